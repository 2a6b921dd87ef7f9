//! Reading a store back: pick the superblock, load its checkpoint, replay the journal.
//!
//! Recovery needs no decisions from a human. The newer valid superblock wins; its checkpoint
//! must be intact (it was flushed before the superblock was written, so damage there is media
//! failure and is reported, never guessed around); the journal is replayed batch by batch
//! until the first batch that is absent, from another epoch, out of sequence or torn.
//!
//! From format version 2 every batch has two copies, written together. A batch with one
//! valid copy is replayed from it and the other copy's fault is recorded; a batch with none
//! is the normal trace of a crash during a commit that was never acknowledged. Version 1
//! stores have one copy, and there a damaged last batch looks like a torn one.

use std::time::Instant;

use bytes::BytesMut;
use strata_core::{BlockDevice, BlockError};

use crate::block::{self, BlockKind, BLOCK_SIZE};
use crate::journal::decode_batch;
use crate::layout::Superblock;
use crate::state::{decode_checkpoint, State, TablePages};

/// Why the journal scan stopped.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum JournalEnd {
    /// The next block belongs to another epoch or batch: the clean end.
    Clean,
    /// The next batch failed its checks (in both copies, from format version 2): a commit
    /// interrupted by a crash.
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
    /// Journal batches replayed from one copy because the other failed its checks, one line
    /// each (format version 2). Nothing was lost, but the medium (or a crash) damaged a copy.
    pub journal_copy_faults: Vec<String>,
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
            other => BlockError::Corrupt(format!("metadata recovery: {other}")),
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
    let pages = TablePages::of_version(superblock.format_version);
    let mut state =
        decode_checkpoint(&stream, pages).map_err(|e| checkpoint_error(e.to_string()))?;
    let mut recovered = Recovered {
        next_txn: superblock.checkpoint_txn,
        superblock,
        state: State::new(),
        journal_end_block: 0,
        batches_replayed: 0,
        txns_replayed: 0,
        journal_end: JournalEnd::Clean,
        superblock_faults,
        journal_copy_faults: Vec::new(),
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
///
/// An epoch's first batch starts at journal block 0 (copy 1) and, in format version 2, at the
/// first block of the journal's second half (copy 2). Both places are looked at whatever the
/// readable superblock's version (the newer one may be the version 2 superblock that upgraded
/// a version 1 store), so that damage to one copy of that batch does not hide it.
async fn refuse_if_newer_epoch(
    device: &dyn BlockDevice,
    superblock: &Superblock,
) -> Result<(), RecoveryError> {
    let layout = &superblock.layout;
    for at in [0, layout.journal_blocks / 2] {
        let first = read_blocks(device, layout.journal_offset(at), 1).await?;
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
    }
    Ok(())
}

/// Journal blocks read ahead per device read while scanning.
const SCAN_CHUNK_BLOCKS: u64 = 256;

/// What one copy of the journal holds where the next batch should be.
enum CopyRead {
    /// The whole batch, checked.
    Valid { count: u64, stream: Vec<u8> },
    /// The first block fails its own checks: never written in this epoch, or torn, or damaged.
    Unreadable(String),
    /// The first block is a valid block of something else (an older epoch, another batch).
    Other(String),
    /// The first block starts this batch, but the batch as a whole fails its checks.
    Torn(String),
}

impl CopyRead {
    fn reason(&self) -> &str {
        match self {
            CopyRead::Valid { .. } => "valid",
            CopyRead::Unreadable(reason) | CopyRead::Other(reason) | CopyRead::Torn(reason) => {
                reason
            }
        }
    }
}

async fn read_copy(
    device: &dyn BlockDevice,
    window: &mut JournalWindow,
    epoch: u64,
    seq: u64,
    at: u64,
) -> Result<CopyRead, BlockError> {
    let first = window.blocks(device, at, 1).await?;
    let header = match block::decode(first) {
        Ok((header, _)) => header,
        Err(fault) => return Ok(CopyRead::Unreadable(format!("block {at}: {fault}"))),
    };
    if header.kind != BlockKind::Journal || header.epoch != epoch || header.seq != seq {
        return Ok(CopyRead::Other(format!(
            "block {at} holds a {:?} block of epoch {} batch {}",
            header.kind, header.epoch, header.seq
        )));
    }
    let count = header.count as u64;
    if at + count > window.capacity {
        return Ok(CopyRead::Torn(format!("batch {seq} runs past the journal")));
    }
    let unit = window.blocks(device, at, count).await?;
    Ok(
        match block::decode_unit(BlockKind::Journal, epoch, seq, unit) {
            Ok((_, stream)) => CopyRead::Valid { count, stream },
            Err(fault) => CopyRead::Torn(format!("batch {seq}: {fault}")),
        },
    )
}

async fn replay_journal(
    device: &dyn BlockDevice,
    recovered: &mut Recovered,
    state: &mut State,
) -> Result<(), RecoveryError> {
    let superblock = recovered.superblock.clone();
    let epoch = superblock.generation;
    let capacity = superblock.journal_capacity();
    let mut windows: Vec<JournalWindow> = (0..superblock.journal_copies())
        .map(|copy| JournalWindow::new(&superblock, copy))
        .collect();
    loop {
        let at = recovered.journal_end_block;
        let seq = recovered.batches_replayed;
        if at >= capacity {
            recovered.journal_end = JournalEnd::Full;
            return Ok(());
        }
        let mut reads = Vec::with_capacity(windows.len());
        for window in &mut windows {
            reads.push(read_copy(device, window, epoch, seq, at).await?);
        }
        let (count, stream) = if let [only] = &mut reads[..] {
            // Format version 1: one copy, and no way to tell a torn tail from a damaged one.
            match std::mem::replace(only, CopyRead::Other(String::new())) {
                CopyRead::Valid { count, stream } => (count, stream),
                CopyRead::Other(_) => {
                    recovered.journal_end = JournalEnd::Clean;
                    return Ok(());
                }
                CopyRead::Unreadable(_) => {
                    recovered.journal_end = JournalEnd::Clean;
                    return refuse_if_later_batches(device, &mut windows, epoch, seq, at + 1).await;
                }
                CopyRead::Torn(reason) => {
                    recovered.journal_end = JournalEnd::Torn(reason);
                    return refuse_if_later_batches(device, &mut windows, epoch, seq, at + 1).await;
                }
            }
        } else {
            match twin_batch(recovered, epoch, seq, reads)? {
                Pick::Batch(count, stream) => (count, stream),
                Pick::End { damaged: false } => return Ok(()),
                Pick::End { damaged: true } => {
                    return refuse_if_later_batches(device, &mut windows, epoch, seq, at + 1).await
                }
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

/// What the two copies of a batch give.
enum Pick {
    Batch(u64, Vec<u8>),
    /// The journal ends here. `damaged`: a copy holds a block that fails its checks or a torn
    /// unit, so this may be a damaged batch, and later batches must be looked for. When both
    /// copies hold valid blocks of something else (an older epoch), neither write of this
    /// batch ever happened, so no later batch was written either (as in version 1): the scan,
    /// a read of the rest of the journal area, is skipped.
    End {
        damaged: bool,
    },
}

/// Format version 2: picks batch `seq` from its two copies, or finds the journal's end
/// (recording why in `recovered.journal_end`).
///
/// Both copies are written together and both are awaited before a commit returns, so:
/// - one valid copy is a batch whose other write was torn by a crash (it may or may not have
///   been acknowledged) or damaged later. Either way the valid copy is the batch, and nothing
///   is lost; the finding is recorded so that `strata check` shows it, and the fresh
///   checkpoint at open makes the journal, and the damaged copy, history;
/// - no valid copy is a commit interrupted by a crash before either write was whole: it was
///   never acknowledged. (An acknowledged batch with both copies damaged afterwards looks the
///   same when it is the last one: that takes two independent media faults, the format's
///   limit. When a later batch is valid the caller refuses.)
/// - two valid copies that differ cannot come from one commit: refuse rather than choose.
fn twin_batch(
    recovered: &mut Recovered,
    epoch: u64,
    seq: u64,
    reads: Vec<CopyRead>,
) -> Result<Pick, RecoveryError> {
    let mut reads = reads.into_iter();
    let (one, two) = (reads.next().expect("copy 1"), reads.next().expect("copy 2"));
    match (one, two) {
        (
            CopyRead::Valid { count, stream },
            CopyRead::Valid {
                count: count_2,
                stream: stream_2,
            },
        ) => {
            if count != count_2 || stream != stream_2 {
                return Err(RecoveryError::Replay {
                    batch: seq,
                    txn: recovered.next_txn,
                    reason: format!(
                        "the two copies of batch {seq} (epoch {epoch}) are both valid but \
                         differ ({count} and {count_2} blocks): committed metadata was \
                         corrupted on the medium, or written wrongly"
                    ),
                });
            }
            Ok(Pick::Batch(count, stream))
        }
        (CopyRead::Valid { count, stream }, bad) => {
            recovered
                .journal_copy_faults
                .push(copy_fault(seq, epoch, 2, &bad));
            Ok(Pick::Batch(count, stream))
        }
        (bad, CopyRead::Valid { count, stream }) => {
            recovered
                .journal_copy_faults
                .push(copy_fault(seq, epoch, 1, &bad));
            Ok(Pick::Batch(count, stream))
        }
        (one, two) => {
            let torn = matches!(one, CopyRead::Torn(_)) || matches!(two, CopyRead::Torn(_));
            recovered.journal_end = if torn {
                JournalEnd::Torn(format!(
                    "batch {seq}: copy 1: {}; copy 2: {}",
                    one.reason(),
                    two.reason()
                ))
            } else {
                JournalEnd::Clean
            };
            let damaged = !matches!((&one, &two), (CopyRead::Other(_), CopyRead::Other(_)));
            Ok(Pick::End { damaged })
        }
    }
}

fn copy_fault(seq: u64, epoch: u64, copy: u64, read: &CopyRead) -> String {
    format!(
        "journal batch {seq} (epoch {epoch}): copy {copy} failed its check ({}); replayed from \
         the other copy",
        read.reason()
    )
}

/// A batch that fails its checks (in every copy) is normally the one a crash interrupted, and
/// nothing after it was ever written: each batch is written only once the one before it is
/// durable. A valid later batch of the same epoch, in either copy, therefore means the failed
/// one was damaged after it was acknowledged (media corruption). Replaying past it would be
/// guessing and stopping at it would silently drop committed transactions, so recovery
/// refuses and says where.
async fn refuse_if_later_batches(
    device: &dyn BlockDevice,
    windows: &mut [JournalWindow],
    epoch: u64,
    seq: u64,
    from: u64,
) -> Result<(), RecoveryError> {
    for (copy, window) in windows.iter_mut().enumerate() {
        for at in from..window.capacity {
            let block = window.blocks(device, at, 1).await?;
            let Ok((header, _)) = block::decode(block) else {
                continue;
            };
            if header.kind == BlockKind::Journal && header.epoch == epoch && header.seq > seq {
                return Err(RecoveryError::Replay {
                    batch: seq,
                    txn: 0,
                    reason: format!(
                        "batch {seq} is damaged but batch {} follows it at journal block {at} \
                         (copy {}): committed metadata was corrupted on the medium",
                        header.seq,
                        copy + 1
                    ),
                });
            }
        }
    }
    Ok(())
}

/// A read-ahead buffer over one copy of the journal, so a scan costs a few large reads, not
/// one per batch. Blocks are numbered within the copy.
struct JournalWindow {
    layout: crate::layout::Layout,
    /// The copy's first block within the journal area.
    base: u64,
    /// Blocks in the copy.
    capacity: u64,
    start: u64,
    data: BytesMut,
}

impl JournalWindow {
    fn new(superblock: &Superblock, copy: u64) -> Self {
        JournalWindow {
            layout: superblock.layout,
            base: copy * superblock.journal_capacity(),
            capacity: superblock.journal_capacity(),
            start: 0,
            data: BytesMut::new(),
        }
    }

    async fn blocks(
        &mut self,
        device: &dyn BlockDevice,
        at: u64,
        count: u64,
    ) -> Result<&[u8], BlockError> {
        assert!(at + count <= self.capacity);
        let have = (self.data.len() / BLOCK_SIZE) as u64;
        if at < self.start || at + count > self.start + have {
            let blocks = count.max(SCAN_CHUNK_BLOCKS).min(self.capacity - at);
            let offset = self.layout.journal_offset(self.base + at);
            self.data = read_blocks(device, offset, blocks).await?;
            self.start = at;
        }
        let from = (at - self.start) as usize * BLOCK_SIZE;
        Ok(&self.data[from..from + count as usize * BLOCK_SIZE])
    }
}
