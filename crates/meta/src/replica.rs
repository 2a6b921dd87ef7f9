//! Metadata kept in several places: one device over the metadata regions of several members
//! (a mirror's legs, a raid5 array's members), and the write of one record at several offsets.
//!
//! Lives here rather than in `strata-core` because it is metadata policy (every copy gets every
//! write, one surviving copy is enough), not part of the block contract.
//!
//! [`ReplicatedDevice`]: writes and flushes go to every target at once and succeed if one
//! copy took them; a target that fails is handed back to its owner ([`Replicas::failed`]),
//! which drops or fails that member. Reads come from the sources in the owner's order, the
//! next one answering when one fails. Everything else is the trait's default: `discard`
//! keeps the old contents (the contract allows it, and a metadata store never needs the
//! space back), `write_zeroes` writes zeros through `write` (so every copy gets them, with
//! FUA when asked), `block_status` is all data, and control verbs are refused.

use bytes::{Bytes, BytesMut};
use futures_util::future::join_all;
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, DeviceRef, Geometry, Result, WriteFlags,
};

/// Who holds the copies, as the owning layer sees its members.
pub trait Replicas: Send + Sync {
    /// Where writes and flushes go now: (member index, its device).
    fn targets(&self) -> Vec<(usize, DeviceRef)>;

    /// Where reads may come from, best first.
    fn sources(&self) -> Vec<(usize, DeviceRef)>;

    /// `device` in slot `member` failed a write or flush with `error` (the owner stops using it).
    fn failed(&self, member: usize, device: &DeviceRef, what: &'static str, error: &BlockError);

    /// The answer when no copy took `what` ("write", "flush", "read"): `first` is the first
    /// error a copy gave, `None` when there was no copy to try.
    fn none_left(&self, what: &'static str, first: Option<BlockError>) -> BlockError;

    /// A lock held shared across every write and flush, if the owner needs one (raid5 holds
    /// it exclusively while copying the region to a new member, so no write slips between).
    fn write_gate(&self) -> Option<&tokio::sync::RwLock<()>> {
        None
    }
}

/// The metadata regions of several members as one device; see the module documentation.
pub struct ReplicatedDevice<R> {
    geometry: Geometry,
    replicas: R,
}

impl<R: Replicas> ReplicatedDevice<R> {
    pub fn new(geometry: Geometry, replicas: R) -> Self {
        ReplicatedDevice { geometry, replicas }
    }

    /// The owner's view of the members.
    pub fn replicas(&self) -> &R {
        &self.replicas
    }

    /// Runs `op` on every target at once; a target that fails is reported. Succeeds if one did.
    async fn each<F>(&self, what: &'static str, op: F) -> Result<()>
    where
        F: Fn(DeviceRef) -> strata_core::BoxFuture<'static, Result<()>>,
    {
        let _gate = match self.replicas.write_gate() {
            Some(gate) => Some(gate.read().await),
            None => None,
        };
        let targets = self.replicas.targets();
        let results = join_all(targets.iter().map(|(_, device)| op(device.clone()))).await;
        let mut ok = false;
        let mut first = None;
        for ((member, device), result) in targets.iter().zip(results) {
            match result {
                Ok(()) => ok = true,
                Err(error) => {
                    self.replicas.failed(*member, device, what, &error);
                    first.get_or_insert(error);
                }
            }
        }
        if ok {
            Ok(())
        } else {
            Err(self.replicas.none_left(what, first))
        }
    }
}

#[async_trait]
impl<R: Replicas> BlockDevice for ReplicatedDevice<R> {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            flush: true,
            fua: true,
            ..Capabilities::default()
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry.check_range(offset, len as u64)?;
        let mut first = None;
        for (member, device) in self.replicas.sources() {
            match device.read(offset, len).await {
                Ok(data) => return Ok(data),
                Err(error) => {
                    tracing::error!(member, %error, "metadata read failed; trying the next copy");
                    first.get_or_insert(error);
                }
            }
        }
        Err(self.replicas.none_left("read", first))
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.geometry.check_range(offset, data.len() as u64)?;
        self.each("write", |device| {
            let data = data.clone();
            Box::pin(async move { device.write(offset, data, flags).await })
        })
        .await
    }

    async fn flush(&self) -> Result<()> {
        self.each("flush", |device| {
            Box::pin(async move { device.flush().await })
        })
        .await
    }
}

/// Writes `data` at every offset of `offsets` and returns once all are durable
/// ([`BlockDevice::write_durable`]: at once, as FUA writes, or on a file as writes and one
/// sync), with the first error in offset order if any failed. The second copy of a journal
/// record costs one more write, not a second round trip, and an acknowledged record survives
/// any fault that spares one copy.
pub async fn write_copies(
    device: &dyn BlockDevice,
    offsets: impl IntoIterator<Item = u64>,
    data: Bytes,
) -> Result<()> {
    let writes = offsets
        .into_iter()
        .map(|offset| (offset, data.clone()))
        .collect();
    device.write_durable(writes).await
}
