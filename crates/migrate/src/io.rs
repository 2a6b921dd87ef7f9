//! The data path: reads and writes split per chunk, migration on access, discard, flush.
//!
//! A read that migrates is answered as soon as its child read completes; the data it read
//! (a copy, never read again) goes to the destination in a background task of the layer's
//! `Background` (so a quiesce pauses it and a stop cancels it), which takes the chunk alone
//! and migrates only if the chunk's version is still the one the read ran under. At most
//! `MAX_MIGRATIONS_IN_FLIGHT` such tasks, one per chunk; a read beyond does not migrate.
//!
//! Crash ordering (also in `docs/layers/migrate.md`):
//! 1. data goes to its destination first (a fresh slot, or positions of the chunk's other
//!    location that no durable entry names valid for another block: a position only ever
//!    holds its own logical block's data);
//! 2. only once that write completed is the transaction applied that sets the destination's
//!    valid bits and clears the source's (one transaction: never two places, never none);
//! 3. a FLUSH or FUA commits, and every commit flushes every child before the journal write:
//!    a durable entry never names data that is not durable;
//! 4. a slot an entry stops naming is reused only once that transaction is durable, so a
//!    crash that brings back the old entry finds the old data.

use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};
use strata_core::{push_extent, BlockError, Extent, ExtentState, Result, WriteFlags};
use strata_meta::TxnClass;

use crate::migrate::{Migrate, MAX_MIGRATIONS_IN_FLIGHT};
use crate::policy::{self, Policy};
use crate::records::{self, Entry, Location};
use crate::shape::BLOCK;

/// Bits `first..first + count` of a chunk.
pub(crate) fn mask(first: u64, count: u64) -> u64 {
    assert!(first + count <= 64 && count > 0);
    if count == 64 {
        u64::MAX
    } else {
        ((1u64 << count) - 1) << first
    }
}

/// Runs of consecutive block indices (within `first..first + count`) that map to the same
/// key: (key, start, end).
fn runs<K: PartialEq + Copy>(first: u64, count: u64, key: impl Fn(u64) -> K) -> Vec<(K, u64, u64)> {
    let mut out: Vec<(K, u64, u64)> = Vec::new();
    for index in first..first + count {
        let k = key(index);
        match out.last_mut() {
            Some(last) if last.0 == k && last.2 == index => last.2 = index + 1,
            _ => out.push((k, index, index + 1)),
        }
    }
    out
}

/// A read's migration handed to the background: what the read saw and read.
struct ReadMigration {
    chunk: u64,
    /// The chunk's version the read ran under.
    version: u64,
    /// The entry the read used.
    entry: Entry,
    decided: Move,
    /// The request's first block index in the chunk; `data` starts there.
    first: u64,
    /// The blocks to move (valid on `decided.src` when read).
    moving: u64,
    data: Bytes,
}

/// A read migration's place among those in flight and the slot it claimed: dropping it
/// gives back both (the slot only if still held: `migrate_blocks` takes it over).
struct Admitted {
    layer: Weak<Migrate>,
    chunk: u64,
    dst: usize,
    claimed: Option<u64>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let Some(layer) = self.layer.upgrade() else {
            return; // the layer is gone, its free slots with it
        };
        if let Some(slot) = self.claimed.take() {
            if let Ok(mut space) = layer.space() {
                space.free[self.dst].insert(slot);
            }
        }
        layer.end_in_flight(self.chunk);
    }
}

/// A migration decided for one request on one chunk.
#[derive(Clone, Copy, Debug)]
struct Move {
    src: usize,
    dst: usize,
    /// A slot claimed on `dst` for a new location (None: the chunk has one there).
    claimed: Option<u64>,
}

