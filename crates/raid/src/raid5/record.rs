//! The array's record in its metadata store: shape (fixed at creation) and member states.
//!
//! Blob `raid5`, little-endian: `version u32 (=3), members u32, chunk u64, journal_bytes u64,
//! data_start u64, stripes u64, uuid [16]`, then per member `state u8 (0 active, 1 failed,
//! 2 rebuilding), rebuild_checkpoint u64`, then (version 2) `journal_device u8` (1: the
//! journals live on a separate journal device), then (version 3) `reshape u8` (0: none; 1: a
//! grow is under way, followed by [`ReshapeRecord`]'s fields: `old_members u32, policy u8,
//! phase u8, paused u8, on_failure u8, checkpoint u64, grow_id u64, names u8` and per added
//! member `len u16, name`). During a grow `members` and the states count the members of the
//! new geometry. Versions 1 and 2 read as version 3 without a grow. Table `lost` (4-byte
//! records): stripe → member + 1 of a chunk whose content could not be recovered (reads of
//! it fail until rewritten whole).

use strata_core::{BlockError, Result};

use super::members::{Member, MemberState};

pub const RECORD_VERSION: u32 = 3;
pub const BLOB: &str = "raid5";
pub const LOST: &str = "lost";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayRecord {
    pub members: usize,
    pub chunk_bytes: u64,
    pub journal_bytes: u64,
    pub data_start: u64,
    pub stripes: u64,
    pub uuid: [u8; 16],
    /// (state, durable rebuild checkpoint) per member.
    pub states: Vec<(MemberState, u64)>,
    /// The journals live on a journal device, not on the members.
    pub journal_device: bool,
    /// A grow under way (docs/layers/raid5-grow.md).
    pub reshape: Option<ReshapeRecord>,
}

/// Where a grow stands, as durably recorded: what the array was, how far its data moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReshapeRecord {
    /// Members of the old geometry (the first `old_members` of the array's).
    pub old_members: usize,
    /// 0: ALV, 1: MD-Reshape (the baseline).
    pub policy: u8,
    pub phase: ReshapePhase,
    /// Stopped by the administrator (`strata raid5 pause`): stays stopped across restarts.
    pub paused: bool,
    /// What the mover does while a member is failed: 0 go on degraded, 1 wait for its
    /// replacement to be rebuilt.
    pub on_failure: u8,
    /// Data chunks below this live in the new geometry (the durable checkpoint).
    pub checkpoint: u64,
    /// Counts the array's grows: names this grow's critical-section backup, so that a
    /// backup left by an earlier grow is never taken for this one's.
    pub grow_id: u64,
    /// The disks the grow added, as the configuration names them (for messages).
    pub added: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReshapePhase {
    /// The first stripes are being rewritten from the backup on the new members; a restart
    /// redoes them from that backup.
    Critical,
    /// Windows are being moved; everything at and above `checkpoint` is in the old geometry.
    Moving,
}

