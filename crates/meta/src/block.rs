//! The one framing every metadata block uses: a 40-byte header with a kind, a crc32c, the
//! epoch (checkpoint generation) it belongs to and its place in its unit, then payload.
//!
//! Like persistent-data's block validators, the checksum is set just before a block is
//! written and checked just after it is read, so nothing above this module ever sees a block
//! that fails it. A torn 4 KiB write fails the checksum; a stale block from an older epoch
//! fails the epoch test; a block from another unit fails the sequence or index test.

use bytes::{BufMut, BytesMut};

/// Every metadata block is this big, and metadata I/O is aligned to it.
pub const BLOCK_SIZE: usize = 4096;
/// Header bytes at the start of every block.
pub const HEADER_SIZE: usize = 40;
/// Payload bytes a block carries.
pub const PAYLOAD_SIZE: usize = BLOCK_SIZE - HEADER_SIZE;

const _: () = assert!(BLOCK_SIZE.is_multiple_of(512));
const _: () = assert!(HEADER_SIZE.is_multiple_of(8));

/// What a block is. The values are magic numbers so a block of the wrong kind never parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Superblock = 0x5354_5342, // "STSB"
    Checkpoint = 0x5354_434b, // "STCK"
    Journal = 0x5354_4a4e,    // "STJN"
}

impl BlockKind {
    fn from_magic(magic: u32) -> Option<BlockKind> {
        [
            BlockKind::Superblock,
            BlockKind::Checkpoint,
            BlockKind::Journal,
        ]
        .into_iter()
        .find(|kind| *kind as u32 == magic)
    }
}

/// Where a block sits: which epoch, which unit (journal batch number or 0) and which block of
/// that unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub kind: BlockKind,
    pub epoch: u64,
    pub seq: u64,
    pub index: u32,
    pub count: u32,
    pub payload_len: u32,
    /// For the first block of a unit, the crc32c of the unit's whole payload stream; it
    /// catches a unit assembled from blocks of two different attempts at the same place.
    pub unit_crc: u32,
}

/// Why a block was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockFault {
    #[error("unknown magic {0:#010x}")]
    Magic(u32),
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("payload length {0} exceeds {PAYLOAD_SIZE}")]
    PayloadLength(u32),
    #[error("block {index} of a {count}-block unit")]
    Index { index: u32, count: u32 },
}

