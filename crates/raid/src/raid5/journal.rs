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
//! Lanes: the region after the superblock is split into up to [`MAX_LANES`] lanes, each a
//! log of its own with one write in flight at a time, so a torn batch is always the last
//! thing in its lane. A record goes to an idle lane if there is one, so up to that many
//! journal writes of one member run at once: with one lane, every stripe update whose parity
//! is on a member waited for the previous one's journal write, which waits behind the
//! member's queued data, and the array could not keep its members busy.
//!
//! Group commit: when every lane is busy, a record joins a lane's queue and goes out with the
//! others queued there in that lane's next write, so concurrent stripe updates on one member
//! share journal I/O.
//!
//! Order: every record carries a seq, counted per journal and epoch in append order; recovery
//! reads every lane and orders records by seq. Two updates of one stripe never overlap (the
//! stripe lock), so the later one's seq is higher and it was appended after the earlier one
//! was durable: whatever lane tails a crash tears, a stripe's surviving records are a prefix
//! of its history in seq order.
//!
//! Two copies (version 3): the region is split into two halves, each a superblock and the
//! same lanes, and every lane write goes to the same offset in both halves, as two FUA writes
//! issued together; a record counts as durable only when both are. One copy alone cannot tell
//! a record torn by a crash (never acknowledged, the lane's end) from one damaged on the
//! medium after it was acknowledged (its loss would let replay write an older update of a
//! stripe over the newer in-place data). With two copies far apart, one local fault leaves
//! one valid copy: recovery replays it and reports a finding; both invalid is a crash before
//! either copy was whole; both valid but different cannot come from one write and refuses.
//! Version 2 journals (one copy) are still read, with the old rules, so an array written by
//! the previous version replays its journal; the reset after replay writes version 4.
//!
//! Reclaim (version 4): each lane is a ring. The superblock records, per lane, where its live
//! records start (the *tail*: block offset and index) and the least seq they carry; a
//! reclaim *cuts* the journal (every record appended before the cut), waits for the updates
//! of those records to finish their in-place writes, flushes the members, then writes a
//! superblock whose tails are the cut: the records before it are durable in place and are
//! never read again, and their space is reused only once both superblock copies say so.
//! Appends go on meanwhile into the rest of the ring. Records are read from the tail, across
//! the end of the lane, each the next index with a higher seq than the one before (a stale
//! record of an earlier pass has a lower one). Version 3 is the case of tails at 0.
//!
//! Lock rule: `state` (std Mutex) never across an await; `writers[lane]` (async Mutex)
//! serializes the journal writes of one lane; a cut's generation lock is held (shared) by
//! each appender from its record's placement until its update's in-place writes are done,
//! and taken exclusively by the reclaim to wait for them.

use std::sync::Mutex;

use bytes::Bytes;

use strata_core::{BlockError, DeviceRef, Result, WriteFlags};

pub const JBLOCK: u64 = 4096;
const RECORD_MAGIC: u32 = 0x5335_4a52; // "S5JR"
const SUPER_MAGIC: u32 = 0x5335_4a53; // "S5JS"
const DEVICE_MAGIC: u32 = 0x5335_4a44; // "S5JD"
/// Version 4: lanes are rings whose tails the superblock records (reclaim); version 3: two
/// copies of everything, lanes read from their start; version 2: one copy, lanes; version 1:
/// one log.
pub const JOURNAL_VERSION: u32 = 4;
/// Two copies, lanes from their start: read as version 4 with every tail at 0.
const TWO_COPY_VERSION: u32 = 3;
/// The previous version, still read (one copy, the same lanes over the whole region).
const ONE_COPY_VERSION: u32 = 2;
/// At most this many lanes per journal; fewer when the journal is small (each lane must hold
/// two of the largest records).
pub const MAX_LANES: u64 = 4;
const HEADER: usize = 56;
const ENTRY: usize = 20;
/// Update records list at most this many (member, start, length) writes: their header block
/// holds the list.
pub const MAX_UPDATE_WRITES: usize = (JBLOCK as usize - HEADER) / ENTRY;
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

    /// The record as the `index`-th of `lane` in `epoch`, with journal-wide order `seq`.
    pub fn encode(&self, epoch: u64, seq: u64, lane: u8, index: u32) -> Vec<u8> {
        let mut out = vec![0u8; (self.blocks() * JBLOCK) as usize];
        out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&epoch.to_le_bytes());
        out[16..24].copy_from_slice(&seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.blocks().to_le_bytes());
        out[32] = self.kind();
        out[33] = lane;
        out[52..56].copy_from_slice(&index.to_le_bytes());
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
        seal(out)
    }
}

/// Stores the CRC32C of `block`, computed with its CRC field (bytes 4..8) zero, in that field.
fn seal(mut block: Vec<u8>) -> Vec<u8> {
    block[4..8].fill(0);
    let crc = crc32c::crc32c(&block);
    block[4..8].copy_from_slice(&crc.to_le_bytes());
    block
}

/// The first `len` bytes of `block`, CRC field zeroed, if `block` holds that many, starts with
/// `magic` and its CRC field matches; what [`seal`] wrote.
fn unseal(block: &[u8], magic: u32, len: usize) -> Option<Vec<u8>> {
    if block.len() < len || u32_at(block, 0) != magic {
        return None;
    }
    let mut copy = block[..len].to_vec();
    let crc = u32_at(&copy, 4);
    copy[4..8].fill(0);
    (crc32c::crc32c(&copy) == crc).then_some(copy)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Decodes the record at the start of `log` if it is whole and is the `index`-th of `lane`
/// in `epoch`: (seq, record, blocks).
pub fn decode(log: &[u8], epoch: u64, lane: u8, index: u32) -> Option<(u64, Record, u64)> {
    if log.len() < JBLOCK as usize || u32_at(log, 0) != RECORD_MAGIC {
        return None;
    }
    if u64_at(log, 8) != epoch || log[33] != lane || u32_at(log, 52) != index {
        return None;
    }
    let seq = u64_at(log, 16);
    let blocks = u64_at(log, 24);
    // Compared in blocks: a damaged count times the block size could overflow.
    if blocks == 0 || blocks > log.len() as u64 / JBLOCK {
        return None;
    }
    let whole = unseal(log, RECORD_MAGIC, (blocks * JBLOCK) as usize)?;
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
    Some((seq, record, blocks))
}

/// Where a journal's live records start (version 4): the generation of this superblock
/// (one per reclaim in an epoch), the least seq of a live record, and per lane the block
/// offset (from the lane's first block) and index of its first live record. All zero after a
/// reset, and for version 3 (lanes read from their start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tails {
    pub generation: u64,
    pub seq: u64,
    pub lanes: [(u64, u32); MAX_LANES as usize],
}

