//! Sparse disk images: what a disk durably holds, and what a crash leaves behind.
//!
//! A crash test takes thousands of snapshots of a few-MiB disk, so an image must be cheap to
//! copy: pages are 4 KiB, absent pages read as zeros, and present pages are shared between
//! copies (`Arc`) until one of them writes (copy-on-write through `Arc::make_mut`). Content
//! equality ignores the representation: an absent page equals a present page of zeros.

use std::collections::BTreeSet;
use std::fmt;

use rand::RngExt;
use strata_core::{Extent, Geometry, PageStore};

use crate::CrashRng;

/// Page size of an image. Independent of the disk's `min_io` and sector size.
pub use strata_core::pages::PAGE;

/// Sparse disk content: 4 KiB pages, absent = zeros. Cloning shares the pages.
#[derive(Clone)]
pub struct DiskImage {
    geometry: Geometry,
    pages: PageStore,
}

impl DiskImage {
    /// An image of a disk that was never written.
    pub fn zeroed(geometry: Geometry) -> Self {
        DiskImage {
            geometry,
            pages: PageStore::new(),
        }
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn size(&self) -> u64 {
        self.geometry.size
    }

    /// Panics unless `[offset, offset + len)` lies inside the image: images are test tools, and
    /// a range outside one is a bug in the test (devices check ranges before touching images).
    fn assert_inside(&self, offset: u64, len: u64) {
        let inside = offset
            .checked_add(len)
            .is_some_and(|end| end <= self.geometry.size);
        assert!(
            inside,
            "image range [{offset}, +{len}) reaches past the end ({} bytes)",
            self.geometry.size
        );
    }

    /// The bytes of `[offset, offset + len)`.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.read_into(offset, &mut out);
        out
    }

    /// Fills `out` with the bytes at `offset`.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) {
        self.assert_inside(offset, out.len() as u64);
        self.pages.read_into(offset, out);
    }

    /// Overwrites `[offset, offset + data.len())` with `data`.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.assert_inside(offset, data.len() as u64);
        self.pages.write(offset, data);
    }

    /// Makes `[offset, offset + len)` read as zeros, freeing pages that end up all zeros.
    pub fn zero(&mut self, offset: u64, len: u64) {
        self.assert_inside(offset, len);
        self.pages.zero(offset, len);
    }

    /// Whether every byte of the range is zero.
    pub fn is_zero(&self, offset: u64, len: u64) -> bool {
        self.assert_inside(offset, len);
        self.pages.is_zero(offset, len)
    }

    /// Whether `[offset, offset + len)` holds the same bytes in both images (without copying).
    pub fn range_eq(&self, other: &DiskImage, offset: u64, len: u64) -> bool {
        self.assert_inside(offset, len);
        other.assert_inside(offset, len);
        self.pages.range_eq(&other.pages, offset, len)
    }

    /// Bytes held by present pages.
    pub fn allocated_bytes(&self) -> u64 {
        self.pages.allocated_bytes()
    }

    /// Allocation of `[offset, offset + len)`: present pages as `Data`, the rest as `Hole`.
    pub fn extents(&self, offset: u64, len: u64) -> Vec<Extent> {
        self.assert_inside(offset, len);
        self.pages.extents(offset, len)
    }

    /// Damages `[offset, offset + len)` on purpose, for tests of checksums and metadata
    /// validation. Either flips 1..=8 random bits at distinct bytes, or scribbles random bytes
    /// over a run of up to 64 bytes. Always changes at least one byte. Deterministic given `rng`.
    pub fn corrupt(&mut self, offset: u64, len: usize, rng: &mut CrashRng) {
        assert!(len > 0, "corrupt needs a non-empty range");
        let before = self.read(offset, len);
        let mut bytes = before.clone();
        if rng.random_bool(0.5) {
            let flips = rng.random_range(1..=8usize).min(len);
            let mut positions = BTreeSet::new();
            while positions.len() < flips {
                positions.insert(rng.random_range(0..len));
            }
            for position in positions {
                bytes[position] ^= 1 << rng.random_range(0..8u32);
            }
        } else {
            let run = rng.random_range(1..=64usize).min(len);
            let start = rng.random_range(0..=len - run);
            rng.fill(&mut bytes[start..start + run]);
            if bytes == before {
                bytes[start] ^= 0xff;
            }
        }
        assert_ne!(bytes, before, "corrupt must change the range");
        self.write(offset, &bytes);
    }

    /// Media damage: flips `count` distinct bytes at random places in `[offset, offset +
    /// len)`, each XORed with a random non-zero value (so each one changes). Returns the byte
    /// offsets hit, in ascending order, for the failure report.
    pub fn flip_bytes(
        &mut self,
        offset: u64,
        len: u64,
        count: usize,
        rng: &mut CrashRng,
    ) -> Vec<u64> {
        assert!(
            count as u64 <= len && offset + len <= self.size(),
            "cannot flip {count} bytes in [{offset}, +{len}) of a {}-byte image",
            self.size()
        );
        let mut positions = BTreeSet::new();
        while positions.len() < count {
            positions.insert(offset + rng.random_range(0..len));
        }
        for &at in &positions {
            let mut byte = [0u8];
            self.read_into(at, &mut byte);
            byte[0] ^= rng.random_range(1..=255u8);
            self.write(at, &byte);
        }
        positions.into_iter().collect()
    }
}

