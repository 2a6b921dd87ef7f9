//! Differential compaction of snapshots (Clotho §1.8): an old version's extents that no other
//! version reads are stored as binary deltas against its successor's view and freed.
//!
//! A snapshot `S` is compacted against the nearest later snapshot `N` that descends from it.
//! Per virtual extent, the chain links only `S` reads (`versions::compactable`) are taken out:
//! `S`'s bytes from them are encoded against `N`'s view of the whole extent
//! ([`crate::delta`]), packed with other extents' records into a *delta extent*, and the links
//! are freed. Reading `S` there then costs two reads, the record and `N`'s extent, as in
//! Clotho. While `S` is compacted, `N`'s epoch stays pinned (a "shadow" when `N` itself is
//! deleted) so its view cannot change; `S` cannot be rolled back to or cloned, and `N` cannot
//! be compacted in turn (recursive compaction is not built).
//!
//! Order of durability, per batch of records: the delta extent is written and flushed, then
//! one transaction (with the pool's I/O held, so no request sees half of it) records the
//! entries, frees the taken links and relinks the chains. Each extent's plan is checked again
//! inside that transaction: a link some other version came to read in the meantime is left
//! alone. Uncompacting runs the other way: the links are written back to new extents and
//! flushed, then one transaction puts them back into their chains and drops the entries.

use std::collections::BTreeMap;

use bytes::BytesMut;
use strata_core::{BlockError, Result, WriteFlags};
use strata_meta::{ObjectId, State, TxnClass};

use crate::chain::Source;
use crate::delta::{self, Decoded, TakenLink};
use crate::map::{Piece, GRANULE};
use crate::pool::ThinPool;
use crate::records::{
    compaction_name, deltas_name, CompactionRecord, DeltaEntry, SnapshotRecord, VersionsRecord,
};
use crate::snapshot::{no_snapshot, relink};
use crate::versions::{self, Epoch, Granules, Lineage, Link};

/// What a compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactReport {
    /// The snapshot its deltas are made against.
    pub base: String,
    /// Virtual extents now read through a delta.
    pub extents_compacted: u64,
    /// Extents that had links only this snapshot reads but whose delta would not halve them.
    pub extents_kept: u64,
    /// Physical extents freed, and extents taken for deltas.
    pub extents_freed: u64,
    pub delta_extents: u64,
    /// The snapshot's bytes replaced by deltas, and the deltas' bytes.
    pub data_bytes: u64,
    pub delta_bytes: u64,
    /// Space given back to the pool: freed extents less delta extents, in bytes.
    pub bytes_saved: i64,
}

/// An extent written back: its virtual extent, the entry it replaces, and the new links
/// (reserved extents) with what each gives.
type WrittenBack = (u64, DeltaEntry, Vec<(u64, TakenLink)>);

/// What an uncompaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UncompactReport {
    pub extents_restored: u64,
    /// Physical extents allocated for the restored links, and delta extents freed.
    pub extents_allocated: u64,
    pub delta_extents_freed: u64,
}

/// One extent's plan: the links to take out and where its record lies in the delta extent.
struct Planned {
    extent: u64,
    links: Vec<(u64, TakenLink)>,
    offset: u32,
    len: u32,
    crc: u32,
}

/// Records waiting for their delta extent to be written.
struct Batch {
    bytes: Vec<u8>,
    planned: Vec<Planned>,
}

/// The other readers of a volume's chains, as [`ThinPool::readers`] finds them.
struct Readers {
    others: Vec<Epoch>,
    compacted: Vec<Epoch>,
}

/// The snapshot a compaction works on, and what its checks need.
struct Subject {
    volume_id: u32,
    map: ObjectId,
    epoch: Epoch,
    base: Epoch,
    lineage: Lineage,
}

