//! Clotho §3.4 (`strata sim clotho`, docs/versions-sim.md) at a small scale: the shape of the
//! paper's results on the thin pool's versions over the calibrated Cheetah model. Nothing
//! here is a recorded number: every figure is simulated afresh and checked against the
//! paper's claim (or against another simulated figure), so a thin pool whose reads walked
//! chains on disk, whose writes after a version copied extents, or whose compacted reads
//! did not go to the disk twice (or returned other bytes), would fail.

use strata_sim::clotho::{self, ClothoConfig, Layout, Parts};
use strata_sim::model::SECONDS;

/// The paper's bound on Bonnie++'s random seek + read overhead against the plain disk.
const PAPER_READ_OVERHEAD_PERCENT: f64 = 7.5;

#[test]
fn random_reads_of_a_volume_with_versions_cost_at_most_the_papers_overhead() {
    // 1/4 of the paper's sizes: a 512 MiB region on a 5.25 GiB partition; 8,000 reads.
    let config = ClothoConfig::scaled(1, 4);
    let runs = clotho::read_overhead(&config).unwrap();
    let table = clotho::format_report(&clotho::ClothoReport {
        config: config.clone(),
        reads: runs.clone(),
        writes: Vec::new(),
        compacted: Vec::new(),
    });
    println!("{table}");
    let [disk, thin, chains] = runs.as_slice() else {
        panic!("three configurations:\n{table}");
    };
    assert_eq!(
        (disk.layout, thin.layout, chains.layout),
        (Layout::Disk, Layout::Remap, Layout::Remap)
    );
    for run in &runs {
        assert_eq!(run.reads.ios, config.read_ios, "{table}");
        assert_eq!(run.reads.failed, 0, "{table}");
        // One disk read per 4 KiB read, chains or not: the walk is in memory (the pool's
        // map, history and liveness), never on the disk.
        assert_eq!(run.reads.disk_reads_per_io, 1.0, "{table}");
    }
    // The chains exist: the versions pinned what the overwrites replaced, in new extents.
    assert_eq!(chains.versions, config.read_versions);
    assert_eq!(thin.allocated_bytes, config.file_bytes, "{table}");
    assert!(
        chains.allocated_bytes > 2 * config.file_bytes,
        "the overwrites after versions went to new extents:\n{table}"
    );
    // The paper's bound, for the paper's configuration (latest version only) and with chains.
    assert!(
        thin.overhead_percent.abs() <= PAPER_READ_OVERHEAD_PERCENT,
        "{table}"
    );
    assert!(
        chains.overhead_percent <= PAPER_READ_OVERHEAD_PERCENT,
        "{table}"
    );
    // What chains cost is placement: the current version's blocks spread over more of the
    // disk, so seeks are longer. More spread, more cost.
    assert!(chains.overhead_percent > thin.overhead_percent, "{table}");
}

#[test]
fn more_frequent_versions_do_not_slow_random_overwrites() {
    // 1/16 of the paper's sizes and times: a 128 MiB region, 150 s of overwrites, a version
    // every 37.5 s and every 18.75 s (the paper's 10 and 5 minutes, scaled).
    let config = ClothoConfig::scaled(1, 16);
    let runs = clotho::write_path(&config).unwrap();
    let table = clotho::format_report(&clotho::ClothoReport {
        config: config.clone(),
        reads: Vec::new(),
        writes: runs.clone(),
        compacted: Vec::new(),
    });
    println!("{table}");
    let (longer, shorter) = (config.version_periods[0], config.version_periods[1]);
    assert_eq!((longer, shorter), (37_500_000_000, 18_750_000_000));
    let get = |layout: Layout, period: Option<u64>| {
        runs.iter()
            .find(|r| r.layout == layout && r.period_ns == period)
            .unwrap_or_else(|| panic!("{layout:?} {period:?}:\n{table}"))
    };
    let none = get(Layout::Remap, None);
    let every_longer = get(Layout::Remap, Some(longer));
    let every_shorter = get(Layout::Remap, Some(shorter));
    let copy = get(Layout::Copy, Some(shorter));
    for run in &runs {
        assert_eq!(run.writes.failed, 0, "{table}");
        // 150 s at hundreds of writes a second.
        assert!(run.writes.ios > 150 * 300, "{table}");
    }
    assert_eq!(none.versions_taken, 0);
    assert_eq!(every_longer.versions_taken, 3, "37.5, 75, 112.5 s");
    assert_eq!(every_shorter.versions_taken, 7);
    assert_eq!(copy.versions_taken, 7);
    // More versions, more first writes into shared extents, which go to new extents: as
    // many as remap-on-write predicts (the first write into each extent after a version,
    // and no other).
    assert_eq!(none.new_extent_share, 0.0);
    assert!(every_shorter.new_extent_share > every_longer.new_extent_share);
    assert!(every_longer.new_extent_share > 0.0);
    for run in [every_longer, every_shorter] {
        let (measured, expected) = (run.new_extent_share, run.expected_new_extent_share);
        assert!(
            (measured / expected - 1.0).abs() < 0.1,
            "{}: {measured} of the writes went to new extents, {expected} expected:\n{table}",
            run.configuration
        );
    }

    // The shape the brief asks for, and the paper's: versions do not slow the write path,
    // and more frequent versions are no slower than less frequent ones.
    assert!(
        every_shorter.writes.iops >= 0.9 * none.writes.iops,
        "{table}"
    );
    assert!(
        every_shorter.writes.iops >= every_longer.writes.iops,
        "{table}"
    );
    // The same check fails for whole-extent copy-on-write (dm-thin's way, the pool's
    // `snapshot-write = "copy"`): each first write after a version reads and writes a whole
    // extent. So the check above can tell a write path that pays for versions.
    assert!(copy.writes.iops < 0.9 * none.writes.iops, "{table}");
    assert!(copy.writes.disk_ios_per_io > 1.2, "{table}");
    assert!(every_shorter.writes.disk_ios_per_io < 1.05, "{table}");
}