/// Byte offset of the per-lane tails in a version 4 superblock: (offset u64, index u32).
const TAILS_AT: usize = 64;
const TAIL: usize = 12;
const _: () = assert!(TAILS_AT + MAX_LANES as usize * TAIL <= JBLOCK as usize);

/// Block 0 of a journal: which array and member it belongs to, the current epoch, how many
/// lanes share the rest of the region, and where their live records start.
pub fn encode_super(
    uuid: [u8; 16],
    member: usize,
    epoch: u64,
    lanes: u64,
    tails: &Tails,
) -> Vec<u8> {
    let mut out = encode_super_version(JOURNAL_VERSION, uuid, member, epoch, lanes);
    out[48..56].copy_from_slice(&tails.generation.to_le_bytes());
    out[56..64].copy_from_slice(&tails.seq.to_le_bytes());
    for (lane, (offset, index)) in tails.lanes.iter().enumerate() {
        let at = TAILS_AT + lane * TAIL;
        out[at..at + 8].copy_from_slice(&offset.to_le_bytes());
        out[at + 8..at + 12].copy_from_slice(&index.to_le_bytes());
    }
    seal(out)
}

fn encode_super_version(
    version: u32,
    uuid: [u8; 16],
    member: usize,
    epoch: u64,
    lanes: u64,
) -> Vec<u8> {
    let mut out = vec![0u8; JBLOCK as usize];
    out[0..4].copy_from_slice(&SUPER_MAGIC.to_le_bytes());
    out[8..16].copy_from_slice(&epoch.to_le_bytes());
    out[16..32].copy_from_slice(&uuid);
    out[32..36].copy_from_slice(&(member as u32).to_le_bytes());
    out[36..40].copy_from_slice(&version.to_le_bytes());
    out[40..48].copy_from_slice(&lanes.to_le_bytes());
    seal(out)
}

/// A valid journal superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Super {
    pub uuid: [u8; 16],
    pub member: usize,
    pub epoch: u64,
    pub lanes: u64,
    pub version: u32,
    /// Version 4's tails; zero for the older versions.
    pub tails: Tails,
}

/// The superblock in `block` if it is whole and of a version this code reads (2 to 4).
pub fn decode_super(block: &[u8]) -> Option<Super> {
    let copy = unseal(block, SUPER_MAGIC, JBLOCK as usize)?;
    let version = u32_at(&copy, 36);
    if !(ONE_COPY_VERSION..=JOURNAL_VERSION).contains(&version) {
        return None;
    }
    let lanes = u64_at(&copy, 40);
    if !(1..=MAX_LANES).contains(&lanes) {
        return None;
    }
    let mut tails = Tails::default();
    if version >= JOURNAL_VERSION {
        tails.generation = u64_at(&copy, 48);
        tails.seq = u64_at(&copy, 56);
        for (lane, tail) in tails.lanes.iter_mut().enumerate() {
            let at = TAILS_AT + lane * TAIL;
            *tail = (u64_at(&copy, at), u32_at(&copy, at + 8));
        }
    }
    Some(Super {
        uuid: copy[16..32].try_into().unwrap(),
        member: u32_at(&copy, 32) as usize,
        epoch: u64_at(&copy, 8),
        lanes,
        version,
        tails,
    })
}

/// Where member `member`'s journal starts on a journal device: after the device's header
/// block, one region of `journal_bytes` per member.
pub fn device_journal_base(member: usize, journal_bytes: u64) -> u64 {
    JBLOCK + member as u64 * journal_bytes
}

/// Bytes a journal device needs for `members` journals of `journal_bytes`.
pub fn device_bytes(members: usize, journal_bytes: u64) -> u64 {
    device_journal_base(members, journal_bytes)
}

/// Block 0 of a journal device: the array it belongs to and the shape of its regions, so a
/// device from another array (or none at all) is refused at open instead of read as empty
/// journals.
pub fn encode_device_header(uuid: [u8; 16], members: usize, journal_bytes: u64) -> Vec<u8> {
    let mut out = vec![0u8; JBLOCK as usize];
    out[0..4].copy_from_slice(&DEVICE_MAGIC.to_le_bytes());
    out[8..24].copy_from_slice(&uuid);
    out[24..28].copy_from_slice(&(members as u32).to_le_bytes());
    out[28..32].copy_from_slice(&JOURNAL_VERSION.to_le_bytes());
    out[32..40].copy_from_slice(&journal_bytes.to_le_bytes());
    seal(out)
}

/// (uuid, members, journal_bytes) of a valid journal device header.
pub fn decode_device_header(block: &[u8]) -> Option<([u8; 16], usize, u64)> {
    let copy = unseal(block, DEVICE_MAGIC, JBLOCK as usize)?;
    // The header names the array and its shape; its version is the journal version the
    // device was created with, and each journal's superblock says which version it holds now
    // (a version 2 device's journals are rewritten as version 3 at their first reset).
    let version = u32_at(&copy, 28);
    if !(ONE_COPY_VERSION..=JOURNAL_VERSION).contains(&version) {
        return None;
    }
    let uuid = copy[8..24].try_into().unwrap();
    Some((uuid, u32_at(&copy, 24) as usize, u64_at(&copy, 32)))
}

/// Lanes for a journal copy of `blocks` blocks whose largest record takes `max_record`
/// blocks: as many as hold two such records each, at most [`MAX_LANES`], at least one.
pub fn lanes_for(blocks: u64, max_record: u64) -> u64 {
    ((blocks - 1) / (2 * max_record)).clamp(1, MAX_LANES)
}

