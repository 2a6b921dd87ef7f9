//! The one block interface every backend, layer and frontend speaks.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use serde::Serialize;

use crate::{BoxFuture, Capabilities, Extent, ExtentState, Geometry, Result};

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
    /// Add several members at once and spread the data over them all (a raid5 grow), online;
    /// `options` are the kind's (raid5: `policy`, `on-failure`).
    GrowMembers {
        members: Vec<Member>,
        options: toml::Table,
    },
    /// Put `member` in the place of child `index` (a failed disk's replacement) and rebuild
    /// onto it in the background.
    ReplaceMember { index: usize, member: Member },
    /// Stop using child `index`, as if it had failed (for maintenance and tests).
    FailMember { index: usize },
    /// Grow the device to `size` bytes (children must already have the room).
    Grow { size: u64 },
    /// A node whose devices are made by control verbs (a thin pool): the names of the
    /// devices it holds now. Answered with [`ControlReply::Names`].
    Volumes,
    /// One of those devices by name, answered with [`ControlReply::Device`].
    Volume { name: String },
    /// Make a device of `size` bytes named `name`, answered with [`ControlReply::Device`].
    CreateVolume { name: String, size: u64 },
    /// Change the size of device `name` to `size` bytes (past the new end is discarded),
    /// answered with [`ControlReply::Done`].
    ResizeVolume { name: String, size: u64 },
    /// Delete device `name` and give its space back, answered with [`ControlReply::Done`].
    DeleteVolume { name: String },
    /// The node's space and each device's share of it, answered with [`ControlReply::Space`].
    Space,
    /// The layer's own object, for the control plane's typed verbs (a `ThinPool`), answered
    /// with [`ControlReply::Handle`].
    Handle,
    /// Pause background work (rebuild, resync, committer) once its running step ends;
    /// nests, each undone by one `Resume` (see `lifecycle`). Filters forward it.
    Quiesce,
    /// Undo one `Quiesce`.
    Resume,
    /// End background work and wait for it (server shutdown); I/O goes on being served.
    Stop,
    /// The server's last word to a device, after its final flush: a device that is a member
    /// of a cluster leaves it (a shared volume revokes its lease, so its lock segments go to
    /// the hosts waiting for them at once, not at the lease's expiry). Answered with
    /// [`ControlReply::Done`]; every other device refuses.
    Leave,
    /// A view of this device for one client connection, answered with
    /// [`ControlReply::Device`] by a device that keeps a stream of writes per opener (a
    /// shared volume: that connection's flush commits that connection's writes, as one
    /// interval). Others refuse, and the connection uses the device itself.
    Connection,
    /// A verb the layer's kind declares in its registry entry and handles itself (a thin
    /// pool's `snapshot-create`, `count`'s `reset-counts`), with its arguments already checked
    /// against the declaration ([`crate::layer::Verb::arguments`]). Answered with
    /// [`ControlReply::Table`]. A layer that does not know the verb answers `Unsupported`.
    Call { verb: String, args: toml::Table },
    /// Lock a byte range for a holder, answered with [`ControlReply::Lock`] (`crate::lock`):
    /// a device that holds locks takes it; a layer with a fixed map of its range to its
    /// children's passes it down; others refuse with `Unsupported("lock")`.
    Lock(crate::lock::LockRequest),
}

impl Control {
    /// The verb's name, for refusals and logs ("add-member").
    pub fn verb(&self) -> &'static str {
        match self {
            Control::Describe => "describe",
            Control::AddMember(_) => "add-member",
            Control::GrowMembers { .. } => "grow-members",
            Control::ReplaceMember { .. } => "replace-member",
            Control::FailMember { .. } => "fail-member",
            Control::Grow { .. } => "grow",
            Control::Volumes => "volumes",
            Control::Volume { .. } => "volume",
            Control::CreateVolume { .. } => "volume-create",
            Control::ResizeVolume { .. } => "volume-resize",
            Control::DeleteVolume { .. } => "volume-delete",
            Control::Space => "volume-list",
            Control::Handle => "handle",
            Control::Quiesce => "quiesce",
            Control::Resume => "resume",
            Control::Stop => "stop",
            Control::Leave => "leave",
            Control::Connection => "connection",
            Control::Call { .. } => "call",
            Control::Lock(_) => "lock",
        }
    }
}

