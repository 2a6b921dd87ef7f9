//! `stripe`: RAID-0 across two or more children, like md raid0 or dm-stripe.
//!
//! ```toml
//! [[layer]]
//! name = "fast"
//! kind = "stripe"
//! children = ["d0", "d1", "d2"]   # at least two
//! chunk = "64KiB"                  # power of two, at least 4KiB; default 64KiB
//! ```
//!
//! Keeps no state: chunk `c` of the device lives on child `c % n` at offset `(c / n) * chunk`,
//! so the configuration (children in order, chunk) *is* the layout. Changing either scrambles
//! the data. The size is `n * (smallest child rounded down to chunk)`; the rest of larger
//! children is unused.
//!
//! Why it is fast: one request becomes at most one request per child. The chunks a request
//! touches on child `k` are `c, c + n, c + 2n, …`, which sit back to back on that child, so
//! the [`plan`] merges them into one run; the runs are issued concurrently. A 1 MiB read over
//! 3 children with 64 KiB chunks is three ~341 KiB reads in parallel, not sixteen 64 KiB ones.
//! The cost is a gather copy for writes (and a scatter copy for reads) whose run spans more
//! than one chunk; a request inside one chunk is passed through without copying.
//!
//! A failure of any run fails the request; the runs that landed are allowed, as for a torn
//! write. There is no redundancy: one failed child fails the device.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::future::try_join_all;
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, DeviceRef, Extent,
    Geometry, NodeStatus, Result, WriteFlags, ZeroFlags,
};

use crate::combined::{
    describe_children, merge_extents, shared_capabilities, shared_geometry, Take,
};
use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind};
use strata_core::lock;
use strata_core::ByteSize;

pub static KIND: LayerKind =
    LayerKind::new::<StripeConfig>("stripe", ChildCount::AtLeast(2), |args| {
        Box::pin(async move { build(args).map(|s| Arc::new(s) as DeviceRef) })
    })
    .about("RAID-0: chunks dealt round-robin over the children");

pub const DEFAULT_CHUNK: u64 = 64 << 10;
pub const MIN_CHUNK: u64 = 4 << 10;
/// block_status answers for at most this many chunks at a time, so that its plan stays small
/// whatever length is asked (the contract lets it answer for less).
const BLOCK_STATUS_CHUNKS: u64 = 1024;

/// A `[[layer]]` table of kind `stripe`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct StripeConfig {
    /// A power of two, at least [`MIN_CHUNK`].
    pub chunk: ByteSize,
}

impl Default for StripeConfig {
    fn default() -> Self {
        StripeConfig {
            chunk: ByteSize(DEFAULT_CHUNK),
        }
    }
}

fn build(args: LayerArgs) -> Result<Stripe> {
    let config: StripeConfig = args.options.parse()?;
    let children = args.all_children()?;
    Stripe::new(args.name, children, args.child_names, config.chunk.0)
}

/// Where byte `offset` of the device lives: `(child, offset on the child)`.
pub fn locate(members: usize, chunk: u64, offset: u64) -> (usize, u64) {
    assert!(members >= 1);
    assert!(chunk.is_power_of_two());
    let index = offset / chunk;
    let members = members as u64;
    let child = (index % members) as usize;
    (child, (index / members) * chunk + offset % chunk)
}

/// A part of a request inside one chunk: `len` bytes at `at` in the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub at: u64,
    pub len: u64,
}

/// One child's share of a request: a contiguous range of the child made of the request's
/// segments, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub child: usize,
    pub child_offset: u64,
    pub len: u64,
    pub segments: Vec<Segment>,
}

/// Splits `[offset, offset + len)` into at most one [`Run`] per child, in order of first
/// appearance. The caller has range-checked the request.
pub fn plan(members: usize, chunk: u64, offset: u64, len: u64) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::with_capacity(members.min(len.div_ceil(chunk) as usize + 1));
    let end = offset + len;
    let mut pos = offset;
    while pos < end {
        let piece = (chunk - pos % chunk).min(end - pos);
        let (child, child_offset) = locate(members, chunk, pos);
        let segment = Segment {
            at: pos - offset,
            len: piece,
        };
        match runs.iter_mut().find(|run| run.child == child) {
            Some(run) => {
                // Chunks c and c + n are adjacent on their child: the heart of the merge.
                assert_eq!(
                    run.child_offset + run.len,
                    child_offset,
                    "runs are contiguous"
                );
                run.len += piece;
                run.segments.push(segment);
            }
            None => runs.push(Run {
                child,
                child_offset,
                len: piece,
                segments: vec![segment],
            }),
        }
        pos += piece;
    }
    assert!(runs.len() <= members);
    debug_assert_eq!(runs.iter().map(|r| r.len).sum::<u64>(), len);
    runs
}

