//! Clotho's versions of a thin volume, as policy with no I/O: which epoch a write goes to,
//! which epochs see which data, which data a write may overwrite in place, and which data a
//! deletion frees.
//!
//! A volume's history is a tree of *epochs*. Writes go to the current epoch; taking a
//! snapshot pins the current epoch and starts a new one whose parent it is; a rollback starts
//! a new epoch whose parent is the snapshot's. A version (a snapshot, or the volume now) at
//! epoch `w` sees data written in epoch `e` exactly when `e` is `w` or one of its ancestors.
//!
//! Each virtual extent of a volume keeps a *chain* of physical extents, newest first, each
//! written in one epoch and defining some of the extent's 4 KiB granules (as data or as
//! zeros). A version reads a granule from the newest extent of the chain it sees that defines
//! it (remap-on-write: the first write after a snapshot lands in a new extent, and the rest of
//! the old extent is never copied). The newest extent may be written in place only when no
//! pinned epoch other than the current one sees it (`Lineage::shared_limit`).

use std::collections::BTreeMap;

/// An epoch number: 0 when the volume is created, +1 at every snapshot and rollback.
pub type Epoch = u32;

/// The tree of a volume's epochs: the current one, and the epochs whose parent is not the
/// epoch before them (the first epoch after each rollback).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    pub current: Epoch,
    /// Epoch → its parent, where the parent is not `epoch - 1`.
    pub jumps: BTreeMap<Epoch, Epoch>,
}

impl Lineage {
    /// The epoch `epoch` continues from (None for epoch 0, the root).
    pub fn parent(&self, epoch: Epoch) -> Option<Epoch> {
        self.jumps
            .get(&epoch)
            .copied()
            .or_else(|| epoch.checked_sub(1))
    }

    /// Whether a version at epoch `at` sees what was written in epoch `written`: `written` is
    /// `at` or one of its ancestors. O(number of rollbacks).
    pub fn sees(&self, at: Epoch, written: Epoch) -> bool {
        let mut top = at;
        loop {
            if written > top {
                return false;
            }
            // Epochs start..=top are consecutive: each one's parent is the one before.
            match self.jumps.range(..=top).next_back() {
                None => return true,
                Some((&start, _)) if written >= start => return true,
                Some((_, &parent)) => top = parent,
            }
        }
    }

    /// The newest epoch that both `a` and `b` see: where their histories part.
    pub fn meet(&self, a: Epoch, b: Epoch) -> Epoch {
        // Along `a`'s ancestry, "b sees it" holds for a prefix from the root: search it.
        let mut top = a;
        loop {
            let (start, parent) = match self.jumps.range(..=top).next_back() {
                Some((&start, &parent)) => (start, Some(parent)),
                None => (0, None),
            };
            if self.sees(b, start) {
                // The answer is in start..=top: the largest epoch there that b sees.
                let (mut lo, mut hi) = (start, top);
                while lo < hi {
                    let mid = lo + (hi - lo).div_ceil(2);
                    if self.sees(b, mid) {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
                return lo;
            }
            match parent {
                Some(parent) => top = parent,
                // Every epoch descends from 0, which both see.
                None => return 0,
            }
        }
    }

    /// The newest epoch, on the current epoch's path, that some pinned epoch other than the
    /// current one also sees. An extent the current epoch sees whose epoch is at most this
    /// is shared with a version and must not be written in place; None: nothing is shared.
    pub fn shared_limit(&self, pinned: impl IntoIterator<Item = Epoch>) -> Option<Epoch> {
        pinned
            .into_iter()
            .filter(|&p| p != self.current)
            .map(|p| self.meet(p, self.current))
            .max()
    }

    /// Pins nothing by itself: starts a new epoch after the current one (a snapshot pins the
    /// one it leaves). Returns the epoch left behind.
    pub fn advance(&mut self) -> Epoch {
        let left = self.current;
        self.current += 1;
        left
    }

    /// Starts a new epoch continuing from `to` (a rollback): the current epoch's own writes
    /// are then seen by no one unless a snapshot pins it.
    pub fn branch(&mut self, to: Epoch) {
        assert!(to <= self.current, "branch to a future epoch {to}");
        self.current += 1;
        if to != self.current - 1 {
            self.jumps.insert(self.current, to);
        }
    }
}

/// A set of granules of one extent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granules {
    words: Vec<u64>,
    len: u64,
}

impl Granules {
    pub fn empty(len: u64) -> Granules {
        Granules {
            words: vec![0; len.div_ceil(64) as usize],
            len,
        }
    }

