//! Free space on the slow child, in memory: which physical blocks may be handed out now,
//! which physical ranges are some logical range's base, and the first base of a range.
//!
//! A block is *busy* while it is live (the metadata's `allocated` bitmap), reserved by a
//! write or destage under way, or freed by a transaction that is not yet durable. The last
//! rule is the crash rule of §4.7: a block freed by a staged overwrite still holds the data a
//! crash would bring back until the freeing transaction is on disk, so it is reused only
//! after (`free_after` … `reclaim`).
//!
//! Lock rule: the stage keeps one `Allocator` behind a std mutex, held for in-memory work
//! only, never across an await.

use crate::plan::FreeBlocks;

/// A fixed-size bit set.
#[derive(Clone, Debug)]
pub(crate) struct Bits {
    words: Vec<u64>,
    ones: u64,
    len: u64,
}

impl Bits {
    pub fn new(len: u64) -> Bits {
        Bits {
            words: vec![0; len.div_ceil(64) as usize],
            ones: 0,
            len,
        }
    }

    pub fn get(&self, bit: u64) -> bool {
        debug_assert!(bit < self.len);
        self.words[(bit / 64) as usize] >> (bit % 64) & 1 == 1
    }

    /// Sets `bit` to `value`; returns whether it changed.
    pub fn set(&mut self, bit: u64, value: bool) -> bool {
        if self.get(bit) == value {
            return false;
        }
        self.words[(bit / 64) as usize] ^= 1 << (bit % 64);
        if value {
            self.ones += 1;
        } else {
            self.ones -= 1;
        }
        true
    }

    pub fn ones(&self) -> u64 {
        self.ones
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The first clear bit at or after `from`, wrapping once around.
    pub fn next_clear_from(&self, from: u64) -> Option<u64> {
        if self.ones == self.len {
            return None;
        }
        (from..self.len).chain(0..from).find(|&bit| !self.get(bit))
    }
}

/// Frees waiting for their transaction to be durable: released once the store's durable
/// transaction count reaches `after`.
#[derive(Debug, Default)]
pub(crate) struct PendingFrees {
    items: Vec<(u64, u64)>,
}

impl PendingFrees {
    pub fn push(&mut self, item: u64, after: u64) {
        self.items.push((after, item));
    }

    /// The items whose transaction is durable (and that `keep` does not hold back).
    pub fn take_durable(&mut self, durable_txn: u64, keep: impl Fn(u64) -> bool) -> Vec<u64> {
        let mut ready = Vec::new();
        self.items.retain(|&(after, item)| {
            let release = after <= durable_txn && !keep(item);
            if release {
                ready.push(item);
            }
            !release
        });
        ready
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }
}

/// The slow child's blocks and ranges, as the data path hands them out.
#[derive(Debug)]
pub struct Allocator {
    range_blocks: u64,
    ranges: u64,
    busy: Bits,
    /// Physical ranges that are some logical range's base.
    based: Bits,
    pending: PendingFrees,
}

impl Allocator {
    pub fn new(ranges: u64, range_blocks: u64) -> Allocator {
        Allocator {
            range_blocks,
            ranges,
            busy: Bits::new(ranges * range_blocks),
            based: Bits::new(ranges),
            pending: PendingFrees::default(),
        }
    }

    /// At open: a live block.
    pub fn mark_live(&mut self, block: u64) {
        self.busy.set(block, true);
    }

    /// At open, and when a base is chosen: physical range `range` is a base.
    pub fn mark_based(&mut self, range: u64) {
        self.based.set(range, true);
    }

    /// Takes a free block for a write or a destage under way.
    pub fn reserve(&mut self, block: u64) {
        let changed = self.busy.set(block, true);
        assert!(changed, "block {block} reserved while busy");
    }

    /// Gives back a reservation that never became live.
    pub fn release(&mut self, block: u64) {
        let changed = self.busy.set(block, false);
        assert!(changed, "block {block} released while free");
    }

    /// `block` was freed by a transaction that is durable once `after` transactions are.
    pub fn free_after(&mut self, block: u64, after: u64) {
        debug_assert!(self.busy.get(block));
        self.pending.push(block, after);
    }

