//! The one block interface every backend, layer and frontend speaks.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use serde::Serialize;

use crate::{Capabilities, Extent, Geometry, Result};

/// Flags on a write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Force unit access: the write is durable when it completes.
    pub fua: bool,
}

/// Flags on write_zeroes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// The device may deallocate the range instead of writing zeros (NBD: no NO_HOLE flag).
    pub may_trim: bool,
    /// Fail with `Unsupported` unless zeroing is cheaper than writing zeros (NBD: FAST_ZERO).
    pub fast: bool,
    pub fua: bool,
}

/// A typed control call: Violin's ioctl. Layers add variants as they grow verbs
/// ("take a version", "add a disk"); a device that does not know a verb answers `Unsupported`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Control {
    /// Describe this node and its children: kind, size, state.
    Describe,
}

/// The answer to a [`Control`] call.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ControlReply {
    Describe(NodeStatus),
}

/// Health of a node, ordered from best to worst so that a parent's state is the max of what
/// it cannot hide from its children.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    Ok,
    Degraded,
    ReadOnly,
    Failed,
}

/// One node of the device tree as `strata status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub name: String,
    pub kind: String,
    pub size: u64,
    pub health: Health,
    /// Free-form facts a layer wants an operator to see ("path = disks/d0.img").
    pub detail: Vec<(String, String)>,
    pub stats: Option<crate::StatsSnapshot>,
    pub children: Vec<NodeStatus>,
}

/// An asynchronous block device.
///
/// Contract, for every implementation:
/// - Requests may complete in any order. Between two flushes there is no ordering promise:
///   a crash may keep any subset of the writes acknowledged since the last completed flush,
///   and a write that was in flight may be torn at sector granularity.
/// - A write acknowledged before a completed `flush`, or with `fua`, survives any crash.
/// - Offsets and lengths must lie inside `geometry().size` and be multiples of
///   `geometry().min_io`; otherwise the call fails with `OutOfRange` or `InvalidArgument`
///   and touches nothing.
/// - A read of bytes never written returns zeros. A read never returns bytes that belong to
///   another device or volume.
/// - Errors are answers: a failed call reports why and leaves the device serving.
#[async_trait]
pub trait BlockDevice: Send + Sync {
    fn geometry(&self) -> Geometry;
    fn capabilities(&self) -> Capabilities;

    /// Reads `len` bytes from `offset` into a buffer the device allocates and hands over.
    /// The device owns the buffer while the request is in flight, as a completion-based
    /// engine (io_uring, a simulator) must; and it can fill fresh memory without zeroing it
    /// first (zeroing measured ~10% of a 1 MiB read's CPU).
    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut>;

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()>;

    /// Makes every write completed before this call durable.
    async fn flush(&self) -> Result<()>;

    /// Tells the device the range is no longer needed. Afterwards the range reads as zeros or
    /// as its old contents; callers that need zeros use `write_zeroes`.
    async fn discard(&self, offset: u64, len: u64) -> Result<()>;

    /// Makes the range read as zeros.
    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()>;

    /// Describes allocation from `offset`, covering at least one byte and at most `len`.
    /// Extents are contiguous, start at `offset`, and never extend past `offset + len`.
    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>>;

    async fn control(&self, request: Control) -> Result<ControlReply>;
}

/// Devices are shared by the exports and connections that use them.
pub type DeviceRef = Arc<dyn BlockDevice>;
