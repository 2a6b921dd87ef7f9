//! The array's record in its metadata store: shape (fixed at creation) and member states.
//!
//! Blob `raid5`, little-endian: `version u32 (=2), members u32, chunk u64, journal_bytes u64,
//! data_start u64, stripes u64, uuid [16]`, then per member `state u8 (0 active, 1 failed,
//! 2 rebuilding), rebuild_checkpoint u64`, then (version 2) `journal_device u8` (1: the
//! journals live on a separate journal device). Version 1 records read as version 2 without a
//! journal device. Table `lost` (4-byte records): stripe → member + 1
//! of a chunk whose content could not be recovered (reads of it fail until rewritten whole).

use strata_core::{BlockError, Result};

use super::members::{Member, MemberState};

pub const RECORD_VERSION: u32 = 2;
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
        if version != RECORD_VERSION && version != 1 {
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
        Ok(ArrayRecord {
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
        };
        let bytes = record.encode();
        assert_eq!(ArrayRecord::decode(&bytes).unwrap(), record);
        let mut other = bytes.clone();
        other[0] = 3;
        assert!(ArrayRecord::decode(&other)
            .unwrap_err()
            .to_string()
            .contains("version 3"));
        assert!(ArrayRecord::decode(&bytes[..60]).is_err());
        // A version 1 record (no flag) reads as having no journal device.
        let mut v1 = bytes[..bytes.len() - 1].to_vec();
        v1[0] = 1;
        let old = ArrayRecord::decode(&v1).unwrap();
        assert!(!old.journal_device);
        assert_eq!(old.states, record.states);
        let mut bad_flag = bytes.clone();
        *bad_flag.last_mut().unwrap() = 7;
        assert!(ArrayRecord::decode(&bad_flag).is_err());
    }
}
