//! `strata sim explore`: the command line of whole-stack simulation testing.

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::{bail, Context};
use strata_core::planted::{self, Bug};
use strata_core::{errln, outln};
use strata_sim::explore::{self, DataDir, Options, Report};

#[derive(clap::Args)]
pub struct ExploreArgs {
    /// The seed every run's plan is drawn from.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many runs (run numbers 0..runs, or from --run; default 100, or 1 with --run).
    #[arg(long)]
    runs: Option<u64>,
    /// Only run this one (with --runs 1 unless --runs is given too).
    #[arg(long)]
    run: Option<u64>,
    /// Only these steps of the run (comma-separated indexes, as a shrunk failure prints).
    #[arg(long, value_delimiter = ',')]
    steps: Option<Vec<usize>>,
    /// Worker threads (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Print each run's plan and what happened in it.
    #[arg(long)]
    verbose: bool,
    /// Do not shrink a failure.
    #[arg(long)]
    no_shrink: bool,
    /// Start no more runs after the first failure.
    #[arg(long)]
    stop_at_failure: bool,
    /// Turn on a deliberate defect (testing the explorer itself): stripe-flush-dropped,
    /// thin-map-before-data, raid5-parity-skipped, mirror-stale-leg-read,
    /// mirror-degraded-unasked.
    #[arg(long)]
    plant: Option<String>,
}

pub fn run(args: ExploreArgs) -> anyhow::Result<()> {
    if let Some(name) = &args.plant {
        let Some(bug) = Bug::from_name(name) else {
            let names: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
            bail!(
                "--plant: no defect named {name:?} (known: {})",
                names.join(", ")
            );
        };
        planted::plant(Some(bug));
    }
    install_panic_hook();
    if std::env::var_os("STRATA_EXPLORE_TRACE").is_some() {
        // The layers' own warnings (a member failed, a commit failed), beside the trace.
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter("warn")
            .init();
    }
    let data_dir = DataDir::create().context("creating a data folder for key files")?;
    let runs = args
        .runs
        .unwrap_or(if args.run.is_some() { 1 } else { 100 });
    let options = Options {
        seed: args.seed,
        first: args.run.unwrap_or(0),
        runs,
        steps: args.steps.clone(),
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        shrink: !args.no_shrink,
        stop_at_failure: args.stop_at_failure,
    };
    if args.verbose {
        return verbose(&options, data_dir.path());
    }
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let report = explore::explore(&options, data_dir.path(), |done, total| {
        if tty && (done % 50 == 0 || done == total) {
            eprint!(
                "\r{done}/{total} runs, {:.1} runs/s",
                done as f64 / started.elapsed().as_secs_f64()
            );
        }
    });
    if tty {
        eprintln!();
    }
    print_report(&options, &report);
    if !report.failures.is_empty() {
        bail!("{} of {} runs failed", report.failures.len(), report.runs);
    }
    Ok(())
}

fn print_report(options: &Options, report: &Report) {
    for found in &report.failures {
        outln!(
            "FAILED run {} (seed {}) at {}: {}",
            found.run,
            options.seed,
            match found.failure.step {
                None => "the first start".to_string(),
                Some(s)
                    if s == explore::plan(explore::run_seed(options.seed, found.run))
                        .steps
                        .len() =>
                    "the final restart".to_string(),
                Some(s) => format!("step {s}"),
            },
            found.failure.message
        );
        outln!(
            "  replay: {}",
            explore::replay_line(options.seed, found.run, options.steps.as_deref())
        );
        if let Some((steps, failure)) = &found.shrunk {
            outln!(
                "  shrunk to {} steps: {}",
                steps.len(),
                explore::replay_line(options.seed, found.run, Some(steps))
            );
            outln!("  which fails with: {}", failure.message);
        }
    }
    outln!(
        "{} runs, {} failed, {:.1} s, {:.1} runs/s, {} disk requests ({:.0}/s)",
        report.runs,
        report.failures.len(),
        report.seconds,
        report.runs as f64 / report.seconds.max(1e-9),
        report.disk_requests,
        report.disk_requests as f64 / report.seconds.max(1e-9)
    );
    outln!("coverage:");
    strata_core::out!("{}", report.coverage.render());
}

/// One run at a time, with its plan and log.
fn verbose(options: &Options, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let mut failed = 0;
    for run in options.first..options.first + options.runs {
        let plan = explore::plan(explore::run_seed(options.seed, run));
        outln!("run {run} (seed {}):", options.seed);
        strata_core::out!("{}", plan.config);
        for (i, step) in plan.steps.iter().enumerate() {
            outln!("  step {i}: {step}");
        }
        let result = explore::play(options.seed, run, options.steps.as_deref(), data_dir);
        let (log, verdict) = match &result {
            Ok(outcome) => (&outcome.log, "passed".to_string()),
            Err(failure) => {
                failed += 1;
                (&failure.log, format!("FAILED: {}", failure.message))
            }
        };
        for line in log {
            outln!("{line}");
        }
        outln!("run {run}: {verdict}");
    }
    if failed > 0 {
        bail!("{failed} runs failed");
    }
    Ok(())
}

/// A release build aborts on a panic: say first which run it was.
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        if let Some((seed, run)) = explore::current_run() {
            errln!(
                "strata: run {run} panicked; replay: {}",
                explore::replay_line(seed, run, None)
            );
        }
    }));
}
