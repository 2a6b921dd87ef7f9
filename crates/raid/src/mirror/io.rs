//! The data path: bitmap-guarded writes to every member, balanced reads with repair, flushes.
//!
//! A write: take the regions' locks shared; make sure each region's bit is set *and durable*
//! (the write intent); write every member that receives writes at once; mark any that failed
//! faulty, durably; acknowledge if at least one member has the data. Discard and
//! write_zeroes go the same way (a discard becomes write_zeroes with `may_trim`, so every
//! member reads zeros after it and members never drift apart).

use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use bytes::{Bytes, BytesMut};
use futures_util::future::join_all;
use strata_core::{
    async_trait, poison, BlockDevice, BlockError, BoxFuture, Capabilities, Control, ControlReply,
    DeviceRef, Extent, ExtentState, Geometry, Result, WriteFlags, ZeroFlags,
};
use strata_meta::TxnClass;

use super::policy::{read_order, regions_of, sync_source, MemberState};
use super::state::{Inner, Mirror};

type MemberOp<'a> = &'a (dyn Fn(DeviceRef, u64) -> BoxFuture<'static, Result<()>> + Sync);

/// Holds a write's regions as in flight; releases them (and records when) on drop.
struct InFlight<'a> {
    inner: &'a Inner,
    range: std::ops::Range<u64>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let now = self.inner.runtime.now();
        let mut regions = self
            .inner
            .regions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for r in self.range.clone() {
            if let Some(track) = regions.track.get_mut(&r) {
                track.inflight -= 1;
                track.last_write = now;
            }
        }
    }
}

impl Inner {
    /// Marks the regions in flight and their bits set; returns once the bits are durable.
    async fn begin_write(&self, range: std::ops::Range<u64>) -> Result<InFlight<'_>> {
        let guard = InFlight {
            inner: self,
            range: range.clone(),
        };
        let now = self.runtime.now();
        let newest_set = {
            let mut regions = poison::check(self.regions.lock(), &self.name, "the region table")?;
            let mut to_set = Vec::new();
            let mut newest_set = None;
            for r in range.clone() {
                let track = regions.track.entry(r).or_default();
                track.inflight += 1;
                track.generation += 1;
                track.last_write = now;
                if track.set_txn.is_none() {
                    to_set.push(r);
                }
                newest_set = newest_set.max(track.set_txn);
            }
            if !to_set.is_empty() {
                let txn = self.store.next_txn();
                self.store.transact(TxnClass::Normal, |_, t| {
                    for &r in &to_set {
                        t.set_bits(self.ids.dirty, r, 1, true);
                    }
                    Ok(())
                })?;
                for r in to_set {
                    regions.track.get_mut(&r).expect("tracked").set_txn = Some(txn);
                }
                newest_set = Some(txn);
            }
            newest_set
        };
        if newest_set.is_some_and(|txn| txn >= self.store.durable_txn()) {
            self.commit().await?;
        }
        Ok(guard)
    }

    /// Runs `op` on every member that receives writes; marks failures faulty. Succeeds if
    /// one member succeeded.
    pub async fn write_members(&self, what: &str, offset: u64, op: MemberOp<'_>) -> Result<()> {
        let targets: Vec<(usize, DeviceRef)> = self
            .snapshot()?
            .into_iter()
            .enumerate()
            .filter_map(|(i, (d, s))| d.filter(|_| s.receives_writes()).map(|d| (i, d)))
            .collect();
        let at = self.data_offset + offset;
        let results = join_all(targets.iter().map(|(_, d)| op(d.clone(), at))).await;
        let mut ok = false;
        let mut first_error = None;
        for ((index, device), result) in targets.iter().zip(results) {
            match result {
                Ok(()) => ok = true,
                Err(error) => {
                    // The device, not just the slot: a background flush can fail on a
                    // disk that the operator replaced while it was in flight.
                    self.mark_device_faulty(*index, device, &format!("{what} failed: {error}"))
                        .await?;
                    first_error.get_or_insert(error);
                }
            }
        }
        match (ok, first_error) {
            (true, _) => Ok(()),
            (false, Some(error)) => Err(error),
            (false, None) => Err(no_member(&self.name)),
        }
    }

    /// A mutating request: locks, write intent, then `op` on every member.
    async fn mutate(&self, what: &str, offset: u64, len: u64, op: MemberOp<'_>) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let range = regions_of(offset, len, self.region);
        let _shared = self.region_locks().read_range(range.clone()).await;
        let _inflight = self.begin_write(range).await?;
        self.write_members(what, offset, op).await
    }

    pub async fn read_data(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry.check_range(offset, len as u64)?;
        let end = offset + len as u64;
        let snapshot = self.snapshot()?;
        let states: Vec<MemberState> = snapshot.iter().map(|(_, s)| *s).collect();
        let pinned = {
            let regions = poison::check(self.regions.lock(), &self.name, "the region table")?;
            let range = regions_of(offset, len as u64, self.region);
            regions
                .needs_sync
                .range(range)
                .next()
                .and_then(|_| sync_source(&states))
        };
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let order: Vec<usize> = read_order(&states, end, turn, pinned)
            .into_iter()
            .filter(|&i| snapshot[i].0.is_some())
            .collect();
        let mut failed = Vec::new();
        let mut last_error = None;
        for index in order {
            let device = snapshot[index].0.clone().expect("present");
            match device.read(self.data_offset + offset, len).await {
                Ok(data) => {
                    if !failed.is_empty() {
                        self.repair(offset, len, index, &failed).await?;
                    }
                    return Ok(data);
                }
                Err(error) => {
                    tracing::warn!(mirror = %self.name, member = index, %error, "read failed; trying another member");
                    self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    failed.push(index);
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| no_member(&self.name)))
    }

    /// Rewrites `[offset, +len)` from `good` onto the members whose read failed (a latent
    /// sector error heals when rewritten); a member that cannot take it is faulty. Runs under
    /// the regions' exclusive locks and re-reads there, so no concurrent write is undone.
    async fn repair(&self, offset: u64, len: usize, good: usize, failed: &[usize]) -> Result<()> {
        let range = regions_of(offset, len as u64, self.region);
        let _exclusive = self.region_locks().write_range(range).await;
        let snapshot = self.snapshot()?;
        let Some(source) = snapshot[good].0.clone() else {
            return Ok(());
        };
        let Ok(data) = source.read(self.data_offset + offset, len).await else {
            return Ok(());
        };
        let data = data.freeze();
        for &index in failed {
            let (Some(device), state) = snapshot[index].clone() else {
                continue;
            };
            if !state.receives_writes() {
                continue;
            }
            let at = self.data_offset + offset;
            match device
                .write(at, data.clone(), WriteFlags { fua: true })
                .await
            {
                Ok(()) => {
                    self.counters.repairs.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(mirror = %self.name, member = index, offset, len, "read error repaired");
                }
                Err(error) => {
                    self.mark_device_faulty(
                        index,
                        &device,
                        &format!("repair write failed: {error}"),
                    )
                    .await?
                }
            }
        }
        Ok(())
    }

    pub async fn flush_members(&self) -> Result<()> {
        let cleanable = self.clean_candidates()?;
        self.write_members("flush", 0, &|d, _| Box::pin(async move { d.flush().await }))
            .await?;
        // Commit the clears now, so that a crash after this flush resyncs only what was
        // written after it (one metadata write, and only when a bit was cleared).
        if self.clear_bits(&cleanable)? {
            self.commit().await?;
        }
        Ok(())
    }

    fn caps(&self) -> Vec<Capabilities> {
        // A poisoned member table fails every request; capabilities then claim nothing.
        self.snapshot()
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, s)| s.receives_writes())
            .filter_map(|(d, _)| d.map(|d| d.capabilities()))
            .collect()
    }

    async fn zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let native = self.caps().iter().all(|c| c.write_zeroes);
        if native {
            return self
                .mutate("write_zeroes", offset, len, &|d, at| {
                    Box::pin(async move { d.write_zeroes(at, len, flags).await })
                })
                .await;
        }
        if flags.fast {
            return Err(BlockError::Unsupported("mirror: a member cannot zero fast"));
        }
        let chunk = u64::from(self.geometry.max_io).min(1 << 20);
        let mut at = offset;
        while at < offset + len {
            let n = chunk.min(offset + len - at);
            let zeros = Bytes::from(vec![0u8; n as usize]);
            let fua = WriteFlags { fua: flags.fua };
            self.mutate("write", at, n, &|d, o| {
                let zeros = zeros.clone();
                Box::pin(async move { d.write(o, zeros, fua).await })
            })
            .await?;
            at += n;
        }
        Ok(())
    }
}

