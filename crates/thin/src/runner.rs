//! The versions policies at work in a pool: the runner that takes periodic snapshots per
//! volume and keeps them to the last K, and the state the policies keep in memory (write
//! counts, what they did). The decisions are the pure functions of `schedule` and `reserve`;
//! the runner acts through the same paths a person's commands take (`take_snapshot`,
//! `delete_snapshot`) and says what it did: every automatic deletion and every refusal is
//! logged and counted, and the last one is shown in `strata status` (`policy_status`).
//! The policy records and protections are in `policy_records`, the reserve in
//! `reserve_watch`.
//!
//! The runner is one background task of the pool, on the pool's `Background` (the handle
//! online changes quiesce and shutdown stops), that wakes once every
//! [`crate::PoolRuntime::policy_interval`] (a second) or when a write brings free space under
//! the reserve, and runs [`ThinPool::run_policies`] as one step. Tests call
//! [`ThinPool::policy_tick`] and [`ThinPool::enforce_reserve`] with a clock of their own
//! instead.
//!
//! Write counts (for `every-writes`) live in memory only: they restart at zero when the pool
//! is opened, so a restart postpones a snapshot due by writes, never takes an extra one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use strata_core::{Result, Runtime};
use strata_meta::TxnClass;
use tokio::sync::Notify;

use crate::pool::ThinPool;
use crate::reserve::ReservePolicy;
use crate::schedule::{self, Due, Made, Schedule};

/// How often the runner looks at the policies ([`crate::PoolRuntime::policy_interval`]'s
/// default): periods are whole seconds, so a second late at most.
pub const DEFAULT_POLICY_INTERVAL: Duration = Duration::from_secs(1);

/// The pool's versions-policy state that is not in the metadata.
pub(crate) struct VersionsPolicy {
    pub(crate) reserve: Option<ReservePolicy>,
    /// Write requests per volume id since the last automatic snapshot (or the open).
    writes: Mutex<BTreeMap<u32, Arc<AtomicU64>>>,
    pub(crate) taken: AtomicU64,
    pub(crate) kept_deleted: AtomicU64,
    pub(crate) reserve_deleted: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// What the policies did last, for status.
    pub(crate) last_action: Mutex<Option<String>>,
    /// Signalled when free space falls under the reserve (with `delete-oldest`), so the
    /// runner acts at once instead of at its next look. Shared with the runner task, which
    /// holds no strong reference to the pool while it waits.
    pub(crate) reserve_low: Arc<Notify>,
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

/// What the policies did since the pool was opened, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyCounts {
    /// Automatic snapshots taken.
    pub taken: u64,
    /// Automatic snapshots deleted by keep-K.
    pub kept_deleted: u64,
    /// Snapshots deleted to bring free space back to the reserve.
    pub reserve_deleted: u64,
    /// Snapshots (manual or automatic) refused for the reserve.
    pub refused: u64,
    /// Policy passes that failed for a volume (logged with the error).
    pub failed: u64,
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

    /// The write counter of volume `id`, shared by its handles (made on first use). Both
    /// locks here are changed by one insert or one assignment, which a panic cannot leave
    /// half done, so a poisoned lock's value is sound and is read through.
    pub(crate) fn write_counter(&self, id: u32) -> Arc<AtomicU64> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default()
            .clone()
    }

    pub(crate) fn writes(&self, id: u32) -> u64 {
        self.write_counter(id).load(Relaxed)
    }

    pub(crate) fn act(&self, what: String) {
        let at = schedule::utc(schedule::wall_ms());
        *self.last_action.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{at} {what}"));
    }
}

impl ThinPool {
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
                let mut listen = true;
                loop {
                    {
                        let nap = std::pin::pin!(worker.sleep(sleeper.as_ref(), interval));
                        if listen {
                            let low = std::pin::pin!(woken.notified());
                            futures_util::future::select(nap, low).await;
                        } else {
                            nap.await;
                        }
                    }
                    let Some(_step) = worker.step().await else {
                        return;
                    };
                    let Some(pool) = pool.upgrade() else { return };
                    let report = pool.run_policies(schedule::wall_ms()).await;
                    // Under the reserve with nothing left to delete (only protected
                    // snapshots), every allocating write would wake the runner again for
                    // nothing: it waits out its interval instead.
                    listen = !report.reserve_deleted.is_empty() || !pool.below_reserve();
                }
            });
    }

    /// What the policies did since the pool was opened.
    pub fn policy_counts(&self) -> PolicyCounts {
        let state = &self.versions_policy;
        PolicyCounts {
            taken: state.taken.load(Relaxed),
            kept_deleted: state.kept_deleted.load(Relaxed),
            reserve_deleted: state.reserve_deleted.load(Relaxed),
            refused: state.refused.load(Relaxed),
            failed: state.failed.load(Relaxed),
        }
    }
}
