//! The brick's store: prepare, decide, read, versions, and recovery at open.
//!
//! Each 4 KiB unit of the share lives where the `map` table says, or at its home when the map
//! says nothing (format 2, `docs/brick-format.md`). A prepare writes to free units; a commit
//! maps them in one metadata transaction, so an interval's data is written once. The unit a
//! commit replaces is freed, or kept by a version (`map::keeper`).
//!
//! # Lock rules
//!
//! Prepares, decisions and forgets run concurrently, so that they share the metadata store's
//! group commits and their device I/O overlaps. What keeps them correct:
//! - **The mem lock is held only for in-memory work, `MetaStore::read` and
//!   `MetaStore::transact`**, never across device I/O or `meta.commit().await` (it is a `std`
//!   mutex: a guard held across an await would make the RPC futures `!Send`, so the compiler
//!   refuses it). A change to the metadata and the matching change to `Mem` are made under one
//!   hold, so what `Mem` says is always what the metadata says, durable or not.
//! - **An answer waits for what it saw to be durable**: every vote, decision, status and
//!   in-doubt list calls `meta.commit()` after its last look at `Mem` (cheap when nothing is
//!   pending), because `Mem` may hold another request's transaction not yet durable. A `No`
//!   needs no commit: it only ever aborts.
//! - **A prepare is admitted twice.** Under the lock: the forgotten mark, `prepare_action`,
//!   the fences, then units are allocated and the id marked `preparing`. The data's checksums
//!   are computed outside the lock; then, under it again, the same checks run once more (an
//!   abort or a forget may have arrived, or a newer epoch been recorded meanwhile) before the
//!   record goes into the same transaction as its newer epochs. The data itself is written by
//!   the metadata commit that carries the record, in the same call as its journal batch. A
//!   duplicate prepare, or a commit, of an id being prepared waits for it; an abort is
//!   recorded at once, and the prepare's second check then refuses.
//! - **Commits carried by a prepare** (`prepare_carrying`) are applied before it, each as a
//!   decision is, but answered only with the prepare, once its metadata commit has made them
//!   durable too.
//! - **A commit is one transaction**: the map takes the interval's units, the replaced units
//!   go to a version or to `freeing`, and the record becomes an `applied` tombstone. It is
//!   acknowledged once durable. Units a write covers only in part are first filled in around
//!   it from the current data; a crash before the transaction is durable leaves the interval
//!   prepared, and the fill is redone from the same current data.
//! - **Units are freed only once the transaction that frees them is durable** (until then a
//!   crash brings back what points at them) **and every read that started before it has
//!   ended** (a read may have looked the unit up just before). An abort commits, then frees;
//!   a prepare short of space commits, or waits for reads, to free them.
//! - **Commits that share a unit are never applying at once**: the second fills its units in
//!   from the first's result. A commit waits until no interval it shares a unit with is
//!   `applying` (from its decision to its transaction). Per unit, commits then land in the
//!   order they were decided, which for the bricks of one volume is the lock order.
//! - **No lost wake-ups.** A waiter registers `changed.notified()` before it takes the lock
//!   to look, and whoever clears a `preparing` mark or an `applying` entry, or ends a read,
//!   calls `notify_waiters` after changing `Mem`: a change before the look is seen, one after
//!   it wakes the waiter.
//! - A commit whose fill-in fails leaves its interval `applying` and marked failed: the
//!   commits that share a unit with it are refused with an error until the brick is reopened
//!   (the interval is still prepared there, and is resolved again).
//! - **Versions** (`versions.rs`) are changed under the same lock, one transaction per step;
//!   a roll-back or a deletion records what it is doing first, and an open finishes it.

mod apply;
mod map;
mod open;
mod refusal;
mod summary;
pub(crate) mod versions;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{Bytes, BytesMut};
use strata_cluster::interval::{
    decide_action, prepare_action, DecideAction, Decision, IntervalId, PrepareAction, Status,
};
use strata_core::{BlockError, DeviceRef, Result, WriteFlags};
use strata_meta::{FormatOptions, MetaStore, ObjectId, StoreOptions, TxnClass};

use crate::commit::OVERLAP_REFUSAL;
use crate::failstop::{DiskHealth, FailStop};
use crate::layout::BrickLayout;
use crate::record::{blob_name, IntervalRecord, RecordState, StagedCrc, StagedExtent};
use crate::space::{FreeSpace, UNIT};
pub use refusal::PrepareRefusal;
use refusal::RefusalCounts;
pub use summary::{BrickSummary, StepKind, StepProgress, Units};
use versions::VersionsBlob;

/// The owner written in the metadata superblock: an open refuses any other.
pub const OWNER: &str = "strata brick";
/// Writes are whole sectors: the smallest unit a device writes without a read before.
pub const SECTOR: u64 = 512;
pub(crate) const LAYOUT_BLOB: &str = "layout";
/// Per client, the sequence number below which its intervals are forgotten (see `forget`).
const FORGOTTEN_TABLE: &str = "forgotten";
/// Per lock segment of the volume, the newest claim epoch a prepare carried (fencing).
const EPOCHS_TABLE: &str = "epochs";
/// Clients whose intervals the bricks resolve among themselves: nothing more is taken from
/// them (see `fence_client`).
const FENCED_TABLE: &str = "fenced";
/// Per unit of the share (its index), the device offset of the unit holding its data, for
/// units that are not at home.
pub(crate) const MAP_TABLE: &str = "map";

#[derive(Clone, Debug)]
pub struct BrickOptions {
    pub meta_bytes: u64,
    pub home_bytes: u64,
    pub min_staging_bytes: u64,
}

/// A brick's answer to a prepare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Vote {
    Yes,
    /// No, and why (already decided, no staging space, ...). The client aborts.
    No(String),
}

/// A version of the brick's share: the content it had at the volume's cut `number`, kept
/// while newer writes land (docs/brick-format.md, "Versions").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionInfo {
    pub number: u64,
    /// Bytes of old data this version keeps from being freed.
    pub held_bytes: u64,
}