impl ThinPool {
    /// Compacts `snapshot` of `volume` against its successor. Running it again continues a
    /// compaction cut short; extents already compacted are skipped.
    pub async fn compact_snapshot(&self, volume: &str, snapshot: &str) -> Result<CompactReport> {
        let (record, map) = self.volume_record(volume)?;
        let all = self.store.read(|state| self.versions_records(state))?;
        let versions = all
            .get(&record.id)
            .ok_or_else(|| no_snapshot(volume, snapshot))?;
        let target = (versions.snapshots.iter())
            .find(|s| s.name == snapshot)
            .ok_or_else(|| no_snapshot(volume, snapshot))?;
        let base = match target.compacted {
            Some(base) => base,
            None => successor(versions, target).ok_or_else(|| {
                BlockError::InvalidArgument(format!(
                    "snapshot {volume}@{snapshot} has no later snapshot to be compacted \
                     against; take one first"
                ))
            })?,
        };
        self.check_compactable(&all, record.id, volume, target)?;
        let subject = Subject {
            volume_id: record.id,
            map,
            epoch: target.epoch,
            base,
            lineage: versions.lineage.clone(),
        };
        let base_name = (versions.snapshots.iter())
            .find(|s| s.epoch == base)
            .map_or_else(|| format!("epoch {base} (deleted)"), |s| s.name.clone());
        let mut report = CompactReport {
            base: base_name,
            ..CompactReport::default()
        };
        let extents: Vec<u64> = self.store.read(|state| {
            let table = state.table(map);
            table.map_or_else(Vec::new, |t| t.iter_from(0).map(|(i, _)| i).collect())
        });
        let extent_size = self.extent_size() as usize;
        let mut batch = Batch {
            bytes: Vec::new(),
            planned: Vec::new(),
        };
        let readers = self.store.read(|state| self.readers(state, &subject))?;
        for extent in extents {
            let plan = self.plan_extent(&subject, &readers, extent).await?;
            let Some((links, data, record)) = plan else {
                continue;
            };
            if !delta::worth_compacting(data.len(), record.len()) {
                report.extents_kept += 1;
                continue;
            }
            if batch.bytes.len() + record.len() > extent_size {
                self.commit_batch(&subject, &mut batch, &mut report).await?;
            }
            batch.planned.push(Planned {
                extent,
                links,
                offset: batch.bytes.len() as u32,
                len: record.len() as u32,
                crc: crc32c::crc32c(&record),
            });
            report.data_bytes += data.len() as u64;
            batch.bytes.extend_from_slice(&record);
        }
        self.commit_batch(&subject, &mut batch, &mut report).await?;
        report.bytes_saved =
            (report.extents_freed as i64 - report.delta_extents as i64) * self.extent_size() as i64;
        tracing::info!(pool = %self.name, volume, snapshot, base = %report.base,
            extents = report.extents_compacted, freed = report.extents_freed,
            delta_bytes = report.delta_bytes, saved = report.bytes_saved, "snapshot compacted");
        Ok(report)
    }

    /// The refusal: a snapshot clones read through (they would not see its deltas).
    fn check_compactable(
        &self,
        all: &BTreeMap<u32, VersionsRecord>,
        id: u32,
        volume: &str,
        target: &SnapshotRecord,
    ) -> Result<()> {
        let clones = all
            .values()
            .filter(|r| {
                r.base
                    .is_some_and(|b| b.volume == id && b.epoch == target.epoch)
            })
            .count();
        if clones > 0 {
            return Err(BlockError::InvalidArgument(format!(
                "snapshot {volume}@{} cannot be compacted: {clones} clone(s) read it",
                target.name
            )));
        }
        Ok(())
    }

    /// Who else reads the volume's chains now: the pinned epochs other than the subject's
    /// (its base included), and the compacted snapshots, whose deltas give them granules.
    /// One decode of the versions records, for a whole pass or a whole batch.
    fn readers(&self, state: &State, subject: &Subject) -> Result<Readers> {
        let all = self.versions_records(state)?;
        let mut others = Self::pinned(&all, subject.volume_id);
        others.retain(|&e| e != subject.epoch);
        if !others.contains(&subject.base) {
            others.push(subject.base);
        }
        let compacted = all
            .get(&subject.volume_id)
            .map(compacted_epochs)
            .unwrap_or_default();
        Ok(Readers { others, compacted })
    }

