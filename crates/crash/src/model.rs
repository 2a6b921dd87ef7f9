//! The reference model: what each 512-byte sector of a device under test may legally hold.
//!
//! The `BlockDevice` contract promises little between flushes, and the model promises exactly
//! that much. Writes to one sector never overlap in time (the model panics if a test issues
//! overlapping writes concurrently: block devices leave the result undefined), so the writes
//! covering a sector form a sequence. Per sector the model keeps the suffix of that sequence that
//! may still be on the medium after a crash: `candidates[0]` is the newest write known durable
//! (or the initial zeros), and every later entry is a write that may have landed too.
//!
//! Rules (W covers the sector; "completed" means acknowledged with success):
//! - `write_started(W)`: W is appended. It is a candidate from now on, even if it never
//!   completes: a write in flight at a crash may land, partly land (per sector), or not.
//! - `write_completed(W, fua = true)`: W is durable at once; the sector collapses to `[W]`.
//! - `write_completed(W, false)` / `write_failed(W)`: no change of candidates. A failed write
//!   stays a candidate ("may or may not have landed") until a newer durable write replaces it.
//! - `flush_completed(F)`: let W be the newest candidate that *completed before F started*;
//!   if there is one, the candidates before it are dropped. The candidates after it (writes
//!   still in flight, completed after F started, or failed) stay: the flush promised nothing
//!   about them. A failed flush (`flush_failed`) promises nothing at all.
//! - After a crash the sector may hold any candidate; between crashes a read must return the
//!   newest completed candidate, or a newer one still in flight or failed (`check_live`).
//! - `settle` after a successful `check` pins each sector to what was read: a reopened stack
//!   must present contents a later crash cannot take back.
//!
//! Example, one sector, in time order: A completes; F1 starts; B starts; F1 completes. A
//! completed before F1 started, B did not: candidates `[A, B]`. Then B completes, C starts and
//! fails, and power fails: the sector may hold A, B or C. Had a flush F2 started after B
//! completed and completed itself, the candidates would be `[B, C]`: B is durable, C may or
//! may not have landed.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;

use crate::pattern::{describe_sector, SECTOR_BYTES};

const SECTOR: u64 = SECTOR_BYTES as u64;
/// Compared against with `==` (a memcmp), which is much faster than testing byte by byte.
static ZERO_SECTOR: [u8; SECTOR_BYTES] = [0; SECTOR_BYTES];

/// A write (or write_zeroes) the model knows about. `WriteId::ZEROS` is the initial content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(pub u64);

impl WriteId {
    /// The zeros a device holds before anything is written.
    pub const ZEROS: WriteId = WriteId(0);
}

impl fmt::Display for WriteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == WriteId::ZEROS {
            write!(f, "zeros")
        } else {
            write!(f, "w{}", self.0)
        }
    }
}

/// A flush the model knows about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlushId(u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    InFlight,
    Completed { at: u64, fua: bool },
    Failed,
}

struct Write {
    offset: u64,
    len: u64,
    /// `None`: zeros.
    data: Option<Bytes>,
    state: State,
    /// Sectors that list this write as a candidate; the record goes when none does.
    refs: u64,
}

/// What each 512-byte sector of a device under test may legally contain.
pub struct DeviceModel {
    size: u64,
    next_id: u64,
    next_flush: u64,
    /// Logical time: every start and completion ticks it.
    clock: u64,
    candidates: Vec<Vec<WriteId>>,
    writes: BTreeMap<WriteId, Write>,
    /// Flushes started and not yet completed → the time they started.
    flushes: BTreeMap<FlushId, u64>,
}

impl DeviceModel {
    /// A model of a device of `size` bytes (a multiple of 512), all zeros. Write ids start at 1.
    pub fn new(size: u64) -> Self {
        Self::with_first_id(size, 1)
    }