impl Migrate {
    /// Chunk pieces of a request: (chunk, first block index, block count, byte offset into
    /// the request).
    fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64, u64, usize)> {
        let per = self.shape.chunk_blocks;
        let (mut block, end) = (offset / BLOCK, (offset + len) / BLOCK);
        let mut out = Vec::new();
        while block < end {
            let (chunk, index) = (block / per, block % per);
            let count = (per - index).min(end - block);
            out.push((chunk, index, count, ((block * BLOCK) - offset) as usize));
            block += count;
        }
        out
    }

    /// A child request, timed: its response time feeds the device's EWMA.
    async fn timed<T>(
        &self,
        device: usize,
        request: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let start = self.now();
        let result = request.await;
        let end = self.now();
        let elapsed = end.saturating_sub(start);
        if result.is_ok() {
            if let Ok(mut policy) = self.policy_state() {
                policy.stats[device].update(end, elapsed.as_secs_f64() * 1e6);
            }
            self.bump(&self.counters.child_requests[device], 1);
        }
        result
    }

    async fn read_at(&self, location: Location, index: u64, count: u64) -> Result<BytesMut> {
        let at = self.shape.offset(location.device, location.slot, index);
        let child = &self.children[location.device];
        self.timed(location.device, child.read(at, (count * BLOCK) as usize))
            .await
    }

    async fn write_at(&self, location: Location, index: u64, data: Bytes, fua: bool) -> Result<()> {
        let at = self.shape.offset(location.device, location.slot, index);
        let child = &self.children[location.device];
        self.timed(location.device, child.write(at, data, WriteFlags { fua }))
            .await
    }

    /// A read: its chunks at once (each piece holds one chunk's lock and waits for no
    /// other while it does, so pieces of requests that overlap cannot deadlock).
    pub(crate) async fn read_blocks(self: &Arc<Self>, offset: u64, len: usize) -> Result<BytesMut> {
        let pieces = self.pieces(offset, len as u64);
        if let [(chunk, first, count, _)] = pieces[..] {
            // One chunk: its piece is the answer, not a copy of it.
            return self.read_piece(chunk, first, count).await;
        }
        let reads = pieces
            .iter()
            .map(|&(chunk, first, count, _)| self.read_piece(chunk, first, count));
        let mut out = BytesMut::with_capacity(len);
        for piece in futures_util::future::join_all(reads).await {
            out.extend_from_slice(&piece?);
        }
        assert_eq!(out.len(), len);
        Ok(out)
    }

    async fn read_piece(self: &Arc<Self>, chunk: u64, first: u64, count: u64) -> Result<BytesMut> {
        let _shared = self.locks.read_range(chunk..chunk + 1).await;
        let version = self.version(chunk);
        let entry = self.entry(chunk);
        if entry.is_empty() {
            // Never written: zeros.
            return Ok(BytesMut::zeroed((count * BLOCK) as usize));
        }
        let runs = runs(first, count, |i| entry.holder(i));
        let out = match runs[..] {
            // All of it in one place (the common case): the child's buffer is the answer.
            [(Some(k), start, end)] => {
                let location = entry.locations[k].expect("a holder exists");
                self.read_at(location, start, end - start).await?
            }
            _ => {
                let mut out = BytesMut::zeroed((count * BLOCK) as usize);
                for (holder, start, end) in runs {
                    let Some(k) = holder else { continue };
                    let location = entry.locations[k].expect("a holder exists");
                    let data = self.read_at(location, start, end - start).await?;
                    let from = ((start - first) * BLOCK) as usize;
                    out[from..from + data.len()].copy_from_slice(&data);
                }
                out
            }
        };
        // Migration on access: the data just read goes to the destination, never read again,
        // after the read is answered.
        let requested = mask(first, count);
        let Some((src, moving)) = majority_source(&entry, requested) else {
            return Ok(out);
        };
        let Some(decided) = self.decide(chunk, &entry, src, true)? else {
            return Ok(out);
        };
        let job = ReadMigration {
            chunk,
            version,
            entry,
            decided,
            first,
            moving,
            data: Bytes::copy_from_slice(&out),
        };
        self.spawn_read_migration(job);
        Ok(out)
    }

    /// Hands a read's migration to the background. Admitted by `decide` (counted in
    /// `in_flight`, its slot claimed): whatever becomes of it, both are given back.
    fn spawn_read_migration(self: &Arc<Self>, job: ReadMigration) {
        let admitted = Admitted {
            layer: Arc::downgrade(self),
            chunk: job.chunk,
            dst: job.decided.dst,
            claimed: job.decided.claimed,
        };
        let layer = Arc::downgrade(self);
        let runtime = self.settings.runtime.clone();
        let spawned = self
            .background
            .spawn(runtime.as_ref(), move |worker| async move {
                let mut admitted = admitted;
                let Some(step) = worker.step().await else {
                    if let Some(layer) = layer.upgrade() {
                        layer.bump(&layer.counters.migrations_cancelled, 1);
                    }
                    // Stopped: the slot and the place given back before the worker ends,
                    // so that a stop returns with them back.
                    drop(admitted);
                    return;
                };
                if let Some(layer) = layer.upgrade() {
                    layer.finish_read_migration(job, &mut admitted).await;
                }
                drop(admitted);
                drop(step);
            });
        if !spawned {
            // Stopped already: the task (and with it `admitted`) was dropped unrun.
            self.bump(&self.counters.migrations_cancelled, 1);
        }
    }

    /// The second half of a read's migration, in the background: alone on the chunk, and
    /// only if nothing changed it since the read (else the data carried may be stale and the
    /// migration is dropped), the data read is written to the destination, then the map.
    async fn finish_read_migration(&self, job: ReadMigration, admitted: &mut Admitted) {
        let ReadMigration {
            chunk,
            version,
            entry,
            mut decided,
            first,
            moving,
            data,
        } = job;
        let _alone = self.locks.write_range(chunk..chunk + 1).await;
        if self.version(chunk) != version {
            self.bump(&self.counters.migration_races, 1);
            return; // `admitted` gives the slot back
        }
        self.changed(chunk);
        // From here `migrate_blocks` owns the slot: it gives it back if it fails.
        decided.claimed = admitted.claimed.take();
        if let Err(error) = self
            .migrate_blocks(chunk, entry, decided, first, moving, &data, false)
            .await
        {
            // The read succeeded long ago: a failed migration leaves the data where it was.
            self.bump(&self.counters.migration_failures, 1);
            tracing::warn!(migrate = %self.name, chunk, %error, "migration after a read failed");
        } else {
            self.bump(&self.counters.read_migrations, 1);
        }
    }

    /// A write: its chunks at once (as a read); the first failure is the answer, after
    /// every piece has ended.
    pub(crate) async fn write_blocks(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        let pieces = self.pieces(offset, data.len() as u64);
        let writes = pieces.iter().map(|&(chunk, first, count, at)| {
            let piece = data.slice(at..at + (count * BLOCK) as usize);
            self.write_piece(chunk, first, count, piece)
        });
        for result in futures_util::future::join_all(writes).await {
            result?;
        }
        if fua {
            self.flush_all().await?;
        }
        Ok(())
    }

    async fn write_piece(&self, chunk: u64, first: u64, count: u64, data: Bytes) -> Result<()> {
        let _alone = self.locks.write_range(chunk..chunk + 1).await;
        self.changed(chunk);
        let entry = self.entry(chunk);
        if entry.is_empty() {
            return self.first_write(chunk, first, count, data).await;
        }
        let requested = mask(first, count);
        let home = entry.locations[0].expect("a non-empty entry has a first location");
        // A block's source: where it is valid, or the first location if unwritten.
        let source = |i: u64| {
            entry
                .holder(i)
                .map_or(home.device, |k| location(&entry, k).device)
        };
        // The source: the device most of the request's blocks go to without migration
        // (ties: the lower child); the blocks that may move are those going there.
        let mut counts = vec![0u64; self.children.len()];
        (first..first + count).for_each(|i| counts[source(i)] += 1);
        let src_device = (0..counts.len())
            .max_by_key(|&d| (counts[d], usize::MAX - d))
            .expect("children");
        let moving = (first..first + count)
            .filter(|&i| source(i) == src_device)
            .fold(0u64, |bits, i| bits | 1 << i);
        assert_eq!(moving & !requested, 0);
        if let Some(decided) = self.decide(chunk, &entry, src_device, false)? {
            self.migrate_blocks(chunk, entry, decided, first, moving, &data, true)
                .await?;
            self.bump(&self.counters.write_migrations, 1);
            // The rest of the request (blocks on another device) is written in place below.
            let rest = requested & !moving;
            if rest == 0 {
                return Ok(());
            }
            let entry = self.entry(chunk);
            return self.write_in_place(chunk, entry, first, rest, &data).await;
        }
        self.write_in_place(chunk, entry, first, requested, &data)
            .await
    }

    /// Writes the blocks of `which` where they are valid (unwritten ones at the first
    /// location) and records the newly valid ones.
    async fn write_in_place(
        &self,
        chunk: u64,
        entry: Entry,
        first: u64,
        which: u64,
        data: &Bytes,
    ) -> Result<()> {
        let target = |i: u64| (which >> i & 1 == 1).then(|| entry.holder(i).unwrap_or(0));
        let count = 64 - (which.leading_zeros() as u64) - first;
        for (k, start, end) in runs(first, count, target) {
            let Some(k) = k else { continue };
            let piece = slice_blocks(data, first, start, end);
            self.write_at(location(&entry, k), start, piece, false)
                .await?;
        }
        let fresh = which & !valid_bits(&entry);
        if fresh != 0 {
            let mut updated = entry;
            if let Some(home) = updated.locations[0].as_mut() {
                home.valid |= fresh;
            }
            self.put_entry(chunk, updated)?;
        }
        Ok(())
    }

    /// The first write of a chunk: a slot by the allocation policy, the data, the entry.
    async fn first_write(&self, chunk: u64, first: u64, count: u64, data: Bytes) -> Result<()> {
        let (device, slot) = self.allocate_first(chunk).await?;
        let location = Location {
            device,
            slot,
            valid: mask(first, count),
        };
        if let Err(error) = self.write_at(location, first, data, false).await {
            let mut space = self.space()?;
            space.free[device].insert(slot);
            space.allocated -= 1;
            return Err(error);
        }
        self.put_entry(chunk, Entry::single(location))
    }

    /// A slot for a chunk's first write. When none is free, slots freed by transactions not
    /// yet durable are what is missing: a commit releases them (concurrent requests may free
    /// more meanwhile, hence a few rounds).
    async fn allocate_first(&self, chunk: u64) -> Result<(usize, u64)> {
        for _ in 0..ALLOCATION_COMMITS {
            {
                let mut space = self.space()?;
                let free: Vec<u64> = space.free.iter().map(|f| f.len() as u64).collect();
                if let Some(device) = policy::first_device(self.settings.allocation, chunk, &free) {
                    let slot = space.free[device].pop_first().expect("a free slot");
                    space.allocated += 1;
                    assert!(space.allocated <= self.shape.chunks);
                    return Ok((device, slot));
                }
                // free + pending >= unwritten chunks (a migration claims a slot only above
                // that), and this chunk is unwritten: some free must be pending.
                assert!(!space.pending.is_empty(), "no slot free nor pending");
            }
            self.commit().await?;
        }
        Err(BlockError::NoSpace)
    }

    /// The policy's decision for a request whose data is on `src`: the candidate list is
    /// touched, then the rule asked, then (for a read's, which runs in the background) a place
    /// among the migrations in flight checked, then a token taken, then a slot claimed if
    /// needed.
    /// A read's migration admitted is counted in `in_flight` until its `Admitted` drops.
    fn decide(
        &self,
        chunk: u64,
        entry: &Entry,
        src: usize,
        background: bool,
    ) -> Result<Option<Move>> {
        let mode = self.settings.policy;
        if mode == Policy::NoMig {
            return Ok(None);
        }
        let room = self.room(entry)?;
        let now = self.now();
        let mut state = self.policy_state()?;
        let draw = state.rng.next_f64();
        let listed = state.candidates.touch(chunk, draw);
        let draw = state.rng.next_u64();
        let stats = state.stats.clone();
        let Some(dst) = policy::decide(mode, self.settings.delta, &stats, &room, src, draw) else {
            return Ok(None);
        };
        if mode == Policy::Mig && !listed {
            self.bump(&self.counters.not_candidate, 1);
            return Ok(None);
        }
        if background {
            let in_flight = self.in_flight.borrow();
            if in_flight.len() >= MAX_MIGRATIONS_IN_FLIGHT || in_flight.contains(&chunk) {
                self.bump(&self.counters.in_flight_skips, 1);
                return Ok(None);
            }
        }
        if !state.bucket.try_take(now) {
            self.bump(&self.counters.no_token, 1);
            return Ok(None);
        }
        // Admitted under the policy lock, where every admission is: the check above holds.
        if background {
            self.in_flight.send_modify(|in_flight| {
                in_flight.insert(chunk);
            });
        }
        drop(state);
        let claimed = match entry.on_device(dst) {
            Some(_) => None,
            None => match self.claim_slot(dst) {
                Ok(Some(slot)) => Some(slot),
                claimed => {
                    if background {
                        self.end_in_flight(chunk);
                    }
                    claimed?;
                    return Ok(None); // the room was taken meanwhile
                }
            },
        };
        Ok(Some(Move { src, dst, claimed }))
    }

    /// Which children could take data of this chunk: one it has a location on, or any with
    /// a free slot while the chunk has one location and a slot stays for every chunk never
    /// written (so that a first write always finds one).
    fn room(&self, entry: &Entry) -> Result<Vec<bool>> {
        let space = self.space()?;
        let spare = space.free_total() > self.shape.chunks - space.allocated;
        Ok((0..self.children.len())
            .map(|d| {
                entry.on_device(d).is_some()
                    || (entry.locations[1].is_none() && spare && !space.free[d].is_empty())
            })
            .collect())
    }

    /// A read migration of `chunk` has ended (landed, dropped, failed or cancelled).
    fn end_in_flight(&self, chunk: u64) {
        self.in_flight.send_modify(|in_flight| {
            in_flight.remove(&chunk);
        });
    }

    fn claim_slot(&self, device: usize) -> Result<Option<u64>> {
        let mut space = self.space()?;
        if space.free_total() <= self.shape.chunks - space.allocated {
            return Ok(None);
        }
        Ok(space.free[device].pop_first())
    }

    /// Moves blocks `moving` of `chunk` from `decided.src` to `decided.dst`: their data (in
    /// `data`, the request's, starting at block `first`) written at the destination, then
    /// one transaction moves their valid bits.
    #[allow(clippy::too_many_arguments)]
    async fn migrate_blocks(
        &self,
        chunk: u64,
        entry: Entry,
        decided: Move,
        first: u64,
        moving: u64,
        data: &Bytes,
        is_write: bool,
    ) -> Result<()> {
        assert_ne!(decided.src, decided.dst);
        let mut updated = entry;
        let k_dst = match decided.claimed {
            Some(slot) => {
                let k = usize::from(updated.locations[0].is_some());
                assert!(
                    updated.locations[k].is_none(),
                    "a chunk has two locations at most"
                );
                updated.locations[k] = Some(Location {
                    device: decided.dst,
                    slot,
                    valid: 0,
                });
                k
            }
            None => updated
                .on_device(decided.dst)
                .expect("decided with a location there"),
        };
        let dst = location(&updated, k_dst);
        let count = 64 - (moving.leading_zeros() as u64) - first;
        for (on, start, end) in runs(first, count, |i| moving >> i & 1 == 1) {
            if !on {
                continue;
            }
            let piece = slice_blocks(data, first, start, end);
            if let Err(error) = self.write_at(dst, start, piece, false).await {
                if let Some(slot) = decided.claimed {
                    self.space()?.free[decided.dst].insert(slot);
                }
                return Err(error);
            }
        }
        // One transaction: valid at the destination, invalid everywhere else.
        for (k, slot) in updated.locations.iter_mut().enumerate() {
            if let Some(l) = slot.as_mut() {
                if k == k_dst {
                    l.valid |= moving;
                } else {
                    l.valid &= !moving;
                }
            }
        }
        if !is_write {
            // A read moves only blocks that were valid.
            assert_eq!(moving & !valid_bits(&entry), 0);
        }
        if let Err(error) = self.put_entry(chunk, updated) {
            if let Some(slot) = decided.claimed {
                self.space()?.free[decided.dst].insert(slot);
            }
            return Err(error);
        }
        self.bump(&self.counters.migrations, 1);
        self.bump(
            &self.counters.migrated_blocks,
            u64::from(moving.count_ones()),
        );
        self.bump(&self.counters.moved_to[decided.dst], 1);
        self.bump(&self.counters.moved[decided.src][decided.dst], 1);
        Ok(())
    }

    /// Records `entry` for `chunk` (normalized: empty locations dropped, their slots freed
    /// once durable; an empty entry removes the record and the chunk's allocation).
    pub(crate) fn put_entry(&self, chunk: u64, mut entry: Entry) -> Result<()> {
        let dropped = entry.normalize();
        let ids = self.ids;
        let class = if dropped.is_empty() {
            TxnClass::Normal
        } else {
            TxnClass::Reclaim
        };
        self.store.transact(class, |_, txn| {
            txn.set(ids.chunks, chunk, &entry.encode());
            Ok(())
        })?;
        let mut space = self.space()?;
        if entry.is_empty() {
            space.allocated -= 1;
        }
        if !dropped.is_empty() {
            self.free_after(&mut space, &dropped);
        }
        Ok(())
    }

    /// Discard (and write-zeroes that may trim): the blocks become unwritten; a chunk left
    /// with none frees its slots (once durable) and may be allocated again.
    pub(crate) async fn unmap_blocks(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        for (chunk, first, count, _) in self.pieces(offset, len) {
            let _alone = self.locks.write_range(chunk..chunk + 1).await;
            self.changed(chunk);
            let entry = self.entry(chunk);
            let clear = mask(first, count);
            if entry.is_empty() || valid_bits(&entry) & clear == 0 {
                continue;
            }
            let mut updated = entry;
            for l in updated.locations.iter_mut().flatten() {
                l.valid &= !clear;
            }
            self.put_entry(chunk, updated)?;
            self.bump(
                &self.counters.unmapped_blocks,
                u64::from((valid_bits(&entry) & clear).count_ones()),
            );
        }
        if fua {
            self.flush_all().await?;
        }
        Ok(())
    }

    /// Every child flushed, then the map committed (which flushes them again only if there
    /// is something to commit): after it, every write acknowledged before is durable.
    pub(crate) async fn flush_all(&self) -> Result<()> {
        if self.settings.unsafe_skip_data_barrier {
            return self.commit().await;
        }
        let flushes = self.children.iter().map(|c| c.flush());
        for result in futures_util::future::join_all(flushes).await {
            result?;
        }
        self.commit().await
    }
}

