//! The stage itself: its children, its metadata store, its in-memory free space; format and
//! open. The data path is in `io`, the destage in `destage`, status in `status`.
//!
//! Lock rules:
//! - `locks` (striped, by logical block): a read holds its blocks shared from the map lookup
//!   until its child reads complete; a write holds them alone from before it looks at the
//!   map until its transaction is applied. A destage takes them all, alone, only for the
//!   in-memory switch. So a slot or block is never freed (let alone reused) under a read.
//! - `space` (std mutex): in-memory only, never across an await. Taken before the store's
//!   own lock when both are needed (a first base is chosen and recorded together).
//! - `destaging` (async mutex): one destage at a time; writes that find the log full wait
//!   on it, in turn, and take their slots under it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use strata_core::{Background, BlockError, DeviceRef, Result, Runtime, StripedLocks};
use strata_meta::{FormatOptions, MetaStore, Recovered, StoreOptions, TxnClass};

use crate::alloc::Allocator;
use crate::config::StageConfig;
use crate::log::LogSlots;
use crate::map::{decode_base, decode_moved, Location};
use crate::records::{self, decode_shape, encode_shape, u64_at, Ids, OWNER};
use crate::shape::{Shape, BLOCK};
use crate::status::Counters;
use crate::trigger::Trigger;

/// Lock stripes over logical blocks.
const LOCK_STRIPES: usize = 1024;

/// The fewest log slots a stage formats with.
pub const MIN_LOG_SLOTS: u64 = 16;

/// How a stage runs its destages.
#[derive(Clone)]
pub struct Settings {
    pub runtime: Arc<dyn Runtime>,
    pub threshold: u64,
    pub trigger: Trigger,
    pub window: u64,
    /// Requests of a destage batch in flight at once (`None`: the whole batch).
    pub destage_depth: Option<usize>,
    /// Destage from a background task (served stages) or inline in the write that crossed
    /// the trigger (tests: deterministic, and a power cut lands inside the destage's steps).
    pub background: bool,
    /// Test-only: skip the metadata's data barrier (the ordering bug the crash suite must
    /// catch).
    #[doc(hidden)]
    pub unsafe_skip_data_barrier: bool,
}

impl Settings {
    pub fn from_config(config: &StageConfig, runtime: Arc<dyn Runtime>) -> Settings {
        Settings {
            runtime,
            threshold: config.threshold.0,
            trigger: config.trigger(),
            window: config.window,
            destage_depth: config.destage_depth.map(|d| d as usize),
            background: false,
            unsafe_skip_data_barrier: false,
        }
    }
}

/// Free space on both children, in memory.
pub(crate) struct Space {
    pub alloc: Allocator,
    pub log: LogSlots,
    /// Live staged blocks per logical extent (the triggers' input), kept with the map.
    pub staged: BTreeMap<u64, u64>,
}

impl Space {
    pub(crate) fn note_staged(&mut self, extent: u64, delta: i64) {
        let count = self.staged.entry(extent).or_insert(0);
        *count = count
            .checked_add_signed(delta)
            .expect("staged counts follow the reverse table");
        if *count == 0 {
            self.staged.remove(&extent);
        }
    }

    /// Live staged blocks in all.
    pub(crate) fn staged_blocks(&self) -> u64 {
        self.staged.values().sum()
    }
}

