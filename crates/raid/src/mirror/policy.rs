//! Pure decisions of the mirror, kept apart from I/O so that each can be checked against
//! worked examples: which regions a request touches, which members may serve a read, which
//! metadata copy wins at open, and how member states are encoded.

use crate::refusal::Refusal;
use std::ops::Range;

/// What a member is to the mirror. Persisted per slot in the `mirror.members` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Holds every acknowledged write; may serve any read.
    InSync,
    /// Not used at all: failed, missing, or failed by the operator.
    Faulty,
    /// Being copied onto; bytes of the data area below `done` are current.
    Resyncing { done: u64 },
}

impl MemberState {
    /// 16 bytes: state (1 in-sync, 2 faulty, 3 resyncing), 7 zero bytes, `done` (u64 LE).
    /// Never all zeros, since the metadata service reads all-zero records as absent.
    pub fn encode(self) -> [u8; 16] {
        let (tag, done) = match self {
            MemberState::InSync => (1u8, 0),
            MemberState::Faulty => (2, 0),
            MemberState::Resyncing { done } => (3, done),
        };
        let mut out = [0u8; 16];
        out[0] = tag;
        out[8..].copy_from_slice(&done.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<MemberState> {
        if bytes.len() != 16 {
            return None;
        }
        let done = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
        match bytes[0] {
            1 => Some(MemberState::InSync),
            2 => Some(MemberState::Faulty),
            3 => Some(MemberState::Resyncing { done }),
            _ => None,
        }
    }

    /// Whether writes go to this member.
    pub fn receives_writes(self) -> bool {
        !matches!(self, MemberState::Faulty)
    }

    /// Whether this member may serve a read of `[offset, end)` of the data area.
    pub fn can_read(self, end: u64) -> bool {
        match self {
            MemberState::InSync => true,
            MemberState::Faulty => false,
            MemberState::Resyncing { done } => {
                end <= done
                    || strata_core::planted::planted(strata_core::planted::Bug::MirrorStaleLegRead)
            }
        }
    }

    pub fn label(self, size: u64) -> String {
        match self {
            MemberState::InSync => "in-sync".into(),
            MemberState::Faulty => "faulty".into(),
            MemberState::Resyncing { done } => {
                format!("resyncing {:.1} %", percent(done, size))
            }
        }
    }
}

pub fn percent(done: u64, total: u64) -> f64 {
    if total == 0 {
        100.0
    } else {
        done as f64 * 100.0 / total as f64
    }
}

/// The mirror-wide record, the blob `mirror.config`. Version 1, 32 bytes little-endian:
/// `version u32, members u32, data_offset u64, size u64, region u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MirrorRecord {
    pub members: u32,
    pub data_offset: u64,
    pub size: u64,
    pub region: u64,
}

pub const RECORD_VERSION: u32 = 1;

impl MirrorRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        out.extend_from_slice(&RECORD_VERSION.to_le_bytes());
        out.extend_from_slice(&self.members.to_le_bytes());
        out.extend_from_slice(&self.data_offset.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.region.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<MirrorRecord, String> {
        if bytes.len() != 32 {
            return Err(format!("mirror record of {} bytes, not 32", bytes.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let version = u32_at(0);
        if version != RECORD_VERSION {
            return Err(format!(
                "mirror record version {version}; this build reads {RECORD_VERSION}"
            ));
        }
        let record = MirrorRecord {
            members: u32_at(4),
            data_offset: u64_at(8),
            size: u64_at(16),
            region: u64_at(24),
        };
        if record.region == 0 || record.size == 0 {
            return Err(format!("mirror record {record:?} is not usable"));
        }
        Ok(record)
    }
}

/// Regions (of `region` bytes) that `[offset, offset + len)` touches. An empty range touches
/// none.
pub fn regions_of(offset: u64, len: u64, region: u64) -> Range<u64> {
    if len == 0 {
        return 0..0;
    }
    offset / region..(offset + len - 1) / region + 1
}

/// Byte range of region `r` in a data area of `size` bytes (the last one may be short).
pub fn region_bytes(r: u64, region: u64, size: u64) -> Range<u64> {
    let start = r * region;
    start..(start + region).min(size)
}

/// Pieces of at most `chunk` bytes covering `range`, for copies that must respect max_io.
pub fn chunks(range: Range<u64>, chunk: u64) -> Vec<Range<u64>> {
    assert!(chunk > 0);
    let mut out = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let end = (at + chunk).min(range.end);
        out.push(at..end);
        at = end;
    }
    out
}

/// Order in which to try members for a read: the members that may serve it, starting at the
/// round-robin position `turn`. When `pinned` is set (a region dirtied before a crash and not
/// yet resynced) that member goes first and alone decides the answer unless it fails, so that
/// two reads of the same bytes cannot see two different members' versions.
pub fn read_order(
    states: &[MemberState],
    end: u64,
    turn: usize,
    pinned: Option<usize>,
) -> Vec<usize> {
    let readable: Vec<usize> = (0..states.len())
        .filter(|&i| states[i].can_read(end))
        .collect();
    if readable.is_empty() {
        return readable;
    }
    let start = turn % readable.len();
    let mut order: Vec<usize> = readable[start..]
        .iter()
        .chain(&readable[..start])
        .copied()
        .collect();
    if let Some(p) = pinned {
        if let Some(pos) = order.iter().position(|&i| i == p) {
            order.remove(pos);
            order.insert(0, p);
        }
    }
    order
}

/// The member that dirty regions are copied from after a crash: the first in-sync one.
pub fn sync_source(states: &[MemberState]) -> Option<usize> {
    states.iter().position(|s| *s == MemberState::InSync)
}

/// What one member's copy of the metadata looked like at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyView {
    /// The member is absent from the assembly.
    Missing,
    /// No superblock and the whole region reads as zeros: never written.
    Blank,
    /// No superblock, but the region is not all zeros: both superblocks damaged, or a disk
    /// that was never this mirror's. Never formatted over; as a member it is unreadable
    /// metadata of unknown age (see `assemble_states`).
    Unlabelled(String),
    /// A superblock, but recovery refused (damage), with why, and the generation its newest
    /// readable superblock names (None if unknown).
    Damaged {
        why: String,
        generation: Option<u64>,
    },
    Valid {
        uuid: [u8; 16],
        owner: String,
        generation: u64,
        next_txn: u64,
        /// What this copy records about every slot (its `mirror.members` table).
        states: Vec<MemberState>,
    },
}

/// How to open, given every member's copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyChoice {
    /// No member has ever held a mirror: format.
    Format,
    /// Open from this member's copy; it is the newest.
    Open(usize),
}

/// Whether a copy's record of a slot says that slot's disk missed writes: faulty, or a
/// replacement that had not yet received anything. Such a disk's own copy is stale.
fn records_failed(state: Option<&MemberState>) -> bool {
    matches!(
        state,
        Some(MemberState::Faulty) | Some(MemberState::Resyncing { done: 0 })
    )
}

fn name_of(names: &[String], i: usize) -> String {
    names.get(i).cloned().unwrap_or_else(|| format!("#{i}"))
}

/// Which copy the mirror opens from.
///
/// Every non-faulty member receives the same metadata writes, so copies differ only by how far
/// a crash cut one short, or because a member stopped receiving them (failed, or assembled on
/// its own). The second case is what event counts exist for in md: a member's copy records
/// what it knows of the others. So:
/// - a copy whose slot another present copy records as failed (faulty, or a replacement at 0)
///   is *stale* and never chosen, however new it is: it went on without the others (a degraded
///   start of the old disk) or stopped before them;
/// - two copies that each record the other failed are a split brain: both went on alone, each
///   has writes the other lacks, and only the operator can say which to keep;
/// - among the rest the newest `(generation, next_txn)` wins: a checkpoint contains every
///   transaction of the generations before it, and within one more replayed batches is newer.
///
/// A copy recording its *own* slot as faulty cannot happen in place (a member is dropped from
/// the metadata fan-out before its fault is recorded): the children were reordered. Copies of
/// another store (uuid, owner) mean the configuration names a disk that is not this mirror's.
/// Formatting needs every member present with a blank region, and the server's `may_format`.
pub fn choose_copy(
    copies: &[CopyView],
    names: &[String],
    may_format: bool,
) -> Result<CopyChoice, Refusal> {
    let mut uuid_of: Option<(usize, [u8; 16])> = None;
    let mut valid = Vec::new();
    for (i, copy) in copies.iter().enumerate() {
        let CopyView::Valid {
            uuid,
            owner,
            states,
            ..
        } = copy
        else {
            continue;
        };
        let name = name_of(names, i);
        if owner != super::OWNER {
            return Err(Refusal::from(format!(
                "member {name} holds metadata of a `{owner}`, not a mirror"
            )));
        }
        if let Some((j, other)) = uuid_of {
            if other != *uuid {
                return Err(Refusal::from(format!(
                    "members {} and {name} hold metadata of two different mirrors",
                    name_of(names, j)
                )));
            }
        }
        uuid_of.get_or_insert((i, *uuid));
        if states.get(i) == Some(&MemberState::Faulty) {
            return Err(Refusal::from(format!(
                "member {name}'s metadata records its own slot as faulty: the children were \
                 reordered or a disk moved between slots; configure the disks in their \
                 original order"
            )));
        }
        valid.push(i);
    }
    let recorded = |j: usize, i: usize| match &copies[j] {
        CopyView::Valid { states, .. } => states.get(i).copied(),
        _ => None,
    };
    let failed_by = |i: usize, j: usize| j != i && records_failed(recorded(j, i).as_ref());
    // Only a copy that records itself in sync can have gone on alone: a member being filled
    // (a new leg, a replacement) never serves alone, so two of them that each record the
    // other at 0 are two replacements, not a split brain.
    let own_in_sync = |i: usize| recorded(i, i) == Some(MemberState::InSync);
    for &i in &valid {
        for &j in valid.iter().filter(|&&j| j > i) {
            if failed_by(i, j) && failed_by(j, i) && own_in_sync(i) && own_in_sync(j) {
                let (a, b) = (name_of(names, i), name_of(names, j));
                return Err(Refusal::from(format!(
                    "split brain: members {a} and {b} each record the other as failed, so each \
                     may hold writes the other lacks; assemble the one to keep alone with \
                     --degraded, then re-add the other with `strata replace`"
                )));
            }
        }
    }
    let fresh = valid
        .iter()
        .copied()
        .filter(|&i| !valid.iter().any(|&j| failed_by(i, j)));
    let key = |i: usize| match &copies[i] {
        CopyView::Valid {
            generation,
            next_txn,
            ..
        } => (*generation, *next_txn),
        _ => unreachable!("only valid copies are candidates"),
    };
    // Ties go to the lowest slot, so the choice does not depend on iteration details.
    let best = fresh.fold(None, |best: Option<usize>, i| match best {
        Some(b) if key(b) >= key(i) => Some(b),
        _ => Some(i),
    });
    if let Some(i) = best {
        return Ok(CopyChoice::Open(i));
    }
    if !valid.is_empty() {
        let all: Vec<String> = valid.iter().map(|&i| name_of(names, i)).collect();
        return Err(Refusal::from(format!(
            "split brain: every present copy ({}) is recorded as failed by another; assemble \
             the one to keep alone with --degraded, then re-add the others with `strata replace`",
            all.join(", ")
        )));
    }
    if let Some((i, why)) = copies.iter().enumerate().find_map(|(i, c)| match c {
        CopyView::Damaged { why, .. } | CopyView::Unlabelled(why) => Some((i, why)),
        _ => None,
    }) {
        return Err(Refusal::Damaged(format!(
            "no readable metadata copy, and member {}'s is damaged ({why}); refusing to \
             format over it: run `strata check`",
            name_of(names, i)
        )));
    }
    if copies.iter().all(|c| *c == CopyView::Missing) {
        return Err(Refusal::Refused("every member is missing".into()));
    }
    if copies.contains(&CopyView::Missing) {
        return Err(Refusal::Refused(
            "a new mirror needs every member present to format".into(),
        ));
    }
    if !may_format {
        return Err(Refusal::Refused(
            "the disks are labelled as holding this hierarchy but no member has mirror \
             metadata (zeroed, or never written); if this is a new layer, start it with \
             `strata serve --format LAYER`"
                .into(),
        ));
    }
    Ok(CopyChoice::Format)
}

/// Member states for the configured children once a copy is chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assembly {
    pub states: Vec<MemberState>,
    /// Members the chosen copy records in sync that are missing: started without them
    /// (allowed by `allow_degraded`), now faulty.
    pub missing_in_sync: Vec<usize>,
    /// Members whose valid copy is further behind the chosen one than a crash can leave a
    /// member in the fan-out: resynced from 0.
    pub behind: Vec<usize>,
}

