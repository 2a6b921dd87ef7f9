//! The `[[layer]]` options of kind `stage`, typed, with their defaults and their rules.

use serde::{Deserialize, Serialize};
use strata_core::ByteSize;

use crate::shape::BLOCK;
use crate::trigger::{Trigger, TriggerKind};

/// The paper's break-even between a random I/O and a full-track read (§4.3): writes smaller
/// than this are staged.
pub const DEFAULT_THRESHOLD: u64 = 168 << 10;
/// The paper's extent (§5.2): one destage batch per extent.
pub const DEFAULT_EXTENT: u64 = 16 << 20;
/// The paper's allocation range on nearline drives, the RAID stripe unit (§4.2).
pub const DEFAULT_RANGE: u64 = 1 << 20;
/// The proximal window in allocation ranges (§4.4: "~100 allocation ranges").
pub const DEFAULT_WINDOW: u64 = 100;

/// A `[[layer]]` table of kind `stage`. `extent`, `range` and `metadata-size` are fixed at
/// creation (a reopen refuses values that differ from the format record); the rest may
/// change between starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct StageConfig {
    /// Writes smaller than this go to the log; larger ones (and equal) to the slow child.
    pub threshold: ByteSize,
    pub extent: ByteSize,
    pub range: ByteSize,
    /// How far from its home range (in ranges) a destaged block may go before the layout
    /// counts as aged.
    pub window: u64,
    pub trigger: TriggerKind,
    /// Watermarks in percent of the log (`trigger = "watermark"`).
    pub high: u64,
    pub low: u64,
    /// Staged blocks in one extent that start its destage (`trigger = "density"`): 8
    /// fills a drive's queue of 8, the paper's strand.
    pub density: u64,
    /// The metadata region at the start of the fast child (default: 96 bytes per log slot
    /// and 4 per slow-child block, at least 1 MiB; see `metadata_bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_size: Option<ByteSize>,
    /// Requests of one destage batch in flight at once (default: the whole batch, for the
    /// slow child's queue to order, and for a raid5 below to update each stripe's parity
    /// once for all of them). 1 writes back one block run at a time in address order, as
    /// bcache and dm-writecache do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destage_depth: Option<u64>,
}

impl Default for StageConfig {
    fn default() -> Self {
        StageConfig {
            threshold: ByteSize(DEFAULT_THRESHOLD),
            extent: ByteSize(DEFAULT_EXTENT),
            range: ByteSize(DEFAULT_RANGE),
            window: DEFAULT_WINDOW,
            trigger: TriggerKind::Full,
            high: 80,
            low: 20,
            density: 8,
            metadata_size: None,
            destage_depth: None,
        }
    }
}

impl StageConfig {
    /// What the types cannot say; errors name the field.
    pub fn check(&self) -> Result<(), String> {
        let range = self.range.0;
        if !range.is_power_of_two() || !(64 << 10..=64 << 20).contains(&range) {
            return Err(format!(
                "field `range`: {range} bytes is not a power of two from 64KiB to 64MiB"
            ));
        }
        let extent = self.extent.0;
        if extent < range || !extent.is_multiple_of(range) {
            return Err(format!(
                "field `extent`: {extent} bytes is not a whole number of ranges of {range}"
            ));
        }
        if self.threshold.0 == 0 || !self.threshold.0.is_multiple_of(BLOCK) {
            return Err(format!(
                "field `threshold`: {} bytes is not a positive multiple of 4KiB",
                self.threshold.0
            ));
        }
        if !(1..=100).contains(&self.high) || self.low >= self.high {
            return Err(format!(
                "fields `high` and `low`: need 0 <= low < high <= 100 (percent), got low = {}, \
                 high = {}",
                self.low, self.high
            ));
        }
        if self.density == 0 {
            return Err("field `density`: at least 1 block".into());
        }
        if self.destage_depth == Some(0) {
            return Err("field `destage-depth`: at least 1 request".into());
        }
        if let Some(size) = self.metadata_size {
            if size.0 < 1 << 20 || !size.0.is_multiple_of(BLOCK) {
                return Err(format!(
                    "field `metadata-size`: {} bytes is not a multiple of 4KiB of at least 1MiB",
                    size.0
                ));
            }
        }
        Ok(())
    }

    pub fn trigger(&self) -> Trigger {
        match self.trigger {
            TriggerKind::Full => Trigger::Full,
            TriggerKind::Watermark => Trigger::Watermark {
                high_percent: self.high,
                low_percent: self.low,
            },
            TriggerKind::Density => Trigger::Density {
                blocks: self.density,
                together: match self.destage_depth {
                    None => crate::destage::BATCHES_IN_FLIGHT,
                    Some(_) => 1,
                },
            },
        }
    }

    /// The metadata region a format gives a stage with these children.
    ///
    /// A staged block costs at most 24 bytes of `moved` (a lone 8-byte record and its page
    /// header, when updates are random) and 8.25 of `reverse` (dense by slot): 32.25 bytes of
    /// state. The store keeps a state of at most 3/8 of its region (two checkpoint slots
    /// and a journal of a quarter), less a 5 % reserve, so 32.25 B needs 91 B of region: 96
    /// per slot. Per slow-child block, 4 B of region holds 1.4 B of state: the `home` and
    /// `allocated` bitmaps (0.25 B) and `ranges` (0.03 B) leave room for about one block in
    /// twenty placed off its home. A store that fills anyway destages to empty itself.
    pub fn metadata_bytes(&self, fast_size: u64, slow_size: u64) -> u64 {
        self.metadata_size.map_or_else(
            || {
                let slots = fast_size / BLOCK;
                let blocks = slow_size / BLOCK;
                (96 * slots + 4 * blocks)
                    .max(1 << 20)
                    .next_multiple_of(1 << 20)
            },
            |size| size.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers() {
        let config = StageConfig::default();
        assert_eq!(config.check(), Ok(()));
        assert_eq!(config.threshold.0, 168 << 10);
        assert_eq!(config.trigger(), Trigger::Full);
    }

    #[test]
    fn bad_values_are_refused_by_field() {
        let bad = |edit: fn(&mut StageConfig), field: &str| {
            let mut config = StageConfig::default();
            edit(&mut config);
            let error = config.check().unwrap_err();
            assert!(error.contains(field), "{error}");
        };
        bad(|c| c.range = ByteSize(3 << 20), "`range`");
        bad(|c| c.extent = ByteSize(1536 << 10), "`extent`");
        bad(|c| c.threshold = ByteSize(1000), "`threshold`");
        bad(|c| c.low = 90, "`low`");
        bad(|c| c.density = 0, "`density`");
        bad(|c| c.destage_depth = Some(0), "`destage-depth`");
        bad(
            |c| c.metadata_size = Some(ByteSize(4096)),
            "`metadata-size`",
        );
    }

    #[test]
    fn the_default_metadata_region_grows_with_the_children() {
        let config = StageConfig::default();
        // 96 B × 16 K slots + 4 B × 256 K blocks = 2.5 MiB, rounded up to whole MiB.
        assert_eq!(config.metadata_bytes(64 << 20, 1 << 30), 3 << 20);
        let big = config.metadata_bytes(10 << 30, 1 << 40);
        // 96 B × 2.6 M slots + 4 B × 268 M blocks ≈ 1.25 GiB.
        assert!((1 << 30..2 << 30).contains(&big), "{big}");
    }
}
