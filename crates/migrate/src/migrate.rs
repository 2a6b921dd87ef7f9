//! The layer itself: its children, its metadata store on child 0, its free slots and its
//! policy state; format and open. The data path is in `io`, the merger in `merge`, status in
//! `status`.
//!
//! Lock rules:
//! - `locks` (striped, by logical chunk): a write, a discard, a merge and a migration hold
//!   their chunk alone from before they look at the map until their transaction is applied,
//!   and bump the stripe's `versions` counter. A read holds it shared while it looks at the
//!   map and reads the children; if the data it read is to migrate, it lets go, takes the
//!   chunk alone, and migrates only if the version is still the one it read under (else a
//!   write, a discard or another migration came in between: the data may be stale, and the
//!   migration is dropped). That second half of a read's migration runs in the background,
//!   after the read has been answered (`io`): the version check is the same. A request holds
//!   one chunk at a time: `read_range`/`write_range` of one chunk only.
//! - `space` and `policy` (std mutexes): in-memory only, never held across an await, never
//!   both at once. `in_flight` (a watch channel) is changed under `policy` when a migration is
//!   admitted, alone when one ends.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use strata_core::{Background, BlockError, DeviceRef, Result, Runtime, StripedLocks};
use strata_meta::{FormatOptions, MetaStore, Recovered, StoreOptions, TxnClass};

use crate::config::MigrateConfig;
use crate::policy::{Allocation, CandidateList, Delta, Ewma, Policy, Rng, TokenBucket};
use crate::records::{self, decode_shape, encode_shape, Entry, Ids, Location, OWNER};
use crate::shape::{Shape, BLOCK};
use crate::status::Counters;

const LOCK_STRIPES: usize = 1024;

/// Read migrations waiting or running in the background at most; a read that would start
/// one more does not migrate (`skipped in flight`).
pub const MAX_MIGRATIONS_IN_FLIGHT: usize = 8;

/// How a layer runs: its policy's settings (all may change between starts).
#[derive(Clone)]
pub struct Settings {
    pub runtime: Arc<dyn Runtime>,
    pub allocation: Allocation,
    pub policy: Policy,
    pub delta: Delta,
    /// The time constant of the response-time averages.
    pub smoothing: Duration,
    pub tokens_per_s: u64,
    pub token_cap: u64,
    pub candidate_probability: f64,
    pub candidates: u64,
    pub seed: u64,
    /// The background merger's period (None: no merger; tests call `merge_partial`).
    pub merge_interval: Option<Duration>,
    /// Test-only: commit the map without flushing the children first (the ordering bug the
    /// crash suite must catch).
    #[doc(hidden)]
    pub unsafe_skip_data_barrier: bool,
    /// Test-only: reuse a freed slot at once, before the transaction that freed it is
    /// durable (the other ordering bug the crash suite must catch).
    #[doc(hidden)]
    pub unsafe_reuse_before_durable: bool,
}

impl Settings {
    pub fn from_config(config: &MigrateConfig, runtime: Arc<dyn Runtime>) -> Result<Settings> {
        let invalid = BlockError::InvalidArgument;
        config.check().map_err(invalid)?;
        let seed = config.seed.unwrap_or_else(|| runtime.random_u64());
        Ok(Settings {
            allocation: config.allocation,
            policy: config.policy,
            delta: config.delta().map_err(invalid)?,
            smoothing: config.smoothing().map_err(invalid)?,
            tokens_per_s: config.tokens,
            token_cap: config.token_cap(),
            candidate_probability: config.candidate_probability,
            candidates: config.candidates,
            seed,
            merge_interval: config.merge_interval().map_err(invalid)?,
            unsafe_skip_data_barrier: false,
            unsafe_reuse_before_durable: false,
            runtime,
        })
    }
}

/// Free chunk slots, in memory.
pub(crate) struct Space {
    /// Per child, its slots no entry names.
    pub free: Vec<BTreeSet<u64>>,
    /// Slots freed by a transaction not yet durable: (first durable txn number that makes the
    /// free safe, child, slot). A crash could bring back the entry that names them.
    pub pending: Vec<(u64, usize, u64)>,
    /// Logical chunks with an entry.
    pub allocated: u64,
}

impl Space {
    pub fn free_total(&self) -> u64 {
        self.free.iter().map(|f| f.len() as u64).sum()
    }
}

/// The policy's state: response times, tokens, candidates, random draws.
pub(crate) struct PolicyState {
    pub stats: Vec<Ewma>,
    pub bucket: TokenBucket,
    pub candidates: CandidateList,
    pub rng: Rng,
}

