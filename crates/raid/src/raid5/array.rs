//! The array's shared state and the operations every path uses: member I/O that names the
//! member it failed on, durable failure marking, member flushes, journal resets.
//!
//! Lock order (outermost first): one writer slot (held by whoever runs a stripe's queued
//! writes, across their retries, journal resets included), `reclaim_lock` (held by a journal
//! reclaim or reset from start to end; a writer waiting for journal space waits for it, never
//! holding the gate), `gate` (shared by every stripe update and rebuild step, exclusive for a
//! journal reset), one stripe lock, then `fail_lock` (async, held while a failure is made
//! durable). A reclaim takes no gate: it waits for the journals' pins (`journal::Pin`), which
//! updates hold only between their journal append and the end of their in-place writes. std Mutexes (`full`, `lost`, `record`,
//! `activity`, `queued`) are held only for in-memory work, never across an await.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use bytes::Bytes;
use futures_util::future::join_all;
use strata_core::{
    poison, Activity, Background, BlockError, DeviceRef, Result, Runtime, StripedLocks, WriteFlags,
};
use strata_meta::{MetaStore, ObjectId, TxnClass};

use super::grow::GrowControl;
use super::io::Queued;
use super::journal::{Appended, Cut, Journal, Record, MAX_DONE};
use super::layout::Layout;
use super::members::{array_failed, MemberState, Members};
use super::record::ArrayRecord;
use super::shape::Shape;

/// Stripe locks are a fixed table indexed by stripe number: two stripes that share a slot
/// serialize, which is rare at this size and costs no allocation per request.
pub const STRIPE_LOCKS: usize = 1024;

/// A member I/O that failed: which member (the caller marks it failed and retries), and the
/// device the request went to, if it went to one.
pub struct Fault {
    pub member: usize,
    /// A request in flight when its member was replaced fails on the old device, and a
    /// fault found before a replacement is acted on after it: either is not the
    /// replacement's ([`Array::fail`]).
    pub device: Option<DeviceRef>,
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fault {{ member: {} }}", self.member)
    }
}

/// Full-stripe writes whose in-place writes may not be durable yet.
#[derive(Default)]
pub struct FullWrites {
    /// stripe → (parity member, journal epoch, intent seq) of its last full-stripe write.
    pub dirty: HashMap<u64, (usize, u64, u64)>,
    /// Completed since the last flush: (stripe, parity member, epoch, intent seq).
    pub completed: Vec<(u64, usize, u64, u64)>,
}

pub struct Array {
    pub name: String,
    pub runtime: Arc<dyn Runtime>,
    /// The geometry, which a grow changes (read it with [`Array::shape`]).
    pub shape: std::sync::RwLock<Shape>,
    pub min_io: u32,
    pub members: Arc<Members>,
    pub store: Arc<MetaStore>,
    pub blob_id: ObjectId,
    pub lost_id: ObjectId,
    /// The record as last made durable (shape, states, rebuild checkpoint).
    pub record: Mutex<ArrayRecord>,
    /// One per member (a grow adds some).
    pub journals: std::sync::RwLock<Vec<Arc<Journal>>>,
    /// The device holding every member's journal, if the array was created with one.
    pub journal_device: Option<DeviceRef>,
    /// Why the journal device stopped working; writes are refused from then on.
    pub journal_failed: Mutex<Option<String>>,
    /// Stripe locks, taken exclusively: an update, a reconstructing read or a rebuild of a
    /// stripe runs alone in it.
    pub locks: StripedLocks,
    /// Writer slots: the holder of a stripe's slot runs the writes queued for it (`io`).
    pub writers: StripedLocks,
    /// stripe → writes waiting for its next update, in arrival order.
    pub queued: Mutex<HashMap<u64, VecDeque<Queued>>>,
    /// Stripe updates run, and writes that rode along in another's (shown by Describe).
    pub stripe_updates: AtomicU64,
    pub coalesced_writes: AtomicU64,
    pub gate: tokio::sync::RwLock<()>,
    pub fail_lock: tokio::sync::Mutex<()>,
    pub full: Mutex<FullWrites>,
    /// stripe → member whose chunk there is unrecoverable (mirror of the `lost` table).
    pub lost: Mutex<BTreeMap<u64, usize>>,
    pub activity: Mutex<Option<Activity>>,
    /// Test-only: no journal, so the write hole is open (the crash test must catch it).
    pub skip_journal: bool,
    pub epoch_base: u64,
    pub resets: AtomicU64,
    /// Held by a journal reclaim or reset for its whole run: one at a time.
    pub reclaim_lock: tokio::sync::Mutex<()>,
    /// Reclaims completed (shown by Describe); a writer waiting for journal space returns
    /// when this moves.
    pub reclaims: AtomicU64,
    /// Reclaims that ended in an error (a member or journal write failed under them).
    pub reclaims_failed: AtomicU64,
    /// A background reclaim is spawned and has not finished.
    pub reclaim_spawned: AtomicBool,
    /// The array itself, for the background reclaims it spawns (set by [`Array::shared`]).
    pub this: OnceLock<Weak<Array>>,
    /// Stripe-journal damage repaired from the other copy at open (shown by Describe, so a
    /// failing medium is seen before a second fault makes the damage unrecoverable).
    pub journal_findings: AtomicU64,
    /// The rebuild: quiesced by online changes, stopped at shutdown.
    pub background: Background,
    /// A grow's coordination with the data path (see `grow`).
    pub grow: GrowControl,
}

