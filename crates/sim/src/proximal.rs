//! Proximal I/O §5 (Schindler, Shete & Smith, FAST '11; digest
//! `shared/papers/proximal-io.md` §5, §9 F-H, §10.5) in virtual time, on Strata's `stage`
//! layer itself (`strata sim proximal`, docs/proximal-sim.md).
//!
//! Each run is a fresh simulation from the seed: five simulated WD RE3 drives, a slice of
//! `member_bytes` at the start of each, a 4+1 `raid5` of 1 MiB chunks over the slices (its
//! stripe journal on a simulated flash device, as the paper's RAID had none on its disks), and
//! a `stage` over [flash, raid5] with 16 MiB extents and 1 MiB ranges, all written as
//! `[[layer]]` text and built through the layer registry as `strata serve` builds it.
//!
//! A run fills 89 % of the stage serially with 16 MiB extents (4 MiB writes, which go to the
//! raid5 directly), then issues 2,000 random 4 KiB updates per extent (staged; the log is
//! destaged when it fills), then destages what is left. Table 2 is measured on the drives
//! during the update phase, where every drive I/O is destage I/O (staged writes and the
//! stage's metadata go to flash): see [`revolutions`] for the I/Os per revolution. Table 3
//! reads every extent in a random order in requests of 974 blocks, pristine (after the fill)
//! and aged (after the updates), and the same on a write-anywhere hole-plugging layout
//! ([`layout::HolePlugging`]) read through the raid5.

pub mod layout;
mod report;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::join_all;
use strata_core::{Control, ControlReply, DeviceRef, NodeStatus, WriteFlags};

pub use report::{format_report, write_plots, PAPER, PAPER_READ};

use crate::disk::{CompletionRecord, DataMode, DiskStats, SimDisk};
use crate::driver::{self, DriverConfig};
use crate::executor::{derive_seed, SimConfig, Simulation};
use crate::model::{Io, Nanos, Op, Workload, MILLIS, SECONDS};
use crate::results::{self, LatencySummary};
use crate::stack::{Stack, StackSpec};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The stage's block, the update size.
pub const BLOCK: u64 = 4 * KIB;
/// Data members of the 4+1 raid5.
pub const DATA_MEMBERS: u64 = 4;
/// The staging flash (0.1 ms per request, negligible as in the paper) and the raid5 journal.
pub const FLASH_MODEL: &str = "proximal-staging-flash";

/// When a destage starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    Full,
    /// An extent's staged blocks reach this.
    Density(u64),
    /// The stage's defaults: start at 80 % of the log, stop at 20 %.
    Watermark,
}

impl Trigger {
    pub fn label(self) -> String {
        match self {
            Trigger::Full => "full".into(),
            Trigger::Density(n) => format!("density {n}"),
            Trigger::Watermark => "watermark 80/20".into(),
        }
    }
}

/// What the whole reproduction runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProximalConfig {
    pub seed: u64,
    /// The drive (`wd-re3-1t`).
    pub model: String,
    /// Each raid5 member: a slice at the start of its drive (the paper: whole 1 TB drives).
    pub member_bytes: u64,
    pub chunk_bytes: u64,
    pub extent_bytes: u64,
    pub range_bytes: u64,
    /// Share of the stage filled with extents, in percent.
    pub fill_percent: f64,
    pub updates_per_extent: u64,
    /// Staging sizes of Table 2, in percent of the usable capacity (4 × member).
    pub staging_percents: Vec<f64>,
    /// Also run the smallest and largest staging size on `wd-re3-1t-order-quirk`.
    pub quirk: bool,
    /// Table 3's request size, in blocks (the paper's indirect-block fan-out).
    pub read_blocks: u64,
    /// Table 3 is read on the run of this staging size.
    pub table3_percent: f64,
    /// The trigger comparison: staging size, updates per extent, open-loop rate.
    pub trigger_percent: f64,
    pub trigger_updates_per_extent: u64,
    pub rate_per_s: f64,
    /// The update-in-place baseline: updates straight to the raid5, at queue depth 1.
    pub in_place_updates: u64,
}

