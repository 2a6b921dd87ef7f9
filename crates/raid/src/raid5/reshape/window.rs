//! Window arithmetic of the online grow A(m, n): the reordering window of Theorem 1, the
//! stripe-aligned sliding window ALV checkpoints by, and the critical section at the start
//! that no such window covers (ALV paper §1.2–1.4, §2.1).
//!
//! Chunk numbers are data chunks in logical order; a row is a stripe, the same offset on
//! every member. The old geometry has m members (m−1 data chunks per row), the new one m+n
//! (N1 = m+n−1 data chunks per row). Both are left-asymmetric, as [`Layout`] pins.
//!
//! Pure arithmetic; no I/O, no locks.

use crate::raid5::layout::Layout;

/// A(m, n): grow an m-member RAID-5 by n members (paper Definition 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grow {
    /// Members before the grow (≥ 3).
    pub m: usize,
    /// Members added (≥ 1).
    pub n: usize,
}

impl Grow {
    pub fn new(m: usize, n: usize) -> Grow {
        let grow = Grow { m, n };
        grow.check();
        grow
    }

    /// The fields are public, so every entry point re-checks them.
    fn check(&self) {
        assert!(
            self.m >= 3,
            "A({}, {}): RAID-5 needs 3 members",
            self.m,
            self.n
        );
        assert!(
            self.n >= 1,
            "A({}, {}): a grow adds a member",
            self.m,
            self.n
        );
    }

    /// Data chunks per old row: m − 1.
    pub fn old_data(&self) -> u64 {
        self.check();
        (self.m - 1) as u64
    }

    /// Data chunks per new row: N1 = m + n − 1.
    pub fn n1(&self) -> u64 {
        self.check();
        (self.m + self.n - 1) as u64
    }

    /// Placement in the old geometry. Chunk size and stripe count do not enter
    /// `locate`/`parity_member`, so a nominal 4 KiB chunk and no stripes stand in.
    pub fn old_layout(&self) -> Layout {
        self.check();
        Layout::new(self.m, 4096, 0, 0)
    }

    /// Placement in the new geometry (see [`Grow::old_layout`]).
    pub fn new_layout(&self) -> Layout {
        self.check();
        Layout::new(self.m + self.n, 4096, 0, 0)
    }

    /// R(m, n, x), Theorem 1 as stated (§1.3): from state S(m, n, x) (every chunk below x
    /// moved, none at or above), chunks [x, x + R) can be moved in any order without one
    /// overwriting another's old copy or being overwritten by new parity.
    pub fn reorder_window(&self, x: u64) -> u64 {
        let g = x / self.old_data();
        let r = x % self.old_data();
        let t = self.old_layout().parity_member(g) as u64;
        let t_new = self.new_layout().parity_member(g) as u64;
        // The four cases exactly as the theorem states them (hence `r + 1 <= t'`).
        #[allow(clippy::int_plus_one)]
        let delta: i64 = if r < t {
            if r <= t_new {
                0
            } else {
                -1
            }
        } else if r + 1 <= t_new {
            1
        } else {
            0
        };
        // δ = −1 needs r > t' ≥ 0, so r ≥ 1, so g ≥ 1 (row 0 has t = m−1 > r): never negative.
        let window = (self.n as u64 * g)
            .checked_add_signed(delta)
            .expect("Theorem 1 is never negative");
        debug_assert!(window <= self.n as u64 * g + 1);
        window
    }

    /// End of the stripe-aligned sliding window that a checkpoint at `ckpt` opens, or None
    /// when no whole new row fits in R(ckpt) from there.
    ///
    /// Aligning x + R(x) down to N1 gives N1·⌊c/(m−1)⌋: with c = g(m−1) + r, c + R = g·N1 +
    /// r + δ, and 0 ≤ r + δ < N1 (δ = −1 needs r ≥ 1; r + 1 ≤ m − 1 < N1). The window ends
    /// at the start of new row g, so it only ever writes new rows below old row g, whose old
    /// slots hold chunks below `ckpt`: old rows from g up stay intact until the next
    /// checkpoint (the row rule the engine's recovery and degraded reads rely on).
    pub fn sliding_end(&self, ckpt: u64) -> Option<u64> {
        let end = self.n1() * (ckpt / self.old_data());
        debug_assert_eq!(
            end,
            (ckpt + self.reorder_window(ckpt)) / self.n1() * self.n1()
        );
        (end > ckpt).then_some(end)
    }

