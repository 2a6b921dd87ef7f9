//! Background work: resync (dirty regions after a crash, then new or replaced members) and
//! the lazy clearing of write-intent bits.
//!
//! One resync task runs at a time, one region per step, holding only a weak reference
//! between steps so that dropping the mirror stops it. Each copy holds the region's lock
//! exclusively, so a write to that region waits and then lands on the copied data, never
//! under it. A new member's progress is made durable every `resync_checkpoint` bytes (after
//! flushing it): a restart resumes there rather than at zero.
//!
//! A bit is cleared only when its region has had no write in flight and none started since a
//! snapshot taken *before* a flush of every member completed: then every member holds the
//! same bytes there durably, which is what a clear bit promises.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::join_all;
use strata_core::{Activity, BlockError, DeviceRef, Result, WriteFlags};
use strata_meta::TxnClass;

use super::meta::same_device;
use super::policy::{chunks, region_bytes, sync_source, MemberState};
use super::state::Inner;

impl Inner {
    /// Regions whose bit may be cleared once a flush that starts now completes, with the
    /// write generation each had.
    pub fn clean_candidates(&self) -> Result<Vec<(u64, u64)>> {
        let now = self.runtime.now();
        let regions = self.regions_lock()?;
        Ok(regions
            .track
            .iter()
            .filter(|(r, t)| {
                t.inflight == 0
                    && t.set_txn.is_some()
                    && !regions.needs_sync.contains(r)
                    && now.saturating_sub(t.last_write) >= self.options.bitmap_clear
            })
            .map(|(&r, t)| (r, t.generation))
            .collect())
    }

    /// Clears the bits of candidates untouched since they were picked (not yet durable).
    /// Returns whether it cleared any.
    pub fn clear_bits(&self, candidates: &[(u64, u64)]) -> Result<bool> {
        if candidates.is_empty() {
            return Ok(false);
        }
        let mut regions = self.regions_lock()?;
        let clear: Vec<u64> = candidates
            .iter()
            .filter(|(r, generation)| {
                regions.track.get(r).is_some_and(|t| {
                    t.inflight == 0 && t.generation == *generation && t.set_txn.is_some()
                }) && !regions.needs_sync.contains(r)
            })
            .map(|(r, _)| *r)
            .collect();
        if clear.is_empty() {
            return Ok(false);
        }
        self.store.transact(TxnClass::Reclaim, |_, txn| {
            for &r in &clear {
                txn.set_bits(self.ids.dirty, r, 1, false);
            }
            Ok(())
        })?;
        for r in clear {
            regions.track.remove(&r);
        }
        Ok(true)
    }

    /// Every `bitmap_clear`, cleans idle regions (flushing the members first) and commits.
    pub fn start_cleaner(self: &Arc<Self>) {
        let interval = self.options.bitmap_clear;
        if interval.is_zero() {
            return;
        }
        let weak = Arc::downgrade(self);
        let runtime = self.runtime.clone();
        self.background.spawn(self.runtime.as_ref(), |worker| async move {
            while worker.sleep(runtime.as_ref(), interval).await {
                let Some(_step) = worker.step().await else { return };
                let Some(inner) = weak.upgrade() else { return };
                if inner.clean_candidates().is_ok_and(|c| c.is_empty()) {
                    continue;
                }
                let result = async {
                    inner.flush_members().await?;
                    inner.commit().await
                }
                .await;
                if let Err(error) = result {
                    tracing::warn!(mirror = %inner.name, %error, "bitmap cleaning failed; will retry");
                }
            }
        });
    }

    /// Starts the resync task unless it runs; if it runs, makes it look for work again.
    /// Each region copied is one step of the mirror's background work: a quiesce lets the
    /// copy under way finish and holds the next; a stop ends the task (an unfinished resync
    /// resumes from its checkpoint at the next open).
    pub fn kick_resync(self: &Arc<Self>) -> Result<()> {
        {
            let mut control = self.resync_control()?;
            if control.running {
                control.again = true;
                return Ok(());
            }
            control.running = true;
            control.again = false;
        }
        let weak = Arc::downgrade(self);
        let spawned = self.background.spawn(self.runtime.as_ref(), |worker| async move {
            loop {
                let step = worker.step().await;
                let Some(inner) = weak.upgrade() else { return };
                let Some(_step) = step else {
                    inner.resync_ended();
                    return;
                };
                let result = inner.resync_step().await;
                let Ok(mut control) = inner.resync_control() else {
                    tracing::error!(mirror = %inner.name, "resync stopped: its state lock is poisoned");
                    return;
                };
                match result {
                    Ok(true) => continue,
                    Ok(false) if control.again => {
                        control.again = false;
                        continue;
                    }
                    Ok(false) => {}
                    // A reconfiguration during the failed step (a replacement, say: a new
                    // source or target) is the restart the stop waits for; dropping its
                    // `again` would leave the resync stopped until the next open.
                    Err(error) if control.again => {
                        tracing::warn!(mirror = %inner.name, %error, "resync step failed; the mirror was reconfigured meanwhile, retrying");
                        control.again = false;
                        continue;
                    }
                    Err(error) => {
                        tracing::error!(mirror = %inner.name, %error, "resync stopped; it resumes at the next reconfiguration or open");
                    }
                }
                control.running = false;
                control.activity = None;
                return;
            }
        });
        if !spawned {
            self.resync_ended();
        }
        Ok(())
    }

