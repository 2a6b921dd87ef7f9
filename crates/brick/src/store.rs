//! The brick's store: prepare, decide, read, and recovery at open.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

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

struct Mem {
    intervals: BTreeMap<IntervalId, Live>,
    staging: Staging,
    forgotten: BTreeMap<u64, u64>,
    epochs: BTreeMap<u32, i64>,
    fenced: BTreeSet<u64>,
}

pub struct BrickStore {
    device: DeviceRef,
    meta: Arc<MetaStore>,
    layout: BrickLayout,
    forgotten_table: ObjectId,
    epochs_table: ObjectId,
    fenced_table: ObjectId,
    /// One prepare, decision or forget at a time: each ends in a metadata commit, and the
    /// rules need the interval's state not to move underneath them.
    mem: tokio::sync::Mutex<Mem>,
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
    // Staged data must be on the medium before the record that points to it.
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
            mem.intervals.insert(id, Live { record, blob });
        }
        let store = BrickStore {
            device,
            meta,
            layout,
            forgotten_table,
            epochs_table,
            fenced_table: fenced.0,
            mem: tokio::sync::Mutex::new(mem),
        };
        {
            let mut mem = store.mem.lock().await;
            let committed: Vec<IntervalId> = mem
                .intervals
                .iter()
                .filter(|(_, live)| live.record.state == RecordState::Committed)
                .map(|(&id, _)| id)
                .collect();
            for id in committed {
                store.apply(&mut mem, id).await?;
            }
        }
        if report != OpenReport::default() {
            tracing::info!(?report, "brick opened");
        }
        Ok((store, report))
    }

    pub fn layout(&self) -> BrickLayout {
        self.layout
    }

    /// Free staging space, in bytes.
    pub async fn staging_free(&self) -> u64 {
        self.mem.lock().await.staging.free_bytes()
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
        let mut mem = self.mem.lock().await;
        if mem.fenced.contains(&id.client) {
            return Ok(Vote::No(fenced_client(id.client)));
        }
        if mem
            .forgotten
            .get(&id.client)
            .is_some_and(|&below| id.seq < below)
        {
            return Ok(Vote::No(format!(
                "interval {id:?} is older than its client's forgotten mark"
            )));
        }
        let status = mem.intervals.get(&id).map(|l| l.record.state.status());
        match prepare_action(status) {
            PrepareAction::Repeat => return Ok(Vote::Yes),
            PrepareAction::Refuse => {
                return Ok(Vote::No(format!("interval {id:?} is already decided")))
            }
            PrepareAction::Record => {}
        }
        if let Some((segment, epoch, newest)) = fences.iter().find_map(|&(segment, epoch)| {
            let newest = *mem.epochs.get(&segment)?;
            (epoch < newest).then_some((segment, epoch, newest))
        }) {
            tracing::warn!(?id, segment, epoch, newest, "prepare fenced");
            return Ok(Vote::No(format!(
                "fenced: segment {segment} was claimed at epoch {newest}, after the client's {epoch}"
            )));
        }
        // Another client's interval over the same bytes, prepared here and undecided: its
        // client died or paused inside its commit, or owes this brick the decision. Until it
        // is decided, a later interval must not be staged behind it, or the earlier one's
        // commit could still land on top. The client waits and tries again.
        if let Some(other) = mem.intervals.iter().find_map(|(&other, live)| {
            (other.client != id.client
                && live.record.state == RecordState::Prepared
                && overlaps(&live.record.extents, &writes, self.layout.home_offset))
            .then_some(other)
        }) {
            return Ok(Vote::No(format!(
                "interval {id:?} {OVERLAP_REFUSAL} ({other:?}) held here"
            )));
        }
        let total: u64 = writes.iter().map(|(_, d)| d.len() as u64).sum();
        let Some(runs) = mem.staging.allocate(total) else {
            return Ok(Vote::No(format!(
                "no staging space: {total} bytes wanted, {} free",
                mem.staging.free_bytes()
            )));
        };
        let extents = place(&writes, &runs, self.layout.home_offset);
        let staged = self.stage(&writes, &extents).await;
        let recorded = match staged {
            Ok(()) => {
                let record = IntervalRecord {
                    state: RecordState::Prepared,
                    bricks,
                    extents,
                };
                self.record_prepared(id, &record, fences)
                    .map(|blob| (blob, record))
            }
            Err(e) => Err(e),
        };
        let (blob, record) = match recorded {
            Ok(done) => done,
            Err(e) => {
                for (start, len) in runs {
                    mem.staging.release(start, len);
                }
                return Err(e);
            }
        };
        mem.intervals.insert(id, Live { record, blob });
        for &(segment, epoch) in fences {
            let newest = mem.epochs.entry(segment).or_insert(epoch);
            *newest = (*newest).max(epoch);
        }
        self.meta.commit().await?;
        Ok(Vote::Yes)
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
        let mut mem = self.mem.lock().await;
        if !resolved && mem.fenced.contains(&id.client) {
            tracing::warn!(?id, ?decision, "decision from a fenced client refused");
            return Ok(false);
        }
        let status = mem.intervals.get(&id).map(|l| l.record.state.status());
        match decide_action(status, decision) {
            DecideAction::Repeat { same } => Ok(same),
            DecideAction::Refuse => Ok(false),
            DecideAction::Remember => {
                if mem
                    .forgotten
                    .get(&id.client)
                    .is_some_and(|&below| id.seq < below)
                {
                    return Ok(true);
                }
                let record = IntervalRecord::tombstone(RecordState::Aborted, Vec::new());
                let blob = self.record_new(id, &record)?;
                mem.intervals.insert(id, Live { record, blob });
                self.meta.commit().await?;
                Ok(true)
            }
            DecideAction::Drop => {
                let live = mem.intervals.get(&id).expect("prepared");
                let freed = live.record.extents.clone();
                let record =
                    IntervalRecord::tombstone(RecordState::Aborted, live.record.bricks.clone());
                self.record_update(live.blob, &record, TxnClass::Reclaim)?;
                self.meta.commit().await?;
                // Freed only now: until the tombstone is durable, a crash brings the prepared
                // record back, and its staged data must still be there.
                for (start, len) in staging_runs(&freed) {
                    mem.staging.release(start, len);
                }
                mem.intervals.get_mut(&id).expect("prepared").record = record;
                Ok(true)
            }
            DecideAction::Apply => {
                let live = mem.intervals.get_mut(&id).expect("prepared");
                live.record.state = RecordState::Committed;
                let (blob, record) = (live.blob, live.record.clone());
                self.record_update(blob, &record, TxnClass::Reclaim)?;
                self.meta.commit().await?;
                self.apply(&mut mem, id).await?;
                Ok(true)
            }
        }
    }

    /// Copies a committed interval's staged writes home, makes them durable, and shrinks the
    /// record to a tombstone. Redone from the start after a crash (the copy is idempotent).
    async fn apply(&self, mem: &mut Mem, id: IntervalId) -> Result<()> {
        let live = mem.intervals.get(&id).expect("committed");
        let extents = live.record.extents.clone();
        for extent in &extents {
            let data = self.read_all(extent.staging, extent.len as usize).await?;
            self.write_all(extent.home, data.freeze()).await?;
        }
        self.device.flush().await?;
        let record = IntervalRecord::tombstone(RecordState::Applied, live.record.bricks.clone());
        self.record_update(live.blob, &record, TxnClass::Reclaim)?;
        self.meta.commit().await?;
        for (start, len) in staging_runs(&extents) {
            mem.staging.release(start, len);
        }
        mem.intervals.get_mut(&id).expect("committed").record = record;
        Ok(())
    }

    /// What this brick's log says of an interval, for a peer resolving it in doubt. `None`
    /// for an interval never prepared here or already forgotten (its client forgets only
    /// intervals ended on every brick, which no brick can be in doubt about).
    pub async fn status(&self, id: IntervalId) -> Option<Status> {
        let mem = self.mem.lock().await;
        mem.intervals.get(&id).map(|l| l.record.state.status())
    }

    /// Prepared intervals with no decision yet, with the bricks of each.
    pub async fn in_doubt(&self) -> Vec<(IntervalId, Vec<u64>)> {
        let mem = self.mem.lock().await;
        mem.intervals
            .iter()
            .filter(|(_, l)| l.record.state == RecordState::Prepared)
            .map(|(&id, l)| (id, l.record.bricks.clone()))
            .collect()
    }

    /// From now on, takes no prepare and no decision from `client`, durably: its lease ran out,
    /// and its peers are about to read this brick's state of its intervals to resolve them. A
    /// client paused past its lease could otherwise wake up and commit here after the peers
    /// read the interval as prepared and resolved it as aborted.
    pub async fn fence_client(&self, client: u64) -> Result<()> {
        let mut mem = self.mem.lock().await;
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
        // Durable before the answer, also when an earlier request recorded it.
        self.meta.commit().await
    }

    /// The client says every interval of its below `seq` has ended on every brick: their
    /// tombstones go, and a late prepare of one is refused by the mark instead.
    pub async fn forget(&self, client: u64, below: u64) -> Result<usize> {
        let mut mem = self.mem.lock().await;
        let gone: Vec<(IntervalId, ObjectId)> = mem
            .intervals
            .range(IntervalId { client, seq: 0 }..IntervalId { client, seq: below })
            .filter(|(_, l)| !l.record.state.holds_staging())
            .map(|(&id, l)| (id, l.blob))
            .collect();
        if mem
            .forgotten
            .get(&client)
            .is_some_and(|&mark| mark >= below)
            && gone.is_empty()
        {
            return Ok(0);
        }
        let table = self.forgotten_table;
        let mark = mem.forgotten.get(&client).copied().unwrap_or(0).max(below);
        self.meta.transact(TxnClass::Reclaim, |_, txn| {
            txn.set(table, client, &mark.to_le_bytes());
            for (_, blob) in &gone {
                txn.delete(*blob);
            }
            Ok(())
        })?;
        self.meta.commit().await?;
        mem.forgotten.insert(client, mark);
        for (id, _) in &gone {
            mem.intervals.remove(id);
        }
        Ok(gone.len())
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
