//! `migrate`: user-centric data migration (Kang & Reddy, "User-Centric Data Migration in
//! Networked Storage Systems"). The layer maps 128 KiB chunks over N ≥ 2 children (child 0
//! the local disk, the others typically remote bricks), measures each child's response time
//! itself, and moves the data being accessed to the fastest child when the one holding it is
//! slower by more than δ.
//!
//! ```toml
//! [[layer]]
//! name = "mig"
//! kind = "migrate"
//! children = ["local", "brick1", "brick2"]
//! allocation = "str"     # "str" (round-robin chunks) | "seq" (child 0 first)
//! policy = "mig"         # "mig" | "nomig" | "locality"
//! delta = "adaptive"     # or a duration: "5ms"
//! tokens = 4             # migrations per second
//! ```
//!
//! Modules, one job each:
//! - `policy`: the pure rules (EWMA, δ, destination, tokens, candidate list, allocation);
//! - `config`: the `[[layer]]` options, defaults and rules;
//! - `shape`: chunks and chunk slots (arithmetic);
//! - `records`: the metadata objects, the map entry, the invariants;
//! - `migrate`: the layer's state, format and open;
//! - `io`: reads, writes, migration on access (a read's in the background), discard, flush;
//! - `merge`: the background merger of partial chunks;
//! - `status`: counters and `strata status`;
//! - `kind`: the registry kind and the block device.
//!
//! The on-disk format, the crash ordering and the options: `docs/layers/migrate.md`.

pub mod config;
mod io;
mod kind;
mod merge;
mod migrate;
pub mod policy;
pub mod records;
pub mod shape;
mod status;

pub use config::MigrateConfig;
pub use kind::{open_or_format, MigrateDevice, KIND, MERGE};
pub use migrate::{Migrate, Settings, MAX_MIGRATIONS_IN_FLIGHT};
pub use records::{check_state, MIGRATE_FORMAT_VERSION};
pub use status::CountersSnapshot;
