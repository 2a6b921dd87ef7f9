//! Workloads: trace replay (open loop, by timestamp) and seeded generators (closed loop, or
//! open-loop Poisson), plus `WorkloadSpec`, their description in an experiment file.

pub mod generate;
pub mod replay;
pub mod spec;
pub mod trace;

pub use generate::{AddressDist, ClosedLoop, Limited, Pattern, Poisson, WeightedSize};
pub use replay::{fold_into_volume, ReplayOptions, TraceWorkload};
pub use spec::WorkloadSpec;
pub use trace::{parse_trace, read_trace, TraceError, TraceFormat, TraceRecord};
