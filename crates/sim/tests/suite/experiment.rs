//! Experiments end to end, as `strata sim run` runs them: an experiment file's text, parsed,
//! its stack built through the layer registry, its workload driven, its report and records
//! serialized.

use std::path::{Path, PathBuf};

use strata_sim::disk::DataMode;
use strata_sim::executor::Simulation;
use strata_sim::experiment::{Experiment, Report};
use strata_sim::model::IoRecord;
use strata_sim::models;
use strata_sim::results;
use strata_sim::stack::StackSpec;

fn repo_sim_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sim")
}

fn websearch_trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/websearch-spc.trace")
}

/// The committed WebSearch-on-RAID-0 experiment, with `seed`; `None` when the trace is absent.
fn websearch(seed: u64) -> Option<Experiment> {
    if !websearch_trace().exists() {
        println!(
            "skipped: no trace at {} (the shared traces are not on this machine)",
            websearch_trace().display()
        );
        return None;
    }
    let dir = repo_sim_dir();
    let text = std::fs::read_to_string(dir.join("websearch-raid0.toml")).unwrap();
    let mut experiment = Experiment::parse(&text, &dir).unwrap();
    experiment.seed = seed;
    Some(experiment)
}

/// A run as the files `strata sim run --out` writes: report.json and records.csv.
fn run_to_text(experiment: &Experiment) -> (Report, Vec<IoRecord>, String, String) {
    let (report, output) = experiment.run().unwrap();
    let json = results::to_json(&report).unwrap();
    let csv = results::records_to_csv(&output.records).unwrap();
    (report, output.records, json, csv)
}

#[test]
fn websearch_on_raid0_is_deterministic_complete_and_spread_over_the_stripe() {
    let Some(experiment) = websearch(1) else {
        return;
    };
    let (report, records, json, csv) = run_to_text(&experiment);
    let (_, _, json_again, csv_again) = run_to_text(&experiment);
    assert!(json == json_again, "same seed, different report.json");
    assert!(csv == csv_again, "same seed, different records.csv");

    let other = websearch(2).unwrap();
    let (_, _, json_other, csv_other) = run_to_text(&other);
    assert_ne!(json, json_other, "seeds 1 and 2 gave the same report.json");
    assert_ne!(csv, csv_other, "seeds 1 and 2 gave the same records.csv");

    assert_eq!(records.len(), 24_783, "the trace has 24,783 requests");
    assert_eq!(report.summary.throughput.ios, 24_783);
    assert_eq!(report.summary.failed, 0);
    for record in &records {
        assert!(
            record.completed > record.issued,
            "a request completed at {} but was issued at {}",
            record.completed,
            record.issued
        );
    }

    assert_eq!(report.disks.len(), 3);
    let per_disk: Vec<u64> = report
        .disks
        .iter()
        .map(|d| d.stats.reads + d.stats.writes)
        .collect();
    let total: u64 = per_disk.iter().sum();
    assert!(
        total >= 24_783,
        "the disks served {total} requests, fewer than the trace's"
    );
    for (disk, count) in report.disks.iter().zip(&per_disk) {
        let share = *count as f64 / total as f64;
        assert!(
            (0.20..=0.46).contains(&share),
            "disk {} took {:.1} % of the requests ({per_disk:?})",
            disk.name,
            share * 100.0
        );
    }
}

/// Uniform 4 KiB random reads, closed loop at `queue_depth`, on one Cheetah 15K.5 through a
/// `slice` layer (the registry path every stack takes).
fn one_cheetah_random_reads(queue_depth: usize) -> Report {
    let text = format!(
        r#"
name = "random 4 KiB reads on one Cheetah"
seed = 11
queue-depth = {queue_depth}

[[disk]]
name = "d0"
model = "cheetah-15k5-300g"

[[layer]]
name = "whole"
kind = "slice"
children = ["d0"]

[workload]
kind = "uniform"
read_share = 1.0
count = 2000
"#
    );
    let experiment = Experiment::parse(&text, Path::new(".")).unwrap();
    experiment.run().unwrap().0
}

