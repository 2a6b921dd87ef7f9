//! The destage mechanism: runs the planner's batches through the slow child, then switches
//! the map, then frees the log.
//!
//! Steps, and what a power cut at each leaves (the crash suite cuts at every one):
//! 1. commit: every free so far is durable, so the planner may use the blocks it frees;
//! 2. bases for staged ranges that have none (one transaction, not yet durable);
//! 3. plan (in memory) and reserve the targets, pin the slots;
//! 4. per extent, ascending, the whole batch in flight at once (or strands of
//!    `destage-depth`): read the slots from the log, write the targets (free blocks: nothing live is overwritten, so a cut here leaves
//!    the map pointing at the log, which still holds every block);
//! 5. flush the slow child: the destaged data is durable;
//! 6. switch, in one transaction, every block still in the slot it was planned from (a block
//!    overwritten meanwhile is skipped and its target released): the map points at the
//!    targets and the slots are freed — in memory;
//! 7. commit: the switch is durable (the commit flushes both children again first);
//! 8. only now are the freed slots reused (the `log` module's pending frees).

use futures_util::future::{join_all, try_join_all, BoxFuture, FutureExt};
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use strata_core::{BlockError, Result, WriteFlags};
use strata_meta::TxnClass;

use crate::map::{encode_moved, Location};
use crate::plan::{self, Batch, Plan, PlanParams, PlanStats, Staged};
use crate::records::{base_of, locate, u64_at};
use crate::shape::{runs, BLOCK};
use crate::stage::Stage;
use crate::trigger::Decision;

/// How often the background destager looks at its trigger without being kicked.
const TICK: Duration = Duration::from_millis(100);

/// Extents' batches a destage has in flight at once (the density trigger waits for as many).
pub(crate) const BATCHES_IN_FLIGHT: usize = 4;

/// What one destage did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DestageReport {
    /// Blocks switched to the slow child.
    pub blocks: u64,
    /// Blocks overwritten while being copied (left in the log).
    pub skipped: u64,
    pub batches: u64,
    pub requests: u64,
    pub strands: u64,
    pub placement: PlanStats,
}

impl Stage {
    /// Destages everything staged now (the `destage` verb, and the full trigger).
    pub async fn destage_all(&self) -> Result<DestageReport> {
        let _one = self.destaging.lock().await;
        self.destage_locked(Decision::All).await
    }

    /// After a write: the background destager is kicked, or (inline) the trigger's decisions
    /// are carried out now, slice after slice, until it has nothing more to do.
    pub(crate) async fn after_write(&self) -> Result<()> {
        if self.settings.background {
            self.kick.notify_one();
            return Ok(());
        }
        while let Some(report) = self.destage_if_triggered().await? {
            if report.blocks == 0 {
                break;
            }
        }
        Ok(())
    }

    pub(crate) async fn destage_if_triggered(&self) -> Result<Option<DestageReport>> {
        let decision = self.decide()?;
        if decision == Decision::Nothing {
            return Ok(None);
        }
        let _one = self.destaging.lock().await;
        // Decided again under the lock: a destage that just ended may have done it.
        let decision = self.decide()?;
        if decision == Decision::Nothing {
            return Ok(None);
        }
        self.destage_locked(decision).await.map(Some)
    }

    fn decide(&self) -> Result<Decision> {
        let space = self.space()?;
        let staged: Vec<(u64, u64)> = space.staged.iter().map(|(&e, &n)| (e, n)).collect();
        let used = space.staged_blocks();
        let trigger = &self.settings.trigger;
        let was = self.draining.load(Ordering::Relaxed);
        let draining = trigger.draining(used, self.shape.log_slots, was);
        self.draining.store(draining, Ordering::Relaxed);
        Ok(trigger.decide(used, self.shape.log_slots, &staged, draining))
    }