fn no_member(name: &str) -> BlockError {
    BlockError::io(
        format!("mirror {name}"),
        std::io::Error::other("no member can serve the request"),
    )
}

#[async_trait]
impl BlockDevice for Mirror {
    fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.caps();
        let all = |f: fn(&Capabilities) -> bool| !caps.is_empty() && caps.iter().all(f);
        Capabilities {
            read_only: false,
            flush: true,
            fua: all(|c| c.fua),
            discard: all(|c| c.write_zeroes),
            write_zeroes: true,
            fast_zero: all(|c| c.fast_zero),
            block_status: false,
            consistent_across_openers: all(|c| c.consistent_across_openers),
            rotational: caps.iter().any(|c| c.rotational),
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.inner.read_data(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let len = data.len() as u64;
        self.inner
            .mutate("write", offset, len, &|d, at| {
                let data = data.clone();
                Box::pin(async move { d.write(at, data, flags).await })
            })
            .await
    }

    async fn flush(&self) -> Result<()> {
        self.inner.flush_members().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.geometry.check_range(offset, len)?;
        if !self.inner.caps().iter().all(|c| c.write_zeroes) {
            // Discard is advisory: keeping the old contents everywhere keeps members equal.
            return Ok(());
        }
        let flags = ZeroFlags {
            may_trim: true,
            ..ZeroFlags::default()
        };
        self.inner.zeroes(offset, len, flags).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.inner.geometry.check_range(offset, len)?;
        self.inner.zeroes(offset, len, flags).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner.geometry.check_range(offset, len)?;
        Ok(vec![Extent {
            offset,
            len,
            state: ExtentState::Data,
        }])
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        self.inner.control(request).await
    }
}
