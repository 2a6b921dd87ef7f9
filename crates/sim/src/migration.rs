//! User-centric data migration (Kang & Reddy; digest `shared/papers/user-centric-migration.md`)
//! in virtual time, on Strata's `migrate` layer itself (`strata sim migration`,
//! docs/migration-sim.md).
//!
//! Each load point is a fresh simulation from the seed: N simulated 10,000 RPM drives
//! (`fc-10k-146g`, the only 10K preset: the paper's disks are 10,000 RPM Seagate SCSI), a
//! slice of `partition_bytes` at the start of each (the paper's 16 GB partitions), drive 0
//! local and the others behind a Table 1 network link (`link = "rtt-9ms"` …), and a `migrate`
//! layer over the slices, all written as `[[layer]]` text and built through the layer
//! registry as `strata serve` builds it. Two users sharing bricks ([`run_shared`]) need one
//! drive reached locally by one user and over the network by the other; the disk option puts
//! a whole drive behind a link, so there the link is [`link::Linked`], a simulator-side
//! wrapper that sends each request over a [`crate::net::Link`] of the same Table 1 row.
//!
//! A point writes the data set (the creation phase), then runs the synthetic SFS-like mix
//! ([`sfs`]) open loop at its rate for `warmup + measure` seconds; response time and
//! delivered throughput are taken over the measurement window, and the layer's counters
//! (`strata status`'s) are sampled every `sample_s` seconds for the migration timeline.

pub mod link;
mod report;
pub mod sfs;

use std::path::Path;
use std::pin::pin;

use futures_util::future::{select, Either};
use strata_core::{Control, ControlReply, DeviceRef, NodeStatus};

pub use report::{format_report, write_plots, PAPER_FIG4};

use std::sync::Arc;

use crate::disk::{DataMode, SimDisk};
use crate::driver::{self, DriverConfig};
use crate::executor::{derive_seed, SimConfig, SimRuntime, Simulation};
use crate::model::{Io, IoRecord, Nanos, Workload, MILLIS, SECONDS};
use crate::results;
use crate::stack::{Stack, StackSpec};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The drive: 10,000 RPM as the paper's (the only 10K preset).
pub const MODEL: &str = "fc-10k-146g";

/// First-write placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Allocation {
    Str,
    Seq,
}

/// Migration policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Policy {
    Mig,
    NoMig,
    Locality,
}

impl Allocation {
    fn option(self) -> &'static str {
        match self {
            Allocation::Str => "str",
            Allocation::Seq => "seq",
        }
    }
}

impl Policy {
    fn option(self) -> &'static str {
        match self {
            Policy::Mig => "mig",
            Policy::NoMig => "nomig",
            Policy::Locality => "locality",
        }
    }
}

/// The paper's configuration names: STR-MIG, SEQ-NOMIG, STR-LOCALITY …
pub fn config_name(allocation: Allocation, policy: Policy) -> String {
    format!(
        "{}-{}",
        allocation.option().to_uppercase(),
        policy.option().to_uppercase()
    )
}

/// What the whole reproduction runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MigrationConfig {
    pub seed: u64,
    pub model: String,
    /// Disks of the single-user runs: 1 local + (disks − 1) remote.
    pub disks: usize,
    /// Each disk's partition (a slice at its start).
    pub partition_bytes: u64,
    /// The data set written in the creation phase.
    pub data_bytes: u64,
    /// Zipf skew of the workload's addresses.
    pub theta: f64,
    pub warmup_s: f64,
    pub measure_s: f64,
    /// Offered loads of a sweep, operations per second, ascending.
    pub loads: Vec<f64>,
    /// A sweep stops after the first point whose mean response time passes this many times
    /// `bound_ms` (the rest would only be deeper in overload).
    pub stop_factor: f64,
    /// Saturation: the delivered throughput where mean response time crosses this.
    pub bound_ms: f64,
    pub rtts: Vec<u32>,
    pub tokens: u64,
    /// The layer's `candidate-probability`. The reproduction sets it to 1 (every accessed
    /// chunk enters the candidate list, which stays a 4096-chunk LRU): the paper's Fig. 3 shows
    /// its base-load migration bound by tokens (4 tokens/s 13.6 % better than 1), and with
    /// the layer's default of 0.05 ours is bound by admissions instead (0.9 %); 1 gives
    /// 13.8 %. None: the layer's default.
    pub candidate_probability: Option<f64>,
    /// The layer's `delta` option (None: its default, `"adaptive"`).
    pub delta: Option<String>,
    /// Client processes of the workload, each with one operation in flight (SFS's load
    /// generators); None: open loop without a ceiling.
    pub processes: Option<usize>,
    /// More lines of the migrate layer's table (`key = value`), for sensitivity runs.
    pub layer_options: Vec<String>,
    /// Counters sampled this often (virtual seconds).
    pub sample_s: f64,
    /// The convergence runs: loads and length.
    pub converge_loads: Vec<f64>,
    pub converge_s: f64,
    /// Experiments to run (all by default).
    pub parts: Vec<Part>,
}

