//! Volumes changed at run time: grown, shrunk, deleted.
//!
//! Each change is one metadata transaction, committed before it returns. A shrink or a
//! delete frees space, so it runs as [`TxnClass::Reclaim`] and works on a full pool; the
//! extents it frees are quarantined like discard's, never reused before the free is durable.
//!
//! Handles opened before a change (a connected NBD client's) see it at once: a volume's size
//! is read live from the pool, and every write checks it again under its extent's lock
//! stripe. A change holds every stripe while it edits the map and the size, so no write is
//! between its check and its publish then; a write that comes later sees the new size. So
//! nothing is ever mapped past a volume's end or into a deleted volume.

use std::sync::Arc;

use bytes::Bytes;
use strata_core::{BlockError, Result, WriteFlags};
use strata_meta::{ObjectId, State, Txn, TxnClass};

use super::map::{Piece, GRANULE};
use super::pool::ThinPool;
use super::records::{decode_volumes, encode_volumes, VolumeRecord};

/// One volume's share of its pool, for listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeUsage {
    pub name: String,
    /// Virtual size in bytes.
    pub size: u64,
    /// Physical extents the volume maps.
    pub mapped_extents: u64,
}

impl ThinPool {
    /// Changes a volume's size (a positive multiple of 512). A shrink frees every extent
    /// mapped past the new end and kills the granules past it in the last extent, so a later
    /// grow shows zeros there, never the old bytes.
    pub async fn resize_volume(self: &Arc<Self>, name: &str, new_size: u64) -> Result<()> {
        check_size(new_size)?;
        let quiet = self.quiesce().await;
        let (record, map) = self.volume_entry(name)?;
        if new_size == record.size {
            return Ok(());
        }
        let shrink = new_size < record.size;
        if shrink && self.has_versions(record.id) {
            // A shrink cuts the newest extents only; older ones of the chains, which the
            // volume's versions read, would be left behind.
            return Err(BlockError::InvalidArgument(format!(
                "volume {name} has versions (snapshots, a clone base, or their history): \
                 it can grow but not shrink"
            )));
        }
        if shrink {
            self.zero_cut_granule(&record, map, new_size).await?;
        }
        let class = if shrink {
            TxnClass::Reclaim
        } else {
            TxnClass::Normal
        };
        let ids = self.ids;
        let id = record.id;
        self.freeing_transaction(class, |state, txn, freed| {
            let mut volumes = self.stored_volumes(state)?;
            let stored = volumes
                .iter_mut()
                .find(|v| v.id == id)
                .ok_or_else(|| gone(name))?;
            stored.size = new_size;
            txn.put_blob(ids.volumes, encode_volumes(&volumes));
            if shrink {
                self.cut(state, txn, map, new_size, Entries::Clear, freed);
            }
            Ok(())
        })?;
        if let Some((stored, _)) = self.volumes_lock().get_mut(name) {
            stored.size = new_size;
        }
        self.set_live_size(id, new_size);
        // I/O may go on during the commit: the map and the size are consistent already.
        drop(quiet);
        self.store.commit().await?;
        tracing::info!(
            pool = %self.name,
            volume = name,
            from = record.size,
            to = new_size,
            "thin volume resized"
        );
        Ok(())
    }