impl PartialEq for DiskImage {
    fn eq(&self, other: &Self) -> bool {
        self.geometry == other.geometry && self.pages.content_eq(&other.pages)
    }
}

impl Eq for DiskImage {}

impl fmt::Debug for DiskImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskImage")
            .field("size", &self.geometry.size)
            .field("pages", &self.pages.allocated_pages())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use strata_core::ExtentState;

    fn image(size: u64) -> DiskImage {
        DiskImage::zeroed(Geometry::byte_addressable(size))
    }

    #[test]
    fn writes_across_pages_read_back_and_zeroing_frees_pages() {
        let mut img = image(64 << 10);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        img.write(3000, &data);
        assert_eq!(img.read(3000, data.len()), data);
        assert_eq!(img.read(2990, 10), vec![0; 10]);
        assert_eq!(img.allocated_bytes(), 4 * 4096);
        img.zero(4096, 8192);
        assert_eq!(img.allocated_bytes(), 2 * 4096);
        assert!(img.is_zero(4096, 8192));
        assert!(!img.is_zero(3000, 1));
        img.zero(0, 4096);
        img.zero(12_288, 1000);
        img.zero(13_288, 3096);
        assert_eq!(img.allocated_bytes(), 0);
        assert_eq!(img, image(64 << 10));
    }

    #[test]
    fn clones_are_independent_copies() {
        let mut a = image(16 << 10);
        a.write(0, &[1; 100]);
        let b = a.clone();
        a.write(50, &[2; 100]);
        assert_eq!(b.read(0, 150), [vec![1; 100], vec![0; 50]].concat());
        assert_eq!(a.read(0, 150), [vec![1; 50], vec![2; 100]].concat());
        assert_ne!(a, b);
    }

    #[test]
    fn extents_report_present_pages_as_data() {
        let mut img = image(64 << 10);
        img.write(5000, &[9; 10]);
        let got: Vec<_> = img
            .extents(100, 12_000)
            .iter()
            .map(|e| (e.offset, e.len, e.state))
            .collect();
        assert_eq!(
            got,
            vec![
                (100, 3996, ExtentState::Hole),
                (4096, 4096, ExtentState::Data),
                (8192, 3908, ExtentState::Hole)
            ]
        );
    }

    #[test]
    fn corrupt_always_changes_something_inside_the_range_only() {
        let mut rng = CrashRng::seed_from_u64(7);
        for round in 0..500 {
            let mut img = image(16 << 10);
            img.write(0, &[0x5a; 16 << 10]);
            let len = 1 + round % 70;
            img.corrupt(4096, len, &mut rng);
            assert_ne!(img.read(4096, len), vec![0x5a; len]);
            assert_eq!(img.read(0, 4096), vec![0x5a; 4096]);
            let after = 4096 + len as u64;
            assert_eq!(
                img.read(after, (16 << 10) - after as usize),
                vec![0x5a; (16 << 10) - after as usize]
            );
        }
    }

    #[test]
    #[should_panic(expected = "reaches past the end")]
    fn out_of_range_is_a_test_bug() {
        image(4096).write(4000, &[0; 200]);
    }
}
