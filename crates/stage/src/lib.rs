//! `stage`: Proximal I/O's flash staging (Schindler, Shete & Smith, FAST '11). Writes
//! smaller than a threshold append to a log on a fast child, which is their durable home until
//! a destage moves them, sorted per extent and placed next to their logical neighbours, to
//! the slow child in dense ascending batches; larger writes go to the slow child directly.
//!
//! ```toml
//! [[layer]]
//! name = "staged"
//! kind = "stage"
//! children = ["flash", "disk"]   # [fast, slow], in this order
//! threshold = "168KiB"           # smaller writes are staged
//! trigger = "density"            # "full" (default) | "watermark" | "density"
//! density = 8                    # staged blocks that make an extent ready to destage
//! # destage-depth = 1             # requests in flight per batch (default: the whole batch)
//! ```
//!
//! Modules, one job each:
//! - `shape`: blocks, allocation ranges, extents, log slots (arithmetic);
//! - `config`: the `[[layer]]` options, defaults and rules;
//! - `trigger`: when to destage and what (pure);
//! - `plan`: the destage planner (pure): placement near logical neighbours, ascending
//!   batches per extent, cut into strands of `destage-depth` if one is set;
//! - `map`: the compact map's records (ranges with a base, home bits, moved blocks);
//! - `records`: the metadata objects, the format record, the invariants;
//! - `alloc`: free blocks and ranges of the slow child in memory, frees held until durable;
//! - `log`: the log's slots in memory, same rule, pinned during a destage;
//! - `stage`: the layer's state, format and open;
//! - `io`: reads (scatter-gather), writes (staged or direct), flush;
//! - `destage`: the destage mechanism and the background destager;
//! - `status`: counters and `strata status`;
//! - `kind`: the registry kind and the block device.
//!
//! The on-disk format, the crash ordering and the failure modes: `docs/layers/stage.md`.

mod alloc;
pub mod config;
mod destage;
mod io;
mod kind;
mod log;
pub mod map;
pub mod plan;
pub mod records;
pub mod shape;
mod stage;
mod status;
pub mod trigger;

pub use config::StageConfig;
pub use destage::DestageReport;
pub use kind::{open_or_format, StageDevice, DESTAGE, KIND};
pub use records::{check_state, STAGE_FORMAT_VERSION};
pub use stage::{Settings, Stage, MIN_LOG_SLOTS};
pub use status::CountersSnapshot;
