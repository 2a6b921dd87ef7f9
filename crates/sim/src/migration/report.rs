//! `strata sim migration`'s tables (the paper's figures beside the simulated ones) and plots.

use std::path::{Path, PathBuf};

use crate::clotho::table;
use crate::results::{self, Series};

use super::link::{SharedCurve, SharedReport};
use super::{local_share, saturation, Curve, MigrationReport, Point, MIB};

/// Fig. 4(b) as the digest quotes it: RTT, base response time improvement %, higher-load
/// improvement range %, saturation gain %.
pub const PAPER_FIG4: [(u32, f64, (f64, f64), f64); 3] = [
    (9, 24.0, (6.7, 20.0), 9.6),
    (17, 24.3, (8.5, 26.5), 9.1),
    (25, 33.3, (7.0, 29.8), 10.8),
];

/// The targets: STR-MIG base response time at most this × STR-NOMIG's.
pub fn target_base_ratio(rtt_ms: u32) -> Option<f64> {
    match rtt_ms {
        9 => Some(0.76),
        25 => Some(0.67),
        _ => None,
    }
}

/// The target saturation gain, %.
pub const TARGET_SATURATION_GAIN: f64 = 9.0;

fn pct(new: f64, old: f64) -> f64 {
    (old - new) / old * 100.0
}

fn or_dash(value: Option<f64>, digits: usize) -> String {
    value.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// Improvement of `mig` over `nomig` at the higher loads: every load point after the first
/// where both curves have a point and NOMIG's mean is within the bound; (min, max) in %.
pub fn higher_load_range(mig: &Curve, nomig: &Curve, bound_ms: f64) -> Option<(f64, f64)> {
    let gains: Vec<f64> = mig
        .points
        .iter()
        .zip(&nomig.points)
        .skip(1)
        .filter(|(_, n)| n.mean_ms <= bound_ms)
        .map(|(m, n)| pct(m.mean_ms, n.mean_ms))
        .collect();
    if gains.is_empty() {
        return None;
    }
    Some((
        gains.iter().copied().fold(f64::INFINITY, f64::min),
        gains.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    ))
}

fn curve_rows(curves: &[&Curve]) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "config".into(),
        "RTT".into(),
        "tokens".into(),
        "offered/s".into(),
        "delivered/s".into(),
        "mean ms".into(),
        "p95 ms".into(),
        "mig→local".into(),
        "mig→remote".into(),
        "local share".into(),
        "r local ms".into(),
        "r remote ms".into(),
        "δ ms".into(),
        "last mig s".into(),
        "drive util %".into(),
    ]];
    for curve in curves {
        for p in &curve.points {
            rows.push(point_row(&curve.name, p));
        }
    }
    rows
}

fn point_row(name: &str, p: &Point) -> Vec<String> {
    let c = &p.counters;
    let remote: Vec<String> = c
        .response_ms
        .iter()
        .skip(1)
        .map(|r| format!("{r:.1}"))
        .collect();
    vec![
        name.to_string(),
        format!("{} ms", p.setup.rtt_ms),
        p.setup.tokens.to_string(),
        format!("{:.1}", p.offered),
        format!("{:.1}", p.delivered),
        format!("{:.2}", p.mean_ms),
        format!("{:.1}", p.p95_ms),
        c.moved_to.first().copied().unwrap_or(0).to_string(),
        c.moved_to.iter().skip(1).sum::<u64>().to_string(),
        format!("{:.2}", local_share(c)),
        or_dash(c.response_ms.first().copied(), 1),
        remote.join("/"),
        format!("{:.1}", c.delta_ms),
        or_dash(p.last_migration_s, 0),
        p.disk_util
            .iter()
            .map(|u| format!("{:.0}", u * 100.0))
            .collect::<Vec<_>>()
            .join("/"),
    ]
}