    pub fn from_fn(len: u64, member: impl Fn(u64) -> bool) -> Granules {
        let mut set = Granules::empty(len);
        for g in (0..len).filter(|&g| member(g)) {
            set.insert(g);
        }
        set
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn insert(&mut self, g: u64) {
        assert!(g < self.len);
        self.words[(g / 64) as usize] |= 1 << (g % 64);
    }

    pub fn contains(&self, g: u64) -> bool {
        g < self.len && self.words[(g / 64) as usize] & (1 << (g % 64)) != 0
    }

    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    pub fn is_full(&self) -> bool {
        self.count() == self.len
    }

    pub fn union_with(&mut self, other: &Granules) {
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w |= o;
        }
    }

    /// The granules of `self` not in `other`.
    pub fn minus(&self, other: &Granules) -> Granules {
        Granules {
            words: (self.words.iter().zip(&other.words))
                .map(|(w, o)| w & !o)
                .collect(),
            len: self.len,
        }
    }

    pub fn intersection(&self, other: &Granules) -> Granules {
        Granules {
            words: (self.words.iter().zip(&other.words))
                .map(|(w, o)| w & o)
                .collect(),
            len: self.len,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len).filter(|&g| self.contains(g))
    }
}

/// One physical extent of a chain as the policy sees it: the epoch it was written in and the
/// granules it defines (holds data for, or holds as zeros).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub epoch: Epoch,
    pub defines: Granules,
}

/// Which granules of each link (a chain, newest first) some pinned epoch reads from it. A
/// link with none is garbage; a granule not needed is dead in that link.
pub fn needed(chain: &[Link], lineage: &Lineage, pinned: &[Epoch]) -> Vec<Granules> {
    readers(chain, lineage, pinned).needed
}

/// Granules a pinned epoch does not read from the chain: a compacted snapshot's delta gives
/// them (None: it reads the chain for every granule).
pub type Given<'a> = &'a dyn Fn(Epoch) -> Option<Granules>;

/// [`needed`], for pinned epochs some of which are given some granules.
pub fn needed_given(
    chain: &[Link],
    lineage: &Lineage,
    pinned: &[Epoch],
    given: Given,
) -> Vec<Granules> {
    readers_given(chain, lineage, pinned, given).needed
}

/// What compacting the version at `at` may take out of a chain (newest first): per link, the
/// granules `at` reads from it, when no epoch of `others` reads anything from that link (the
/// link is then freed and the version's granules kept as a delta); empty otherwise.
pub fn compactable(
    chain: &[Link],
    lineage: &Lineage,
    at: Epoch,
    others: &[Epoch],
    given: Given,
) -> Vec<Granules> {
    let mine = needed_given(chain, lineage, &[at], given);
    let theirs = needed_given(chain, lineage, others, given);
    mine.into_iter()
        .zip(theirs)
        .map(|(mine, theirs)| {
            if theirs.is_empty() {
                mine
            } else {
                Granules::empty(mine.len())
            }
        })
        .collect()
}

/// What each pinned epoch reads from a chain, and which of it no other pinned epoch reads.
pub struct Readers {
    /// Per link: the granules some pinned epoch reads from it.
    pub needed: Vec<Granules>,
    /// Per pinned epoch (in the order given): granules it reads that no other pinned epoch
    /// reads from the same link (its own space), and granules it shares.
    pub unique: Vec<u64>,
    pub shared: Vec<u64>,
}

/// Resolves every pinned epoch's reads of one chain (newest first). O(pinned × links).
pub fn readers(chain: &[Link], lineage: &Lineage, pinned: &[Epoch]) -> Readers {
    readers_given(chain, lineage, pinned, &|_| None)
}

