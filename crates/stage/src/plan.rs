//! The destage planner (the paper's §4.4), pure: which free physical block each staged block
//! goes to, and in what order the writes are issued. No I/O, no clock, no shared state.
//!
//! Placement, for each staged block in logical order (just-in-time allocation next to the
//! logical neighbours):
//! 1. its *home block* (the same offset inside the physical range its logical range is based
//!    on) if free: a block that returns home costs no map entry;
//! 2. else the free block nearest to its home inside the *home range*, where its logical
//!    neighbours live;
//! 3. else the nearest range, alternating above and below, within `window_ranges` of the home
//!    range (the proximal window: ~100 ranges in the paper);
//! 4. else the nearest free block anywhere (counted as `outside_window`: the layout ages, but
//!    the data is kept).
//!
//! Issue: one *batch* per logical extent; inside it the placements sorted by physical block
//! (ascending, as §2.7 found drives need), physically consecutive blocks merged into one
//! request, and the requests cut into *strands* of at most `strand` issued one after the
//! other (by default one strand: the whole batch, which the slow child's queue orders; the
//! paper's drives took 8 at a time).

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;

use crate::shape::runs;

/// Which physical blocks are free now (the allocator's view, frozen for one plan).
pub trait FreeBlocks {
    fn is_free(&self, block: u64) -> bool;
    /// Physical ranges on the slow child.
    fn ranges(&self) -> u64;
    fn range_blocks(&self) -> u64;
}

/// A staged block: where it is in the log and where its home is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Staged {
    pub logical: u64,
    pub slot: u64,
    /// Its home block (its logical range's base must be decided before planning).
    pub home: u64,
}

/// Where one staged block goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub logical: u64,
    pub slot: u64,
    pub target: u64,
}

/// One extent's writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub extent: u64,
    /// Ascending by `target`.
    pub placements: Vec<Placement>,
    /// Runs of physically consecutive placements: one child write each.
    pub requests: Vec<Range<usize>>,
    /// Requests issued together, at most `strand` each, in ascending order.
    pub strands: Vec<Range<usize>>,
}

/// How placements fell, for status and the paper's ">99 % home" check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanStats {
    pub at_home_block: u64,
    /// In the home range (home block included).
    pub in_home_range: u64,
    /// In the window but outside the home range.
    pub in_window: u64,
    pub outside_window: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub batches: Vec<Batch>,
    pub stats: PlanStats,
}

/// Parameters of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanParams {
    pub extent_blocks: u64,
    pub window_ranges: u64,
    /// Requests in flight at once (`usize::MAX`: the whole batch).
    pub strand: usize,
}

/// No free block is left anywhere for this staged block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoFreeBlock {
    pub logical: u64,
}

/// Plans the destage of `staged` (any order, each logical block at most once).
pub fn plan(
    staged: &[Staged],
    free: &impl FreeBlocks,
    params: PlanParams,
) -> Result<Plan, NoFreeBlock> {
    assert!(params.strand > 0 && params.extent_blocks > 0);
    let mut sorted = staged.to_vec();
    sorted.sort_by_key(|s| s.logical);
    debug_assert!(sorted.windows(2).all(|w| w[0].logical < w[1].logical));
    let mut placer = Placer::new(free, params.window_ranges);
    let mut by_extent: BTreeMap<u64, Vec<Placement>> = BTreeMap::new();
    for block in &sorted {
        let target = placer.place(block.home).ok_or(NoFreeBlock {
            logical: block.logical,
        })?;
        by_extent
            .entry(block.logical / params.extent_blocks)
            .or_default()
            .push(Placement {
                logical: block.logical,
                slot: block.slot,
                target,
            });
    }
    let batches = by_extent
        .into_iter()
        .map(|(extent, placements)| batch(extent, placements, params.strand))
        .collect();
    Ok(Plan {
        batches,
        stats: placer.stats,
    })
}

fn batch(extent: u64, mut placements: Vec<Placement>, strand: usize) -> Batch {
    placements.sort_by_key(|p| p.target);
    let requests = runs(&placements, |p| p.target);
    let strands = (0..requests.len())
        .step_by(strand)
        .map(|start| start..start.saturating_add(strand).min(requests.len()))
        .collect();
    Batch {
        extent,
        placements,
        requests,
        strands,
    }
}

