//! Versions of thin volumes (Clotho): snapshots taken, listed, deleted in any order, rolled
//! back to and cloned, sharing the pool's allocator and metadata.
//!
//! Every change of a volume's versions is one transaction of its `versions.<id>` record, made
//! with every lock stripe held (no I/O of the pool in flight), so a write belongs wholly to the
//! epoch before or wholly to the epoch after. Taking a snapshot first makes everything
//! acknowledged durable, then pins the current epoch and starts the next: constant time, no
//! data or map copied. What a deletion or a rollback leaves unread is freed afterwards by a
//! pass over the volume's chains, one virtual extent at a time under its stripe
//! ([`ThinPool::collect`]); a crash in that pass leaves garbage, never a lost granule, and
//! the next deletion (or open) collects it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use strata_core::{BlockError, Result};
use strata_meta::{ObjectId, State, TxnClass};

use crate::chain::{Layer, Reading};
use crate::map::GRANULE;
use crate::pool::ThinPool;
use crate::records::{
    self, decode_volumes, encode_volumes, versions_name, Base, History, PoolRecord, SnapshotRecord,
    VersionsRecord, VolumeRecord,
};
use crate::versions::{self, check_name, Epoch, Granules, Link};
use crate::volume::{HeadView, ThinVolume};

pub use crate::snapshot_device::SnapshotDevice;

/// The objects versions keep, created with the pool's first snapshot.
#[derive(Clone, Copy, Debug)]
pub struct VersionIds {
    pub history: ObjectId,
    pub masked: ObjectId,
}

/// One snapshot as `snapshot list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotInfo {
    pub volume: String,
    pub name: String,
    pub epoch: Epoch,
    pub created_ms: u64,
    /// The volume's size when it was taken.
    pub size: u64,
    /// Bytes only this snapshot reads (freed if it is deleted, unless a clone holds them).
    pub unique_bytes: u64,
    /// Bytes it reads that the volume or another version reads too.
    pub shared_bytes: u64,
    /// The snapshot it is compacted against (None: not compacted), and its deltas' bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compacted_against: Option<String>,
    pub delta_bytes: u64,
}

