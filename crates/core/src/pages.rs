//! Sparse byte storage in 4 KiB pages: what the memory backend, the crash harness's disk
//! images and the simulator's disks keep their bytes in.
//!
//! Absent pages read as zeros and cost nothing. Pages are shared between clones (`Arc`) and
//! copied on their first write after a clone, so a crash test can snapshot an image cheaply;
//! a store that is never cloned pays one reference-count check per page written.
//!
//! The store does not check ranges against a device size: its users do (a device answers
//! `OutOfRange`, a test image panics), and `offset + len` must not overflow.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use crate::split::split_at_units;
use crate::{push_extent, Extent, ExtentState};

/// Page size of a store, independent of any device's `min_io`: a byte-addressable device
/// still allocates whole pages, and a device demanding 4 KiB I/O never touches part of one.
pub const PAGE: usize = 4096;
const PAGE_U64: u64 = PAGE as u64;

type Page = Arc<[u8; PAGE]>;

/// Sparse content: page index → bytes; absent pages are zeros. Cloning shares the pages.
#[derive(Clone, Default)]
pub struct PageStore {
    /// A BTreeMap so that allocation queries walk only the present pages of a range.
    pages: BTreeMap<u64, Page>,
}

/// The part of one page a byte range covers.
struct Segment {
    index: u64,
    /// Offset inside the page.
    start: usize,
    len: usize,
    /// Offset inside the range.
    done: usize,
}

impl Segment {
    fn in_page(&self) -> Range<usize> {
        self.start..self.start + self.len
    }

    fn in_range(&self) -> Range<usize> {
        self.done..self.done + self.len
    }

    fn is_whole_page(&self) -> bool {
        self.len == PAGE
    }
}

/// Splits `[offset, offset + len)` at page boundaries.
fn segments(offset: u64, len: u64) -> impl Iterator<Item = Segment> {
    split_at_units(offset, len, PAGE_U64).map(|piece| Segment {
        index: piece.unit,
        start: piece.within as usize,
        len: piece.len as usize,
        done: piece.done as usize,
    })
}

fn is_zeros(bytes: &[u8]) -> bool {
    bytes.iter().all(|&byte| byte == 0)
}

impl PageStore {
    /// A store holding nothing (all zeros).
    pub fn new() -> Self {
        Self::default()
    }

