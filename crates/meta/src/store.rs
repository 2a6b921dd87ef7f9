//! The metadata service: transactions applied in memory at once, made durable by group
//! commit, and checkpointed when the journal fills.
//!
//! Lock rules: `shared` (a std RwLock) is held only for in-memory work, never across an await.
//! `committer` (an async mutex) serializes commits and is held across their I/O; a commit
//! takes `shared` briefly to cut its batch. Layers read state under `shared`'s read lock.
//!
//! Durability contract: a transaction is durable once a [`MetaStore::commit`] that started
//! after it returns Ok. Every commit first flushes the data devices (and the store's own
//! device), so metadata never reaches the disk before the data it points to. A failed
//! metadata write leaves the store failed: it refuses further transactions, because what
//! reached the disk is then unknown, and the next open recovers from what is there.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use strata_core::{Background, BlockError, DeviceRef, Result, Runtime, WriteFlags};

use crate::block::{self, BlockKind, BLOCK_SIZE};
use crate::journal::PendingBatch;
use crate::layout::{Layout, Superblock, FORMAT_VERSION};
use crate::objects::Value;
use crate::recovery::{self, JournalEnd, Recovered};
use crate::state::{encode_checkpoint, ObjectId, ObjectKind, Op, State, Undo};
use crate::stats::{MetaCounters, SpaceReport};

/// Whether a transaction may dig into the reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnClass {
    /// Ordinary work: refused with NoSpace once only the reserve is left.
    Normal,
    /// Work that frees space (discard, delete): may use the reserve, so it always works on a
    /// full store.
    Reclaim,
}

/// Settings fixed when a region is formatted.
#[derive(Clone, Debug)]
pub struct FormatOptions {
    /// Who keeps state here; `strata check` picks its invariants by this name.
    pub owner: String,
    /// Fraction of the region given to the journal.
    pub journal_fraction: f64,
    /// Fraction of checkpoint space kept for [`TxnClass::Reclaim`] transactions.
    pub reserve_fraction: f64,
    /// Fraction of checkpoint space above which a low-space event is raised.
    pub low_water_fraction: f64,
    /// The first generation; random by default so that blocks left by an earlier store in
    /// the same region never match the new one's epochs.
    pub first_generation: Option<u64>,
}

impl FormatOptions {
    pub fn new(owner: &str) -> Self {
        FormatOptions {
            owner: owner.to_string(),
            journal_fraction: 0.25,
            reserve_fraction: 0.05,
            low_water_fraction: 0.80,
            first_generation: None,
        }
    }

    /// The first generation drawn from `runtime`: random under `strata serve`, from the seed
    /// in the simulator (the generation's parity decides which superblock copy a checkpoint
    /// writes, and so where on the disk, so a seeded run must not draw it from the OS).
    pub fn random_from(mut self, runtime: &dyn strata_core::Runtime) -> Self {
        self.first_generation = Some(generation_from(runtime.random_u64()));
        self
    }
}

/// Settings of an open store.
#[derive(Clone)]
pub struct StoreOptions {
    /// Name used in logs and status ("pool0 metadata").
    pub name: String,
    /// Devices that hold data the metadata points to; flushed before every commit.
    pub data_devices: Vec<DeviceRef>,
    /// Test-only: skip the data flush before a commit, and the one after a batch whose data
    /// it covers (its copies then go as `write_durable`, which need not make earlier writes
    /// durable). This plants the ordering bug (data committed after its metadata) the crash
    /// harness must catch.
    #[doc(hidden)]
    pub unsafe_skip_data_barrier: bool,
}

impl StoreOptions {
    pub fn new(name: &str) -> Self {
        StoreOptions {
            name: name.to_string(),
            data_devices: Vec::new(),
            unsafe_skip_data_barrier: false,
        }
    }
}

/// Changes staged by a transaction; applied all together or not at all.
pub struct Txn {
    ops: Vec<Op>,
    next_id: ObjectId,
}

