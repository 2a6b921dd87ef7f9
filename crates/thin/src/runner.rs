//! The versions policies at work in a pool: periodic snapshots per volume (kept to the last K),
//! protected snapshots, and the space reserve for versions. The decisions are the pure
//! functions of `schedule` and `reserve`; this module reads the records, acts through the
//! same paths a person's commands take (`take_snapshot`, `delete_snapshot`), and says what it
//! did: every automatic deletion and every refusal is logged and counted, and the last one is
//! shown in `strata status`.
//!
//! The runner is one background task of the pool, on the pool's `Background` (the handle
//! online changes quiesce and shutdown stops), that wakes once a `policy-interval` or when a
//! write brings free space under the reserve, and runs [`ThinPool::run_policies`] as one step.
//! Tests call [`ThinPool::policy_tick`] and [`ThinPool::enforce_reserve`] with a clock of
//! their own instead.
//!
//! Write counts (for `every-writes`) live in memory only: they restart at zero when the pool
//! is opened, so a restart postpones a snapshot due by writes, never takes an extra one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use strata_core::{BlockError, ByteSize, Result, Runtime};
use strata_meta::{State, Txn, TxnClass};
use tokio::sync::Notify;

use crate::pool::ThinPool;
use crate::records::policy::{policy_name, PolicyRecord};
use crate::records::{versions_name, SnapshotRecord, VersionsRecord};
use crate::reserve::{self, Candidate, ReservePolicy, WhenReserveLow};
use crate::schedule::{self, Due, Made, Schedule};

/// How often the runner looks at the policies when the configuration does not say.
pub const DEFAULT_POLICY_INTERVAL: Duration = Duration::from_secs(1);

/// The pool's versions-policy state that is not in the metadata.
pub(crate) struct VersionsPolicy {
    reserve: Option<ReservePolicy>,
    /// Write requests per volume id since the last automatic snapshot (or the open).
    writes: Mutex<BTreeMap<u32, Arc<AtomicU64>>>,
    taken: AtomicU64,
    kept_deleted: AtomicU64,
    reserve_deleted: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    /// What the policies did last, for status.
    last_action: Mutex<Option<String>>,
    /// Signalled when free space falls under the reserve (with `delete-oldest`), so the
    /// runner acts at once instead of at its next look. Shared with the runner task, which
    /// holds no strong reference to the pool while it waits.
    reserve_low: Arc<Notify>,
}

/// What one pass of the policies did, for tests and the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyReport {
    /// (volume, snapshot) taken by a schedule.
    pub taken: Vec<(String, String)>,
    /// (volume, snapshot) deleted because the schedule keeps only the last K.
    pub kept_deleted: Vec<(String, String)>,
    /// (volume, snapshot) deleted to bring free space back to the reserve.
    pub reserve_deleted: Vec<(String, String)>,
    /// (volume, why) automatic snapshots refused or failed.
    pub refused: Vec<(String, String)>,
}

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

impl VersionsPolicy {
    pub(crate) fn new(reserve: Option<ReservePolicy>) -> Self {
        VersionsPolicy {
            reserve,
            writes: Mutex::new(BTreeMap::new()),
            taken: AtomicU64::new(0),
            kept_deleted: AtomicU64::new(0),
            reserve_deleted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last_action: Mutex::new(None),
            reserve_low: Arc::new(Notify::new()),
        }
    }

    /// The write counter of volume `id`, shared by its handles (made on first use).
    pub(crate) fn write_counter(&self, id: u32) -> Arc<AtomicU64> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default()
            .clone()
    }

    fn writes(&self, id: u32) -> u64 {
        self.write_counter(id).load(Relaxed)
    }

    fn act(&self, what: String) {
        let at = schedule::utc(schedule::wall_ms());
        *self.last_action.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{at} {what}"));
    }
}

/// A volume's records as the policies read them.
struct Records {
    versions: Option<VersionsRecord>,
    policy: Option<PolicyRecord>,
}

impl ThinPool {
    fn policy_corrupt(&self, problem: impl std::fmt::Display) -> BlockError {
        BlockError::Corrupt(format!("thin pool {}: {problem}", self.name))
    }

