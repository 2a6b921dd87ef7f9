//! A generic crash scenario for layers that should behave like one plain disk.
//!
//! One seed: build the stack over fresh crash disks, run a random workload (pattern writes of
//! 512 B to `max_write` bytes, some with FUA, write_zeroes, flushes, discards when the stack
//! promises zeros, reads checked against the model as they happen), lose power at a random
//! point, reopen the stack from what the disks kept, and check every sector of it against the
//! [`DeviceModel`]. Then carry on from there for the next round.
//!
//! The crash point is chosen as "a few mutating operations after the start of workload op k":
//! the power cut lands inside op k when the stack turns it into several disk operations (a
//! journal write, a data write, a flush), or a little later when it does not. Offsets fall in a
//! small hot window half of the time, so sectors are rewritten often enough for reordering and
//! superseded data to matter.
//!
//! `open(group, None)` formats a fresh stack; it must leave it durable (flush) before it
//! returns, as a real format would. `open(group, Some(images))` reopens from the images a crash
//! left, one per disk in creation order; use [`open_disks`] to turn them back into disks. A
//! reopen must succeed without help: an error is a failure of the seed.

use std::collections::VecDeque;
use std::future::Future;

use bytes::{Bytes, BytesMut};
use futures_util::future::join_all;
use rand::{RngExt, SeedableRng};
use strata_core::{BoxFuture, DeviceRef, Geometry, WriteFlags, ZeroFlags};

use crate::model::{FlushId, WriteId};
use crate::{CrashDisk, CrashGroup, CrashRng, CrashStats, DeviceModel, DiskImage};

/// Shape of a [`flat_device_scenario`].
#[derive(Clone, Debug)]
pub struct ScenarioConfig {
    /// The disks `open` builds the stack over (used by [`open_disks`]).
    pub disks: Vec<Geometry>,
    /// Workload operations between two crashes (fewer when the crash comes early).
    pub ops_per_round: u32,
    /// Crashes per seed.
    pub rounds: u32,
    /// Largest write, in bytes.
    pub max_write: usize,
    /// The stack turns a discard into zeros, so the workload may discard and expect zeros.
    pub discard_zeroes: bool,
    /// Up to this many non-overlapping operations in flight at once; 1 = one at a time.
    pub concurrency: usize,
}

impl ScenarioConfig {
    /// Defaults: 40 ops per round, 3 rounds, writes up to 64 KiB, one op at a time.
    pub fn new(disks: Vec<Geometry>) -> Self {
        ScenarioConfig {
            disks,
            ops_per_round: 40,
            rounds: 3,
            max_write: 64 << 10,
            discard_zeroes: false,
            concurrency: 1,
        }
    }
}

/// A disk of `size` bytes with 512-byte sectors (min_io 512), as most crash tests use.
pub fn sector_disk(size: u64) -> Geometry {
    Geometry {
        size,
        min_io: 512,
        logical_block: 512,
        physical_block: 4096,
        preferred_io: 4096,
        max_io: 1 << 20,
    }
}