    /// The resync task is gone (stopped): the next kick may start one again.
    fn resync_ended(&self) {
        if let Ok(mut control) = self.resync_control() {
            control.running = false;
            control.activity = None;
        }
    }

    fn set_activity(&self, what: String, done_bytes: u64, total_bytes: u64) -> Result<()> {
        self.resync_control()?.activity = Some(Activity {
            what,
            done_bytes,
            total_bytes,
        });
        Ok(())
    }

    /// Copies one region; Ok(false) when there is nothing left to do.
    async fn resync_step(&self) -> Result<bool> {
        let dirty = self.regions_lock()?.needs_sync.first().copied();
        if let Some(r) = dirty {
            let states = self.states()?;
            let source = sync_source(&states).ok_or_else(|| stalled(&self.name))?;
            let start = r * self.region;
            let targets: Vec<usize> = (0..states.len())
                .filter(|&i| i != source)
                .filter(|&i| match states[i] {
                    MemberState::InSync => true,
                    MemberState::Resyncing { done } => done > start,
                    MemberState::Faulty => false,
                })
                .collect();
            self.copy_region(r, source, &targets).await?;
            self.regions_lock()?.needs_sync.remove(&r);
            let synced = self.counters.dirty_synced.fetch_add(1, Ordering::Relaxed) + 1;
            let total = self.counters.dirty_at_open.load(Ordering::Relaxed);
            self.set_activity(
                "resyncing dirty regions".into(),
                synced * self.region,
                total * self.region,
            )?;
            return Ok(true);
        }
        let snapshot = self.snapshot()?;
        let states: Vec<MemberState> = snapshot.iter().map(|(_, s)| *s).collect();
        let Some((target, done)) = states.iter().enumerate().find_map(|(i, s)| match s {
            MemberState::Resyncing { done } => Some((i, *done)),
            _ => None,
        }) else {
            return Ok(false);
        };
        // The disk being resynced, taken with its state: the slot can be failed and given
        // a replacement while this step copies, and the progress belongs to this disk only.
        let Some(device) = snapshot[target].0.clone() else {
            return Ok(true);
        };
        let name = self.slots_read()?[target].name.clone();
        if done < self.size {
            let source = sync_source(&states).ok_or_else(|| stalled(&self.name))?;
            let r = done / self.region;
            let bytes = region_bytes(r, self.region, self.size);
            self.copy_region(r, source, &[target]).await?;
            self.counters
                .resynced_bytes
                .fetch_add(bytes.end - bytes.start, Ordering::Relaxed);
            let now_done = bytes.end;
            {
                let mut slots = self.slots_write()?;
                let slot = &mut slots[target];
                let same = slot
                    .device
                    .as_ref()
                    .is_some_and(|d| same_device(d, &device));
                // A replacement also starts at `Resyncing { done: 0 }`: the state alone
                // cannot tell it from the disk this region was copied to.
                if same && slot.state == (MemberState::Resyncing { done }) {
                    slot.state = MemberState::Resyncing { done: now_done };
                } else {
                    return Ok(true);
                }
            }
            self.set_activity(format!("resyncing {name}"), now_done, self.size)?;
            let every = (self.options.resync_checkpoint / self.region).max(1);
            if now_done < self.size && !(r + 1).is_multiple_of(every) {
                return Ok(true);
            }
        }
        // A checkpoint (or the end): the copied bytes must be durable before the progress is.
        if let Err(error) = device.flush().await {
            self.mark_device_faulty(
                target,
                &device,
                &format!("flush during resync failed: {error}"),
            )
            .await?;
            return Ok(true);
        }
        let MemberState::Resyncing { done } = self.states()?[target] else {
            return Ok(true);
        };
        let state = if done >= self.size {
            tracing::info!(mirror = %self.name, member = %name, "resync complete; member in sync");
            MemberState::InSync
        } else {
            MemberState::Resyncing { done }
        };
        match self.record_state(target, &device, state).await {
            Err(BlockError::Unsupported(_)) => Ok(true),
            other => other.map(|()| true),
        }
    }

