//! Reading a store back: pick the superblock, load its checkpoint, replay the journal.
//!
//! Recovery needs no decisions from a human. The newer valid superblock wins; its checkpoint
//! must be intact (it was flushed before the superblock was written, so damage there is media
//! failure and is reported, never guessed around); the journal is replayed batch by batch
//! until the first batch that is absent, from another epoch, out of sequence or torn. A torn
//! batch is the normal trace of a crash during a commit that was never acknowledged.

use std::time::Instant;

use bytes::BytesMut;
use strata_core::{BlockDevice, BlockError};

use crate::block::{self, BlockKind, BLOCK_SIZE};
use crate::journal::decode_batch;
use crate::layout::Superblock;
use crate::state::{decode_checkpoint, State};

/// Why the journal scan stopped.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum JournalEnd {
    /// The next block belongs to another epoch or batch: the clean end.
    Clean,
    /// The next batch failed its checks: a commit interrupted by a crash.
    Torn(String),
    /// The journal is full up to its last block.
    Full,
}

/// What recovery found.
#[derive(Clone, Debug)]
pub struct Recovered {
    pub superblock: Superblock,
    pub state: State,
    /// Number the next transaction gets.
    pub next_txn: u64,
    /// Journal block after the last valid batch.
    pub journal_end_block: u64,
    pub batches_replayed: u64,
    pub txns_replayed: u64,
    pub journal_end: JournalEnd,
    /// Superblock copies that did not check out, with why (copy index, reason).
    pub superblock_faults: Vec<(u64, String)>,
    pub checkpoint_bytes: u64,
    pub elapsed: std::time::Duration,
}

/// Why a store could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("no valid superblock (copy A: {a}; copy B: {b})")]
    NoSuperblock { a: String, b: String },
    #[error("checkpoint of generation {generation} is damaged: {reason}")]
    Checkpoint { generation: u64, reason: String },
    #[error("journal batch {batch} (transaction {txn}) does not apply: {reason}")]
    Replay {
        batch: u64,
        txn: u64,
        reason: String,
    },
    #[error(transparent)]
    Io(#[from] BlockError),
}

impl From<RecoveryError> for BlockError {
    fn from(error: RecoveryError) -> Self {
        match error {
            RecoveryError::Io(error) => error,
            other => BlockError::io(
                format!("metadata recovery: {other}"),
                std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
            ),
        }
    }
}

