//! Disks that lose power: a durable image, a volatile write cache, and a crash that keeps an
//! arbitrary part of that cache.
//!
//! Each disk holds the image it would keep through a power cut (`durable`) and the ordered list
//! of mutating operations since its last completed flush (`pending`). Reads see `volatile`, which
//! is always `durable` with `pending` applied in order (kept incrementally so that reads are
//! cheap). A flush moves `pending` into `durable`. A FUA write goes to `durable` at once, and
//! the bytes it covers are cut out of older pending operations: the disk's cache holds the
//! newest data for a sector, so an older cached write can never land over FUA'd data.
//!
//! A crash ([`CrashGroup::crash`]) builds each disk's surviving image from `durable` plus a
//! random selection of the pending operations, each kept whole, dropped, or torn at 512-byte
//! sector granularity, applied in a random order. That is exactly the freedom the
//! `BlockDevice` contract gives a device between flushes.
//!
//! All disks of a [`CrashGroup`] share one lock and one operation counter: a stack over several
//! children loses power as one, and "the 1234th mutating operation" names one point in time
//! across all of them. Every operation runs synchronously under that lock (no await while it is
//! held), so an operation either happened before a flush or after it.

use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use rand::seq::SliceRandom;
use rand::RngExt;
use strata_core::split::split_at_units;
use strata_core::{BlockError, Geometry};

use crate::{CrashRng, DiskImage};

/// Tearing granularity: a torn write keeps or loses each 512-byte sector independently.
pub const SECTOR: u64 = 512;

/// A group of disks that lose power together. Clone is cheap (`Arc`).
#[derive(Clone, Default)]
pub struct CrashGroup {
    inner: Arc<Mutex<GroupState>>,
}

/// What happens to the unflushed operations at a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPolicy {
    /// Every pending operation lands, in order: the image is what reads saw.
    KeepAll,
    /// No pending operation lands: the image is what the last flush (and FUA) made durable.
    DropAll,
    /// Each pending operation is kept (p = 0.4), dropped (p = 0.3) or torn (p = 0.3, each of
    /// its sectors kept with p = 0.5); the survivors are applied in a random order.
    Random,
}

#[derive(Default)]
pub(crate) struct GroupState {
    /// Mutating operations seen so far by all disks.
    pub(crate) ops: u64,
    /// Power fails at the first mutating operation numbered at least this.
    pub(crate) armed: Option<u64>,
    pub(crate) powered_off: bool,
    pub(crate) disks: Vec<DiskState>,
}

/// A mutating operation still in a disk's volatile cache.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) offset: u64,
    pub(crate) data: PendingData,
}

#[derive(Clone, Debug)]
pub(crate) enum PendingData {
    Bytes(Bytes),
    /// write_zeroes, or a discard (which this disk turns into zeros).
    Zeroes(u64),
}

impl Pending {
    pub(crate) fn len(&self) -> u64 {
        match &self.data {
            PendingData::Bytes(bytes) => bytes.len() as u64,
            PendingData::Zeroes(len) => *len,
        }
    }

    fn end(&self) -> u64 {
        self.offset + self.len()
    }

    /// The part of this operation inside `[start, end)`, which must lie inside it.
    fn slice(&self, start: u64, end: u64) -> Pending {
        debug_assert!(self.offset <= start && start < end && end <= self.end());
        let data = match &self.data {
            PendingData::Bytes(bytes) => PendingData::Bytes(
                bytes.slice((start - self.offset) as usize..(end - self.offset) as usize),
            ),
            PendingData::Zeroes(_) => PendingData::Zeroes(end - start),
        };
        Pending {
            offset: start,
            data,
        }
    }

    pub(crate) fn apply(&self, image: &mut DiskImage) {
        match &self.data {
            PendingData::Bytes(bytes) => image.write(self.offset, bytes),
            PendingData::Zeroes(len) => image.zero(self.offset, *len),
        }
    }

