//! Media damage: bytes that change on the medium after the layer wrote and flushed them.
//!
//! A crash only ever loses or tears writes still in the cache. A medium also goes bad under
//! data that was durable: a bit rots, a head writes the wrong track, firmware returns another
//! block. A layer that checksums its metadata must then either recover the data (from another
//! copy) or refuse to open; what it must never do is open and serve wrong or missing data as
//! if nothing happened. [`Damage`] describes such a fault and applies it to the images a power
//! cut left; `damaged_device_scenario` (in the scenario module) checks the rule.

use crate::{CrashRng, DiskImage};

/// `bytes` distinct bytes flipped at seeded-random places in `[offset, offset + len)` of disk
/// `disk` (its index in creation order, as in the images a crash returns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub disk: usize,
    pub offset: u64,
    pub len: u64,
    pub bytes: usize,
}

impl Damage {
    /// `bytes` flipped in `[offset, offset + len)` of disk 0.
    pub fn new(offset: u64, len: u64, bytes: usize) -> Self {
        Damage {
            disk: 0,
            offset,
            len,
            bytes,
        }
    }

    /// The same damage on disk `disk`.
    pub fn on_disk(self, disk: usize) -> Self {
        Damage { disk, ..self }
    }

    /// Flips the bytes; returns a line saying which, for the failure report.
    pub fn apply(&self, images: &mut [DiskImage], rng: &mut CrashRng) -> String {
        let image = images
            .get_mut(self.disk)
            .unwrap_or_else(|| panic!("damage on disk {}, which does not exist", self.disk));
        let hit = image.flip_bytes(self.offset, self.len, self.bytes, rng);
        format!(
            "damage: disk {} [{}, +{}): flipped {} byte(s) at {hit:?}",
            self.disk, self.offset, self.len, self.bytes
        )
    }
}

/// What a [`damaged_device_scenario`](crate::damaged_device_scenario) seed saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DamageStats {
    /// Power cut, damage and reopen cycles run.
    pub damage_points: u64,
    /// Reopens that failed: the damage was reported and the device refused. Ends the seed.
    pub refused: u64,
    /// Reads of the reopened device that failed: the damage was reported on read. Ends the
    /// seed.
    pub read_errors: u64,
    /// Reopens after which every sector held what the model allows.
    pub intact: u64,
}

impl DamageStats {
    /// Adds another seed's counts (for a test that reports totals).
    pub fn add(&mut self, other: DamageStats) {
        self.damage_points += other.damage_points;
        self.refused += other.refused;
        self.read_errors += other.read_errors;
        self.intact += other.intact;
    }
}

impl From<DamageStats> for crate::CrashStats {
    fn from(stats: DamageStats) -> Self {
        crate::CrashStats {
            crash_points: stats.damage_points,
        }
    }
}
