//! The data path: one stripe's part of a read or a write, and the array flush.
//!
//! A stripe update runs under the gate (shared) and its stripe lock: plan, read, compute,
//! journal (durably), then write in place. Any member error before the journal record is
//! durable abandons the attempt (nothing changed), fails the member durably and replans. A
//! member error after it leaves the update valid (the computed data and parity are right
//! whichever member dropped out): the member is failed durably and the update counts as done.

use bytes::Bytes;
use futures_util::future::join_all;
use strata_core::Result;

use super::array::{Array, Fault};
use super::journal::{Appended, Record};
use super::layout::Layout;
use super::plan::{plan_read, plan_write, xor_into, ReadSource, WriteKind};

/// What one attempt at a stripe update ended with.
enum Step {
    Done,
    /// Member failed: record it durably and retry.
    Failed(usize),
    /// The journal is full: reset it and retry.
    JournalFull,
    /// Done, but a Done record did not fit: reset the journals before acknowledging.
    DoneReset,
}

/// Attempts per stripe: each retry follows a member failure or a journal reset, and an
/// array fails at its second member failure, so a handful is plenty.
const ATTEMPTS: usize = 8;

/// Journal-full retries per stripe. Counted apart from failures: every reset empties the
/// journal and the largest record fits an empty lane, but many concurrent stripe writes to
/// a small journal can each lose the race for the fresh space several times (journal
/// version 3's two copies halve a journal's room). The bound only stops a bug from looping.
const FULL_RETRIES: usize = 1000;

impl Array {
    pub async fn write_stripe(
        &self,
        layout: Layout,
        stripe: u64,
        within: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<()> {
        let (mut failures, mut resets) = (0, 0);
        while failures < ATTEMPTS && resets < FULL_RETRIES {
            match self
                .try_write_stripe(layout, stripe, within, data, fua)
                .await?
            {
                Step::Done => return Ok(()),
                Step::DoneReset => return self.reset_journals().await,
                Step::Failed(member) => {
                    failures += 1;
                    self.fail_member(member).await?
                }
                Step::JournalFull => {
                    resets += 1;
                    self.reset_journals().await?
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
        within: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<Step> {
        let _gate = self.gate.read().await;
        let _lock = self.lock_stripe(stripe).await;
        let failed = self.members.unusable(stripe, layout.members)?;
        if let Some(f) = failed {
            if !self.members.lock()[f].durable {
                return Ok(Step::Failed(f));
            }
        }
        let parity = layout.parity_member(stripe);
        let (chunk, members, len) = (layout.chunk_bytes, layout.members, data.len() as u64);
        let plan = plan_write(chunk, members, parity, stripe, within, len, failed);
        // A partial update after an unflushed full-stripe write of this stripe: make that
        // write durable first, so the stripe's old state is consistent (see the doc).
        let full_dirty = self.full_writes()?.dirty.contains_key(&stripe);
        if plan.kind != WriteKind::FullStripe && full_dirty {
            if let Some(member) = self.flush_members().await? {
                return Ok(Step::Failed(member));
            }
            self.full_writes()?.dirty.remove(&stripe);
        }
        let reads = plan
            .reads
            .iter()
            .map(|r| self.m_read(r.member, layout.member_offset(stripe, r.start), r.len));
        let mut old = Vec::with_capacity(plan.reads.len());
        for result in join_all(reads).await {
            match result {
                Ok(bytes) => old.push(bytes),
                Err(Fault { member }) => return Ok(Step::Failed(member)),
            }
        }
        let writes: Vec<(usize, u64, Bytes)> = plan
            .compute(&old, data)
            .into_iter()
            .map(|(m, start, bytes)| (m, start, Bytes::from(bytes)))
            .collect();
        let record = match plan.kind {
            WriteKind::DataOnly => None,
            WriteKind::FullStripe => Some(Record::Intent { stripe }),
            _ => Some(Record::Update {
                stripe,
                writes: writes.clone(),
            }),
        };
        let mut intent = None;
        if let Some(record) = record.filter(|_| !self.skip_journal) {
            let Some(device) = self.journal_target(parity) else {
                return Ok(Step::Failed(parity));
            };
            let epoch = self.journal(parity).epoch();
            match self.journal(parity).append(&device, &record, None).await {
                Ok(Appended::Full) => return Ok(Step::JournalFull),
                Ok(Appended::Durable(seq)) if plan.kind == WriteKind::FullStripe => {
                    intent = Some((parity, epoch, seq));
                    self.full_writes()?
                        .dirty
                        .insert(stripe, (parity, epoch, seq));
                }
                Ok(_) => {}
                Err(_) => return Ok(Step::Failed(self.journal_write_failed(parity)?.member)),
            }
        }
        let in_place = writes.into_iter().map(|(m, start, bytes)| {
            self.m_write(m, layout.member_offset(stripe, start), bytes, fua)
        });
        for result in join_all(in_place).await {
            if let Err(Fault { member }) = result {
                self.fail_member(member).await?;
            }
        }
        self.after_write(stripe, &plan, intent, fua).await
    }

    /// Bookkeeping once the in-place writes are done: full-stripe completion (and its Done
    /// record under FUA), and clearing a lost mark the write covered.
    async fn after_write(
        &self,
        stripe: u64,
        plan: &super::plan::WritePlan,
        intent: Option<(usize, u64, u64)>,
        fua: bool,
    ) -> Result<Step> {
        let lost = self.lost_chunks()?.get(&stripe).copied();
        if let Some(member) = lost {
            let whole = plan
                .pieces
                .iter()
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
        match self
            .journal(parity)
            .append(&device, &done, Some(epoch))
            .await
        {
            Ok(Appended::Full) => Ok(Step::DoneReset),
            Ok(_) => Ok(Step::Done),
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
                Some(member) => self.fail_member(member).await?,
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
    ) -> Result<Option<usize>> {
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
                Err(Fault { member }) => return Ok(Some(member)),
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
