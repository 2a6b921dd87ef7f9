//! Where a data chunk lives: the left-asymmetric RAID-5 layout (ALV paper §1.1).
//!
//! Data chunks are numbered in logical (RAID-0) order. Stripe `g` holds `k - 1` data chunks
//! and one parity chunk at the same offset (`g * chunk`) of every member. Parity rotates from
//! the last member downwards (`t = (k-1) - g mod k`); data fill the other members left to
//! right, always starting at member 0 (unlike left-symmetric, they do not restart after the
//! parity member). This module is pure arithmetic so that it can be pinned by the paper's
//! table; nothing here does I/O.

use strata_core::split::split_at_units;

/// The shape of an array: member count, chunk size, where data start on each member and how
/// many stripes fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Members (k ≥ 3).
    pub members: usize,
    pub chunk_bytes: u64,
    /// Byte offset of stripe 0 on every member (after the metadata region and the journal).
    pub data_start: u64,
    pub stripes: u64,
}

impl Layout {
    pub fn new(members: usize, chunk_bytes: u64, data_start: u64, stripes: u64) -> Layout {
        assert!(members >= 3, "raid5 needs at least 3 members");
        assert!(chunk_bytes.is_power_of_two() && chunk_bytes >= 4096);
        assert!(data_start.is_multiple_of(chunk_bytes));
        Layout {
            members,
            chunk_bytes,
            data_start,
            stripes,
        }
    }

    /// Data chunks per stripe.
    pub fn data_chunks(&self) -> usize {
        self.members - 1
    }

    /// Bytes of data per stripe.
    pub fn stripe_bytes(&self) -> u64 {
        self.chunk_bytes * self.data_chunks() as u64
    }

    /// Bytes the array exports.
    pub fn size(&self) -> u64 {
        self.stripes * self.stripe_bytes()
    }

    /// The member holding the parity of `stripe`: t = (k-1) - (g mod k).
    pub fn parity_member(&self, stripe: u64) -> usize {
        let k = self.members as u64;
        let t = (k - 1) - stripe % k;
        debug_assert!(t < k);
        t as usize
    }

    /// The member holding data chunk `r` (0-based within the stripe) of `stripe`:
    /// r if r < t, else r + 1 (the parity chunk precedes it).
    pub fn data_member(&self, stripe: u64, r: usize) -> usize {
        assert!(r < self.data_chunks());
        let t = self.parity_member(stripe);
        if r < t {
            r
        } else {
            r + 1
        }
    }

    /// The inverse of [`Layout::data_member`]: which data chunk `member` holds in `stripe`,
    /// or None for the parity member.
    pub fn data_index(&self, stripe: u64, member: usize) -> Option<usize> {
        let t = self.parity_member(stripe);
        match member.cmp(&t) {
            std::cmp::Ordering::Less => Some(member),
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => Some(member - 1),
        }
    }

    /// Logical data chunk `x` → (stripe, member).
    pub fn locate(&self, x: u64) -> (u64, usize) {
        let per = self.data_chunks() as u64;
        let stripe = x / per;
        let member = self.data_member(stripe, (x % per) as usize);
        (stripe, member)
    }

    /// Byte offset on a member of byte `within` of `stripe`'s chunk.
    pub fn member_offset(&self, stripe: u64, within: u64) -> u64 {
        debug_assert!(within <= self.chunk_bytes && stripe < self.stripes);
        self.data_start + stripe * self.chunk_bytes + within
    }

    /// Splits an array range into per-stripe pieces: (stripe, offset within the stripe's
    /// data, length, offset within the request).
    pub fn split(&self, offset: u64, len: u64) -> Vec<(u64, u64, u64, u64)> {
        split_at_units(offset, len, self.stripe_bytes())
            .map(|piece| (piece.unit, piece.within, piece.len, piece.done))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's table for A(3,1) (§1.1): rows 0–9 of the 3-disk layout (Fig. 1 state 0)
    /// and of the 4-disk layout. `P` marks parity; numbers are data chunks.
    fn table(k: usize) -> Vec<Vec<Option<u64>>> {
        let layout = Layout::new(k, 4096, 0, 10);
        let mut rows = vec![vec![None; 10]; k];
        for x in 0..(10 * (k as u64 - 1)) {
            let (g, d) = layout.locate(x);
            rows[d][g as usize] = Some(x);
        }
        for g in 0..10 {
            assert_eq!(rows[layout.parity_member(g)][g as usize], None);
        }
        rows
    }

    fn parse(line: &str) -> Vec<Option<u64>> {
        line.split_whitespace()
            .map(|cell| cell.parse().ok())
            .collect()
    }

    #[test]
    fn three_disks_match_the_paper() {
        let expected = [
            parse("0 2 P 6 8 P 12 14 P 18"),
            parse("1 P 4 7 P 10 13 P 16 19"),
            parse("P 3 5 P 9 11 P 15 17 P"),
        ];
        assert_eq!(table(3), expected);
    }

    #[test]
    fn four_disks_match_the_paper() {
        let expected = [
            parse("0 3 6 P 12 15 18 P 24 27"),
            parse("1 4 P 9 13 16 P 21 25 28"),
            parse("2 P 7 10 14 P 19 22 26 P"),
            parse("P 5 8 11 P 17 20 23 P 29"),
        ];
        assert_eq!(table(4), expected);
    }

    #[test]
    fn data_index_inverts_data_member() {
        for k in 3..8 {
            let layout = Layout::new(k, 4096, 0, 40);
            for g in 0..40 {
                let mut seen = 0;
                for m in 0..k {
                    match layout.data_index(g, m) {
                        Some(r) => {
                            assert_eq!(layout.data_member(g, r), m);
                            seen += 1;
                        }
                        None => assert_eq!(layout.parity_member(g), m),
                    }
                }
                assert_eq!(seen, k - 1);
            }
        }
    }

    #[test]
    fn split_cuts_at_stripe_boundaries() {
        let layout = Layout::new(4, 4096, 0, 10);
        assert_eq!(layout.stripe_bytes(), 12288);
        let pieces = layout.split(12000, 13000);
        assert_eq!(
            pieces,
            vec![(0, 12000, 288, 0), (1, 0, 12288, 288), (2, 0, 424, 12576)]
        );
        assert_eq!(layout.split(0, 0), vec![]);
    }
}