#[test]
fn one_cheetah_serves_a_random_read_in_one_op_and_more_at_queue_depth_8() {
    let qd1 = one_cheetah_random_reads(1);
    let mean_ms = qd1.summary.latency[0].summary.mean_ns / 1e6;
    // Proximal I/O §1/§7: one random 4 KiB I/O on the Cheetah 15K.5 is 1 OP = 5.6 ms.
    assert!(
        (mean_ms / 5.6 - 1.0).abs() <= 0.05,
        "mean latency {mean_ms:.3} ms at queue depth 1, paper 5.6 ms"
    );
    let qd8 = one_cheetah_random_reads(8);
    let (iops1, iops8) = (qd1.summary.throughput.iops, qd8.summary.throughput.iops);
    // SPTF over 8 queued commands shortens positioning well beyond noise (≈ 1.7× here).
    assert!(
        iops8 > 1.3 * iops1,
        "queue depth 8 gave {iops8:.1} IOPS, depth 1 gave {iops1:.1}"
    );
}

const THREE_DISKS: &str = r#"
[[disk]]
name = "d0"
model = "cheetah-15k5-300g"

[[disk]]
name = "d1"
model = "cheetah-15k5-300g"

[[disk]]
name = "d2"
model = "cheetah-15k5-300g"
"#;

const SMALL_WORKLOAD: &str = r#"
[workload]
kind = "uniform"
read_share = 1.0
count = 10
"#;

fn parse_error(text: &str) -> String {
    Experiment::parse(text, Path::new("."))
        .err()
        .unwrap_or_else(|| panic!("parsed, but should not have:\n{text}"))
}

#[test]
fn an_unknown_top_level_field_is_named() {
    let text = format!("colour = \"blue\"\n{THREE_DISKS}{SMALL_WORKLOAD}");
    let error = parse_error(&text);
    assert!(
        error.starts_with("unknown field `colour`") && error.contains("queue-depth"),
        "{error}"
    );
}

#[test]
fn an_unknown_model_is_named_with_the_presets() {
    let text = format!("[[disk]]\nname = \"d0\"\nmodel = \"floppy-1440k\"\n{SMALL_WORKLOAD}");
    // Checked when the file is read, before anything runs.
    let error = parse_error(&text);
    assert!(
        error.starts_with("disk d0: unknown model \"floppy-1440k\"")
            && error.contains("cheetah-15k5-300g"),
        "{error}"
    );
}

#[test]
fn an_unknown_layer_kind_is_named_with_the_kinds() {
    let text = format!(
        "{THREE_DISKS}\n[[layer]]\nname = \"r\"\nkind = \"raid9\"\nchildren = [\"d0\", \"d1\", \"d2\"]\n{SMALL_WORKLOAD}"
    );
    let error = parse_error(&text);
    assert!(
        error.contains("field `kind`: unknown layer kind \"raid9\"") && error.contains("stripe"),
        "{error}"
    );
}

