//! The typed objects a layer keeps: sparse tables of fixed-size records and sparse bitmaps.
//!
//! Both are paged so that memory and checkpoint space follow what is set, not the index
//! space: a page that becomes all zeros is dropped. An absent entry reads as all zeros, so a
//! layer encodes "unset" as zero (a thin map stores physical extent + 1).
//!
//! Memory: a table page of 64 entries costs 64 × value_size bytes plus about 48 bytes of page
//! and tree overhead, so a dense 4-byte table costs about 4.8 bytes per entry. A bitmap page
//! covers 4096 bits in 512 bytes plus the same overhead.

use std::collections::BTreeMap;

/// Entries per table page.
pub const TABLE_PAGE_ENTRIES: u64 = 64;
/// Bits per bitmap page.
pub const BITMAP_PAGE_BITS: u64 = 4096;
const BITMAP_PAGE_WORDS: usize = (BITMAP_PAGE_BITS / 64) as usize;
/// Largest record a table holds.
pub const MAX_VALUE_SIZE: usize = 256;

/// One table record on its way in a transaction, or an old one kept to undo it. Records are
/// a few bytes (a brick's map holds 8 per 4 KiB unit, and a 1 MiB commit sets 256 of them):
/// kept inline, they cost no allocation, where a `Vec` cost one for the op and one for its
/// undo (in a profile of a brick, allocation was about half of the 4.5 % its carried commits'
/// transactions took). Longer records spill to the heap.
pub type Value = smallvec::SmallVec<[u8; 16]>;

/// Bytes a table page takes in a checkpoint besides its present values: its page number and
/// the mask of its present entries (format version 3; versions 1 and 2 stored all 64 values).
pub const TABLE_PAGE_HEADER_BYTES: u64 = 16;

/// Bytes a bitmap page takes in a checkpoint.
pub const BITMAP_PAGE_BYTES: u64 = 8 + BITMAP_PAGE_BITS / 8;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TablePage {
    pub(crate) values: Box<[u8]>,
    /// Entries in this page that are not all zeros.
    pub(crate) present: u32,
}

/// A sparse array of fixed-size records indexed by u64.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    value_size: usize,
    pub(crate) pages: BTreeMap<u64, TablePage>,
    present: u64,
}

impl Table {
    pub fn new(value_size: usize) -> Self {
        assert!((1..=MAX_VALUE_SIZE).contains(&value_size));
        Table {
            value_size,
            pages: BTreeMap::new(),
            present: 0,
        }
    }

    pub fn value_size(&self) -> usize {
        self.value_size
    }

    /// Entries that are not all zeros.
    pub fn len(&self) -> u64 {
        self.present
    }

    pub fn is_empty(&self) -> bool {
        self.present == 0
    }

    /// The record at `index`, or None when it is all zeros.
    pub fn get(&self, index: u64) -> Option<&[u8]> {
        let page = self.pages.get(&(index / TABLE_PAGE_ENTRIES))?;
        let value = &page.values[self.slot(index)];
        value.iter().any(|&b| b != 0).then_some(value)
    }

    /// The record at `index` as a little-endian u32 (0 when absent). For 4-byte tables.
    pub fn get_u32(&self, index: u64) -> u32 {
        debug_assert_eq!(self.value_size, 4);
        self.get(index).map_or(0, |v| {
            u32::from_le_bytes(v.try_into().expect("4-byte table"))
        })
    }