/// The experiments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
pub enum Part {
    /// Fig. 4: STR-MIG vs STR-NOMIG at every RTT.
    Str,
    /// Fig. 5: SEQ-MIG vs SEQ-NOMIG at every RTT.
    Seq,
    /// Fig. 3: 1 vs 4 tokens.
    Tokens,
    /// Fig. 6: locality-only vs user-centric.
    Locality,
    /// Fig. 7/9: two users sharing bricks.
    Shared,
    /// Migration stops after loads equalise.
    Converge,
}

pub const ALL_PARTS: [Part; 6] = [
    Part::Str,
    Part::Seq,
    Part::Tokens,
    Part::Locality,
    Part::Shared,
    Part::Converge,
];

impl MigrationConfig {
    /// The full reproduction.
    pub fn full(seed: u64) -> MigrationConfig {
        MigrationConfig {
            seed,
            model: MODEL.into(),
            disks: 2,
            partition_bytes: 16 * GIB,
            // SFS97 scales its file set at about 10 MB per requested op/s: 4 GiB is its set
            // at about 400 ops/s, the middle of the sweep.
            data_bytes: 4 * GIB,
            theta: 1.0,
            warmup_s: 300.0,
            measure_s: 300.0,
            loads: vec![
                25.0, 50.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0, 400.0, 450.0, 500.0, 550.0,
                600.0, 650.0, 700.0, 750.0, 800.0, 900.0, 1000.0, 1100.0, 1200.0,
            ],
            stop_factor: 2.0,
            bound_ms: 50.0,
            rtts: vec![9, 17, 25],
            tokens: 4,
            candidate_probability: Some(1.0),
            delta: None,
            layer_options: Vec::new(),
            processes: None,
            sample_s: 10.0,
            converge_loads: vec![100.0, 450.0],
            converge_s: 1800.0,
            parts: ALL_PARTS.to_vec(),
        }
    }

    /// Seconds, not minutes: a small data set, short windows, two loads, one RTT.
    pub fn quick(seed: u64) -> MigrationConfig {
        MigrationConfig {
            partition_bytes: GIB,
            data_bytes: 64 * MIB,
            warmup_s: 30.0,
            measure_s: 30.0,
            loads: vec![40.0, 120.0],
            rtts: vec![9],
            sample_s: 5.0,
            converge_loads: vec![60.0],
            converge_s: 120.0,
            ..MigrationConfig::full(seed)
        }
    }
}

/// One load point's setup.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PointSetup {
    pub allocation: Allocation,
    pub policy: Policy,
    pub rtt_ms: u32,
    pub tokens: u64,
    pub load: f64,
}

/// The layer's counters at one moment (parsed from its status).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Counters {
    pub migrations: u64,
    /// Per child: migrations toward it.
    pub moved_to: Vec<u64>,
    /// Per child: requests the layer sent it.
    pub requests: Vec<u64>,
    /// Per child: smoothed response time, ms.
    pub response_ms: Vec<f64>,
    /// δ between the slowest and the fastest child now, ms.
    pub delta_ms: f64,
    pub merges: u64,
    pub dropped_by_race: u64,
    pub no_token: u64,
    pub not_candidate: u64,
}