impl Txn {
    fn create(&mut self, name: &str, kind: ObjectKind, value_size: u32) -> ObjectId {
        let id = self.next_id;
        self.next_id += 1;
        self.ops.push(Op::Create {
            id,
            kind,
            value_size,
            name: name.to_string(),
        });
        id
    }

    pub fn create_table(&mut self, name: &str, value_size: usize) -> ObjectId {
        self.create(name, ObjectKind::Table, value_size as u32)
    }

    pub fn create_bitmap(&mut self, name: &str) -> ObjectId {
        self.create(name, ObjectKind::Bitmap, 0)
    }

    pub fn create_blob(&mut self, name: &str) -> ObjectId {
        self.create(name, ObjectKind::Blob, 0)
    }

    pub fn delete(&mut self, id: ObjectId) {
        self.ops.push(Op::Delete { id });
    }

    pub fn set(&mut self, table: ObjectId, index: u64, value: &[u8]) {
        self.ops.push(Op::Set {
            id: table,
            index,
            value: Value::from_slice(value),
        });
    }

    pub fn set_u32(&mut self, table: ObjectId, index: u64, value: u32) {
        self.set(table, index, &value.to_le_bytes());
    }

    pub fn set_bits(&mut self, bitmap: ObjectId, start: u64, count: u64, value: bool) {
        self.ops.push(Op::SetBits {
            id: bitmap,
            start,
            count,
            value,
        });
    }

    pub fn put_blob(&mut self, blob: ObjectId, data: Vec<u8>) {
        self.ops.push(Op::PutBlob { id: blob, data });
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// What a transaction's commit must do for the data it points at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DataRule {
    /// Flush the data devices before the journal write.
    Barrier,
    /// Nothing: the caller made it durable.
    Durable,
    /// Flush the store's own device after the journal write.
    Covered,
}

struct Shared {
    state: State,
    pending: PendingBatch,
    /// A transaction in `pending` points at data that only the commit's data barrier makes
    /// durable (see [`MetaStore::transact_data_durable`]).
    pending_needs_barrier: bool,
    /// A transaction in `pending` points at data on the store's own device that the commit's
    /// own sync makes durable (see [`MetaStore::transact_data_covered`]).
    pending_covered: bool,
    /// Data the pending covered transactions point at, not written yet
    /// ([`MetaStore::transact_data_covered_with`]): the commit writes it with the journal.
    pending_data: Vec<(u64, Bytes)>,
    next_txn: u64,
    /// Every transaction numbered below this is durable.
    durable_txn: u64,
    /// The failure that stopped the store; later calls fail with the same kind.
    failed: Option<Failure>,
    low_space: bool,
}

/// Where the next commit goes. Owned by whoever holds the commit lock.
struct Committer {
    superblock: Superblock,
    journal_block: u64,
    batch_seq: u64,
}

/// A crash-consistent store of named objects in a region of a device.
pub struct MetaStore {
    device: DeviceRef,
    options: StoreOptions,
    layout: Layout,
    shared: RwLock<Shared>,
    committer: tokio::sync::Mutex<Committer>,
    counters: MetaCounters,
    uuid: [u8; 16],
    reserve_bytes: u64,
    low_water_bytes: u64,
    /// The timed committer, if one was spawned: stopped explicitly at shutdown.
    background: Background,
}

impl MetaStore {
    /// Writes an empty store into the region `[offset, offset + len)` of `device` and opens it.
    pub async fn format(
        device: DeviceRef,
        offset: u64,
        len: u64,
        format: FormatOptions,
        options: StoreOptions,
    ) -> Result<Arc<MetaStore>> {
        let layout = Layout::new(offset, len, format.journal_fraction)
            .map_err(BlockError::InvalidArgument)?;
        let capacity = layout.slot_capacity_bytes() as f64;
        let generation = format.first_generation.unwrap_or_else(random_generation);
        let superblock = Superblock {
            format_version: FORMAT_VERSION,
            uuid: random_uuid(),
            generation,
            owner: format.owner.clone(),
            layout,
            active_slot: 0,
            checkpoint_blocks: 1,
            checkpoint_txn: 0,
            reserve_bytes: (capacity * format.reserve_fraction) as u64,
            low_water_bytes: (capacity * format.low_water_fraction) as u64,
        };
        // Invalidate both copies first, so that no superblock of an earlier store survives
        // next to the new one.
        let zeros = bytes::Bytes::from(vec![0u8; 2 * BLOCK_SIZE]);
        device
            .write(layout.superblock_offset(0), zeros, WriteFlags::default())
            .await?;
        let recovered = Recovered {
            superblock,
            state: State::new(),
            next_txn: 0,
            journal_end_block: 0,
            batches_replayed: 0,
            txns_replayed: 0,
            journal_end: JournalEnd::Clean,
            superblock_faults: Vec::new(),
            journal_copy_faults: Vec::new(),
            checkpoint_bytes: 0,
            elapsed: Duration::ZERO,
        };
        let store = MetaStore::from_recovered(device, recovered, options);
        // Twice, so that both superblock copies are valid from the start.
        store.checkpoint_now().await?;
        store.checkpoint_now().await?;
        Ok(store)
    }