    /// This operation cut at absolute 512-byte sector boundaries.
    fn sectors(&self) -> impl Iterator<Item = Pending> + '_ {
        split_at_units(self.offset, self.end() - self.offset, SECTOR).map(move |piece| {
            let start = self.offset + piece.done;
            self.slice(start, start + piece.len)
        })
    }
}

/// Counters of one disk, for tests that want to see what a layer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskCounters {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub write_zeroes: u64,
    pub discards: u64,
    pub flushes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Operations in the volatile cache now (a FUA write or a split one may count differently
    /// from the calls that produced them).
    pub pending: u64,
}

/// Injected faults of one disk. Ranges are byte ranges; latent errors are 512-byte sectors.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    pub(crate) read_errors: Vec<Range<u64>>,
    pub(crate) write_errors: Vec<Range<u64>>,
    pub(crate) latent: std::collections::BTreeSet<u64>,
    pub(crate) gone: bool,
}

fn overlaps(ranges: &[Range<u64>], offset: u64, len: u64) -> bool {
    len > 0
        && ranges
            .iter()
            .any(|range| range.start < offset + len && offset < range.end)
}

impl Faults {
    pub(crate) fn read_fails(&self, offset: u64, len: u64) -> bool {
        overlaps(&self.read_errors, offset, len)
            || (len > 0
                && self
                    .latent
                    .range(offset / SECTOR..=(offset + len - 1) / SECTOR)
                    .next()
                    .is_some())
    }

    pub(crate) fn write_fails(&self, offset: u64, len: u64) -> bool {
        overlaps(&self.write_errors, offset, len)
    }

    /// A successful write rewrites the medium: sectors it covers entirely are healed.
    fn healed_by(&mut self, offset: u64, len: u64) {
        let first = offset.div_ceil(SECTOR);
        let end = (offset + len) / SECTOR;
        if first < end {
            let healed: Vec<u64> = self.latent.range(first..end).copied().collect();
            for sector in healed {
                self.latent.remove(&sector);
            }
        }
    }
}

pub(crate) struct DiskState {
    pub(crate) geometry: Geometry,
    pub(crate) durable: DiskImage,
    pub(crate) volatile: DiskImage,
    pub(crate) pending: Vec<Pending>,
    pub(crate) faults: Faults,
    pub(crate) counters: DiskCounters,
}

/// A mutating operation on its way into a disk.
pub(crate) enum Mutation {
    Write { offset: u64, data: Bytes, fua: bool },
    Zeroes { offset: u64, len: u64, fua: bool },
    Discard { offset: u64, len: u64 },
    Flush,
}

impl Mutation {
    pub(crate) fn range(&self) -> Option<(u64, u64)> {
        match self {
            Mutation::Write { offset, data, .. } => Some((*offset, data.len() as u64)),
            Mutation::Zeroes { offset, len, .. } | Mutation::Discard { offset, len } => {
                Some((*offset, *len))
            }
            Mutation::Flush => None,
        }
    }

    fn into_pending(self) -> Option<Pending> {
        let pending = match self {
            Mutation::Write { offset, data, .. } => Pending {
                offset,
                data: PendingData::Bytes(data),
            },
            Mutation::Zeroes { offset, len, .. } | Mutation::Discard { offset, len } => Pending {
                offset,
                data: PendingData::Zeroes(len),
            },
            Mutation::Flush => return None,
        };
        (pending.len() > 0).then_some(pending)
    }
}

impl DiskState {
    pub(crate) fn new(image: DiskImage) -> Self {
        DiskState {
            geometry: image.geometry(),
            durable: image.clone(),
            volatile: image,
            pending: Vec::new(),
            faults: Faults::default(),
            counters: DiskCounters::default(),
        }
    }