    /// Entries that are not all zeros, in index order, from `start`.
    pub fn iter_from(&self, start: u64) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        let size = self.value_size;
        self.pages
            .range(start / TABLE_PAGE_ENTRIES..)
            .flat_map(move |(page_no, page)| {
                page.values
                    .chunks_exact(size)
                    .enumerate()
                    .map(move |(i, v)| (page_no * TABLE_PAGE_ENTRIES + i as u64, v))
            })
            .filter(move |(index, value)| *index >= start && value.iter().any(|&b| b != 0))
    }

    /// Pages held, for accounting.
    pub fn pages(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Bytes the table's pages take in a checkpoint: a header per page, then only the
    /// present values, so a sparse table costs what is set rather than whole pages.
    pub fn encoded_bytes(&self) -> u64 {
        self.pages() * TABLE_PAGE_HEADER_BYTES + self.present * self.value_size as u64
    }

    fn slot(&self, index: u64) -> std::ops::Range<usize> {
        let at = (index % TABLE_PAGE_ENTRIES) as usize * self.value_size;
        at..at + self.value_size
    }

    /// Sets a record and returns its previous value and the change in checkpoint bytes.
    pub(crate) fn set(&mut self, index: u64, value: &[u8]) -> (Value, i64) {
        assert_eq!(value.len(), self.value_size);
        let slot = self.slot(index);
        let page_no = index / TABLE_PAGE_ENTRIES;
        let value_bytes = self.value_size as i64;
        let new_nonzero = value.iter().any(|&b| b != 0);
        let Some(page) = self.pages.get_mut(&page_no) else {
            let old = Value::from_elem(0, self.value_size);
            if !new_nonzero {
                return (old, 0);
            }
            let mut values = vec![0; TABLE_PAGE_ENTRIES as usize * self.value_size];
            values[slot].copy_from_slice(value);
            let page = TablePage {
                values: values.into_boxed_slice(),
                present: 1,
            };
            self.pages.insert(page_no, page);
            self.present += 1;
            return (old, TABLE_PAGE_HEADER_BYTES as i64 + value_bytes);
        };
        let old = Value::from_slice(&page.values[slot.clone()]);
        let old_nonzero = old.iter().any(|&b| b != 0);
        page.values[slot].copy_from_slice(value);
        let delta = match (old_nonzero, new_nonzero) {
            (false, true) => {
                page.present += 1;
                self.present += 1;
                value_bytes
            }
            (true, false) => {
                page.present -= 1;
                self.present -= 1;
                -value_bytes
            }
            _ => 0,
        };
        debug_assert!(page.present as u64 <= TABLE_PAGE_ENTRIES);
        if page.present == 0 {
            self.pages.remove(&page_no);
            return (old, delta - TABLE_PAGE_HEADER_BYTES as i64);
        }
        (old, delta)
    }

    /// The pages with, for each, the mask of its present entries (bit i: entry i of the
    /// page is not all zeros) and its values: what a checkpoint stores.
    pub(crate) fn pages_with_masks(&self) -> impl Iterator<Item = (u64, u64, &[u8])> + '_ {
        let size = self.value_size;
        self.pages.iter().map(move |(page_no, page)| {
            let mask = page
                .values
                .chunks_exact(size)
                .enumerate()
                .filter(|(_, v)| v.iter().any(|&b| b != 0))
                .fold(0u64, |mask, (i, _)| mask | 1 << i);
            (*page_no, mask, &page.values[..])
        })
    }

    /// Inserts a whole page read from a checkpoint. Returns false if the page is malformed.
    pub(crate) fn insert_page(&mut self, page_no: u64, values: Box<[u8]>) -> bool {
        if values.len() != TABLE_PAGE_ENTRIES as usize * self.value_size {
            return false;
        }
        let present = values
            .chunks_exact(self.value_size)
            .filter(|v| v.iter().any(|&b| b != 0))
            .count() as u32;
        if present == 0 || self.pages.contains_key(&page_no) {
            return false;
        }
        self.present += present as u64;
        self.pages.insert(page_no, TablePage { values, present });
        true
    }
}

/// What a page costs in memory besides its bits: its slot in a B-tree node (key, value,
/// share of the node) and its box, about 48 bytes.
pub const PAGE_OVERHEAD: u64 = 48;

/// Set bits of a page at most this many are kept as a sorted list of positions (2 bytes each)
/// rather than 512 bytes of words: a thin pool's liveness bitmap is mostly pages where each
/// extent has a few live granules, or whole extents live (a full page costs nothing).
const SPARSE_MAX: u32 = 128;

/// One page of a bitmap in memory. The representation follows from the count of set bits
/// alone (canonical), so equal pages compare equal. The checkpoint always stores the words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BitmapPage {
    bits: PageBits,
    pub(crate) ones: u32,
}

/// Set bits of a page at most this many are kept inline, in the page's own B-tree slot, with
/// no allocation (a 4 MiB extent has 1,024 granules: 4 extents a page, often one live granule
/// each).
const FEW_MAX: usize = 8;

#[derive(Clone, Debug, PartialEq, Eq)]
enum PageBits {
    /// `1..=FEW_MAX` set bits, their positions ascending in `positions[..len]`, the rest 0.
    Few {
        len: u8,
        positions: [u16; FEW_MAX],
    },
    /// `FEW_MAX + 1..=SPARSE_MAX` set bits, their positions ascending.
    Sparse(Box<[u16]>),
    Dense(Box<[u64; BITMAP_PAGE_WORDS]>),
    /// Every bit set.
    Full,
}

