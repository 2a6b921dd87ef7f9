//! Opening a brick: its layout, tables, versions and records, checked; a format-1 brick
//! upgraded; free space rebuilt from what is in use; a step a crash interrupted finished.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use strata_cluster::interval::IntervalId;
use strata_core::{BlockError, DeviceRef, Result};
use strata_meta::{MetaStore, ObjectId, State, TxnClass};

use super::versions::{self, Pending, VersionsBlob};
use super::{
    corrupt, staged_units, u64_of, BrickSettings, BrickStore, Live, Mem, OpenReport, EPOCHS_TABLE,
    FENCED_TABLE, FORGOTTEN_TABLE, LAYOUT_BLOB, MAP_TABLE,
};
use crate::failstop::DiskHealth;
use crate::layout::{BrickLayout, LAYOUT_VERSION};
use crate::record::{
    blob_name, parse_blob_name, IntervalRecord, RecordState, StagedCrc, StagedExtent,
};
use crate::space::{FreeSpace, UNIT};

/// What the metadata says, read in one look.
struct Found {
    forgotten: (ObjectId, BTreeMap<u64, u64>),
    epochs: (ObjectId, BTreeMap<u32, i64>),
    fenced: (ObjectId, BTreeSet<u64>),
    map: (ObjectId, BTreeMap<u64, u64>),
    versions_blob: (ObjectId, VersionsBlob),
    versions: BTreeMap<u64, (ObjectId, BTreeMap<u64, u64>)>,
    records: Vec<(IntervalId, ObjectId, IntervalRecord)>,
}

fn u64_table(state: &State, name: &str) -> Result<(ObjectId, BTreeMap<u64, u64>)> {
    let id = state
        .id(name)
        .ok_or_else(|| corrupt(format_args!("no {name} table")))?;
    let table = state
        .table(id)
        .filter(|t| t.value_size() == 8)
        .ok_or_else(|| corrupt(format_args!("{name} is not a table of u64s")))?;
    Ok((
        id,
        table.iter_from(0).map(|(i, v)| (i, u64_of(v))).collect(),
    ))
}

fn read_found(state: &State) -> Result<Found> {
    let forgotten = u64_table(state, FORGOTTEN_TABLE)?;
    let (fenced_id, fenced) = u64_table(state, FENCED_TABLE)?;
    let (epochs_id, raw_epochs) = u64_table(state, EPOCHS_TABLE)?;
    let epochs = raw_epochs
        .into_iter()
        .map(|(segment, epoch)| {
            let segment = u32::try_from(segment)
                .map_err(|_| corrupt(format_args!("epoch of segment {segment}")))?;
            Ok((segment, epoch as i64))
        })
        .collect::<Result<BTreeMap<u32, i64>>>()?;
    let map = u64_table(state, MAP_TABLE)?;
    let blob_id = state
        .id(versions::BLOB)
        .ok_or_else(|| corrupt("no versions blob"))?;
    let blob = VersionsBlob::decode(state.blob(blob_id).unwrap_or_default()).map_err(corrupt)?;
    let mut versions = BTreeMap::new();
    let mut records = Vec::new();
    for (object, body) in state.objects() {
        if let Some(number) = versions::parse_table_name(&body.name) {
            if number > blob.newest {
                return Err(corrupt(format_args!(
                    "{} is newer than the newest version recorded, {}",
                    body.name, blob.newest
                )));
            }
            versions.insert(number, u64_table(state, &body.name)?);
            continue;
        }
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
    if let Some(Pending::Rollback(n) | Pending::Delete(n)) = blob.pending {
        if !versions.contains_key(&n) {
            return Err(corrupt(format_args!(
                "the versions blob records a step on version {n}, which is not here"
            )));
        }
    }
    Ok(Found {
        forgotten,
        epochs: (epochs_id, epochs),
        fenced: (fenced_id, fenced.into_keys().collect()),
        map,
        versions_blob: (blob_id, blob),
        versions,
        records,
    })
}

/// Marks in use every unit the metadata points at. A unit claimed twice, or outside the
/// data region, is damage: the open is refused, naming the owners.
struct Claims<'a> {
    space: FreeSpace,
    layout: &'a BrickLayout,
}

