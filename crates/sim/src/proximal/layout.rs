//! The workload's addresses, drawn from the seed, and the write-anywhere baseline's layout.
//!
//! - [`updates`]: exactly `per_extent` random 4 KiB updates in each filled extent (uniform
//!   offsets, with replacement), the extents interleaved in a random order.
//! - [`HolePlugging`]: the paper's write-anywhere baseline (§5.2): no staging, each small
//!   write goes to the next free block after the previous one (greedy hole plugging, wrapping
//!   round), and frees the block it replaces; no cleaner. A pure allocator: only the layout it
//!   leaves is read back through the simulated raid5 (Table 3).

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One update: (extent, block within the extent).
pub type Update = (u64, u64);

/// `per_extent` updates in each of `extents` extents of `blocks` blocks, shuffled.
pub fn updates(extents: u64, blocks: u64, per_extent: u64, seed: u64) -> Vec<Update> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut list: Vec<Update> = (0..extents)
        .flat_map(|e| (0..per_extent).map(move |_| (e, 0)))
        .collect();
    for update in &mut list {
        update.1 = rng.random_range(0..blocks);
    }
    // Fisher-Yates.
    for i in (1..list.len()).rev() {
        let j = rng.random_range(0..=i as u64) as usize;
        list.swap(i, j);
    }
    list
}

/// A random order of `n` items.
pub fn order(n: u64, seed: u64) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut items: Vec<u64> = (0..n).collect();
    for i in (1..items.len()).rev() {
        let j = rng.random_range(0..=i as u64) as usize;
        items.swap(i, j);
    }
    items
}

/// Logical block → physical block of a write-anywhere volume that plugs holes greedily.
pub struct HolePlugging {
    map: Vec<u64>,
    free: Vec<bool>,
    cursor: u64,
}

impl HolePlugging {
    /// `filled` logical blocks written serially at the start of `physical` blocks.
    pub fn filled(filled: u64, physical: u64) -> HolePlugging {
        assert!(filled <= physical);
        HolePlugging {
            map: (0..filled).collect(),
            free: (0..physical).map(|p| p >= filled).collect(),
            cursor: filled,
        }
    }

    /// A new version of logical block `logical`: the next free block at or after the cursor.
    pub fn write(&mut self, logical: u64) {
        let n = self.free.len() as u64;
        let mut p = self.cursor % n;
        while !self.free[p as usize] {
            p = (p + 1) % n;
        }
        self.free[p as usize] = false;
        let old = std::mem::replace(&mut self.map[logical as usize], p);
        self.free[old as usize] = true;
        self.cursor = p + 1;
    }

    pub fn physical(&self, logical: u64) -> u64 {
        self.map[logical as usize]
    }

    /// Physically consecutive runs (start, blocks) of the logical blocks `[first, first + n)`,
    /// in logical order: the scatter-gather pieces of one read.
    pub fn runs(&self, first: u64, n: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for logical in first..first + n {
            let p = self.physical(logical);
            match runs.last_mut() {
                Some((start, len)) if *start + *len == p => *len += 1,
                _ => runs.push((p, 1)),
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_extent_gets_its_updates_and_the_draw_is_the_seeds() {
        let list = updates(5, 4096, 100, 7);
        assert_eq!(list.len(), 500);
        for e in 0..5 {
            assert_eq!(list.iter().filter(|u| u.0 == e).count(), 100);
        }
        assert!(list.iter().all(|u| u.1 < 4096));
        assert_eq!(list, updates(5, 4096, 100, 7));
        assert_ne!(list, updates(5, 4096, 100, 8));
        let mut o = order(10, 3);
        o.sort();
        assert_eq!(o, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn hole_plugging_fills_the_tail_then_the_holes_and_scatters() {
        let mut layout = HolePlugging::filled(8, 10);
        layout.write(3); // to 8, frees 3
        layout.write(5); // to 9, frees 5
        layout.write(0); // wraps: first free from 10 % 10 = 0... 0 is live, 3 is free
        assert_eq!(layout.physical(3), 8);
        assert_eq!(layout.physical(5), 9);
        assert_eq!(layout.physical(0), 3);
        assert_eq!(
            layout.runs(0, 8),
            [(3, 1), (1, 2), (8, 1), (4, 1), (9, 1), (6, 2)]
        );
    }
}