/// Where a non-empty request inside one chunk goes, `(child, offset on the child)`: the one
/// run of one segment [`plan`] would make. `None` for an empty request or one that crosses a
/// chunk boundary.
pub fn inside_one_chunk(members: usize, chunk: u64, offset: u64, len: u64) -> Option<(usize, u64)> {
    let one = len > 0 && offset / chunk == (offset + len - 1) / chunk;
    one.then(|| locate(members, chunk, offset))
}

/// The range each child holds of `[offset, offset + len)`, as `(child, child offset, len)`,
/// computed from the two ends alone: O(children) whatever the length, for discard and
/// write_zeroes of a whole device (whose per-chunk [`plan`] would have millions of segments).
/// Equal to the runs of [`plan`] without their segments, in child order.
pub fn spans(members: usize, chunk: u64, offset: u64, len: u64) -> Vec<(usize, u64, u64)> {
    if len == 0 {
        return Vec::new();
    }
    let n = members as u64;
    let (first, last) = (offset / chunk, (offset + len - 1) / chunk);
    let mut spans = Vec::with_capacity(members);
    for child in 0..n {
        // The first and last chunks of the request that live on this child.
        let head = first + (child + n - first % n) % n;
        let tail_back = (last % n + n - child) % n;
        if head > last || tail_back > last - first {
            continue;
        }
        let tail = last - tail_back;
        let start = if head == first {
            locate(members, chunk, offset).1
        } else {
            head / n * chunk
        };
        let end = if tail == last {
            locate(members, chunk, offset + len - 1).1 + 1
        } else {
            (tail / n + 1) * chunk
        };
        assert!(start < end);
        spans.push((child as usize, start, end - start));
    }
    debug_assert_eq!(spans.iter().map(|s| s.2).sum::<u64>(), len);
    spans
}

/// Every segment of `runs` in request order, as `(run index, offset in the run, segment)`.
fn in_request_order(runs: &[Run]) -> Vec<(usize, u64, Segment)> {
    let mut order = Vec::new();
    for (index, run) in runs.iter().enumerate() {
        let mut run_at = 0;
        for segment in &run.segments {
            order.push((index, run_at, *segment));
            run_at += segment.len;
        }
    }
    order.sort_by_key(|(_, _, segment)| segment.at);
    order
}

pub struct Stripe {
    name: String,
    children: Vec<DeviceRef>,
    child_names: Vec<String>,
    chunk: u64,
    geometry: Geometry,
    capabilities: Capabilities,
}

impl Stripe {
    pub fn new(
        name: String,
        children: Vec<DeviceRef>,
        child_names: Vec<String>,
        chunk: u64,
    ) -> Result<Stripe> {
        let invalid = |what: String| BlockError::InvalidArgument(format!("stripe {name}: {what}"));
        if children.len() < 2 {
            return Err(invalid(format!(
                "needs at least 2 children, got {}",
                children.len()
            )));
        }
        if !chunk.is_power_of_two() || chunk < MIN_CHUNK {
            return Err(invalid(format!(
                "chunk {chunk} must be a power of two of at least {MIN_CHUNK} bytes"
            )));
        }
        let smallest = children
            .iter()
            .map(|c| c.geometry().size)
            .min()
            .unwrap_or(0);
        let per_child = smallest / chunk * chunk;
        if per_child == 0 {
            return Err(invalid(format!(
                "the smallest child ({smallest} bytes) holds no whole {chunk}-byte chunk"
            )));
        }
        let size = per_child * children.len() as u64;
        let mut geometry = shared_geometry(&children, size);
        if !chunk.is_multiple_of(u64::from(geometry.min_io)) {
            return Err(invalid(format!(
                "chunk {chunk} is not a multiple of the children's {}-byte alignment",
                geometry.min_io
            )));
        }
        let stripe_width = chunk * children.len() as u64;
        geometry.preferred_io = u32::try_from(stripe_width).unwrap_or(u32::MAX);
        Ok(Stripe {
            capabilities: shared_capabilities(&children),
            name,
            child_names,
            children,
            chunk,
            geometry,
        })
    }

    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// Where a request that lies inside one chunk goes, `(child, offset on the child)`, after
    /// the range check; `None` for an empty request or one that crosses a chunk boundary.
    /// Such a request is the [`plan`]'s one run of one segment, served without building it.
    fn inside_one_chunk(&self, offset: u64, len: u64) -> Result<Option<(usize, u64)>> {
        self.geometry.check_range(offset, len)?;
        Ok(inside_one_chunk(
            self.children.len(),
            self.chunk,
            offset,
            len,
        ))
    }