    /// What the subject reads only from this extent's chain, with the links it lives in,
    /// its bytes and their delta record; None when there is nothing to take or it is done.
    /// `readers` may be stale: the batch's transaction checks the plan again.
    async fn plan_extent(
        &self,
        subject: &Subject,
        readers: &Readers,
        extent: u64,
    ) -> Result<Option<(Vec<(u64, TakenLink)>, Vec<u8>, Vec<u8>)>> {
        let planned = self.store.read(|state| {
            if self.delta_entry(state, subject, extent).is_some() {
                return None;
            }
            let taken = self.takeable(state, subject, extent, readers);
            (!taken.is_empty()).then_some(taken)
        });
        let Some(taken) = planned else {
            return Ok(None);
        };
        let data = self.read_taken(&taken).await?;
        let base = self
            .extent_view(subject.volume_id, subject.base, extent)
            .await?;
        let record = delta::encode(
            &taken.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(),
            &data,
            &base,
        )
        .map_err(|e| BlockError::InvalidArgument(format!("thin pool {}: delta: {e}", self.name)))?;
        Ok(Some((taken, data, record)))
    }

    /// The links of a chain the subject alone reads, with the granules it reads from each
    /// as data and as zeros.
    fn takeable(
        &self,
        state: &State,
        subject: &Subject,
        extent: u64,
        readers: &Readers,
    ) -> Vec<(u64, TakenLink)> {
        let chain = self.links(state, subject.map, extent);
        let links: Vec<Link> = chain.iter().map(|(_, l)| l.clone()).collect();
        let given = self.given_at(state, subject.volume_id, &readers.compacted, extent);
        let take = versions::compactable(
            &links,
            &subject.lineage,
            subject.epoch,
            &readers.others,
            &|e| given.get(&e).cloned(),
        );
        let live = state.bitmap(self.ids.live).expect("pool live bitmap");
        chain
            .iter()
            .zip(take)
            .filter(|(_, granules)| !granules.is_empty())
            .map(|((phys, link), granules)| {
                let first = self.first_granule(*phys);
                let data = Granules::from_fn(granules.len(), |g| {
                    granules.contains(g) && live.get(first + g)
                });
                let zeros = granules.minus(&data);
                (
                    *phys,
                    TakenLink {
                        epoch: link.epoch,
                        data,
                        zeros,
                    },
                )
            })
            .collect()
    }

    /// The data granules of the taken links, in granule order.
    async fn read_taken(&self, taken: &[(u64, TakenLink)]) -> Result<Vec<u8>> {
        let mut owner: Vec<(u64, u64)> = taken
            .iter()
            .flat_map(|(phys, link)| link.data.iter().map(move |g| (g, *phys)))
            .collect();
        owner.sort_unstable();
        let mut out = Vec::with_capacity(owner.len() * GRANULE as usize);
        for (g, phys) in owner {
            let offset = self.extent_offset(phys) + g * GRANULE;
            out.extend_from_slice(&self.child.read(offset, GRANULE as usize).await?);
        }
        Ok(out)
    }

    /// A whole extent's bytes as `sources` give them.
    async fn read_whole(
        &self,
        extent: u64,
        sources: &[(std::ops::Range<u64>, Source)],
    ) -> Result<Vec<u8>> {
        let piece = Piece {
            extent,
            within: 0,
            len: self.extent_size(),
            done: 0,
        };
        let mut out = BytesMut::with_capacity(self.extent_size() as usize);
        self.read_sources(&piece, sources, &mut out).await?;
        Ok(out.to_vec())
    }

    fn delta_table(&self, state: &State, volume: u32, epoch: Epoch) -> Option<ObjectId> {
        state.id(&deltas_name(volume, epoch))
    }

    fn delta_entry(&self, state: &State, subject: &Subject, extent: u64) -> Option<DeltaEntry> {
        let table = self.delta_table(state, subject.volume_id, subject.epoch)?;
        DeltaEntry::decode(state.table(table)?.get(extent))
    }