/// Frames `payload` (at most PAYLOAD_SIZE bytes) as one block and appends it to `out`.
pub fn encode(out: &mut BytesMut, header: BlockHeader, payload: &[u8]) {
    assert!(
        payload.len() <= PAYLOAD_SIZE,
        "payload of {}",
        payload.len()
    );
    assert!(header.index < header.count);
    let start = out.len();
    out.put_u32_le(header.kind as u32);
    out.put_u32_le(0); // crc, filled below
    out.put_u64_le(header.epoch);
    out.put_u64_le(header.seq);
    out.put_u32_le(header.index);
    out.put_u32_le(header.count);
    out.put_u32_le(payload.len() as u32);
    out.put_u32_le(header.unit_crc);
    debug_assert_eq!(out.len() - start, HEADER_SIZE);
    out.put_slice(payload);
    out.put_bytes(0, PAYLOAD_SIZE - payload.len());
    let crc = crc32c::crc32c(&out[start..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len() - start, BLOCK_SIZE);
}

/// Checks one block and returns its header and payload.
pub fn decode(block: &[u8]) -> Result<(BlockHeader, &[u8]), BlockFault> {
    assert_eq!(block.len(), BLOCK_SIZE);
    let u32_at = |at: usize| u32::from_le_bytes(block[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(block[at..at + 8].try_into().unwrap());
    let magic = u32_at(0);
    let kind = BlockKind::from_magic(magic).ok_or(BlockFault::Magic(magic))?;
    let stored = u32_at(4);
    let computed = {
        let mut digest = crc32c::crc32c(&block[..4]);
        digest = crc32c::crc32c_append(digest, &[0; 4]);
        crc32c::crc32c_append(digest, &block[8..])
    };
    if stored != computed {
        return Err(BlockFault::Checksum { stored, computed });
    }
    let header = BlockHeader {
        kind,
        epoch: u64_at(8),
        seq: u64_at(16),
        index: u32_at(24),
        count: u32_at(28),
        payload_len: u32_at(32),
        unit_crc: u32_at(36),
    };
    if header.payload_len as usize > PAYLOAD_SIZE {
        return Err(BlockFault::PayloadLength(header.payload_len));
    }
    if header.index >= header.count {
        return Err(BlockFault::Index {
            index: header.index,
            count: header.count,
        });
    }
    let payload = &block[HEADER_SIZE..HEADER_SIZE + header.payload_len as usize];
    Ok((header, payload))
}

/// Number of blocks a payload stream of `len` bytes needs (at least one).
pub fn blocks_for(len: usize) -> usize {
    len.div_ceil(PAYLOAD_SIZE).max(1)
}

/// Frames a whole payload stream as a unit of consecutive blocks.
pub fn encode_unit(kind: BlockKind, epoch: u64, seq: u64, stream: &[u8]) -> BytesMut {
    let count = blocks_for(stream.len());
    let unit_crc = crc32c::crc32c(stream);
    let mut out = BytesMut::with_capacity(count * BLOCK_SIZE);
    let mut chunks = stream.chunks(PAYLOAD_SIZE);
    for index in 0..count {
        let chunk = chunks.next().unwrap_or(&[]);
        let header = BlockHeader {
            kind,
            epoch,
            seq,
            index: index as u32,
            count: count as u32,
            payload_len: chunk.len() as u32,
            unit_crc,
        };
        encode(&mut out, header, chunk);
    }
    debug_assert_eq!(out.len(), count * BLOCK_SIZE);
    out
}

/// Why a unit could not be read back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnitFault {
    #[error("block {index}: {fault}")]
    Block { index: usize, fault: BlockFault },
    #[error("block {index}: expected {expected}, found {found}")]
    Mismatch {
        index: usize,
        expected: String,
        found: String,
    },
    #[error("unit checksum mismatch")]
    UnitChecksum,
}

/// Reads back a unit framed by [`encode_unit`] from `blocks`, which starts at its first
/// block and may run past its end. Returns the header of its first block and its stream.
pub fn decode_unit(
    kind: BlockKind,
    epoch: u64,
    seq: u64,
    blocks: &[u8],
) -> Result<(BlockHeader, Vec<u8>), UnitFault> {
    let first = first_header(kind, epoch, seq, blocks)?;
    let count = first.count as usize;
    if count * BLOCK_SIZE > blocks.len() {
        return Err(UnitFault::Mismatch {
            index: 0,
            expected: format!("at most {} blocks", blocks.len() / BLOCK_SIZE),
            found: format!("a {count}-block unit"),
        });
    }
    let mut stream = Vec::with_capacity(count * PAYLOAD_SIZE);
    for (index, block) in blocks.chunks_exact(BLOCK_SIZE).take(count).enumerate() {
        let (header, payload) = decode(block).map_err(|fault| UnitFault::Block { index, fault })?;
        let expected = BlockHeader {
            index: index as u32,
            payload_len: header.payload_len,
            ..first
        };
        if header != expected {
            return Err(UnitFault::Mismatch {
                index,
                expected: format!("{expected:?}"),
                found: format!("{header:?}"),
            });
        }
        stream.extend_from_slice(payload);
    }
    if crc32c::crc32c(&stream) != first.unit_crc {
        return Err(UnitFault::UnitChecksum);
    }
    Ok((first, stream))
}

fn first_header(
    kind: BlockKind,
    epoch: u64,
    seq: u64,
    blocks: &[u8],
) -> Result<BlockHeader, UnitFault> {
    let (first, _) =
        decode(&blocks[..BLOCK_SIZE]).map_err(|fault| UnitFault::Block { index: 0, fault })?;
    if first.kind != kind || first.epoch != epoch || first.seq != seq || first.index != 0 {
        return Err(UnitFault::Mismatch {
            index: 0,
            expected: format!("{kind:?} epoch {epoch} seq {seq} index 0"),
            found: format!(
                "{:?} epoch {} seq {} index {}",
                first.kind, first.epoch, first.seq, first.index
            ),
        });
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_round_trips_and_rejects_every_kind_of_damage() {
        let stream: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let unit = encode_unit(BlockKind::Journal, 3, 9, &stream);
        assert_eq!(unit.len(), 3 * BLOCK_SIZE);
        let (header, back) = decode_unit(BlockKind::Journal, 3, 9, &unit).unwrap();
        assert_eq!(back, stream);
        assert_eq!(header.count, 3);

        let wrong_epoch = decode_unit(BlockKind::Journal, 4, 9, &unit);
        assert!(matches!(
            wrong_epoch,
            Err(UnitFault::Mismatch { index: 0, .. })
        ));
        let wrong_kind = decode_unit(BlockKind::Checkpoint, 3, 9, &unit);
        assert!(wrong_kind.is_err());

        let mut torn = unit.clone();
        torn[BLOCK_SIZE + 100] ^= 1;
        let fault = decode_unit(BlockKind::Journal, 3, 9, &torn).unwrap_err();
        assert!(matches!(
            fault,
            UnitFault::Block {
                index: 1,
                fault: BlockFault::Checksum { .. }
            }
        ));

        // Two attempts at the same batch, spliced: every block is valid, the unit is not.
        let other: Vec<u8> = stream.iter().map(|b| b ^ 0x55).collect();
        let second = encode_unit(BlockKind::Journal, 3, 9, &other);
        let mut spliced = unit.clone();
        spliced[2 * BLOCK_SIZE..].copy_from_slice(&second[2 * BLOCK_SIZE..]);
        let spliced = decode_unit(BlockKind::Journal, 3, 9, &spliced);
        assert!(
            spliced.is_err(),
            "a unit spliced from two attempts must be rejected"
        );

        let short = decode_unit(BlockKind::Journal, 3, 9, &unit[..2 * BLOCK_SIZE]);
        assert!(short.is_err());
    }

    #[test]
    fn empty_stream_is_one_block() {
        let unit = encode_unit(BlockKind::Checkpoint, 1, 0, &[]);
        assert_eq!(unit.len(), BLOCK_SIZE);
        let (_, back) = decode_unit(BlockKind::Checkpoint, 1, 0, &unit).unwrap();
        assert!(back.is_empty());
        assert_eq!(
            decode(&[0u8; BLOCK_SIZE]).unwrap_err(),
            BlockFault::Magic(0)
        );
    }
}