    fn read_policy_records(&self, state: &State, id: u32) -> Result<Records> {
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

    fn volume_id(&self, volume: &str) -> Result<u32> {
        self.volumes_lock()
            .get(volume)
            .map(|(record, _)| record.id)
            .ok_or_else(|| BlockError::InvalidArgument(format!("no volume named {volume:?}")))
    }

    /// Stages `change` of volume `id`'s policy record in `txn`: pruned of snapshots that are
    /// gone, deleted when it says nothing any more.
    fn stage_policy(
        &self,
        state: &State,
        txn: &mut Txn,
        id: u32,
        change: impl FnOnce(&mut PolicyRecord, Option<&VersionsRecord>) -> Result<()>,
    ) -> Result<()> {
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

    /// Free data extents and the reserve in extents, now.
    fn reserve_state(&self, policy: &ReservePolicy) -> (u64, u64) {
        let extents = self.extents();
        let free = extents.saturating_sub(self.allocated_extents());
        (free, policy.reserve.extents(extents, self.extent_size()))
    }

    /// Called as allocation changes (with the low-water watch): wakes the runner when free
    /// space fell under a `delete-oldest` reserve. Two counters, no walk: cheap on the write
    /// path.
    pub(crate) fn watch_reserve(&self) {
        let Some(policy) = &self.versions_policy.reserve else {
            return;
        };
        if policy.when_low != WhenReserveLow::DeleteOldest {
            return;
        }
        let (free, reserve) = self.reserve_state(policy);
        if reserve::below(free, reserve) {
            self.versions_policy.reserve_low.notify_one();
        }
    }

    /// Before a snapshot of `volume` is taken: below the reserve, `refuse` refuses it and
    /// `delete-oldest` deletes old snapshots first (refusing it if that does not bring free
    /// space back to the reserve).
    pub(crate) async fn reserve_for_snapshot(&self, volume: &str) -> Result<()> {
        let Some(policy) = self.versions_policy.reserve else {
            return Ok(());
        };
        let (free, reserve) = self.reserve_state(&policy);
        if !reserve::below(free, reserve) {
            return Ok(());
        }
        if policy.when_low == WhenReserveLow::DeleteOldest {
            self.delete_oldest_while_below(&policy, &mut Vec::new())
                .await?;
            let (free, reserve) = self.reserve_state(&policy);
            if !reserve::below(free, reserve) {
                return Ok(());
            }
        }
        let (free, reserve) = self.reserve_state(&policy);
        let extent = self.extent_size();
        let mut why = format!(
            "snapshot of {}/{volume} refused: free space {} ({free} extents) is below the \
             snapshot reserve {} ({reserve} extents; snapshot-reserve = \"{}\", \
             when-reserve-low = \"{}\")",
            self.name,
            ByteSize(free * extent),
            ByteSize(reserve * extent),
            policy.reserve.describe(),
            policy.when_low.name()
        );
        if policy.when_low == WhenReserveLow::DeleteOldest {
            why.push_str(" and no unprotected snapshot is left to delete");
        }
        self.versions_policy.refused.fetch_add(1, Relaxed);
        tracing::warn!(
            pool = %self.name,
            volume,
            free_bytes = free * extent,
            reserve_bytes = reserve * extent,
            "snapshot refused: the pool's free space is below its snapshot reserve"
        );
        self.versions_policy.act(format!(
            "refused a snapshot of {volume}: free {} < reserve {}",
            ByteSize(free * extent),
            ByteSize(reserve * extent)
        ));
        Err(BlockError::InvalidArgument(why))
    }

    /// Every snapshot of the pool, with its protection, for `delete-oldest`.
    fn candidates(&self) -> Result<Vec<Candidate>> {
        let volumes: Vec<(u32, String)> = self
            .volumes_lock()
            .values()
            .map(|(record, _)| (record.id, record.name.clone()))
            .collect();
        self.store.read(|state| {
            let mut out = Vec::new();
            for (id, volume) in &volumes {
                let records = self.read_policy_records(state, *id)?;
                let protected = records.policy.map(|p| p.protected).unwrap_or_default();
                for snapshot in records.versions.map(|v| v.snapshots).unwrap_or_default() {
                    out.push(Candidate {
                        volume: volume.clone(),
                        protected: protected.contains(&snapshot.epoch),
                        name: snapshot.name,
                        created_ms: snapshot.created_ms,
                        epoch: snapshot.epoch,
                    });
                }
            }
            Ok(out)
        })
    }

    /// Deletes the pool's oldest unprotected snapshot, then the next, while free space is
    /// under the reserve and one is left. Each deletion is logged, counted and reported.
    async fn delete_oldest_while_below(
        &self,
        policy: &ReservePolicy,
        deleted: &mut Vec<(String, String)>,
    ) -> Result<()> {
        let extent = self.extent_size();
        loop {
            let (free, reserve) = self.reserve_state(policy);
            if !reserve::below(free, reserve) {
                return Ok(());
            }
            let candidates = self.candidates()?;
            let Some(oldest) = reserve::oldest_unprotected(&candidates) else {
                return Ok(());
            };
            let (volume, snapshot) = (oldest.volume.clone(), oldest.name.clone());
            let freed = match self.delete_snapshot(&volume, &snapshot).await {
                Ok(freed) => freed,
                // Deleted meanwhile by someone else: look again.
                Err(BlockError::InvalidArgument(_))
                    if !self.snapshot_exists(&volume, &snapshot) =>
                {
                    continue
                }
                Err(error) => return Err(error),
            };
            self.versions_policy.reserve_deleted.fetch_add(1, Relaxed);
            tracing::warn!(
                pool = %self.name,
                volume = %volume,
                snapshot = %snapshot,
                free_bytes = free * extent,
                reserve_bytes = reserve * extent,
                extents_freed = freed,
                "snapshot deleted: the pool's free space is below its snapshot reserve (when-reserve-low = \"delete-oldest\")"
            );
            self.versions_policy.act(format!(
                "deleted {volume}@{snapshot} for the reserve: free {} < reserve {}, {} freed",
                ByteSize(free * extent),
                ByteSize(reserve * extent),
                ByteSize(freed * extent)
            ));
            deleted.push((volume, snapshot));
        }
    }

    fn snapshot_exists(&self, volume: &str, snapshot: &str) -> bool {
        self.snapshots(Some(volume))
            .is_ok_and(|list| list.iter().any(|s| s.name == snapshot))
    }

    /// With `when-reserve-low = "delete-oldest"`: deletes the oldest unprotected snapshots
    /// while free space is under the reserve. Returns what it deleted.
    pub async fn enforce_reserve(&self) -> Result<Vec<(String, String)>> {
        let mut deleted = Vec::new();
        if let Some(policy) = self.versions_policy.reserve {
            if policy.when_low == WhenReserveLow::DeleteOldest {
                self.delete_oldest_while_below(&policy, &mut deleted)
                    .await?;
            }
        }
        Ok(deleted)
    }

    /// One pass of every volume's schedule at wall-clock time `now_ms`: a snapshot where one
    /// is due, then the policy's snapshots beyond its last K deleted. A volume whose snapshot
    /// is refused or fails does not stop the others.
    pub async fn policy_tick(&self, now_ms: u64) -> PolicyReport {
        let mut report = PolicyReport::default();
        let volumes: Vec<(u32, String)> = self
            .volumes_lock()
            .values()
            .map(|(record, _)| (record.id, record.name.clone()))
            .collect();
        for (id, volume) in volumes {
            if let Err(error) = self.tick_volume(id, &volume, now_ms, &mut report).await {
                self.versions_policy.failed.fetch_add(1, Relaxed);
                tracing::warn!(pool = %self.name, volume = %volume, %error, "snapshot policy failed");
                self.versions_policy
                    .act(format!("policy of {volume} failed: {error}"));
                report.refused.push((volume, error.to_string()));
            }
        }
        report
    }

    async fn tick_volume(
        &self,
        id: u32,
        volume: &str,
        now_ms: u64,
        report: &mut PolicyReport,
    ) -> Result<()> {
        let records = self
            .store
            .read(|state| self.read_policy_records(state, id))?;
        let Some(policy) = records.policy else {
            return Ok(());
        };
        let Some(schedule) = policy.schedule else {
            return Ok(());
        };
        let counter = self.versions_policy.write_counter(id);
        if let Some(due) = schedule::due(&schedule, policy.anchor_ms, now_ms, counter.load(Relaxed))
        {
            self.take_policy_snapshot(id, volume, due, now_ms, report)
                .await?;
        }
        self.keep_last(id, volume, &schedule, report).await
    }

    async fn take_policy_snapshot(
        &self,
        id: u32,
        volume: &str,
        due: Due,
        now_ms: u64,
        report: &mut PolicyReport,
    ) -> Result<()> {
        let counter = self.versions_policy.write_counter(id);
        if let Err(refusal) = self.reserve_for_snapshot(volume).await {
            // This period's (or these writes') snapshot is skipped: the next is due one
            // period or N writes later, so a pool under its reserve is not asked (and the
            // log told) again every second.
            self.store.transact(TxnClass::Normal, |state, txn| {
                self.stage_policy(state, txn, id, |policy, _| {
                    policy.anchor_ms = now_ms;
                    Ok(())
                })
            })?;
            self.store.commit().await?;
            counter.store(0, Relaxed);
            report
                .refused
                .push((volume.to_string(), refusal.to_string()));
            return Ok(());
        }
        let taken = self.store.read(|state| {
            self.read_policy_records(state, id)
                .map(|r| r.versions.map(|v| v.snapshots).unwrap_or_default())
        })?;
        let name = schedule::auto_name(now_ms, |name| taken.iter().any(|s| s.name == name));
        let snapshot = self
            .take_snapshot(volume, Some(&name), now_ms, |snapshot, state, txn| {
                self.stage_policy(state, txn, id, |policy, _| {
                    policy.made.insert(snapshot.epoch);
                    policy.anchor_ms = now_ms;
                    Ok(())
                })?;
                // Under the snapshot's quiesce: every write counted so far is in it.
                counter.store(0, Relaxed);
                Ok(())
            })
            .await?;
        self.versions_policy.taken.fetch_add(1, Relaxed);
        let why = match due {
            Due::Period => "its period passed",
            Due::Writes => "its write count was reached",
        };
        tracing::info!(pool = %self.name, volume, snapshot = %snapshot.name, due = why, "automatic snapshot taken");
        self.versions_policy
            .act(format!("took {volume}@{} ({why})", snapshot.name));
        report.taken.push((volume.to_string(), snapshot.name));
        Ok(())
    }

    /// Deletes the policy's snapshots of `volume` beyond its last K (never a manual or a
    /// protected one).
    async fn keep_last(
        &self,
        id: u32,
        volume: &str,
        schedule: &Schedule,
        report: &mut PolicyReport,
    ) -> Result<()> {
        let records = self
            .store
            .read(|state| self.read_policy_records(state, id))?;
        let (Some(policy), Some(versions)) = (records.policy, records.versions) else {
            return Ok(());
        };
        let made: Vec<Made> = versions
            .snapshots
            .iter()
            .filter(|s| policy.made.contains(&s.epoch))
            .map(|s| Made {
                epoch: s.epoch,
                protected: policy.protected.contains(&s.epoch),
            })
            .collect();
        for epoch in schedule::beyond_keep(&made, schedule.keep) {
            let Some(snapshot) = versions.snapshots.iter().find(|s| s.epoch == epoch) else {
                continue;
            };
            let freed = self.delete_snapshot(volume, &snapshot.name).await?;
            self.versions_policy.kept_deleted.fetch_add(1, Relaxed);
            // Routine, asked for by the policy: info, not a warning.
            tracing::info!(pool = %self.name, volume, snapshot = %snapshot.name, keep = schedule.keep, extents_freed = freed, "automatic snapshot deleted: the policy keeps only its last K");
            self.versions_policy.act(format!(
                "deleted {volume}@{} (keep {})",
                snapshot.name,
                schedule.keep.unwrap_or(0)
            ));
            report
                .kept_deleted
                .push((volume.to_string(), snapshot.name.clone()));
        }
        Ok(())
    }

    /// One pass of the runner: the schedules at `now_ms`, then the reserve.
    pub async fn run_policies(&self, now_ms: u64) -> PolicyReport {
        let mut report = self.policy_tick(now_ms).await;
        match self.enforce_reserve().await {
            Ok(deleted) => report.reserve_deleted = deleted,
            Err(error) => {
                self.versions_policy.failed.fetch_add(1, Relaxed);
                tracing::warn!(pool = %self.name, %error, "snapshot reserve could not be enforced");
                self.versions_policy
                    .act(format!("reserve not enforced: {error}"));
            }
        }
        report
    }

    /// Starts the runner on the pool's background work: a pass every `interval`, or at once
    /// when free space falls under a `delete-oldest` reserve. Holds only a weak reference to
    /// the pool between passes, so that dropping the pool ends it too.
    pub(crate) fn spawn_policy_runner(
        self: &Arc<Self>,
        runtime: Arc<dyn Runtime>,
        interval: Duration,
    ) {
        let pool: Weak<ThinPool> = Arc::downgrade(self);
        let woken = self.versions_policy.reserve_low.clone();
        let sleeper = runtime.clone();
        self.background()
            .spawn(runtime.as_ref(), |worker| async move {
                loop {
                    {
                        let nap = std::pin::pin!(worker.sleep(sleeper.as_ref(), interval));
                        let low = std::pin::pin!(woken.notified());
                        futures_util::future::select(nap, low).await;
                    }
                    let Some(_step) = worker.step().await else {
                        return;
                    };
                    let Some(pool) = pool.upgrade() else { return };
                    pool.run_policies(schedule::wall_ms()).await;
                }
            });
    }

    /// The pool's part of status: the reserve, what the policies did since the pool was
    /// opened, and the last thing they did.
    pub(crate) fn policy_detail(&self) -> Vec<(String, String)> {
        let state = &self.versions_policy;
        let count = |key: &str, n: &AtomicU64| (key.to_string(), n.load(Relaxed).to_string());
        let mut detail = Vec::new();
        match &state.reserve {
            None => detail.push(("snapshot reserve".into(), "none".into())),
            Some(policy) => {
                let (free, reserve) = self.reserve_state(policy);
                let extent = self.extent_size();
                detail.push((
                    "snapshot reserve".into(),
                    format!(
                        "{} ({} in {reserve} extents; free {}{})",
                        policy.reserve.describe(),
                        ByteSize(reserve * extent),
                        ByteSize(free * extent),
                        if reserve::below(free, reserve) {
                            ", BELOW"
                        } else {
                            ""
                        }
                    ),
                ));
                detail.push(("when reserve low".into(), policy.when_low.name().into()));
            }
        }
        detail.push(count("snapshots refused for the reserve", &state.refused));
        detail.push(count(
            "snapshots deleted for the reserve",
            &state.reserve_deleted,
        ));
        detail.push(count("automatic snapshots taken", &state.taken));
        detail.push(count(
            "automatic snapshots deleted (keep)",
            &state.kept_deleted,
        ));
        detail.push(count("snapshot policy failures", &state.failed));
        let last = state
            .last_action
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        detail.push((
            "last versions action".into(),
            last.unwrap_or_else(|| "none".into()),
        ));
        detail
    }

    /// A volume's part of status: its schedule, the next and the last automatic snapshot.
    pub(crate) fn volume_policy_detail(&self, volume: &str) -> Vec<(String, String)> {
        let Ok(status) = self.snapshot_policy(volume) else {
            return Vec::new();
        };
        let Some(policy) = status.policy else {
            if status.protected.is_empty() {
                return Vec::new();
            }
            return vec![("protected snapshots".into(), status.protected.join(", "))];
        };
        let mut next = Vec::new();
        if let Some(at) = status.next_due_ms {
            next.push(format!("{} UTC", schedule::utc(at)));
        }
        if let Some(writes) = status.every_writes {
            next.push(format!(
                "after {} more writes",
                writes.saturating_sub(status.writes_since)
            ));
        }
        let mut detail = vec![
            ("snapshot policy".into(), policy),
            ("next automatic snapshot".into(), next.join(" or ")),
            (
                "last automatic snapshot".into(),
                match (&status.last_auto, status.last_auto_ms) {
                    (Some(name), Some(ms)) => format!("{name} at {} UTC", schedule::utc(ms)),
                    _ => "none".into(),
                },
            ),
            ("writes since".into(), status.writes_since.to_string()),
        ];
        if !status.protected.is_empty() {
            detail.push(("protected snapshots".into(), status.protected.join(", ")));
        }
        detail
    }
}