    /// Fills `out` with the bytes at `offset`.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) {
        for segment in segments(offset, out.len() as u64) {
            let dest = &mut out[segment.in_range()];
            match self.pages.get(&segment.index) {
                Some(page) => dest.copy_from_slice(&page[segment.in_page()]),
                None => dest.fill(0),
            }
        }
    }

    /// Appends the `len` bytes at `offset` to `buf` (no zeroing pass over fresh memory).
    pub fn read_append(&self, offset: u64, len: usize, buf: &mut BytesMut) {
        for segment in segments(offset, len as u64) {
            match self.pages.get(&segment.index) {
                Some(page) => buf.extend_from_slice(&page[segment.in_page()]),
                None => buf.put_bytes(0, segment.len),
            }
        }
    }

    /// Stores `data` at `offset`, allocating every page it touches (so that written ranges
    /// show as data, as on a file).
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        for segment in segments(offset, data.len() as u64) {
            let page = self
                .pages
                .entry(segment.index)
                .or_insert_with(|| Arc::new([0; PAGE]));
            Arc::make_mut(page)[segment.in_page()].copy_from_slice(&data[segment.in_range()]);
        }
    }

    /// Stores `data` at `offset` but allocates no page for zeros that land in a hole (a
    /// simulated disk holding hundreds of GB of zeros keeps nothing for them).
    pub fn write_sparse(&mut self, offset: u64, data: &[u8]) {
        for segment in segments(offset, data.len() as u64) {
            let bytes = &data[segment.in_range()];
            match self.pages.get_mut(&segment.index) {
                Some(page) => Arc::make_mut(page)[segment.in_page()].copy_from_slice(bytes),
                None if is_zeros(bytes) => {}
                None => {
                    let mut page = [0; PAGE];
                    page[segment.in_page()].copy_from_slice(bytes);
                    self.pages.insert(segment.index, Arc::new(page));
                }
            }
        }
    }

    /// Makes `[offset, offset + len)` read as zeros. Frees the pages it covers entirely and
    /// the pages that end up all zeros, which are indistinguishable from holes (so allocation
    /// queries report them as holes and memory is given back).
    pub fn zero(&mut self, offset: u64, len: u64) {
        for segment in segments(offset, len) {
            if segment.is_whole_page() {
                self.pages.remove(&segment.index);
            } else if let Some(page) = self.pages.get_mut(&segment.index) {
                let page = Arc::make_mut(page);
                page[segment.in_page()].fill(0);
                if is_zeros(&page[..]) {
                    self.pages.remove(&segment.index);
                }
            }
        }
    }

    /// Whether every byte of the range is zero.
    pub fn is_zero(&self, offset: u64, len: u64) -> bool {
        segments(offset, len).all(|segment| match self.pages.get(&segment.index) {
            Some(page) => is_zeros(&page[segment.in_page()]),
            None => true,
        })
    }

    /// Whether `[offset, offset + len)` holds the same bytes in both stores (without copying;
    /// an absent page equals a present page of zeros).
    pub fn range_eq(&self, other: &PageStore, offset: u64, len: u64) -> bool {
        let zero = [0u8; PAGE];
        segments(offset, len).all(|segment| {
            let mine = self.pages.get(&segment.index).map_or(&zero, |page| &**page);
            let theirs = other
                .pages
                .get(&segment.index)
                .map_or(&zero, |page| &**page);
            mine[segment.in_page()] == theirs[segment.in_page()]
        })
    }

    /// Whether both stores hold the same bytes everywhere (an absent page equals a present
    /// page of zeros); looks only at present pages.
    pub fn content_eq(&self, other: &PageStore) -> bool {
        let zero = [0u8; PAGE];
        let indexes: BTreeSet<u64> = self
            .pages
            .keys()
            .chain(other.pages.keys())
            .copied()
            .collect();
        indexes.into_iter().all(|index| {
            let mine = self.pages.get(&index).map_or(&zero, |page| &**page);
            let theirs = other.pages.get(&index).map_or(&zero, |page| &**page);
            mine == theirs
        })
    }

    /// Number of present pages.
    pub fn allocated_pages(&self) -> usize {
        self.pages.len()
    }

    /// Bytes held by present pages.
    pub fn allocated_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE_U64
    }

    /// Allocation of `[offset, offset + len)`: present pages as `Data`, the rest as `Hole`,
    /// merged, covering the range exactly (no extent for an empty range).
    pub fn extents(&self, offset: u64, len: u64) -> Vec<Extent> {
        let mut extents = Vec::new();
        if len == 0 {
            return extents;
        }
        let end = offset + len;
        let mut pos = offset;
        for &index in self
            .pages
            .range(offset / PAGE_U64..=(end - 1) / PAGE_U64)
            .map(|(index, _)| index)
        {
            let data_start = (index * PAGE_U64).max(offset);
            let data_end = (index * PAGE_U64 + PAGE_U64).min(end);
            push_extent(&mut extents, extent(pos, data_start, ExtentState::Hole));
            push_extent(
                &mut extents,
                extent(data_start, data_end, ExtentState::Data),
            );
            pos = data_end;
        }
        push_extent(&mut extents, extent(pos, end, ExtentState::Hole));
        extents
    }
}