fn summary_rows(pairs: &[(Curve, Curve)], bound_ms: f64, with_paper: bool) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "RTT".into(),
        "NOMIG base ms".into(),
        "MIG base ms".into(),
        "MIG/NOMIG".into(),
        "base gain %".into(),
        "(paper)".into(),
        "higher-load gain %".into(),
        "(paper)".into(),
        "NOMIG sat/s".into(),
        "MIG sat/s".into(),
        "sat gain %".into(),
        "(paper)".into(),
        "max delivered NOMIG/MIG".into(),
        "migrations".into(),
    ]];
    for (mig, nomig) in pairs {
        let paper = PAPER_FIG4.iter().find(|p| p.0 == mig.rtt_ms);
        let (base_m, base_n) = (mig.base_ms(), nomig.base_ms());
        let (sat_m, sat_n) = (mig.saturation(bound_ms), nomig.saturation(bound_ms));
        let gain = match (sat_m, sat_n) {
            (Some(m), Some(n)) => Some((m - n) / n * 100.0),
            _ => None,
        };
        let range = higher_load_range(mig, nomig, bound_ms)
            .map_or("-".into(), |(a, b)| format!("{a:.1} to {b:.1}"));
        rows.push(vec![
            format!("{} ms", mig.rtt_ms),
            format!("{base_n:.2}"),
            format!("{base_m:.2}"),
            format!("{:.3}", base_m / base_n),
            format!("{:.1}", pct(base_m, base_n)),
            if with_paper {
                or_dash(paper.map(|p| p.1), 1)
            } else {
                "-".into()
            },
            range,
            if with_paper {
                paper.map_or("-".into(), |p| format!("{} to {}", p.2 .0, p.2 .1))
            } else {
                "-".into()
            },
            or_dash(sat_n, 1),
            or_dash(sat_m, 1),
            or_dash(gain, 1),
            if with_paper {
                or_dash(paper.map(|p| p.3), 1)
            } else {
                "-".into()
            },
            format!("{:.1}/{:.1}", nomig.max_delivered(), mig.max_delivered()),
            mig.migrations().to_string(),
        ]);
    }
    rows
}

fn targets(report: &MigrationReport) -> String {
    let bound = report.config.bound_ms;
    let mut out = String::new();
    for (mig, nomig) in &report.striping {
        let ratio = mig.base_ms() / nomig.base_ms();
        if let Some(target) = target_base_ratio(mig.rtt_ms) {
            out.push_str(&format!(
                "  target: STR-MIG base ≤ {target:.2} × STR-NOMIG at {} ms: {ratio:.3} → {}\n",
                mig.rtt_ms,
                if ratio <= target { "met" } else { "NOT met" }
            ));
        }
        let gain = match (mig.saturation(bound), nomig.saturation(bound)) {
            (Some(m), Some(n)) => Some((m - n) / n * 100.0),
            _ => None,
        };
        out.push_str(&format!(
            "  target: saturation gain ≥ +{TARGET_SATURATION_GAIN} % at {} ms: {} → {}\n",
            mig.rtt_ms,
            or_dash(gain, 1),
            match gain {
                Some(g) if g >= TARGET_SATURATION_GAIN => "met",
                Some(_) => "NOT met",
                None => "not measured (a sweep did not cross the bound)",
            }
        ));
    }
    out
}