    /// A write found no room for `count` blocks: unless a destage that ran meanwhile (or a
    /// commit) already made room, destage the trigger's backstop (`Trigger::backstop`:
    /// everything for `full`, a slice of the densest extents for the others), then, if that
    /// was not enough (blocks overwritten meanwhile stay in the log), everything.
    /// The caller holds `destaging`.
    pub(crate) async fn make_room(&self, count: u64) -> Result<()> {
        self.reclaim()?;
        if self.space()?.log.free() >= count {
            return Ok(());
        }
        self.commit().await?;
        if self.space()?.log.free() >= count {
            return Ok(());
        }
        let slice = {
            let space = self.space()?;
            let staged: Vec<(u64, u64)> = space.staged.iter().map(|(&e, &n)| (e, n)).collect();
            self.settings
                .trigger
                .backstop(count, self.shape.log_slots, &staged)
        };
        if let Decision::Extents(_) = slice {
            self.destage_locked(slice).await?;
            if self.space()?.log.free() >= count {
                return Ok(());
            }
        }
        self.destage_locked(Decision::All).await.map(drop)
    }

    /// Runs one destage; the caller holds `destaging`.
    pub(crate) async fn destage_locked(&self, decision: Decision) -> Result<DestageReport> {
        self.destage_running.store(true, Ordering::Relaxed);
        let result = self.run_destage(&decision).await;
        self.destage_running.store(false, Ordering::Relaxed);
        self.counters.set_progress(0, 0);
        self.space()?.log.unpin_all();
        self.reclaim()?;
        match &result {
            Ok(report) => self.counters.destaged(report),
            Err(error) => {
                self.counters.bump(&self.counters.destage_failures, 1);
                tracing::error!(stage = %self.name, %error, "destage failed; the blocks stay in the log");
            }
        }
        result
    }

    async fn run_destage(&self, decision: &Decision) -> Result<DestageReport> {
        self.commit().await?;
        let staged = self.staged_entries(decision);
        if staged.is_empty() {
            return Ok(DestageReport::default());
        }
        let plan = self.plan_destage(&staged)?;
        let total = staged.len() as u64;
        self.counters.set_progress(0, total);
        let copied = self.copy(&plan).await;
        let flushed = match copied {
            Ok(()) => self.slow.flush().await,
            Err(error) => Err(error),
        };
        if let Err(error) = flushed {
            self.release_targets(&plan)?;
            return Err(error);
        }
        let switched = self.switch(&plan).await;
        let (blocks, skipped) = match switched {
            Ok(counts) => counts,
            Err(error) => {
                self.release_targets(&plan)?;
                return Err(error);
            }
        };
        self.commit().await?;
        Ok(DestageReport {
            blocks,
            skipped,
            batches: plan.batches.len() as u64,
            requests: plan.batches.iter().map(|b| b.requests.len() as u64).sum(),
            strands: plan.batches.iter().map(|b| b.strands.len() as u64).sum(),
            placement: plan.stats,
        })
    }

    /// (slot, logical block) of every staged block the decision takes.
    fn staged_entries(&self, decision: &Decision) -> Vec<(u64, u64)> {
        let extents: Option<BTreeSet<u64>> = match decision {
            Decision::Extents(extents) => Some(extents.iter().copied().collect()),
            _ => None,
        };
        self.store.read(|state| {
            let Some(reverse) = state.table(self.ids.reverse) else {
                return Vec::new();
            };
            reverse
                .iter_from(0)
                .map(|(slot, _)| (slot, u64_at(reverse, slot) - 1))
                .filter(|&(_, logical)| {
                    extents
                        .as_ref()
                        .is_none_or(|e| e.contains(&self.shape.extent_of(logical)))
                })
                .collect()
        })
    }