/// How many generations a copy of a member that stayed in the metadata fan-out can lag the
/// newest: one checkpoint in flight when the power went (checkpoints run one at a time).
pub const CRASH_LAG: u64 = 1;

/// Reconciles the chosen copy's record (`recorded`, one state per recorded slot) with the
/// configured children:
/// - a slot the chosen copy records faulty stays faulty, whatever its disk holds: a disk
///   that missed writes comes back only through `strata replace` (a full resync);
/// - a missing child is faulty; if the chosen copy records it in sync, the mirror would start
///   without data it believes current: only with `allow_degraded`;
/// - a child that does not fit the data area (`fits` false) is faulty;
/// - a blank or unlabelled copy where the slot is not faulty is a disk swapped in offline:
///   resync from 0 (its contents are unknown). A damaged or older valid copy keeps its
///   slot's state (a crash during an open's rewrite can damage a copy; the data is not
///   suspect);
/// - a valid copy more than [`CRASH_LAG`] generations older than the chosen one, where the
///   chosen one records the slot in sync or resyncing, stopped receiving metadata while the
///   others went on: a disk that was replaced and is configured again in place of its
///   replacement (slots are positional; disks carry no identity). Its data is as old as its
///   copy: resync from 0 rather than trust the slot's state;
/// - children past the recorded slots are new members: resync from 0.
///
/// At least one present in-sync member must remain.
pub fn assemble_states(
    recorded: &[MemberState],
    winner_generation: u64,
    copies: &[CopyView],
    fits: &[bool],
    names: &[String],
    allow_degraded: bool,
) -> Result<Assembly, String> {
    let mut missing_in_sync = Vec::new();
    let mut unreadable = Vec::new();
    let mut behind = Vec::new();
    let states: Vec<MemberState> = copies
        .iter()
        .enumerate()
        .map(|(i, copy)| {
            let state = recorded
                .get(i)
                .copied()
                .unwrap_or(MemberState::Resyncing { done: 0 });
            match (copy, state) {
                (_, MemberState::Faulty) => MemberState::Faulty,
                (CopyView::Missing, MemberState::InSync) => {
                    missing_in_sync.push(i);
                    MemberState::Faulty
                }
                (CopyView::Missing, _) => MemberState::Faulty,
                (CopyView::Unlabelled(_), _) => {
                    unreadable.push(i);
                    MemberState::Faulty
                }
                (CopyView::Damaged { generation, .. }, _)
                    if generation.is_none_or(|g| g >= winner_generation) =>
                {
                    unreadable.push(i);
                    MemberState::Faulty
                }
                _ if !fits.get(i).copied().unwrap_or(false) => MemberState::Faulty,
                (CopyView::Blank, _) => MemberState::Resyncing { done: 0 },
                (CopyView::Valid { generation, .. }, _)
                    if generation.saturating_add(CRASH_LAG) < winner_generation =>
                {
                    behind.push(i);
                    MemberState::Resyncing { done: 0 }
                }
                (_, state) => state,
            }
        })
        .collect();
    let missing: Vec<String> = missing_in_sync.iter().map(|&i| name_of(names, i)).collect();
    let unasked = strata_core::planted::planted(strata_core::planted::Bug::MirrorDegradedUnasked);
    if !missing.is_empty() && !allow_degraded && !unasked {
        return Err(format!(
            "member(s) {} missing, and the newest metadata records them in sync; starting \
             without them needs `--degraded` (they will be marked faulty)",
            missing.join(", ")
        ));
    }
    let doubted: Vec<String> = unreadable.iter().map(|&i| name_of(names, i)).collect();
    if !doubted.is_empty() && !allow_degraded {
        return Err(format!(
            "member(s) {}: metadata damaged and possibly newer than every readable copy (it \
             may record the others as failed); run `strata check`; starting without them \
             needs `--degraded` (they will be marked faulty and serve nothing)",
            doubted.join(", ")
        ));
    }
    missing_in_sync.extend(unreadable);
    missing_in_sync.sort_unstable();
    if !states.contains(&MemberState::InSync) {
        return Err("no in-sync member is present".into());
    }
    Ok(Assembly {
        states,
        missing_in_sync,
        behind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_states_round_trip_and_are_never_all_zero() {
        for state in [
            MemberState::InSync,
            MemberState::Faulty,
            MemberState::Resyncing { done: 0 },
            MemberState::Resyncing { done: 3 << 30 },
        ] {
            let bytes = state.encode();
            assert_ne!(bytes, [0u8; 16]);
            assert_eq!(MemberState::decode(&bytes), Some(state));
        }
        assert_eq!(MemberState::decode(&[0u8; 16]), None);
    }

    #[test]
    fn record_round_trips_and_refuses_other_versions() {
        let record = MirrorRecord {
            members: 3,
            data_offset: 4 << 20,
            size: 1 << 30,
            region: 64 << 20,
        };
        let mut bytes = record.encode();
        assert_eq!(bytes.len(), 32);
        assert_eq!(MirrorRecord::decode(&bytes), Ok(record));
        bytes[0] = 2;
        assert!(MirrorRecord::decode(&bytes)
            .unwrap_err()
            .contains("version 2"));
    }

    #[test]
    fn regions_cover_exactly_the_touched_ones() {
        let region = 64 << 10;
        assert_eq!(regions_of(0, 512, region), 0..1);
        assert_eq!(regions_of(region - 512, 1024, region), 0..2);
        assert_eq!(regions_of(region, region, region), 1..2);
        assert_eq!(regions_of(5, 0, region), 0..0);
        assert_eq!(region_bytes(2, 100, 250), 200..250);
        assert_eq!(chunks(0..250, 100), vec![0..100, 100..200, 200..250]);
    }

    #[test]
    fn reads_rotate_over_readable_members_and_honour_a_pin() {
        use MemberState::*;
        let states = [InSync, Faulty, InSync, Resyncing { done: 4096 }];
        assert_eq!(read_order(&states, 8192, 0, None), vec![0, 2]);
        assert_eq!(read_order(&states, 8192, 1, None), vec![2, 0]);
        // Below the resync point the resyncing member is as good as any.
        assert_eq!(read_order(&states, 4096, 2, None), vec![3, 0, 2]);
        assert_eq!(read_order(&states, 4096, 2, Some(0)), vec![0, 3, 2]);
        assert_eq!(
            read_order(&[Faulty, Faulty], 1, 0, None),
            Vec::<usize>::new()
        );
        assert_eq!(sync_source(&states), Some(0));
        assert_eq!(sync_source(&[Faulty, Resyncing { done: 0 }]), None);
    }

    fn valid(uuid: u8, generation: u64, next_txn: u64) -> CopyView {
        with_states(uuid, generation, next_txn, &[])
    }

    fn with_states(uuid: u8, generation: u64, next_txn: u64, states: &[MemberState]) -> CopyView {
        CopyView::Valid {
            uuid: [uuid; 16],
            owner: super::super::OWNER.into(),
            generation,
            next_txn,
            states: states.to_vec(),
        }
    }

    fn damaged(why: &str, generation: Option<u64>) -> CopyView {
        CopyView::Damaged {
            why: why.into(),
            generation,
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("d{i}")).collect()
    }

    fn choose(copies: &[CopyView]) -> Result<CopyChoice, Refusal> {
        choose_copy(copies, &names(copies.len()), true)
    }

    #[test]
    fn the_newest_copy_wins_by_generation_then_transactions() {
        // Member 1 missed the last checkpoint (torn superblock): generation wins.
        let copies = [valid(7, 10, 50), valid(7, 9, 80), CopyView::Blank];
        assert_eq!(choose(&copies), Ok(CopyChoice::Open(0)));
        // Same generation: the copy that got more journal batches wins.
        let copies = [valid(7, 10, 50), valid(7, 10, 52)];
        assert_eq!(choose(&copies), Ok(CopyChoice::Open(1)));
        // A damaged copy is outvoted by a valid one.
        let copies = [damaged("crc", Some(3)), valid(7, 3, 1)];
        assert_eq!(choose(&copies), Ok(CopyChoice::Open(1)));
    }

    #[test]
    fn formats_only_all_blank_members_with_the_policy_and_refuses_strangers() {
        assert_eq!(
            choose(&[CopyView::Blank, CopyView::Blank]),
            Ok(CopyChoice::Format)
        );
        let refused = choose_copy(&[CopyView::Blank, CopyView::Blank], &names(2), false);
        assert!(refused.unwrap_err().contains("strata serve --format"));
        assert!(choose(&[CopyView::Blank, CopyView::Missing]).is_err());
        assert!(matches!(
            choose(&[CopyView::Blank, damaged("x", None)]),
            Err(Refusal::Damaged(_))
        ));
        assert!(matches!(
            choose(&[CopyView::Blank, CopyView::Missing]),
            Err(Refusal::Refused(_))
        ));
        // Superblocks gone but the region not blank: damage, never formatted over.
        let unlabelled = CopyView::Unlabelled("non-zero region".into());
        let refused = choose(&[CopyView::Blank, unlabelled]).unwrap_err();
        assert!(refused.contains("strata check"));
        let error = refused.error("mirror m");
        assert!(
            matches!(error, strata_core::BlockError::Corrupt(ref why) if why.starts_with("mirror m: ")),
            "damage is reported as Corrupt: {error:?}"
        );
        assert!(choose(&[valid(1, 5, 5), valid(2, 5, 5)])
            .unwrap_err()
            .contains("two different mirrors"));
        let thin = CopyView::Valid {
            uuid: [1; 16],
            owner: "thin-pool".into(),
            generation: 1,
            next_txn: 1,
            states: vec![],
        };
        assert!(choose(&[thin]).unwrap_err().contains("thin-pool"));
    }

    use MemberState::{Faulty, InSync};

    #[test]
    fn a_copy_recorded_failed_by_another_never_wins_however_new() {
        // b (slot 1) was failed and a went on. Even a newer b copy loses while a records it
        // faulty (here b's own record still calls a in sync, so this is no split brain).
        let a = with_states(7, 10, 50, &[InSync, Faulty]);
        let b_newer = with_states(7, 12, 90, &[InSync, InSync]);
        assert_eq!(
            choose(&[a.clone(), b_newer.clone()]),
            Ok(CopyChoice::Open(0))
        );
        // A replacement recorded at 0 is no better.
        let a0 = with_states(7, 10, 50, &[InSync, MemberState::Resyncing { done: 0 }]);
        assert_eq!(choose(&[a0, b_newer]), Ok(CopyChoice::Open(0)));
        // Presentation order does not matter: same slots, copies looked at in either order
        // give the same winner (the choice is a function of the slots, not of the loop).
        let a = with_states(7, 10, 50, &[Faulty, InSync]);
        let b = with_states(7, 12, 90, &[InSync, InSync]);
        assert_eq!(choose(&[b, a]), Ok(CopyChoice::Open(1)));
        // Resyncing past 0 is a member receiving metadata: not stale.
        let a = with_states(7, 10, 50, &[InSync, MemberState::Resyncing { done: 4096 }]);
        let c = with_states(7, 10, 51, &[InSync, MemberState::Resyncing { done: 4096 }]);
        assert_eq!(choose(&[a, c]), Ok(CopyChoice::Open(1)));
    }

    /// Two members filled at once from a third (a new leg added, then a dead leg replaced),
    /// cut by a power failure: each records the other at 0. Neither ever served alone; the
    /// in-sync member's copy wins. (Found by `strata sim explore`: the mirror was refused as
    /// a split brain with all its disks present.)
    #[test]
    fn two_members_being_filled_that_record_each_other_at_0_are_no_split_brain() {
        let zero = MemberState::Resyncing { done: 0 };
        let filling = MemberState::Resyncing { done: 8192 };
        let new_leg = with_states(7, 12, 40, &[zero, InSync, filling]);
        let source = with_states(7, 12, 41, &[zero, InSync, filling]);
        let replacement = with_states(7, 12, 41, &[zero, InSync, zero]);
        assert_eq!(
            choose(&[replacement, source, new_leg]),
            Ok(CopyChoice::Open(1))
        );
    }

    #[test]
    fn two_copies_recording_each_other_failed_are_a_split_brain() {
        let a = with_states(7, 10, 50, &[InSync, Faulty]);
        let b = with_states(7, 11, 3, &[Faulty, InSync]);
        let error = choose(&[a, b]).unwrap_err();
        assert!(
            error.contains("split brain")
                && error.contains("d0")
                && error.contains("d1")
                && error.contains("--degraded")
                && error.contains("strata replace"),
            "{error}"
        );
        // A cycle over three members: every copy is stale to some other.
        let a = with_states(7, 10, 50, &[InSync, Faulty, InSync]);
        let b = with_states(7, 10, 50, &[InSync, InSync, Faulty]);
        let c = with_states(7, 10, 50, &[Faulty, InSync, InSync]);
        assert!(choose(&[a, b, c]).unwrap_err().contains("split brain"));
        // A copy that records its own slot faulty: the children were reordered.
        let a = with_states(7, 10, 50, &[InSync, Faulty]);
        let b = with_states(7, 9, 40, &[InSync, InSync]);
        assert!(choose(&[b, a]).unwrap_err().contains("reordered"));
    }

    #[test]
    fn after_the_choice_the_chosen_record_decides_each_member() {
        let n = names(4);
        let recorded = [InSync, Faulty, InSync, InSync];
        let copies = [
            valid(7, 10, 50),
            valid(7, 9, 50),   // recorded faulty: stays faulty though present
            CopyView::Missing, // recorded in sync: needs the flag
            CopyView::Blank,   // swapped in offline: resync from 0
        ];
        let fits = [true, true, false, true];
        let error = assemble_states(&recorded, 10, &copies, &fits, &n, false).unwrap_err();
        assert!(
            error.contains("d2") && error.contains("--degraded"),
            "{error}"
        );
        let assembly = assemble_states(&recorded, 10, &copies, &fits, &n, true).unwrap();
        assert_eq!(
            assembly.states,
            vec![InSync, Faulty, Faulty, MemberState::Resyncing { done: 0 }]
        );
        assert_eq!(assembly.missing_in_sync, vec![2]);
        // A missing member already faulty, or a new slot missing, needs no flag.
        let assembly = assemble_states(
            &[InSync, Faulty],
            10,
            &[valid(7, 10, 1), CopyView::Missing, CopyView::Missing],
            &[true, false, false],
            &names(3),
            false,
        )
        .unwrap();
        assert_eq!(assembly.states, vec![InSync, Faulty, Faulty]);
        // A damaged copy older than the chosen one keeps its slot's state; one as new or
        // newer, of unknown generation, or unlabelled (superblocks lost) may record the
        // chosen member failed: only with the flag, and then faulty.
        let older = [valid(7, 10, 1), damaged("crc", Some(9))];
        let assembly =
            assemble_states(&[InSync, InSync], 10, &older, &[true; 2], &names(2), false).unwrap();
        assert_eq!(assembly.states, vec![InSync, InSync]);
        for doubt in [
            damaged("crc", Some(10)),
            damaged("crc", Some(11)),
            damaged("crc", None),
            CopyView::Unlabelled("x".into()),
        ] {
            let copies = [valid(7, 10, 1), doubt];
            let error =
                assemble_states(&[InSync, InSync], 10, &copies, &[true; 2], &names(2), false)
                    .unwrap_err();
            assert!(
                error.contains("d1") && error.contains("--degraded"),
                "{error}"
            );
            let assembly =
                assemble_states(&[InSync, InSync], 10, &copies, &[true; 2], &names(2), true)
                    .unwrap();
            assert_eq!(assembly.states, vec![InSync, Faulty]);
            assert_eq!(assembly.missing_in_sync, vec![1]);
        }
        // A valid copy one generation behind (a checkpoint cut by a crash) keeps its state;
        // two or more behind missed writes while out of the fan-out: resync from 0.
        let copies = [valid(7, 10, 1), valid(7, 9, 1), valid(7, 8, 1)];
        let assembly = assemble_states(
            &[InSync, InSync, MemberState::Resyncing { done: 4096 }],
            10,
            &copies,
            &[true; 3],
            &names(3),
            false,
        )
        .unwrap();
        assert_eq!(
            assembly.states,
            vec![InSync, InSync, MemberState::Resyncing { done: 0 }]
        );
        assert_eq!(assembly.behind, vec![2]);
        let small = assemble_states(
            &[InSync, InSync],
            10,
            &[valid(7, 10, 1), valid(7, 10, 1)],
            &[true, false],
            &names(2),
            false,
        )
        .unwrap();
        assert_eq!(small.states, vec![InSync, Faulty]);
        // Nothing in sync left: refused.
        assert!(assemble_states(
            &[Faulty, InSync],
            10,
            &[valid(7, 10, 1), CopyView::Blank],
            &[true, true],
            &names(2),
            true
        )
        .is_err());
    }
}
