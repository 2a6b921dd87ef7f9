//! `fault`: a child that fails on purpose, for tests and demonstrations (nbdkit's `error`
//! filter, dm-flakey).
//!
//! ```toml
//! [[layer]]
//! name = "flaky"
//! kind = "fault"
//! children = ["d0"]
//! fail-read = "1MiB+4KiB,8MiB+64KiB"   # reads touching these ranges fail
//! fail-write = "0+512"                 # writes, write_zeroes, discards touching them fail
//! error-rate = 0.01                    # any data operation fails with this probability
//! seed = 42                            # for error-rate; default 0
//! ```
//!
//! Ranges are `offset+length` with sizes as elsewhere (`4096`, `64KiB`), comma-separated.
//! Every injected error is `BlockError::Io` with OS error EIO, as a failing disk gives, and
//! changes nothing on the child: the request is refused before it is passed down.
//!
//! Random errors draw from a splitmix64 sequence started at `seed`, one draw per data
//! operation (read, write, write_zeroes, discard, flush), so a run that issues the same
//! operations in the same order fails the same ones. Concurrent requests draw in the order
//! they arrive.
//!
//! At run time, `Control::FailMember { index: 0 }` makes the device disappear: from then on
//! every operation (block_status included) fails with EIO and `describe` reports it Failed,
//! as a pulled disk would. There is no way back short of rebuilding the layer: a disk that
//! comes back is a new disk to a RAID layer above.
//!
//! Keeps no state beyond the RNG and the "gone" flag, both in memory.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use strata_core::layer::verbs;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, errno, BlockDevice, BlockError, ByteSize, Control, ControlReply, DeviceRef,
    Extent, Filter, Health, NodeStatus, Result, WriteFlags, ZeroFlags,
};

use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind};

pub static KIND: LayerKind =
    LayerKind::new::<FaultConfig>("fault", ChildCount::Exactly(1), |args| {
        Box::pin(async move { build(args).map(|f| Arc::new(f) as DeviceRef) })
    })
    .about("injects I/O errors: fixed ranges, a random rate, or the whole device on command")
    .verbs(&[verbs::FAIL_MEMBER]);

/// What to fail: a `[[layer]]` table of kind `fault`. Absent options fail nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct FaultConfig {
    /// `(offset, len)` ranges whose reads fail.
    #[serde(with = "ranges_text")]
    pub fail_read: Vec<(u64, u64)>,
    /// `(offset, len)` ranges whose writes, write_zeroes and discards fail.
    #[serde(with = "ranges_text")]
    pub fail_write: Vec<(u64, u64)>,
    /// Probability in [0, 1] that any data operation fails.
    pub error_rate: f64,
    pub seed: u64,
}

fn build(args: LayerArgs) -> Result<Fault> {
    let config: FaultConfig = args.options.parse()?;
    let child = args.all_children()?.remove(0);
    Fault::new(args.name, child, config)
}

/// Ranges as `"1MiB+4KiB,8MiB+64KiB"`: [`parse_ranges`] in, [`format_ranges`] out.
mod ranges_text {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    type Ranges = Vec<(u64, u64)>;

    pub fn serialize<S: Serializer>(ranges: &Ranges, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&super::format_ranges(ranges))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Ranges, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse_ranges(&text).map_err(D::Error::custom)
    }
}

/// Writes ranges the way [`parse_ranges`] reads them (`""` for none).
pub fn format_ranges(ranges: &[(u64, u64)]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(|&(o, n)| format!("{}+{}", ByteSize(o), ByteSize(n)))
        .collect();
    parts.join(",")
}

/// Parses `"1MiB+4KiB,8MiB+64KiB"` into `[(1 MiB, 4 KiB), (8 MiB, 64 KiB)]`.
pub fn parse_ranges(text: &str) -> std::result::Result<Vec<(u64, u64)>, String> {
    let mut ranges = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (offset, len) = part
            .split_once('+')
            .ok_or_else(|| format!("{part:?} is not offset+length (example: \"1MiB+4KiB\")"))?;
        let offset = ByteSize::parse(offset)?.0;
        let len = ByteSize::parse(len)?.0;
        if len == 0 || offset.checked_add(len).is_none() {
            return Err(format!("{part:?} is an empty or overflowing range"));
        }
        ranges.push((offset, len));
    }
    Ok(ranges)
}

fn overlaps(ranges: &[(u64, u64)], offset: u64, len: u64) -> Option<(u64, u64)> {
    ranges
        .iter()
        .copied()
        .find(|&(start, n)| len > 0 && start < offset + len && offset < start + n)
}

