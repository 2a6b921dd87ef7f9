//! The data path: one stripe's part of a read or a write, and the array flush.
//!
//! A stripe update runs under the gate (shared) and its stripe lock: plan, read, compute,
//! journal (durably), then write in place. Any member error before the journal record is
//! durable abandons the attempt (nothing changed), fails the member durably and replans. A
//! member error after it leaves the update valid (the computed data and parity are right
//! whichever member dropped out): the member is failed durably and the update counts as done.
//!
//! Writes to one stripe coalesce. Each waits in its stripe's queue; whoever holds the
//! stripe's *writer* slot takes every queued write that fits one update (same layout, no
//! full-stripe write, pairwise disjoint, in arrival order up to the first that is not) and
//! runs them as one: one plan (`plan_writes`: each parity row read and written once), one
//! journal record, all member I/O at once. A batch of small writes to a stripe then costs the
//! members one parity update instead of one each, and each member sees all of the batch's
//! requests together, for its scheduler to order (what Proximal I/O's destage relies on;
//! md's stripe cache batches the same way). Lock order: writer slot, gate, stripe lock.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::future::join_all;
use strata_core::{BlockError, Result};
use tokio::sync::oneshot;

use super::array::{Array, Fault, FULL_RETRIES};
use super::journal::{Appended, Record, MAX_UPDATE_WRITES};
use super::layout::Layout;
use super::members::MemberState;
use super::plan::{plan_read, plan_writes, xor_into, ReadSource, WriteKind, WritePlan};

/// A write waiting in its stripe's queue (see the module doc).
pub struct Queued {
    layout: Layout,
    within: u64,
    data: Bytes,
    fua: bool,
    done: oneshot::Sender<Result<()>>,
}

impl Queued {
    fn is_full_stripe(&self) -> bool {
        self.within == 0 && self.data.len() as u64 == self.layout.stripe_bytes()
    }

    /// At most how many writes this one adds to an update record: a piece per chunk it
    /// touches, and a parity range.
    fn record_writes(&self) -> usize {
        let chunk = self.layout.chunk_bytes;
        let last = self.within + self.data.len() as u64 - 1;
        (last / chunk - self.within / chunk) as usize + 2
    }

    fn overlaps(&self, other: &Queued) -> bool {
        let end = |q: &Queued| q.within + q.data.len() as u64;
        self.within < end(other) && other.within < end(self)
    }

    /// Whether this write can join `batch` (non-empty, in arrival order), whose update
    /// record lists at most `record_writes` writes so far.
    fn joins(&self, batch: &[Queued], record_writes: usize) -> bool {
        batch[0].layout == self.layout
            && !batch[0].is_full_stripe()
            && !self.is_full_stripe()
            && record_writes + self.record_writes() <= MAX_UPDATE_WRITES
            && batch.iter().all(|taken| !taken.overlaps(self))
    }
}

/// What one attempt at a stripe update ended with.
enum Step {
    Done,
    /// Member failed: record it durably and retry.
    Failed(Fault),
    /// The journal is full: wait for a reclaim and retry.
    JournalFull,
    /// Done, but the Done record of this FUA full-stripe write (parity member, epoch, intent
    /// seq) did not fit: log it after a reclaim, before acknowledging.
    DoneFull((usize, u64, u64)),
}

/// Attempts per stripe: each retry follows a member failure, and an array fails at its
/// second member failure, so a handful is plenty. Journal-full retries are counted apart
/// ([`FULL_RETRIES`]): a reclaim frees every record placed before it and the largest record
/// fits an empty lane, but many concurrent stripe writes to a small journal can each lose
/// the race for the freed space several times.
const ATTEMPTS: usize = 8;

