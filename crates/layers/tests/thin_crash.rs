//! The thin pool under the crash harness: a volume must behave like one disk with a volatile
//! cache through any power cut: flushed and FUA writes survive, nothing reads back that was
//! never written there (another extent's old bytes included).
//!
//! Replay one seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-layers --test thin_crash`.
//! Run longer: `STRATA_CRASH_ITERATIONS=100000 cargo test -p strata-layers --test thin_crash`.

use std::sync::Arc;

use strata_core::{DeviceRef, TokioRuntime};
use strata_crash::{
    flat_device_scenario, open_disks, panic_message, sector_disk, CrashGroup, CrashPlan, CrashRun,
    CrashStats, DiskImage, ScenarioConfig,
};
use strata_layers::thin::{check_state, PoolOptions, PoolRuntime, ThinPool};

const EXTENT: u64 = 64 << 10;
/// 1 MiB of metadata and 24 extents of data, for a 1 MiB (16-extent) volume: extents are
/// freed and reused within a run.
const DISK: u64 = (1 << 20) + 24 * EXTENT;
const VOLUME: u64 = 1 << 20;

async fn open_volume(
    group: &CrashGroup,
    images: Option<Vec<DiskImage>>,
    planted_bug: bool,
) -> strata_core::Result<DeviceRef> {
    let fresh = images.is_none();
    let disk = open_disks(group, &[sector_disk(DISK)], images).remove(0);
    let child: DeviceRef = Arc::new(disk);
    let mut settings = PoolRuntime::new(TokioRuntime::current());
    settings.commit_interval = None;
    settings.unsafe_skip_data_barrier = planted_bug;
    let pool = if fresh {
        let options = PoolOptions {
            extent_size: EXTENT,
            metadata_size: Some(1 << 20),
            start_mid: false,
        };
        let pool = ThinPool::format("pool", child, &options, settings).await?;
        pool.create_volume("v", VOLUME).await?;
        pool
    } else {
        ThinPool::open("pool", child, settings).await?.0
    };
    let problems = pool.store().read(check_state);
    assert!(
        problems.is_empty(),
        "pool invariants broken after reopen: {problems:?}"
    );
    Ok(pool.volume("v").expect("volume v"))
}

fn config() -> ScenarioConfig {
    let mut config = ScenarioConfig::new(vec![sector_disk(DISK)]);
    config.rounds = 4;
    config.ops_per_round = 40;
    config.max_write = 128 << 10;
    config
}

#[test]
fn thin_volume_keeps_every_flushed_write_through_power_cuts() {
    let run = CrashRun {
        name: "thin volume",
        replay: "cargo test -p strata-layers --test thin_crash thin_volume_keeps",
        default_iterations: 1500,
    };
    let config = config();
    let summary = run.run_async(|seed| {
        let config = config.clone();
        async move {
            flat_device_scenario(seed, &config, |group, images| {
                let group = group.clone();
                async move { open_volume(&group, images, false).await }
            })
            .await
        }
    });
    assert!(summary.crash_points >= summary.iterations);
}

#[test]
fn thin_volume_with_concurrent_requests_survives_power_cuts() {
    let run = CrashRun {
        name: "thin volume, concurrent",
        replay: "cargo test -p strata-layers --test thin_crash concurrent",
        default_iterations: 500,
    };
    let mut config = config();
    config.concurrency = 4;
    let summary = run.run_async(|seed| {
        let config = config.clone();
        async move {
            flat_device_scenario(seed, &config, |group, images| {
                let group = group.clone();
                async move { open_volume(&group, images, false).await }
            })
            .await
        }
    });
    assert!(summary.crash_points >= summary.iterations);
}

/// The ordering bug every thin layer must not have: metadata committed before the data it
/// points to is durable. The harness must catch it, and say how to replay it.
#[test]
fn the_harness_catches_metadata_committed_before_its_data() {
    let run = CrashRun {
        name: "thin volume with the data barrier removed",
        replay: "cargo test -p strata-layers --test thin_crash catches",
        default_iterations: 0,
    };
    let config = config();
    let plan = CrashPlan {
        first: 0xBAD_0000,
        count: 400,
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run.run_plan_async(plan, |seed| {
            let config = config.clone();
            async move {
                flat_device_scenario(seed, &config, |group, images| {
                    let group = group.clone();
                    async move { open_volume(&group, images, true).await }
                })
                .await
                .map(|stats: CrashStats| stats)
            }
        })
    }));
    let payload = outcome.expect_err("400 seeds ran with the ordering bug planted and none failed");
    let message = panic_message(&*payload);
    assert!(message.contains("replay: STRATA_CRASH_SEED="), "{message}");
    assert!(message.contains("after the crash"), "{message}");
}