    /// Same, with write ids from `first` on: give each volume of a test its own range (e.g.
    /// volume `i` from `(i << 40) + 1`) and pattern data names the volume it belongs to.
    pub fn with_first_id(size: u64, first: u64) -> Self {
        assert!(first > 0, "write id 0 means the initial zeros");
        assert!(
            size.is_multiple_of(SECTOR),
            "the model works in 512-byte sectors; size {size} is not a multiple"
        );
        DeviceModel {
            size,
            next_id: first,
            next_flush: 0,
            clock: 0,
            candidates: vec![vec![WriteId::ZEROS]; (size / SECTOR) as usize],
            writes: BTreeMap::new(),
            flushes: BTreeMap::new(),
        }
    }

    /// The bytes the workload may use.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn sectors(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        assert!(
            offset.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR),
            "the model works in 512-byte sectors: [{offset}, +{len}) is not aligned"
        );
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.size),
            "[{offset}, +{len}) reaches past the end of the model ({} bytes)",
            self.size
        );
        (offset / SECTOR) as usize..((offset + len) / SECTOR) as usize
    }

    fn start(&mut self, offset: u64, len: u64, data: Option<Bytes>) -> WriteId {
        assert!(len > 0, "an empty write changes nothing; do not model it");
        let sectors = self.sectors(offset, len);
        let id = WriteId(self.next_id);
        self.next_id += 1;
        for sector in sectors.clone() {
            let last = *self.candidates[sector].last().expect("never empty");
            if self.state(last) == State::InFlight {
                let other = &self.writes[&last];
                panic!(
                    "overlapping concurrent writes: {id} [{offset}, +{len}) overlaps {last} \
                     [{}, +{}) which is still in flight; block devices leave that undefined, \
                     so a workload must not issue it",
                    other.offset, other.len
                );
            }
            self.candidates[sector].push(id);
        }
        self.tick();
        let refs = sectors.len() as u64;
        let state = State::InFlight;
        let write = Write {
            offset,
            len,
            data,
            state,
            refs,
        };
        self.writes.insert(id, write);
        id
    }

    /// A write the test is about to issue. Returns its id; pattern data is `pattern(id, ..)`,
    /// so a test that wants it calls [`Self::next_write_id`] first, or passes arbitrary bytes.
    pub fn write_started(&mut self, offset: u64, data: Bytes) -> WriteId {
        let len = data.len() as u64;
        self.start(offset, len, Some(data))
    }

    /// Starts a write of fresh [`pattern`](crate::pattern()) data: returns its id and the bytes
    /// to issue.
    pub fn pattern_write_started(&mut self, offset: u64, len: usize) -> (WriteId, Bytes) {
        let data = crate::pattern(self.next_write_id(), offset, len);
        let id = self.write_started(offset, data.clone());
        (id, data)
    }

    /// The id the next `write_started` or `zeroes_started` will return.
    pub fn next_write_id(&self) -> WriteId {
        WriteId(self.next_id)
    }

    /// A write_zeroes (or a discard on a device that promises zeros) about to be issued.
    pub fn zeroes_started(&mut self, offset: u64, len: u64) -> WriteId {
        self.start(offset, len, None)
    }

    fn state(&self, id: WriteId) -> State {
        if id == WriteId::ZEROS {
            return State::Completed { at: 0, fua: false };
        }
        self.writes[&id].state
    }

    fn finish(&mut self, id: WriteId, state: State) {
        let write = self
            .writes
            .get_mut(&id)
            .unwrap_or_else(|| panic!("{id} is not a write this model started"));
        assert_eq!(write.state, State::InFlight, "{id} finished twice");
        write.state = state;
    }

    /// The write was acknowledged with success; with `fua` it is durable now.
    pub fn write_completed(&mut self, id: WriteId, fua: bool) {
        let at = self.tick();
        self.finish(id, State::Completed { at, fua });
        if fua {
            let write = &self.writes[&id];
            for sector in self.sectors(write.offset, write.len) {
                self.collapse_to(sector, id);
            }
        }
    }

    /// The write failed: it may or may not have landed, sector by sector.
    pub fn write_failed(&mut self, id: WriteId) {
        self.tick();
        self.finish(id, State::Failed);
    }

    pub fn flush_started(&mut self) -> FlushId {
        let id = FlushId(self.next_flush);
        self.next_flush += 1;
        let at = self.tick();
        self.flushes.insert(id, at);
        id
    }

    /// The flush succeeded: every write completed before it started is durable.
    pub fn flush_completed(&mut self, id: FlushId) {
        let started = self.flushes.remove(&id).expect("flush completed twice");
        self.tick();
        for sector in 0..self.candidates.len() {
            let list = &self.candidates[sector];
            if list.len() < 2 {
                continue;
            }
            let newest_durable = list.iter().rposition(
                |&w| matches!(self.state(w), State::Completed { at, .. } if at < started),
            );
            if let Some(index) = newest_durable.filter(|&index| index > 0) {
                let keep = list[index];
                self.collapse_to(sector, keep);
            }
        }
    }

    /// The flush failed: it promised nothing.
    pub fn flush_failed(&mut self, id: FlushId) {
        self.flushes.remove(&id).expect("flush finished twice");
        self.tick();
    }

    /// The device now holds `size` bytes (a volume resized): sectors past the new end are
    /// forgotten, sectors added read as zeros. Call with nothing in flight.
    pub fn resize(&mut self, size: u64) {
        assert!(
            size.is_multiple_of(SECTOR),
            "the model works in 512-byte sectors; size {size} is not a multiple"
        );
        let sectors = (size / SECTOR) as usize;
        while self.candidates.len() > sectors {
            for id in self.candidates.pop().expect("longer than sectors") {
                self.release(id);
            }
        }
        self.candidates.resize(sectors, vec![WriteId::ZEROS]);
        self.size = size;
    }

    /// The device grew to `size` bytes (a raid5 grown onto new disks, a concat given a member,
    /// a slice made longer)
    /// and `tail`, what it reads past the old end, is what the new sectors hold, durably: a
    /// device's new capacity holds what it holds (a reshape may leave old copies there).
    /// Call with nothing in flight.
    pub fn grow_as_read(&mut self, size: u64, tail: Bytes) {
        let old = self.size;
        assert_eq!(
            old + tail.len() as u64,
            size,
            "the tail is what the device grew by"
        );
        self.resize(size);
        if tail.iter().any(|&b| b != 0) {
            let id = self.write_started(old, tail);
            self.write_completed(id, true);
        }
    }

    /// Power failed: writes still in flight will never complete; they stay candidates.
    pub fn crashed(&mut self) {
        for write in self.writes.values_mut() {
            if write.state == State::InFlight {
                write.state = State::Failed;
            }
        }
        self.flushes.clear();
    }

    /// Drops the candidates of `sector` older than `keep`.
    fn collapse_to(&mut self, sector: usize, keep: WriteId) {
        let list = &mut self.candidates[sector];
        let index = list
            .iter()
            .position(|&w| w == keep)
            .expect("collapse to a candidate");
        let dropped: Vec<WriteId> = list.drain(..index).collect();
        for id in dropped {
            self.release(id);
        }
    }

    fn release(&mut self, id: WriteId) {
        if id == WriteId::ZEROS {
            return;
        }
        let write = self.writes.get_mut(&id).expect("released write exists");
        write.refs -= 1;
        if write.refs == 0 {
            debug_assert_ne!(write.state, State::InFlight);
            self.writes.remove(&id);
        }
    }

    /// The candidates of the sector at byte `offset`, oldest (the durable one) first.
    pub fn allowed(&self, offset: u64) -> Vec<WriteId> {
        let sector = self.sectors(offset, SECTOR).start;
        self.candidates[sector].clone()
    }

    fn matches(&self, id: WriteId, sector: usize, actual: &[u8]) -> bool {
        let Some(write) = self.writes.get(&id).filter(|_| id != WriteId::ZEROS) else {
            return *actual == ZERO_SECTOR;
        };
        match &write.data {
            None => *actual == ZERO_SECTOR,
            Some(data) => {
                let at = (sector as u64 * SECTOR - write.offset) as usize;
                data[at..at + SECTOR_BYTES] == *actual
            }
        }
    }

    fn describe(&self, id: WriteId, durable: bool) -> String {
        let Some(write) = self.writes.get(&id).filter(|_| id != WriteId::ZEROS) else {
            let how = if durable { "durable" } else { "candidate" };
            return format!("zeros (initial, {how})");
        };
        let kind = if write.data.is_some() {
            "write"
        } else {
            "zeroes"
        };
        let state = match write.state {
            State::InFlight => "in flight".to_string(),
            State::Failed => "failed or cut by the crash".to_string(),
            State::Completed { fua: true, .. } => "completed with FUA".to_string(),
            State::Completed { .. } => "completed".to_string(),
        };
        let durable = if durable { ", durable" } else { "" };
        format!(
            "{id} ({kind} [{}, +{}), {state}{durable})",
            write.offset, write.len
        )
    }

    /// Checks bytes read at `offset` after a crash: each sector must hold one of its candidates.
    /// The error names the first bad sector, what it holds and what it may hold.
    pub fn check(&self, offset: u64, actual: &[u8]) -> Result<(), String> {
        self.check_sectors(offset, actual, false)
    }

    /// Checks bytes read at `offset` on a device that has not crashed since the writes: each
    /// sector holds its newest completed candidate, or a newer one in flight or failed.
    pub fn check_live(&self, offset: u64, actual: &[u8]) -> Result<(), String> {
        self.check_sectors(offset, actual, true)
    }

    fn live_from(&self, list: &[WriteId]) -> usize {
        list.iter()
            .rposition(|&w| matches!(self.state(w), State::Completed { .. }))
            .unwrap_or(0)
    }

    fn check_sectors(&self, offset: u64, actual: &[u8], live: bool) -> Result<(), String> {
        let range = self.sectors(offset, actual.len() as u64);
        let mut bad = Vec::new();
        for (i, sector) in range.enumerate() {
            let bytes = &actual[i * SECTOR_BYTES..(i + 1) * SECTOR_BYTES];
            let list = &self.candidates[sector];
            let from = if live { self.live_from(list) } else { 0 };
            if !list[from..].iter().any(|&w| self.matches(w, sector, bytes)) {
                bad.push((sector, bytes, from));
            }
        }
        let Some(&(sector, bytes, from)) = bad.first() else {
            return Ok(());
        };
        let at = sector as u64 * SECTOR;
        let list = &self.candidates[sector];
        let allowed: Vec<String> = list[from..]
            .iter()
            .enumerate()
            .map(|(i, &w)| self.describe(w, i + from == 0))
            .collect();
        let when = if live {
            "before any crash"
        } else {
            "after the crash"
        };
        let mut message = format!(
            "sector at byte offset {at} holds data no write explains {when}\n  read:    {}\n  allowed: {}",
            describe_sector(at, bytes),
            allowed.join("; ")
        );
        if live && from > 0 {
            let stale: Vec<String> = list[..from].iter().map(|w| w.to_string()).collect();
            message += &format!("\n  superseded (stale if read now): {}", stale.join(", "));
        }
        if bad.len() > 1 {
            let last = bad.last().expect("non-empty").0 as u64 * SECTOR;
            message += &format!(
                "\n  {} more bad sectors in this read, the last at byte offset {last}",
                bad.len() - 1
            );
        }
        Err(message)
    }

    /// After a successful `check`, pins each sector to the candidate that was read. Panics if
    /// a sector matches none (check first) or if a write is still in flight (call `crashed`).
    pub fn settle(&mut self, offset: u64, actual: &[u8]) {
        assert!(
            self.writes.values().all(|w| w.state != State::InFlight),
            "settle with writes in flight: call crashed() after a crash"
        );
        for (i, sector) in self.sectors(offset, actual.len() as u64).enumerate() {
            let bytes = &actual[i * SECTOR_BYTES..(i + 1) * SECTOR_BYTES];
            let found = self.candidates[sector]
                .iter()
                .copied()
                .find(|&w| self.matches(w, sector, bytes));
            let Some(keep) = found else {
                panic!(
                    "settle: sector at byte offset {} matches no candidate; check it first",
                    sector as u64 * SECTOR
                );
            };
            let mut list = std::mem::take(&mut self.candidates[sector]);
            for &id in list.iter().filter(|&&w| w != keep) {
                self.release(id);
            }
            list.clear();
            list.push(keep);
            self.candidates[sector] = list;
        }
    }

    /// Writes the model still holds data for (a measure of its memory use).
    pub fn tracked_writes(&self) -> usize {
        self.writes.len()
    }
}
