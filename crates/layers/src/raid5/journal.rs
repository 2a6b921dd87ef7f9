//! The stripe journal that closes the write hole.
//!
//! Every stripe update that is not a full-stripe write first logs its *result*, the new data
//! and the new parity it is about to write in place, to the journal of the stripe's parity
//! member, durably (FUA); only then are the in-place writes issued. A full-stripe write logs a
//! header-only *intent*. Recovery at open replays updates in log order and resyncs (or, with a
//! member missing, marks unreadable) stripes whose full-stripe write may be torn. See
//! `docs/layers/raid5.md` for why the parity member is the right place (its loss leaves the
//! data chunks intact, and its survival keeps the record).
//!
//! Group commit: records queued while a journal write is in flight go out together in the
//! next write, so concurrent stripe updates on one member share one journal I/O.
//!
//! Lock rule: `state` (std Mutex) never across an await; `writer` (async Mutex) serializes the
//! journal writes of one member, so batch k+1 starts only once batch k is durable, and a
//! torn batch is always the last thing in the log.

use std::sync::Mutex;

use bytes::Bytes;

use strata_core::{BlockError, DeviceRef, Result, WriteFlags};

pub const JBLOCK: u64 = 4096;
const RECORD_MAGIC: u32 = 0x5335_4a52; // "S5JR"
const SUPER_MAGIC: u32 = 0x5335_4a53; // "S5JS"
pub const JOURNAL_VERSION: u32 = 1;
const HEADER: usize = 56;
const ENTRY: usize = 20;
/// Done records list at most this many intent seqs.
pub const MAX_DONE: usize = (JBLOCK as usize - HEADER) / 8;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The new contents of a stripe's changed ranges (data and parity): (member, start, bytes).
    Update {
        stripe: u64,
        writes: Vec<(usize, u64, Bytes)>,
    },
    /// A full-stripe write of `stripe` is about to start.
    Intent { stripe: u64 },
    /// The full-stripe writes logged by these intents are durable in place.
    Done { seqs: Vec<u64> },
}

impl Record {
    fn kind(&self) -> u8 {
        match self {
            Record::Update { .. } => 1,
            Record::Intent { .. } => 2,
            Record::Done { .. } => 3,
        }
    }

    /// Blocks the record takes: one header plus the payload rounded up.
    pub fn blocks(&self) -> u64 {
        let payload: u64 = match self {
            Record::Update { writes, .. } => writes.iter().map(|w| w.2.len() as u64).sum(),
            _ => 0,
        };
        1 + payload.div_ceil(JBLOCK)
    }