impl ProximalConfig {
    /// The paper's setup with members of `member_bytes` (the paper: 1 TB).
    pub fn with_members(seed: u64, member_bytes: u64) -> ProximalConfig {
        ProximalConfig {
            seed,
            model: "wd-re3-1t".into(),
            member_bytes,
            chunk_bytes: MIB,
            extent_bytes: 16 * MIB,
            range_bytes: MIB,
            fill_percent: 89.0,
            updates_per_extent: 2000,
            staging_percents: vec![1.0, 2.0, 5.0, 10.0],
            quirk: true,
            read_blocks: 974,
            table3_percent: 1.0,
            trigger_percent: 1.0,
            trigger_updates_per_extent: 500,
            rate_per_s: 40.0,
            in_place_updates: 2000,
        }
    }

    /// The default scale: members of 1 GiB (4 GiB usable, 227 extents of 16 MiB).
    pub fn default_scale(seed: u64) -> ProximalConfig {
        ProximalConfig::with_members(seed, GIB)
    }

    /// Usable bytes the staging percentages are of: the data members' share.
    pub fn usable_bytes(&self) -> u64 {
        DATA_MEMBERS * self.member_bytes
    }

    /// Log slots of a staging area of `percent` of the usable capacity.
    pub fn log_slots(&self, percent: f64) -> u64 {
        ((self.usable_bytes() as f64 * percent / 100.0) / BLOCK as f64)
            .round()
            .max(16.0) as u64
    }
}

/// One staged run: its setup.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StagedSetup {
    pub model: String,
    pub percent: f64,
    pub trigger: Trigger,
    pub updates_per_extent: u64,
    /// Open loop at this many updates per second; `None`: closed loop, one at a time.
    pub rate_per_s: Option<f64>,
    /// Read every extent pristine and aged (Table 3).
    pub reads: bool,
}

/// Table 3: one serial read of every extent.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReadRun {
    pub layout: String,
    pub requests: u64,
    pub blocks_per_request: f64,
    pub mean_ms: f64,
    pub seconds: f64,
    /// Bytes read ÷ time ÷ 4 data disks (the paper's 345 MB/s ÷ 4 = 86.2).
    pub mb_per_s_per_disk: f64,
    /// Drive I/Os per request, all drives.
    pub disk_ios_per_request: f64,
    /// Physically consecutive runs per request (hole-plugging only: the layout is known).
    pub runs_per_request: Option<f64>,
}

/// The I/Os per revolution of a set of drive timelines ([`revolutions`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Revolutions {
    /// Inter-completion gaps counted (I/Os after the first of each batch on each drive).
    pub gaps: u64,
    /// Mean inter-completion time within a batch on one drive (the paper's service time).
    pub mean_service_ms: f64,
    /// Revolution ÷ that: the paper's Table 2 column.
    pub per_revolution: f64,
    /// The same with the drive's idle time inside a batch left out (a request that reached an
    /// idle drive counts from its arrival, not from the previous completion).
    pub busy_per_revolution: f64,
    /// I/Os per revolution with the gaps where a drive went from one extent's batch to
    /// another's counted too (only idle gaps over a revolution left out): the measure that
    /// does not flatter batches of several extents in flight at once.
    pub with_switches_per_revolution: f64,
}

/// What one staged run measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StagedRun {
    pub setup: StagedSetup,
    /// Updates the stage failed (open loop only; a closed-loop failure fails the run).
    pub failed: u64,
    pub log_slots: u64,
    pub extents: u64,
    pub updates: u64,
    /// Destages during the update phase (the final one for the reads not counted).
    pub destages: u64,
    pub batches: u64,
    pub destaged_blocks: u64,
    /// Drive I/Os during the update phase, all five drives.
    pub disk_reads: u64,
    pub disk_writes: u64,
    pub updates_per_batch: f64,
    pub ios_per_batch: f64,
    /// Drive I/Os per destaged update.
    pub amplification: f64,
    pub revolutions: Revolutions,
    /// The stage's child writes per batch (consecutive blocks merged).
    pub stage_requests_per_batch: f64,
    pub placed_at_home: u64,
    pub placed_in_home_range: u64,
    pub placed_in_window: u64,
    pub placed_outside_window: u64,
    pub update_seconds: f64,
    pub updates_per_s: f64,
    /// Response time of the updates (arrival to completion).
    pub latency: Option<LatencySummary>,
    pub pristine: Option<ReadRun>,
    pub aged: Option<ReadRun>,
}

/// The update-in-place baseline: small writes straight to the raid5.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct InPlaceRun {
    pub updates: u64,
    pub disk_reads: u64,
    pub disk_writes: u64,
    pub ios_per_update: f64,
    pub updates_per_s: f64,
    pub revolutions: Revolutions,
}

