//! Free units of a brick's data region, 4 KiB each: first fit, neighbours merged on free.
//! Kept only in memory: at open it is rebuilt from what the metadata says is in use (the
//! map, the versions, the prepared records).

use std::collections::BTreeMap;

pub const UNIT: u64 = 4096;

#[derive(Clone, Debug)]
pub struct FreeSpace {
    /// Free runs: start offset to length, in bytes, disjoint and never adjacent.
    free: BTreeMap<u64, u64>,
    total: u64,
}

impl FreeSpace {
    /// All of `[offset, offset + len)` free.
    pub fn new(offset: u64, len: u64) -> FreeSpace {
        assert!(offset.is_multiple_of(UNIT) && len.is_multiple_of(UNIT) && len > 0);
        FreeSpace {
            free: BTreeMap::from([(offset, len)]),
            total: len,
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Takes `len` bytes (rounded up to units) as one or more runs, or `None` (and takes
    /// nothing) if that much is not free.
    pub fn allocate(&mut self, len: u64) -> Option<Vec<(u64, u64)>> {
        let mut want = len.next_multiple_of(UNIT);
        if want == 0 || want > self.free_bytes() {
            return None;
        }
        let mut runs = Vec::new();
        while want > 0 {
            let (&start, &run) = self.free.iter().next().expect("enough is free");
            let take = run.min(want);
            self.free.remove(&start);
            if take < run {
                self.free.insert(start + take, run - take);
            }
            runs.push((start, take));
            want -= take;
        }
        Some(runs)
    }

    /// Marks a run in use that the metadata found at open says is. False if any of it is not
    /// free (two owners of one place: damage).
    pub fn take(&mut self, start: u64, len: u64) -> bool {
        let len = len.next_multiple_of(UNIT);
        let Some((&run_start, &run_len)) = self.free.range(..=start).next_back() else {
            return false;
        };
        if start + len > run_start + run_len {
            return false;
        }
        self.free.remove(&run_start);
        if start > run_start {
            self.free.insert(run_start, start - run_start);
        }
        if start + len < run_start + run_len {
            self.free
                .insert(start + len, run_start + run_len - start - len);
        }
        true
    }

    /// Gives a run back.
    pub fn release(&mut self, start: u64, len: u64) {
        let mut start = start;
        let mut len = len.next_multiple_of(UNIT);
        if let Some((&before, &before_len)) = self.free.range(..start).next_back() {
            assert!(before + before_len <= start, "a unit freed twice");
            if before + before_len == start {
                self.free.remove(&before);
                start = before;
                len += before_len;
            }
        }
        if let Some((&after, &after_len)) = self.free.range(start..).next() {
            assert!(start + len <= after, "a unit freed twice");
            if start + len == after {
                self.free.remove(&after);
                len += after_len;
            }
        }
        self.free.insert(start, len);
    }

    /// Gives back single units, in any order, a run of neighbours at a time: a commit frees
    /// the 256 units a 1 MiB write replaced, usually side by side, and each `release` is
    /// four lookups in the tree of runs.
    pub fn release_units(&mut self, mut units: Vec<u64>) {
        units.sort_unstable();
        let mut units = units.into_iter().peekable();
        while let Some(start) = units.next() {
            let mut end = start + UNIT;
            // A unit listed twice is not a neighbour: `release` refuses it as freed twice.
            while units.next_if_eq(&end).is_some() {
                end += UNIT;
            }
            self.release(start, end - start);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs_split_and_merge_back() {
        let mut space = FreeSpace::new(1 << 20, 16 * UNIT);
        let a = space.allocate(3 * UNIT).unwrap();
        let b = space.allocate(1).unwrap();
        assert_eq!(a, vec![(1 << 20, 3 * UNIT)]);
        assert_eq!(b, vec![((1 << 20) + 3 * UNIT, UNIT)]);
        space.release(a[0].0, a[0].1);
        // 3 units free at the front, 12 after b: 14 come as two runs.
        let c = space.allocate(14 * UNIT).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(space.allocate(2 * UNIT), None);
        assert_eq!(space.free_bytes(), UNIT);
        for (start, len) in c.into_iter().chain(b) {
            space.release(start, len);
        }
        assert_eq!(space.free.len(), 1, "merged into one run");
        assert!(space.take((1 << 20) + UNIT, UNIT));
        assert!(!space.take((1 << 20) + UNIT, UNIT), "taken twice");
        assert_eq!(space.free_bytes(), 15 * UNIT);
    }

    #[test]
    #[should_panic(expected = "a unit freed twice")]
    fn a_unit_listed_twice_is_refused() {
        let mut space = FreeSpace::new(0, 8 * UNIT);
        let runs = space.allocate(4 * UNIT).unwrap();
        assert_eq!(runs, vec![(0, 4 * UNIT)]);
        space.release_units(vec![2 * UNIT, UNIT, 2 * UNIT]);
    }

    proptest! {
        /// Against a model of one flag per unit: runs never overlap, never leave the region,
        /// and the free count always matches.
        #[test]
        fn allocations_never_overlap(ops in proptest::collection::vec((any::<bool>(), 1u64..6), 1..80)) {
            let units = 32u64;
            let mut space = FreeSpace::new(0, units * UNIT);
            let mut used = vec![false; units as usize];
            let mut held: Vec<Vec<(u64, u64)>> = Vec::new();
            for (alloc, n) in ops {
                if alloc || held.is_empty() {
                    match space.allocate(n * UNIT) {
                        Some(runs) => {
                            prop_assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), n * UNIT);
                            for &(start, len) in &runs {
                                for u in start / UNIT..(start + len) / UNIT {
                                    prop_assert!(u < units && !used[u as usize]);
                                    used[u as usize] = true;
                                }
                            }
                            held.push(runs);
                        }
                        None => prop_assert!(used.iter().filter(|u| !**u).count() < n as usize),
                    }
                } else {
                    let runs = held.swap_remove((n as usize) % held.len());
                    let mut singles = Vec::new();
                    for (start, len) in runs {
                        for u in start / UNIT..(start + len) / UNIT {
                            used[u as usize] = false;
                            singles.push(u * UNIT);
                        }
                        if n % 2 == 0 {
                            space.release(start, len);
                        }
                    }
                    if n % 2 == 1 {
                        // As a commit frees them: unit by unit, in no particular order.
                        singles.reverse();
                        space.release_units(singles);
                    }
                }
                let free = used.iter().filter(|u| !**u).count() as u64 * UNIT;
                prop_assert_eq!(space.free_bytes(), free);
            }
        }
    }
}
