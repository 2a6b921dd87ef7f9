//! What a device built over several children (concat, stripe) derives from them: the
//! geometry and capabilities they share, their descriptions, and one block-status answer
//! merged from theirs.

use futures_util::future::try_join_all;
use strata_core::{push_extent, Capabilities, DeviceRef, Extent, Geometry, NodeStatus, Result};

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

pub(crate) fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// Capabilities of a device built from all of `children`: what they all can do, except that
/// one read-only child makes the whole read-only, one volatile cache makes flush matter, one
/// child with real block status makes holes reportable, one rotational child slows the lot.
pub(crate) fn shared_capabilities(children: &[DeviceRef]) -> Capabilities {
    let caps: Vec<Capabilities> = children.iter().map(|c| c.capabilities()).collect();
    let all = |f: fn(&Capabilities) -> bool| caps.iter().all(f);
    let any = |f: fn(&Capabilities) -> bool| caps.iter().any(f);
    Capabilities {
        read_only: any(|c| c.read_only),
        flush: any(|c| c.flush),
        fua: all(|c| c.fua),
        discard: all(|c| c.discard),
        write_zeroes: all(|c| c.write_zeroes),
        fast_zero: all(|c| c.fast_zero),
        block_status: any(|c| c.block_status),
        consistent_across_openers: all(|c| c.consistent_across_openers),
        rotational: any(|c| c.rotational),
    }
}

/// The geometry every child accepts: the strictest alignment and block sizes, the smallest
/// maximum request. Pieces of a request are never longer than the request, so `max_io` needs
/// no more than the smallest child's.
pub(crate) fn shared_geometry(children: &[DeviceRef], size: u64) -> Geometry {
    let geometries: Vec<Geometry> = children.iter().map(|c| c.geometry()).collect();
    let max = |f: fn(&Geometry) -> u32| geometries.iter().map(f).max().unwrap_or(512);
    let min_io = geometries
        .iter()
        .fold(1, |acc, g| lcm(acc, u64::from(g.min_io.max(1))));
    Geometry {
        size,
        min_io: u32::try_from(min_io).expect("min_io of powers of two fits in u32"),
        logical_block: max(|g| g.logical_block),
        physical_block: max(|g| g.physical_block),
        preferred_io: max(|g| g.preferred_io),
        max_io: geometries.iter().map(|g| g.max_io).min().unwrap_or(1 << 20),
    }
}

/// Asks every child to describe itself, concurrently.
pub(crate) async fn describe_children(children: &[DeviceRef]) -> Result<Vec<NodeStatus>> {
    try_join_all(
        children
            .iter()
            .map(|child| strata_core::describe(child.as_ref())),
    )
    .await
}

/// One range of the device's block-status answer, in request order: `len` bytes that child
/// answer number `answer` describes from `child_start`, reported at `device_offset`.
pub(crate) struct Take {
    pub answer: usize,
    pub child_start: u64,
    pub len: u64,
    pub device_offset: u64,
}

impl Take {
    pub(crate) fn new(answer: usize, child_start: u64, len: u64, device_offset: u64) -> Take {
        Take {
            answer,
            child_start,
            len,
            device_offset,
        }
    }
}

/// The device's extents from its children's `answers`, taken range by range in request
/// order. Stops at the first range its child did not describe whole: extents must be
/// contiguous, so nothing after a gap may be reported.
pub(crate) fn merge_extents(
    answers: &[Vec<Extent>],
    takes: impl IntoIterator<Item = Take>,
) -> Vec<Extent> {
    let mut cursors = vec![0; answers.len()];
    let mut extents = Vec::new();
    for take in takes {
        let cursor = &mut cursors[take.answer];
        let answer = &answers[take.answer];
        let covered = take_extents(
            answer,
            cursor,
            take.child_start,
            take.len,
            take.device_offset,
            &mut extents,
        );
        if covered < take.len {
            break;
        }
    }
    extents
}

/// Appends the part of a child's answer `extents` (child coordinates, contiguous) that covers
/// `[start, start + len)` on the child to `out`, moved to begin at `device_offset`. `cursor`
/// indexes `extents` and only moves forward, so a caller that takes several increasing ranges
/// from one answer (stripe's segments) walks it once. Returns how many bytes of the range the
/// child described: a child may answer for less than asked, and a gap ends its answer; after
/// that nothing more may be reported, since extents must be contiguous.
fn take_extents(
    extents: &[Extent],
    cursor: &mut usize,
    start: u64,
    len: u64,
    device_offset: u64,
    out: &mut Vec<Extent>,
) -> u64 {
    let mut covered = 0;
    while covered < len && *cursor < extents.len() {
        let extent = extents[*cursor];
        let pos = start + covered;
        let extent_end = extent.offset + extent.len;
        if extent_end <= pos {
            *cursor += 1;
            continue;
        }
        if extent.offset > pos {
            break;
        }
        let take = (extent_end - pos).min(len - covered);
        push_extent(
            out,
            Extent {
                offset: device_offset + covered,
                len: take,
                state: extent.state,
            },
        );
        covered += take;
    }
    assert!(covered <= len);
    covered
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ExtentState;

    #[test]
    fn translate_stops_where_the_child_stops() {
        let child = [
            Extent {
                offset: 100,
                len: 50,
                state: ExtentState::Hole,
            },
            Extent {
                offset: 150,
                len: 500,
                state: ExtentState::Data,
            },
        ];
        let mut out = Vec::new();
        let mut cursor = 0;
        assert_eq!(
            take_extents(&child, &mut cursor, 100, 80, 9000, &mut out),
            80
        );
        assert_eq!(out.len(), 2);
        assert_eq!((out[1].offset, out[1].len), (9050, 30));
        // A later range of the same answer starts inside the second extent.
        let mut later = Vec::new();
        assert_eq!(
            take_extents(&child, &mut cursor, 600, 100, 0, &mut later),
            50
        );
        assert_eq!(
            later,
            vec![Extent {
                offset: 0,
                len: 50,
                state: ExtentState::Data
            }]
        );
        assert_eq!(cursor, 2, "the answer is used up");
        let mut short = Vec::new();
        assert_eq!(
            take_extents(&child[..1], &mut 0, 100, 80, 0, &mut short),
            50
        );
        let gap = [
            child[0],
            Extent {
                offset: 200,
                ..child[1]
            },
        ];
        assert_eq!(take_extents(&gap, &mut 0, 100, 200, 0, &mut Vec::new()), 50);
        assert_eq!(lcm(512, 4096), 4096);
        assert_eq!(lcm(1, 512), 512);
    }

    #[test]
    fn merging_stops_at_the_first_range_a_child_left_short() {
        let data = |offset, len| Extent {
            offset,
            len,
            state: ExtentState::Data,
        };
        let answers = vec![vec![data(0, 100)], vec![data(0, 40)], vec![data(0, 100)]];
        let take = |answer, device_offset| Take::new(answer, 0, 100, device_offset);
        let merged = merge_extents(&answers, [take(0, 0), take(1, 100), take(2, 200)]);
        assert_eq!(merged, vec![data(0, 140)]);
    }
}