impl ArrayRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + 9 * self.members);
        out.extend(RECORD_VERSION.to_le_bytes());
        out.extend((self.members as u32).to_le_bytes());
        for v in [
            self.chunk_bytes,
            self.journal_bytes,
            self.data_start,
            self.stripes,
        ] {
            out.extend(v.to_le_bytes());
        }
        out.extend(self.uuid);
        assert_eq!(self.states.len(), self.members);
        for (state, cursor) in &self.states {
            out.push(state.code());
            out.extend(cursor.to_le_bytes());
        }
        out.push(u8::from(self.journal_device));
        match &self.reshape {
            None => out.push(0),
            Some(r) => {
                out.push(1);
                out.extend((r.old_members as u32).to_le_bytes());
                out.push(r.policy);
                out.push(match r.phase {
                    ReshapePhase::Critical => 0,
                    ReshapePhase::Moving => 1,
                });
                out.push(u8::from(r.paused));
                out.push(r.on_failure);
                out.extend(r.checkpoint.to_le_bytes());
                out.extend(r.grow_id.to_le_bytes());
                assert!(r.added.len() <= u8::MAX as usize);
                out.push(r.added.len() as u8);
                for name in &r.added {
                    let name = &name.as_bytes()[..name.len().min(u16::MAX as usize)];
                    out.extend((name.len() as u16).to_le_bytes());
                    out.extend(name);
                }
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ArrayRecord> {
        let bad = |what: &str| BlockError::InvalidArgument(format!("raid5 record: {what}"));
        let u64_at = |at: usize| -> Result<u64> {
            let b = bytes.get(at..at + 8).ok_or_else(|| bad("truncated"))?;
            Ok(u64::from_le_bytes(b.try_into().unwrap()))
        };
        let head = bytes.get(0..8).ok_or_else(|| bad("truncated"))?;
        let version = u32::from_le_bytes(head[0..4].try_into().unwrap());
        if !(1..=RECORD_VERSION).contains(&version) {
            return Err(bad(&format!(
                "version {version}, this build reads {RECORD_VERSION}"
            )));
        }
        let members = u32::from_le_bytes(head[4..8].try_into().unwrap()) as usize;
        let uuid = bytes.get(40..56).ok_or_else(|| bad("truncated"))?;
        let mut states = Vec::with_capacity(members);
        for i in 0..members {
            let at = 56 + 9 * i;
            let code = *bytes.get(at).ok_or_else(|| bad("truncated"))?;
            let state = MemberState::from_code(code).ok_or_else(|| bad("member state"))?;
            states.push((state, u64_at(at + 1)?));
        }
        let journal_device = match version {
            1 => false,
            _ => match bytes.get(56 + 9 * members) {
                Some(0) => false,
                Some(1) => true,
                Some(_) => return Err(bad("journal device flag")),
                None => return Err(bad("truncated")),
            },
        };
        let reshape = match version {
            1 | 2 => None,
            _ => decode_reshape(bytes, 56 + 9 * members + 1)?,
        };
        Ok(ArrayRecord {
            reshape,
            journal_device,
            members,
            chunk_bytes: u64_at(8)?,
            journal_bytes: u64_at(16)?,
            data_start: u64_at(24)?,
            stripes: u64_at(32)?,
            uuid: uuid.try_into().unwrap(),
            states,
        })
    }

    /// Members of the geometry the array is growing to (all of them), or has.
    pub fn old_members(&self) -> usize {
        self.reshape
            .as_ref()
            .map_or(self.members, |r| r.old_members)
    }

    pub fn with_members(&self, members: &[Member]) -> ArrayRecord {
        let mut out = self.clone();
        out.states = members
            .iter()
            .zip(&self.states)
            .map(|(m, (_, old))| {
                let cursor = if m.state == MemberState::Rebuilding {
                    *old
                } else {
                    0
                };
                (m.state, cursor)
            })
            .collect();
        out
    }
}

fn decode_reshape(bytes: &[u8], at: usize) -> Result<Option<ReshapeRecord>> {
    let bad = |what: &str| BlockError::InvalidArgument(format!("raid5 record: {what}"));
    let mut cursor = at;
    let mut take = |n: usize| -> Result<&[u8]> {
        let part = bytes
            .get(cursor..cursor + n)
            .ok_or_else(|| bad("truncated grow state"))?;
        cursor += n;
        Ok(part)
    };
    match take(1)?[0] {
        0 => return Ok(None),
        1 => {}
        _ => return Err(bad("grow flag")),
    }
    let old_members = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
    let policy = take(1)?[0];
    let phase = match take(1)?[0] {
        0 => ReshapePhase::Critical,
        1 => ReshapePhase::Moving,
        _ => return Err(bad("grow phase")),
    };
    let paused = match take(1)?[0] {
        0 => false,
        1 => true,
        _ => return Err(bad("grow paused flag")),
    };
    let on_failure = take(1)?[0];
    if policy > 1 || on_failure > 1 {
        return Err(bad("grow policy"));
    }
    let checkpoint = u64::from_le_bytes(take(8)?.try_into().unwrap());
    let grow_id = u64::from_le_bytes(take(8)?.try_into().unwrap());
    let count = take(1)?[0] as usize;
    let mut added = Vec::with_capacity(count);
    for _ in 0..count {
        let len = u16::from_le_bytes(take(2)?.try_into().unwrap()) as usize;
        added.push(String::from_utf8_lossy(take(len)?).into_owned());
    }
    Ok(Some(ReshapeRecord {
        old_members,
        policy,
        phase,
        paused,
        on_failure,
        checkpoint,
        grow_id,
        added,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_refuses_other_versions() {
        let record = ArrayRecord {
            members: 3,
            chunk_bytes: 65536,
            journal_bytes: 4 << 20,
            data_start: 5 << 20,
            stripes: 100,
            uuid: [7; 16],
            states: vec![
                (MemberState::Active, 0),
                (MemberState::Rebuilding, 42),
                (MemberState::Failed, 0),
            ],
            journal_device: true,
            reshape: None,
        };
        let bytes = record.encode();
        assert_eq!(ArrayRecord::decode(&bytes).unwrap(), record);
        let mut other = bytes.clone();
        other[0] = 4;
        assert!(ArrayRecord::decode(&other)
            .unwrap_err()
            .to_string()
            .contains("version 4"));
        assert!(ArrayRecord::decode(&bytes[..60]).is_err());
        // A version 2 record (no grow byte) reads as having no grow.
        let mut v2 = bytes[..bytes.len() - 1].to_vec();
        v2[0] = 2;
        assert_eq!(ArrayRecord::decode(&v2).unwrap(), record);
        // A version 1 record (no flag) reads as having no journal device.
        let mut v1 = bytes[..bytes.len() - 2].to_vec();
        v1[0] = 1;
        let old = ArrayRecord::decode(&v1).unwrap();
        assert!(!old.journal_device);
        assert_eq!(old.states, record.states);
        let mut bad_flag = bytes.clone();
        let at = bad_flag.len() - 2;
        bad_flag[at] = 7;
        assert!(ArrayRecord::decode(&bad_flag).is_err());
    }

    #[test]
    fn a_grow_under_way_round_trips_and_damage_is_refused() {
        let record = ArrayRecord {
            members: 5,
            chunk_bytes: 65536,
            journal_bytes: 4 << 20,
            data_start: 5 << 20,
            stripes: 100,
            uuid: [9; 16],
            states: vec![(MemberState::Active, 0); 5],
            journal_device: false,
            reshape: Some(ReshapeRecord {
                old_members: 3,
                policy: 0,
                phase: ReshapePhase::Moving,
                paused: true,
                on_failure: 1,
                checkpoint: 1234,
                grow_id: 2,
                added: vec!["d3".into(), "disk four".into()],
            }),
        };
        let bytes = record.encode();
        assert_eq!(ArrayRecord::decode(&bytes).unwrap(), record);
        assert_eq!(record.old_members(), 3);
        for cut in 1..30 {
            assert!(
                ArrayRecord::decode(&bytes[..bytes.len() - cut]).is_err(),
                "cut {cut}"
            );
        }
        let flag = 56 + 9 * 5 + 1;
        let mut bad = bytes.clone();
        bad[flag + 6] = 9; // phase
        assert!(ArrayRecord::decode(&bad).is_err());
    }
}
