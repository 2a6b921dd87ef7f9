//! `crypt`: the child holds only ciphertext. XTS-AES-256, like dm-crypt's `aes-xts-plain64`.
//!
//! ```toml
//! [[layer]]
//! name = "secret"
//! kind = "crypt"
//! children = ["d0"]
//! key-file = "keys/enc.key"   # 64 raw bytes; relative to the configuration's folder
//! sector-size = 512           # or 4096; default 512
//! ```
//!
//! Make a key with `head -c 64 /dev/urandom > keys/enc.key`. The first 32 bytes key the data
//! cipher, the last 32 the tweak cipher (IEEE 1619 Key1 ‖ Key2). Lose the key, lose the data.
//!
//! Each sector is one XTS data unit whose tweak is its sector number (in `sector-size` units,
//! from the start of the child) as a little-endian 128-bit integer: dm-crypt's `plain64` (with
//! `iv_large_sectors` for 4096-byte sectors). The same plaintext at two offsets encrypts
//! differently; the same plaintext rewritten at one offset encrypts the same (XTS has no
//! per-write nonce: an attacker who sees the disk twice learns which sectors changed).
//!
//! Never-written sectors: the contract says they read as zeros, and the child gives zeros for
//! them, which would decrypt to garbage. So a sector whose *ciphertext* is all zeros decrypts
//! to zeros (see [`apply`]); everything else is decrypted. A child must therefore start out
//! zeroed (a new sparse file is): leftover data on a reused disk reads as garbage.
//!
//! Why no discard, and why write_zeroes writes ciphertext: a sector the child zeroes or
//! trims reads back as ciphertext zeros, which decrypt to garbage, neither zeros nor the old
//! data. So `write_zeroes` encrypts a zero buffer and writes it (never passed down, never
//! fast), `discard` is refused and `capabilities().discard` is false, and `block_status`
//! reports everything as data: the child's holes say nothing about the plaintext (and
//! reporting them would leak which parts were never written).
//!
//! Buffers: a write encrypts a copy (the caller's `Bytes` may be shared and is never
//! changed); a read decrypts the buffer the child handed over, which is ours alone. Requests
//! above [`INLINE_MAX`] are encrypted on the runtime's blocking pool so that a 32 MiB write
//! does not stall the async threads for milliseconds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

mod xts;

use bytes::{Bytes, BytesMut};
use futures_util::future::try_join_all;
use strata_core::{
    async_trait, run_blocking, BlockDevice, BlockError, Capabilities, Control, ControlReply,
    DeviceRef, Geometry, NodeStatus, Result, Runtime, WriteFlags, ZeroFlags,
};
pub use xts::XtsAes256;

use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind};
use strata_core::lock;
use strata_core::ByteSize;

pub static KIND: LayerKind =
    LayerKind::new::<CryptConfig>("crypt", ChildCount::Exactly(1), |args| {
        Box::pin(async move { build(args).await.map(|c| Arc::new(c) as DeviceRef) })
    })
    .about("XTS-AES-256 encryption of one child, key from a file");

/// XTS-AES-256: two 256-bit keys.
pub const KEY_BYTES: usize = 64;
/// Requests up to this size are encrypted on the calling task (~50 µs with AES-NI).
pub const INLINE_MAX: usize = 64 << 10;
/// write_zeroes writes ciphertext in pieces of this size, a few at a time.
const ZERO_PIECE: u64 = 1 << 20;
const ZERO_PIECES_IN_FLIGHT: usize = 4;

/// A `[[layer]]` table of kind `crypt`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CryptConfig {
    /// As the configuration gave it: relative paths resolve against the configuration's
    /// folder ([`layer::Options::base`]) when the layer is built, and `describe` hands the
    /// path back unresolved, so a label written from it resolves the same way.
    pub key_file: PathBuf,
    /// 512 or 4096.
    #[serde(default = "default_sector")]
    pub sector_size: ByteSize,
}

pub const DEFAULT_SECTOR: u64 = 512;