fn shared_rows(pair: &(SharedCurve, SharedCurve), bound_ms: f64) -> (Vec<Vec<String>>, String) {
    let (mig, nomig) = pair;
    let users = mig.setup.ratio.len();
    let mut header = vec!["unit/s".to_string()];
    for u in 0..users {
        let name = (b'A' + u as u8) as char;
        header.push(format!("{name} NOMIG ms"));
        header.push(format!("{name} MIG ms"));
        header.push(format!("{name} gain %"));
    }
    header.extend([
        "avg NOMIG ms".into(),
        "avg MIG ms".into(),
        "avg gain %".into(),
        "delivered NOMIG/MIG".into(),
        "balance NOMIG/MIG".into(),
    ]);
    let mut rows = vec![header];
    for (m, n) in mig.points.iter().zip(&nomig.points) {
        let mut row = vec![format!("{:.1}", m.unit)];
        for u in 0..users {
            let (mu, nu) = (&m.users[u], &n.users[u]);
            row.push(format!("{:.2}", nu.mean_ms));
            row.push(format!("{:.2}", mu.mean_ms));
            row.push(format!("{:.1}", pct(mu.mean_ms, nu.mean_ms)));
        }
        row.push(format!("{:.2}", n.mean_ms()));
        row.push(format!("{:.2}", m.mean_ms()));
        row.push(format!("{:.1}", pct(m.mean_ms(), n.mean_ms())));
        row.push(format!("{:.1}/{:.1}", n.delivered(), m.delivered()));
        row.push(format!("{:.3}/{:.3}", n.balance(), m.balance()));
        rows.push(row);
    }
    let curve = |c: &SharedCurve| -> Vec<(f64, f64)> {
        c.points
            .iter()
            .map(|p| (p.delivered(), p.mean_ms()))
            .collect()
    };
    let (sm, sn) = (
        saturation(&curve(mig), bound_ms),
        saturation(&curve(nomig), bound_ms),
    );
    let gain = match (sm, sn) {
        (Some(m), Some(n)) => Some((m - n) / n * 100.0),
        _ => None,
    };
    let mut notes = format!(
        "  saturation of the request-weighted average (mean crosses {bound_ms} ms): NOMIG {} /s, MIG {} /s, gain {} %\n",
        or_dash(sn, 1),
        or_dash(sm, 1),
        or_dash(gain, 1)
    );
    // Where each drive's requests came from, at the middle point both curves have.
    let both = mig.points.len().min(nomig.points.len());
    if both > 0 {
        let i = (both - 1) / 2;
        for (label, point) in [("NOMIG", &nomig.points[i]), ("MIG", &mig.points[i])] {
            notes.push_str(&format!(
                "  drive requests by user at unit {:.1}/s, {label}:",
                point.unit
            ));
            for (k, by_user) in point.disk_requests.iter().enumerate() {
                let total: u64 = by_user.iter().sum();
                let shares: Vec<String> = by_user
                    .iter()
                    .enumerate()
                    .map(|(u, r)| {
                        format!(
                            "{}:{:.0}%",
                            (b'A' + u as u8) as char,
                            *r as f64 * 100.0 / total.max(1) as f64
                        )
                    })
                    .collect();
                notes.push_str(&format!(
                    " disk {} {total} ({})",
                    (b'A' + k as u8) as char,
                    shares.join(" ")
                ));
                notes.push(';');
            }
            notes.push('\n');
        }
        for (u, p) in mig.points[i].users.iter().enumerate() {
            notes.push_str(&format!(
                "  user {} MIG at unit {:.1}/s: migrations to own disk {}, to others {}\n",
                (b'A' + u as u8) as char,
                mig.points[i].unit,
                p.counters.moved_to.first().copied().unwrap_or(0),
                p.counters.moved_to.iter().skip(1).sum::<u64>()
            ));
        }
    }
    (rows, notes)
}

/// The convergence run in buckets of `bucket_s`.
fn converge_rows(point: &Point, bucket_s: f64) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "until s".into(),
        "mig→local".into(),
        "mig→remote".into(),
        "migrations/s".into(),
        "r local ms".into(),
        "r remote ms".into(),
        "δ ms".into(),
    ]];
    let mut bucket_end = bucket_s;
    let (mut to_local, mut to_remote) = (0, 0);
    let mut last = None;
    let flush =
        |rows: &mut Vec<Vec<String>>, end: f64, l: u64, r: u64, last: Option<&super::Interval>| {
            let Some(i) = last else { return };
            rows.push(vec![
                format!("{end:.0}"),
                l.to_string(),
                r.to_string(),
                format!("{:.3}", (l + r) as f64 / bucket_s),
                or_dash(i.response_ms.first().copied(), 1),
                i.response_ms
                    .iter()
                    .skip(1)
                    .map(|r| format!("{r:.1}"))
                    .collect::<Vec<_>>()
                    .join("/"),
                format!("{:.1}", i.delta_ms),
            ]);
        };
    for interval in &point.timeline {
        while interval.at_s > bucket_end + 1e-9 {
            flush(&mut rows, bucket_end, to_local, to_remote, last);
            (to_local, to_remote) = (0, 0);
            bucket_end += bucket_s;
        }
        to_local += interval.to_local;
        to_remote += interval.to_remote;
        last = Some(interval);
    }
    flush(&mut rows, bucket_end, to_local, to_remote, last);
    rows
}