impl Counters {
    fn since(&self, before: &Counters) -> Counters {
        let minus = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(x, y)| x - y).collect();
        Counters {
            migrations: self.migrations - before.migrations,
            moved_to: minus(&self.moved_to, &before.moved_to),
            requests: minus(&self.requests, &before.requests),
            response_ms: self.response_ms.clone(),
            delta_ms: self.delta_ms,
            merges: self.merges - before.merges,
            dropped_by_race: self.dropped_by_race - before.dropped_by_race,
            no_token: self.no_token - before.no_token,
            not_candidate: self.not_candidate - before.not_candidate,
        }
    }
}

/// Migrations in one sampling interval, by direction.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Interval {
    /// End of the interval, virtual seconds from the transaction phase's start.
    pub at_s: f64,
    /// Toward child 0 (the local disk).
    pub to_local: u64,
    /// Toward any other child.
    pub to_remote: u64,
    /// Response times of the children at the end of the interval, ms.
    pub response_ms: Vec<f64>,
    pub delta_ms: f64,
}

/// What one load point measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Point {
    pub setup: PointSetup,
    /// Operations per second arriving in the measurement window.
    pub offered: f64,
    /// Operations per second completed in the measurement window.
    pub delivered: f64,
    /// Response time of the operations that arrived in the window, ms.
    pub mean_ms: f64,
    pub p95_ms: f64,
    pub operations: u64,
    /// Operations of the whole transaction phase that failed (expected: none).
    pub failed: u64,
    /// The layer's counters over the transaction phase (warm-up and window).
    pub counters: Counters,
    /// Last migration, seconds from the transaction phase's start (None: none).
    pub last_migration_s: Option<f64>,
    pub timeline: Vec<Interval>,
    /// Per simulated drive over the transaction phase: I/Os and utilization (busy time over
    /// the phase). Empty for a shared point's users (the drives are in [`link::SharedPoint`]).
    pub disk_ios: Vec<u64>,
    pub disk_util: Vec<f64>,
}

fn stack_text(config: &MigrationConfig, setup: &PointSetup) -> String {
    let mut text = String::new();
    for i in 0..config.disks {
        text.push_str(&format!(
            "[[disk]]\nname = \"d{i}\"\nmodel = \"{}\"\n",
            config.model
        ));
        if i > 0 {
            text.push_str(&format!("link = \"rtt-{}ms\"\n", setup.rtt_ms));
        }
        text.push('\n');
    }
    for i in 0..config.disks {
        text.push_str(&format!(
            "[[layer]]\nname = \"p{i}\"\nkind = \"slice\"\nchildren = [\"d{i}\"]\nlength = {}\n\n",
            config.partition_bytes
        ));
    }
    let children: Vec<String> = (0..config.disks).map(|i| format!("\"p{i}\"")).collect();
    text.push_str(&migrate_layer(
        config,
        "mig",
        &children.join(", "),
        setup,
        derive_seed(config.seed, "migrate-policy"),
    ));
    text
}

fn migrate_layer(
    config: &MigrationConfig,
    name: &str,
    children: &str,
    setup: &PointSetup,
    seed: u64,
) -> String {
    let delta = config
        .delta
        .as_ref()
        .map_or(String::new(), |d| format!("delta = \"{d}\"\n"));
    let candidates = config.candidate_probability.map_or(String::new(), |p| {
        format!("candidate-probability = {p:?}\n")
    });
    let extra: String = config
        .layer_options
        .iter()
        .map(|line| format!("{line}\n"))
        .collect();
    format!(
        "[[layer]]\nname = \"{name}\"\nkind = \"migrate\"\nchildren = [{children}]\nallocation = \"{}\"\npolicy = \"{}\"\ntokens = {}\nseed = {}\n{candidates}{delta}{extra}\n",
        setup.allocation.option(),
        setup.policy.option(),
        setup.tokens,
        seed % (1 << 62)
    )
}

fn build(config: &MigrationConfig, setup: &PointSetup) -> Result<(Simulation, Stack), String> {
    let table: toml::Table = stack_text(config, setup)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let spec = StackSpec::from_toml(&table)?;
    // The same seed for every point: every policy sees the same drives and the same links.
    let sim = Simulation::with_config(SimConfig::new(config.seed));
    let stack = spec.build(
        &sim,
        &crate::models::build,
        DataMode::TimingOnly,
        Path::new("."),
    )?;
    Ok((sim, stack))
}