/// The answer to a [`Control`] call.
// Control calls are rare (status, reconfiguration), so the size of a reply does not matter.
#[allow(clippy::large_enum_variant)]
#[non_exhaustive]
pub enum ControlReply {
    Describe(NodeStatus),
    /// The change is made (and durable, for layers that record their shape).
    Done,
    /// The devices a node holds ([`Control::Volumes`]).
    Names(Vec<String>),
    /// A device the node made or holds ([`Control::Volume`], [`Control::CreateVolume`]).
    Device(DeviceRef),
    /// The layer's own object ([`Control::Handle`]), to downcast.
    Handle(Arc<dyn std::any::Any + Send + Sync>),
    /// A device-making node's space ([`Control::Space`]).
    Space(SpaceReport),
    /// What a [`Control::Call`] answers: any table (an empty one when there is nothing to
    /// say), shown by `strata call` as text or JSON.
    Table(toml::Table),
    /// A lock taken ([`Control::Lock`]).
    Lock(crate::lock::HeldLock),
}

/// The space of a node whose devices are made by verbs, and each device's share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpaceReport {
    /// The unit space is handed out in (a thin pool's extent).
    pub unit_bytes: u64,
    /// Room for data, in all.
    pub data_bytes: u64,
    /// Room handed out to devices.
    pub allocated_bytes: u64,
    pub devices: Vec<DeviceShare>,
}

/// One made device in a [`SpaceReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceShare {
    pub name: String,
    /// Its virtual size.
    pub size: u64,
    /// The room it holds.
    pub allocated_bytes: u64,
}

/// Devices and handles show by what they are, not their contents.
impl std::fmt::Debug for ControlReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlReply::Describe(status) => f.debug_tuple("Describe").field(status).finish(),
            ControlReply::Done => f.write_str("Done"),
            ControlReply::Names(names) => f.debug_tuple("Names").field(names).finish(),
            ControlReply::Device(device) => write!(f, "Device({} bytes)", device.geometry().size),
            ControlReply::Handle(_) => f.write_str("Handle"),
            ControlReply::Space(space) => f.debug_tuple("Space").field(space).finish(),
            ControlReply::Table(table) => f.debug_tuple("Table").field(table).finish(),
            ControlReply::Lock(lock) => f.debug_tuple("Lock").field(lock).finish(),
        }
    }
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

    /// Writes every `(offset, data)` and returns once all of them are durable: the same as
    /// that many writes with FUA issued at once, in no order among themselves. For records
    /// kept in several copies (a metadata journal's two).
    ///
    /// Default: exactly those FUA writes (see [`write_each_durable`]). A device that can make
    /// several writes durable for the price of one overrides it: a file writes them all and
    /// syncs once, where each FUA write pays for its own sync (two 4 KiB copies: 0.13 ms
    /// against 0.25 ms, measured on the quiet VM).
    async fn write_durable(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        write_each_durable(self, writes).await
    }

    /// Writes every `(offset, data)`, then flushes: on return these writes, and every write
    /// completed before the call, are durable. A crash before it returns may keep any of
    /// them, and any earlier unflushed write, whole, torn or not at all, in any order. For a
    /// record that reaches the medium under the same sync as the data it points at, where
    /// recovery can tell whether the data landed (a brick's prepare carries checksums).
    ///
    /// Default: the writes at once, then a flush. A file overrides it: its `write_durable`
    /// already ends with one sync of the whole file.
    async fn write_and_flush(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        write_all(self, writes).await?;
        self.flush().await
    }

    /// Tells the device the range is no longer needed. Afterwards the range reads as zeros or
    /// as its old contents; callers that need zeros use `write_zeroes`.
    ///
    /// Default: checks the range and keeps the old contents. Discard is a hint and the contract
    /// lets the range keep its bytes, so ignoring it is an honest answer, not a refusal; a
    /// device that can give space back overrides this (and says so in `capabilities`).
    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry().check_range(offset, len)
    }

    /// Makes the range read as zeros.
    ///
    /// Default: writes zero buffers in pieces of at most `max_io` (and at most
    /// [`ZERO_PIECE`]), with FUA when `flags.fua`, in order. It is never cheaper than writing
    /// zeros, so `flags.fast` is refused with `Unsupported`; `may_trim` is ignored (allowed).
    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        write_zeroes_by_writing(self, offset, len, flags).await
    }

    /// Describes allocation from `offset`, covering at least one byte and at most `len`.
    /// Extents are contiguous, start at `offset`, and never extend past `offset + len`.
    ///
    /// Default: checks the range and answers that all of it is data (one extent; none for an
    /// empty range), which is always true of a device that does not track allocation.
    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry().check_range(offset, len)?;
        Ok(all_data(offset, len))
    }

    /// Default: knows no verb; refuses each with `Unsupported` naming it.
    async fn control(&self, request: Control) -> Result<ControlReply> {
        Err(refuse(&request))
    }
}

