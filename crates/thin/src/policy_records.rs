//! A volume's versions policy record at work: read with the volume's versions, staged in a
//! transaction (pruned of snapshots gone, deleted when empty), set and shown, and the
//! protections it holds (`strata snapshot policy|protect|unprotect`). The record's format is
//! `records::policy`.

use std::sync::atomic::Ordering::Relaxed;

use strata_core::{BlockError, Result};
use strata_meta::{State, Txn, TxnClass};

use crate::pool::ThinPool;
use crate::records::policy::{policy_name, PolicyRecord};
use crate::records::{decode_volumes, versions_name, SnapshotRecord, VersionsRecord};
use crate::schedule::{self, Schedule};

/// A volume's policy as `strata snapshot policy` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PolicyStatus {
    pub volume: String,
    /// "every 10m, keep 24", or None when no schedule is set.
    pub policy: Option<String>,
    pub every: Option<String>,
    pub every_writes: Option<u64>,
    pub keep: Option<u32>,
    /// Write requests counted since the last automatic snapshot (in memory: 0 after a
    /// restart).
    pub writes_since: u64,
    /// When the period next falls due (ms since the Unix epoch).
    pub next_due_ms: Option<u64>,
    pub last_auto: Option<String>,
    pub last_auto_ms: Option<u64>,
    /// Snapshots the policy made that exist now.
    pub policy_snapshots: Vec<String>,
    pub protected: Vec<String>,
}

/// A volume's records as the policies read them.
pub(crate) struct Records {
    pub(crate) versions: Option<VersionsRecord>,
    pub(crate) policy: Option<PolicyRecord>,
}

impl ThinPool {
    pub(crate) fn policy_corrupt(&self, problem: impl std::fmt::Display) -> BlockError {
        BlockError::Corrupt(format!("thin pool {}: {problem}", self.name))
    }

    pub(crate) fn read_policy_records(&self, state: &State, id: u32) -> Result<Records> {
        let versions = match state.id(&versions_name(id)) {
            Some(object) => Some(
                VersionsRecord::decode(state.blob(object).unwrap_or(&[]))
                    .map_err(|e| self.policy_corrupt(e))?,
            ),
            None => None,
        };
        let policy = match state.id(&policy_name(id)) {
            Some(object) => Some(
                PolicyRecord::decode(state.blob(object).unwrap_or(&[]))
                    .map_err(|e| self.policy_corrupt(e))?,
            ),
            None => None,
        };
        Ok(Records { versions, policy })
    }

    pub(crate) fn volume_id(&self, volume: &str) -> Result<u32> {
        self.volumes_lock()
            .get(volume)
            .map(|(record, _)| record.id)
            .ok_or_else(|| BlockError::InvalidArgument(format!("no volume named {volume:?}")))
    }

    /// Stages `change` of volume `id`'s policy record in `txn`: pruned of snapshots that are
    /// gone, deleted when it says nothing any more.
    pub(crate) fn stage_policy(
        &self,
        state: &State,
        txn: &mut Txn,
        id: u32,
        change: impl FnOnce(&mut PolicyRecord, Option<&VersionsRecord>) -> Result<()>,
    ) -> Result<()> {
        // Checked in the transaction: a volume deleted since its id was looked up must not
        // get a record again (it would outlive it).
        let volumes = decode_volumes(state.blob(self.ids.volumes).unwrap_or(&[]))
            .map_err(|e| self.policy_corrupt(e))?;
        if !volumes.iter().any(|v| v.id == id) {
            return Err(BlockError::InvalidArgument(format!(
                "volume {id} was deleted"
            )));
        }
        let records = self.read_policy_records(state, id)?;
        let mut policy = records.policy.unwrap_or_default();
        policy.prune(records.versions.as_ref());
        change(&mut policy, records.versions.as_ref())?;
        let name = policy_name(id);
        match (state.id(&name), policy.is_empty()) {
            (Some(object), true) => txn.delete(object),
            (None, true) => {}
            (Some(object), false) => txn.put_blob(object, policy.encode()),
            (None, false) => {
                let object = txn.create_blob(&name);
                txn.put_blob(object, policy.encode());
            }
        }
        Ok(())
    }

