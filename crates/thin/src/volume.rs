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
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, Extent, Geometry,
    NodeStatus, Result, WriteFlags, ZeroFlags,
};
use strata_meta::{ObjectId, State, TxnClass};

use super::chain::{push_sources, Reading, Source};
use super::map::{pieces, runs, Piece, GRANULE};
use super::policy::MapCommit;
use super::pool::{lock_key, ThinPool};
use super::records::{History, VolumeRecord};
use super::versions::Epoch;

pub struct ThinVolume {
    pool: Arc<ThinPool>,
    record: VolumeRecord,
    map: ObjectId,
    /// The volume's size now (a resize or delete through the pool updates it; 0: deleted).
    size: Arc<AtomicU64>,
    /// The volume's versions as its I/O sees them; shared by its handles.
    view: Arc<ViewCell>,
    /// Write requests since the last automatic snapshot (the versions policy's count).
    writes: Arc<AtomicU64>,
}

/// How the volume now is read and written once it has versions (see `versions`). Replaced
/// only while the pool is quiesced (every lock stripe held), so I/O, which reads it under its
/// stripe, sees one view from start to end.
pub(crate) struct HeadView {
    /// The volume's map at the current epoch, then its bases'.
    pub reading: Reading,
    pub current: Epoch,
    /// Extents written in an epoch up to this one are shared with a version
    /// (`Lineage::shared_limit`): a write goes to a new extent instead.
    pub shared_limit: Option<Epoch>,
}

/// A volume's view: None while it never had a version (every chain is one extent long).
pub(crate) type ViewCell = std::sync::RwLock<Option<Arc<HeadView>>>;

/// Where a virtual extent lives and which of the granules a piece touches are live.
struct Located {
    phys: u64,
    runs: Vec<(std::ops::Range<u64>, bool)>,
}

/// The newest extent of a piece's chain, as a write sees it.
struct Head {
    phys: u64,
    /// The current epoch sees it and no version shares it: it may be written in place.
    writable: bool,
    /// Which granules of the piece it holds live.
    runs: Vec<(std::ops::Range<u64>, bool)>,
}

/// Where a write lands.
#[derive(Clone, Copy)]
enum Target {
    /// The newest extent, in place.
    InPlace(u64),
    /// A newly allocated extent that becomes the newest of the chain, above `older`.
    Fresh { phys: u64, older: Option<u64> },
}

impl ThinVolume {
    pub(crate) fn new(pool: Arc<ThinPool>, record: VolumeRecord, map: ObjectId) -> Self {
        let size = pool.size_cell(&record);
        let view = pool.view_cell(record.id);
        let writes = pool.versions_policy.write_counter(record.id);
        ThinVolume {
            pool,
            record,
            map,
            size,
            view,
            writes,
        }
    }

    fn head_view(&self) -> Option<Arc<HeadView>> {
        // Replaced whole, never half written: a poisoned lock's value is sound.
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
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
        let view = self.head_view();
        self.read_current(view.as_deref(), &piece, out).await
    }

    /// Where each granule of a piece is read from now.
    fn sources(
        &self,
        view: Option<&HeadView>,
        piece: &Piece,
    ) -> Vec<(std::ops::Range<u64>, Source)> {
        match view {
            None => match self.locate(piece) {
                None => vec![(piece.granules(), Source::Zero)],
                Some(located) => (located.runs.into_iter())
                    .map(|(granules, live)| {
                        let source = if live {
                            Source::Data(located.phys)
                        } else {
                            Source::Zero
                        };
                        (granules, source)
                    })
                    .collect(),
            },
            Some(view) => {
                let ids = self.pool.chain_ids();
                self.pool
                    .store
                    .read(|state| ids.resolve(state, &view.reading, piece.extent, piece.granules()))
            }
        }
    }

    /// Appends the piece's bytes as the volume holds them now. The caller holds its stripe.
    async fn read_current(
        &self,
        view: Option<&HeadView>,
        piece: &Piece,
        out: &mut BytesMut,
    ) -> Result<()> {
        let sources = self.sources(view, piece);
        self.pool.read_sources(piece, &sources, out).await
    }

    /// The newest extent of the piece's chain and whether a write may land in it.
    fn head(&self, view: Option<&HeadView>, piece: &Piece) -> Option<Head> {
        let Some(view) = view else {
            return self.locate(piece).map(|located| Head {
                phys: located.phys,
                writable: true,
                runs: located.runs,
            });
        };
        let ids = self.pool.chain_ids();
        self.pool.store.read(|state| {
            let phys = ids.head(state, self.map, piece.extent)?;
            let History { epoch, .. } = ids.history(state, phys);
            let own = &view.reading[0];
            let writable = own.lineage.sees(view.current, epoch)
                && view.shared_limit.is_none_or(|limit| epoch > limit);
            let live = state.bitmap(self.pool.ids.live).expect("pool live bitmap");
            let base = self.pool.first_granule(phys);
            Some(Head {
                phys,
                writable,
                runs: runs(piece.granules(), |g| live.get(base + g)),
            })
        })
    }