fn default_sector() -> ByteSize {
    ByteSize(DEFAULT_SECTOR)
}

async fn build(args: LayerArgs) -> Result<Crypt> {
    let config: CryptConfig = args.options.parse().map_err(|error| match error {
        BlockError::InvalidArgument(what) if what.contains("`key-file` is required") => {
            BlockError::InvalidArgument(format!(
                "crypt {}: {what} (make one: head -c 64 /dev/urandom > enc.key)",
                args.name
            ))
        }
        other => other,
    })?;
    let child = args.all_children()?.remove(0);
    let path = args.options.base.join(&config.key_file);
    let key = read_key(&args.name, &path, args.runtime.as_ref()).await?;
    let mut crypt = Crypt::new(args.name, child, &key, config.sector_size.0, args.runtime)?;
    crypt.key_file = Some(path);
    crypt.config = Some(config);
    Ok(crypt)
}

/// Reads a key file, refusing any length but [`KEY_BYTES`] with a message that says why.
pub async fn read_key(name: &str, path: &Path, runtime: &dyn Runtime) -> Result<Vec<u8>> {
    let owned = path.to_path_buf();
    let key = run_blocking(runtime, move || std::fs::read(owned))
        .await
        .map_err(|e| {
            BlockError::io(
                format!("crypt {name}: reading key file {}", path.display()),
                e,
            )
        })?;
    if key.len() != KEY_BYTES {
        return Err(BlockError::InvalidArgument(format!(
            "crypt {name}: key file {} holds {} bytes; XTS-AES-256 needs exactly {KEY_BYTES} \
             raw bytes (not hex, no newline): head -c 64 /dev/urandom > {}",
            path.display(),
            key.len(),
            path.display()
        )));
    }
    Ok(key)
}

pub struct Crypt {
    name: String,
    child: DeviceRef,
    xts: Arc<XtsAes256>,
    sector: u64,
    geometry: Geometry,
    capabilities: Capabilities,
    runtime: Arc<dyn Runtime>,
    /// Resolved, for the operator's eyes (`detail`).
    key_file: Option<PathBuf>,
    /// As configured, for `describe`: None for a crypt made from a key in memory.
    config: Option<CryptConfig>,
}

impl Crypt {
    /// Encrypts `child` with `key` (Key1 ‖ Key2, 64 bytes) in sectors of `sector` bytes.
    pub fn new(
        name: String,
        child: DeviceRef,
        key: &[u8],
        sector: u64,
        runtime: Arc<dyn Runtime>,
    ) -> Result<Crypt> {
        let invalid = |what: String| BlockError::InvalidArgument(format!("crypt {name}: {what}"));
        if key.len() != KEY_BYTES {
            return Err(invalid(format!(
                "the key is {} bytes; XTS-AES-256 needs exactly {KEY_BYTES}",
                key.len()
            )));
        }
        // IEEE 1619-2018 §5.1 and FIPS: XTS with Key1 == Key2 is not XTS; refuse it.
        if key[..32] == key[32..] {
            return Err(invalid("the two halves of the key are equal".into()));
        }
        if sector != 512 && sector != 4096 {
            return Err(invalid(format!(
                "field `sector-size`: {sector} is not 512 or 4096"
            )));
        }
        let child_geometry = child.geometry();
        let min_io = u64::from(child_geometry.min_io).max(sector);
        if !min_io.is_multiple_of(sector) || !min_io.is_multiple_of(child_geometry.min_io.into()) {
            return Err(invalid(format!(
                "the child's {}-byte alignment does not fit {sector}-byte sectors",
                child_geometry.min_io
            )));
        }
        let size = child_geometry.size / min_io * min_io;
        if size == 0 {
            return Err(invalid("the child holds no whole sector".into()));
        }
        let min_io = min_io as u32;
        let geometry = Geometry {
            size,
            min_io,
            logical_block: child_geometry.logical_block.max(min_io),
            physical_block: child_geometry.physical_block.max(min_io),
            preferred_io: child_geometry.preferred_io.max(min_io),
            max_io: (child_geometry.max_io / min_io * min_io).max(min_io),
        };
        let capabilities = Capabilities {
            discard: false,
            write_zeroes: true,
            fast_zero: false,
            block_status: false,
            ..child.capabilities()
        };
        let data_key = key[..32].try_into().expect("32-byte key");
        let tweak_key = key[32..].try_into().expect("32-byte key");
        Ok(Crypt {
            name,
            child,
            xts: Arc::new(XtsAes256::new(data_key, tweak_key)),
            sector,
            geometry,
            capabilities,
            runtime,
            key_file: None,
            config: None,
        })
    }

