//! Strata's crash harness and fault injection, used by the tests of every stateful layer.
//!
//! A layer that keeps state on its children (a journal, a map, a superblock) is only as good
//! as its recovery, and recovery bugs hide in the moments nobody tests by hand: power failing
//! between a data write and the metadata that points to it, a cache that lands writes out of
//! order, a write torn in half. This crate makes those moments cheap to produce by the
//! thousand, and every failure reproducible from one seed:
//!
//! - [`CrashGroup`] / [`CrashDisk`]: disks with a volatile cache that lose power together, at
//!   a chosen mutating operation or now, keeping any subset of their unflushed writes (whole,
//!   torn at 512-byte sectors, reordered). Also injects read and write errors, latent sector
//!   errors, and disks that disappear.
//! - [`DiskImage`]: what a disk kept; reopen a stack over disks made from images.
//! - [`DeviceModel`] and [`pattern`]: what a device that behaves like one disk may legally
//!   return after a crash, and self-describing data that makes a wrong sector explain itself.
//! - [`CrashRun`]: runs a test over many seeds; a failure prints the line that replays it.
//! - [`flat_device_scenario`]: the whole loop (workload, crash, reopen, check) for any stack
//!   that should behave like a plain disk.
//! - [`Damage`] and [`damaged_device_scenario`]: media damage after a completed flush; the
//!   reopened stack must either refuse or serve every flushed write intact.
//! - [`testkit`]: helpers the layers' tests share, such as a device that sees each request
//!   before it goes down.
//!
//! See `docs/crash-harness.md` for the crash model, the model's rules and how to replay.

mod damage;
mod device;
mod disk;
mod image;
mod model;
mod pattern;
mod run;
mod scenario;
pub mod testkit;

pub use damage::{Damage, DamageStats};
pub use device::{CrashDisk, ENODEV};
pub use disk::{CrashGroup, CrashPolicy, DiskCounters, SECTOR};
pub use image::{DiskImage, PAGE};
pub use model::{DeviceModel, FlushId, WriteId};
pub use pattern::{decode_pattern, describe_sector, pattern, PatternHeader, SECTOR_BYTES};
pub use run::{
    panic_message, CrashPlan, CrashRun, CrashStats, CrashSummary, DEFAULT_BASE_SEED, ENV_BASE,
    ENV_ITERATIONS, ENV_SEED,
};
pub use scenario::{
    damaged_device_scenario, flat_device_scenario, open_disks, sector_disk, ScenarioConfig,
};

/// Re-exported so tests seed [`CrashRng`] and draw from it with the same `rand` version.
pub use rand;
/// The harness's random number generator: ChaCha8, whose output is fixed across versions, so
/// a seed replays the same run on any machine and any later build.
pub use rand_chacha::ChaCha8Rng as CrashRng;
