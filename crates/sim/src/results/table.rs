//! The run summary as a fixed-width terminal table, latencies in milliseconds.

use crate::model::{Nanos, MILLIS};

use super::stats::{DeviceSummary, RunSummary, Scope};

fn ms(ns: Nanos) -> String {
    format!("{:.3}", ns as f64 / MILLIS as f64)
}

fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::All => "all",
        Scope::Read => "read",
        Scope::Write => "write",
    }
}

pub fn format_summary_table(summary: &RunSummary) -> String {
    let header = [
        "op", "count", "mean", "stddev", "min", "p50", "p90", "p95", "p99", "p99.9", "max",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for scoped in &summary.latency {
        let s = &scoped.summary;
        rows.push(vec![
            scope_name(scoped.scope).to_owned(),
            s.count.to_string(),
            format!("{:.3}", s.mean_ns / MILLIS as f64),
            format!("{:.3}", s.stddev_ns / MILLIS as f64),
            ms(s.min_ns),
            ms(s.p50_ns),
            ms(s.p90_ns),
            ms(s.p95_ns),
            ms(s.p99_ns),
            ms(s.p999_ns),
            ms(s.max_ns),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::from("latency (ms)\n");
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, &w))| {
                if c == 0 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    let t = &summary.throughput;
    out.push_str(&format!(
        "throughput: {} I/Os in {:.3} s = {:.1} IOPS, {:.2} MiB/s; failed: {}\n",
        t.ios,
        t.span_ns as f64 / 1e9,
        t.iops,
        t.mib_per_s,
        summary.failed
    ));
    out
}

/// One line per device: utilization as a percentage, queue depth mean and maximum.
pub fn format_device_table(devices: &[DeviceSummary]) -> String {
    let width = devices
        .iter()
        .map(|d| d.device.len())
        .max()
        .unwrap_or(0)
        .max("device".len());
    let mut out = format!(
        "{:<width$}  {:>6}  {:>8}  {:>6}\n",
        "device", "util%", "mean qd", "max qd"
    );
    for d in devices {
        out.push_str(&format!(
            "{:<width$}  {:>6.1}  {:>8.2}  {:>6}\n",
            d.device,
            d.mean_utilization * 100.0,
            d.mean_queue_depth,
            d.max_queue_depth
        ));
    }
    out
}