/// Everything `strata sim proximal` measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProximalReport {
    pub config: ProximalConfig,
    /// The drive's revolution, ms.
    pub revolution_ms: f64,
    pub table2: Vec<StagedRun>,
    /// The order-quirk drive at the smallest and largest staging size.
    pub quirk: Vec<StagedRun>,
    pub hole_plugging: Option<ReadRun>,
    pub in_place: InPlaceRun,
    pub triggers: Vec<StagedRun>,
}

impl ProximalReport {
    /// The Table 3 run (pristine and aged reads).
    pub fn table3(&self) -> Option<&StagedRun> {
        self.table2.iter().find(|r| r.aged.is_some())
    }
}

/// The stack in the serve config's syntax; `staging`: the stage's log slots and trigger
/// (None: the raid5 alone, the update-in-place baseline).
pub fn stack_text(config: &ProximalConfig, model: &str, staging: Option<(u64, Trigger)>) -> String {
    let mut text = String::new();
    for i in 0..5 {
        text.push_str(&format!(
            "[[disk]]\nname = \"d{i}\"\nmodel = \"{model}\"\n\n"
        ));
    }
    for i in 0..5 {
        text.push_str(&format!(
            "[[layer]]\nname = \"p{i}\"\nkind = \"slice\"\nchildren = [\"d{i}\"]\nlength = {}\n\n",
            config.member_bytes
        ));
    }
    text.push_str(&format!(
        "[[disk]]\nname = \"journal\"\nmodel = \"{FLASH_MODEL}\"\ncapacity = {}\n\n",
        GIB
    ));
    text.push_str(&format!(
        "[[layer]]\nname = \"r5\"\nkind = \"raid5\"\nchildren = [\"p0\", \"p1\", \"p2\", \"p3\", \"p4\", \"journal\"]\nchunk = {}\njournal-device = \"journal\"\n\n",
        config.chunk_bytes
    ));
    if let Some((slots, trigger)) = staging {
        let metadata = metadata_bytes(config, slots);
        text.push_str(&format!(
            "[[disk]]\nname = \"flash\"\nmodel = \"{FLASH_MODEL}\"\ncapacity = {}\n\n",
            metadata + slots * BLOCK
        ));
        text.push_str(&format!(
            "[[layer]]\nname = \"st\"\nkind = \"stage\"\nchildren = [\"flash\", \"r5\"]\nextent = {}\nrange = {}\nmetadata-size = {metadata}\n",
            config.extent_bytes, config.range_bytes
        ));
        match trigger {
            Trigger::Full => text.push_str("trigger = \"full\"\n"),
            Trigger::Density(n) => {
                text.push_str(&format!("trigger = \"density\"\ndensity = {n}\n"))
            }
            Trigger::Watermark => text.push_str("trigger = \"watermark\"\nhigh = 80\nlow = 20\n"),
        }
    }
    text
}

/// The stage's default metadata region for a log of `slots` over the usable capacity,
/// given explicitly so that the log has exactly `slots`.
fn metadata_bytes(config: &ProximalConfig, slots: u64) -> u64 {
    strata_stage::StageConfig::default().metadata_bytes(slots * BLOCK, config.usable_bytes())
}

fn build(
    config: &ProximalConfig,
    model: &str,
    staging: Option<(u64, Trigger)>,
) -> Result<(Simulation, Stack), String> {
    let table: toml::Table = stack_text(config, model, staging)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let spec = StackSpec::from_toml(&table)?;
    let sim = Simulation::with_config(SimConfig::new(config.seed));
    let stack = spec.build(
        &sim,
        &crate::models::build,
        DataMode::TimingOnly,
        Path::new("."),
    )?;
    Ok((sim, stack))
}

/// The drives of the raid5 (the flash devices are not counted).
fn drives(stack: &Stack) -> Vec<Arc<SimDisk>> {
    stack
        .disks
        .iter()
        .filter(|d| d.name().starts_with('d'))
        .cloned()
        .collect()
}

fn sum_stats(drives: &[Arc<SimDisk>], before: &[DiskStats]) -> DiskStats {
    let mut total = DiskStats::default();
    for (d, b) in drives.iter().zip(before) {
        let s = d.stats().since(b);
        total.reads += s.reads;
        total.writes += s.writes;
        total.read_bytes += s.read_bytes;
        total.written_bytes += s.written_bytes;
        total.completed += s.completed;
        total.busy_time += s.busy_time;
    }
    total
}

