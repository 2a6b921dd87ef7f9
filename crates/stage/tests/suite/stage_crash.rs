//! The stage under the crash harness: it must behave like one disk with a volatile cache
//! through any power cut, during staging, during a destage (which the small log makes
//! frequent), and at every single step of a destage.
//!
//! Replay one seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-stage --test suite -- stage_crash::`.
//! Run longer: `STRATA_CRASH_ITERATIONS=100000 cargo test -p strata-stage --test suite -- stage_crash::`.

use std::sync::Arc;

use bytes::Bytes;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::testkit::panic_report;
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashGroup, CrashPlan, CrashPolicy, CrashRng,
    CrashRun, CrashStats, DiskImage, ScenarioConfig,
};
use strata_stage::{check_state, Stage, StageConfig, StageDevice};

use crate::common;
use common::*;

const SLOW: u64 = 2 << 20;
/// 24 log slots: a 64 KiB workload write is direct, but a handful of small ones fill the log,
/// so destages (and power cuts inside them) are frequent.
const SLOTS: u64 = 24;

fn disks() -> Vec<strata_core::Geometry> {
    vec![sector_disk(fast_size(SLOTS)), sector_disk(SLOW)]
}

async fn open_stage(
    group: &CrashGroup,
    images: Option<Vec<DiskImage>>,
    config: &StageConfig,
    planted_bug: bool,
) -> strata_core::Result<Arc<Stage>> {
    let fresh = images.is_none();
    let mut disks = open_disks(group, &disks(), images);
    let slow: DeviceRef = Arc::new(disks.pop().unwrap());
    let fast: DeviceRef = Arc::new(disks.pop().unwrap());
    let mut settings = settings(config);
    settings.unsafe_skip_data_barrier = planted_bug;
    settings.background = BACKGROUND.with(|b| b.get());
    let stage = if fresh {
        Stage::format("st", fast, slow, config, settings).await?
    } else {
        Stage::open("st", fast, slow, settings).await?
    };
    let problems = stage.store().read(check_state);
    assert!(
        problems.is_empty(),
        "invariants broken after reopen: {problems:?}"
    );
    Ok(stage)
}

