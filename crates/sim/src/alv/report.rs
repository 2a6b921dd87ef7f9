//! `strata sim alv`'s tables (the paper's figures beside the simulated ones) and plots.

use std::path::{Path, PathBuf};

use crate::clotho::table;
use crate::results::{self, Series};

use super::{AlvReport, GrowRun, Load, Policy, Sweep, GIB, KIB};

/// The paper's figures for one load (§5.2, A(3,1), 30 GB disks, 64 KB chunks).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PaperRow {
    pub load: Load,
    /// Redistribution time, MD-Reshape then ALV (s).
    pub md_s: f64,
    pub alv_s: f64,
    /// Mean response time during it (ms); none offline.
    pub md_ms: Option<f64>,
    pub alv_ms: Option<f64>,
}

/// Fig. 13 (SPC-Web), Fig. 10 (TPC-C), Fig. 12 (Cello-99), Fig. 14 (offline).
pub const PAPER: [PaperRow; 4] = [
    PaperRow {
        load: Load::WebSearch,
        md_s: 4_338.0,
        alv_s: 3_294.0,
        md_ms: Some(484.130),
        alv_ms: Some(226.023),
    },
    PaperRow {
        load: Load::Tpcc,
        md_s: 4_828.0,
        alv_s: 3_600.0,
        md_ms: Some(738.147),
        alv_ms: Some(192.608),
    },
    PaperRow {
        load: Load::Cello,
        md_s: 3_027.0,
        alv_s: 2_141.0,
        md_ms: Some(1_108.110),
        alv_ms: Some(444.381),
    },
    PaperRow {
        load: Load::Offline,
        md_s: 1_836.0,
        alv_s: 1_571.0,
        md_ms: None,
        alv_ms: None,
    },
];

/// Table 1 (TPC-C run): metadata updates MD-Reshape 9,988, ALV 28.
pub const PAPER_METADATA: (u64, u64) = (9_988, 28);

/// The targets: ALV/MD redistribution time, mean response time, metadata writes;
/// offline time over the bandwidth bound.
pub const TARGET_TIME: f64 = 0.76;
pub const TARGET_RESPONSE: f64 = 0.47;
pub const TARGET_METADATA: f64 = 0.01;
pub const TARGET_BOUND: f64 = 1.15;

fn paper(load: Load) -> &'static PaperRow {
    PAPER.iter().find(|p| p.load == load).expect("every load")
}

fn f1(x: f64) -> String {
    format!("{x:.1}")
}

fn ratio(x: f64) -> String {
    format!("{x:.2}x")
}

/// Against a target: enough digits that "missed" is never printed beside the target.
fn ratio3(x: f64) -> String {
    format!("{x:.3}x")
}

fn change(alv: f64, md: f64) -> String {
    format!("{:+.1} %", (alv / md - 1.0) * 100.0)
}

fn ms(run: &GrowRun) -> String {
    run.mean_ms().map_or("-".into(), f1)
}

fn p99(run: &GrowRun) -> String {
    run.user
        .as_ref()
        .map_or("-".into(), |u| f1(u.p99_ns as f64 / 1e6))
}

/// The redistribution time, or for a grow cut off by the time limit how far it got.
fn seconds(run: &GrowRun) -> String {
    if run.finished {
        f1(super::seconds(run.grow_ns))
    } else {
        format!(
            "> {:.0} (unfinished, {:.0} % moved)",
            super::seconds(run.grow_ns),
            run.moved_bytes as f64 / run.total_bytes.max(1) as f64 * 100.0
        )
    }
}

