//! Pure decisions of the mirror, kept apart from I/O so that each can be checked against
//! worked examples: which regions a request touches, which members may serve a read, which
//! metadata copy wins at open, and how member states are encoded.

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
            MemberState::Resyncing { done } => end <= done,
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
    /// No superblock at all: a blank (or never-formatted) region.
    Blank,
    /// A superblock, but recovery refused (damage), with why.
    Damaged(String),
    Valid {
        uuid: [u8; 16],
        owner: String,
        generation: u64,
        next_txn: u64,
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

/// Every copy receives the same writes, so copies differ only by how far a crash or a member
/// failure cut them short. A checkpoint (a new generation) contains every transaction of the
/// generations before it, so the newest copy is the one with the highest generation, then the
/// most transactions replayed. Copies of different stores (another uuid, another owner) mean
/// the configuration names a disk that is not this mirror's: refuse rather than overwrite it.
pub fn choose_copy(copies: &[CopyView]) -> Result<CopyChoice, String> {
    let mut best: Option<(usize, u64, u64, [u8; 16])> = None;
    for (i, copy) in copies.iter().enumerate() {
        let CopyView::Valid {
            uuid,
            owner,
            generation,
            next_txn,
        } = copy
        else {
            continue;
        };
        if owner != super::OWNER {
            return Err(format!(
                "member {i} holds metadata of a `{owner}`, not a mirror"
            ));
        }
        if let Some((j, _, _, other)) = best {
            if other != *uuid {
                return Err(format!(
                    "members {j} and {i} hold metadata of two different mirrors"
                ));
            }
        }
        if best.is_none_or(|(_, g, t, _)| (*generation, *next_txn) > (g, t)) {
            best = Some((i, *generation, *next_txn, *uuid));
        }
    }
    if let Some((i, ..)) = best {
        return Ok(CopyChoice::Open(i));
    }
    if let Some((i, CopyView::Damaged(why))) = copies
        .iter()
        .enumerate()
        .find(|(_, c)| matches!(c, CopyView::Damaged(_)))
    {
        return Err(format!(
            "no readable metadata copy, and member {i}'s is damaged ({why}); refusing to format over it"
        ));
    }
    if copies.iter().all(|c| *c == CopyView::Missing) {
        return Err("every member is missing".into());
    }
    if copies.contains(&CopyView::Missing) {
        return Err("a new mirror needs every member present to format".into());
    }
    Ok(CopyChoice::Format)
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
        CopyView::Valid {
            uuid: [uuid; 16],
            owner: super::super::OWNER.into(),
            generation,
            next_txn,
        }
    }

    #[test]
    fn the_newest_copy_wins_by_generation_then_transactions() {
        // Member 1 missed the last checkpoint (torn superblock): generation wins.
        let copies = [valid(7, 10, 50), valid(7, 9, 80), CopyView::Blank];
        assert_eq!(choose_copy(&copies), Ok(CopyChoice::Open(0)));
        // Same generation: the copy that got more journal batches wins.
        let copies = [valid(7, 10, 50), valid(7, 10, 52)];
        assert_eq!(choose_copy(&copies), Ok(CopyChoice::Open(1)));
        // A damaged copy is outvoted by a valid one.
        let copies = [CopyView::Damaged("crc".into()), valid(7, 3, 1)];
        assert_eq!(choose_copy(&copies), Ok(CopyChoice::Open(1)));
    }

    #[test]
    fn formats_only_all_blank_members_and_refuses_strangers() {
        assert_eq!(
            choose_copy(&[CopyView::Blank, CopyView::Blank]),
            Ok(CopyChoice::Format)
        );
        assert!(choose_copy(&[CopyView::Blank, CopyView::Missing]).is_err());
        assert!(choose_copy(&[CopyView::Blank, CopyView::Damaged("x".into())]).is_err());
        assert!(choose_copy(&[valid(1, 5, 5), valid(2, 5, 5)])
            .unwrap_err()
            .contains("two different mirrors"));
        let thin = CopyView::Valid {
            uuid: [1; 16],
            owner: "thin-pool".into(),
            generation: 1,
            next_txn: 1,
        };
        assert!(choose_copy(&[thin]).unwrap_err().contains("thin-pool"));
    }
}
