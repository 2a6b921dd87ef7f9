//! The stage's objects in the metadata store, their format record, and their invariants.
//!
//! | object | kind | holds |
//! |---|---|---|
//! | `stage` | blob | the format record: [`STAGE_FORMAT_VERSION`] and the [`Shape`] |
//! | `ranges` | table, 8 B | logical range → base physical range + 1 (`map`) |
//! | `home` | bitmap | logical blocks living at their home block |
//! | `moved` | table, 8 B | logical block → a physical block off home, or a log slot |
//! | `reverse` | table, 8 B | log slot → logical block + 1 (the paper's staging table) |
//! | `allocated` | bitmap | physical blocks holding a live block |

use std::collections::{BTreeMap, BTreeSet};

use strata_meta::{ObjectId, State, Table};

use crate::map::{decode_base, decode_moved, Location};
use crate::shape::Shape;

/// The version of the stage's own records (the store has its own, `strata_meta`'s).
pub const STAGE_FORMAT_VERSION: u32 = 1;

/// The owner name the metadata superblock carries.
pub const OWNER: &str = "stage";

pub const STAGE: &str = "stage";
pub const RANGES: &str = "ranges";
pub const HOME: &str = "home";
pub const MOVED: &str = "moved";
pub const REVERSE: &str = "reverse";
pub const ALLOCATED: &str = "allocated";

/// Object ids, found once at open.
#[derive(Clone, Copy, Debug)]
pub struct Ids {
    pub stage: ObjectId,
    pub ranges: ObjectId,
    pub home: ObjectId,
    pub moved: ObjectId,
    pub reverse: ObjectId,
    pub allocated: ObjectId,
}

impl Ids {
    pub fn find(state: &State) -> Result<Ids, String> {
        let id = |name: &str| state.id(name).ok_or(format!("object {name:?} is missing"));
        Ok(Ids {
            stage: id(STAGE)?,
            ranges: id(RANGES)?,
            home: id(HOME)?,
            moved: id(MOVED)?,
            reverse: id(REVERSE)?,
            allocated: id(ALLOCATED)?,
        })
    }
}

/// The format record: the version and the shape.
pub fn encode_shape(shape: &Shape) -> Vec<u8> {
    let mut out = STAGE_FORMAT_VERSION.to_le_bytes().to_vec();
    for value in [
        shape.range_blocks,
        shape.extent_ranges,
        shape.ranges,
        shape.log_offset,
        shape.log_slots,
    ] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out
}

pub fn decode_shape(blob: &[u8]) -> Result<Shape, String> {
    if blob.len() != 4 + 5 * 8 {
        return Err(format!("format record of {} bytes, not 44", blob.len()));
    }
    let version = u32::from_le_bytes(blob[..4].try_into().expect("4 bytes"));
    if version != STAGE_FORMAT_VERSION {
        return Err(format!(
            "stage format version {version}; this build reads version {STAGE_FORMAT_VERSION}"
        ));
    }
    let field = |i: usize| u64::from_le_bytes(blob[4 + i * 8..12 + i * 8].try_into().expect("8"));
    let shape = Shape {
        range_blocks: field(0),
        extent_ranges: field(1),
        ranges: field(2),
        log_offset: field(3),
        log_slots: field(4),
    };
    if shape.range_blocks == 0 || shape.extent_ranges == 0 || shape.log_slots == 0 {
        return Err(format!("format record describes an empty shape: {shape:?}"));
    }
    Ok(shape)
}

pub fn u64_at(table: &Table, index: u64) -> u64 {
    table.get(index).map_or(0, |v| {
        u64::from_le_bytes(v.try_into().expect("8-byte table"))
    })
}

/// A logical block's base range, if its range has one.
pub fn base_of(state: &State, ids: &Ids, shape: &Shape, logical: u64) -> Option<u64> {
    let ranges = state.table(ids.ranges)?;
    decode_base(u64_at(ranges, shape.range_of(logical)))
}

/// Where `logical` lives in `state`.
pub fn locate(state: &State, ids: &Ids, shape: &Shape, logical: u64) -> Location {
    let at_home = state.bitmap(ids.home).is_some_and(|b| b.get(logical));
    if at_home {
        let base = base_of(state, ids, shape, logical).expect("a block at home has a base");
        return Location::Disk(shape.home(logical, base));
    }
    let record = state.table(ids.moved).map_or(0, |t| u64_at(t, logical));
    if record == 0 {
        return Location::Unwritten;
    }
    decode_moved(record).unwrap_or_else(|e| panic!("checked at open: {e}"))
}