/// A workload of I/Os given in advance.
struct Listed(std::vec::IntoIter<Io>);

impl Workload for Listed {
    fn next_io(&mut self) -> Option<Io> {
        self.0.next()
    }
}

fn quiet(processes: Option<usize>) -> DriverConfig {
    DriverConfig {
        queue_depth: 4,
        sample_interval: None,
        verify_data: false,
        outstanding_limit: processes,
    }
}

async fn describe(device: &DeviceRef) -> Result<NodeStatus, String> {
    match device.control(Control::Describe).await {
        Ok(ControlReply::Describe(node)) => Ok(node),
        Ok(_) => Err("describe: unexpected reply".into()),
        Err(e) => Err(format!("describe: {e}")),
    }
}

fn detail<'a>(node: &'a NodeStatus, key: &str) -> Result<&'a str, String> {
    node.detail
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| format!("migrate status has no {key:?}"))
}

fn number(node: &NodeStatus, key: &str) -> Result<u64, String> {
    detail(node, key)?
        .parse()
        .map_err(|_| format!("migrate status: {key} is not a number"))
}

/// "12.34 ms ± 1.00 ms (5 samples)" or "adaptive, now 4.60 ms": the first figure before " ms".
fn leading_ms(text: &str) -> Result<f64, String> {
    let before = text
        .split(" ms")
        .next()
        .ok_or_else(|| format!("no ms in {text:?}"))?;
    before
        .rsplit(' ')
        .next()
        .unwrap_or(before)
        .parse()
        .map_err(|_| format!("no figure in {text:?}"))
}

/// The counters of the migrate layer's status (`strata status`).
pub fn counters_of(node: &NodeStatus, children: usize) -> Result<Counters, String> {
    let mut c = Counters {
        migrations: number(node, "migrations")?,
        delta_ms: leading_ms(detail(node, "delta")?)?,
        merges: number(node, "merges")?,
        dropped_by_race: number(node, "migrations dropped by a race")?,
        no_token: number(node, "skipped no token")?,
        not_candidate: number(node, "skipped not candidate")?,
        ..Counters::default()
    };
    for i in 0..children {
        c.moved_to
            .push(number(node, &format!("migrations to child {i}"))?);
        c.requests
            .push(number(node, &format!("child {i} requests"))?);
        c.response_ms
            .push(leading_ms(detail(node, &format!("child {i} response"))?)?);
    }
    Ok(c)
}

async fn sample_counters(
    clock: SimRuntime,
    layers: Vec<(DeviceRef, usize)>,
    interval: Nanos,
    out: &mut [Vec<(Nanos, Counters)>],
) -> Result<(), String> {
    let start = clock.now_nanos();
    let mut next = start;
    loop {
        for (i, (layer, children)) in layers.iter().enumerate() {
            let node = describe(layer).await?;
            out[i].push((next - start, counters_of(&node, *children)?));
        }
        next += interval;
        clock.sleep_until(next).await;
    }
}

/// Runs `workload` on `tops` (one per user, `workload[i]` on `tops[i]`) while sampling each
/// user's migrate layer; returns each user's records and samples.
#[allow(clippy::type_complexity)]
fn run_phase(
    sim: &Simulation,
    users: &[(DeviceRef, usize)],
    workloads: Vec<Box<dyn Workload>>,
    interval: Nanos,
    disks: &[Arc<SimDisk>],
    processes: Option<usize>,
) -> Result<
    (
        Vec<(Vec<IoRecord>, Vec<(Nanos, Counters)>)>,
        Vec<u64>,
        Vec<f64>,
    ),
    String,
