//! What a device looks like from above: its size, its block sizes and what it can do.

use serde::Serialize;

/// The shape of a device. Every size is in bytes.
///
/// `min_io` is the granularity the device *accepts*: offsets and lengths of every request must
/// be multiples of it (1 for a buffered file, 512 or 4096 for O_DIRECT). `logical_block` and
/// `physical_block` are what the device reports to file systems, as a disk does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Geometry {
    pub size: u64,
    pub min_io: u32,
    pub logical_block: u32,
    pub physical_block: u32,
    /// The request size the device serves best (a stripe width, an extent size).
    pub preferred_io: u32,
    /// The largest request the device takes in one call.
    pub max_io: u32,
}

impl Geometry {
    /// A device of `size` bytes that accepts any alignment and reports 4 KiB blocks.
    pub fn byte_addressable(size: u64) -> Self {
        Geometry {
            size,
            min_io: 1,
            logical_block: 512,
            physical_block: 4096,
            preferred_io: 4096,
            max_io: 32 << 20,
        }
    }

    /// Checks that `[offset, offset + len)` lies inside the device and respects `min_io`.
    pub fn check_range(&self, offset: u64, len: u64) -> crate::Result<()> {
        let end = offset.checked_add(len);
        if end.is_none_or(|end| end > self.size) {
            return Err(crate::BlockError::OutOfRange {
                offset,
                len,
                size: self.size,
            });
        }
        let align = u64::from(self.min_io);
        // min_io is a power of two on every device there is: a mask, not two divisions.
        let misaligned = if align.is_power_of_two() {
            (offset | len) & (align - 1) != 0
        } else {
            !offset.is_multiple_of(align) || !len.is_multiple_of(align)
        };
        if misaligned {
            return Err(crate::BlockError::InvalidArgument(format!(
                "[{offset}, +{len}) is not aligned to {align} bytes"
            )));
        }
        Ok(())
    }
}

/// What a device can do. Negotiated once at open and cached by the layers above.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    pub read_only: bool,
    /// FLUSH does something (the device has a volatile cache).
    pub flush: bool,
    /// FUA is done natively, cheaper than write + flush.
    pub fua: bool,
    pub discard: bool,
    pub write_zeroes: bool,
    /// write_zeroes with `fast = true` succeeds only when it is cheaper than writing zeros.
    pub fast_zero: bool,
    /// block_status reports real holes and zeros rather than "all allocated".
    pub block_status: bool,
    /// Every opener sees the same data and a FLUSH on any opener covers writes from all of them,
    /// so an NBD server may advertise multi-conn.
    pub consistent_across_openers: bool,
    /// The medium is rotational (a hint for clients' schedulers).
    pub rotational: bool,
}

impl Capabilities {
    /// A writable, non-rotational device that does everything: the starting point a device
    /// narrows (`Capabilities { fast_zero: false, ..Capabilities::ALL }`).
    pub const ALL: Capabilities = Capabilities {
        read_only: false,
        flush: true,
        fua: true,
        discard: true,
        write_zeroes: true,
        fast_zero: true,
        block_status: true,
        consistent_across_openers: true,
        rotational: false,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_range_refuses_past_the_end_and_overflow() {
        let g = Geometry::byte_addressable(4096);
        assert!(g.check_range(0, 4096).is_ok());
        assert!(g.check_range(4096, 0).is_ok());
        assert!(g.check_range(4095, 2).is_err());
        assert!(g.check_range(u64::MAX, 2).is_err());
    }

    #[test]
    fn check_range_enforces_min_io() {
        let g = Geometry {
            min_io: 512,
            ..Geometry::byte_addressable(8192)
        };
        assert!(g.check_range(512, 1024).is_ok());
        assert!(g.check_range(1, 512).is_err());
        assert!(g.check_range(0, 511).is_err());
    }
}
