//! Virtual Allocation: thin pools whose volumes get physical extents on first write.
//!
//! - `map`: address arithmetic (extents, 4 KiB granules), pure.
//! - `alloc`: which extent a first write gets (log order from a moving head), pure.
//! - `records`: the pool's objects in the metadata store and their invariants.
//! - `pool`: format/open, volumes, space, flush.
//! - `policy`: run-time policies (map commit, when full, low water) and what they promise.
//! - `space`: low-water mark, writes waiting for space, usage counts.
//! - `volume`: the block device a volume is.
//! - `lifecycle`: volumes resized and deleted at run time.
//! - `versions`: Clotho's versions as policy: epochs, what each version sees, what a write
//!   may overwrite and what a deletion frees; pure.
//! - `chain`: where each granule of a version lives (a walk down the chains).
//! - `snapshot`: versions taken, listed, deleted, rolled back to, cloned; the view I/O reads.
//! - `snapshot_device`: a snapshot as a read-only block device.
//! - `kind`: the pool as a registry kind; its volumes are made and found by control verbs.
//! - `schedule`: periodic versions as policy: when a snapshot is due, which keep-K deletes,
//!   automatic names; pure.
//! - `reserve`: the space reserve for versions as policy: its size, which snapshot
//!   `delete-oldest` takes; pure.
//! - `runner`: the versions policies at work: periodic snapshots kept to the last K.
//! - `policy_records`: a volume's policy record and protections, set and shown.
//! - `reserve_watch`: the space reserve at work: refusals and delete-oldest.
//! - `policy_status`: the policies in `strata status`.
//! - `policy_verbs`: the pool's verbs for them (`snapshot-policy`, `snapshot-protect`…).

mod alloc;
mod chain;
mod compact;
pub mod config;
pub mod delta;
pub mod fuzzing;
mod kind;
mod lifecycle;
mod map;
mod policy;
mod policy_records;
mod policy_status;
mod policy_verbs;
mod pool;
mod records;
mod reserve;
mod reserve_watch;
mod runner;
pub mod schedule;
mod snapshot;
mod snapshot_device;
mod space;
pub mod versions;
mod volume;

pub use compact::{CompactReport, UncompactReport};
pub use config::PoolConfig;
pub use kind::{KIND, VERBS};
pub use lifecycle::VolumeUsage;
pub use map::GRANULE;
pub use policy::{LowWater, MapCommit, WhenFull, DEFAULT_FULL_WAIT};
pub use policy_records::PolicyStatus;
pub use pool::{
    check_extent_size, map_id, PoolOptions, PoolRuntime, ThinPool, DEFAULT_EXTENT_SIZE,
};
pub use records::check_state;
pub use reserve::{Reserve, ReservePolicy, WhenReserveLow};
pub use runner::{PolicyCounts, PolicyReport, DEFAULT_POLICY_INTERVAL};
pub use schedule::Schedule;
pub use snapshot::{SnapshotDevice, SnapshotInfo};
pub use space::{PoolSpace, VolumeSpace};
pub use volume::{ThinVolume, VolumeRef};