fn corrupt(pool: &str, problem: impl std::fmt::Display) -> BlockError {
    BlockError::Corrupt(format!("thin pool {pool}: {problem}"))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Every volume's versions record, by volume id.
type Records = std::collections::BTreeMap<u32, VersionsRecord>;

impl ThinPool {
    /// At open: finds the versions objects and sets every volume's view.
    pub(crate) fn load_versions(&self) -> Result<()> {
        self.store.read(|state| {
            if let (Some(history), Some(masked)) =
                (state.id(records::HISTORY), state.id(records::MASKED))
            {
                let _ = self.version_ids.set(VersionIds { history, masked });
            }
            self.refresh_views(state)
        })
    }

    pub(crate) fn versions_records(&self, state: &State) -> Result<Records> {
        let mut out = Records::new();
        for (record, _) in self.volumes_lock().values() {
            let Some(id) = state.id(&versions_name(record.id)) else {
                continue;
            };
            let bytes = state.blob(id).unwrap_or(&[]);
            let decoded = VersionsRecord::decode(bytes)
                .map_err(|e| corrupt(&self.name, format!("volume {}: {e}", record.name)))?;
            out.insert(record.id, decoded);
        }
        Ok(out)
    }

    /// The epochs of volume `id` some version reads: the current one, its snapshots', and
    /// those its clones were made from.
    pub(crate) fn pinned(records: &Records, id: u32) -> Vec<Epoch> {
        let Some(own) = records.get(&id) else {
            return vec![0];
        };
        let mut pinned: Vec<Epoch> = std::iter::once(own.lineage.current)
            .chain(own.snapshots.iter().map(|s| s.epoch))
            // A compacted snapshot's deltas are read against its base: pinned while they are.
            .chain(own.snapshots.iter().filter_map(|s| s.compacted))
            .chain(
                records
                    .values()
                    .filter_map(|r| r.base.filter(|b| b.volume == id).map(|b| b.epoch)),
            )
            .collect();
        pinned.sort_unstable();
        pinned.dedup();
        pinned
    }

    /// How volume `id` is read at epoch `at`: its own map, then its bases'.
    pub(crate) fn reading(&self, records: &Records, id: u32, at: Epoch) -> Result<Reading> {
        let maps: std::collections::BTreeMap<u32, ObjectId> = self
            .volumes_lock()
            .values()
            .map(|(record, map)| (record.id, *map))
            .collect();
        let mut layers = Vec::new();
        let (mut volume, mut epoch) = (id, at);
        loop {
            let map = *maps.get(&volume).ok_or_else(|| {
                corrupt(
                    &self.name,
                    format!("a clone's base volume {volume} is gone"),
                )
            })?;
            let record = records.get(&volume);
            layers.push(Layer {
                map,
                lineage: record.map(|r| r.lineage.clone()).unwrap_or_default(),
                at: epoch,
            });
            match record.and_then(|r| r.base) {
                Some(base) if layers.len() <= maps.len() => {
                    (volume, epoch) = (base.volume, base.epoch)
                }
                Some(_) => return Err(corrupt(&self.name, "clone bases form a cycle")),
                None => return Ok(Arc::new(layers)),
            }
        }
    }

    /// Sets every volume's view from the records in `state`. Called with the pool quiesced
    /// (or before it serves).
    pub(crate) fn refresh_views(&self, state: &State) -> Result<()> {
        let records = self.versions_records(state)?;
        *self
            .snapshot_epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = records
            .iter()
            .flat_map(|(id, r)| r.snapshots.iter().map(move |s| (*id, s.epoch)))
            .collect();
        let ids: Vec<u32> = self.volumes_lock().values().map(|(r, _)| r.id).collect();
        for id in ids {
            let view = match records.get(&id) {
                None => None,
                Some(record) => Some(Arc::new(HeadView {
                    reading: self.reading(&records, id, record.lineage.current)?,
                    current: record.lineage.current,
                    shared_limit: record.lineage.shared_limit(Self::pinned(&records, id)),
                })),
            };
            *self
                .view_cell(id)
                .write()
                .unwrap_or_else(|p| p.into_inner()) = view;
        }
        Ok(())
    }

    pub(crate) fn volume_record(&self, name: &str) -> Result<(VolumeRecord, ObjectId)> {
        self.volumes_lock()
            .get(name)
            .cloned()
            .ok_or_else(|| BlockError::InvalidArgument(format!("no volume named {name:?}")))
    }

    /// Runs `change` on volume `id`'s versions record (a default one if it has none) in one
    /// transaction, creating the versions objects and moving the pool to format 2 the first
    /// time, then sets the views. The caller holds the pool quiesced.
    pub(crate) fn change_versions<R>(
        &self,
        id: u32,
        change: impl FnOnce(
            &mut VersionsRecord,
            &State,
            &mut strata_meta::Txn,
            &mut Vec<u64>,
        ) -> Result<R>,
    ) -> Result<R> {
        let pool_id = self.ids.pool;
        let result = self.freeing_transaction(TxnClass::Normal, |state, txn, freed| {
            let name = versions_name(id);
            let mut record = match state.id(&name) {
                Some(object) => VersionsRecord::decode(state.blob(object).unwrap_or(&[]))
                    .map_err(|e| corrupt(&self.name, e))?,
                None => VersionsRecord::default(),
            };
            let result = change(&mut record, state, txn, freed)?;
            if state.id(records::HISTORY).is_none() {
                txn.create_table(records::HISTORY, History::BYTES);
                txn.create_bitmap(records::MASKED);
                let mut pool = PoolRecord::decode(state.blob(pool_id).unwrap_or(&[]))
                    .map_err(|e| corrupt(&self.name, e))?;
                pool.format = records::POOL_FORMAT_VERSIONS;
                txn.put_blob(pool_id, pool.encode());
            }
            let blob = match state.id(&name) {
                Some(object) => object,
                None => txn.create_blob(&name),
            };
            txn.put_blob(blob, record.encode());
            Ok(result)
        })?;
        self.store.read(|state| {
            if let (Some(history), Some(masked)) =
                (state.id(records::HISTORY), state.id(records::MASKED))
            {
                let _ = self.version_ids.set(VersionIds { history, masked });
            }
            self.refresh_views(state)
        })?;
        Ok(result)
    }

    /// Takes a snapshot of `volume` named `name` (default `v<epoch>`): every write
    /// acknowledged before it belongs to it, none after. Durable on return; constant time
    /// whatever the volume's size.
    pub async fn create_snapshot(
        &self,
        volume: &str,
        name: Option<&str>,
    ) -> Result<SnapshotRecord> {
        // The space reserve for versions may refuse it, or delete old ones first (runner.rs).
        self.reserve_for_snapshot(volume).await?;
        self.take_snapshot(volume, name, now_ms(), |_, _, _| Ok(()))
            .await
    }

    /// [`ThinPool::create_snapshot`] past the reserve, taken at `created_ms`; `also` stages
    /// more in the snapshot's own transaction (the versions policy records what it made).
    pub(crate) async fn take_snapshot(
        &self,
        volume: &str,
        name: Option<&str>,
        created_ms: u64,
        also: impl FnOnce(&SnapshotRecord, &State, &mut strata_meta::Txn) -> Result<()>,
    ) -> Result<SnapshotRecord> {
        if let Some(name) = name {
            check_name(name).map_err(BlockError::InvalidArgument)?;
        }
        // Most of what is dirty goes down before I/O is held, so the hold is short; the
        // flush under the quiesce then covers what was acknowledged since.
        self.flush().await?;
        // No request is half done when the epoch changes: those in flight finish first.
        let _whole = self.requests.write().await;
        let quiet = self.quiesce().await;
        let (record, _) = self.volume_record(volume)?;
        // Everything acknowledged is made durable first, under the quiesce: it is the
        // snapshot's.
        self.flush().await?;
        let snapshot = self.change_versions(record.id, |versions, state, txn, _| {
            let epoch = versions.lineage.current;
            let name = name.map_or_else(|| format!("v{epoch}"), str::to_string);
            if versions.snapshots.iter().any(|s| s.name == name) {
                return Err(BlockError::InvalidArgument(format!(
                    "volume {volume} has a snapshot named {name:?} already"
                )));
            }
            let snapshot = SnapshotRecord {
                name,
                epoch,
                created_ms,
                size: record.size,
                compacted: None,
            };
            versions.snapshots.push(snapshot.clone());
            versions.lineage.advance();
            also(&snapshot, state, txn)?;
            Ok(snapshot)
        })?;
        self.store.commit().await?;
        drop(quiet);
        tracing::info!(pool = %self.name, volume, snapshot = %snapshot.name, epoch = snapshot.epoch, "snapshot taken");
        Ok(snapshot)
    }

    /// Deletes a snapshot of `volume`; every other version and the volume read as before.
    /// Frees what only it read. Returns the extents freed.
    pub async fn delete_snapshot(&self, volume: &str, name: &str) -> Result<u64> {
        let quiet = self.quiesce().await;
        let (record, _) = self.volume_record(volume)?;
        self.refuse_protected(record.id, volume, name)?;
        let has_versions = self.versions_record(record.id)?.is_some();
        if !has_versions {
            return Err(no_snapshot(volume, name));
        }
        self.change_versions(record.id, |versions, state, txn, freed| {
            let Some(at) = versions.snapshots.iter().position(|s| s.name == name) else {
                return Err(no_snapshot(volume, name));
            };
            if let Some(dependent) = (versions.snapshots.iter())
                .find(|s| s.compacted == Some(versions.snapshots[at].epoch))
                .filter(|_| versions.snapshots[at].compacted.is_some())
            {
                // Its deltas are part of the dependent's base view.
                return Err(BlockError::InvalidArgument(format!(
                    "snapshot {volume}@{name} is compacted and {} is compacted against it; \
                     uncompact {} first",
                    dependent.name, dependent.name
                )));
            }
            let gone = versions.snapshots.remove(at);
            if gone.compacted.is_some() {
                // Its deltas go with it, in the same transaction.
                self.drop_compaction(state, txn, record.id, gone.epoch, freed)?;
            }
            Ok(())
        })?;
        self.store.commit().await?;
        drop(quiet);
        let freed = self.collect(volume).await?;
        tracing::info!(pool = %self.name, volume, snapshot = name, extents_freed = freed, "snapshot deleted");
        Ok(freed)
    }

    /// Makes `volume` read as `snapshot` again (its size too). The snapshot and every other
    /// version stay; what the volume wrote since and no version reads is freed.
    pub async fn rollback(&self, volume: &str, snapshot: &str) -> Result<u64> {
        let whole = self.requests.write().await;
        let quiet = self.quiesce().await;
        let (record, _) = self.volume_record(volume)?;
        let target = self.find_snapshot(record.id, volume, snapshot)?;
        refuse_if_compacted(&target, volume, "roll back to")?;
        let ids = self.ids;
        self.flush().await?;
        self.change_versions(record.id, |versions, state, txn, _| {
            versions.lineage.branch(target.epoch);
            let mut volumes = decode_volumes(state.blob(ids.volumes).unwrap_or(&[]))
                .map_err(|e| corrupt(&self.name, e))?;
            for stored in volumes.iter_mut().filter(|v| v.id == record.id) {
                stored.size = target.size;
            }
            txn.put_blob(ids.volumes, encode_volumes(&volumes));
            Ok(())
        })?;
        if let Some((stored, _)) = self.volumes_lock().get_mut(volume) {
            stored.size = target.size;
        }
        self.set_live_size(record.id, target.size);
        self.store.commit().await?;
        drop(quiet);
        drop(whole);
        let freed = self.collect(volume).await?;
        tracing::info!(pool = %self.name, volume, snapshot, extents_freed = freed, "volume rolled back");
        Ok(freed)
    }

    /// A new writable volume that reads as `snapshot` of `volume` until it is written; it
    /// shares all its data with the snapshot.
    pub async fn clone_snapshot(
        self: &Arc<Self>,
        volume: &str,
        snapshot: &str,
        new_volume: &str,
    ) -> Result<Arc<ThinVolume>> {
        if new_volume.is_empty() || new_volume.len() > 64 || new_volume.contains(['/', '@']) {
            return Err(BlockError::InvalidArgument(format!(
                "volume name {new_volume:?}"
            )));
        }
        let quiet = self.quiesce().await;
        let (origin, _) = self.volume_record(volume)?;
        let source = self.find_snapshot(origin.id, volume, snapshot)?;
        refuse_if_compacted(&source, volume, "clone")?;
        let record = self.store.transact(TxnClass::Normal, |state, txn| {
            let record = self.stage_volume(state, txn, new_volume, source.size)?;
            let versions = VersionsRecord {
                base: Some(Base {
                    volume: origin.id,
                    epoch: source.epoch,
                }),
                ..VersionsRecord::default()
            };
            let blob = txn.create_blob(&versions_name(record.id));
            txn.put_blob(blob, versions.encode());
            Ok(record)
        })?;
        let clone = self.attach(record)?;
        self.store.read(|state| self.refresh_views(state))?;
        self.store.commit().await?;
        drop(quiet);
        tracing::info!(pool = %self.name, volume, snapshot, clone = new_volume, "snapshot cloned");
        Ok(clone)
    }

    /// Sets every volume's view again (after a volume came or went). Quiesced callers only.
    pub(crate) fn refresh_versions(&self, state: &State) -> Result<()> {
        self.refresh_views(state)
    }

    /// A read-only device reading `snapshot` of `volume`, while the snapshot exists.
    pub fn snapshot_device(
        self: &Arc<Self>,
        volume: &str,
        snapshot: &str,
    ) -> Result<SnapshotDevice> {
        let (record, _) = self.volume_record(volume)?;
        let found = self.find_snapshot(record.id, volume, snapshot)?;
        let all = self.store.read(|state| self.versions_records(state))?;
        Ok(SnapshotDevice {
            pool: self.clone(),
            volume: record.id,
            name: format!("{volume}@{snapshot}"),
            epoch: found.epoch,
            size: found.size,
            reading: self.reading(&all, record.id, found.epoch)?,
        })
    }

    /// Whether volume `id` has a versions record (it had a snapshot, or is a clone).
    pub(crate) fn has_versions(&self, id: u32) -> bool {
        self.store
            .read(|state| state.id(&versions_name(id)).is_some())
    }

    /// The volume a clone reads from, if `id` is a clone.
    pub(crate) fn base_of(&self, id: u32) -> Result<Option<Base>> {
        Ok(self.versions_record(id)?.and_then(|v| v.base))
    }

    /// The name of the volume with id `id`.
    pub(crate) fn volume_name(&self, id: u32) -> Option<String> {
        self.volumes_lock()
            .values()
            .find(|(r, _)| r.id == id)
            .map(|(r, _)| r.name.clone())
    }

    pub(crate) fn versions_record(&self, id: u32) -> Result<Option<VersionsRecord>> {
        self.store.read(|state| {
            let Some(object) = state.id(&versions_name(id)) else {
                return Ok(None);
            };
            VersionsRecord::decode(state.blob(object).unwrap_or(&[]))
                .map(Some)
                .map_err(|e| corrupt(&self.name, e))
        })
    }

    pub(crate) fn find_snapshot(
        &self,
        id: u32,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotRecord> {
        self.versions_record(id)?
            .and_then(|versions| versions.snapshots.into_iter().find(|s| s.name == name))
            .ok_or_else(|| no_snapshot(volume, name))
    }

    /// Whether `volume` has versions, snapshots or clones (which a shrink or a delete of it
    /// must not break).
    pub(crate) fn versions_block(&self, volume: &VolumeRecord) -> Result<Option<String>> {
        let all = self.store.read(|state| self.versions_records(state))?;
        let clones: Vec<String> = self
            .volumes_lock()
            .values()
            .filter(|(r, _)| {
                all.get(&r.id)
                    .and_then(|v| v.base)
                    .is_some_and(|b| b.volume == volume.id)
            })
            .map(|(r, _)| r.name.clone())
            .collect();
        let Some(own) = all.get(&volume.id) else {
            return Ok(None);
        };
        if !clones.is_empty() {
            return Ok(Some(format!(
                "volume {} has clones: {}",
                volume.name,
                clones.join(", ")
            )));
        }
        if !own.snapshots.is_empty() {
            let names: Vec<&str> = own.snapshots.iter().map(|s| s.name.as_str()).collect();
            return Ok(Some(format!(
                "volume {} has snapshots: {}",
                volume.name,
                names.join(", ")
            )));
        }
        Ok(None)
    }

    /// Every snapshot (of `volume`, or of all volumes) with the space it alone reads and the
    /// space it shares. Walks the volumes' chains a chunk at a time.
    pub fn snapshots(&self, volume: Option<&str>) -> Result<Vec<SnapshotInfo>> {
        let all = self.store.read(|state| self.versions_records(state))?;
        let volumes: Vec<(VolumeRecord, ObjectId)> = self
            .volumes_lock()
            .values()
            .filter(|(r, _)| volume.is_none_or(|v| v == r.name))
            .cloned()
            .collect();
        if let Some(name) = volume {
            if volumes.is_empty() {
                return Err(BlockError::InvalidArgument(format!(
                    "no volume named {name:?}"
                )));
            }
        }
        let mut out = Vec::new();
        for (record, map) in volumes {
            let Some(versions) = all.get(&record.id) else {
                continue;
            };
            if versions.snapshots.is_empty() {
                continue;
            }
            let pinned: Vec<Epoch> = versions.snapshots.iter().map(|s| s.epoch).collect();
            let others = Self::pinned(&all, record.id);
            let (unique, shared) = self.reader_space(record.id, map, versions, &pinned, &others);
            for (i, snapshot) in versions.snapshots.iter().enumerate() {
                let compacted_against = snapshot.compacted.map(|base| {
                    (versions.snapshots.iter())
                        .find(|s| s.epoch == base)
                        .map_or_else(|| format!("epoch {base} (deleted)"), |s| s.name.clone())
                });
                let delta_bytes = self
                    .store
                    .read(|state| self.delta_bytes(state, record.id, snapshot.epoch));
                out.push(SnapshotInfo {
                    compacted_against,
                    delta_bytes,
                    volume: record.name.clone(),
                    name: snapshot.name.clone(),
                    epoch: snapshot.epoch,
                    created_ms: snapshot.created_ms,
                    size: snapshot.size,
                    unique_bytes: unique[i] * GRANULE,
                    shared_bytes: shared[i] * GRANULE,
                });
            }
        }
        Ok(out)
    }

    /// Granules each of `pinned` reads alone and shares, among every epoch in `all`.
    fn reader_space(
        &self,
        id: u32,
        map: ObjectId,
        versions: &VersionsRecord,
        pinned: &[Epoch],
        all: &[Epoch],
    ) -> (Vec<u64>, Vec<u64>) {
        let lineage = &versions.lineage;
        let compacted = crate::compact::compacted_epochs(versions);
        let readers: Vec<Epoch> = pinned
            .iter()
            .copied()
            .chain(all.iter().copied().filter(|e| !pinned.contains(e)))
            .collect();
        let mut unique = vec![0u64; pinned.len()];
        let mut shared = vec![0u64; pinned.len()];
        self.each_chain(id, map, &compacted, |links, given| {
            let got =
                versions::readers_given(links, lineage, &readers, &|e| given.get(&e).cloned());
            for i in 0..pinned.len() {
                unique[i] += got.unique[i];
                shared[i] += got.shared[i];
            }
        });
        (unique, shared)
    }

    /// Calls `visit` with every chain of a map (as policy links) and what the `compacted`
    /// snapshots read there from their deltas, reading a chunk at a time.
    fn each_chain(
        &self,
        id: u32,
        map: ObjectId,
        compacted: &[Epoch],
        mut visit: impl FnMut(&[Link], &std::collections::BTreeMap<Epoch, Granules>),
    ) {
        const CHUNK: usize = 1024;
        let mut from = 0;
        loop {
            let chains = self.store.read(|state| {
                let Some(table) = state.table(map) else {
                    return Vec::new();
                };
                let extents: Vec<u64> = table.iter_from(from).take(CHUNK).map(|(i, _)| i).collect();
                extents
                    .into_iter()
                    .map(|extent| {
                        let given = self.given_at(state, id, compacted, extent);
                        (extent, self.links(state, map, extent), given)
                    })
                    .collect::<Vec<_>>()
            });
            let Some(&(last, _, _)) = chains.last() else {
                return;
            };
            for (_, links, given) in &chains {
                let links: Vec<Link> = links.iter().map(|(_, link)| link.clone()).collect();
                visit(&links, given);
            }
            from = last + 1;
        }
    }

    /// A chain as policy links, with each link's physical extent.
    pub(crate) fn links(&self, state: &State, map: ObjectId, extent: u64) -> Vec<(u64, Link)> {
        let ids = self.chain_ids();
        let live = state.bitmap(self.ids.live).expect("pool live bitmap");
        let per_extent = self.record.granules_per_extent();
        ids.chain(state, map, extent)
            .into_iter()
            .map(|(phys, history)| {
                let first = self.first_granule(phys);
                let defines = Granules::from_fn(per_extent, |g| {
                    live.get(first + g) || ids.masked(state, phys, g)
                });
                (
                    phys,
                    Link {
                        epoch: history.epoch,
                        defines,
                    },
                )
            })
            .collect()
    }

    /// Frees what no version of `volume` reads any more: granules of its chains no pinned
    /// epoch reads die, and extents with nothing left are unlinked and freed. One virtual
    /// extent at a time, under its stripe, each a transaction of its own. Returns the extents
    /// freed.
    pub async fn collect(&self, volume: &str) -> Result<u64> {
        let (record, map) = self.volume_record(volume)?;
        let Some(versions) = self.versions_record(record.id)? else {
            return Ok(0);
        };
        let all = self.store.read(|state| self.versions_records(state))?;
        let pinned = Self::pinned(&all, record.id);
        let extents: Vec<u64> = self.store.read(|state| {
            state
                .table(map)
                .map(|t| t.iter_from(0).map(|(i, _)| i).collect())
                .unwrap_or_default()
        });
        let mut freed_total = 0;
        for extent in extents {
            let _exclusive = self
                .extent_locks()
                .write(crate::pool::lock_key(record.id, extent))
                .await;
            freed_total += self.collect_chain(record.id, map, extent, &versions, &pinned)?;
        }
        if freed_total > 0 {
            self.store.commit().await?;
            self.space_watch.freed.notify_waiters();
        }
        Ok(freed_total)
    }

    fn collect_chain(
        &self,
        id: u32,
        map: ObjectId,
        extent: u64,
        versions: &VersionsRecord,
        pinned: &[Epoch],
    ) -> Result<u64> {
        let lineage = &versions.lineage;
        let compacted = crate::compact::compacted_epochs(versions);
        let chain_ids = self.chain_ids();
        let (Some(history), Some(masked)) = (chain_ids.history, chain_ids.masked) else {
            return Ok(0);
        };
        let ids = self.ids;
        let freed = self.freeing_transaction(TxnClass::Reclaim, |state, txn, freed| {
            let chain = self.links(state, map, extent);
            if chain.is_empty() {
                return Ok(0);
            }
            let links: Vec<Link> = chain.iter().map(|(_, link)| link.clone()).collect();
            // A compacted snapshot reads its delta's granules from there, not from older
            // links: they may die in those.
            let given = self.given_at(state, id, &compacted, extent);
            let needed =
                versions::needed_given(&links, lineage, pinned, &|e| given.get(&e).cloned());
            let mut kept: Vec<(u64, Epoch)> = Vec::new();
            for ((phys, link), needed) in chain.iter().zip(&needed) {
                let first = self.first_granule(*phys);
                if needed.is_empty() {
                    self.unlink_extent(txn, *phys, freed);
                    continue;
                }
                for g in link.defines.minus(needed).iter() {
                    txn.set_bits(ids.live, first + g, 1, false);
                    txn.set_bits(masked, first + g, 1, false);
                }
                kept.push((*phys, link.epoch));
            }
            if freed.is_empty() {
                return Ok(0);
            }
            relink(txn, history, map, extent, &kept);
            Ok(freed.len() as u64)
        })?;
        Ok(freed)
    }
}

impl ThinPool {
    /// Frees a physical extent of a chain (the caller relinks the chain): not allocated,
    /// nothing live or masked in it.
    pub(crate) fn unlink_extent(
        &self,
        txn: &mut strata_meta::Txn,
        phys: u64,
        freed: &mut Vec<u64>,
    ) {
        let per_extent = self.record.granules_per_extent();
        let first = self.first_granule(phys);
        freed.push(phys);
        txn.set_bits(self.ids.allocated, phys, 1, false);
        txn.set_bits(self.ids.live, first, per_extent, false);
        if let Some(masked) = self.chain_ids().masked {
            txn.set_bits(masked, first, per_extent, false);
        }
    }
}

/// Writes a chain anew: `links` (physical extent, epoch), newest first, become the map's
/// head and each one's older link.
pub(crate) fn relink(
    txn: &mut strata_meta::Txn,
    history: ObjectId,
    map: ObjectId,
    extent: u64,
    links: &[(u64, Epoch)],
) {
    debug_assert!(links.windows(2).all(|w| w[0].1 > w[1].1), "newest first");
    let head = links.first().map_or(0, |(phys, _)| *phys as u32 + 1);
    txn.set_u32(map, extent, head);
    for (i, &(phys, epoch)) in links.iter().enumerate() {
        let older = links.get(i + 1).map(|(phys, _)| *phys);
        txn.set(history, phys, &History { epoch, older }.encode());
    }
}

/// A compacted snapshot is read through its deltas, which a rollback or a clone would not
/// see: it must be uncompacted first.
fn refuse_if_compacted(snapshot: &SnapshotRecord, volume: &str, what: &str) -> Result<()> {
    if snapshot.compacted.is_some() {
        return Err(BlockError::InvalidArgument(format!(
            "snapshot {volume}@{} is compacted; uncompact it before you {what} it",
            snapshot.name
        )));
    }
    Ok(())
}

pub(crate) fn no_snapshot(volume: &str, name: &str) -> BlockError {
    BlockError::InvalidArgument(format!("volume {volume} has no snapshot named {name:?}"))
}