pub struct Stage {
    pub(crate) name: String,
    pub(crate) fast: DeviceRef,
    pub(crate) slow: DeviceRef,
    pub(crate) store: Arc<MetaStore>,
    pub(crate) ids: Ids,
    pub(crate) shape: Shape,
    pub(crate) settings: Settings,
    pub(crate) space: Mutex<Space>,
    pub(crate) locks: StripedLocks,
    pub(crate) destaging: tokio::sync::Mutex<()>,
    /// Writers waiting for room in the log; while any wait, new writers queue behind them.
    pub(crate) room_waiters: AtomicU64,
    /// Notified when a staged write ends (its slots become destageable or free).
    pub(crate) room: tokio::sync::Notify,
    pub(crate) counters: Counters,
    /// Why the fast child was last seen failing (a log read or write, a metadata commit).
    pub(crate) fast_failure: Mutex<Option<String>>,
    pub(crate) kick: Arc<tokio::sync::Notify>,
    pub(crate) background: Background,
    pub(crate) destage_running: AtomicBool,
    /// A watermark drain is on (`Trigger::draining`): set at `high`, cleared at `low`.
    pub(crate) draining: AtomicBool,
    config: OnceLock<toml::Table>,
}

fn corrupt(name: &str, problem: impl std::fmt::Display) -> BlockError {
    BlockError::Corrupt(format!(
        "stage {name}: {problem}; run `strata check` on its fast child"
    ))
}

impl Stage {
    /// The shape a format gives these children under `config`.
    /// Both children must take single 4 KiB requests (every map and the log are in blocks).
    fn check_children(fast: &DeviceRef, slow: &DeviceRef) -> Result<()> {
        for (which, child) in [("fast", fast), ("slow", slow)] {
            let min_io = u64::from(child.geometry().min_io.max(1));
            if !BLOCK.is_multiple_of(min_io) {
                return Err(BlockError::InvalidArgument(format!(
                    "the {which} child takes requests in units of {min_io} bytes; a stage needs \
                     4 KiB requests"
                )));
            }
        }
        Ok(())
    }

    pub fn shape_for(config: &StageConfig, fast_size: u64, slow_size: u64) -> Result<Shape> {
        let invalid = BlockError::InvalidArgument;
        config.check().map_err(invalid)?;
        let log_offset = config.metadata_bytes(fast_size, slow_size);
        let log_slots = fast_size.saturating_sub(log_offset) / BLOCK;
        let shape = Shape {
            range_blocks: config.range.0 / BLOCK,
            extent_ranges: config.extent.0 / config.range.0,
            ranges: slow_size / config.range.0,
            log_offset,
            log_slots,
        };
        let staged_max = config.threshold.0 / BLOCK;
        if log_slots < MIN_LOG_SLOTS.max(2 * staged_max) {
            return Err(invalid(format!(
                "the fast child ({fast_size} bytes) leaves {log_slots} log slots after \
                 {log_offset} bytes of metadata; a log needs at least {} (twice the largest \
                 staged write, `threshold`)",
                MIN_LOG_SLOTS.max(2 * staged_max)
            )));
        }
        if shape.ranges == 0 {
            return Err(invalid(format!(
                "the slow child ({slow_size} bytes) is smaller than one range ({})",
                config.range.0
            )));
        }
        Ok(shape)
    }

    /// Formats a new, empty stage over `fast` (metadata and log) and `slow`.
    pub async fn format(
        name: &str,
        fast: DeviceRef,
        slow: DeviceRef,
        config: &StageConfig,
        settings: Settings,
    ) -> Result<Arc<Stage>> {
        Self::check_children(&fast, &slow)?;
        let shape = Self::shape_for(config, fast.geometry().size, slow.geometry().size)?;
        let store = MetaStore::format(
            fast.clone(),
            0,
            shape.log_offset,
            FormatOptions::new(OWNER).random_from(settings.runtime.as_ref()),
            store_options(name, &slow, &settings),
        )
        .await?;
        store.transact(TxnClass::Normal, |_, txn| {
            let stage = txn.create_blob(records::STAGE);
            txn.put_blob(stage, encode_shape(&shape));
            txn.create_table(records::RANGES, 8);
            txn.create_bitmap(records::HOME);
            txn.create_table(records::MOVED, 8);
            txn.create_table(records::REVERSE, 8);
            txn.create_bitmap(records::ALLOCATED);
            Ok(())
        })?;
        store.commit().await?;
        tracing::info!(
            stage = name,
            size = shape.size(),
            log_slots = shape.log_slots,
            metadata_bytes = shape.log_offset,
            "stage formatted"
        );
        Self::assemble(name, fast, slow, store, settings)
    }

