//! The ALV paper's evaluation (Zhang, Zheng, Shu, IEEE TC 2009, §5; digest
//! `shared/papers/alv-raid5-scaling.md` §5, §9) in virtual time, on Strata's raid5 grow
//! engine itself (`strata sim alv`, docs/raid5-grow-sim.md).
//!
//! Each run is a fresh simulation from the seed: an m-member raid5 over `slice`s of
//! simulated 10K FC drives (the paper's 30 GB partitions of ST3146807FC disks), written as
//! `[[layer]]` text and built through the layer registry as `strata serve` builds it; one
//! more drive of the same model, not in the stack, is created and handed to the raid5 node
//! with `Control::GrowMembers` (policy "alv" or "md", the rate control's knobs as grow
//! options), the verb `strata raid5 grow` sends. The grow runs in the raid5 layer's
//! background on the simulated runtime while a workload (`load`) replays against the array,
//! open loop, until the grow ends. The array's `Control::Describe` gives the grow's
//! counters ("last grow …" once it is over); the simulated drives count every I/O.
//!
//! Measured per run: the redistribution time (from the grow request to the array taking
//! its new size), the response time of every user request that arrived during it (mean,
//! p99, and equal-size sequence averages over time, the paper's Figs. 10-13), the mover's
//! reads, writes and metadata writes, and what went through each drive. `--scale N`
//! divides the members by N (the workloads' rates stay: the drives are as busy with user
//! I/O as at full size, and the grow takes about 1/N of the time).

mod load;
mod report;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join;
use strata_core::{Control, ControlReply, DeviceRef, Member, NodeStatus};

pub use load::{Load, SyntheticParams};
pub use report::{format_report, write_plots, PAPER};

use crate::disk::{DataMode, DiskStats};
use crate::driver::{self, DriverConfig};
use crate::executor::{SimConfig, SimRuntime, Simulation};
use crate::model::{IoRecord, Nanos, Workload, MILLIS, SECONDS};
use crate::results::{self, LatencySummary};
use crate::stack::{DiskSpec, Stack, StackSpec};
use crate::workload::TraceRecord;

const KIB: u64 = 1 << 10;
const GIB: u64 = 1 << 30;

/// How often the watcher looks whether the grow is over (the redistribution time's
/// resolution), and how often it samples the mover's state.
const POLL: Nanos = 10 * MILLIS;
const SAMPLE: Nanos = SECONDS;

/// Which policy moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Alv,
    Md,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Alv => "alv",
            Policy::Md => "md",
        }
    }
}

/// The rate control's knobs for a grow (grow options; `None`: the engine's default, which
/// is the paper's baseline: B = 15 ms, θ = 0.1, md 1,000-200,000 KiB/s).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Knobs {
    pub bound_ms: Option<f64>,
    pub slack: Option<f64>,
    /// ALV's aggregation buffer per member, busy and quiet alike (default: the engine's,
    /// 2 MiB while users are about and 8 MiB while they are quiet).
    pub buffer_kib: Option<u64>,
    pub speed_min_kibps: Option<u64>,
    pub speed_max_kibps: Option<u64>,
    /// md's stripe cache in entries of 4 KiB per member (default 512: 2 MiB).
    pub stripe_cache: Option<u64>,
}

/// One grow to run: A(m, n) at a chunk size, a policy and its knobs, under a load, with
/// the stripe journal where it says.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Setup {
    pub m: usize,
    pub n: usize,
    pub chunk_bytes: u64,
    pub load: Load,
    pub policy: Policy,
    pub knobs: Knobs,
    pub journal: Journal,
}

/// md's speed limits in the paper's runs (§4; KiB/s per member, as md's sysfs takes them):
/// TPC-C max 200 MB/s (md's default: not a limit on these drives), Cello-99 max 10, SPC-Web
/// max 7, all with min 1. The paper's md ran at its maximum under load (digest §5.2: 7.08
/// MiB/s per device under SPC-Web, 10.15 under Cello-99, 6.36 disk-bound under TPC-C), but
/// the engine's funnel, like md's `is_mddev_idle` as the engine models it (more than 32
/// sectors of user I/O since the last look is "busy"), holds md at its minimum whenever
/// users do I/O. So that md moves as the paper's did, its minimum is set to the paper's
/// maximum: md runs at that speed, or as fast as the drives allow. `--md-speed-min/max`
/// replace these (the funnel's own defaults, 1,000 and 200,000: md crawls at 1 MB/s).
pub fn paper_md_speed_kibps(load: Load) -> u64 {
    match load {
        Load::Tpcc | Load::Offline => 200_000,
        Load::Cello => 10_000,
        Load::WebSearch => 7_000,
    }
}

