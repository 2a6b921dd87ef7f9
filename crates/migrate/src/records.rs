//! The layer's objects in the metadata store, their format record, and their invariants.
//!
//! | object | kind | holds |
//! |---|---|---|
//! | `migrate` | blob | the format record: [`MIGRATE_FORMAT_VERSION`] and the [`Shape`] |
//! | `chunks` | table, 32 B | logical chunk → up to two locations, each with its validity bits |
//!
//! A `chunks` record is the paper's 5-tuple: `(A<address, validity>, B<address, validity>)`,
//! four little-endian u64: location A (`(device + 1) << 48 | slot`, 0 = none), A's valid
//! blocks (bit i = block i of the chunk), then the same for B. Free slots are not recorded:
//! they are the slots no record names, rebuilt at open.

use std::collections::BTreeSet;

use strata_meta::{ObjectId, State};

use crate::shape::Shape;

/// The version of the layer's own records (the store has its own, `strata_meta`'s).
pub const MIGRATE_FORMAT_VERSION: u32 = 1;

/// The owner name the metadata superblock carries.
pub const OWNER: &str = "migrate";

pub const MIGRATE: &str = "migrate";
pub const CHUNKS: &str = "chunks";
pub const ENTRY_BYTES: usize = 32;

const DEVICE_SHIFT: u32 = 48;
const SLOT_MASK: u64 = (1 << DEVICE_SHIFT) - 1;

/// One physical home of part of a chunk: a chunk slot on a child, and which of the chunk's
/// blocks are valid there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub device: usize,
    pub slot: u64,
    pub valid: u64,
}

/// A logical chunk's map entry: at most two locations, on different devices, whose valid
/// bits never overlap. The first is the one the chunk was allocated at, or what remains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub locations: [Option<Location>; 2],
}

