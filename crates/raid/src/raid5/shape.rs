//! The array's geometry, which a grow changes while the array serves: where a chunk lives for
//! a request, and which geometry a row is in. Pure: the grow engine (`grow`) moves the
//! boundaries, the data path (`mod.rs`) asks them.
//!
//! During a grow from `m` to `m + n` members (docs/layers/raid5-grow.md), with `c` the
//! durable checkpoint and `moved` how far the mover has copied (both in data chunks, both
//! multiples of a new stripe's `N1 = m + n - 1` chunks once the critical section is done):
//! - chunks below `c` live in the new geometry;
//! - chunks in `[c, moved)` are copied but not recorded: both copies are valid, because the
//!   mover's writes since `c` only land on rows below `c / (m - 1)` (the window rule, see
//!   `reshape::window`); reads use the new copy, a write needs the checkpoint first (ALV
//!   forces it, MD-Reshape waits for it), or it would leave the only current copy where a
//!   crash forgets it;
//! - the window being moved blocks requests into it until it is done;
//! - chunks at and above `moved` live in the old geometry.
//!
//! Rows, for recovery and rebuild: rows below `moved / N1` hold new stripes; rows at and above
//! `c / (m - 1)` (whole old stripes not yet moved) hold old stripes, intact, with their old
//! parity; the rows between hold nothing anybody reads (their old stripes moved, their new
//! stripes not written yet).

use super::layout::Layout;

/// A grow under way, in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moving {
    /// The geometry being left (its first `old.members` members are the array's first).
    pub old: Layout,
    /// Durable: chunks below live in the new geometry.
    pub checkpoint: u64,
    /// Chunks below are copied to the new geometry (the old copies of `[checkpoint, moved)`
    /// are still valid).
    pub moved: u64,
    /// The window being moved now: requests into it wait.
    pub inflight: Option<(u64, u64)>,
    /// Reads of copied-but-unrecorded data wait for the checkpoint too (MD-Reshape's
    /// `make_request` blocks them; ALV reads the new copy).
    pub unrecorded_reads_wait: bool,
}

/// The array's geometry: the one it has, or the one it is growing to and where the grow is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub layout: Layout,
    pub moving: Option<Moving>,
}

/// Where one chunk of a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Served in this geometry.
    In(Layout),
    /// Inside the window being moved: wait until it is done.
    Wait,
    /// A write into copied-but-unrecorded data: the checkpoint must come first.
    Checkpoint,
}

/// A piece of a request served in one geometry: `(layout, offset, len, offset in request)`.
pub type Piece = (Layout, u64, u64, u64);

impl Shape {
    pub fn new(layout: Layout) -> Shape {
        Shape {
            layout,
            moving: None,
        }
    }

    /// Data chunks per new stripe.
    fn n1(&self) -> u64 {
        self.layout.data_chunks() as u64
    }

    /// Bytes the array exports: the old geometry's until the grow is complete (the new
    /// capacity beyond is written only at the grow's end).
    pub fn size(&self) -> u64 {
        match &self.moving {
            Some(moving) => moving.old.size(),
            None => self.layout.size(),
        }
    }

    /// Data chunks of the geometry being left (all the data there is during a grow).
    pub fn old_chunks(&self) -> u64 {
        let layout = self.moving.map_or(self.layout, |m| m.old);
        layout.stripes * layout.data_chunks() as u64
    }

    /// Data chunks of the geometry the array has or grows to.
    pub fn new_chunks(&self) -> u64 {
        self.layout.stripes * self.n1()
    }

    pub fn route(&self, chunk: u64, write: bool) -> Route {
        let Some(moving) = &self.moving else {
            return Route::In(self.layout);
        };
        if let Some((lo, hi)) = moving.inflight {
            if (lo..hi).contains(&chunk) {
                return Route::Wait;
            }
        }
        if chunk < moving.checkpoint {
            Route::In(self.layout)
        } else if chunk < moving.moved {
            if write || moving.unrecorded_reads_wait {
                Route::Checkpoint
            } else {
                Route::In(self.layout)
            }
        } else {
            Route::In(moving.old)
        }
    }

