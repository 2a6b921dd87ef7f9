//! Address arithmetic of a thin volume: how a request splits into extents and granules.
//! Pure functions, so the data path and the tests agree on them by construction.

use strata_core::split::split_at_units;

/// Liveness is tracked per granule inside each extent, so a partly discarded extent hides its
/// dead parts and an extent whose every granule is dead goes back to the pool.
pub const GRANULE: u64 = 4096;

/// The part of a request that falls in one extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Virtual extent number within the volume.
    pub extent: u64,
    /// Byte offset inside the extent.
    pub within: u64,
    pub len: u64,
    /// Byte offset of this piece inside the request.
    pub done: u64,
}

impl Piece {
    /// Granules this piece touches, as a range of granule numbers inside the extent.
    pub fn granules(&self) -> std::ops::Range<u64> {
        self.within / GRANULE..(self.within + self.len).div_ceil(GRANULE)
    }

    /// Granules this piece covers completely.
    pub fn whole_granules(&self) -> std::ops::Range<u64> {
        let first = self.within.div_ceil(GRANULE);
        let end = (self.within + self.len) / GRANULE;
        first..end.max(first)
    }
}

/// Splits `[offset, offset + len)` at extent boundaries.
pub fn pieces(offset: u64, len: u64, extent_size: u64) -> impl Iterator<Item = Piece> {
    assert!(extent_size.is_power_of_two() && extent_size >= GRANULE);
    split_at_units(offset, len, extent_size).map(|piece| Piece {
        extent: piece.unit,
        within: piece.within,
        len: piece.len,
        done: piece.done,
    })
}

/// Maximal runs of granules in `range` with the same value of `live(g)`, as
/// `(granule range, live)`.
pub fn runs(
    range: std::ops::Range<u64>,
    live: impl Fn(u64) -> bool,
) -> Vec<(std::ops::Range<u64>, bool)> {
    let mut out: Vec<(std::ops::Range<u64>, bool)> = Vec::new();
    for granule in range {
        let value = live(granule);
        match out.last_mut() {
            Some((run, run_value)) if *run_value == value && run.end == granule => run.end += 1,
            _ => out.push((granule..granule + 1, value)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_at_extent_boundaries() {
        let extent = 64 * 1024;
        let got: Vec<Piece> = pieces(60 * 1024, 72 * 1024, extent).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0],
            Piece {
                extent: 0,
                within: 60 * 1024,
                len: 4096,
                done: 0
            }
        );
        assert_eq!(
            got[1],
            Piece {
                extent: 1,
                within: 0,
                len: extent,
                done: 4096
            }
        );
        assert_eq!(got[2].extent, 2);
        assert_eq!(got[2].len, 4096);
        assert_eq!(got.iter().map(|p| p.len).sum::<u64>(), 72 * 1024);
    }

    #[test]
    fn granule_ranges_cover_and_contain() {
        let at_512 = |len| Piece {
            extent: 0,
            within: 512,
            len,
            done: 0,
        };
        let piece = at_512(8192);
        assert_eq!(piece.granules(), 0..3);
        assert_eq!(piece.whole_granules(), 1..2);
        let small = at_512(512);
        assert_eq!(small.granules(), 0..1);
        assert!(small.whole_granules().is_empty());
    }

    #[test]
    fn runs_merge_equal_neighbours() {
        let got = runs(0..6, |g| g == 2 || g == 3);
        assert_eq!(got, vec![(0..2, false), (2..4, true), (4..6, false)]);
    }
}