/// Reads `blocks` metadata blocks at byte `offset`, in pieces the device accepts.
pub async fn read_blocks(
    device: &dyn BlockDevice,
    offset: u64,
    blocks: u64,
) -> Result<BytesMut, BlockError> {
    let total = blocks as usize * BLOCK_SIZE;
    let piece = (device.geometry().max_io as usize / BLOCK_SIZE).max(1) * BLOCK_SIZE;
    let mut out = BytesMut::with_capacity(total);
    while out.len() < total {
        let len = piece.min(total - out.len());
        let data = device.read(offset + out.len() as u64, len).await?;
        assert_eq!(data.len(), len, "a device returned a short read");
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// Reads both superblock copies and returns the valid one with the higher generation.
pub async fn read_superblock(
    device: &dyn BlockDevice,
    offset: u64,
) -> Result<(Superblock, Vec<(u64, String)>), RecoveryError> {
    let both = read_blocks(device, offset, 2).await?;
    let mut faults = Vec::new();
    let mut best: Option<Superblock> = None;
    for copy in 0..2u64 {
        let data = &both[copy as usize * BLOCK_SIZE..(copy as usize + 1) * BLOCK_SIZE];
        match Superblock::decode(data, offset) {
            Ok(sb) if sb.copy() != copy => faults.push((
                copy,
                format!("generation {} in the wrong copy", sb.generation),
            )),
            Ok(sb) => {
                if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                    best = Some(sb);
                }
            }
            Err(reason) => faults.push((copy, reason)),
        }
    }
    match best {
        Some(superblock) => Ok((superblock, faults)),
        None => {
            let reason = |copy: u64| {
                faults
                    .iter()
                    .find(|(c, _)| *c == copy)
                    .map_or_else(String::new, |(_, r)| r.clone())
            };
            Err(RecoveryError::NoSuperblock {
                a: reason(0),
                b: reason(1),
            })
        }
    }
}

/// Recovers the state of the store whose region starts at byte `offset` of `device`.
pub async fn recover(device: &dyn BlockDevice, offset: u64) -> Result<Recovered, RecoveryError> {
    let started = Instant::now();
    let (superblock, superblock_faults) = read_superblock(device, offset).await?;
    let layout = superblock.layout;
    let generation = superblock.generation;
    if !superblock_faults.is_empty() {
        refuse_if_newer_epoch(device, &superblock).await?;
    }
    let slot = layout.slot_offset(superblock.active_slot);
    let blocks = read_blocks(device, slot, superblock.checkpoint_blocks).await?;
    let checkpoint_error = |reason: String| RecoveryError::Checkpoint { generation, reason };
    let (_, stream) = block::decode_unit(BlockKind::Checkpoint, generation, 0, &blocks)
        .map_err(|fault| checkpoint_error(fault.to_string()))?;
    let mut state = decode_checkpoint(&stream).map_err(|e| checkpoint_error(e.to_string()))?;
    let mut recovered = Recovered {
        next_txn: superblock.checkpoint_txn,
        superblock,
        state: State::new(),
        journal_end_block: 0,
        batches_replayed: 0,
        txns_replayed: 0,
        journal_end: JournalEnd::Clean,
        superblock_faults,
        checkpoint_bytes: stream.len() as u64,
        elapsed: Default::default(),
    };
    replay_journal(device, &mut recovered, &mut state).await?;
    recovered.state = state;
    recovered.elapsed = started.elapsed();
    Ok(recovered)
}

/// A superblock copy that fails its checks is normally a superblock write torn by a crash, and
/// the other copy is then the current one. But journal batches of a newer epoch are written
/// only after that epoch's superblock is durable: if the journal starts with one, the newer
/// superblock was damaged after the fact, and falling back would silently roll back.
async fn refuse_if_newer_epoch(
    device: &dyn BlockDevice,
    superblock: &Superblock,
) -> Result<(), RecoveryError> {
    let first = read_blocks(device, superblock.layout.journal_offset(0), 1).await?;
    if let Ok((header, _)) = block::decode(&first) {
        if header.kind == BlockKind::Journal && header.epoch > superblock.generation {
            return Err(RecoveryError::NoSuperblock {
                a: format!("the superblock of generation {} is damaged", header.epoch),
                b: format!(
                    "only generation {} is readable, and falling back to it would lose committed metadata",
                    superblock.generation
                ),
            });
        }
    }
    Ok(())
}

/// Journal blocks read ahead per device read while scanning.
const SCAN_CHUNK_BLOCKS: u64 = 256;

async fn replay_journal(
    device: &dyn BlockDevice,
    recovered: &mut Recovered,
    state: &mut State,
) -> Result<(), RecoveryError> {
    let layout = recovered.superblock.layout;
    let epoch = recovered.superblock.generation;
    let mut window = JournalWindow::default();
    loop {
        let at = recovered.journal_end_block;
        let seq = recovered.batches_replayed;
        if at >= layout.journal_blocks {
            recovered.journal_end = JournalEnd::Full;
            return Ok(());
        }
        let first = window.blocks(device, &layout, at, 1).await?;
        let Ok((header, _)) = block::decode(first) else {
            // Unreadable first block: never written in this epoch, or torn by a crash.
            recovered.journal_end = JournalEnd::Clean;
            return refuse_if_later_batches(device, &layout, epoch, seq, at + 1, &mut window).await;
        };
        if header.kind != BlockKind::Journal || header.epoch != epoch || header.seq != seq {
            recovered.journal_end = JournalEnd::Clean;
            return Ok(());
        }
        let count = header.count as u64;
        if at + count > layout.journal_blocks {
            recovered.journal_end = JournalEnd::Torn(format!("batch {seq} runs past the journal"));
            return Ok(());
        }
        let unit = window.blocks(device, &layout, at, count).await?;
        let stream = match block::decode_unit(BlockKind::Journal, epoch, seq, unit) {
            Ok((_, stream)) => stream,
            Err(fault) => {
                recovered.journal_end = JournalEnd::Torn(format!("batch {seq}: {fault}"));
                return refuse_if_later_batches(device, &layout, epoch, seq, at + 1, &mut window)
                    .await;
            }
        };
        let replay_error = |txn: u64, reason: String| RecoveryError::Replay {
            batch: seq,
            txn,
            reason,
        };
        let batch =
            decode_batch(&stream).map_err(|e| replay_error(recovered.next_txn, e.to_string()))?;
        if batch.first_txn != recovered.next_txn {
            let reason = format!("starts at transaction {}", batch.first_txn);
            return Err(replay_error(recovered.next_txn, reason));
        }
        for txn in &batch.txns {
            for op in txn {
                state
                    .apply(op)
                    .map_err(|e| replay_error(recovered.next_txn, e.to_string()))?;
            }
            recovered.next_txn += 1;
            recovered.txns_replayed += 1;
        }
        recovered.batches_replayed += 1;
        recovered.journal_end_block = at + count;
    }
}

/// A batch that fails its checks is normally the one a crash interrupted, and nothing after
/// it was ever written: each batch is written only once the one before it is durable. A
/// valid later batch of the same epoch therefore means the failed one was damaged after it
/// was acknowledged (media corruption). Replaying past it would be guessing and stopping at it
/// would silently drop committed transactions, so recovery refuses and says where.
async fn refuse_if_later_batches(
    device: &dyn BlockDevice,
    layout: &crate::layout::Layout,
    epoch: u64,
    seq: u64,
    from: u64,
    window: &mut JournalWindow,
) -> Result<(), RecoveryError> {
    for at in from..layout.journal_blocks {
        let block = window.blocks(device, layout, at, 1).await?;
        let Ok((header, _)) = block::decode(block) else {
            continue;
        };
        if header.kind == BlockKind::Journal && header.epoch == epoch && header.seq > seq {
            return Err(RecoveryError::Replay {
                batch: seq,
                txn: 0,
                reason: format!(
                    "batch {seq} is damaged but batch {} follows it at journal block {at}: \
                     committed metadata was corrupted on the medium",
                    header.seq
                ),
            });
        }
    }
    Ok(())
}

/// A read-ahead buffer over the journal, so a scan costs a few large reads, not one per batch.
#[derive(Default)]
struct JournalWindow {
    start: u64,
    data: BytesMut,
}

impl JournalWindow {
    async fn blocks(
        &mut self,
        device: &dyn BlockDevice,
        layout: &crate::layout::Layout,
        at: u64,
        count: u64,
    ) -> Result<&[u8], BlockError> {
        let have = (self.data.len() / BLOCK_SIZE) as u64;
        if at < self.start || at + count > self.start + have {
            let blocks = count.max(SCAN_CHUNK_BLOCKS).min(layout.journal_blocks - at);
            self.data = read_blocks(device, layout.journal_offset(at), blocks).await?;
            self.start = at;
        }
        let from = (at - self.start) as usize * BLOCK_SIZE;
        Ok(&self.data[from..from + count as usize * BLOCK_SIZE])
    }
}
