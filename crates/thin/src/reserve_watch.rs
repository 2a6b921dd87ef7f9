//! The space reserve for versions at work: the pool below its reserve refuses snapshots
//! (`refuse`) or deletes its oldest unprotected ones (`delete-oldest`), at snapshot creation
//! and when writes bring free space under it (the allocation path's watch wakes the runner).
//! The decisions are `reserve`'s pure functions.

use std::sync::atomic::Ordering::Relaxed;

use strata_core::{BlockError, ByteSize, Result};

use crate::pool::ThinPool;
use crate::reserve::{self, Candidate, ReservePolicy, WhenReserveLow};

impl ThinPool {
    /// Free data extents and the reserve in extents, now.
    pub(crate) fn reserve_state(&self, policy: &ReservePolicy) -> (u64, u64) {
        let extents = self.extents();
        let free = extents.saturating_sub(self.allocated_extents());
        (free, policy.reserve.extents(extents, self.extent_size()))
    }

    /// Whether the pool has a reserve and its free space is below it now.
    pub(crate) fn below_reserve(&self) -> bool {
        self.versions_policy.reserve.is_some_and(|policy| {
            let (free, reserve) = self.reserve_state(&policy);
            reserve::below(free, reserve)
        })
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
}
