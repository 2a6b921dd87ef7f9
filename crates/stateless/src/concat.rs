//! `concat`: children end to end, like md "linear" or a dm table of several linear lines.
//!
//! ```toml
//! [[layer]]
//! name = "big"
//! kind = "concat"
//! children = ["d0", "d1", "d2"]   # at least one; no options
//! ```
//!
//! Keeps no state of its own: the order of `children` *is* the layout, so reordering them in
//! the configuration reorders the data. Each child contributes its size rounded down to the
//! common alignment (the largest `min_io` of the children, at least 512 bytes), so that every
//! boundary between children is a boundary every child accepts a request at.
//!
//! A request that crosses a boundary is split into one request per child, issued concurrently;
//! the pieces of a write are zero-copy slices of the caller's buffer. A failure of any piece
//! fails the whole request: the parts that did land are allowed, as for a torn write.
//!
//! Capabilities are what all children share (discard only if every child discards), except
//! those where one child is enough to change the answer (read-only, a volatile cache).
//!
//! Growing online: `Control::AddMember` appends a child and the device grows by its size. The
//! layout lives behind an `Arc` that requests clone, so requests in flight keep the old layout,
//! which is a prefix of the new one. The caller persists the new `children` list.
//!
//! Lock rule: the layout lock is held only to clone or swap the `Arc`, never across I/O.

use std::sync::{Arc, PoisonError, RwLock};
use strata_core::layer::verbs;

use bytes::{Bytes, BytesMut};
use futures_util::future::try_join_all;
use strata_core::{
    async_trait, push_extent, BlockDevice, BlockError, Capabilities, Control, ControlReply,
    DeviceRef, Extent, Geometry, Member, NodeStatus, Result, WriteFlags, ZeroFlags,
};

use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind};

pub static KIND: LayerKind =
    LayerKind::new::<ConcatConfig>("concat", ChildCount::AtLeast(1), |args| {
        Box::pin(async move { build(args).map(|c| Arc::new(c) as DeviceRef) })
    })
    .about("children end to end (aggregation); grows online with AddMember")
    .verbs(&[verbs::ADD_MEMBER]);

/// A `[[layer]]` table of kind `concat`: no options (the children are the layout).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcatConfig {}

fn build(args: LayerArgs) -> Result<Concat> {
    let ConcatConfig {} = args.options.parse()?;
    let children = args.all_children()?;
    let members = args
        .child_names
        .iter()
        .cloned()
        .zip(children)
        .map(|(name, device)| Member { name, device })
        .collect();
    Concat::new(args.name, members)
}

/// Smallest boundary granularity between children, whatever their `min_io`.
const MIN_ALIGN: u64 = 512;

/// One child's part of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub child: usize,
    /// Where the piece starts on the child.
    pub child_offset: u64,
    /// Where the piece starts inside the request.
    pub at: u64,
    pub len: u64,
}

/// Splits `[offset, offset + len)` at the child boundaries. `starts[i]` is where child `i`
/// begins on the device and the last entry is the device size. The caller has range-checked
/// the request; a zero-length request has no pieces.
pub fn split(starts: &[u64], offset: u64, len: u64) -> Vec<Piece> {
    assert!(starts.len() >= 2, "at least one child");
    assert!(offset + len <= starts[starts.len() - 1], "checked range");
    let mut pieces = Vec::new();
    let end = offset + len;
    let mut pos = offset;
    // The child holding `pos`: the last start at or before it.
    let mut child = starts
        .partition_point(|&start| start <= pos)
        .saturating_sub(1);
    while pos < end {
        let child_end = starts[child + 1];
        let piece_end = end.min(child_end);
        if piece_end > pos {
            pieces.push(Piece {
                child,
                child_offset: pos - starts[child],
                at: pos - offset,
                len: piece_end - pos,
            });
        }
        pos = piece_end;
        child += 1;
    }
    debug_assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), len);
    pieces
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> u64 {
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
    try_join_all(children.iter().map(|child| async move {
        match child.control(Control::Describe).await? {
            ControlReply::Describe(node) => Ok(node),
            _ => Err(BlockError::Unsupported("describe")),
        }
    }))
    .await
}