impl Claims<'_> {
    fn take(&mut self, start: u64, len: u64, owner: impl Fn() -> String) -> Result<()> {
        let inside = start >= self.layout.home_offset
            && start.is_multiple_of(UNIT)
            && start
                .checked_add(len)
                .is_some_and(|end| end <= self.layout.data_end());
        if !inside || !self.space.take(start, len) {
            return Err(corrupt(format_args!(
                "{}: units [{start}, +{len}) are outside the data region or have another owner",
                owner()
            )));
        }
        Ok(())
    }
}

impl BrickStore {
    pub(super) async fn load(
        device: DeviceRef,
        disk: Arc<DiskHealth>,
        meta: Arc<MetaStore>,
        settings: &BrickSettings,
    ) -> Result<(BrickStore, OpenReport)> {
        let size = device.geometry().size;
        let mut report = OpenReport::default();
        // Bricks formatted before the table existed get it, empty, at their first open.
        if meta.read(|state| state.id(FENCED_TABLE).is_none()) {
            meta.transact(TxnClass::Normal, |_, txn| {
                txn.create_table(FENCED_TABLE, 8);
                Ok(())
            })?;
            meta.commit().await?;
            tracing::info!("brick metadata: added the table of fenced clients");
        }
        let (layout, format) = meta.read(|state| {
            let id = state.id(LAYOUT_BLOB).ok_or_else(|| corrupt("no layout"))?;
            BrickLayout::decode_any(state.blob(id).unwrap_or_default(), size).map_err(corrupt)
        })?;
        match format {
            1 => upgrade_format_one(&device, &meta, &layout, &mut report).await?,
            2 => upgrade_format_two(&meta, &layout, &mut report).await?,
            _ => {}
        }
        let mut found = meta.read(read_found)?;
        if !settings.unsafe_skip_checksums {
            report.unlanded = abort_unlanded(&device, &meta, &mut found.records).await?;
        }
        let home_units = layout.home_bytes / UNIT;
        let mut claims = Claims {
            space: FreeSpace::new(layout.home_offset, layout.data_end() - layout.home_offset),
            layout: &layout,
        };
        let home_end = layout.home_offset + layout.home_bytes;
        if layout.staging_offset > home_end {
            claims.take(home_end, layout.staging_offset - home_end, || {
                "the gap".into()
            })?;
        }
        // Units at home: every unit of the share the map does not send elsewhere.
        let mut next = 0;
        for &index in found.map.1.keys().chain(std::iter::once(&home_units)) {
            if index > home_units {
                return Err(corrupt(format_args!(
                    "the map names unit {index}, past the share"
                )));
            }
            if index > next {
                claims.take(
                    layout.home_offset + next * UNIT,
                    (index - next) * UNIT,
                    || "home".into(),
                )?;
            }
            next = index + 1;
        }
        for (&index, &unit) in &found.map.1 {
            claims.take(unit, UNIT, || format!("unit {index} of the map"))?;
        }
        for (&number, (_, table)) in &found.versions {
            for (&index, &unit) in table {
                if index >= home_units {
                    return Err(corrupt(format_args!(
                        "version {number} keeps unit {index}, past the share"
                    )));
                }
                claims.take(unit, UNIT, || format!("unit {index} of version {number}"))?;
            }
        }
        let mut intervals = BTreeMap::new();
        for (id, blob, record) in found.records {
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
            for unit in staged_units(&record.extents) {
                claims.take(unit, UNIT, || format!("record {}", blob_name(id)))?;
            }
            match record.state {
                RecordState::Prepared => report.in_doubt += 1,
                RecordState::Committed => {
                    return Err(corrupt(format_args!(
                        "record {} is committed in format 2, which commits in one step",
                        blob_name(id)
                    )))
                }
                RecordState::Applied | RecordState::Aborted => report.tombstones += 1,
            }
            intervals.insert(id, Live { record, blob });
        }
        let pending = found.versions_blob.1.pending;
        let mem = Mem {
            intervals,
            space: claims.space,
            forgotten: found.forgotten.1,
            epochs: found.epochs.1,
            fenced: found.fenced.1,
            preparing: BTreeMap::new(),
            applying: BTreeMap::new(),
            freeing: Vec::new(),
            versions: found
                .versions
                .iter()
                .map(|(&n, (id, _))| (n, *id))
                .collect(),
            versions_blob: found.versions_blob.1,
            reads: BTreeSet::new(),
            next_read: 0,
            step: None,
        };
        let store = BrickStore {
            device,
            meta,
            layout,
            forgotten_table: found.forgotten.0,
            epochs_table: found.epochs.0,
            fenced_table: found.fenced.0,
            map_table: found.map.0,
            versions_blob: found.versions_blob.0,
            mem: Mutex::new(mem),
            changed: tokio::sync::Notify::new(),
            step_entries: match settings.step_entries {
                0 => versions::STEP_ENTRIES,
                n => n,
            },
            disk,
            refusals: Default::default(),
            skip_data_flush: settings.unsafe_skip_data_barrier,
            yields_while_staging: settings.yields_while_staging,
        };
        match pending {
            Some(Pending::Rollback(number)) => store.finish_rollback(number).await?,
            Some(Pending::Delete(number)) => store.finish_delete(number).await?,
            None => {}
        }
        report.finished = pending.map(Pending::describe);
        if report != OpenReport::default() {
            tracing::info!(?report, "brick opened");
        }
        Ok((store, report))
    }
}

