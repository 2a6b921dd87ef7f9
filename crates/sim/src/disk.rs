//! `SimDisk`: a [`BlockDevice`] whose timing comes from a [`DeviceModel`] and whose data
//! lives in memory, so that real layers can be stacked on simulated disks.
//!
//! Every read, write and write_zeroes is submitted to the model at the current virtual time
//! and completes when the model says. Data moves at completion: a write's bytes land, and a
//! read's bytes are copied, when the model finishes the request, as on a drive (a read
//! racing a write may see either version; the block contract allows both).
//!
//! Flush: the modelled drives have no volatile cache (a completed write is on the medium),
//! so a flush costs no device time; it completes once every write submitted before it has
//! completed. FUA is therefore native and free. Discard drops the stored pages at once and
//! costs nothing (it only changes what reads return, which the contract leaves open).
//!
//! Data is kept sparsely in 4 KiB pages; bytes never written read as zeros. With
//! [`DataMode::TimingOnly`] nothing is stored (reads return zeros), so trace replays over
//! hundreds of GB allocate nothing in proportion to the address space.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, Geometry,
    NodeStatus, PageStore, Result, WriteFlags, ZeroFlags,
};

use crate::executor::{EventSource, SimRuntime, Simulation};
use crate::model::{Completion, DeviceModel, Nanos, Op, Request};

pub const SECTOR: u64 = 512;
const PAGE: u64 = 4096;
/// Largest request the disk accepts in one call (a layer splits bigger ones).
const MAX_IO: u32 = 32 << 20;

/// Whether a [`SimDisk`] keeps the bytes written to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataMode {
    /// Sparse in-memory pages: reads return what was written.
    Stored,
    /// Timing only: writes are dropped and reads return zeros.
    TimingOnly,
}

/// What a disk has been asked to do so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Reads and writes the model has completed (flushes cost no device time and are not
    /// counted).
    #[serde(default)]
    pub completed: u64,
    /// Time during which the model was serving at least one request.
    pub busy_time: Nanos,
}

impl DiskStats {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &DiskStats) -> DiskStats {
        DiskStats {
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            flushes: self.flushes - earlier.flushes,
            read_bytes: self.read_bytes - earlier.read_bytes,
            written_bytes: self.written_bytes - earlier.written_bytes,
            completed: self.completed - earlier.completed,
            busy_time: self.busy_time - earlier.busy_time,
        }
    }
}

struct Waiter {
    done: bool,
    waker: Option<Waker>,
    op: Op,
    offset: u64,
    submitted: Nanos,
}

/// One completed request, as [`SimDisk::record_completions`] keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletionRecord {
    /// When the request reached the disk, and when it completed.
    pub submitted: Nanos,
    pub at: Nanos,
    pub op: Op,
    pub offset: u64,
}

/// The part of a disk the executor drives: the model and who waits for what.
struct DeviceState {
    model: Box<dyn DeviceModel>,
    next_id: u64,
    waiting: Waiting,
    /// Writes submitted and not yet completed, for flushes to wait on.
    open_writes: OpenWrites,
    flush_waiters: Vec<Waker>,
    stats: DiskStats,
    completed: Vec<Completion>,
    /// Completions kept for the caller while recording is on.
    recorded: Option<Vec<CompletionRecord>>,
}

struct Device {
    state: Mutex<DeviceState>,
    /// The model's `next_completion` (`u64::MAX`: none), stored whenever the model changes
    /// (a submit, an advance), so that the executor, which asks every disk at every step,
    /// reads it without taking the lock.
    next_event: AtomicU64,
}

impl Device {
    /// Publishes the model's next completion; called with the state locked, after every
    /// change to the model.
    fn publish_next_event(&self, state: &DeviceState) {
        let next = state.model.next_completion().unwrap_or(u64::MAX);
        debug_assert!(
            state.model.next_completion() != Some(u64::MAX),
            "u64::MAX means none"
        );
        self.next_event.store(next, Ordering::Relaxed);
    }
}

