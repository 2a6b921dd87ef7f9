//! Latency statistics, throughput and CDFs from the driver's records. Failed I/Os are counted
//! apart and left out of latency and throughput.
//!
//! Percentiles are nearest-rank (the value at rank `ceil(p/100 · n)` of the sorted sample), so
//! every reported percentile is a latency that some request actually saw. The standard
//! deviation is the population one (divide by n): the records are the whole run, not a sample.

use std::collections::BTreeMap;

use crate::model::{DeviceSample, IoRecord, Nanos, Op, SECONDS};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ns: f64,
    pub stddev_ns: f64,
    pub min_ns: Nanos,
    pub p50_ns: Nanos,
    pub p90_ns: Nanos,
    pub p95_ns: Nanos,
    pub p99_ns: Nanos,
    pub p999_ns: Nanos,
    pub max_ns: Nanos,
}

/// Which I/Os a latency summary covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    All,
    Read,
    Write,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScopedLatency {
    pub scope: Scope,
    pub summary: LatencySummary,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Throughput {
    pub ios: u64,
    pub bytes: u64,
    /// From the first issue to the last completion.
    pub span_ns: Nanos,
    pub iops: f64,
    pub mib_per_s: f64,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunSummary {
    /// `all` first, then `read` and `write` when the run had any.
    pub latency: Vec<ScopedLatency>,
    pub throughput: Throughput,
    pub failed: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CdfPoint {
    pub latency_ns: Nanos,
    /// Share of requests with latency at or below `latency_ns`.
    pub fraction: f64,
}

/// Mean latency of the requests completing in one time bucket.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TimePoint {
    /// Bucket end.
    pub at_ns: Nanos,
    pub count: u64,
    pub mean_latency_ns: f64,
    pub max_latency_ns: Nanos,
}

pub fn latency_ns(record: &IoRecord) -> Nanos {
    record.completed.saturating_sub(record.issued)
}

/// The value at nearest rank `ceil(percent/100 · n)` of an ascending, non-empty slice.
pub fn percentile(sorted: &[Nanos], percent: f64) -> Nanos {
    assert!(!sorted.is_empty(), "a percentile of nothing");
    assert!(
        (0.0..=100.0).contains(&percent),
        "percentile {percent} out of range"
    );
    // 99.9 has no exact binary form: 99.9 % of 1000 computes as 999.0000000000001, whose
    // ceiling would skip a rank. A relative nudge far below one rank removes that error.
    let exact = percent / 100.0 * sorted.len() as f64;
    let rank = (exact * (1.0 - 1e-12)).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summary of latencies in any order; `None` when there are none.
pub fn summarize_latencies(latencies: &[Nanos]) -> Option<LatencySummary> {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    summarize_sorted(&sorted)
}

/// [`summarize_latencies`] of an ascending slice. The sums run in ascending order, so the
/// figures are the same to the last bit however the slice was sorted.
fn summarize_sorted(sorted: &[Nanos]) -> Option<LatencySummary> {
    if sorted.is_empty() {
        return None;
    }
    debug_assert!(sorted.is_sorted());
    let count = sorted.len() as f64;
    let mean = sorted.iter().map(|&l| l as f64).sum::<f64>() / count;
    let variance = sorted
        .iter()
        .map(|&l| (l as f64 - mean).powi(2))
        .sum::<f64>()
        / count;
    Some(LatencySummary {
        count: sorted.len() as u64,
        mean_ns: mean,
        stddev_ns: variance.sqrt(),
        min_ns: sorted[0],
        p50_ns: percentile(sorted, 50.0),
        p90_ns: percentile(sorted, 90.0),
        p95_ns: percentile(sorted, 95.0),
        p99_ns: percentile(sorted, 99.0),
        p999_ns: percentile(sorted, 99.9),
        max_ns: sorted[sorted.len() - 1],
    })
}

fn succeeded(records: &[IoRecord], op: Option<Op>) -> impl Iterator<Item = &IoRecord> {
    records
        .iter()
        .filter(move |r| !r.failed && op.is_none_or(|op| r.op == op))
}

pub fn throughput(records: &[IoRecord]) -> Throughput {
    let (mut ios, mut bytes, mut first, mut last) = (0u64, 0u64, Nanos::MAX, 0);
    for r in succeeded(records, None) {
        ios += 1;
        bytes += r.len;
        first = first.min(r.issued);
        last = last.max(r.completed);
    }
    let first = if ios == 0 { 0 } else { first };
    let span_ns = last.saturating_sub(first);
    let seconds = span_ns as f64 / SECONDS as f64;
    let per_second = |amount: f64| if span_ns == 0 { 0.0 } else { amount / seconds };
    Throughput {
        ios,
        bytes,
        span_ns,
        iops: per_second(ios as f64),
        mib_per_s: per_second(bytes as f64 / (1024.0 * 1024.0)),
    }
}

pub fn summarize(records: &[IoRecord]) -> RunSummary {
    let scopes = [
        (Scope::All, None),
        (Scope::Read, Some(Op::Read)),
        (Scope::Write, Some(Op::Write)),
    ];
    // One sort serves all three scopes: each latency carries its op in the lowest bit, and
    // the reads' and writes' latencies come out of the sorted whole already in order.
    let mut keyed: Vec<Nanos> = succeeded(records, None)
        .map(|r| latency_ns(r) << 1 | u64::from(r.op == Op::Write))
        .collect();
    keyed.sort_unstable();
    let mut latencies = Vec::with_capacity(keyed.len());
    let latency = scopes
        .into_iter()
        .filter_map(|(scope, op)| {
            latencies.clear();
            latencies.extend(
                keyed
                    .iter()
                    .filter(|&&k| op.is_none_or(|op| (k & 1 == 1) == (op == Op::Write)))
                    .map(|&k| k >> 1),
            );
            summarize_sorted(&latencies).map(|summary| ScopedLatency { scope, summary })
        })
        .collect();
    RunSummary {
        latency,
        throughput: throughput(records),
        failed: records.iter().filter(|r| r.failed).count() as u64,
    }
}

/// At most `max_points` points of the latency CDF (of one op, or all), evenly spaced in rank;
/// the last point is always the maximum at fraction 1.
pub fn latency_cdf(records: &[IoRecord], op: Option<Op>, max_points: usize) -> Vec<CdfPoint> {
    assert!(max_points > 0, "a CDF needs at least one point");
    let mut sorted: Vec<Nanos> = succeeded(records, op).map(latency_ns).collect();
    sorted.sort_unstable();
    let n = sorted.len();
    let points = max_points.min(n);
    (1..=points)
        .map(|k| {
            let rank = (k * n).div_ceil(points);
            CdfPoint {
                latency_ns: sorted[rank - 1],
                fraction: rank as f64 / n as f64,
            }
        })
        .collect()
}

/// Requests bucketed by completion time (`bucket_ns` wide, from time 0); empty buckets are
/// left out.
pub fn latency_over_time(records: &[IoRecord], bucket_ns: Nanos) -> Vec<TimePoint> {
    assert!(bucket_ns > 0, "buckets need a width");
    let mut buckets: BTreeMap<u64, (u64, f64, Nanos)> = BTreeMap::new();
    for record in succeeded(records, None) {
        let entry = buckets
            .entry(record.completed / bucket_ns)
            .or_insert((0, 0.0, 0));
        let latency = latency_ns(record);
        entry.0 += 1;
        entry.1 += latency as f64;
        entry.2 = entry.2.max(latency);
    }
    buckets
        .into_iter()
        .map(|(bucket, (count, sum, max))| TimePoint {
            at_ns: (bucket + 1) * bucket_ns,
            count,
            mean_latency_ns: sum / count as f64,
            max_latency_ns: max,
        })
        .collect()
}

/// One device over a run, from its periodic samples.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceSummary {
    pub device: String,
    pub samples: u64,
    pub mean_utilization: f64,
    pub mean_queue_depth: f64,
    pub max_queue_depth: usize,
}

/// Per-device averages of the samples, in device-name order. Samples are taken at a fixed
/// interval, so plain means are time averages.
pub fn summarize_devices(samples: &[DeviceSample]) -> Vec<DeviceSummary> {
    let mut devices: BTreeMap<&str, Vec<&DeviceSample>> = BTreeMap::new();
    for sample in samples {
        devices
            .entry(sample.device.as_str())
            .or_default()
            .push(sample);
    }
    devices
        .into_iter()
        .map(|(device, samples)| {
            let count = samples.len() as f64;
            DeviceSummary {
                device: device.to_owned(),
                samples: samples.len() as u64,
                mean_utilization: samples.iter().map(|s| s.utilization).sum::<f64>() / count,
                mean_queue_depth: samples.iter().map(|s| s.queue_depth as f64).sum::<f64>() / count,
                max_queue_depth: samples.iter().map(|s| s.queue_depth).max().unwrap_or(0),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let data: Vec<Nanos> = (1..=1000).collect();
        let summary = summarize_latencies(&data).unwrap();
        assert_eq!(
            (summary.min_ns, summary.p50_ns, summary.p90_ns),
            (1, 500, 900)
        );
        assert_eq!(
            (
                summary.p95_ns,
                summary.p99_ns,
                summary.p999_ns,
                summary.max_ns
            ),
            (950, 990, 999, 1000)
        );
        assert_eq!(summary.mean_ns, 500.5);
        assert!(summarize_latencies(&[]).is_none());
    }

    #[test]
    fn cdf_ends_at_the_maximum() {
        let records: Vec<IoRecord> = (1..=10)
            .map(|l| IoRecord {
                op: Op::Read,
                offset: 0,
                len: 512,
                issued: 0,
                completed: l,
                failed: false,
            })
            .collect();
        let cdf = latency_cdf(&records, None, 4);
        let ranks: Vec<(Nanos, f64)> = cdf.iter().map(|p| (p.latency_ns, p.fraction)).collect();
        assert_eq!(ranks, vec![(3, 0.3), (5, 0.5), (8, 0.8), (10, 1.0)]);
        assert!(latency_cdf(&records, Some(Op::Write), 4).is_empty());
    }
}
