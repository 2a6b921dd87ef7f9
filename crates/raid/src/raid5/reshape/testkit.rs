//! Test helpers: a brute-force model of the member slots during a grow, against which the
//! closed forms of `window`, `aggregate` and `md` are checked. A slot is (member, row).

use std::collections::HashSet;

use super::window::Grow;

/// The chunk whose old copy sits in slot (member, row) before the grow: None for old parity
/// and for the added members.
pub fn old_owner(grow: Grow, member: usize, row: u64) -> Option<u64> {
    if member >= grow.m {
        return None;
    }
    let r = grow.old_layout().data_index(row, member)?;
    Some(row * grow.old_data() + r as u64)
}

/// The largest w such that, from S(m, n, x), chunks [x, x+w) can be moved in any order and
/// each new row completed inside the window gets its parity, without a write landing on the
/// old copy of a chunk ≥ x that some order leaves unmoved. Safety only shrinks as w grows
/// (each chunk's and each completed row's verdict does not depend on w), so this scans up.
pub fn max_safe_window(grow: Grow, x: u64) -> u64 {
    let new = grow.new_layout();
    let n1 = grow.n1();
    let mut w = 0;
    loop {
        let y = x + w;
        let (row, member) = new.locate(y);
        if old_owner(grow, member, row).is_some_and(|z| z >= x && z != y) {
            return w;
        }
        // y completes its new row; the row's parity is written once all its data moved.
        if (y + 1).is_multiple_of(n1) {
            let parity = new.parity_member(row);
            let in_row = |z: u64| z / n1 == row;
            if old_owner(grow, parity, row).is_some_and(|z| z >= x && !in_row(z)) {
                return w;
            }
        }
        w += 1;
        assert!(w < 1 << 20, "runaway window at x={x}");
    }
}

/// Sliding windows ALV walks with no user writes: from C, each checkpoint opens
/// [c, sliding_end(c)), capped at the end of the data rounded up to a new row.
pub fn sliding_windows(grow: Grow, old_total: u64) -> u64 {
    let cap = grow.round_up(old_total);
    let mut ckpt = grow.critical_end();
    let mut windows = 0;
    while ckpt < cap {
        let end = grow
            .sliding_end(ckpt)
            .expect("every checkpoint from C opens a window");
        assert!(end > ckpt);
        ckpt = end.min(cap);
        windows += 1;
    }
    windows
}

/// Moves `order` one chunk at a time from S(m, n, first_unmoved): read the old copy, write
/// the new slot, and write a new row's parity as soon as all its data have moved. Fails on
/// a write to the old copy of a chunk ≥ `first_unmoved` not yet moved; else returns every
/// slot written.
pub fn move_chunks(
    grow: Grow,
    first_unmoved: u64,
    order: &[u64],
) -> Result<Vec<(usize, u64)>, String> {
    let new = grow.new_layout();
    let n1 = grow.n1();
    let mut moved: HashSet<u64> = HashSet::with_capacity(order.len());
    let mut written = Vec::with_capacity(order.len() * 2);
    let mut write = |moved: &HashSet<u64>, member: usize, row: u64, what: String| {
        if let Some(z) = old_owner(grow, member, row) {
            if z >= first_unmoved && !moved.contains(&z) {
                return Err(format!(
                    "{what} overwrites unmoved chunk {z} at {member}/{row}"
                ));
            }
        }
        written.push((member, row));
        Ok(())
    };
    for &y in order {
        assert!(y >= first_unmoved, "chunk {y} was already moved");
        assert!(moved.insert(y), "chunk {y} moved twice");
        let (row, member) = new.locate(y);
        write(&moved, member, row, format!("chunk {y}"))?;
        let row_done = (row * n1..(row + 1) * n1).all(|z| z < first_unmoved || moved.contains(&z));
        if row_done {
            write(&moved, new.parity_member(row), row, format!("Q{row}"))?;
        }
    }
    Ok(written)
}

/// A deterministic shuffle of [lo, hi) (Fisher–Yates over splitmix64).
pub fn permutation(lo: u64, hi: u64, seed: u64) -> Vec<u64> {
    let mut chunks: Vec<u64> = (lo..hi).collect();
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..chunks.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        chunks.swap(i, j);
    }
    chunks
}
