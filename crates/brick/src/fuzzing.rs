//! Entry points for `fuzz/` (cargo fuzz): the decoders of what a brick reads from its disk.

use crate::layout::BrickLayout;
use crate::record::{IntervalRecord, RECORD_VERSION};
use crate::store::versions::VersionsBlob;

/// An interval record, a layout and a versions blob from arbitrary bytes: each is refused or
/// re-encodes to the same bytes (a format-1 record, which this build only reads, decodes to
/// what its re-encoding decodes to); never a panic.
pub fn records(data: &[u8]) {
    if let Ok(record) = IntervalRecord::decode(data) {
        if data[0] == RECORD_VERSION {
            assert_eq!(record.encode(), data, "a record re-encodes to its bytes");
        } else if record.state != crate::record::RecordState::Committed {
            assert_eq!(IntervalRecord::decode(&record.encode()), Ok(record));
        }
    }
    if let Ok(blob) = VersionsBlob::decode(data) {
        assert_eq!(
            blob.encode(),
            data,
            "a versions blob re-encodes to its bytes"
        );
    }
    if let Ok(layout) = BrickLayout::decode(data, u64::MAX) {
        assert_eq!(layout.encode(), data, "a layout re-encodes to its bytes");
    }
}
