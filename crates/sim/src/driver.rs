//! The driver: plays a [`Workload`] against the top of a simulated stack and records what
//! happened, one [`IoRecord`] per I/O and, at a fixed interval, one [`DeviceSample`] per
//! simulated disk.
//!
//! An I/O without an arrival time is closed loop: it is issued as soon as fewer than
//! `queue_depth` I/Os are outstanding. An I/O with an arrival time is open loop: it is
//! issued at that time (counted from the start of the run) whatever is outstanding.
//!
//! Every time in a [`RunOutput`] counts from the start of the run, so a result does not
//! depend on how long the stack took to assemble. Records are in completion order.
//!
//! Written data is a pure function of the seed and the byte address ([`pattern`]): whatever
//! order overlapping writes land in, a sector reads back as zeros (never written) or as the
//! pattern, which is what [`sectors_match`] checks.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::{select, Either};
use futures_util::stream::{FuturesUnordered, StreamExt};
use strata_core::{DeviceRef, WriteFlags};

use crate::disk::{DiskStats, SimDisk, SECTOR};
use crate::executor::{derive_seed, splitmix64, SimRuntime, Simulation, Sleep};
use crate::model::{DeviceSample, Io, IoRecord, Nanos, Op, Workload};

#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Closed loop: I/Os kept outstanding. At least 1.
    pub queue_depth: usize,
    /// Take a [`DeviceSample`] per disk this often; `None` takes none.
    pub sample_interval: Option<Nanos>,
    /// Write the seed's [`pattern`] and check every read against it. Off: writes carry
    /// zeros (no generation cost, for speed runs) and reads are not checked.
    pub verify_data: bool,
    /// Open loop with a ceiling: I/Os with arrival times are issued at their arrival but
    /// with at most this many outstanding; later arrivals wait, in order, for a slot (a
    /// benchmark's fixed pool of client processes, each with one request in flight). `None`:
    /// no ceiling.
    pub outstanding_limit: Option<usize>,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            queue_depth: 1,
            sample_interval: None,
            verify_data: true,
            outstanding_limit: None,
        }
    }
}

/// One simulated disk's share of a run.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DiskReport {
    pub name: String,
    pub model: String,
    /// What the run asked of the disk (not counting what assembling the stack did).
    pub stats: DiskStats,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunOutput {
    pub seed: u64,
    /// Virtual time at which the run started (every other time counts from here).
    pub started_at: Nanos,
    /// When the last I/O completed.
    pub end: Nanos,
    pub records: Vec<IoRecord>,
    pub samples: Vec<DeviceSample>,
    pub disks: Vec<DiskReport>,
    /// Reads that returned bytes other than zeros or the pattern (always 0 unless a layer
    /// corrupts data; only counted with `verify_data`).
    pub read_mismatches: u64,
}

/// Runs `workload` against `top` in `sim` until the workload is over and every I/O has
/// completed, sampling `disks`.
pub fn run(
    sim: &Simulation,
    top: DeviceRef,
    workload: &mut dyn Workload,
    disks: &[Arc<SimDisk>],
    config: &DriverConfig,
) -> RunOutput {
    sim.block_on(drive(sim.handle(), top, workload, disks, config))
}

