//! An experiment, end to end: a stack (see [`crate::stack`]), a workload (see
//! [`crate::workload::WorkloadSpec`]), how to drive it, and what to write out.
//!
//! ```toml
//! name = "WebSearch on a RAID-0 of three Cheetahs"
//! seed = 1
//! queue-depth = 8            # closed-loop workloads; open-loop ones arrive by timestamp
//! sample-interval = "100ms"  # per-disk utilization and queue depth
//! time-limit = "2h"          # virtual time from the workload's start; past it the run stops with an error
//! data = "timing"            # or "stored": keep and verify the bytes (small volumes)
//!
//! [[disk]]
//! name = "d0"
//! model = "cheetah-15k5-300g"
//! # … d1, d2
//!
//! [[layer]]                  # the serve config's syntax
//! name = "r0"
//! kind = "stripe"
//! children = ["d0", "d1", "d2"]
//! chunk = "64KiB"
//!
//! [workload]
//! kind = "trace"
//! path = "../shared/traces/websearch-spc.trace"   # relative to this file
//! format = "mqsim"
//! ```

use std::path::{Path, PathBuf};

use crate::disk::DataMode;
use crate::driver::{self, DriverConfig, RunOutput};
use crate::executor::{SimConfig, Simulation};
use crate::model::{Nanos, MICROS, MILLIS, SECONDS};
use crate::results::{self, DeviceSummary, RunSummary};
use crate::stack::StackSpec;
use crate::workload::WorkloadSpec;

#[derive(Clone, Debug)]
pub struct Experiment {
    pub name: String,
    pub seed: u64,
    pub queue_depth: usize,
    pub sample_interval: Option<Nanos>,
    pub time_limit: Option<Nanos>,
    pub data: DataMode,
    pub stack: StackSpec,
    pub workload: WorkloadSpec,
    /// Folder relative paths (traces, layer key files) resolve against.
    pub base: PathBuf,
}

/// What a run produced, summarized.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub experiment: String,
    pub seed: u64,
    pub top: String,
    pub volume_bytes: u64,
    /// Virtual time the run took.
    pub simulated_ns: Nanos,
    pub summary: RunSummary,
    pub devices: Vec<DeviceSummary>,
    pub disks: Vec<driver::DiskReport>,
    pub read_mismatches: u64,
}

const TOP_KEYS: &[&str] = &[
    "name",
    "seed",
    "queue-depth",
    "sample-interval",
    "time-limit",
    "data",
    "disk",
    "layer",
    "top",
    "workload",
];

impl Experiment {
    /// Parses an experiment file's text; `base` is the folder it came from.
    pub fn parse(text: &str, base: &Path) -> Result<Experiment, String> {
        let table: toml::Table = text.parse().map_err(|e| format!("{e}"))?;
        if let Some(key) = table.keys().find(|k| !TOP_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "unknown field `{key}` (known: {})",
                TOP_KEYS.join(", ")
            ));
        }
        let mut workload: WorkloadSpec = table
            .get("workload")
            .ok_or("missing [workload]")?
            .clone()
            .try_into()
            .map_err(|e| format!("[workload]: {e}"))?;
        workload.resolve_paths(base);
        let stack = StackSpec::from_toml(&table)?;
        // Models are cheap to make: check names and options now, not when the run starts.
        for disk in &stack.disks {
            crate::models::build(&disk.model, &disk.options, 0)
                .map_err(|e| format!("disk {}: {e}", disk.name))?;
        }
        Ok(Experiment {
            name: match table.get("name") {
                Some(toml::Value::String(s)) => s.clone(),
                None => "experiment".into(),
                Some(_) => return Err("`name` must be a string".into()),
            },
            seed: match table.get("seed") {
                Some(toml::Value::Integer(n)) if *n >= 0 => *n as u64,
                None => 0,
                Some(_) => return Err("`seed` must be a non-negative integer".into()),
            },
            queue_depth: match table.get("queue-depth") {
                Some(toml::Value::Integer(n)) if *n >= 1 => *n as usize,
                None => 1,
                Some(_) => return Err("`queue-depth` must be a positive integer".into()),
            },
            sample_interval: duration_field(&table, "sample-interval")?,
            time_limit: duration_field(&table, "time-limit")?,
            data: match table.get("data").map(|v| v.as_str()) {
                None | Some(Some("timing")) => DataMode::TimingOnly,
                Some(Some("stored")) => DataMode::Stored,
                _ => return Err("`data` must be \"timing\" or \"stored\"".into()),
            },
            stack,
            workload,
            base: base.to_path_buf(),
        })
    }

    pub fn load(path: &Path) -> Result<Experiment, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Experiment::parse(&text, base).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Builds the stack and runs the workload on it, in a new simulation.
    pub fn run(&self) -> Result<(Report, RunOutput), String> {
        let sim = Simulation::with_config(SimConfig::new(self.seed));
        let stack = self
            .stack
            .build(&sim, &crate::models::build, self.data, &self.base)?;
        // Counted from here: assembly (a raid5 zeroing its members, say) may take hours of
        // virtual time that are not the experiment's.
        sim.set_time_limit(self.time_limit.map(|limit| sim.now().saturating_add(limit)));
        let volume_bytes = stack.top.geometry().size;
        let mut workload = self.workload.build(volume_bytes, self.seed)?;
        let config = DriverConfig {
            queue_depth: self.queue_depth,
            sample_interval: self.sample_interval,
            verify_data: self.data == DataMode::Stored,
            outstanding_limit: None,
        };
        let output = sim
            .try_block_on(driver::drive(
                sim.handle(),
                stack.top.clone(),
                workload.as_mut(),
                &stack.disks,
                &config,
            ))
            .map_err(|stop| stop.to_string())?;
        let report = Report {
            experiment: self.name.clone(),
            seed: self.seed,
            top: stack.top_name,
            volume_bytes,
            simulated_ns: output.end,
            summary: results::summarize(&output.records),
            devices: results::summarize_devices(&output.samples),
            disks: output.disks.clone(),
            read_mismatches: output.read_mismatches,
        };
        Ok((report, output))
    }
}