/// A format-1 brick keeps the share at home, in place: redo the copy home of its committed
/// intervals as format 1 did, then add the map (empty: every unit at home) and the versions
/// blob. Its prepared intervals were staged without regard to units, so format 2 cannot
/// commit them: such a brick is refused, to be opened by the build that wrote it until they
/// are decided.
async fn upgrade_format_one(
    device: &DeviceRef,
    meta: &Arc<MetaStore>,
    layout: &BrickLayout,
    report: &mut OpenReport,
) -> Result<()> {
    let records: Vec<(IntervalId, ObjectId, IntervalRecord)> = meta.read(|state| {
        let mut records = Vec::new();
        for (object, body) in state.objects() {
            if let Some(id) = parse_blob_name(&body.name) {
                let bytes = state.blob(object).unwrap_or_default();
                let record = IntervalRecord::decode(bytes)
                    .map_err(|why| corrupt(format_args!("record {}: {why}", body.name)))?;
                records.push((id, object, record));
            }
        }
        Ok::<_, BlockError>(records)
    })?;
    let prepared = records
        .iter()
        .filter(|(_, _, r)| r.state == RecordState::Prepared)
        .count();
    if prepared > 0 {
        return Err(BlockError::InvalidArgument(format!(
            "a format-1 brick with {prepared} intervals in doubt: open it with the build that \
             wrote it until they are decided, then here to upgrade it"
        )));
    }
    // In interval order, as format 1 promised: overlapping ones were decided in that order.
    let mut committed: Vec<_> = records
        .into_iter()
        .filter(|(_, _, r)| r.state == RecordState::Committed)
        .collect();
    committed.sort_by_key(|(id, _, _)| *id);
    for (_, _, record) in &committed {
        for extent in &record.extents {
            let data = device.read(extent.staging, extent.len as usize).await?;
            device
                .write(extent.home, data.freeze(), Default::default())
                .await?;
        }
    }
    report.redone = committed.len();
    let encoded_layout = layout.encode();
    meta.transact(TxnClass::Reclaim, |state, txn| {
        let layout_id = state.id(LAYOUT_BLOB).expect("read above");
        txn.put_blob(layout_id, encoded_layout);
        txn.create_table(MAP_TABLE, 8);
        let blob = txn.create_blob(versions::BLOB);
        txn.put_blob(blob, VersionsBlob::default().encode());
        for (_, object, record) in &committed {
            let tombstone = IntervalRecord::tombstone(RecordState::Applied, record.bricks.clone());
            txn.put_blob(*object, tombstone.encode());
        }
        Ok(())
    })?;
    // The data barrier flushes the copies home before the tombstones and the new layout.
    meta.commit().await?;
    report.upgraded = true;
    tracing::info!(
        redone = report.redone,
        "brick upgraded from format 1 to format {LAYOUT_VERSION}"
    );
    Ok(())
}

