//! A sparse device in RAM.
//!
//! It exists so that layers and frontends can be tested (and benchmarked) without touching a
//! disk: it is cheap to create, holds only the pages ever written, and reports those pages as
//! data and everything else as holes, which exercises block-status paths as a real file would.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, Extent, Geometry,
    Health, NodeStatus, PageStore, Result, WriteFlags, ZeroFlags,
};

#[cfg(test)]
use strata_core::ExtentState;

/// A sparse in-memory block device. Pages never written read as zeros and cost nothing.
pub struct MemoryDevice {
    geometry: Geometry,
    /// 4 KiB pages (allocation granularity, independent of `min_io`).
    pages: RwLock<PageStore>,
}

impl MemoryDevice {
    /// A byte-addressable device of `size` bytes, all zeros.
    pub fn new(size: u64) -> Self {
        Self::with_geometry(Geometry::byte_addressable(size))
    }

    /// A device with an explicit geometry, e.g. to make callers respect a larger `min_io`.
    pub fn with_geometry(geometry: Geometry) -> Self {
        MemoryDevice {
            geometry,
            pages: RwLock::new(PageStore::new()),
        }
    }

    /// Bytes currently held in memory.
    pub fn allocated_bytes(&self) -> u64 {
        self.pages_read().allocated_bytes()
    }

