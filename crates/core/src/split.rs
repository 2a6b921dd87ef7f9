//! Cutting a byte range at fixed-size boundaries: pages of a page store, extents of a thin
//! volume, stripes of a RAID-5, sectors of a simulated write. One loop, so the arithmetic
//! (and its edge at the end of the range) is written and tested once.

/// The part of a range that falls in one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitPiece {
    /// Which unit: `offset / unit_size`.
    pub unit: u64,
    /// Byte offset inside the unit.
    pub within: u64,
    pub len: u64,
    /// Byte offset of this piece inside the range.
    pub done: u64,
}

/// Splits `[offset, offset + len)` at multiples of `unit_size`, in order; nothing for an
/// empty range.
pub fn split_at_units(offset: u64, len: u64, unit_size: u64) -> impl Iterator<Item = UnitPiece> {
    assert!(unit_size > 0, "unit size 0");
    let end = offset.checked_add(len).expect("range end overflows u64");
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let within = at % unit_size;
        let piece = UnitPiece {
            unit: at / unit_size,
            within,
            len: (unit_size - within).min(end - at),
            done: at - offset,
        };
        at += piece.len;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_range_across_two_boundaries_has_three_pieces() {
        let pieces: Vec<UnitPiece> = split_at_units(1000, 5000, 2048).collect();
        let piece = |unit, within, len, done| UnitPiece {
            unit,
            within,
            len,
            done,
        };
        assert_eq!(
            pieces,
            vec![
                piece(0, 1000, 1048, 0),
                piece(1, 0, 2048, 1048),
                piece(2, 0, 1904, 3096)
            ]
        );
        assert_eq!(split_at_units(4096, 0, 512).count(), 0);
    }

    proptest! {
        #[test]
        fn pieces_tile_the_range_and_stay_in_their_unit(
            offset in 0u64..1 << 40, len in 0u64..1 << 20, shift in 0u32..20,
        ) {
            let unit = 1u64 << shift;
            let mut expected_done = 0;
            for piece in split_at_units(offset, len, unit) {
                prop_assert_eq!(piece.done, expected_done);
                prop_assert_eq!(piece.unit * unit + piece.within, offset + piece.done);
                prop_assert!(piece.len > 0 && piece.within + piece.len <= unit);
                expected_done += piece.len;
            }
            prop_assert_eq!(expected_done, len);
        }
    }
}