    fn push_pending(&mut self, pending: Pending) {
        assert!(
            pending.len() > 0 && pending.end() <= self.geometry.size,
            "pending operation [{}, +{}) outside the disk ({} bytes)",
            pending.offset,
            pending.len(),
            self.geometry.size
        );
        self.pending.push(pending);
    }

    /// The operation in flight when power failed: cached, so a crash may keep, drop or tear it,
    /// but not applied to the volatile view (nobody will read this disk again before the crash).
    pub(crate) fn record_in_flight(&mut self, mutation: Mutation) {
        if let Some(pending) = mutation.into_pending() {
            self.push_pending(pending);
        }
    }

    /// Applies an operation that succeeded.
    pub(crate) fn apply(&mut self, mutation: Mutation) {
        let fua = matches!(
            mutation,
            Mutation::Write { fua: true, .. } | Mutation::Zeroes { fua: true, .. }
        );
        match &mutation {
            Mutation::Write { offset, data, .. } => {
                self.counters.writes += 1;
                self.counters.bytes_written += data.len() as u64;
                self.faults.healed_by(*offset, data.len() as u64);
            }
            Mutation::Zeroes { offset, len, .. } => {
                self.counters.write_zeroes += 1;
                self.faults.healed_by(*offset, *len);
            }
            Mutation::Discard { .. } => self.counters.discards += 1,
            Mutation::Flush => {
                self.counters.flushes += 1;
                self.commit();
                return;
            }
        }
        self.counters.fua_writes += u64::from(fua);
        let Some(pending) = mutation.into_pending() else {
            return;
        };
        pending.apply(&mut self.volatile);
        if fua {
            pending.apply(&mut self.durable);
            self.supersede(pending.offset, pending.end());
        } else {
            self.push_pending(pending);
        }
    }

    /// Cuts `[start, end)` out of every pending operation: newer data for those bytes is durable.
    fn supersede(&mut self, start: u64, end: u64) {
        let mut kept = Vec::with_capacity(self.pending.len());
        for op in self.pending.drain(..) {
            if op.end() <= start || end <= op.offset {
                kept.push(op);
                continue;
            }
            if op.offset < start {
                kept.push(op.slice(op.offset, start));
            }
            if end < op.end() {
                kept.push(op.slice(end, op.end()));
            }
        }
        self.pending = kept;
    }

    /// A completed flush: everything cached becomes durable.
    fn commit(&mut self) {
        if cfg!(debug_assertions) {
            // The volatile view must be exactly durable + pending in order.
            let mut check = self.durable.clone();
            for op in &self.pending {
                op.apply(&mut check);
            }
            for op in &self.pending {
                assert!(
                    check.range_eq(&self.volatile, op.offset, op.len()),
                    "volatile view diverged from durable + pending at [{}, +{})",
                    op.offset,
                    op.len()
                );
            }
        }
        self.durable = self.volatile.clone();
        self.pending.clear();
    }

    /// The image a power cut leaves under `policy`.
    fn survivor(&self, policy: CrashPolicy, rng: &mut CrashRng) -> DiskImage {
        let mut image = self.durable.clone();
        let mut kept: Vec<Pending> = Vec::new();
        match policy {
            CrashPolicy::KeepAll => kept.extend(self.pending.iter().cloned()),
            CrashPolicy::DropAll => {}
            CrashPolicy::Random => {
                for op in &self.pending {
                    match rng.random_range(0..10u32) {
                        0..=3 => kept.push(op.clone()),
                        4..=6 => {}
                        _ => kept.extend(op.sectors().filter(|_| rng.random_bool(0.5))),
                    }
                }
                kept.shuffle(rng);
            }
        }
        for op in &kept {
            op.apply(&mut image);
        }
        image
    }
}

impl CrashGroup {
    pub fn new() -> Self {
        Self::default()
    }

    // A test thread that panicked while holding the lock leaves state that is at worst torn,
    // which a crash allows anyway; keep serving so the failure report is the original panic.
    pub(crate) fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new zero-filled disk in this group.
    pub fn disk(&self, geometry: Geometry) -> crate::CrashDisk {
        self.disk_from(DiskImage::zeroed(geometry))
    }

