//! The data path: reads gathered from both children, writes routed by size, flush.
//!
//! Crash ordering of a staged write: the data goes to free log slots first; only once that
//! write completed is the transaction applied that points the blocks at the slots (and frees
//! their old places); a FLUSH or a FUA then commits, and every commit flushes both children
//! before the journal write. So a map entry is never durable before the data it names, and
//! a freed block or slot, which a crash could make current again, is reused only once the
//! freeing transaction is durable (`alloc`, `log`).
//!
//! A direct (large) write overwrites blocks already on the slow child in place (the contract
//! lets an unflushed write be torn) and places the others at their home block, or near it,
//! before one transaction records them; its FUA is passed down, then the transaction
//! committed.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use futures_util::future::join_all;
use strata_core::{push_extent, BlockError, Extent, ExtentState, Result, WriteFlags};
use strata_meta::{State, Txn, TxnClass};

use crate::map::{encode_base, encode_moved, Location};
use crate::plan::{self, PlanParams, Staged};
use crate::records::{base_of, locate};
use crate::shape::{runs, BLOCK};
use crate::stage::{Space, Stage};
use crate::trigger::Decision;

/// Logical blocks one discard transaction or one block-status answer covers (16 MiB): a
/// discard of a whole device is many bounded transactions, not one that could outgrow a
/// journal batch, and a status answer is bounded work under the store's read lock.
const MAP_PIECE_BLOCKS: u64 = 4096;