/// [`readers`], for pinned epochs some of which are given some granules.
pub fn readers_given(chain: &[Link], lineage: &Lineage, pinned: &[Epoch], given: Given) -> Readers {
    debug_assert!(
        chain.windows(2).all(|w| w[0].epoch > w[1].epoch),
        "a chain runs newest first, one link per epoch"
    );
    let len = chain.first().map_or(0, |l| l.defines.len());
    let mut reads: Vec<Vec<Granules>> = Vec::with_capacity(pinned.len());
    for &at in pinned {
        let mut covered = given(at).unwrap_or_else(|| Granules::empty(len));
        let mut from = Vec::with_capacity(chain.len());
        for link in chain {
            if lineage.sees(at, link.epoch) && !covered.is_full() {
                let fresh = link.defines.minus(&covered);
                covered.union_with(&link.defines);
                from.push(fresh);
            } else {
                from.push(Granules::empty(len));
            }
        }
        reads.push(from);
    }
    let mut needed = vec![Granules::empty(len); chain.len()];
    let mut twice = vec![Granules::empty(len); chain.len()];
    for from in &reads {
        for (i, fresh) in from.iter().enumerate() {
            twice[i].union_with(&needed[i].intersection(fresh));
            needed[i].union_with(fresh);
        }
    }
    let unique = reads
        .iter()
        .map(|from| {
            (from.iter().zip(&twice))
                .map(|(fresh, twice)| fresh.minus(twice).count())
                .sum()
        })
        .collect::<Vec<u64>>();
    let shared = reads
        .iter()
        .zip(&unique)
        .map(|(from, unique)| from.iter().map(Granules::count).sum::<u64>() - unique)
        .collect();
    Readers {
        needed,
        unique,
        shared,
    }
}