/// What the whole evaluation runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AlvConfig {
    pub seed: u64,
    /// 1: the paper's 30 GiB members; N: members of 30 GiB / N.
    pub scale: u64,
    /// The drive (`fc-10k-146g`: the paper's Seagate ST3146807FC, 10,000 rpm).
    pub model: String,
    /// Each member: a slice at the start of its drive.
    pub member_bytes: u64,
    pub chunk_bytes: u64,
    pub m: usize,
    pub n: usize,
    /// The loads compared (each with both policies).
    pub loads: Vec<Load>,
    /// Knobs of the main comparison: ALV's (defaults: the paper's baseline, B = 15 ms and
    /// θ = 0.1); md's when given (default: [`paper_md_speed_kibps`] per load).
    pub alv: Knobs,
    pub md: Option<Knobs>,
    pub synthetic: SyntheticParams,
    /// Where the raid5's stripe journal lives: on the members (Strata's default), or on a
    /// simulated flash device (`journal-device`, like md's `--write-journal`). The paper's md
    /// (2.6.18) had no journal at all: a small write cost its read-modify-write only.
    pub journal: Journal,
    /// The WebSearch trace (MQSim format).
    pub trace: PathBuf,
    /// Equal-size sequences the response times over time are averaged in.
    pub sequences: usize,
    /// Sensitivity sweeps to run after the comparison.
    pub sweeps: Vec<Sweep>,
    /// A run whose grow is not over after this much virtual time fails.
    pub time_limit: Nanos,
    /// How long each load runs alone for its baseline.
    pub baseline: Nanos,
}

impl AlvConfig {
    /// The paper's A(3,1) of 30 GiB members and 64 KiB chunks, divided by `scale`.
    pub fn scaled(seed: u64, scale: u64) -> AlvConfig {
        let scale = scale.max(1);
        AlvConfig {
            seed,
            scale,
            model: "fc-10k-146g".into(),
            member_bytes: (30 * GIB / scale).next_multiple_of(GIB >> 10),
            chunk_bytes: 64 * KIB,
            m: 3,
            n: 1,
            loads: Load::ALL.to_vec(),
            alv: Knobs::default(),
            md: None,
            synthetic: SyntheticParams::default(),
            journal: Journal::Flash,
            trace: PathBuf::from("../shared/traces/websearch-spc.trace"),
            sequences: 100,
            sweeps: Vec::new(),
            time_limit: 48 * 3600 * SECONDS / scale,
            baseline: 60 * SECONDS,
        }
    }

    /// The main comparison's setup of `load` under `policy`.
    pub fn setup(&self, load: Load, policy: Policy) -> Setup {
        let speed = paper_md_speed_kibps(load);
        let md = self.md.unwrap_or(Knobs {
            speed_min_kibps: Some(speed),
            speed_max_kibps: Some(speed),
            ..Knobs::default()
        });
        Setup {
            m: self.m,
            n: self.n,
            chunk_bytes: self.chunk_bytes,
            load,
            policy,
            knobs: match policy {
                Policy::Alv => self.alv,
                Policy::Md => md,
            },
            journal: self.journal,
        }
    }
}

/// Where the stripe journal lives ([`AlvConfig::journal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Journal {
    Members,
    Flash,
}

/// The flash model of the journal device.
pub const JOURNAL_MODEL: &str = "intel-x25m-160gb";

/// A sensitivity sweep (paper §5.3): a few points each, compared by direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sweep {
    /// ALV's latency bound B under the TPC-C-like load (Fig. 15).
    Bound,
    /// ALV's slack θ under the TPC-C-like load (Fig. 16).
    Slack,
    /// Chunk size, both policies, TPC-C-like (Fig. 17).
    Chunk,
    /// A(5,1), A(7,1), A(9,1), both policies, TPC-C-like (Fig. 18).
    Members,
    /// A(3,2), A(3,3), both policies, TPC-C-like (not in the paper).
    Added,
    /// The stripe journal on the members instead of flash, both policies, TPC-C-like and
    /// WebSearch (Strata's default placement; not in the paper).
    Journal,
    /// md with its funnel's defaults (1,000-200,000 KiB/s: held at the minimum under load),
    /// every load but offline (the paper's nominal settings; not its operating point).
    MdDefaults,
    /// ALV's buffer and md's stripe cache at 1 and 4 MiB per member, offline (Fig. 19).
    Buffer,
}

