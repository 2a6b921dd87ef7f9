//! Where each logical 4 KiB block lives, as the metadata records it; pure over the state.
//!
//! Three objects keep the map compact, so that data written serially costs almost nothing:
//! - `ranges` (table, 8 bytes per logical 1 MiB range): 0 while nothing in the range was
//!   ever placed on the slow child, else its *base* physical range + 1. A range's blocks
//!   have their *home* at the same offsets in its base range.
//! - `home` (bitmap, 1 bit per logical block): the block lives at its home.
//! - `moved` (table, 8 bytes per block that lives elsewhere): a physical block other than
//!   its home, or a log slot.
//!
//! A block is at home, moved, or neither (never written: reads as zeros), never both. A
//! range written serially is one `ranges` record and 256 bits; a block staged or placed off
//! home costs one `moved` record, dropped again when a destage brings it home.

/// Where a logical block's newest durable-or-pending copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Location {
    Unwritten,
    /// A block of the slow child.
    Disk(u64),
    /// A slot of the log on the fast child.
    Log(u64),
}

const TAG_SHIFT: u32 = 62;
const TAG_DISK: u64 = 1;
const TAG_LOG: u64 = 2;
const VALUE_MASK: u64 = (1 << TAG_SHIFT) - 1;

/// A `moved` record: the tag in the top two bits (so that no record is all zeros, which the
/// metadata service reads as absent), the block or slot below.
pub fn encode_moved(location: Location) -> u64 {
    match location {
        Location::Disk(block) => {
            assert!(block <= VALUE_MASK);
            TAG_DISK << TAG_SHIFT | block
        }
        Location::Log(slot) => {
            assert!(slot <= VALUE_MASK);
            TAG_LOG << TAG_SHIFT | slot
        }
        Location::Unwritten => unreachable!("an unwritten block has no moved record"),
    }
}

pub fn decode_moved(record: u64) -> Result<Location, String> {
    let value = record & VALUE_MASK;
    match record >> TAG_SHIFT {
        TAG_DISK => Ok(Location::Disk(value)),
        TAG_LOG => Ok(Location::Log(value)),
        tag => Err(format!("moved record {record:#x} has unknown tag {tag}")),
    }
}

/// A `ranges` record: the base range + 1 (0 = no base).
pub fn encode_base(base: u64) -> u64 {
    base + 1
}

pub fn decode_base(record: u64) -> Option<u64> {
    record.checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_records_round_trip_and_are_never_zero() {
        for location in [
            Location::Disk(0),
            Location::Disk(VALUE_MASK),
            Location::Log(0),
            Location::Log(12345),
        ] {
            let record = encode_moved(location);
            assert_ne!(record, 0);
            assert_eq!(decode_moved(record), Ok(location));
        }
        assert!(decode_moved(3 << TAG_SHIFT).is_err());
        assert!(decode_moved(5).is_err());
    }

    #[test]
    fn a_base_record_of_zero_means_no_base() {
        assert_eq!(decode_base(0), None);
        assert_eq!(decode_base(encode_base(0)), Some(0));
        assert_eq!(decode_base(encode_base(41)), Some(41));
    }
}
