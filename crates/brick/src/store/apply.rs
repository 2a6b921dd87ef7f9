//! A commit: fill in the units the interval's writes cover only in part, then map the
//! interval's units in one transaction, keeping or freeing the units they replace.

use strata_cluster::interval::IntervalId;
use strata_core::Result;
use strata_meta::{ObjectId, TxnClass};

use super::map::{self, UnitCommit};
use super::versions::table_name;
use super::{u64_of, BrickStore, Mem};
use crate::record::{IntervalRecord, RecordState};
use crate::space::UNIT;

impl BrickStore {
    /// Applies a committed interval. It is `applying` until this returns; the transaction is
    /// made, not yet durable (the caller commits before it answers).
    pub(super) async fn apply(
        &self,
        id: IntervalId,
        blob: ObjectId,
        record: &IntervalRecord,
    ) -> Result<()> {
        let (plan, unused) = map::commit_plan(&record.extents);
        let filled = match self.fill_in(&plan).await {
            Ok(true) => self.flush_data().await,
            Ok(false) => Ok(()),
            Err(error) => Err(error),
        };
        if let Err(error) = filled {
            self.apply_failed(id);
            return Err(error);
        }
        let mapped = {
            let mut mem = self.lock();
            self.map_in(&mut mem, id, blob, record, &plan, unused)
        };
        if mapped.is_err() {
            self.apply_failed(id);
            return mapped;
        }
        let mut mem = self.lock();
        mem.applying.remove(&id);
        drop(mem);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Writes, around each partly covered unit's own piece, the unit's current data under the
    /// interval's earlier pieces. Only the interval's own staging units are written, so this
    /// is redone safely after a crash, from the same current data (the map changes only in
    /// the transaction that follows). Whether it wrote anything: the caller then flushes it
    /// before that transaction.
    async fn fill_in(&self, plan: &[UnitCommit]) -> Result<bool> {
        let mut wrote = false;
        for unit in plan.iter().filter(|unit| !unit.whole()) {
            wrote = true;
            let offset = unit.home - self.layout.home_offset;
            let mut data = self.read_mapped(None, offset, UNIT as usize).await?;
            for piece in &unit.earlier {
                let bytes = self
                    .read_all(piece.unit + piece.from, (piece.to - piece.from) as usize)
                    .await?;
                data[piece.from as usize..piece.to as usize].copy_from_slice(&bytes);
            }
            let data = data.freeze();
            let target = unit.target;
            if target.from > 0 {
                self.write_all(target.unit, data.slice(..target.from as usize))
                    .await?;
            }
            if target.to < UNIT {
                self.write_all(target.unit + target.to, data.slice(target.to as usize..))
                    .await?;
            }
        }
        Ok(wrote)
    }

    /// The commit's transaction: the map takes the targets, each replaced unit goes to the
    /// version that keeps it or is freed, versions up to the interval's tag that this brick
    /// has not seen yet are created, and the record becomes an `applied` tombstone.
    fn map_in(
        &self,
        mem: &mut Mem,
        id: IntervalId,
        blob: ObjectId,
        record: &IntervalRecord,
        plan: &[UnitCommit],
        unused: Vec<u64>,
    ) -> Result<()> {
        let tag = record.tag;
        let newest = mem.versions_blob.newest;
        let created: Vec<u64> = (newest + 1..=tag).collect();
        let mut numbers = mem.version_numbers();
        numbers.extend(created.iter().copied());
        let tombstone = IntervalRecord::tombstone(RecordState::Applied, record.bricks.clone());
        let mut blob_after = mem.versions_blob;
        blob_after.newest = newest.max(tag);
        let (map_table, home_offset) = (self.map_table, self.layout.home_offset);
        let versions_blob = self.versions_blob;
        let existing = mem.versions.clone();
        // Its staged units were made durable before the prepare's record, and fill-in's writes
        // before this (`apply`).
        let (tables, freed) =
            self.meta
                .transact_data_durable(TxnClass::Reclaim, |state, txn| {
                    let mut tables = existing;
                    for &number in &created {
                        tables.insert(number, txn.create_table(&table_name(number), 8));
                    }
                    if !created.is_empty() {
                        txn.put_blob(versions_blob, blob_after.encode());
                    }
                    let map = state.table(map_table).expect("checked at open");
                    let mut freed = unused;
                    for unit in plan {
                        let index = (unit.home - home_offset) / UNIT;
                        let old = map.get(index).map_or(unit.home, u64_of);
                        let new = unit.target.unit;
                        if new == unit.home {
                            txn.set(map_table, index, &[0; 8]);
                        } else {
                            txn.set(map_table, index, &new.to_le_bytes());
                        }
                        // A table created in this transaction holds nothing yet.
                        let has_copy = |v: u64| {
                            state
                                .table(tables[&v])
                                .is_some_and(|table| table.get(index).is_some())
                        };
                        match map::keeper(&numbers, tag, has_copy) {
                            Some(version) => txn.set(tables[&version], index, &old.to_le_bytes()),
                            None => freed.push(old),
                        }
                    }
                    txn.put_blob(blob, tombstone.encode());
                    Ok((tables, freed))
                })?;
        if !created.is_empty() {
            tracing::info!(
                tag,
                ?created,
                "versions created by the first commit after their cut"
            );
        }
        mem.versions = tables;
        mem.versions_blob = blob_after;
        mem.intervals.get_mut(&id).expect("applying").record = tombstone;
        self.free_later(mem, freed);
        Ok(())
    }
}