impl Migrate {
    /// Allocation of `offset..offset + len`: a block never written, or discarded, is a hole
    /// (it reads as zeros); any other is data. Answers at most [`STATUS_BLOCKS`] blocks (the
    /// caller asks again), from one look at the map; extents are cut to the range.
    pub(crate) fn allocation(&self, offset: u64, len: u64) -> Vec<Extent> {
        let per = self.shape.chunk_blocks;
        let stop = offset + len;
        let first = offset / BLOCK;
        let end = stop.div_ceil(BLOCK).min(first + STATUS_BLOCKS);
        let mut extents = Vec::new();
        self.store.read(|state| {
            let mut cached: Option<(u64, u64)> = None; // (chunk, valid bits)
            for block in first..end {
                let chunk = block / per;
                let valid = match cached {
                    Some((c, valid)) if c == chunk => valid,
                    _ => {
                        let valid = valid_bits(&records::entry(state, &self.ids, chunk));
                        cached = Some((chunk, valid));
                        valid
                    }
                };
                let state = if valid >> (block % per) & 1 == 1 {
                    ExtentState::Data
                } else {
                    ExtentState::Hole
                };
                let start = (block * BLOCK).max(offset);
                let extent = Extent {
                    offset: start,
                    len: ((block + 1) * BLOCK).min(stop) - start,
                    state,
                };
                push_extent(&mut extents, extent);
            }
        });
        extents
    }
}