> {
    let clock = sim.handle();
    let mut samples: Vec<Vec<(Nanos, Counters)>> = vec![Vec::new(); users.len()];
    let outputs = sim.block_on(async {
        let drives =
            futures_util::future::join_all(users.iter().zip(workloads).enumerate().map(
                |(i, ((top, _), mut workload))| {
                    let clock = clock.clone();
                    let top = top.clone();
                    // The first user's driver reports the drives.
                    let disks = if i == 0 { disks } else { &[] };
                    async move {
                        driver::drive(clock, top, &mut workload, disks, &quiet(processes)).await
                    }
                },
            ));
        let sampler = sample_counters(clock.clone(), users.to_vec(), interval, &mut samples);
        match select(pin!(drives), pin!(sampler)).await {
            Either::Left((outputs, _)) => Ok(outputs),
            Either::Right((result, _)) => {
                Err(result.err().unwrap_or_else(|| "the sampler stopped".into()))
            }
        }
    })?;
    // The state at the end.
    for (i, (layer, children)) in users.iter().enumerate() {
        let node = sim.block_on(describe(layer))?;
        let at = outputs[i].end;
        samples[i].push((at, counters_of(&node, *children)?));
    }
    let end = outputs.iter().map(|o| o.end).max().unwrap_or(0);
    let (ios, util) = disk_load(&outputs[0].disks, end);
    Ok((
        outputs
            .into_iter()
            .zip(samples)
            .map(|(o, s)| (o.records, s))
            .collect(),
        ios,
        util,
    ))
}

/// The measurement of one user's records and samples.
fn measure(
    config: &MigrationConfig,
    setup: PointSetup,
    records: &[IoRecord],
    samples: &[(Nanos, Counters)],
) -> Point {
    let from = (config.warmup_s * SECONDS as f64) as Nanos;
    let to = from + (config.measure_s * SECONDS as f64) as Nanos;
    let mut latencies: Vec<Nanos> = records
        .iter()
        .filter(|r| r.issued >= from && r.issued < to && !r.failed)
        .map(results::latency_ns)
        .collect();
    latencies.sort_unstable();
    let completed = records
        .iter()
        .filter(|r| r.completed >= from && r.completed < to)
        .count();
    let window = config.measure_s.max(1e-9);
    let mean = latencies.iter().sum::<Nanos>() as f64 / latencies.len().max(1) as f64;
    let first = &samples.first().expect("a sample at the start").1;
    let last = &samples.last().expect("a sample at the end").1;
    let mut timeline = Vec::new();
    let mut last_migration_s = None;
    for pair in samples.windows(2) {
        let (at, now) = (&pair[1].0, &pair[1].1);
        let step = now.since(&pair[0].1);
        let to_local = step.moved_to.first().copied().unwrap_or(0);
        let to_remote = step.moved_to.iter().skip(1).sum();
        if step.migrations > 0 {
            last_migration_s = Some(*at as f64 / SECONDS as f64);
        }
        timeline.push(Interval {
            at_s: *at as f64 / SECONDS as f64,
            to_local,
            to_remote,
            response_ms: now.response_ms.clone(),
            delta_ms: now.delta_ms,
        });
    }
    Point {
        setup,
        offered: latencies.len() as f64 / window,
        delivered: completed as f64 / window,
        mean_ms: mean / MILLIS as f64,
        p95_ms: results::percentile(&latencies, 95.0) as f64 / MILLIS as f64,
        operations: latencies.len() as u64,
        failed: records.iter().filter(|r| r.failed).count() as u64,
        counters: last.since(first),
        last_migration_s,
        timeline,
        disk_ios: Vec::new(),
        disk_util: Vec::new(),
    }
}

/// Per drive: (I/Os, utilization) of a run's disk reports.
fn disk_load(disks: &[driver::DiskReport], end: Nanos) -> (Vec<u64>, Vec<f64>) {
    disks
        .iter()
        .map(|d| {
            (
                d.stats.reads + d.stats.writes,
                d.stats.busy_time as f64 / end.max(1) as f64,
            )
        })
        .unzip()
}

/// One load point of one user, from a fresh simulation.
pub fn run_point(config: &MigrationConfig, setup: &PointSetup) -> Result<Point, String> {
    run_point_for(config, setup, config.warmup_s + config.measure_s)
}

fn run_point_for(
    config: &MigrationConfig,
    setup: &PointSetup,
    seconds: f64,
) -> Result<Point, String> {
    let (sim, stack) = build(config, setup)?;
    let top = stack.top.clone();
    driver::run(
        &sim,
        top.clone(),
        &mut Listed(sfs::creation(config.data_bytes).into_iter()),
        &[],
        &quiet(None),
    );
    // The workload's seed depends on the load only: every policy sees the same operations.
    let workload = sfs::SfsLike::new(
        config.data_bytes,
        config.theta,
        setup.load,
        (seconds * SECONDS as f64) as Nanos,
        derive_seed(config.seed, &format!("sfs-{}", setup.load)),
    )?;
    let interval = (config.sample_s * SECONDS as f64) as Nanos;
    let (mut out, disk_ios, disk_util) = run_phase(
        &sim,
        &[(top, config.disks)],
        vec![Box::new(workload)],
        interval,
        &stack.disks,
        config.processes,
    )?;
    let (records, samples) = out.remove(0);
    Ok(Point {
        disk_ios,
        disk_util,
        ..measure(config, *setup, &records, &samples)
    })
}