/// What an open found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Prepared intervals with no decision: in doubt until their client or their peers say.
    pub in_doubt: usize,
    /// Committed intervals of a format-1 brick whose copy home was redone.
    pub redone: usize,
    /// Decided intervals kept to answer peers.
    pub tombstones: usize,
    /// Prepares whose record was found without all of its staged data (the power failed
    /// before the flush that acknowledges a prepare), aborted at the open.
    pub unlanded: usize,
    /// A brick of an older format was upgraded to this build's.
    pub upgraded: bool,
    /// A roll-back or a version's deletion a crash interrupted, finished.
    pub finished: Option<String>,
}

struct Live {
    record: IntervalRecord,
    blob: ObjectId,
}

/// A committed interval whose transaction is not made yet.
struct Applying {
    /// The units of the share it maps (their home device offsets), sorted.
    units: Vec<u64>,
    /// Its fill-in failed: commits sharing a unit are refused until the brick is reopened.
    failed: bool,
}

/// Units to free once transactions below `txn` are durable and the reads before `reads`
/// have ended.
struct Freeing {
    txn: u64,
    reads: u64,
    units: Vec<u64>,
}

struct Mem {
    intervals: BTreeMap<IntervalId, Live>,
    space: FreeSpace,
    forgotten: BTreeMap<u64, u64>,
    epochs: BTreeMap<u32, i64>,
    fenced: BTreeSet<u64>,
    /// Admitted prepares whose record is not made yet (their data is being staged), with
    /// their tags.
    preparing: BTreeMap<IntervalId, u64>,
    /// From a commit's decision to its transaction (see the lock rules).
    applying: BTreeMap<IntervalId, Applying>,
    freeing: Vec<Freeing>,
    /// The versions kept here, by number: each one's table of the units it keeps a copy of.
    versions: BTreeMap<u64, ObjectId>,
    /// The newest version number ever created here, and the step in progress.
    versions_blob: VersionsBlob,
    /// Reads in progress, by ticket (see the lock rules).
    reads: BTreeSet<u64>,
    next_read: u64,
    /// The latest roll-back or deletion run since the open, with how far it got.
    step: Option<StepProgress>,
}

impl Mem {
    fn version_numbers(&self) -> BTreeSet<u64> {
        self.versions.keys().copied().collect()
    }

    /// The oldest read still running, or the next ticket when none is.
    fn oldest_read(&self) -> u64 {
        self.reads.first().copied().unwrap_or(self.next_read)
    }
}

/// What a prepare's admission checks decided.
enum Admission {
    Record,
    Repeat,
    No(PrepareRefusal, String),
}

/// What a prepare does once the lock is released, before its data is staged.
enum Admitted {
    /// A prepare of the same interval is running, or units wait for reads to end: wait, then
    /// look again.
    Wait,
    /// Make the frees of applied intervals durable, then look again.
    Commit,
    /// Write the data to these runs of units.
    Staging(Vec<(u64, u64)>),
    Answer(Vote),
}

/// What a decision does once the lock is released.
enum Step {
    /// Wait for a `preparing` mark or an `applying` entry to go, then look again.
    Wait,
    /// Answer once what was seen is durable.
    Answer(bool),
    /// The abort's tombstone is in; free these units once it is durable.
    Free(Vec<u64>),
    /// The commit is decided (and the interval `applying`): fill in, map, make it durable.
    Apply(ObjectId, IntervalRecord),
}

pub struct BrickStore {
    device: DeviceRef,
    meta: Arc<MetaStore>,
    layout: BrickLayout,
    forgotten_table: ObjectId,
    epochs_table: ObjectId,
    fenced_table: ObjectId,
    map_table: ObjectId,
    versions_blob: ObjectId,
    /// Held only for in-memory work and `transact` (see the lock rules).
    mem: Mutex<Mem>,
    /// Told whenever a `preparing` mark or an `applying` entry goes, or a read ends.
    changed: tokio::sync::Notify,
    /// Entries a roll-back or a deletion moves per transaction.
    step_entries: usize,
    /// Whether `device` has failed: the brick then answers nothing (`failstop`).
    disk: Arc<DiskHealth>,
    /// Prepares voted no since the open, by class.
    refusals: RefusalCounts,
    /// Test-only ([`BrickSettings::unsafe_skip_data_barrier`]): filled-in units are not
    /// flushed before the commit's map points at them.
    skip_data_flush: bool,
    /// Test-only ([`BrickSettings::yields_while_staging`]).
    yields_while_staging: usize,
}

/// How a store runs (as opposed to how it is laid out, [`BrickOptions`]).
#[derive(Clone, Debug, Default)]
pub struct BrickSettings {
    /// Test-only: commit records without making the staged data they point to durable with
    /// them. This plants the ordering bug the crash harness must catch.
    #[doc(hidden)]
    pub unsafe_skip_data_barrier: bool,
    /// Test-only: at open, trust every prepared record without checking its data against
    /// its checksums. This plants the bug the checksums are there for: a prepare whose record
    /// landed without its data is served as prepared.
    #[doc(hidden)]
    pub unsafe_skip_checksums: bool,
    /// Test-only: entries a roll-back or a deletion moves per transaction (0: the default),
    /// small so that the crash harness cuts power between its transactions.
    #[doc(hidden)]
    pub step_entries: usize,
    /// Test-only: at most how many times a prepare yields between its admission and its
    /// record (at least once when set). A prepare
    /// does no I/O there (its data is written with its record, `stage`), but on a
    /// multi-threaded runtime other requests run beside it while it checksums its data;
    /// yielding lets a single-threaded test meet those races (an abort, or a newer epoch,
    /// arriving meanwhile), which the prepare's second admission check is there for.
    #[doc(hidden)]
    pub yields_while_staging: usize,
}

fn store_options(settings: &BrickSettings) -> StoreOptions {
    let mut options = StoreOptions::new("brick metadata");
    // Staged data must be on the medium before the record that points to it, and filled-in
    // units before the map that points to them. The metadata is on the data's own device,
    // which the store flushes before every commit: naming it again as a data device flushed
    // it twice per commit, the second flush finding nothing to write but costing a trip to
    // a blocking thread.
    options.unsafe_skip_data_barrier = settings.unsafe_skip_data_barrier;
    options
}

fn corrupt(what: impl std::fmt::Display) -> BlockError {
    BlockError::Corrupt(format!("brick: {what}"))
}

/// A read registered in `Mem::reads`: ends (and wakes those waiting for units) when dropped.
struct ReadTicket<'a> {
    store: &'a BrickStore,
    ticket: u64,
}