impl Sweep {
    pub const ALL: [Sweep; 8] = [
        Sweep::Bound,
        Sweep::Slack,
        Sweep::Chunk,
        Sweep::Members,
        Sweep::Added,
        Sweep::Journal,
        Sweep::MdDefaults,
        Sweep::Buffer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Sweep::Bound => "bound",
            Sweep::Slack => "slack",
            Sweep::Chunk => "chunk",
            Sweep::Members => "members",
            Sweep::Added => "added",
            Sweep::Journal => "journal",
            Sweep::MdDefaults => "md-defaults",
            Sweep::Buffer => "buffer",
        }
    }

    pub fn parse(text: &str) -> Result<Sweep, String> {
        Sweep::ALL
            .into_iter()
            .find(|s| s.name() == text)
            .ok_or_else(|| {
                format!(
                    "{text:?} is not a sweep (bound, slack, chunk, members, added, journal, \
                     md-defaults, buffer, all)"
                )
            })
    }

    /// The grows of this sweep (the comparison's TPC-C-like pair is its reference point and
    /// is not repeated).
    pub fn setups(self, config: &AlvConfig) -> Vec<Setup> {
        let base = |policy| config.setup(Load::Tpcc, policy);
        let both = |change: &dyn Fn(&mut Setup)| {
            [Policy::Alv, Policy::Md].map(|policy| {
                let mut setup = base(policy);
                change(&mut setup);
                setup
            })
        };
        match self {
            Sweep::Bound => [6.0, 10.0, 25.0]
                .map(|ms| Setup {
                    knobs: Knobs {
                        bound_ms: Some(ms),
                        ..config.alv
                    },
                    ..base(Policy::Alv)
                })
                .to_vec(),
            Sweep::Slack => [0.0, 0.05, 0.2]
                .map(|slack| Setup {
                    knobs: Knobs {
                        slack: Some(slack),
                        ..config.alv
                    },
                    ..base(Policy::Alv)
                })
                .to_vec(),
            Sweep::Chunk => [16 * KIB, 256 * KIB]
                .into_iter()
                .flat_map(|chunk| both(&|s: &mut Setup| s.chunk_bytes = chunk))
                .collect(),
            Sweep::Members => [5, 7, 9]
                .into_iter()
                .flat_map(|m| both(&|s: &mut Setup| s.m = m))
                .collect(),
            Sweep::Added => [2, 3]
                .into_iter()
                .flat_map(|n| both(&|s: &mut Setup| s.n = n))
                .collect(),
            Sweep::Journal => [Load::Tpcc, Load::WebSearch]
                .into_iter()
                .filter(|load| config.loads.contains(load))
                .flat_map(|load| {
                    [Policy::Alv, Policy::Md].map(|policy| Setup {
                        journal: Journal::Members,
                        ..config.setup(load, policy)
                    })
                })
                .collect(),
            Sweep::Buffer => [1024u64, 4096]
                .into_iter()
                .flat_map(|kib| {
                    let alv = config.setup(Load::Offline, Policy::Alv);
                    let md = config.setup(Load::Offline, Policy::Md);
                    [
                        Setup {
                            knobs: Knobs {
                                buffer_kib: Some(kib),
                                ..alv.knobs
                            },
                            ..alv
                        },
                        Setup {
                            knobs: Knobs {
                                stripe_cache: Some(kib / 4),
                                ..md.knobs
                            },
                            ..md
                        },
                    ]
                })
                .collect(),
            Sweep::MdDefaults => config
                .loads
                .iter()
                .filter(|&&load| load != Load::Offline)
                .map(|&load| Setup {
                    knobs: Knobs::default(),
                    ..config.setup(load, Policy::Md)
                })
                .collect(),
        }
    }
}

/// Response time averaged over one of the equal-size sequences of requests (in arrival
/// order) that arrived during the grow.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct SequencePoint {
    /// Mean arrival time of the sequence, from the grow's start.
    pub at_s: f64,
    pub mean_ms: f64,
    pub requests: u64,
}

/// What one grow measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GrowRun {
    pub setup: Setup,
    /// From the grow request to the array's new size (or to the time limit).
    pub grow_ns: Nanos,
    /// False: the grow was still under way at the time limit.
    pub finished: bool,
    /// How far it got: bytes of the new geometry moved, of all.
    pub moved_bytes: u64,
    pub total_bytes: u64,
    /// User requests that arrived during the grow, and their response times (arrival to
    /// completion, queueing in the array included).
    pub user: Option<LatencySummary>,
    pub user_failed: u64,
    pub sequences: Vec<SequencePoint>,
    /// The engine's counters ("last grow …" describe lines).
    pub windows: u64,
    pub metadata_writes: u64,
    pub forced_checkpoints: u64,
    pub mover_reads: u64,
    pub mover_writes: u64,
    pub mover_bytes_read: u64,
    pub mover_bytes_written: u64,
    /// Each drive during the grow (user I/O included), the new one last.
    pub disks: Vec<(String, DiskStats)>,
    /// Share of 1 s samples in which the mover was moving (not held by its rate control).
    pub moving_share: f64,
    /// Sustained sequential bandwidth of the drive over the members' region, bytes/s.
    pub bandwidth: f64,
}

impl GrowRun {
    /// Bytes through the busiest drive during the grow.
    pub fn busiest_bytes(&self) -> u64 {
        self.disks
            .iter()
            .map(|(_, s)| s.read_bytes + s.written_bytes)
            .max()
            .unwrap_or(0)
    }