/// A sweep over `config.loads`, stopping past saturation.
pub fn sweep(
    config: &MigrationConfig,
    allocation: Allocation,
    policy: Policy,
    rtt_ms: u32,
    tokens: u64,
) -> Result<Curve, String> {
    let mut points = Vec::new();
    for &load in &config.loads {
        let point = run_point(
            config,
            &PointSetup {
                allocation,
                policy,
                rtt_ms,
                tokens,
                load,
            },
        )?;
        let over = point.mean_ms > config.stop_factor * config.bound_ms;
        points.push(point);
        if over {
            break;
        }
    }
    Ok(Curve {
        name: config_name(allocation, policy),
        allocation,
        policy,
        rtt_ms,
        tokens,
        points,
    })
}

/// A response-time/throughput curve.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Curve {
    pub name: String,
    pub allocation: Allocation,
    pub policy: Policy,
    pub rtt_ms: u32,
    pub tokens: u64,
    pub points: Vec<Point>,
}

impl Curve {
    /// Base response time: the mean response time at the lowest load point.
    pub fn base_ms(&self) -> f64 {
        self.points.first().map_or(f64::NAN, |p| p.mean_ms)
    }

    /// Saturation throughput: the delivered throughput where the mean response time crosses
    /// `bound_ms`, interpolated linearly between the last point under it and the first over
    /// it; `None` if no point crosses it (the sweep did not reach saturation) or the first
    /// point is already over it.
    pub fn saturation(&self, bound_ms: f64) -> Option<f64> {
        saturation(
            &self
                .points
                .iter()
                .map(|p| (p.delivered, p.mean_ms))
                .collect::<Vec<_>>(),
            bound_ms,
        )
    }

    /// The highest delivered throughput of the sweep.
    pub fn max_delivered(&self) -> f64 {
        self.points.iter().map(|p| p.delivered).fold(0.0, f64::max)
    }

    pub fn migrations(&self) -> u64 {
        self.points.iter().map(|p| p.counters.migrations).sum()
    }
}

/// See [`Curve::saturation`]; `points` are (delivered ops/s, mean ms) by ascending load.
pub fn saturation(points: &[(f64, f64)], bound_ms: f64) -> Option<f64> {
    let over = points.iter().position(|p| p.1 > bound_ms)?;
    if over == 0 {
        return None;
    }
    let (x0, y0) = points[over - 1];
    let (x1, y1) = points[over];
    Some(x0 + (x1 - x0) * (bound_ms - y0) / (y1 - y0))
}

/// Everything `strata sim migration` measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MigrationReport {
    pub config: MigrationConfig,
    /// Fig. 4: per RTT, (STR-MIG, STR-NOMIG).
    pub striping: Vec<(Curve, Curve)>,
    /// Fig. 5: per RTT, (SEQ-MIG, SEQ-NOMIG).
    pub sequential: Vec<(Curve, Curve)>,
    /// Fig. 3: STR-MIG at the first RTT with 1 and 4 tokens.
    pub tokens: Vec<Curve>,
    /// Fig. 6: STR-LOCALITY and SEQ-LOCALITY at the first RTT (the MIG curves are above).
    pub locality: Vec<Curve>,
    pub shared: Option<link::SharedReport>,
    /// STR-MIG at the first RTT, one long run per convergence load.
    pub converge: Vec<Point>,
}