impl Drop for ReadTicket<'_> {
    fn drop(&mut self) {
        let mut mem = self.store.lock();
        mem.reads.remove(&self.ticket);
        drop(mem);
        self.store.changed.notify_waiters();
    }
}

impl BrickStore {
    /// Lays a new, empty brick on `device`. Refused if the device already holds Strata
    /// metadata of any kind, unless `overwrite`: a brick is never formatted over data by
    /// accident.
    pub async fn format(
        device: DeviceRef,
        options: &BrickOptions,
        overwrite: bool,
    ) -> Result<BrickStore> {
        Self::format_with(device, options, overwrite, &BrickSettings::default()).await
    }

    pub async fn format_with(
        device: DeviceRef,
        options: &BrickOptions,
        overwrite: bool,
        settings: &BrickSettings,
    ) -> Result<BrickStore> {
        let (device, disk) = FailStop::wrap(device);
        let size = device.geometry().size;
        let layout = BrickLayout::plan(
            size,
            options.meta_bytes,
            options.home_bytes,
            options.min_staging_bytes,
        )
        .map_err(BlockError::InvalidArgument)?;
        if !overwrite {
            if let Ok(found) = strata_meta::recover(device.as_ref(), 0).await {
                return Err(BlockError::InvalidArgument(format!(
                    "the device holds Strata metadata (owner {:?}); refusing to format a brick over it",
                    found.superblock.owner
                )));
            }
        }
        let meta = MetaStore::format(
            device.clone(),
            0,
            layout.meta_bytes,
            FormatOptions::new(OWNER),
            store_options(settings),
        )
        .await?;
        meta.transact(TxnClass::Normal, |_, txn| {
            let blob = txn.create_blob(LAYOUT_BLOB);
            txn.put_blob(blob, layout.encode());
            txn.create_table(FORGOTTEN_TABLE, 8);
            txn.create_table(EPOCHS_TABLE, 8);
            txn.create_table(FENCED_TABLE, 8);
            txn.create_table(MAP_TABLE, 8);
            let versions = txn.create_blob(versions::BLOB);
            txn.put_blob(versions, VersionsBlob::default().encode());
            Ok(())
        })?;
        meta.commit().await?;
        tracing::info!(?layout, "brick formatted");
        let (store, _) = BrickStore::load(device, disk, meta, settings).await?;
        Ok(store)
    }

    /// Opens a brick: recovers its metadata, checks every record, the map and the versions,
    /// upgrades a format-1 brick, and finishes a roll-back or deletion a crash interrupted.
    /// Damage anywhere refuses the brick, naming what.
    pub async fn open(device: DeviceRef) -> Result<(BrickStore, OpenReport)> {
        Self::open_with(device, &BrickSettings::default()).await
    }

    pub async fn open_with(
        device: DeviceRef,
        settings: &BrickSettings,
    ) -> Result<(BrickStore, OpenReport)> {
        let (device, disk) = FailStop::wrap(device);
        let recovered = strata_meta::recover(device.as_ref(), 0)
            .await
            .map_err(|e| corrupt(format_args!("its metadata does not recover: {e}")))?;
        if recovered.superblock.owner != OWNER {
            return Err(BlockError::InvalidArgument(format!(
                "the device's metadata belongs to {:?}, not to a brick",
                recovered.superblock.owner
            )));
        }
        let (meta, _) =
            MetaStore::open_recovered(device.clone(), recovered, store_options(settings)).await?;
        BrickStore::load(device, disk, meta, settings).await
    }

    /// The error that failed the brick's disk, if it has: the brick then refuses every
    /// request, and its service answers as a brick that is down.
    pub fn disk_failure(&self) -> Option<String> {
        self.disk.failure().map(str::to_string)
    }

    pub fn layout(&self) -> BrickLayout {
        self.layout
    }

    /// The metadata store's counters: commits, journal batches, checkpoints, commit time.
    pub fn metadata_counters(&self) -> strata_meta::CountersSnapshot {
        self.meta.counters().snapshot()
    }

    /// Prepares voted no since the brick was opened, by class.
    pub fn prepare_refusals(&self) -> Vec<(PrepareRefusal, u64)> {
        self.refusals.snapshot()
    }

    /// A prepare's `No`, counted by class.
    fn refuse(&self, class: PrepareRefusal, why: String) -> Vote {
        self.refusals.count(class);
        Vote::No(why)
    }

    /// Free space for prepares, in bytes, once the frees of applied intervals are durable.
    pub async fn staging_free(&self) -> u64 {
        // A failed commit frees nothing: `reclaim` frees only what is durable.
        let _ = self.meta.commit().await;
        let mut mem = self.lock();
        self.reclaim(&mut mem);
        mem.space.free_bytes()
    }

    /// Frees the units whose freeing transaction is durable and whose readers are gone.
    fn reclaim(&self, mem: &mut Mem) {
        let durable = self.meta.durable_txn();
        let oldest_read = mem.oldest_read();
        let (free, keep) = std::mem::take(&mut mem.freeing)
            .into_iter()
            .partition(|f| f.txn <= durable && f.reads <= oldest_read);
        mem.freeing = keep;
        for freeing in free {
            mem.space.release_units(freeing.units);
        }
    }

    /// Queues units to be freed once the transaction just made is durable and the reads
    /// running now have ended.
    fn free_later(&self, mem: &mut Mem, units: Vec<u64>) {
        if !units.is_empty() {
            let txn = self.meta.next_txn();
            let reads = mem.next_read;
            mem.freeing.push(Freeing { txn, reads, units });
        }
    }

