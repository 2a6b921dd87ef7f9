//! Which physical extent a new write gets: the policy, with no I/O.
//!
//! Virtual Allocation lays extents out in the order they are first written, from a moving
//! head (the paper's layout; its variant starts the head mid-device). Two rules keep data
//! safe:
//! - an extent chosen for a write is *reserved* until its mapping is published, so two
//!   writers never get the same one;
//! - an extent freed by a transaction is *quarantined* until that transaction is durable.
//!   Otherwise a crash could bring back the old mapping while the extent already holds
//!   another volume's data (persistent-data's rule: never reuse a block freed in the open
//!   transaction).

use std::collections::{BTreeMap, BTreeSet};

use strata_meta::Bitmap;

#[derive(Debug)]
pub struct Allocator {
    extents: u64,
    head: u64,
    reserved: BTreeSet<u64>,
    /// Extent → the transaction number that must be durable before it is reused.
    quarantine: BTreeMap<u64, u64>,
}

impl Allocator {
    pub fn new(extents: u64, head: u64) -> Self {
        assert!(head <= extents);
        Allocator {
            extents,
            head: if head == extents { 0 } else { head },
            reserved: BTreeSet::new(),
            quarantine: BTreeMap::new(),
        }
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    /// Picks and reserves a free extent, searching from the head and wrapping once.
    pub fn allocate(&mut self, allocated: &Bitmap, durable_txn: u64) -> Option<u64> {
        self.quarantine.retain(|_, txn| *txn > durable_txn);
        for (from, limit) in [(self.head, self.extents), (0, self.head)] {
            let mut at = from;
            while let Some(extent) = allocated.next(at, limit, false) {
                if !self.reserved.contains(&extent) && !self.quarantine.contains_key(&extent) {
                    self.reserved.insert(extent);
                    self.head = (extent + 1) % self.extents;
                    return Some(extent);
                }
                at = extent + 1;
            }
        }
        None
    }

    /// The reserved extent's mapping is published (or its write failed): it is no longer
    /// the allocator's to guard.
    pub fn settle(&mut self, extent: u64) {
        let was_reserved = self.reserved.remove(&extent);
        assert!(was_reserved, "extent {extent} was not reserved");
    }

    /// `extent` was freed by a transaction; it may be reused once transactions numbered
    /// below `durable_after` are durable.
    pub fn quarantine(&mut self, extent: u64, durable_after: u64) {
        assert!(extent < self.extents);
        self.quarantine.insert(extent, durable_after);
    }

    /// The pool grew to `extents`; the head stays where it is, so the new extents come after
    /// the ones it has not reached yet.
    pub fn grow(&mut self, extents: u64) {
        assert!(extents >= self.extents);
        self.extents = extents;
    }

    /// Drops the quarantine of an extent whose free did not happen after all.
    pub fn unquarantine(&mut self, extent: u64) {
        self.quarantine.remove(&extent);
    }

    /// Extents waiting for a commit before they can be reused.
    pub fn quarantined(&self) -> usize {
        self.quarantine.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmap(set: &[u64]) -> Bitmap {
        Bitmap::from_bits(set.iter().copied())
    }

    #[test]
    fn allocates_in_log_order_from_the_head_and_wraps() {
        let mut alloc = Allocator::new(8, 5);
        let used = bitmap(&[5, 6]);
        assert_eq!(alloc.allocate(&used, 0), Some(7));
        assert_eq!(alloc.allocate(&used, 0), Some(0), "wraps to the start");
        assert_eq!(alloc.allocate(&used, 0), Some(1));
        alloc.settle(7);
        assert_eq!(alloc.head(), 2);
    }

    #[test]
    fn reserved_and_quarantined_extents_are_skipped() {
        let mut alloc = Allocator::new(4, 0);
        let used = bitmap(&[]);
        assert_eq!(alloc.allocate(&used, 0), Some(0));
        alloc.quarantine(1, 10);
        assert_eq!(
            alloc.allocate(&used, 9),
            Some(2),
            "1 waits for transaction 10"
        );
        assert_eq!(alloc.allocate(&used, 9), Some(3));
        assert_eq!(
            alloc.allocate(&used, 9),
            None,
            "0, 2, 3 reserved; 1 quarantined"
        );
        assert_eq!(alloc.allocate(&used, 10), Some(1), "durable now");
        assert_eq!(alloc.quarantined(), 0);
    }
}