/// Attempts at making journal room per write or Done record: a reclaim frees every record
/// placed before it, but concurrent writers can take the freed space first. The bound only
/// stops a bug from looping.
pub const FULL_RETRIES: usize = 1000;

impl Array {
    /// The array, shared, knowing itself (for the background reclaims it spawns).
    pub fn shared(self) -> Arc<Array> {
        let array = Arc::new(self);
        array
            .this
            .set(Arc::downgrade(&array))
            .expect("set once, here");
        array
    }

    /// The geometry now (and where a grow stands).
    pub fn shape(&self) -> Shape {
        *self.shape.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The geometry the array has, or grows to: its member count is every member's.
    pub fn layout(&self) -> Layout {
        self.shape().layout
    }

    /// Member `member`'s stripe journal.
    pub fn journal(&self, member: usize) -> Arc<Journal> {
        self.journals.read().unwrap_or_else(|p| p.into_inner())[member].clone()
    }

    /// The full-stripe writes table, or a failure of the array if a panic poisoned it (on the
    /// request path, so a client gets an error, not a crashed server).
    pub fn full_writes(&self) -> Result<MutexGuard<'_, FullWrites>> {
        poison::check(self.full.lock(), &self.name, "the full-stripe write table")
    }

    /// The queues of writes waiting for their stripe (request path, as `full_writes`).
    pub fn queued(&self) -> Result<MutexGuard<'_, HashMap<u64, VecDeque<Queued>>>> {
        poison::check(self.queued.lock(), &self.name, "the stripe write queues")
    }

    /// The table of chunks lost in a crash while degraded (request path, as `full_writes`).
    pub fn lost_chunks(&self) -> Result<MutexGuard<'_, BTreeMap<u64, usize>>> {
        poison::check(self.lost.lock(), &self.name, "the lost-chunk table")
    }

    /// The array's record (shape, member states, journal size); a failure of the array if a
    /// panic poisoned it.
    pub fn array_record(&self) -> Result<MutexGuard<'_, ArrayRecord>> {
        poison::check(self.record.lock(), &self.name, "the array record")
    }

    /// Takes `stripe`'s lock (exclusive).
    pub async fn lock_stripe(&self, stripe: u64) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.locks.write(stripe).await
    }

    pub async fn m_read(
        &self,
        member: usize,
        offset: u64,
        len: u64,
    ) -> std::result::Result<Vec<u8>, Fault> {
        // No device in the slot: the fault names none (`Array::fail` fails the slot).
        let device = self.members.device(member).ok_or(Fault {
            member,
            device: None,
        })?;
        match device.read(offset, len as usize).await {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(error) => {
                tracing::error!(array = %self.name, member, offset, %error, "raid5: member read failed");
                Err(Fault {
                    member,
                    device: Some(device),
                })
            }
        }
    }

    pub async fn m_write(
        &self,
        member: usize,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> std::result::Result<(), Fault> {
        // No device in the slot: the fault names none (`Array::fail` fails the slot).
        let device = self.members.device(member).ok_or(Fault {
            member,
            device: None,
        })?;
        match device.write(offset, data, WriteFlags { fua }).await {
            Ok(()) => Ok(()),
            Err(error) => {
                tracing::error!(array = %self.name, member, offset, %error, "raid5: member write failed");
                Err(Fault {
                    member,
                    device: Some(device),
                })
            }
        }
    }

    pub fn check_alive(&self) -> Result<()> {
        if self.members.unhealthy() >= 2 {
            return Err(array_failed(&self.name));
        }
        Ok(())
    }

    /// Writes need a live array and a working journal: without the journal no update may
    /// start, since nothing would close its write hole.
    pub fn check_writable(&self) -> Result<()> {
        self.check_alive()?;
        let journal_failed =
            poison::check(self.journal_failed.lock(), &self.name, "the journal state")?;
        if let Some(reason) = journal_failed.as_ref() {
            return Err(self.journal_device_error(reason));
        }
        Ok(())
    }

    fn journal_device_error(&self, reason: &str) -> BlockError {
        Array::io_error(format!(
            "raid5 {}: the journal device failed ({reason}); writes are refused, reads still \
             work",
            self.name
        ))
    }

    /// Where member `member`'s journal is written: the journal device, or the member.
    pub fn journal_target(&self, member: usize) -> Option<DeviceRef> {
        match &self.journal_device {
            Some(device) => Some(device.clone()),
            None => self.members.device(member),
        }
    }

    /// A journal write for `member` failed. On a member, the member is failing: returns the
    /// fault for the caller to fail it. On the journal device, the array stops taking writes
    /// (as md does when its journal device fails): returns the error.
    pub fn journal_write_failed(&self, member: usize) -> std::result::Result<Fault, BlockError> {
        if self.journal_device.is_none() {
            return Ok(self.members.fault(member));
        }
        let reason = "a journal write failed".to_string();
        tracing::error!(array = %self.name, member, "raid5: journal device write failed; refusing writes");
        let error = self.journal_device_error(&reason);
        poison::check(self.journal_failed.lock(), &self.name, "the journal state")?
            .get_or_insert(reason);
        Err(error)
    }

    /// Fails the member of `fault`, unless the request failed on a device the member has been
    /// replaced since: that failure is the old device's (which left the array when it was
    /// failed), and charging it to the replacement would fail a healthy rebuild.
    pub async fn fail(&self, fault: Fault) -> Result<()> {
        let now = self.members.device(fault.member);
        if let (Some(failed), Some(now)) = (&fault.device, &now) {
            if !Arc::ptr_eq(failed, now) {
                tracing::warn!(
                    array = %self.name,
                    member = fault.member,
                    "raid5: a request to the device member {} had before its replacement failed late; not charged to the replacement",
                    fault.member
                );
                return self.check_alive();
            }
        }
        self.fail_member(fault.member).await
    }

    /// Marks `member` failed and makes that durable before returning, so that no degraded
    /// write (which leaves the member stale) can be acknowledged while the metadata still
    /// calls it active.
    pub async fn fail_member(&self, member: usize) -> Result<()> {
        let _serial = self.fail_lock.lock().await;
        let changed = self.members.mark_failed(member);
        if !changed && self.members.lock()[member].durable {
            return self.check_alive();
        }
        if changed {
            tracing::error!(array = %self.name, member, "raid5: member failed");
        }
        self.persist().await?;
        self.check_alive()
    }

    /// Writes the member states (and rebuild checkpoint) to the metadata and commits. Loops
    /// while the commit itself loses members (at most once per member).
    pub async fn persist(&self) -> Result<()> {
        for _ in 0..=self.layout().members {
            let snapshot = self.members.snapshot();
            let record = self.array_record()?.with_members(&snapshot);
            let blob = self.blob_id;
            self.store.transact(TxnClass::Normal, |_, txn| {
                txn.put_blob(blob, record.encode());
                Ok(())
            })?;
            self.store.commit().await?;
            *self.array_record()? = record;
            self.members.mark_durable(&snapshot);
            if self.members.snapshot().iter().all(|m| m.durable) {
                return Ok(());
            }
        }
        Err(array_failed("recording member failures"))
    }

    /// Flushes every member still in use; the first that fails is returned.
    pub async fn flush_members(&self) -> Result<Option<usize>> {
        let snapshot = self.members.snapshot();
        let targets: Vec<usize> = (0..snapshot.len())
            .filter(|&m| snapshot[m].state != MemberState::Failed)
            .collect();
        let flushes = targets.iter().map(|&m| async move {
            match self.members.device(m) {
                Some(device) => device.flush().await.map_err(|e| (m, e)),
                None => Err((m, BlockError::Unsupported("missing member"))),
            }
        });
        for result in join_all(flushes).await {
            if let Err((member, error)) = result {
                tracing::error!(array = %self.name, member, %error, "raid5: member flush failed");
                return Ok(Some(member));
            }
        }
        Ok(None)
    }

    /// Flushes the members until one round succeeds, failing the members that do not.
    pub async fn flush_all(&self) -> Result<()> {
        for _ in 0..=self.layout().members {
            match self.flush_members().await? {
                None => return Ok(()),
                Some(member) => self.fail_member(member).await?,
            }
        }
        Err(array_failed("flush"))
    }

    /// Empties every journal: waits for all stripe updates (the gate), makes their in-place
    /// writes durable, then starts a new epoch on each member in use. After a reclaim under
    /// way, never during one.
    pub async fn reset_journals(&self) -> Result<()> {
        let _serial = self.reclaim_lock.lock().await;
        let _gate = self.gate.write().await;
        self.reset_journals_locked().await
    }

    /// [`Array::reset_journals`] for a caller already holding the gate exclusively (open,
    /// before any reclaim can start).
    pub async fn reset_journals_locked(&self) -> Result<()> {
        self.flush_all().await?;
        let epoch = self.epoch_base + self.resets.fetch_add(1, Ordering::Relaxed) + 1;
        let snapshot = self.members.snapshot();
        // On a journal device every journal is reset, a failed member's too: the device is
        // there to write to, and an emptied journal cannot be mistaken for a live one later
        // (recovery skips failed members' journals in any case).
        let on_device = self.journal_device.is_some();
        let resets = (0..snapshot.len())
            .filter(|&m| on_device || snapshot[m].state != MemberState::Failed)
            .map(|m| async move {
                let device = self
                    .journal_target(m)
                    .ok_or_else(|| self.members.fault(m))?;
                self.journal(m)
                    .reset(&device, epoch)
                    .await
                    .map_err(|_| self.members.fault(m))
            });
        self.journal_faults(join_all(resets).await).await?;
        *self.full_writes()? = FullWrites::default();
        Ok(())
    }

    /// Fails the members (or the journal device) whose journal writes returned a fault.
    async fn journal_faults(&self, results: Vec<std::result::Result<(), Fault>>) -> Result<()> {
        for result in results {
            if let Err(Fault { member, .. }) = result {
                let fault = self.journal_write_failed(member)?;
                self.fail_member(fault.member).await?;
            }
        }
        Ok(())
    }

    /// Starts a reclaim in the background if `journal` passed its high-water mark and none
    /// is spawned yet; the writes go on meanwhile.
    pub fn reclaim_soon(&self, journal: &Journal) {
        if !journal.wants_reclaim() || self.reclaim_spawned.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(weak) = self.this.get().cloned() else {
            self.reclaim_spawned.store(false, Ordering::Release);
            return;
        };
        let spawned = self
            .background
            .spawn(self.runtime.as_ref(), move |worker| async move {
                let _worker = worker;
                let Some(array) = weak.upgrade() else { return };
                let wanted = {
                    let _serial = array.reclaim_lock.lock().await;
                    let journals = array.journals.read().unwrap_or_else(|p| p.into_inner());
                    journals.iter().any(|j| j.wants_reclaim())
                };
                if wanted {
                    if let Err(error) = array.reclaim().await {
                        tracing::warn!(array = %array.name, %error, "raid5: journal reclaim failed");
                    }
                }
                array.reclaim_spawned.store(false, Ordering::Release);
            });
        if !spawned {
            self.reclaim_spawned.store(false, Ordering::Release);
        }
    }

    /// Waits until a journal may have room again: for the reclaim under way if there is
    /// one (never a second one behind it), else runs one. A caller holds no gate.
    pub async fn make_room(&self) -> Result<()> {
        let seen = self.reclaims.load(Ordering::Acquire);
        let _serial = self.reclaim_lock.lock().await;
        if self.reclaims.load(Ordering::Acquire) != seen {
            return Ok(());
        }
        self.reclaim_locked().await
    }

    /// Frees every journal's records placed so far, while appends go on (module doc of
    /// `journal`): cut, wait for the cut updates' in-place writes, flush the members, move
    /// the tails.
    pub async fn reclaim(&self) -> Result<()> {
        let _serial = self.reclaim_lock.lock().await;
        self.reclaim_locked().await
    }

    async fn reclaim_locked(&self) -> Result<()> {
        let result = self.reclaim_steps().await;
        if result.is_err() {
            self.reclaims_failed.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn reclaim_steps(&self) -> Result<()> {
        let journals: Vec<Arc<Journal>> = self
            .journals
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let snapshot = self.members.snapshot();
        let cuts: Vec<(usize, Cut)> = (0..journals.len())
            .filter(|&m| {
                snapshot
                    .get(m)
                    .is_some_and(|s| s.state != MemberState::Failed)
            })
            .filter_map(|m| journals[m].cut().map(|cut| (m, cut)))
            .collect();
        let settles = cuts.iter().map(|(m, cut)| {
            self.on_journal(*m, move |j, d| async move { j.settle(&d, cut).await })
        });
        self.journal_faults(join_all(settles).await).await?;
        // Every update placed before the cuts has finished its in-place writes: this flush
        // makes them durable, and with them every record before the cuts is redundant.
        self.flush_all().await?;
        let moves = cuts.iter().map(|(m, cut)| {
            self.on_journal(*m, move |j, d| async move { j.move_tail(&d, cut).await })
        });
        self.journal_faults(join_all(moves).await).await?;
        {
            let mut full = self.full_writes()?;
            let before = |&(member, epoch, seq): &(usize, u64, u64)| {
                cuts.iter()
                    .any(|(m, cut)| (*m, cut.epoch()) == (member, epoch) && seq < cut.seq)
            };
            full.dirty.retain(|_, intent| !before(intent));
            full.completed
                .retain(|&(_, member, epoch, seq)| !before(&(member, epoch, seq)));
        }
        self.reclaims.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Runs `work` on member `member`'s journal and where it is written; a failure is the
    /// member's fault (for [`Array::journal_faults`]).
    async fn on_journal<'a, F, Fut>(
        &'a self,
        member: usize,
        work: F,
    ) -> std::result::Result<(), Fault>
    where
        F: FnOnce(Arc<Journal>, DeviceRef) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + 'a,
    {
        let device = self
            .journal_target(member)
            .ok_or_else(|| self.members.fault(member))?;
        let journal = self.journal(member);
        if self.members.is_failed(member) {
            return Ok(());
        }
        work(journal, device)
            .await
            .map_err(|_| self.members.fault(member))
    }

    /// After a member flush: tells each journal that the full-stripe writes it logged before
    /// `completed` was taken are durable, so recovery will not doubt them.
    pub async fn log_done(&self, completed: Vec<(u64, usize, u64, u64)>) -> Result<()> {
        let mut parts: VecDeque<(usize, u64, Vec<u64>)> = VecDeque::new();
        {
            let mut full = self.full_writes()?;
            let mut by_member: BTreeMap<(usize, u64), Vec<u64>> = BTreeMap::new();
            for &(stripe, member, epoch, seq) in &completed {
                if full.dirty.get(&stripe) == Some(&(member, epoch, seq)) {
                    full.dirty.remove(&stripe);
                }
                by_member.entry((member, epoch)).or_default().push(seq);
            }
            for ((member, epoch), seqs) in by_member {
                parts.extend(seqs.chunks(MAX_DONE).map(|p| (member, epoch, p.to_vec())));
            }
        }
        for _ in 0..FULL_RETRIES {
            if self.append_dones(&mut parts).await? {
                return Ok(());
            }
            self.make_room().await?;
        }
        Err(Array::io_error(format!(
            "raid5 {}: no journal room for Done records",
            self.name
        )))
    }

    /// Appends the Done records of `parts` in order; false when a journal was full (the
    /// rest stay in `parts`).
    async fn append_dones(&self, parts: &mut VecDeque<(usize, u64, Vec<u64>)>) -> Result<bool> {
        // Appends hold the gate shared, so that a reset never runs under them.
        let _gate = self.gate.read().await;
        while let Some((member, epoch, seqs)) = parts.pop_front() {
            // A member failed since its full-stripe writes were logged: its journal is no
            // longer reclaimed (`reclaim_steps`) nor trusted, so a full one would never make
            // room, and the flush failed after every retry. Its Done records are dropped, as
            // `with_journal` drops its other journal writes.
            if self.members.is_failed(member) {
                continue;
            }
            let Some(device) = self.journal_target(member) else {
                continue;
            };
            let journal = self.journal(member);
            let record = Record::Done { seqs };
            match journal.append(&device, &record, Some(epoch)).await {
                Ok(Appended::Full) => {
                    let Record::Done { seqs } = record else {
                        unreachable!()
                    };
                    parts.push_front((member, epoch, seqs));
                    return Ok(false);
                }
                Ok(_) => self.reclaim_soon(&journal),
                Err(_) => {
                    let fault = self.journal_write_failed(member)?;
                    self.fail_member(fault.member).await?
                }
            }
        }
        Ok(true)
    }

    /// Removes the lost mark of `stripe`'s chunk on `member` (it was rewritten whole).
    pub async fn clear_lost(&self, stripe: u64) -> Result<()> {
        let id = self.lost_id;
        self.store.transact(TxnClass::Reclaim, |_, txn| {
            txn.set(id, stripe, &[0u8; 4]);
            Ok(())
        })?;
        self.store.commit().await?;
        self.lost_chunks()?.remove(&stripe);
        Ok(())
    }

    pub fn io_error(what: String) -> BlockError {
        BlockError::io(what, std::io::Error::from_raw_os_error(5))
    }
}
