//! Seeded, replayable crash runs.
//!
//! A crash test is a function of a seed. [`CrashRun`] runs it for a range of seeds and, on the
//! first failure, panics with the seed and the exact command that replays it, so a red CI run
//! is one copy-paste away from a debugger. Environment variables:
//! - `STRATA_CRASH_SEED=<u64>`: run just that seed (the replay).
//! - `STRATA_CRASH_ITERATIONS=<n>`: run `n` seeds instead of the default (the longer run).
//! - `STRATA_CRASH_BASE=<u64>`: the first seed (default [`DEFAULT_BASE_SEED`], fixed so CI is
//!   reproducible; change it to explore seeds CI never ran).
//!
//! A body that panics is reported like one that returns an error: with its seed.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

pub const ENV_SEED: &str = "STRATA_CRASH_SEED";
pub const ENV_ITERATIONS: &str = "STRATA_CRASH_ITERATIONS";
pub const ENV_BASE: &str = "STRATA_CRASH_BASE";
/// The first seed when `STRATA_CRASH_BASE` is unset.
pub const DEFAULT_BASE_SEED: u64 = 0x5EED_0000;

/// A named crash test and how to replay it.
#[derive(Clone, Debug)]
pub struct CrashRun {
    pub name: &'static str,
    /// The command that runs this test, e.g. `cargo test -p strata-meta --test crash -- recovery`.
    pub replay: &'static str,
    pub default_iterations: u64,
}

/// What one seed did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashStats {
    /// Crashes (power cuts followed by a reopen and a check) this seed went through.
    pub crash_points: u64,
}

/// What a whole run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashSummary {
    pub iterations: u64,
    pub crash_points: u64,
    pub elapsed: Duration,
}

/// The seeds a run will use: `first`, `first + 1`, … (`count` of them, wrapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashPlan {
    pub first: u64,
    pub count: u64,
}

fn parse(env: &impl Fn(&str) -> Option<String>, name: &str) -> Option<u64> {
    let value = env(name)?;
    let trimmed = value.trim();
    let parsed = match trimmed.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => trimmed.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={value:?} is not a u64")))
}

/// The text of a panic payload (`&str` or `String`), for tests that check a run's report.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

impl CrashRun {
    /// The seeds the environment asks for.
    pub fn plan(&self) -> CrashPlan {
        self.plan_from(|name| std::env::var(name).ok())
    }

    /// The seeds `env` asks for (a function so tests need not touch the process environment).
    pub fn plan_from(&self, env: impl Fn(&str) -> Option<String>) -> CrashPlan {
        if let Some(seed) = parse(&env, ENV_SEED) {
            return CrashPlan {
                first: seed,
                count: 1,
            };
        }
        CrashPlan {
            first: parse(&env, ENV_BASE).unwrap_or(DEFAULT_BASE_SEED),
            count: parse(&env, ENV_ITERATIONS).unwrap_or(self.default_iterations),
        }
    }

    /// Runs `body(seed)` for the seeds of [`Self::plan`]; panics on the first failure with the
    /// error, the seed and the line that replays it. Prints a summary to stderr.
    pub fn run<F>(&self, body: F) -> CrashSummary
    where
        F: FnMut(u64) -> Result<CrashStats, String>,
    {
        self.run_plan(self.plan(), body)
    }

    /// [`Self::run`] for async bodies, on one current-thread tokio runtime built for the run.
    /// Call it from a plain `#[test]`, not from inside a runtime.
    pub fn run_async<F, Fut>(&self, body: F) -> CrashSummary
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = Result<CrashStats, String>>,
    {
        self.run_plan_async(self.plan(), body)
    }