    /// Writes the batch's delta extent, then records it, frees the taken links and relinks
    /// their chains in one transaction under the pool's quiesce.
    async fn commit_batch(
        &self,
        subject: &Subject,
        batch: &mut Batch,
        report: &mut CompactReport,
    ) -> Result<()> {
        if batch.planned.is_empty() {
            return Ok(());
        }
        let mut bytes = std::mem::take(&mut batch.bytes);
        let planned = std::mem::take(&mut batch.planned);
        bytes.resize(bytes.len().next_multiple_of(GRANULE as usize), 0);
        let delta_phys = self.reserve_extent().await?;
        let written = async {
            let offset = self.extent_offset(delta_phys);
            self.child
                .write(offset, bytes.into(), WriteFlags::default())
                .await?;
            self.child.flush().await
        }
        .await;
        if let Err(error) = written {
            self.release_reservation(delta_phys)?;
            return Err(error);
        }
        let quiet = self.quiesce().await;
        let applied = self.freeing_transaction(TxnClass::Normal, |state, txn, freed| {
            let (mut versions, versions_id) = self.subject_record(state, subject)?;
            let snapshot = (versions.snapshots.iter_mut())
                .find(|s| s.epoch == subject.epoch)
                .ok_or_else(|| BlockError::InvalidArgument("the snapshot was deleted".into()))?;
            let (blob, table) = match snapshot.compacted {
                Some(base) if base != subject.base => {
                    return Err(BlockError::InvalidArgument(
                        "the snapshot was compacted against another base meanwhile".into(),
                    ))
                }
                Some(_) => (
                    state.id(&compaction_name(subject.volume_id, subject.epoch)),
                    self.delta_table(state, subject.volume_id, subject.epoch),
                ),
                None => (None, None),
            };
            snapshot.compacted = Some(subject.base);
            let readers = self.readers(state, subject)?;
            let history = self
                .chain_ids()
                .history
                .expect("a pool with snapshots has history");
            let mut applied = Vec::new();
            for plan in &planned {
                let unchanged = self.delta_entry(state, subject, plan.extent).is_none()
                    && self.takeable(state, subject, plan.extent, &readers) == plan.links;
                if !unchanged {
                    continue;
                }
                let kept: Vec<(u64, Epoch)> = (self.links(state, subject.map, plan.extent))
                    .into_iter()
                    .filter(|(phys, _)| !plan.links.iter().any(|(p, _)| p == phys))
                    .map(|(phys, link)| (phys, link.epoch))
                    .collect();
                for (phys, _) in &plan.links {
                    self.unlink_extent(txn, *phys, freed);
                }
                relink(txn, history, subject.map, plan.extent, &kept);
                applied.push(plan);
            }
            if applied.is_empty() {
                return Ok((0, 0, 0));
            }
            let table = table.unwrap_or_else(|| {
                txn.create_table(
                    &deltas_name(subject.volume_id, subject.epoch),
                    DeltaEntry::value_bytes(self.record.granules_per_extent()),
                )
            });
            for plan in &applied {
                let entry = DeltaEntry {
                    phys: delta_phys,
                    offset: plan.offset,
                    len: plan.len,
                    crc: plan.crc,
                };
                let mut covered = Granules::empty(self.record.granules_per_extent());
                for (_, link) in &plan.links {
                    covered.union_with(&link.data);
                    covered.union_with(&link.zeros);
                }
                txn.set(table, plan.extent, &entry.encode(&covered));
            }
            let mut compaction = match blob {
                Some(id) => CompactionRecord::decode(state.blob(id).unwrap_or(&[]))
                    .map_err(|e| BlockError::Corrupt(format!("thin pool {}: {e}", self.name)))?,
                None => CompactionRecord::default(),
            };
            compaction.delta_extents.push(delta_phys);
            let blob = blob.unwrap_or_else(|| {
                txn.create_blob(&compaction_name(subject.volume_id, subject.epoch))
            });
            txn.put_blob(blob, compaction.encode());
            txn.set_bits(self.ids.allocated, delta_phys, 1, true);
            txn.put_blob(versions_id, versions.encode());
            let delta_bytes: u64 = applied.iter().map(|p| p.len as u64).sum();
            let freed_links: u64 = applied.iter().map(|p| p.links.len() as u64).sum();
            Ok((applied.len() as u64, delta_bytes, freed_links))
        });
        let settled = match &applied {
            Ok((count, _, _)) if *count > 0 => self.allocator().map(|mut a| a.settle(delta_phys)),
            _ => self.release_reservation(delta_phys),
        };
        let refreshed = self.store.read(|state| self.refresh_views(state));
        drop(quiet);
        let (count, delta_bytes, freed) = applied?;
        settled?;
        refreshed?;
        if count > 0 {
            self.store.commit().await?;
            report.extents_compacted += count;
            report.extents_freed += freed;
            report.delta_extents += 1;
            report.delta_bytes += delta_bytes;
        }
        Ok(())
    }