/// Every table.
pub fn format_report(report: &MigrationReport) -> String {
    let c = &report.config;
    let bound = c.bound_ms;
    let mut out = String::new();
    out.push_str(&format!(
        "User-centric migration on the migrate layer: {} disks of {} (partitions of {} MiB; \
         child 0 local, the others behind the Table 1 link), synthetic SFS-like mix over a \
         {} MiB data set (zipf {}), {}; warm-up {} s, measured {} s per point; \
         {} tokens/s; δ {}; candidate probability {}{}; seed {}\n\
         base response time = mean at the lowest load; saturation = delivered ops/s where the \
         mean crosses {bound} ms (interpolated)\n\n",
        c.disks,
        c.model,
        c.partition_bytes / MIB,
        c.data_bytes / MIB,
        c.theta,
        c.processes.map_or("open loop".to_string(), |n| format!(
            "open loop with at most {n} operations outstanding"
        )),
        c.warmup_s,
        c.measure_s,
        c.tokens,
        c.delta.as_deref().unwrap_or("adaptive"),
        c.candidate_probability
            .map_or("(the layer's default)".to_string(), |p| p.to_string()),
        c.layer_options
            .iter()
            .map(|o| format!("; {o}"))
            .collect::<String>(),
        c.seed,
    ));
    if !report.striping.is_empty() {
        out.push_str("Fig. 4: striping, STR-MIG vs STR-NOMIG\n");
        out.push_str(&table(&summary_rows(&report.striping, bound, true)));
        out.push_str(&targets(report));
        let curves: Vec<&Curve> = report.striping.iter().flat_map(|(m, n)| [n, m]).collect();
        out.push('\n');
        out.push_str(&table(&curve_rows(&curves)));
        out.push('\n');
    }
    if !report.sequential.is_empty() {
        out.push_str(
            "Fig. 5: sequential, SEQ-MIG vs SEQ-NOMIG (paper at 9 ms: no difference up to \
             load 400, migration from load 500, up to 45.3 % better at high load, saturation \
             +18.2 %; fewer migrations at 17 ms; none at 25 ms)\n",
        );
        out.push_str(&table(&summary_rows(&report.sequential, bound, false)));
        for (mig, _) in &report.sequential {
            let first = mig
                .points
                .iter()
                .find(|p| p.counters.migrations > 0)
                .map(|p| p.setup.load);
            out.push_str(&format!(
                "  {} ms: {} migrations in the sweep ({} to the local disk); first at offered \
                 load {}\n",
                mig.rtt_ms,
                mig.migrations(),
                mig.points
                    .iter()
                    .map(|p| p.counters.moved_to.first().copied().unwrap_or(0))
                    .sum::<u64>(),
                or_dash(first, 0)
            ));
        }
        let curves: Vec<&Curve> = report.sequential.iter().flat_map(|(m, n)| [n, m]).collect();
        out.push('\n');
        out.push_str(&table(&curve_rows(&curves)));
        out.push('\n');
    }
    if report.tokens.len() == 2 {
        let (one, four) = (&report.tokens[0], &report.tokens[1]);
        out.push_str(&format!(
            "Fig. 3: STR-MIG at {} ms, 1 vs 4 tokens/s (paper: 4 tokens base response time \
             13.6 % better than 1; 4 saturate earlier; 1 token migrates remote→local only, 4 \
             also local→remote at high load)\n",
            one.rtt_ms
        ));
        out.push_str(&format!(
            "  base: 1 token {:.2} ms, 4 tokens {:.2} ms: 4 better by {:.1} %; saturation 1 \
             token {} /s, 4 tokens {} /s\n",
            one.base_ms(),
            four.base_ms(),
            pct(four.base_ms(), one.base_ms()),
            or_dash(one.saturation(bound), 1),
            or_dash(four.saturation(bound), 1)
        ));
        out.push_str(&table(&curve_rows(&[one, four])));
        out.push('\n');
    }
    if !report.locality.is_empty() {
        out.push_str(
            "Fig. 6: locality-only migration (every access off the local disk moves there) vs \
             user-centric (paper: locality degrades as load rises, user-centric saturates \
             later; no figures)\n",
        );
        let mut rows = vec![vec![
            "config".into(),
            "base ms".into(),
            "sat/s".into(),
            "max delivered/s".into(),
            "migrations".into(),
        ]];
        let mut curves: Vec<&Curve> = Vec::new();
        for loc in &report.locality {
            let mig = report
                .striping
                .iter()
                .chain(&report.sequential)
                .map(|(m, _)| m)
                .find(|m| m.allocation == loc.allocation && m.rtt_ms == loc.rtt_ms);
            for curve in mig.into_iter().chain([loc]) {
                rows.push(vec![
                    format!("{} {} ms", curve.name, curve.rtt_ms),
                    format!("{:.2}", curve.base_ms()),
                    or_dash(curve.saturation(bound), 1),
                    format!("{:.1}", curve.max_delivered()),
                    curve.migrations().to_string(),
                ]);
                curves.push(curve);
            }
        }
        out.push_str(&table(&rows));
        out.push('\n');
        out.push_str(&table(&curve_rows(&curves)));
        out.push('\n');
    }
    if let Some(shared) = &report.shared {
        out.push_str(&format_shared(shared, bound));
    }
    out.push_str(&format!(
        "failed operations in all runs: {}\n\n",
        report.failed()
    ));
    for point in &report.converge {
        out.push_str(&format!(
            "Convergence: STR-MIG at {} ms, {} ops/s for {} s: {} migrations ({} to local, {} \
             to remote); last migration at {} s\n",
            point.setup.rtt_ms,
            point.setup.load,
            c.converge_s,
            point.counters.migrations,
            point.counters.moved_to.first().copied().unwrap_or(0),
            point.counters.moved_to.iter().skip(1).sum::<u64>(),
            or_dash(point.last_migration_s, 0)
        ));
        out.push_str(&table(&converge_rows(point, c.converge_s / 12.0)));
        out.push('\n');
    }
    out
}