    /// Bases, then the plan; its targets reserved and its slots pinned.
    fn plan_destage(&self, staged: &[(u64, u64)]) -> Result<Plan> {
        let mut space = self.space()?;
        let ranges = staged.iter().map(|&(_, l)| self.shape.range_of(l));
        // Reclaim class: a destage gives back more metadata than it takes, so it must run
        // on a full store (it is what empties it).
        self.ensure_bases(&mut space, ranges, TxnClass::Reclaim)?;
        let blocks: Vec<Staged> = self.store.read(|state| {
            staged
                .iter()
                .map(|&(slot, logical)| {
                    let base = base_of(state, &self.ids, &self.shape, logical).expect("ensured");
                    Staged {
                        logical,
                        slot,
                        home: self.shape.home(logical, base),
                    }
                })
                .collect()
        });
        let params = PlanParams {
            extent_blocks: self.shape.extent_blocks(),
            window_ranges: self.settings.window,
            strand: self.settings.destage_depth.unwrap_or(usize::MAX),
        };
        let plan = plan::plan(&blocks, &space.alloc, params).map_err(|none| {
            tracing::error!(stage = %self.name, logical = none.logical, "no free block left on the slow child for a destage");
            BlockError::NoSpace
        })?;
        for placement in plan.batches.iter().flat_map(|b| &b.placements) {
            space.alloc.reserve(placement.target);
        }
        space.log.pin(staged.iter().map(|&(slot, _)| slot));
        Ok(plan)
    }

    fn release_targets(&self, plan: &Plan) -> Result<()> {
        let mut space = self.space()?;
        for placement in plan.batches.iter().flat_map(|b| &b.placements) {
            space.alloc.release(placement.target);
        }
        Ok(())
    }

