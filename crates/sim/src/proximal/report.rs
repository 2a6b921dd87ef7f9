//! `strata sim proximal`'s tables (the paper's figures beside the simulated ones) and plots.

use std::path::{Path, PathBuf};

use crate::clotho::table;
use crate::results::{self, Series};

use super::{ProximalReport, ReadRun, StagedRun, MIB};

/// One row of the paper's Table 2 (RE3 4+1 RAID-4, 16 MB extents, 89 % full).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PaperRow {
    pub percent: f64,
    pub updates_per_batch: f64,
    pub amplification: f64,
    pub per_revolution: f64,
}

/// Table 2 as the seed quotes it (the intermediate rows are missing from the seed).
pub const PAPER: [PaperRow; 2] = [
    PaperRow {
        percent: 1.0,
        updates_per_batch: 47.5,
        amplification: 6.2,
        per_revolution: 5.3,
    },
    PaperRow {
        percent: 10.0,
        updates_per_batch: 369.7,
        amplification: 4.5,
        per_revolution: 8.6,
    },
];

/// Table 3: per-disk MB/s aged and pristine (86.2, 89.0); write-anywhere "as little as 3 %".
pub const PAPER_READ: (f64, f64) = (86.2, 89.0);

fn paper(percent: f64) -> Option<PaperRow> {
    PAPER.into_iter().find(|p| p.percent == percent)
}

fn or_dash(value: Option<f64>, digits: usize) -> String {
    value.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn table2_rows(runs: &[StagedRun]) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "drive".into(),
        "staging".into(),
        "log slots".into(),
        "batches".into(),
        "updates/batch".into(),
        "(paper)".into(),
        "disk I/Os/batch".into(),
        "amplification".into(),
        "(paper)".into(),
        "I/Os/rev".into(),
        "(paper)".into(),
        "busy I/Os/rev".into(),
        "I/Os/rev with switches".into(),
        "service ms".into(),
        "updates/s".into(),
    ]];
    for run in runs {
        let p = paper(run.setup.percent);
        rows.push(vec![
            run.setup.model.clone(),
            format!("{} %", run.setup.percent),
            run.log_slots.to_string(),
            run.batches.to_string(),
            format!("{:.1}", run.updates_per_batch),
            or_dash(p.map(|p| p.updates_per_batch), 1),
            format!("{:.1}", run.ios_per_batch),
            format!("{:.2}", run.amplification),
            or_dash(p.map(|p| p.amplification), 1),
            format!("{:.2}", run.revolutions.per_revolution),
            or_dash(p.map(|p| p.per_revolution), 1),
            format!("{:.2}", run.revolutions.busy_per_revolution),
            format!("{:.2}", run.revolutions.with_switches_per_revolution),
            format!("{:.2}", run.revolutions.mean_service_ms),
            format!("{:.0}", run.updates_per_s),
        ]);
    }
    rows
}

fn read_row(run: &ReadRun, pristine: Option<f64>, paper: &str) -> Vec<String> {
    vec![
        run.layout.clone(),
        run.requests.to_string(),
        format!("{:.1}", run.blocks_per_request),
        format!("{:.2}", run.mean_ms),
        format!("{:.1}", run.disk_ios_per_request),
        or_dash(run.runs_per_request, 1),
        format!("{:.1}", run.mb_per_s_per_disk),
        or_dash(pristine.map(|p| run.mb_per_s_per_disk / p), 3),
        paper.into(),
    ]
}

