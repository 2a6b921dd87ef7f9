//! A thin volume: a block device whose extents are mapped from its pool on first write.
//!
//! Lock rule, per (volume, virtual extent) stripe of the pool: reads and overwrites of live
//! granules of a mapped extent take it shared; anything that changes the extent's mapping or
//! liveness (first write, write into a dead granule, discard, zeroing) takes it exclusive and
//! holds it across its data I/O and its transaction. So a read never sees a mapping whose
//! data is still being written, and an extent is never freed under an in-flight write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, push_extent, BlockDevice, BlockError, Capabilities, Control, ControlReply, Extent,
    ExtentState, Geometry, NodeStatus, Result, WriteFlags, ZeroFlags,
};
use strata_meta::{ObjectId, State, TxnClass};

use super::map::{pieces, runs, Piece, GRANULE};
use super::policy::MapCommit;
use super::pool::{lock_key, ThinPool};
use super::records::VolumeRecord;

pub struct ThinVolume {
    pool: Arc<ThinPool>,
    record: VolumeRecord,
    map: ObjectId,
    /// The volume's size now (a resize or delete through the pool updates it; 0: deleted).
    size: Arc<AtomicU64>,
}

/// Where a virtual extent lives and which of the granules a piece touches are live.
struct Located {
    phys: u64,
    runs: Vec<(std::ops::Range<u64>, bool)>,
}

impl ThinVolume {
    pub(crate) fn new(pool: Arc<ThinPool>, record: VolumeRecord, map: ObjectId) -> Self {
        let size = pool.size_cell(&record);
        ThinVolume {
            pool,
            record,
            map,
            size,
        }
    }

    pub fn name(&self) -> &str {
        &self.record.name
    }

    fn live_size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    pub fn pool(&self) -> &Arc<ThinPool> {
        &self.pool
    }

    pub fn status(&self) -> NodeStatus {
        self.pool.volume_status(&self.record, self.map)
    }

    fn phys_of(&self, state: &State, extent: u64) -> Option<u64> {
        // A deleted volume has no map: a handle kept past the delete reads holes.
        let value = state.table(self.map)?.get_u32(extent);
        (value as u64).checked_sub(1)
    }

    fn locate(&self, piece: &Piece) -> Option<Located> {
        self.pool.store.read(|state| {
            let phys = self.phys_of(state, piece.extent)?;
            let live = state.bitmap(self.pool.ids.live).expect("pool live bitmap");
            let base = self.pool.first_granule(phys);
            Some(Located {
                phys,
                runs: runs(piece.granules(), |g| live.get(base + g)),
            })
        })
    }

    async fn read_piece(&self, piece: Piece, out: &mut BytesMut) -> Result<()> {
        let _shared = self.extent_lock().read(self.lock_key(&piece)).await;
        let Some(located) = self.locate(&piece) else {
            out.resize(out.len() + piece.len as usize, 0);
            return Ok(());
        };
        let extent_offset = self.pool.extent_offset(located.phys);
        for (granules, live) in located.runs {
            let start = (granules.start * GRANULE).max(piece.within);
            let end = (granules.end * GRANULE).min(piece.within + piece.len);
            if live {
                let data = self
                    .pool
                    .child
                    .read(extent_offset + start, (end - start) as usize)
                    .await?;
                out.extend_from_slice(&data);
            } else {
                out.resize(out.len() + (end - start) as usize, 0);
            }
        }
        Ok(())
    }

    /// Writes one piece. Returns whether it published metadata (a mapping or liveness).
    async fn write_piece(&self, piece: Piece, data: Bytes, fua: bool) -> Result<bool> {
        let key = self.lock_key(&piece);
        {
            let _shared = self.extent_lock().read(key).await;
            self.pool.check_live(self.live_size(), &piece)?;
            if let Some(located) = self.locate(&piece) {
                if located.runs.iter().all(|(_, live)| *live) {
                    let offset = self.pool.extent_offset(located.phys) + piece.within;
                    self.pool
                        .child
                        .write(offset, data, WriteFlags { fua })
                        .await?;
                    // The mapping this overwrite lands in may itself not be durable yet;
                    // report it as published so that a FUA write commits it.
                    return Ok(fua && self.pool.store.uncommitted() > 0);
                }
            }
        }
        // An extent is reserved with the stripe released: reserving may wait for space
        // (`when-full = "wait"`), and the discard or delete that frees it needs the stripes.
        let mut reserved = None;
        loop {
            let exclusive = self.extent_lock().write(key).await;
            if let Err(error) = self.pool.check_live(self.live_size(), &piece) {
                if let Some(phys) = reserved {
                    self.pool.release_reservation(phys)?;
                }
                return Err(error);
            }
            let (phys, fresh, runs) = match (self.locate(&piece), reserved) {
                (Some(located), spare) => {
                    // Another write mapped the extent while this one waited for space.
                    if let Some(phys) = spare {
                        self.pool.release_reservation(phys)?;
                    }
                    (located.phys, false, located.runs)
                }
                (None, Some(phys)) => (phys, true, vec![(piece.granules(), false)]),
                (None, None) => {
                    drop(exclusive);
                    reserved = Some(self.pool.reserve_extent().await?);
                    continue;
                }
            };
            let result = self.fill_and_publish(piece, data, phys, fresh, &runs).await;
            if fresh {
                self.pool.allocator()?.settle(phys);
                if result.is_ok() {
                    self.pool.watch_low_water();
                }
            }
            return result.map(|()| true);
        }
    }

