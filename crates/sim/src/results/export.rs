//! Results as CSV (one header row, one row per record, sample or summary line) and JSON.
//! Every writer has a reader, so a run's output can be reloaded and re-plotted.

use std::path::Path;

use crate::model::{DeviceSample, IoRecord, Nanos};

use super::stats::{
    CdfPoint, DeviceSummary, LatencySummary, RunSummary, Scope, ScopedLatency, TimePoint,
};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("CSV")]
    Csv(#[from] csv::Error),
    #[error("JSON")]
    Json(#[from] serde_json::Error),
    #[error("writing {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn to_csv<T: serde::Serialize>(rows: impl IntoIterator<Item = T>) -> Result<String, ExportError> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    for row in rows {
        writer.serialize(row)?;
    }
    let bytes = writer.into_inner().map_err(|e| ExportError::Io {
        path: "<memory>".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(String::from_utf8(bytes).expect("CSV of numbers and names is UTF-8"))
}

fn from_csv<T: serde::de::DeserializeOwned>(text: &str) -> Result<Vec<T>, ExportError> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    Ok(reader.deserialize().collect::<Result<Vec<T>, _>>()?)
}

/// Columns: op,offset,len,issued,completed,failed.
pub fn records_to_csv(records: &[IoRecord]) -> Result<String, ExportError> {
    to_csv(records)
}

pub fn records_from_csv(text: &str) -> Result<Vec<IoRecord>, ExportError> {
    from_csv(text)
}

/// Columns: at,device,queue_depth,utilization.
pub fn samples_to_csv(samples: &[DeviceSample]) -> Result<String, ExportError> {
    to_csv(samples)
}

pub fn samples_from_csv(text: &str) -> Result<Vec<DeviceSample>, ExportError> {
    from_csv(text)
}

/// Columns: latency_ns,fraction.
pub fn cdf_to_csv(points: &[CdfPoint]) -> Result<String, ExportError> {
    to_csv(points)
}

/// Columns: at_ns,count,mean_latency_ns,max_latency_ns.
pub fn time_points_to_csv(points: &[TimePoint]) -> Result<String, ExportError> {
    to_csv(points)
}

/// Columns: device,samples,mean_utilization,mean_queue_depth,max_queue_depth.
pub fn device_summaries_to_csv(devices: &[DeviceSummary]) -> Result<String, ExportError> {
    to_csv(devices)
}

/// One flat CSV row per latency scope, with the run's throughput repeated on each row so the
/// file stands alone.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SummaryRow {
    pub scope: Scope,
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
    pub iops: f64,
    pub mib_per_s: f64,
    pub failed: u64,
}

pub fn summary_rows(summary: &RunSummary) -> Vec<SummaryRow> {
    summary
        .latency
        .iter()
        .map(|ScopedLatency { scope, summary: s }| SummaryRow {
            scope: *scope,
            count: s.count,
            mean_ns: s.mean_ns,
            stddev_ns: s.stddev_ns,
            min_ns: s.min_ns,
            p50_ns: s.p50_ns,
            p90_ns: s.p90_ns,
            p95_ns: s.p95_ns,
            p99_ns: s.p99_ns,
            p999_ns: s.p999_ns,
            max_ns: s.max_ns,
            iops: summary.throughput.iops,
            mib_per_s: summary.throughput.mib_per_s,
            failed: summary.failed,
        })
        .collect()
}

pub fn summary_to_csv(summary: &RunSummary) -> Result<String, ExportError> {
    to_csv(summary_rows(summary))
}

/// The latency part of a summary CSV, back as per-scope summaries.
pub fn summary_latencies_from_csv(text: &str) -> Result<Vec<ScopedLatency>, ExportError> {
    let rows: Vec<SummaryRow> = from_csv(text)?;
    Ok(rows
        .into_iter()
        .map(|r| ScopedLatency {
            scope: r.scope,
            summary: LatencySummary {
                count: r.count,
                mean_ns: r.mean_ns,
                stddev_ns: r.stddev_ns,
                min_ns: r.min_ns,
                p50_ns: r.p50_ns,
                p90_ns: r.p90_ns,
                p95_ns: r.p95_ns,
                p99_ns: r.p99_ns,
                p999_ns: r.p999_ns,
                max_ns: r.max_ns,
            },
        })
        .collect())
}

pub fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, ExportError> {
    Ok(serde_json::to_string_pretty(value)?)
}

pub fn summary_from_json(text: &str) -> Result<RunSummary, ExportError> {
    Ok(serde_json::from_str(text)?)
}

pub fn write_text(path: &Path, text: &str) -> Result<(), ExportError> {
    std::fs::write(path, text).map_err(|source| ExportError::Io {
        path: path.display().to_string(),
        source,
    })
}