    /// The time the busiest drive needs for its bytes at its sustained bandwidth.
    pub fn bandwidth_bound_ns(&self) -> Nanos {
        (self.busiest_bytes() as f64 / self.bandwidth * SECONDS as f64).round() as Nanos
    }

    pub fn mean_ms(&self) -> Option<f64> {
        self.user.as_ref().map(|u| u.mean_ns / MILLIS as f64)
    }
}

/// Everything `strata sim alv` measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AlvReport {
    pub config: AlvConfig,
    /// Requests per second of the WebSearch trace as recorded (looped at that rate).
    pub trace_iops: Option<f64>,
    /// Each load without a grow, for reference.
    pub baselines: Vec<Baseline>,
    pub runs: Vec<GrowRun>,
    pub sweeps: Vec<(Sweep, Vec<GrowRun>)>,
}

impl AlvReport {
    pub fn run(&self, load: Load, policy: Policy) -> Option<&GrowRun> {
        self.runs
            .iter()
            .find(|r| r.setup.load == load && r.setup.policy == policy)
    }

    /// Mean user response (ms) of `load` alone on the old array, with no grow.
    pub fn baseline(&self, load: Load) -> Option<f64> {
        let alone = self.baselines.iter().find(|b| b.load == load)?;
        Some(alone.user.as_ref()?.mean_ns / MILLIS as f64)
    }
}

/// The stack of a run in the serve config's syntax: m drives, a slice of `member_bytes` at
/// the start of each, a raid5 over the slices.
pub fn stack_text(config: &AlvConfig, setup: &Setup) -> String {
    let mut text = String::new();
    for i in 0..setup.m {
        text.push_str(&format!(
            "[[disk]]\nname = \"d{i}\"\nmodel = \"{}\"\n\n",
            config.model
        ));
    }
    for i in 0..setup.m {
        text.push_str(&format!(
            "[[layer]]\nname = \"p{i}\"\nkind = \"slice\"\nchildren = [\"d{i}\"]\nlength = {}\n\n",
            config.member_bytes
        ));
    }
    let mut children: Vec<String> = (0..setup.m).map(|i| format!("\"p{i}\"")).collect();
    if setup.journal == Journal::Flash {
        text.push_str(&format!(
            "[[disk]]\nname = \"journal\"\nmodel = \"{JOURNAL_MODEL}\"\n\n"
        ));
        children.push("\"journal\"".into());
    }
    text.push_str(&format!(
        "[[layer]]\nname = \"r5\"\nkind = \"raid5\"\nchildren = [{}]\nchunk = {}\n",
        children.join(", "),
        setup.chunk_bytes
    ));
    if setup.journal == Journal::Flash {
        text.push_str("journal-device = \"journal\"\n");
    }
    text
}

/// The grow request's options table (what `strata raid5 grow --policy …` sends).
pub fn grow_options(setup: &Setup) -> toml::Table {
    let mut options = toml::Table::new();
    options.insert("policy".into(), setup.policy.name().into());
    options.insert("on-failure".into(), "continue".into());
    let k = setup.knobs;
    if let Some(ms) = k.bound_ms {
        options.insert("bound-ms".into(), ms.into());
    }
    if let Some(slack) = k.slack {
        options.insert("slack".into(), slack.into());
    }
    if let Some(min) = k.speed_min_kibps {
        options.insert("speed-min".into(), (min as i64).into());
    }
    if let Some(max) = k.speed_max_kibps {
        options.insert("speed-max".into(), (max as i64).into());
    }
    if let Some(kib) = k.buffer_kib {
        options.insert("buffer-kib".into(), (kib as i64).into());
    }
    if let Some(pages) = k.stripe_cache {
        options.insert("stripe-cache".into(), (pages as i64).into());
    }
    options
}

/// Runs the comparison (every load, both policies), then the sweeps.
pub fn run(config: &AlvConfig) -> Result<AlvReport, String> {
    let needs_trace = config.loads.contains(&Load::WebSearch);
    let trace = if needs_trace {
        Some(Arc::new(read_trace(&config.trace)?))
    } else {
        None
    };
    let bandwidth = sustained_bandwidth(config)?;
    let mut baselines = Vec::new();
    for &load in &config.loads {
        if load != Load::Offline {
            baselines.push(run_baseline(config, load, config.baseline, trace.clone())?);
        }
    }
    let mut runs = Vec::new();
    for &load in &config.loads {
        for policy in [Policy::Alv, Policy::Md] {
            let setup = config.setup(load, policy);
            runs.push(run_grow(config, &setup, trace.clone(), bandwidth)?);
        }
    }
    let mut sweeps = Vec::new();
    for &sweep in &config.sweeps {
        let setups = sweep.setups(config);
        let done: Result<Vec<GrowRun>, String> = setups
            .iter()
            .map(|setup| run_grow(config, setup, trace.clone(), bandwidth))
            .collect();
        sweeps.push((sweep, done?));
    }
    let trace_iops = match &trace {
        Some(records) => Some(load::LoopedTrace::new(records.clone(), GIB)?.rate_iops()),
        None => None,
    };
    Ok(AlvReport {
        config: config.clone(),
        trace_iops,
        baselines,
        runs,
        sweeps,
    })
}