    /// A panic under the lock (a unit freed twice) is a bug that already failed its
    /// request; the others go on, as the metadata store's own lock does.
    fn lock(&self) -> MutexGuard<'_, Mem> {
        self.mem.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_home(&self, offset: u64, len: u64) -> Result<()> {
        if !offset.is_multiple_of(SECTOR) || !len.is_multiple_of(SECTOR) || len == 0 {
            return Err(BlockError::InvalidArgument(format!(
                "write [{offset}, +{len}) is not in whole {SECTOR}-byte sectors"
            )));
        }
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.layout.home_bytes)
        {
            return Err(BlockError::OutOfRange {
                offset,
                len,
                size: self.layout.home_bytes,
            });
        }
        Ok(())
    }

    /// Prepares an interval that precedes any version (tag 0); see [`Self::prepare_tagged`].
    pub async fn prepare(
        &self,
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
    ) -> Result<Vote> {
        self.prepare_tagged(id, bricks, writes, fences, 0).await
    }

    /// Prepares an interval: stages its writes (offsets within the share) in free units and
    /// records them durably, then votes. `bricks` lists every brick of the interval; `fences`
    /// the claim epoch of each lock segment the client holds its locks under. An epoch older
    /// than one seen for its segment is refused: its holder lost the claim to a newer one.
    /// `tag` is the version cut the interval follows: version `n` holds exactly the intervals
    /// tagged below `n`.
    pub async fn prepare_tagged(
        &self,
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<Vote> {
        for (offset, data) in &writes {
            self.check_home(*offset, data.len() as u64)?;
        }
        let total = map::units_needed(&writes) * UNIT;
        let runs = loop {
            let changed = self.changed.notified();
            let admitted = {
                let mut mem = self.lock();
                self.reclaim(&mut mem);
                if mem.preparing.contains_key(&id) {
                    // A duplicate (the client sent it again): answered as a repeat once the
                    // first is recorded, or as the first was refused.
                    Admitted::Wait
                } else {
                    match self.admit(&mem, id, &writes, fences, tag) {
                        Admission::No(class, why) => Admitted::Answer(self.refuse(class, why)),
                        Admission::Repeat => Admitted::Answer(Vote::Yes),
                        Admission::Record => match mem.space.allocate(total) {
                            Some(runs) => {
                                mem.preparing.insert(id, tag);
                                Admitted::Staging(runs)
                            }
                            None => {
                                let durable = self.meta.durable_txn();
                                if mem.freeing.iter().any(|f| f.txn > durable) {
                                    Admitted::Commit
                                } else if !mem.freeing.is_empty() {
                                    // Freed units wait only for reads to end.
                                    Admitted::Wait
                                } else {
                                    let why = no_space(&mem, total);
                                    Admitted::Answer(self.refuse(PrepareRefusal::NoSpace, why))
                                }
                            }
                        },
                    }
                }
            };
            match admitted {
                Admitted::Wait => changed.await,
                Admitted::Commit => self.meta.commit().await?,
                Admitted::Staging(runs) => break runs,
                Admitted::Answer(Vote::Yes) => {
                    self.meta.commit().await?;
                    return Ok(Vote::Yes);
                }
                Admitted::Answer(no) => return Ok(no),
            }
        };
        let mut extents = map::place(&writes, &runs, self.layout.home_offset);
        let staged = self.stage(&writes, &mut extents);
        if self.yields_while_staging > 0 {
            // From 1 to n, varying from one interval to the next, so that prepares sent
            // together also record in another order than they were admitted.
            let varied = id.seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
            for _ in 0..=(varied % self.yields_while_staging as u64) {
                tokio::task::yield_now().await;
            }
        }
        let outcome = {
            let mut mem = self.lock();
            mem.preparing.remove(&id);
            self.changed.notify_waiters();
            let outcome: Result<Option<Vote>> = match self.admit(&mem, id, &writes, fences, tag) {
                Admission::No(class, why) => Ok(Some(self.refuse(class, why))),
                // Only a prepare records a prepared interval, and a duplicate waited: kept
                // for completeness, this answers as a repeat.
                Admission::Repeat => Ok(Some(Vote::Yes)),
                Admission::Record => {
                    let record = IntervalRecord {
                        state: RecordState::Prepared,
                        tag,
                        bricks,
                        extents,
                    };
                    self.record_prepared(id, &record, fences, staged)
                        .map(|blob| {
                            mem.intervals.insert(id, Live { record, blob });
                            for &(segment, epoch) in fences {
                                let newest = mem.epochs.entry(segment).or_insert(epoch);
                                *newest = (*newest).max(epoch);
                            }
                            None
                        })
                }
            };
            if !matches!(outcome, Ok(None)) {
                // Nothing durable points at these units: free at once.
                for &(start, len) in &runs {
                    mem.space.release(start, len);
                }
            }
            outcome
        };
        match outcome? {
            Some(Vote::No(why)) => Ok(Vote::No(why)),
            Some(Vote::Yes) | None => {
                self.meta.commit().await?;
                Ok(Vote::Yes)
            }
        }
    }

    /// A prepare's checks, run when it is admitted and again before its record is made.
    fn admit(
        &self,
        mem: &Mem,
        id: IntervalId,
        writes: &[(u64, Bytes)],
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Admission {
        if let Some(pending) = mem.versions_blob.pending {
            return Admission::No(
                PrepareRefusal::Busy,
                format!("the brick is busy: {}", pending.describe()),
            );
        }
        if mem.fenced.contains(&id.client) {
            return Admission::No(PrepareRefusal::Fenced, fenced_client(id.client));
        }
        if tag < mem.versions_blob.sealed {
            return Admission::No(
                PrepareRefusal::Tag,
                format!(
                "version {} is sealed here: interval {id:?}, tagged {tag}, would change it (its \
                 host's lease ran out before the version was taken?)",
                mem.versions_blob.sealed
            ),
            );
        }
        if tag > mem.versions_blob.newest + versions::MAX_VERSIONS_AHEAD {
            return Admission::No(
                PrepareRefusal::Tag,
                format!(
                    "version tag {tag} is more than {} ahead of this brick's newest version, {}",
                    versions::MAX_VERSIONS_AHEAD,
                    mem.versions_blob.newest
                ),
            );
        }
        if mem
            .forgotten
            .get(&id.client)
            .is_some_and(|&below| id.seq < below)
        {
            return Admission::No(
                PrepareRefusal::Late,
                format!("interval {id:?} is older than its client's forgotten mark"),
            );
        }
        let status = mem.intervals.get(&id).map(|l| l.record.state.status());
        match prepare_action(status) {
            PrepareAction::Repeat => return Admission::Repeat,
            PrepareAction::Refuse => {
                return Admission::No(
                    PrepareRefusal::Late,
                    format!("interval {id:?} is already decided"),
                )
            }
            PrepareAction::Record => {}
        }
        if let Some((segment, epoch, newest)) = fences.iter().find_map(|&(segment, epoch)| {
            let newest = *mem.epochs.get(&segment)?;
            (epoch < newest).then_some((segment, epoch, newest))
        }) {
            tracing::warn!(?id, segment, epoch, newest, "prepare fenced");
            return Admission::No(
                PrepareRefusal::Fenced,
                format!(
                "fenced: segment {segment} was claimed at epoch {newest}, after the client's {epoch}"
            ),
            );
        }
        // Another client's interval over the same bytes, prepared here and undecided: its
        // client died or paused inside its commit, or owes this brick the decision. Until it
        // is decided, a later interval must not be staged behind it, or the earlier one's
        // commit could still land on top. The client waits and tries again.
        if let Some(other) = mem.intervals.iter().find_map(|(&other, live)| {
            (other.client != id.client
                && live.record.state == RecordState::Prepared
                && overlaps(&live.record.extents, writes, self.layout.home_offset))
            .then_some(other)
        }) {
            return Admission::No(
                PrepareRefusal::Overlap,
                format!("interval {id:?} {OVERLAP_REFUSAL} ({other:?}) held here"),
            );
        }
        Admission::Record
    }

    /// Makes the data written so far durable, before a transaction made with
    /// `transact_data_durable` points at it (a commit's filled-in units).
    async fn flush_data(&self) -> Result<()> {
        if self.skip_data_flush {
            return Ok(());
        }
        self.device.flush().await
    }

    /// Cuts each write's bytes into the device writes of its extents (`place` cut them in
    /// order) and sets each extent's checksum. Nothing is written here: the metadata commit
    /// that carries the record writes this data and its journal batch in one call, then
    /// flushes the device once (`transact_data_covered_with`), which makes the data durable
    /// with the record. Each prepare used to sync its own data first, a second sync in a row
    /// at one outstanding, and then to write it in a call of its own, a second trip to the
    /// device. A crash before that flush may keep the record without its data; such a
    /// prepare was never acknowledged, and the checksums let the open find it and abort it
    /// (`open::abort_unlanded`).
    fn stage(&self, writes: &[(u64, Bytes)], extents: &mut [StagedExtent]) -> Vec<(u64, Bytes)> {
        let mut pieces = Vec::new();
        let mut extents = extents.iter_mut();
        for (_, bytes) in writes {
            let mut used = 0;
            while used < bytes.len() {
                let extent = extents.next().expect("the extents cover the writes");
                let end = used + extent.len as usize;
                let piece = bytes.slice(used..end);
                extent.crc = Some(StagedCrc::of(&piece));
                self.cut(&mut pieces, extent.staging, piece);
                used = end;
            }
        }
        pieces
    }

    fn record_new(&self, id: IntervalId, record: &IntervalRecord) -> Result<ObjectId> {
        let name = blob_name(id);
        let encoded = record.encode();
        self.meta.transact(TxnClass::Normal, |_, txn| {
            let blob = txn.create_blob(&name);
            txn.put_blob(blob, encoded);
            Ok(blob)
        })
    }

    /// The prepared record and the newer epochs it carries, in one transaction; `staged` is
    /// the data it points at, written by the commit that makes it durable (`stage`).
    fn record_prepared(
        &self,
        id: IntervalId,
        record: &IntervalRecord,
        fences: &[(u32, i64)],
        staged: Vec<(u64, Bytes)>,
    ) -> Result<ObjectId> {
        let name = blob_name(id);
        let encoded = record.encode();
        let epochs = self.epochs_table;
        self.meta
            .transact_data_covered_with(TxnClass::Normal, staged, |state, txn| {
                let blob = txn.create_blob(&name);
                txn.put_blob(blob, encoded);
                let table = state.table(epochs).expect("checked at open");
                for &(segment, epoch) in fences {
                    let seen = table.get(u64::from(segment)).map_or(i64::MIN, |v| {
                        u64::from_le_bytes(v.try_into().unwrap()) as i64
                    });
                    if epoch > seen {
                        txn.set(epochs, u64::from(segment), &(epoch as u64).to_le_bytes());
                    }
                }
                Ok(blob)
            })
    }

    fn record_update(
        &self,
        blob: ObjectId,
        record: &IntervalRecord,
        class: TxnClass,
    ) -> Result<()> {
        let encoded = record.encode();
        self.meta.transact(class, |_, txn| {
            txn.put_blob(blob, encoded);
            Ok(())
        })
    }

    /// Applies the client's decision. `Ok(false)` when the rules refuse it: a commit of an
    /// interval this brick never prepared, a decision contrary to the one recorded, or a
    /// client fenced here (its peers resolve its intervals).
    pub async fn decide(&self, id: IntervalId, decision: Decision) -> Result<bool> {
        self.decide_as(id, decision, false).await
    }

    /// Applies a decision a brick resolved for an interval in doubt: taken from a fenced
    /// client's interval too.
    pub async fn decide_resolved(&self, id: IntervalId, decision: Decision) -> Result<bool> {
        self.decide_as(id, decision, true).await
    }

    async fn decide_as(&self, id: IntervalId, decision: Decision, resolved: bool) -> Result<bool> {
        self.decide_with(id, decision, resolved, true).await
    }

    /// Applies the commits a prepare carries (`carried`: its client's earlier intervals, each
    /// voted yes by every brick), then the prepare. The commits' transactions are made durable
    /// by the prepare's own metadata commit, with its record and staged data: one durable
    /// write answers both, where a commit sent alone costs one of its own. Returns the vote,
    /// and for each carried commit, in order, whether it is applied and durable (a `decide`'s
    /// answer; an error applying one answers `false`, and the client owes it to this brick,
    /// as for a `Decide` that failed).
    pub async fn prepare_carrying(
        &self,
        carried: &[IntervalId],
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<(Vote, Vec<bool>)> {
        if let Some(other) = carried.iter().find(|c| c.client != id.client) {
            return Err(BlockError::InvalidArgument(format!(
                "prepare of {id:?} carries the commit of {other:?}, another client's interval"
            )));
        }
        let mut committed = Vec::with_capacity(carried.len());
        for &earlier in carried {
            committed.push(
                match self
                    .decide_with(earlier, Decision::Commit, false, false)
                    .await
                {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(interval = ?earlier, %error, "carried commit failed");
                        false
                    }
                },
            );
        }
        let vote = self.prepare_tagged(id, bricks, writes, fences, tag).await?;
        if !carried.is_empty() {
            // A yes has made everything before it durable already; a no makes nothing so.
            self.meta.commit().await?;
        }
        Ok((vote, committed))
    }

    /// `durable`: the answer waits until the decision is durable. Without it, the caller
    /// makes it durable (`meta.commit()`) before it tells anyone the answer.
    async fn decide_with(
        &self,
        id: IntervalId,
        decision: Decision,
        resolved: bool,
        durable: bool,
    ) -> Result<bool> {
        loop {
            let changed = self.changed.notified();
            let step = {
                let mut mem = self.lock();
                if !resolved && mem.fenced.contains(&id.client) {
                    tracing::warn!(?id, ?decision, "decision from a fenced client refused");
                    Step::Answer(false)
                } else {
                    self.decide_step(&mut mem, id, decision)?
                }
            };
            match step {
                Step::Wait => changed.await,
                Step::Answer(answer) => {
                    if durable {
                        self.meta.commit().await?;
                    }
                    return Ok(answer);
                }
                Step::Free(units) => {
                    self.meta.commit().await?;
                    // Freed only now: until the tombstone is durable, a crash brings the
                    // prepared record back, and its staged data must still be there.
                    self.lock().space.release_units(units);
                    // Reads held back by the interval (`until_decided`) go on.
                    self.changed.notify_waiters();
                    return Ok(true);
                }
                Step::Apply(blob, record) => {
                    self.apply(id, blob, &record).await?;
                    if durable {
                        self.meta.commit().await?;
                    }
                    return Ok(true);
                }
            }
        }
    }

    /// The part of a decision made under the lock.
    fn decide_step(&self, mem: &mut Mem, id: IntervalId, decision: Decision) -> Result<Step> {
        if decision == Decision::Commit && mem.preparing.contains_key(&id) {
            // Nothing sends a commit before this brick voted, but a duplicate prepare might
            // still be running when the first one's vote led to it: wait for the record.
            return Ok(Step::Wait);
        }
        let status = mem.intervals.get(&id).map(|l| l.record.state.status());
        match decide_action(status, decision) {
            DecideAction::Repeat { same } => Ok(Step::Answer(same)),
            DecideAction::Refuse => Ok(Step::Answer(false)),
            DecideAction::Remember => {
                if mem
                    .forgotten
                    .get(&id.client)
                    .is_some_and(|&below| id.seq < below)
                {
                    return Ok(Step::Answer(true));
                }
                // An interval still being prepared is recorded aborted now: its prepare
                // checks again before recording, finds the abort and votes no.
                let record = IntervalRecord::tombstone(RecordState::Aborted, Vec::new());
                let blob = self.record_new(id, &record)?;
                mem.intervals.insert(id, Live { record, blob });
                Ok(Step::Answer(true))
            }
            DecideAction::Drop => {
                let live = mem.intervals.get_mut(&id).expect("prepared");
                let freed = staged_units(&live.record.extents);
                let record =
                    IntervalRecord::tombstone(RecordState::Aborted, live.record.bricks.clone());
                self.record_update(live.blob, &record, TxnClass::Reclaim)?;
                live.record = record;
                Ok(Step::Free(freed))
            }
            DecideAction::Apply => {
                if let Some(applying) = mem.applying.get(&id) {
                    // The same commit, sent again while the first is filling in: answered
                    // when the first is, as a repeat.
                    if applying.failed {
                        return Err(apply_failure(id));
                    }
                    return Ok(Step::Wait);
                }
                let live = &mem.intervals[&id];
                let units = home_units(&live.record.extents);
                if let Some(busy) = mem
                    .applying
                    .values()
                    .find(|a| shares_unit(&a.units, &units))
                {
                    if busy.failed {
                        return Err(apply_failure(id));
                    }
                    return Ok(Step::Wait);
                }
                let record = live.record.clone();
                let blob = live.blob;
                mem.applying.insert(
                    id,
                    Applying {
                        units,
                        failed: false,
                    },
                );
                Ok(Step::Apply(blob, record))
            }
        }
    }

    /// A commit's fill-in failed: the interval stays `applying`, and what waits on it is
    /// woken to find it failed.
    fn apply_failed(&self, id: IntervalId) {
        let mut mem = self.lock();
        if let Some(applying) = mem.applying.get_mut(&id) {
            applying.failed = true;
        }
        self.changed.notify_waiters();
    }
    /// What this brick's log says of an interval, for a peer resolving it in doubt. `None`
    /// for an interval never prepared here or already forgotten (its client forgets only
    /// intervals ended on every brick, which no brick can be in doubt about), and for one
    /// whose prepare is still staging its data (it has voted nothing yet).
    ///
    /// Answered once what it says is durable. A brick whose metadata store has failed cannot
    /// make it so, and has no safe answer (each status leads a peer to decide), so it never
    /// answers, as a brick that is down: the peer's deadline keeps the interval in doubt.
    /// [`Self::try_status`] says why instead.
    pub async fn status(&self, id: IntervalId) -> Option<Status> {
        match self.try_status(id).await {
            Ok(status) => status,
            Err(error) => unanswerable("status", error).await,
        }
    }

    /// [`Self::status`], or the error that keeps it from being durable.
    pub async fn try_status(&self, id: IntervalId) -> Result<Option<Status>> {
        let status = {
            let mem = self.lock();
            mem.intervals.get(&id).map(|l| l.record.state.status())
        };
        self.meta.commit().await?;
        Ok(status)
    }

    /// Prepared intervals with no decision yet, with the bricks of each. Like
    /// [`Self::status`], never answered by a brick whose metadata store has failed.
    pub async fn in_doubt(&self) -> Vec<(IntervalId, Vec<u64>)> {
        match self.try_in_doubt().await {
            Ok(listed) => listed,
            Err(error) => unanswerable("in-doubt list", error).await,
        }
    }

    /// [`Self::in_doubt`], or the error that keeps it from being durable.
    pub async fn try_in_doubt(&self) -> Result<Vec<(IntervalId, Vec<u64>)>> {
        let listed = self.try_in_doubt_tagged().await?;
        Ok(listed
            .into_iter()
            .map(|(id, bricks, _)| (id, bricks))
            .collect())
    }

    /// [`Self::try_in_doubt`], with each interval's version tag: an administrator taking a
    /// version waits for those tagged below it.
    pub async fn try_in_doubt_tagged(&self) -> Result<Vec<(IntervalId, Vec<u64>, u64)>> {
        let listed = {
            let mem = self.lock();
            mem.intervals
                .iter()
                .filter(|(_, l)| l.record.state == RecordState::Prepared)
                .map(|(&id, l)| (id, l.record.bricks.clone(), l.record.tag))
                .collect()
        };
        self.meta.commit().await?;
        Ok(listed)
    }

    /// From now on, takes no prepare and no decision from `client`, durably: its lease ran out,
    /// and its peers are about to read this brick's state of its intervals to resolve them. A
    /// client paused past its lease could otherwise wake up and commit here after the peers
    /// read the interval as prepared and resolved it as aborted.
    pub async fn fence_client(&self, client: u64) -> Result<()> {
        {
            let mut mem = self.lock();
            if !mem.fenced.contains(&client) {
                let table = self.fenced_table;
                self.meta.transact(TxnClass::Reclaim, |_, txn| {
                    txn.set(table, client, &1u64.to_le_bytes());
                    Ok(())
                })?;
                mem.fenced.insert(client);
                tracing::info!(
                    client = format_args!("{client:x}"),
                    "client fenced: its intervals are resolved by the bricks"
                );
            }
        }
        // Durable before the answer, also when an earlier request recorded it: a prepare or
        // decision admitted before the fence is in the same or an earlier commit.
        self.meta.commit().await
    }

    /// The client says every interval of its below `seq` has ended on every brick: their
    /// tombstones go, and a late prepare of one is refused by the mark instead.
    pub async fn forget(&self, client: u64, below: u64) -> Result<usize> {
        let forgotten = {
            let mut mem = self.lock();
            let gone: Vec<(IntervalId, ObjectId)> = mem
                .intervals
                .range(IntervalId { client, seq: 0 }..IntervalId { client, seq: below })
                .filter(|(_, l)| !l.record.state.holds_staging())
                .map(|(&id, l)| (id, l.blob))
                .collect();
            let mark = mem.forgotten.get(&client).copied().unwrap_or(0).max(below);
            if mem.forgotten.get(&client) != Some(&mark) || !gone.is_empty() {
                let table = self.forgotten_table;
                self.meta.transact(TxnClass::Reclaim, |_, txn| {
                    txn.set(table, client, &mark.to_le_bytes());
                    for (_, blob) in &gone {
                        txn.delete(*blob);
                    }
                    Ok(())
                })?;
                mem.forgotten.insert(client, mark);
                for (id, _) in &gone {
                    mem.intervals.remove(id);
                }
            }
            gone.len()
        };
        // Also when nothing was left to do here: a concurrent forget may have raised the mark
        // this answer relies on without its commit being durable yet.
        self.meta.commit().await?;
        Ok(forgotten)
    }

    /// Writes the share in place at once, outside any interval, and flushes: the baseline
    /// intervals are measured against (`WriteDirect`). Not atomic, not ordered against
    /// intervals, and refused while the brick keeps versions (it would change their data).
    pub async fn write_direct(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        for (offset, data) in &writes {
            self.check_home(*offset, data.len() as u64)?;
        }
        let ticket = self.begin_read()?;
        if !self.lock().versions.is_empty() {
            return Err(BlockError::Unsupported(
                "direct writes to a brick that keeps versions: they would change the versions' data",
            ));
        }
        // Made durable in one call, as a prepare's staged data is (`stage`): the baseline
        // intervals are measured against gets the same single trip and sync.
        let mut pieces = Vec::new();
        for (offset, data) in writes {
            let mut done = 0;
            for (device, len) in self.locate(None, offset, data.len() as u64) {
                let len = len as usize;
                self.cut(&mut pieces, device, data.slice(done..done + len));
                done += len;
            }
        }
        let written = self.device.write_durable(pieces).await;
        drop(ticket);
        written
    }

    /// Reads the share (offsets within it): what committed intervals wrote, once no interval
    /// over these bytes is undecided here ([`Self::until_decided`]).
    pub async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.check_home(offset, len as u64)?;
        self.until_decided(offset, len as u64).await;
        self.read_mapped(None, offset, len).await
    }

    /// Waits until no interval prepared here over these bytes is undecided. Such an interval
    /// is committed once every brick holds it prepared, before any commit reaches this one
    /// (its client reported it ended at its last yes vote), so the bytes' data here may be
    /// old. They are served once the commit lands, or the abort, or the bricks resolve it
    /// (which needs its client fenced: a lease's length). The server bounds the wait.
    pub async fn until_decided(&self, offset: u64, len: u64) {
        loop {
            let changed = self.changed.notified();
            if self.undecided_over(offset, len).is_none() {
                return;
            }
            changed.await;
        }
    }

    /// The first interval prepared here and undecided over these bytes (share offsets).
    pub fn undecided_over(&self, offset: u64, len: u64) -> Option<IntervalId> {
        let (start, end) = (
            self.layout.home_offset + offset,
            self.layout.home_offset + offset + len,
        );
        self.lock().intervals.iter().find_map(|(&id, live)| {
            (live.record.state == RecordState::Prepared
                && (live.record.extents.iter())
                    .any(|e| e.home < end && start < e.home + u64::from(e.len)))
            .then_some(id)
        })
    }

    /// Reads the share as it is now (`None`) or as version `n` keeps it.
    async fn read_mapped(&self, version: Option<u64>, offset: u64, len: usize) -> Result<BytesMut> {
        let ticket = self.begin_read()?;
        if let Some(number) = version {
            if !self.lock().versions.contains_key(&number) {
                return Err(BlockError::InvalidArgument(format!(
                    "the brick keeps no version {number}"
                )));
            }
        }
        let mut out = BytesMut::with_capacity(len);
        for (device, piece) in self.locate(version, offset, len as u64) {
            out.extend_from_slice(&self.read_all(device, piece as usize).await?);
        }
        drop(ticket);
        Ok(out)
    }

    /// Registers a read, so that the units it looks up are not reused under it. Refused
    /// while a roll-back is half done.
    fn begin_read(&self) -> Result<ReadTicket<'_>> {
        let mut mem = self.lock();
        if let Some(pending) = mem.versions_blob.pending {
            if pending.is_rollback() {
                return Err(BlockError::io(
                    "brick read",
                    std::io::Error::other(format!(
                        "the brick is {}: its data is not readable until that is done",
                        pending.describe()
                    )),
                ));
            }
        }
        let ticket = mem.next_read;
        mem.next_read += 1;
        mem.reads.insert(ticket);
        Ok(ReadTicket {
            store: self,
            ticket,
        })
    }

    /// Where the bytes `[offset, +len)` of the share (or of a version of it) are on the
    /// device, as runs in order.
    fn locate(&self, version: Option<u64>, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let mem = self.lock();
        self.meta.read(|state| {
            let place = Placement {
                state,
                map: self.map_table,
                versions: &mem.versions,
                home_offset: self.layout.home_offset,
            };
            place.locate(version, offset, len)
        })
    }

    async fn write_all(&self, offset: u64, data: Bytes) -> Result<()> {
        let mut pieces = Vec::new();
        self.cut(&mut pieces, offset, data);
        for (offset, piece) in pieces {
            self.device
                .write(offset, piece, WriteFlags::default())
                .await?;
        }
        Ok(())
    }

    /// Appends `data`, to be written at `offset`, to `pieces` as writes of at most the
    /// device's `max_io`.
    fn cut(&self, pieces: &mut Vec<(u64, Bytes)>, offset: u64, data: Bytes) {
        let max = self.device.geometry().max_io as usize;
        let mut at = 0;
        while at < data.len() {
            let end = (at + max).min(data.len());
            pieces.push((offset + at as u64, data.slice(at..end)));
            at = end;
        }
    }

    async fn read_all(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let max = self.device.geometry().max_io as usize;
        let mut out = BytesMut::with_capacity(len);
        while out.len() < len {
            let piece = (len - out.len()).min(max);
            out.extend_from_slice(&self.device.read(offset + out.len() as u64, piece).await?);
        }
        Ok(out)
    }
}