    /// The subject's versions record and its object id, from `state`.
    fn subject_record(
        &self,
        state: &State,
        subject: &Subject,
    ) -> Result<(VersionsRecord, ObjectId)> {
        let id = state
            .id(&crate::records::versions_name(subject.volume_id))
            .ok_or_else(|| BlockError::InvalidArgument("the volume's versions are gone".into()))?;
        let record = VersionsRecord::decode(state.blob(id).unwrap_or(&[]))
            .map_err(|e| BlockError::Corrupt(format!("thin pool {}: {e}", self.name)))?;
        Ok((record, id))
    }
}

/// The epochs of a volume's compacted snapshots.
pub(crate) fn compacted_epochs(versions: &VersionsRecord) -> Vec<Epoch> {
    (versions.snapshots.iter())
        .filter(|s| s.compacted.is_some())
        .map(|s| s.epoch)
        .collect()
}

/// The nearest later snapshot that descends from `target`: what it is compacted against.
fn successor(versions: &VersionsRecord, target: &SnapshotRecord) -> Option<Epoch> {
    (versions.snapshots.iter())
        .filter(|s| s.epoch > target.epoch && versions.lineage.sees(s.epoch, target.epoch))
        .map(|s| s.epoch)
        .min()
}

/// A compacted extent of a snapshot, decoded: the granules its delta gives.
pub(crate) struct Restored {
    decoded: Decoded,
    /// Data granule → its 4 KiB in `decoded.data`.
    at: BTreeMap<u64, usize>,
}

/// What a snapshot reads at one granule of a compacted extent.
pub(crate) enum Given<'a> {
    Data(&'a [u8]),
    Zeros,
}

impl Restored {
    fn new(decoded: Decoded) -> Restored {
        let at = (decoded.data_granules().into_iter())
            .enumerate()
            .map(|(i, g)| (g, i * GRANULE as usize))
            .collect();
        Restored { decoded, at }
    }

    /// What the delta gives at granule `g`, if it covers it.
    pub(crate) fn given(&self, g: u64) -> Option<Given<'_>> {
        if let Some(&at) = self.at.get(&g) {
            return Some(Given::Data(&self.decoded.data[at..at + GRANULE as usize]));
        }
        (self.decoded.links.iter())
            .any(|l| l.zeros.contains(g))
            .then_some(Given::Zeros)
    }
}

impl ThinPool {
    /// The epoch snapshot `epoch` of `volume` is compacted against, if it is.
    pub(crate) fn compaction_base(&self, volume: u32, epoch: Epoch) -> Result<Option<Epoch>> {
        let record = self.versions_record(volume)?;
        Ok((record.iter())
            .flat_map(|v| v.snapshots.iter())
            .find(|s| s.epoch == epoch)
            .and_then(|s| s.compacted))
    }