/// Everything wrong with a stage's state (empty when consistent): what tests assert after
/// every reopen and what `strata check` could report.
pub fn check_state(state: &State) -> Vec<String> {
    let ids = match Ids::find(state) {
        Ok(ids) => ids,
        Err(problem) => return vec![problem],
    };
    let shape = match decode_shape(state.blob(ids.stage).unwrap_or(&[])) {
        Ok(shape) => shape,
        Err(problem) => return vec![problem],
    };
    let mut problems = Vec::new();
    let (Some(ranges), Some(home), Some(moved), Some(reverse), Some(allocated)) = (
        state.table(ids.ranges),
        state.bitmap(ids.home),
        state.table(ids.moved),
        state.table(ids.reverse),
        state.bitmap(ids.allocated),
    ) else {
        return vec!["an object has the wrong kind".into()];
    };
    let mut bases = BTreeMap::new();
    for (range, record) in ranges.iter_from(0) {
        let base = decode_base(u64::from_le_bytes(record.try_into().expect("8"))).expect("set");
        if range >= shape.ranges || base >= shape.ranges {
            problems.push(format!("range {range} based at {base}, past the device"));
        }
        if let Some(other) = bases.insert(base, range) {
            problems.push(format!("ranges {other} and {range} share base {base}"));
        }
    }
    // Every physical block a logical block lives on, with its owner.
    let mut owners: BTreeMap<u64, u64> = BTreeMap::new();
    let mut own = |physical: u64, logical: u64, problems: &mut Vec<String>| {
        if let Some(other) = owners.insert(physical, logical) {
            problems.push(format!(
                "blocks {other} and {logical} both live on {physical}"
            ));
        }
    };
    let mut logical = home.next(0, u64::MAX, true);
    while let Some(block) = logical {
        match base_of(state, &ids, &shape, block) {
            Some(base) => own(shape.home(block, base), block, &mut problems),
            None => problems.push(format!("block {block} is at home in a range with no base")),
        }
        if moved.get(block).is_some() {
            problems.push(format!("block {block} is both at home and moved"));
        }
        logical = home.next(block + 1, u64::MAX, true);
    }
    let mut slots_seen = BTreeSet::new();
    for (block, record) in moved.iter_from(0) {
        match decode_moved(u64::from_le_bytes(record.try_into().expect("8"))) {
            Ok(Location::Disk(physical)) => own(physical, block, &mut problems),
            Ok(Location::Log(slot)) => {
                slots_seen.insert(slot);
                if u64_at(reverse, slot) != block + 1 {
                    problems.push(format!(
                        "block {block} is in slot {slot}, which names another"
                    ));
                }
            }
            Ok(Location::Unwritten) => unreachable!("decode never answers Unwritten"),
            Err(problem) => problems.push(problem),
        }
        if block >= shape.blocks() {
            problems.push(format!("block {block} is past the device"));
        }
    }
    for (slot, _) in reverse.iter_from(0) {
        if !slots_seen.contains(&slot) {
            problems.push(format!("log slot {slot} is in use but no block is there"));
        }
        if slot >= shape.log_slots {
            problems.push(format!("log slot {slot} is past the log"));
        }
    }
    let marked = allocated.count_ones();
    if marked != owners.len() as u64 {
        problems.push(format!(
            "{marked} blocks marked allocated, {} hold live blocks",
            owners.len()
        ));
    }
    for physical in owners.keys() {
        if !allocated.get(*physical) {
            problems.push(format!("block {physical} is live but not marked allocated"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_record_round_trips_and_refuses_other_versions() {
        let shape = Shape {
            range_blocks: 256,
            extent_ranges: 16,
            ranges: 100,
            log_offset: 1 << 20,
            log_slots: 1000,
        };
        let blob = encode_shape(&shape);
        assert_eq!(decode_shape(&blob), Ok(shape));
        let mut newer = blob.clone();
        newer[0] = 2;
        let error = decode_shape(&newer).unwrap_err();
        assert!(error.contains("version 2"), "{error}");
        assert!(decode_shape(&blob[..10]).is_err());
    }
}