fn format_shared(shared: &SharedReport, bound: f64) -> String {
    let mut out = String::new();
    for pair in &shared.curves {
        let setup = &pair.0.setup;
        let paper = if setup.ratio.len() == 3 {
            "paper Fig. 7: server A 7.3–20.1 % better, average 6.6–20.4 %, saturation +5.4 %; \
             Fig. 8: load balance down by up to 12.8 %"
        } else {
            "paper Fig. 9: A starts migrating to disk B at load 500, A saturation +11.7 %, A \
             10.1 → 6.5 ms, B 2.2 → 3.6 ms (worse), global average better"
        };
        out.push_str(&format!(
            "Shared bricks, {} at {} ms ({paper})\n",
            setup.name, shared.rtt_ms
        ));
        let (rows, notes) = shared_rows(pair, bound);
        out.push_str(&table(&rows));
        out.push_str(&notes);
        out.push('\n');
    }
    out
}

/// Points past `PLOT_CUT ×` the bound are left out of the plots: one overloaded point (an
/// open-loop queue that grew for 600 s) would flatten every other point onto the x axis.
const PLOT_CUT: f64 = 2.0;

fn rt_series(curve: &Curve, bound_ms: f64) -> Series {
    Series {
        name: format!("{} {} ms", curve.name, curve.rtt_ms),
        points: curve
            .points
            .iter()
            .filter(|p| p.mean_ms <= PLOT_CUT * bound_ms)
            .map(|p| (p.delivered, p.mean_ms))
            .collect(),
    }
}

fn timeline_series(name: &str, point: &Point) -> Vec<Series> {
    vec![
        Series {
            name: format!("{name}: to local"),
            points: point
                .timeline
                .iter()
                .map(|i| (i.at_s, i.to_local as f64))
                .collect(),
        },
        Series {
            name: format!("{name}: to remote"),
            points: point
                .timeline
                .iter()
                .map(|i| (i.at_s, i.to_remote as f64))
                .collect(),
        },
    ]
}