/// Where the share's units are, as a metadata state says: the map, the versions' tables,
/// home. Read by the store under its lock, and by `inspect` from recovered metadata.
pub(crate) struct Placement<'a> {
    pub state: &'a strata_meta::State,
    pub map: ObjectId,
    pub versions: &'a BTreeMap<u64, ObjectId>,
    pub home_offset: u64,
}

impl Placement<'_> {
    /// Where the bytes `[offset, +len)` of the share, or of version `version` of it, are on
    /// the device, as runs in order.
    pub fn locate(&self, version: Option<u64>, offset: u64, len: u64) -> Vec<(u64, u64)> {
        // Only a read of a version needs the set; reads of the current data skip it.
        let numbers: BTreeSet<u64> = match version {
            Some(_) => self.versions.keys().copied().collect(),
            None => BTreeSet::new(),
        };
        let map = self.state.table(self.map).expect("checked at open");
        let table_of = |v: u64| {
            self.state
                .table(self.versions[&v])
                .expect("checked at open")
        };
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let unit = at / UNIT;
            let end = ((unit + 1) * UNIT).min(offset + len);
            let kept = version.and_then(|n| {
                map::resolve(&numbers, n, |v| table_of(v).get(unit).is_some())
                    .map(|v| u64_of(table_of(v).get(unit).expect("resolved")))
            });
            let device = kept
                .or_else(|| map.get(unit).map(u64_of))
                .unwrap_or(self.home_offset + unit * UNIT);
            pieces.push((device + at % UNIT, end - at));
            at = end;
        }
        map::coalesce(pieces)
    }
}

