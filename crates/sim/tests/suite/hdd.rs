//! The HDD model: seek-curve shape, serpentine layout, scheduling, determinism, and the
//! papers' figures (the acceptance test).

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_sim::hdd::geometry::{Geometry, Zone};
use strata_sim::hdd::{presets, Hdd, HddParams, Scheduler};
use strata_sim::model::{Completion, DeviceModel, Nanos, Op, Request, MICROS};
use strata_sim::validate;

const IO: u64 = 4096;

#[test]
fn seek_curve_has_plateau_then_sqrt_then_linear() {
    for params in presets::all() {
        let drive = Hdd::new(params.clone());
        let curve = drive.seek_curve();
        let seek = params.seek;
        let max = drive.geometry().cylinders() - 1;
        assert_eq!(curve.time(0), 0);
        assert_eq!(curve.time(1), seek.settle);
        // Plateau: everything below C stays between settle and plateau_end.
        for d in 1..seek.plateau_cylinders {
            let t = curve.time(d);
            assert!(
                t >= seek.settle && t <= seek.plateau_end,
                "{}: seek({d}) = {t}",
                params.name
            );
        }
        // Monotone over the whole stroke, ending at the full-stroke time (±1 ns rounding).
        let mut last = 0;
        for d in 0..=max {
            let t = curve.time(d);
            assert!(t >= last, "{}: seek not monotone at {d}", params.name);
            last = t;
        }
        assert!(curve.time(max).abs_diff(seek.full_stroke) <= 1);
        // Square-root part: concave, so equal steps in distance add less and less time.
        let (a, b) = (seek.plateau_cylinders, seek.linear_from_cylinders);
        let step = (b - a) / 4;
        let rises: Vec<Nanos> = (0..3)
            .map(|i| curve.time(a + (i + 1) * step) - curve.time(a + i * step))
            .collect();
        assert!(
            rises[0] > rises[1] && rises[1] > rises[2],
            "{}: {rises:?}",
            params.name
        );
        // Linear part: equal steps add equal time.
        let step = (max - b) / 4;
        let rises: Vec<Nanos> = (0..3)
            .map(|i| curve.time(b + (i + 1) * step) - curve.time(b + i * step))
            .collect();
        assert!(
            rises[0].abs_diff(rises[2]) <= 2,
            "{}: {rises:?}",
            params.name
        );
    }
}

#[test]
fn fitted_seek_curve_averages_the_datasheet_seek_over_random_lbns() {
    for params in presets::all() {
        let drive = Hdd::new(params.clone());
        let geometry = drive.geometry();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (mut sum, mut count) = (0u128, 0u32);
        for _ in 0..50_000 {
            let a = geometry
                .locate(rng.random_range(0..geometry.total_sectors()))
                .cylinder;
            let b = geometry
                .locate(rng.random_range(0..geometry.total_sectors()))
                .cylinder;
            if a != b {
                sum += u128::from(drive.seek_curve().time(a.abs_diff(b)));
                count += 1;
            }
        }
        let mean = sum as f64 / f64::from(count);
        let target = params.seek.average as f64;
        assert!(
            (mean / target - 1.0).abs() < 0.02,
            "{}: mean seek {mean} vs {target}",
            params.name
        );
    }
}

#[test]
fn serpentine_layout_is_a_bijection_on_a_small_disk() {
    let zones = [
        Zone {
            cylinders: 23,
            sectors_per_track: 17,
        },
        Zone {
            cylinders: 9,
            sectors_per_track: 13,
        },
        Zone {
            cylinders: 5,
            sectors_per_track: 8,
        },
    ];
    let geometry = Geometry::new(&zones, 4, 6, 0.2);
    let mut seen = std::collections::BTreeSet::new();
    for lbn in 0..geometry.total_sectors() {
        let at = geometry.locate(lbn);
        assert!(at.slot < at.sectors_per_track && at.sector < at.sectors_per_track);
        assert!(
            seen.insert((at.cylinder, at.head, at.sector)),
            "LBN {lbn} collides"
        );
        assert_eq!(geometry.lbn_of(at.cylinder, at.head, at.sector), lbn);
    }
    let tracks: u64 = zones
        .iter()
        .map(|z| u64::from(z.cylinders) * 4 * u64::from(z.sectors_per_track))
        .sum();
    assert_eq!(seen.len() as u64, tracks);
}