    /// Deletes a volume: frees all its extents and removes its record and its map.
    pub async fn delete_volume(self: &Arc<Self>, name: &str) -> Result<()> {
        let quiet = self.quiesce().await;
        let (record, map) = self.volume_entry(name)?;
        if let Some(why) = self.versions_block(&record)? {
            return Err(BlockError::InvalidArgument(format!(
                "{why}: delete them first (a version's data is read through its volume)"
            )));
        }
        let base = self.base_of(record.id)?;
        let ids = self.ids;
        let id = record.id;
        let chain_ids = self.chain_ids();
        let freed = self.freeing_transaction(TxnClass::Reclaim, |state, txn, freed| {
            // The older extents of the chains go too (`cut` frees the newest of each).
            if chain_ids.history.is_some() {
                for (_, value) in state.table(map).into_iter().flat_map(|t| t.iter_from(0)) {
                    let head = u32::from_le_bytes(value.try_into().expect("4-byte map")) as u64 - 1;
                    let mut older = chain_ids.history(state, head).older;
                    while let Some(phys) = older {
                        freed.push(phys);
                        older = chain_ids.history(state, phys).older;
                    }
                }
            }
            if let Some(versions) = state.id(&super::records::versions_name(id)) {
                txn.delete(versions);
            }
            if let Some(policy) = state.id(&super::records::policy::policy_name(id)) {
                txn.delete(policy);
            }
            let mut volumes = self.stored_volumes(state)?;
            let before = volumes.len();
            volumes.retain(|v| v.id != id);
            if volumes.len() == before {
                return Err(gone(name));
            }
            txn.put_blob(ids.volumes, encode_volumes(&volumes));
            self.cut(state, txn, map, 0, Entries::GoWithTheMap, freed);
            txn.delete(map);
            Ok(freed.len())
        })?;
        self.volumes_lock().remove(name);
        self.set_live_size(id, 0);
        self.store.read(|state| self.refresh_versions(state))?;
        drop(quiet);
        self.store.commit().await?;
        tracing::info!(pool = %self.name, volume = name, extents_freed = freed, "thin volume deleted");
        // A clone's base epoch is no longer pinned: its origin may have garbage now.
        if let Some(origin) = base.and_then(|b| self.volume_name(b.volume)) {
            self.collect(&origin).await?;
        }
        Ok(())
    }

    /// Size in bytes of a volume, if it exists.
    pub fn volume_size(&self, name: &str) -> Option<u64> {
        self.volumes_lock().get(name).map(|(record, _)| record.size)
    }

    /// Every volume with its size and the extents it maps, in name order.
    pub fn volume_usage(&self) -> Vec<VolumeUsage> {
        let volumes: Vec<(VolumeRecord, ObjectId)> =
            self.volumes_lock().values().cloned().collect();
        self.store.read(|state| {
            volumes
                .into_iter()
                .map(|(record, map)| VolumeUsage {
                    mapped_extents: state.table(map).map_or(0, |t| t.len()),
                    name: record.name,
                    size: record.size,
                })
                .collect()
        })
    }

    /// Bytes of data space (all extents, mapped or not).
    pub fn data_bytes(&self) -> u64 {
        self.extents() * self.record.extent_size
    }

    /// The current size of the volume a handle was opened on; 0 once it is deleted (even if
    /// another volume took its name since).
    /// Refuses a write piece that no longer lies inside its volume. Called under the piece's
    /// lock stripe, which a resize or delete holds while it changes the volume.
    pub(crate) fn check_live(&self, size: u64, piece: &Piece) -> Result<()> {
        let offset = piece.extent * self.record.extent_size + piece.within;
        if offset + piece.len > size {
            return Err(BlockError::OutOfRange {
                offset,
                len: piece.len,
                size,
            });
        }
        Ok(())
    }

    fn volume_entry(&self, name: &str) -> Result<(VolumeRecord, ObjectId)> {
        self.volumes_lock()
            .get(name)
            .cloned()
            .ok_or_else(|| gone(name))
    }

    fn stored_volumes(&self, state: &State) -> Result<Vec<VolumeRecord>> {
        decode_volumes(state.blob(self.ids.volumes).unwrap_or(&[])).map_err(|problem| {
            BlockError::InvalidArgument(format!("thin pool {}: {problem}", self.name))
        })
    }