/// Commits a first write may wait for before it gives up on a slot.
const ALLOCATION_COMMITS: usize = 8;

/// Blocks one block-status answer covers (16 MiB): bounded work under the store's lock.
const STATUS_BLOCKS: u64 = 4096;

/// The location at `k` (present).
fn location(entry: &Entry, k: usize) -> Location {
    entry.locations[k].expect("a location the entry has")
}

fn valid_bits(entry: &Entry) -> u64 {
    entry.locations.iter().flatten().fold(0, |v, l| v | l.valid)
}

/// The blocks `start..end` of request data that begins at block `first`.
fn slice_blocks(data: &Bytes, first: u64, start: u64, end: u64) -> Bytes {
    data.slice(((start - first) * BLOCK) as usize..((end - first) * BLOCK) as usize)
}

/// For a read: the device holding most of the requested valid blocks, and those blocks.
fn majority_source(entry: &Entry, requested: u64) -> Option<(usize, u64)> {
    entry
        .locations
        .iter()
        .flatten()
        .map(|l| (l.device, l.valid & requested))
        .filter(|(_, bits)| *bits != 0)
        .max_by_key(|(device, bits)| (bits.count_ones(), usize::MAX - device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_runs() {
        assert_eq!(mask(0, 64), u64::MAX);
        assert_eq!(mask(2, 3), 0b11100);
        let r = runs(0, 6, |i| i / 2);
        assert_eq!(r, vec![(0, 0, 2), (1, 2, 4), (2, 4, 6)]);
    }

    #[test]
    fn a_read_migrates_from_the_device_holding_most_of_it() {
        let entry = Entry {
            locations: [
                Some(Location {
                    device: 0,
                    slot: 0,
                    valid: 0b0011,
                }),
                Some(Location {
                    device: 1,
                    slot: 0,
                    valid: 0b1100,
                }),
            ],
        };
        assert_eq!(majority_source(&entry, 0b0111), Some((0, 0b0011)));
        assert_eq!(majority_source(&entry, 0b1110), Some((1, 0b1100)));
        assert_eq!(majority_source(&entry, 0b1_0000), None);
    }
}