    /// Releases the frees whose transaction is durable.
    pub fn reclaim(&mut self, durable_txn: u64) {
        for block in self.pending.take_durable(durable_txn, |_| false) {
            self.busy.set(block, false);
        }
    }

    pub fn free_blocks(&self) -> u64 {
        self.busy.len() - self.busy.ones()
    }

    pub fn pending_frees(&self) -> usize {
        self.pending.len()
    }

    /// A base for a logical range with no base yet, next to its logical neighbours: right
    /// after the base of the range before it, else right before the base of the range after
    /// it, else the physical range of the same number (so data written in order lays out in
    /// order). The nearest range that is no base and wholly free wins; failing that, the
    /// nearest that is no base. Marks it based.
    pub fn choose_base(
        &mut self,
        logical_range: u64,
        before: Option<u64>,
        after: Option<u64>,
    ) -> Option<u64> {
        let wanted = match (before, after) {
            (Some(base), _) => base + 1,
            (None, Some(base)) => base.saturating_sub(1),
            (None, None) => logical_range,
        }
        .min(self.ranges - 1);
        let wholly_free = |a: &Allocator, r: u64| {
            let first = r * a.range_blocks;
            (first..first + a.range_blocks).all(|b| !a.busy.get(b))
        };
        let nearest = |a: &Allocator, ok: &dyn Fn(&Allocator, u64) -> bool| {
            (0..a.ranges).find_map(|d| {
                let up = wanted.checked_add(d).filter(|&r| r < a.ranges);
                let down = wanted.checked_sub(d).filter(|_| d > 0);
                up.into_iter()
                    .chain(down)
                    .find(|&r| !a.based.get(r) && ok(a, r))
            })
        };
        let base = nearest(self, &wholly_free).or_else(|| nearest(self, &|_, _| true))?;
        self.based.set(base, true);
        Some(base)
    }
}

impl FreeBlocks for Allocator {
    fn is_free(&self, block: u64) -> bool {
        !self.busy.get(block)
    }

    fn ranges(&self) -> u64 {
        self.ranges
    }

    fn range_blocks(&self) -> u64 {
        self.range_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_block_is_reused_only_once_its_transaction_is_durable() {
        let mut alloc = Allocator::new(2, 4);
        alloc.reserve(3);
        alloc.free_after(3, 10);
        alloc.reclaim(9);
        assert!(!alloc.is_free(3), "reused before the free was durable");
        alloc.reclaim(10);
        assert!(alloc.is_free(3));
        assert_eq!(alloc.free_blocks(), 8);
    }

    #[test]
    #[should_panic(expected = "reserved while busy")]
    fn reserving_a_busy_block_is_a_bug() {
        let mut alloc = Allocator::new(1, 4);
        alloc.mark_live(1);
        alloc.reserve(1);
    }

    #[test]
    fn a_first_base_goes_next_to_its_logical_neighbour() {
        let mut alloc = Allocator::new(8, 4);
        // No neighbour: the range of the same number.
        assert_eq!(alloc.choose_base(2, None, None), Some(2));
        // After a neighbour based at 5: 6.
        assert_eq!(alloc.choose_base(3, Some(5), None), Some(6));
        // Before a neighbour based at 2 (taken): the nearest free one to 1.
        assert_eq!(alloc.choose_base(0, None, Some(2)), Some(1));
        // Range 7 has a live block (a destaged block from elsewhere): 7 is passed over for a
        // wholly free range while one exists.
        alloc.mark_live(7 * 4);
        assert_eq!(alloc.choose_base(6, Some(6), None), Some(5));
    }

    #[test]
    fn bits_find_the_next_clear_bit_wrapping() {
        let mut bits = Bits::new(5);
        for b in [0, 1, 3] {
            bits.set(b, true);
        }
        assert_eq!(bits.next_clear_from(3), Some(4));
        assert_eq!(bits.next_clear_from(4), Some(4));
        bits.set(4, true);
        assert_eq!(bits.next_clear_from(3), Some(2));
        bits.set(2, true);
        assert_eq!(bits.next_clear_from(0), None);
        assert_eq!(bits.ones(), 5);
    }
}