fn read_trace(path: &Path) -> Result<Vec<TraceRecord>, String> {
    crate::workload::read_trace(path, crate::workload::TraceFormat::Mqsim).map_err(|e| {
        format!(
            "the WebSearch trace {}: {e} (pass --trace, or leave out the websearch load)",
            path.display()
        )
    })
}

/// A fresh simulation with the stack of `setup` and the drive to add.
fn build(config: &AlvConfig, setup: &Setup) -> Result<(Simulation, Stack, Vec<Member>), String> {
    let table: toml::Table = stack_text(config, setup)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let spec = StackSpec::from_toml(&table)?;
    let sim = Simulation::with_config(SimConfig::new(config.seed));
    let mut stack = spec.build(
        &sim,
        &crate::models::build,
        DataMode::TimingOnly,
        Path::new("."),
    )?;
    let mut added = Vec::new();
    for i in setup.m..setup.m + setup.n {
        let spec = DiskSpec {
            name: format!("d{i}"),
            model: config.model.clone(),
            options: toml::Table::new(),
        };
        let disk = stack.add_disk(&sim, &spec, &crate::models::build, DataMode::TimingOnly)?;
        added.push(Member {
            name: spec.name,
            device: disk as DeviceRef,
        });
    }
    Ok((sim, stack, added))
}

/// The user workload of `load` over a volume of `volume` bytes (None: offline).
fn workload(
    config: &AlvConfig,
    load: Load,
    volume: u64,
    trace: Option<Arc<Vec<TraceRecord>>>,
    seed: u64,
) -> Result<Option<Box<dyn Workload>>, String> {
    Ok(match load {
        Load::Offline => None,
        Load::WebSearch => {
            let records = trace.ok_or("the websearch load needs the trace")?;
            Some(Box::new(load::LoopedTrace::new(records, volume)?))
        }
        Load::Tpcc => Some(Box::new(load::tpcc(&config.synthetic, volume, seed)?)),
        Load::Cello => Some(Box::new(load::cello(&config.synthetic, volume, seed)?)),
    })
}

/// What the watcher saw: when the grow ended (absolute virtual time) and the mover's state
/// once a second.
struct Watched {
    end: Nanos,
    /// False when the deadline came first.
    finished: bool,
    samples: u64,
    moving: u64,
}

/// Waits until the array takes its new size, or until `deadline` (absolute); samples the
/// "grow" describe line meanwhile. Fails if the mover stopped on an error.
async fn watch_grow(
    clock: SimRuntime,
    top: DeviceRef,
    raid: DeviceRef,
    old_size: u64,
    done: Arc<AtomicBool>,
    deadline: Nanos,
) -> Result<Watched, String> {
    let mut watched = Watched {
        end: 0,
        finished: false,
        samples: 0,
        moving: 0,
    };
    let mut next_sample = clock.now_nanos() + SAMPLE;
    loop {
        let now = clock.now_nanos();
        let finished = top.geometry().size != old_size;
        if finished || now >= deadline {
            watched.end = now;
            watched.finished = finished;
            done.store(true, Ordering::Relaxed);
            return Ok(watched);
        }
        if now >= next_sample {
            next_sample += SAMPLE;
            let node = describe(&raid).await?;
            let state = detail(&node, "grow").unwrap_or_default();
            if state.starts_with("stopped") {
                done.store(true, Ordering::Relaxed);
                return Err(format!("the grow {state}"));
            }
            watched.samples += 1;
            watched.moving += u64::from(state == "moving");
        }
        clock.sleep_until(now + POLL).await;
    }
}

async fn describe(device: &DeviceRef) -> Result<NodeStatus, String> {
    match device.control(Control::Describe).await {
        Ok(ControlReply::Describe(node)) => Ok(node),
        Ok(_) => Err("describe: unexpected reply".into()),
        Err(e) => Err(format!("describe: {e}")),
    }
}

fn detail(node: &NodeStatus, key: &str) -> Option<String> {
    node.detail
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
}

/// A grow counter ("grow …" while it runs, "last grow …" once over), or a pair of them
/// ("a / b").
fn counters(node: &NodeStatus, key: &str) -> Result<Vec<u64>, String> {
    let text = detail(node, &format!("last {key}"))
        .or_else(|| detail(node, key))
        .ok_or_else(|| format!("describe has no {key:?}"))?;
    text.split(" / ")
        .map(|n| n.parse().map_err(|_| format!("{key}: {text:?}")))
        .collect()
}

