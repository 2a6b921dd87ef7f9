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
use strata_core::lock;

use crate::combined::{
    describe_children, lcm, merge_extents, shared_capabilities, shared_geometry, Take,
};
use bytes::{Bytes, BytesMut};
use futures_util::future::try_join_all;
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, DeviceRef, Extent,
    Geometry, Member, NodeStatus, Result, WriteFlags, ZeroFlags,
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

/// Where a non-empty request that lies inside one child goes, `(child, offset on the
/// child)`: [`split`]'s one piece, found without building the list. `None` for an empty
/// request or one that crosses a boundary.
fn inside_one_child(starts: &[u64], offset: u64, len: u64) -> Option<(usize, u64)> {
    let child = starts
        .partition_point(|&start| start <= offset)
        .saturating_sub(1);
    (len > 0 && offset + len <= starts[child + 1]).then(|| (child, offset - starts[child]))
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

#[async_trait]
impl BlockDevice for Concat {
    // Read under the lock rather than through `layout()`: a layer above may ask for the
    // geometry on every request, and cloning the `Arc` costs two atomic operations.
    fn geometry(&self) -> Geometry {
        self.layout
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .geometry
    }

    fn capabilities(&self) -> Capabilities {
        self.layout
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .capabilities
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let layout = self.layout();
        layout.geometry.check_range(offset, len as u64)?;
        if let Some((child, child_offset)) = inside_one_child(&layout.starts, offset, len as u64) {
            return layout.devices[child].read(child_offset, len).await;
        }
        let pieces = split(&layout.starts, offset, len as u64);
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
        if let Some((child, child_offset)) =
            inside_one_child(&layout.starts, offset, data.len() as u64)
        {
            return layout.devices[child].write(child_offset, data, flags).await;
        }
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
        let takes = (pieces.iter().enumerate())
            .map(|(answer, p)| Take::new(answer, p.child_offset, p.len, offset + p.at));
        Ok(merge_extents(&answers, takes))
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.describe().await?)),
            Control::AddMember(member) => {
                self.add_member(member)?;
                Ok(ControlReply::Done)
            }
            Control::Lock(request) => {
                let layout = self.layout();
                layout.geometry.check_range(request.offset, request.len)?;
                let pieces = split(&layout.starts, request.offset, request.len)
                    .into_iter()
                    .map(|p| {
                        (
                            &layout.devices[p.child],
                            p.child_offset..p.child_offset + p.len,
                        )
                    });
                let held = lock::lock_children(&request, pieces).await?;
                Ok(ControlReply::Lock(held))
            }
            _ => Err(BlockError::Unsupported("concat: control")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_one_child_shortcut_agrees_with_split() {
        for offset in (0..4096).step_by(256) {
            for len in (0..=4096 - offset).step_by(256) {
                let pieces = split(&STARTS, offset, len);
                let expected = match pieces[..] {
                    [piece] => Some((piece.child, piece.child_offset)),
                    _ => None,
                };
                assert_eq!(
                    inside_one_child(&STARTS, offset, len),
                    expected,
                    "[{offset}, +{len})"
                );
            }
        }
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
}