/// One step of splitmix64 (Steele, Lea, Flood 2014): a counter through a mixing function, so
/// the state can live in one atomic and never needs a lock.
fn splitmix64(counter: u64) -> u64 {
    let mut z = counter;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

pub struct Fault {
    name: String,
    child: DeviceRef,
    config: FaultConfig,
    counter: AtomicU64,
    gone: AtomicBool,
}

impl Fault {
    pub fn new(name: String, child: DeviceRef, config: FaultConfig) -> Result<Fault> {
        if !(0.0..=1.0).contains(&config.error_rate) {
            return Err(BlockError::InvalidArgument(format!(
                "fault {name}: field `error-rate`: {} is not between 0 and 1",
                config.error_rate
            )));
        }
        Ok(Fault {
            counter: AtomicU64::new(config.seed),
            name,
            child,
            config,
            gone: AtomicBool::new(false),
        })
    }

    /// Makes the device disappear, as `Control::FailMember { index: 0 }` does.
    pub fn disappear(&self) {
        self.gone.store(true, Ordering::SeqCst);
    }

    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    fn error(&self, what: String) -> BlockError {
        let source = io::Error::from_raw_os_error(errno::EIO as i32);
        BlockError::io(format!("fault {}: injected {what}", self.name), source)
    }

    /// The error this operation gets, if any: gone, a listed range, or the dice.
    fn check(&self, op: &str, ranges: &[(u64, u64)], offset: u64, len: u64) -> Result<()> {
        if self.is_gone() {
            return Err(self.error(format!("{op} error: the device is gone")));
        }
        if let Some((start, n)) = overlaps(ranges, offset, len) {
            return Err(self.error(format!(
                "{op} error: [{offset}, +{len}) touches [{start}, +{n})"
            )));
        }
        if self.config.error_rate > 0.0 && self.roll() < self.config.error_rate {
            return Err(self.error(format!("random {op} error")));
        }
        Ok(())
    }

    /// A uniform draw in [0, 1).
    fn roll(&self) -> f64 {
        let counter = self
            .counter
            .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
            .wrapping_add(GOLDEN_GAMMA);
        (splitmix64(counter) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn describe_detail(&self) -> Vec<(String, String)> {
        vec![
            ("fail-read".into(), format_ranges(&self.config.fail_read)),
            ("fail-write".into(), format_ranges(&self.config.fail_write)),
            ("error-rate".into(), self.config.error_rate.to_string()),
            ("gone".into(), self.is_gone().to_string()),
        ]
    }
}

#[async_trait]
impl Filter for Fault {
    fn next(&self) -> &DeviceRef {
        &self.child
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.check("read", &self.config.fail_read, offset, len as u64)?;
        self.child.read(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.check("write", &self.config.fail_write, offset, data.len() as u64)?;
        self.child.write(offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        self.check("flush", &[], 0, 0)?;
        self.child.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check("discard", &self.config.fail_write, offset, len)?;
        self.child.discard(offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.check("write_zeroes", &self.config.fail_write, offset, len)?;
        self.child.write_zeroes(offset, len, flags).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        if self.is_gone() {
            return Err(self.error("block_status error: the device is gone".into()));
        }
        self.child.block_status(offset, len).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => {
                let child = strata_core::describe(self.child.as_ref()).await?;
                let mut node = NodeStatus::new(&self.name, "fault", self.child.geometry().size);
                node.health = if self.is_gone() {
                    Health::Failed
                } else {
                    child.health
                };
                node.detail = self.describe_detail();
                node.config = layer::to_table(&self.config);
                node.children = vec![child];
                Ok(ControlReply::Describe(node))
            }
            Control::FailMember { index: 0 } => {
                self.disappear();
                Ok(ControlReply::Done)
            }
            Control::FailMember { index } => Err(BlockError::InvalidArgument(format!(
                "fault {}: has one child (index 0), not {index}",
                self.name
            ))),
            _ => Err(BlockError::Unsupported("fault: control")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_with_units_and_refuse_nonsense() {
        assert_eq!(
            parse_ranges("1MiB+4KiB, 8MiB+64KiB").unwrap(),
            vec![(1 << 20, 4096), (8 << 20, 64 << 10)]
        );
        assert_eq!(parse_ranges("").unwrap(), vec![]);
        assert_eq!(parse_ranges("0+512").unwrap(), vec![(0, 512)]);
        assert!(parse_ranges("1MiB").unwrap_err().contains("offset+length"));
        assert!(parse_ranges("1MiB+0").is_err());
        assert!(parse_ranges("x+1").is_err());
    }

    #[test]
    fn overlap_is_half_open() {
        let ranges = [(4096, 512)];
        assert!(overlaps(&ranges, 4095, 1).is_none());
        assert!(overlaps(&ranges, 4095, 2).is_some());
        assert!(overlaps(&ranges, 4607, 1).is_some());
        assert!(overlaps(&ranges, 4608, 100).is_none());
        assert!(overlaps(&ranges, 4096, 0).is_none());
    }

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // The first outputs of splitmix64 seeded with 0 (reference C implementation).
        let first = splitmix64(GOLDEN_GAMMA);
        assert_eq!(first, 0xe220_a839_7b1d_cdaf);
        assert_eq!(
            splitmix64(GOLDEN_GAMMA.wrapping_mul(2)),
            0x6e78_9e6a_a1b9_65f4
        );
    }
}
