//! A snapshot as a block device: read-only, readable while the volume is in use, holes
//! reported. It reads the volume's chains at the snapshot's epoch; extents a snapshot sees are
//! never written in place (`Lineage::shared_limit`), so its bytes cannot change under it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, push_extent, BlockDevice, BlockError, Capabilities, Extent, ExtentState, Geometry,
    Result, WriteFlags, ZeroFlags,
};

use crate::chain::{Reading, Source};
use crate::map::{pieces, Piece, GRANULE};
use crate::pool::{lock_key, ThinPool};
use crate::versions::Epoch;

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

    /// Where the piece's granules are read from, if the snapshot still exists. The caller
    /// holds the piece's stripe, so a deletion's cleanup cannot free them meanwhile.
    fn sources(&self, piece: &Piece) -> Result<Vec<(std::ops::Range<u64>, Source)>> {
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
        Ok(self
            .pool
            .store
            .read(|state| ids.resolve(state, &self.reading, piece.extent, piece.granules())))
    }
}

#[async_trait]
impl BlockDevice for SnapshotDevice {
    fn geometry(&self) -> Geometry {
        let child = self.pool.child.geometry();
        Geometry {
            size: self.size,
            min_io: child.min_io.max(512),
            logical_block: 512,
            physical_block: 4096,
            preferred_io: GRANULE as u32,
            max_io: child.max_io.min(32 << 20),
        }
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
            let _shared = self
                .pool
                .extent_locks()
                .read(lock_key(self.volume, piece.extent))
                .await;
            let sources = self.sources(&piece)?;
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
            let _shared = self
                .pool
                .extent_locks()
                .read(lock_key(self.volume, piece.extent))
                .await;
            for (granules, source) in self.sources(&piece)? {
                let start = (granules.start * GRANULE).max(piece.within);
                let end = (granules.end * GRANULE).min(piece.within + piece.len);
                let state = match source {
                    Source::Data(_) => ExtentState::Data,
                    Source::Zero => ExtentState::Hole,
                };
                push_extent(
                    &mut extents,
                    Extent {
                        offset: offset + piece.done + (start - piece.within),
                        len: end - start,
                        state,
                    },
                );
            }
        }
        Ok(extents)
    }
}
