//! The pure part of the map: where a prepared interval's writes wait, what its commit maps,
//! and which version keeps an overwritten unit's old data. The store does the I/O and the
//! transactions; these decide what they are, and are pinned by the tests below.

use std::collections::BTreeSet;

use bytes::Bytes;

use crate::record::StagedExtent;
use crate::space::UNIT;

/// Cuts the writes (offsets within the share) over the units allocated to them, in order:
/// each write gets whole units of its own, one per unit of the share it touches, and its
/// bytes sit at the same offset within a unit as at home. A commit can then map a unit the
/// write covers whole, and fill in around one it covers in part.
pub fn place(writes: &[(u64, Bytes)], runs: &[(u64, u64)], home_offset: u64) -> Vec<StagedExtent> {
    let mut units = runs
        .iter()
        .flat_map(|&(start, len)| (start..start + len).step_by(UNIT as usize));
    let mut extents: Vec<StagedExtent> = Vec::new();
    for (offset, data) in writes {
        let (start, end) = (
            home_offset + offset,
            home_offset + offset + data.len() as u64,
        );
        let mut at = start;
        while at < end {
            let unit_end = (at / UNIT + 1) * UNIT;
            let piece_end = unit_end.min(end);
            let staging = units.next().expect("a unit for each unit written") + at % UNIT;
            let len = (piece_end - at) as u32;
            // Contiguous at home and in staging, and of the same write: one extent.
            let joins = extents.last().is_some_and(|last| {
                at != start
                    && last.home + u64::from(last.len) == at
                    && last.staging + u64::from(last.len) == staging
                    && u64::from(last.len) + u64::from(len) <= u64::from(u32::MAX / 2)
            });
            if joins {
                extents.last_mut().expect("joins an extent").len += len;
            } else {
                extents.push(StagedExtent {
                    home: at,
                    staging,
                    len,
                    crc: None,
                });
            }
            at = piece_end;
        }
    }
    extents
}

/// How many units the writes need: one per unit of the share each write touches.
pub fn units_needed(writes: &[(u64, Bytes)]) -> u64 {
    writes
        .iter()
        .map(|(offset, data)| {
            let end = offset + data.len() as u64;
            end.div_ceil(UNIT) - offset / UNIT
        })
        .sum()
}

/// One piece of a staged write, within one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Bytes `[from, to)` within the unit.
    pub from: u64,
    pub to: u64,
    /// The staging unit (its device offset) holding them at the same offsets.
    pub unit: u64,
}

/// What a commit does to one unit of the share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitCommit {
    /// The unit's home (device offset): its name in the map.
    pub home: u64,
    /// The staging unit that becomes the unit's data: the last write's.
    pub target: Piece,
    /// Earlier pieces of the interval in this unit, in write order. With the current data
    /// under them, they fill what the target's own write leaves out.
    pub earlier: Vec<Piece>,
}

impl UnitCommit {
    /// The target holds the whole unit already: nothing to fill in.
    pub fn whole(&self) -> bool {
        self.target.from == 0 && self.target.to == UNIT
    }
}

/// What a commit maps, unit by unit (ascending), and the staging units it leaves unused (an
/// earlier write's, overwritten within the interval), to be freed.
pub fn commit_plan(extents: &[StagedExtent]) -> (Vec<UnitCommit>, Vec<u64>) {
    // Every piece under its home unit, in one vector sorted by unit; the sort is stable, so
    // a unit's pieces stay in write order. (A map of one vector per unit allocated 256 times
    // for a 1 MiB interval: allocation was the largest CPU cost intervals added, perf.)
    let mut pieces: Vec<(u64, Piece)> = Vec::new();
    for extent in extents {
        let end = extent.home + u64::from(extent.len);
        let mut at = extent.home;
        while at < end {
            let home = at / UNIT * UNIT;
            let to = (home + UNIT).min(end);
            let staging = extent.staging + (at - extent.home);
            pieces.push((
                home,
                Piece {
                    from: at - home,
                    to: to - home,
                    unit: staging / UNIT * UNIT,
                },
            ));
            at = to;
        }
    }
    pieces.sort_by_key(|&(home, _)| home);
    let mut unused = BTreeSet::new();
    let mut plan = Vec::new();
    for unit in pieces.chunk_by(|a, b| a.0 == b.0) {
        let (&(home, target), earlier) = unit.split_last().expect("a unit has a piece");
        // Empty for a unit written once, as most are: no allocation.
        let earlier: Vec<Piece> = earlier.iter().map(|&(_, piece)| piece).collect();
        for piece in &earlier {
            if piece.unit != target.unit {
                unused.insert(piece.unit);
            }
        }
        plan.push(UnitCommit {
            home,
            target,
            earlier,
        });
    }
    // A unit the target of another home unit uses is not unused (cannot happen: a write's
    // units are its own, one per home unit), kept out for safety.
    for commit in &plan {
        unused.remove(&commit.target.unit);
    }
    (plan, unused.into_iter().collect())
}