    /// Opens the store whose region starts at `offset`, recovering it and writing a fresh
    /// checkpoint so that the journal starts clean in a new epoch.
    pub async fn open(
        device: DeviceRef,
        offset: u64,
        options: StoreOptions,
    ) -> Result<(Arc<MetaStore>, Recovered)> {
        let recovered = recovery::recover(device.as_ref(), offset).await?;
        Self::open_recovered(device, recovered, options).await
    }

    /// [`MetaStore::open`] from a recovery the caller already ran (`recovery::recover` on the
    /// same device and offset, with nothing written there since): a caller that must look at
    /// what recovery found before deciding to open (its owner, whether it recovers at all)
    /// reads the region once, not twice.
    pub async fn open_recovered(
        device: DeviceRef,
        recovered: Recovered,
        options: StoreOptions,
    ) -> Result<(Arc<MetaStore>, Recovered)> {
        let name = options.name.clone();
        tracing::info!(
            store = %name,
            generation = recovered.superblock.generation,
            batches = recovered.batches_replayed,
            transactions = recovered.txns_replayed,
            journal_end = ?recovered.journal_end,
            state_bytes = recovered.state.encoded_bytes(),
            elapsed_ms = recovered.elapsed.as_secs_f64() * 1e3,
            "metadata recovered"
        );
        for (copy, reason) in &recovered.superblock_faults {
            tracing::warn!(store = %name, copy, %reason, "superblock copy is not valid; the next checkpoint rewrites it");
        }
        for fault in &recovered.journal_copy_faults {
            tracing::warn!(store = %name, %fault, "journal copy is not valid; the fresh checkpoint retires it");
        }
        if recovered.superblock.format_version < FORMAT_VERSION {
            tracing::info!(
                store = %name,
                from = recovered.superblock.format_version,
                to = FORMAT_VERSION,
                "upgrading the metadata format with the open's checkpoint"
            );
        }
        let store = MetaStore::from_recovered(device, recovered.clone(), options);
        store.checkpoint_now().await?;
        Ok((store, recovered))
    }

