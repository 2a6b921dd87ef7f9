//! Recovery at open: replay the stripe journals and settle full-stripe writes in doubt.
//!
//! For each stripe, its records all sit in one journal (its parity member's), in the order
//! the updates happened. Records before the stripe's last intent are superseded by that
//! full-stripe write. Updates after it are replayed in order: each writes the new data and
//! parity of its rows, so afterwards those rows are consistent whatever subset of the
//! original in-place writes had landed, and a missing member's content is derivable. An
//! intent with no update after it and no Done record names a full-stripe write that may be
//! torn: with every member present the parity is recomputed from the data (resync); with a
//! data member missing, that member's chunk cannot be derived and is marked lost (reads fail
//! rather than return a mix of old and new); with the parity member missing there is nothing
//! to fix.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use strata_core::{BlockError, Result};
use strata_meta::TxnClass;

use super::array::{Array, Fault};
use super::journal::{device_journal_base, scan, Record, JOURNAL_VERSION};
use super::layout::Layout;
use super::members::{MemberState, META_BYTES};
use super::plan::xor_into;

#[derive(Debug, Default, Clone, Copy)]
pub struct Replayed {
    pub updates: u64,
    pub resynced: u64,
    pub lost: u64,
}

type StripeLog = BTreeMap<u64, Vec<(usize, u64, Record)>>;

impl Array {
    async fn read_journals(&self) -> Result<(StripeLog, HashSet<(usize, u64)>)> {
        let mut stripes: StripeLog = BTreeMap::new();
        let mut done = HashSet::new();
        let uuid = self.array_record()?.uuid;
        let bytes = self.array_record()?.journal_bytes;
        let snapshot = self.members.snapshot();
        for (member, state) in snapshot.iter().enumerate() {
            // A failed member's journal is skipped even when the journal device still holds
            // it: its stripes' parity is gone, so nothing in it is needed, and writes to those
            // stripes since the failure went unjournaled (data only), which replaying its
            // older records would undo.
            if state.state == MemberState::Failed {
                continue;
            }
            let region = if let Some(device) = &self.journal_device {
                let base = device_journal_base(member, bytes);
                device.read(base, bytes as usize).await?.to_vec()
            } else {
                match self.m_read(member, META_BYTES, bytes).await {
                    Ok(region) => region,
                    Err(Fault { member, .. }) => {
                        self.members.mark_failed(member);
                        continue;
                    }
                }
            };
            let scanned = scan(&region, uuid, member).map_err(|damage| {
                BlockError::Corrupt(format!(
                    "raid5 {}: the stripe journal of member {member} is damaged: {damage}; \
                     the array is not started, because replaying around the damage could write \
                     older data over acknowledged writes (run `strata check`; restore the member \
                     or the journal device from a copy, or replace the member)",
                    self.name
                ))
            })?;
            for finding in &scanned.findings {
                tracing::warn!(array = %self.name, member, %finding, "raid5: stripe journal damage repaired from its other copy");
            }
            self.journal_findings
                .fetch_add(scanned.findings.len() as u64, Ordering::Relaxed);
            if scanned.version != 0 && scanned.version != JOURNAL_VERSION {
                tracing::info!(array = %self.name, member, version = scanned.version, "raid5: replaying a stripe journal of an older version; it is rewritten as version {JOURNAL_VERSION} after replay");
            }
            for (seq, record) in scanned.records {
                match record {
                    Record::Done { seqs } => done.extend(seqs.into_iter().map(|s| (member, s))),
                    Record::Update { stripe, .. } | Record::Intent { stripe } => stripes
                        .entry(stripe)
                        .or_default()
                        .push((member, seq, record)),
                }
            }
        }
        Ok((stripes, done))
    }

    /// Replays every journal. The caller holds the gate exclusively and resets the journals
    /// afterwards (which flushes what this wrote).
    pub async fn replay(&self) -> Result<Replayed> {
        let (stripes, done) = self.read_journals().await?;
        let mut report = Replayed::default();
        let mut lost = Vec::new();
        for (stripe, log) in stripes {
            if stripe >= self.layout().stripes {
                continue;
            }
            let last_intent = log
                .iter()
                .rposition(|(_, _, r)| matches!(r, Record::Intent { .. }));
            let after = last_intent.map_or(0, |i| i + 1);
            for (_, _, record) in &log[after..] {
                if let Record::Update { writes, .. } = record {
                    self.replay_update(stripe, writes).await?;
                    report.updates += 1;
                }
            }
            let Some(i) = last_intent else { continue };
            let (member, seq, _) = &log[i];
            if after < log.len() || done.contains(&(*member, *seq)) {
                continue;
            }
            // During a grow a row is in one geometry or the other, or holds nothing anybody
            // reads (see `shape`): only a live row's parity is worth resyncing.
            let Some(layout) = self.shape().row_layout(stripe) else {
                continue;
            };
            match self.members.unusable(stripe, layout.members)? {
                None => {
                    self.resync(layout, stripe).await?;
                    report.resynced += 1;
                }
                Some(f) if f == layout.parity_member(stripe) => {}
                Some(f) => lost.push((stripe, f)),
            }
        }
        report.lost = lost.len() as u64;
        if !lost.is_empty() {
            let id = self.lost_id;
            self.store.transact(TxnClass::Normal, |_, txn| {
                for &(stripe, member) in &lost {
                    txn.set_u32(id, stripe, member as u32 + 1);
                }
                Ok(())
            })?;
            self.lost_chunks()?.extend(lost.iter().copied());
            for (stripe, member) in &lost {
                tracing::error!(array = %self.name, stripe, member, "raid5: a full-stripe write was torn by a crash while this member is missing; its chunk there is lost");
            }
        }
        Ok(report)
    }

    async fn replay_update(&self, stripe: u64, writes: &[(usize, u64, Bytes)]) -> Result<()> {
        let layout = self.layout();
        let unusable = self.members.unusable(stripe, layout.members)?;
        for (member, start, bytes) in writes {
            if Some(*member) == unusable || *start + bytes.len() as u64 > layout.chunk_bytes {
                continue;
            }
            let offset = layout.member_offset(stripe, *start);
            if let Err(fault) = self.m_write(*member, offset, bytes.clone(), false).await {
                self.fail(fault).await?;
            }
        }
        Ok(())
    }

    /// Parity := XOR of the data chunks of `stripe` (every member present).
    pub async fn resync(&self, layout: Layout, stripe: u64) -> Result<()> {
        let parity = layout.parity_member(stripe);
        let offset = layout.member_offset(stripe, 0);
        let mut sum = vec![0u8; layout.chunk_bytes as usize];
        for member in (0..layout.members).filter(|&m| m != parity) {
            match self.m_read(member, offset, layout.chunk_bytes).await {
                Ok(bytes) => xor_into(&mut sum, &bytes),
                Err(fault) => return self.fail(fault).await,
            }
        }
        if let Err(fault) = self.m_write(parity, offset, Bytes::from(sum), false).await {
            self.fail(fault).await?;
        }
        Ok(())
    }
}