/// One grow, start to end, in a fresh simulation.
pub fn run_grow(
    config: &AlvConfig,
    setup: &Setup,
    trace: Option<Arc<Vec<TraceRecord>>>,
    bandwidth: f64,
) -> Result<GrowRun, String> {
    let (sim, stack, added) = build(config, setup)?;
    let raid = stack.nodes["r5"].clone();
    let top = stack.top.clone();
    let old_size = top.geometry().size;
    let seed = crate::executor::derive_seed(config.seed, &format!("alv-{}", setup.load.name()));
    let user = workload(config, setup.load, old_size, trace, seed)?;
    let done = Arc::new(AtomicBool::new(false));
    let before: Vec<DiskStats> = stack.disks.iter().map(|d| d.stats()).collect();
    let start = sim.now();
    // The requests in flight at the deadline still complete: an hour for them.
    sim.set_time_limit(Some(start + config.time_limit + 3600 * SECONDS));
    let request = Control::GrowMembers {
        members: added,
        options: grow_options(setup),
    };
    let clock = sim.handle();
    let driver_config = DriverConfig {
        queue_depth: 1,
        sample_interval: None,
        verify_data: false,
        outstanding_limit: None,
    };
    let outcome = sim.try_block_on(async {
        raid.control(request)
            .await
            .map_err(|e| format!("grow-members: {e}"))?;
        let watch = watch_grow(
            clock.clone(),
            top.clone(),
            raid.clone(),
            old_size,
            done.clone(),
            start + config.time_limit,
        );
        let (watched, output) = match user {
            None => (watch.await, None),
            Some(inner) => {
                let mut user = load::WhileGrowing {
                    inner,
                    done: done.clone(),
                };
                let drive =
                    driver::drive(clock.clone(), top.clone(), &mut user, &[], &driver_config);
                let (watched, output) = join(watch, drive).await;
                (watched, Some(output))
            }
        };
        let watched = watched?;
        let node = describe(&raid).await?;
        Ok::<_, String>((watched, output, node))
    });
    let (watched, output, node) = outcome.map_err(|stop| {
        format!(
            "{} {} A({},{}): {stop}",
            setup.load.name(),
            setup.policy.name(),
            setup.m,
            setup.n
        )
    })??;
    let disks = stack
        .disks
        .iter()
        .zip(&before)
        .map(|(d, b)| (d.name().to_string(), d.stats().since(b)))
        .collect();
    let [reads, writes] = counters(&node, "grow I/Os read / written")?[..] else {
        return Err("last grow I/Os: two numbers expected".into());
    };
    let [bytes_read, bytes_written] = counters(&node, "grow bytes read / written")?[..] else {
        return Err("last grow bytes: two numbers expected".into());
    };
    let grow_ns = watched.end - start;
    let (user, user_failed, sequences) = match &output {
        Some(output) => {
            let during: Vec<&IoRecord> = output
                .records
                .iter()
                .filter(|r| r.issued + output.started_at < watched.end)
                .collect();
            let failed = during.iter().filter(|r| r.failed).count() as u64;
            let latencies: Vec<Nanos> = during.iter().map(|r| results::latency_ns(r)).collect();
            (
                results::summarize_latencies(&latencies),
                failed,
                sequence_averages(&during, output.started_at - start, config.sequences),
            )
        }
        None => (None, 0, Vec::new()),
    };
    let (moved_bytes, total_bytes) = match (&node.activity, watched.finished) {
        (Some(activity), false) => (activity.done_bytes, activity.total_bytes),
        _ => {
            let size = top.geometry().size;
            (size, size)
        }
    };
    Ok(GrowRun {
        setup: *setup,
        grow_ns,
        finished: watched.finished,
        moved_bytes,
        total_bytes,
        user,
        user_failed,
        sequences,
        windows: counters(&node, "grow windows")?[0],
        metadata_writes: counters(&node, "grow metadata writes")?[0],
        forced_checkpoints: counters(&node, "grow forced checkpoints")?[0],
        mover_reads: reads,
        mover_writes: writes,
        mover_bytes_read: bytes_read,
        mover_bytes_written: bytes_written,
        disks,
        moving_share: if watched.samples == 0 {
            1.0
        } else {
            watched.moving as f64 / watched.samples as f64
        },
        bandwidth,
    })
}

/// The load alone, without a grow: what the array's users see before the grow, and how
/// many of their requests already exceed ALV's latency bound (if more than θ do, the valve
/// never opens).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Baseline {
    pub load: Load,
    pub duration_ns: Nanos,
    pub user: Option<LatencySummary>,
    /// Share of requests slower than the bound B (15 ms unless set).
    pub late_share: f64,
    /// Mean response of reads and of writes (ms), when there were some.
    pub read_ms: Option<f64>,
    pub write_ms: Option<f64>,
    /// Busy share of the busiest drive.
    pub utilization: f64,
}

