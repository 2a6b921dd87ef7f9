//! The brick's store: prepare, decide, read, and recovery at open.
//!
//! # Lock rules
//!
//! Prepares, decisions and forgets run concurrently, so that they share the metadata store's
//! group commits and their device I/O overlaps. What keeps them correct:
//! - **The mem lock is held only for in-memory work and `MetaStore::transact`**, never across
//!   device I/O or `meta.commit().await` (it is a `std` mutex: a guard held across an await
//!   would make the RPC futures `!Send`, so the compiler refuses it). A change to the
//!   metadata and the matching change to `Mem` are made under one hold, so what `Mem` says
//!   is always what the metadata says, durable or not.
//! - **An answer waits for what it saw to be durable**: every vote, decision, status and
//!   in-doubt list calls `meta.commit()` after its last look at `Mem` (cheap when nothing is
//!   pending), because `Mem` may hold another request's transaction not yet durable. A `No`
//!   needs no commit: it only ever aborts.
//! - **A prepare is admitted twice.** Under the lock: the forgotten mark, `prepare_action`,
//!   the fences, then staging is allocated and the id marked `preparing`. The data is
//!   written outside the lock; then, under it again, the same checks run once more (an abort
//!   or a forget may have arrived, or a newer epoch been recorded meanwhile) before the
//!   record goes into the same transaction as its newer epochs. A duplicate prepare, or a
//!   commit, of an id being prepared waits for it; an abort is recorded at once, and the
//!   prepare's second check then refuses.
//! - **A commit is acknowledged once its `committed` record is durable and its writes are
//!   copied home** (written, not flushed), with its `applied` tombstone transacted but not
//!   committed: a crash before that tombstone is durable redoes the copy from staging, and
//!   the commit that makes it durable flushes the copy first (the data barrier). So a commit
//!   costs one metadata commit on its way, and the tombstone rides on a later one.
//! - **Staging is freed only once the transaction that frees it is durable**: until then a
//!   crash brings back the record that points at it. An abort commits, then frees; an
//!   applied interval's units wait in `freeing` until `durable_txn` passes its tombstone,
//!   and a prepare short of space commits to free them. Units a prepare never recorded are
//!   freed at once.
//! - **Committed intervals that overlap at home are never applying at once.** Open redoes
//!   committed intervals in `IntervalId` order, not in decision order, so a commit first
//!   waits until no interval it overlaps is `applying` (from its `committed` transaction to
//!   its `applied` one, which ends the decision without another await, in the same poll as
//!   its acknowledgement). Overlapping commits are therefore applied and acknowledged in one
//!   order, and at most one of them is ever `committed` and not `applied` on disk (metadata
//!   becomes durable in transaction order). Non-overlapping ones copy home concurrently.
//! - **No lost wake-ups.** A waiter registers `changed.notified()` before it takes the lock
//!   to look, and whoever clears a `preparing` mark or an `applying` entry calls
//!   `notify_waiters` after changing `Mem`: a change before the look is seen, one after it
//!   wakes the waiter.
//! - A copy home that fails leaves its interval `applying` and marked failed: the commits
//!   that overlap it are refused with an error until the brick is reopened (open redoes it).
//!
//! `read` and `write_direct` take no lock: the lock layer above keeps readers and direct
//! writers out of ranges an interval is writing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{Bytes, BytesMut};
use strata_cluster::interval::{
    decide_action, prepare_action, DecideAction, Decision, IntervalId, PrepareAction, Status,
};
use strata_core::{BlockError, DeviceRef, Result, WriteFlags};
use strata_meta::{FormatOptions, MetaStore, ObjectId, StoreOptions, TxnClass};

use crate::commit::OVERLAP_REFUSAL;
use crate::layout::BrickLayout;
use crate::record::{blob_name, parse_blob_name, IntervalRecord, RecordState, StagedExtent};
use crate::staging::Staging;