/// The largest zero buffer the default `write_zeroes` allocates (it is shared by its pieces).
pub const ZERO_PIECE: u64 = 1 << 20;

/// `[offset, offset + len)` as one data extent (none when empty).
pub fn all_data(offset: u64, len: u64) -> Vec<Extent> {
    if len == 0 {
        return Vec::new();
    }
    vec![Extent {
        offset,
        len,
        state: ExtentState::Data,
    }]
}

/// `device`'s own description: what a layer puts among its node's children.
pub async fn describe<D: BlockDevice + ?Sized>(device: &D) -> crate::Result<NodeStatus> {
    match device.control(Control::Describe).await? {
        ControlReply::Describe(node) => Ok(node),
        _ => Err(crate::BlockError::Unsupported("describe")),
    }
}

/// The answer to a control verb a device does not know.
pub fn refuse(request: &Control) -> crate::BlockError {
    crate::BlockError::Unsupported(request.verb())
}

/// `write_durable` done as one FUA write per piece, all at once: the trait's default, and
/// what a filter does unless it says otherwise (its own `write` must see every write).
pub async fn write_each_durable<D: BlockDevice + ?Sized>(
    device: &D,
    writes: Vec<(u64, Bytes)>,
) -> Result<()> {
    write_each(device, writes, WriteFlags { fua: true }).await
}

/// Every `(offset, data)` as an ordinary write, all at once: none is durable on return.
pub async fn write_all<D: BlockDevice + ?Sized>(
    device: &D,
    writes: Vec<(u64, Bytes)>,
) -> Result<()> {
    write_each(device, writes, WriteFlags::default()).await
}

async fn write_each<D: BlockDevice + ?Sized>(
    device: &D,
    writes: Vec<(u64, Bytes)>,
    flags: WriteFlags,
) -> Result<()> {
    let writes = writes
        .into_iter()
        .map(|(offset, data)| device.write(offset, data, flags));
    // Every write is awaited, so none is still in flight when the caller hears of a failure.
    futures_util::future::join_all(writes)
        .await
        .into_iter()
        .collect()
}

/// `write_zeroes` done with ordinary writes of zeros (the trait's default, usable by a device
/// that overrides `write_zeroes` only for some flags).
pub async fn write_zeroes_by_writing<D: BlockDevice + ?Sized>(
    device: &D,
    offset: u64,
    len: u64,
    flags: ZeroFlags,
) -> Result<()> {
    let geometry = device.geometry();
    geometry.check_range(offset, len)?;
    if flags.fast {
        return Err(crate::BlockError::Unsupported(
            "fast zeroing (this device writes zeros)",
        ));
    }
    let align = u64::from(geometry.min_io.max(1));
    // A multiple of min_io, at least one block, within max_io when max_io allows it.
    let piece = (u64::from(geometry.max_io).min(ZERO_PIECE) / align).max(1) * align;
    let zeros = Bytes::from(vec![0u8; piece.min(len) as usize]);
    let write_flags = WriteFlags { fua: flags.fua };
    let mut done = 0;
    while done < len {
        let n = piece.min(len - done);
        device
            .write(offset + done, zeros.slice(..n as usize), write_flags)
            .await?;
        done += n;
    }
    Ok(())
}