    /// Opens the stage on its children, recovering its metadata.
    pub async fn open(
        name: &str,
        fast: DeviceRef,
        slow: DeviceRef,
        settings: Settings,
    ) -> Result<Arc<Stage>> {
        let recovered = strata_meta::recover(fast.as_ref(), 0).await?;
        Self::open_recovered(name, fast, slow, recovered, settings).await
    }

    pub(crate) async fn open_recovered(
        name: &str,
        fast: DeviceRef,
        slow: DeviceRef,
        recovered: Recovered,
        settings: Settings,
    ) -> Result<Arc<Stage>> {
        // Before the open's checkpoint writes anything: another layer's store is not ours.
        if recovered.superblock.owner != OWNER {
            return Err(BlockError::InvalidArgument(format!(
                "stage {name}: the fast child's metadata belongs to a {:?}, not a stage",
                recovered.superblock.owner
            )));
        }
        let options = store_options(name, &slow, &settings);
        let (store, _) = MetaStore::open_recovered(fast.clone(), recovered, options).await?;
        Self::assemble(name, fast, slow, store, settings)
    }

    fn assemble(
        name: &str,
        fast: DeviceRef,
        slow: DeviceRef,
        store: Arc<MetaStore>,
        settings: Settings,
    ) -> Result<Arc<Stage>> {
        Self::check_children(&fast, &slow)?;
        let (ids, shape) = store
            .read(|state| -> std::result::Result<_, String> {
                let ids = Ids::find(state)?;
                let shape = decode_shape(state.blob(ids.stage).unwrap_or(&[]))?;
                Ok((ids, shape))
            })
            .map_err(|problem| corrupt(name, problem))?;
        let fast_end = shape.log_offset + shape.log_slots * BLOCK;
        if fast_end > fast.geometry().size || shape.size() > slow.geometry().size {
            return Err(corrupt(
                name,
                format!(
                    "the format record needs {fast_end} bytes of fast child and {} of slow \
                     child; they have {} and {}",
                    shape.size(),
                    fast.geometry().size,
                    slow.geometry().size
                ),
            ));
        }
        let space = store
            .read(|state| rebuild_space(state, &ids, &shape))
            .map_err(|problem| corrupt(name, problem))?;
        let stage = Arc::new(Stage {
            name: name.to_string(),
            fast,
            slow,
            store,
            ids,
            shape,
            settings,
            space: Mutex::new(space),
            locks: StripedLocks::new(LOCK_STRIPES),
            destaging: tokio::sync::Mutex::new(()),
            room_waiters: AtomicU64::new(0),
            room: tokio::sync::Notify::new(),
            counters: Counters::default(),
            fast_failure: Mutex::new(None),
            kick: Arc::new(tokio::sync::Notify::new()),
            background: Background::new(),
            destage_running: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            config: OnceLock::new(),
        });
        if stage.settings.background {
            stage.spawn_destager();
        }
        Ok(stage)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    pub fn store(&self) -> &Arc<MetaStore> {
        &self.store
    }

    pub fn background(&self) -> &Background {
        &self.background
    }

    /// The `[[layer]]` options it was built from, defaults explicit, for `describe`.
    pub fn set_config(&self, config: toml::Table) {
        let _ = self.config.set(config);
    }

    pub(crate) fn config(&self) -> Option<&toml::Table> {
        self.config.get()
    }

    pub(crate) fn space(&self) -> Result<MutexGuard<'_, Space>> {
        strata_core::poison::check(self.space.lock(), &self.name, "free space")
    }

