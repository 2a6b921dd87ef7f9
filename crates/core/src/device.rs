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

/// A device handed to a layer by name, for reconfiguration.
#[derive(Clone)]
pub struct Member {
    pub name: String,
    pub device: DeviceRef,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("name", &self.name).finish()
    }
}

/// A typed control call: Violin's ioctl. Layers add variants as they grow verbs
/// ("take a version", "add a disk"); a device that does not know a verb answers `Unsupported`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Control {
    /// Describe this node and its children: kind, size, state.
    Describe,
    /// Add a member (a mirror leg; a disk to grow onto).
    AddMember(Member),
    /// Put `member` in the place of child `index` (a failed disk's replacement) and rebuild
    /// onto it in the background.
    ReplaceMember { index: usize, member: Member },
    /// Stop using child `index`, as if it had failed (for maintenance and tests).
    FailMember { index: usize },
    /// Grow the device to `size` bytes (children must already have the room).
    Grow { size: u64 },
}

/// The answer to a [`Control`] call.
// Control calls are rare (status, reconfiguration), so the size of a reply does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ControlReply {
    Describe(NodeStatus),
    /// The change is made (and durable, for layers that record their shape).
    Done,
}

/// Long work a node is doing (rebuild, resync, reshape), for progress displays.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Activity {
    /// What is going on ("rebuilding d3").
    pub what: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
}

impl Activity {
    pub fn percent(&self) -> f64 {
        if self.total_bytes == 0 {
            100.0
        } else {
            self.done_bytes as f64 * 100.0 / self.total_bytes as f64
        }
    }
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
    /// Long work under way, if any.
    pub activity: Option<Activity>,
    /// The layer's configuration as it runs: its kind's config struct with every default
    /// made explicit, as the options of a `[[layer]]` table (without `name`, `kind` and
    /// `children`). Feeding it back as a configuration builds the same layer, so labels and
    /// `strata status --json` are written from it. Paths are kept as the configuration gave
    /// them (relative to the configuration's folder). None for disks and for layers built
    /// outside a configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<toml::Table>,
}

impl NodeStatus {
    /// A healthy node with nothing more to say; callers fill in the rest.
    pub fn new(name: impl Into<String>, kind: impl Into<String>, size: u64) -> Self {
        NodeStatus {
            name: name.into(),
            kind: kind.into(),
            size,
            health: Health::Ok,
            detail: Vec::new(),
            stats: None,
            children: Vec::new(),
            activity: None,
            config: None,
        }
    }
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

/// A shared device is a device: wrappers such as `Metered` can take an `Arc<dyn BlockDevice>`.
#[async_trait]
impl<T: BlockDevice + ?Sized> BlockDevice for Arc<T> {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }

    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        (**self).read(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        (**self).write(offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        (**self).flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        (**self).discard(offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        (**self).write_zeroes(offset, len, flags).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        (**self).block_status(offset, len).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        (**self).control(request).await
    }
}
