//! Aggregated window I/O (ALV paper §2.2): an aggregation window [lo, hi) of whole new
//! rows is read with at most one I/O per old member and written with exactly one I/O per
//! new member. Because the window is whole new rows, every write is a full-stripe write:
//! new parity is the XOR of new data only, and no old data or old parity is read for it.
//!
//! Inside a window every chunk may move in any order (Theorem 1, and the row rule of
//! `window`), which is what lets all reads finish before any write starts. Pure: the engine
//! issues the I/O that [`window_io`] lists and hands the buffers to [`shuffle`].

use super::window::Grow;

/// A contiguous run of rows on one member: one I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberRows {
    pub member: usize,
    pub first_row: u64,
    pub rows: u64,
}

impl MemberRows {
    /// One past the last row.
    pub fn end_row(&self) -> u64 {
        self.first_row + self.rows
    }
}

/// The member I/O that moves one aggregation window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowIo {
    /// Old geometry, one per old member holding a chunk of the window, by member. A range
    /// may read through old parity between the chunks it needs (discarded by `shuffle`).
    pub reads: Vec<MemberRows>,
    /// New geometry, one per member 0..m+n, new rows lo/N1 .. hi/N1, data and parity.
    pub writes: Vec<MemberRows>,
}

fn check_window(grow: Grow, lo: u64, hi: u64) {
    let n1 = grow.n1();
    assert!(lo < hi, "empty window [{lo}, {hi})");
    assert!(
        lo.is_multiple_of(n1),
        "window start {lo} is not a new row (N1 = {n1})"
    );
    assert!(
        hi.is_multiple_of(n1),
        "window end {hi} is not a new row (N1 = {n1})"
    );
}

/// The chunk `member` holds in old row `row`, if it holds data there.
fn old_chunk(grow: Grow, member: usize, row: u64) -> Option<u64> {
    let r = grow.old_layout().data_index(row, member)?;
    Some(row * grow.old_data() + r as u64)
}

/// The reads and writes that move [lo, hi) (multiples of N1). Chunks at or above
/// `old_total` were never written: they are not read, and are written as zeros.
pub fn window_io(grow: Grow, lo: u64, hi: u64, old_total: u64) -> WindowIo {
    check_window(grow, lo, hi);
    let data_hi = hi.min(old_total);
    let mut reads = Vec::with_capacity(grow.m);
    if lo < data_hi {
        let first = lo / grow.old_data();
        let last = (data_hi - 1) / grow.old_data();
        let wanted = |member: usize, row: u64| {
            old_chunk(grow, member, row).is_some_and(|x| (lo..data_hi).contains(&x))
        };
        for member in 0..grow.m {
            // Only the first and last rows are partial, and a member misses at most its
            // parity row in between, so both scans stop within a few rows.
            let Some(top) = (first..=last).find(|&row| wanted(member, row)) else {
                continue;
            };
            let bottom = (top..=last).rev().find(|&row| wanted(member, row)).unwrap();
            reads.push(MemberRows {
                member,
                first_row: top,
                rows: bottom - top + 1,
            });
        }
    }
    let writes: Vec<MemberRows> = (0..grow.m + grow.n)
        .map(|member| MemberRows {
            member,
            first_row: lo / grow.n1(),
            rows: (hi - lo) / grow.n1(),
        })
        .collect();
    assert!(reads.len() <= grow.m);
    assert_eq!(writes.len(), grow.m + grow.n);
    WindowIo { reads, writes }
}