/// [`run`] as a future, for callers already inside [`Simulation::block_on`].
pub async fn drive(
    clock: SimRuntime,
    top: DeviceRef,
    workload: &mut dyn Workload,
    disks: &[Arc<SimDisk>],
    config: &DriverConfig,
) -> RunOutput {
    assert!(config.queue_depth >= 1, "queue_depth must be at least 1");
    assert!(
        config.outstanding_limit != Some(0),
        "outstanding_limit must be at least 1"
    );
    let start = clock.now_nanos();
    let data_seed = derive_seed(clock.seed(), "driver-data");
    let zeros = Bytes::from(vec![0u8; 1 << 20]);
    let stats_at_start: Vec<DiskStats> = disks.iter().map(|d| d.stats()).collect();
    let mut sampler = config
        .sample_interval
        .map(|interval| Sampler::new(interval, start, &stats_at_start));

    let mut records = Vec::new();
    let mut read_mismatches = 0;
    let mut inflight = FuturesUnordered::new();
    let mut pending: Option<Io> = None;
    let mut exhausted = false;
    let mut timer: Option<(Nanos, Pin<Box<Sleep>>)> = None;
    loop {
        let now = clock.now_nanos();
        if let Some(sampler) = &mut sampler {
            sampler.take_due(now, disks);
        }
        let full = |inflight: usize| config.outstanding_limit.is_some_and(|m| inflight >= m);
        loop {
            if pending.is_none() && !exhausted {
                pending = workload.next_io();
                exhausted = pending.is_none();
            }
            let Some(io) = pending else { break };
            let due = match io.arrival {
                None => inflight.len() < config.queue_depth,
                Some(arrival) => start + arrival <= now && !full(inflight.len()),
            };
            if !due {
                break;
            }
            pending = None;
            let data = match (io.op, config.verify_data) {
                (Op::Read, _) => None,
                (Op::Write, true) => Some(pattern(data_seed, io.offset, io.len as usize)),
                (Op::Write, false) => Some(zero_payload(&zeros, io.len as usize)),
            };
            inflight.push(issue(
                &clock,
                &top,
                io,
                start,
                data,
                config.verify_data.then_some(data_seed),
            ));
        }
        if inflight.is_empty() && pending.is_none() {
            break;
        }
        // An arrival held back by the ceiling waits for a completion, not for its time.
        let arrival = pending
            .and_then(|io| io.arrival)
            .filter(|_| !full(inflight.len()))
            .map(|a| start + a);
        let wake_at = [arrival, sampler.as_ref().map(|s| s.next)]
            .into_iter()
            .flatten()
            .min();
        let finished = match wake_at {
            None => inflight.next().await,
            Some(at) => {
                // One timer per deadline, not one per loop turn: the loop turns at every
                // completion and a dropped timer stays in the heap until its time.
                if timer.as_ref().is_none_or(|(t, _)| *t != at) {
                    timer = Some((at, Box::pin(clock.sleep_until(at))));
                }
                let (_, sleep) = timer.as_mut().expect("just set");
                if inflight.is_empty() {
                    sleep.as_mut().await;
                    None
                } else {
                    match select(inflight.next(), sleep.as_mut()).await {
                        Either::Left((finished, _)) => finished,
                        Either::Right(((), _)) => None,
                    }
                }
            }
        };
        if let Some((record, mismatch)) = finished {
            records.push(record);
            read_mismatches += u64::from(mismatch);
        }
    }

    let disk_reports = disks
        .iter()
        .zip(&stats_at_start)
        .map(|(disk, before)| DiskReport {
            name: disk.name().to_string(),
            model: disk.model_name().to_string(),
            stats: disk.stats().since(before),
        })
        .collect();
    RunOutput {
        seed: clock.seed(),
        started_at: start,
        end: clock.now_nanos() - start,
        records,
        samples: sampler.map(|s| s.samples).unwrap_or_default(),
        disks: disk_reports,
        read_mismatches,
    }
}

/// Issues one I/O and reports it, with whether a read returned unexpected bytes.
async fn issue(
    clock: &SimRuntime,
    top: &DeviceRef,
    io: Io,
    start: Nanos,
    data: Option<Bytes>,
    verify_seed: Option<u64>,
) -> (IoRecord, bool) {
    let issued = clock.now_nanos() - start;
    let (failed, mismatch) = match data {
        Some(data) => (
            top.write(io.offset, data, WriteFlags::default())
                .await
                .is_err(),
            false,
        ),
        None => match top.read(io.offset, io.len as usize).await {
            Ok(bytes) => (
                false,
                verify_seed.is_some_and(|seed| !sectors_match(seed, io.offset, &bytes)),
            ),
            Err(_) => (true, false),
        },
    };
    let record = IoRecord {
        op: io.op,
        offset: io.offset,
        len: io.len,
        issued,
        completed: clock.now_nanos() - start,
        failed,
    };
    (record, mismatch)
}

