//! The thin pool's records in the metadata store, and their encodings.
//!
//! Objects (names are fixed; version 1):
//! - `pool` (blob): format version, extent size, data start, extent count, next volume id.
//!   The extent count only grows, when the pool's device does (`ThinPool::grow`); it is
//!   committed before any extent past the old count is mapped.
//! - `volumes` (blob): every volume's id, size and name.
//! - `allocated` (bitmap): one bit per physical extent, set while a volume maps it.
//! - `live` (bitmap): one bit per 4 KiB granule of every physical extent, set while the
//!   granule holds data written through its volume. A clear bit reads as zeros.
//! - `map.<id>` (table of u32): virtual extent → physical extent + 1 (0 = unmapped).

use bytes::BufMut;
use strata_meta::{ObjectId, State};

pub const POOL: &str = "pool";
pub const VOLUMES: &str = "volumes";
pub const ALLOCATED: &str = "allocated";
pub const LIVE: &str = "live";
pub const POOL_FORMAT_VERSION: u32 = 1;

pub fn map_name(volume: u32) -> String {
    format!("map.{volume}")
}

/// The pool's fixed shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolRecord {
    pub extent_size: u64,
    /// Byte offset of physical extent 0 on the child.
    pub data_start: u64,
    pub extents: u64,
    pub next_volume: u32,
}

impl PoolRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32_le(POOL_FORMAT_VERSION);
        out.put_u64_le(self.extent_size);
        out.put_u64_le(self.data_start);
        out.put_u64_le(self.extents);
        out.put_u32_le(self.next_volume);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<PoolRecord, String> {
        let read = |at: usize, len: usize| {
            bytes
                .get(at..at + len)
                .ok_or_else(|| format!("pool record of {} bytes is short", bytes.len()))
        };
        let u64_at = |at| read(at, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        let u32_at = |at| read(at, 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
        let version = u32_at(0)?;
        if version != POOL_FORMAT_VERSION {
            return Err(format!(
                "thin pool format version {version}; this build reads {POOL_FORMAT_VERSION}"
            ));
        }
        let record = PoolRecord {
            extent_size: u64_at(4)?,
            data_start: u64_at(12)?,
            extents: u64_at(20)?,
            next_volume: u32_at(28)?,
        };
        if !record.extent_size.is_power_of_two() || record.extent_size < super::map::GRANULE {
            return Err(format!("extent size {}", record.extent_size));
        }
        Ok(record)
    }

    pub fn granules_per_extent(&self) -> u64 {
        self.extent_size / super::map::GRANULE
    }
}

/// One volume as the pool records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: u32,
    pub size: u64,
    pub name: String,
}

pub fn encode_volumes(volumes: &[VolumeRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    out.put_u32_le(volumes.len() as u32);
    for volume in volumes {
        out.put_u32_le(volume.id);
        out.put_u64_le(volume.size);
        out.put_u8(volume.name.len() as u8);
        out.put_slice(volume.name.as_bytes());
    }
    out
}

pub fn decode_volumes(bytes: &[u8]) -> Result<Vec<VolumeRecord>, String> {
    let mut at = 0usize;
    let mut take = |len: usize| -> Result<&[u8], String> {
        let slice = bytes
            .get(at..at + len)
            .ok_or_else(|| format!("volume list is short at byte {at}"))?;
        at += len;
        Ok(slice)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().unwrap());
    let mut volumes = Vec::new();
    for _ in 0..count {
        let id = u32::from_le_bytes(take(4)?.try_into().unwrap());
        let size = u64::from_le_bytes(take(8)?.try_into().unwrap());
        let len = take(1)?[0] as usize;
        let name =
            String::from_utf8(take(len)?.to_vec()).map_err(|_| "volume name is not UTF-8")?;
        volumes.push(VolumeRecord { id, size, name });
    }
    Ok(volumes)
}

/// Object ids of the pool-wide records.
#[derive(Clone, Copy, Debug)]
pub struct PoolIds {
    pub pool: ObjectId,
    pub volumes: ObjectId,
    pub allocated: ObjectId,
    pub live: ObjectId,
}

impl PoolIds {
    pub fn find(state: &State) -> Result<PoolIds, String> {
        let id = |name: &str| state.id(name).ok_or_else(|| format!("no `{name}` object"));
        Ok(PoolIds {
            pool: id(POOL)?,
            volumes: id(VOLUMES)?,
            allocated: id(ALLOCATED)?,
            live: id(LIVE)?,
        })
    }
}

/// Checks every invariant that ties the pool's records together. Returns the violations
/// found (empty when the state is consistent). `strata check` and the crash tests use it.
pub fn check_state(state: &State) -> Vec<String> {
    let mut problems = Vec::new();
    let ids = match PoolIds::find(state) {
        Ok(ids) => ids,
        Err(problem) => return vec![problem],
    };
    let pool = match state.blob(ids.pool).map(PoolRecord::decode) {
        Some(Ok(pool)) => pool,
        Some(Err(problem)) => return vec![problem],
        None => return vec!["`pool` is not a blob".into()],
    };
    let volumes = match state.blob(ids.volumes).map(decode_volumes) {
        Some(Ok(volumes)) => volumes,
        Some(Err(problem)) => return vec![problem],
        None => return vec!["`volumes` is not a blob".into()],
    };
    let (Some(allocated), Some(live)) = (state.bitmap(ids.allocated), state.bitmap(ids.live))
    else {
        return vec!["`allocated` or `live` is not a bitmap".into()];
    };
    let mut owners = std::collections::HashMap::new();
    for volume in &volumes {
        let Some(map) = state
            .id(&map_name(volume.id))
            .and_then(|id| state.table(id))
        else {
            problems.push(format!("volume {} has no map", volume.name));
            continue;
        };
        let virtual_extents = volume.size.div_ceil(pool.extent_size);
        for (index, value) in map.iter_from(0) {
            let phys = u32::from_le_bytes(value.try_into().unwrap_or([0; 4])) as u64;
            let Some(phys) = phys.checked_sub(1).filter(|p| *p < pool.extents) else {
                problems.push(format!(
                    "{}: extent {index} maps outside the pool",
                    volume.name
                ));
                continue;
            };
            if index >= virtual_extents {
                problems.push(format!(
                    "{}: extent {index} lies past the volume's end",
                    volume.name
                ));
            }
            if !allocated.get(phys) {
                problems.push(format!(
                    "{}: extent {index} → {phys}, not marked allocated",
                    volume.name
                ));
            }
            if let Some(other) = owners.insert(phys, (volume.name.clone(), index)) {
                problems.push(format!(
                    "physical extent {phys} mapped twice: {other:?} and ({}, {index})",
                    volume.name
                ));
            }
        }
    }
    if allocated.count_ones() != owners.len() as u64 {
        problems.push(format!(
            "{} extents marked allocated but {} mapped",
            allocated.count_ones(),
            owners.len()
        ));
    }
    let per_extent = pool.granules_per_extent();
    let mut granule = live.next(0, u64::MAX, true);
    while let Some(g) = granule {
        let extent = g / per_extent;
        if !owners.contains_key(&extent) {
            problems.push(format!("granule {g} is live in unmapped extent {extent}"));
            granule = live.next((extent + 1) * per_extent, u64::MAX, true);
        } else {
            granule = live.next(g + 1, u64::MAX, true);
        }
    }
    problems
}