    pub fn encode(&self, epoch: u64, seq: u64) -> Vec<u8> {
        let mut out = vec![0u8; (self.blocks() * JBLOCK) as usize];
        out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&epoch.to_le_bytes());
        out[16..24].copy_from_slice(&seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.blocks().to_le_bytes());
        out[32] = self.kind();
        let mut at = HEADER;
        match self {
            Record::Update { stripe, writes } => {
                assert!(HEADER + writes.len() * ENTRY <= JBLOCK as usize);
                out[40..48].copy_from_slice(&stripe.to_le_bytes());
                out[48..52].copy_from_slice(&(writes.len() as u32).to_le_bytes());
                let mut payload = JBLOCK as usize;
                for (member, start, bytes) in writes {
                    out[at..at + 4].copy_from_slice(&(*member as u32).to_le_bytes());
                    out[at + 4..at + 12].copy_from_slice(&start.to_le_bytes());
                    out[at + 12..at + 20].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
                    at += ENTRY;
                    out[payload..payload + bytes.len()].copy_from_slice(bytes);
                    payload += bytes.len();
                }
            }
            Record::Intent { stripe } => out[40..48].copy_from_slice(&stripe.to_le_bytes()),
            Record::Done { seqs } => {
                assert!(seqs.len() <= MAX_DONE);
                out[48..52].copy_from_slice(&(seqs.len() as u32).to_le_bytes());
                for seq in seqs {
                    out[at..at + 8].copy_from_slice(&seq.to_le_bytes());
                    at += 8;
                }
            }
        }
        let crc = crc32c::crc32c(&out);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        out
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Decodes the record at the start of `log` if it is whole and belongs to (epoch, seq).
pub fn decode(log: &[u8], epoch: u64, seq: u64) -> Option<(Record, u64)> {
    if log.len() < JBLOCK as usize || u32_at(log, 0) != RECORD_MAGIC {
        return None;
    }
    if u64_at(log, 8) != epoch || u64_at(log, 16) != seq {
        return None;
    }
    let blocks = u64_at(log, 24);
    if blocks == 0 || blocks * JBLOCK > log.len() as u64 {
        return None;
    }
    let mut whole = log[..(blocks * JBLOCK) as usize].to_vec();
    let crc = u32_at(&whole, 4);
    whole[4..8].fill(0);
    if crc32c::crc32c(&whole) != crc {
        return None;
    }
    let count = u32_at(&whole, 48) as usize;
    let record = match whole[32] {
        1 if HEADER + count * ENTRY <= JBLOCK as usize => {
            let mut payload = JBLOCK as usize;
            let mut writes = Vec::with_capacity(count);
            for i in 0..count {
                let at = HEADER + i * ENTRY;
                let len = u64_at(&whole, at + 12) as usize;
                let bytes = Bytes::copy_from_slice(whole.get(payload..payload + len)?);
                payload += len;
                writes.push((u32_at(&whole, at) as usize, u64_at(&whole, at + 4), bytes));
            }
            Record::Update {
                stripe: u64_at(&whole, 40),
                writes,
            }
        }
        2 => Record::Intent {
            stripe: u64_at(&whole, 40),
        },
        3 if count <= MAX_DONE => Record::Done {
            seqs: (0..count).map(|i| u64_at(&whole, HEADER + 8 * i)).collect(),
        },
        _ => return None,
    };
    Some((record, blocks))
}

/// Block 0 of a journal: which array and member it belongs to, and the current epoch.
pub fn encode_super(uuid: [u8; 16], member: usize, epoch: u64) -> Vec<u8> {
    let mut out = vec![0u8; JBLOCK as usize];
    out[0..4].copy_from_slice(&SUPER_MAGIC.to_le_bytes());
    out[8..16].copy_from_slice(&epoch.to_le_bytes());
    out[16..32].copy_from_slice(&uuid);
    out[32..36].copy_from_slice(&(member as u32).to_le_bytes());
    out[36..40].copy_from_slice(&JOURNAL_VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

/// (uuid, member, epoch) of a valid journal superblock.
pub fn decode_super(block: &[u8]) -> Option<([u8; 16], usize, u64)> {
    if block.len() < JBLOCK as usize || u32_at(block, 0) != SUPER_MAGIC {
        return None;
    }
    let mut copy = block[..JBLOCK as usize].to_vec();
    let crc = u32_at(&copy, 4);
    copy[4..8].fill(0);
    if crc32c::crc32c(&copy) != crc || u32_at(&copy, 36) != JOURNAL_VERSION {
        return None;
    }
    let uuid = copy[16..32].try_into().unwrap();
    Some((uuid, u32_at(&copy, 32) as usize, u64_at(&copy, 8)))
}

/// Every valid record of a journal region read whole, in order: (seq, record).
pub fn scan(region: &[u8], uuid: [u8; 16], member: usize) -> Vec<(u64, Record)> {
    let Some((found, index, epoch)) = decode_super(region) else {
        return Vec::new();
    };
    if found != uuid || index != member {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = JBLOCK as usize;
    let mut seq = 0;
    while let Some((record, blocks)) = decode(&region[at.min(region.len())..], epoch, seq) {
        out.push((seq, record));
        at += (blocks * JBLOCK) as usize;
        seq += 1;
    }
    out
}

struct State {
    epoch: u64,
    next_block: u64,
    next_seq: u64,
    /// Every seq below this is durable.
    durable: u64,
    /// Queued, not yet written: (seq, first block, bytes).
    pending: Vec<(u64, u64, Vec<u8>)>,
    failed: Option<String>,
}

/// One member's journal: a log in `[base, base + blocks * JBLOCK)`, block 0 the superblock.
pub struct Journal {
    member: usize,
    base: u64,
    blocks: u64,
    uuid: [u8; 16],
    state: Mutex<State>,
    writer: tokio::sync::Mutex<()>,
}

/// Outcome of an append.
pub enum Appended {
    Durable(u64),
    /// No room: the caller resets the journals (after a flush) and retries.
    Full,
    /// The journal moved to another epoch; nothing written.
    Stale,
}

impl Journal {
    pub fn new(member: usize, base: u64, bytes: u64, uuid: [u8; 16]) -> Journal {
        assert!(bytes / JBLOCK >= 8);
        Journal {
            member,
            base,
            blocks: bytes / JBLOCK,
            uuid,
            state: Mutex::new(State {
                epoch: 0,
                next_block: 1,
                next_seq: 0,
                durable: 0,
                pending: Vec::new(),
                failed: Some("not yet reset".into()),
            }),
            writer: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Empties the journal under a new epoch. Only when nothing is being appended and every
    /// logged update is durable in place (the caller holds the gate exclusively and flushed).
    pub async fn reset(&self, device: &DeviceRef, epoch: u64) -> Result<()> {
        let _writer = self.writer.lock().await;
        let block = encode_super(self.uuid, self.member, epoch);
        device
            .write(self.base, Bytes::from(block), WriteFlags { fua: true })
            .await?;
        let mut state = self.lock();
        // Appenders hold the array's gate, which a reset holds exclusively: records can only
        // still be queued when their appender was cancelled (its update never reached the
        // members) or a journal write failed. None of them was acknowledged; drop them.
        if !state.pending.is_empty() {
            tracing::debug!(
                member = self.member,
                records = state.pending.len(),
                "raid5: journal reset drops abandoned records"
            );
        }
        *state = State {
            epoch,
            next_block: 1,
            next_seq: 0,
            durable: 0,
            pending: Vec::new(),
            failed: None,
        };
        Ok(())
    }

    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Logs `record` and returns once it is durable. With `epoch`, only if the journal is
    /// still in that epoch (a Done record names seqs of one epoch; after a reset they are
    /// moot): otherwise returns `Stale` and writes nothing.
    pub async fn append(
        &self,
        device: &DeviceRef,
        record: &Record,
        epoch: Option<u64>,
    ) -> Result<Appended> {
        let seq = {
            let mut state = self.lock();
            if let Some(reason) = &state.failed {
                return Err(journal_error(self.member, reason));
            }
            if epoch.is_some_and(|e| e != state.epoch) {
                return Ok(Appended::Stale);
            }
            let blocks = record.blocks();
            if state.next_block + blocks > self.blocks {
                return Ok(Appended::Full);
            }
            let seq = state.next_seq;
            let bytes = record.encode(state.epoch, seq);
            let block = state.next_block;
            state.pending.push((seq, block, bytes));
            state.next_seq += 1;
            state.next_block += blocks;
            seq
        };
        loop {
            {
                let state = self.lock();
                if state.durable > seq {
                    return Ok(Appended::Durable(seq));
                }
                if let Some(reason) = &state.failed {
                    return Err(journal_error(self.member, reason));
                }
            }
            let _writer = self.writer.lock().await;
            let batch = std::mem::take(&mut self.lock().pending);
            let Some(&(_, first, _)) = batch.first() else {
                // Not queued, not durable, not failed: a reset dropped it (it cannot happen
                // to an appender holding the gate; refuse rather than spin).
                if self.lock().durable <= seq {
                    return Err(journal_error(
                        self.member,
                        "record dropped by a journal reset",
                    ));
                }
                continue;
            };
            let last = batch.last().expect("non-empty").0;
            let bytes: Vec<u8> = batch.into_iter().flat_map(|(_, _, b)| b).collect();
            let offset = self.base + first * JBLOCK;
            match device
                .write(offset, Bytes::from(bytes), WriteFlags { fua: true })
                .await
            {
                Ok(()) => self.lock().durable = last + 1,
                Err(error) => {
                    self.lock().failed = Some(error.to_string());
                    return Err(error);
                }
            }
        }
    }
}

fn journal_error(member: usize, reason: &str) -> BlockError {
    BlockError::io(
        format!("raid5: journal of member {member} is unusable: {reason}"),
        std::io::Error::from_raw_os_error(5),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let update = Record::Update {
            stripe: 7,
            writes: vec![
                (1, 512, Bytes::from(vec![3u8; 1024])),
                (3, 512, Bytes::from(vec![9u8; 1024])),
            ],
        };
        let intent = Record::Intent { stripe: 9 };
        let done = Record::Done { seqs: vec![1, 5] };
        let uuid = [4u8; 16];
        let mut region = encode_super(uuid, 2, 77);
        for (seq, record) in [&update, &intent, &done].into_iter().enumerate() {
            region.extend(record.encode(77, seq as u64));
        }
        region.extend(vec![0u8; 8192]);
        let scanned = scan(&region, uuid, 2);
        assert_eq!(scanned.len(), 3);
        assert_eq!(scanned[0].1, update);
        assert_eq!(scanned[2].1, done);
        // Another member's journal, or another array's, reads as empty.
        assert!(scan(&region, uuid, 1).is_empty());
        assert!(scan(&region, [5u8; 16], 2).is_empty());
        // A torn payload ends the log there.
        region[2 * JBLOCK as usize + 10] ^= 1;
        assert!(scan(&region, uuid, 2).is_empty());
    }
}