/// Format 3 differs from format 2 only in its prepared records, which carry checksums of
/// their staged data: format 2's records are read as they are. The layout's version is raised
/// so that a build of format 2 refuses the brick by its layout rather than by its first new
/// record.
async fn upgrade_format_two(
    meta: &Arc<MetaStore>,
    layout: &BrickLayout,
    report: &mut OpenReport,
) -> Result<()> {
    let encoded_layout = layout.encode();
    meta.transact(TxnClass::Reclaim, |state, txn| {
        let layout_id = state.id(LAYOUT_BLOB).expect("read above");
        txn.put_blob(layout_id, encoded_layout);
        Ok(())
    })?;
    meta.commit().await?;
    report.upgraded = true;
    tracing::info!("brick upgraded from format 2 to format {LAYOUT_VERSION}");
    Ok(())
}

/// A prepare's record and its staged data reach the medium under one sync (`stage`), and a
/// power failure before that sync may keep the record without all of the data. Such a
/// prepare was never acknowledged, so no host can have committed its interval: it becomes an
/// aborted tombstone, durable before the brick serves (a duplicate of the prepare arriving
/// late is refused, as after any abort), and its units are free. Served as prepared, a
/// repeated prepare would have voted yes for data that is not there.
///
/// Records of format 2 carry no checksums; their data was durable before them.
async fn abort_unlanded(
    device: &DeviceRef,
    meta: &Arc<MetaStore>,
    records: &mut [(IntervalId, ObjectId, IntervalRecord)],
) -> Result<usize> {
    let mut unlanded = Vec::new();
    for (index, (_, _, record)) in records.iter().enumerate() {
        if record.state != RecordState::Prepared {
            continue;
        }
        for extent in &record.extents {
            if !extent_landed(device, extent).await? {
                unlanded.push(index);
                break;
            }
        }
    }
    if unlanded.is_empty() {
        return Ok(0);
    }
    let tombstones: Vec<(ObjectId, IntervalRecord)> = unlanded
        .iter()
        .map(|&index| {
            let (_, blob, record) = &records[index];
            let tombstone = IntervalRecord::tombstone(RecordState::Aborted, record.bricks.clone());
            (*blob, tombstone)
        })
        .collect();
    meta.transact(TxnClass::Reclaim, |_, txn| {
        for (blob, tombstone) in &tombstones {
            txn.put_blob(*blob, tombstone.encode());
        }
        Ok(())
    })?;
    meta.commit().await?;
    for (&index, (_, tombstone)) in unlanded.iter().zip(tombstones) {
        let (id, _, record) = &mut records[index];
        tracing::warn!(
            interval = ?id,
            "a prepare's record was found without all of its data (the power failed before \
             it was acknowledged): the interval is aborted here"
        );
        *record = tombstone;
    }
    Ok(unlanded.len())
}

/// Whether an extent's staged bytes match its checksum. One outside the device is left to the
/// open's checks, which refuse the brick naming the record.
async fn extent_landed(device: &DeviceRef, extent: &StagedExtent) -> Result<bool> {
    let Some(expected) = extent.crc else {
        return Ok(true);
    };
    let end = extent.staging.checked_add(u64::from(extent.len));
    if end.is_none_or(|end| end > device.geometry().size) {
        return Ok(true);
    }
    let max = device.geometry().max_io as u64;
    let mut crc = StagedCrc::new();
    let mut at = 0;
    while at < u64::from(extent.len) {
        let len = (u64::from(extent.len) - at).min(max);
        let data = device.read(extent.staging + at, len as usize).await?;
        crc.update(&data);
        at += len;
    }
    Ok(crc.finish() == expected)
}
