//! A brick's durable side of consistency intervals (RIBD §2.5, issue 19), and a host's side
//! of a shared volume over bricks.
//!
//! A brick holds one share of a shared volume and takes part in the two-phase commit of every
//! interval that writes to it:
//! - **prepare**: the interval's writes go to free 4 KiB units of the brick, and a record of
//!   them (where they go, where they wait, which bricks share the interval) is committed to the
//!   brick's metadata store. Only then does the brick vote yes. Nothing is visible yet.
//! - **commit**: one metadata transaction maps those units into the share (each byte is
//!   written once) and leaves a tombstone; the commit is acknowledged once it is durable.
//! - **abort**: the decision is recorded, the units go back.
//!
//! A brick stops at its disk's first failure (`failstop`). The rules (what a repeated prepare
//! or a late abort means) are `strata_cluster::interval`'s, shared with the model the
//! protocol's fault tests run. The on-disk format is in `docs/brick-format.md`; the host's
//! side (`SharedVolume`) in `docs/shared-volumes.md`.

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
pub use record::{blob_name, IntervalRecord, RecordState, StagedExtent, RECORD_VERSION};
pub use space::FreeSpace;
pub use store::{
    BrickOptions, BrickSettings, BrickStore, BrickSummary, OpenReport, PrepareRefusal, StepKind,
    StepProgress, Units, VersionInfo, Vote, OWNER, SECTOR,
};
pub use volume::{Interval, LockOwner, RangeLock, Rebuilt, SharedVolume};
