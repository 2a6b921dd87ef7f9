//! Entry points for the fuzz targets (`fuzz/`) and the in-suite fuzz test: the decoders of
//! what a thin pool reads back from its disk. Each either refuses the bytes or gives a value
//! that encodes back to itself; none may panic or allocate by a length it has not checked.

use crate::delta;
use crate::map::GRANULE;
use crate::records::{CompactionRecord, DeltaEntry, VersionsRecord};

/// Granules per extent of the pool the delta target pretends to read from (64 KiB extents).
const PER_EXTENT: u64 = 16;

/// The versions record, a compaction record, and a delta table entry.
pub fn records(data: &[u8]) {
    if let Ok(record) = VersionsRecord::decode(data) {
        let again = VersionsRecord::decode(&record.encode()).expect("a decoded record re-decodes");
        assert_eq!(again, record);
    }
    if let Ok(record) = CompactionRecord::decode(data) {
        assert_eq!(CompactionRecord::decode(&record.encode()), Ok(record));
    }
    if let Some(entry) = DeltaEntry::decode(Some(data)) {
        let covered = DeltaEntry::covered(Some(data), PER_EXTENT);
        let again = entry.encode(&covered);
        assert_eq!(DeltaEntry::decode(Some(&again)), Some(entry));
        assert_eq!(DeltaEntry::covered(Some(&again), PER_EXTENT), covered);
    }
}

/// A delta record decoded against a fixed base: refused, or exactly one 4 KiB of data per
/// data granule of its links.
pub fn delta_record(data: &[u8]) {
    let base: Vec<u8> = (0..PER_EXTENT * GRANULE).map(|i| (i % 251) as u8).collect();
    if let Ok(decoded) = delta::decode(data, PER_EXTENT, &base) {
        let granules: u64 = decoded.links.iter().map(|l| l.data.count()).sum();
        assert_eq!(decoded.data.len() as u64, granules * GRANULE);
    }
}
