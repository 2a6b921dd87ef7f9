//! Pass-through filters (nbdkit's `next` pattern): a layer over one child writes only the
//! methods it changes; every other call goes to the child unchanged.
//!
//! ```ignore
//! struct CountReads { next: DeviceRef, reads: AtomicU64 }
//!
//! #[async_trait]
//! impl Filter for CountReads {
//!     fn next(&self) -> &DeviceRef { &self.next }
//!     async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
//!         self.reads.fetch_add(1, Ordering::Relaxed);
//!         self.next.read(offset, len).await
//!     }
//! }
//! // CountReads is now a BlockDevice (blanket impl below).
//! ```
//!
//! Why a blanket `impl<F: Filter> BlockDevice for F` rather than a wrapper type or a macro: a
//! downstream crate's filter is a local type, so the compiler can see that it implements only
//! one of the two traits, and the impls do not overlap (checked: a type implementing `Filter`
//! cannot also implement `BlockDevice`, and `Arc<T>` / `Metered<D>` cannot implement `Filter`
//! outside this crate). The filter keeps its own name in types and errors, and its methods
//! are ordinary trait methods, so no macro hides what is generated.
//!
//! The blanket impl checks each request's range against the filter's geometry before the
//! filter sees it, so a filter never acts (sleeps, counts, injects a fault) on a request the
//! device refuses anyway, and no filter writes that check itself.
//!
//! Call a filter through `BlockDevice` (a `DeviceRef`, or `BlockDevice::read(&f, ..)`): with
//! both traits in scope, `f.read(..)` on the concrete type is ambiguous.

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use crate::{
    BlockDevice, Capabilities, Control, ControlReply, DeviceRef, Extent, Geometry, Result,
    WriteFlags, ZeroFlags,
};

/// A device over one child (`next`) that forwards what it does not override.
#[async_trait]
pub trait Filter: Send + Sync {
    /// The device below, where every method not overridden goes.
    fn next(&self) -> &DeviceRef;

    fn geometry(&self) -> Geometry {
        self.next().geometry()
    }