    fn plan(&self, offset: u64, len: u64) -> Result<Vec<Run>> {
        self.geometry.check_range(offset, len)?;
        Ok(plan(self.children.len(), self.chunk, offset, len))
    }

    async fn describe(&self) -> Result<NodeStatus> {
        let children = describe_children(&self.children).await?;
        let mut node = NodeStatus::new(&self.name, "stripe", self.geometry.size);
        node.health = children
            .iter()
            .map(|c| c.health)
            .max()
            .unwrap_or(node.health);
        node.detail = vec![
            ("chunk".into(), self.chunk.to_string()),
            ("members".into(), self.child_names.join(", ")),
        ];
        node.config = layer::to_table(&StripeConfig {
            chunk: ByteSize(self.chunk),
        });
        node.children = children;
        Ok(node)
    }
}

#[async_trait]
impl BlockDevice for Stripe {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        if let Some((child, child_offset)) = self.inside_one_chunk(offset, len as u64)? {
            let part = self.children[child].read(child_offset, len).await?;
            assert_eq!(part.len(), len, "child returned a short read");
            return Ok(part);
        }
        let runs = self.plan(offset, len as u64)?;
        let parts = try_join_all(
            runs.iter()
                .map(|run| self.children[run.child].read(run.child_offset, run.len as usize)),
        )
        .await?;
        for (part, run) in parts.iter().zip(&runs) {
            assert_eq!(part.len() as u64, run.len, "child returned a short read");
        }
        if let [run] = &runs[..] {
            if run.segments.len() == 1 {
                // Handed over as the child returned it (a clone would copy the bytes).
                return Ok(parts.into_iter().next().expect("one run, one part"));
            }
        }
        // Scatter: the segments in request order, each from its run's buffer.
        let mut buf = BytesMut::with_capacity(len);
        for (index, run_at, segment) in in_request_order(&runs) {
            debug_assert_eq!(buf.len() as u64, segment.at);
            let range = run_at as usize..(run_at + segment.len) as usize;
            buf.extend_from_slice(&parts[index][range]);
        }
        assert_eq!(buf.len(), len);
        Ok(buf)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        if let Some((child, child_offset)) = self.inside_one_chunk(offset, data.len() as u64)? {
            return self.children[child].write(child_offset, data, flags).await;
        }
        let runs = self.plan(offset, data.len() as u64)?;
        try_join_all(runs.iter().map(|run| {
            let part = gather(&data, run);
            self.children[run.child].write(run.child_offset, part, flags)
        }))
        .await?;
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        if strata_core::planted::planted(strata_core::planted::Bug::StripeFlushDropped) {
            return Ok(());
        }
        try_join_all(self.children.iter().map(|c| c.flush())).await?;
        Ok(())
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        if !self.capabilities.discard {
            return Err(BlockError::Unsupported("stripe: a member cannot discard"));
        }
        let spans = spans(self.children.len(), self.chunk, offset, len);
        try_join_all(
            spans
                .iter()
                .map(|&(child, at, len)| self.children[child].discard(at, len)),
        )
        .await?;
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        let spans = spans(self.children.len(), self.chunk, offset, len);
        try_join_all(
            spans
                .iter()
                .map(|&(child, at, len)| self.children[child].write_zeroes(at, len, flags)),
        )
        .await?;
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry.check_range(offset, len)?;
        // The answer may be shorter than asked: bound the plan to a fixed number of chunks.
        let limit = BLOCK_STATUS_CHUNKS * self.chunk - offset % self.chunk;
        let runs = self.plan(offset, len.min(limit))?;
        let answers = try_join_all(
            runs.iter()
                .map(|run| self.children[run.child].block_status(run.child_offset, run.len)),
        )
        .await?;
        let takes = in_request_order(&runs)
            .into_iter()
            .map(|(answer, run_at, segment)| {
                let child_start = runs[answer].child_offset + run_at;
                Take::new(answer, child_start, segment.len, offset + segment.at)
            });
        Ok(merge_extents(&answers, takes))
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.describe().await?)),
            Control::Lock(request) => {
                // Each member's run is contiguous on it: one lock per member.
                let mut runs = self.plan(request.offset, request.len)?;
                runs.sort_by_key(|run| run.child);
                // Collected: handed over lazily, the closure trips async_trait's lifetime bounds.
                let pieces: Vec<_> = (runs.iter())
                    .map(|run| {
                        let range = run.child_offset..run.child_offset + run.len;
                        (&self.children[run.child], range)
                    })
                    .collect();
                let held = lock::lock_children(&request, pieces).await?;
                Ok(ControlReply::Lock(held))
            }
            _ => Err(BlockError::Unsupported("stripe: control")),
        }
    }
}