/// Rearranges the buffers of [`window_io`]'s reads (in the order of `reads`) into one buffer
/// per write (in the order of `writes`): each new data chunk in its slot, zeros for chunks
/// at or above `old_total`, and each new row's parity the XOR of that row's new data.
pub fn shuffle(
    grow: Grow,
    lo: u64,
    hi: u64,
    old_total: u64,
    reads: &[Vec<u8>],
    chunk_bytes: usize,
) -> Vec<Vec<u8>> {
    assert!(chunk_bytes > 0, "a chunk has bytes");
    let io = window_io(grow, lo, hi, old_total);
    assert_eq!(reads.len(), io.reads.len(), "one buffer per read range");
    for (buf, range) in reads.iter().zip(&io.reads) {
        assert_eq!(
            buf.len() as u64,
            range.rows * chunk_bytes as u64,
            "{range:?}"
        );
    }
    let (old, new) = (grow.old_layout(), grow.new_layout());
    let first_row = lo / grow.n1();
    let rows = (hi - lo) / grow.n1();
    let mut out = vec![vec![0u8; rows as usize * chunk_bytes]; grow.m + grow.n];
    for x in lo..hi.min(old_total) {
        let (old_row, old_member) = old.locate(x);
        let range = io.reads.iter().position(|r| r.member == old_member);
        let range = range.expect("window_io reads every member holding a chunk");
        let src = (old_row - io.reads[range].first_row) as usize * chunk_bytes;
        let (new_row, new_member) = new.locate(x);
        let dst = (new_row - first_row) as usize * chunk_bytes;
        out[new_member][dst..dst + chunk_bytes]
            .copy_from_slice(&reads[range][src..src + chunk_bytes]);
    }
    for row in first_row..first_row + rows {
        let parity = new.parity_member(row);
        let at = (row - first_row) as usize * chunk_bytes;
        let mut sum = vec![0u8; chunk_bytes];
        for (member, buf) in out.iter().enumerate() {
            if member != parity {
                sum.iter_mut()
                    .zip(&buf[at..at + chunk_bytes])
                    .for_each(|(s, b)| *s ^= b);
            }
        }
        out[parity][at..at + chunk_bytes].copy_from_slice(&sum);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn rows(member: usize, first_row: u64, last_row: u64) -> MemberRows {
        MemberRows {
            member,
            first_row,
            rows: last_row - first_row + 1,
        }
    }

    /// Figs. 6–7: S(3,1,18), window 18..27. Reads disk 0 {18,20,24,26} = rows 9..=13 (with
    /// P11), disk 1 {19,22,25} = rows 9..=12 (with P10), disk 2 {21,23} = rows 10..=11;
    /// writes rows 6..=8 on all four.
    #[test]
    fn s_3_1_18_reads_three_ranges_and_writes_four() {
        let grow = Grow::new(3, 1);
        let io = window_io(grow, 18, 27, 1000);
        assert_eq!(
            io.reads,
            vec![rows(0, 9, 13), rows(1, 9, 12), rows(2, 10, 11)]
        );
        assert_eq!(io.writes, (0..4).map(|m| rows(m, 6, 8)).collect::<Vec<_>>());
        // The chunks each read range covers, as the paper lists them.
        let covered = |r: &MemberRows| -> Vec<u64> {
            (r.first_row..r.end_row())
                .filter_map(|row| old_chunk(grow, r.member, row))
                .collect()
        };
        assert_eq!(covered(&io.reads[0]), vec![18, 20, 24, 26]);
        assert_eq!(covered(&io.reads[1]), vec![19, 22, 25]);
        assert_eq!(covered(&io.reads[2]), vec![21, 23]);
    }

    /// §2.2: with a 6-chunk aggregation window the nine chunks take 3 + 2 reads and 4 + 4
    /// writes; the first read is {18, 20}.
    #[test]
    fn six_chunk_aggregation_takes_five_reads_and_eight_writes() {
        let grow = Grow::new(3, 1);
        let first = window_io(grow, 18, 24, 1000);
        let second = window_io(grow, 24, 27, 1000);
        assert_eq!(
            first.reads,
            vec![rows(0, 9, 10), rows(1, 9, 11), rows(2, 10, 11)]
        );
        assert_eq!(second.reads, vec![rows(0, 12, 13), rows(1, 12, 12)]);
        assert_eq!(first.reads.len() + second.reads.len(), 5);
        assert_eq!(first.writes.len() + second.writes.len(), 8);
        assert_eq!(first.writes[0], rows(0, 6, 7));
    }

    /// Chunks at or above the old end are neither read nor (as data) present.
    #[test]
    fn window_past_the_old_data_reads_only_what_exists() {
        let grow = Grow::new(3, 1);
        assert_eq!(
            window_io(grow, 18, 27, 20).reads,
            vec![rows(0, 9, 9), rows(1, 9, 9)]
        );
        assert_eq!(window_io(grow, 18, 27, 18).reads, vec![]);
        assert_eq!(window_io(grow, 18, 27, 18).writes.len(), 4);
    }

    #[test]
    #[should_panic(expected = "not a new row")]
    fn unaligned_window_is_refused() {
        window_io(Grow::new(3, 1), 18, 26, 1000);
    }

    fn chunk_data(x: u64, chunk_bytes: usize) -> Vec<u8> {
        (0..chunk_bytes)
            .map(|i| (x.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8 + 1)
            .collect()
    }

    /// Old members as slots; old parity is garbage, to prove shuffle never uses it.
    fn old_slot(grow: Grow, member: usize, row: u64, old_total: u64, bytes: usize) -> Vec<u8> {
        match old_chunk(grow, member, row) {
            Some(x) if x < old_total => chunk_data(x, bytes),
            Some(_) => vec![0; bytes],
            None => vec![0xEE; bytes],
        }
    }

    proptest! {
        /// Shuffled buffers, placed in the new layout, hold every chunk's bytes (zeros past
        /// the old end), and every new row's parity XORs to zero.
        #[test]
        fn shuffle_places_every_chunk_and_parity(
            m in 3usize..=9, n in 1usize..=4, first_row in 0u64..200, rows in 1u64..12,
            tail in 0u64..40, chunk_bytes in 1usize..24,
        ) {
            let grow = Grow::new(m, n);
            let (lo, hi) = (first_row * grow.n1(), (first_row + rows) * grow.n1());
            let old_total = (hi + 20).saturating_sub(tail);
            let io = window_io(grow, lo, hi, old_total);
            let reads: Vec<Vec<u8>> = io.reads.iter().map(|r| {
                (r.first_row..r.end_row())
                    .flat_map(|row| old_slot(grow, r.member, row, old_total, chunk_bytes))
                    .collect()
            }).collect();
            let out = shuffle(grow, lo, hi, old_total, &reads, chunk_bytes);
            prop_assert_eq!(out.len(), io.writes.len());
            let mut slots: HashMap<(usize, u64), &[u8]> = HashMap::new();
            for (w, buf) in io.writes.iter().zip(&out) {
                prop_assert_eq!(buf.len() as u64, w.rows * chunk_bytes as u64);
                for (i, row) in (w.first_row..w.end_row()).enumerate() {
                    slots.insert((w.member, row), &buf[i * chunk_bytes..(i + 1) * chunk_bytes]);
                }
            }
            let new = grow.new_layout();
            for x in lo..hi {
                let (row, member) = new.locate(x);
                let want = if x < old_total { chunk_data(x, chunk_bytes) } else { vec![0; chunk_bytes] };
                prop_assert_eq!(slots[&(member, row)], &want[..], "chunk {}", x);
            }
            for row in first_row..first_row + rows {
                let mut sum = vec![0u8; chunk_bytes];
                for member in 0..m + n {
                    sum.iter_mut().zip(slots[&(member, row)]).for_each(|(s, b)| *s ^= b);
                }
                prop_assert!(sum.iter().all(|&b| b == 0), "row {} parity", row);
            }
        }
    }
}