/// The owner written in the metadata superblock: an open refuses any other.
pub const OWNER: &str = "strata brick";
/// Writes are whole sectors: the smallest unit a device writes without a read before.
pub const SECTOR: u64 = 512;
const LAYOUT_BLOB: &str = "layout";
/// Per client, the sequence number below which its intervals are forgotten (see `forget`).
const FORGOTTEN_TABLE: &str = "forgotten";
/// Per lock segment of the volume, the newest claim epoch a prepare carried (fencing).
const EPOCHS_TABLE: &str = "epochs";
/// Clients whose intervals the bricks resolve among themselves: nothing more is taken from
/// them (see `fence_client`).
const FENCED_TABLE: &str = "fenced";

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
    /// Bytes of old data this version alone keeps from being freed.
    pub held_bytes: u64,
}

/// What an open found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Prepared intervals with no decision: in doubt until their client or their peers say.
    pub in_doubt: usize,
    /// Committed intervals whose copy home was redone.
    pub redone: usize,
    /// Decided intervals kept to answer peers.
    pub tombstones: usize,
}

struct Live {
    record: IntervalRecord,
    blob: ObjectId,
}

/// A committed interval whose copy home has not finished.
struct Applying {
    /// Its home ranges, `[start, end)` device offsets.
    home: Vec<(u64, u64)>,
    /// The copy home failed: overlapping commits are refused until the brick is reopened.
    failed: bool,
}

struct Mem {
    intervals: BTreeMap<IntervalId, Live>,
    staging: Staging,
    forgotten: BTreeMap<u64, u64>,
    epochs: BTreeMap<u32, i64>,
    fenced: BTreeSet<u64>,
    /// Admitted prepares whose record is not made yet (their data is being staged).
    preparing: BTreeSet<IntervalId>,
    /// From the `committed` transaction to the `applied` one (see the lock rules).
    applying: BTreeMap<IntervalId, Applying>,
    /// Staging runs of applied intervals, free once transactions below the number are
    /// durable (`MetaStore::durable_txn`).
    freeing: Vec<(u64, Vec<(u64, u64)>)>,
}

/// What a prepare's admission checks decided.
enum Admission {
    Record,
    Repeat,
    No(String),
}

/// What a prepare does once the lock is released, before its data is staged.
enum Admitted {
    /// A prepare of the same interval is running: wait for it, then look again.
    Wait,
    /// Make the frees of applied intervals durable, then look again.
    Commit,
    /// Write the data to these staging runs.
    Staging(Vec<(u64, u64)>),
    Answer(Vote),
}

/// What a decision does once the lock is released.
enum Step {
    /// Wait for a `preparing` mark or an `applying` entry to go, then look again.
    Wait,
    /// Answer once what was seen is durable.
    Answer(bool),
    /// The abort's tombstone is in; free these staging runs once it is durable.
    Free(Vec<(u64, u64)>),
    /// The commit is in (and the interval `applying`): make it durable, then copy home.
    Apply(ObjectId, IntervalRecord),
}

pub struct BrickStore {
    device: DeviceRef,
    meta: Arc<MetaStore>,
    layout: BrickLayout,
    forgotten_table: ObjectId,
    epochs_table: ObjectId,
    fenced_table: ObjectId,
    /// Held only for in-memory work and `transact` (see the lock rules).
    mem: Mutex<Mem>,
    /// Told whenever a `preparing` mark or an `applying` entry goes.
    changed: tokio::sync::Notify,
}

/// How a store runs (as opposed to how it is laid out, [`BrickOptions`]).
#[derive(Clone, Debug, Default)]
pub struct BrickSettings {
    /// Test-only: commit records without first flushing the staged data they point to. This
    /// plants the ordering bug the crash harness must catch.
    #[doc(hidden)]
    pub unsafe_skip_data_barrier: bool,
}