#[test]
fn cheetah_band_holds_the_papers_624000_lbns() {
    // Proximal I/O §2: 1200 SPT x 65 cylinders x 8 surfaces = 624,000 LBNs per band.
    let drive = Hdd::new(presets::cheetah_15k5());
    let g = drive.geometry();
    let last_in_band = g.locate(624_000 - 1);
    assert_eq!((last_in_band.cylinder, last_in_band.head), (64, 7));
    assert_eq!(
        (g.locate(624_000).cylinder, g.locate(624_000).head),
        (65, 0)
    );
    // The next LBN after a surface's 65 tracks goes to the next surface, band start.
    let next_surface = g.locate(65 * 1200);
    assert_eq!((next_surface.cylinder, next_surface.head), (0, 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn preset_layouts_round_trip(lbn_fraction in 0.0f64..1.0, preset in 0usize..4) {
        let drive = Hdd::new(presets::all()[preset].clone());
        let g = drive.geometry();
        let lbn = ((g.total_sectors() - 1) as f64 * lbn_fraction) as u64;
        let at = g.locate(lbn);
        prop_assert_eq!(g.lbn_of(at.cylinder, at.head, at.sector), lbn);
        prop_assert!(at.cylinder < g.cylinders() && at.head < g.surfaces());
    }
}

/// Runs batches of `batch` random reads within `span` sectors, each batch issued at once
/// when the previous one is done; returns the completions and the end time.
fn run_batches(
    params: HddParams,
    seed: u64,
    batches: usize,
    batch: usize,
    span: u64,
) -> (Vec<Completion>, Nanos) {
    let mut drive = Hdd::with_seed(params, seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let sectors = drive.params().capacity_sectors;
    let mut all = Vec::new();
    let (mut now, mut id) = (0, 0);
    for _ in 0..batches {
        let start = rng.random_range(0..sectors - span);
        for _ in 0..batch {
            let lbn = start + rng.random_range(0..span - 8);
            drive.submit(
                now,
                Request {
                    id,
                    op: if id % 3 == 0 { Op::Write } else { Op::Read },
                    offset: lbn * 512,
                    len: IO,
                },
            );
            id += 1;
        }
        while let Some(at) = drive.next_completion() {
            drive.advance(at, &mut all);
            now = at;
        }
    }
    assert_eq!(all.len(), batches * batch);
    assert_eq!(drive.outstanding(), 0);
    (all, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn sptf_is_never_slower_than_fifo_on_the_same_input(seed in 0u64..1_000_000, span_exp in 10u32..29) {
        let span = 1u64 << span_exp;
        let mut fifo = presets::cheetah_15k5();
        fifo.scheduler = Scheduler::Fifo;
        let (_, fifo_time) = run_batches(fifo, seed, 40, 8, span);
        let (_, sptf_time) = run_batches(presets::cheetah_15k5(), seed, 40, 8, span);
        prop_assert!(sptf_time <= fifo_time, "SPTF {} > FIFO {}", sptf_time, fifo_time);
    }
}

#[test]
fn same_seed_same_completions_and_different_seeds_differ() {
    let (a, _) = run_batches(presets::wd_re3_1tb(), 5, 50, 8, 1 << 20);
    let (b, _) = run_batches(presets::wd_re3_1tb(), 5, 50, 8, 1 << 20);
    let (c, _) = run_batches(presets::wd_re3_1tb(), 6, 50, 8, 1 << 20);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn fifo_serves_in_arrival_order_and_sptf_reorders() {
    let ids = |scheduler| {
        let mut params = presets::cheetah_15k5();
        params.scheduler = scheduler;
        let mut drive = Hdd::new(params);
        // Descending LBNs within a band: FIFO must go backwards, SPTF will not.
        for (id, lbn) in [600_000u64, 450_000, 300_000, 150_000, 1_000]
            .into_iter()
            .enumerate()
        {
            drive.submit(
                0,
                Request {
                    id: id as u64,
                    op: Op::Read,
                    offset: lbn * 512,
                    len: IO,
                },
            );
        }
        let mut done = Vec::new();
        while let Some(at) = drive.next_completion() {
            drive.advance(at, &mut done);
        }
        done.iter().map(|c| c.id).collect::<Vec<_>>()
    };
    assert_eq!(ids(Scheduler::Fifo), vec![0, 1, 2, 3, 4]);
    assert_ne!(ids(Scheduler::Sptf), vec![0, 1, 2, 3, 4]);
}

#[test]
fn queue_depth_bounds_the_commands_at_the_drive() {
    // With one command at the drive there is nothing to reorder: SPTF serves in arrival
    // order, exactly as FIFO does at the same depth.
    let at_depth_one = |scheduler| {
        let mut params = presets::cheetah_15k5();
        params.queue_depth = 1;
        params.scheduler = scheduler;
        run_batches(params, 9, 30, 8, 1 << 22).0
    };
    let sptf = at_depth_one(Scheduler::Sptf);
    assert!(
        sptf.windows(2).all(|w| w[0].id < w[1].id),
        "depth 1 served out of order"
    );
    assert!(sptf == at_depth_one(Scheduler::Fifo));
    // At depth 8 SPTF does reorder the same input.
    let (deep, _) = run_batches(presets::cheetah_15k5(), 9, 30, 8, 1 << 22);
    assert!(deep.windows(2).any(|w| w[0].id > w[1].id));
}

#[test]
fn a_lone_read_costs_overhead_seek_rotation_and_transfer() {
    let params = presets::cheetah_15k5();
    let mut drive = Hdd::new(params.clone());
    // LBN 0 is at angle 0 on cylinder 0 where the heads start: no seek, no rotational
    // wait beyond the overhead's lost revolution fraction.
    drive.submit(
        0,
        Request {
            id: 1,
            op: Op::Read,
            offset: 0,
            len: IO,
        },
    );
    let revolution = drive.revolution();
    let at = drive.next_completion().unwrap();
    let transfer = 8 * revolution / 1200;
    assert_eq!(
        at,
        revolution + transfer,
        "the overhead makes the head miss sector 0 once"
    );
    let mut done = Vec::new();
    drive.advance(at, &mut done);
    assert_eq!(done, vec![Completion { id: 1, at }]);
    assert_eq!(drive.busy_time(), at);
    assert!(params.command_overhead > 0 && params.command_overhead < 200 * MICROS);
}

#[test]
fn every_validation_row_is_within_five_percent_of_the_paper() {
    let rows = validate::validate_disk();
    let table = validate::format_table(&rows);
    println!("{table}");
    assert!(rows.len() >= 20, "{table}");
    for row in &rows {
        assert!(row.within_tolerance, "row out of tolerance:\n{table}");
        match row.anchor {
            // A figure from the paper: within ±5 % of it.
            validate::Anchor::Value => {
                assert!((row.ratio - 1.0).abs() <= validate::TOLERANCE, "{row:?}");
            }
            // A statement without a figure: inside the band that reads it.
            validate::Anchor::Bound => {
                assert!(
                    row.low <= row.simulated && row.simulated <= row.high,
                    "{row:?}"
                );
            }
        }
    }
    let json = serde_json::to_string(&rows).unwrap();
    assert!(json.contains("\"within_tolerance\":true"));
    assert!(json.contains("\"anchor\":\"bound\"") && json.contains("\"anchor\":\"value\""));
}

#[test]
fn validation_covers_track_approximate_strands_writes_and_issue_order() {
    let rows = validate::validate_disk();
    let find = |model: &str, metric: &str| {
        rows.iter()
            .find(|r| r.model == model && r.metric.starts_with(metric))
            .unwrap_or_else(|| panic!("no row {model} / {metric}"))
    };
    let cheetah = "cheetah-15k5-300g";
    // Track-approximate strands cost what proximal ones do (Proximal I/O §2): a figure.
    let track = find(cheetah, "track-approx. strand D=8 span 1024");
    assert_eq!((track.anchor, track.paper), (validate::Anchor::Value, 0.39));
    // Writes at every strand length, and in the track-approximate span: above the reads.
    for requests in [1, 2, 4, 8] {
        let metric = format!("write/read strand time, D={requests} span 100k");
        let row = find(cheetah, &metric);
        assert!(row.low >= 1.0 && row.simulated > 1.0, "{row:?}");
    }
    assert!(find(cheetah, "write/read strand time, D=8 span 1024").simulated > 1.0);
    let writes = find(cheetah, "write strand D=8 span 100k, OP/request");
    assert!(writes.simulated > find(cheetah, "proximal strand D=8").simulated);
    // Issue order matters on the quirky RE3 only (§2.7).
    let quirky = "wd-re3-1t-order-quirk";
    let random = find(quirky, "random/ascending issue");
    assert!(random.simulated > 1.0 + validate::TOLERANCE, "{random:?}");
    let ascending = find(quirky, "ascending issue");
    assert!((ascending.simulated - 1.0).abs() <= validate::TOLERANCE);
    let fixed = find("wd-re3-1t", "random/ascending issue");
    assert!((fixed.simulated - 1.0).abs() <= validate::TOLERANCE);
}

/// Submits 4 KiB reads of `lbns` at once, in this order (ids 0, 1, …), to a drive fresh from
/// `Hdd::new`, and returns their completions in completion order.
fn complete_reads(params: HddParams, lbns: &[u64]) -> Vec<Completion> {
    let mut drive = Hdd::new(params);
    for (id, &lbn) in lbns.iter().enumerate() {
        let request = Request {
            id: id as u64,
            op: Op::Read,
            offset: lbn * 512,
            len: IO,
        };
        drive.submit(0, request);
    }
    let mut done = Vec::new();
    while let Some(at) = drive.next_completion() {
        drive.advance(at, &mut done);
    }
    assert_eq!(done.len(), lbns.len());
    done
}

/// The order in which `lbns`, submitted at once in this order, complete.
fn completion_order(params: HddParams, lbns: &[u64]) -> Vec<u64> {
    complete_reads(params, lbns).iter().map(|c| c.id).collect()
}

/// When the last of two reads on track 0, 100 sectors (0.33 ms at 15,000 RPM) apart,
/// completes: whether the second makes the same revolution as the first decides it.
fn two_reads_on_one_track(same_track_reposition: Nanos) -> Nanos {
    let mut params = presets::cheetah_15k5();
    params.same_track_reposition = same_track_reposition;
    complete_reads(params, &[0, 108])[1].at
}

#[test]
fn a_non_contiguous_access_on_the_same_track_costs_a_reposition() {
    let cheetah = presets::cheetah_15k5();
    let revolution = Hdd::new(cheetah.clone()).revolution();
    assert_eq!(revolution, 4_000_000);
    let transfer = 8 * revolution / 1200;
    let start_b = 108 * revolution / 1200;
    // The Cheetah repositions for 0.62 ms, longer than the 0.33 ms gap: after A (LBN 0, at
    // one revolution, as a lone read there is), B waits for the next revolution.
    let last = two_reads_on_one_track(cheetah.same_track_reposition);
    assert_eq!(last, 2 * revolution + start_b + transfer);
    // Without the reposition SPTF takes B first, then A within the same revolution.
    assert_eq!(two_reads_on_one_track(0), revolution + transfer);
    assert_eq!(cheetah.same_track_reposition, cheetah.seek.settle);
}

#[test]
fn the_order_quirk_reorders_only_commands_that_arrive_ascending() {
    let quirky = presets::by_name("wd-re3-1t-order-quirk").expect("the §2.7 preset");
    let sound = presets::wd_re3_1tb();
    assert!(quirky.order_quirk && !sound.order_quirk);
    assert_eq!(
        HddParams {
            name: sound.name.clone(),
            order_quirk: false,
            ..quirky.clone()
        },
        sound,
        "the quirk is the preset's only difference"
    );
    let descending = [600_000u64, 450_000, 300_000, 150_000, 1_000];
    // Descending: every command opens a run, so the quirky drive serves them as they came.
    assert_eq!(
        completion_order(quirky.clone(), &descending),
        [0, 1, 2, 3, 4]
    );
    assert_ne!(
        completion_order(sound.clone(), &descending),
        [0, 1, 2, 3, 4]
    );
    // Ascending: one run, reordered exactly as by the drive without the quirk.
    let ascending: Vec<u64> = descending.iter().rev().copied().collect();
    let order = completion_order(quirky, &ascending);
    assert_eq!(order, completion_order(sound, &ascending));
    assert_ne!(order, [0, 1, 2, 3, 4], "SPTF reorders the ascending strand");
}

/// Issues `count` sequential 4 KiB requests from LBN 0, `depth` at a time, and returns the
/// time the last one completes.
fn sequential(params: HddParams, op: Op, count: u64, depth: u64) -> Nanos {
    let mut drive = Hdd::new(params);
    let mut done = Vec::new();
    let request = |id| Request {
        id,
        op,
        offset: id * IO,
        len: IO,
    };
    let (mut next, mut now) = (0u64, 0);
    while next < depth.min(count) {
        drive.submit(0, request(next));
        next += 1;
    }
    while let Some(at) = drive.next_completion() {
        let before = done.len();
        drive.advance(at, &mut done);
        now = at;
        for _ in before..done.len() {
            if next < count {
                drive.submit(at, request(next));
                next += 1;
            }
        }
    }
    assert_eq!(done.len() as u64, count);
    now
}

#[test]
fn sequential_reads_stream_from_read_ahead_and_queued_writes_stream() {
    let params = presets::cheetah_15k5();
    let revolution = Hdd::new(params.clone()).revolution();
    // 2 MiB = 4096 sectors = 3.4 outer tracks of 1200: about 3.4 revolutions of media time
    // plus skews and the first positioning.
    let media = 4096 * revolution / 1200;
    // One at a time, each cached read still pays the command overhead.
    let bound = media.max(512 * params.command_overhead);
    let read_qd1 = sequential(params.clone(), Op::Read, 512, 1);
    assert!(
        read_qd1 < bound + 2 * revolution,
        "read QD1 {read_qd1} vs {bound}"
    );
    let read_qd4 = sequential(params.clone(), Op::Read, 512, 4);
    assert!(
        read_qd4 < media + 2 * revolution,
        "read QD4 {read_qd4} vs media {media}"
    );
    // Without read-ahead each 4 KiB read arrives after its sector has passed.
    let mut no_read_ahead = params.clone();
    no_read_ahead.read_ahead_bytes = 0;
    let slow = sequential(no_read_ahead, Op::Read, 512, 1);
    assert!(slow > 400 * revolution, "{slow}");
    // Writes have no cache: one at a time they miss a revolution each, but queued at the
    // drive their processing overlaps and they stream too.
    let write_qd1 = sequential(params.clone(), Op::Write, 512, 1);
    assert!(write_qd1 > 400 * revolution);
    let write_qd4 = sequential(params, Op::Write, 512, 4);
    assert!(
        write_qd4 < media + 2 * revolution,
        "write QD4 {write_qd4} vs media {media}"
    );
}

#[test]
fn capacity_is_the_datasheet_lba_count() {
    let mut drive = Hdd::new(presets::cheetah_15k5());
    assert_eq!(drive.capacity(), 300_000_000_000);
    assert_eq!(
        Hdd::new(presets::wd_re3_1tb()).capacity(),
        1_953_525_168 * 512
    );
    let last = drive.capacity() - IO;
    drive.submit(
        0,
        Request {
            id: 0,
            op: Op::Write,
            offset: last,
            len: IO,
        },
    );
    assert!(drive.next_completion().is_some());
    assert_eq!(drive.outstanding(), 1);
}

#[test]
#[should_panic(expected = "past the end")]
fn a_request_past_the_end_is_a_caller_bug() {
    let mut drive = Hdd::new(presets::cheetah_15k5());
    let end = drive.capacity();
    drive.submit(
        0,
        Request {
            id: 0,
            op: Op::Read,
            offset: end,
            len: IO,
        },
    );
}

#[test]
fn raising_the_queue_depth_lets_waiting_commands_reach_the_drive() {
    let mut params = presets::cheetah_15k5();
    params.queue_depth = 1;
    let mut drive = Hdd::new(params);
    for id in 0..6u64 {
        // Descending within a band, so FIFO order is visibly not SPTF order.
        let lbn = 600_000 - id * 100_000;
        drive.submit(
            0,
            Request {
                id,
                op: Op::Read,
                offset: lbn * 512,
                len: IO,
            },
        );
    }
    drive.set_queue_depth(8);
    drive.submit(
        0,
        Request {
            id: 6,
            op: Op::Read,
            offset: 0,
            len: IO,
        },
    );
    let mut done = Vec::new();
    while let Some(at) = drive.next_completion() {
        drive.advance(at, &mut done);
    }
    let order: Vec<u64> = done.iter().map(|c| c.id).collect();
    assert_eq!(order.len(), 7);
    // The choice made at t = 0 at depth 1 (command 0) is reopened over all seven.
    assert_ne!(
        order[0], 0,
        "SPTF chose among the whole queue at once: {order:?}"
    );
}
