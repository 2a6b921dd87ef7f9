//! What a brick holds now, in one look: its format and share, its units, its versions, the
//! intervals it holds in doubt and the roll-back or deletion it runs. `strata brick status`
//! shows it (the `Describe` call) and the brick's metrics export it.

use super::{staged_units, BrickStore, VersionInfo};
use crate::layout::LAYOUT_VERSION;
use crate::record::RecordState;
use crate::space::UNIT;

/// The units (4 KiB each) of the brick's data region, home and staging together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Units {
    pub total: u64,
    /// Free for prepares. Units freed by a transaction not yet durable, or still looked up
    /// by a read, are not counted free until they can be reused.
    pub free: u64,
    /// Old data kept by versions.
    pub kept: u64,
    /// Data of prepared intervals, staged and undecided.
    pub staged: u64,
    /// Units of the share whose data lives away from home (the map's entries).
    pub away: u64,
}

impl Units {
    pub fn used(&self) -> u64 {
        self.total - self.free
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    Rollback,
    Delete,
}

impl StepKind {
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Rollback => "rollback",
            StepKind::Delete => "delete",
        }
    }
}

/// How far a roll-back or a deletion has got: the entries of the versions' tables it has
/// moved, of all it has to move. A deletion's total grows if commits add entries to the
/// version meanwhile; a roll-back's does not (it runs with no interval in doubt, and refuses
/// prepares).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepProgress {
    pub kind: StepKind,
    /// The version rolled back to, or deleted.
    pub version: u64,
    /// Entries moved by durable transactions.
    pub done_entries: u64,
    pub total_entries: u64,
    /// False once the step has ended; it is kept to show how the last one ended.
    pub running: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrickSummary {
    /// The brick format on the device (`docs/brick-format.md`): an open upgrades older ones.
    pub format: u8,
    pub share_bytes: u64,
    pub unit_bytes: u64,
    pub units: Units,
    /// The versions kept, oldest first.
    pub versions: Vec<VersionInfo>,
    /// The newest version number ever created here, and the newest sealed.
    pub newest_version: u64,
    pub sealed_version: u64,
    /// Prepared intervals with no decision yet.
    pub in_doubt: u64,
    /// The latest roll-back or deletion since the brick was opened.
    pub step: Option<StepProgress>,
}

impl BrickSummary {
    /// Whether version `number` is sealed here: its cut is final.
    pub fn is_sealed(&self, number: u64) -> bool {
        number <= self.sealed_version
    }
}

impl BrickStore {
    /// What the brick holds now. Unlike a status or the in-doubt list, it does not wait for
    /// what it saw to be durable: it is for people and metrics, and no peer decides by it.
    pub fn summary(&self) -> BrickSummary {
        let mut mem = self.lock();
        self.reclaim(&mut mem);
        let versions = self.version_infos(&mem);
        let away = (self.meta).read(|state| state.table(self.map_table).map_or(0, |t| t.len()));
        let prepared =
            || (mem.intervals.values()).filter(|live| live.record.state == RecordState::Prepared);
        let staged: usize = prepared()
            .map(|live| staged_units(&live.record.extents).len())
            .sum();
        let units = Units {
            total: (self.layout.home_bytes + self.layout.staging_bytes) / UNIT,
            free: mem.space.free_bytes() / UNIT,
            kept: versions.iter().map(|v| v.held_bytes / UNIT).sum(),
            staged: staged as u64,
            away,
        };
        BrickSummary {
            format: LAYOUT_VERSION,
            share_bytes: self.layout.home_bytes,
            unit_bytes: UNIT,
            units,
            versions,
            newest_version: mem.versions_blob.newest,
            sealed_version: mem.versions_blob.sealed,
            in_doubt: prepared().count() as u64,
            step: mem.step,
        }
    }
}