impl Entry {
    pub fn single(location: Location) -> Entry {
        Entry {
            locations: [Some(location), None],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.locations.iter().all(Option::is_none)
    }

    /// Which location holds block `index` valid.
    pub fn holder(&self, index: u64) -> Option<usize> {
        (0..2).find(|&k| self.locations[k].is_some_and(|l| l.valid >> index & 1 == 1))
    }

    /// The location on `device`, if the chunk has one there.
    pub fn on_device(&self, device: usize) -> Option<usize> {
        (0..2).find(|&k| self.locations[k].is_some_and(|l| l.device == device))
    }

    /// Drops locations left with no valid block (their slots are the caller's to free), and
    /// moves a lone second location first. Returns the dropped ones.
    pub fn normalize(&mut self) -> Vec<Location> {
        let mut dropped = Vec::new();
        for k in 0..2 {
            if let Some(location) = self.locations[k] {
                if location.valid == 0 {
                    dropped.push(location);
                    self.locations[k] = None;
                }
            }
        }
        if self.locations[0].is_none() {
            self.locations.swap(0, 1);
        }
        dropped
    }

    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut out = [0u8; ENTRY_BYTES];
        for (k, location) in self.locations.iter().enumerate() {
            let (address, valid) = location.map_or((0, 0), |l| {
                assert!(l.slot <= SLOT_MASK && l.device < 0xFFFE);
                (((l.device as u64 + 1) << DEVICE_SHIFT) | l.slot, l.valid)
            });
            out[k * 16..k * 16 + 8].copy_from_slice(&address.to_le_bytes());
            out[k * 16 + 8..k * 16 + 16].copy_from_slice(&valid.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Entry, String> {
        if bytes.len() != ENTRY_BYTES {
            return Err(format!("chunk record of {} bytes, not 32", bytes.len()));
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8"));
        let mut entry = Entry::default();
        for k in 0..2 {
            let (address, valid) = (word(2 * k), word(2 * k + 1));
            if address == 0 {
                if valid != 0 {
                    return Err(format!("location {k} is absent but has valid bits"));
                }
                continue;
            }
            entry.locations[k] = Some(Location {
                device: (address >> DEVICE_SHIFT) as usize - 1,
                slot: address & SLOT_MASK,
                valid,
            });
        }
        Ok(entry)
    }
}

/// Object ids, found once at open.
#[derive(Clone, Copy, Debug)]
pub struct Ids {
    pub migrate: ObjectId,
    pub chunks: ObjectId,
}

impl Ids {
    pub fn find(state: &State) -> Result<Ids, String> {
        let id = |name: &str| state.id(name).ok_or(format!("object {name:?} is missing"));
        Ok(Ids {
            migrate: id(MIGRATE)?,
            chunks: id(CHUNKS)?,
        })
    }
}

/// The format record: version, chunk blocks, metadata bytes, logical chunks, then the
/// number of children and each one's slots.
pub fn encode_shape(shape: &Shape) -> Vec<u8> {
    let mut out = MIGRATE_FORMAT_VERSION.to_le_bytes().to_vec();
    let head = [
        shape.chunk_blocks,
        shape.metadata_bytes,
        shape.chunks,
        shape.slots.len() as u64,
    ];
    for value in head.into_iter().chain(shape.slots.iter().copied()) {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out
}

pub fn decode_shape(blob: &[u8]) -> Result<Shape, String> {
    if blob.len() < 4 + 4 * 8 {
        return Err(format!("format record of {} bytes, too short", blob.len()));
    }
    let version = u32::from_le_bytes(blob[..4].try_into().expect("4 bytes"));
    if version != MIGRATE_FORMAT_VERSION {
        return Err(format!(
            "migrate format version {version}; this build reads version {MIGRATE_FORMAT_VERSION}"
        ));
    }
    let field = |i: usize| u64::from_le_bytes(blob[4 + i * 8..12 + i * 8].try_into().expect("8"));
    let devices = field(3) as usize;
    if devices < 2 || blob.len() != 4 + (4 + devices) * 8 {
        return Err(format!(
            "format record of {} bytes for {devices} children",
            blob.len()
        ));
    }
    let shape = Shape {
        chunk_blocks: field(0),
        metadata_bytes: field(1),
        chunks: field(2),
        slots: (0..devices).map(|i| field(4 + i)).collect(),
    };
    let total: u64 = shape.slots.iter().sum();
    if !(1..=64).contains(&shape.chunk_blocks) || shape.chunks == 0 || shape.chunks > total {
        return Err(format!(
            "format record describes an impossible shape: {shape:?}"
        ));
    }
    Ok(shape)
}

/// Every chunk's entry, ascending.
pub fn entries(state: &State, ids: &Ids) -> Result<Vec<(u64, Entry)>, String> {
    let table = state
        .table(ids.chunks)
        .ok_or("object \"chunks\" has the wrong kind")?;
    table
        .iter_from(0)
        .map(|(chunk, bytes)| Entry::decode(bytes).map(|e| (chunk, e)))
        .collect()
}

/// The entry of `chunk` (empty if never written).
pub fn entry(state: &State, ids: &Ids, chunk: u64) -> Entry {
    state
        .table(ids.chunks)
        .and_then(|t| t.get(chunk))
        .map_or_else(Entry::default, |bytes| {
            Entry::decode(bytes).unwrap_or_else(|e| panic!("checked at open: {e}"))
        })
}

/// Everything wrong with one entry against the shape.
fn check_entry(shape: &Shape, chunk: u64, entry: &Entry, problems: &mut Vec<String>) {
    if chunk >= shape.chunks {
        problems.push(format!("chunk {chunk} is past the device"));
    }
    let mut seen = 0u64;
    for location in entry.locations.iter().flatten() {
        if location.device >= shape.devices() || location.slot >= shape.slots[location.device] {
            problems.push(format!(
                "chunk {chunk} lives on slot {} of child {}, past its end",
                location.slot, location.device
            ));
        }
        if location.valid == 0 {
            problems.push(format!(
                "chunk {chunk} keeps a location with no valid block"
            ));
        }
        if location.valid & !shape.full_mask() != 0 {
            problems.push(format!("chunk {chunk} has valid bits past its last block"));
        }
        if seen & location.valid != 0 {
            problems.push(format!(
                "chunk {chunk}: blocks {:#x} are valid in two places",
                seen & location.valid
            ));
        }
        seen |= location.valid;
    }
    if let [Some(a), Some(b)] = entry.locations {
        if a.device == b.device {
            problems.push(format!(
                "chunk {chunk} has both locations on child {}",
                a.device
            ));
        }
    }
    if entry.locations[0].is_none() {
        problems.push(format!("chunk {chunk} has a record but no first location"));
    }
}

/// Everything wrong with a migrate layer's state (empty when consistent): what tests assert
/// after every reopen and what `strata check` reports. Each written block valid in exactly
/// one place; no slot used twice; everything within the children.
pub fn check_state(state: &State) -> Vec<String> {
    let ids = match Ids::find(state) {
        Ok(ids) => ids,
        Err(problem) => return vec![problem],
    };
    let shape = match decode_shape(state.blob(ids.migrate).unwrap_or(&[])) {
        Ok(shape) => shape,
        Err(problem) => return vec![problem],
    };
    let all = match entries(state, &ids) {
        Ok(all) => all,
        Err(problem) => return vec![problem],
    };
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (chunk, entry) in &all {
        check_entry(&shape, *chunk, entry, &mut problems);
        for location in entry.locations.iter().flatten() {
            if !used.insert((location.device, location.slot)) {
                problems.push(format!(
                    "slot {} of child {} is used twice (chunk {chunk})",
                    location.slot, location.device
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_empty_is_all_zeros() {
        assert_eq!(Entry::default().encode(), [0; 32]);
        let entry = Entry {
            locations: [
                Some(Location {
                    device: 0,
                    slot: 0,
                    valid: 0b1010,
                }),
                Some(Location {
                    device: 2,
                    slot: 77,
                    valid: 0b0101,
                }),
            ],
        };
        assert_eq!(Entry::decode(&entry.encode()), Ok(entry));
        assert_eq!(entry.holder(1), Some(0));
        assert_eq!(entry.holder(2), Some(1));
        assert_eq!(entry.holder(4), None);
        assert_eq!(entry.on_device(2), Some(1));
        let mut bad = entry.encode();
        bad[0..8].copy_from_slice(&[0; 8]);
        assert!(Entry::decode(&bad).is_err());
    }

    #[test]
    fn normalize_drops_empty_locations_and_keeps_the_first_filled() {
        let mut entry = Entry {
            locations: [
                Some(Location {
                    device: 0,
                    slot: 3,
                    valid: 0,
                }),
                Some(Location {
                    device: 1,
                    slot: 4,
                    valid: 1,
                }),
            ],
        };
        let dropped = entry.normalize();
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].slot, 3);
        assert_eq!(entry.locations[0].unwrap().device, 1);
        assert!(entry.locations[1].is_none());
    }

    #[test]
    fn the_format_record_round_trips_and_refuses_other_versions() {
        let shape = Shape {
            chunk_blocks: 32,
            metadata_bytes: 1 << 20,
            chunks: 20,
            slots: vec![10, 14],
        };
        let blob = encode_shape(&shape);
        assert_eq!(decode_shape(&blob), Ok(shape));
        let mut newer = blob.clone();
        newer[0] = 2;
        let error = decode_shape(&newer).unwrap_err();
        assert!(error.contains("version 2"), "{error}");
        assert!(decode_shape(&blob[..20]).is_err());
    }

    #[test]
    fn check_entry_finds_a_block_valid_twice() {
        let shape = Shape {
            chunk_blocks: 32,
            metadata_bytes: 1 << 20,
            chunks: 20,
            slots: vec![10, 14],
        };
        let entry = Entry {
            locations: [
                Some(Location {
                    device: 0,
                    slot: 0,
                    valid: 0b11,
                }),
                Some(Location {
                    device: 1,
                    slot: 0,
                    valid: 0b10,
                }),
            ],
        };
        let mut problems = Vec::new();
        check_entry(&shape, 0, &entry, &mut problems);
        assert!(problems[0].contains("valid in two places"), "{problems:?}");
    }
}
