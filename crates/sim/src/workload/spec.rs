//! A workload as an experiment file describes it (TOML-friendly, tagged by `kind`), and the
//! one place that turns a description into a running workload.

use std::path::{Path, PathBuf};

use crate::model::{Nanos, Workload, SECONDS};

use super::generate::{AddressDist, ClosedLoop, Limited, Pattern, Poisson, WeightedSize};
use super::replay::{ReplayOptions, TraceWorkload};
use super::trace::{read_trace, TraceFormat};

/// ```toml
/// kind = "zipf"            # uniform | zipf | sequential | tpcc | poisson | trace
/// theta = 0.99
/// read_share = 0.7
/// sizes = [{ bytes = 4096, weight = 3 }, { bytes = 65536, weight = 1 }]
/// count = 100000
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkloadSpec {
    /// Closed loop, uniform over aligned blocks.
    Uniform {
        read_share: f64,
        #[serde(default = "default_sizes")]
        sizes: Vec<WeightedSize>,
        #[serde(default = "default_align")]
        align: u64,
        count: Option<u64>,
    },
    /// Closed loop, zipf over aligned blocks.
    Zipf {
        theta: f64,
        #[serde(default = "default_true")]
        scatter: bool,
        read_share: f64,
        #[serde(default = "default_sizes")]
        sizes: Vec<WeightedSize>,
        #[serde(default = "default_align")]
        align: u64,
        count: Option<u64>,
    },
    /// Closed loop, one sequential stream.
    Sequential {
        #[serde(default)]
        start: u64,
        read_share: f64,
        #[serde(default = "default_sizes")]
        sizes: Vec<WeightedSize>,
        count: Option<u64>,
    },
    /// Closed loop, synthetic TPC-C-like mix (`Pattern::tpcc_like`).
    Tpcc { count: Option<u64> },
    /// Open loop, Poisson arrivals at `rate_iops`.
    Poisson {
        rate_iops: f64,
        #[serde(default = "default_address")]
        address: AddressDist,
        read_share: f64,
        #[serde(default = "default_sizes")]
        sizes: Vec<WeightedSize>,
        #[serde(default = "default_align")]
        align: u64,
        count: Option<u64>,
        duration_s: Option<f64>,
    },
    /// Open loop, a trace replayed by timestamp. A relative `path` is relative to the working
    /// directory unless `resolve_paths` was called.
    Trace {
        path: PathBuf,
        format: TraceFormat,
        #[serde(default = "default_speedup")]
        speedup: f64,
        device: Option<u32>,
        count: Option<u64>,
        duration_s: Option<f64>,
    },
}

fn default_sizes() -> Vec<WeightedSize> {
    vec![WeightedSize {
        bytes: 4096,
        weight: 1,
    }]
}

fn default_align() -> u64 {
    4096
}

fn default_true() -> bool {
    true
}

fn default_address() -> AddressDist {
    AddressDist::Uniform
}

fn default_speedup() -> f64 {
    1.0
}

impl WorkloadSpec {
    /// Makes a relative trace path relative to `base` (the experiment file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        if let WorkloadSpec::Trace { path, .. } = self {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
    }

    /// The workload over a volume of `volume_size` bytes; generators draw from `seed`.
    pub fn build(&self, volume_size: u64, seed: u64) -> Result<Box<dyn Workload>, String> {
        let closed = |address, read_share, sizes: &Vec<WeightedSize>, align, count| {
            let pattern = Pattern {
                address,
                sizes: sizes.clone(),
                read_share,
                align,
            };
            let generator = ClosedLoop::new(pattern, volume_size, seed)?;
            Ok(Box::new(Limited::new(generator, count, None)) as Box<dyn Workload>)
        };
        match self {
            WorkloadSpec::Uniform {
                read_share,
                sizes,
                align,
                count,
            } => closed(AddressDist::Uniform, *read_share, sizes, *align, *count),
            WorkloadSpec::Zipf {
                theta,
                scatter,
                read_share,
                sizes,
                align,
                count,
            } => {
                let address = AddressDist::Zipf {
                    theta: *theta,
                    scatter: *scatter,
                };
                closed(address, *read_share, sizes, *align, *count)
            }
            WorkloadSpec::Sequential {
                start,
                read_share,
                sizes,
                count,
            } => closed(
                AddressDist::Sequential { start: *start },
                *read_share,
                sizes,
                512,
                *count,
            ),
            WorkloadSpec::Tpcc { count } => {
                let generator = ClosedLoop::new(Pattern::tpcc_like(), volume_size, seed)?;
                Ok(Box::new(Limited::new(generator, *count, None)))
            }
            WorkloadSpec::Poisson {
                rate_iops,
                address,
                read_share,
                sizes,
                align,
                count,
                duration_s,
            } => {
                let pattern = Pattern {
                    address: *address,
                    sizes: sizes.clone(),
                    read_share: *read_share,
                    align: *align,
                };
                let generator = Poisson::new(pattern, *rate_iops, volume_size, seed)?;
                Ok(Box::new(Limited::new(
                    generator,
                    *count,
                    duration_ns(*duration_s)?,
                )))
            }
            WorkloadSpec::Trace {
                path,
                format,
                speedup,
                device,
                count,
                duration_s,
            } => {
                let records = read_trace(path, *format).map_err(|e| error_chain(&e))?;
                let options = ReplayOptions {
                    volume_size,
                    speedup: *speedup,
                    device: *device,
                };
                let replay = TraceWorkload::new(records, options)?;
                Ok(Box::new(Limited::new(
                    replay,
                    *count,
                    duration_ns(*duration_s)?,
                )))
            }
        }
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    match error.source() {
        Some(source) => format!("{error}: {source}"),
        None => error.to_string(),
    }
}

fn duration_ns(seconds: Option<f64>) -> Result<Option<Nanos>, String> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some((s * SECONDS as f64).round() as Nanos)),
        Some(s) => Err(format!("duration {s} s must be a number >= 0")),
    }
}