/// A workload of I/Os given in advance.
struct Listed(std::vec::IntoIter<Io>);

impl Workload for Listed {
    fn next_io(&mut self) -> Option<Io> {
        self.0.next()
    }
}

/// Runs `ios` against `top`: closed loop one at a time; open loop each at its arrival,
/// whatever is outstanding (the driver's rule).
fn one_at_a_time(sim: &Simulation, top: DeviceRef, ios: Vec<Io>) -> driver::RunOutput {
    let config = DriverConfig {
        queue_depth: 1,
        sample_interval: None,
        verify_data: false,
        outstanding_limit: None,
    };
    driver::run(sim, top, &mut Listed(ios.into_iter()), &[], &config)
}

/// The revolution of `model`, ns.
pub fn revolution_ns(model: &str) -> Result<Nanos, String> {
    let params =
        crate::hdd::presets::by_name(model).ok_or_else(|| format!("{model} is not an HDD"))?;
    Ok(60 * SECONDS / params.rpm as u64)
}

/// The paper's I/Os per revolution (§5.3: "the difference between the completions of the last
/// two I/Os" on a drive, averaged; revolution ÷ that). Each drive's completions are cut into
/// batches: a batch is a run of consecutive completions in one extent's share of the member
/// (`(offset − data_start) / member_extent`), and a new one also starts when the drive sat
/// idle for more than a revolution (the host paused between destages). Every completion after
/// the first of its batch contributes its gap to the previous one; the first, which carries
/// the seek from wherever the head was, does not (the paper randomized the heads before each
/// batch and, measuring gaps, left that seek out as well).
pub fn revolutions(
    timelines: &[Vec<CompletionRecord>],
    data_start: u64,
    member_extent: u64,
    revolution: Nanos,
) -> Revolutions {
    let (mut gaps, mut total, mut busy) = (0u64, 0u64, 0u64);
    let (mut all_gaps, mut all_total) = (0u64, 0u64);
    for timeline in timelines {
        let mut previous: Option<(u64, Nanos)> = None;
        for c in timeline {
            let key = c.offset.saturating_sub(data_start) / member_extent;
            if let Some((prev_key, prev_at)) = previous {
                let idle = c.submitted.saturating_sub(prev_at);
                if idle <= revolution {
                    all_gaps += 1;
                    all_total += c.at - prev_at;
                }
                if prev_key == key && idle <= revolution {
                    gaps += 1;
                    total += c.at - prev_at;
                    busy += c.at - prev_at.max(c.submitted);
                }
            }
            previous = Some((key, c.at));
        }
    }
    if gaps == 0 {
        return Revolutions::default();
    }
    let mean = total as f64 / gaps as f64;
    let mean_busy = busy as f64 / gaps as f64;
    Revolutions {
        gaps,
        mean_service_ms: mean / MILLIS as f64,
        per_revolution: revolution as f64 / mean,
        busy_per_revolution: revolution as f64 / mean_busy.max(1.0),
        with_switches_per_revolution: revolution as f64 * all_gaps as f64 / all_total.max(1) as f64,
    }
}

async fn describe(device: &DeviceRef) -> Result<NodeStatus, String> {
    match device.control(Control::Describe).await {
        Ok(ControlReply::Describe(node)) => Ok(node),
        Ok(_) => Err("describe: unexpected reply".into()),
        Err(e) => Err(format!("describe: {e}")),
    }
}

fn counter(node: &NodeStatus, key: &str) -> Result<u64, String> {
    node.detail
        .iter()
        .find(|(k, _)| k == key)
        .ok_or_else(|| format!("stage describe has no {key:?}"))?
        .1
        .parse()
        .map_err(|_| format!("stage describe: {key} is not a number"))
}

/// The stage's counters that Table 2 needs.
#[derive(Clone, Copy, Debug, Default)]
struct StageCounts {
    destages: u64,
    batches: u64,
    blocks: u64,
    requests: u64,
    at_home: u64,
    in_range: u64,
    in_window: u64,
    outside: u64,
}

impl StageCounts {
    fn of(node: &NodeStatus) -> Result<StageCounts, String> {
        Ok(StageCounts {
            destages: counter(node, "destages")?,
            batches: counter(node, "batches")?,
            blocks: counter(node, "destaged blocks")?,
            requests: counter(node, "destage I/Os")?,
            at_home: counter(node, "placed at home")?,
            in_range: counter(node, "placed in home range")?,
            in_window: counter(node, "placed in window")?,
            outside: counter(node, "placed outside window")?,
        })
    }
}