/// Bytes a version 3 journal needs when its largest record takes `max_record` bytes: two
/// copies, each a superblock and room for one of the largest records (a journal this small
/// resets after every such record, but always makes progress). One block more than version
/// 2's minimum (a superblock and two records in one copy), so that journals sized by the
/// old rule mostly still open. Never under 64 KiB: a copy needs 8 blocks for its lanes
/// (`Journal::new` asserts it), which a 48 KiB journal for three members of 4 KiB chunks
/// passed this check without and then panicked at open.
pub fn least_bytes(max_record: u64) -> u64 {
    (2 * (max_record.div_ceil(JBLOCK) * JBLOCK + JBLOCK)).max(16 * JBLOCK)
}

/// Blocks of one copy in a region of `blocks` blocks: version 3 keeps two copies, in the two
/// halves (far apart, so one local fault cannot hit both); version 2 had one.
pub fn copy_blocks(blocks: u64, version: u32) -> u64 {
    if version >= 3 {
        blocks / 2
    } else {
        blocks
    }
}

/// Blocks `[first, first + len)` of lane `lane` of `lanes` in a copy of `blocks` blocks.
fn lane_span(blocks: u64, lanes: u64, lane: u64) -> (u64, u64) {
    let len = (blocks - 1) / lanes;
    (1 + lane * len, len)
}

/// What a journal region holds: every record to replay, in seq order, and the findings
/// (damage repaired from the other copy) to report.
#[derive(Debug, Default)]
pub struct Scanned {
    pub records: Vec<(u64, Record)>,
    pub findings: Vec<String>,
    /// The version read (0 for a journal never initialized).
    pub version: u32,
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Reads a journal region whole. Err is damage that must refuse the open: replaying around
/// it could roll back acknowledged writes.
pub fn scan(region: &[u8], uuid: [u8; 16], member: usize) -> std::result::Result<Scanned, String> {
    let blocks = region.len() as u64 / JBLOCK;
    let block = |b: u64| &region[(b * JBLOCK) as usize..((b + 1) * JBLOCK) as usize];
    let half = blocks / 2;
    let first = decode_super(block(0));
    if let Some(s) = first.filter(|s| s.version == ONE_COPY_VERSION) {
        return Ok(scan_one_copy(region, uuid, member, s));
    }
    // Versions 3 and 4: the superblock at the start of each half. A reset (or a reclaim's
    // tail move) writes copy 1, then copy 2, so a crash leaves at most one of them torn, or
    // both valid with copy 1 newer (a later epoch, or the same epoch and a later tail
    // generation); either way every record the newer one drops was durable in place before
    // it was written (a reset and a reclaim flush the members first), and the space it frees
    // is reused only once both copies are written, so the older one still reads whole.
    let two_copies = |s: &Super| s.version >= TWO_COPY_VERSION;
    let copies = [
        first.filter(two_copies),
        decode_super(block(half)).filter(two_copies),
    ];
    let mut findings = Vec::new();
    let sup = match copies {
        [Some(a), Some(b)] => {
            if (a.uuid, a.member, a.lanes) != (b.uuid, b.member, b.lanes) {
                return Err(format!(
                    "the two copies of the journal superblock are valid but name different \
                    journals ({a:?} and {b:?})"
                ));
            }
            if (a.epoch, a.tails.generation) >= (b.epoch, b.tails.generation) {
                a
            } else {
                b
            }
        }
        [Some(s), None] | [None, Some(s)] => {
            let bad = if copies[0].is_none() { 1 } else { 2 };
            findings.push(format!(
                "journal superblock copy {bad} failed its check (a reset torn by a crash, or \
                    damage on the medium); the other copy was used"
            ));
            s
        }
        [None, None] => {
            // Creation zeroes the journal region before the array record that names it is
            // committed, so a crash before the first reset leaves zeros; anything else is
            // two damaged copies, and reading the journal as empty could skip replays.
            if is_zero(block(0)) && is_zero(block(half)) {
                return Ok(Scanned::default());
            }
            return Err(
                "both copies of the journal superblock are damaged (or this is not a raid5 \
                    journal)"
                    .into(),
            );
        }
    };
    if sup.uuid != uuid || sup.member != member {
        return Err(format!(
            "the journal superblock names another journal (member {} of array {:02x?}, \
             expected member {member})",
            sup.member,
            &sup.uuid[..4]
        ));
    }
    let copy = |c: u64| &region[(c * half * JBLOCK) as usize..((c + 1) * half * JBLOCK) as usize];
    let mut records = Vec::new();
    for lane in 0..sup.lanes {
        let (first, len) = lane_span(half, sup.lanes, lane);
        let (offset, index) = sup.tails.lanes[lane as usize];
        if offset >= len {
            return Err(format!(
                "lane {lane}'s tail is block {offset} of a {len}-block lane (epoch {})",
                sup.epoch
            ));
        }
        // The lane from its tail on, across its end: a linear log again.
        let ring = |c: u64| {
            let lane = &copy(c)[(first * JBLOCK) as usize..((first + len) * JBLOCK) as usize];
            let split = (offset * JBLOCK) as usize;
            [&lane[split..], &lane[..split]].concat()
        };
        let from = (sup.epoch, lane as u8, index, sup.tails.seq);
        let found = scan_lane(&ring(0), &ring(1), from, &mut findings)?;
        records.extend(found);
    }
    records.sort_by_key(|(seq, _)| *seq);
    Ok(Scanned {
        records,
        findings,
        version: sup.version,
    })
}

/// The records of one lane, read in both copies (`one`, `two`: the lane from its tail on)
/// from `(epoch, lane, first index, least seq)`: each the next index, with a seq above the
/// previous one's, until a position where neither copy holds one.
fn scan_lane(
    one: &[u8],
    two: &[u8],
    (epoch, lane, first, least): (u64, u8, u32, u64),
    findings: &mut Vec<String>,
) -> std::result::Result<Vec<(u64, Record)>, String> {
    assert_eq!(one.len(), two.len());
    let (end, mut at, mut index, mut least) = (one.len(), 0usize, first, least);
    let mut records = Vec::new();
    loop {
        let from = at.min(end);
        // A stale record of an earlier pass round the ring can carry the index expected
        // here only after 2^32 records; its seq is lower than every live record's anyway.
        let valid =
            |log: &[u8]| decode(&log[from..end], epoch, lane, index).filter(|r| r.0 >= least);
        let a = valid(one);
        let b = valid(two);
        let one_bad = a.is_none();
        let (seq, record, taken) = match (a, b) {
            // Both copies were written from the same bytes: a difference is damage that
            // still passed a checksum, or a bug; neither can be replayed safely.
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "lane {lane} record {index} (epoch {epoch}): the two copies are both \
                    valid but differ"
                ))
            }
            (Some(a), Some(_)) => a,
            // One copy whole: either acknowledged and later damaged in the other copy (it
            // must be replayed), or in flight when a crash hit between the two writes
            // (replaying a whole, unacknowledged update is also correct: its in-place writes
            // had not started, and it writes data and parity alike).
            (Some(r), None) | (None, Some(r)) => {
                let bad = if one_bad { 1 } else { 2 };
                findings.push(format!(
                    "lane {lane} record {index} (epoch {epoch}): copy {bad} failed its check; \
                    replayed from the other copy"
                ));
                r
            }
            // Neither copy whole: a batch cut by a crash before either copy was whole, never
            // acknowledged (group commit may leave whole records after it in the same write,
            // also unacknowledged): the end of the lane. Two independent faults at this
            // position in both copies look the same: the format's limit.
            (None, None) => break,
        };
        assert!(seq >= least);
        records.push((seq, record));
        at += (taken * JBLOCK) as usize;
        index = index.wrapping_add(1);
        least = seq + 1;
    }
    Ok(records)
}

