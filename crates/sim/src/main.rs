//! `strata-sim` (also run as `strata sim …`): the deterministic simulator from the command
//! line (see docs/simulator.md). A binary of its own so that the serving binary does not
//! carry the simulator's models, plots and trace readers (see docs/architecture.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use strata_core::{errln, out, outln};

mod explore_cmd;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use strata_sim::alv;
use strata_sim::clotho;
use strata_sim::experiment::{self, Experiment};
use strata_sim::migration;
use strata_sim::proximal;
use strata_sim::ribd;
use strata_sim::validate;
use strata_sim::workload::{TraceFormat, WorkloadSpec};

#[derive(Parser)]
#[command(
    name = "strata sim",
    bin_name = "strata sim",
    version,
    about = "The deterministic simulator: Strata's layers over modelled disks, in virtual time"
)]
struct Cli {
    #[command(subcommand)]
    command: SimCommand,
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            errln!("strata: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Subcommand)]
enum SimCommand {
    /// Check the disk models against the papers' figures (one row per check).
    ValidateDisk {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run an experiment file: a stack of simulated disks and Strata layers, and a workload.
    Run {
        experiment: PathBuf,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Replay a block trace, open loop by timestamp, on a stack file ([[disk]] with `model`,
    /// [[layer]] as in the serve config).
    Replay {
        /// The trace.
        #[arg(long)]
        trace: PathBuf,
        /// Its format: mqsim (the ASCII format of ../shared/traces), msr-csv, spc-csv.
        #[arg(long, default_value = "mqsim")]
        format: String,
        /// The stack to replay on.
        #[arg(long)]
        stack: PathBuf,
        /// Replay this many times faster than recorded.
        #[arg(long, default_value_t = 1.0)]
        speedup: f64,
        /// Only the trace's requests for this device number.
        #[arg(long)]
        device: Option<u32>,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Clotho's evaluation (§3.4) on a thin pool with versions over a simulated Cheetah:
    /// random read overhead, overwrites with a version every 10 and 5 minutes, random reads
    /// of a compacted version. See docs/versions-sim.md.
    Clotho {
        /// Divide the partition, the region, the run and the version periods by this (1: the
        /// paper's sizes).
        #[arg(long, default_value_t = 1)]
        scale: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Only part a (random reads), b (overwrites with versions) or c (reads of a
        /// compacted version).
        #[arg(long)]
        part: Option<String>,
        /// (a): versions taken before the reads, each followed by an overwrite (default 3).
        #[arg(long)]
        read_versions: Option<u32>,
        /// (a): share of the region's 4 KiB blocks each overwrite writes (default 0.1).
        #[arg(long)]
        overwrite_share: Option<f64>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// RIBD's cost of two-phase commit on large sequential writes (Fig. 6.8b): a RAIN-10 of
    /// two bricks on simulated SATA drives over Gigabit Ethernet, 1 MiB writes with intervals
    /// and written through. See docs/shared-volumes.md, "In the simulator".
    Ribd {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The disk model under each brick.
        #[arg(long, default_value = "wd-re3-1t")]
        model: String,
        /// Client counts (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
        clients: Vec<u64>,
        /// Each brick's share, MiB.
        #[arg(long, default_value_t = 1024)]
        share_mib: u64,
        /// Virtual seconds measured per run, after the fill.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The ALV paper's evaluation (§5) on the raid5 grow engine: A(3,1) grown with ALV and
    /// with MD-Reshape under the WebSearch trace, a TPC-C-like and a Cello-like synthetic
    /// load, and offline, over simulated 10K FC drives. See docs/raid5-grow-sim.md.
    Alv {
        /// Divide the 30 GiB members by this (1: the paper's size).
        #[arg(long, default_value_t = 32)]
        scale: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Only these loads (comma-separated: websearch, tpcc, cello, offline).
        #[arg(long, value_delimiter = ',')]
        load: Vec<String>,
        /// Sensitivity sweeps to run too (comma-separated: bound, slack, chunk, members,
        /// added, or all).
        #[arg(long, value_delimiter = ',')]
        sweep: Vec<String>,
        /// ALV's latency bound B in ms (default 15) and slack θ (default 0.1).
        #[arg(long)]
        bound_ms: Option<f64>,
        #[arg(long)]
        slack: Option<f64>,
        /// MD's speed limits in KiB/s per member, for every load (default: min = max = the
        /// paper's maximum for the load: 7,000 WebSearch, 10,000 Cello, 200,000 TPC-C).
        #[arg(long)]
        md_speed_min: Option<u64>,
        #[arg(long)]
        md_speed_max: Option<u64>,
        /// Where the raid5's stripe journal lives: flash (default: a simulated Intel X25-M as
        /// its journal device, so that a small write costs its read-modify-write as in the
        /// paper's md, which had no journal) or members (Strata's default placement).
        #[arg(long, default_value = "flash")]
        journal: String,
        /// The WebSearch trace (MQSim format).
        #[arg(long, default_value = "../shared/traces/websearch-spc.trace")]
        trace: PathBuf,
        /// Write the response-time plots (SVG) and report.json here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Proximal I/O §5 on the stage layer: a 4+1 raid5 of simulated WD RE3 drives with a
    /// flash stage, 16 MiB extents filled to 89 %, 2,000 random 4 KiB updates per extent:
    /// Table 2 (I/Os per revolution by staging size), Table 3 (serial reads aged, pristine,
    /// write-anywhere), update in place, and the destage triggers. See docs/proximal-sim.md.
    Proximal {
        /// Each raid5 member: a slice of this many MiB of its drive (the paper: whole 1 TB
        /// drives).
        #[arg(long, default_value_t = 1024)]
        member_mib: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Staging sizes of Table 2, % of the usable capacity (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "1,2,5,10")]
        staging: Vec<f64>,
        /// Updates per extent (the paper: 2,000).
        #[arg(long, default_value_t = 2000)]
        updates: u64,
        /// The trigger comparison: staging %, updates per extent, open-loop rate (updates/s).
        #[arg(long, default_value_t = 1.0)]
        trigger_staging: f64,
        #[arg(long, default_value_t = 500)]
        trigger_updates: u64,
        #[arg(long, default_value_t = 40.0)]
        rate: f64,
        /// Skip the runs on wd-re3-1t-order-quirk.
        #[arg(long)]
        no_quirk: bool,
        /// Write the plots (SVG) and report.json here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// User-centric migration (Kang & Reddy) on the migrate layer: a local 10K drive and
    /// remote ones behind the paper's Table 1 links, a synthetic SFS-like mix open loop;
    /// STR/SEQ × MIG/NOMIG at 9/17/25 ms, 1 vs 4 tokens, locality-only, two or three users
    /// sharing drives, convergence. See docs/migration-sim.md.
    Migration {
        /// Seconds instead of minutes: a 64 MiB data set, 30 + 30 s per point, two loads,
        /// 9 ms only.
        #[arg(long)]
        quick: bool,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Offered loads of every sweep, ops/s (comma-separated, ascending).
        #[arg(long, value_delimiter = ',')]
        loads: Option<Vec<f64>>,
        /// RTTs (Table 1: 9, 17, 25 ms; comma-separated).
        #[arg(long, value_delimiter = ',')]
        rtt: Option<Vec<u32>>,
        /// Warm-up and measurement window per point, virtual seconds.
        #[arg(long)]
        warmup: Option<f64>,
        #[arg(long)]
        measure: Option<f64>,
        /// The data set, MiB.
        #[arg(long)]
        data_mib: Option<u64>,
        /// Zipf skew of the addresses.
        #[arg(long)]
        theta: Option<f64>,
        /// Disks of the single-user runs (1 local + the rest remote).
        #[arg(long)]
        disks: Option<usize>,
        /// Saturation bound: mean response time, ms.
        #[arg(long)]
        bound_ms: Option<f64>,
        /// The migrate layer's δ: "adaptive" (its default) or a duration ("5ms").
        #[arg(long)]
        delta: Option<String>,
        /// More options of the migrate layer, as TOML lines (`--set 'smoothing = "30s"'`),
        /// for sensitivity runs; repeatable.
        #[arg(long = "set")]
        set: Vec<String>,
        /// The migrate layer's candidate-probability (default 1: calibrated to the paper's
        /// Fig. 3; see docs/migration-sim.md).
        #[arg(long)]
        candidate_probability: Option<f64>,
        /// Client processes, each with one operation in flight (arrivals wait for one);
        /// default: open loop without a ceiling.
        #[arg(long)]
        processes: Option<usize>,
        /// Experiments to run (comma-separated; default all).
        #[arg(long, value_delimiter = ',', value_enum)]
        part: Option<Vec<migration::Part>>,
        /// Write the plots (SVG) and report.json here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// List the device-model presets.
    Models,
    /// Whole-stack simulation testing: random hierarchies, workloads, crashes, member
    /// failures and online changes from a seed, each start checked against a reference
    /// model. See docs/explore.md.
    Explore(explore_cmd::ExploreArgs),
}

/// How a run is reported, alike for `run` and `replay`.
#[derive(clap::Args)]
struct ReportArgs {
    /// Write report.json, CSVs and SVG plots here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override the file's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn run(command: SimCommand) -> anyhow::Result<()> {
    match command {
        SimCommand::ValidateDisk { json } => {
            let rows = validate::validate_disk();
            if json {
                outln!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                out!("{}", validate::format_table(&rows));
            }
            let off = rows.iter().filter(|r| !r.within_tolerance).count();
            if off > 0 {
                bail!("{off} of {} checks are outside the tolerance", rows.len());
            }
            Ok(())
        }
        SimCommand::Run { experiment, report } => {
            let loaded = Experiment::load(&experiment).map_err(anyhow::Error::msg)?;
            run_and_report(loaded, &experiment, &report)
        }
        SimCommand::Replay {
            trace,
            format,
            stack,
            speedup,
            device,
            report,
        } => {
            let format = match format.as_str() {
                "mqsim" => TraceFormat::Mqsim,
                "msr-csv" | "msr_csv" => TraceFormat::MsrCsv,
                "spc-csv" | "spc_csv" => TraceFormat::SpcCsv,
                other => bail!("--format: {other:?} is not mqsim, msr-csv or spc-csv"),
            };
            if speedup.is_nan() || speedup <= 0.0 {
                bail!("--speedup must be positive");
            }
            let text = std::fs::read_to_string(&stack)
                .with_context(|| format!("reading {}", stack.display()))?;
            let base = stack.parent().unwrap_or(Path::new("."));
            // The stack file may carry run settings but no workload: the trace is it.
            let mut table: toml::Table = text
                .parse()
                .with_context(|| format!("parsing {}", stack.display()))?;
            if table.contains_key("workload") {
                bail!(
                    "{}: a stack file for replay has no [workload]; use `strata sim run`",
                    stack.display()
                );
            }
            table.insert(
                "workload".into(),
                toml::Value::try_from(WorkloadSpec::Trace {
                    path: std::env::current_dir()?.join(&trace),
                    format,
                    speedup,
                    device,
                    count: None,
                    duration_s: None,
                })?,
            );
            if !table.contains_key("name") {
                let name = format!(
                    "{} on {}",
                    trace.file_name().unwrap_or_default().to_string_lossy(),
                    stack.file_name().unwrap_or_default().to_string_lossy()
                );
                table.insert("name".into(), toml::Value::String(name));
            }
            let loaded = Experiment::parse(&toml::to_string(&table)?, base)
                .map_err(|e| anyhow::anyhow!("{}: {e}", stack.display()))?;
            run_and_report(loaded, &stack, &report)
        }
        SimCommand::Clotho {
            scale,
            seed,
            part,
            read_versions,
            overwrite_share,
            json,
        } => {
            if scale == 0 {
                bail!("--scale must be at least 1");
            }
            let mut config = clotho::ClothoConfig::scaled(seed, scale);
            if let Some(versions) = read_versions {
                config.read_versions = versions;
            }
            if let Some(share) = overwrite_share {
                if !(share.is_finite() && (0.0..=10.0).contains(&share)) {
                    bail!("--overwrite-share must be from 0 to 10 (1: as many writes as the region has blocks)");
                }
                config.overwrite_share = share;
            }
            let parts = match part.as_deref() {
                None => clotho::Parts::ALL,
                Some("a") => clotho::Parts {
                    reads: true,
                    writes: false,
                    compacted: false,
                },
                Some("b") => clotho::Parts {
                    reads: false,
                    writes: true,
                    compacted: false,
                },
                Some("c") => clotho::Parts {
                    reads: false,
                    writes: false,
                    compacted: true,
                },
                Some(other) => bail!("--part: {other:?} is not a, b or c"),
            };
            let report = clotho::run_parts(&config, parts).map_err(anyhow::Error::msg)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                out!("{}", clotho::format_report(&report));
            }
            Ok(())
        }
        SimCommand::Ribd {
            seed,
            model,
            clients,
            share_mib,
            seconds,
            json,
        } => {
            if seconds == 0 || share_mib == 0 {
                bail!("--seconds and --share-mib must be at least 1");
            }
            let mut config = ribd::RibdConfig::paper(seed);
            config.model = model;
            config.clients = clients;
            config.share_bytes = share_mib << 20;
            config.run_ns = seconds * 1_000_000_000;
            let runs = ribd::run(&config).map_err(anyhow::Error::msg)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&runs)?);
            } else {
                out!("{}", ribd::format_report(&config, &runs));
            }
            Ok(())
        }
        SimCommand::Alv {
            scale,
            seed,
            load,
            sweep,
            bound_ms,
            slack,
            md_speed_min,
            md_speed_max,
            journal,
            trace,
            out,
            json,
        } => {
            if scale == 0 {
                bail!("--scale must be at least 1");
            }
            let mut config = alv::AlvConfig::scaled(seed, scale);
            if !load.is_empty() {
                config.loads = load
                    .iter()
                    .map(|l| alv::Load::parse(l))
                    .collect::<Result<_, _>>()
                    .map_err(|e| anyhow::anyhow!("--load: {e}"))?;
            }
            config.sweeps = if sweep.iter().any(|s| s == "all") {
                alv::Sweep::ALL.to_vec()
            } else {
                sweep
                    .iter()
                    .map(|s| alv::Sweep::parse(s))
                    .collect::<Result<_, _>>()
                    .map_err(|e| anyhow::anyhow!("--sweep: {e}"))?
            };
            config.alv.bound_ms = bound_ms;
            config.alv.slack = slack;
            if md_speed_min.is_some() || md_speed_max.is_some() {
                config.md = Some(alv::Knobs {
                    speed_min_kibps: md_speed_min,
                    speed_max_kibps: md_speed_max,
                    ..alv::Knobs::default()
                });
            }
            config.trace = trace;
            config.journal = match journal.as_str() {
                "members" => alv::Journal::Members,
                "flash" => alv::Journal::Flash,
                other => bail!("--journal: {other:?} is not members or flash"),
            };
            let report = alv::run(&config).map_err(anyhow::Error::msg)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                out!("{}", alv::format_report(&report));
            }
            if let Some(dir) = out {
                let written = alv::write_plots(&report, &dir).map_err(anyhow::Error::msg)?;
                if !json {
                    outln!("wrote {} files to {}", written.len(), dir.display());
                }
            }
            Ok(())
        }
        SimCommand::Proximal {
            member_mib,
            seed,
            staging,
            updates,
            trigger_staging,
            trigger_updates,
            rate,
            no_quirk,
            out,
            json,
        } => {
            if member_mib < 64 {
                bail!("--member-mib must be at least 64");
            }
            if staging.is_empty() || staging.iter().any(|p| !(*p > 0.0 && *p <= 50.0)) {
                bail!("--staging: percentages from 0 (exclusive) to 50");
            }
            if !(rate.is_finite() && rate > 0.0) {
                bail!("--rate must be positive");
            }
            let mut config = proximal::ProximalConfig::with_members(seed, member_mib << 20);
            config.staging_percents = staging;
            config.table3_percent = config.staging_percents[0];
            config.updates_per_extent = updates;
            config.trigger_percent = trigger_staging;
            config.trigger_updates_per_extent = trigger_updates;
            config.rate_per_s = rate;
            config.quirk = !no_quirk;
            let report = proximal::run(&config).map_err(anyhow::Error::msg)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                out!("{}", proximal::format_report(&report));
            }
            if let Some(dir) = out {
                let written = proximal::write_plots(&report, &dir).map_err(anyhow::Error::msg)?;
                if !json {
                    outln!("wrote {} files to {}", written.len(), dir.display());
                }
            }
            Ok(())
        }
        SimCommand::Migration {
            quick,
            seed,
            loads,
            rtt,
            warmup,
            measure,
            data_mib,
            theta,
            disks,
            bound_ms,
            delta,
            set,
            candidate_probability,
            processes,
            part,
            out,
            json,
        } => {
            let mut config = if quick {
                migration::MigrationConfig::quick(seed)
            } else {
                migration::MigrationConfig::full(seed)
            };
            if let Some(loads) = loads {
                if loads.is_empty() || loads.iter().any(|l| !(l.is_finite() && *l > 0.0)) {
                    bail!("--loads: positive ops/s");
                }
                config.loads = loads;
            }
            if let Some(rtt) = rtt {
                if rtt.is_empty() || rtt.iter().any(|r| ![9, 17, 25].contains(r)) {
                    bail!("--rtt: 9, 17 or 25 (Table 1)");
                }
                config.rtts = rtt;
            }
            if let Some(w) = warmup {
                config.warmup_s = w;
            }
            if let Some(m) = measure {
                if m.is_nan() || m <= 0.0 {
                    bail!("--measure must be positive");
                }
                config.measure_s = m;
            }
            if let Some(d) = data_mib {
                config.data_bytes = d << 20;
            }
            if let Some(t) = theta {
                config.theta = t;
            }
            if let Some(d) = disks {
                if d < 2 {
                    bail!("--disks: at least 2");
                }
                config.disks = d;
            }
            if let Some(b) = bound_ms {
                config.bound_ms = b;
            }
            config.delta = delta;
            config.layer_options = set;
            config.processes = processes;
            if let Some(p) = candidate_probability {
                config.candidate_probability = Some(p);
            }
            if let Some(part) = part {
                config.parts = part;
            }
            let started = std::time::Instant::now();
            let report = migration::run(&config).map_err(anyhow::Error::msg)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                out!("{}", migration::format_report(&report));
                outln!(
                    "simulated in {:.1} s of wall time",
                    started.elapsed().as_secs_f64()
                );
            }
            if let Some(dir) = out {
                let written = migration::write_plots(&report, &dir).map_err(anyhow::Error::msg)?;
                if !json {
                    outln!("wrote {} files to {}", written.len(), dir.display());
                }
            }
            Ok(())
        }
        SimCommand::Explore(args) => explore_cmd::run(args),
        SimCommand::Models => {
            for name in strata_sim::models::preset_names() {
                outln!("{name}");
            }
            Ok(())
        }
    }
}

fn run_and_report(mut loaded: Experiment, file: &Path, args: &ReportArgs) -> anyhow::Result<()> {
    if let Some(seed) = args.seed {
        loaded.seed = seed;
    }
    let (out, json) = (args.out.as_deref(), args.json);
    let wall = std::time::Instant::now();
    let (report, output) = loaded
        .run()
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let elapsed = wall.elapsed();
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", experiment::format_report(&report));
        let disk_requests: u64 = output.disks.iter().map(|d| d.stats.completed).sum();
        outln!(
            "\n{} requests simulated in {:.2} s of wall time: {} disk requests, {:.2} M per wall second",
            output.records.len(),
            elapsed.as_secs_f64(),
            disk_requests,
            disk_requests as f64 / elapsed.as_secs_f64() / 1e6
        );
    }
    if let Some(dir) = out {
        let written =
            experiment::write_outputs(dir, &report, &output).map_err(anyhow::Error::msg)?;
        if !json {
            outln!("wrote {} files to {}", written.len(), dir.display());
        }
    }
    if report.read_mismatches > 0 {
        bail!("{} reads returned wrong data", report.read_mismatches);
    }
    Ok(())
}