impl BitmapPage {
    /// The page holding `words`, or `None` when no bit is set.
    pub(crate) fn from_words(words: &[u64; BITMAP_PAGE_WORDS]) -> Option<BitmapPage> {
        let ones: u32 = words.iter().map(|w| w.count_ones()).sum();
        let bits = match ones {
            0 => return None,
            n if n as u64 == BITMAP_PAGE_BITS => PageBits::Full,
            n if n <= SPARSE_MAX => {
                let mut positions = Vec::with_capacity(n as usize);
                for (index, &word) in words.iter().enumerate() {
                    let mut rest = word;
                    while rest != 0 {
                        positions.push((index * 64) as u16 + rest.trailing_zeros() as u16);
                        rest &= rest - 1;
                    }
                }
                if positions.len() <= FEW_MAX {
                    let mut few = [0u16; FEW_MAX];
                    few[..positions.len()].copy_from_slice(&positions);
                    PageBits::Few {
                        len: positions.len() as u8,
                        positions: few,
                    }
                } else {
                    PageBits::Sparse(positions.into_boxed_slice())
                }
            }
            _ => PageBits::Dense(Box::new(*words)),
        };
        Some(BitmapPage { bits, ones })
    }

    /// The set bits' positions, for the two list representations.
    fn positions(&self) -> Option<&[u16]> {
        match &self.bits {
            PageBits::Few { len, positions } => Some(&positions[..*len as usize]),
            PageBits::Sparse(positions) => Some(positions),
            PageBits::Dense(_) | PageBits::Full => None,
        }
    }

    pub(crate) fn words(&self) -> [u64; BITMAP_PAGE_WORDS] {
        if let Some(positions) = self.positions() {
            let mut words = [0u64; BITMAP_PAGE_WORDS];
            for &b in positions {
                words[b as usize / 64] |= 1 << (b % 64);
            }
            return words;
        }
        match &self.bits {
            PageBits::Full => [u64::MAX; BITMAP_PAGE_WORDS],
            PageBits::Dense(words) => **words,
            PageBits::Few { .. } | PageBits::Sparse(_) => unreachable!("handled above"),
        }
    }

    fn get(&self, within: u64) -> bool {
        if let Some(positions) = self.positions() {
            return positions.binary_search(&(within as u16)).is_ok();
        }
        match &self.bits {
            PageBits::Full => true,
            PageBits::Dense(words) => words[(within / 64) as usize] >> (within % 64) & 1 == 1,
            PageBits::Few { .. } | PageBits::Sparse(_) => unreachable!("handled above"),
        }
    }

    /// Set bits in `[lo, hi)` of the page.
    fn count(&self, lo: u64, hi: u64) -> u64 {
        if let Some(positions) = self.positions() {
            let from = positions.partition_point(|&b| (b as u64) < lo);
            let to = positions.partition_point(|&b| (b as u64) < hi);
            return (to - from) as u64;
        }
        match &self.bits {
            PageBits::Full => hi - lo,
            PageBits::Few { .. } | PageBits::Sparse(_) => unreachable!("handled above"),
            PageBits::Dense(words) => {
                let mut count = 0u64;
                let mut within = lo;
                while within < hi {
                    let word = (within / 64) as usize;
                    let first = within % 64;
                    let last = (hi - word as u64 * 64).min(64);
                    let mask = if last - first == 64 {
                        u64::MAX
                    } else {
                        ((1u64 << (last - first)) - 1) << first
                    };
                    count += (words[word] & mask).count_ones() as u64;
                    within = word as u64 * 64 + last;
                }
                count
            }
        }
    }
}

/// A sparse bitmap over u64 bit numbers; absent pages are all clear.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bitmap {
    pub(crate) pages: BTreeMap<u64, BitmapPage>,
    ones: u64,
}

/// The pages a bit-range operation changed, as they were before, for undo.
pub(crate) type BitmapUndo = Vec<(u64, Option<BitmapPage>)>;

impl Bitmap {
    /// A bitmap with exactly these bits set (for tests and tools; layers change bitmaps
    /// through transactions).
    pub fn from_bits(bits: impl IntoIterator<Item = u64>) -> Bitmap {
        let mut bitmap = Bitmap::default();
        for bit in bits {
            bitmap.set_range(bit, 1, true);
        }
        bitmap
    }

    pub fn get(&self, bit: u64) -> bool {
        self.pages
            .get(&(bit / BITMAP_PAGE_BITS))
            .is_some_and(|page| page.get(bit % BITMAP_PAGE_BITS))
    }