    /// [`Self::run_async`] over explicit seeds, ignoring the environment.
    pub fn run_plan_async<F, Fut>(&self, plan: CrashPlan, mut body: F) -> CrashSummary
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = Result<CrashStats, String>>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
        self.run_plan(plan, |seed| runtime.block_on(body(seed)))
    }

    /// [`Self::run`] over explicit seeds, ignoring the environment.
    pub fn run_plan<F>(&self, plan: CrashPlan, mut body: F) -> CrashSummary
    where
        F: FnMut(u64) -> Result<CrashStats, String>,
    {
        let started = Instant::now();
        let mut crash_points = 0;
        for i in 0..plan.count {
            let seed = plan.first.wrapping_add(i);
            let outcome = catch_unwind(AssertUnwindSafe(|| body(seed)))
                .unwrap_or_else(|payload| Err(format!("panicked: {}", panic_message(&*payload))));
            match outcome {
                Ok(stats) => crash_points += stats.crash_points,
                Err(error) => panic!(
                    "crash run `{}` failed on seed {seed} (iteration {} of {}):\n{error}\n\
                     replay: {ENV_SEED}={seed} {}",
                    self.name,
                    i + 1,
                    plan.count,
                    self.replay
                ),
            }
        }
        let summary = CrashSummary {
            iterations: plan.count,
            crash_points,
            elapsed: started.elapsed(),
        };
        eprintln!(
            "crash run `{}`: {} iterations, {} crash points, {:.2?} (seeds {}..{}; more: {ENV_ITERATIONS}=<n>)",
            self.name,
            summary.iterations,
            summary.crash_points,
            summary.elapsed,
            plan.first,
            plan.first.wrapping_add(plan.count),
        );
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> CrashRun {
        CrashRun {
            name: "unit",
            replay: "cargo test -p strata-crash -- unit",
            default_iterations: 10,
        }
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        }
    }

    #[test]
    fn plan_reads_seed_iterations_and_base() {
        let default = run().plan_from(env(&[]));
        assert_eq!(
            default,
            CrashPlan {
                first: DEFAULT_BASE_SEED,
                count: 10
            }
        );
        let longer = run().plan_from(env(&[(ENV_ITERATIONS, "1000000"), (ENV_BASE, "0x10")]));
        assert_eq!(
            longer,
            CrashPlan {
                first: 16,
                count: 1_000_000
            }
        );
        let replay = run().plan_from(env(&[(ENV_SEED, "42"), (ENV_ITERATIONS, "9")]));
        assert_eq!(
            replay,
            CrashPlan {
                first: 42,
                count: 1
            }
        );
    }

    #[test]
    #[should_panic(expected = "is not a u64")]
    fn a_bad_seed_is_refused_loudly() {
        run().plan_from(env(&[(ENV_SEED, "forty-two")]));
    }

    #[test]
    fn counts_crash_points_and_visits_each_seed() {
        let mut seen = Vec::new();
        let summary = run().run_plan(CrashPlan { first: 5, count: 4 }, |seed| {
            seen.push(seed);
            Ok(CrashStats { crash_points: 3 })
        });
        assert_eq!(seen, vec![5, 6, 7, 8]);
        assert_eq!(summary.iterations, 4);
        assert_eq!(summary.crash_points, 12);
    }

    #[test]
    fn failures_and_panics_name_the_seed_and_the_replay_line() {
        for panics in [false, true] {
            let result = catch_unwind(|| {
                run().run_plan(
                    CrashPlan {
                        first: 100,
                        count: 10,
                    },
                    |seed| {
                        if seed == 103 {
                            assert!(!panics, "boom at {seed}");
                            return Err("wrong data".into());
                        }
                        Ok(CrashStats::default())
                    },
                )
            });
            let message = panic_message(&*result.expect_err("the run must fail"));
            assert!(
                message.contains("seed 103 (iteration 4 of 10)"),
                "{message}"
            );
            let cause = if panics { "boom at 103" } else { "wrong data" };
            assert!(message.contains(cause), "{message}");
            assert!(
                message
                    .contains("replay: STRATA_CRASH_SEED=103 cargo test -p strata-crash -- unit"),
                "{message}"
            );
        }
    }

    #[test]
    fn async_bodies_run_on_one_runtime() {
        let summary = run().run_plan_async(CrashPlan { first: 0, count: 3 }, |seed| async move {
            tokio::task::yield_now().await;
            Ok(CrashStats { crash_points: seed })
        });
        assert_eq!(summary.crash_points, 3);
    }
}
