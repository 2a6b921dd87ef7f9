//! `strata sim alv` (docs/raid5-grow-sim.md) at a small scale: both policies grow the array
//! through `Control::GrowMembers` in virtual time and the counters come from the engine.
//! Nothing here is a recorded number: what is checked are the paper's structural claims
//! (ALV's metadata writes are logarithmic, md's linear; ALV moves the data in few large
//! I/Os, md in 4 KiB ones) and that a run is a function of its seed.

use strata_sim::alv::{self, AlvConfig, Load, Policy};

/// 30 MiB members: a grow takes a second or two of virtual time.
const SCALE: u64 = 1024;

fn config(loads: &[Load]) -> AlvConfig {
    AlvConfig {
        loads: loads.to_vec(),
        trace: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/traces/websearch-spc.trace"
        )
        .into(),
        ..AlvConfig::scaled(1, SCALE)
    }
}

#[test]
fn offline_both_policies_grow_the_array_and_alv_writes_less_metadata() {
    let report = alv::run(&config(&[Load::Offline])).unwrap();
    let table = alv::format_report(&report);
    println!("{table}");
    let alv = report.run(Load::Offline, Policy::Alv).expect("an ALV run");
    let md = report.run(Load::Offline, Policy::Md).expect("an md run");
    for run in [alv, md] {
        assert!(run.finished, "{table}");
        assert!(run.user.is_none(), "no user I/O offline");
        // Every old chunk read once at least, the whole new capacity written.
        assert!(run.mover_bytes_written >= run.total_bytes, "{table}");
        assert!(run.metadata_writes >= 1, "{table}");
        let written: u64 = run.disks.iter().map(|(_, s)| s.written_bytes).sum();
        assert!(
            written >= run.mover_bytes_written,
            "the drives saw the mover's writes"
        );
    }
    assert!(alv.metadata_writes < md.metadata_writes, "{table}");
    // md moves in 4 KiB I/Os (but for the critical section's few, written whole through
    // the backup as for ALV). ALV offline, with no user to spare, writes each member's range
    // of a window in one I/O: 8 MiB once the reordering window allows it, smaller in the
    // first windows.
    let whole = md.mover_bytes_written - md.mover_writes * 4096;
    assert!(whole < md.mover_bytes_written / 100, "{table}");
    assert!(
        alv.mover_bytes_written / alv.mover_writes >= 256 << 10,
        "ALV's writes average a quarter MiB at least: {table}"
    );
    assert!(alv.mover_writes * 100 < md.mover_writes, "{table}");
    // The bound is what the busiest drive needs at its sustained bandwidth; nothing beats it.
    assert!(alv.grow_ns > alv.bandwidth_bound_ns(), "{table}");
    assert!(table.contains("none (offline)") && table.contains("targets (issue 15)"));
}

#[test]
fn under_the_websearch_trace_the_users_are_measured_during_the_grow_only() {
    let report = alv::run(&config(&[Load::WebSearch, Load::Offline])).unwrap();
    let table = alv::format_report(&report);
    println!("{table}");
    assert_eq!(report.baselines.len(), 1, "offline has none");
    for policy in [Policy::Alv, Policy::Md] {
        let run = report.run(Load::WebSearch, policy).unwrap();
        assert!(run.finished, "{table}");
        let user = run.user.as_ref().expect("requests during the grow");
        assert!(user.count > 100, "{table}");
        assert_eq!(run.user_failed, 0);
        let sequences: u64 = run.sequences.iter().map(|s| s.requests).sum();
        assert_eq!(sequences, user.count, "every request in one sequence");
        let last = run.sequences.last().unwrap();
        assert!(
            last.at_s * 1e9 <= run.grow_ns as f64,
            "arrived during the grow"
        );
    }
    // Lazy checkpoints (paper §2.3): under a trace of reads (4 writes in 24,782), ALV
    // records its sliding windows and what user writes force, whatever its valve does; it
    // recorded one more each time the valve closed, once every two seconds or so.
    let (alv, offline) = (
        report.run(Load::WebSearch, Policy::Alv).unwrap(),
        report.run(Load::Offline, Policy::Alv).unwrap(),
    );
    assert!(
        alv.moving_share < 1.0,
        "the valve closed sometimes:\n{table}"
    );
    assert!(
        alv.metadata_writes <= offline.metadata_writes + 2 * alv.forced_checkpoints,
        "{table}"
    );
    // No policy can give users a lower mean than the load alone: the targets table says so
    // when that floor is above the target, instead of calling it ALV's miss.
    let md = report.run(Load::WebSearch, Policy::Md).unwrap();
    let floor = report.baseline(Load::WebSearch).unwrap() / md.mean_ms().unwrap();
    let ratio = alv.mean_ms().unwrap() / md.mean_ms().unwrap();
    let response_row = table
        .lines()
        .find(|l| l.contains("mean response ALV/MD") && l.contains("WebSearch"))
        .expect("a response target row");
    assert_eq!(
        response_row.contains("out of reach"),
        floor > 0.47 && ratio > 0.47,
        "floor {floor:.3}, ALV {ratio:.3}: {response_row}"
    );
    let dir = tempfile::tempdir().unwrap();
    let written = alv::write_plots(&report, dir.path()).unwrap();
    let svg = std::fs::read_to_string(dir.path().join("response-websearch.svg")).unwrap();
    roxmltree::Document::parse(&svg).expect("well-formed SVG");
    assert!(svg.contains("alv (") && svg.contains("md ("));
    assert_eq!(written.len(), 2, "the plot and report.json (none offline)");
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let run = |seed| {
        let config = AlvConfig {
            seed,
            ..config(&[Load::Tpcc])
        };
        serde_json::to_string(&alv::run(&config).unwrap()).unwrap()
    };
    let first = run(1);
    assert_eq!(first, run(1));
    assert_ne!(first, run(2));
}