    // A writer that panicked mid-copy leaves at worst a torn write, which the device contract
    // already allows after a crash, so a poisoned lock is safe to keep using.
    fn pages_read(&self) -> RwLockReadGuard<'_, PageStore> {
        self.pages.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn pages_write(&self) -> RwLockWriteGuard<'_, PageStore> {
        self.pages.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl BlockDevice for MemoryDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry.check_range(offset, len as u64)?;
        let mut buf = BytesMut::with_capacity(len);
        self.pages_read().read_append(offset, len, &mut buf);
        debug_assert_eq!(buf.len(), len);
        Ok(buf)
    }

    async fn write(&self, offset: u64, data: Bytes, _flags: WriteFlags) -> Result<()> {
        // Memory is as durable as it gets the moment the copy is done, so FUA needs nothing.
        self.geometry.check_range(offset, data.len() as u64)?;
        self.pages_write().write(offset, &data);
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        Ok(())
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        self.pages_write().zero(offset, len);
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, _flags: ZeroFlags) -> Result<()> {
        // Freeing pages is both the fastest way and a trim; doing it regardless of may_trim is
        // fine here because a later write re-allocates without ever failing for space.
        self.geometry.check_range(offset, len)?;
        self.pages_write().zero(offset, len);
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry.check_range(offset, len)?;
        Ok(self.pages_read().extents(offset, len))
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(NodeStatus {
                name: "memory".into(),
                kind: "memory".into(),
                size: self.geometry.size,
                health: Health::Ok,
                detail: vec![("allocated".into(), self.allocated_bytes().to_string())],
                stats: None,
                children: Vec::new(),
                activity: None,
                config: None,
            })),
            _ => Err(BlockError::Unsupported("control verb on a memory device")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(len: usize, byte: u8) -> Bytes {
        Bytes::from(vec![byte; len])
    }

    async fn read(dev: &MemoryDevice, offset: u64, len: usize) -> Vec<u8> {
        dev.read(offset, len).await.unwrap().to_vec()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn never_written_reads_zeros_and_is_one_hole() {
        let dev = MemoryDevice::new(1 << 20);
        let out = dev.read(12_345, 10_000).await.unwrap();
        assert_eq!(out.len(), 10_000);
        assert!(out.iter().all(|&b| b == 0));
        let extents = dev.block_status(100, 50_000).await.unwrap();
        assert_eq!(
            extents,
            vec![Extent {
                offset: 100,
                len: 50_000,
                state: ExtentState::Hole
            }]
        );
        assert_eq!(dev.allocated_bytes(), 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn writes_across_pages_read_back_and_show_as_clamped_data() {
        let dev = MemoryDevice::new(64 * 1024);
        let data: Vec<u8> = (0..6000u32).map(|i| (i % 251) as u8 + 1).collect();
        dev.write(4000, Bytes::from(data.clone()), WriteFlags::default())
            .await
            .unwrap();
        assert_eq!(read(&dev, 4000, 6000).await, data);
        assert_eq!(read(&dev, 3990, 10).await, vec![0; 10]);
        // Pages 0..=2 are present; the query starts inside page 0 and ends inside page 4.
        let extents = dev.block_status(100, 4 * 4096).await.unwrap();
        assert_eq!(
            extents,
            vec![
                Extent {
                    offset: 100,
                    len: 3 * 4096 - 100,
                    state: ExtentState::Data
                },
                Extent {
                    offset: 3 * 4096,
                    len: 4096 + 100,
                    state: ExtentState::Hole
                },
            ]
        );
        assert_eq!(dev.allocated_bytes(), 3 * 4096);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn zeroing_frees_whole_pages_and_zeros_partial_ones() {
        let dev = MemoryDevice::new(64 * 1024);
        dev.write(0, filled(4 * 4096, 7), WriteFlags::default())
            .await
            .unwrap();
        // Covers the end of page 0, all of page 1, the start of page 2.
        dev.discard(4000, 2 * 4096).await.unwrap();
        assert_eq!(dev.allocated_bytes(), 3 * 4096);
        assert_eq!(read(&dev, 3999, 1).await, vec![7]);
        assert_eq!(read(&dev, 4000, 2 * 4096).await, vec![0; 2 * 4096]);
        assert_eq!(read(&dev, 4000 + 2 * 4096, 1).await, vec![7]);
        let extents = dev.block_status(0, 4 * 4096).await.unwrap();
        let states: Vec<_> = extents.iter().map(|e| (e.offset, e.state)).collect();
        assert_eq!(
            states,
            vec![
                (0, ExtentState::Data),
                (4096, ExtentState::Hole),
                (8192, ExtentState::Data)
            ]
        );

        // Zeroing the rest of page 2 by hand leaves it all zeros: it becomes a hole too.
        let flags = ZeroFlags {
            may_trim: false,
            ..ZeroFlags::default()
        };
        dev.write_zeroes(8192, 4096, flags).await.unwrap();
        assert_eq!(dev.allocated_bytes(), 2 * 4096);
        assert_eq!(read(&dev, 8192, 4096).await, vec![0; 4096]);
        assert_eq!(read(&dev, 3 * 4096, 4096).await, vec![7; 4096]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn bad_requests_fail_and_change_nothing() {
        let geometry = Geometry {
            min_io: 512,
            ..Geometry::byte_addressable(8192)
        };
        let dev = MemoryDevice::with_geometry(geometry);
        dev.write(0, filled(8192, 3), WriteFlags::default())
            .await
            .unwrap();

        let misaligned = dev.write(1, filled(512, 9), WriteFlags::default()).await;
        assert!(
            matches!(misaligned, Err(BlockError::InvalidArgument(_))),
            "{misaligned:?}"
        );
        let past_end = dev
            .write(7680, filled(1024, 9), WriteFlags::default())
            .await;
        assert!(
            matches!(past_end, Err(BlockError::OutOfRange { .. })),
            "{past_end:?}"
        );
        let short = dev.read(0, 100).await;
        assert!(
            matches!(short, Err(BlockError::InvalidArgument(_))),
            "{short:?}"
        );
        let discard = dev.discard(512, 8192).await;
        assert!(
            matches!(discard, Err(BlockError::OutOfRange { .. })),
            "{discard:?}"
        );
        let zero = dev.write_zeroes(100, 512, ZeroFlags::default()).await;
        assert!(
            matches!(zero, Err(BlockError::InvalidArgument(_))),
            "{zero:?}"
        );
        let status = dev.block_status(u64::MAX - 511, 512).await;
        assert!(
            matches!(status, Err(BlockError::OutOfRange { .. })),
            "{status:?}"
        );

        assert_eq!(read(&dev, 0, 8192).await, vec![3; 8192]);
        assert_eq!(dev.allocated_bytes(), 8192);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn describe_names_the_kind_and_size() {
        let dev = MemoryDevice::new(1 << 30);
        let reply = dev.control(Control::Describe).await.unwrap();
        let ControlReply::Describe(node) = reply else {
            panic!("expected a description, got {reply:?}");
        };
        assert_eq!(node.kind, "memory");
        assert_eq!(node.size, 1 << 30);
        assert_eq!(node.health, Health::Ok);
    }
}