/// Who waits for which request, by id. Every request gets the next id and a waiter at once,
/// so the waiters sit in id order from the oldest one still waited for: finding one is an
/// index, and finished ones leave from the front. Cheaper than a hash map for the same
/// answers.
#[derive(Default)]
struct Waiting {
    /// The id of `slots[0]`.
    first: u64,
    slots: VecDeque<Option<Waiter>>,
}

impl Waiting {
    fn insert(&mut self, id: u64, waiter: Waiter) {
        if self.slots.is_empty() {
            self.first = id;
        }
        assert_eq!(
            self.first + self.slots.len() as u64,
            id,
            "waiters come in id order"
        );
        self.slots.push_back(Some(waiter));
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Waiter> {
        let at = id.checked_sub(self.first)?;
        self.slots.get_mut(usize::try_from(at).ok()?)?.as_mut()
    }

    fn remove(&mut self, id: u64) {
        if let Some(slot) = id
            .checked_sub(self.first)
            .and_then(|at| self.slots.get_mut(usize::try_from(at).ok()?))
        {
            *slot = None;
        }
        while self.slots.front().is_some_and(Option::is_none) {
            self.slots.pop_front();
            self.first += 1;
        }
    }
}

/// The ids of writes submitted and not yet completed. Ids are handed out in increasing
/// order, so they are kept in submission order, each with whether it is still open; a
/// completed write is marked, and marked ones leave from the front. Cheaper than a
/// `BTreeSet` (no node allocation, no rebalancing) for the same answers.
#[derive(Default)]
struct OpenWrites {
    ids: VecDeque<(u64, bool)>,
}

impl OpenWrites {
    fn insert(&mut self, id: u64) {
        debug_assert!(self.ids.back().is_none_or(|&(last, _)| last < id));
        self.ids.push_back((id, true));
    }

    /// Closes `id`; whether it was open.
    fn remove(&mut self, id: u64) -> bool {
        let Ok(at) = self.ids.binary_search_by_key(&id, |&(id, _)| id) else {
            return false;
        };
        let was_open = std::mem::replace(&mut self.ids[at].1, false);
        while self.ids.front().is_some_and(|&(_, open)| !open) {
            self.ids.pop_front();
        }
        was_open
    }

    /// The oldest open write.
    fn first(&self) -> Option<u64> {
        self.ids.front().map(|&(id, _)| id)
    }
}

impl EventSource for Device {
    fn next_event(&self) -> Option<Nanos> {
        let next = self.next_event.load(Ordering::Relaxed);
        (next != u64::MAX).then_some(next)
    }