    fn from_recovered(device: DeviceRef, recovered: Recovered, options: StoreOptions) -> Arc<Self> {
        let layout = recovered.superblock.layout;
        let uuid = recovered.superblock.uuid;
        let reserve_bytes = recovered.superblock.reserve_bytes;
        let low_water_bytes = recovered.superblock.low_water_bytes;
        let shared = Shared {
            pending: PendingBatch::new(recovered.next_txn),
            pending_needs_barrier: false,
            pending_covered: false,
            pending_data: Vec::new(),
            next_txn: recovered.next_txn,
            durable_txn: recovered.next_txn,
            state: recovered.state,
            failed: None,
            low_space: false,
        };
        let committer = Committer {
            superblock: recovered.superblock,
            journal_block: recovered.journal_end_block,
            batch_seq: recovered.batches_replayed,
        };
        Arc::new(MetaStore {
            device,
            options,
            layout,
            shared: RwLock::new(shared),
            committer: tokio::sync::Mutex::new(committer),
            counters: MetaCounters::default(),
            uuid,
            reserve_bytes,
            low_water_bytes,
            background: Background::new(),
        })
    }

    pub fn name(&self) -> &str {
        &self.options.name
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    fn read_shared(&self) -> RwLockReadGuard<'_, Shared> {
        self.shared
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn write_shared(&self) -> RwLockWriteGuard<'_, Shared> {
        self.shared
            .write()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Runs `f` on the current state (including transactions not yet durable).
    pub fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.read_shared().state)
    }

    /// Runs a transaction: `build` looks at the state and stages changes, which are then
    /// applied all together, or not at all if `build` fails, an op is invalid or the result
    /// would not fit. Staged changes are not visible to `build` itself.
    ///
    /// The commit that makes it durable first flushes the data devices (the data barrier):
    /// the transaction may point at data written just before it.
    pub fn transact<R>(
        &self,
        class: TxnClass,
        build: impl FnOnce(&State, &mut Txn) -> Result<R>,
    ) -> Result<R> {
        self.transact_inner(class, DataRule::Barrier, build)
    }

    /// [`Self::transact`] for a transaction whose caller has already made durable every byte
    /// it points at (or that points at no new data). A commit carrying only such
    /// transactions skips the data barrier, and the caller's own sync ran outside the one
    /// commit at a time: a brick's prepares make their staged data durable side by side and
    /// then share one journal write.
    pub fn transact_data_durable<R>(
        &self,
        class: TxnClass,
        build: impl FnOnce(&State, &mut Txn) -> Result<R>,
    ) -> Result<R> {
        self.transact_inner(class, DataRule::Durable, build)
    }

    /// [`Self::transact`] for a transaction that points at data its caller wrote to the
    /// store's own device and did not make durable. The commit that carries it writes its
    /// journal batch and then flushes the device once: the data and the record become
    /// durable under one sync, instead of a barrier's sync and then the journal's. A crash
    /// before that flush may keep the record without the data, so only a caller that can
    /// tell at recovery whether its data landed may use this (a brick's prepare: the record
    /// carries checksums of its staged data, and was not acknowledged before the flush).
    pub fn transact_data_covered<R>(
        &self,
        class: TxnClass,
        build: impl FnOnce(&State, &mut Txn) -> Result<R>,
    ) -> Result<R> {
        self.transact_inner(class, DataRule::Covered, build)
    }

    /// [`Self::transact_data_covered`] for a transaction whose data is not written yet:
    /// `data` (offsets on the store's own device) is written by the commit that carries the
    /// transaction, in the same call as its journal batch and before its one flush. A
    /// brick's prepare then costs one trip to the device, as a write made durable does. If
    /// the transaction is refused, the data is not written.
    pub fn transact_data_covered_with<R>(
        &self,
        class: TxnClass,
        data: Vec<(u64, Bytes)>,
        build: impl FnOnce(&State, &mut Txn) -> Result<R>,
    ) -> Result<R> {
        self.transact_with(class, DataRule::Covered, data, build)
    }

    fn transact_inner<R>(
        &self,
        class: TxnClass,
        rule: DataRule,
        build: impl FnOnce(&State, &mut Txn) -> Result<R>,
    ) -> Result<R> {
        self.transact_with(class, rule, Vec::new(), build)
    }

