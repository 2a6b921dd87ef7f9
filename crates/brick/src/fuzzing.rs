//! Entry points for `fuzz/` (cargo fuzz): the decoders of what a brick reads from its disk.

use crate::layout::BrickLayout;
use crate::record::IntervalRecord;

/// An interval record and a layout from arbitrary bytes: each is refused or re-encodes to the
/// same bytes; never a panic.
pub fn records(data: &[u8]) {
    if let Ok(record) = IntervalRecord::decode(data) {
        assert_eq!(record.encode(), data, "a record re-encodes to its bytes");
    }
    if let Ok(layout) = BrickLayout::decode(data, u64::MAX) {
        assert_eq!(layout.encode(), data, "a layout re-encodes to its bytes");
    }
}