    fn advance(&self, now: Nanos, wake: &mut Vec<Waker>) {
        let mut guard = self.state.lock().unwrap();
        let state = &mut *guard;
        let mut completed = std::mem::take(&mut state.completed);
        state.model.advance(now, &mut completed);
        self.publish_next_event(state);
        let mut wrote = false;
        state.stats.completed += completed.len() as u64;
        for completion in completed.drain(..) {
            let waiter = state.waiting.get_mut(completion.id);
            // A read is never an open write; a request nobody waits for any more may be.
            if waiter.as_ref().is_none_or(|waiter| waiter.op == Op::Write) {
                wrote |= state.open_writes.remove(completion.id);
            }
            if let Some(waiter) = state.waiting.get_mut(completion.id) {
                waiter.done = true;
                if let Some(recorded) = state.recorded.as_mut() {
                    recorded.push(CompletionRecord {
                        submitted: waiter.submitted,
                        at: completion.at,
                        op: waiter.op,
                        offset: waiter.offset,
                    });
                }
                wake.extend(waiter.waker.take());
            }
        }
        if wrote {
            wake.append(&mut state.flush_waiters);
        }
        state.completed = completed;
    }
}

/// Completes when the model reports request `id` done.
struct Completed {
    device: Arc<Device>,
    id: u64,
    /// Not polled yet, and created in the poll that submitted the request and stored the
    /// waker with it: nothing can have completed it since (completions are delivered
    /// between polls), so the first poll is pending without a look.
    submitted_in_this_poll: bool,
    /// Returned ready (its waiter is gone already: nothing to remove on drop).
    finished: bool,
}

impl Future for Completed {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if std::mem::take(&mut self.submitted_in_this_poll) {
            return Poll::Pending;
        }
        let mut state = self.device.state.lock().unwrap();
        let waiter = state
            .waiting
            .get_mut(self.id)
            .expect("a request is waited for until it completes");
        if waiter.done {
            state.waiting.remove(self.id);
            drop(state);
            self.finished = true;
            Poll::Ready(())
        } else {
            waiter.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

impl Drop for Completed {
    /// A cancelled caller stops waiting; the model still serves the request.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Ok(mut state) = self.device.state.lock() {
            state.waiting.remove(self.id);
        }
    }
}

/// Completes when no write submitted before `upto` is still open.
struct WritesDrained {
    device: Arc<Device>,
    upto: u64,
}

impl Future for WritesDrained {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.device.state.lock().unwrap();
        if state.open_writes.first().is_none_or(|id| id >= self.upto) {
            Poll::Ready(())
        } else {
            state.flush_waiters.push(cx.waker().clone());
            Poll::Pending
        }
    }
}

/// A simulated disk; see the module documentation.
pub struct SimDisk {
    name: String,
    model_name: String,
    geometry: Geometry,
    device: Arc<Device>,
    clock: SimRuntime,
    pages: Option<Mutex<PageStore>>,
}

