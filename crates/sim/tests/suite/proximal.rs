//! `strata sim proximal` (docs/proximal-sim.md) at a tiny scale: members of 64 MiB (13
//! extents of 16 MiB at 89 %), 600 updates per extent. Nothing here is a recorded number:
//! what is checked are structural facts (bigger staging, bigger batches and less
//! amplification; update in place costs 4 drive I/Os; every destaged block back in its home
//! range; hole plugging scatters the extents; a run is a function of its seed).

use strata_sim::proximal::{self, ProximalConfig, StagedSetup, Trigger};

fn config() -> ProximalConfig {
    ProximalConfig {
        updates_per_extent: 600,
        staging_percents: vec![1.0, 4.0],
        ..ProximalConfig::with_members(1, 64 << 20)
    }
}

fn setup(config: &ProximalConfig, percent: f64, reads: bool) -> StagedSetup {
    StagedSetup {
        model: config.model.clone(),
        percent,
        trigger: Trigger::Full,
        updates_per_extent: config.updates_per_extent,
        rate_per_s: None,
        reads,
    }
}

#[test]
fn bigger_staging_makes_bigger_batches_and_less_amplification() {
    let config = config();
    let small = proximal::run_staged(&config, &setup(&config, 1.0, true)).unwrap();
    let big = proximal::run_staged(&config, &setup(&config, 4.0, false)).unwrap();
    for run in [&small, &big] {
        assert_eq!(run.failed, 0);
        assert!(run.destages >= 2, "{run:?}");
        assert_eq!(
            run.batches,
            run.destages * run.extents,
            "one batch per extent"
        );
        // Every destaged block went back to its home range (each update freed its own block).
        assert_eq!(
            run.placed_in_window + run.placed_outside_window,
            0,
            "{run:?}"
        );
        assert!(run.placed_in_home_range >= run.destaged_blocks, "{run:?}");
        assert!(run.revolutions.gaps > 0 && run.revolutions.per_revolution > 0.0);
        // A 4 KiB update on raid5 costs a read-modify-write: at most 4 drive I/Os.
        assert!(
            run.amplification > 1.0 && run.amplification <= 4.0,
            "{run:?}"
        );
    }
    assert!(big.updates_per_batch > 2.0 * small.updates_per_batch);
    assert!(big.amplification < small.amplification);
    // The aged layout reads (about) as fast as the pristine one: the blocks went home.
    let pristine = small.pristine.as_ref().unwrap();
    let aged = small.aged.as_ref().unwrap();
    assert_eq!(pristine.requests, aged.requests);
    assert!(aged.mb_per_s_per_disk >= 0.9 * pristine.mb_per_s_per_disk);
    // The write-anywhere layout of the same updates does not.
    let holes = proximal::run_hole_plugging(&config).unwrap();
    assert_eq!(holes.requests, pristine.requests);
    assert!(holes.runs_per_request.unwrap() > 10.0, "{holes:?}");
    assert!(holes.mb_per_s_per_disk < 0.5 * pristine.mb_per_s_per_disk);
}

#[test]
fn update_in_place_costs_four_drive_ios() {
    let config = ProximalConfig {
        in_place_updates: 200,
        ..config()
    };
    let run = proximal::run_in_place(&config).unwrap();
    assert_eq!(run.disk_reads, 400, "old data and old parity");
    assert_eq!(run.disk_writes, 400, "new data and new parity");
    assert_eq!(run.ios_per_update, 4.0);
}

#[test]
fn a_run_is_a_function_of_its_seed() {
    let config = ProximalConfig {
        updates_per_extent: 150,
        ..config()
    };
    let one = proximal::run_staged(&config, &setup(&config, 1.0, false)).unwrap();
    assert_eq!(
        one,
        proximal::run_staged(&config, &setup(&config, 1.0, false)).unwrap()
    );
    let other = ProximalConfig { seed: 2, ..config };
    let two = proximal::run_staged(&other, &setup(&other, 1.0, false)).unwrap();
    assert_ne!(one.revolutions, two.revolutions);
}