/// A version 2 journal (one copy): each lane is read up to its first record that is not
/// whole, as version 2 did (it cannot tell damage from a crash there; see the docs).
fn scan_one_copy(region: &[u8], uuid: [u8; 16], member: usize, sup: Super) -> Scanned {
    let mut out = Scanned {
        version: ONE_COPY_VERSION,
        ..Scanned::default()
    };
    if sup.uuid != uuid || sup.member != member {
        return out;
    }
    let blocks = region.len() as u64 / JBLOCK;
    for lane in 0..sup.lanes {
        let (first, len) = lane_span(blocks, sup.lanes, lane);
        let end = ((first + len) * JBLOCK) as usize;
        let mut at = (first * JBLOCK) as usize;
        let mut index = 0;
        while let Some((seq, record, taken)) =
            decode(&region[at.min(end)..end], sup.epoch, lane as u8, index)
        {
            out.records.push((seq, record));
            at += (taken * JBLOCK) as usize;
            index += 1;
        }
    }
    out.records.sort_by_key(|(seq, _)| *seq);
    out
}

/// One lane's ring: blocks `[first, first + len)`. Positions are counted in blocks from the
/// epoch's start without wrapping (`head`, `tail`); block `first + v % len` holds position v.
struct Lane {
    first: u64,
    len: u64,
    /// Where the next record goes.
    head: u64,
    /// Where the live records start, as both superblock copies say: the blocks from here to
    /// `head` must not be overwritten.
    tail: u64,
    /// Indexes count records in the lane since the epoch's start (written as u32).
    next_index: u64,
    /// Every index below this is durable.
    durable: u64,
    /// Queued, not yet written: (index, position, bytes).
    pending: Vec<(u64, u64, Vec<u8>)>,
    /// A batch of this lane is being written.
    writing: bool,
}

impl Lane {
    fn new(first: u64, len: u64) -> Lane {
        Lane {
            first,
            len,
            head: 0,
            tail: 0,
            next_index: 0,
            durable: 0,
            pending: Vec::new(),
            writing: false,
        }
    }

    fn room(&self, blocks: u64) -> bool {
        self.head + blocks - self.tail <= self.len
    }
}

struct State {
    epoch: u64,
    next_seq: u64,
    lanes: Vec<Lane>,
    failed: Option<String>,
    /// The superblock generation both copies hold (a reclaim writes the next).
    generation: u64,
    /// Held shared by every appender placed since the last cut (see [`Pin`]).
    pins: std::sync::Arc<tokio::sync::RwLock<()>>,
}

/// One member's journal: a region at `base` holding two copies of `blocks` blocks each,
/// each copy's block 0 a superblock and the rest split into lanes.
pub struct Journal {
    member: usize,
    base: u64,
    /// Blocks of one copy; copy 2 starts this many blocks after copy 1.
    blocks: u64,
    lanes: u64,
    uuid: [u8; 16],
    state: Mutex<State>,
    writers: Vec<tokio::sync::Mutex<()>>,
}

/// Held from a record's placement until the update it logs has finished its in-place
/// writes (drop it then): a reclaim waits for the pins of the records before its cut, so
/// that its member flush covers their writes.
pub struct Pin {
    _held: tokio::sync::OwnedRwLockReadGuard<()>,
}

/// Outcome of an append.
pub enum Appended {
    Durable(u64, Pin),
    /// No room: the caller waits for a reclaim (or runs one) and retries.
    Full,
    /// The journal moved to another epoch; nothing written.
    Stale,
}

/// Where a reclaim cut a journal: the records placed before it are freed once their
/// updates' writes are flushed ([`Journal::settle`], then [`Journal::move_tail`]).
pub struct Cut {
    epoch: u64,
    /// Every record before the cut has a lower seq, every record after it this or higher.
    pub seq: u64,
    /// Per lane: (head position, next index) at the cut.
    lanes: Vec<(u64, u64)>,
    pins: std::sync::Arc<tokio::sync::RwLock<()>>,
}