/// Writes `[0, bytes)` of `top` front to back in 4 MiB writes (full raid5 stripes, larger
/// than the stage's threshold: they go to the raid5 directly).
async fn fill(top: &DeviceRef, bytes: u64) -> Result<(), String> {
    let step = 4 * MIB;
    let zeros = Bytes::from(vec![0u8; step as usize]);
    let mut offset = 0;
    while offset < bytes {
        let len = step.min(bytes - offset);
        top.write(offset, zeros.slice(..len as usize), WriteFlags::default())
            .await
            .map_err(|e| format!("fill at {offset}: {e}"))?;
        offset += len;
    }
    Ok(())
}

/// Reads every one of `extents` extents of `top` in the order of `seed`, in requests of
/// `read_blocks` blocks, one at a time.
fn read_extents(
    sim: &Simulation,
    top: &DeviceRef,
    drives: &[Arc<SimDisk>],
    config: &ProximalConfig,
    extents: u64,
    seed: u64,
    label: &str,
) -> ReadRun {
    let mut ios = Vec::new();
    for e in layout::order(extents, seed) {
        let start = e * config.extent_bytes;
        let mut offset = 0;
        while offset < config.extent_bytes {
            let len = (config.read_blocks * BLOCK).min(config.extent_bytes - offset);
            ios.push(Io {
                arrival: None,
                op: Op::Read,
                offset: start + offset,
                len,
            });
            offset += len;
        }
    }
    let before: Vec<DiskStats> = drives.iter().map(|d| d.stats()).collect();
    let output = one_at_a_time(sim, top.clone(), ios);
    let stats = sum_stats(drives, &before);
    read_run(label, &output.records, stats, None)
}

fn read_run(
    label: &str,
    records: &[crate::model::IoRecord],
    stats: DiskStats,
    runs: Option<f64>,
) -> ReadRun {
    let n = records.len().max(1) as f64;
    let bytes: u64 = records.iter().map(|r| r.len).sum();
    let span = records.iter().map(|r| r.completed).max().unwrap_or(0)
        - records.iter().map(|r| r.issued).min().unwrap_or(0);
    let seconds = span as f64 / SECONDS as f64;
    let mean = records.iter().map(results::latency_ns).sum::<Nanos>() as f64 / n;
    ReadRun {
        layout: label.into(),
        requests: records.len() as u64,
        blocks_per_request: bytes as f64 / BLOCK as f64 / n,
        mean_ms: mean / MILLIS as f64,
        seconds,
        mb_per_s_per_disk: bytes as f64 / seconds.max(1e-9) / 1e6 / DATA_MEMBERS as f64,
        disk_ios_per_request: (stats.reads + stats.writes) as f64 / n,
        runs_per_request: runs,
    }
}

/// Filled extents of a stage of `size` bytes.
fn filled_extents(config: &ProximalConfig, size: u64) -> u64 {
    ((size / config.extent_bytes) as f64 * config.fill_percent / 100.0).floor() as u64
}