pub struct Migrate {
    pub(crate) name: String,
    pub(crate) children: Vec<DeviceRef>,
    pub(crate) store: Arc<MetaStore>,
    pub(crate) ids: Ids,
    pub(crate) shape: Shape,
    pub(crate) settings: Settings,
    pub(crate) space: Mutex<Space>,
    pub(crate) policy: Mutex<PolicyState>,
    pub(crate) locks: StripedLocks,
    /// Per lock stripe: bumped by everything that changes a chunk's data or entry.
    pub(crate) versions: Vec<AtomicU64>,
    pub(crate) counters: Counters,
    pub(crate) background: Background,
    /// The chunks whose read migration was handed to the background and has not ended (at
    /// most one per chunk, at most [`MAX_MIGRATIONS_IN_FLIGHT`]).
    pub(crate) in_flight: tokio::sync::watch::Sender<BTreeSet<u64>>,
    /// (time, migrations) at the last status, for the rate it shows.
    pub(crate) last_status: Mutex<(Duration, u64)>,
    config: OnceLock<toml::Table>,
}

fn corrupt(name: &str, problem: impl std::fmt::Display) -> BlockError {
    BlockError::Corrupt(format!(
        "migrate {name}: {problem}; run `strata check` on its first child"
    ))
}

impl Migrate {
    fn check_children(name: &str, children: &[DeviceRef]) -> Result<()> {
        if children.len() < 2 {
            return Err(BlockError::InvalidArgument(format!(
                "migrate {name}: {} children; a migrate layer needs at least 2",
                children.len()
            )));
        }
        for (i, child) in children.iter().enumerate() {
            let min_io = u64::from(child.geometry().min_io.max(1));
            if !BLOCK.is_multiple_of(min_io) {
                return Err(BlockError::InvalidArgument(format!(
                    "migrate {name}: child {i} takes requests in units of {min_io} bytes; a \
                     migrate layer needs 4 KiB requests"
                )));
            }
        }
        Ok(())
    }

    /// Formats a new, empty layer: the metadata store at the start of child 0.
    pub async fn format(
        name: &str,
        children: Vec<DeviceRef>,
        config: &MigrateConfig,
        settings: Settings,
    ) -> Result<Arc<Migrate>> {
        Self::check_children(name, &children)?;
        config.check().map_err(BlockError::InvalidArgument)?;
        let sizes: Vec<u64> = children.iter().map(|c| c.geometry().size).collect();
        let metadata_bytes = config.metadata_bytes(sizes.iter().sum());
        let shape = Shape::new(config.chunk.0, metadata_bytes, &sizes)
            .map_err(|e| BlockError::InvalidArgument(format!("migrate {name}: {e}")))?;
        let store = MetaStore::format(
            children[0].clone(),
            0,
            metadata_bytes,
            FormatOptions::new(OWNER).random_from(settings.runtime.as_ref()),
            store_options(name, &children, &settings),
        )
        .await?;
        store.transact(TxnClass::Normal, |_, txn| {
            let record = txn.create_blob(records::MIGRATE);
            txn.put_blob(record, encode_shape(&shape));
            txn.create_table(records::CHUNKS, records::ENTRY_BYTES);
            Ok(())
        })?;
        store.commit().await?;
        tracing::info!(migrate = name, size = shape.size(), slots = ?shape.slots, "migrate formatted");
        Self::assemble(name, children, store, settings)
    }

    /// Opens the layer on its children, recovering its metadata.
    pub async fn open(
        name: &str,
        children: Vec<DeviceRef>,
        settings: Settings,
    ) -> Result<Arc<Migrate>> {
        Self::check_children(name, &children)?;
        let recovered = strata_meta::recover(children[0].as_ref(), 0).await?;
        Self::open_recovered(name, children, recovered, settings).await
    }

    pub(crate) async fn open_recovered(
        name: &str,
        children: Vec<DeviceRef>,
        recovered: Recovered,
        settings: Settings,
    ) -> Result<Arc<Migrate>> {
        Self::check_children(name, &children)?;
        if recovered.superblock.owner != OWNER {
            return Err(BlockError::InvalidArgument(format!(
                "migrate {name}: child 0's metadata belongs to a {:?}, not a migrate layer",
                recovered.superblock.owner
            )));
        }
        // The shape is checked against the children before the open writes anything.
        let shape = {
            let state = &recovered.state;
            let ids = Ids::find(state).map_err(|p| corrupt(name, p))?;
            decode_shape(state.blob(ids.migrate).unwrap_or(&[])).map_err(|p| corrupt(name, p))?
        };
        check_fits(name, &shape, &children)?;
        let options = store_options(name, &children, &settings);
        let (store, _) = MetaStore::open_recovered(children[0].clone(), recovered, options).await?;
        Self::assemble(name, children, store, settings)
    }

