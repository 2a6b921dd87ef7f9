//! Media damage: `DiskImage::flip_bytes`, `Damage`, and the damaged-device scenario, which
//! accepts a refusal or intact data and catches silent loss with a seed that replays.

use std::future::{ready, Ready};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use strata_core::{BlockError, DeviceRef, Geometry, Result};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::testkit::{block_on, panic_report};
use strata_crash::{
    damaged_device_scenario, open_disks, sector_disk, CrashGroup, CrashPlan, CrashRng, CrashRun,
    Damage, DiskImage, ScenarioConfig, DEFAULT_BASE_SEED,
};

const DISK: u64 = 256 << 10;

fn config() -> ScenarioConfig {
    let mut config = ScenarioConfig::new(vec![sector_disk(DISK)]);
    config.ops_per_round = 20;
    config
}

#[test]
fn flip_bytes_changes_exactly_the_bytes_it_names_and_replays() {
    let mut image = DiskImage::zeroed(sector_disk(DISK));
    image.write(4096, &[0x5a; 8192]);
    let before = image.clone();
    let mut rng = CrashRng::seed_from_u64(7);
    let hit = image.flip_bytes(4000, 9000, 16, &mut rng);
    assert_eq!(hit.len(), 16);
    assert!(hit.windows(2).all(|w| w[0] < w[1]), "{hit:?}");
    for at in 0..DISK {
        let changed = image.read(at, 1) != before.read(at, 1);
        assert_eq!(changed, hit.contains(&at), "byte {at}");
    }
    assert!(hit.iter().all(|&at| (4000..13000).contains(&at)));
    let mut again = before.clone();
    let mut rng = CrashRng::seed_from_u64(7);
    let damage = Damage::new(4000, 9000, 16);
    let line = damage.apply(std::slice::from_mut(&mut again), &mut rng);
    assert_eq!(again, image, "the same seed must flip the same bytes");
    assert!(line.contains(&format!("{hit:?}")), "{line}");
}

/// The disk itself: it checks nothing, so damage anywhere in written data is served.
fn bare(
    geometry: Geometry,
) -> impl FnMut(&CrashGroup, Option<Vec<DiskImage>>) -> Ready<Result<DeviceRef>> {
    move |group, images| {
        let disk = open_disks(group, &[geometry], images).remove(0);
        ready(Ok(Arc::new(disk) as DeviceRef))
    }
}

#[test]
fn a_stack_that_serves_damaged_data_is_caught_as_silent_loss() {
    let config = config();
    let geometry = config.disks[0];
    let scenario = |seed: u64| {
        block_on(damaged_device_scenario(
            seed,
            &config,
            |_: &mut CrashRng, _: &[DiskImage]| vec![Damage::new(0, DISK, 4)],
            bare(geometry),
        ))
        .map(Into::into)
    };
    let plan = CrashPlan {
        first: DEFAULT_BASE_SEED,
        count: 50,
    };
    let run = CrashRun {
        name: "bare disk under damage",
        replay: "cargo test -p strata-crash --test suite -- damage::",
        default_iterations: 50,
    };
    let report = panic_report(
        || run.run_plan(plan, scenario),
        "damaged data served must be caught",
    );
    assert!(report.contains("silent loss"), "{report}");
    assert!(
        report.contains("damage: disk 0 [0, +262144): flipped 4 byte(s) at"),
        "{report}"
    );
    let seed: u64 = report
        .split("replay: STRATA_CRASH_SEED=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| panic!("no replay line in: {report}"));
    assert!(
        scenario(seed).is_err(),
        "seed {seed} must fail again on replay"
    );
}

#[test]
fn refusing_to_open_and_serving_intact_data_both_pass() {
    let config = config();
    let geometry = config.disks[0];
    let refused = AtomicU64::new(0);
    let intact = AtomicU64::new(0);
    let run = CrashRun {
        name: "a stack that detects every damage",
        replay: "cargo test -p strata-crash --test suite -- damage::",
        default_iterations: 200,
    };
    let summary = run.run_async(|seed| {
        // Stands in for a stack with checksums: it knows whether the images were damaged
        // (half of the rounds) and refuses to open them if so.
        let damaged = Arc::new(AtomicBool::new(false));
        let flag = damaged.clone();
        let aim = move |rng: &mut CrashRng, _: &[DiskImage]| {
            let hit = rng.random_bool(0.5);
            flag.store(hit, Ordering::SeqCst);
            if hit {
                vec![Damage::new(0, DISK, 1)]
            } else {
                Vec::new()
            }
        };
        let mut bare = bare(geometry);
        let open = move |group: &CrashGroup, images: Option<Vec<DiskImage>>| {
            if images.is_some() && damaged.load(Ordering::SeqCst) {
                let error = BlockError::InvalidArgument("checksum mismatch".into());
                return ready(Err(error));
            }
            bare(group, images)
        };
        let (refused, intact) = (&refused, &intact);
        let config = &config;
        async move {
            let stats = damaged_device_scenario(seed, config, aim, open).await?;
            refused.fetch_add(stats.refused, Ordering::Relaxed);
            intact.fetch_add(stats.intact, Ordering::Relaxed);
            Ok(stats.into())
        }
    });
    let (refused, intact) = (refused.into_inner(), intact.into_inner());
    assert!(
        refused > 50 && intact > 50,
        "refused {refused}, intact {intact}"
    );
    assert_eq!(summary.crash_points, refused + intact);
}