/// The layout requests work from; replaced whole when a member is added.
struct Layout {
    members: Vec<Member>,
    devices: Vec<DeviceRef>,
    /// `starts[i]` is where child `i` begins; the last entry is the size.
    starts: Vec<u64>,
    geometry: Geometry,
    capabilities: Capabilities,
}

impl Layout {
    fn new(members: Vec<Member>, align: u64) -> Layout {
        let devices: Vec<DeviceRef> = members.iter().map(|m| m.device.clone()).collect();
        let mut starts = vec![0];
        for device in &devices {
            let usable = device.geometry().size / align * align;
            starts.push(starts[starts.len() - 1] + usable);
        }
        let size = starts[starts.len() - 1];
        let geometry = shared_geometry(&devices, size);
        assert!(align.is_multiple_of(u64::from(geometry.min_io)));
        Layout {
            capabilities: shared_capabilities(&devices),
            members,
            devices,
            starts,
            geometry,
        }
    }
}

pub struct Concat {
    name: String,
    /// Boundary granularity, fixed at creation: members added later must accept it.
    align: u64,
    layout: RwLock<Arc<Layout>>,
}

impl Concat {
    /// `members` end to end, in order.
    pub fn new(name: String, members: Vec<Member>) -> Result<Concat> {
        if members.is_empty() {
            return Err(BlockError::InvalidArgument(format!(
                "concat {name}: needs at least one child"
            )));
        }
        let align = members.iter().fold(MIN_ALIGN, |acc, m| {
            lcm(acc, u64::from(m.device.geometry().min_io.max(1)))
        });
        for member in &members {
            check_member(&name, member, align)?;
        }
        let layout = Layout::new(members, align);
        Ok(Concat {
            name,
            align,
            layout: RwLock::new(Arc::new(layout)),
        })
    }