    /// C: the first stripe-aligned checkpoint that opens a sliding window. Chunks 0..m−2
    /// never move; from chunk m − 1 to C the window is shorter than a new row (§1.4), so the
    /// engine moves [0, C) through a backup before ALV's windows take over.
    ///
    /// C = N1·k opens a window iff N1·⌊N1·k/(m−1)⌋ > N1·k iff k·n ≥ m − 1, so the least k is
    /// ⌈(m−1)/n⌉.
    pub fn critical_end(&self) -> u64 {
        let rows = self.old_data().div_ceil(self.n as u64);
        let end = self.n1() * rows;
        debug_assert!(self.sliding_end(end).is_some());
        debug_assert!(rows == 1 || self.sliding_end(end - self.n1()).is_none());
        end
    }

    /// Data chunks an array of `rows` old rows holds: rows·(m−1).
    pub fn chunks_before_grow(&self, rows: u64) -> u64 {
        rows.checked_mul(self.old_data())
            .expect("chunk count overflows u64")
    }

    /// `chunks` rounded up to a whole new row: where the last window of the moved data ends.
    pub fn round_up(&self, chunks: u64) -> u64 {
        chunks.div_ceil(self.n1()) * self.n1()
    }

    /// Aggregation window in chunks for a buffer of `buffer_bytes` per old member: as many
    /// old rows as the buffer holds, times m − 1 data chunks, rounded down to whole new rows
    /// (at least one). The paper's "2 MB per member disk" is ambiguous (§4): at 64 KiB
    /// chunks this gives 63 chunks for A(3,1), where Table 1's arithmetic fits 64.
    pub fn aggregation_chunks(&self, buffer_bytes: u64, chunk_bytes: u64) -> u64 {
        assert!(chunk_bytes > 0, "a chunk has bytes");
        let chunks = buffer_bytes / chunk_bytes * self.old_data();
        let window = (chunks / self.n1()).max(1) * self.n1();
        debug_assert!(window.is_multiple_of(self.n1()));
        window
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raid5::reshape::testkit;

    fn grows() -> impl Iterator<Item = Grow> {
        (3..=9).flat_map(|m| (1..=4).map(move |n| Grow::new(m, n)))
    }

    #[test]
    fn theorem_1_anchor_r_3_1_18_is_9() {
        let grow = Grow::new(3, 1);
        assert_eq!(grow.reorder_window(18), 9);
        assert_eq!(grow.reorder_window(17), 9);
        assert_eq!(grow.reorder_window(20), 10);
    }

    /// The digest's R(3,1,x) for x = 0..=100 (§1.3), computed there from Theorem 1.
    #[test]
    fn theorem_1_matches_the_digest_vector_for_a_3_1() {
        let expected: Vec<u64> = "0 0 1 2 3 2 3 2 4 5 6 6 6 6 7 7 9 9 9 9 10 \
            10 11 11 12 12 13 14 15 14 15 14 16 17 18 18 18 18 19 19 21 \
            21 21 21 22 22 23 23 24 24 25 26 27 26 27 26 28 29 30 30 30 \
            30 31 31 33 33 33 33 34 34 35 35 36 36 37 38 39 38 39 38 40 \
            41 42 42 42 42 43 43 45 45 45 45 46 46 47 47 48 48 49 50 51"
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(expected.len(), 101);
        let grow = Grow::new(3, 1);
        let got: Vec<u64> = (0..=100).map(|x| grow.reorder_window(x)).collect();
        assert_eq!(got, expected);
    }

    /// Fig. 1 state 3: from x = 6, chunks 6, 7, 8 form a window, and chunk 9 would land on
    /// chunk 7's old slot.
    #[test]
    fn fig_1_state_3_window_stops_before_chunk_9() {
        let grow = Grow::new(3, 1);
        assert_eq!(grow.reorder_window(6), 3);
        assert_eq!(
            grow.new_layout().locate(9),
            grow.old_layout().locate(7),
            "9's new slot is 7's old slot"
        );
        assert_ne!(grow.new_layout().locate(8), grow.old_layout().locate(7));
    }

    /// Chunks 0..m−2 never move (R = 0); the first to move is m − 1, with R = n.
    #[test]
    fn degenerate_start_first_movable_chunk_has_window_n() {
        for grow in grows() {
            for x in 0..grow.old_data() {
                assert_eq!(grow.reorder_window(x), 0, "{grow:?} x={x}");
                assert_eq!(grow.new_layout().locate(x), grow.old_layout().locate(x));
            }
            let first = grow.old_data();
            assert_eq!(grow.reorder_window(first), grow.n as u64, "{grow:?}");
            assert_ne!(
                grow.new_layout().locate(first),
                grow.old_layout().locate(first)
            );
        }
    }

    /// Theorem 1 is safe but not always maximal: R(3,1,13) = 6 where 7 would do, R(3,1,14)
    /// = 7 where 8 would (§1.3); and never above the brute-forced maximum anywhere.
    #[test]
    fn theorem_1_is_safe_and_sometimes_conservative() {
        let grow = Grow::new(3, 1);
        assert_eq!(grow.reorder_window(13), 6);
        assert_eq!(testkit::max_safe_window(grow, 13), 7);
        assert_eq!(grow.reorder_window(14), 7);
        assert_eq!(testkit::max_safe_window(grow, 14), 8);
        let mut conservative = 0;
        for grow in grows() {
            for x in grow.old_data()..400 {
                let best = testkit::max_safe_window(grow, x);
                let r = grow.reorder_window(x);
                assert!(r <= best, "{grow:?} x={x}: R={r} > safe {best}");
                conservative += usize::from(r < best);
            }
        }
        // 11,060 cases; the digest counted 382 conservative ones with a slightly different
        // treatment of parity, this brute force 389.
        assert_eq!(conservative, 389);
    }

    #[test]
    fn sliding_end_equals_aligned_reordering_end() {
        for grow in grows() {
            for c in 0..4000 {
                let aligned = (c + grow.reorder_window(c)) / grow.n1() * grow.n1();
                let end = grow.n1() * (c / grow.old_data());
                assert_eq!(end, aligned, "{grow:?} c={c}");
                assert_eq!(grow.sliding_end(c), (end > c).then_some(end));
                if let Some(e) = grow.sliding_end(c) {
                    assert!(e - c <= grow.reorder_window(c), "{grow:?} c={c}");
                }
            }
        }
    }

    /// §1.4's starts: 6 for A(3,1), 20 for A(5,1), 42 for A(7,1), 72 for A(9,1).
    #[test]
    fn critical_end_pins_the_digest_values() {
        assert_eq!(Grow::new(3, 1).critical_end(), 6);
        assert_eq!(Grow::new(5, 1).critical_end(), 20);
        assert_eq!(Grow::new(7, 1).critical_end(), 42);
        assert_eq!(Grow::new(9, 1).critical_end(), 72);
        assert_eq!(Grow::new(4, 2).critical_end(), 10);
        assert_eq!(Grow::new(9, 4).critical_end(), 24);
    }

    /// No aligned checkpoint below C opens a window; C and everything after it does.
    #[test]
    fn critical_end_is_the_first_aligned_checkpoint_with_a_window() {
        for grow in grows() {
            let c = grow.critical_end();
            assert!(c.is_multiple_of(grow.n1()));
            for below in (0..c).step_by(grow.n1() as usize) {
                assert_eq!(grow.sliding_end(below), None, "{grow:?} at {below}");
            }
            for ckpt in c..c + 3000 {
                let end = grow.sliding_end(ckpt);
                assert!(end.is_some_and(|e| e > ckpt), "{grow:?} at {ckpt}");
            }
        }
    }

    #[test]
    fn chunks_before_grow_are_whole_old_rows() {
        for grow in grows() {
            let chunks = grow.chunks_before_grow(10);
            assert_eq!(chunks, 10 * (grow.m as u64 - 1));
            assert_eq!(grow.old_layout().locate(chunks - 1).0, 9);
            assert_eq!(grow.old_layout().locate(chunks).0, 10);
        }
    }

    /// One checkpoint per sliding window, no user writes, from C to the end of A(3,1)'s
    /// 983,040 chunks (two 30 GiB data members at 64 KiB): the windows grow by about 3/2
    /// each (N1/(m−1)), so their count is logarithmic in the volume.
    #[test]
    fn a_3_1_over_983040_chunks_takes_31_sliding_windows() {
        let grow = Grow::new(3, 1);
        let windows = testkit::sliding_windows(grow, 983_040);
        assert!(
            (25..=35).contains(&windows),
            "A(3,1) over 983,040 chunks: {windows} sliding windows (paper Table 1: 28)"
        );
        assert_eq!(windows, 31, "sliding windows for A(3,1), 983,040 chunks");
        // Logarithmic: doubling the volume adds about log(2)/log(1.5) ≈ 1.7 windows.
        let doubled = testkit::sliding_windows(grow, 2 * 983_040);
        assert!((windows + 1..=windows + 2).contains(&doubled), "{doubled}");
        assert_eq!(testkit::sliding_windows(Grow::new(9, 1), 983_040), 85);
    }

    #[test]
    fn aggregation_chunks_round_down_to_whole_new_rows() {
        let grow = Grow::new(3, 1);
        assert_eq!(grow.aggregation_chunks(2 << 20, 64 << 10), 63);
        assert_eq!(grow.aggregation_chunks(0, 64 << 10), 3);
        assert_eq!(Grow::new(5, 1).aggregation_chunks(2 << 20, 64 << 10), 125);
        assert_eq!(grow.round_up(983_041), 983_043);
        assert_eq!(grow.round_up(983_040), 983_040);
    }

    #[test]
    #[should_panic(expected = "needs 3 members")]
    fn two_members_are_refused() {
        Grow { m: 2, n: 1 }.n1();
    }
}