#[test]
fn the_same_seed_gives_the_same_report_and_another_seed_another() {
    let run = |seed| {
        // (c) at one share (half the extents compacted) and its control: both read paths.
        let config = ClothoConfig {
            compacted_shares: vec![0.5],
            ..ClothoConfig::scaled(seed, 64)
        };
        clotho::run_parts(&config, Parts::ALL).unwrap()
    };
    let json = |report: &clotho::ClothoReport| serde_json::to_string(report).unwrap();
    let first = run(1);
    assert_eq!(json(&first), json(&run(1)));
    assert_ne!(json(&first), json(&run(2)));
    // Scaled down 64 times, the run still takes its versions (the periods scale with it).
    let shortest = first.config.version_periods[1];
    assert!(shortest < 5 * SECONDS);
    let every_shortest = first.write(Layout::Remap, Some(shortest)).unwrap();
    assert_eq!(every_shortest.versions_taken, 7);
    let [half, control] = first.compacted.as_slice() else {
        panic!("50 % and its control: {:?}", first.compacted);
    };
    assert_eq!(half.extents_compacted, half.extents / 2);
    assert!(!control.compacted);
}

#[test]
fn reads_of_a_fully_compacted_version_cost_two_disk_reads_and_about_half_the_throughput() {
    // 1/64 of the paper's sizes: an 8 MiB region (128 extents of 64 KiB), 2,000 random
    // 4 KiB reads of v1 at queue depth 1 after it was compacted against v2.
    let config = ClothoConfig::scaled(1, 64);
    assert_eq!(config.compacted_shares, vec![0.0, 0.5, 1.0]);
    let runs = clotho::compacted_reads(&config).unwrap();
    let table = clotho::format_report(&clotho::ClothoReport {
        config: config.clone(),
        reads: Vec::new(),
        writes: Vec::new(),
        compacted: runs.clone(),
    });
    println!("{table}");
    let [none, half, all, control] = runs.as_slice() else {
        panic!("four configurations:\n{table}");
    };
    let extents = config.compacted_file_bytes / config.extent_bytes;
    for run in &runs {
        assert_eq!(run.extents, extents, "{table}");
        assert_eq!(run.reads.ios, config.compacted_read_ios, "{table}");
        assert_eq!(run.reads.failed, 0, "{table}");
        // The version reads back as it was written (so the deltas were made of real bytes
        // and decode to them: a disk that stored nothing would read zeros here).
        assert!(run.verified_blocks >= extents / 2, "{table}");
        // Every superseded extent's delta halves it (a few bytes per 4 KiB changed).
        assert_eq!(run.extents_kept, 0, "{table}");
    }
    // 0 %: nothing superseded, nothing to compact, one disk read per read.
    assert_eq!((none.superseded_share, none.extents_compacted), (0.0, 0));
    assert_eq!(none.reads.disk_reads_per_io, 1.0, "{table}");
    // 100 %: every extent compacted, and every read costs its delta record and the base's
    // extent: the paper's 2 disk accesses per read (not 1: nothing caches the base or the
    // delta; not 3), about half the throughput.
    assert_eq!(all.extents_compacted, extents, "{table}");
    assert!(2 * all.delta_bytes <= all.data_bytes, "{table}");
    let per_read = all.reads.disk_reads_per_io;
    assert!((1.9..=2.1).contains(&per_read), "{table}");
    assert!(all.ratio_to_uncompacted <= 0.7, "{table}");
    // 50 %: half the extents, half the reads pay the second access.
    assert_eq!(half.extents_compacted, extents / 2, "{table}");
    let per_read = half.reads.disk_reads_per_io;
    assert!((1.4..=1.6).contains(&per_read), "{table}");
    assert!(
        all.reads.iops < half.reads.iops && half.reads.iops < none.reads.iops,
        "{table}"
    );
    // The control: the same history (every extent superseded), not compacted, reads as
    // 0 % does. What costs is the compaction, not where v1's data lies.
    assert!(!control.compacted && control.superseded_share == 1.0);
    assert_eq!(control.extents_compacted, 0, "{table}");
    assert_eq!(control.reads.disk_reads_per_io, 1.0, "{table}");
    assert!(control.ratio_to_uncompacted >= 0.9, "{table}");
}
