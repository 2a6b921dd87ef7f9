//! `mirror`: RAID-1 over n ≥ 2 members, like md raid1 with an internal write-intent bitmap.
//!
//! ```toml
//! [[layer]]
//! name = "m0"
//! kind = "mirror"
//! children = ["d0", "d1"]
//! region = "64MiB"          # write-intent bitmap granularity (md's default chunk)
//! metadata-size = "4MiB"    # reserved at the start of every member (used at format only)
//! bitmap-clear-ms = 5000    # a dirty region is cleaned after this long without writes
//! resync-concurrency = 4    # copy requests in flight while resyncing
//! ```
//!
//! Why it is built this way (the on-disk layout is in `docs/layers/mirror.md`):
//! - Every member starts with the same metadata region, one `MetaStore` written to all of them
//!   at once ([`meta::MetaFanout`]), so the mirror's own state survives any member but the last.
//! - The write-intent bitmap is what lets a crash cost only the regions being written: before
//!   the first write to a clean region its bit is made durable, and only then does data go to
//!   the members. Bits are cleared lazily once a flush has made the region identical everywhere.
//! - A member that fails a write is marked faulty *durably before the write is acknowledged*:
//!   otherwise a crash could bring it back as in-sync with a write it never got.
//! - Resync (a new member, or dirty regions after a crash) copies region by region under a
//!   per-region lock that writes also take (shared), so a copy can never land stale data over
//!   a newer write.
//!
//! Files: `policy` (pure decisions), `meta` (the store on every member), `io` (the data
//! path), `resync` (background copying and bit clearing), `control` (describe, add, replace,
//! fail).

mod control;
mod io;
mod meta;
pub mod policy;
mod resync;
mod state;

use std::sync::Arc;
use std::time::Duration;
use strata_core::layer::verbs;

use serde::{Deserialize, Serialize};
use strata_core::{BlockError, ByteSize, DeviceRef, Result, Runtime};

use strata_core::layer::{ChildCount, LayerArgs, LayerKind, StartPolicy};

pub use policy::MemberState;
pub use state::{Mirror, MirrorStats};

/// The metadata store's owner name.
pub const OWNER: &str = "mirror";

pub static KIND: LayerKind =
    LayerKind::new::<MirrorConfig>("mirror", ChildCount::AtLeast(2), |args| {
        Box::pin(async move { build(args).await.map(|m| Arc::new(m) as DeviceRef) })
    })
    .about("RAID-1 over n members with a write-intent bitmap and online resync")
    .tolerating(|n| n.saturating_sub(1))
    .verbs(&[verbs::REPLACE, verbs::ADD_MEMBER, verbs::FAIL_MEMBER]);

/// Settings of a mirror; `region` and `metadata_size` matter only when formatting.
#[derive(Clone, Debug)]
pub struct MirrorOptions {
    pub region: u64,
    pub metadata_size: u64,
    /// A dirty region with no writes for this long is cleaned at the next flush or tick;
    /// zero cleans at every flush and runs no timer.
    pub bitmap_clear: Duration,
    /// Copy requests in flight while resyncing; 0 counts as 1.
    pub resync_concurrency: usize,
    /// Largest piece a resync copies at once.
    pub copy_chunk: u64,
    /// A resyncing member's progress is made durable at least this often (bytes).
    pub resync_checkpoint: u64,
    /// Whether this start may format blank members and start with in-sync members missing.
    pub start: StartPolicy,
}

impl Default for MirrorOptions {
    fn default() -> Self {
        MirrorOptions {
            region: 64 << 20,
            metadata_size: 4 << 20,
            bitmap_clear: Duration::from_secs(5),
            resync_concurrency: 4,
            copy_chunk: 1 << 20,
            resync_checkpoint: 256 << 20,
            start: StartPolicy::default(),
        }
    }
}

/// A `[[layer]]` table of kind `mirror`; the defaults are [`MirrorOptions::default`]'s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MirrorConfig {
    /// Write-intent bitmap granularity; used at format only.
    pub region: ByteSize,
    /// Reserved at the start of every member; used at format only.
    pub metadata_size: ByteSize,
    pub bitmap_clear_ms: u64,
    /// Copy requests in flight while resyncing (0 counts as 1).
    pub resync_concurrency: u64,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        let defaults = MirrorOptions::default();
        MirrorConfig {
            region: ByteSize(defaults.region),
            metadata_size: ByteSize(defaults.metadata_size),
            bitmap_clear_ms: defaults.bitmap_clear.as_millis() as u64,
            resync_concurrency: defaults.resync_concurrency as u64,
        }
    }
}

impl MirrorConfig {
    /// The settings a mirror opens with; the rest keep their defaults.
    pub fn options(&self, start: StartPolicy) -> MirrorOptions {
        MirrorOptions {
            region: self.region.0,
            metadata_size: self.metadata_size.0,
            bitmap_clear: Duration::from_millis(self.bitmap_clear_ms),
            // As configured, 0 included: the resync counts 0 as 1 where it uses it, and
            // `describe` gives back what the configuration said.
            resync_concurrency: self.resync_concurrency as usize,
            start,
            ..MirrorOptions::default()
        }
    }
}

async fn build(args: LayerArgs) -> Result<Mirror> {
    let config: MirrorConfig = args.options.parse()?;
    let options = config.options(args.start);
    Mirror::open(
        args.name,
        args.child_names,
        args.children,
        options,
        args.runtime,
    )
    .await
}

fn invalid(name: &str, what: impl std::fmt::Display) -> BlockError {
    BlockError::InvalidArgument(format!("mirror {name}: {what}"))
}

/// Keeps the compiler honest about the runtime type used by the background tasks.
type RuntimeRef = Arc<dyn Runtime>;