    fn transact_with<R>(
        &self,
        class: TxnClass,
        rule: DataRule,
        data: Vec<(u64, Bytes)>,
        build: impl FnOnce(&State, &mut Txn) -> Result<R>,
    ) -> Result<R> {
        let mut shared = self.write_shared();
        if let Some(failure) = &shared.failed {
            return Err(failure.refusal(&self.options.name));
        }
        let mut txn = Txn {
            ops: Vec::new(),
            next_id: shared.state.next_id(),
        };
        let result = build(&shared.state, &mut txn)?;
        if txn.ops.is_empty() {
            // Nothing records the data: it need not be written.
            return Ok(result);
        }
        let limit = match class {
            TxnClass::Normal => self.capacity_bytes() - self.reserve_bytes(),
            TxnClass::Reclaim => self.capacity_bytes(),
        };
        apply_all(&mut shared.state, &txn.ops, limit).map_err(|error| {
            if !matches!(error, BlockError::NoSpace) {
                tracing::error!(store = %self.options.name, %error, "metadata transaction refused");
            }
            error
        })?;
        shared.pending.push(&txn.ops);
        shared.pending_needs_barrier |= rule == DataRule::Barrier;
        shared.pending_covered |= rule == DataRule::Covered;
        shared.pending_data.extend(data);
        shared.next_txn += 1;
        self.counters.txn(txn.ops.len());
        self.watch_space(&mut shared);
        Ok(result)
    }