#[test]
fn a_child_used_by_two_layers_is_named() {
    let text = format!(
        "{THREE_DISKS}
[[layer]]
name = \"a\"
kind = \"stripe\"
children = [\"d0\", \"d1\"]

[[layer]]
name = \"b\"
kind = \"stripe\"
children = [\"d1\", \"d2\"]
{SMALL_WORKLOAD}"
    );
    let error = parse_error(&text);
    assert_eq!(
        error,
        "field `children`: \"d1\" is already a child of \"a\" (all of it), and \"b\" uses all \
         of it: the ranges overlap (a device may have several parents only where they use \
         disjoint ranges of it)"
    );
}

#[test]
fn a_run_past_its_time_limit_stops_with_an_error_counted_from_the_workload() {
    let text = r#"
name = "a limit the workload cannot meet"
seed = 3
time-limit = "100ms"

[[disk]]
name = "d0"
model = "cheetah-15k5-300g"

[[workload]]
"#;
    // [[workload]] is an array, not a table: a precise error, not a panic.
    let error = parse_error(text);
    assert!(error.contains("[workload]"), "{error}");
    let text = text.replace(
        "[[workload]]",
        "[workload]\nkind = \"uniform\"\nread_share = 1.0\ncount = 1000",
    );
    let experiment = Experiment::parse(&text, Path::new(".")).unwrap();
    // 1,000 random reads at ~5.6 ms each need ~5.6 s of virtual time.
    let Err(error) = experiment.run() else {
        panic!("the limit must stop the run");
    };
    assert!(
        error.contains("virtual time limit of 100000000 ns"),
        "{error}"
    );
}

/// A run that stores and verifies its data: `disks` Cheetahs d0…, a mixed uniform workload of
/// `count` requests; the caller appends the layers.
fn stored_run(seed: u64, disks: usize, count: u64) -> String {
    let mut text = format!("seed = {seed}\nqueue-depth = 4\ndata = \"stored\"\n");
    for i in 0..disks {
        text.push_str(&format!(
            "[[disk]]\nname = \"d{i}\"\nmodel = \"cheetah-15k5-300g\"\n"
        ));
    }
    text + &format!("[workload]\nkind = \"uniform\"\nread_share = 0.5\ncount = {count}\n")
}

#[test]
fn two_disjoint_slices_of_one_disk_rejoined_by_a_stripe_run_with_verified_data() {
    // A DAG, not a tree: d0 has two parents, which use disjoint halves of it.
    let text = stored_run(11, 1, 500)
        + r#"
[[layer]]
name = "low"
kind = "slice"
children = ["d0"]
offset = 0
length = "1GiB"

[[layer]]
name = "high"
kind = "slice"
children = ["d0"]
offset = "1GiB"
length = "1GiB"

[[layer]]
name = "both"
kind = "stripe"
children = ["low", "high"]
"#;
    let experiment = Experiment::parse(&text, Path::new(".")).unwrap();
    let (report, output) = experiment.run().unwrap();
    assert_eq!(output.records.len(), 500);
    assert_eq!(report.read_mismatches, 0);
    // The same slices overlapping are refused when the file is read, ranges named.
    let overlapping = text.replace("offset = \"1GiB\"", "offset = \"512MiB\"");
    let error = parse_error(&overlapping);
    assert!(
        error.contains("\"d0\" is already a child of \"low\" (bytes 0B..1GiB)")
            && error.contains("\"high\" uses bytes 512MiB..1536MiB"),
        "{error}"
    );
}

#[test]
fn a_thin_pool_formatted_in_the_simulator_draws_its_metadata_generation_from_the_seed() {
    // The store's first generation decides which superblock copy each checkpoint writes, and
    // so where on the disk: drawn from the OS, it made seeded runs that checkpoint differ.
    let text = "[[disk]]\nname = \"d0\"\nmodel = \"cheetah-15k5-300g\"\n\n\
                [[layer]]\nname = \"part\"\nkind = \"slice\"\nchildren = [\"d0\"]\n\
                length = \"1GiB\"\n\n\
                [[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"part\"]\n\
                volumes = [{ name = \"vol\", size = \"64MiB\" }]\n";
    let spec = StackSpec::from_toml(&text.parse().unwrap()).unwrap();
    let generation = |seed| {
        let sim = Simulation::new(seed);
        let stack = spec
            .build(&sim, &models::build, DataMode::Stored, Path::new("."))
            .unwrap();
        let part = stack.nodes["part"].clone();
        let (superblock, faults) = sim
            .block_on(async move { strata_meta::read_superblock(part.as_ref(), 0).await })
            .unwrap();
        assert!(faults.is_empty(), "{faults:?}");
        superblock.generation
    };
    assert_eq!(generation(1), generation(1));
    assert_ne!(generation(1), generation(2));
}

#[test]
fn a_thin_pool_over_a_raid5_runs_in_virtual_time_with_verified_data() {
    // The stack file's [[layer]] text is the one tests/integration/test_sim.py serves over NBD.
    let stack = include_str!("../../../../sim/thin-raid5-4-cheetah.toml");
    let text = format!(
        "seed = 7\nqueue-depth = 4\ndata = \"stored\"\n{stack}\n\
         [workload]\nkind = \"uniform\"\nread_share = 0.5\ncount = 1000\n"
    );
    let experiment = Experiment::parse(&text, Path::new(".")).unwrap();
    let (report, output) = experiment.run().unwrap();
    assert_eq!(report.top, "pool/vol");
    assert_eq!(output.records.len(), 1000);
    assert_eq!(report.read_mismatches, 0);
}