/// The bytes of `run` as one buffer: a zero-copy slice when the run is one segment.
fn gather(data: &Bytes, run: &Run) -> Bytes {
    let slice = |s: &Segment| data.slice(s.at as usize..(s.at + s.len) as usize);
    if let [segment] = run.segments[..] {
        return slice(&segment);
    }
    let mut buf = BytesMut::with_capacity(run.len as usize);
    for segment in &run.segments {
        buf.extend_from_slice(&slice(segment));
    }
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    #[test]
    fn the_one_chunk_shortcut_agrees_with_plan() {
        for offset in (0..8 * K).step_by(512) {
            for len in (0..=4 * K).step_by(512) {
                let runs = plan(3, K, offset, len);
                let expected = match &runs[..] {
                    [run] if run.segments.len() == 1 => Some((run.child, run.child_offset)),
                    _ => None,
                };
                assert_eq!(
                    inside_one_chunk(3, K, offset, len),
                    expected,
                    "[{offset}, +{len})"
                );
            }
        }
    }

    #[test]
    fn locate_deals_chunks_round_robin() {
        // 3 children, 4 KiB chunks: chunk 0 → d0@0, 1 → d1@0, 2 → d2@0, 3 → d0@4K, 7 → d1@8K.
        assert_eq!(locate(3, K, 0), (0, 0));
        assert_eq!(locate(3, K, K), (1, 0));
        assert_eq!(locate(3, K, 2 * K + 5), (2, 5));
        assert_eq!(locate(3, K, 3 * K), (0, K));
        assert_eq!(locate(3, K, 7 * K + 100), (1, 2 * K + 100));
    }

    #[test]
    fn a_request_inside_one_chunk_is_one_run() {
        let runs = plan(3, K, 3 * K + 512, 1024);
        assert_eq!(
            runs,
            vec![Run {
                child: 0,
                child_offset: K + 512,
                len: 1024,
                segments: vec![Segment { at: 0, len: 1024 }],
            }]
        );
    }

    #[test]
    fn consecutive_chunks_on_one_child_merge_into_one_run() {
        // 2 children, 4 KiB chunks, [2K, 2K + 16K): chunks 0..=4.
        // d0 gets chunk 0 (tail), 2, 4 (head) = child [2K, 10K); d1 gets 1, 3 = [0, 8K).
        let runs = plan(2, K, 2048, 4 * K);
        assert_eq!(runs.len(), 2);
        assert_eq!(
            (runs[0].child, runs[0].child_offset, runs[0].len),
            (0, 2048, 2048 + K + 2048)
        );
        assert_eq!(
            runs[0].segments,
            vec![
                Segment { at: 0, len: 2048 },
                Segment {
                    at: 2048 + K,
                    len: K
                },
                Segment {
                    at: 2048 + 3 * K,
                    len: 2048
                },
            ]
        );
        assert_eq!(
            (runs[1].child, runs[1].child_offset, runs[1].len),
            (1, 0, 2 * K)
        );
        let order: Vec<u64> = in_request_order(&runs)
            .iter()
            .map(|(_, _, s)| s.at)
            .collect();
        assert_eq!(order, vec![0, 2048, 2048 + K, 2048 + 2 * K, 2048 + 3 * K]);
    }

    #[test]
    fn a_megabyte_over_three_children_is_three_runs() {
        let chunk = 64 << 10;
        let runs = plan(3, chunk, 0, 1 << 20);
        let lens: Vec<u64> = runs.iter().map(|r| r.len).collect();
        // 16 chunks: d0 gets 0,3,..,15 (6 chunks), d1 and d2 get 5 each.
        assert_eq!(lens, vec![6 * chunk, 5 * chunk, 5 * chunk]);
        assert!(plan(3, chunk, 0, 0).is_empty());
    }

    #[test]
    fn spans_equal_the_runs_of_the_plan() {
        // Exhaustive over small shapes: every offset and length in sectors of 4 stripes.
        for members in 2..=4usize {
            let size = 4 * members as u64 * K;
            for offset in (0..size).step_by(512) {
                for len in (0..=size - offset).step_by(512) {
                    let mut from_plan: Vec<(usize, u64, u64)> = plan(members, K, offset, len)
                        .iter()
                        .map(|r| (r.child, r.child_offset, r.len))
                        .collect();
                    from_plan.sort();
                    assert_eq!(
                        spans(members, K, offset, len),
                        from_plan,
                        "{members} {offset} {len}"
                    );
                }
            }
        }
    }
}