impl Array {
    /// Writes `data` at `within` of `stripe`, coalesced with the writes to it queued
    /// meanwhile (module doc).
    pub async fn write_stripe(
        &self,
        layout: Layout,
        stripe: u64,
        within: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<()> {
        let (done, mut outcome) = oneshot::channel();
        self.queued()?.entry(stripe).or_default().push_back(Queued {
            layout,
            within,
            data,
            fua,
            done,
        });
        loop {
            let _writer = tokio::select! {
                biased;
                result = &mut outcome => return result.unwrap_or_else(|_| {
                    Err(Array::io_error(format!(
                        "raid5 {}: the update of stripe {stripe} carrying this write was \
                         abandoned halfway",
                        self.name
                    )))
                }),
                writer = self.writers.write(stripe) => writer,
            };
            // Writes submitted together with this one queue up as soon as it yields: let
            // them join its update (a plug).
            tokio::task::yield_now().await;
            let batch = self.take_batch(stripe)?;
            if !batch.is_empty() {
                self.update_batch(stripe, batch).await;
            }
        }
    }

    /// The writes at the head of `stripe`'s queue that one update can carry.
    fn take_batch(&self, stripe: u64) -> Result<Vec<Queued>> {
        let mut queued = self.queued()?;
        let Some(queue) = queued.get_mut(&stripe) else {
            return Ok(Vec::new());
        };
        let (mut batch, mut record_writes): (Vec<Queued>, usize) = (Vec::new(), 0);
        while let Some(next) = queue.pop_front() {
            if !batch.is_empty() && !next.joins(&batch, record_writes) {
                queue.push_front(next);
                break;
            }
            record_writes += next.record_writes();
            batch.push(next);
        }
        if queue.is_empty() {
            queued.remove(&stripe);
        }
        Ok(batch)
    }

    /// Runs `batch` as one stripe update and tells each write how it went.
    async fn update_batch(&self, stripe: u64, batch: Vec<Queued>) {
        let layout = batch[0].layout;
        // A chunk lost in a crash while degraded has unknown content: a write of part of it
        // cannot compute the parity, and whatever it wrote would read back as an error
        // (the chunk stays lost until one write covers it whole). So it is refused, the
        // other writes of the batch go on. (Found by `strata sim explore`, seed 9 run 489: a
        // thin pool's write into such a chunk was acknowledged, flushed, then unreadable.)
        let lost = match self.lost_chunks() {
            Ok(lost) => lost.get(&stripe).copied(),
            Err(error) => {
                for write in batch {
                    let _ = write.done.send(Err(BlockError::again(&error)));
                }
                return;
            }
        };
        let (refused, batch): (Vec<Queued>, Vec<Queued>) = batch.into_iter().partition(|q| {
            lost.is_some_and(|member| {
                partly_over(layout, stripe, member, q.within, q.data.len() as u64)
            })
        });
        for write in refused {
            let _ = write.done.send(Err(Array::io_error(format!(
                "raid5 {}: chunk of member {} in stripe {stripe} was lost in a crash while \
                 degraded; rewrite it whole",
                self.name,
                lost.expect("refused for a lost chunk")
            ))));
        }
        if batch.is_empty() {
            return;
        }
        let fua = batch.iter().any(|q| q.fua);
        let writes: Vec<(u64, Bytes)> = batch.iter().map(|q| (q.within, q.data.clone())).collect();
        self.stripe_updates.fetch_add(1, Ordering::Relaxed);
        self.coalesced_writes
            .fetch_add(batch.len() as u64 - 1, Ordering::Relaxed);
        let result = self.settle_stripe(layout, stripe, &writes, fua).await;
        for write in batch {
            // A writer that stopped waiting (its future dropped) needs no answer.
            let _ = write
                .done
                .send(result.as_ref().map_err(BlockError::again).copied());
        }
    }

    /// Updates `stripe` with disjoint `writes`, retrying after member failures and after
    /// waiting for journal room.
    async fn settle_stripe(
        &self,
        layout: Layout,
        stripe: u64,
        writes: &[(u64, Bytes)],
        fua: bool,
    ) -> Result<()> {
        let (mut failures, mut full) = (0, 0);
        while failures < ATTEMPTS && full < FULL_RETRIES {
            match self.try_write_stripe(layout, stripe, writes, fua).await? {
                Step::Done => return Ok(()),
                Step::DoneFull((parity, epoch, seq)) => {
                    return self.log_done(vec![(stripe, parity, epoch, seq)]).await
                }
                Step::Failed(fault) => {
                    failures += 1;
                    self.fail(fault).await?
                }
                Step::JournalFull => {
                    full += 1;
                    // Without the gate or the stripe lock: the reclaim waits for updates
                    // in flight to finish their in-place writes.
                    self.make_room().await?
                }
            }
        }
        Err(Array::io_error(format!(
            "raid5 {}: stripe {stripe} write did not settle",
            self.name
        )))
    }

    async fn try_write_stripe(
        &self,
        layout: Layout,
        stripe: u64,
        writes: &[(u64, Bytes)],
        fua: bool,
    ) -> Result<Step> {
        let _gate = self.gate.read().await;
        let _lock = self.lock_stripe(stripe).await;
        let failed = self.members.unusable(stripe, layout.members)?;
        if let Some(f) = failed {
            // A failure not yet recorded is recorded before a degraded write leaves the member
            // stale. A replacement rebuilding (not yet recorded either) is different: the
            // record still calls its slot failed, which a degraded write is consistent with,
            // and failing it here would end a healthy rebuild.
            let member = self.members.lock()[f].clone();
            if !member.durable && member.state == MemberState::Failed {
                return Ok(Step::Failed(self.members.fault(f)));
            }
        }
        let parity = layout.parity_member(stripe);
        let (chunk, members) = (layout.chunk_bytes, layout.members);
        let ranges: Vec<(u64, u64)> = writes
            .iter()
            .map(|(within, data)| (*within, data.len() as u64))
            .collect();
        let plans = plan_writes(chunk, members, parity, stripe, &ranges, failed);
        // The groups differ only between RMW and RCW, both journaled as an update: a parity
        // failure makes them all data-only, and a full-stripe write is never batched.
        let journaled = |kind| match kind {
            WriteKind::ReconstructWrite => WriteKind::ReadModifyWrite,
            kind => kind,
        };
        let kind = journaled(plans[0].kind);
        assert!(plans.iter().all(|plan| journaled(plan.kind) == kind));
        // A lone write (every full-stripe one among them) is planned from its own buffer;
        // a batch's data is laid end to end, as `plan_writes` counts its sources.
        let data: std::borrow::Cow<[u8]> = if writes.len() == 1 {
            std::borrow::Cow::Borrowed(&writes[0].1[..])
        } else {
            std::borrow::Cow::Owned(writes.iter().flat_map(|(_, d)| d.iter().copied()).collect())
        };
        // A partial update after an unflushed full-stripe write of this stripe: make that
        // write durable first, so the stripe's old state is consistent (see the doc).
        let full_dirty = self.full_writes()?.dirty.contains_key(&stripe);
        if kind != WriteKind::FullStripe && full_dirty {
            if let Some(member) = self.flush_members().await? {
                return Ok(Step::Failed(self.members.fault(member)));
            }
            self.full_writes()?.dirty.remove(&stripe);
        }
        // Every group's reads at once, so each member sees the whole batch's requests.
        let reads = plans
            .iter()
            .flat_map(|plan| &plan.reads)
            .map(|r| self.m_read(r.member, layout.member_offset(stripe, r.start), r.len));
        let mut old = Vec::new();
        for result in join_all(reads).await {
            match result {
                Ok(bytes) => old.push(bytes),
                Err(fault) => return Ok(Step::Failed(fault)),
            }
        }
        let mut writes: Vec<(usize, u64, Bytes)> = Vec::new();
        let mut rest = &old[..];
        for plan in &plans {
            let (mine, after) = rest.split_at(plan.reads.len());
            rest = after;
            writes.extend(
                plan.compute(mine, &data)
                    .into_iter()
                    .map(|(m, start, bytes)| (m, start, Bytes::from(bytes))),
            );
        }
        let record = match kind {
            WriteKind::DataOnly => None,
            WriteKind::FullStripe => Some(Record::Intent { stripe }),
            _ => Some(Record::Update {
                stripe,
                writes: writes.clone(),
            }),
        };
        let mut intent = None;
        // Held until the in-place writes are done: a reclaim's member flush must cover them
        // before it frees the record.
        let mut pin = None;
        if let Some(record) = record.filter(|_| !self.skip_journal) {
            let Some(device) = self.journal_target(parity) else {
                return Ok(Step::Failed(self.members.fault(parity)));
            };
            let journal = self.journal(parity);
            let epoch = journal.epoch();
            match journal.append(&device, &record, None).await {
                Ok(Appended::Full) => return Ok(Step::JournalFull),
                Ok(Appended::Durable(seq, held)) => {
                    pin = Some(held);
                    if kind == WriteKind::FullStripe {
                        intent = Some((parity, epoch, seq));
                        self.full_writes()?
                            .dirty
                            .insert(stripe, (parity, epoch, seq));
                    }
                    self.reclaim_soon(&journal);
                }
                Ok(Appended::Stale) => {}
                Err(_) => return Ok(Step::Failed(self.journal_write_failed(parity)?)),
            }
        }
        let skip_parity = kind != WriteKind::FullStripe
            && strata_core::planted::planted(strata_core::planted::Bug::Raid5ParitySkipped);
        let in_place = writes
            .into_iter()
            .filter(|(m, ..)| !(skip_parity && *m == parity))
            .map(|(m, start, bytes)| {
                self.m_write(m, layout.member_offset(stripe, start), bytes, fua)
            });
        for result in join_all(in_place).await {
            if let Err(fault) = result {
                self.fail(fault).await?;
            }
        }
        drop(pin);
        self.after_write(stripe, &plans, intent, fua).await
    }

    /// Bookkeeping once the in-place writes are done: full-stripe completion (and its Done
    /// record under FUA), and clearing a lost mark the write covered.
    async fn after_write(
        &self,
        stripe: u64,
        plans: &[WritePlan],
        intent: Option<(usize, u64, u64)>,
        fua: bool,
    ) -> Result<Step> {
        let lost = self.lost_chunks()?.get(&stripe).copied();
        if let Some(member) = lost {
            let whole = plans
                .iter()
                .flat_map(|plan| &plan.pieces)
                .any(|p| p.member == member && p.start == 0 && p.len == self.layout().chunk_bytes);
            if whole {
                self.clear_lost(stripe).await?;
            }
        }
        let Some((parity, epoch, seq)) = intent else {
            return Ok(Step::Done);
        };
        if !fua {
            self.full_writes()?
                .completed
                .push((stripe, parity, epoch, seq));
            return Ok(Step::Done);
        }
        let Some(device) = self.journal_target(parity) else {
            return Ok(Step::Done);
        };
        let done = Record::Done { seqs: vec![seq] };
        let journal = self.journal(parity);
        match journal.append(&device, &done, Some(epoch)).await {
            Ok(Appended::Full) => Ok(Step::DoneFull((parity, epoch, seq))),
            Ok(_) => {
                self.reclaim_soon(&journal);
                Ok(Step::Done)
            }
            Err(_) => {
                // The write itself is durable in place; only its Done record is missing, so
                // recovery would resync the stripe (or call its chunk lost), never misread.
                let fault = self.journal_write_failed(parity)?;
                self.fail_member(fault.member).await?;
                Ok(Step::Done)
            }
        }
    }

    pub async fn read_stripe(
        &self,
        layout: Layout,
        stripe: u64,
        within: u64,
        out: &mut [u8],
    ) -> Result<()> {
        for _ in 0..ATTEMPTS {
            match self.try_read_stripe(layout, stripe, within, out).await? {
                None => return Ok(()),
                Some(fault) => self.fail(fault).await?,
            }
        }
        Err(Array::io_error(format!(
            "raid5 {}: stripe {stripe} read did not settle",
            self.name
        )))
    }

    async fn try_read_stripe(
        &self,
        layout: Layout,
        stripe: u64,
        within: u64,
        out: &mut [u8],
    ) -> Result<Option<Fault>> {
        let mut failed = self.members.unusable(stripe, layout.members)?;
        // Reconstructing reads the whole stripe, so it must not see half an update.
        let _lock = match failed {
            Some(_) => {
                let lock = self.lock_stripe(stripe).await;
                failed = self.members.unusable(stripe, layout.members)?;
                Some(lock)
            }
            None => None,
        };
        let parity = layout.parity_member(stripe);
        let (chunk, members, len) = (layout.chunk_bytes, layout.members, out.len() as u64);
        let parts = plan_read(chunk, members, parity, within, len, failed);
        if let Some(&member) = self.lost_chunks()?.get(&stripe) {
            if parts.iter().any(|p| p.member == member) {
                return Err(Array::io_error(format!(
                    "raid5 {}: chunk of member {member} in stripe {stripe} was lost in a crash \
                     while degraded; rewrite it whole",
                    self.name
                )));
            }
        }
        let fetches = parts.iter().map(|part| async move {
            let offset = layout.member_offset(stripe, part.start);
            match &part.source {
                ReadSource::Direct { member } => self.m_read(*member, offset, part.len).await,
                ReadSource::Reconstruct { from } => {
                    let all =
                        join_all(from.iter().map(|&m| self.m_read(m, offset, part.len))).await;
                    let mut rebuilt = vec![0u8; part.len as usize];
                    for bytes in all {
                        xor_into(&mut rebuilt, &bytes?);
                    }
                    Ok(rebuilt)
                }
            }
        });
        for (part, result) in parts.iter().zip(join_all(fetches).await) {
            match result {
                Ok(bytes) => {
                    out[part.dst as usize..(part.dst + part.len) as usize].copy_from_slice(&bytes)
                }
                Err(fault) => return Ok(Some(fault)),
            }
        }
        Ok(None)
    }

    /// The array flush: members first, then the Done records of the full-stripe writes that
    /// flush covered, then any metadata not yet committed.
    pub async fn flush(&self) -> Result<()> {
        self.check_alive()?;
        let completed = std::mem::take(&mut self.full_writes()?.completed);
        self.flush_all().await?;
        self.log_done(completed).await?;
        if self.store.uncommitted() > 0 {
            self.store.commit().await?;
        }
        Ok(())
    }
}

/// Whether `[within, within + len)` of `stripe`'s data covers part, but not all, of the
/// chunk of `member`.
fn partly_over(layout: Layout, stripe: u64, member: usize, within: u64, len: u64) -> bool {
    let parity = layout.parity_member(stripe);
    if member == parity {
        return false;
    }
    let position = if member < parity { member } else { member - 1 } as u64;
    let (start, end) = (
        position * layout.chunk_bytes,
        (position + 1) * layout.chunk_bytes,
    );
    let (from, to) = (within, within + len);
    let overlaps = from < end && start < to;
    let whole = from <= start && end <= to;
    overlaps && !whole
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_write_over_part_of_a_lost_chunk_is_refused() {
        let layout = Layout::new(4, 65536, 1 << 20, 100);
        let stripe = 0;
        let parity = layout.parity_member(stripe);
        let member = (0..4).find(|&m| m != parity).expect("a data member");
        let position = if member < parity { member } else { member - 1 } as u64;
        let start = position * 65536;
        assert!(partly_over(layout, stripe, member, start + 4096, 4096));
        assert!(
            partly_over(layout, stripe, member, start.saturating_sub(4096), 8192) || start == 0
        );
        assert!(
            !partly_over(layout, stripe, member, start, 65536),
            "whole: it clears the mark"
        );
        assert!(
            !partly_over(layout, stripe, member, 0, 3 * 65536),
            "the whole stripe"
        );
        let other = (start + 65536) % (3 * 65536);
        assert!(
            !partly_over(layout, stripe, member, other, 4096),
            "another chunk"
        );
        assert!(
            !partly_over(layout, stripe, parity, 0, 4096),
            "parity holds no data"
        );
    }
}
