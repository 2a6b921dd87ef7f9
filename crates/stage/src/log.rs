//! The staging log's slots on the fast child, in memory: which slots a staged write may take.
//!
//! The log is written in append order: a cursor moves forward over the slots and wraps, and a
//! write takes the next free slots after it. A destage frees slots anywhere, so the log is not
//! a strict ring; on flash the order of writes costs nothing, and the reverse table (slot →
//! logical block, in the metadata) is what makes a slot live, not its position.
//!
//! A slot is busy while live (named in the reverse table), reserved by a staged write under
//! way, or freed by a transaction not yet durable (a crash would bring back the metadata that
//! points at it). A destage *pins* the slots it copies: a slot freed during the copy (by an
//! overwrite of its block) is not reused until the destage ends, so the copy never reads a
//! slot that already holds another write (the switch then sees the block moved and skips it).
//!
//! Lock rule: kept behind the stage's std mutex, never held across an await.

use std::collections::HashSet;

use crate::alloc::{Bits, PendingFrees};

#[derive(Debug)]
pub struct LogSlots {
    busy: Bits,
    cursor: u64,
    pending: PendingFrees,
    pinned: HashSet<u64>,
}

impl LogSlots {
    pub fn new(slots: u64) -> LogSlots {
        assert!(slots > 0);
        LogSlots {
            busy: Bits::new(slots),
            cursor: 0,
            pending: PendingFrees::default(),
            pinned: HashSet::new(),
        }
    }

    /// At open: a live slot. The cursor starts after the last one.
    pub fn mark_live(&mut self, slot: u64) {
        self.busy.set(slot, true);
        self.cursor = (slot + 1) % self.busy.len();
    }

    pub fn slots(&self) -> u64 {
        self.busy.len()
    }

    /// Slots that are not free: live, reserved or waiting for their free to be durable.
    pub fn busy(&self) -> u64 {
        self.busy.ones()
    }

    pub fn free(&self) -> u64 {
        self.slots() - self.busy()
    }

    /// Takes `n` free slots in log order, or none if fewer are free.
    pub fn reserve(&mut self, n: u64) -> Option<Vec<u64>> {
        if self.free() < n {
            return None;
        }
        let mut taken = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let slot = self
                .busy
                .next_clear_from(self.cursor)
                .expect("counted free slots");
            self.busy.set(slot, true);
            self.cursor = (slot + 1) % self.slots();
            taken.push(slot);
        }
        Some(taken)
    }

    /// Gives back a reservation that never became live.
    pub fn release(&mut self, slot: u64) {
        let changed = self.busy.set(slot, false);
        assert!(changed, "slot {slot} released while free");
    }

    /// `slot` was freed by a transaction durable once `after` transactions are.
    pub fn free_after(&mut self, slot: u64, after: u64) {
        debug_assert!(self.busy.get(slot));
        self.pending.push(slot, after);
    }

    /// Releases the frees whose transaction is durable, except pinned slots.
    pub fn reclaim(&mut self, durable_txn: u64) {
        let pinned = &self.pinned;
        let ready = self
            .pending
            .take_durable(durable_txn, |s| pinned.contains(&s));
        for slot in ready {
            self.busy.set(slot, false);
        }
    }

    pub fn pin(&mut self, slots: impl IntoIterator<Item = u64>) {
        self.pinned.extend(slots);
    }

    pub fn unpin_all(&mut self) {
        self.pinned.clear();
    }

    pub fn pending_frees(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_in_log_order_and_wrap() {
        let mut log = LogSlots::new(4);
        assert_eq!(log.reserve(3), Some(vec![0, 1, 2]));
        log.free_after(1, 5);
        log.reclaim(5);
        // The cursor is at 3: 3, then wraps to 1.
        assert_eq!(log.reserve(2), Some(vec![3, 1]));
        assert_eq!(log.reserve(1), None, "the log is full");
        assert_eq!(log.busy(), 4);
    }

    #[test]
    fn a_freed_slot_waits_for_its_transaction_and_its_pin() {
        let mut log = LogSlots::new(2);
        let slots = log.reserve(2).unwrap();
        log.pin(slots.clone());
        log.free_after(0, 3);
        log.reclaim(2);
        assert_eq!(log.free(), 0, "reused before the free was durable");
        log.reclaim(3);
        assert_eq!(log.free(), 0, "a pinned slot was reused during a destage");
        log.unpin_all();
        log.reclaim(3);
        assert_eq!(log.free(), 1);
        assert_eq!(log.pending_frees(), 0);
    }

    #[test]
    fn a_reopened_log_appends_after_its_last_live_slot() {
        let mut log = LogSlots::new(8);
        log.mark_live(2);
        log.mark_live(5);
        assert_eq!(log.reserve(3), Some(vec![6, 7, 0]));
    }
}
