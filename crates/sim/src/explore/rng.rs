//! The explorer's choices, drawn from ChaCha8 (whose output is fixed across versions, so a
//! seed names the same run on any machine and any later build).

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct Picks(ChaCha8Rng);

impl Picks {
    pub fn new(seed: u64) -> Self {
        Picks(ChaCha8Rng::seed_from_u64(seed))
    }

    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.0
    }

    /// One of `0..bound` (0 when `bound` is 0).
    pub fn next(&mut self, bound: u64) -> u64 {
        if bound <= 1 {
            0
        } else {
            self.0.random_range(0..bound)
        }
    }

    /// One of `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next(high - low + 1)
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.next(n) == 0
    }

    pub fn one_of<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.next(items.len() as u64) as usize]
    }

    /// Sometimes one of `values`, sometimes none (the option left to its default).
    pub fn maybe(&mut self, values: &[&str]) -> Option<String> {
        (self.next(3) != 0).then(|| self.one_of(values).to_string())
    }

    /// Removes `count` random items of `from` and returns them.
    pub fn take<T>(&mut self, from: &mut Vec<T>, count: usize) -> Vec<T> {
        (0..count)
            .map(|_| from.remove(self.next(from.len() as u64) as usize))
            .collect()
    }
}
