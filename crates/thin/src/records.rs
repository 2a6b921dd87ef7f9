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
//! - `map.<id>` (table of u32): virtual extent → physical extent + 1 (0 = unmapped); with
//!   versions, the newest extent of the virtual extent's chain.
//!
//! Format version 2 adds versions (Clotho); a pool is written as version 2 from its first
//! snapshot on, so that a build that knows nothing of chains refuses it instead of reading
//! only the newest extent of each:
//! - `versions.<id>` (blob): a volume's epochs, snapshots and clone base
//!   ([`VersionsRecord`]); absent for a volume that never had a version.
//! - `history` (table of 8 bytes): physical extent → the epoch it was written in (u32) and
//!   the next older extent of its chain + 1 (u32, 0 = none). Absent: epoch 0, no older one.
//! - `masked` (bitmap): one bit per granule of every physical extent, set where the extent
//!   defines the granule as zeros (a discard over data an older extent of the chain holds).

use bytes::BufMut;
use strata_core::Fields;
use strata_meta::{ObjectId, State};

use crate::versions::{Epoch, Granules, Lineage};

// Versions policies (periodic snapshots, protected snapshots): `versions-policy.<id>`.
pub mod policy;

pub const POOL: &str = "pool";
pub const VOLUMES: &str = "volumes";
pub const ALLOCATED: &str = "allocated";
pub const LIVE: &str = "live";
pub const HISTORY: &str = "history";
pub const MASKED: &str = "masked";
/// Pools without versions are written as version 1 (and read by builds before versions).
pub const POOL_FORMAT_VERSION: u32 = 1;
/// The version of a pool that has (or had) versions.
pub const POOL_FORMAT_VERSIONS: u32 = 2;

pub fn map_name(volume: u32) -> String {
    format!("map.{volume}")
}

pub fn versions_name(volume: u32) -> String {
    format!("versions.{volume}")
}

/// The extents holding a compacted snapshot's deltas.
pub fn compaction_name(volume: u32, epoch: Epoch) -> String {
    format!("compact.{volume}.{epoch}")
}

/// A compacted snapshot's records, by virtual extent.
pub fn deltas_name(volume: u32, epoch: Epoch) -> String {
    format!("deltas.{volume}.{epoch}")
}

/// Where one compacted extent's delta record lies (a `deltas.<id>.<epoch>` entry), followed
/// in the table by the granules the record gives the snapshot (data or zeros), so that walks
/// over the chains know what the snapshot no longer reads from them without reading the
/// record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaEntry {
    /// The physical extent holding the record (one of the compaction's delta extents).
    pub phys: u64,
    pub offset: u32,
    pub len: u32,
    /// crc32c of the record's bytes.
    pub crc: u32,
}

impl DeltaEntry {
    const FIXED: usize = 16;

    /// Bytes of a table entry in a pool of `per_extent` granules per extent.
    pub fn value_bytes(per_extent: u64) -> usize {
        Self::FIXED + per_extent.div_ceil(8) as usize
    }

    /// The entry and the granules its record covers.
    pub fn encode(&self, covered: &Granules) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::value_bytes(covered.len()));
        out.put_u32_le(self.phys as u32 + 1);
        out.put_u32_le(self.offset);
        out.put_u32_le(self.len);
        out.put_u32_le(self.crc);
        let mut set = vec![0u8; covered.len().div_ceil(8) as usize];
        for g in covered.iter() {
            set[(g / 8) as usize] |= 1 << (g % 8);
        }
        out.extend_from_slice(&set);
        out
    }

    /// The encoding of "no entry": a removed one is written as zeros.
    pub fn none(per_extent: u64) -> Vec<u8> {
        vec![0; Self::value_bytes(per_extent)]
    }

    pub fn decode(bytes: Option<&[u8]>) -> Option<DeltaEntry> {
        let bytes = bytes.filter(|b| b.len() >= Self::FIXED)?;
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        Some(DeltaEntry {
            phys: (u32_at(0) as u64).checked_sub(1)?,
            offset: u32_at(4),
            len: u32_at(8),
            crc: u32_at(12),
        })
    }

    /// The granules an entry's record covers (empty for no entry).
    pub fn covered(bytes: Option<&[u8]>, per_extent: u64) -> Granules {
        let set = bytes.and_then(|b| b.get(Self::FIXED..)).unwrap_or(&[]);
        Granules::from_fn(per_extent, |g| {
            set.get((g / 8) as usize)
                .is_some_and(|byte| byte & (1 << (g % 8)) != 0)
        })
    }
}

/// The extents a compaction wrote its deltas to (the `compact.<id>.<epoch>` blob): they
/// belong to it until it is undone or its snapshot deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionRecord {
    pub delta_extents: Vec<u64>,
}

