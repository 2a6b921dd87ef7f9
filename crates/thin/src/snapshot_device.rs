//! A snapshot as a block device: read-only, readable while the volume is in use, holes
//! reported. It reads the volume's chains at the snapshot's epoch; extents a snapshot sees are
//! never written in place (`Lineage::shared_limit`), so its bytes cannot change under it.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Extent, Geometry, Result, WriteFlags,
    ZeroFlags,
};

use crate::chain::{push_sources, Reading, Source};
use crate::map::{pieces, Piece};
use crate::pool::{lock_key, ThinPool};
use crate::versions::Epoch;

/// A held lock stripe.
type Stripe<'a> = tokio::sync::RwLockReadGuard<'a, ()>;

pub struct SnapshotDevice {
    pub(crate) pool: Arc<ThinPool>,
    /// The volume's id.
    pub(crate) volume: u32,
    /// `volume@snapshot`.
    pub(crate) name: String,
    pub(crate) epoch: Epoch,
    pub(crate) size: u64,
    pub(crate) reading: Reading,
}

impl SnapshotDevice {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the piece's granules are read from, if the snapshot still exists, with the
    /// piece's stripe held so that a deletion's cleanup cannot free them meanwhile.
    async fn sources(&self, piece: &Piece) -> Result<(Stripe<'_>, Vec<(Range<u64>, Source)>)> {
        let stripe = self
            .pool
            .extent_locks()
            .read(lock_key(self.volume, piece.extent))
            .await;
        let exists = self
            .pool
            .snapshot_epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(self.volume, self.epoch));
        if !exists {
            return Err(BlockError::InvalidArgument(format!(
                "snapshot {} was deleted",
                self.name
            )));
        }
        let ids = self.pool.chain_ids();
        let sources = (self.pool.store)
            .read(|state| ids.resolve(state, &self.reading, piece.extent, piece.granules()));
        Ok((stripe, sources))
    }
}

#[async_trait]
impl BlockDevice for SnapshotDevice {
    fn geometry(&self) -> Geometry {
        self.pool.device_geometry(self.size)
    }

    fn capabilities(&self) -> Capabilities {
        let child = self.pool.child.capabilities();
        Capabilities {
            read_only: true,
            rotational: child.rotational,
            ..Capabilities::default()
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry().check_range(offset, len as u64)?;
        let mut out = BytesMut::with_capacity(len);
        for piece in pieces(offset, len as u64, self.pool.extent_size()) {
            let (_stripe, sources) = self.sources(&piece).await?;
            self.pool.read_sources(&piece, &sources, &mut out).await?;
        }
        Ok(out)
    }

    async fn write(&self, offset: u64, data: Bytes, _flags: WriteFlags) -> Result<()> {
        self.geometry().check_range(offset, data.len() as u64)?;
        Err(BlockError::ReadOnly)
    }

    async fn flush(&self) -> Result<()> {
        Ok(())
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        Err(BlockError::ReadOnly)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, _flags: ZeroFlags) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        Err(BlockError::ReadOnly)
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry().check_range(offset, len)?;
        let mut extents = Vec::new();
        for piece in pieces(offset, len, self.pool.extent_size()) {
            let (_stripe, sources) = self.sources(&piece).await?;
            push_sources(&mut extents, offset, &piece, &sources);
        }
        Ok(extents)
    }
}