/// The plots (response time against delivered throughput per figure, migration timelines)
/// and `report.json`, in `dir`.
pub fn write_plots(report: &MigrationReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut write = |name: &str, text: String| -> Result<(), String> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let rt = |title: &str, series: &[Series]| {
        results::lines_svg(
            title,
            "delivered throughput (ops/s)",
            "mean response time (ms)",
            series,
        )
        .map_err(|e| e.to_string())
    };
    let interval = report.config.sample_s;
    let bound = report.config.bound_ms;
    for (label, pairs) in [
        ("fig4-str", &report.striping),
        ("fig5-seq", &report.sequential),
    ] {
        for (mig, nomig) in pairs {
            let svg = rt(
                &format!("{} vs {} at {} ms RTT", mig.name, nomig.name, mig.rtt_ms),
                &[rt_series(nomig, bound), rt_series(mig, bound)],
            )?;
            write(&format!("{label}-{}ms.svg", mig.rtt_ms), svg)?;
        }
    }
    if report.tokens.len() == 2 {
        let svg = rt(
            "STR-MIG, 1 vs 4 tokens",
            &[
                Series {
                    name: "1 token/s".into(),
                    ..rt_series(&report.tokens[0], bound)
                },
                Series {
                    name: "4 tokens/s".into(),
                    ..rt_series(&report.tokens[1], bound)
                },
            ],
        )?;
        write("fig3-tokens-rt.svg", svg)?;
        // The migration rate over time at the middle load both sweeps have.
        let both = report.tokens[0]
            .points
            .len()
            .min(report.tokens[1].points.len());
        if both > 0 {
            let i = (both - 1) / 2;
            let mut series = timeline_series("1 token", &report.tokens[0].points[i]);
            series.extend(timeline_series("4 tokens", &report.tokens[1].points[i]));
            let svg = results::lines_svg(
                &format!(
                    "Migrations per {interval} s at {} ops/s",
                    report.tokens[0].points[i].setup.load
                ),
                "time (s)",
                "migrations per interval",
                &series,
            )
            .map_err(|e| e.to_string())?;
            write("fig3-tokens-rate.svg", svg)?;
        }
    }
    if !report.locality.is_empty() {
        let mut series = Vec::new();
        for loc in &report.locality {
            if let Some((mig, _)) = report
                .striping
                .iter()
                .chain(&report.sequential)
                .find(|(m, _)| m.allocation == loc.allocation && m.rtt_ms == loc.rtt_ms)
            {
                series.push(rt_series(mig, bound));
            }
            series.push(rt_series(loc, bound));
        }
        write(
            "fig6-locality.svg",
            rt("Locality-only vs user-centric migration", &series)?,
        )?;
    }
    if let Some(shared) = &report.shared {
        for (i, (mig, nomig)) in shared.curves.iter().enumerate() {
            let s = |c: &SharedCurve| Series {
                name: format!("{} (request-weighted average)", c.name),
                points: c
                    .points
                    .iter()
                    .filter(|p| p.mean_ms() <= PLOT_CUT * bound)
                    .map(|p| (p.delivered(), p.mean_ms()))
                    .collect(),
            };
            let name = if i == 0 {
                "fig7-shared-str.svg"
            } else {
                "fig9-shared-seq.svg"
            };
            write(name, rt(&mig.setup.name, &[s(nomig), s(mig)])?)?;
        }
    }
    if !report.converge.is_empty() {
        let series: Vec<Series> = report
            .converge
            .iter()
            .flat_map(|p| timeline_series(&format!("{} ops/s", p.setup.load), p))
            .collect();
        let svg = results::lines_svg(
            &format!("STR-MIG: migrations per {interval} s"),
            "time (s)",
            "migrations per interval",
            &series,
        )
        .map_err(|e| e.to_string())?;
        write("converge.svg", svg)?;
    }
    let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    write("report.json", json)?;
    Ok(written)
}