/// One staged run, start to end, in a fresh simulation.
pub fn run_staged(config: &ProximalConfig, setup: &StagedSetup) -> Result<StagedRun, String> {
    let slots = config.log_slots(setup.percent);
    let (sim, stack) = build(config, &setup.model, Some((slots, setup.trigger)))?;
    let top = stack.top.clone();
    let drives = drives(&stack);
    let revolution = revolution_ns(&setup.model)?;
    let extents = filled_extents(config, top.geometry().size);
    let blocks = config.extent_bytes / BLOCK;
    let name = format!(
        "{} {} {}%",
        setup.model,
        setup.trigger.label(),
        setup.percent
    );
    // The fill, recorded to find where the raid5's data starts on its members.
    for d in &drives {
        d.record_completions(true);
    }
    sim.try_block_on(fill(&top, extents * config.extent_bytes))
        .map_err(|stop| format!("{name}: fill: {stop}"))??;
    let data_start = drives
        .iter()
        .flat_map(|d| d.take_completions())
        .map(|c| c.offset)
        .min()
        .unwrap_or(0);
    let pristine = setup.reads.then(|| {
        read_extents(
            &sim,
            &top,
            &drives,
            config,
            extents,
            derive_seed(config.seed, "proximal-read-pristine"),
            "pristine",
        )
    });
    for d in &drives {
        d.take_completions();
    }
    // The updates.
    let list = layout::updates(
        extents,
        blocks,
        setup.updates_per_extent,
        derive_seed(config.seed, "proximal-updates"),
    );
    // Open loop: arrivals count from the driver's start.
    let ios: Vec<Io> = list
        .iter()
        .enumerate()
        .map(|(i, &(e, b))| Io {
            arrival: setup
                .rate_per_s
                .map(|rate| (i as f64 * SECONDS as f64 / rate) as Nanos),
            op: Op::Write,
            offset: e * config.extent_bytes + b * BLOCK,
            len: BLOCK,
        })
        .collect();
    let before: Vec<DiskStats> = drives.iter().map(|d| d.stats()).collect();
    let counts_before = StageCounts::of(&sim.block_on(describe(&top))?)?;
    let output = one_at_a_time(&sim, top.clone(), ios);
    let failed = output.records.iter().filter(|r| r.failed).count();
    // Open loop, failures are part of the result (docs/proximal-sim.md: the stage refuses
    // writes with ENOSPC after a full-log destage under an open-loop load); closed loop, none
    // is expected.
    if failed > 0 && setup.rate_per_s.is_none() {
        // The driver keeps no error: ask the stack once more for the first failed update's.
        let first = output.records.iter().find(|r| r.failed).expect("failed");
        let error = sim
            .try_block_on(top.write(
                first.offset,
                Bytes::from(vec![0u8; BLOCK as usize]),
                WriteFlags::default(),
            ))
            .map(|r| {
                r.err()
                    .map_or("no error on retry".into(), |e| e.to_string())
            })
            .unwrap_or_else(|stop| stop.to_string());
        let node = sim.block_on(describe(&top))?;
        return Err(format!(
            "{name}: {failed} updates failed ({error}); first at {} of {}; {:?}",
            output.records.iter().position(|r| r.failed).unwrap_or(0),
            output.records.len(),
            node.detail
        ));
    }
    let stats = sum_stats(&drives, &before);
    let timelines: Vec<Vec<CompletionRecord>> =
        drives.iter().map(|d| d.take_completions()).collect();
    let counts = StageCounts::of(&sim.block_on(describe(&top))?)?;
    let update_ns = output.end;
    let latencies: Vec<Nanos> = output
        .records
        .iter()
        .filter(|r| !r.failed)
        .map(results::latency_ns)
        .collect();
    // What is left in the log goes too, before the aged reads (not counted above).
    let aged = if setup.reads {
        sim.try_block_on(top.control(Control::Call {
            verb: "destage".into(),
            args: toml::Table::new(),
        }))
        .map_err(|stop| format!("{name}: destage: {stop}"))?
        .map_err(|e| format!("{name}: destage: {e}"))?;
        Some(read_extents(
            &sim,
            &top,
            &drives,
            config,
            extents,
            derive_seed(config.seed, "proximal-read-aged"),
            "aged",
        ))
    } else {
        None
    };
    for d in &drives {
        d.record_completions(false);
    }
    let batches = counts.batches - counts_before.batches;
    let destaged = counts.blocks - counts_before.blocks;
    let ios = stats.reads + stats.writes;
    let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let update_seconds = update_ns as f64 / SECONDS as f64;
    Ok(StagedRun {
        setup: setup.clone(),
        failed: failed as u64,
        log_slots: slots,
        extents,
        updates: list.len() as u64,
        destages: counts.destages - counts_before.destages,
        batches,
        destaged_blocks: destaged,
        disk_reads: stats.reads,
        disk_writes: stats.writes,
        updates_per_batch: per(destaged, batches),
        ios_per_batch: per(ios, batches),
        amplification: per(ios, destaged),
        revolutions: revolutions(
            &timelines,
            data_start,
            config.extent_bytes / DATA_MEMBERS,
            revolution,
        ),
        stage_requests_per_batch: per(counts.requests - counts_before.requests, batches),
        placed_at_home: counts.at_home - counts_before.at_home,
        placed_in_home_range: counts.in_range - counts_before.in_range,
        placed_in_window: counts.in_window - counts_before.in_window,
        placed_outside_window: counts.outside - counts_before.outside,
        update_seconds,
        updates_per_s: list.len() as f64 / update_seconds.max(1e-9),
        latency: results::summarize_latencies(&latencies),
        pristine,
        aged,
    })
}

