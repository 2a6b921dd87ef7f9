//! A volume's versions policy record (the `versions-policy.<id>` blob): its periodic-snapshot
//! schedule, when the period counts from, which of its snapshots the policy made (the only
//! ones keep-K may delete) and which are protected (never deleted by a policy, and refused by
//! a manual delete). A child of `records` so that it reads its fields with the same reader.
//!
//! Snapshots are named here by epoch, not by name: a volume's epochs are never reused, so an
//! entry left by a snapshot deleted since can never point at another one. Such entries are
//! dropped the next time the record is written (readers always meet them with the volume's
//! versions record, which says what exists).
//!
//! Encoding, little-endian, version 1:
//! `u32 version`, `u8 scheduled (0/1)`, `u64 every_ms (0: none)`, `u64 every_writes (0:
//! none)`, `u32 keep (0: all)`, `u64 anchor_ms`, `u32 count` + `count × u32 epoch` of the
//! snapshots the policy made, `u32 count` + `count × u32 epoch` of the protected snapshots.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::BufMut;
use strata_meta::State;

use strata_core::Fields;

use super::{versions_name, VersionsRecord, VolumeRecord};
use crate::schedule::Schedule;
use crate::versions::Epoch;

pub fn policy_name(volume: u32) -> String {
    format!("versions-policy.{volume}")
}

/// One volume's versions policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyRecord {
    /// None: no periodic snapshots (set `--off`, or only protections recorded).
    pub schedule: Option<Schedule>,
    /// Milliseconds since the Unix epoch the period counts from: when the schedule was set,
    /// or when the last automatic snapshot was taken.
    pub anchor_ms: u64,
    /// Epochs of the snapshots the policy took.
    pub made: BTreeSet<Epoch>,
    /// Epochs of the protected snapshots.
    pub protected: BTreeSet<Epoch>,
}

const POLICY_RECORD_VERSION: u32 = 1;

impl PolicyRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32_le(POLICY_RECORD_VERSION);
        let schedule = self.schedule.unwrap_or_default();
        out.put_u8(self.schedule.is_some() as u8);
        out.put_u64_le(schedule.every.map_or(0, |d| d.as_millis() as u64));
        out.put_u64_le(schedule.every_writes.unwrap_or(0));
        out.put_u32_le(schedule.keep.unwrap_or(0));
        out.put_u64_le(self.anchor_ms);
        for set in [&self.made, &self.protected] {
            out.put_u32_le(set.len() as u32);
            for &epoch in set {
                out.put_u32_le(epoch);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<PolicyRecord, String> {
        let mut fields = Fields::new(bytes, "versions policy record");
        let version = fields.u32()?;
        if version != POLICY_RECORD_VERSION {
            return Err(format!("versions policy record version {version}"));
        }
        let scheduled = match fields.u8()? {
            0 => false,
            1 => true,
            other => return Err(format!("versions policy schedule marker {other}")),
        };
        let every_ms = fields.u64()?;
        let every_writes = fields.u64()?;
        let keep = fields.u32()?;
        let anchor_ms = fields.u64()?;
        let schedule = Schedule {
            every: (every_ms > 0).then(|| Duration::from_millis(every_ms)),
            every_writes: (every_writes > 0).then_some(every_writes),
            keep: (keep > 0).then_some(keep),
        };
        if scheduled && schedule.every.is_none() && schedule.every_writes.is_none() {
            return Err("a versions policy schedule with neither a period nor a count".into());
        }
        let mut sets = [BTreeSet::new(), BTreeSet::new()];
        for set in &mut sets {
            let count = fields.u32()?;
            for _ in 0..count {
                set.insert(fields.u32()?);
            }
        }
        let [made, protected] = sets;
        Ok(PolicyRecord {
            schedule: scheduled.then_some(schedule),
            anchor_ms,
            made,
            protected,
        })
    }

    /// Drops the epochs of snapshots `versions` no longer has.
    pub fn prune(&mut self, versions: Option<&VersionsRecord>) {
        let exists =
            |epoch: &Epoch| versions.is_some_and(|v| v.snapshots.iter().any(|s| s.epoch == *epoch));
        self.made.retain(exists);
        self.protected.retain(exists);
    }

    /// Whether the record says anything (a record that does not is deleted, not written).
    pub fn is_empty(&self) -> bool {
        self.schedule.is_none() && self.made.is_empty() && self.protected.is_empty()
    }
}

/// `check_state`'s part: every policy record decodes and belongs to a volume that exists,
/// and a protected or policy-made epoch names a snapshot of that volume at most (entries of
/// deleted snapshots are allowed: see the module docs).
pub fn check(state: &State, volumes: &[VolumeRecord]) -> Vec<String> {
    let mut problems = Vec::new();
    for volume in volumes {
        let Some(id) = state.id(&policy_name(volume.id)) else {
            continue;
        };
        let record = match PolicyRecord::decode(state.blob(id).unwrap_or(&[])) {
            Ok(record) => record,
            Err(problem) => {
                problems.push(format!("{}: {problem}", volume.name));
                continue;
            }
        };
        let current = state
            .id(&versions_name(volume.id))
            .and_then(|id| VersionsRecord::decode(state.blob(id).unwrap_or(&[])).ok())
            .map_or(0, |v| v.lineage.current);
        if let Some(epoch) = record
            .made
            .iter()
            .chain(&record.protected)
            .find(|e| **e >= current)
        {
            problems.push(format!(
                "{}: the versions policy names epoch {epoch}, not before the current {current}",
                volume.name
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_record_round_trips_and_damage_is_named() {
        let record = PolicyRecord {
            schedule: Some(Schedule {
                every: Some(Duration::from_secs(600)),
                every_writes: Some(1000),
                keep: Some(24),
            }),
            anchor_ms: 1_795_629_915_250,
            made: [3, 5, 8].into(),
            protected: [1, 5].into(),
        };
        let bytes = record.encode();
        assert_eq!(PolicyRecord::decode(&bytes).unwrap(), record);
        let off = PolicyRecord {
            schedule: None,
            protected: [2].into(),
            ..PolicyRecord::default()
        };
        assert_eq!(PolicyRecord::decode(&off.encode()).unwrap(), off);
        let writes_only = PolicyRecord {
            schedule: Some(Schedule {
                every_writes: Some(3),
                ..Schedule::default()
            }),
            ..PolicyRecord::default()
        };
        assert_eq!(
            PolicyRecord::decode(&writes_only.encode()).unwrap(),
            writes_only
        );
        let short = PolicyRecord::decode(&bytes[..bytes.len() - 2]).unwrap_err();
        assert!(short.contains("versions policy record is short"), "{short}");
        let mut future = bytes.clone();
        future[0] = 2;
        assert!(PolicyRecord::decode(&future)
            .unwrap_err()
            .contains("record version 2"));
        let mut empty_schedule = writes_only.encode();
        empty_schedule[13..21].fill(0); // every_writes
        assert!(PolicyRecord::decode(&empty_schedule)
            .unwrap_err()
            .contains("neither a period nor a count"));
        assert!(PolicyRecord::default().is_empty());
        assert!(!off.is_empty());
    }
}