impl Cut {
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Journal {
    /// A journal of `bytes` at `base` whose largest record takes `max_record` bytes.
    pub fn new(member: usize, base: u64, bytes: u64, max_record: u64, uuid: [u8; 16]) -> Journal {
        let blocks = copy_blocks(bytes / JBLOCK, JOURNAL_VERSION);
        assert!(blocks >= 8);
        let lanes = lanes_for(blocks, max_record.div_ceil(JBLOCK));
        Journal {
            member,
            base,
            blocks,
            lanes,
            uuid,
            state: Mutex::new(State {
                epoch: 0,
                next_seq: 0,
                lanes: Self::empty_lanes(blocks, lanes),
                failed: Some("not yet reset".into()),
                generation: 0,
                pins: Default::default(),
            }),
            writers: (0..lanes).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    fn empty_lanes(blocks: u64, lanes: u64) -> Vec<Lane> {
        (0..lanes)
            .map(|lane| {
                let (first, len) = lane_span(blocks, lanes, lane);
                Lane::new(first, len)
            })
            .collect()
    }

    pub fn lanes(&self) -> u64 {
        self.lanes
    }

    /// Byte offsets of block `block` in copy 1 and copy 2.
    fn offsets(&self, block: u64) -> [u64; 2] {
        let one = self.base + block * JBLOCK;
        [one, one + self.blocks * JBLOCK]
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `block` as the superblock: copy 1, then (after it completed) copy 2, never both
    /// at once: a crash then tears at most one, and both copies invalid stays a sign of
    /// damage (see `scan`).
    async fn write_super(&self, device: &DeviceRef, block: Vec<u8>) -> Result<()> {
        let block = Bytes::from(block);
        for offset in self.offsets(0) {
            device
                .write(offset, block.clone(), WriteFlags { fua: true })
                .await?;
        }
        Ok(())
    }

    /// Empties the journal under a new epoch. Only when nothing is being appended and every
    /// logged update is durable in place (the caller holds the gate exclusively and flushed).
    pub async fn reset(&self, device: &DeviceRef, epoch: u64) -> Result<()> {
        let mut writers = Vec::with_capacity(self.writers.len());
        for writer in &self.writers {
            writers.push(writer.lock().await);
        }
        let block = encode_super(self.uuid, self.member, epoch, self.lanes, &Tails::default());
        self.write_super(device, block).await?;
        let mut state = self.lock();
        // Appenders hold the array's gate, which a reset holds exclusively: records can only
        // still be queued when their appender was cancelled (its update never reached the
        // members) or a journal write failed. None of them was acknowledged; drop them.
        let abandoned: usize = state.lanes.iter().map(|l| l.pending.len()).sum();
        if abandoned > 0 {
            tracing::debug!(
                member = self.member,
                records = abandoned,
                "raid5: journal reset drops abandoned records"
            );
        }
        *state = State {
            epoch,
            next_seq: 0,
            lanes: Self::empty_lanes(self.blocks, self.lanes),
            failed: None,
            generation: 0,
            pins: Default::default(),
        };
        Ok(())
    }

    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Whether a lane is half full or more (live records and records not yet reclaimed).
    /// Half: a reclaim frees what was placed before its cut, and leaves the other half for
    /// the appends that go on while it flushes the members; starting earlier means more
    /// member flushes for the same records, later less room to write on during one.
    pub fn wants_reclaim(&self) -> bool {
        let state = self.lock();
        state.failed.is_none() && state.lanes.iter().any(|l| 2 * (l.head - l.tail) >= l.len)
    }

    /// Cuts the journal: the records placed so far will be freed by [`Journal::move_tail`].
    /// None when the journal is unusable.
    pub fn cut(&self) -> Option<Cut> {
        let mut state = self.lock();
        if state.failed.is_some() {
            return None;
        }
        let pins = std::mem::take(&mut state.pins);
        Some(Cut {
            epoch: state.epoch,
            seq: state.next_seq,
            lanes: state.lanes.iter().map(|l| (l.head, l.next_index)).collect(),
            pins,
        })
    }

    /// Waits until every update placed before `cut` has finished its in-place writes (or
    /// was abandoned), then writes what its appenders left queued, so that no hole precedes
    /// the records after the cut.
    pub async fn settle(&self, device: &DeviceRef, cut: &Cut) -> Result<()> {
        let _all = cut.pins.write().await;
        for (lane, &(_, index)) in cut.lanes.iter().enumerate() {
            // Whether the last write_lane found nothing queued (another appender's batch may
            // have carried the records meanwhile: checked once more before giving up).
            let mut idle = false;
            loop {
                {
                    let state = self.lock();
                    if state.epoch != cut.epoch || state.lanes[lane].durable >= index {
                        break;
                    }
                    if let Some(reason) = &state.failed {
                        return Err(journal_error(self.member, reason));
                    }
                }
                if idle {
                    return Err(journal_error(
                        self.member,
                        "record dropped before its write",
                    ));
                }
                idle = !self.write_lane(device, lane).await?;
            }
        }
        Ok(())
    }

    /// Frees the records before `cut`, once the members were flushed after [`Journal::settle`]:
    /// both superblock copies name the cut as the tail, then its space is reused.
    pub async fn move_tail(&self, device: &DeviceRef, cut: &Cut) -> Result<()> {
        let (block, generation) = {
            let state = self.lock();
            if state.epoch != cut.epoch || state.failed.is_some() {
                return Ok(());
            }
            let generation = state.generation + 1;
            let mut tails = Tails {
                generation,
                seq: cut.seq,
                ..Tails::default()
            };
            for (lane, &(head, index)) in cut.lanes.iter().enumerate() {
                tails.lanes[lane] = (head % state.lanes[lane].len, index as u32);
            }
            let block = encode_super(self.uuid, self.member, state.epoch, self.lanes, &tails);
            (block, generation)
        };
        self.write_super(device, block).await?;
        let mut state = self.lock();
        if state.epoch == cut.epoch {
            state.generation = generation;
            for (lane, &(head, _)) in state.lanes.iter_mut().zip(&cut.lanes) {
                assert!(lane.tail <= head && head <= lane.head);
                lane.tail = head;
            }
        }
        Ok(())
    }

    /// The lane for a record of `blocks`: an idle one if any (its write starts at once),
    /// else one with records already queued (they go out together), else the one with the
    /// shortest queue; only lanes with room. None when no lane has room.
    fn choose_lane(lanes: &[Lane], blocks: u64) -> Option<usize> {
        let fits = || lanes.iter().enumerate().filter(|(_, l)| l.room(blocks));
        fits()
            .find(|(_, l)| !l.writing && l.pending.is_empty())
            .or_else(|| fits().find(|(_, l)| !l.pending.is_empty()))
            .or_else(|| fits().min_by_key(|(_, l)| l.pending.len()))
            .map(|(i, _)| i)
    }

    /// Logs `record` and returns once it is durable, with the [`Pin`] its update holds until
    /// its in-place writes are done. With `epoch`, only if the journal is still in that
    /// epoch (a Done record names seqs of one epoch; after a reset they are moot): otherwise
    /// returns `Stale` and writes nothing.
    pub async fn append(
        &self,
        device: &DeviceRef,
        record: &Record,
        epoch: Option<u64>,
    ) -> Result<Appended> {
        let (lane, seq, index, pin) = {
            let mut state = self.lock();
            if let Some(reason) = &state.failed {
                return Err(journal_error(self.member, reason));
            }
            if epoch.is_some_and(|e| e != state.epoch) {
                return Ok(Appended::Stale);
            }
            let blocks = record.blocks();
            let Some(lane) = Self::choose_lane(&state.lanes, blocks) else {
                return Ok(Appended::Full);
            };
            // Never contended: a reclaim takes the lock exclusively only after replacing it.
            let pin = Pin {
                _held: state
                    .pins
                    .clone()
                    .try_read_owned()
                    .expect("current pins are shared"),
            };
            let seq = state.next_seq;
            state.next_seq += 1;
            let epoch = state.epoch;
            let l = &mut state.lanes[lane];
            let index = l.next_index;
            let bytes = record.encode(epoch, seq, lane as u8, index as u32);
            l.pending.push((index, l.head, bytes));
            l.next_index += 1;
            l.head += blocks;
            (lane, seq, index, pin)
        };
        loop {
            {
                let state = self.lock();
                if state.lanes[lane].durable > index {
                    return Ok(Appended::Durable(seq, pin));
                }
                if let Some(reason) = &state.failed {
                    return Err(journal_error(self.member, reason));
                }
            }
            if !self.write_lane(device, lane).await? {
                let state = self.lock();
                // Not queued, not durable, not failed: a reset dropped it (it cannot happen
                // to an appender holding the gate; refuse rather than spin).
                if state.lanes[lane].durable <= index && state.failed.is_none() {
                    return Err(journal_error(
                        self.member,
                        "record dropped by a journal reset",
                    ));
                }
            }
        }
    }

    /// Writes the records queued in `lane` as one batch (false: none were queued). A batch
    /// that crosses the end of the lane is written in two parts, the one at the end first.
    async fn write_lane(&self, device: &DeviceRef, lane: usize) -> Result<bool> {
        let _writer = self.writers[lane].lock().await;
        let (batch, first, len) = {
            let mut state = self.lock();
            let l = &mut state.lanes[lane];
            l.writing = true;
            (std::mem::take(&mut l.pending), l.first, l.len)
        };
        let Some(&(_, start, _)) = batch.first() else {
            self.lock().lanes[lane].writing = false;
            return Ok(false);
        };
        let last = batch.last().expect("non-empty").0;
        let mut bytes: Vec<u8> = batch.into_iter().flat_map(|(_, _, b)| b).collect();
        let at = start % len;
        let rest = bytes.split_off(bytes.len().min(((len - at) * JBLOCK) as usize));
        // Both copies at once (the cost of the second is one more concurrent write, not a
        // second round trip), and durable only when both are: an acknowledged record then
        // survives any fault that spares one copy.
        let mut written =
            strata_meta::write_copies(&**device, self.offsets(first + at), Bytes::from(bytes))
                .await;
        if written.is_ok() && !rest.is_empty() {
            written =
                strata_meta::write_copies(&**device, self.offsets(first), Bytes::from(rest)).await;
        }
        let mut state = self.lock();
        state.lanes[lane].writing = false;
        match written {
            Ok(()) => {
                state.lanes[lane].durable = last + 1;
                Ok(true)
            }
            Err(error) => {
                state.failed = Some(error.to_string());
                Err(error)
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

    /// Version 2 (one copy) is still read with its own rules: these two tests pin them.
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
        let mut region = encode_super_version(ONE_COPY_VERSION, uuid, 2, 77, 1);
        for (seq, record) in [&update, &intent, &done].into_iter().enumerate() {
            region.extend(record.encode(77, seq as u64, 0, seq as u32));
        }
        region.extend(vec![0u8; 8192]);
        let scanned = scan(&region, uuid, 2).unwrap().records;
        assert_eq!(scanned.len(), 3);
        assert_eq!(scanned[0].1, update);
        assert_eq!(scanned[2].1, done);
        // Another member's journal, or another array's, reads as empty.
        assert!(scan(&region, uuid, 1).unwrap().records.is_empty());
        assert!(scan(&region, [5u8; 16], 2).unwrap().records.is_empty());
        // A torn payload ends the log there.
        region[2 * JBLOCK as usize + 10] ^= 1;
        assert!(scan(&region, uuid, 2).unwrap().records.is_empty());
    }

    /// Lanes are read independently and merged by seq: a torn tail in one lane ends only
    /// that lane, and a record found in the wrong lane or at the wrong index is refused.
    #[test]
    fn lanes_merge_by_seq_and_tear_independently() {
        let uuid = [6u8; 16];
        let blocks = 1 + 2 * 8;
        let mut region = vec![0u8; (blocks * JBLOCK) as usize];
        region[..JBLOCK as usize].copy_from_slice(&encode_super_version(
            ONE_COPY_VERSION,
            uuid,
            0,
            5,
            2,
        ));
        let place = |region: &mut Vec<u8>, block: u64, bytes: Vec<u8>| {
            let at = (block * JBLOCK) as usize;
            region[at..at + bytes.len()].copy_from_slice(&bytes);
        };
        let (lane0, _) = lane_span(blocks, 2, 0);
        let (lane1, _) = lane_span(blocks, 2, 1);
        // Lane 0 holds seqs 0 and 3, lane 1 holds 1, 2 and 4.
        // (block, stripe, seq, lane, index in lane)
        for (block, stripe, seq, lane, index) in [
            (lane0, 10, 0, 0, 0),
            (lane0 + 1, 13, 3, 0, 1),
            (lane1, 11, 1, 1, 0),
            (lane1 + 1, 12, 2, 1, 1),
            (lane1 + 2, 14, 4, 1, 2),
        ] {
            place(
                &mut region,
                block,
                Record::Intent { stripe }.encode(5, seq, lane, index),
            );
        }
        let seqs: Vec<u64> = scan(&region, uuid, 0)
            .unwrap()
            .records
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(seqs, vec![0, 1, 2, 3, 4]);
        // Lane 0's second record torn: lane 1 still reads whole.
        region[((lane0 + 1) * JBLOCK) as usize + 100] ^= 1;
        let seqs: Vec<u64> = scan(&region, uuid, 0)
            .unwrap()
            .records
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(seqs, vec![0, 1, 2, 4]);
        // A record encoded for lane 1 but found in lane 0 is not taken.
        place(
            &mut region,
            lane0 + 1,
            Record::Intent { stripe: 13 }.encode(5, 3, 1, 1),
        );
        assert_eq!(scan(&region, uuid, 0).unwrap().records.len(), 4);
        // Lane counts a journal cannot have are refused.
        assert!(decode_super(&encode_super(uuid, 0, 5, 0, &Tails::default())).is_none());
        assert!(
            decode_super(&encode_super(uuid, 0, 5, MAX_LANES + 1, &Tails::default())).is_none()
        );
        assert_eq!(lanes_for(1 + 4 * 33, 33), 2);
        assert_eq!(lanes_for(9, 33), 1);
        assert_eq!(lanes_for(1 << 20, 33), MAX_LANES);
    }

    #[test]
    fn device_header_round_trips_and_refuses_damage() {
        let header = encode_device_header([3u8; 16], 4, 1 << 20);
        assert_eq!(decode_device_header(&header), Some(([3u8; 16], 4, 1 << 20)));
        let mut torn = header.clone();
        torn[30] ^= 1;
        assert_eq!(decode_device_header(&torn), None);
        assert_eq!(decode_device_header(&vec![0u8; 4096]), None);
        assert_eq!(device_journal_base(2, 1 << 20), 4096 + (2 << 20));
    }
}

#[cfg(test)]
mod two_copies {
    use super::*;

    const UUID: [u8; 16] = [8u8; 16];
    /// Blocks of one copy; two lanes of 8 blocks each after the superblock.
    const HALF: u64 = 17;

    fn place(region: &mut [u8], block: u64, bytes: &[u8]) {
        let at = (block * JBLOCK) as usize;
        region[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// A version 3 region with `records` (lane, bytes) placed in both copies, in order.
    fn region(records: &[(u64, Vec<u8>)]) -> Vec<u8> {
        let mut region = vec![0u8; (2 * HALF * JBLOCK) as usize];
        let sup = encode_super(UUID, 1, 9, 2, &Tails::default());
        place(&mut region, 0, &sup);
        place(&mut region, HALF, &sup);
        let mut next = [lane_span(HALF, 2, 0).0, lane_span(HALF, 2, 1).0];
        for (lane, bytes) in records {
            place(&mut region, next[*lane as usize], bytes);
            place(&mut region, HALF + next[*lane as usize], bytes);
            next[*lane as usize] += bytes.len() as u64 / JBLOCK;
        }
        region
    }

    fn update(stripe: u64, byte: u8) -> Record {
        Record::Update {
            stripe,
            writes: vec![(0, 0, Bytes::from(vec![byte; 4096]))],
        }
    }

    fn flip(region: &mut [u8], block: u64, at: usize) {
        region[(block * JBLOCK) as usize + at] ^= 0x5a;
    }

    fn seqs(region: &[u8]) -> Vec<u64> {
        let scanned = scan(region, UUID, 1).unwrap();
        scanned.records.iter().map(|r| r.0).collect()
    }

    /// Lane 0: seq 0 (stripe 3, old), seq 2 (stripe 3, new); lane 1: seq 1.
    fn three() -> Vec<u8> {
        region(&[
            (0, update(3, 1).encode(9, 0, 0, 0)),
            (1, Record::Intent { stripe: 4 }.encode(9, 1, 1, 0)),
            (0, update(3, 2).encode(9, 2, 0, 1)),
        ])
    }

    #[test]
    fn intact_copies_replay_everything_without_findings() {
        let scanned = scan(&three(), UUID, 1).unwrap();
        assert_eq!(scanned.version, JOURNAL_VERSION);
        assert!(scanned.findings.is_empty());
        assert_eq!(seqs(&three()), vec![0, 1, 2]);
        assert_eq!(scanned.records[2].1, update(3, 2));
    }

    /// The defect this version closes: the newer update of stripe 3 (seq 2) damaged in one
    /// copy after it was acknowledged. Read from the other copy, with a finding.
    #[test]
    fn one_damaged_copy_is_replayed_from_the_other_with_a_finding() {
        let (first, _) = lane_span(HALF, 2, 0);
        for (copy, block) in [(1, first + 2), (2, HALF + first + 2)] {
            for at in [0, 20, 4096 + 7] {
                let mut damaged = three();
                flip(
                    &mut damaged,
                    block + at as u64 / JBLOCK,
                    at % JBLOCK as usize,
                );
                let scanned = scan(&damaged, UUID, 1).unwrap();
                assert_eq!(seqs(&damaged), vec![0, 1, 2], "copy {copy} byte {at}");
                assert_eq!(scanned.records[2].1, update(3, 2));
                assert_eq!(scanned.findings.len(), 1, "{:?}", scanned.findings);
                assert!(scanned.findings[0].contains(&format!("copy {copy} failed")));
            }
        }
    }

    /// Both copies invalid is the end of the lane (a crash before either copy was whole); a
    /// whole record after it in the same lane is an unacknowledged part of the same batch
    /// (group commit) and is not replayed.
    #[test]
    fn both_copies_invalid_end_the_lane() {
        let (first, _) = lane_span(HALF, 2, 0);
        let mut torn = three();
        flip(&mut torn, first, 100);
        flip(&mut torn, HALF + first, 3000);
        let scanned = scan(&torn, UUID, 1).unwrap();
        assert!(scanned.findings.is_empty());
        assert_eq!(seqs(&torn), vec![1]);
    }

    /// A damaged block count must read as an invalid record, not overflow (found by the
    /// media-damage test: a count near u64::MAX panicked in debug builds).
    #[test]
    fn a_huge_block_count_is_invalid() {
        let mut bytes = update(3, 1).encode(9, 0, 0, 0);
        bytes[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        assert!(decode(&bytes, 9, 0, 0).is_none());
    }

    #[test]
    fn both_copies_valid_but_different_refuse() {
        let (first, _) = lane_span(HALF, 2, 0);
        let mut region = three();
        place(
            &mut region,
            HALF + first + 2,
            &update(3, 7).encode(9, 2, 0, 1),
        );
        let error = scan(&region, UUID, 1).unwrap_err();
        assert!(error.contains("both valid but differ"), "{error}");
    }

    #[test]
    fn superblock_copies() {
        // One copy damaged: the other is used, with a finding.
        for block in [0, HALF] {
            let mut region = three();
            flip(&mut region, block, 40);
            let scanned = scan(&region, UUID, 1).unwrap();
            assert_eq!(scanned.records.len(), 3);
            assert_eq!(scanned.findings.len(), 1);
        }
        // Both damaged: refused, never read as an empty journal.
        let mut region = three();
        flip(&mut region, 0, 40);
        flip(&mut region, HALF, 41);
        let error = scan(&region, UUID, 1).unwrap_err();
        assert!(
            error.contains("both copies of the journal superblock"),
            "{error}"
        );
        // Both zero (a crash between creation and the first reset): empty.
        let mut region = vec![0u8; (2 * HALF * JBLOCK) as usize];
        assert!(scan(&region, UUID, 1).unwrap().records.is_empty());
        // A reset torn between its two writes: copy 1 newer, copy 2 older; the newer wins
        // (every record of the older epoch was durable in place before the reset).
        place(
            &mut region,
            0,
            &encode_super(UUID, 1, 10, 2, &Tails::default()),
        );
        place(
            &mut region,
            HALF,
            &encode_super(UUID, 1, 9, 2, &Tails::default()),
        );
        let (first, _) = lane_span(HALF, 2, 0);
        place(&mut region, first, &update(3, 1).encode(9, 0, 0, 0));
        place(&mut region, HALF + first, &update(3, 1).encode(9, 0, 0, 0));
        let scanned = scan(&region, UUID, 1).unwrap();
        assert!(scanned.records.is_empty() && scanned.findings.is_empty());
        // Another member's journal is refused, not read as empty.
        assert!(scan(&three(), UUID, 2).is_err());
    }

    #[test]
    fn least_bytes_is_never_below_the_eight_blocks_a_copy_needs() {
        assert_eq!(least_bytes(3 * 4096 + JBLOCK), 16 * JBLOCK);
        let blocks = copy_blocks(least_bytes(JBLOCK) / JBLOCK, JOURNAL_VERSION);
        assert!(blocks >= 8, "{blocks}");
    }

    #[test]
    fn least_bytes_holds_a_largest_record_per_copy() {
        // Records large enough that the record rule, not the 64 KiB floor, decides.
        let max_record = 3 * 65536 + 4096;
        let bytes = least_bytes(max_record);
        let half = copy_blocks(bytes / JBLOCK, JOURNAL_VERSION);
        assert_eq!(lanes_for(half, max_record / JBLOCK), 1);
        let (_, len) = lane_span(half, 1, 0);
        assert_eq!(len, max_record / JBLOCK);
        // One block less and the largest record would never fit in a copy.
        let (_, short) = lane_span(copy_blocks(bytes / JBLOCK - 1, JOURNAL_VERSION), 1, 0);
        assert!(short < max_record / JBLOCK);
    }
}

#[cfg(test)]
mod rings {
    use std::sync::Arc;

    use super::*;

    const UUID: [u8; 16] = [3u8; 16];
    /// Blocks of one copy: a superblock and four lanes of 10 blocks (largest record 5).
    const HALF: u64 = 41;

    fn update(stripe: u64, blocks: u64) -> Record {
        Record::Update {
            stripe,
            writes: vec![(
                1,
                0,
                Bytes::from(vec![stripe as u8; ((blocks - 1) * JBLOCK) as usize]),
            )],
        }
    }

    /// A version 3 superblock over the same records reads as version 4 with its tails at 0.
    #[test]
    fn version_3_reads_as_tails_at_zero() {
        let mut region = vec![0u8; (2 * HALF * JBLOCK) as usize];
        let (first, _) = lane_span(HALF, 4, 2);
        for copy in 0..2 {
            let sup = encode_super_version(TWO_COPY_VERSION, UUID, 0, 6, 4);
            let at = (copy * HALF * JBLOCK) as usize;
            region[at..at + JBLOCK as usize].copy_from_slice(&sup);
            let bytes = update(9, 2).encode(6, 0, 2, 0);
            let at = ((copy * HALF + first) * JBLOCK) as usize;
            region[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        let scanned = scan(&region, UUID, 0).unwrap();
        assert_eq!(scanned.version, TWO_COPY_VERSION);
        assert_eq!(scanned.records, vec![(0, update(9, 2))]);
        let sup = decode_super(&region[..JBLOCK as usize]).unwrap();
        assert_eq!(sup.tails, Tails::default());
    }

    /// Appends of random sizes with reclaims between them (some with appends between the cut
    /// and the tail move): at every point the region reads back exactly the records not
    /// freed, in seq order, across the lanes' ends and over stale records of earlier passes.
    #[tokio::test]
    async fn the_ring_reads_back_every_live_record() {
        let bytes = 2 * HALF * JBLOCK;
        let device: DeviceRef = Arc::new(strata_backend::MemoryDevice::new(bytes));
        let journal = Journal::new(0, 0, bytes, 5 * JBLOCK, UUID);
        assert_eq!(journal.lanes(), 4);
        journal.reset(&device, 6).await.unwrap();
        let mut live: Vec<(u64, Record)> = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let (mut reclaims, mut wrapped) = (0, false);
        for step in 0..3000u64 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let record = update(step, 1 + (x >> 33) % 5);
            match journal.append(&device, &record, None).await.unwrap() {
                Appended::Durable(seq, _) => live.push((seq, record)),
                Appended::Full => {
                    let cut = journal.cut().unwrap();
                    // Half of the time a record goes in between the cut and the tail move.
                    if (x >> 40).is_multiple_of(2) {
                        if let Appended::Durable(seq, _) = journal
                            .append(&device, &update(step, 1), None)
                            .await
                            .unwrap()
                        {
                            live.push((seq, update(step, 1)));
                        }
                    }
                    journal.settle(&device, &cut).await.unwrap();
                    journal.move_tail(&device, &cut).await.unwrap();
                    live.retain(|(seq, _)| *seq >= cut.seq);
                    reclaims += 1;
                }
                Appended::Stale => unreachable!(),
            }
            wrapped |= journal.lock().lanes.iter().any(|l| l.head > l.len);
            if step % 37 == 0 {
                let region = device.read(0, bytes as usize).await.unwrap();
                let scanned = scan(&region, UUID, 0).unwrap();
                assert!(scanned.findings.is_empty());
                assert_eq!(scanned.records, live, "step {step}");
            }
        }
        assert!(reclaims > 100 && wrapped, "{reclaims} reclaims");
    }
}