impl SimDisk {
    /// A disk named `name` over `model`, registered with `sim` so that its completions
    /// advance virtual time. Its size is the model's capacity rounded down to 512 bytes.
    pub fn new(
        sim: &Simulation,
        name: impl Into<String>,
        model: Box<dyn DeviceModel>,
        mode: DataMode,
    ) -> Arc<SimDisk> {
        let size = model.capacity() / SECTOR * SECTOR;
        let model_name = model.name().to_string();
        let device = Arc::new(Device {
            state: Mutex::new(DeviceState {
                model,
                next_id: 0,
                waiting: Waiting::default(),
                open_writes: OpenWrites::default(),
                flush_waiters: Vec::new(),
                stats: DiskStats::default(),
                completed: Vec::new(),
                recorded: None,
            }),
            next_event: AtomicU64::new(u64::MAX),
        });
        sim.register(device.clone());
        Arc::new(SimDisk {
            name: name.into(),
            model_name,
            geometry: Geometry {
                size,
                min_io: SECTOR as u32,
                logical_block: SECTOR as u32,
                physical_block: PAGE as u32,
                preferred_io: PAGE as u32,
                max_io: MAX_IO,
            },
            device,
            clock: sim.handle(),
            pages: (mode == DataMode::Stored).then(|| Mutex::new(PageStore::new())),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    pub fn stats(&self) -> DiskStats {
        let state = self.device.state.lock().unwrap();
        DiskStats {
            busy_time: state.model.busy_time(),
            ..state.stats.clone()
        }
    }

    /// Starts (or stops, dropping what was kept) keeping a record of every completion, for
    /// per-request timelines (inter-completion times).
    pub fn record_completions(&self, on: bool) {
        self.device.state.lock().unwrap().recorded = on.then(Vec::new);
    }

    /// The completions kept since recording started or since the last take, in completion
    /// order; recording stays on.
    pub fn take_completions(&self) -> Vec<CompletionRecord> {
        let mut state = self.device.state.lock().unwrap();
        state
            .recorded
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Requests accepted by the model and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.device.state.lock().unwrap().model.outstanding()
    }

    /// Number of 4 KiB pages holding data (0 in timing-only mode).
    pub fn stored_pages(&self) -> usize {
        self.pages
            .as_ref()
            .map_or(0, |pages| pages.lock().unwrap().allocated_pages())
    }

    /// Submits one request to the model now and waits for it to complete.
    async fn serve(&self, op: Op, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let now = self.clock.now_nanos();
        // The waker is stored with the request, in the same poll that then awaits it, so the
        // first poll of `Completed` need not take the lock only to store it.
        let waker = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        let id = {
            let mut state = self.device.state.lock().unwrap();
            let id = state.next_id;
            state.next_id += 1;
            state.model.submit(
                now,
                Request {
                    id,
                    op,
                    offset,
                    len,
                },
            );
            self.device.publish_next_event(&state);
            state.waiting.insert(
                id,
                Waiter {
                    done: false,
                    waker: Some(waker),
                    op,
                    offset,
                    submitted: now,
                },
            );
            match op {
                Op::Read => {
                    state.stats.reads += 1;
                    state.stats.read_bytes += len;
                }
                Op::Write => {
                    state.open_writes.insert(id);
                    state.stats.writes += 1;
                    state.stats.written_bytes += len;
                }
            }
            id
        };
        Completed {
            device: self.device.clone(),
            id,
            submitted_in_this_poll: true,
            finished: false,
        }
        .await;
    }

    fn copy_out(&self, offset: u64, out: &mut [u8]) {
        let Some(pages) = &self.pages else { return };
        pages.lock().unwrap().read_into(offset, out);
    }

    /// Stores `data` at `offset`; `None` stores zeros. Zeros written into holes allocate
    /// nothing, and pages that become all zeros through zeroing are dropped, so that zeroing
    /// gives memory back.
    fn copy_in(&self, offset: u64, len: u64, data: Option<&[u8]>) {
        let Some(pages) = &self.pages else { return };
        let mut pages = pages.lock().unwrap();
        match data {
            Some(data) => pages.write_sparse(offset, data),
            None => pages.zero(offset, len),
        }
    }
}

#[async_trait]
impl BlockDevice for SimDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fast_zero: false,
            block_status: false,
            ..Capabilities::ALL
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry.check_range(offset, len as u64)?;
        self.serve(Op::Read, offset, len as u64).await;
        let mut buffer = BytesMut::zeroed(len);
        self.copy_out(offset, &mut buffer);
        Ok(buffer)
    }

    async fn write(&self, offset: u64, data: Bytes, _flags: WriteFlags) -> Result<()> {
        self.geometry.check_range(offset, data.len() as u64)?;
        self.serve(Op::Write, offset, data.len() as u64).await;
        self.copy_in(offset, data.len() as u64, Some(&data));
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let upto = {
            let mut state = self.device.state.lock().unwrap();
            state.stats.flushes += 1;
            state.next_id
        };
        WritesDrained {
            device: self.device.clone(),
            upto,
        }
        .await;
        Ok(())
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        self.copy_in(offset, len, None);
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        if flags.fast {
            return Err(BlockError::Unsupported("fast zeroing on a simulated disk"));
        }
        // Written as zeros on the medium (WRITE SAME), in pieces the disk accepts.
        let mut at = offset;
        while at < offset + len {
            let piece = (offset + len - at).min(u64::from(MAX_IO));
            self.serve(Op::Write, at, piece).await;
            self.copy_in(at, piece, None);
            at += piece;
        }
        Ok(())
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => {
                let stats = self.stats();
                let mut status = NodeStatus::new(&self.name, "sim-disk", self.geometry.size);
                status.detail = vec![
                    ("model".into(), self.model_name.clone()),
                    ("reads".into(), stats.reads.to_string()),
                    ("writes".into(), stats.writes.to_string()),
                    ("busy-ns".into(), stats.busy_time.to_string()),
                ];
                Ok(ControlReply::Describe(status))
            }
            _ => Err(BlockError::Unsupported("control on a simulated disk")),
        }
    }
}