    /// Cuts a request into pieces of one geometry each, or says why it cannot go now (the
    /// first blocked chunk's reason).
    pub fn pieces(&self, offset: u64, len: u64, write: bool) -> Result<Vec<Piece>, Route> {
        let chunk = self.layout.chunk_bytes;
        let mut pieces: Vec<Piece> = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let index = at / chunk;
            let end = ((index + 1) * chunk).min(offset + len);
            let layout = match self.route(index, write) {
                Route::In(layout) => layout,
                blocked => return Err(blocked),
            };
            match pieces.last_mut() {
                Some(last) if last.0 == layout && last.1 + last.2 == at => last.2 += end - at,
                _ => pieces.push((layout, at, end - at, at - offset)),
            }
            at = end;
        }
        Ok(pieces)
    }

    /// The geometry row `row` is in, or None for a row nothing reads (see the module docs).
    pub fn row_layout(&self, row: u64) -> Option<Layout> {
        let Some(moving) = &self.moving else {
            return Some(self.layout);
        };
        let old_per = moving.old.data_chunks() as u64;
        if row < moving.moved / self.n1() {
            Some(self.layout)
        } else if row >= moving.checkpoint / old_per {
            Some(moving.old)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn growing(checkpoint: u64, moved: u64, inflight: Option<(u64, u64)>) -> Shape {
        let old = Layout::new(3, 4096, 0, 100);
        Shape {
            layout: Layout::new(4, 4096, 0, 100),
            moving: Some(Moving {
                old,
                checkpoint,
                moved,
                inflight,
                unrecorded_reads_wait: false,
            }),
        }
    }

    #[test]
    fn requests_go_to_the_new_geometry_below_the_checkpoint_and_the_old_above_what_moved() {
        let shape = growing(18, 27, Some((27, 36)));
        let (old, new) = (shape.moving.unwrap().old, shape.layout);
        assert_eq!(shape.route(17, true), Route::In(new));
        assert_eq!(shape.route(18, false), Route::In(new));
        assert_eq!(shape.route(18, true), Route::Checkpoint);
        assert_eq!(shape.route(27, false), Route::Wait);
        assert_eq!(shape.route(35, true), Route::Wait);
        assert_eq!(shape.route(36, true), Route::In(old));
        assert_eq!(shape.size(), old.size());
        assert_eq!(shape.old_chunks(), 200);
        assert_eq!(shape.new_chunks(), 300);
        // A read across the boundaries: one piece per geometry, in request order.
        let pieces = shape.pieces(16 * 4096 + 100, 2 * 4096, false).unwrap();
        assert_eq!(
            pieces,
            vec![(new, 16 * 4096 + 100, 2 * 4096, 0)],
            "reads of copied data use the new copy"
        );
        let pieces = shape.pieces(40 * 4096 - 10, 20, true).unwrap();
        assert_eq!(pieces, vec![(old, 40 * 4096 - 10, 20, 0)]);
        assert_eq!(
            shape.pieces(17 * 4096, 2 * 4096, true),
            Err(Route::Checkpoint)
        );
        assert_eq!(shape.pieces(26 * 4096, 2 * 4096, false), Err(Route::Wait));
        let done = growing(36, 36, None);
        let pieces = done.pieces(35 * 4096, 2 * 4096, true).unwrap();
        assert_eq!(
            pieces,
            vec![(new, 35 * 4096, 4096, 0), (old, 36 * 4096, 4096, 4096)]
        );
    }

    #[test]
    fn rows_are_new_below_what_moved_old_above_the_checkpoint_and_dead_between() {
        // A(3,1) at checkpoint 18 with 27 moved: new rows 0..9, old rows from 9 on.
        let shape = growing(18, 27, None);
        let (old, new) = (shape.moving.unwrap().old, shape.layout);
        assert_eq!(shape.row_layout(8), Some(new));
        assert_eq!(shape.row_layout(9), Some(old));
        // Checkpoint 18, moved 18: rows 6..9 are dead (old stripes 6-8 moved, new rows 6-8
        // not written).
        let shape = growing(18, 18, None);
        assert_eq!(shape.row_layout(5), Some(new));
        for row in 6..9 {
            assert_eq!(shape.row_layout(row), None, "row {row}");
        }
        assert_eq!(shape.row_layout(9), Some(old));
        assert_eq!(Shape::new(new).row_layout(99), Some(new));
    }
}
