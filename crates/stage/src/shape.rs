//! The stage's address arithmetic, pure: blocks, allocation ranges, extents, log slots.
//!
//! Units (all fixed at format, recorded in the format record):
//! - a *block* is 4 KiB, the unit of every map and of the log;
//! - an *allocation range* is `range_blocks` consecutive blocks (1 MiB by default, the
//!   paper's nearline stripe unit), logical or physical;
//! - an *extent* is `extent_ranges` consecutive logical ranges (16 MiB by default, the
//!   paper's extent): the destage issues one batch per extent;
//! - a *log slot* is one block of the log on the fast child, after its metadata region.

/// The block of every map and of the log.
pub const BLOCK: u64 = 4096;

/// The shape of one stage, as formatted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub range_blocks: u64,
    pub extent_ranges: u64,
    /// Allocation ranges on the slow child; the logical device has as many.
    pub ranges: u64,
    /// Byte offset of the log on the fast child (the metadata region's size).
    pub log_offset: u64,
    pub log_slots: u64,
}

impl Shape {
    pub fn range_bytes(&self) -> u64 {
        self.range_blocks * BLOCK
    }

    pub fn extent_blocks(&self) -> u64 {
        self.range_blocks * self.extent_ranges
    }

    /// Blocks on the slow child the stage uses, and blocks of the logical device.
    pub fn blocks(&self) -> u64 {
        self.ranges * self.range_blocks
    }

    /// The logical device's size in bytes.
    pub fn size(&self) -> u64 {
        self.blocks() * BLOCK
    }

    pub fn range_of(&self, block: u64) -> u64 {
        block / self.range_blocks
    }

    pub fn extent_of(&self, logical: u64) -> u64 {
        logical / self.extent_blocks()
    }

    /// A logical block's physical home once its range is based at physical range `base`:
    /// the same offset inside the base range.
    pub fn home(&self, logical: u64, base: u64) -> u64 {
        base * self.range_blocks + logical % self.range_blocks
    }

    /// Byte offset of a log slot on the fast child.
    pub fn slot_offset(&self, slot: u64) -> u64 {
        debug_assert!(slot < self.log_slots);
        self.log_offset + slot * BLOCK
    }

    /// Byte offset of a physical block on the slow child.
    pub fn block_offset(&self, physical: u64) -> u64 {
        debug_assert!(physical < self.blocks());
        physical * BLOCK
    }
}

/// Consecutive runs of `items` whose `key` grows by one from each to the next: the pieces a
/// run of blocks becomes as child requests (one request per run, not per block).
pub fn runs<T>(items: &[T], key: impl Fn(&T) -> u64) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=items.len() {
        if i == items.len() || key(&items[i]) != key(&items[i - 1]) + 1 {
            runs.push(start..i);
            start = i;
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            range_blocks: 256,
            extent_ranges: 16,
            ranges: 64,
            log_offset: 1 << 20,
            log_slots: 100,
        }
    }

    #[test]
    fn paper_defaults_give_1_mib_ranges_and_16_mib_extents() {
        let shape = shape();
        assert_eq!(shape.range_bytes(), 1 << 20);
        assert_eq!(shape.extent_blocks() * BLOCK, 16 << 20);
        assert_eq!(shape.size(), 64 << 20);
        assert_eq!(shape.extent_of(4095), 0);
        assert_eq!(shape.extent_of(4096), 1);
    }

    #[test]
    fn a_home_keeps_the_offset_inside_the_range() {
        let shape = shape();
        assert_eq!(shape.home(256 + 7, 9), 9 * 256 + 7);
        assert_eq!(shape.home(0, 0), 0);
        assert_eq!(shape.slot_offset(3), (1 << 20) + 3 * 4096);
    }

    #[test]
    fn runs_split_where_the_key_jumps() {
        let keys = [4u64, 5, 6, 9, 10, 3];
        let found = runs(&keys, |k| *k);
        assert_eq!(found, vec![0..3, 3..5, 5..6]);
        assert!(runs::<u64>(&[], |k| *k).is_empty());
    }
}