    fn assemble(
        name: &str,
        children: Vec<DeviceRef>,
        store: Arc<MetaStore>,
        settings: Settings,
    ) -> Result<Arc<Migrate>> {
        let (ids, shape) = store
            .read(|state| -> std::result::Result<_, String> {
                let ids = Ids::find(state)?;
                let shape = decode_shape(state.blob(ids.migrate).unwrap_or(&[]))?;
                Ok((ids, shape))
            })
            .map_err(|problem| corrupt(name, problem))?;
        check_fits(name, &shape, &children)?;
        let space = store
            .read(|state| rebuild_space(state, &ids, &shape))
            .map_err(|problem| corrupt(name, problem))?;
        let now = settings.runtime.now();
        let policy = PolicyState {
            stats: vec![Ewma::new(settings.smoothing); children.len()],
            bucket: TokenBucket::new(settings.tokens_per_s as f64, settings.token_cap as f64, now),
            candidates: CandidateList::new(
                settings.candidates as usize,
                settings.candidate_probability,
            ),
            rng: Rng::new(settings.seed),
        };
        let layer = Arc::new(Migrate {
            name: name.to_string(),
            counters: Counters::new(children.len()),
            children,
            store,
            ids,
            shape,
            settings,
            space: Mutex::new(space),
            policy: Mutex::new(policy),
            locks: StripedLocks::new(LOCK_STRIPES),
            versions: (0..LOCK_STRIPES).map(|_| AtomicU64::new(0)).collect(),
            background: Background::new(),
            in_flight: tokio::sync::watch::Sender::new(BTreeSet::new()),
            last_status: Mutex::new((now, 0)),
            config: OnceLock::new(),
        });
        if layer.settings.merge_interval.is_some() {
            layer.spawn_merger();
        }
        Ok(layer)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub fn store(&self) -> &Arc<MetaStore> {
        &self.store
    }

    pub fn children(&self) -> &[DeviceRef] {
        &self.children
    }

    pub fn background(&self) -> &Background {
        &self.background
    }

    /// Read migrations handed to the background that have not ended yet.
    pub fn migrations_in_flight(&self) -> usize {
        self.in_flight.borrow().len()
    }

    /// Waits until no read migration is in flight: every one handed to the background so far
    /// has landed, been dropped, failed or been cancelled. (Waits forever while the
    /// background work is quiesced with migrations waiting; a stop cancels them.)
    pub async fn settle(&self) {
        let mut watching = self.in_flight.subscribe();
        // The sender lives in `self`: the channel cannot close while we wait.
        let _ = watching.wait_for(|chunks| chunks.is_empty()).await;
    }

    /// The `[[layer]]` options it was built from, defaults explicit, for `describe`.
    pub fn set_config(&self, config: toml::Table) {
        let _ = self.config.set(config);
    }

    pub(crate) fn config(&self) -> Option<&toml::Table> {
        self.config.get()
    }

    pub(crate) fn space(&self) -> Result<MutexGuard<'_, Space>> {
        strata_core::poison::check(self.space.lock(), &self.name, "free slots")
    }