/// Runs `load` for `duration` of virtual time on the A(m, n) stack, no grow.
pub fn run_baseline(
    config: &AlvConfig,
    load: Load,
    duration: Nanos,
    trace: Option<Arc<Vec<TraceRecord>>>,
) -> Result<Baseline, String> {
    let setup = config.setup(load, Policy::Alv);
    let (sim, stack, _) = build(config, &setup)?;
    let top = stack.top.clone();
    let seed = crate::executor::derive_seed(config.seed, &format!("alv-{}", load.name()));
    let Some(inner) = workload(config, load, top.geometry().size, trace, seed)? else {
        return Err("the offline load has no baseline".into());
    };
    let mut user = crate::workload::Limited::new(inner, None, Some(duration));
    let before: Vec<DiskStats> = stack.disks.iter().map(|d| d.stats()).collect();
    let output = driver::run(
        &sim,
        top,
        &mut user,
        &[],
        &DriverConfig {
            queue_depth: 1,
            sample_interval: None,
            verify_data: false,
            outstanding_limit: None,
        },
    );
    let latencies: Vec<Nanos> = output.records.iter().map(results::latency_ns).collect();
    let bound = (config.alv.bound_ms.unwrap_or(15.0) * MILLIS as f64) as Nanos;
    let late = latencies.iter().filter(|&&l| l > bound).count();
    let busy = stack
        .disks
        .iter()
        .zip(&before)
        .map(|(d, b)| d.stats().since(b).busy_time)
        .max()
        .unwrap_or(0);
    let mean_of = |op| {
        let of: Vec<Nanos> = output
            .records
            .iter()
            .filter(|r| r.op == op)
            .map(results::latency_ns)
            .collect();
        (!of.is_empty()).then(|| of.iter().sum::<Nanos>() as f64 / of.len() as f64 / 1e6)
    };
    Ok(Baseline {
        load,
        duration_ns: duration,
        read_ms: mean_of(crate::model::Op::Read),
        write_ms: mean_of(crate::model::Op::Write),
        late_share: late as f64 / latencies.len().max(1) as f64,
        user: results::summarize_latencies(&latencies),
        utilization: busy as f64 / output.end.max(1) as f64,
    })
}

/// The paper's time series (Figs. 10, 12, 13): the response times in arrival order, cut
/// into `count` sequences of equal size (the last takes the remainder), each averaged.
/// `offset`: the records' time origin after the grow's start.
pub fn sequence_averages(records: &[&IoRecord], offset: Nanos, count: usize) -> Vec<SequencePoint> {
    let mut ordered: Vec<&IoRecord> = records.to_vec();
    ordered.sort_by_key(|r| r.issued);
    let count = count.min(ordered.len()).max(1);
    let size = ordered.len() / count;
    if size == 0 {
        return Vec::new();
    }
    (0..count)
        .map(|i| {
            let end = if i + 1 == count {
                ordered.len()
            } else {
                (i + 1) * size
            };
            let part = &ordered[i * size..end];
            let n = part.len() as f64;
            let at = part.iter().map(|r| (r.issued + offset) as f64).sum::<f64>() / n;
            let latency = part
                .iter()
                .map(|r| results::latency_ns(r) as f64)
                .sum::<f64>()
                / n;
            SequencePoint {
                at_s: at / SECONDS as f64,
                mean_ms: latency / MILLIS as f64,
                requests: part.len() as u64,
            }
        })
        .collect()
}

/// The drive's sustained sequential bandwidth over the members' region: a fresh drive of
/// the model reads `[0, member_bytes)` front to back in 4 MiB requests, two outstanding.
pub fn sustained_bandwidth(config: &AlvConfig) -> Result<f64, String> {
    let sim = Simulation::with_config(SimConfig::new(config.seed));
    let seed = crate::executor::derive_seed(config.seed, "alv-bandwidth");
    let model = crate::models::build(&config.model, &toml::Table::new(), seed)?;
    let disk = crate::disk::SimDisk::new(&sim, "probe", model, DataMode::TimingOnly);
    let step = 4u64 << 20;
    let region = config.member_bytes / step * step;
    let pattern = crate::workload::Pattern {
        address: crate::workload::AddressDist::Sequential { start: 0 },
        sizes: vec![crate::workload::WeightedSize {
            bytes: step,
            weight: 1,
        }],
        read_share: 1.0,
        align: step,
    };
    let inner = crate::workload::ClosedLoop::new(pattern, region, seed)?;
    let mut reads = crate::workload::Limited::new(inner, Some(region / step), None);
    let output = driver::run(
        &sim,
        disk as DeviceRef,
        &mut reads,
        &[],
        &DriverConfig {
            queue_depth: 2,
            sample_interval: None,
            verify_data: false,
            outstanding_limit: None,
        },
    );
    Ok(region as f64 * SECONDS as f64 / output.end.max(1) as f64)
}