    pub fn count_ones(&self) -> u64 {
        self.ones
    }

    /// Set bits in `[start, start + len)`: one page lookup per page and a popcount per word,
    /// so that a thin pool can count the live granules of every extent at scrape time.
    pub fn count_range(&self, start: u64, len: u64) -> u64 {
        let end = start + len;
        let mut count = 0u64;
        let mut bit = start;
        while bit < end {
            let page_no = bit / BITMAP_PAGE_BITS;
            let page_end = ((page_no + 1) * BITMAP_PAGE_BITS).min(end);
            if let Some(page) = self.pages.get(&page_no) {
                let base = page_no * BITMAP_PAGE_BITS;
                count += page.count(bit - base, page_end - base);
            }
            bit = page_end;
        }
        count
    }

    /// Whether every bit of `[start, start + len)` has `value`.
    pub fn all(&self, start: u64, len: u64, value: bool) -> bool {
        (start..start + len).all(|bit| self.get(bit) == value)
    }

    /// The first bit in `[from, limit)` whose value is `value`.
    pub fn next(&self, from: u64, limit: u64, value: bool) -> Option<u64> {
        let mut bit = from;
        while bit < limit {
            let page_no = bit / BITMAP_PAGE_BITS;
            let page_end = ((page_no + 1) * BITMAP_PAGE_BITS).min(limit);
            match self.pages.get(&page_no) {
                None if !value => return Some(bit),
                None => {
                    // Skip straight to the next present page.
                    let next = self.pages.range(page_no + 1..).next()?;
                    bit = (*next.0 * BITMAP_PAGE_BITS).max(page_end);
                    continue;
                }
                Some(page) if page.ones == 0 && value => {}
                Some(page) if page.ones as u64 == BITMAP_PAGE_BITS && !value => {}
                Some(page) => {
                    for b in bit..page_end {
                        if page.get(b % BITMAP_PAGE_BITS) == value {
                            return Some(b);
                        }
                    }
                }
            }
            bit = page_end;
        }
        None
    }