    /// Remembers (and logs) that the fast child failed: status shows it from now on.
    pub(crate) fn fast_failed(&self, what: &str, error: &BlockError) {
        tracing::error!(stage = %self.name, %error, "fast child failed: {what}");
        let mut failure = self
            .fast_failure
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        *failure = Some(format!("{what}: {error}"));
    }

    /// Whether the fast child (or the metadata store on it) has failed.
    pub fn fast_child_failed(&self) -> bool {
        self.fast_failure().is_some() || self.store.space().failed.is_some()
    }

    pub(crate) fn fast_failure(&self) -> Option<String> {
        self.fast_failure
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }

    /// Makes every transaction so far durable, then lets their frees be reused.
    pub(crate) async fn commit(&self) -> Result<()> {
        if let Err(error) = self.store.commit().await {
            self.fast_failed("metadata commit", &error);
            return Err(error);
        }
        self.reclaim()
    }

    /// Releases the frees whose transaction is durable.
    pub(crate) fn reclaim(&self) -> Result<()> {
        let durable = self.store.durable_txn();
        let mut space = self.space()?;
        space.alloc.reclaim(durable);
        space.log.reclaim(durable);
        Ok(())
    }

    /// Where `logical` lives now (tests and status).
    pub fn locate(&self, logical: u64) -> Location {
        self.store
            .read(|state| records::locate(state, &self.ids, &self.shape, logical))
    }

    pub(crate) fn running_destage(&self) -> bool {
        self.destage_running.load(Ordering::Relaxed)
    }
}

fn store_options(name: &str, slow: &DeviceRef, settings: &Settings) -> StoreOptions {
    let mut options = StoreOptions::new(&format!("{name} metadata"));
    // Every commit flushes the slow child first: a map entry that points at a destaged or
    // directly written block never reaches the flash before the block is on the disk. The
    // store flushes its own device (the fast child, where the log is) as well.
    options.data_devices = vec![slow.clone()];
    options.unsafe_skip_data_barrier = settings.unsafe_skip_data_barrier;
    options
}

/// The in-memory free space of a state, and its records checked on the way.
fn rebuild_space(
    state: &strata_meta::State,
    ids: &Ids,
    shape: &Shape,
) -> std::result::Result<Space, String> {
    let mut alloc = Allocator::new(shape.ranges, shape.range_blocks);
    let mut log = LogSlots::new(shape.log_slots);
    let missing = |what: &str| format!("object {what} has the wrong kind");
    let ranges = state.table(ids.ranges).ok_or_else(|| missing("ranges"))?;
    for (range, record) in ranges.iter_from(0) {
        let base = decode_base(u64::from_le_bytes(record.try_into().expect("8-byte table")))
            .expect("a present record is not zero");
        if base >= shape.ranges || range >= shape.ranges {
            return Err(format!(
                "range {range} has base {base}, past the slow child"
            ));
        }
        alloc.mark_based(base);
    }
    let allocated = state
        .bitmap(ids.allocated)
        .ok_or_else(|| missing("allocated"))?;
    let mut at = allocated.next(0, u64::MAX, true);
    while let Some(block) = at {
        if block >= shape.blocks() {
            return Err(format!("block {block} is allocated past the slow child"));
        }
        alloc.mark_live(block);
        at = allocated.next(block + 1, u64::MAX, true);
    }
    let reverse = state.table(ids.reverse).ok_or_else(|| missing("reverse"))?;
    let mut staged = BTreeMap::new();
    for (slot, _) in reverse.iter_from(0) {
        if slot >= shape.log_slots {
            return Err(format!("log slot {slot} is past the log"));
        }
        log.mark_live(slot);
        let logical = u64_at(reverse, slot) - 1;
        *staged.entry(shape.extent_of(logical)).or_insert(0) += 1;
    }
    let moved = state.table(ids.moved).ok_or_else(|| missing("moved"))?;
    for (block, _) in moved.iter_from(0) {
        decode_moved(u64_at(moved, block))?;
    }
    Ok(Space { alloc, log, staged })
}