/// A snapshot's name: 1 to 64 characters from `A-Z a-z 0-9 . _ -`, not starting with `.` or
/// `-` (it is part of an export name, `pool/volume@snapshot`).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > 64 {
        return Err(format!("snapshot name {name:?} must be 1 to 64 characters"));
    }
    if !name.chars().all(ok_char) || name.starts_with(['.', '-']) {
        return Err(format!(
            "snapshot name {name:?}: use letters, digits, '.', '_' and '-' (not first)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(len: u64, members: &[u64]) -> Granules {
        Granules::from_fn(len, |g| members.contains(&g))
    }

    #[test]
    fn compaction_takes_only_links_no_other_version_reads() {
        // Snapshots at 0 and 1, the volume at 2. Extent of 4 granules: epoch 0 wrote all,
        // epoch 1 rewrote granule 1, epoch 2 (the volume) rewrote granules 1 and 2.
        let lineage = Lineage {
            current: 2,
            jumps: Default::default(),
        };
        let chain = vec![
            Link {
                epoch: 2,
                defines: set(4, &[1, 2]),
            },
            Link {
                epoch: 1,
                defines: set(4, &[1]),
            },
            Link {
                epoch: 0,
                defines: set(4, &[0, 1, 2, 3]),
            },
        ];
        // Compacting snapshot 1 against the volume: only the epoch-1 link is its alone.
        let none = |_| None;
        let take = compactable(&chain, &lineage, 1, &[0, 2], &none);
        assert_eq!(take, vec![set(4, &[]), set(4, &[1]), set(4, &[])]);
        // Snapshot 0 shares its link with snapshot 1 (granules 0, 2, 3): nothing to take.
        let take = compactable(&chain, &lineage, 0, &[1, 2], &none);
        assert!(take.iter().all(Granules::is_empty));
        // With snapshot 1 gone, the epoch-1 link is garbage, not snapshot 0's: still nothing.
        let take = compactable(&chain, &lineage, 0, &[2], &none);
        assert_eq!(take, vec![set(4, &[]), set(4, &[]), set(4, &[])]);
        // Snapshot 1 compacted, its delta giving granule 1: with its own link gone it must
        // not fall through to the epoch-0 link's granule 1, which then no one reads.
        let compacted = |e: Epoch| (e == 1).then(|| set(4, &[1]));
        let needed_now = needed_given(&chain[2..], &lineage, &[1], &compacted);
        assert_eq!(needed_now, vec![set(4, &[0, 2, 3])]);
        let falls_through = needed(&chain[2..], &lineage, &[1]);
        assert_eq!(falls_through, vec![set(4, &[0, 1, 2, 3])]);
    }

    #[test]
    fn a_line_of_snapshots_sees_its_past_only() {
        let mut lineage = Lineage::default();
        assert_eq!(lineage.advance(), 0);
        assert_eq!(lineage.advance(), 1);
        assert_eq!(lineage.current, 2);
        assert!(lineage.sees(2, 0) && lineage.sees(2, 1) && lineage.sees(2, 2));
        assert!(lineage.sees(1, 0) && !lineage.sees(1, 2));
        assert_eq!(lineage.meet(0, 2), 0);
        assert_eq!(lineage.shared_limit([0, 1, 2]), Some(1));
        assert_eq!(lineage.shared_limit([2]), None);
    }

    #[test]
    fn a_rollback_hides_the_abandoned_epochs_from_the_volume_but_not_from_their_snapshots() {
        // Snapshots at 0, 1 and 2; roll back to 1: epoch 4 continues from 1 (3 was the head).
        let mut lineage = Lineage::default();
        for _ in 0..3 {
            lineage.advance();
        }
        lineage.branch(1);
        assert_eq!(lineage.current, 4);
        assert_eq!(lineage.parent(4), Some(1));
        assert!(lineage.sees(4, 1) && lineage.sees(4, 0));
        assert!(!lineage.sees(4, 2) && !lineage.sees(4, 3));
        assert!(
            lineage.sees(2, 1),
            "the later snapshot still sees its own past"
        );
        assert_eq!(lineage.meet(2, 4), 1);
        assert_eq!(lineage.meet(3, 4), 1);
        // Snapshot 2 shares with the volume only what both see: up to epoch 1.
        assert_eq!(lineage.shared_limit([0, 2, 4]), Some(1));
        assert_eq!(lineage.shared_limit([2, 4]), Some(1));
        // Writes in 4 then snapshot, roll back to 2 again.
        lineage.advance();
        lineage.branch(2);
        assert_eq!(lineage.current, 6);
        assert!(lineage.sees(6, 2) && lineage.sees(6, 1) && !lineage.sees(6, 4));
        assert_eq!(lineage.meet(4, 6), 1);
        assert_eq!(lineage.meet(5, 6), 1);
    }

    #[test]
    fn the_newest_link_a_version_sees_defines_each_granule() {
        // Extent of 4 granules. Epoch 0 wrote all four; snapshot; epoch 1 rewrote granule 1;
        // snapshot; epoch 2 rewrote granule 2.
        let mut lineage = Lineage::default();
        lineage.advance();
        lineage.advance();
        let chain = vec![
            Link {
                epoch: 2,
                defines: set(4, &[2]),
            },
            Link {
                epoch: 1,
                defines: set(4, &[1]),
            },
            Link {
                epoch: 0,
                defines: set(4, &[0, 1, 2, 3]),
            },
        ];
        let got = readers(&chain, &lineage, &[0, 1, 2]);
        assert_eq!(got.needed[0], set(4, &[2]));
        assert_eq!(got.needed[1], set(4, &[1]));
        assert_eq!(got.needed[2], set(4, &[0, 1, 2, 3]));
        // Epoch 0 alone reads granule 1 of the oldest link: unique to it.
        assert_eq!(got.unique, vec![1, 0, 1]);
        assert_eq!(got.shared, vec![3, 4, 3]);
        // Delete snapshot 1: granule 1 of link 1 is then read by epoch 2 still.
        let without_1 = readers(&chain, &lineage, &[0, 2]);
        assert_eq!(without_1.needed[1], set(4, &[1]));
        // Delete snapshot 0 as well: granule 1 of the oldest link is garbage.
        let only_now = needed(&chain, &lineage, &[2]);
        assert_eq!(only_now[2], set(4, &[0, 3]));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("daily-2026.11.25_0100").is_ok());
        for bad in ["", "-x", ".x", "a/b", "a@b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    /// The reference: walk the parents one at a time.
    fn ancestors(lineage: &Lineage, at: Epoch) -> Vec<Epoch> {
        let mut out = vec![at];
        let mut e = at;
        while let Some(p) = lineage.parent(e) {
            out.push(p);
            e = p;
        }
        out
    }

    proptest! {
        #[test]
        fn sees_and_meet_agree_with_walking_the_parents(
            steps in proptest::collection::vec((any::<bool>(), any::<u32>()), 0..40),
            a in any::<u32>(),
            b in any::<u32>(),
        ) {
            let mut lineage = Lineage::default();
            for (rollback, to) in steps {
                if rollback {
                    let to = to % (lineage.current + 1);
                    lineage.branch(to);
                } else {
                    lineage.advance();
                }
            }
            let a = a % (lineage.current + 1);
            let b = b % (lineage.current + 1);
            let of_a = ancestors(&lineage, a);
            for written in 0..=lineage.current {
                prop_assert_eq!(lineage.sees(a, written), of_a.contains(&written));
            }
            let of_b = ancestors(&lineage, b);
            let meet = of_a.iter().copied().filter(|e| of_b.contains(e)).max().unwrap();
            prop_assert_eq!(lineage.meet(a, b), meet);
        }
    }
}
