//! Whole-stack simulation testing (`strata sim explore`): from a seed, random hierarchies of
//! the registry's kinds over crash disks, random client work against them, and random
//! events between (power cuts, process crashes, disks that go and come back stale, latency
//! spikes, thin volumes made, resized and deleted), each start checked against a reference
//! model of what every target must hold. A failing run prints the one line that replays it,
//! shrunk to the fewest steps that still fail. See `docs/explore.md`.

pub mod client;
pub mod coverage;
pub mod disks;
pub mod generate;
pub mod rng;
pub mod site;
pub mod world;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

pub use coverage::Coverage;
pub use generate::{plan, Plan, Step};
pub use world::{Failure, Outcome};

use crate::executor::derive_seed;

/// What to explore.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Runs `first..first + runs`.
    pub first: u64,
    pub runs: u64,
    /// Only these steps of each run (indexes into its plan), to replay a shrunk failure.
    pub steps: Option<Vec<usize>>,
    /// Worker threads.
    pub jobs: usize,
    /// Shrink the first failure to the fewest steps that still fail.
    pub shrink: bool,
    /// Start no run after the first failure (runs under way finish).
    pub stop_at_failure: bool,
}

/// A run that failed, shrunk where it could be.
#[derive(Clone, Debug)]
pub struct Found {
    pub run: u64,
    pub failure: Failure,
    /// The fewest steps (indexes into the plan) that still fail, if shrinking found fewer.
    pub shrunk: Option<(Vec<usize>, Failure)>,
}

/// What an exploration did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub runs: u64,
    pub coverage: Coverage,
    pub disk_requests: u64,
    pub seconds: f64,
    pub failures: Vec<Found>,
}

/// Run `run` of seed `seed`: its own seed, from which its plan and everything it does are
/// drawn.
pub fn run_seed(seed: u64, run: u64) -> u64 {
    derive_seed(seed, &format!("run-{run}"))
}

/// The command that replays run `run` (with only `steps`, when shrunk).
pub fn replay_line(seed: u64, run: u64, steps: Option<&[usize]>) -> String {
    let mut line = format!("strata sim explore --seed {seed} --run {run}");
    if let Some(steps) = steps {
        let list: Vec<String> = steps.iter().map(|s| s.to_string()).collect();
        line.push_str(&format!(" --steps {}", list.join(",")));
    }
    line
}

/// A folder with what generated configurations refer to (a crypt layer's key file).
pub struct DataDir(PathBuf);

impl DataDir {
    pub fn create() -> std::io::Result<DataDir> {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "strata-explore-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("keys"))?;
        let key: Vec<u8> = (0..64).collect();
        std::fs::write(dir.join("keys/enc.key"), key)?;
        Ok(DataDir(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

thread_local! {
    /// The run this thread is on, for the panic hook (a release build aborts on panic, so the
    /// hook is the only chance to say which run it was).
    static CURRENT: std::cell::Cell<Option<(u64, u64)>> = const { std::cell::Cell::new(None) };
}

/// The run a panic happened in, if it happened in one: `(seed, run)`.
pub fn current_run() -> Option<(u64, u64)> {
    CURRENT.with(|c| c.get())
}

/// Plays one run; a panic in it is a failure too (in builds that unwind).
pub fn play(
    seed: u64,
    run: u64,
    steps: Option<&[usize]>,
    data_dir: &Path,
) -> Result<Outcome, Failure> {
    let plan = plan(run_seed(seed, run));
    CURRENT.with(|c| c.set(Some((seed, run))));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        world::run(&plan, run_seed(seed, run), steps, data_dir)
    }));
    CURRENT.with(|c| c.set(None));
    // The data folder's name differs from process to process; a run's text must not.
    let folder = data_dir.display().to_string();
    let anonymous = |text: &str| text.replace(&folder, "DATA");
    match result {
        Ok(Ok(mut outcome)) => {
            outcome.log.iter_mut().for_each(|l| *l = anonymous(l));
            Ok(outcome)
        }
        Ok(Err(mut failure)) => {
            failure.message = anonymous(&failure.message);
            failure.log.iter_mut().for_each(|l| *l = anonymous(l));
            Err(failure)
        }
        Err(panic) => Err(Failure {
            message: format!("panicked: {}", strata_crash::panic_message(&panic)),
            step: None,
            log: Vec::new(),
        }),
    }
}

/// The fewest steps of run `run` that still fail: drops steps one at a time, keeping each
/// drop that still fails, until none can go (at most `budget` replays).
pub fn shrink(
    seed: u64,
    run: u64,
    failing: &[usize],
    data_dir: &Path,
    budget: usize,
) -> Option<(Vec<usize>, Failure)> {
    let mut steps: Vec<usize> = failing.to_vec();
    let mut best = None;
    let mut replays = 0;
    let mut progress = true;
    while progress && replays < budget {
        progress = false;
        let mut i = steps.len();
        while i > 0 && replays < budget {
            i -= 1;
            let mut fewer = steps.clone();
            fewer.remove(i);
            replays += 1;
            if let Err(failure) = play(seed, run, Some(&fewer), data_dir) {
                steps = fewer;
                best = Some(failure);
                progress = true;
            }
        }
    }
    best.map(|failure| (steps, failure))
}

/// Plays runs `first..first + runs` of `seed` on `jobs` threads.
pub fn explore(options: &Options, data_dir: &Path, mut progress: impl FnMut(u64, u64)) -> Report {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(options.first));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let end = options.first + options.runs;
    let (send, receive) = mpsc::channel::<(u64, Result<Outcome, Failure>)>();
    let mut report = Report::default();
    std::thread::scope(|scope| {
        for _ in 0..options.jobs.max(1) {
            let next = next.clone();
            let stop = stop.clone();
            let send = send.clone();
            let steps = options.steps.clone();
            scope.spawn(move || loop {
                let run = next.fetch_add(1, Ordering::Relaxed);
                if run >= end || stop.load(Ordering::Relaxed) {
                    return;
                }
                let result = play(options.seed, run, steps.as_deref(), data_dir);
                if send.send((run, result)).is_err() {
                    return;
                }
            });
        }
        drop(send);
        for (run, result) in receive {
            report.runs += 1;
            match result {
                Ok(outcome) => {
                    report.coverage.merge(&outcome.coverage);
                    report.disk_requests += outcome.disk_requests;
                }
                Err(failure) => {
                    if options.stop_at_failure {
                        stop.store(true, Ordering::Relaxed);
                    }
                    report.failures.push(Found {
                        run,
                        failure,
                        shrunk: None,
                    })
                }
            }
            progress(report.runs, options.runs);
        }
    });
    report.failures.sort_by_key(|f| f.run);
    if options.shrink {
        if let Some(first) = report.failures.first_mut() {
            let plan = plan(run_seed(options.seed, first.run));
            let all: Vec<usize> = (0..plan.steps.len()).collect();
            let steps = options.steps.clone().unwrap_or(all);
            // Only the steps up to the failing one can matter.
            let upto: Vec<usize> = match first.failure.step {
                Some(step) => steps.iter().copied().filter(|&s| s <= step).collect(),
                None => steps,
            };
            first.shrunk = shrink(options.seed, first.run, &upto, data_dir, 200);
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}
