//! Allocation extents, as `block_status` reports them.

use serde::Serialize;

/// The state of a run of bytes, as NBD's `base:allocation` context describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ExtentState {
    /// Backed by storage; contents unknown.
    Data,
    /// Backed by storage and known to read as zeros.
    Zero,
    /// Not backed by storage; reads as zeros.
    Hole,
}

impl ExtentState {
    /// Whether the bytes read back as zeros.
    pub fn reads_zero(self) -> bool {
        matches!(self, ExtentState::Zero | ExtentState::Hole)
    }
}

/// A run of `len` bytes starting at `offset`, all in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub state: ExtentState,
}

/// Appends an extent, merging it with the last one when they touch and share a state, so that
/// devices can report at whatever granularity they track and callers still see maximal runs.
pub fn push_extent(extents: &mut Vec<Extent>, extent: Extent) {
    if extent.len == 0 {
        return;
    }
    if let Some(last) = extents.last_mut() {
        debug_assert_eq!(
            last.offset + last.len,
            extent.offset,
            "extents must be contiguous"
        );
        if last.state == extent.state {
            last.len += extent.len;
            return;
        }
    }
    extents.push(extent);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_merges_equal_neighbours_only() {
        let mut v = Vec::new();
        push_extent(
            &mut v,
            Extent {
                offset: 0,
                len: 10,
                state: ExtentState::Data,
            },
        );
        push_extent(
            &mut v,
            Extent {
                offset: 10,
                len: 5,
                state: ExtentState::Data,
            },
        );
        push_extent(
            &mut v,
            Extent {
                offset: 15,
                len: 0,
                state: ExtentState::Hole,
            },
        );
        push_extent(
            &mut v,
            Extent {
                offset: 15,
                len: 5,
                state: ExtentState::Hole,
            },
        );
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].len, 15);
        assert_eq!(
            v[1],
            Extent {
                offset: 15,
                len: 5,
                state: ExtentState::Hole
            }
        );
    }
}
