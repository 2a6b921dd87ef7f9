//! Network RAID-10 across bricks (RAIN-10, RIBD §2.8), the placement and replica policy: the
//! volume is striped in `unit`-byte units over mirror sets of bricks; a write goes to every
//! brick of its set that is up; a brick that is down has the regions written meanwhile marked
//! dirty, and when it returns only those are copied back to it (RIBD copied whole devices);
//! reads go round-robin over the bricks of the set that hold the region current.
//!
//! Pure policy: the caller does the I/O, says when a brick goes or returns, and reports each
//! region copied. A region is `region` bytes of a brick's address space.

use std::collections::BTreeSet;

use crate::interval::Brick;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RainError {
    #[error("every brick of mirror set {0} is down or stale there: the data is unavailable")]
    Unavailable(usize),
    #[error("brick {0} is the last current copy of a region of set {1}: it cannot go down")]
    LastCopy(Brick, usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum BrickState {
    Up,
    /// Down, or back but not yet copied to: the regions written while it was away.
    Stale {
        dirty: BTreeSet<u64>,
        down: bool,
    },
}

/// Where a byte of the volume lives: its mirror set and its offset on each brick of the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub set: usize,
    pub offset: u64,
}

pub struct Rain10 {
    unit: u64,
    region: u64,
    sets: Vec<Vec<Brick>>,
    state: Vec<BrickState>,
    /// Round-robin position per set.
    next_read: Vec<usize>,
}

impl Rain10 {
    /// `sets` lists each mirror set's bricks (every brick in exactly one set, numbered from 0).
    pub fn new(unit: u64, region: u64, sets: Vec<Vec<Brick>>) -> Self {
        let bricks = sets.iter().map(Vec::len).sum();
        assert!(unit > 0 && region > 0 && sets.iter().all(|s| !s.is_empty()));
        let mut seen: Vec<Brick> = sets.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..bricks).collect::<Vec<_>>(),
            "bricks 0..n, each once"
        );
        Rain10 {
            unit,
            region,
            next_read: vec![0; sets.len()],
            sets,
            state: vec![BrickState::Up; bricks],
        }
    }

    /// Where volume byte `at` lives (RAID-0 over the sets in `unit`s).
    pub fn place(&self, at: u64) -> Place {
        let n = self.sets.len() as u64;
        let stripe = at / self.unit;
        Place {
            set: (stripe % n) as usize,
            offset: (stripe / n) * self.unit + at % self.unit,
        }
    }

    /// The bricks a write at `place` goes to now (those up); marks the region dirty on the
    /// bricks of the set that are not current.
    pub fn write(&mut self, place: Place) -> Result<Vec<Brick>, RainError> {
        let region = place.offset / self.region;
        let mut targets = Vec::new();
        for &b in &self.sets[place.set] {
            match &mut self.state[b] {
                BrickState::Up => targets.push(b),
                BrickState::Stale { dirty, down: true } => {
                    dirty.insert(region);
                }
                // Back and being copied to: it takes new writes too. A region it holds current
                // stays so; a dirty one stays dirty until it is copied whole.
                BrickState::Stale { down: false, .. } => targets.push(b),
            }
        }
        if !targets.iter().any(|&b| self.current(b, region)) {
            return Err(RainError::Unavailable(place.set));
        }
        Ok(targets)
    }

    /// The brick to read `place` from: the next, round-robin, of the set's bricks that hold its
    /// region current.
    pub fn read_from(&mut self, place: Place) -> Result<Brick, RainError> {
        let region = place.offset / self.region;
        let set = &self.sets[place.set];
        for i in 0..set.len() {
            let b = set[(self.next_read[place.set] + i) % set.len()];
            if self.current(b, region) {
                self.next_read[place.set] = (self.next_read[place.set] + i + 1) % set.len();
                return Ok(b);
            }
        }
        Err(RainError::Unavailable(place.set))
    }

    /// `brick` went down (failed or unreachable). Refused if it holds the only current copy of
    /// a region its set has written while others were away.
    pub fn down(&mut self, brick: Brick) -> Result<(), RainError> {
        let set = self.set_of(brick);
        let others_stale: BTreeSet<u64> = (self.sets[set].iter())
            .filter(|&&b| b != brick)
            .filter_map(|&b| match &self.state[b] {
                BrickState::Stale { dirty, .. } => Some(dirty.iter().copied()),
                BrickState::Up => None,
            })
            .flatten()
            .collect();
        let others_down = (self.sets[set].iter())
            .filter(|&&b| b != brick)
            .all(|&b| matches!(self.state[b], BrickState::Stale { down: true, .. }));
        let sole = others_stale.iter().any(|&r| {
            self.current(brick, r)
                && (self.sets[set].iter())
                    .filter(|&&b| b != brick)
                    .all(|&b| !self.current(b, r))
        });
        if others_down || sole {
            return Err(RainError::LastCopy(brick, set));
        }
        self.state[brick] = match std::mem::replace(&mut self.state[brick], BrickState::Up) {
            BrickState::Up => BrickState::Stale {
                dirty: BTreeSet::new(),
                down: true,
            },
            BrickState::Stale { dirty, .. } => BrickState::Stale { dirty, down: true },
        };
        Ok(())
    }

    /// `brick` is back: returns the regions to copy to it from a current brick of its set.
    pub fn returned(&mut self, brick: Brick) -> Vec<u64> {
        match &mut self.state[brick] {
            BrickState::Stale { dirty, down } => {
                *down = false;
                let regions: Vec<u64> = dirty.iter().copied().collect();
                if regions.is_empty() {
                    self.state[brick] = BrickState::Up;
                }
                regions
            }
            BrickState::Up => Vec::new(),
        }
    }

    /// `region` was copied whole to `brick` (from a current brick, after any write to it that
    /// was in flight): it is current there. The brick is up once nothing is left.
    pub fn copied(&mut self, brick: Brick, region: u64) {
        if let BrickState::Stale { dirty, down: false } = &mut self.state[brick] {
            dirty.remove(&region);
            if dirty.is_empty() {
                self.state[brick] = BrickState::Up;
            }
        }
    }

    /// A brick of `brick`'s set that holds `region` current, other than `brick`: where to copy
    /// it from.
    pub fn source(&self, brick: Brick, region: u64) -> Option<Brick> {
        let set = self.set_of(brick);
        (self.sets[set].iter())
            .copied()
            .find(|&b| b != brick && self.current(b, region) && self.is_reachable(b))
    }

    /// `brick` is stale in `dirty` (as recorded when this host opened the volume): down until
    /// it is seen back and those regions are copied to it.
    pub fn restore(&mut self, brick: Brick, dirty: impl IntoIterator<Item = u64>) {
        self.state[brick] = BrickState::Stale {
            dirty: dirty.into_iter().collect(),
            down: true,
        };
    }

    /// Whether `brick` holds `region` current (and is reachable).
    pub fn is_current(&self, brick: Brick, region: u64) -> bool {
        self.current(brick, region)
    }

    /// Whether `brick` is down (failed or unreachable, not yet back).
    pub fn is_down(&self, brick: Brick) -> bool {
        !self.is_reachable(brick)
    }

    /// How many regions `brick` misses (to be copied back to it).
    pub fn missing(&self, brick: Brick) -> usize {
        match &self.state[brick] {
            BrickState::Up => 0,
            BrickState::Stale { dirty, .. } => dirty.len(),
        }
    }

    /// Whether `brick` is up and holds every region current.
    pub fn in_sync(&self, brick: Brick) -> bool {
        self.state[brick] == BrickState::Up
    }

    fn is_reachable(&self, brick: Brick) -> bool {
        !matches!(self.state[brick], BrickState::Stale { down: true, .. })
    }

    fn current(&self, brick: Brick, region: u64) -> bool {
        match &self.state[brick] {
            BrickState::Up => true,
            BrickState::Stale { dirty, down } => !down && !dirty.contains(&region),
        }
    }

    fn set_of(&self, brick: Brick) -> usize {
        (self.sets.iter())
            .position(|s| s.contains(&brick))
            .expect("a brick of this volume")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_go_round_the_sets_and_reads_round_the_replicas() {
        let mut r = Rain10::new(4096, 65536, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(r.place(0), Place { set: 0, offset: 0 });
        assert_eq!(r.place(4096 + 10), Place { set: 1, offset: 10 });
        assert_eq!(
            r.place(8192),
            Place {
                set: 0,
                offset: 4096
            }
        );
        let p = r.place(0);
        let (a, b) = (r.read_from(p).unwrap(), r.read_from(p).unwrap());
        assert_ne!(a, b, "reads alternate between the two copies");
    }

    #[test]
    fn a_brick_back_gets_only_the_regions_written_while_it_was_away() {
        let mut r = Rain10::new(4096, 65536, vec![vec![0, 1]]);
        r.down(1).unwrap();
        assert_eq!(r.write(r.place(0)).unwrap(), vec![0]);
        assert_eq!(r.write(r.place(3 * 65536)).unwrap(), vec![0]);
        assert_eq!(
            r.down(0),
            Err(RainError::LastCopy(0, 0)),
            "the only copy stays up"
        );
        assert_eq!(r.returned(1), vec![0, 3]);
        // Being copied to: it takes new writes, but reads of its dirty regions go to brick 0.
        assert_eq!(r.write(r.place(0)).unwrap(), vec![0, 1]);
        for _ in 0..3 {
            assert_eq!(r.read_from(r.place(0)).unwrap(), 0);
        }
        assert_eq!(r.source(1, 0), Some(0));
        r.copied(1, 0);
        assert!(!r.in_sync(1));
        r.copied(1, 3);
        assert!(r.in_sync(1));
    }
}