/// Writes a run's files into `dir`: `report.json`, `summary.csv`, `records.csv`,
/// `samples.csv`, `latency-cdf.csv`, and the plots `latency-cdf.svg`, `latency-time.svg`,
/// `utilization.svg`, `queue-depth.svg`. Returns the paths written.
pub fn write_outputs(
    dir: &Path,
    report: &Report,
    output: &RunOutput,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut put = |name: &str, text: String| -> Result<(), String> {
        let path = dir.join(name);
        results::write_text(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let err = |e: &dyn std::fmt::Display| e.to_string();
    put(
        "report.json",
        results::to_json(report).map_err(|e| err(&e))?,
    )?;
    put(
        "summary.csv",
        results::summary_to_csv(&report.summary).map_err(|e| err(&e))?,
    )?;
    put(
        "records.csv",
        results::records_to_csv(&output.records).map_err(|e| err(&e))?,
    )?;
    put(
        "samples.csv",
        results::samples_to_csv(&output.samples).map_err(|e| err(&e))?,
    )?;
    let cdf = results::latency_cdf(&output.records, None, 500);
    put(
        "latency-cdf.csv",
        results::cdf_to_csv(&cdf).map_err(|e| err(&e))?,
    )?;
    let title = &report.experiment;
    put(
        "latency-cdf.svg",
        results::latency_cdf_svg(title, &[("all", cdf.as_slice())]).map_err(|e| err(&e))?,
    )?;
    let bucket = (output.end / 200).max(MILLIS);
    let over_time = results::latency_over_time(&output.records, bucket);
    put(
        "latency-time.svg",
        results::latency_over_time_svg(title, &over_time).map_err(|e| err(&e))?,
    )?;
    if !output.samples.is_empty() {
        put(
            "utilization.svg",
            results::utilization_svg(title, &output.samples).map_err(|e| err(&e))?,
        )?;
        put(
            "queue-depth.svg",
            results::queue_depth_svg(title, &output.samples).map_err(|e| err(&e))?,
        )?;
    }
    Ok(written)
}

/// A report as the terminal shows it.
pub fn format_report(report: &Report) -> String {
    let mut text = format!(
        "{} (seed {}): {:.1} GiB device {}, {:.3} s of virtual time\n\n",
        report.experiment,
        report.seed,
        report.volume_bytes as f64 / (1u64 << 30) as f64,
        report.top,
        report.simulated_ns as f64 / SECONDS as f64
    );
    text.push_str(&results::format_summary_table(&report.summary));
    if !report.devices.is_empty() {
        text.push('\n');
        text.push_str(&results::format_device_table(&report.devices));
    }
    text
}

fn duration_field(table: &toml::Table, key: &str) -> Result<Option<Nanos>, String> {
    match table.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => parse_duration(s)
            .map(Some)
            .map_err(|e| format!("`{key}`: {e}")),
        Some(_) => Err(format!("`{key}` must be a duration such as \"100ms\"")),
    }
}

/// "250us", "100ms", "2s", "5m", "2h" (a decimal number and a unit).
pub fn parse_duration(text: &str) -> Result<Nanos, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit (ns, us, ms, s, m, h)"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a number and a unit"))?;
    let unit_ns = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => MICROS,
        "ms" => MILLIS,
        "s" => SECONDS,
        "m" | "min" => 60 * SECONDS,
        "h" => 3600 * SECONDS,
        other => return Err(format!("unknown unit {other:?} (ns, us, ms, s, m, h)")),
    };
    Ok((number * unit_ns as f64).round() as Nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250us").unwrap(), 250 * MICROS);
        assert_eq!(parse_duration("1.5s").unwrap(), 1_500 * MILLIS);
        assert_eq!(parse_duration("2h").unwrap(), 7_200 * SECONDS);
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }
}
