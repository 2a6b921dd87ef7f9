//! A brick stops at its disk's first failure (fail-stop), as Linux MD kicks a member out at
//! its first write error.
//!
//! Why stop rather than answer each request as it comes: a brick whose disk failed a write
//! may hold a staged interval half written, and one whose disk failed a read cannot vouch for
//! anything it reads later. Its mirror peer holds every committed write, so the safe answer is
//! to go away whole: hosts take a brick that does not answer down, record what it misses in
//! etcd and go on with its peer (docs/shared-volumes.md, "A brick's disk fails"). A request
//! refused one by one instead would abort every interval touching the brick, and fail the
//! clients' writes although a good copy is there.
//!
//! The failure is kept in memory only. A brick restarted over the same disk serves again if
//! its store opens; it is stale wherever hosts wrote while it was away, and is read there only
//! once copied back, so nothing it lost is ever served.

use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use strata_core::{async_trait, BlockError, DeviceRef, Filter, Result, WriteFlags, ZeroFlags};

/// Whether the disk under a brick has failed, and the first error that said so.
#[derive(Debug, Default)]
pub struct DiskHealth {
    failure: OnceLock<String>,
}

impl DiskHealth {
    /// The first error the disk returned, once it has failed.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// The refusal of every request after the failure: an I/O error, as the disk's own.
    fn refusal(&self) -> Option<BlockError> {
        self.failure().map(|first| BlockError::Io {
            context: format!("the brick's disk failed earlier ({first}); it serves nothing until restarted or replaced"),
            source: std::io::Error::from_raw_os_error(strata_core::errno::EIO as i32),
        })
    }

    fn check<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(error @ (BlockError::Io { .. } | BlockError::NoSpace)) = &result {
            if self.failure.set(error.to_string()).is_ok() {
                tracing::error!(%error, "the brick's disk failed: the brick stops serving");
            }
        }
        result
    }
}

/// The brick's device, watched: its first I/O error (or a full disk under a brick file)
/// marks it failed, and from then on every request is refused before it reaches the disk.
pub struct FailStop {
    next: DeviceRef,
    health: Arc<DiskHealth>,
}

impl FailStop {
    pub fn wrap(device: DeviceRef) -> (DeviceRef, Arc<DiskHealth>) {
        let health = Arc::new(DiskHealth::default());
        let watched = FailStop {
            next: device,
            health: health.clone(),
        };
        (Arc::new(watched), health)
    }
}

#[async_trait]
impl Filter for FailStop {
    fn next(&self) -> &DeviceRef {
        &self.next
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        if let Some(refused) = self.health.refusal() {
            return Err(refused);
        }
        self.health.check(self.next.read(offset, len).await)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        if let Some(refused) = self.health.refusal() {
            return Err(refused);
        }
        self.health
            .check(self.next.write(offset, data, flags).await)
    }

    async fn flush(&self) -> Result<()> {
        if let Some(refused) = self.health.refusal() {
            return Err(refused);
        }
        self.health.check(self.next.flush().await)
    }

    async fn write_durable(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        if let Some(refused) = self.health.refusal() {
            return Err(refused);
        }
        self.health.check(self.next.write_durable(writes).await)
    }

    async fn write_and_flush(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        if let Some(refused) = self.health.refusal() {
            return Err(refused);
        }
        self.health.check(self.next.write_and_flush(writes).await)
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if let Some(refused) = self.health.refusal() {
            return Err(refused);
        }
        self.health.check(self.next.discard(offset, len).await)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        if let Some(refused) = self.health.refusal() {
            return Err(refused);
        }
        self.health
            .check(self.next.write_zeroes(offset, len, flags).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::BlockDevice;

    /// A disk whose writes past `bad` fail, as a disk with a bad region does.
    struct BadRegion {
        bad: u64,
    }

    #[async_trait]
    impl strata_core::BlockDevice for BadRegion {
        fn geometry(&self) -> strata_core::Geometry {
            strata_core::Geometry::byte_addressable(1 << 20)
        }
        fn capabilities(&self) -> strata_core::Capabilities {
            strata_core::Capabilities::ALL
        }
        async fn read(&self, _offset: u64, len: usize) -> Result<BytesMut> {
            Ok(BytesMut::zeroed(len))
        }
        async fn write(&self, offset: u64, _data: Bytes, _flags: WriteFlags) -> Result<()> {
            if offset >= self.bad {
                return Err(BlockError::Io {
                    context: "test disk".into(),
                    source: std::io::Error::from_raw_os_error(5),
                });
            }
            Ok(())
        }
        async fn flush(&self) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_first_io_error_stops_every_later_request_and_is_kept() {
        let (disk, health) = FailStop::wrap(Arc::new(BadRegion { bad: 4096 }));
        let block = || Bytes::from(vec![1u8; 512]);
        disk.write(0, block(), WriteFlags::default()).await.unwrap();
        disk.read(0, 512).await.unwrap();
        assert!(health.failure().is_none());
        let first = disk.write(8192, block(), WriteFlags::default()).await;
        assert!(matches!(first, Err(BlockError::Io { .. })));
        let failure = health.failure().expect("failed").to_string();
        assert!(failure.contains("test disk"), "{failure}");
        // Requests the disk would still answer are refused: the brick is gone as a whole.
        for refused in [
            disk.read(0, 512).await.map(|_| ()),
            disk.write(0, block(), WriteFlags::default()).await,
            disk.flush().await,
        ] {
            let error = refused.unwrap_err().to_string();
            assert!(error.contains("failed earlier"), "{error}");
        }
        assert_eq!(
            health.failure(),
            Some(failure.as_str()),
            "the first error is kept"
        );
    }

    #[tokio::test]
    async fn refusals_of_bad_requests_are_not_disk_failures() {
        let (disk, health) = FailStop::wrap(Arc::new(BadRegion { bad: u64::MAX }));
        assert!(disk.read(1 << 20, 512).await.is_err(), "out of range");
        assert!(health.failure().is_none());
    }
}
