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
//! - `kind`: the pool as a registry kind; its volumes are made and found by control verbs.

mod alloc;
pub mod config;
mod kind;
mod lifecycle;
mod map;
mod policy;
mod pool;
mod records;
mod space;
mod volume;

pub use config::PoolConfig;
pub use kind::{KIND, VERBS};
pub use lifecycle::VolumeUsage;
pub use map::GRANULE;
pub use policy::{LowWater, MapCommit, WhenFull, DEFAULT_FULL_WAIT};
pub use pool::{
    check_extent_size, map_id, PoolOptions, PoolRuntime, ThinPool, DEFAULT_EXTENT_SIZE,
};
pub use records::check_state;
pub use space::{PoolSpace, VolumeSpace};
pub use volume::{ThinVolume, VolumeRef};