fn size_text(bytes: u64) -> String {
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= GIB >> 4 {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

fn run_row(run: &GrowRun) -> Vec<String> {
    let s = &run.setup;
    let user = run.user.as_ref().map_or(0, |u| u.count);
    vec![
        s.load.label().into(),
        s.policy.name().into(),
        seconds(run),
        ms(run),
        p99(run),
        user.to_string(),
        format!("{:.0}", run.moving_share * 100.0),
        run.mover_reads.to_string(),
        run.mover_writes.to_string(),
        run.metadata_writes.to_string(),
        run.forced_checkpoints.to_string(),
    ]
}

fn run_header(first: &str) -> Vec<String> {
    [
        first,
        "policy",
        "grow s",
        "mean ms",
        "p99 ms",
        "requests",
        "moving %",
        "mover reads",
        "mover writes",
        "metadata writes",
        "forced",
    ]
    .map(String::from)
    .to_vec()
}

/// The comparison: every run, then ALV against MD per load beside the paper.
fn comparison(report: &AlvReport) -> String {
    let mut rows = vec![run_header("load")];
    rows.extend(report.runs.iter().map(run_row));
    let mut out = table(&rows);
    out.push('\n');
    let mut rows = vec![[
        "load",
        "grow ALV/MD",
        "paper",
        "mean resp. ALV/MD",
        "paper",
        "metadata ALV/MD",
        "paper",
    ]
    .map(String::from)
    .to_vec()];
    for &load in &report.config.loads {
        let (Some(alv), Some(md)) = (report.run(load, Policy::Alv), report.run(load, Policy::Md))
        else {
            continue;
        };
        let p = paper(load);
        let response = match (alv.mean_ms(), md.mean_ms()) {
            (Some(a), Some(m)) => format!("{} ({})", ratio(a / m), change(a, m)),
            _ => "-".into(),
        };
        let paper_response = match (p.alv_ms, p.md_ms) {
            (Some(a), Some(m)) => format!("{} ({})", ratio(a / m), change(a, m)),
            _ => "-".into(),
        };
        let metadata = format!(
            "{} / {} ({:.2} %)",
            alv.metadata_writes,
            md.metadata_writes,
            alv.metadata_writes as f64 / md.metadata_writes.max(1) as f64 * 100.0
        );
        let paper_metadata = if load == Load::Tpcc {
            format!("{} / {} (0.28 %)", PAPER_METADATA.1, PAPER_METADATA.0)
        } else {
            "-".into()
        };
        let (a, m) = (alv.grow_ns as f64, md.grow_ns as f64);
        rows.push(vec![
            load.label().into(),
            format!("{} ({})", ratio(a / m), change(a, m)),
            format!("{} ({})", ratio(p.alv_s / p.md_s), change(p.alv_s, p.md_s)),
            response,
            paper_response,
            metadata,
            paper_metadata,
        ]);
    }
    out.push_str(&table(&rows));
    out
}

/// Each load alone on the old array.
fn baselines(report: &AlvReport) -> String {
    let bound = report.config.alv.bound_ms.unwrap_or(15.0);
    let mut rows = vec![vec![
        "load alone (no grow)".to_string(),
        "s".into(),
        "requests".into(),
        "mean ms".into(),
        "reads ms".into(),
        "writes ms".into(),
        "p99 ms".into(),
        format!("> {bound} ms %"),
        "busiest drive %".into(),
    ]];
    for b in &report.baselines {
        let u = b.user.as_ref();
        rows.push(vec![
            b.load.label().into(),
            f1(b.duration_ns as f64 / 1e9),
            u.map_or(0, |u| u.count).to_string(),
            u.map_or("-".into(), |u| f1(u.mean_ns / 1e6)),
            b.read_ms.map_or("-".into(), f1),
            b.write_ms.map_or("-".into(), f1),
            u.map_or("-".into(), |u| f1(u.p99_ns as f64 / 1e6)),
            f1(b.late_share * 100.0),
            format!("{:.0}", b.utilization * 100.0),
        ]);
    }
    table(&rows)
}

/// The targets, each met or missed, from the comparison's runs.
fn targets(report: &AlvReport) -> String {
    let mut rows = vec![["target", "load", "measured", "target", "verdict"]
        .map(String::from)
        .to_vec()];
    let verdict = |ok: bool| if ok { "met" } else { "missed" }.to_string();
    for &load in &report.config.loads {
        let (Some(alv), Some(md)) = (report.run(load, Policy::Alv), report.run(load, Policy::Md))
        else {
            continue;
        };
        let time = alv.grow_ns as f64 / md.grow_ns as f64;
        rows.push(vec![
            "redistribution time ALV/MD".into(),
            load.label().into(),
            ratio3(time),
            format!("<= {}", ratio(TARGET_TIME)),
            verdict(time <= TARGET_TIME),
        ]);
        if let (Some(a), Some(m)) = (alv.mean_ms(), md.mean_ms()) {
            // The load alone is what a policy that never disturbed a user would give: its
            // ratio to md's is the lowest any policy can reach on this load. A target below
            // it is out of reach for every policy, not missed by ALV's.
            let floor = report.baseline(load).map(|alone| alone / m);
            let verdict = match floor {
                Some(floor) if floor > TARGET_RESPONSE && a / m > TARGET_RESPONSE => {
                    format!("out of reach (no grow: {})", ratio3(floor))
                }
                _ => verdict(a / m <= TARGET_RESPONSE),
            };
            rows.push(vec![
                "mean response ALV/MD".into(),
                load.label().into(),
                ratio3(a / m),
                format!("<= {}", ratio(TARGET_RESPONSE)),
                verdict,
            ]);
        }
        let meta = alv.metadata_writes as f64 / md.metadata_writes.max(1) as f64;
        rows.push(vec![
            "metadata writes ALV/MD".into(),
            load.label().into(),
            format!("{:.2} %", meta * 100.0),
            "<= 1 %".into(),
            verdict(meta <= TARGET_METADATA),
        ]);
        if load == Load::Offline {
            for run in [alv, md] {
                let bound = run.grow_ns as f64 / run.bandwidth_bound_ns() as f64;
                rows.push(vec![
                    format!("{} time / bandwidth bound", run.setup.policy.name()),
                    load.label().into(),
                    format!(
                        "{} ({:.1} s / {:.1} s)",
                        ratio3(bound),
                        super::seconds(run.grow_ns),
                        super::seconds(run.bandwidth_bound_ns())
                    ),
                    if run.setup.policy == Policy::Alv {
                        format!("<= {}", ratio(TARGET_BOUND))
                    } else {
                        "-".into()
                    },
                    if run.setup.policy == Policy::Alv {
                        verdict(bound <= TARGET_BOUND)
                    } else {
                        "-".into()
                    },
                ]);
            }
        }
    }
    table(&rows)
}

/// What a sweep point changes, as a row label.
fn point(sweep: Sweep, run: &GrowRun) -> String {
    let s = &run.setup;
    match sweep {
        Sweep::Bound => format!("B = {} ms", s.knobs.bound_ms.unwrap_or(15.0)),
        Sweep::Slack => format!("θ = {}", s.knobs.slack.unwrap_or(0.1)),
        Sweep::Chunk => format!("chunk {} KiB", s.chunk_bytes / KIB),
        Sweep::Members | Sweep::Added => format!("A({},{})", s.m, s.n),
        Sweep::Journal => format!(
            "{}, journal on {}",
            s.load.name(),
            match s.journal {
                super::Journal::Flash => "flash",
                super::Journal::Members => "members",
            }
        ),
        Sweep::Buffer => match (s.policy, s.knobs.buffer_kib) {
            // The engine's default: 2 MiB while users are about, 8 MiB while they are quiet
            // (offline, every window).
            (Policy::Alv, None) => "ALV's default (8 MiB offline)".to_string(),
            (Policy::Alv, Some(kib)) => format!("{} MiB per member", kib as f64 / 1024.0),
            (Policy::Md, _) => format!(
                "{} MiB per member",
                s.knobs.stripe_cache.unwrap_or(512) as f64 / 256.0
            ),
        },
        Sweep::MdDefaults => match (s.policy, s.knobs.speed_min_kibps) {
            (Policy::Alv, _) => s.load.name().to_string(),
            (Policy::Md, Some(min)) => format!("{}, md at {} KiB/s", s.load.name(), min),
            (Policy::Md, None) => format!("{}, md defaults", s.load.name()),
        },
    }
}

/// What an ALV run is compared with: same load, shape, journal and buffer (ALV's buffer
/// against md's stripe cache, both in 4 KiB pages per member).
fn key(run: &GrowRun) -> (Load, usize, usize, u64, super::Journal, u64) {
    let s = &run.setup;
    let pages = match s.policy {
        Policy::Alv => s.knobs.buffer_kib.unwrap_or(2048) / 4,
        Policy::Md => s.knobs.stripe_cache.unwrap_or(512),
    };
    (s.load, s.m, s.n, s.chunk_bytes, s.journal, pages)
}

/// Each sweep's points after the comparison's runs it varies from (marked "reference"),
/// with ALV against MD: for an ALV run the MD run of the same load and shape (the sweep's
/// own, else the comparison's); for md's defaults, the comparison's ALV run against it.
fn sweeps(report: &AlvReport) -> String {
    let mut out = String::new();
    for (sweep, runs) in &report.sweeps {
        let mut rows = vec![{
            let mut header = run_header("point");
            header.extend(["grow ALV/MD".into(), "resp. ALV/MD".into()]);
            header
        }];
        let mut all: Vec<(String, &GrowRun)> = report
            .runs
            .iter()
            .filter(|r| runs.iter().any(|s| s.setup.load == r.setup.load))
            .map(|r| (format!("{} (reference)", point(*sweep, r)), r))
            .collect();
        all.extend(runs.iter().map(|r| (point(*sweep, r), r)));
        for (label, run) in &all {
            let partner = |policy: Policy| {
                runs.iter()
                    .chain(&report.runs)
                    .find(|r| r.setup.policy == policy && key(r) == key(run))
            };
            let pair = match (run.setup.policy, sweep) {
                (Policy::Md, Sweep::MdDefaults) if runs.iter().any(|r| std::ptr::eq(r, *run)) => {
                    report
                        .run(run.setup.load, Policy::Alv)
                        .map(|alv| (alv, *run))
                }
                (Policy::Alv, _) => partner(Policy::Md).map(|md| (*run, md)),
                _ => None,
            };
            let mut row = run_row(run);
            row[0] = label.clone();
            match pair {
                Some((alv, md)) => {
                    row.push(ratio(alv.grow_ns as f64 / md.grow_ns as f64));
                    row.push(match (alv.mean_ms(), md.mean_ms()) {
                        (Some(a), Some(m)) => ratio(a / m),
                        _ => "-".into(),
                    });
                }
                None => row.extend(["".into(), "".into()]),
            }
            rows.push(row);
        }
        out.push_str(&format!(
            "\nsweep {} ({}):\n",
            sweep.name(),
            match sweep {
                Sweep::Bound => "TPC-C-like load; the paper's Fig. 15",
                Sweep::Slack => "TPC-C-like load; the paper's Fig. 16",
                Sweep::Chunk => "TPC-C-like load; the paper's Fig. 17",
                Sweep::Members => "TPC-C-like load; the paper's Fig. 18",
                Sweep::Added => "TPC-C-like load; not in the paper",
                Sweep::Journal => "Strata's journal placement; not in the paper",
                Sweep::MdDefaults => "md's funnel at its defaults, 1,000-200,000 KiB/s",
                Sweep::Buffer => "offline; ALV's buffer and md's stripe cache; the paper's Fig. 19",
            }
        ));
        out.push_str(&table(&rows));
    }
    out
}

/// The report as the terminal shows it.
pub fn format_report(report: &AlvReport) -> String {
    let c = &report.config;
    let mut out = format!(
        "ALV §5 on the raid5 grow engine: A({},{}) of {} members (slices of {}), {} KiB chunks, \
         seed {}, scale 1/{}\n",
        c.m,
        c.n,
        size_text(c.member_bytes),
        c.model,
        c.chunk_bytes / KIB,
        c.seed,
        c.scale
    );
    out.push_str(&format!(
        "loads: WebSearch = the SPC trace looped{}; TPC-C-like and Cello-like are SYNTHETIC \
         stand-ins (TPC-C-like: Poisson {} IOPS, 8 KiB, 2/3 reads, zipf 0.9; Cello-like: \
         {} IOPS in Pareto bursts of {:.1} s every {:.1} s of silence, 4-64 KiB, {:.0} % \
         reads, uniform)\n",
        report
            .trace_iops
            .map_or(String::new(), |r| format!(" ({r:.0} IOPS)")),
        c.synthetic.tpcc_iops,
        c.synthetic.cello_burst_iops,
        c.synthetic.cello_burst_mean_ns as f64 / 1e9,
        c.synthetic.cello_gap_mean_ns as f64 / 1e9,
        c.synthetic.cello_read_share * 100.0,
    ));
    if let Some(run) = report.runs.first() {
        out.push_str(&format!(
            "drive sustained bandwidth over the members' region: {:.1} MiB/s\n",
            run.bandwidth / (1 << 20) as f64
        ));
    }
    out.push('\n');
    if !report.baselines.is_empty() {
        out.push_str(&baselines(report));
        out.push('\n');
    }
    out.push_str(&comparison(report));
    out.push_str("\ntargets (issue 15):\n");
    out.push_str(&targets(report));
    out.push_str(&sweeps(report));
    out
}

/// Response time over the reshape, ALV and MD on one plot per load; returns the files.
pub fn write_plots(report: &AlvReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for &load in &report.config.loads {
        if load == Load::Offline {
            continue;
        }
        let series: Vec<Series> = [Policy::Alv, Policy::Md]
            .iter()
            .filter_map(|&p| report.run(load, p))
            .map(|run| Series {
                name: format!(
                    "{} ({:.0} s)",
                    run.setup.policy.name(),
                    super::seconds(run.grow_ns)
                ),
                points: run.sequences.iter().map(|s| (s.at_s, s.mean_ms)).collect(),
            })
            .collect();
        let title = format!("{}: response time during the grow", load.label());
        let svg = results::lines_svg(
            &title,
            "time since the grow started (s)",
            "mean response time of a sequence (ms)",
            &series,
        )
        .map_err(|e| e.to_string())?;
        let path = dir.join(format!("response-{}.svg", load.name()));
        std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    let path = dir.join("report.json");
    std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    written.push(path);
    Ok(written)
}