/// The search for free blocks, remembering what this plan already took.
struct Placer<'a, F> {
    free: &'a F,
    window: u64,
    taken: HashSet<u64>,
    /// Free blocks left per range, counted on first look.
    left: BTreeMap<u64, u64>,
    stats: PlanStats,
}

impl<'a, F: FreeBlocks> Placer<'a, F> {
    fn new(free: &'a F, window: u64) -> Self {
        Placer {
            free,
            window,
            taken: HashSet::new(),
            left: BTreeMap::new(),
            stats: PlanStats::default(),
        }
    }

    fn available(&self, block: u64) -> bool {
        self.free.is_free(block) && !self.taken.contains(&block)
    }

    fn left_in(&mut self, range: u64) -> u64 {
        let blocks = self.free.range_blocks();
        let free = self.free;
        *self.left.entry(range).or_insert_with(|| {
            (range * blocks..(range + 1) * blocks)
                .filter(|&b| free.is_free(b))
                .count() as u64
        })
    }

    fn take(&mut self, block: u64) -> u64 {
        debug_assert!(self.available(block));
        self.taken.insert(block);
        let range = block / self.free.range_blocks();
        let left = self.left_in(range);
        self.left.insert(range, left - 1);
        block
    }

    fn place(&mut self, home: u64) -> Option<u64> {
        let blocks = self.free.range_blocks();
        let home_range = home / blocks;
        if self.available(home) {
            self.stats.at_home_block += 1;
            self.stats.in_home_range += 1;
            return Some(self.take(home));
        }
        let ranges = self.free.ranges();
        // Distance 0 is the home range; the window; then the rest of the device.
        for distance in 0..ranges {
            for range in candidates(home_range, distance, ranges) {
                if self.left_in(range) == 0 {
                    continue;
                }
                let block = self.nearest_in(range, home)?;
                match distance {
                    0 => self.stats.in_home_range += 1,
                    d if d <= self.window => self.stats.in_window += 1,
                    _ => self.stats.outside_window += 1,
                }
                return Some(self.take(block));
            }
        }
        None
    }

    /// The available block of `range` nearest to `home`'s offset inside its range.
    fn nearest_in(&self, range: u64, home: u64) -> Option<u64> {
        let blocks = self.free.range_blocks();
        let first = range * blocks;
        let offset = home % blocks;
        (0..blocks)
            .flat_map(|d| {
                [
                    offset.checked_add(d),
                    offset.checked_sub(d).filter(|_| d > 0),
                ]
            })
            .flatten()
            .filter(|&o| o < blocks)
            .map(|o| first + o)
            .find(|&b| self.available(b))
    }
}