    /// Step 4: every batch, up to `BATCHES_IN_FLIGHT` extents at once so that the slow
    /// child's queues do not run dry at each batch's tail (with a `destage-depth`, one batch
    /// after the other). After a failure no further batch starts, and the ones in flight are
    /// awaited, not dropped halfway.
    async fn copy(&self, plan: &Plan) -> Result<()> {
        let in_flight = match self.settings.destage_depth {
            None => BATCHES_IN_FLIGHT,
            Some(_) => 1,
        };
        // Boxed as `Send` here, where the lifetimes are concrete: left generic, rustc cannot
        // prove the destage future `Send` for every lifetime (rust-lang/rust#64552).
        let mut pending = plan
            .batches
            .iter()
            .map(|batch| -> BoxFuture<'_, Result<()>> { self.write_batch(batch).boxed() });
        let mut running: FuturesUnordered<_> = pending.by_ref().take(in_flight).collect();
        let mut failure = None;
        while let Some(result) = running.next().await {
            if let Err(error) = result {
                failure.get_or_insert(error);
            }
            if failure.is_none() {
                running.extend(pending.next());
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// One extent: its blocks read from the log, then written ascending, a strand at a time.
    async fn write_batch(&self, batch: &Batch) -> Result<()> {
        let data = self
            .read_slots(batch.placements.iter().map(|p| p.slot))
            .await?;
        // A run longer than the slow child takes in one request goes as several, back to back
        // in the same strand (a 16 MiB extent written whole is one run).
        let per_request = (u64::from(self.slow.geometry().max_io) / BLOCK).max(1) as usize;
        for strand in &batch.strands {
            let pieces = batch.requests[strand.clone()]
                .iter()
                .flat_map(|request| batch.placements[request.clone()].chunks(per_request));
            let writes = pieces.map(|placements| {
                let mut buffer = BytesMut::with_capacity(placements.len() * BLOCK as usize);
                for placement in placements {
                    buffer.extend_from_slice(&data[&placement.slot]);
                }
                let at = self.shape.block_offset(placements[0].target);
                self.slow.write(at, buffer.freeze(), WriteFlags::default())
            });
            try_join_all(writes).await?;
            // Progress by strand, not by batch: a destage of one extent shows it too.
            let blocks = batch.requests[strand.clone()]
                .iter()
                .map(|request| request.len() as u64)
                .sum();
            self.counters.add_progress(blocks);
        }
        Ok(())
    }

    /// The contents of `slots`, one read per run of consecutive slots, all at once.
    async fn read_slots(&self, slots: impl Iterator<Item = u64>) -> Result<BTreeMap<u64, Bytes>> {
        let mut sorted: Vec<u64> = slots.collect();
        sorted.sort_unstable();
        let per_read = (u64::from(self.fast.geometry().max_io) / BLOCK).max(1) as usize;
        let pieces: Vec<&[u64]> = runs(&sorted, |s| *s)
            .into_iter()
            .flat_map(|run| sorted[run].chunks(per_read))
            .collect();
        let reads = pieces.into_iter().map(|piece| {
            let first = piece[0];
            let len = piece.len() * BLOCK as usize;
            async move {
                (
                    first,
                    self.fast.read(self.shape.slot_offset(first), len).await,
                )
            }
        });
        let mut data = BTreeMap::new();
        for (first, result) in join_all(reads).await {
            let bytes = match result {
                Ok(bytes) => bytes.freeze(),
                Err(error) => {
                    self.counters.bump(&self.counters.fast_read_errors, 1);
                    self.fast_failed("read of the log during a destage", &error);
                    return Err(error);
                }
            };
            for i in 0..bytes.len() / BLOCK as usize {
                let block = bytes.slice(i * BLOCK as usize..(i + 1) * BLOCK as usize);
                data.insert(first + i as u64, block);
            }
        }
        Ok(data)
    }

    /// Step 6: the map switched to the targets for every block still where it was planned
    /// from; returns (switched, skipped).
    async fn switch(&self, plan: &Plan) -> Result<(u64, u64)> {
        let _all = self.locks.write_all().await;
        let ids = self.ids;
        let placements: Vec<_> = plan.batches.iter().flat_map(|b| &b.placements).collect();
        let switched: Vec<bool> = self.store.transact(TxnClass::Reclaim, |state, txn| {
            let mut switched = Vec::with_capacity(placements.len());
            for placement in &placements {
                let logical = placement.logical;
                let current = locate(state, &ids, &self.shape, logical);
                if current != Location::Log(placement.slot) {
                    switched.push(false);
                    continue;
                }
                self.unlink(state, txn, logical);
                let base = base_of(state, &ids, &self.shape, logical).expect("planned with one");
                if placement.target == self.shape.home(logical, base) {
                    txn.set_bits(ids.home, logical, 1, true);
                    txn.set(ids.moved, logical, &[0; 8]);
                } else {
                    let record = encode_moved(Location::Disk(placement.target));
                    txn.set(ids.moved, logical, &record.to_le_bytes());
                }
                txn.set_bits(ids.allocated, placement.target, 1, true);
                switched.push(true);
            }
            Ok(switched)
        })?;
        let mut space = self.space()?;
        let mut counts = (0, 0);
        for (placement, &done) in placements.iter().zip(&switched) {
            if done {
                counts.0 += 1;
                self.free_after(
                    &mut space,
                    &[Location::Log(placement.slot)],
                    placement.logical,
                );
            } else {
                counts.1 += 1;
                space.alloc.release(placement.target);
            }
        }
        Ok(counts)
    }

    /// The background destager (served stages): wakes on a write's kick or every tick, and
    /// carries out the trigger's decision, one destage a step.
    pub(crate) fn spawn_destager(self: &Arc<Self>) {
        let stage = Arc::downgrade(self);
        let kick = self.kick.clone();
        let runtime = self.settings.runtime.clone();
        self.background.spawn(runtime.clone().as_ref(), |worker| async move {
            loop {
                // Biased: tokio picks a ready branch at random otherwise, which makes a
                // simulated run depend on more than its seed.
                tokio::select! {
                    biased;
                    _ = kick.notified() => {}
                    alive = worker.sleep(runtime.as_ref(), TICK) => if !alive { return },
                }
                let Some(_step) = worker.step().await else { return };
                let Some(stage) = stage.upgrade() else { return };
                match stage.destage_if_triggered().await {
                    // A slice done: look again at once, the drain may go on.
                    Ok(Some(report)) if report.blocks > 0 => kick.notify_one(),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(stage = %stage.name, %error, "background destage failed; retrying at the next trigger");
                    }
                }
            }
        });
    }
}