/// Disks of `geometries` in `group`: fresh ones, or the ones `images` describe (which must
/// match the geometries, in order).
pub fn open_disks(
    group: &CrashGroup,
    geometries: &[Geometry],
    images: Option<Vec<DiskImage>>,
) -> Vec<CrashDisk> {
    match images {
        None => geometries.iter().map(|&g| group.disk(g)).collect(),
        Some(images) => {
            assert_eq!(images.len(), geometries.len(), "one image per disk");
            for (image, geometry) in images.iter().zip(geometries) {
                assert_eq!(image.geometry(), *geometry, "image of another disk");
            }
            images
                .into_iter()
                .map(|image| group.disk_from(image))
                .collect()
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Write { offset: u64, len: u64, fua: bool },
    Zeroes { offset: u64, len: u64, fua: bool },
    Discard { offset: u64, len: u64 },
    Flush,
    Read { offset: u64, len: u64 },
}

impl Op {
    fn range(&self) -> Option<(u64, u64)> {
        match *self {
            Op::Write { offset, len, .. }
            | Op::Zeroes { offset, len, .. }
            | Op::Discard { offset, len }
            | Op::Read { offset, len } => Some((offset, len)),
            Op::Flush => None,
        }
    }
}

/// The model's handle on an operation in flight.
enum Started {
    Write(WriteId, Bytes),
    Zeroes(WriteId),
    Flush(FlushId),
    Read,
}

type OpFuture<'d> = BoxFuture<'d, strata_core::Result<Option<BytesMut>>>;

struct Workload<'a> {
    seed: u64,
    config: &'a ScenarioConfig,
    rng: CrashRng,
    model: DeviceModel,
    /// Alignment of every request: the stack's min_io, at least a sector.
    unit: u64,
    max_len: u64,
    hot: (u64, u64),
    round: u32,
    log: VecDeque<String>,
}

const LOG_LINES: usize = 40;
const HOT_WINDOW: u64 = 64 << 10;

impl Workload<'_> {
    fn note(&mut self, line: String) {
        if self.log.len() == LOG_LINES {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    fn failure(&self, what: &str) -> String {
        let log: Vec<&str> = self.log.iter().map(String::as_str).collect();
        format!(
            "seed {}, round {} of {}: {what}\nrecent operations, oldest first:\n  {}",
            self.seed,
            self.round + 1,
            self.config.rounds,
            log.join("\n  ")
        )
    }

    fn pick_range(&mut self) -> (u64, u64) {
        let size = self.model.size();
        let (start, end) = if self.rng.random_bool(0.5) {
            self.hot
        } else {
            (0, size)
        };
        let units = (end - start) / self.unit;
        let most = (self.max_len / self.unit).clamp(1, units);
        let count = if self.rng.random_bool(0.5) {
            self.rng.random_range(1..=most.min(4))
        } else {
            self.rng.random_range(1..=most)
        };
        let first = self.rng.random_range(0..=units - count);
        (start + first * self.unit, count * self.unit)
    }

    fn pick(&mut self, reads: bool, zeroes: bool) -> Op {
        let roll = self.rng.random_range(0..100u32);
        let fua = self.rng.random_bool(0.2);
        match roll {
            0..=13 => Op::Flush,
            14..=27 if reads => {
                let (offset, len) = self.pick_range();
                Op::Read { offset, len }
            }
            28..=35 if zeroes => {
                let (offset, len) = self.pick_range();
                Op::Zeroes { offset, len, fua }
            }
            36..=40 if self.config.discard_zeroes => {
                let (offset, len) = self.pick_range();
                Op::Discard { offset, len }
            }
            _ => {
                let (offset, len) = self.pick_range();
                Op::Write { offset, len, fua }
            }
        }
    }

    fn begin(&mut self, op: Op) -> Started {
        match op {
            Op::Write { offset, len, .. } => {
                let (id, data) = self.model.pattern_write_started(offset, len as usize);
                Started::Write(id, data)
            }
            Op::Zeroes { offset, len, .. } | Op::Discard { offset, len } => {
                Started::Zeroes(self.model.zeroes_started(offset, len))
            }
            Op::Flush => Started::Flush(self.model.flush_started()),
            Op::Read { .. } => Started::Read,
        }
    }

    fn call<'d>(dev: &'d DeviceRef, op: Op, started: &Started) -> OpFuture<'d> {
        let data = match started {
            Started::Write(_, data) => Some(data.clone()),
            _ => None,
        };
        Box::pin(async move {
            match op {
                Op::Write { offset, fua, .. } => {
                    let data = data.expect("write data");
                    dev.write(offset, data, WriteFlags { fua }).await?;
                }
                Op::Zeroes { offset, len, fua } => {
                    let flags = ZeroFlags {
                        fua,
                        ..ZeroFlags::default()
                    };
                    dev.write_zeroes(offset, len, flags).await?;
                }
                Op::Discard { offset, len } => dev.discard(offset, len).await?,
                Op::Flush => dev.flush().await?,
                Op::Read { offset, len } => return Ok(Some(dev.read(offset, len as usize).await?)),
            }
            Ok(None)
        })
    }

    /// Records the outcome in the model. An error is fine once power has failed, and a
    /// failure of the stack otherwise.
    fn end(
        &mut self,
        op: Op,
        started: Started,
        result: strata_core::Result<Option<BytesMut>>,
        powered_off: bool,
    ) -> Result<(), String> {
        let fua = matches!(
            op,
            Op::Write { fua: true, .. } | Op::Zeroes { fua: true, .. }
        );
        let id = match (&started, &result) {
            (Started::Write(id, _) | Started::Zeroes(id), Ok(_)) => {
                self.model.write_completed(*id, fua);
                format!("{id} ")
            }
            (Started::Write(id, _) | Started::Zeroes(id), Err(_)) => {
                self.model.write_failed(*id);
                format!("{id} ")
            }
            (Started::Flush(id), Ok(_)) => {
                self.model.flush_completed(*id);
                String::new()
            }
            (Started::Flush(id), Err(_)) => {
                self.model.flush_failed(*id);
                String::new()
            }
            (Started::Read, _) => String::new(),
        };
        let outcome = match &result {
            Ok(_) => "ok".to_string(),
            Err(error) => format!("error: {error}"),
        };
        self.note(format!("{id}{op:?}: {outcome}"));
        if let (Op::Read { offset, .. }, Ok(Some(bytes))) = (op, &result) {
            self.model
                .check_live(offset, bytes)
                .map_err(|e| self.failure(&format!("a read returned wrong data\n{e}")))?;
        }
        if result.is_err() && !powered_off {
            return Err(self.failure(&format!("{op:?} failed although power had not")));
        }
        Ok(())
    }

    async fn one(&mut self, dev: &DeviceRef, group: &CrashGroup, op: Op) -> Result<(), String> {
        let started = self.begin(op);
        let result = Self::call(dev, op, &started).await;
        self.end(op, started, result, group.is_powered_off())
    }

    /// Several operations in flight at once, on disjoint ranges.
    async fn batch(&mut self, dev: &DeviceRef, group: &CrashGroup) -> Result<(), String> {
        let count = self.rng.random_range(2..=self.config.concurrency);
        let zeroes = dev.capabilities().write_zeroes;
        let mut ops: Vec<Op> = Vec::new();
        for _ in 0..count {
            let op = self.pick(false, zeroes);
            let clashes = |other: &Op| match (op.range(), other.range()) {
                (Some((a, la)), Some((b, lb))) => a < b + lb && b < a + la,
                _ => false,
            };
            if !ops.iter().any(clashes) {
                ops.push(op);
            }
        }
        let started: Vec<Started> = ops.iter().map(|&op| self.begin(op)).collect();
        let calls = ops
            .iter()
            .zip(&started)
            .map(|(&op, s)| Self::call(dev, op, s));
        let results = join_all(calls).await;
        let powered_off = group.is_powered_off();
        for ((op, started), result) in ops.into_iter().zip(started).zip(results) {
            self.end(op, started, result, powered_off)?;
        }
        Ok(())
    }

    /// Reads the whole reopened device, checks it and pins the model to it.
    async fn verify(&mut self, dev: &DeviceRef) -> Result<(), String> {
        self.verify_reads(dev).await.map_err(|(_, report)| report)
    }

    /// [`Self::verify`], with the error saying whether a read failed (true) or returned
    /// wrong data (false).
    async fn verify_reads(&mut self, dev: &DeviceRef) -> Result<(), (bool, String)> {
        let size = self.model.size();
        let chunk = (u64::from(dev.geometry().max_io).min(1 << 20) / self.unit).max(1) * self.unit;
        let mut offset = 0;
        while offset < size {
            let len = chunk.min(size - offset);
            let bytes = dev.read(offset, len as usize).await.map_err(|e| {
                let what = format!("reading [{offset}, +{len}) after the reopen: {e}");
                (true, self.failure(&what))
            })?;
            self.model.check(offset, &bytes).map_err(|e| {
                (
                    false,
                    self.failure(&format!("wrong data after the crash and reopen\n{e}")),
                )
            })?;
            self.model.settle(offset, &bytes);
            offset += len;
        }
        Ok(())
    }
}