const COMPACTION_RECORD_VERSION: u32 = 1;

impl CompactionRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32_le(COMPACTION_RECORD_VERSION);
        out.put_u32_le(self.delta_extents.len() as u32);
        for &extent in &self.delta_extents {
            out.put_u64_le(extent);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<CompactionRecord, String> {
        let mut fields = Fields::new(bytes, "compaction record");
        let version = fields.u32()?;
        if version != COMPACTION_RECORD_VERSION {
            return Err(format!("compaction record version {version}"));
        }
        let count = fields.u32()?;
        let delta_extents = (0..count)
            .map(|_| fields.u64())
            .collect::<Result<Vec<u64>, String>>()?;
        Ok(CompactionRecord { delta_extents })
    }
}

/// The pool's fixed shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolRecord {
    /// [`POOL_FORMAT_VERSION`] or [`POOL_FORMAT_VERSIONS`].
    pub format: u32,
    pub extent_size: u64,
    /// Byte offset of physical extent 0 on the child.
    pub data_start: u64,
    pub extents: u64,
    pub next_volume: u32,
}

impl PoolRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32_le(self.format);
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
        if !(POOL_FORMAT_VERSION..=POOL_FORMAT_VERSIONS).contains(&version) {
            return Err(format!(
                "thin pool format version {version}; this build reads {POOL_FORMAT_VERSION} \
                 and {POOL_FORMAT_VERSIONS}"
            ));
        }
        let record = PoolRecord {
            format: version,
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
    let mut fields = Fields::new(bytes, "volume list");
    let count = fields.u32()?;
    let mut volumes = Vec::new();
    for _ in 0..count {
        let id = fields.u32()?;
        let size = fields.u64()?;
        let name = fields.name()?;
        volumes.push(VolumeRecord { id, size, name });
    }
    Ok(volumes)
}

/// A physical extent's place in its chain (the `history` table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub epoch: Epoch,
    /// The next older physical extent of the chain.
    pub older: Option<u64>,
}

impl History {
    pub const BYTES: usize = 8;

    pub fn encode(&self) -> [u8; 8] {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&self.epoch.to_le_bytes());
        let older = self.older.map_or(0, |o| o as u32 + 1);
        out[4..].copy_from_slice(&older.to_le_bytes());
        out
    }

    /// A missing or all-zero entry is epoch 0 with nothing older: every extent of a pool
    /// before versions.
    pub fn decode(bytes: Option<&[u8]>) -> History {
        let Some(bytes) = bytes.filter(|b| b.len() == Self::BYTES) else {
            return History::default();
        };
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        History {
            epoch: u32_at(0),
            older: (u32_at(4) as u64).checked_sub(1),
        }
    }
}

/// A snapshot of a volume: a name for one of its epochs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub name: String,
    pub epoch: Epoch,
    /// Milliseconds since the Unix epoch, when it was taken.
    pub created_ms: u64,
    /// The volume's size then.
    pub size: u64,
    /// Compacted (maybe in part) as deltas against the version at this epoch, which stays
    /// pinned while it is (a "shadow" if its snapshot is deleted).
    pub compacted: Option<Epoch>,
}

/// Where a clone's data comes from before it writes its own: a volume and one of its epochs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Base {
    pub volume: u32,
    pub epoch: Epoch,
}

/// A volume's versions (the `versions.<id>` blob).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionsRecord {
    pub lineage: Lineage,
    pub snapshots: Vec<SnapshotRecord>,
    pub base: Option<Base>,
}

/// Version 2 adds each snapshot's compaction base; version 1 records are read as having none.
const VERSIONS_RECORD_VERSION: u32 = 2;