thread_local! {
    /// Destage from the background task, as a served stage does, instead of inline in the
    /// write that crossed the trigger (set per test thread by `run_flat_background`).
    static BACKGROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn scenario(concurrency: usize) -> ScenarioConfig {
    let mut scenario = ScenarioConfig::new(disks());
    scenario.rounds = 4;
    scenario.ops_per_round = 40;
    scenario.max_write = 64 << 10;
    scenario.concurrency = concurrency;
    // A discard unmaps: the range reads as zeros, which the workload then checks.
    scenario.discard_zeroes = true;
    scenario
}

async fn flat_seed(
    seed: u64,
    scenario: ScenarioConfig,
    trigger: &'static str,
    planted_bug: bool,
) -> Result<CrashStats, String> {
    let config = config(trigger);
    flat_device_scenario(seed, &scenario, |group, images| {
        let group = group.clone();
        let config = config.clone();
        async move {
            let stage = open_stage(&group, images, &config, planted_bug).await?;
            Ok(Arc::new(StageDevice(stage)) as DeviceRef)
        }
    })
    .await
}

fn run_flat(name: &'static str, iterations: u64, concurrency: usize, trigger: &'static str) {
    let run = CrashRun {
        name,
        replay: "cargo test -p strata-stage --test suite -- stage_crash::",
        default_iterations: iterations,
    };
    let scenario = scenario(concurrency);
    let summary = run.run_async(|seed| flat_seed(seed, scenario.clone(), trigger, false));
    assert!(summary.crash_points >= summary.iterations);
}

#[test]
fn the_stage_keeps_every_flushed_write_through_power_cuts() {
    run_flat("stage, full trigger", 1000, 1, "full");
}

#[test]
fn the_stage_with_concurrent_requests_survives_power_cuts() {
    run_flat("stage, full trigger, concurrent", 400, 4, "full");
}

/// The served stage's way: a background task destages (woken by each write and every
/// 100 ms) while the workload goes on, so power cuts land in destages racing writes. The
/// 24-slot log also fills under it, so writes destage through the backstop as well (40
/// seeds of each: 362 destages, 637 log-full waits).
#[test]
fn the_background_destager_survives_power_cuts() {
    BACKGROUND.with(|b| b.set(true));
    run_flat(
        "stage, background destager, watermark, concurrent",
        300,
        4,
        "watermark",
    );
    run_flat("stage, background destager, density", 300, 1, "density");
    BACKGROUND.with(|b| b.set(false));
}

#[test]
fn the_background_triggers_survive_power_cuts() {
    run_flat("stage, density trigger", 400, 1, "density");
    run_flat("stage, watermark trigger, concurrent", 300, 4, "watermark");
}

/// The ordering bug a stage must not have: a map entry committed before the log data it
/// points at is durable. The harness must catch it.
#[test]
fn the_harness_catches_metadata_committed_before_its_data() {
    let run = CrashRun {
        name: "stage with the data barrier removed",
        replay: "cargo test -p strata-stage --test suite -- stage_crash::catches",
        default_iterations: 0,
    };
    let scenario = scenario(1);
    let plan = CrashPlan {
        first: 0xBAD_0000,
        count: 400,
    };
    let message = panic_report(
        || run.run_plan_async(plan, |seed| flat_seed(seed, scenario.clone(), "full", true)),
        "400 seeds ran with the ordering bug planted and none failed",
    );
    assert!(message.contains("replay: STRATA_CRASH_SEED="), "{message}");
}

/// Staged blocks (some overwritten, some in ranges with no base yet), all flushed; then a
/// destage with the power cut at its `cut`-th disk operation (None: no cut). Returns the
/// disk operations the destage took, and the images.
async fn destage_with_cut(
    seed: u64,
    cut: Option<u64>,
) -> Result<(u64, Vec<DiskImage>, Vec<u8>), String> {
    let config = config("full");
    let mut rng = CrashRng::seed_from_u64(seed);
    let group = CrashGroup::new();
    let stage = open_stage(&group, None, &config, false)
        .await
        .map_err(|e| e.to_string())?;
    let device = StageDevice(stage.clone());
    let mut model = vec![0u8; SLOW as usize];
    // A direct write first, so that some staged blocks overwrite blocks on the slow child.
    let first = rng.random_range(0..(SLOW / BLOCK - 16));
    let mut writes = vec![(first, 16u64)];
    for _ in 0..rng.random_range(4..20) {
        writes.push((rng.random_range(0..SLOW / BLOCK), 1));
    }
    for (i, (block, count)) in writes.into_iter().enumerate() {
        let data: Vec<u8> = (block..block + count)
            .flat_map(|b| block_data(b, i as u8 + 1))
            .collect();
        let at = (block * BLOCK) as usize;
        model[at..at + data.len()].copy_from_slice(&data);
        let fua = rng.random_bool(0.2);
        device
            .write(block * BLOCK, Bytes::from(data), WriteFlags { fua })
            .await
            .map_err(|e| e.to_string())?;
    }
    device.flush().await.map_err(|e| e.to_string())?;
    let before = group.mutating_ops();
    if let Some(cut) = cut {
        group.arm_crash_at(before + cut);
    }
    let destaged = stage.destage_all().await;
    if cut.is_none() {
        destaged.map_err(|e| format!("destage without a cut failed: {e}"))?;
    }
    let ops = group.mutating_ops() - before;
    let images = group.crash_with(CrashPolicy::Random, &mut rng);
    Ok((ops, images, model))
}

/// Every step of a destage: for each seed, the destage's disk operations are counted once,
/// then the power is cut at each of them in turn (with a random survival of the unflushed
/// ones). Everything was flushed before the destage, so after each cut the device must read
/// exactly as before it, and a destage after the reopen must complete.
#[test]
fn a_power_cut_at_every_step_of_a_destage_loses_nothing() {
    let run = CrashRun {
        name: "stage, cut at every destage step",
        replay: "cargo test -p strata-stage --test suite -- stage_crash::every_step",
        default_iterations: 60,
    };
    let summary = run.run_async(|seed| async move {
        let (steps, _, _) = destage_with_cut(seed, None).await?;
        let mut stats = CrashStats::default();
        for cut in 0..steps {
            let (_, images, model) = destage_with_cut(seed, Some(cut)).await?;
            let group = CrashGroup::new();
            let stage = open_stage(&group, Some(images), &config("full"), false)
                .await
                .map_err(|e| format!("cut at destage step {cut} of {steps}: reopen: {e}"))?;
            let device = StageDevice(stage.clone());
            let read = device
                .read(0, SLOW as usize)
                .await
                .map_err(|e| e.to_string())?;
            if read[..] != model[..] {
                let bad = (0..model.len()).find(|&i| read[i] != model[i]).unwrap();
                return Err(format!(
                    "cut at destage step {cut} of {steps}: block {} differs after the reopen \
                     (first bad byte {bad})",
                    bad as u64 / BLOCK
                ));
            }
            stage
                .destage_all()
                .await
                .map_err(|e| format!("cut at step {cut}: destage after reopen: {e}"))?;
            let again = device
                .read(0, SLOW as usize)
                .await
                .map_err(|e| e.to_string())?;
            if again[..] != model[..] {
                return Err(format!(
                    "cut at step {cut}: wrong data after the second destage"
                ));
            }
            stats.crash_points += 1;
        }
        Ok(stats)
    });
    assert!(
        summary.crash_points >= summary.iterations * 10,
        "{summary:?}"
    );
}