    /// Writes `data` into the extent, padding dead partial granules with zeros so that a
    /// granule, once live, holds nothing but this volume's bytes; then publishes the mapping
    /// and the granules' liveness in one transaction.
    async fn fill_and_publish(
        &self,
        piece: Piece,
        data: Bytes,
        phys: u64,
        fresh: bool,
        runs: &[(std::ops::Range<u64>, bool)],
    ) -> Result<()> {
        let granules = piece.granules();
        let dead = |g: u64| runs.iter().any(|(range, live)| !live && range.contains(&g));
        let start = if dead(granules.start) {
            granules.start * GRANULE
        } else {
            piece.within
        };
        let end = if dead(granules.end - 1) {
            granules.end * GRANULE
        } else {
            piece.within + piece.len
        };
        let buffer = if start == piece.within && end == piece.within + piece.len {
            data
        } else {
            let mut padded = BytesMut::zeroed((end - start) as usize);
            let at = (piece.within - start) as usize;
            padded[at..at + data.len()].copy_from_slice(&data);
            padded.freeze()
        };
        let offset = self.pool.extent_offset(phys) + start;
        self.pool
            .child
            .write(offset, buffer, WriteFlags::default())
            .await?;
        let ids = self.pool.ids;
        let first = self.pool.first_granule(phys);
        self.pool.store.transact(TxnClass::Normal, |_, txn| {
            if fresh {
                txn.set_u32(self.map, piece.extent, phys as u32 + 1);
                txn.set_bits(ids.allocated, phys, 1, true);
            }
            txn.set_bits(
                ids.live,
                first + granules.start,
                granules.end - granules.start,
                true,
            );
            Ok(())
        })
    }

    /// Kills the whole granules of a piece and frees its extent once nothing in it is live.
    /// With `zero`, the partial granules at its edges are overwritten with zeros.
    async fn reclaim_piece(&self, piece: Piece, zero: bool) -> Result<()> {
        let _exclusive = self.extent_lock().write(self.lock_key(&piece)).await;
        let Some(located) = self.locate(&piece) else {
            return Ok(());
        };
        let whole = piece.whole_granules();
        if zero {
            self.zero_edges(&piece, &located, &whole).await?;
        }
        if whole.is_empty() {
            return Ok(());
        }
        let ids = self.pool.ids;
        let phys = located.phys;
        let first = self.pool.first_granule(phys);
        let per_extent = self.pool.record.extent_size / GRANULE;
        let mut guarded = false;
        let result = self.pool.store.transact(TxnClass::Reclaim, |state, txn| {
            let live = state.bitmap(ids.live).expect("pool live bitmap");
            let left = live.count_range(first, per_extent)
                - live.count_range(first + whole.start, whole.end - whole.start);
            if left == 0 {
                txn.set_bits(ids.live, first, per_extent, false);
                txn.set_u32(self.map, piece.extent, 0);
                txn.set_bits(ids.allocated, phys, 1, false);
                // Quarantined before the store's lock is released: an allocation in between
                // would otherwise see the extent free before the free is durable.
                self.pool.allocator()?.quarantine(phys, u64::MAX);
                guarded = true;
            } else {
                txn.set_bits(
                    ids.live,
                    first + whole.start,
                    whole.end - whole.start,
                    false,
                );
            }
            Ok(left == 0)
        });
        let freed = match result {
            Ok(freed) => freed,
            Err(error) => {
                // Nothing was freed: the extent is still mapped, drop the guard.
                // (A poisoned allocator has failed the pool already: the original error
                // is the one to report.)
                if let (true, Ok(mut allocator)) = (guarded, self.pool.allocator()) {
                    allocator.unquarantine(phys);
                }
                return Err(error);
            }
        };
        if freed {
            let durable_after = self.pool.store.next_txn();
            self.pool.allocator()?.quarantine(phys, durable_after);
            // A tracker without per-granule liveness frees an extent only when one discard
            // covers it whole.
            let partial = whole != (0..per_extent);
            self.pool.space_watch.extent_freed(partial);
            self.pool.watch_low_water();
        }
        Ok(())
    }