    /// Encrypts (or decrypts) `buf`, which starts at device `offset`, on the calling task when
    /// small and on the blocking pool when large.
    async fn transform(&self, offset: u64, mut buf: BytesMut, encrypt: bool) -> BytesMut {
        if buf.len() <= INLINE_MAX {
            apply(&self.xts, &mut buf, offset, self.sector, encrypt);
            return buf;
        }
        let (xts, sector) = (self.xts.clone(), self.sector);
        run_blocking(self.runtime.as_ref(), move || {
            apply(&xts, &mut buf, offset, sector, encrypt);
            buf
        })
        .await
    }

    /// Writes ciphertext of zeros over `[offset, offset + len)`, in pieces.
    async fn write_encrypted_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        let piece = ZERO_PIECE.min(u64::from(self.geometry.max_io)) / self.sector * self.sector;
        assert!(piece >= self.sector);
        let pieces: Vec<(u64, u64)> = (0..len.div_ceil(piece))
            .map(|i| (offset + i * piece, piece.min(len - i * piece)))
            .collect();
        for batch in pieces.chunks(ZERO_PIECES_IN_FLIGHT) {
            try_join_all(batch.iter().map(|&(at, len)| async move {
                let zeros = BytesMut::zeroed(len as usize);
                let ciphertext = self.transform(at, zeros, true).await;
                self.child.write(at, ciphertext.freeze(), flags).await
            }))
            .await?;
        }
        Ok(())
    }

    async fn describe(&self) -> Result<NodeStatus> {
        let child = strata_core::describe(self.child.as_ref()).await?;
        let mut node = NodeStatus::new(&self.name, "crypt", self.geometry.size);
        node.health = child.health;
        node.detail = vec![
            ("cipher".into(), "aes-xts-plain64 (256-bit keys)".into()),
            ("sector-size".into(), self.sector.to_string()),
        ];
        if let Some(path) = &self.key_file {
            node.detail
                .push(("key-file".into(), path.display().to_string()));
        }
        node.config = self.config.as_ref().and_then(layer::to_table);
        node.children = vec![child];
        Ok(node)
    }
}

/// XTS over whole sectors of `buf`, which starts at byte `offset` of the device; the tweak of
/// each sector is its number, little-endian (`plain64`).
///
/// Decryption leaves a sector of all-zero ciphertext as zeros: that is a sector never written
/// through this layer (the child was zeros), and the device contract says it reads as zeros.
/// A real ciphertext is all zeros with probability 2^-4096 (512-byte sectors), so no written
/// sector is ever mistaken for one.
pub fn apply(xts: &XtsAes256, buf: &mut [u8], offset: u64, sector: u64, encrypt: bool) {
    assert!(offset.is_multiple_of(sector), "sector-aligned offset");
    assert!((buf.len() as u64).is_multiple_of(sector), "whole sectors");
    let first = u128::from(offset / sector);
    for (index, data) in buf.chunks_exact_mut(sector as usize).enumerate() {
        let number = first + index as u128;
        if encrypt {
            xts.encrypt_unit(data, number);
        } else if data.iter().any(|&byte| byte != 0) {
            xts.decrypt_unit(data, number);
        }
    }
}