    /// Takes every lock stripe, in order, so that no I/O of any volume is inside one. I/O
    /// holds one stripe at a time, so taking them in order cannot deadlock.
    pub(crate) async fn quiesce(&self) -> Vec<tokio::sync::RwLockWriteGuard<'_, ()>> {
        self.locks.write_all().await
    }

    /// Runs a transaction that may free extents (it pushes them on the list it is given).
    /// They are quarantined while the transaction is built, under the store's lock, so an
    /// allocation never sees them free before the quarantine does; then until the
    /// transaction is durable.
    pub(crate) fn freeing_transaction<R>(
        &self,
        class: TxnClass,
        build: impl FnOnce(&State, &mut Txn, &mut Vec<u64>) -> Result<R>,
    ) -> Result<R> {
        let mut freed = Vec::new();
        let result = self.store.transact(class, |state, txn| {
            let result = build(state, txn, &mut freed)?;
            let mut allocator = self.allocator()?;
            for &extent in &freed {
                allocator.quarantine(extent, u64::MAX);
            }
            Ok(result)
        });
        // The transaction just applied (if it did) is numbered below `next_txn`.
        let release_after = match result {
            Ok(_) => self.store.next_txn(),
            Err(_) => 0, // nothing was freed: drop the guard at the next allocation
        };
        let mut allocator = self.allocator()?;
        for &extent in &freed {
            allocator.quarantine(extent, release_after);
        }
        result
    }

    /// Stages the changes that cut the volume whose map is `map` at `new_size` bytes: every
    /// extent mapped wholly past it is freed; in the extent it ends inside, the granules
    /// past it die, and the extent is freed if nothing in it is left live.
    fn cut(
        &self,
        state: &State,
        txn: &mut Txn,
        map: ObjectId,
        new_size: u64,
        entries: Entries,
        freed: &mut Vec<u64>,
    ) {
        let extent_size = self.record.extent_size;
        let per_extent = extent_size / GRANULE;
        let Some(table) = state.table(map) else {
            return;
        };
        let live = state.bitmap(self.ids.live).expect("pool live bitmap");
        let phys_at =
            |value: &[u8]| u32::from_le_bytes(value.try_into().expect("4-byte map")) as u64 - 1;
        let kept = new_size.div_ceil(extent_size);
        if !new_size.is_multiple_of(extent_size) {
            let index = new_size / extent_size;
            if let Some(value) = table.get(index) {
                let phys = phys_at(value);
                let first = self.first_granule(phys);
                let keep = (new_size % extent_size).div_ceil(GRANULE);
                if live.count_range(first, keep) == 0 {
                    txn.set_u32(map, index, 0);
                    freed.push(phys);
                } else {
                    txn.set_bits(self.ids.live, first + keep, per_extent - keep, false);
                }
            }
        }
        for (index, value) in table.iter_from(kept) {
            let phys = phys_at(value);
            if entries == Entries::Clear {
                txn.set_u32(map, index, 0);
            }
            freed.push(phys);
        }
        // Extents sit in log order, so the freed ones mostly form runs: one op per run.
        let mut extents: Vec<u64> = freed.clone();
        extents.sort_unstable();
        let mut at = 0;
        while at < extents.len() {
            let start = extents[at];
            let mut end = at + 1;
            while end < extents.len() && extents[end] == start + (end - at) as u64 {
                end += 1;
            }
            let count = (end - at) as u64;
            txn.set_bits(self.ids.allocated, start, count, false);
            txn.set_bits(
                self.ids.live,
                self.first_granule(start),
                count * per_extent,
                false,
            );
            if let Some(masked) = self.chain_ids().masked {
                txn.set_bits(masked, self.first_granule(start), count * per_extent, false);
            }
            at = end;
        }
    }

    /// Before a shrink to a size inside a granule: zeros over the rest of that granule. The
    /// granule stays live (its head is still the volume's), so without this its tail would
    /// show the old bytes after a later grow. The commit that publishes the shrink flushes
    /// these zeros first.
    async fn zero_cut_granule(
        &self,
        record: &VolumeRecord,
        map: ObjectId,
        new_size: u64,
    ) -> Result<()> {
        if new_size.is_multiple_of(GRANULE) {
            return Ok(());
        }
        let extent_size = self.record.extent_size;
        let within = new_size % extent_size;
        let granule = within / GRANULE;
        let phys = self.store.read(|state| {
            let phys = (state.table(map)?.get_u32(new_size / extent_size) as u64).checked_sub(1)?;
            let live = state.bitmap(self.ids.live).expect("pool live bitmap");
            live.get(self.first_granule(phys) + granule).then_some(phys)
        });
        let Some(phys) = phys else {
            return Ok(());
        };
        let end = (granule + 1) * GRANULE;
        let zeros = Bytes::from(vec![0u8; (end - within) as usize]);
        tracing::debug!(volume = %record.name, phys, within, "zeroing the tail of the cut granule");
        self.child
            .write(
                self.extent_offset(phys) + within,
                zeros,
                WriteFlags::default(),
            )
            .await
    }
}

/// What happens to the map entries of freed extents.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Entries {
    Clear,
    /// The transaction deletes the whole map: clearing entries one by one first would only
    /// make it longer.
    GoWithTheMap,
}

fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(512) {
        return Err(BlockError::InvalidArgument(format!(
            "volume size {size} is not a positive multiple of 512"
        )));
    }
    Ok(())
}

fn gone(name: &str) -> BlockError {
    BlockError::InvalidArgument(format!("no volume named {name:?}"))
}