/// Every table.
pub fn format_report(report: &ProximalReport) -> String {
    let c = &report.config;
    let mut out = String::new();
    out.push_str(&format!(
        "Proximal I/O §5 on the stage layer: 5 × {} (slices of {} MiB), raid5 4+1 of {} KiB \
         chunks, stage extent {} MiB, range {} MiB; fill {} %, {} updates per extent; seed {}; \
         revolution {:.3} ms\n\n",
        c.model,
        c.member_bytes / MIB,
        c.chunk_bytes >> 10,
        c.extent_bytes / MIB,
        c.range_bytes / MIB,
        c.fill_percent,
        c.updates_per_extent,
        c.seed,
        report.revolution_ms
    ));
    out.push_str("Table 2: random updates, destage when the log is full\n");
    let mut runs = report.table2.clone();
    runs.extend(report.quirk.iter().cloned());
    out.push_str(&table(&table2_rows(&runs)));
    for run in &runs {
        let placed = run.placed_at_home
            + run.placed_in_home_range
            + run.placed_in_window
            + run.placed_outside_window;
        out.push_str(&format!(
            "  {} {} %: {} destages; placed at home {} / in home range {} / in window {} / \
             outside {} of {placed}; {:.1} stage requests per batch\n",
            run.setup.model,
            run.setup.percent,
            run.destages,
            run.placed_at_home,
            run.placed_in_home_range,
            run.placed_in_window,
            run.placed_outside_window,
            run.stage_requests_per_batch
        ));
    }
    out.push_str("\nTable 3: serial read of every extent, random order\n");
    let mut rows = vec![vec![
        "layout".into(),
        "requests".into(),
        "blocks/request".into(),
        "ms/request".into(),
        "disk I/Os/request".into(),
        "runs/request".into(),
        "MB/s per disk".into(),
        "÷ pristine".into(),
        "(paper)".into(),
    ]];
    let t3 = report.table3();
    let pristine = t3.and_then(|r| r.pristine.as_ref());
    let base = pristine.map(|p| p.mb_per_s_per_disk);
    if let Some(p) = pristine {
        rows.push(read_row(p, base, "89.0 MB/s"));
    }
    if let Some(a) = t3.and_then(|r| r.aged.as_ref()) {
        rows.push(read_row(a, base, "86.2 MB/s (0.969)"));
    }
    if let Some(h) = &report.hole_plugging {
        rows.push(read_row(h, base, "as little as 3 %"));
    }
    out.push_str(&table(&rows));
    let ip = &report.in_place;
    out.push_str(&format!(
        "\nUpdate in place (4 KiB random writes straight to the raid5, one at a time): {} \
         updates, {:.2} disk I/Os per update ({} reads, {} writes; the paper's frame array: \
         4), {:.0} updates/s\n",
        ip.updates, ip.ios_per_update, ip.disk_reads, ip.disk_writes, ip.updates_per_s
    ));
    out.push_str(&format!(
        "\nTriggers: {} % staging, {} updates per extent, open loop at {} updates/s\n",
        c.trigger_percent, c.trigger_updates_per_extent, c.rate_per_s
    ));
    let mut rows = vec![vec![
        "trigger".into(),
        "batches".into(),
        "updates/batch".into(),
        "amplification".into(),
        "I/Os/rev".into(),
        "busy I/Os/rev".into(),
        "I/Os/rev with switches".into(),
        "mean ms".into(),
        "p99 ms".into(),
        "max ms".into(),
        "failed".into(),
    ]];
    for run in &report.triggers {
        let l = run.latency.as_ref();
        rows.push(vec![
            run.setup.trigger.label(),
            run.batches.to_string(),
            format!("{:.1}", run.updates_per_batch),
            format!("{:.2}", run.amplification),
            format!("{:.2}", run.revolutions.per_revolution),
            format!("{:.2}", run.revolutions.busy_per_revolution),
            format!("{:.2}", run.revolutions.with_switches_per_revolution),
            or_dash(l.map(|l| l.mean_ns / 1e6), 2),
            or_dash(l.map(|l| l.p99_ns as f64 / 1e6), 2),
            or_dash(l.map(|l| l.max_ns as f64 / 1e6), 1),
            run.failed.to_string(),
        ]);
    }
    out.push_str(&table(&rows));
    out
}

/// `dir/ios-per-revolution.svg` (against staging size, per drive), `dir/triggers.svg`
/// (I/Os per revolution and p99 per trigger) and `dir/report.json`.
pub fn write_plots(report: &ProximalReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut write = |name: &str, text: String| -> Result<(), String> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let mut series = vec![Series {
        name: format!("{} (full trigger)", report.config.model),
        points: report
            .table2
            .iter()
            .map(|r| (r.setup.percent, r.revolutions.per_revolution))
            .collect(),
    }];
    if !report.quirk.is_empty() {
        series.push(Series {
            name: format!("{}-order-quirk (full trigger)", report.config.model),
            points: report
                .quirk
                .iter()
                .map(|r| (r.setup.percent, r.revolutions.per_revolution))
                .collect(),
        });
    }
    series.push(Series {
        name: "paper (Table 2)".into(),
        points: PAPER
            .iter()
            .map(|p| (p.percent, p.per_revolution))
            .collect(),
    });
    let svg = results::lines_svg(
        "Disk I/Os per revolution during destage",
        "staging area (% of usable capacity)",
        "disk I/Os per revolution",
        &series,
    )
    .map_err(|e| e.to_string())?;
    write("ios-per-revolution.svg", svg)?;
    // One point per trigger: x = I/Os per revolution, y = p99 latency.
    let series: Vec<Series> = report
        .triggers
        .iter()
        .filter_map(|r| {
            Some(Series {
                name: r.setup.trigger.label(),
                points: vec![(
                    r.revolutions.per_revolution,
                    r.latency.as_ref()?.p99_ns as f64 / 1e6,
                )],
            })
        })
        .collect();
    let svg = results::lines_svg(
        &format!(
            "Triggers at {} % staging, {} updates/s",
            report.config.trigger_percent, report.config.rate_per_s
        ),
        "disk I/Os per revolution",
        "p99 update latency (ms)",
        &series,
    )
    .map_err(|e| e.to_string())?;
    write("triggers.svg", svg)?;
    let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    write("report.json", json)?;
    Ok(written)
}