/// Opens a fresh stack and sets up the workload against its geometry.
async fn start<'c, Open, Fut>(
    seed: u64,
    config: &'c ScenarioConfig,
    open: &mut Open,
) -> Result<(CrashGroup, DeviceRef, Workload<'c>), String>
where
    Open: FnMut(&CrashGroup, Option<Vec<DiskImage>>) -> Fut,
    Fut: Future<Output = strata_core::Result<DeviceRef>>,
{
    assert!(config.ops_per_round > 0 && config.concurrency > 0);
    let group = CrashGroup::new();
    let dev = open(&group, None)
        .await
        .map_err(|e| format!("seed {seed}: creating the stack failed: {e}"))?;
    let geometry = dev.geometry();
    let unit = u64::from(geometry.min_io).max(512);
    let size = geometry.size / unit * unit;
    let max_len = (config.max_write as u64)
        .min(u64::from(geometry.max_io))
        .min(size)
        / unit
        * unit;
    if size == 0 || max_len == 0 || !unit.is_multiple_of(512) {
        return Err(format!(
            "seed {seed}: the stack's geometry {geometry:?} leaves nothing to test"
        ));
    }
    let mut rng = CrashRng::seed_from_u64(seed);
    let hot_len = HOT_WINDOW.min(size) / unit * unit;
    let hot_start = rng.random_range(0..=(size - hot_len) / unit) * unit;
    let work = Workload {
        seed,
        config,
        rng,
        model: DeviceModel::new(size),
        unit,
        max_len,
        hot: (hot_start, hot_start + hot_len),
        round: 0,
        log: VecDeque::new(),
    };
    Ok((group, dev, work))
}

/// One workload operation: alone, or a batch of concurrent ones.
async fn step(work: &mut Workload<'_>, dev: &DeviceRef, group: &CrashGroup) -> Result<(), String> {
    if work.config.concurrency > 1 && work.rng.random_bool(0.5) {
        work.batch(dev, group).await
    } else {
        let op = work.pick(true, dev.capabilities().write_zeroes);
        work.one(dev, group, op).await
    }
}

/// Runs one seeded scenario; see the module docs. Returns the crashes it went through.
pub async fn flat_device_scenario<Open, Fut>(
    seed: u64,
    config: &ScenarioConfig,
    mut open: Open,
) -> Result<CrashStats, String>
where
    Open: FnMut(&CrashGroup, Option<Vec<DiskImage>>) -> Fut,
    Fut: Future<Output = strata_core::Result<DeviceRef>>,
{
    let (mut group, mut dev, mut work) = start(seed, config, &mut open).await?;
    let size = work.model.size();
    for round in 0..config.rounds {
        work.round = round;
        let crash_op = work.rng.random_range(0..config.ops_per_round);
        for n in 0..config.ops_per_round {
            if n == crash_op {
                let at = group.mutating_ops() + work.rng.random_range(0..4);
                group.arm_crash_at(at);
                work.note(format!("(power will fail at disk op #{at})"));
            }
            step(&mut work, &dev, &group).await?;
            if group.is_powered_off() {
                break;
            }
        }
        let ops = group.mutating_ops();
        let images = group.crash(&mut work.rng);
        work.model.crashed();
        work.note(format!("--- power failed after {ops} disk ops; reopening"));
        drop(dev);
        group = CrashGroup::new();
        dev = open(&group, Some(images))
            .await
            .map_err(|e| work.failure(&format!("reopening after the crash failed: {e}")))?;
        if dev.geometry().size < size {
            let got = dev.geometry().size;
            return Err(work.failure(&format!("the reopened stack has {got} bytes, not {size}")));
        }
        work.verify(&dev).await?;
    }
    Ok(CrashStats {
        crash_points: u64::from(config.rounds),
    })
}

/// Media damage after a completed flush; see [`Damage`](crate::Damage). Per round: the random
/// workload (no power cut during it), a flush that must complete, a power cut, then the
/// damage `damage(rng, images)` returns is applied to the images, and the stack is reopened
/// from them. Then either:
/// - the reopen fails: the damage was reported and the device refused. Acceptable; the seed
///   ends there (there is nothing to carry on with);
/// - a read of the reopened device fails: the damage was reported on read. Acceptable, the
///   seed ends;
/// - or every sector must hold what the model allows, which after the flush is exactly the
///   last write to it: anything else (zeros, an older write, garbage) is silent loss, and the
///   seed fails with a report that names the damage and replays.
///
/// `damage` sees the images so it can aim at structures whose place depends on state (the
/// current checkpoint, the last journal batch). Aim only at what the stack claims to protect:
/// damage in unprotected user data is, correctly, served as it is and fails the check.
pub async fn damaged_device_scenario<Open, Fut, Aim>(
    seed: u64,
    config: &ScenarioConfig,
    mut damage: Aim,
    mut open: Open,
) -> Result<crate::DamageStats, String>
where
    Open: FnMut(&CrashGroup, Option<Vec<DiskImage>>) -> Fut,
    Fut: Future<Output = strata_core::Result<DeviceRef>>,
    Aim: FnMut(&mut CrashRng, &[DiskImage]) -> Vec<crate::Damage>,
{
    let (mut group, mut dev, mut work) = start(seed, config, &mut open).await?;
    let size = work.model.size();
    let mut stats = crate::DamageStats::default();
    for round in 0..config.rounds {
        work.round = round;
        for _ in 0..config.ops_per_round {
            step(&mut work, &dev, &group).await?;
        }
        // Everything the workload wrote is now acknowledged and flushed: a stack may lose
        // none of it, whatever happens to the medium afterwards.
        work.one(&dev, &group, Op::Flush).await?;
        let ops = group.mutating_ops();
        let mut images = group.crash(&mut work.rng);
        work.model.crashed();
        work.note(format!(
            "--- power cut after a completed flush ({ops} disk ops)"
        ));
        for fault in damage(&mut work.rng, &images) {
            let line = fault.apply(&mut images, &mut work.rng);
            work.note(line);
        }
        stats.damage_points += 1;
        drop(dev);
        group = CrashGroup::new();
        dev = match open(&group, Some(images)).await {
            Ok(dev) => dev,
            Err(error) => {
                work.note(format!("reopen refused: {error}"));
                stats.refused += 1;
                return Ok(stats);
            }
        };
        if dev.geometry().size < size {
            let got = dev.geometry().size;
            return Err(work.failure(&format!("the reopened stack has {got} bytes, not {size}")));
        }
        match work.verify_reads(&dev).await {
            Ok(()) => stats.intact += 1,
            Err((true, report)) => {
                // A read error: the damage was reported, not served.
                work.note(report);
                stats.read_errors += 1;
                return Ok(stats);
            }
            Err((false, report)) => {
                return Err(format!(
                    "silent loss: the stack reopened after media damage and served wrong \
                     data\n{report}"
                ))
            }
        }
    }
    Ok(stats)
}