    fn watch_space(&self, shared: &mut Shared) {
        let used = shared.state.encoded_bytes();
        let low_water = self.low_water_bytes;
        if used > low_water && !shared.low_space {
            shared.low_space = true;
            self.counters.low_space_event();
            tracing::warn!(
                store = %self.options.name,
                used_bytes = used,
                capacity_bytes = self.capacity_bytes(),
                "metadata space is running low"
            );
        } else if used <= low_water && shared.low_space {
            shared.low_space = false;
            tracing::info!(store = %self.options.name, used_bytes = used, "metadata space is back under the low-water mark");
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.layout.slot_capacity_bytes()
    }

    fn reserve_bytes(&self) -> u64 {
        self.reserve_bytes
    }

    /// Makes every transaction run so far durable. Concurrent callers share one write.
    pub async fn commit(&self) -> Result<()> {
        let target = self.read_shared().next_txn;
        loop {
            {
                let shared = self.read_shared();
                if let Some(failure) = &shared.failed {
                    return Err(failure.refusal(&self.options.name));
                }
                if shared.durable_txn >= target {
                    return Ok(());
                }
            }
            let mut committer = self.committer.lock().await;
            if self.read_shared().durable_txn >= target {
                return Ok(());
            }
            self.commit_locked(&mut committer).await?;
        }
    }

    /// Transactions not yet durable.
    pub fn uncommitted(&self) -> u64 {
        let shared = self.read_shared();
        shared.next_txn - shared.durable_txn
    }

    /// Transactions numbered below this are durable; layers use it to release space freed by
    /// a transaction only once the free is on disk.
    pub fn durable_txn(&self) -> u64 {
        self.read_shared().durable_txn
    }

    /// The number the next transaction will get.
    pub fn next_txn(&self) -> u64 {
        self.read_shared().next_txn
    }

    async fn commit_locked(&self, committer: &mut Committer) -> Result<()> {
        let started = std::time::Instant::now();
        let (batch, upto, checkpoint, needs_barrier, covered, data) = {
            let mut shared = self.write_shared();
            // A commit that failed took its batch with it: the pending batch no longer holds
            // those transactions, so "nothing pending" below would call them durable (and a
            // layer would reuse the space they freed). The caller gets the failure instead.
            if let Some(failure) = &shared.failed {
                return Err(failure.refusal(&self.options.name));
            }
            let upto = shared.next_txn;
            let batch = std::mem::replace(&mut shared.pending, PendingBatch::new(upto));
            let needs_barrier = std::mem::take(&mut shared.pending_needs_barrier);
            let covered = std::mem::take(&mut shared.pending_covered);
            let data = std::mem::take(&mut shared.pending_data);
            if batch.is_empty() {
                shared.durable_txn = upto;
                return Ok(());
            }
            let blocks = block::blocks_for(batch.stream_len()) as u64;
            let fits = committer.journal_block + blocks <= committer.superblock.journal_capacity();
            let checkpoint = (!fits).then(|| {
                let mut stream = Vec::with_capacity(shared.state.encoded_bytes() as usize);
                encode_checkpoint(&shared.state, &mut stream);
                stream
            });
            (batch, upto, checkpoint, needs_barrier, covered, data)
        };
        let result = async {
            // A checkpoint is written in several steps: data it covers is made durable first.
            let barrier = needs_barrier || (covered && checkpoint.is_some());
            let data = if barrier && !data.is_empty() {
                strata_core::write_all(&*self.device, data).await?;
                Vec::new()
            } else {
                data
            };
            if barrier {
                self.data_barrier().await?;
            }
            match checkpoint {
                // The batch's transactions are only in this checkpoint.
                Some(stream) => self.write_checkpoint(committer, &stream, upto, true).await,
                None => {
                    let flush_after = covered && !needs_barrier;
                    self.write_batch(committer, &batch, flush_after, data).await
                }
            }
        }
        .await;
        let mut shared = self.write_shared();
        match result {
            Ok(()) => {
                shared.durable_txn = upto;
                self.counters.commit(started.elapsed());
                Ok(())
            }
            Err(error) => {
                tracing::error!(store = %self.options.name, %error, "metadata commit failed; the store is now failed");
                shared.failed = Some(Failure::of(&error));
                Err(error)
            }
        }
    }

    /// Flushes the data the metadata about to be written may point to.
    async fn data_barrier(&self) -> Result<()> {
        if self.options.unsafe_skip_data_barrier {
            return Ok(());
        }
        for device in &self.options.data_devices {
            device.flush().await?;
        }
        self.device.flush().await
    }

    /// `flush_after`: the batch carries transactions whose data is not durable yet
    /// ([`Self::transact_data_covered`]); the copies are written and the device flushed, which
    /// makes that data durable with them.
    async fn write_batch(
        &self,
        committer: &mut Committer,
        batch: &PendingBatch,
        flush_after: bool,
        data: Vec<(u64, Bytes)>,
    ) -> Result<()> {
        let superblock = &committer.superblock;
        let epoch = superblock.generation;
        let unit = block::encode_unit(
            BlockKind::Journal,
            epoch,
            committer.batch_seq,
            &batch.stream(),
        )
        .freeze();
        let blocks = (unit.len() / BLOCK_SIZE) as u64;
        // Every copy (two from format version 2) is issued at once and all are awaited: the
        // second costs one more concurrent write, not one more round trip, and the commit is
        // acknowledged only once every copy is durable, which is what lets recovery read a
        // batch with one valid copy as "completed, then damaged or torn", never as lost.
        let offsets = (0..superblock.journal_copies())
            .map(|copy| superblock.journal_copy_offset(copy, committer.journal_block));
        if flush_after && !self.options.unsafe_skip_data_barrier {
            // The data the batch points at goes in the same call, under the same flush.
            let mut writes = data;
            writes.extend(offsets.map(|offset| (offset, unit.clone())));
            self.device.write_and_flush(writes).await?;
        } else if !data.is_empty() {
            // Test-only (`unsafe_skip_data_barrier`): the data, then the copies, no flush
            // between them or after.
            strata_core::write_all(&*self.device, data).await?;
            crate::write_copies(&*self.device, offsets, unit).await?;
        } else {
            crate::write_copies(&*self.device, offsets, unit).await?;
        }
        committer.journal_block += blocks;
        committer.batch_seq += 1;
        self.counters.batch(blocks);
        Ok(())
    }

    /// Writes the whole state as a new checkpoint and publishes it with a superblock.
    ///
    /// `carries_new` says the checkpoint holds transactions no journal batch holds (a commit
    /// that overflowed the journal, a checkpoint taken with transactions pending). Then an
    /// empty batch 0 of the new epoch follows the superblock, before the call returns: if the
    /// new superblock is later damaged, that batch tells recovery the superblock had been
    /// durable and falling back to the older one would lose acknowledged transactions, so it
    /// refuses instead. Without it the fallback would look exactly like a superblock write
    /// torn by a crash. (A checkpoint of nothing new, as at open, needs no marker: falling
    /// back from it loses nothing, because the older epoch's journal is still intact.)
    async fn write_checkpoint(
        &self,
        committer: &mut Committer,
        stream: &[u8],
        upto: u64,
        carries_new: bool,
    ) -> Result<()> {
        let previous = &committer.superblock;
        let next = Superblock {
            // A version 1 store becomes version 2 here, at its first checkpoint: the new
            // epoch's journal is written with two copies only once this superblock is durable,
            // and until then the version 1 superblock and its journal are still current.
            format_version: FORMAT_VERSION,
            generation: previous.generation + 1,
            active_slot: 1 - previous.active_slot,
            checkpoint_blocks: block::blocks_for(stream.len()) as u64,
            checkpoint_txn: upto,
            ..previous.clone()
        };
        if next.checkpoint_blocks > self.layout.slot_blocks {
            // Transactions are refused before the state outgrows a slot; reaching this is a bug.
            return Err(BlockError::io(
                "metadata checkpoint",
                std::io::Error::other(format!(
                    "state of {} bytes exceeds the checkpoint slot",
                    stream.len()
                )),
            ));
        }
        let unit = block::encode_unit(BlockKind::Checkpoint, next.generation, 0, stream);
        let slot = self.layout.slot_offset(next.active_slot);
        self.device
            .write(slot, unit.freeze(), WriteFlags::default())
            .await?;
        self.device.flush().await?;
        let offset = self.layout.superblock_offset(next.copy());
        self.device
            .write(offset, next.encode().freeze(), WriteFlags { fua: true })
            .await?;
        committer.superblock = next;
        committer.journal_block = 0;
        committer.batch_seq = 0;
        self.counters.checkpoint(stream.len() as u64);
        if carries_new {
            self.write_batch(committer, &PendingBatch::new(upto), false, Vec::new())
                .await?;
        }
        Ok(())
    }

    /// Writes a checkpoint of the current state now (at open, and from `strata check --repair`).
    pub async fn checkpoint_now(&self) -> Result<()> {
        let mut committer = self.committer.lock().await;
        let (stream, upto, carries_new, data) = {
            let mut shared = self.write_shared();
            let upto = shared.next_txn;
            shared.pending = PendingBatch::new(upto);
            shared.pending_needs_barrier = false;
            shared.pending_covered = false;
            let data = std::mem::take(&mut shared.pending_data);
            let mut stream = Vec::new();
            encode_checkpoint(&shared.state, &mut stream);
            (stream, upto, upto > shared.durable_txn, data)
        };
        let result = async {
            // The data pending transactions point at, before the barrier that covers it.
            strata_core::write_all(&*self.device, data).await?;
            self.data_barrier().await?;
            self.write_checkpoint(&mut committer, &stream, upto, carries_new)
                .await
        }
        .await;
        let mut shared = self.write_shared();
        match result {
            Ok(()) => {
                shared.durable_txn = upto;
                Ok(())
            }
            Err(error) => {
                shared.failed = Some(Failure::of(&error));
                Err(error)
            }
        }
    }

    /// Commits every `interval` while there is something to commit, until the committer is
    /// stopped ([`MetaStore::background`]) or the store dropped. The timer bounds how much
    /// acknowledged-but-unflushed metadata a crash loses. Each commit is one step: a quiesce
    /// waits for the commit under way and holds the next.
    pub fn spawn_committer(self: &Arc<Self>, runtime: Arc<dyn Runtime>, interval: Duration) {
        let store: Weak<MetaStore> = Arc::downgrade(self);
        let sleeper = runtime.clone();
        self.background.spawn(runtime.as_ref(), |worker| async move {
            while worker.sleep(sleeper.as_ref(), interval).await {
                let Some(_step) = worker.step().await else { return };
                let Some(store) = store.upgrade() else { return };
                if store.uncommitted() == 0 {
                    continue;
                }
                if let Err(error) = store.commit().await {
                    tracing::error!(store = %store.options.name, %error, "timed metadata commit failed");
                    return;
                }
            }
        });
    }

    /// The store's background work (the timed committer): quiesce, resume, stop.
    pub fn background(&self) -> &Background {
        &self.background
    }

    /// Usage and limits of the checkpoint space.
    pub fn space(&self) -> SpaceReport {
        let shared = self.read_shared();
        SpaceReport {
            capacity_bytes: self.capacity_bytes(),
            used_bytes: shared.state.encoded_bytes(),
            reserve_bytes: self.reserve_bytes(),
            low_water_bytes: self.low_water_bytes,
            low_space: shared.low_space,
            failed: shared.failed.as_ref().map(|f| f.reason.clone()),
        }
    }

    pub fn counters(&self) -> &MetaCounters {
        &self.counters
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Journal blocks a batch sequence may fill before a checkpoint: half the journal area,
    /// since every batch is written twice. (An open store has always written its version 2
    /// checkpoint already: open and format both end with one.)
    pub fn journal_capacity_blocks(&self) -> u64 {
        self.layout.journal_blocks / 2
    }
}

/// Applies `ops` in order; undoes them all if one fails or the state ends above `limit`.
fn apply_all(state: &mut State, ops: &[Op], limit: u64) -> Result<()> {
    let mut undos: Vec<Undo> = Vec::with_capacity(ops.len());
    let mut failure = None;
    for op in ops {
        match state.apply(op) {
            Ok(undo) => undos.push(undo),
            Err(error) => {
                failure = Some(BlockError::InvalidArgument(format!(
                    "metadata op {op:?}: {error}"
                )));
                break;
            }
        }
    }
    if failure.is_none() && state.encoded_bytes() > limit {
        failure = Some(BlockError::NoSpace);
    }
    let Some(error) = failure else {
        return Ok(());
    };
    for undo in undos.into_iter().rev() {
        state.undo(undo);
    }
    Err(error)
}

/// Why a store stopped: what happened, and the error whose kind later refusals keep.
struct Failure {
    reason: String,
    kind: BlockError,
}

impl Failure {
    fn of(error: &BlockError) -> Failure {
        Failure {
            reason: error.to_string(),
            kind: error.recur(String::new()),
        }
    }

    /// The refusal of a call to the failed store: the kind of the failure that stopped it
    /// (a full device stays ENOSPC for the client, a medium error EIO), with what happened.
    fn refusal(&self, name: &str) -> BlockError {
        self.kind.recur(format!(
            "metadata store {name} failed earlier ({}); reopen to recover",
            self.reason
        ))
    }
}

fn random_u64() -> u64 {
    strata_core::os_random_u64()
}

/// A first generation from 64 random bits, with room below 2^63 for every checkpoint a store
/// will write.
fn generation_from(bits: u64) -> u64 {
    (bits >> 16) + 1
}

fn random_generation() -> u64 {
    generation_from(random_u64())
}

/// A random (version 4) UUID, for stores and hierarchies.
pub fn random_uuid() -> [u8; 16] {
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&random_u64().to_le_bytes());
    uuid[8..].copy_from_slice(&random_u64().to_le_bytes());
    uuid[6] = (uuid[6] & 0x0f) | 0x40; // version 4
    uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 4122 variant
    uuid
}