/// The write-anywhere baseline's serial reads: the layout after the same updates (greedy hole
/// plugging, no cleaner), read through the raid5, each request's runs at once.
pub fn run_hole_plugging(config: &ProximalConfig) -> Result<ReadRun, String> {
    let (sim, stack) = build(config, &config.model, None)?;
    let top = stack.top.clone();
    let drives = drives(&stack);
    let physical = top.geometry().size / BLOCK;
    let range_blocks = config.range_bytes / BLOCK;
    // The stage's size: whole ranges of the raid5.
    let extents = filled_extents(config, physical / range_blocks * config.range_bytes);
    let blocks = config.extent_bytes / BLOCK;
    let mut layout = layout::HolePlugging::filled(extents * blocks, physical);
    for (e, b) in layout::updates(
        extents,
        blocks,
        config.updates_per_extent,
        derive_seed(config.seed, "proximal-updates"),
    ) {
        layout.write(e * blocks + b);
    }
    let before: Vec<DiskStats> = drives.iter().map(|d| d.stats()).collect();
    let order = layout::order(extents, derive_seed(config.seed, "proximal-read-aged"));
    let mut records = Vec::new();
    let mut runs_total = 0u64;
    sim.try_block_on(async {
        for e in order {
            let mut first = 0;
            while first < blocks {
                let n = config.read_blocks.min(blocks - first);
                let runs = layout.runs(e * blocks + first, n);
                runs_total += runs.len() as u64;
                let issued = sim.now();
                let reads = runs
                    .iter()
                    .map(|&(p, len)| top.read(p * BLOCK, (len * BLOCK) as usize));
                for result in join_all(reads).await {
                    result.map_err(|err| format!("hole-plugging read: {err}"))?;
                }
                records.push(crate::model::IoRecord {
                    op: Op::Read,
                    offset: (e * blocks + first) * BLOCK,
                    len: n * BLOCK,
                    issued,
                    completed: sim.now(),
                    failed: false,
                });
                first += n;
            }
        }
        Ok::<_, String>(())
    })
    .map_err(|stop| format!("hole-plugging reads: {stop}"))??;
    let stats = sum_stats(&drives, &before);
    let runs = runs_total as f64 / records.len().max(1) as f64;
    Ok(read_run("write-anywhere", &records, stats, Some(runs)))
}

/// The update-in-place baseline: `in_place_updates` random 4 KiB writes straight to the
/// raid5, one at a time.
pub fn run_in_place(config: &ProximalConfig) -> Result<InPlaceRun, String> {
    let (sim, stack) = build(config, &config.model, None)?;
    let top = stack.top.clone();
    let drives = drives(&stack);
    let revolution = revolution_ns(&config.model)?;
    let blocks = top.geometry().size / BLOCK;
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(derive_seed(
        config.seed,
        "proximal-in-place",
    ));
    let ios: Vec<Io> = (0..config.in_place_updates)
        .map(|_| Io {
            arrival: None,
            op: Op::Write,
            offset: rand::RngExt::random_range(&mut rng, 0..blocks) * BLOCK,
            len: BLOCK,
        })
        .collect();
    for d in &drives {
        d.record_completions(true);
    }
    let before: Vec<DiskStats> = drives.iter().map(|d| d.stats()).collect();
    let output = one_at_a_time(&sim, top, ios);
    let stats = sum_stats(&drives, &before);
    let timelines: Vec<Vec<CompletionRecord>> =
        drives.iter().map(|d| d.take_completions()).collect();
    let n = config.in_place_updates.max(1);
    Ok(InPlaceRun {
        updates: config.in_place_updates,
        disk_reads: stats.reads,
        disk_writes: stats.writes,
        ios_per_update: (stats.reads + stats.writes) as f64 / n as f64,
        updates_per_s: n as f64 * SECONDS as f64 / output.end.max(1) as f64,
        // One batch per drive, cut where the drive sat idle for more than a revolution.
        revolutions: revolutions(&timelines, 0, u64::MAX, revolution),
    })
}

/// The Table 2 setups: every staging size, closed loop, full trigger; Table 3's reads on one.
pub fn table2_setups(config: &ProximalConfig, model: &str) -> Vec<StagedSetup> {
    config
        .staging_percents
        .iter()
        .map(|&percent| StagedSetup {
            model: model.into(),
            percent,
            trigger: Trigger::Full,
            updates_per_extent: config.updates_per_extent,
            rate_per_s: None,
            reads: model == config.model && percent == config.table3_percent,
        })
        .collect()
}