/// The ranges at `distance` from `home` (above first), inside `[0, ranges)`.
fn candidates(home: u64, distance: u64, ranges: u64) -> impl Iterator<Item = u64> {
    let above = home.checked_add(distance).filter(|&r| r < ranges);
    let below = home.checked_sub(distance).filter(|_| distance > 0);
    above.into_iter().chain(below)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A free map for tests: the free blocks as a set.
    #[derive(Clone, Debug)]
    pub(crate) struct TestFree {
        pub ranges: u64,
        pub range_blocks: u64,
        pub free: HashSet<u64>,
    }

    impl FreeBlocks for TestFree {
        fn is_free(&self, block: u64) -> bool {
            self.free.contains(&block)
        }
        fn ranges(&self) -> u64 {
            self.ranges
        }
        fn range_blocks(&self) -> u64 {
            self.range_blocks
        }
    }

    const PARAMS: PlanParams = PlanParams {
        extent_blocks: 64,
        window_ranges: 2,
        strand: 8,
    };

    fn staged(logical: u64, home: u64) -> Staged {
        Staged {
            logical,
            slot: logical + 1000,
            home,
        }
    }

    #[test]
    fn a_free_home_block_is_taken_first() {
        let free = TestFree {
            ranges: 4,
            range_blocks: 16,
            free: [5, 6, 20].into_iter().collect(),
        };
        let plan = plan(&[staged(5, 5)], &free, PARAMS).unwrap();
        assert_eq!(plan.batches[0].placements[0].target, 5);
        assert_eq!(plan.stats.at_home_block, 1);
    }

    #[test]
    fn a_taken_home_goes_to_the_nearest_free_block_of_its_range_then_the_window() {
        let free = TestFree {
            ranges: 8,
            range_blocks: 16,
            // Range 0 has block 9 free; range 2 has 40; range 7 (outside a window of 2 from
            // range 0) has 120.
            free: [9, 40, 120].into_iter().collect(),
        };
        let blocks = [staged(0, 2), staged(1, 3), staged(2, 4), staged(3, 5)];
        // Logical 0 (home 2) takes 9, the nearest free block of its range; 1 goes to the
        // window (40); 2 outside it (120); 3 finds nothing.
        let Err(NoFreeBlock { logical: 3 }) = plan_or(&blocks, &free) else {
            panic!("four blocks cannot fit three free blocks");
        };
        let plan = plan_or(&blocks[..3], &free).unwrap();
        let targets: Vec<(u64, u64)> = plan.batches[0]
            .placements
            .iter()
            .map(|p| (p.logical, p.target))
            .collect();
        assert_eq!(targets, vec![(0, 9), (1, 40), (2, 120)]);
        assert_eq!(plan.stats.in_home_range, 1);
        assert_eq!(plan.stats.in_window, 1);
        assert_eq!(plan.stats.outside_window, 1);
    }

    fn plan_or(blocks: &[Staged], free: &TestFree) -> Result<Plan, NoFreeBlock> {
        plan(blocks, free, PARAMS)
    }

    #[test]
    fn consecutive_targets_merge_and_strands_hold_at_most_eight_requests() {
        let free = TestFree {
            ranges: 4,
            range_blocks: 64,
            free: (0..64).collect(),
        };
        // 20 blocks at even homes: 20 single-block requests, strands of 8, 8, 4.
        let blocks: Vec<Staged> = (0..20).map(|i| staged(i * 2, i * 2)).collect();
        let plan = plan(&blocks, &free, PARAMS).unwrap();
        let batch = &plan.batches[0];
        assert_eq!(batch.requests.len(), 20);
        let sizes: Vec<usize> = batch.strands.iter().map(|s| s.len()).collect();
        assert_eq!(sizes, vec![8, 8, 4]);
        // Ten consecutive homes: one request.
        let blocks: Vec<Staged> = (0..10).map(|i| staged(i, i)).collect();
        let plan = plan_or(&blocks, &free).unwrap();
        assert_eq!(plan.batches[0].requests, vec![0..10]);
    }

    #[test]
    fn one_batch_per_extent_in_extent_order() {
        let free = TestFree {
            ranges: 4,
            range_blocks: 64,
            free: (0..256).collect(),
        };
        let blocks = [staged(130, 130), staged(3, 3), staged(70, 70)];
        let plan = plan(&blocks, &free, PARAMS).unwrap();
        let extents: Vec<u64> = plan.batches.iter().map(|b| b.extent).collect();
        assert_eq!(extents, vec![0, 1, 2]);
    }

    /// A random layout: `ranges` ranges of `range_blocks`, some free, and staged blocks whose
    /// homes are random.
    fn layouts() -> impl Strategy<Value = (TestFree, Vec<Staged>, u64)> {
        (2u64..12, 4u64..24, 0u64..4).prop_flat_map(|(ranges, range_blocks, window)| {
            let blocks = ranges * range_blocks;
            (
                proptest::collection::hash_set(0..blocks, 0..blocks as usize),
                proptest::collection::btree_map(0..blocks, 0..blocks, 0..blocks as usize),
            )
                .prop_map(move |(free, homes)| {
                    let free = TestFree {
                        ranges,
                        range_blocks,
                        free,
                    };
                    let staged = homes
                        .into_iter()
                        .enumerate()
                        .map(|(i, (logical, home))| Staged {
                            logical,
                            slot: i as u64,
                            home,
                        })
                        .collect();
                    (free, staged, window)
                })
        })
    }

    proptest! {
        #[test]
        fn every_block_is_placed_once_on_a_free_block_ascending(
            (free, staged, window) in layouts()
        ) {
            let params = PlanParams { extent_blocks: 32, window_ranges: window, strand: 8 };
            let result = plan(&staged, &free, params);
            if staged.len() > free.free.len() {
                prop_assert!(result.is_err());
                return Ok(());
            }
            let plan = result.unwrap();
            let placed: Vec<&Placement> = plan.batches.iter().flat_map(|b| &b.placements).collect();
            prop_assert_eq!(placed.len(), staged.len());
            let logicals: HashSet<u64> = placed.iter().map(|p| p.logical).collect();
            prop_assert_eq!(logicals.len(), staged.len());
            let targets: HashSet<u64> = placed.iter().map(|p| p.target).collect();
            prop_assert_eq!(targets.len(), staged.len(), "two blocks on one target");
            for p in &placed {
                prop_assert!(free.is_free(p.target), "placed on a live block {}", p.target);
            }
            let stats = plan.stats;
            prop_assert_eq!(stats.in_home_range + stats.in_window + stats.outside_window, staged.len() as u64);
            for batch in &plan.batches {
                prop_assert!(batch.placements.windows(2).all(|w| w[0].target < w[1].target));
                prop_assert!(batch.placements.iter().all(|p| p.logical / 32 == batch.extent));
                prop_assert!(batch.strands.iter().all(|s| s.len() <= 8 && !s.is_empty()));
                let covered: usize = batch.requests.iter().map(|r| r.len()).sum();
                prop_assert_eq!(covered, batch.placements.len());
            }
        }

        /// A block leaves its window only when the window has no free block left.
        #[test]
        fn a_block_leaves_its_window_only_when_the_window_is_full(
            (free, staged, window) in layouts()
        ) {
            prop_assume!(staged.len() <= free.free.len());
            let params = PlanParams { extent_blocks: 32, window_ranges: window, strand: 8 };
            let plan = plan(&staged, &free, params).unwrap();
            let placed: Vec<Placement> = plan.batches.iter().flat_map(|b| b.placements.clone()).collect();
            let home_of = |logical: u64| staged.iter().find(|s| s.logical == logical).unwrap().home;
            for p in &placed {
                let home_range = home_of(p.logical) / free.range_blocks;
                let range = p.target / free.range_blocks;
                if range.abs_diff(home_range) <= window {
                    continue;
                }
                // Every free block of the window went to some block of this plan.
                let lo = home_range.saturating_sub(window) * free.range_blocks;
                let hi = ((home_range + window + 1).min(free.ranges)) * free.range_blocks;
                let taken: HashSet<u64> = placed.iter().map(|q| q.target).collect();
                for b in lo..hi {
                    prop_assert!(!free.is_free(b) || taken.contains(&b),
                        "block {} left its window while {} was free", p.logical, b);
                }
            }
        }

        /// The paper's workload: each staged block freed its old block in its home range, so
        /// every block finds room at home.
        #[test]
        fn blocks_that_freed_their_old_block_all_stay_in_their_home_range(
            ranges in 2u64..10, range_blocks in 8u64..32, picks in proptest::collection::vec(any::<u64>(), 1..60)
        ) {
            let blocks = ranges * range_blocks;
            let mut free = TestFree { ranges, range_blocks, free: HashSet::new() };
            let mut staged = Vec::new();
            let mut seen = HashSet::new();
            for (i, pick) in picks.into_iter().enumerate() {
                let logical = pick % blocks;
                if !seen.insert(logical) { continue; }
                // Pristine layout (home = logical); the staged write freed a block of its
                // range (not necessarily its own: an earlier destage may have moved it).
                let range = logical / range_blocks;
                let old = range * range_blocks + (pick / blocks) % range_blocks;
                if !free.free.insert(old) { continue; }
                staged.push(Staged { logical, slot: i as u64, home: logical });
            }
            let params = PlanParams { extent_blocks: 64, window_ranges: 1, strand: 8 };
            let plan = plan(&staged, &free, params).unwrap();
            prop_assert_eq!(plan.stats.in_home_range, staged.len() as u64);
        }
    }
}