    /// Writes one piece. Returns whether it published metadata (a mapping or liveness).
    async fn write_piece(&self, piece: Piece, data: Bytes, fua: bool) -> Result<bool> {
        let key = self.lock_key(&piece);
        {
            let _shared = self.extent_lock().read(key).await;
            self.pool.check_live(self.live_size(), &piece)?;
            let view = self.head_view();
            if let Some(head) = self.head(view.as_deref(), &piece) {
                if head.writable && head.runs.iter().all(|(_, live)| *live) {
                    let offset = self.pool.extent_offset(head.phys) + piece.within;
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
            let view = self.head_view();
            let head = self.head(view.as_deref(), &piece);
            let (target, runs) = match (head, reserved) {
                (Some(head), spare) if head.writable => {
                    // Mapped already (maybe by another write while this one waited for space).
                    if let Some(phys) = spare {
                        self.pool.release_reservation(phys)?;
                    }
                    (Target::InPlace(head.phys), head.runs)
                }
                (head, Some(phys)) => {
                    let older = head.map(|head| head.phys);
                    (
                        Target::Fresh { phys, older },
                        vec![(piece.granules(), false)],
                    )
                }
                (_, None) => {
                    drop(exclusive);
                    reserved = Some(self.pool.reserve_extent().await?);
                    continue;
                }
            };
            let result = self
                .fill_and_publish(view.as_deref(), piece, data, target, &runs)
                .await;
            if let Target::Fresh { phys, .. } = target {
                self.pool.allocator()?.settle(phys);
                if result.is_ok() {
                    self.pool.watch_low_water();
                }
            }
            return result.map(|()| true);
        }
    }

    /// Writes `data` into the target extent; a partial granule the target does not hold yet is
    /// completed with what the volume holds there now (zeros, or an older extent's bytes), so
    /// that a granule, once live, holds nothing but this volume's bytes. Then publishes the
    /// mapping, the chain link and the granules' liveness in one transaction.
    async fn fill_and_publish(
        &self,
        view: Option<&HeadView>,
        piece: Piece,
        data: Bytes,
        target: Target,
        runs: &[(std::ops::Range<u64>, bool)],
    ) -> Result<()> {
        let extent_size = self.extent_size();
        let dead = |g: u64| runs.iter().any(|(range, live)| !live && range.contains(&g));
        // Copy-on-write copies what the new extent takes over from an older one or a base.
        let copy_whole = match (target, view) {
            (Target::Fresh { older, .. }, Some(view)) => {
                self.pool.copy_on_write && (older.is_some() || view.reading.len() > 1)
            }
            _ => false,
        };
        let (start, end) = if copy_whole {
            (0, extent_size)
        } else {
            let granules = piece.granules();
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
            (start, end)
        };
        let buffer = if start == piece.within && end == piece.within + piece.len {
            data
        } else {
            let mut filled = BytesMut::with_capacity((end - start) as usize);
            let before = Piece {
                within: start,
                len: piece.within - start,
                ..piece
            };
            let after = Piece {
                within: piece.within + piece.len,
                len: end - (piece.within + piece.len),
                ..piece
            };
            self.current_or_zeros(view, &before, &mut filled).await?;
            filled.extend_from_slice(&data);
            self.current_or_zeros(view, &after, &mut filled).await?;
            filled.freeze()
        };
        let phys = match target {
            Target::InPlace(phys) | Target::Fresh { phys, .. } => phys,
        };
        let offset = self.pool.extent_offset(phys) + start;
        self.pool
            .child
            .write(offset, buffer, WriteFlags::default())
            .await?;
        let ids = self.pool.ids;
        let chain_ids = self.pool.chain_ids();
        let first = self.pool.first_granule(phys);
        let granules = start / GRANULE..end.div_ceil(GRANULE);
        self.pool.store.transact(TxnClass::Normal, |_, txn| {
            let per_extent = extent_size / GRANULE;
            if let Target::Fresh { phys, older } = target {
                txn.set_u32(self.map, piece.extent, phys as u32 + 1);
                txn.set_bits(ids.allocated, phys, 1, true);
                // In a pool with versions, a reused extent's record of its last life is
                // overwritten here, in the transaction that maps it again.
                if let Some(history) = chain_ids.history {
                    let link = History {
                        epoch: view.map_or(0, |view| view.current),
                        older,
                    };
                    txn.set(history, phys, &link.encode());
                }
                if let Some(masked) = chain_ids.masked {
                    txn.set_bits(masked, first, per_extent, false);
                }
            } else if let Some(masked) = chain_ids.masked {
                txn.set_bits(
                    masked,
                    first + granules.start,
                    granules.end - granules.start,
                    false,
                );
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

    /// Appends what the volume holds now over `piece` (zeros, without a look, for a volume
    /// without versions: its only extent does not hold it, or the caller would not ask).
    async fn current_or_zeros(
        &self,
        view: Option<&HeadView>,
        piece: &Piece,
        out: &mut BytesMut,
    ) -> Result<()> {
        if piece.len == 0 {
            return Ok(());
        }
        match view {
            None => {
                out.resize(out.len() + piece.len as usize, 0);
                Ok(())
            }
            Some(_) => self.read_current(view, piece, out).await,
        }
    }

    /// Kills the whole granules of a piece and frees its extent once nothing in it is live.
    /// With `zero`, the partial granules at its edges are overwritten with zeros.
    ///
    /// Returns false, having done nothing, for a zeroing of a volume with versions: its
    /// caller writes zeros instead (an older extent may hold data under dead granules).
    async fn reclaim_piece(&self, piece: Piece, zero: bool) -> Result<bool> {
        let _exclusive = self.extent_lock().write(self.lock_key(&piece)).await;
        if let Some(view) = self.head_view() {
            if zero {
                return Ok(false);
            }
            self.mask_piece(&view, &piece)?;
            return Ok(true);
        }
        let Some(located) = self.locate(&piece) else {
            return Ok(true);
        };
        let whole = piece.whole_granules();
        if zero {
            self.zero_edges(&piece, &located, &whole).await?;
        }
        if whole.is_empty() {
            return Ok(true);
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
        Ok(true)
    }

    /// A discard in a volume with versions: the whole granules of the piece are defined as
    /// zeros in the newest extent if it may be written (an older extent of the chain may
    /// hold data under them); nothing is freed here (a later version cleanup does that). If a
    /// version shares the newest extent, the discard is a no-op: the version keeps the data
    /// anyway, and NBD lets a trimmed range read back as anything.
    fn mask_piece(&self, view: &HeadView, piece: &Piece) -> Result<()> {
        let whole = piece.whole_granules();
        if whole.is_empty() {
            return Ok(());
        }
        let Some(head) = self.head(Some(view), piece).filter(|head| head.writable) else {
            return Ok(());
        };
        let chain_ids = self.pool.chain_ids();
        let masked = chain_ids.masked.ok_or_else(|| {
            BlockError::Corrupt(format!(
                "thin pool {}: versions without a `masked` bitmap",
                self.pool.name()
            ))
        })?;
        let first = self.pool.first_granule(head.phys) + whole.start;
        let count = whole.end - whole.start;
        let live = self.pool.ids.live;
        self.pool.store.transact(TxnClass::Reclaim, |_, txn| {
            txn.set_bits(live, first, count, false);
            txn.set_bits(masked, first, count, true);
            Ok(())
        })
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
        // Live: a resize or delete through the pool shows in handles already open.
        self.pool.device_geometry(self.live_size())
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
        let _whole = self.pool.requests.read().await;
        self.write_pieces(offset, data, flags).await?;
        self.wrote();
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        self.pool.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        let _whole = self.pool.requests.read().await;
        for piece in pieces(offset, len, self.extent_size()) {
            self.reclaim_piece(piece, false).await?;
        }
        self.wrote();
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        let _whole = self.pool.requests.read().await;
        if !flags.may_trim {
            if flags.fast {
                return Err(BlockError::Unsupported("fast zeroing without trimming"));
            }
            self.write_zero_data(offset, len, flags.fua).await?;
            self.wrote();
            return Ok(());
        }
        for piece in pieces(offset, len, self.extent_size()) {
            if !self.reclaim_piece(piece, true).await? {
                let at = offset + piece.done;
                self.write_zero_data(at, piece.len, false).await?;
            }
        }
        if flags.fua {
            self.pool.flush().await?;
        }
        self.wrote();
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry().check_range(offset, len)?;
        let view = self.head_view();
        let mut extents = Vec::new();
        for piece in pieces(offset, len, self.extent_size()) {
            let sources = self.sources(view.as_deref(), &piece);
            push_sources(&mut extents, offset, &piece, &sources);
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
    /// Counts one acknowledged write request (WRITE, WRITE_ZEROES or TRIM) for the volume's
    /// `every-writes` snapshot policy.
    fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// The pool's extent locks (see [`ThinPool::extent_locks`]).
    fn extent_lock(&self) -> &strata_core::StripedLocks {
        self.pool.extent_locks()
    }

    /// This volume's key for `piece`'s extent in the pool's lock table.
    fn lock_key(&self, piece: &Piece) -> u64 {
        lock_key(self.record.id, piece.extent)
    }

    /// A write's pieces, one extent at a time (the caller holds the pool's request gate).
    async fn write_pieces(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
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

    /// NO_HOLE zeroing: real zeros, allocated like any write (under the caller's gate).
    async fn write_zero_data(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        let chunk = self.extent_size().min(1 << 20);
        let zeros = Bytes::from(vec![0u8; chunk as usize]);
        let mut at = offset;
        while at < offset + len {
            let n = chunk.min(offset + len - at);
            self.write_pieces(at, zeros.slice(..n as usize), WriteFlags { fua: false })
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