fn u64_of(value: &[u8]) -> u64 {
    u64::from_le_bytes(value.try_into().expect("tables of u64s, checked at open"))
}

fn no_space(mem: &Mem, wanted: u64) -> String {
    let held: usize = mem.versions.len();
    format!(
        "no staging space: {wanted} bytes wanted, {} free{}",
        mem.space.free_bytes(),
        if held > 0 {
            format!(" ({held} versions keep old data: delete one to free it)")
        } else {
            String::new()
        }
    )
}

fn fenced_client(client: u64) -> String {
    format!("client {client:x} is fenced: its lease ran out, and the bricks resolve its intervals")
}

/// Whether any staged extent (home offsets on the device) meets any write (offsets within the
/// home region).
fn overlaps(extents: &[StagedExtent], writes: &[(u64, Bytes)], home_offset: u64) -> bool {
    extents.iter().any(|extent| {
        let (start, end) = (extent.home, extent.home + u64::from(extent.len));
        writes.iter().any(|(offset, data)| {
            let at = home_offset + offset;
            at < end && start < at + data.len() as u64
        })
    })
}

/// The units of the share a record's extents touch (their home device offsets), sorted.
fn home_units(extents: &[StagedExtent]) -> Vec<u64> {
    units_under(extents.iter().map(|e| (e.home, e.len)))
}

