//! Strata's core: the block-device trait every backend, layer and frontend speaks, its errors,
//! geometry and extents, the runtime services layers may use, and per-device statistics.

pub mod blank;
pub mod console;
mod device;
pub mod duration;
mod error;
mod extent;
mod fields;
pub mod filter;
mod geometry;
pub mod layer;
mod layer_config;
pub mod lifecycle;
pub mod lock;
pub mod metric_family;
pub mod pages;
pub mod planted;
pub mod poison;
mod runtime;
mod size;
pub mod split;
mod stats;
mod striped;

pub use device::{
    all_data, describe, refuse, write_all, write_each_durable, write_zeroes_by_writing, Activity,
    BlockDevice, Control, ControlReply, DeviceRef, DeviceShare, Health, Member, NodeStatus,
    SpaceReport, WriteFlags, ZeroFlags, ZERO_PIECE,
};
pub use error::{errno, BlockError, Result};
pub use extent::{push_extent, Extent, ExtentState};
pub use fields::Fields;
pub use filter::Filter;
pub use geometry::{Capabilities, Geometry};
pub use lifecycle::{Background, Worker};
pub use pages::PageStore;
pub use runtime::{os_random_u64, run_blocking, BoxFuture, Runtime, TokioRuntime};
pub use size::ByteSize;
pub use stats::{
    latency_histogram, DeviceStats, Metered, MetricsRegistry, Op, OpSnapshot, StatsSnapshot,
};
pub use striped::StripedLocks;

/// Re-exported so that implementors use the same version of the attribute macro.
pub use async_trait::async_trait;
pub use bytes;