fn zero_payload(zeros: &Bytes, len: usize) -> Bytes {
    if len <= zeros.len() {
        zeros.slice(..len)
    } else {
        Bytes::from(vec![0u8; len])
    }
}

/// The bytes the driver writes at `offset` for `seed`: every 8-byte word is a hash of the
/// seed and the word's address, so any two writes agree on every byte they share.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Bytes {
    let mut bytes = Vec::with_capacity(len);
    fill_pattern(seed, offset, len, &mut bytes);
    Bytes::from(bytes)
}

/// Appends the pattern's bytes `[offset, offset + len)`, at any alignment (a misaligned I/O
/// must fail in the stack, not in the driver).
fn fill_pattern(seed: u64, offset: u64, len: usize, out: &mut Vec<u8>) {
    let end = offset + len as u64;
    for word in offset / 8..end.div_ceil(8) {
        let bytes = splitmix64(seed ^ word.wrapping_mul(0x9e37_79b9)).to_le_bytes();
        let from = offset.saturating_sub(word * 8) as usize;
        let to = (end - word * 8).min(8) as usize;
        out.extend_from_slice(&bytes[from..to]);
    }
}

/// Whether every 512-byte sector of `data` (read at `offset`) is all zeros or the pattern.
pub fn sectors_match(seed: u64, offset: u64, data: &[u8]) -> bool {
    let mut expected = Vec::with_capacity(SECTOR as usize);
    data.chunks(SECTOR as usize).enumerate().all(|(i, sector)| {
        expected.clear();
        fill_pattern(
            seed,
            offset + i as u64 * SECTOR,
            sector.len(),
            &mut expected,
        );
        sector == expected.as_slice() || sector.iter().all(|&b| b == 0)
    })
}

/// Samples queue depth and utilization of each disk every `interval`.
struct Sampler {
    interval: Nanos,
    start: Nanos,
    /// Absolute time of the next sample.
    next: Nanos,
    busy_before: Vec<Nanos>,
    samples: Vec<DeviceSample>,
}

impl Sampler {
    fn new(interval: Nanos, start: Nanos, stats: &[DiskStats]) -> Self {
        assert!(interval > 0, "sample_interval must be positive");
        Sampler {
            interval,
            start,
            next: start + interval,
            busy_before: stats.iter().map(|s| s.busy_time).collect(),
            samples: Vec::new(),
        }
    }

    fn take_due(&mut self, now: Nanos, disks: &[Arc<SimDisk>]) {
        while self.next <= now {
            for (disk, before) in disks.iter().zip(&mut self.busy_before) {
                let busy = disk.stats().busy_time;
                let delta = busy.saturating_sub(*before);
                *before = busy;
                self.samples.push(DeviceSample {
                    at: self.next - self.start,
                    device: disk.name().to_string(),
                    queue_depth: disk.outstanding(),
                    utilization: (delta as f64 / self.interval as f64).clamp(0.0, 1.0),
                });
            }
            self.next += self.interval;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_patterns_agree_and_reads_of_zeros_or_pattern_match() {
        let whole = pattern(5, 0, 4096);
        let part = pattern(5, 1024, 512);
        assert_eq!(&whole[1024..1536], &part[..]);
        assert_ne!(pattern(5, 0, 512), pattern(6, 0, 512));
        let mut mixed = whole.to_vec();
        mixed[512..1024].fill(0);
        assert!(sectors_match(5, 0, &mixed));
        mixed[2000] ^= 1;
        assert!(!sectors_match(5, 0, &mixed));
        assert!(!sectors_match(5, 512, &whole[..512]));
        assert_eq!(&pattern(5, 13, 100)[..], &whole[13..113]);
        assert_eq!(&pattern(5, 4090, 3)[..], &whole[4090..4093]);
    }
}