    /// A disk whose durable content starts as `image` (what a previous crash left).
    pub fn disk_from(&self, image: DiskImage) -> crate::CrashDisk {
        let geometry = image.geometry();
        let mut state = self.lock();
        state.disks.push(DiskState::new(image));
        let index = state.disks.len() - 1;
        drop(state);
        crate::CrashDisk::new(self.clone(), index, geometry)
    }

    /// Mutating operations (write, write_zeroes, discard, flush; a FUA write counts once) seen so
    /// far by all disks of the group, including ones that failed on an injected fault. Requests
    /// refused for their range, or after power failed, do not count.
    pub fn mutating_ops(&self) -> u64 {
        self.lock().ops
    }

    /// Power fails at the mutating operation numbered `op` (0-based, see [`Self::mutating_ops`]):
    /// that operation is cached (a crash may keep, drop or tear it) but returns an I/O error,
    /// and every later call on any disk of the group returns `BlockError::Shutdown`. If the
    /// counter is already past `op`, the next mutating operation is the one.
    pub fn arm_crash_at(&self, op: u64) {
        self.lock().armed = Some(op);
    }

    /// Power fails now.
    pub fn power_off(&self) {
        self.lock().powered_off = true;
    }

    pub fn is_powered_off(&self) -> bool {
        self.lock().powered_off
    }

    /// The images a power cut leaves, one per disk in creation order: each disk's durable
    /// content plus a random part of its cache (see [`CrashPolicy::Random`]). Powers the group
    /// off. Deterministic given `rng`; may be called again for another possible outcome.
    pub fn crash(&self, rng: &mut CrashRng) -> Vec<DiskImage> {
        self.crash_with(CrashPolicy::Random, rng)
    }

    /// [`Self::crash`] with an explicit policy.
    pub fn crash_with(&self, policy: CrashPolicy, rng: &mut CrashRng) -> Vec<DiskImage> {
        let mut state = self.lock();
        state.powered_off = true;
        state
            .disks
            .iter()
            .map(|disk| disk.survivor(policy, rng))
            .collect()
    }
}

/// The error of the operation in flight when power failed.
pub(crate) fn power_failure(what: &str) -> BlockError {
    BlockError::io(
        format!("power failed during {what}"),
        io::Error::from_raw_os_error(5),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(offset: u64, len: usize, byte: u8) -> Pending {
        Pending {
            offset,
            data: PendingData::Bytes(Bytes::from(vec![byte; len])),
        }
    }

    #[test]
    fn sectors_cut_at_absolute_boundaries() {
        let pieces: Vec<(u64, u64)> = op(100, 1200, 1)
            .sectors()
            .map(|p| (p.offset, p.len()))
            .collect();
        assert_eq!(pieces, vec![(100, 412), (512, 512), (1024, 276)]);
    }

    #[test]
    fn supersede_keeps_only_the_bytes_outside() {
        let mut disk = DiskState::new(DiskImage::zeroed(Geometry::byte_addressable(8192)));
        disk.pending = vec![op(0, 2048, 1), op(1024, 512, 2), op(4096, 512, 3)];
        disk.supersede(512, 1536);
        let left: Vec<(u64, u64)> = disk.pending.iter().map(|p| (p.offset, p.len())).collect();
        assert_eq!(left, vec![(0, 512), (1536, 512), (4096, 512)]);
    }

    #[test]
    fn latent_errors_heal_only_on_whole_sectors() {
        let mut faults = Faults::default();
        faults.latent.extend([1, 2, 3]);
        faults.healed_by(600, 1000); // covers sector 2 only entirely
        assert_eq!(
            faults.latent.iter().copied().collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert!(faults.read_fails(1023, 1));
        assert!(!faults.read_fails(1024, 512));
    }
}