fn shares_unit(a: &[u64], b: &[u64]) -> bool {
    a.iter().any(|unit| b.binary_search(unit).is_ok())
}

async fn unanswerable<T>(what: &str, error: BlockError) -> T {
    tracing::error!(%error, "brick {what} not answered: its metadata cannot be made durable");
    std::future::pending().await
}

fn apply_failure(id: IntervalId) -> BlockError {
    BlockError::io(
        "brick commit",
        std::io::Error::other(format!(
            "a commit that interval {id:?} shares a unit with failed to fill in; the brick must \
             be reopened"
        )),
    )
}

/// The staging units a record's extents occupy (device offsets), sorted.
fn staged_units(extents: &[StagedExtent]) -> Vec<u64> {
    units_under(extents.iter().map(|e| (e.staging, e.len)))
}

/// The 4 KiB units (device offsets) that byte ranges `(start, len)` touch, sorted, once each.
fn units_under(ranges: impl Iterator<Item = (u64, u32)>) -> Vec<u64> {
    let units: BTreeSet<u64> = ranges
        .flat_map(|(start, len)| {
            let end = (start + u64::from(len)).div_ceil(UNIT);
            (start / UNIT..end).map(|unit| unit * UNIT)
        })
        .collect();
    units.into_iter().collect()
}