fn store_options(device: &DeviceRef, settings: &BrickSettings) -> StoreOptions {
    let mut options = StoreOptions::new("brick metadata");
    // Staged data must be on the medium before the record that points to it, and a copy home
    // before the tombstone that frees its staging.
    options.data_devices = vec![device.clone()];
    options.unsafe_skip_data_barrier = settings.unsafe_skip_data_barrier;
    options
}

fn corrupt(what: impl std::fmt::Display) -> BlockError {
    BlockError::Corrupt(format!("brick: {what}"))
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
            store_options(&device, settings),
        )
        .await?;
        meta.transact(TxnClass::Normal, |_, txn| {
            let blob = txn.create_blob(LAYOUT_BLOB);
            txn.put_blob(blob, layout.encode());
            txn.create_table(FORGOTTEN_TABLE, 8);
            txn.create_table(EPOCHS_TABLE, 8);
            txn.create_table(FENCED_TABLE, 8);
            Ok(())
        })?;
        meta.commit().await?;
        tracing::info!(?layout, "brick formatted");
        let (store, _) = BrickStore::load(device, meta).await?;
        Ok(store)
    }

    /// Opens a brick: recovers its metadata, checks every record, and redoes the copy home
    /// of every committed interval. Damage anywhere refuses the brick, naming what.
    pub async fn open(device: DeviceRef) -> Result<(BrickStore, OpenReport)> {
        Self::open_with(device, &BrickSettings::default()).await
    }

    pub async fn open_with(
        device: DeviceRef,
        settings: &BrickSettings,
    ) -> Result<(BrickStore, OpenReport)> {
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
            MetaStore::open_recovered(device.clone(), recovered, store_options(&device, settings))
                .await?;
        BrickStore::load(device, meta).await
    }

    async fn load(device: DeviceRef, meta: Arc<MetaStore>) -> Result<(BrickStore, OpenReport)> {
        let size = device.geometry().size;
        // Bricks formatted before the table existed get it, empty, at their first open.
        if meta.read(|state| state.id(FENCED_TABLE).is_none()) {
            meta.transact(TxnClass::Normal, |_, txn| {
                txn.create_table(FENCED_TABLE, 8);
                Ok(())
            })?;
            meta.commit().await?;
            tracing::info!("brick metadata: added the table of fenced clients");
        }
        let (layout, (forgotten_table, forgotten), (epochs_table, epochs), fenced, records) = meta
            .read(|state| {
                let layout_id = state.id(LAYOUT_BLOB).ok_or_else(|| corrupt("no layout"))?;
                let layout = BrickLayout::decode(state.blob(layout_id).unwrap_or_default(), size)
                    .map_err(corrupt)?;
                let table = |name: &str| {
                    let id = state
                        .id(name)
                        .ok_or_else(|| corrupt(format_args!("no {name} table")))?;
                    let table = state
                        .table(id)
                        .filter(|t| t.value_size() == 8)
                        .ok_or_else(|| corrupt(format_args!("{name} is not a table of u64s")))?;
                    let values: BTreeMap<u64, u64> = table
                        .iter_from(0)
                        .map(|(index, value)| {
                            (index, u64::from_le_bytes(value.try_into().unwrap()))
                        })
                        .collect();
                    Ok::<_, BlockError>((id, values))
                };
                let forgotten = table(FORGOTTEN_TABLE)?;
                let (fenced_id, fenced) = table(FENCED_TABLE)?;
                let fenced = (fenced_id, fenced.into_keys().collect::<BTreeSet<u64>>());
                let (epochs_id, raw_epochs) = table(EPOCHS_TABLE)?;
                let epochs = raw_epochs
                    .into_iter()
                    .map(|(segment, epoch)| {
                        let segment = u32::try_from(segment)
                            .map_err(|_| corrupt(format_args!("epoch of segment {segment}")))?;
                        Ok((segment, epoch as i64))
                    })
                    .collect::<Result<BTreeMap<u32, i64>>>()?;
                let mut records = Vec::new();
                for (object, body) in state.objects() {
                    let Some(id) = parse_blob_name(&body.name) else {
                        continue;
                    };
                    let bytes = state
                        .blob(object)
                        .ok_or_else(|| corrupt(format_args!("{} is not a blob", body.name)))?;
                    let record = IntervalRecord::decode(bytes)
                        .map_err(|why| corrupt(format_args!("record {}: {why}", body.name)))?;
                    records.push((id, object, record));
                }
                Ok::<_, BlockError>((layout, forgotten, (epochs_id, epochs), fenced, records))
            })?;
        let mut mem = Mem {
            intervals: BTreeMap::new(),
            staging: Staging::new(layout.staging_offset, layout.staging_bytes),
            forgotten,
            epochs,
            fenced: fenced.1,
            preparing: BTreeSet::new(),
            applying: BTreeMap::new(),
            freeing: Vec::new(),
        };
        let mut report = OpenReport::default();
        for (id, blob, record) in records {
            let home_end = layout.home_offset + layout.home_bytes;
            if let Some(extent) = record
                .extents
                .iter()
                .find(|e| e.home < layout.home_offset || e.home + u64::from(e.len) > home_end)
            {
                return Err(corrupt(format_args!(
                    "record {}: extent {extent:?} lies outside the home region",
                    blob_name(id)
                )));
            }
            for (start, len) in staging_runs(&record.extents) {
                if !mem.staging.take(start, len) {
                    return Err(corrupt(format_args!(
                        "record {}: staging [{start}, +{len}) is outside the staging region or \
                         held by another record",
                        blob_name(id)
                    )));
                }
            }
            match record.state {
                RecordState::Prepared => report.in_doubt += 1,
                RecordState::Committed => report.redone += 1,
                RecordState::Applied | RecordState::Aborted => report.tombstones += 1,
            }
            if record.state == RecordState::Committed {
                let home = home_ranges(&record.extents);
                mem.applying.insert(
                    id,
                    Applying {
                        home,
                        failed: false,
                    },
                );
            }
            mem.intervals.insert(id, Live { record, blob });
        }
        let committed: Vec<(IntervalId, ObjectId, IntervalRecord)> = mem
            .intervals
            .iter()
            .filter(|(_, live)| live.record.state == RecordState::Committed)
            .map(|(&id, live)| (id, live.blob, live.record.clone()))
            .collect();
        let store = BrickStore {
            device,
            meta,
            layout,
            forgotten_table,
            epochs_table,
            fenced_table: fenced.0,
            mem: Mutex::new(mem),
            changed: tokio::sync::Notify::new(),
        };
        // One at a time, in `IntervalId` order: the order the format promises.
        for (id, blob, record) in committed {
            store.apply(id, blob, &record).await?;
        }
        store.meta.commit().await?;
        store.reclaim(&mut store.lock());
        if report != OpenReport::default() {
            tracing::info!(?report, "brick opened");
        }
        Ok((store, report))
    }

    pub fn layout(&self) -> BrickLayout {
        self.layout
    }

    /// Free staging space, in bytes, once the frees of applied intervals are durable.
    pub async fn staging_free(&self) -> u64 {
        // A failed commit frees nothing: `reclaim` frees only what is durable.
        let _ = self.meta.commit().await;
        let mut mem = self.lock();
        self.reclaim(&mut mem);
        mem.staging.free_bytes()
    }

    /// Frees the staging of applied intervals whose tombstones are now durable.
    fn reclaim(&self, mem: &mut Mem) {
        let durable = self.meta.durable_txn();
        let (free, keep) = std::mem::take(&mut mem.freeing)
            .into_iter()
            .partition(|(txn, _)| *txn <= durable);
        mem.freeing = keep;
        for (_, runs) in free {
            for (start, len) in runs {
                mem.staging.release(start, len);
            }
        }
    }

    /// A panic under the lock (a staging run freed twice) is a bug that already failed its
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

    /// Prepares an interval: stages its writes (offsets within the home region) and records
    /// them durably, then votes. `bricks` lists every brick of the interval; `fences` the
    /// claim epoch of each lock segment the client holds its locks under. An epoch older than
    /// one seen for its segment is refused: its holder lost the claim to a newer one.
    pub async fn prepare(
        &self,
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
    ) -> Result<Vote> {
        for (offset, data) in &writes {
            self.check_home(*offset, data.len() as u64)?;
        }
        let total: u64 = writes.iter().map(|(_, d)| d.len() as u64).sum();
        let runs = loop {
            let changed = self.changed.notified();
            let admitted = {
                let mut mem = self.lock();
                self.reclaim(&mut mem);
                if mem.preparing.contains(&id) {
                    // A duplicate (the client sent it again): answered as a repeat once the
                    // first is recorded, or as the first was refused.
                    Admitted::Wait
                } else {
                    match self.admit(&mem, id, &writes, fences) {
                        Admission::No(why) => Admitted::Answer(Vote::No(why)),
                        Admission::Repeat => Admitted::Answer(Vote::Yes),
                        Admission::Record => match mem.staging.allocate(total) {
                            Some(runs) => {
                                mem.preparing.insert(id);
                                Admitted::Staging(runs)
                            }
                            // Applied intervals wait for a commit to free their staging.
                            None if !mem.freeing.is_empty() => Admitted::Commit,
                            None => Admitted::Answer(Vote::No(format!(
                                "no staging space: {total} bytes wanted, {} free",
                                mem.staging.free_bytes()
                            ))),
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
        let extents = place(&writes, &runs, self.layout.home_offset);
        let staged = self.stage(&writes, &extents).await;
        let outcome = {
            let mut mem = self.lock();
            mem.preparing.remove(&id);
            self.changed.notify_waiters();
            let outcome = staged.and_then(|()| match self.admit(&mem, id, &writes, fences) {
                Admission::No(why) => Ok(Some(Vote::No(why))),
                // Only a prepare records a prepared interval, and a duplicate waited: kept
                // for completeness, this answers as a repeat.
                Admission::Repeat => Ok(Some(Vote::Yes)),
                Admission::Record => {
                    let record = IntervalRecord {
                        state: RecordState::Prepared,
                        bricks,
                        extents,
                    };
                    let blob = self.record_prepared(id, &record, fences)?;
                    mem.intervals.insert(id, Live { record, blob });
                    for &(segment, epoch) in fences {
                        let newest = mem.epochs.entry(segment).or_insert(epoch);
                        *newest = (*newest).max(epoch);
                    }
                    Ok(None)
                }
            });
            if !matches!(outcome, Ok(None)) {
                // Nothing durable points at these units: free at once.
                for &(start, len) in &runs {
                    mem.staging.release(start, len);
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

    /// [`Self::prepare`] of an interval that belongs after the volume's version cut `tag`
    /// and before cut `tag + 1`: version `n` holds exactly the intervals tagged below `n`.
    pub async fn prepare_tagged(
        &self,
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<Vote> {
        if tag != 0 {
            return Err(versions_not_built());
        }
        self.prepare(id, bricks, writes, fences).await
    }

    /// The versions this brick keeps, oldest first.
    pub async fn versions(&self) -> Result<Vec<VersionInfo>> {
        Ok(Vec::new())
    }

    /// Makes sure versions up to `number` exist here (a brick creates a version when the
    /// first interval tagged with it commits; sealing creates it on bricks no such interval
    /// reached). Idempotent.
    pub async fn seal_version(&self, number: u64) -> Result<()> {
        let _ = number;
        Err(versions_not_built())
    }

    /// Deletes a version and frees the old data only it kept. `Ok(false)` when the brick
    /// has no such version. Idempotent, and finished at the next open after a crash.
    pub async fn delete_version(&self, number: u64) -> Result<bool> {
        let _ = number;
        Err(versions_not_built())
    }

    /// Makes version `number` the brick's current content, and deletes the versions newer
    /// than it. Refused while intervals are in doubt here. Finished at the next open after
    /// a crash; prepares are refused until it is done.
    pub async fn rollback(&self, number: u64) -> Result<()> {
        let _ = number;
        Err(versions_not_built())
    }

    /// Reads version `number` of the share (offsets within it, like [`Self::read`]).
    pub async fn read_version(&self, number: u64, offset: u64, len: usize) -> Result<BytesMut> {
        let _ = (number, offset, len);
        Err(versions_not_built())
    }

    /// A prepare's checks, run when it is admitted and again before its record is made.
    fn admit(
        &self,
        mem: &Mem,
        id: IntervalId,
        writes: &[(u64, Bytes)],
        fences: &[(u32, i64)],
    ) -> Admission {
        if mem.fenced.contains(&id.client) {
            return Admission::No(fenced_client(id.client));
        }
        if mem
            .forgotten
            .get(&id.client)
            .is_some_and(|&below| id.seq < below)
        {
            return Admission::No(format!(
                "interval {id:?} is older than its client's forgotten mark"
            ));
        }
        let status = mem.intervals.get(&id).map(|l| l.record.state.status());
        match prepare_action(status) {
            PrepareAction::Repeat => return Admission::Repeat,
            PrepareAction::Refuse => {
                return Admission::No(format!("interval {id:?} is already decided"))
            }
            PrepareAction::Record => {}
        }
        if let Some((segment, epoch, newest)) = fences.iter().find_map(|&(segment, epoch)| {
            let newest = *mem.epochs.get(&segment)?;
            (epoch < newest).then_some((segment, epoch, newest))
        }) {
            tracing::warn!(?id, segment, epoch, newest, "prepare fenced");
            return Admission::No(format!(
                "fenced: segment {segment} was claimed at epoch {newest}, after the client's {epoch}"
            ));
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
            return Admission::No(format!(
                "interval {id:?} {OVERLAP_REFUSAL} ({other:?}) held here"
            ));
        }
        Admission::Record
    }

    /// Writes each write's bytes to its extents (`place` cut them in order).
    async fn stage(&self, writes: &[(u64, Bytes)], extents: &[StagedExtent]) -> Result<()> {
        let mut extents = extents.iter();
        for (_, bytes) in writes {
            let mut used = 0;
            while used < bytes.len() {
                let extent = extents.next().expect("the extents cover the writes");
                let end = used + extent.len as usize;
                self.write_all(extent.staging, bytes.slice(used..end))
                    .await?;
                used = end;
            }
        }
        Ok(())
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

    /// The prepared record and the newer epochs it carries, in one transaction.
    fn record_prepared(
        &self,
        id: IntervalId,
        record: &IntervalRecord,
        fences: &[(u32, i64)],
    ) -> Result<ObjectId> {
        let name = blob_name(id);
        let encoded = record.encode();
        let epochs = self.epochs_table;
        self.meta.transact(TxnClass::Normal, |state, txn| {
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
                    self.meta.commit().await?;
                    return Ok(answer);
                }
                Step::Free(runs) => {
                    self.meta.commit().await?;
                    // Freed only now: until the tombstone is durable, a crash brings the
                    // prepared record back, and its staged data must still be there.
                    let mut mem = self.lock();
                    for (start, len) in runs {
                        mem.staging.release(start, len);
                    }
                    return Ok(true);
                }
                Step::Apply(blob, record) => {
                    if let Err(e) = self.meta.commit().await {
                        self.apply_failed(id);
                        return Err(e);
                    }
                    self.apply(id, blob, &record).await?;
                    return Ok(true);
                }
            }
        }
    }

    /// The part of a decision made under the lock.
    fn decide_step(&self, mem: &mut Mem, id: IntervalId, decision: Decision) -> Result<Step> {
        if decision == Decision::Commit && mem.preparing.contains(&id) {
            // Nothing sends a commit before this brick voted, but a duplicate prepare might
            // still be running when the first one's vote led to it: wait for the record.
            return Ok(Step::Wait);
        }
        let status = mem.intervals.get(&id).map(|l| l.record.state.status());
        match decide_action(status, decision) {
            DecideAction::Repeat { same } => match mem.applying.get(&id) {
                // A repeated commit is acknowledged when the first is: once the writes are
                // home and readable.
                Some(applying) if same => {
                    if applying.failed {
                        return Err(apply_failure(id));
                    }
                    Ok(Step::Wait)
                }
                _ => Ok(Step::Answer(same)),
            },
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
                let freed = staging_runs(&live.record.extents);
                let record =
                    IntervalRecord::tombstone(RecordState::Aborted, live.record.bricks.clone());
                self.record_update(live.blob, &record, TxnClass::Reclaim)?;
                live.record = record;
                Ok(Step::Free(freed))
            }
            DecideAction::Apply => {
                let live = &mem.intervals[&id];
                let home = home_ranges(&live.record.extents);
                if let Some(busy) = mem.applying.values().find(|a| overlap(&a.home, &home)) {
                    if busy.failed {
                        return Err(apply_failure(id));
                    }
                    return Ok(Step::Wait);
                }
                let blob = live.blob;
                let record = IntervalRecord {
                    state: RecordState::Committed,
                    ..live.record.clone()
                };
                self.record_update(blob, &record, TxnClass::Reclaim)?;
                mem.intervals.get_mut(&id).expect("prepared").record = record.clone();
                mem.applying.insert(
                    id,
                    Applying {
                        home,
                        failed: false,
                    },
                );
                Ok(Step::Apply(blob, record))
            }
        }
    }

    /// Copies a committed interval's staged writes home and shrinks the record to a tombstone,
    /// which a later commit makes durable. Redone from the start after a crash (the copy is
    /// idempotent). The interval is `applying` until this returns.
    async fn apply(&self, id: IntervalId, blob: ObjectId, record: &IntervalRecord) -> Result<()> {
        let result = self.copy_home(id, blob, record).await;
        if result.is_err() {
            self.apply_failed(id);
        }
        result
    }

    async fn copy_home(
        &self,
        id: IntervalId,
        blob: ObjectId,
        record: &IntervalRecord,
    ) -> Result<()> {
        for extent in &record.extents {
            let data = self.read_all(extent.staging, extent.len as usize).await?;
            self.write_all(extent.home, data.freeze()).await?;
        }
        // No flush and no commit before the decision is acknowledged: the `committed`
        // record is durable, so a crash redoes this copy from staging, which stays taken until
        // the tombstone is durable. The commit that makes it durable flushes the device first
        // (the data barrier), so the tombstone is never durable before the copy.
        let mut mem = self.lock();
        let tombstone = IntervalRecord::tombstone(RecordState::Applied, record.bricks.clone());
        self.record_update(blob, &tombstone, TxnClass::Reclaim)?;
        // Forget leaves an interval that holds staging alone, so the record is still here.
        mem.intervals.get_mut(&id).expect("committed").record = tombstone;
        let after = self.meta.next_txn();
        mem.freeing.push((after, staging_runs(&record.extents)));
        mem.applying.remove(&id);
        self.changed.notify_waiters();
        Ok(())
    }

    /// The copy home failed: the interval stays `applying`, and what waits on it is woken to
    /// find it failed.
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
        let listed = {
            let mem = self.lock();
            mem.intervals
                .iter()
                .filter(|(_, l)| l.record.state == RecordState::Prepared)
                .map(|(&id, l)| (id, l.record.bricks.clone()))
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

    /// Writes home at once, outside any interval, and flushes: the baseline intervals are
    /// measured against (`WriteDirect`). Not atomic, not ordered against intervals.
    pub async fn write_direct(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        for (offset, data) in &writes {
            self.check_home(*offset, data.len() as u64)?;
        }
        for (offset, data) in writes {
            self.write_all(self.layout.home_offset + offset, data)
                .await?;
        }
        self.device.flush().await
    }

    /// Reads the home region (offsets within it): what committed intervals wrote.
    pub async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.check_home(offset, len as u64)?;
        self.read_all(self.layout.home_offset + offset, len).await
    }

    async fn write_all(&self, offset: u64, data: Bytes) -> Result<()> {
        let max = self.device.geometry().max_io as usize;
        let mut at = 0;
        while at < data.len() {
            let end = (at + max).min(data.len());
            self.device
                .write(
                    offset + at as u64,
                    data.slice(at..end),
                    WriteFlags::default(),
                )
                .await?;
            at = end;
        }
        Ok(())
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

fn versions_not_built() -> BlockError {
    BlockError::Unsupported("brick versions: not built yet".into())
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

/// Cuts the writes into extents over the staging runs, in order: a write may span runs, and
/// a run may hold the ends of several writes.
fn place(writes: &[(u64, Bytes)], runs: &[(u64, u64)], home_offset: u64) -> Vec<StagedExtent> {
    let mut extents = Vec::new();
    let mut runs = runs.iter().copied();
    let (mut run_at, mut run_left) = runs.next().unwrap_or((0, 0));
    for (offset, data) in writes {
        let mut done = 0u64;
        let len = data.len() as u64;
        while done < len {
            if run_left == 0 {
                (run_at, run_left) = runs.next().expect("runs cover the writes");
            }
            let take = (len - done).min(run_left).min(u64::from(u32::MAX) / 2);
            extents.push(StagedExtent {
                home: home_offset + offset + done,
                staging: run_at,
                len: take as u32,
            });
            done += take;
            run_at += take;
            run_left -= take;
        }
    }
    extents
}

/// The home ranges of a record's extents, `[start, end)` device offsets.
fn home_ranges(extents: &[StagedExtent]) -> Vec<(u64, u64)> {
    extents
        .iter()
        .map(|e| (e.home, e.home + u64::from(e.len)))
        .collect()
}

fn overlap(a: &[(u64, u64)], b: &[(u64, u64)]) -> bool {
    a.iter()
        .any(|&(a0, a1)| b.iter().any(|&(b0, b1)| a0 < b1 && b0 < a1))
}

async fn unanswerable<T>(what: &str, error: BlockError) -> T {
    tracing::error!(%error, "brick {what} not answered: its metadata cannot be made durable");
    std::future::pending().await
}

fn apply_failure(id: IntervalId) -> BlockError {
    BlockError::io(
        "brick copy home",
        std::io::Error::other(format!(
            "a copy home that interval {id:?} overlaps failed; the brick must be reopened to redo it"
        )),
    )
}

/// The staging units a record's extents occupy, as merged runs: allocation hands out whole
/// units to one interval, and `place` packs its writes into them, so the rounded spans are
/// exactly what was allocated.
fn staging_runs(extents: &[StagedExtent]) -> Vec<(u64, u64)> {
    use crate::staging::UNIT;
    let mut spans: Vec<(u64, u64)> = extents
        .iter()
        .map(|e| {
            let start = e.staging / UNIT * UNIT;
            (start, (e.staging + u64::from(e.len)).next_multiple_of(UNIT))
        })
        .collect();
    spans.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (start, end) in spans {
        match runs.last_mut() {
            Some((run_start, run_len)) if start <= *run_start + *run_len => {
                *run_len = (*run_len).max(end - *run_start);
            }
            _ => runs.push((start, end - start)),
        }
    }
    runs
}