#[async_trait]
impl BlockDevice for Crypt {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry.check_range(offset, len as u64)?;
        let ciphertext = self.child.read(offset, len).await?;
        assert_eq!(ciphertext.len(), len, "child returned a short read");
        Ok(self.transform(offset, ciphertext, false).await)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.geometry.check_range(offset, data.len() as u64)?;
        let copy = BytesMut::from(&data[..]);
        let ciphertext = self.transform(offset, copy, true).await;
        debug_assert_eq!(ciphertext.len(), data.len());
        self.child.write(offset, ciphertext.freeze(), flags).await
    }

    async fn flush(&self) -> Result<()> {
        self.child.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        Err(BlockError::Unsupported(
            "crypt: discard would leave sectors that decrypt to garbage",
        ))
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        if flags.fast {
            return Err(BlockError::Unsupported(
                "crypt: zeroing writes encrypted zeros, never fast",
            ));
        }
        let flags = WriteFlags { fua: flags.fua };
        self.write_encrypted_zeroes(offset, len, flags).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.describe().await?)),
            // Each sector is encrypted in place: the child's range is the same.
            Control::Lock(request) => {
                self.geometry.check_range(request.offset, request.len)?;
                let range = request.offset..request.offset + request.len;
                let held = lock::lock_children(&request, [(&self.child, range)]).await?;
                Ok(ControlReply::Lock(held))
            }
            _ => Err(BlockError::Unsupported("crypt: control")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IEEE 1619-2007 XTS-AES-256 Key1 ‖ Key2 of vectors 10 to 14.
    const KEY: &str = "27182818284590452353602874713526624977572470936999595749669676273141592653589793238462643383279502884197169399375105820974944592";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    fn xts() -> XtsAes256 {
        let key = hex(KEY);
        XtsAes256::new(key[..32].try_into().unwrap(), key[32..].try_into().unwrap())
    }

    #[test]
    fn ieee_1619_vector_10_at_sector_255() {
        // Data unit sequence number 0xff, 512-byte data unit: byte offset 255 * 512.
        let mut buf: Vec<u8> = (0..512).map(|i| i as u8).collect();
        apply(&xts(), &mut buf, 0xff * 512, 512, true);
        let expected = concat!(
            "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b",
            "5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd",
        );
        assert_eq!(buf[..64], hex(expected)[..]);
        let tail = concat!(
            "1ad77f16f541dfd269d50d6a5f14fb0aab1cbb4c1550be97f7ab4066193c4caa",
            "773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151",
        );
        let tail = hex(tail);
        assert_eq!(buf[512 - tail.len()..], tail[..]);
        apply(&xts(), &mut buf, 0xff * 512, 512, false);
        assert!(buf.iter().enumerate().all(|(i, &b)| b == i as u8));
    }

    #[test]
    fn large_sectors_use_the_sector_number_not_the_512_byte_unit() {
        // Computed with OpenSSL's aes-256-xts, tweak 3 (sector 3 of 4096 bytes).
        let mut buf: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        apply(&xts(), &mut buf, 3 * 4096, 4096, true);
        let head = "d4570dcdfa2e683e356234722a8fbc0b47b226c0930ea2f175260367d016ee03";
        let tail = "086117d97231e18ff642bcc59f1349f74a8eab601d8275a2e3f25176b9beff64";
        assert_eq!(buf[..32], hex(head)[..]);
        assert_eq!(buf[4096 - 32..], hex(tail)[..]);
    }

    #[test]
    fn a_sector_of_zero_ciphertext_reads_as_zeros_and_only_that() {
        let mut buf = vec![0u8; 1024];
        buf[512 + 7] = 1;
        apply(&xts(), &mut buf, 0, 512, false);
        assert!(buf[..512].iter().all(|&b| b == 0), "never written: zeros");
        assert!(
            buf[512..].iter().filter(|&&b| b != 0).count() > 400,
            "decrypted"
        );
        // Encrypted zeros are not zeros on the child, and come back as zeros.
        let mut zeros = vec![0u8; 512];
        apply(&xts(), &mut zeros, 512, 512, true);
        assert!(zeros.iter().any(|&b| b != 0));
        apply(&xts(), &mut zeros, 512, 512, false);
        assert!(zeros.iter().all(|&b| b == 0));
    }
}
