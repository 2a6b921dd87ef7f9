//! A brick's durable side of consistency intervals (RIBD §2.5, issue 19).
//!
//! A brick holds one share of a shared volume (its *home* region) and takes part in the
//! two-phase commit of every interval that writes to it:
//! - **prepare**: the interval's writes go to free space in the brick's *staging* region, and
//!   a record of them (where they go, where they wait, which bricks share the interval) is
//!   committed to the brick's metadata store. Only then does the brick vote yes. Nothing is
//!   visible yet.
//! - **commit**: the decision is recorded durably first, then the staged writes are copied
//!   home, and the record shrinks to a tombstone that frees the staging space. A crash
//!   between the two redoes the copy at the next open, so an acknowledged commit survives.
//! - **abort**: the decision is recorded, the staged writes are dropped.
//!
//! The rules (what a repeated prepare or a late abort means) are `strata_cluster::interval`'s,
//! shared with the model the protocol's fault tests run. The on-disk format is in
//! `docs/brick-format.md`.

pub mod commit;
pub mod failstop;
#[doc(hidden)]
pub mod fuzzing;
pub mod inspect;
mod layout;
pub mod metrics;
pub mod participant;
mod record;
pub mod resolve;
pub mod rpc;
pub mod segments;
mod space;
mod store;
pub mod versions;
mod volume;

pub use layout::{BrickLayout, LAYOUT_VERSION};
pub use record::{IntervalRecord, RecordState, StagedExtent, RECORD_VERSION};
pub use space::FreeSpace;
pub use store::{
    BrickOptions, BrickSettings, BrickStore, BrickSummary, OpenReport, PrepareRefusal, StepKind,
    StepProgress, Units, VersionInfo, Vote, OWNER, SECTOR,
};
pub use volume::{LockOwner, RangeLock, Rebuilt, SharedVolume};