    /// What version `epoch` of `volume` reads in the whole of `extent`: its chains, and its
    /// delta where it is compacted (decoded against its own base's view, and so on down a
    /// series of compacted snapshots, each base later than the last).
    pub(crate) fn extent_view<'a>(
        &'a self,
        volume: u32,
        epoch: Epoch,
        extent: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>>> + Send + 'a>> {
        Box::pin(async move {
            let all = self.store.read(|state| self.versions_records(state))?;
            let reading = self.reading(&all, volume, epoch)?;
            let per_extent = self.record.granules_per_extent();
            let sources = self.store.read(|state| {
                self.chain_ids()
                    .resolve(state, &reading, extent, 0..per_extent)
            });
            let mut bytes = self.read_whole(extent, &sources).await?;
            let (Some(entry), Some(base)) = (
                self.compacted_entry(volume, epoch, extent),
                self.compaction_base(volume, epoch)?,
            ) else {
                return Ok(bytes);
            };
            let what = format!("volume {volume} epoch {epoch}");
            let restored = self
                .restore_compacted(&what, volume, base, extent, entry)
                .await?;
            for g in 0..per_extent {
                let at = (g * GRANULE) as usize..((g + 1) * GRANULE) as usize;
                match restored.given(g) {
                    Some(Given::Data(data)) => bytes[at].copy_from_slice(data),
                    Some(Given::Zeros) => bytes[at].fill(0),
                    None => {}
                }
            }
            Ok(bytes)
        })
    }

    /// Decodes a compacted extent against its base's view of it.
    pub(crate) async fn restore_compacted(
        &self,
        what: &str,
        volume: u32,
        base: Epoch,
        extent: u64,
        entry: DeltaEntry,
    ) -> Result<Restored> {
        let base_view = self.extent_view(volume, base, extent).await?;
        self.restore(what, extent, entry, &base_view).await
    }

    /// The delta entry of `extent` of snapshot `epoch` of `volume`, if it is compacted there.
    pub(crate) fn compacted_entry(
        &self,
        volume: u32,
        epoch: Epoch,
        extent: u64,
    ) -> Option<DeltaEntry> {
        self.store.read(|state| {
            let table = self.delta_table(state, volume, epoch)?;
            DeltaEntry::decode(state.table(table)?.get(extent))
        })
    }

    /// Reads and decodes a compacted extent's record against its base: two reads, as in
    /// Clotho. A damaged record is an error that names it, never wrong data.
    pub(crate) async fn restore(
        &self,
        what: &str,
        extent: u64,
        entry: DeltaEntry,
        base: &[u8],
    ) -> Result<Restored> {
        let damaged = |problem: String| {
            tracing::error!(pool = %self.name, snapshot = what, extent, %problem, "compacted extent is damaged");
            BlockError::Corrupt(format!(
                "thin pool {}: {what}: the delta of extent {extent} is damaged: {problem}",
                self.name
            ))
        };
        if entry.phys >= self.extents()
            || (entry.offset as u64 + entry.len as u64) > self.extent_size()
        {
            return Err(damaged(format!("it lies outside the pool ({entry:?})")));
        }
        // Records are packed at any byte; the child reads whole granules.
        let start = entry.offset as u64 / GRANULE * GRANULE;
        let end = (entry.offset as u64 + entry.len as u64).next_multiple_of(GRANULE);
        let granules = self
            .child
            .read(
                self.extent_offset(entry.phys) + start,
                (end - start) as usize,
            )
            .await?;
        let skip = (entry.offset as u64 - start) as usize;
        let record = &granules[skip..skip + entry.len as usize];
        if crc32c::crc32c(record) != entry.crc {
            return Err(damaged("its checksum does not match".into()));
        }
        let per_extent = self.record.granules_per_extent();
        let decoded = delta::decode(record, per_extent, base).map_err(damaged)?;
        Ok(Restored::new(decoded))
    }

    /// Deletes a compacted snapshot's deltas in the transaction that deletes it.
    pub(crate) fn drop_compaction(
        &self,
        state: &State,
        txn: &mut strata_meta::Txn,
        volume: u32,
        epoch: Epoch,
        freed: &mut Vec<u64>,
    ) -> Result<u64> {
        let mut dropped = 0;
        if let Some(blob) = state.id(&compaction_name(volume, epoch)) {
            let record = CompactionRecord::decode(state.blob(blob).unwrap_or(&[]))
                .map_err(|e| BlockError::Corrupt(format!("thin pool {}: {e}", self.name)))?;
            for phys in record.delta_extents {
                freed.push(phys);
                txn.set_bits(self.ids.allocated, phys, 1, false);
                dropped += 1;
            }
            txn.delete(blob);
        }
        if let Some(table) = state.id(&deltas_name(volume, epoch)) {
            txn.delete(table);
        }
        Ok(dropped)
    }

    /// The granules each of the `compacted` snapshots of `volume` reads from its delta, not
    /// from the chains, at `extent` (a walk over a chain must not let them fall through).
    pub(crate) fn given_at(
        &self,
        state: &State,
        volume: u32,
        compacted: &[Epoch],
        extent: u64,
    ) -> BTreeMap<Epoch, Granules> {
        let per_extent = self.record.granules_per_extent();
        (compacted.iter())
            .filter_map(|&epoch| {
                let table = state.table(self.delta_table(state, volume, epoch)?)?;
                let value = table.get(extent)?;
                DeltaEntry::decode(Some(value))?;
                Some((epoch, DeltaEntry::covered(Some(value), per_extent)))
            })
            .collect()
    }

    /// Bytes of a snapshot's delta records (0 when it is not compacted).
    pub(crate) fn delta_bytes(&self, state: &State, volume: u32, epoch: Epoch) -> u64 {
        let table = self
            .delta_table(state, volume, epoch)
            .and_then(|id| state.table(id));
        table.map_or(0, |t| {
            t.iter_from(0)
                .filter_map(|(_, v)| DeltaEntry::decode(Some(v)))
                .map(|e| e.len as u64)
                .sum()
        })
    }

    /// Writes `snapshot`'s compacted extents back as chain links and drops its deltas: it
    /// reads as before, from its own extents again.
    pub async fn uncompact_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
    ) -> Result<UncompactReport> {
        let (record, map) = self.volume_record(volume)?;
        let all = self.store.read(|state| self.versions_records(state))?;
        let target = (all.get(&record.id).into_iter())
            .flat_map(|v| v.snapshots.iter())
            .find(|s| s.name == snapshot)
            .ok_or_else(|| no_snapshot(volume, snapshot))?;
        let Some(base) = target.compacted else {
            return Err(BlockError::InvalidArgument(format!(
                "snapshot {volume}@{snapshot} is not compacted"
            )));
        };
        let subject = Subject {
            volume_id: record.id,
            map,
            epoch: target.epoch,
            base,
            lineage: all[&record.id].lineage.clone(),
        };
        let what = format!("{volume}@{snapshot}");
        let entries: Vec<(u64, DeltaEntry)> = self.store.read(|state| {
            let table = self
                .delta_table(state, record.id, target.epoch)
                .and_then(|t| state.table(t));
            (table.into_iter())
                .flat_map(|t| t.iter_from(0))
                .filter_map(|(i, v)| DeltaEntry::decode(Some(v)).map(|e| (i, e)))
                .collect()
        });
        let mut report = UncompactReport::default();
        for chunk in entries.chunks(32) {
            let mut restored = Vec::new();
            for &(extent, entry) in chunk {
                let restored_extent = self
                    .restore_compacted(&what, subject.volume_id, subject.base, extent, entry)
                    .await?;
                let links = self.write_back(&restored_extent).await;
                let links = match links {
                    Ok(links) => links,
                    Err(error) => {
                        self.release_all(
                            restored
                                .iter()
                                .flat_map(|(_, _, l): &WrittenBack| l.iter().map(|(p, _)| *p)),
                        )?;
                        return Err(error);
                    }
                };
                restored.push((extent, entry, links));
            }
            self.child.flush().await?;
            self.put_back(&subject, restored, &mut report).await?;
        }
        let quiet = self.quiesce().await;
        let finished = self.freeing_transaction(TxnClass::Normal, |state, txn, freed| {
            let (mut versions, versions_id) = self.subject_record(state, &subject)?;
            let left = self
                .delta_table(state, record.id, subject.epoch)
                .and_then(|t| state.table(t))
                .is_some_and(|t| {
                    t.iter_from(0)
                        .any(|(_, v)| DeltaEntry::decode(Some(v)).is_some())
                });
            if left {
                return Err(BlockError::InvalidArgument(format!(
                    "{what}: extents were compacted again meanwhile; run uncompact again"
                )));
            }
            let dropped = self.drop_compaction(state, txn, record.id, subject.epoch, freed)?;
            if let Some(s) = versions
                .snapshots
                .iter_mut()
                .find(|s| s.epoch == subject.epoch)
            {
                s.compacted = None;
            }
            txn.put_blob(versions_id, versions.encode());
            Ok(dropped)
        });
        let refreshed = self.store.read(|state| self.refresh_views(state));
        drop(quiet);
        report.delta_extents_freed = finished?;
        refreshed?;
        self.store.commit().await?;
        // The base's epoch is no longer pinned by the deltas: what only it held is freed.
        self.collect(volume).await?;
        tracing::info!(pool = %self.name, volume, snapshot, extents = report.extents_restored, "snapshot uncompacted");
        Ok(report)
    }

    /// Writes each taken link's data granules to a new extent; returns them, reserved.
    async fn write_back(&self, restored: &Restored) -> Result<Vec<(u64, TakenLink)>> {
        let mut out: Vec<(u64, TakenLink)> = Vec::new();
        for link in &restored.decoded.links {
            let phys = match self.reserve_extent().await {
                Ok(phys) => phys,
                Err(error) => {
                    self.release_all(out.iter().map(|(p, _)| *p))?;
                    return Err(error);
                }
            };
            out.push((phys, link.clone()));
            for g in link.data.iter() {
                let Some(Given::Data(bytes)) = restored.given(g) else {
                    unreachable!("a data granule of the record");
                };
                let offset = self.extent_offset(phys) + g * GRANULE;
                let written = self
                    .child
                    .write(offset, bytes.to_vec().into(), WriteFlags::default())
                    .await;
                if let Err(error) = written {
                    self.release_all(out.iter().map(|(p, _)| *p))?;
                    return Err(error);
                }
            }
        }
        Ok(out)
    }

    fn release_all(&self, extents: impl Iterator<Item = u64>) -> Result<()> {
        for phys in extents {
            self.release_reservation(phys)?;
        }
        Ok(())
    }

    /// Puts written-back links into their chains and drops their entries, in one
    /// transaction under the quiesce.
    async fn put_back(
        &self,
        subject: &Subject,
        restored: Vec<WrittenBack>,
        report: &mut UncompactReport,
    ) -> Result<()> {
        let quiet = self.quiesce().await;
        let per_extent = self.record.granules_per_extent();
        let applied = self.store.transact(TxnClass::Normal, |state, txn| {
            let history = self
                .chain_ids()
                .history
                .expect("a pool with snapshots has history");
            let masked = self
                .chain_ids()
                .masked
                .expect("a pool with snapshots has masks");
            let table = self
                .delta_table(state, subject.volume_id, subject.epoch)
                .ok_or_else(|| BlockError::InvalidArgument("the snapshot was deleted".into()))?;
            let mut applied = Vec::new();
            for (extent, entry, links) in &restored {
                if self.delta_entry(state, subject, *extent) != Some(*entry) {
                    continue;
                }
                let mut chain: Vec<(u64, Epoch)> = (self.links(state, subject.map, *extent))
                    .into_iter()
                    .map(|(phys, link)| (phys, link.epoch))
                    .chain(links.iter().map(|(phys, link)| (*phys, link.epoch)))
                    .collect();
                chain.sort_unstable_by_key(|link| std::cmp::Reverse(link.1));
                if chain.windows(2).any(|w| w[0].1 == w[1].1) {
                    return Err(BlockError::Corrupt(format!(
                        "thin pool {}: extent {extent}: a restored link's epoch is in its chain",
                        self.name
                    )));
                }
                relink(txn, history, subject.map, *extent, &chain);
                for (phys, link) in links {
                    let first = self.first_granule(*phys);
                    txn.set_bits(self.ids.allocated, *phys, 1, true);
                    txn.set_bits(masked, first, per_extent, false);
                    for g in link.data.iter() {
                        txn.set_bits(self.ids.live, first + g, 1, true);
                    }
                    for g in link.zeros.iter() {
                        txn.set_bits(masked, first + g, 1, true);
                    }
                }
                txn.set(table, *extent, &DeltaEntry::none(per_extent));
                applied.push(*extent);
            }
            Ok(applied)
        });
        let mut settled = Ok(());
        for (extent, _, links) in &restored {
            let used = applied.as_ref().is_ok_and(|a| a.contains(extent));
            for (phys, _) in links {
                let result = if used {
                    self.allocator().map(|mut a| a.settle(*phys))
                } else {
                    self.release_reservation(*phys)
                };
                settled = settled.and(result);
            }
        }
        drop(quiet);
        let applied = applied?;
        settled?;
        report.extents_restored += applied.len() as u64;
        report.extents_allocated += (restored.iter())
            .filter(|(e, _, _)| applied.contains(e))
            .map(|(_, _, l)| l.len() as u64)
            .sum::<u64>();
        self.store.commit().await?;
        Ok(())
    }
}
