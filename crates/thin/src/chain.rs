//! Where each granule of a version lives: a walk down the chains of the pool's records.
//!
//! A version is read through a list of *layers*: the volume's own map at the version's epoch,
//! then, for a clone, its origin's map at the epoch it was cloned from, and so on. In each
//! layer, a virtual extent's chain (the map's newest extent, then `history` links to older
//! ones) is walked newest first, skipping extents the version does not see
//! ([`Lineage::sees`]); the first extent that defines a granule (live: data; masked: zeros)
//! decides it. A granule no layer defines is a hole.

use std::ops::Range;
use std::sync::Arc;

use strata_core::{push_extent, Extent, ExtentState};
use strata_meta::{ObjectId, State};

use crate::map::{Piece, GRANULE};

use crate::records::History;
use crate::versions::{Epoch, Lineage};

/// One map read at one epoch.
#[derive(Clone, Debug)]
pub struct Layer {
    pub map: ObjectId,
    pub lineage: Lineage,
    pub at: Epoch,
}

/// How a version is read: its layers, newest first (the volume's own, then its bases').
pub type Reading = Arc<Vec<Layer>>;

/// Where a run of granules is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Bytes of this physical extent.
    Data(u64),
    /// Zeros: a hole, or granules an extent defines as zeros.
    Zero,
}

/// The object ids a walk needs.
#[derive(Clone, Copy, Debug)]
pub struct ChainIds {
    pub live: ObjectId,
    /// None in a pool that never had versions: every chain is one extent long.
    pub history: Option<ObjectId>,
    pub masked: Option<ObjectId>,
    pub granules_per_extent: u64,
}

impl ChainIds {
    /// The newest extent of `extent`'s chain in `map`, if it is mapped.
    pub fn head(&self, state: &State, map: ObjectId, extent: u64) -> Option<u64> {
        (state.table(map)?.get_u32(extent) as u64).checked_sub(1)
    }

    /// A physical extent's epoch and older link.
    pub fn history(&self, state: &State, phys: u64) -> History {
        let table = self.history.and_then(|id| state.table(id));
        History::decode(table.and_then(|t| t.get(phys)))
    }

    /// Whether `phys` defines granule `g` as zeros.
    pub fn masked(&self, state: &State, phys: u64, g: u64) -> bool {
        let bitmap = self.masked.and_then(|id| state.bitmap(id));
        bitmap.is_some_and(|b| b.get(phys * self.granules_per_extent + g))
    }

    /// The extents of a chain, newest first, with their history.
    pub fn chain(&self, state: &State, map: ObjectId, extent: u64) -> Vec<(u64, History)> {
        let mut out = Vec::new();
        let mut next = self.head(state, map, extent);
        while let Some(phys) = next {
            let history = self.history(state, phys);
            out.push((phys, history));
            next = history.older;
        }
        out
    }

    /// Where each granule of `granules` (within one virtual extent) is read from, in runs.
    pub fn resolve(
        &self,
        state: &State,
        reading: &[Layer],
        extent: u64,
        granules: Range<u64>,
    ) -> Vec<(Range<u64>, Source)> {
        let live = state.bitmap(self.live).expect("pool live bitmap");
        let count = (granules.end - granules.start) as usize;
        let mut found: Vec<Option<Source>> = vec![None; count];
        let mut left = count;
        'layers: for layer in reading {
            let mut next = self.head(state, layer.map, extent);
            while let Some(phys) = next {
                let history = self.history(state, phys);
                if layer.lineage.sees(layer.at, history.epoch) {
                    let first = phys * self.granules_per_extent;
                    for (slot, g) in found.iter_mut().zip(granules.clone()) {
                        if slot.is_some() {
                            continue;
                        }
                        if live.get(first + g) {
                            *slot = Some(Source::Data(phys));
                        } else if self.masked(state, phys, g) {
                            *slot = Some(Source::Zero);
                        } else {
                            continue;
                        }
                        left -= 1;
                    }
                    if left == 0 {
                        break 'layers;
                    }
                }
                next = history.older;
            }
        }
        let mut runs: Vec<(Range<u64>, Source)> = Vec::new();
        for (g, source) in granules.zip(found) {
            let source = source.unwrap_or(Source::Zero);
            match runs.last_mut() {
                Some((run, last)) if *last == source && run.end == g => run.end += 1,
                _ => runs.push((g..g + 1, source)),
            }
        }
        runs
    }
}

/// Appends a piece's runs as block-status extents (data, or a hole for zeros) to `extents`;
/// `offset` is where the request the piece belongs to starts.
pub fn push_sources(
    extents: &mut Vec<Extent>,
    offset: u64,
    piece: &Piece,
    sources: &[(Range<u64>, Source)],
) {
    for (granules, source) in sources {
        let start = (granules.start * GRANULE).max(piece.within);
        let end = (granules.end * GRANULE).min(piece.within + piece.len);
        let state = match source {
            Source::Data(_) => ExtentState::Data,
            Source::Zero => ExtentState::Hole,
        };
        push_extent(
            extents,
            Extent {
                offset: offset + piece.done + (start - piece.within),
                len: end - start,
                state,
            },
        );
    }
}
