//! A snapshot as a block device: read-only, readable while the volume is in use, holes
//! reported. It reads the volume's chains at the snapshot's epoch; extents a snapshot sees are
//! never written in place (`Lineage::shared_limit`), so its bytes cannot change under it.
//! Where the snapshot is compacted, the extent's delta gives the granules it covers
//! ([`crate::compact`]); the chains give the rest.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Extent, Geometry, Result, WriteFlags,
    ZeroFlags,
};

use crate::chain::{push_sources, Reading, Source};
use crate::compact::{Given, Restored};
use crate::map::{pieces, Piece, GRANULE};
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

/// Where a piece's granules come from: the chains, and a compacted extent's delta over them.
struct PieceSources {
    chains: Vec<(Range<u64>, Source)>,
    restored: Option<Restored>,
}

impl PieceSources {
    /// The chain source of granule `g`.
    fn chain(&self, g: u64) -> Source {
        (self.chains.iter())
            .find(|(run, _)| run.contains(&g))
            .map_or(Source::Zero, |(_, source)| *source)
    }
}

impl SnapshotDevice {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the piece's granules are read from, if the snapshot still exists, with the
    /// piece's stripe held so that a deletion's cleanup (or a compaction) cannot change them
    /// meanwhile.
    async fn sources(&self, piece: &Piece) -> Result<(Stripe<'_>, PieceSources)> {
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
        let chains = (self.pool.store)
            .read(|state| ids.resolve(state, &self.reading, piece.extent, piece.granules()));
        let restored = match self
            .pool
            .compacted_entry(self.volume, self.epoch, piece.extent)
        {
            Some(entry) => {
                let base =
                    (self.pool.compaction_base(self.volume, self.epoch)?).ok_or_else(|| {
                        BlockError::Corrupt(format!(
                            "snapshot {} has deltas but no compaction base",
                            self.name
                        ))
                    })?;
                let pool = &self.pool;
                Some(
                    pool.restore_compacted(&self.name, self.volume, base, piece.extent, entry)
                        .await?,
                )
            }
            None => None,
        };
        Ok((stripe, PieceSources { chains, restored }))
    }

    /// Appends a piece's bytes: the delta's granules where it has them, the chains' elsewhere.
    async fn read_piece(
        &self,
        piece: &Piece,
        sources: &PieceSources,
        out: &mut BytesMut,
    ) -> Result<()> {
        let Some(restored) = &sources.restored else {
            return self.pool.read_sources(piece, &sources.chains, out).await;
        };
        for g in piece.granules() {
            let start = (g * GRANULE).max(piece.within);
            let end = ((g + 1) * GRANULE).min(piece.within + piece.len);
            match restored.given(g) {
                Some(Given::Data(bytes)) => {
                    out.extend_from_slice(
                        &bytes[(start - g * GRANULE) as usize..(end - g * GRANULE) as usize],
                    );
                }
                Some(Given::Zeros) => out.resize(out.len() + (end - start) as usize, 0),
                None => {
                    let one = Piece {
                        within: start,
                        len: end - start,
                        ..*piece
                    };
                    self.pool
                        .read_sources(&one, &[(g..g + 1, sources.chain(g))], out)
                        .await?;
                }
            }
        }
        Ok(())
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
            self.read_piece(&piece, &sources, &mut out).await?;
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
            let runs = match &sources.restored {
                None => sources.chains,
                Some(restored) => (piece.granules())
                    .map(|g| {
                        let source = match restored.given(g) {
                            // Data the delta gives is reported as data, wherever it lies.
                            Some(Given::Data(_)) => Source::Data(u64::MAX),
                            Some(Given::Zeros) => Source::Zero,
                            None => sources.chain(g),
                        };
                        (g..g + 1, source)
                    })
                    .collect(),
            };
            push_sources(&mut extents, offset, &piece, &runs);
        }
        Ok(extents)
    }
}