/// One writer counted in `room_waiters` for as long as it lives: a request dropped while it
/// waits (its client gone) must not leave later writers queueing behind nobody.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(waiters: &'a AtomicU64) -> Self {
        waiters.fetch_add(1, Ordering::AcqRel);
        Waiting(waiters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where a direct write puts one block.
#[derive(Clone, Copy, Debug)]
struct Target {
    physical: u64,
    /// Not where the block lives now: reserved for it, recorded by the write's transaction.
    fresh: bool,
    at_home: bool,
    old: Location,
}

/// The next location after `location` in its child's address space, for merging reads.
fn follows(previous: Location, next: Location) -> bool {
    match (previous, next) {
        (Location::Unwritten, Location::Unwritten) => true,
        (Location::Disk(a), Location::Disk(b)) | (Location::Log(a), Location::Log(b)) => b == a + 1,
        _ => false,
    }
}

impl Stage {
    pub(crate) async fn read_blocks(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let first = offset / BLOCK;
        let count = len as u64 / BLOCK;
        let _shared = self.locks.read_range(first..first + count).await;
        let locations: Vec<Location> = self.store.read(|state| {
            (first..first + count)
                .map(|logical| locate(state, &self.ids, &self.shape, logical))
                .collect()
        });
        let mut pieces = Vec::new();
        let mut start = 0;
        for i in 1..=locations.len() {
            if i == locations.len() || !follows(locations[i - 1], locations[i]) {
                pieces.push(start..i);
                start = i;
            }
        }
        // Every piece at once: the slow child gathers the scattered ones (scatter-gather).
        let reads = pieces.iter().filter_map(|piece| {
            let bytes = (piece.len() as u64 * BLOCK) as usize;
            let (child, at, fast) = match locations[piece.start] {
                Location::Unwritten => return None,
                Location::Disk(block) => (&self.slow, self.shape.block_offset(block), false),
                Location::Log(slot) => (&self.fast, self.shape.slot_offset(slot), true),
            };
            let start = piece.start;
            Some(async move { (start, fast, child.read(at, bytes).await) })
        });
        let mut out = BytesMut::zeroed(len);
        for (start, fast, result) in join_all(reads).await {
            let data = match result {
                Ok(data) => data,
                Err(error) if fast => {
                    self.counters.bump(&self.counters.fast_read_errors, 1);
                    self.fast_failed("read of staged data from the log", &error);
                    return Err(error);
                }
                Err(error) => return Err(error),
            };
            let at = start * BLOCK as usize;
            out[at..at + data.len()].copy_from_slice(&data);
        }
        Ok(out)
    }

    pub(crate) async fn write_blocks(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        let first = offset / BLOCK;
        if (data.len() as u64) < self.settings.threshold {
            self.write_staged(first, data, fua).await?;
        } else {
            self.write_direct(first, data, fua).await?;
        }
        self.after_write().await
    }

    async fn write_staged(&self, first: u64, data: Bytes, fua: bool) -> Result<()> {
        let count = data.len() as u64 / BLOCK;
        let slots = self.reserve_slots(count).await?;
        let mut destaged_for_metadata = false;
        let result = loop {
            let exclusive = self.locks.write_range(first..first + count).await;
            let result = self.stage_blocks(first, &slots, &data).await;
            drop(exclusive);
            match result {
                // The metadata store is full: a destage shrinks it (a staged block costs a
                // `moved` and a `reverse` record, a block back home costs neither), so destage
                // and try once more rather than refuse the write. The range lock is dropped
                // first: the destage's switch takes every range.
                Err(BlockError::NoSpace) if !destaged_for_metadata => {
                    destaged_for_metadata = true;
                    self.counters.bump(&self.counters.metadata_full_destages, 1);
                    tracing::warn!(stage = %self.name, "metadata store full; destaging everything to make room in it");
                    let _one = self.destaging.lock().await;
                    if let Err(error) = self.destage_locked(Decision::All).await {
                        break Err(error);
                    }
                }
                Err(BlockError::NoSpace) => {
                    tracing::error!(stage = %self.name, "metadata store still full after a destage: `metadata-size` is too small for the blocks placed off their home; the write is refused");
                    break Err(BlockError::NoSpace);
                }
                other => break other,
            }
        };
        if let Err(error) = result {
            let mut space = self.space()?;
            slots.iter().for_each(|&slot| space.log.release(slot));
            drop(space);
            self.room.notify_waiters();
            return Err(error);
        }
        // The slots are staged now: a writer waiting for room can destage them.
        self.room.notify_waiters();
        self.counters.bump(&self.counters.staged_writes, 1);
        self.counters.bump(&self.counters.staged_blocks, count);
        if fua {
            self.commit().await?;
        }
        Ok(())
    }

    /// The log write, then the transaction that points the blocks at it.
    async fn stage_blocks(&self, first: u64, slots: &[u64], data: &Bytes) -> Result<()> {
        let writes = runs(slots, |s| *s).into_iter().map(|run| {
            let at = self.shape.slot_offset(slots[run.start]);
            let piece = data.slice(run.start * BLOCK as usize..run.end * BLOCK as usize);
            self.fast.write(at, piece, WriteFlags::default())
        });
        for result in join_all(writes).await {
            if let Err(error) = result {
                self.fast_failed("write to the log", &error);
                return Err(error);
            }
        }
        let ids = self.ids;
        let freed = self.store.transact(TxnClass::Normal, |state, txn| {
            let mut freed = Vec::new();
            for (i, &slot) in slots.iter().enumerate() {
                let logical = first + i as u64;
                let old = self.unlink(state, txn, logical);
                txn.set(
                    ids.moved,
                    logical,
                    &encode_moved(Location::Log(slot)).to_le_bytes(),
                );
                txn.set(ids.reverse, slot, &(logical + 1).to_le_bytes());
                freed.push(old);
            }
            Ok(freed)
        })?;
        let mut space = self.space()?;
        for logical in first..first + slots.len() as u64 {
            space.note_staged(self.shape.extent_of(logical), 1);
        }
        self.free_after(&mut space, &freed, first);
        Ok(())
    }

    /// Discard, and write-zeroes that may trim: the blocks become unwritten (they read as
    /// zeros) and their log slots and slow-child blocks are freed, for reuse once the
    /// transaction is durable, as an overwrite frees them. Only blocks that live somewhere
    /// are visited (the `home` bits and `moved` records in the range), so a discard of a
    /// whole device costs what it frees. Reclaim class: it must work on a full store.
    pub(crate) async fn unmap_blocks(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        let (first, end) = (offset / BLOCK, (offset + len) / BLOCK);
        let ids = self.ids;
        let mut start = first;
        while start < end {
            let stop = (start + MAP_PIECE_BLOCKS).min(end);
            let _exclusive = self.locks.write_range(start..stop).await;
            let freed = self.store.transact(TxnClass::Reclaim, |state, txn| {
                let mut live = std::collections::BTreeSet::new();
                if let Some(home) = state.bitmap(ids.home) {
                    let mut at = home.next(start, stop, true);
                    while let Some(block) = at {
                        live.insert(block);
                        at = home.next(block + 1, stop, true);
                    }
                }
                let moved = state.table(ids.moved);
                if let Some(moved) = moved {
                    live.extend(
                        moved
                            .iter_from(start)
                            .map(|(block, _)| block)
                            .take_while(|&block| block < stop),
                    );
                }
                let mut freed = Vec::with_capacity(live.len());
                for logical in live {
                    let old = self.unlink(state, txn, logical);
                    if moved.is_some_and(|m| m.get(logical).is_some()) {
                        txn.set(ids.moved, logical, &[0; 8]);
                    }
                    freed.push((logical, old));
                }
                Ok(freed)
            })?;
            let mut space = self.space()?;
            for (logical, old) in &freed {
                self.free_after(&mut space, std::slice::from_ref(old), *logical);
            }
            drop(space);
            self.counters
                .bump(&self.counters.unmapped_blocks, freed.len() as u64);
            start = stop;
        }
        if fua {
            self.commit().await?;
        }
        Ok(())
    }

    /// Allocation from `offset` (aligned): a block never written, or unmapped, is a hole (it
    /// reads as zeros); any other is data. Answers at most 16 MiB (the caller asks again),
    /// from one look at the map.
    pub(crate) fn allocation(&self, offset: u64, len: u64) -> Vec<Extent> {
        let first = offset / BLOCK;
        let end = first + (len / BLOCK).min(MAP_PIECE_BLOCKS);
        let locations: Vec<Location> = self.store.read(|state| {
            (first..end)
                .map(|logical| locate(state, &self.ids, &self.shape, logical))
                .collect()
        });
        let mut extents = Vec::new();
        for (i, location) in locations.into_iter().enumerate() {
            let state = match location {
                Location::Unwritten => ExtentState::Hole,
                Location::Disk(_) | Location::Log(_) => ExtentState::Data,
            };
            push_extent(
                &mut extents,
                Extent {
                    offset: offset + i as u64 * BLOCK,
                    len: BLOCK,
                    state,
                },
            );
        }
        extents
    }

    /// Clears where `logical` lives now (its home bit, its allocated block, its log slot's
    /// reverse entry; not its `moved` record, which the caller rewrites) and returns it.
    pub(crate) fn unlink(&self, state: &State, txn: &mut Txn, logical: u64) -> Location {
        let ids = self.ids;
        let old = locate(state, &ids, &self.shape, logical);
        match old {
            Location::Unwritten => {}
            Location::Disk(block) => {
                if state.bitmap(ids.home).is_some_and(|home| home.get(logical)) {
                    txn.set_bits(ids.home, logical, 1, false);
                }
                txn.set_bits(ids.allocated, block, 1, false);
            }
            Location::Log(slot) => txn.set(ids.reverse, slot, &[0; 8]),
        }
        old
    }

    /// Hands the places a transaction just freed to the allocators, to be reused once it is
    /// durable; `first` is the first logical block of the request (for the staged counts).
    pub(crate) fn free_after(&self, space: &mut Space, freed: &[Location], first: u64) {
        let after = self.store.next_txn();
        for (i, location) in freed.iter().enumerate() {
            match *location {
                Location::Unwritten => {}
                Location::Disk(block) => space.alloc.free_after(block, after),
                Location::Log(slot) => {
                    space.log.free_after(slot, after);
                    space.note_staged(self.shape.extent_of(first + i as u64), -1);
                }
            }
        }
    }

    /// `count` log slots, destaging first when the log has no room (the full trigger, which
    /// every trigger keeps as its backstop).
    ///
    /// Writers that found the log full are served in turn (the `destaging` mutex is FIFO),
    /// each taking its slots under that lock, and while any waits a new writer queues behind
    /// them instead of taking the room a destage just made: under an overload a writer
    /// waits, it is never starved into an error.
    async fn reserve_slots(&self, count: u64) -> Result<Vec<u64>> {
        if self.room_waiters.load(Ordering::Acquire) == 0 {
            if let Some(slots) = self.space()?.log.reserve(count) {
                return Ok(slots);
            }
        }
        self.counters.bump(&self.counters.log_full_waits, 1);
        let _waiting = Waiting::new(&self.room_waiters);
        self.reserve_in_turn(count).await
    }

    async fn reserve_in_turn(&self, count: u64) -> Result<Vec<u64>> {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let _turn = self.destaging.lock().await;
                if let Some(slots) = self.space()?.log.reserve(count) {
                    return Ok(slots);
                }
                self.make_room(count).await?;
                if let Some(slots) = self.space()?.log.reserve(count) {
                    return Ok(slots);
                }
            }
            // Nothing staged was left to destage: the slots are held by writes in flight,
            // which become destageable once they are staged (each notifies `room`).
            room.await;
        }
    }

    async fn write_direct(&self, first: u64, data: Bytes, fua: bool) -> Result<()> {
        let count = data.len() as u64 / BLOCK;
        // The slow child has a block for every logical block, so a place is always there in
        // the end; but the free ones may be frees not yet durable (a staged overwrite's old
        // place), or reserved by a destage for blocks this write moves out of the log. Then
        // commit (the frees become usable), and next wait for the destage to end (it releases
        // the targets of blocks overwritten meanwhile), before calling the device full. The
        // range lock is dropped while waiting: the destage's switch takes every range.
        // (Found by `strata sim explore`, seed 4 run 470: a raid5 over a stage failed the
        // stage as a member on a NoSpace.)
        let mut attempt = 0;
        let (_exclusive, targets) = loop {
            let exclusive = self.locks.write_range(first..first + count).await;
            match self.place_direct(first, count) {
                Ok(targets) => break (exclusive, targets),
                Err(BlockError::NoSpace) if attempt < 2 => {
                    drop(exclusive);
                    if attempt == 1 {
                        let _destage_done = self.destaging.lock().await;
                    }
                    self.commit().await?;
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        };
        let writes = runs(&targets, |t| t.physical).into_iter().map(|run| {
            let at = self.shape.block_offset(targets[run.start].physical);
            let piece = data.slice(run.start * BLOCK as usize..run.end * BLOCK as usize);
            self.slow.write(at, piece, WriteFlags { fua })
        });
        let failed = join_all(writes).await.into_iter().find_map(Result::err);
        let fresh: Vec<(u64, Target)> = (first..)
            .zip(targets.iter().copied())
            .filter(|(_, t)| t.fresh)
            .collect();
        if let Some(error) = failed {
            let mut space = self.space()?;
            fresh
                .iter()
                .for_each(|(_, t)| space.alloc.release(t.physical));
            return Err(error);
        }
        self.counters.bump(&self.counters.direct_writes, 1);
        self.counters.bump(&self.counters.direct_blocks, count);
        if !fresh.is_empty() {
            self.record_direct(&fresh)?;
        }
        // Even a write wholly in place commits with FUA: the map entry that put a block
        // where it was overwritten may itself not be durable yet (a direct write that moved
        // it out of the log, unflushed), and a crash would then bring back the log copy.
        if fua {
            self.commit().await?;
        }
        Ok(())
    }

    /// The transaction of a direct write: its fresh blocks recorded, their old places freed.
    fn record_direct(&self, fresh: &[(u64, Target)]) -> Result<()> {
        let ids = self.ids;
        self.store.transact(TxnClass::Normal, |state, txn| {
            for &(logical, target) in fresh {
                self.unlink(state, txn, logical);
                if target.at_home {
                    txn.set_bits(ids.home, logical, 1, true);
                    if target.old != Location::Unwritten {
                        txn.set(ids.moved, logical, &[0; 8]);
                    }
                } else {
                    let record = encode_moved(Location::Disk(target.physical));
                    txn.set(ids.moved, logical, &record.to_le_bytes());
                }
                txn.set_bits(ids.allocated, target.physical, 1, true);
            }
            Ok(())
        })?;
        let mut space = self.space()?;
        for &(logical, target) in fresh {
            self.free_after(&mut space, &[target.old], logical);
        }
        Ok(())
    }

    /// Where each block of a direct write goes: in place if it lives on the slow child, else
    /// a reserved block, its home when free.
    fn place_direct(&self, first: u64, count: u64) -> Result<Vec<Target>> {
        let mut space = self.space()?;
        let olds: Vec<Location> = self.store.read(|state| {
            (first..first + count)
                .map(|logical| locate(state, &self.ids, &self.shape, logical))
                .collect()
        });
        let needing: Vec<u64> = (first..)
            .zip(&olds)
            .filter(|(_, old)| !matches!(old, Location::Disk(_)))
            .map(|(logical, _)| self.shape.range_of(logical))
            .collect();
        self.ensure_bases(&mut space, needing, TxnClass::Normal)?;
        let mut targets = Vec::with_capacity(count as usize);
        for (logical, old) in (first..).zip(olds) {
            if let Location::Disk(physical) = old {
                targets.push(Target {
                    physical,
                    fresh: false,
                    at_home: false,
                    old,
                });
                continue;
            }
            let base = self
                .store
                .read(|state| base_of(state, &self.ids, &self.shape, logical))
                .expect("ensured above");
            let home = self.shape.home(logical, base);
            let physical = if space.alloc_is_free(home) {
                home
            } else {
                self.nearest_free(&space, logical, home)?
            };
            space.alloc.reserve(physical);
            targets.push(Target {
                physical,
                fresh: true,
                at_home: physical == home,
                old,
            });
        }
        Ok(targets)
    }

    /// The free block nearest `home` (its range, then the window, then anywhere).
    fn nearest_free(&self, space: &Space, logical: u64, home: u64) -> Result<u64> {
        let params = PlanParams {
            extent_blocks: self.shape.extent_blocks(),
            window_ranges: self.settings.window,
            strand: 1,
        };
        let staged = [Staged {
            logical,
            slot: 0,
            home,
        }];
        let plan = plan::plan(&staged, &space.alloc, params).map_err(|_| BlockError::NoSpace)?;
        Ok(plan.batches[0].placements[0].target)
    }

    /// Gives every logical range in `ranges` that has none a base next to its neighbours,
    /// recorded in one transaction (before any block is placed in it).
    pub(crate) fn ensure_bases(
        &self,
        space: &mut Space,
        ranges: impl IntoIterator<Item = u64>,
        class: TxnClass,
    ) -> Result<()> {
        let mut wanted: Vec<u64> = ranges.into_iter().collect();
        wanted.sort_unstable();
        wanted.dedup();
        let ids = self.ids;
        let range_blocks = self.shape.range_blocks;
        let base =
            |state: &State, range: u64| base_of(state, &ids, &self.shape, range * range_blocks);
        let unbased: Vec<u64> = self.store.read(|state| {
            wanted
                .into_iter()
                .filter(|&r| base(state, r).is_none())
                .collect()
        });
        if unbased.is_empty() {
            return Ok(());
        }
        self.store.transact(class, |state, txn| {
            let mut chosen: std::collections::BTreeMap<u64, u64> = Default::default();
            for &range in &unbased {
                let near = |r: Option<u64>| {
                    r.and_then(|r| chosen.get(&r).copied().or_else(|| base(state, r)))
                };
                let before = near(range.checked_sub(1));
                let after = near(Some(range + 1).filter(|&r| r < self.shape.ranges));
                let Some(physical) = space.alloc.choose_base(range, before, after) else {
                    return Err(BlockError::NoSpace);
                };
                chosen.insert(range, physical);
                txn.set(ids.ranges, range, &encode_base(physical).to_le_bytes());
            }
            Ok(())
        })
    }

    pub(crate) async fn flush_all(&self) -> Result<()> {
        let (slow, fast) = futures_util::future::join(self.slow.flush(), self.fast.flush()).await;
        if let Err(error) = &fast {
            self.fast_failed("flush", error);
        }
        slow?;
        fast?;
        self.commit().await
    }
}

impl Space {
    pub(crate) fn alloc_is_free(&self, block: u64) -> bool {
        use crate::plan::FreeBlocks;
        self.alloc.is_free(block)
    }
}