/// The Duration of `ns`, for messages.
pub fn seconds(ns: Nanos) -> f64 {
    Duration::from_nanos(ns).as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Op;

    #[test]
    fn the_stack_is_serve_config_text_with_the_raid5_over_slices() {
        let mut config = AlvConfig::scaled(1, 32);
        assert_eq!(config.member_bytes, 960 << 20);
        for journal in [Journal::Flash, Journal::Members] {
            config.journal = journal;
            let setup = config.setup(Load::Tpcc, Policy::Alv);
            let table: toml::Table = stack_text(&config, &setup).parse().unwrap();
            let spec = StackSpec::from_toml(&table).unwrap();
            let flash = usize::from(journal == Journal::Flash);
            assert_eq!(spec.disks.len(), 3 + flash);
            assert!(spec.disks[..3].iter().all(|d| d.model == "fc-10k-146g"));
            let raid = spec.layers.iter().find(|l| l.name == "r5").unwrap();
            assert_eq!(raid.children.len(), 3 + flash);
            assert_eq!(
                raid.options.contains_key("journal-device"),
                journal == Journal::Flash
            );
            assert_eq!(spec.layers.len(), 4, "three slices and the raid5");
        }
    }

    #[test]
    fn md_runs_at_the_papers_maximum_and_alv_with_its_defaults() {
        let config = AlvConfig::scaled(1, 32);
        let md = config.setup(Load::WebSearch, Policy::Md);
        assert_eq!(md.knobs.speed_min_kibps, Some(7_000));
        assert_eq!(md.knobs.speed_max_kibps, Some(7_000));
        let options = grow_options(&md);
        assert_eq!(options["policy"].as_str(), Some("md"));
        assert_eq!(options["speed-min"].as_integer(), Some(7_000));
        assert!(!options.contains_key("bound-ms"));
        let alv = grow_options(&config.setup(Load::Cello, Policy::Alv));
        assert_eq!(alv.len(), 2, "policy and on-failure only: {alv:?}");
        let tuned = Setup {
            knobs: Knobs {
                bound_ms: Some(6.0),
                slack: Some(0.2),
                buffer_kib: Some(4096),
                ..Knobs::default()
            },
            ..config.setup(Load::Tpcc, Policy::Alv)
        };
        let options = grow_options(&tuned);
        assert_eq!(options["bound-ms"].as_float(), Some(6.0));
        assert_eq!(options["slack"].as_float(), Some(0.2));
        assert_eq!(options["buffer-kib"].as_integer(), Some(4096));
    }

    #[test]
    fn sweeps_vary_one_thing_from_the_comparison() {
        let config = AlvConfig::scaled(1, 32);
        for sweep in Sweep::ALL {
            assert_eq!(Sweep::parse(sweep.name()), Ok(sweep));
            let setups = sweep.setups(&config);
            assert!(!setups.is_empty(), "{sweep:?}");
            for setup in &setups {
                assert!(
                    !Load::ALL
                        .iter()
                        .flat_map(|&l| [config.setup(l, Policy::Alv), config.setup(l, Policy::Md)])
                        .any(|s| s == *setup),
                    "{sweep:?} repeats a comparison run"
                );
            }
        }
        assert!(Sweep::parse("speed").is_err());
        let members: Vec<(usize, usize)> = Sweep::Members
            .setups(&config)
            .iter()
            .map(|s| (s.m, s.n))
            .collect();
        assert_eq!(members, [(5, 1), (5, 1), (7, 1), (7, 1), (9, 1), (9, 1)]);
        assert!(Sweep::Bound
            .setups(&config)
            .iter()
            .all(|s| s.policy == Policy::Alv && s.load == Load::Tpcc));
        assert_eq!(Load::parse("cello"), Ok(Load::Cello));
        assert!(Load::parse("spc").is_err());
    }

    fn record(issued: Nanos, latency: Nanos) -> IoRecord {
        IoRecord {
            op: Op::Read,
            offset: 0,
            len: 4096,
            issued,
            completed: issued + latency,
            failed: false,
        }
    }

    #[test]
    fn sequences_are_equal_sized_in_arrival_order_and_the_last_takes_the_rest() {
        // Ten requests, arriving every second, the k-th taking k ms; given out of order.
        let records: Vec<IoRecord> = (0..10u64)
            .rev()
            .map(|k| record(k * SECONDS, k * MILLIS))
            .collect();
        let refs: Vec<&IoRecord> = records.iter().collect();
        let points = sequence_averages(&refs, 5 * SECONDS, 3);
        let sizes: Vec<u64> = points.iter().map(|p| p.requests).collect();
        assert_eq!(sizes, [3, 3, 4]);
        assert_eq!(points[0].mean_ms, 1.0, "requests 0, 1, 2");
        assert_eq!(points[0].at_s, 6.0, "mean arrival 1 s, plus the offset");
        assert_eq!(points[2].mean_ms, 7.5, "requests 6 to 9");
        assert!(sequence_averages(&[], 0, 3).is_empty());
        assert_eq!(
            sequence_averages(&refs, 0, 100).len(),
            10,
            "at most one per request"
        );
    }
}