    /// Sets (Some) or removes (None) `volume`'s periodic-snapshot schedule; the period counts
    /// from `now_ms` and the write count from zero. Durable on return. The snapshots a
    /// schedule made stay, and stay the policy's (a later schedule's keep-K counts them).
    pub async fn set_snapshot_policy(
        &self,
        volume: &str,
        schedule: Option<Schedule>,
        now_ms: u64,
    ) -> Result<PolicyStatus> {
        let id = self.volume_id(volume)?;
        self.store.transact(TxnClass::Normal, |state, txn| {
            self.stage_policy(state, txn, id, |policy, _| {
                policy.schedule = schedule;
                policy.anchor_ms = now_ms;
                Ok(())
            })
        })?;
        self.store.commit().await?;
        self.versions_policy.write_counter(id).store(0, Relaxed);
        let said = schedule.map_or("off".to_string(), |s| s.describe());
        tracing::info!(pool = %self.name, volume, policy = %said, "snapshot policy set");
        self.snapshot_policy(volume)
    }

    /// `volume`'s policy, its next due time, its last automatic snapshot and protections.
    pub fn snapshot_policy(&self, volume: &str) -> Result<PolicyStatus> {
        let id = self.volume_id(volume)?;
        let records = self
            .store
            .read(|state| self.read_policy_records(state, id))?;
        let policy = records.policy.unwrap_or_default();
        let snapshots = records.versions.map(|v| v.snapshots).unwrap_or_default();
        let named = |epochs: &std::collections::BTreeSet<u32>| -> Vec<&SnapshotRecord> {
            snapshots
                .iter()
                .filter(|s| epochs.contains(&s.epoch))
                .collect()
        };
        let made = named(&policy.made);
        let last = made.iter().max_by_key(|s| s.epoch);
        let schedule = policy.schedule;
        Ok(PolicyStatus {
            volume: volume.to_string(),
            policy: schedule.map(|s| s.describe()),
            every: schedule.and_then(|s| s.every).map(schedule::format_period),
            every_writes: schedule.and_then(|s| s.every_writes),
            keep: schedule.and_then(|s| s.keep),
            writes_since: self.versions_policy.writes(id),
            next_due_ms: schedule.and_then(|s| schedule::next_due_ms(&s, policy.anchor_ms)),
            last_auto: last.map(|s| s.name.clone()),
            last_auto_ms: last.map(|s| s.created_ms),
            policy_snapshots: made.iter().map(|s| s.name.clone()).collect(),
            protected: named(&policy.protected)
                .iter()
                .map(|s| s.name.clone())
                .collect(),
        })
    }

    /// Protects (or unprotects) a snapshot: a protected one is never deleted by keep-K or
    /// by the reserve, and a manual delete of it is refused. Durable on return. Under the
    /// pool's quiesce, like a deletion, so a protect and a delete of one snapshot are ordered.
    pub async fn protect_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        protect: bool,
    ) -> Result<()> {
        let quiet = self.quiesce().await;
        let id = self.volume_id(volume)?;
        self.store.transact(TxnClass::Normal, |state, txn| {
            self.stage_policy(state, txn, id, |policy, versions| {
                let epoch = versions
                    .and_then(|v| v.snapshots.iter().find(|s| s.name == snapshot))
                    .map(|s| s.epoch)
                    .ok_or_else(|| {
                        BlockError::InvalidArgument(format!(
                            "volume {volume} has no snapshot named {snapshot:?}"
                        ))
                    })?;
                if protect {
                    policy.protected.insert(epoch);
                } else {
                    policy.protected.remove(&epoch);
                }
                Ok(())
            })
        })?;
        self.store.commit().await?;
        drop(quiet);
        tracing::info!(pool = %self.name, volume, snapshot, protected = protect, "snapshot protection set");
        Ok(())
    }

    /// Refuses the deletion of a protected snapshot. The caller holds the pool quiesced.
    pub(crate) fn refuse_protected(&self, id: u32, volume: &str, snapshot: &str) -> Result<()> {
        let records = self
            .store
            .read(|state| self.read_policy_records(state, id))?;
        let (Some(policy), Some(versions)) = (records.policy, records.versions) else {
            return Ok(());
        };
        let protected = versions
            .snapshots
            .iter()
            .any(|s| s.name == snapshot && policy.protected.contains(&s.epoch));
        if protected {
            return Err(BlockError::InvalidArgument(format!(
                "snapshot {volume}@{snapshot} is protected: `strata snapshot unprotect` it first"
            )));
        }
        Ok(())
    }
}