/// The trigger comparison's setup.
pub fn trigger_setup(config: &ProximalConfig, trigger: Trigger) -> StagedSetup {
    StagedSetup {
        model: config.model.clone(),
        percent: config.trigger_percent,
        trigger,
        updates_per_extent: config.trigger_updates_per_extent,
        rate_per_s: Some(config.rate_per_s),
        reads: false,
    }
}

/// Everything, in order: Table 2 (with Table 3's reads), the quirk drive, the hole-plugging
/// baseline, update in place, the triggers (density at the full trigger's updates per batch).
pub fn run(config: &ProximalConfig) -> Result<ProximalReport, String> {
    let revolution = revolution_ns(&config.model)?;
    let table2 = table2_setups(config, &config.model)
        .iter()
        .map(|s| run_staged(config, s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut quirk = Vec::new();
    if config.quirk {
        let quirky = format!("{}-order-quirk", config.model);
        let setups = table2_setups(config, &quirky);
        let ends = [setups.first(), setups.last()];
        for (i, setup) in ends.into_iter().flatten().enumerate() {
            if i == 0 || setups.len() > 1 {
                quirk.push(run_staged(config, setup)?);
            }
        }
    }
    let hole_plugging = Some(run_hole_plugging(config)?);
    let in_place = run_in_place(config)?;
    let full = run_staged(config, &trigger_setup(config, Trigger::Full))?;
    let density = (full.updates_per_batch.round() as u64).max(1);
    let mut triggers = vec![full];
    for trigger in [Trigger::Density(density), Trigger::Watermark] {
        triggers.push(run_staged(config, &trigger_setup(config, trigger))?);
    }
    Ok(ProximalReport {
        config: config.clone(),
        revolution_ms: revolution as f64 / MILLIS as f64,
        table2,
        quirk,
        hole_plugging,
        in_place,
        triggers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(submitted: Nanos, at: Nanos, offset: u64) -> CompletionRecord {
        CompletionRecord {
            submitted,
            at,
            op: Op::Write,
            offset,
        }
    }

    #[test]
    fn revolutions_count_gaps_inside_a_batch_only() {
        let mib = MIB;
        // One drive: a batch in extent 0 (three completions 2 ms apart), then extent 1.
        let timeline = vec![
            at(0, 10 * MILLIS, 0),
            at(0, 12 * MILLIS, mib),
            at(0, 14 * MILLIS, 2 * mib),
            at(0, 30 * MILLIS, 5 * mib),
            at(0, 31 * MILLIS, 6 * mib),
        ];
        let r = revolutions(&[timeline], 0, 4 * mib, 8 * MILLIS);
        assert_eq!(r.gaps, 3, "2 in the first batch, 1 in the second");
        assert!((r.mean_service_ms - 5.0 / 3.0).abs() < 1e-9);
        assert!((r.per_revolution - 8.0 / (5.0 / 3.0)).abs() < 1e-9);
        // A drive idle for more than a revolution starts a new batch, same extent or not.
        let idle = vec![at(0, MILLIS, 0), at(20 * MILLIS, 22 * MILLIS, 4096)];
        assert_eq!(revolutions(&[idle], 0, 4 * mib, 8 * MILLIS).gaps, 0);
    }

    #[test]
    fn the_stack_is_serve_config_text() {
        let config = ProximalConfig::with_members(1, 256 * MIB);
        let slots = config.log_slots(1.0);
        assert_eq!(slots, 2621);
        let table: toml::Table =
            stack_text(&config, "wd-re3-1t", Some((slots, Trigger::Density(40))))
                .parse()
                .unwrap();
        let spec = StackSpec::from_toml(&table).unwrap();
        assert_eq!(spec.disks.len(), 7);
        let stage = spec.layers.iter().find(|l| l.kind == "stage").unwrap();
        assert_eq!(stage.children, ["flash", "r5"]);
        assert_eq!(
            stage.options["density"],
            strata_core::layer::OptionValue::Integer(40)
        );
        let plain: toml::Table = stack_text(&config, "wd-re3-1t", None).parse().unwrap();
        assert!(StackSpec::from_toml(&plain)
            .unwrap()
            .layers
            .iter()
            .all(|l| l.kind != "stage"));
    }
}