    pub(crate) fn policy_state(&self) -> Result<MutexGuard<'_, PolicyState>> {
        strata_core::poison::check(self.policy.lock(), &self.name, "policy state")
    }

    /// The map entry of `chunk` now (tests and status).
    pub fn entry(&self, chunk: u64) -> Entry {
        self.store
            .read(|state| records::entry(state, &self.ids, chunk))
    }

    /// Where logical block `block` is valid: (child, byte offset on it), None if unwritten.
    pub fn locate(&self, block: u64) -> Option<(usize, u64)> {
        let chunk = block / self.shape.chunk_blocks;
        let index = block % self.shape.chunk_blocks;
        let entry = self.entry(chunk);
        let location = entry.locations[entry.holder(index)?]?;
        Some((
            location.device,
            self.shape.offset(location.device, location.slot, index),
        ))
    }

    /// Valid blocks on each child.
    pub fn blocks_per_device(&self) -> Vec<u64> {
        let mut blocks = vec![0; self.children.len()];
        self.store.read(|state| {
            for (_, entry) in records::entries(state, &self.ids).unwrap_or_default() {
                for location in entry.locations.iter().flatten() {
                    blocks[location.device] += u64::from(location.valid.count_ones());
                }
            }
        });
        blocks
    }

    /// Chunks with two locations.
    pub fn partial_chunks(&self) -> u64 {
        self.store.read(|state| {
            records::entries(state, &self.ids)
                .unwrap_or_default()
                .iter()
                .filter(|(_, e)| e.locations[1].is_some())
                .count() as u64
        })
    }

    /// Each child's smoothed response time and deviation, in microseconds.
    pub fn response_times(&self) -> Vec<Ewma> {
        self.policy_state()
            .map(|p| p.stats.clone())
            .unwrap_or_default()
    }

    /// Makes every transaction so far durable (flushing every child first), then lets the
    /// slots they freed be reused.
    pub(crate) async fn commit(&self) -> Result<()> {
        self.store.commit().await?;
        self.reclaim()
    }

    /// Releases the frees whose transaction is durable.
    pub(crate) fn reclaim(&self) -> Result<()> {
        let durable = self.store.durable_txn();
        let mut space = self.space()?;
        let pending = std::mem::take(&mut space.pending);
        for (after, device, slot) in pending {
            if after < durable {
                let fresh = space.free[device].insert(slot);
                assert!(fresh, "slot {slot} of child {device} freed twice");
            } else {
                space.pending.push((after, device, slot));
            }
        }
        Ok(())
    }

    /// Frees `locations`' slots once the transaction just applied is durable.
    pub(crate) fn free_after(&self, space: &mut Space, locations: &[Location]) {
        let txn = self.store.next_txn() - 1;
        if self.settings.unsafe_reuse_before_durable {
            for location in locations {
                space.free[location.device].insert(location.slot);
            }
            return;
        }
        for location in locations {
            space.pending.push((txn, location.device, location.slot));
        }
    }

    /// The version of `chunk`'s stripe (read under its lock, shared or alone).
    pub(crate) fn version(&self, chunk: u64) -> u64 {
        self.versions[self.locks.slot_of(chunk)].load(Ordering::Acquire)
    }

    /// Marks `chunk` changed: call holding it alone.
    pub(crate) fn changed(&self, chunk: u64) {
        self.versions[self.locks.slot_of(chunk)].fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn now(&self) -> Duration {
        self.settings.runtime.now()
    }

    pub(crate) fn bump(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The shape must fit the children it is opened on: as many as formatted, none smaller.
fn check_fits(name: &str, shape: &Shape, children: &[DeviceRef]) -> Result<()> {
    if children.len() != shape.devices() {
        return Err(BlockError::InvalidArgument(format!(
            "migrate {name}: formatted over {} children, opened over {}; a child is missing \
             or was added (children cannot change)",
            shape.devices(),
            children.len()
        )));
    }
    for (i, child) in children.iter().enumerate() {
        let needed = shape.used_bytes(i);
        if child.geometry().size < needed {
            return Err(BlockError::InvalidArgument(format!(
                "migrate {name}: child {i} has {} bytes; the layer was formatted with {needed} \
                 of it (a wrong or shrunk device?)",
                child.geometry().size
            )));
        }
    }
    Ok(())
}

fn store_options(name: &str, children: &[DeviceRef], settings: &Settings) -> StoreOptions {
    let mut options = StoreOptions::new(&format!("{name} metadata"));
    // Every commit flushes every child first: a map entry that points at migrated or newly
    // written data never becomes durable before the data.
    options.data_devices = children.to_vec();
    options.unsafe_skip_data_barrier = settings.unsafe_skip_data_barrier;
    options
}

/// The free slots of a state, and its records checked on the way.
fn rebuild_space(
    state: &strata_meta::State,
    ids: &Ids,
    shape: &Shape,
) -> std::result::Result<Space, String> {
    let problems = records::check_state(state);
    if let Some(first) = problems.first() {
        return Err(format!(
            "the map is inconsistent ({} problems; first: {first})",
            problems.len()
        ));
    }
    let mut free: Vec<BTreeSet<u64>> = shape.slots.iter().map(|&n| (0..n).collect()).collect();
    let all = records::entries(state, ids)?;
    for (_, entry) in &all {
        for location in entry.locations.iter().flatten() {
            free[location.device].remove(&location.slot);
        }
    }
    Ok(Space {
        free,
        pending: Vec::new(),
        allocated: all.len() as u64,
    })
}