    fn layout(&self) -> Arc<Layout> {
        self.layout
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Where each child begins, and the size last: the layout as an operator sees it.
    pub fn starts(&self) -> Vec<u64> {
        self.layout().starts.clone()
    }

    fn add_member(&self, member: Member) -> Result<()> {
        check_member(&self.name, &member, self.align)?;
        let mut guard = self.layout.write().unwrap_or_else(PoisonError::into_inner);
        let mut members = guard.members.clone();
        members.push(member);
        *guard = Arc::new(Layout::new(members, self.align));
        Ok(())
    }

    async fn describe(&self) -> Result<NodeStatus> {
        let layout = self.layout();
        let children = describe_children(&layout.devices).await?;
        let mut node = NodeStatus::new(&self.name, "concat", layout.geometry.size);
        node.health = children
            .iter()
            .map(|c| c.health)
            .max()
            .unwrap_or(node.health);
        for (member, window) in layout.members.iter().zip(layout.starts.windows(2)) {
            let range = format!("[{}, +{})", window[0], window[1] - window[0]);
            node.detail.push((member.name.clone(), range));
        }
        node.config = layer::to_table(&ConcatConfig {});
        node.children = children;
        Ok(node)
    }
}

/// A member must accept requests at every boundary and add at least one aligned unit.
fn check_member(name: &str, member: &Member, align: u64) -> Result<()> {
    let geometry = member.device.geometry();
    if !align.is_multiple_of(u64::from(geometry.min_io.max(1))) {
        return Err(BlockError::InvalidArgument(format!(
            "concat {name}: member {} needs {}-byte alignment, more than the concat's {align}",
            member.name, geometry.min_io
        )));
    }
    if geometry.size < align {
        return Err(BlockError::InvalidArgument(format!(
            "concat {name}: member {} ({} bytes) is smaller than one {align}-byte unit",
            member.name, geometry.size
        )));
    }
    Ok(())
}

/// Appends the part of a child's answer `extents` (child coordinates, contiguous) that covers
/// `[start, start + len)` on the child to `out`, moved to begin at `device_offset`. `cursor`
/// indexes `extents` and only moves forward, so a caller that takes several increasing ranges
/// from one answer (stripe's segments) walks it once. Returns how many bytes of the range the
/// child described: a child may answer for less than asked, and a gap ends its answer; after
/// that nothing more may be reported, since extents must be contiguous.
pub(crate) fn take_extents(
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

#[async_trait]
impl BlockDevice for Concat {
    fn geometry(&self) -> Geometry {
        self.layout().geometry
    }

    fn capabilities(&self) -> Capabilities {
        self.layout().capabilities
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let layout = self.layout();
        layout.geometry.check_range(offset, len as u64)?;
        let pieces = split(&layout.starts, offset, len as u64);
        if let [piece] = pieces[..] {
            return layout.devices[piece.child]
                .read(piece.child_offset, len)
                .await;
        }
        let parts = try_join_all(
            pieces
                .iter()
                .map(|p| layout.devices[p.child].read(p.child_offset, p.len as usize)),
        )
        .await?;
        let mut buf = BytesMut::with_capacity(len);
        for (part, piece) in parts.iter().zip(&pieces) {
            assert_eq!(part.len() as u64, piece.len, "child returned a short read");
            buf.extend_from_slice(part);
        }
        debug_assert_eq!(buf.len(), len);
        Ok(buf)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let layout = self.layout();
        layout.geometry.check_range(offset, data.len() as u64)?;
        let pieces = split(&layout.starts, offset, data.len() as u64);
        try_join_all(pieces.iter().map(|p| {
            let part = data.slice(p.at as usize..(p.at + p.len) as usize);
            layout.devices[p.child].write(p.child_offset, part, flags)
        }))
        .await?;
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let layout = self.layout();
        try_join_all(layout.devices.iter().map(|d| d.flush())).await?;
        Ok(())
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let layout = self.layout();
        layout.geometry.check_range(offset, len)?;
        if !layout.capabilities.discard {
            return Err(BlockError::Unsupported("concat: a member cannot discard"));
        }
        let pieces = split(&layout.starts, offset, len);
        try_join_all(
            pieces
                .iter()
                .map(|p| layout.devices[p.child].discard(p.child_offset, p.len)),
        )
        .await?;
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let layout = self.layout();
        layout.geometry.check_range(offset, len)?;
        let pieces = split(&layout.starts, offset, len);
        try_join_all(
            pieces
                .iter()
                .map(|p| layout.devices[p.child].write_zeroes(p.child_offset, p.len, flags)),
        )
        .await?;
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let layout = self.layout();
        layout.geometry.check_range(offset, len)?;
        let pieces = split(&layout.starts, offset, len);
        let answers = try_join_all(
            pieces
                .iter()
                .map(|p| layout.devices[p.child].block_status(p.child_offset, p.len)),
        )
        .await?;
        let mut extents = Vec::new();
        for (answer, piece) in answers.iter().zip(&pieces) {
            let at = offset + piece.at;
            let (start, len) = (piece.child_offset, piece.len);
            let covered = take_extents(answer, &mut 0, start, len, at, &mut extents);
            if covered < piece.len {
                break;
            }
        }
        Ok(extents)
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.describe().await?)),
            Control::AddMember(member) => {
                self.add_member(member)?;
                Ok(ControlReply::Done)
            }
            _ => Err(BlockError::Unsupported("concat: control")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ExtentState;

    const STARTS: [u64; 4] = [0, 1024, 1536, 4096];

    #[test]
    fn split_inside_one_child_is_one_piece() {
        let pieces = split(&STARTS, 100, 200);
        assert_eq!(
            pieces,
            vec![Piece {
                child: 0,
                child_offset: 100,
                at: 0,
                len: 200
            }]
        );
        let last = split(&STARTS, 1536, 2560);
        assert_eq!(last.len(), 1);
        assert_eq!((last[0].child, last[0].child_offset), (2, 0));
    }

    #[test]
    fn split_across_every_boundary() {
        let pieces = split(&STARTS, 1000, 1000);
        assert_eq!(
            pieces,
            vec![
                Piece {
                    child: 0,
                    child_offset: 1000,
                    at: 0,
                    len: 24
                },
                Piece {
                    child: 1,
                    child_offset: 0,
                    at: 24,
                    len: 512
                },
                Piece {
                    child: 2,
                    child_offset: 0,
                    at: 536,
                    len: 464
                },
            ]
        );
    }

    #[test]
    fn split_at_exact_boundaries_and_empty() {
        assert!(split(&STARTS, 1024, 0).is_empty());
        assert!(split(&STARTS, 4096, 0).is_empty());
        let pieces = split(&STARTS, 1024, 512);
        assert_eq!(pieces.len(), 1);
        assert_eq!((pieces[0].child, pieces[0].child_offset), (1, 0));
        let whole = split(&STARTS, 0, 4096);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[2].at, 1536);
    }

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
}
