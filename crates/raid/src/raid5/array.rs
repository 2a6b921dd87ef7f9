//! The array's shared state and the operations every path uses: member I/O that names the
//! member it failed on, durable failure marking, member flushes, journal resets.
//!
//! Lock order (outermost first): one writer slot (held by whoever runs a stripe's queued
//! writes, across their retries, journal resets included), `gate` (shared by every stripe
//! update and rebuild step, exclusive for a journal reset), one stripe lock, then `fail_lock`
//! (async, held while a failure is made durable). std Mutexes (`full`, `lost`, `record`,
//! `activity`, `queued`) are held only for in-memory work, never across an await.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures_util::future::join_all;
use strata_core::{
    poison, Activity, Background, BlockError, DeviceRef, Result, Runtime, StripedLocks, WriteFlags,
};
use strata_meta::{MetaStore, ObjectId, TxnClass};

use super::grow::GrowControl;
use super::io::Queued;
use super::journal::{Appended, Journal, Record, MAX_DONE};
use super::layout::Layout;
use super::members::{array_failed, MemberState, Members};
use super::record::ArrayRecord;
use super::shape::Shape;

/// Stripe locks are a fixed table indexed by stripe number: two stripes that share a slot
/// serialize, which is rare at this size and costs no allocation per request.
pub const STRIPE_LOCKS: usize = 1024;

/// A member I/O that failed: which member (the caller marks it failed and retries).
#[derive(Debug)]
pub struct Fault {
    pub member: usize,
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
    /// Stripe-journal damage repaired from the other copy at open (shown by Describe, so a
    /// failing medium is seen before a second fault makes the damage unrecoverable).
    pub journal_findings: AtomicU64,
    /// The rebuild: quiesced by online changes, stopped at shutdown.
    pub background: Background,
    /// A grow's coordination with the data path (see `grow`).
    pub grow: GrowControl,
}

impl Array {
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
        let device = self.members.device(member).ok_or(Fault { member })?;
        match device.read(offset, len as usize).await {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(error) => {
                tracing::error!(array = %self.name, member, offset, %error, "raid5: member read failed");
                Err(Fault { member })
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
        let device = self.members.device(member).ok_or(Fault { member })?;
        match device.write(offset, data, WriteFlags { fua }).await {
            Ok(()) => Ok(()),
            Err(error) => {
                tracing::error!(array = %self.name, member, offset, %error, "raid5: member write failed");
                Err(Fault { member })
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
            return Ok(Fault { member });
        }
        let reason = "a journal write failed".to_string();
        tracing::error!(array = %self.name, member, "raid5: journal device write failed; refusing writes");
        let error = self.journal_device_error(&reason);
        poison::check(self.journal_failed.lock(), &self.name, "the journal state")?
            .get_or_insert(reason);
        Err(error)
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
    /// writes durable, then starts a new epoch on each member in use.
    pub async fn reset_journals(&self) -> Result<()> {
        let _gate = self.gate.write().await;
        self.reset_journals_locked().await
    }

    /// [`Array::reset_journals`] for a caller already holding the gate exclusively (open).
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
                let device = self.journal_target(m).ok_or(Fault { member: m })?;
                self.journal(m)
                    .reset(&device, epoch)
                    .await
                    .map_err(|_| Fault { member: m })
            });
        for result in join_all(resets).await {
            if let Err(Fault { member }) = result {
                let fault = self.journal_write_failed(member)?;
                self.fail_member(fault.member).await?;
            }
        }
        *self.full_writes()? = FullWrites::default();
        Ok(())
    }

    /// After a member flush: tells each journal that the full-stripe writes it logged before
    /// `completed` was taken are durable, so recovery will not doubt them.
    pub async fn log_done(&self, completed: Vec<(u64, usize, u64, u64)>) -> Result<()> {
        let mut by_member: BTreeMap<(usize, u64), Vec<u64>> = BTreeMap::new();
        {
            let mut full = self.full_writes()?;
            for &(stripe, member, epoch, seq) in &completed {
                if full.dirty.get(&stripe) == Some(&(member, epoch, seq)) {
                    full.dirty.remove(&stripe);
                }
                by_member.entry((member, epoch)).or_default().push(seq);
            }
        }
        // Appends hold the gate shared, so that a reset never runs under them.
        let gate = self.gate.read().await;
        for ((member, epoch), seqs) in by_member {
            let Some(device) = self.journal_target(member) else {
                continue;
            };
            for part in seqs.chunks(MAX_DONE) {
                let record = Record::Done {
                    seqs: part.to_vec(),
                };
                match self
                    .journal(member)
                    .append(&device, &record, Some(epoch))
                    .await
                {
                    Ok(Appended::Full) => {
                        drop(gate);
                        return self.reset_journals().await;
                    }
                    Ok(_) => {}
                    Err(_) => {
                        let fault = self.journal_write_failed(member)?;
                        self.fail_member(fault.member).await?
                    }
                }
            }
        }
        Ok(())
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