/// Everything the config's parts ask for, in order.
pub fn run(config: &MigrationConfig) -> Result<MigrationReport, String> {
    let wants = |part| config.parts.contains(&part);
    let first_rtt = *config.rtts.first().ok_or("no RTT")?;
    let pair = |allocation| -> Result<Vec<(Curve, Curve)>, String> {
        config
            .rtts
            .iter()
            .map(|&rtt| {
                Ok((
                    sweep(config, allocation, Policy::Mig, rtt, config.tokens)?,
                    sweep(config, allocation, Policy::NoMig, rtt, config.tokens)?,
                ))
            })
            .collect()
    };
    let striping = if wants(Part::Str) {
        pair(Allocation::Str)?
    } else {
        Vec::new()
    };
    let sequential = if wants(Part::Seq) {
        pair(Allocation::Seq)?
    } else {
        Vec::new()
    };
    let mut tokens = Vec::new();
    if wants(Part::Tokens) {
        for n in [1, 4] {
            tokens.push(sweep(config, Allocation::Str, Policy::Mig, first_rtt, n)?);
        }
    }
    let mut locality = Vec::new();
    if wants(Part::Locality) {
        for allocation in [Allocation::Str, Allocation::Seq] {
            locality.push(sweep(
                config,
                allocation,
                Policy::Locality,
                first_rtt,
                config.tokens,
            )?);
        }
    }
    let shared = if wants(Part::Shared) {
        Some(link::run_shared(config, first_rtt)?)
    } else {
        None
    };
    let mut converge = Vec::new();
    if wants(Part::Converge) {
        for &load in &config.converge_loads {
            converge.push(run_point_for(
                config,
                &PointSetup {
                    allocation: Allocation::Str,
                    policy: Policy::Mig,
                    rtt_ms: first_rtt,
                    tokens: config.tokens,
                    load,
                },
                config.converge_s,
            )?);
        }
    }
    Ok(MigrationReport {
        config: config.clone(),
        striping,
        sequential,
        tokens,
        locality,
        shared,
        converge,
    })
}

impl MigrationReport {
    /// Failed operations in every run of the report.
    pub fn failed(&self) -> u64 {
        let curves = self
            .striping
            .iter()
            .chain(&self.sequential)
            .flat_map(|(m, n)| [m, n])
            .chain(&self.tokens)
            .chain(&self.locality);
        let single: u64 = curves.flat_map(|c| &c.points).map(|p| p.failed).sum();
        let shared: u64 = self
            .shared
            .iter()
            .flat_map(|s| &s.curves)
            .flat_map(|(m, n)| [m, n])
            .flat_map(|c| &c.points)
            .flat_map(|p| &p.users)
            .map(|p| p.failed)
            .sum();
        single + shared + self.converge.iter().map(|p| p.failed).sum::<u64>()
    }
}