/// The version that keeps a unit's old data when an interval tagged `tag` overwrites it:
/// the newest version no newer than the tag, unless that version keeps its own copy of the
/// unit already (then the old data is the current content only, and nobody keeps it).
/// `None` when no version is that old. Versions newer than the tag hold no copy of the
/// unit: per unit, intervals commit in tag order, so they see this write as the current.
pub fn keeper(versions: &BTreeSet<u64>, tag: u64, has_copy: impl Fn(u64) -> bool) -> Option<u64> {
    let newest = *versions.range(..=tag).next_back()?;
    (!has_copy(newest)).then_some(newest)
}

/// Which version's copy a read of version `number` finds for a unit: the oldest version at
/// or after `number` that keeps a copy. `None`: the unit is unchanged since, read the
/// current map.
pub fn resolve(
    versions: &BTreeSet<u64>,
    number: u64,
    has_copy: impl Fn(u64) -> bool,
) -> Option<u64> {
    versions.range(number..).copied().find(|&v| has_copy(v))
}

/// Merges sorted `(start, len)` pieces into runs where each starts where the last ended.
pub fn coalesce(pieces: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (start, len) in pieces {
        match runs.last_mut() {
            Some((run_start, run_len)) if *run_start + *run_len == start => *run_len += len,
            _ => runs.push((start, len)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: u64 = 1 << 20;
    const POOL: u64 = 1 << 30;

    fn write(offset: u64, len: usize) -> (u64, Bytes) {
        (offset, Bytes::from(vec![0u8; len]))
    }

    #[test]
    fn a_write_keeps_its_offset_within_each_unit() {
        // 512 bytes at 3584 straddle units 0 and 1 of the share: two units, two pieces.
        let writes = [write(3584, 1024), write(8192, 8192)];
        assert_eq!(units_needed(&writes), 4);
        // The first write's two units are apart: two extents. The second's touch: one.
        let runs = [
            (POOL, UNIT),
            (POOL + 5 * UNIT, UNIT),
            (POOL + 10 * UNIT, 2 * UNIT),
        ];
        let extents = place(&writes, &runs, HOME);
        assert_eq!(
            extents,
            vec![
                StagedExtent {
                    home: HOME + 3584,
                    staging: POOL + 3584,
                    len: 512,
                    crc: None,
                },
                StagedExtent {
                    home: HOME + 4096,
                    staging: POOL + 5 * UNIT,
                    len: 512,
                    crc: None,
                },
                StagedExtent {
                    home: HOME + 8192,
                    staging: POOL + 10 * UNIT,
                    len: 8192,
                    crc: None,
                },
            ]
        );
        let (plan, unused) = commit_plan(&extents);
        assert!(unused.is_empty());
        assert_eq!(plan.len(), 4);
        assert_eq!(plan[0].home, HOME);
        assert_eq!(
            plan[0].target,
            Piece {
                from: 3584,
                to: 4096,
                unit: POOL
            }
        );
        assert!(!plan[0].whole() && !plan[1].whole());
        assert!(plan[2].whole() && plan[3].whole());
        assert_eq!(plan[3].target.unit, POOL + 11 * UNIT);
    }

    #[test]
    fn the_last_write_to_a_unit_is_its_target_and_earlier_ones_fill_in() {
        // Unit 0 whole, then its first sector again: the second is the target, the first
        // fills in the rest of the unit.
        let writes = [write(0, 4096), write(0, 512)];
        let runs = [(POOL, 2 * UNIT)];
        let extents = place(&writes, &runs, HOME);
        let (plan, unused) = commit_plan(&extents);
        assert_eq!(plan.len(), 1);
        assert_eq!(
            plan[0].target,
            Piece {
                from: 0,
                to: 512,
                unit: POOL + UNIT
            }
        );
        assert_eq!(
            plan[0].earlier,
            vec![Piece {
                from: 0,
                to: 4096,
                unit: POOL
            }]
        );
        assert_eq!(unused, vec![POOL]);
        // The other way round: the whole unit wins, the sector's unit goes unused.
        let extents = place(&[write(0, 512), write(0, 4096)], &runs, HOME);
        let (plan, unused) = commit_plan(&extents);
        assert!(plan[0].whole());
        assert_eq!(unused, vec![POOL]);
    }

    #[test]
    fn old_data_goes_to_the_newest_version_no_newer_than_the_tag() {
        let versions: BTreeSet<u64> = [2, 5, 9].into();
        assert_eq!(
            keeper(&versions, 1, |_| false),
            None,
            "no version is that old"
        );
        assert_eq!(keeper(&versions, 5, |_| false), Some(5));
        assert_eq!(
            keeper(&versions, 8, |_| false),
            Some(5),
            "a straggler before cut 9"
        );
        assert_eq!(keeper(&versions, 12, |_| false), Some(9));
        assert_eq!(
            keeper(&versions, 12, |v| v == 9),
            None,
            "9 has its copy: free it"
        );
        // Reading version 3 finds 5's copy, or the current data when none is kept.
        assert_eq!(resolve(&versions, 3, |v| v == 5 || v == 9), Some(5));
        assert_eq!(resolve(&versions, 6, |v| v == 5), None);
        assert_eq!(resolve(&versions, 2, |v| v == 2), Some(2));
    }

    #[test]
    fn runs_coalesce_only_where_they_touch() {
        assert_eq!(coalesce([(0, 4), (4, 4), (12, 4)]), vec![(0, 8), (12, 4)]);
    }
}