    fn capabilities(&self) -> Capabilities {
        self.next().capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.next().read(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.next().write(offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        self.next().flush().await
    }

    /// Not forwarded by default: the writes go through this filter's own `write`, which may
    /// change them (encrypt, remap, refuse). A filter that leaves writes as they are forwards
    /// it to keep the device's cheaper way.
    async fn write_durable(&self, writes: Vec<(u64, Bytes)>) -> Result<()>
    where
        Self: Sized,
    {
        crate::write_each_durable(self, writes).await
    }

    /// Not forwarded by default, for the same reason: the writes through this filter's own
    /// `write`, then its `flush`.
    async fn write_and_flush(&self, writes: Vec<(u64, Bytes)>) -> Result<()>
    where
        Self: Sized,
    {
        crate::write_all(self, writes).await?;
        Filter::flush(self).await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.next().discard(offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.next().write_zeroes(offset, len, flags).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.next().block_status(offset, len).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        self.next().control(request).await
    }
}

#[async_trait]
impl<F: Filter> BlockDevice for F {
    fn geometry(&self) -> Geometry {
        Filter::geometry(self)
    }

    fn capabilities(&self) -> Capabilities {
        Filter::capabilities(self)
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        Filter::geometry(self).check_range(offset, len as u64)?;
        Filter::read(self, offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        Filter::geometry(self).check_range(offset, data.len() as u64)?;
        Filter::write(self, offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        Filter::flush(self).await
    }

    async fn write_durable(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        for (offset, data) in &writes {
            Filter::geometry(self).check_range(*offset, data.len() as u64)?;
        }
        Filter::write_durable(self, writes).await
    }

    async fn write_and_flush(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        for (offset, data) in &writes {
            Filter::geometry(self).check_range(*offset, data.len() as u64)?;
        }
        Filter::write_and_flush(self, writes).await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        Filter::geometry(self).check_range(offset, len)?;
        Filter::discard(self, offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        Filter::geometry(self).check_range(offset, len)?;
        Filter::write_zeroes(self, offset, len, flags).await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        Filter::geometry(self).check_range(offset, len)?;
        Filter::block_status(self, offset, len).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        // A view of the device below would bypass this filter: its connections use it whole.
        if matches!(request, Control::Connection) {
            return Err(crate::refuse(&request));
        }
        Filter::control(self, request).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::{BlockError, ExtentState, NodeStatus};

    /// A child that answers everything, so forwarding is visible.
    struct Child;

    #[async_trait]
    impl BlockDevice for Child {
        fn geometry(&self) -> Geometry {
            Geometry::byte_addressable(1 << 20)
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                discard: true,
                ..Capabilities::default()
            }
        }
        async fn read(&self, _offset: u64, len: usize) -> Result<BytesMut> {
            Ok(BytesMut::from(&vec![7u8; len][..]))
        }
        async fn write(&self, _offset: u64, _data: Bytes, _flags: WriteFlags) -> Result<()> {
            Ok(())
        }
        async fn flush(&self) -> Result<()> {
            Err(BlockError::Shutdown)
        }
        async fn discard(&self, _offset: u64, _len: u64) -> Result<()> {
            Err(BlockError::NoSpace)
        }
        async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
            Ok(vec![Extent {
                offset,
                len,
                state: ExtentState::Hole,
            }])
        }
        async fn control(&self, _request: Control) -> Result<ControlReply> {
            Ok(ControlReply::Describe(NodeStatus::new("child", "test", 0)))
        }
    }

    struct CountReads {
        next: DeviceRef,
        reads: AtomicU64,
    }

    #[async_trait]
    impl Filter for CountReads {
        fn next(&self) -> &DeviceRef {
            &self.next
        }
        async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.next.read(offset, len).await
        }
    }

    fn counting() -> (Arc<CountReads>, DeviceRef) {
        let filter = Arc::new(CountReads {
            next: Arc::new(Child),
            reads: AtomicU64::new(0),
        });
        (filter.clone(), filter)
    }

    #[tokio::test]
    async fn a_filter_does_not_hand_out_a_connection_view_of_the_device_below() {
        // The child answers every control, a connection view included: passed up, it would
        // let the connection bypass the filter.
        let (_, device) = counting();
        let refused = device.control(Control::Connection).await;
        assert!(
            matches!(refused, Err(BlockError::Unsupported("connection"))),
            "{refused:?}"
        );
        assert!(device.control(Control::Describe).await.is_ok());
    }

    #[tokio::test]
    async fn a_filter_changes_what_it_overrides_and_forwards_the_rest() {
        let (filter, device) = counting();
        assert_eq!(&device.read(0, 3).await.unwrap()[..], &[7, 7, 7]);
        assert_eq!(filter.reads.load(Ordering::Relaxed), 1);
        assert_eq!(device.geometry().size, 1 << 20);
        assert!(device.capabilities().discard);
        assert!(matches!(device.flush().await, Err(BlockError::Shutdown)));
        assert!(matches!(
            device.discard(0, 1).await,
            Err(BlockError::NoSpace)
        ));
        let extents = device.block_status(0, 9).await.unwrap();
        assert_eq!(extents[0].state, ExtentState::Hole);
        assert!(matches!(
            device.control(Control::Describe).await,
            Ok(ControlReply::Describe(node)) if node.name == "child"
        ));
        // The default write_zeroes of the child writes zeros through the child's `write`.
        device
            .write_zeroes(0, 4096, ZeroFlags::default())
            .await
            .unwrap();
    }

    /// A filter that changes writes (as an encrypting one would) and notes each it sees.
    struct NoteWrites {
        next: DeviceRef,
        seen: std::sync::Mutex<Vec<(u64, usize, bool)>>,
    }

    #[async_trait]
    impl Filter for NoteWrites {
        fn next(&self) -> &DeviceRef {
            &self.next
        }
        async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
            self.seen
                .lock()
                .unwrap()
                .push((offset, data.len(), flags.fua));
            self.next.write(offset, data, flags).await
        }
    }

    #[tokio::test]
    async fn durable_writes_go_through_the_filters_own_write_each_with_fua() {
        // Forwarded to the child, they would bypass a filter that changes writes.
        let filter = Arc::new(NoteWrites {
            next: Arc::new(Child),
            seen: Default::default(),
        });
        let device: DeviceRef = filter.clone();
        let copy = Bytes::from_static(b"record");
        device
            .write_durable(vec![(0, copy.clone()), (4096, copy.clone())])
            .await
            .unwrap();
        let mut seen = filter.seen.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, vec![(0, 6, true), (4096, 6, true)]);
        // One piece out of range refuses them all before any is written.
        let end = device.geometry().size;
        let refused = device
            .write_durable(vec![(0, copy.clone()), (end, copy)])
            .await;
        assert!(matches!(refused, Err(BlockError::OutOfRange { .. })));
        assert_eq!(filter.seen.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_request_past_the_end_is_refused_before_the_filter_sees_it() {
        let (filter, device) = counting();
        let end = device.geometry().size;
        assert!(matches!(
            device.read(end - 1, 2).await,
            Err(BlockError::OutOfRange { .. })
        ));
        assert_eq!(filter.reads.load(Ordering::Relaxed), 0);
        for refused in [
            device
                .write(end, Bytes::from_static(b"x"), WriteFlags::default())
                .await,
            device.discard(end - 1, 2).await,
            device.write_zeroes(u64::MAX, 2, ZeroFlags::default()).await,
        ] {
            assert!(matches!(refused, Err(BlockError::OutOfRange { .. })));
        }
        assert!(device.block_status(end, 1).await.is_err());
    }
}
