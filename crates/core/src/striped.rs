//! A fixed table of async locks indexed by key modulo its size: per-stripe, per-region and
//! per-extent locking without a lock per key. Two keys that share a slot merely wait for
//! each other.
//!
//! Deadlock rule: a request that needs several slots takes them through [`StripedLocks::read_range`],
//! [`StripedLocks::write_range`] or [`StripedLocks::write_all`], which take them in ascending
//! slot order; one that needs one slot may take it with [`StripedLocks::read`] or
//! [`StripedLocks::write`]. Never hold a slot while taking another by hand.

use std::ops::Range;

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `count` reader-writer locks guarding nothing but the keys they stand for.
pub struct StripedLocks {
    slots: Vec<RwLock<()>>,
}

impl StripedLocks {
    /// A table of `count` slots (at least one).
    pub fn new(count: usize) -> StripedLocks {
        assert!(count > 0, "a lock table needs at least one slot");
        StripedLocks {
            slots: (0..count).map(|_| RwLock::new(())).collect(),
        }
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Never true (a table has at least one slot); here because `len` is.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The slot standing for `key`.
    pub fn slot_of(&self, key: u64) -> usize {
        (key % self.slots.len() as u64) as usize
    }

    /// The slots of `keys`, ascending and without repeats: the order every multi-slot taker
    /// uses.
    pub fn slots_of(&self, keys: Range<u64>) -> Vec<usize> {
        let mut slots: Vec<usize> = keys
            .take(self.slots.len())
            .map(|key| self.slot_of(key))
            .collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// Shares `key`'s slot.
    pub async fn read(&self, key: u64) -> RwLockReadGuard<'_, ()> {
        self.slots[self.slot_of(key)].read().await
    }

    /// Takes `key`'s slot alone.
    pub async fn write(&self, key: u64) -> RwLockWriteGuard<'_, ()> {
        self.slots[self.slot_of(key)].write().await
    }

    /// Shares the slots of every key in `keys`, in ascending slot order.
    pub async fn read_range(&self, keys: Range<u64>) -> Vec<RwLockReadGuard<'_, ()>> {
        let mut guards = Vec::new();
        for slot in self.slots_of(keys) {
            guards.push(self.slots[slot].read().await);
        }
        guards
    }

    /// Takes the slots of every key in `keys` alone, in ascending slot order.
    pub async fn write_range(&self, keys: Range<u64>) -> Vec<RwLockWriteGuard<'_, ()>> {
        let mut guards = Vec::new();
        for slot in self.slots_of(keys) {
            guards.push(self.slots[slot].write().await);
        }
        guards
    }

    /// Takes every slot alone, in order, so that nothing is inside any (quiescing).
    pub async fn write_all(&self) -> Vec<RwLockWriteGuard<'_, ()>> {
        let mut guards = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            guards.push(slot.write().await);
        }
        guards
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn slots_of_a_range_are_ascending_unique_and_bounded() {
        let locks = StripedLocks::new(4);
        assert_eq!(locks.slots_of(2..7), vec![0, 1, 2, 3]);
        assert_eq!(locks.slots_of(3..5), vec![0, 3]);
        assert_eq!(locks.slots_of(5..5), Vec::<usize>::new());
        // A huge range costs at most one pass over the table.
        assert_eq!(locks.slots_of(0..u64::MAX), vec![0, 1, 2, 3]);
        assert_eq!(locks.slot_of(9), 1);
    }

    #[tokio::test]
    async fn readers_share_and_writers_exclude_across_aliasing_keys() {
        let locks = Arc::new(StripedLocks::new(4));
        let a = locks.read(1).await;
        let b = locks.read(5).await; // same slot, shared
        assert!(locks.slots[1].try_write().is_err());
        drop((a, b));
        let writer = locks.write_range(3..6).await; // slots 3, 0, 1
        assert!(locks.slots[0].try_read().is_err());
        assert!(locks.slots[2].try_read().is_ok());
        let waiting = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _g = locks.read_range(0..2).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(writer);
        waiting.await.unwrap();
        let all = locks.write_all().await;
        assert_eq!(all.len(), 4);
    }

    /// Two requests taking overlapping ranges from opposite ends never deadlock, because both
    /// take slots in ascending order.
    #[tokio::test]
    async fn overlapping_range_takers_do_not_deadlock() {
        let locks = Arc::new(StripedLocks::new(8));
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let locks = locks.clone();
            tasks.push(tokio::spawn(async move {
                for round in 0..200u64 {
                    let start = (i * 3 + round) % 16;
                    let _g = locks.write_range(start..start + 5).await;
                    tokio::task::yield_now().await;
                }
            }));
        }
        let all = async {
            for task in tasks {
                task.await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(20), all)
            .await
            .expect("no deadlock");
    }
}