fn extent(start: u64, end: u64, state: ExtentState) -> Extent {
    Extent {
        offset: start,
        len: end - start,
        state,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Small enough that random ranges often share pages, large enough for several pages.
    const SIZE: u64 = 6 * PAGE_U64 + 100;

    #[derive(Clone, Debug)]
    enum Step {
        Write(u64, Vec<u8>),
        WriteSparse(u64, Vec<u8>),
        Zero(u64, u64),
        Snapshot,
    }

    fn range() -> impl Strategy<Value = (u64, u64)> {
        (0..SIZE).prop_flat_map(|offset| (Just(offset), 0..=(SIZE - offset).min(3 * PAGE_U64)))
    }

    fn data() -> impl Strategy<Value = (u64, Vec<u8>)> {
        // Built from a seed rather than byte by byte (fast), and often all zeros or sparse,
        // so that pages becoming all zeros (and zero writes into holes) are common.
        (range(), any::<u8>(), 0..4usize).prop_map(|((offset, len), seed, density)| {
            let byte = |i: usize| match density {
                0 => 0,
                1 => u8::from(i.is_multiple_of(997)) * seed.max(1),
                _ => (i as u8).wrapping_mul(31).wrapping_add(seed),
            };
            (offset, (0..len as usize).map(byte).collect())
        })
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            data().prop_map(|(o, d)| Step::Write(o, d)),
            data().prop_map(|(o, d)| Step::WriteSparse(o, d)),
            range().prop_map(|(o, n)| Step::Zero(o, n)),
            Just(Step::Snapshot),
        ]
    }

    fn apply(model: &mut [u8], offset: u64, data: &[u8]) {
        model[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    proptest! {
        #[test]
        fn behaves_as_a_flat_byte_array(steps in proptest::collection::vec(step(), 1..40),
                                        probes in proptest::collection::vec(range(), 8)) {
            let mut store = PageStore::new();
            let mut model = vec![0u8; SIZE as usize];
            // Snapshots must keep their contents while the store changes after them.
            let mut snapshots = Vec::new();
            for step in steps {
                match step {
                    Step::Write(offset, data) => {
                        store.write(offset, &data);
                        apply(&mut model, offset, &data);
                    }
                    Step::WriteSparse(offset, data) => {
                        store.write_sparse(offset, &data);
                        apply(&mut model, offset, &data);
                    }
                    Step::Zero(offset, len) => {
                        store.zero(offset, len);
                        model[offset as usize..(offset + len) as usize].fill(0);
                    }
                    Step::Snapshot => snapshots.push((store.clone(), model.clone())),
                }
            }
            let mut whole = vec![0xAA; SIZE as usize];
            store.read_into(0, &mut whole);
            prop_assert_eq!(&whole, &model);
            for (snapshot, expected) in &snapshots {
                prop_assert_eq!(snapshot.content_eq(&store), expected == &model);
                let mut bytes = vec![0xAA; SIZE as usize];
                snapshot.read_into(0, &mut bytes);
                prop_assert_eq!(&bytes, expected);
            }
            for (offset, len) in probes {
                let (start, end) = (offset as usize, (offset + len) as usize);
                let mut appended = BytesMut::from(&b"x"[..]);
                store.read_append(offset, len as usize, &mut appended);
                prop_assert_eq!(&appended[1..], &model[start..end]);
                prop_assert_eq!(store.is_zero(offset, len), model[start..end].iter().all(|&b| b == 0));
                let other = PageStore::new();
                prop_assert_eq!(store.range_eq(&other, offset, len), store.is_zero(offset, len));
                prop_assert_eq!(store.content_eq(&other), model.iter().all(|&b| b == 0));
                let extents = store.extents(offset, len);
                // Contiguous, exact cover, merged, and holes read as zeros.
                let mut pos = offset;
                for (i, e) in extents.iter().enumerate() {
                    prop_assert_eq!(e.offset, pos);
                    prop_assert!(e.len > 0);
                    if i > 0 {
                        prop_assert_ne!(extents[i - 1].state, e.state);
                    }
                    if e.state == ExtentState::Hole {
                        prop_assert!(model[e.offset as usize..(e.offset + e.len) as usize]
                            .iter().all(|&b| b == 0));
                    }
                    pos += e.len;
                }
                prop_assert_eq!(pos, offset + len);
            }
            // No page is held that the model says is zero after a zeroing of all of it.
            let mut cleared = store.clone();
            cleared.zero(0, SIZE);
            prop_assert_eq!(cleared.allocated_pages(), 0);
        }
    }

    #[test]
    fn zero_writes_allocate_only_when_not_sparse() {
        let mut store = PageStore::new();
        store.write_sparse(0, &[0; 10]);
        assert_eq!(store.allocated_pages(), 0);
        store.write(0, &[0; 10]);
        assert_eq!(store.allocated_bytes(), PAGE_U64);
        assert_eq!(
            store.extents(0, 2 * PAGE_U64),
            vec![
                extent(0, PAGE_U64, ExtentState::Data),
                extent(PAGE_U64, 2 * PAGE_U64, ExtentState::Hole)
            ]
        );
        store.write(PAGE_U64 - 1, &[1, 2]);
        store.zero(PAGE_U64 - 1, 1);
        // Page 0 is all zeros again and is freed; page 1 keeps its byte.
        assert_eq!(store.allocated_pages(), 1);
        assert!(store.extents(0, 1)[0].state == ExtentState::Hole);
    }
}