/// Devices are shared by the exports and connections that use them.
pub type DeviceRef = Arc<dyn BlockDevice>;

/// A shared device is a device: wrappers such as `Metered` can take an `Arc<dyn BlockDevice>`.
///
/// Calling a method on a `DeviceRef` resolves to this impl (the `Arc` matches before the
/// `dyn BlockDevice` inside it), so it hands back the inner device's future as it is rather
/// than boxing a second future around it: one allocation and one poll level less per call at
/// every layer of a stack.
impl<T: BlockDevice + ?Sized> BlockDevice for Arc<T> {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }

    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }

    fn read<'a, 'f>(&'a self, offset: u64, len: usize) -> BoxFuture<'f, Result<BytesMut>>
    where
        'a: 'f,
        Self: 'f,
    {
        (**self).read(offset, len)
    }

    fn write<'a, 'f>(
        &'a self,
        offset: u64,
        data: Bytes,
        flags: WriteFlags,
    ) -> BoxFuture<'f, Result<()>>
    where
        'a: 'f,
        Self: 'f,
    {
        (**self).write(offset, data, flags)
    }

    fn flush<'a, 'f>(&'a self) -> BoxFuture<'f, Result<()>>
    where
        'a: 'f,
        Self: 'f,
    {
        (**self).flush()
    }

    fn write_durable<'a, 'f>(&'a self, writes: Vec<(u64, Bytes)>) -> BoxFuture<'f, Result<()>>
    where
        'a: 'f,
        Self: 'f,
    {
        (**self).write_durable(writes)
    }

    fn discard<'a, 'f>(&'a self, offset: u64, len: u64) -> BoxFuture<'f, Result<()>>
    where
        'a: 'f,
        Self: 'f,
    {
        (**self).discard(offset, len)
    }

    fn write_zeroes<'a, 'f>(
        &'a self,
        offset: u64,
        len: u64,
        flags: ZeroFlags,
    ) -> BoxFuture<'f, Result<()>>
    where
        'a: 'f,
        Self: 'f,
    {
        (**self).write_zeroes(offset, len, flags)
    }

    fn block_status<'a, 'f>(&'a self, offset: u64, len: u64) -> BoxFuture<'f, Result<Vec<Extent>>>
    where
        'a: 'f,
        Self: 'f,
    {
        (**self).block_status(offset, len)
    }

    fn control<'a, 'f>(&'a self, request: Control) -> BoxFuture<'f, Result<ControlReply>>
    where
        'a: 'f,
        Self: 'f,
    {
        (**self).control(request)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::BlockError;

    /// A device that writes only what the trait requires and records its writes.
    struct Minimal {
        geometry: Geometry,
        writes: Mutex<Vec<(u64, usize, bool, bool)>>,
    }

    impl Minimal {
        fn new(min_io: u32, max_io: u32) -> Minimal {
            Minimal {
                geometry: Geometry {
                    min_io,
                    max_io,
                    ..Geometry::byte_addressable(8 << 20)
                },
                writes: Mutex::new(Vec::new()),
            }
        }
    }

    #[async_trait]
    impl BlockDevice for Minimal {
        fn geometry(&self) -> Geometry {
            self.geometry
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }
        async fn read(&self, _offset: u64, len: usize) -> Result<BytesMut> {
            Ok(BytesMut::zeroed(len))
        }
        async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
            self.geometry.check_range(offset, data.len() as u64)?;
            let zeros = data.iter().all(|&b| b == 0);
            self.writes
                .lock()
                .unwrap()
                .push((offset, data.len(), flags.fua, zeros));
            Ok(())
        }
        async fn flush(&self) -> Result<()> {
            self.writes.lock().unwrap().push(FLUSH);
            Ok(())
        }
    }

    /// How `Minimal` records a flush among its writes.
    const FLUSH: (u64, usize, bool, bool) = (u64::MAX, 0, false, false);

    /// The default `write_and_flush` writes (not FUA), and only then flushes: what makes the
    /// earlier writes durable with them. The default `write_durable` is FUA writes alone.
    #[tokio::test]
    async fn write_and_flush_defaults_to_the_writes_then_one_flush() {
        let device = Minimal::new(512, 1 << 20);
        let writes = vec![
            (0, Bytes::from(vec![1; 4096])),
            (8192, Bytes::from(vec![2; 512])),
        ];
        device.write_and_flush(writes.clone()).await.unwrap();
        assert_eq!(
            device.writes.lock().unwrap().clone(),
            vec![(0, 4096, false, false), (8192, 512, false, false), FLUSH]
        );
        let durable = Minimal::new(512, 1 << 20);
        durable.write_durable(writes).await.unwrap();
        assert_eq!(
            durable.writes.lock().unwrap().clone(),
            vec![(0, 4096, true, false), (8192, 512, true, false)]
        );
        // A write out of range is refused, and nothing is flushed.
        let refused = Minimal::new(512, 1 << 20);
        let beyond = vec![(16 << 20, Bytes::from(vec![1; 512]))];
        assert!(refused.write_and_flush(beyond).await.is_err());
        assert!(!refused.writes.lock().unwrap().contains(&FLUSH));
    }

    #[tokio::test]
    async fn write_zeroes_defaults_to_aligned_zero_writes_within_max_io_with_fua() {
        let device = Minimal::new(512, 3 * 512 + 100);
        let flags = ZeroFlags {
            fua: true,
            ..ZeroFlags::default()
        };
        device.write_zeroes(1024, 4 * 512, flags).await.unwrap();
        let writes = device.writes.lock().unwrap().clone();
        assert_eq!(
            writes,
            vec![(1024, 1536, true, true), (2560, 512, true, true)]
        );
        // Big ranges go in ZERO_PIECE pieces when max_io allows more.
        let big = Minimal::new(1, 32 << 20);
        big.write_zeroes(0, 3 * ZERO_PIECE - 1, ZeroFlags::default())
            .await
            .unwrap();
        let sizes: Vec<usize> = big.writes.lock().unwrap().iter().map(|w| w.1).collect();
        assert_eq!(
            sizes,
            vec![
                ZERO_PIECE as usize,
                ZERO_PIECE as usize,
                ZERO_PIECE as usize - 1
            ]
        );
    }

    #[tokio::test]
    async fn write_zeroes_default_refuses_fast_and_bad_ranges_before_writing() {
        let device = Minimal::new(512, 1 << 20);
        let fast = ZeroFlags {
            fast: true,
            ..ZeroFlags::default()
        };
        assert!(matches!(
            device.write_zeroes(0, 512, fast).await,
            Err(BlockError::Unsupported(_))
        ));
        assert!(matches!(
            device.write_zeroes(0, 100, ZeroFlags::default()).await,
            Err(BlockError::InvalidArgument(_))
        ));
        assert!(matches!(
            device
                .write_zeroes(8 << 20, 512, ZeroFlags::default())
                .await,
            Err(BlockError::OutOfRange { .. })
        ));
        assert!(device.writes.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_other_defaults_answer_all_data_keep_contents_and_refuse_verbs_by_name() {
        let device = Minimal::new(512, 1 << 20);
        assert_eq!(
            device.block_status(512, 1024).await.unwrap(),
            vec![Extent {
                offset: 512,
                len: 1024,
                state: ExtentState::Data
            }]
        );
        assert!(device.block_status(0, 0).await.unwrap().is_empty());
        assert!(device.block_status(8 << 20, 512).await.is_err());
        device.discard(0, 512).await.unwrap();
        assert!(device.discard(0, 100).await.is_err());
        assert!(device.writes.lock().unwrap().is_empty());
        let refused = device.control(Control::Grow { size: 1 }).await.unwrap_err();
        assert!(matches!(refused, BlockError::Unsupported("grow")));
        assert!(refused.to_string().contains("grow"));
    }
}