    pub fn pages(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Memory the pages hold, estimated: each page's bits (2 bytes a set bit when sparse,
    /// 512 when dense, none when full) plus `PAGE_OVERHEAD` for its B-tree slot and box.
    pub fn memory_bytes(&self) -> u64 {
        self.pages
            .values()
            .map(|page| {
                PAGE_OVERHEAD
                    + match &page.bits {
                        PageBits::Full | PageBits::Few { .. } => 0,
                        PageBits::Sparse(positions) => 2 * positions.len() as u64,
                        PageBits::Dense(_) => BITMAP_PAGE_BITS / 8,
                    }
            })
            .sum()
    }

    /// Sets `count` bits from `start` to `value`. Returns the pages as they were (for undo)
    /// and the change in checkpoint bytes.
    pub(crate) fn set_range(&mut self, start: u64, count: u64, value: bool) -> (BitmapUndo, i64) {
        let mut undo = Vec::new();
        let mut delta = 0i64;
        let mut bit = start;
        let end = start + count;
        while bit < end {
            let page_no = bit / BITMAP_PAGE_BITS;
            let page_end = ((page_no + 1) * BITMAP_PAGE_BITS).min(end);
            let before = self.pages.get(&page_no).cloned();
            if before.is_none() && !value {
                bit = page_end;
                continue;
            }
            let mut words = before
                .as_ref()
                .map_or([0u64; BITMAP_PAGE_WORDS], BitmapPage::words);
            for b in bit..page_end {
                let within = b % BITMAP_PAGE_BITS;
                let mask = 1u64 << (within % 64);
                let word = &mut words[(within / 64) as usize];
                if value {
                    *word |= mask;
                } else {
                    *word &= !mask;
                }
            }
            let was = before.as_ref().map_or(0, |p| p.ones);
            match BitmapPage::from_words(&words) {
                Some(page) => {
                    self.ones = self.ones + page.ones as u64 - was as u64;
                    if before.is_none() {
                        delta += BITMAP_PAGE_BYTES as i64;
                    }
                    self.pages.insert(page_no, page);
                }
                None => {
                    self.ones -= was as u64;
                    if self.pages.remove(&page_no).is_some() {
                        delta -= BITMAP_PAGE_BYTES as i64;
                    }
                }
            }
            undo.push((page_no, before));
            bit = page_end;
        }
        (undo, delta)
    }

    /// Puts pages back as [`Bitmap::set_range`] found them.
    pub(crate) fn restore(&mut self, undo: BitmapUndo) -> i64 {
        let mut delta = 0i64;
        for (page_no, before) in undo.into_iter().rev() {
            let removed = self.pages.remove(&page_no);
            if let Some(page) = &removed {
                self.ones -= page.ones as u64;
                delta -= BITMAP_PAGE_BYTES as i64;
            }
            if let Some(page) = before {
                self.ones += page.ones as u64;
                delta += BITMAP_PAGE_BYTES as i64;
                self.pages.insert(page_no, page);
            }
        }
        delta
    }

    /// Inserts a whole page read from a checkpoint. Returns false if it is malformed.
    pub(crate) fn insert_page(
        &mut self,
        page_no: u64,
        words: Box<[u64; BITMAP_PAGE_WORDS]>,
    ) -> bool {
        let Some(page) = BitmapPage::from_words(&words) else {
            return false;
        };
        if self.pages.contains_key(&page_no) {
            return false;
        }
        self.ones += page.ones as u64;
        self.pages.insert(page_no, page);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pages_come_and_go_with_their_entries() {
        let mut table = Table::new(4);
        assert_eq!(table.get(5), None);
        let (old, delta) = table.set(5, &7u32.to_le_bytes());
        assert_eq!(&old[..], &[0; 4]);
        assert_eq!(delta, TABLE_PAGE_HEADER_BYTES as i64 + 4);
        assert_eq!(table.get_u32(5), 7);
        assert_eq!(table.len(), 1);
        let (_, delta) = table.set(6, &1u32.to_le_bytes());
        assert_eq!(delta, 4, "same page: one more value");
        let (_, delta) = table.set(6, &2u32.to_le_bytes());
        assert_eq!(delta, 0, "a value replaced");
        assert_eq!(table.encoded_bytes(), TABLE_PAGE_HEADER_BYTES + 8);
        let (old, delta) = table.set(5, &[0; 4]);
        assert_eq!(&old[..], 7u32.to_le_bytes());
        assert_eq!(delta, -4);
        let (_, delta) = table.set(6, &[0; 4]);
        assert_eq!(delta, -(TABLE_PAGE_HEADER_BYTES as i64 + 4));
        assert_eq!(table.encoded_bytes(), 0);
        assert!(table.is_empty());
        assert_eq!(table.pages(), 0);
    }

    #[test]
    fn table_iterates_present_entries_in_order() {
        let mut table = Table::new(8);
        for index in [1000u64, 3, 64, 65] {
            table.set(index, &(index + 1).to_le_bytes());
        }
        let indexes: Vec<u64> = table.iter_from(4).map(|(i, _)| i).collect();
        assert_eq!(indexes, vec![64, 65, 1000]);
    }

    #[test]
    fn bitmap_ranges_count_and_undo() {
        let mut bitmap = Bitmap::default();
        let (undo, delta) = bitmap.set_range(4090, 10, true);
        assert_eq!(delta, 2 * BITMAP_PAGE_BYTES as i64, "spans two pages");
        assert_eq!(bitmap.count_ones(), 10);
        assert!(bitmap.get(4099));
        assert!(!bitmap.get(4100));
        assert_eq!(bitmap.next(0, 10_000, true), Some(4090));
        assert_eq!(bitmap.next(4090, 10_000, false), Some(4100));
        assert_eq!(bitmap.next(0, 4000, true), None);
        assert_eq!(bitmap.count_range(4095, 100), 5);
        let restored = bitmap.restore(undo);
        assert_eq!(restored, -delta);
        assert_eq!(bitmap.count_ones(), 0);
        assert_eq!(bitmap.pages(), 0);
        assert_eq!(bitmap.next(0, 10_000, true), None);
        assert_eq!(bitmap.next(7, 10_000, false), Some(7));
    }

    #[test]
    fn count_range_agrees_with_counting_bit_by_bit() {
        let mut bitmap = Bitmap::default();
        for (start, count) in [(3u64, 70u64), (4000, 200), (9000, 1), (12_287, 2)] {
            bitmap.set_range(start, count, true);
        }
        let slow = |start: u64, len: u64| (start..start + len).filter(|&b| bitmap.get(b)).count();
        for (start, len) in [
            (0u64, 20_000u64),
            (3, 70),
            (4, 68),
            (64, 64),
            (63, 2),
            (4090, 10),
            (8191, 2),
            (12_287, 1),
            (5000, 3000),
            (0, 0),
        ] {
            assert_eq!(
                bitmap.count_range(start, len),
                slow(start, len) as u64,
                "[{start}, +{len})"
            );
        }
    }

    #[test]
    fn bitmap_next_clear_skips_full_pages() {
        let mut bitmap = Bitmap::default();
        bitmap.set_range(0, 2 * BITMAP_PAGE_BITS + 3, true);
        assert_eq!(
            bitmap.next(0, u64::MAX, false),
            Some(2 * BITMAP_PAGE_BITS + 3)
        );
        assert!(bitmap.all(0, 100, true));
        bitmap.set_range(17, 1, false);
        assert_eq!(bitmap.next(0, u64::MAX, false), Some(17));
    }

    /// Pages change representation (sparse, dense, full) as bits come and go; whatever the
    /// path, the bitmap answers like a set of bits, restores exactly, and the same bits give
    /// equal bitmaps (the crash suites compare recovered state with `==`).
    mod pages {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeSet;

        fn ops() -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
            // Two pages and a bit; long runs fill pages (full), short ones stay sparse.
            let range = (0..2 * BITMAP_PAGE_BITS + 64).prop_flat_map(|start| {
                (
                    Just(start),
                    prop_oneof![1..4u64, 100..300u64, 3000..5000u64],
                    any::<bool>(),
                )
            });
            proptest::collection::vec(range, 1..40)
        }

        proptest! {
            #[test]
            fn a_bitmap_behaves_as_a_set_of_bits(ops in ops()) {
                let mut bitmap = Bitmap::default();
                let mut model = BTreeSet::new();
                for (start, count, value) in ops {
                    let snapshot = bitmap.clone();
                    let (undo, delta) = bitmap.set_range(start, count, value);
                    for bit in start..start + count {
                        if value { model.insert(bit); } else { model.remove(&bit); }
                    }
                    prop_assert_eq!(bitmap.count_ones(), model.len() as u64);
                    let mut undone = bitmap.clone();
                    prop_assert_eq!(undone.restore(undo), -delta);
                    prop_assert_eq!(&undone, &snapshot);
                }
                let end = 2 * BITMAP_PAGE_BITS + 64 + 5000;
                for bit in (0..end).step_by(7) {
                    prop_assert_eq!(bitmap.get(bit), model.contains(&bit));
                }
                for (start, len) in [(0, end), (5, 4091), (4096, 4096), (8190, 70)] {
                    prop_assert_eq!(
                        bitmap.count_range(start, len),
                        model.range(start..start + len).count() as u64
                    );
                }
                prop_assert_eq!(bitmap.next(0, end, true), model.iter().next().copied());
                // The same bits built one by one, in another order, give an equal bitmap.
                let mut rebuilt = Bitmap::default();
                for bit in model.iter().rev() {
                    rebuilt.set_range(*bit, 1, true);
                }
                prop_assert_eq!(&rebuilt, &bitmap);
                // And through the words a checkpoint stores.
                let mut loaded = Bitmap::default();
                for (page_no, page) in &bitmap.pages {
                    prop_assert!(loaded.insert_page(*page_no, Box::new(page.words())));
                }
                prop_assert_eq!(&loaded, &bitmap);
            }
        }

        #[test]
        fn representation_follows_the_count_of_set_bits() {
            let mut bitmap = Bitmap::default();
            bitmap.set_range(0, FEW_MAX as u64, true);
            assert!(matches!(
                bitmap.pages[&0].bits,
                PageBits::Few { len: 8, .. }
            ));
            bitmap.set_range(0, SPARSE_MAX as u64, true);
            assert!(matches!(bitmap.pages[&0].bits, PageBits::Sparse(_)));
            bitmap.set_range(SPARSE_MAX as u64, 1, true);
            assert!(matches!(bitmap.pages[&0].bits, PageBits::Dense(_)));
            bitmap.set_range(0, BITMAP_PAGE_BITS, true);
            assert!(matches!(bitmap.pages[&0].bits, PageBits::Full));
            bitmap.set_range(5, BITMAP_PAGE_BITS - 10, false);
            assert!(matches!(bitmap.pages[&0].bits, PageBits::Sparse(_)));
            assert_eq!(bitmap.count_ones(), 10);
            bitmap.set_range(0, 3, false);
            assert!(matches!(
                bitmap.pages[&0].bits,
                PageBits::Few { len: 7, .. }
            ));
            assert_eq!(bitmap.next(0, BITMAP_PAGE_BITS, true), Some(3));
        }
    }
}
