//! Memory aligned for O_DIRECT, without `unsafe`.
//!
//! O_DIRECT needs the user buffer aligned (commonly to 512 bytes or 4 KiB), and neither
//! `BytesMut` nor `Vec<u8>` promise more than byte alignment. Over-allocating a `Vec` by the
//! alignment and working on the aligned window inside it is enough: the copy in and out of
//! the window costs far less than the I/O.

pub(super) struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes whose first byte sits on a multiple of `align` (a power of two).
    pub(super) fn zeroed(len: usize, align: usize) -> Self {
        debug_assert!(align.is_power_of_two());
        let storage = vec![0u8; len + align];
        // The address only decides where the window starts; nothing is read through it.
        let misalignment = storage.as_ptr() as usize % align;
        let start = (align - misalignment) % align;
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_is_aligned_zeroed_and_of_the_asked_length() {
        for align in [512, 4096, 65536] {
            for len in [0, 1, 4096, 12_345] {
                let mut buf = AlignedBuf::zeroed(len, align);
                assert_eq!(buf.as_slice().as_ptr() as usize % align, 0);
                assert_eq!(buf.as_slice().len(), len);
                assert!(buf.as_slice().iter().all(|&b| b == 0));
                buf.as_mut_slice().fill(1);
                assert_eq!(buf.as_slice().iter().filter(|&&b| b == 1).count(), len);
            }
        }
    }
}