impl VersionsRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.put_u32_le(VERSIONS_RECORD_VERSION);
        out.put_u32_le(self.lineage.current);
        out.put_u32_le(self.lineage.jumps.len() as u32);
        for (&epoch, &parent) in &self.lineage.jumps {
            out.put_u32_le(epoch);
            out.put_u32_le(parent);
        }
        match self.base {
            Some(base) => {
                out.put_u8(1);
                out.put_u32_le(base.volume);
                out.put_u32_le(base.epoch);
            }
            None => out.put_u8(0),
        }
        out.put_u32_le(self.snapshots.len() as u32);
        for snapshot in &self.snapshots {
            out.put_u32_le(snapshot.epoch);
            out.put_u64_le(snapshot.created_ms);
            out.put_u64_le(snapshot.size);
            out.put_u8(snapshot.name.len() as u8);
            out.put_slice(snapshot.name.as_bytes());
            match snapshot.compacted {
                Some(base) => {
                    out.put_u8(1);
                    out.put_u32_le(base);
                }
                None => out.put_u8(0),
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<VersionsRecord, String> {
        let mut fields = Fields::new(bytes, "versions record");
        let version = fields.u32()?;
        if !(1..=VERSIONS_RECORD_VERSION).contains(&version) {
            return Err(format!("versions record version {version}"));
        }
        let current = fields.u32()?;
        let jumps = fields.u32()?;
        let mut lineage = Lineage {
            current,
            jumps: Default::default(),
        };
        for _ in 0..jumps {
            let epoch = fields.u32()?;
            let parent = fields.u32()?;
            if parent >= epoch || epoch > current {
                return Err(format!(
                    "epoch {epoch} has parent {parent} (current {current})"
                ));
            }
            lineage.jumps.insert(epoch, parent);
        }
        let base = match fields.u8()? {
            0 => None,
            1 => Some(Base {
                volume: fields.u32()?,
                epoch: fields.u32()?,
            }),
            other => return Err(format!("base marker {other}")),
        };
        let count = fields.u32()?;
        let mut snapshots = Vec::new();
        for _ in 0..count {
            let epoch = fields.u32()?;
            let created_ms = fields.u64()?;
            let size = fields.u64()?;
            let name = fields.name()?;
            if epoch >= current {
                return Err(format!(
                    "snapshot {name} pins epoch {epoch}, not before {current}"
                ));
            }
            let compacted = match version {
                1 => None,
                _ => match fields.u8()? {
                    0 => None,
                    1 => {
                        let base = fields.u32()?;
                        if base <= epoch || base >= current {
                            return Err(format!(
                                "snapshot {name} (epoch {epoch}) is compacted against epoch \
                                 {base} (current {current})"
                            ));
                        }
                        Some(base)
                    }
                    other => return Err(format!("snapshot {name}: compaction marker {other}")),
                },
            };
            snapshots.push(SnapshotRecord {
                name,
                epoch,
                created_ms,
                size,
                compacted,
            });
        }
        Ok(VersionsRecord {
            lineage,
            snapshots,
            base,
        })
    }
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
    let history = state.id(HISTORY).and_then(|id| state.table(id));
    let masked = state.id(MASKED).and_then(|id| state.bitmap(id));
    if (history.is_some() || masked.is_some()) && pool.format != POOL_FORMAT_VERSIONS {
        problems.push(format!(
            "the pool has versions objects but is format version {}",
            pool.format
        ));
    }
    let mut owners = std::collections::HashMap::new();
    for volume in &volumes {
        let Some(map) = state
            .id(&map_name(volume.id))
            .and_then(|id| state.table(id))
        else {
            problems.push(format!("volume {} has no map", volume.name));
            continue;
        };
        let versions = match state
            .id(&versions_name(volume.id))
            .map(|id| VersionsRecord::decode(state.blob(id).unwrap_or(&[])))
        {
            Some(Ok(versions)) => Some(versions),
            Some(Err(problem)) => {
                problems.push(format!("{}: {problem}", volume.name));
                continue;
            }
            None => None,
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
            // A rollback can leave a smaller volume whose older chains reach further; only
            // a volume without versions has nothing past its end.
            if index >= virtual_extents && versions.is_none() {
                problems.push(format!(
                    "{}: extent {index} lies past the volume's end",
                    volume.name
                ));
            }
            // The chain, newest first: epochs fall strictly, every link allocated and owned
            // once.
            let mut link = Some(phys);
            let mut newer_epoch: Option<Epoch> = None;
            while let Some(phys) = link {
                if phys >= pool.extents {
                    problems.push(format!(
                        "{}: extent {index}'s chain reaches outside the pool",
                        volume.name
                    ));
                    break;
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
                    break;
                }
                let record = History::decode(history.and_then(|t| t.get(phys)));
                if newer_epoch.is_some_and(|newer| record.epoch >= newer) {
                    problems.push(format!(
                        "{}: extent {index}'s chain does not run newest first at {phys}",
                        volume.name
                    ));
                    break;
                }
                let current = versions.as_ref().map_or(0, |v| v.lineage.current);
                if record.epoch > current {
                    problems.push(format!(
                        "{}: extent {phys} is of epoch {} past the current {current}",
                        volume.name, record.epoch
                    ));
                }
                newer_epoch = Some(record.epoch);
                link = record.older;
            }
        }
        if let Some(versions) = &versions {
            let found = Found {
                pool: &pool,
                allocated,
            };
            for snapshot in &versions.snapshots {
                found.check_compaction(state, volume, snapshot, &mut owners, &mut problems);
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
    if let Some(masked) = masked {
        let mut granule = masked.next(0, u64::MAX, true);
        while let Some(g) = granule {
            let extent = g / per_extent;
            if !owners.contains_key(&extent) {
                problems.push(format!("granule {g} is masked in unmapped extent {extent}"));
                granule = masked.next((extent + 1) * per_extent, u64::MAX, true);
            } else {
                if live.get(g) {
                    problems.push(format!("granule {g} is both live and masked"));
                }
                granule = masked.next(g + 1, u64::MAX, true);
            }
        }
    }
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
    problems.extend(policy::check(state, &volumes));
    problems
}

/// What `check_state` has found of the pool, for the checks of its parts.
struct Found<'a> {
    pool: &'a PoolRecord,
    allocated: &'a strata_meta::Bitmap,
}

/// Owner of each physical extent found so far: (volume, virtual extent or a description).
type Owners = std::collections::HashMap<u64, (String, u64)>;

impl Found<'_> {
    /// A compacted snapshot's objects: both present exactly when it is compacted, its delta
    /// extents allocated and owned by it alone, every entry inside one of them.
    fn check_compaction(
        &self,
        state: &State,
        volume: &VolumeRecord,
        snapshot: &SnapshotRecord,
        owners: &mut Owners,
        problems: &mut Vec<String>,
    ) {
        let what = format!("{}@{}", volume.name, snapshot.name);
        let blob = state.id(&compaction_name(volume.id, snapshot.epoch));
        let table = state
            .id(&deltas_name(volume.id, snapshot.epoch))
            .and_then(|id| state.table(id));
        let (Some(blob), Some(table)) = (blob, table) else {
            if snapshot.compacted.is_some() || blob.is_some() || table.is_some() {
                problems.push(format!("{what}: compaction records are incomplete"));
            }
            return;
        };
        if snapshot.compacted.is_none() {
            problems.push(format!(
                "{what}: compaction records of a snapshot not compacted"
            ));
        }
        let record = match CompactionRecord::decode(state.blob(blob).unwrap_or(&[])) {
            Ok(record) => record,
            Err(problem) => {
                problems.push(format!("{what}: {problem}"));
                return;
            }
        };
        for &phys in &record.delta_extents {
            if phys >= self.pool.extents || !self.allocated.get(phys) {
                problems.push(format!("{what}: delta extent {phys} is not allocated"));
            }
            if let Some(other) = owners.insert(phys, (what.clone(), u64::MAX)) {
                problems.push(format!("delta extent {phys} of {what} is also {other:?}'s"));
            }
        }
        for (index, value) in table.iter_from(0) {
            let Some(entry) = DeltaEntry::decode(Some(value)) else {
                continue;
            };
            let end = entry.offset as u64 + entry.len as u64;
            if !record.delta_extents.contains(&entry.phys) || end > self.pool.extent_size {
                problems.push(format!(
                    "{what}: extent {index}'s delta lies outside its delta extents"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_versions_record_round_trips_and_damage_is_named() {
        let mut lineage = Lineage::default();
        lineage.advance();
        lineage.advance();
        lineage.branch(0);
        let record = VersionsRecord {
            lineage,
            snapshots: vec![
                SnapshotRecord {
                    name: "nightly".into(),
                    epoch: 1,
                    created_ms: 1_795_629_915_000,
                    size: 1 << 30,
                    compacted: None,
                },
                SnapshotRecord {
                    name: "first".into(),
                    epoch: 0,
                    created_ms: 1_795_629_000_000,
                    size: 1 << 30,
                    compacted: Some(1),
                },
            ],
            base: Some(Base {
                volume: 3,
                epoch: 7,
            }),
        };
        let bytes = record.encode();
        assert_eq!(VersionsRecord::decode(&bytes).unwrap(), record);
        // A compaction base must be a later epoch than the snapshot's own.
        let mut backwards = record.clone();
        backwards.snapshots[1].compacted = Some(0);
        let problem = VersionsRecord::decode(&backwards.encode()).unwrap_err();
        assert!(problem.contains("compacted against epoch 0"), "{problem}");
        let short = VersionsRecord::decode(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(short.contains("versions record is short"), "{short}");
        let mut future = bytes.clone();
        future[0] = 9;
        assert!(VersionsRecord::decode(&future)
            .unwrap_err()
            .contains("version 9"));
        // A snapshot can only pin an epoch before the current one.
        let mut bad = record.clone();
        bad.snapshots[0].epoch = bad.lineage.current;
        assert!(VersionsRecord::decode(&bad.encode())
            .unwrap_err()
            .contains("pins epoch"));
        let history = History {
            epoch: 5,
            older: Some(0),
        };
        assert_eq!(History::decode(Some(&history.encode())), history);
        assert_eq!(History::decode(None), History::default());
    }
}
