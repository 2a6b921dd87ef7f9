//! Consistency intervals over a simulated network with faults (`strata_sim::intervals`):
//! thousands of seeds of message loss, delays, brick power cuts, client deaths and pauses
//! past the lease, each checked for atomicity, what clients were told, per-client order,
//! replica equality and, with versions announced at random times, every version on every
//! brick against the model, and a roll-back in about half the seeds. Replay one seed:
//! `STRATA_CRASH_SEED=<seed> cargo test -p strata-sim --test suite -- intervals::`.

use std::sync::Mutex;

use strata_crash::testkit::panic_report;
use strata_crash::{CrashPlan, CrashRun, CrashStats};
use strata_sim::intervals::{run_seed, Faults, RunStats};

const INTERVALS_PER_CLIENT: u64 = 8;

#[test]
fn intervals_stay_whole_and_replicas_equal_under_network_faults_power_cuts_and_pauses() {
    let run = CrashRun {
        name: "intervals over a faulty network",
        replay: "cargo test -p strata-sim --test suite -- intervals::intervals_stay",
        default_iterations: 1000,
    };
    let total = Mutex::new(RunStats::default());
    let summary = run.run(|seed| {
        let stats = run_seed(seed, INTERVALS_PER_CLIENT, &Faults::default())?;
        let mut total = total.lock().unwrap();
        total.intervals += stats.intervals;
        total.committed += stats.committed;
        total.brick_crashes += stats.brick_crashes;
        total.client_deaths += stats.client_deaths;
        total.client_pauses += stats.client_pauses;
        total.resolved += stats.resolved;
        total.versions += stats.versions;
        total.sealed_in_run += stats.sealed_in_run;
        total.stragglers += stats.stragglers;
        total.rollbacks += stats.rollbacks;
        total.carried += stats.carried;
        Ok(CrashStats {
            crash_points: stats.brick_crashes,
        })
    });
    let total = *total.lock().unwrap();
    eprintln!("{summary:?}: {total:?}");
    // The faults happened, and the protocol still got work done.
    let seeds = summary.iterations;
    assert!(total.brick_crashes >= seeds, "{total:?}");
    assert!(total.client_pauses * 10 >= seeds, "{total:?}");
    assert!(total.client_deaths * 20 >= seeds, "{total:?}");
    assert!(total.resolved * 10 >= seeds, "{total:?}");
    assert!(total.committed * 2 >= total.intervals, "{total:?}");
    // Versions were announced, sealed during the run in some seeds, rolled back to in about
    // half, and some intervals committed after a version above their tag was created.
    assert!(total.versions * 2 >= seeds, "{total:?}");
    assert!(total.sealed_in_run * 4 >= seeds, "{total:?}");
    assert!(total.rollbacks * 4 >= seeds, "{total:?}");
    assert!(total.stragglers * 50 >= seeds, "{total:?}");
    // Commits carried by the next prepare, with the same faults.
    assert!(total.carried * 2 >= seeds, "{total:?}");
}

/// Bricks that acknowledge a resolver's fence without keeping it: a client paused past its
/// lease wakes up and commits on a brick whose state a resolution already read as prepared.
/// The simulation must find an interval committed on one copy and aborted on the other.
#[test]
fn the_simulation_catches_bricks_that_ignore_a_resolvers_fence() {
    let run = CrashRun {
        name: "intervals with fences ignored",
        replay: "cargo test -p strata-sim --test suite -- intervals::the_simulation",
        default_iterations: 0,
    };
    // Commits sent alone, as this test was written for: a paused client's late commit is one
    // call. With commits carried the fault is caught too, by other symptoms (below).
    let faults = Faults {
        unsafe_peers_ignore_fences: true,
        client_pauses: 0.3,
        carry_commits: false,
        ..Faults::default()
    };
    let plan = CrashPlan {
        first: 0xFE_0000,
        count: 2000,
    };
    let message = panic_report(
        || {
            run.run_plan(plan, |seed| {
                run_seed(seed, INTERVALS_PER_CLIENT, &faults).map(|_| CrashStats::default())
            })
        },
        "2000 seeds ran with fences ignored and none failed",
    );
    assert!(message.contains("half committed"), "{message}");
    let carrying = Faults {
        carry_commits: true,
        ..faults
    };
    panic_report(
        || {
            run.run_plan(plan, |seed| {
                run_seed(seed, INTERVALS_PER_CLIENT, &carrying).map(|_| CrashStats::default())
            })
        },
        "2000 seeds ran with fences ignored and commits carried, and none failed",
    );
}

/// A client whose tags go down (a host that forgot its version floor): per unit, an interval
/// tagged below an earlier one of the same unit commits after it, and the bricks'
/// copy-on-write by tag gives the old data to the wrong version. The simulation must find a
/// version that no longer reads as the intervals tagged below it.
#[test]
fn the_simulation_catches_tags_that_go_down() {
    let run = CrashRun {
        name: "intervals with tags that go down",
        replay: "cargo test -p strata-sim --test suite -- intervals::the_simulation",
        default_iterations: 0,
    };
    let faults = Faults {
        unsafe_tags_go_down: true,
        ..Faults::default()
    };
    let plan = CrashPlan {
        first: 0x7A_0000,
        count: 2000,
    };
    let message = panic_report(
        || {
            run.run_plan(plan, |seed| {
                run_seed(seed, INTERVALS_PER_CLIENT, &faults).map(|_| CrashStats::default())
            })
        },
        "2000 seeds ran with tags going down and none failed",
    );
    assert!(message.contains("differs from the model"), "{message}");
}