    async fn zero_edges(
        &self,
        piece: &Piece,
        located: &Located,
        whole: &std::ops::Range<u64>,
    ) -> Result<()> {
        let offset = self.pool.extent_offset(located.phys);
        let end = piece.within + piece.len;
        let live = |g: u64| {
            located
                .runs
                .iter()
                .any(|(range, live)| *live && range.contains(&g))
        };
        let mut edges = Vec::new();
        let head_granule = piece.within / GRANULE;
        if !whole.contains(&head_granule) && live(head_granule) {
            edges.push((piece.within, end.min((head_granule + 1) * GRANULE)));
        }
        let tail_granule = (end - 1) / GRANULE;
        if tail_granule != head_granule && !whole.contains(&tail_granule) && live(tail_granule) {
            edges.push((tail_granule * GRANULE, end));
        }
        for (start, stop) in edges {
            let zeros = Bytes::from(vec![0u8; (stop - start) as usize]);
            self.pool
                .child
                .write(offset + start, zeros, WriteFlags::default())
                .await?;
        }
        Ok(())
    }

    fn extent_size(&self) -> u64 {
        self.pool.record.extent_size
    }
}

#[async_trait]
impl BlockDevice for ThinVolume {
    fn geometry(&self) -> Geometry {
        let child = self.pool.child.geometry();
        Geometry {
            // Live: a resize or delete through the pool shows in handles already open.
            size: self.live_size(),
            min_io: child.min_io.max(512),
            logical_block: 512,
            physical_block: 4096,
            preferred_io: GRANULE as u32,
            max_io: child.max_io.min(32 << 20),
        }
    }

    fn capabilities(&self) -> Capabilities {
        let child = self.pool.child.capabilities();
        Capabilities {
            read_only: child.read_only,
            rotational: child.rotational,
            ..Capabilities::ALL
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry().check_range(offset, len as u64)?;
        let mut out = BytesMut::with_capacity(len);
        for piece in pieces(offset, len as u64, self.extent_size()) {
            self.read_piece(piece, &mut out).await?;
        }
        debug_assert_eq!(out.len(), len);
        Ok(out)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.geometry().check_range(offset, data.len() as u64)?;
        let mut published = false;
        for piece in pieces(offset, data.len() as u64, self.extent_size()) {
            let slice = data.slice(piece.done as usize..(piece.done + piece.len) as usize);
            published |= self.write_piece(piece, slice, flags.fua).await?;
        }
        // The data went down without FUA; a commit flushes it and then the mapping. In
        // extent mode every write that published a mapping or liveness change does this.
        if published && (flags.fua || self.pool.map_commit == MapCommit::Extent) {
            self.pool.store.commit().await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        self.pool.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        for piece in pieces(offset, len, self.extent_size()) {
            self.reclaim_piece(piece, false).await?;
        }
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        if !flags.may_trim {
            if flags.fast {
                return Err(BlockError::Unsupported("fast zeroing without trimming"));
            }
            return self.write_zero_data(offset, len, flags.fua).await;
        }
        for piece in pieces(offset, len, self.extent_size()) {
            self.reclaim_piece(piece, true).await?;
        }
        if flags.fua {
            self.pool.flush().await?;
        }
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry().check_range(offset, len)?;
        let mut extents = Vec::new();
        let base = offset;
        for piece in pieces(offset, len, self.extent_size()) {
            let piece_start = base + piece.done;
            let Some(located) = self.locate(&piece) else {
                push_extent(
                    &mut extents,
                    Extent {
                        offset: piece_start,
                        len: piece.len,
                        state: ExtentState::Hole,
                    },
                );
                continue;
            };
            for (granules, live) in located.runs {
                let start = (granules.start * GRANULE).max(piece.within);
                let end = (granules.end * GRANULE).min(piece.within + piece.len);
                let state = if live {
                    ExtentState::Data
                } else {
                    ExtentState::Hole
                };
                let at = piece_start + (start - piece.within);
                push_extent(
                    &mut extents,
                    Extent {
                        offset: at,
                        len: end - start,
                        state,
                    },
                );
            }
        }
        Ok(extents)
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.status())),
            _ => Err(BlockError::Unsupported("control")),
        }
    }
}

impl ThinVolume {
    /// The pool's extent locks (see [`ThinPool::extent_locks`]).
    fn extent_lock(&self) -> &strata_core::StripedLocks {
        self.pool.extent_locks()
    }

    /// This volume's key for `piece`'s extent in the pool's lock table.
    fn lock_key(&self, piece: &Piece) -> u64 {
        lock_key(self.record.id, piece.extent)
    }

    /// NO_HOLE zeroing: real zeros, allocated like any write.
    async fn write_zero_data(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        let chunk = self.extent_size().min(1 << 20);
        let zeros = Bytes::from(vec![0u8; chunk as usize]);
        let mut at = offset;
        while at < offset + len {
            let n = chunk.min(offset + len - at);
            self.write(at, zeros.slice(..n as usize), WriteFlags { fua: false })
                .await?;
            at += n;
        }
        if fua {
            self.pool.flush().await?;
        }
        Ok(())
    }
}

/// Keeps the volume's handle type honest about sharing: every handle is a view on the pool.
pub type VolumeRef = Arc<ThinVolume>;