    /// Copies region `r` from `source` to `targets` under the region's exclusive lock.
    /// Another in-sync member stands in for a source that fails a read; a target that fails
    /// a write is faulty.
    async fn copy_region(&self, r: u64, source: usize, targets: &[usize]) -> Result<()> {
        let _lock = self.region_locks().write(r).await;
        if let Some(track) = self.regions_lock()?.track.get_mut(&r) {
            track.generation += 1;
        }
        let snapshot = self.snapshot()?;
        let mut sources: Vec<(usize, DeviceRef)> = Vec::new();
        for (i, (device, state)) in snapshot.iter().enumerate() {
            if let (Some(device), MemberState::InSync) = (device, state) {
                if i == source {
                    sources.insert(0, (i, device.clone()));
                } else {
                    sources.push((i, device.clone()));
                }
            }
        }
        let mut live: Vec<(usize, DeviceRef)> = targets
            .iter()
            .filter_map(|&i| snapshot[i].0.clone().map(|d| (i, d)))
            .collect();
        let align = u64::from(self.geometry.min_io).max(512);
        let chunk =
            (self.options.copy_chunk.min(u64::from(self.geometry.max_io)) / align).max(1) * align;
        let pieces = chunks(region_bytes(r, self.region, self.size), chunk);
        for batch in pieces.chunks(self.options.resync_concurrency.max(1)) {
            if live.is_empty() {
                return Ok(());
            }
            let copies = batch
                .iter()
                .map(|piece| self.copy_piece(&sources, &live, piece.clone()));
            let mut failed: Vec<(usize, DeviceRef, BlockError)> = Vec::new();
            for result in join_all(copies).await {
                failed.extend(result?);
            }
            for (index, device, error) in failed {
                if !live.iter().chain(&sources).any(|(i, _)| *i == index) {
                    continue; // two pieces failed on it: marked already
                }
                self.mark_device_faulty(index, &device, &format!("resync write failed: {error}"))
                    .await?;
                live.retain(|(i, _)| *i != index);
                sources.retain(|(i, _)| *i != index);
            }
        }
        Ok(())
    }

    /// Copies one piece to `targets`, and rewrites it on any in-sync source that failed to
    /// read it (a latent sector error found by the copy heals here, as a read's does, rather
    /// than lingering until it is the last copy). Returns the members whose writes failed.
    async fn copy_piece(
        &self,
        sources: &[(usize, DeviceRef)],
        targets: &[(usize, DeviceRef)],
        piece: std::ops::Range<u64>,
    ) -> Result<Vec<(usize, DeviceRef, BlockError)>> {
        let at = self.data_offset + piece.start;
        let len = (piece.end - piece.start) as usize;
        let mut data: Option<Bytes> = None;
        let mut unreadable: Vec<(usize, DeviceRef)> = Vec::new();
        let mut last_error = None;
        for (index, source) in sources {
            match source.read(at, len).await {
                Ok(bytes) => {
                    data = Some(bytes.freeze());
                    break;
                }
                Err(error) => {
                    tracing::warn!(mirror = %self.name, member = index, %error, "resync read failed; trying another member");
                    self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    unreadable.push((*index, source.clone()));
                    last_error = Some(error);
                }
            }
        }
        let data = match (data, last_error) {
            (Some(data), _) => data,
            (None, Some(error)) => return Err(error),
            (None, None) => return Err(stalled(&self.name)),
        };
        let repairs = unreadable
            .iter()
            .map(|(_, d)| d.write(at, data.clone(), WriteFlags { fua: true }));
        let writes = targets
            .iter()
            .map(|(_, d)| d.write(at, data.clone(), WriteFlags::default()));
        let (repaired, written) =
            futures_util::future::join(join_all(repairs), join_all(writes)).await;
        let mut failed = Vec::new();
        for ((index, device), result) in unreadable.iter().zip(repaired) {
            match result {
                Ok(()) => {
                    self.counters.repairs.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(mirror = %self.name, member = index, offset = piece.start, len, "read error repaired by the resync");
                }
                Err(error) => failed.push((*index, device.clone(), error)),
            }
        }
        for ((index, device), result) in targets.iter().zip(written) {
            if let Err(error) = result {
                failed.push((*index, device.clone(), error));
            }
        }
        Ok(failed)
    }
}

fn stalled(name: &str) -> BlockError {
    BlockError::io(
        format!("mirror {name} resync"),
        std::io::Error::other("no in-sync member to copy from"),
    )
}