/// Child 0's share of the layer's requests.
pub fn local_share(counters: &Counters) -> f64 {
    let total: u64 = counters.requests.iter().sum();
    counters.requests.first().copied().unwrap_or(0) as f64 / total.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(seed: u64) -> MigrationConfig {
        MigrationConfig {
            partition_bytes: 512 * MIB,
            data_bytes: 32 * MIB,
            warmup_s: 20.0,
            measure_s: 20.0,
            loads: vec![40.0],
            ..MigrationConfig::quick(seed)
        }
    }

    fn setup(allocation: Allocation, policy: Policy, load: f64) -> PointSetup {
        PointSetup {
            allocation,
            policy,
            rtt_ms: 9,
            tokens: 4,
            load,
        }
    }

    #[test]
    fn saturation_interpolates_where_the_curve_crosses_the_bound() {
        let points = [(50.0, 10.0), (100.0, 20.0), (140.0, 60.0), (150.0, 200.0)];
        let s = saturation(&points, 50.0).unwrap();
        assert!((s - 130.0).abs() < 1e-9, "{s}");
        assert_eq!(saturation(&points[..2], 50.0), None, "never crossed");
        assert_eq!(saturation(&[(10.0, 80.0)], 50.0), None, "over at once");
    }

    #[test]
    fn the_stack_is_serve_config_text() {
        let config = tiny(1);
        let text = stack_text(&config, &setup(Allocation::Seq, Policy::Locality, 10.0));
        let table: toml::Table = text.parse().unwrap();
        let spec = StackSpec::from_toml(&table).unwrap();
        assert_eq!(spec.disks.len(), 2);
        assert!(spec.disks[0].options.get("link").is_none());
        assert_eq!(
            spec.disks[1].options["link"],
            toml::Value::String("rtt-9ms".into())
        );
        let mig = spec.layers.iter().find(|l| l.kind == "migrate").unwrap();
        assert_eq!(mig.children, ["p0", "p1"]);
        assert_eq!(
            mig.options["policy"],
            strata_core::layer::OptionValue::Text("locality".into())
        );
        // The reproduction's one setting off the layer's defaults.
        assert_eq!(
            mig.options["candidate-probability"],
            strata_core::layer::OptionValue::Float(1.0)
        );
    }

    #[test]
    fn a_short_str_mig_run_migrates_and_nomig_never_does() {
        let config = tiny(3);
        let mig = run_point(&config, &setup(Allocation::Str, Policy::Mig, 40.0)).unwrap();
        assert!(
            mig.counters.migrations > 0,
            "STR-MIG migrated nothing: {:?}",
            mig.counters
        );
        // At low load the local disk answers faster: data moves toward it.
        assert!(mig.counters.moved_to[0] > mig.counters.moved_to[1]);
        let nomig = run_point(&config, &setup(Allocation::Str, Policy::NoMig, 40.0)).unwrap();
        assert_eq!(nomig.counters.migrations, 0);
        assert_eq!(nomig.last_migration_s, None);
        assert!(nomig.timeline.iter().all(|i| i.to_local + i.to_remote == 0));
        // Same operations, so the same offered load.
        assert_eq!(mig.operations, nomig.operations);
        assert!(mig.operations > 0);
    }

    #[test]
    fn the_same_seed_gives_the_same_table() {
        let config = MigrationConfig {
            parts: vec![Part::Str],
            ..tiny(5)
        };
        let a = format_report(&run(&config).unwrap());
        let b = format_report(&run(&config).unwrap());
        assert_eq!(a, b);
        let c = format_report(&run(&MigrationConfig { seed: 6, ..config }).unwrap());
        assert_ne!(a, c);
    }

    #[test]
    fn the_quick_reproduction_prints_every_table_and_draws_every_plot() {
        let config = MigrationConfig {
            loads: vec![40.0],
            warmup_s: 15.0,
            measure_s: 15.0,
            converge_s: 40.0,
            ..MigrationConfig::quick(2)
        };
        let report = run(&config).unwrap();
        let text = format_report(&report);
        for heading in [
            "Fig. 4",
            "Fig. 5",
            "Fig. 3",
            "Fig. 6",
            "3 users, striping, 3:2:1",
            "2 users, sequential, 4:1",
            "Convergence",
        ] {
            assert!(text.contains(heading), "{heading} missing:\n{text}");
        }
        let shared = report.shared.as_ref().unwrap();
        assert_eq!(shared.curves.len(), 2);
        let (mig, nomig) = &shared.curves[0];
        assert_eq!(mig.points[0].users.len(), 3);
        // 3:2:1: user A offers three times C's load.
        let offered: Vec<f64> = nomig.points[0].users.iter().map(|p| p.offered).collect();
        assert!(offered[0] > 2.0 * offered[2], "{offered:?}");
        // Every user's data is on every drive under striping, none migrates without MIG.
        assert!(nomig.points[0]
            .disk_requests
            .iter()
            .all(|by_user| by_user.iter().all(|&r| r > 0)));
        assert!(nomig.points[0]
            .users
            .iter()
            .all(|p| p.counters.migrations == 0));
        assert_eq!(report.failed(), 0);
        assert!(text.contains("failed operations in all runs: 0"));
        let dir = tempfile::tempdir().unwrap();
        let written = write_plots(&report, dir.path()).unwrap();
        let svgs: Vec<_> = written
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "svg"))
            .collect();
        assert_eq!(svgs.len(), 8, "{written:?}");
        for svg in svgs {
            let text = std::fs::read_to_string(svg).unwrap();
            roxmltree::Document::parse(&text).unwrap();
        }
    }

    #[test]
    fn status_figures_are_parsed() {
        assert_eq!(leading_ms("12.34 ms ± 1.00 ms (5 samples)"), Ok(12.34));
        assert_eq!(leading_ms("adaptive, now 4.60 ms"), Ok(4.6));
        assert_eq!(leading_ms("fixed 0.00 ms"), Ok(0.0));
        assert!(leading_ms("soon").is_err());
    }
}
