//! A thin pool: one child device split into a metadata region and equal extents, shared by
//! any number of volumes that map their extents on first write.
//!
//! Durability (the contract of a disk with a volatile cache): a volume's FLUSH commits the
//! pool's metadata, and every commit flushes the child's data first, so a mapping never
//! reaches the disk before the data it points to. Isolation: a newly allocated extent is
//! written before its mapping is published and its unwritten granules stay dead (reading as
//! zeros), and a freed extent is reused only after the free is durable, so no volume ever
//! reads another volume's bytes, before or after a crash.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use strata_core::{
    poison, BlockError, DeviceRef, Health, NodeStatus, Result, Runtime, StripedLocks,
};
use strata_meta::{FormatOptions, MetaStore, ObjectId, Recovered, StoreOptions, TxnClass};

use super::alloc::Allocator;
use super::chain::ChainIds;
use super::map::GRANULE;
use super::policy::{pool_start, LowWater, MapCommit, MetadataFound, PoolStart, WhenFull};
use super::records::{
    self, decode_volumes, encode_volumes, map_name, PoolIds, PoolRecord, VolumeRecord,
};
use super::reserve::ReservePolicy;
use super::runner::{VersionsPolicy, DEFAULT_POLICY_INTERVAL};
use super::snapshot::VersionIds;
use super::space::{PoolSpace, SpaceWatch, VolumeSpace};
use super::volume::{ThinVolume, ViewCell};

/// How a pool is created.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Allocation unit, a power of two from 64 KiB to 4 MiB (the paper used 512 KiB).
    pub extent_size: u64,
    /// Bytes for the metadata region; by default about 860 bytes per extent, which holds
    /// the worst case of one map page per extent twice over (two checkpoint slots).
    pub metadata_size: Option<u64>,
    /// Start allocating mid-device instead of at the first extent (the paper's variant).
    pub start_mid: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            extent_size: 512 << 10,
            metadata_size: None,
            start_mid: false,
        }
    }
}

/// Settings of an open pool.
#[derive(Clone)]
pub struct PoolRuntime {
    pub runtime: Arc<dyn Runtime>,
    /// How often metadata is committed without a FLUSH from a client (None: only on FLUSH,
    /// FUA and when space must be released; tests drive commits themselves).
    pub commit_interval: Option<Duration>,
    /// When a new mapping is committed (see [`MapCommit`]).
    pub map_commit: MapCommit,
    /// What an allocating write does when no extent is free.
    pub when_full: WhenFull,
    /// Share of the data extents allocated above which the pool reports low space.
    pub low_water: LowWater,
    /// The first write into an extent a snapshot shares copies the whole extent (dm-thin's
    /// copy-on-write) instead of writing only its own granules (Clotho's remap-on-write).
    pub copy_on_write: bool,
    /// Free space versions may not eat, and what to do when the pool is below it.
    pub snapshot_reserve: Option<ReservePolicy>,
    /// How often the versions policies are looked at (periodic snapshots, the reserve);
    /// None: never by themselves (tests drive [`ThinPool::run_policies`]).
    pub policy_interval: Option<Duration>,
    /// Test-only: plant the ordering bug (see `StoreOptions::unsafe_skip_data_barrier`).
    #[doc(hidden)]
    pub unsafe_skip_data_barrier: bool,
}

impl PoolRuntime {
    pub fn new(runtime: Arc<dyn Runtime>) -> Self {
        PoolRuntime {
            runtime,
            commit_interval: Some(DEFAULT_COMMIT_INTERVAL),
            map_commit: MapCommit::default(),
            when_full: WhenFull::default(),
            low_water: LowWater::default(),
            copy_on_write: false,
            snapshot_reserve: None,
            policy_interval: Some(DEFAULT_POLICY_INTERVAL),
            unsafe_skip_data_barrier: false,
        }
    }
}

/// The metadata region `format` gives a pool on a device of `size` bytes: the configured
/// size, or about 860 bytes per extent; rounded up to 1 MiB. Also returns the default guess.
fn metadata_bytes(size: u64, options: &PoolOptions) -> (u64, u64) {
    let guess = (size / options.extent_size.max(1) * 860).clamp(256 << 10, 4 << 30);
    let metadata = options
        .metadata_size
        .unwrap_or(guess)
        .next_multiple_of(1 << 20);
    (metadata, guess)
}

/// Lock stripes guarding (volume, virtual extent) pairs; see `volume` for who takes which.
const LOCK_STRIPES: usize = 1024;

/// How often a write waiting for space looks again without being told: frees that do not
/// signal (any path added later) are still noticed.
const FULL_POLL: Duration = Duration::from_millis(200);

pub struct ThinPool {
    pub(crate) name: String,
    pub(crate) child: DeviceRef,
    pub(crate) store: Arc<MetaStore>,
    pub(crate) ids: PoolIds,
    /// The pool's shape as formatted; `extents` there is the count at open.
    pub(crate) record: PoolRecord,
    /// Data extents now: grows when the child does (see [`ThinPool::grow`]).
    extents: AtomicU64,
    /// One growth at a time.
    growing: tokio::sync::Mutex<()>,
    allocator: Mutex<Allocator>,
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) map_commit: MapCommit,
    /// Snapshots: copy whole extents on the first write after one, not only new granules.
    pub(crate) copy_on_write: bool,
    when_full: WhenFull,
    pub(crate) space_watch: SpaceWatch,
    /// Volumes by name, with their map's object id. Handles are made on demand so that the
    /// pool does not own its volumes (they own it).
    volumes: Mutex<BTreeMap<String, (VolumeRecord, ObjectId)>>,
    /// Each volume's current size by volume id, shared with its handles so that the write
    /// path reads it without the `volumes` lock; 0 once deleted (ids are never reused, and
    /// a deleted volume's cell, 16 bytes, stays).
    sizes: Mutex<BTreeMap<u32, Arc<AtomicU64>>>,
    /// Each volume's versions as its I/O reads them, by volume id, shared with its handles
    /// (see `snapshot`).
    views: Mutex<BTreeMap<u32, Arc<ViewCell>>>,
    /// Every snapshot by (volume id, epoch): a snapshot's device reads only while its
    /// snapshot exists (checked under the extent's stripe, which a deletion's cleanup takes).
    pub(crate) snapshot_epochs: Mutex<std::collections::BTreeSet<(u32, crate::versions::Epoch)>>,
    /// The `history` table and `masked` bitmap, once the pool has versions.
    pub(crate) version_ids: std::sync::OnceLock<VersionIds>,
    pub(super) locks: StripedLocks,
    /// Held shared by every changing request of a volume for its whole length, and
    /// exclusively by a snapshot or a rollback: a request that spans extents takes their
    /// stripes one at a time, and a version must not fall between two of its pieces.
    /// Taken before any stripe.
    pub(crate) requests: tokio::sync::RwLock<()>,
    /// Spare devices the server holds to grow this pool with (`grow-from`); reported only.
    spares_left: AtomicU64,
    /// The `[[layer]]` options it was built from, defaults explicit (see
    /// [`crate::PoolConfig::explicit`]), for `describe`; unset for a pool opened directly.
    config: std::sync::OnceLock<toml::Table>,
    /// Periodic snapshots, protections and the space reserve at work (`runner`).
    pub(crate) versions_policy: VersionsPolicy,
}

/// How often a pool commits its metadata when its config does not say.
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// The extent size a pool gets when its config names none.
pub const DEFAULT_EXTENT_SIZE: u64 = 512 << 10;

/// The one rule for extent sizes (config checks, build and format all ask it): a power of
/// two from 64 KiB (smaller extents make the map outgrow its metadata region) to 4 MiB
/// (larger ones make the first write to an extent copy too much).
pub fn check_extent_size(bytes: u64) -> std::result::Result<(), String> {
    if bytes.is_power_of_two() && (64 << 10..=4 << 20).contains(&bytes) {
        Ok(())
    } else {
        Err(format!(
            "{bytes} bytes is not a power of two from 64KiB to 4MiB"
        ))
    }
}

impl ThinPool {
    /// Formats `child` as an empty pool.
    pub async fn format(
        name: &str,
        child: DeviceRef,
        options: &PoolOptions,
        settings: PoolRuntime,
    ) -> Result<Arc<ThinPool>> {
        let extent_size = options.extent_size;
        check_extent_size(extent_size)
            .map_err(|e| BlockError::InvalidArgument(format!("field `extent`: {e}")))?;
        let size = child.geometry().size;
        let (metadata, _) = metadata_bytes(size, options);
        let data_start = metadata.next_multiple_of(extent_size);
        let extents = size.saturating_sub(data_start) / extent_size;
        if extents == 0 {
            return Err(BlockError::InvalidArgument(format!(
                "a {size}-byte device leaves no room for extents after {metadata} bytes of metadata"
            )));
        }
        let store = MetaStore::format(
            child.clone(),
            0,
            metadata,
            FormatOptions::new("thin-pool").random_from(settings.runtime.as_ref()),
            store_options(name, &settings),
        )
        .await?;
        let record = PoolRecord {
            format: records::POOL_FORMAT_VERSION,
            extent_size,
            data_start,
            extents,
            next_volume: 1,
        };
        store.transact(TxnClass::Normal, |_, txn| {
            let pool = txn.create_blob(records::POOL);
            txn.put_blob(pool, record.encode());
            let volumes = txn.create_blob(records::VOLUMES);
            txn.put_blob(volumes, encode_volumes(&[]));
            txn.create_bitmap(records::ALLOCATED);
            txn.create_bitmap(records::LIVE);
            Ok(())
        })?;
        store.commit().await?;
        tracing::info!(
            pool = name,
            extents,
            extent_size,
            metadata_bytes = metadata,
            "thin pool formatted"
        );
        let head = if options.start_mid { extents / 2 } else { 0 };
        Self::assemble(name, child, store, head, settings)
    }

    /// Opens the pool on `child`, recovering its metadata.
    pub async fn open(
        name: &str,
        child: DeviceRef,
        settings: PoolRuntime,
    ) -> Result<(Arc<ThinPool>, Recovered)> {
        let recovered = strata_meta::recover(child.as_ref(), 0).await?;
        Self::open_recovered(name, child, recovered, settings).await
    }

    /// [`ThinPool::open`] from the recovery of `child`'s metadata the caller already ran.
    async fn open_recovered(
        name: &str,
        child: DeviceRef,
        recovered: Recovered,
        settings: PoolRuntime,
    ) -> Result<(Arc<ThinPool>, Recovered)> {
        // Before the open's checkpoint writes anything: another layer's store is not ours.
        if recovered.superblock.owner != "thin-pool" {
            return Err(BlockError::InvalidArgument(format!(
                "{name}: the metadata belongs to a {:?}, not a thin pool",
                recovered.superblock.owner
            )));
        }
        let (store, recovered) =
            MetaStore::open_recovered(child.clone(), recovered, store_options(name, &settings))
                .await?;
        // Log order continues after the highest allocated extent.
        let head = store.read(|state| {
            let ids = PoolIds::find(state).ok()?;
            let allocated = state.bitmap(ids.allocated)?;
            let mut last = None;
            let mut at = allocated.next(0, u64::MAX, true);
            while let Some(extent) = at {
                last = Some(extent);
                at = allocated.next(extent + 1, u64::MAX, true);
            }
            Some(last.map_or(0, |l| l + 1))
        });
        let pool = Self::assemble(name, child, store, head.unwrap_or(0), settings)?;
        // The child may have grown while the pool was closed.
        pool.grow().await?;
        Ok((pool, recovered))
    }

    /// Opens the pool on `child` if it has one; formats it only if `start.may_format` and
    /// the whole metadata region reads as zeros (`policy::pool_start`). Damaged metadata is
    /// refused with an error naming the damage, whatever the policy. Nothing is written
    /// before that decision.
    pub async fn open_or_format(
        name: &str,
        child: DeviceRef,
        options: &PoolOptions,
        settings: PoolRuntime,
        start: strata_core::layer::StartPolicy,
    ) -> Result<Arc<ThinPool>> {
        let mut recovered = None;
        let found = match strata_meta::recover(child.as_ref(), 0).await {
            Ok(found) => {
                recovered = Some(found);
                MetadataFound::Valid
            }
            Err(strata_meta::RecoveryError::Io(error)) => return Err(error),
            Err(strata_meta::RecoveryError::NoSuperblock { a, b }) => {
                // At least the region a format would use now, configured or guessed, whichever
                // is larger: a pool formatted on a smaller device, or with the other setting,
                // had a region this covers. Reading past a region only ever refuses more.
                let (metadata, guess) = metadata_bytes(child.geometry().size, options);
                let scan = metadata.max(guess.next_multiple_of(1 << 20));
                if strata_core::blank::region_is_zero(child.as_ref(), 0, scan).await? {
                    MetadataFound::Blank
                } else {
                    MetadataFound::Damaged(format!(
                        "no valid superblock (copy A: {a}; copy B: {b}) but the metadata region \
                         is not blank"
                    ))
                }
            }
            Err(damage) => MetadataFound::Damaged(damage.to_string()),
        };
        match pool_start(&found, start.may_format) {
            PoolStart::Open => {
                let recovered = recovered.expect("Valid comes with a recovery");
                Ok(Self::open_recovered(name, child, recovered, settings)
                    .await?
                    .0)
            }
            PoolStart::Format => Self::format(name, child, options, settings).await,
            PoolStart::Refuse(why) => Err(BlockError::InvalidArgument(format!(
                "thin pool {name}: {why}"
            ))),
        }
    }

    fn assemble(
        name: &str,
        child: DeviceRef,
        store: Arc<MetaStore>,
        head: u64,
        settings: PoolRuntime,
    ) -> Result<Arc<ThinPool>> {
        let corrupt = |problem: String| BlockError::Corrupt(format!("thin pool {name}: {problem}"));
        let (ids, record, volume_records) = store
            .read(|state| -> std::result::Result<_, String> {
                let ids = PoolIds::find(state)?;
                let record = PoolRecord::decode(state.blob(ids.pool).unwrap_or(&[]))?;
                let volumes = decode_volumes(state.blob(ids.volumes).unwrap_or(&[]))?;
                Ok((ids, record, volumes))
            })
            .map_err(corrupt)?;
        let end = record.data_start + record.extents * record.extent_size;
        if end > child.geometry().size {
            return Err(corrupt(format!("extents end at {end}, past the device")));
        }
        if let Some(interval) = settings.commit_interval {
            store.spawn_committer(settings.runtime.clone(), interval);
        }
        let pool = Arc::new(ThinPool {
            name: name.to_string(),
            child,
            store,
            ids,
            record,
            extents: AtomicU64::new(record.extents),
            growing: tokio::sync::Mutex::new(()),
            allocator: Mutex::new(Allocator::new(record.extents, head.min(record.extents))),
            runtime: settings.runtime.clone(),
            map_commit: settings.map_commit,
            copy_on_write: settings.copy_on_write,
            when_full: settings.when_full,
            space_watch: SpaceWatch::new(settings.low_water),
            volumes: Mutex::new(BTreeMap::new()),
            sizes: Mutex::new(BTreeMap::new()),
            views: Mutex::new(BTreeMap::new()),
            snapshot_epochs: Mutex::new(Default::default()),
            version_ids: std::sync::OnceLock::new(),
            locks: StripedLocks::new(LOCK_STRIPES),
            requests: tokio::sync::RwLock::new(()),
            spares_left: AtomicU64::new(0),
            config: std::sync::OnceLock::new(),
            versions_policy: VersionsPolicy::new(settings.snapshot_reserve),
        });
        for volume in volume_records {
            pool.attach(volume)?;
        }
        pool.load_versions()?;
        pool.watch_low_water();
        if let Some(interval) = settings.policy_interval {
            pool.spawn_policy_runner(settings.runtime.clone(), interval);
        }
        Ok(pool)
    }

    pub(crate) fn attach(self: &Arc<Self>, record: VolumeRecord) -> Result<Arc<ThinVolume>> {
        let map = self
            .store
            .read(|state| state.id(&map_name(record.id)))
            .ok_or_else(|| {
                BlockError::InvalidArgument(format!("volume {} has no map", record.name))
            })?;
        self.sizes_lock()
            .insert(record.id, Arc::new(AtomicU64::new(record.size)));
        let volume = Arc::new(ThinVolume::new(self.clone(), record.clone(), map));
        self.volumes_lock()
            .insert(record.name.clone(), (record, map));
        Ok(volume)
    }

    /// The size cell of a volume, shared by all its handles. A volume unknown here was
    /// deleted (cells are made when a volume is attached and never dropped, so a handle
    /// made from a record read just before a delete still sees 0).
    pub(super) fn size_cell(&self, record: &VolumeRecord) -> Arc<AtomicU64> {
        self.sizes_lock()
            .get(&record.id)
            .cloned()
            .unwrap_or_else(|| Arc::new(AtomicU64::new(0)))
    }

    /// The view cell of a volume, shared by all its handles (made on first use).
    pub(super) fn view_cell(&self, id: u32) -> Arc<ViewCell> {
        self.views
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .entry(id)
            .or_default()
            .clone()
    }

    /// Appends a piece's bytes, read from where `sources` (runs of its granules) say.
    pub(crate) async fn read_sources(
        &self,
        piece: &crate::map::Piece,
        sources: &[(std::ops::Range<u64>, crate::chain::Source)],
        out: &mut bytes::BytesMut,
    ) -> Result<()> {
        for (granules, source) in sources {
            let start = (granules.start * GRANULE).max(piece.within);
            let end = (granules.end * GRANULE).min(piece.within + piece.len);
            match *source {
                crate::chain::Source::Data(phys) => {
                    let offset = self.extent_offset(phys) + start;
                    let data = self.child.read(offset, (end - start) as usize).await?;
                    out.extend_from_slice(&data);
                }
                crate::chain::Source::Zero => out.resize(out.len() + (end - start) as usize, 0),
            }
        }
        Ok(())
    }

    /// The geometry of a device of `size` bytes made from this pool (a volume, a snapshot).
    pub(crate) fn device_geometry(&self, size: u64) -> strata_core::Geometry {
        let child = self.child.geometry();
        strata_core::Geometry {
            size,
            min_io: child.min_io.max(512),
            logical_block: 512,
            physical_block: 4096,
            preferred_io: GRANULE as u32,
            max_io: child.max_io.min(32 << 20),
        }
    }

    /// What a walk down the chains needs.
    pub(crate) fn chain_ids(&self) -> ChainIds {
        let versions = self.version_ids.get();
        ChainIds {
            live: self.ids.live,
            history: versions.map(|v| v.history),
            masked: versions.map(|v| v.masked),
            granules_per_extent: self.record.granules_per_extent(),
        }
    }

    /// Sets a volume's size as its handles see it (0: deleted).
    pub(super) fn set_live_size(&self, id: u32, size: u64) {
        if let Some(cell) = self.sizes_lock().get(&id) {
            cell.store(size, Ordering::Release);
        }
    }

    // The size cells and the volume table are changed by one map operation at a time
    // (insert, remove, one field's assignment), which a panic cannot leave half done, so a
    // poisoned lock's table is sound and is read through. The allocator is not: see
    // [`ThinPool::allocator`].
    fn sizes_lock(&self) -> MutexGuard<'_, BTreeMap<u32, Arc<AtomicU64>>> {
        self.sizes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    pub(super) fn volumes_lock(
        &self,
    ) -> MutexGuard<'_, BTreeMap<String, (VolumeRecord, ObjectId)>> {
        self.volumes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The extent allocator, or a failure of the pool if a panic poisoned it: one of its
    /// changes updates several fields (the head, the reservations, the quarantine), and one
    /// left half done could hand out an extent twice (`strata_core::poison`).
    pub(crate) fn allocator(&self) -> Result<MutexGuard<'_, Allocator>> {
        poison::check(self.allocator.lock(), &self.name, "the extent allocator")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn extent_size(&self) -> u64 {
        self.record.extent_size
    }

    pub fn extents(&self) -> u64 {
        self.extents.load(Ordering::Acquire)
    }

    /// Takes in the extents the child gained since the pool was made or last grown (a
    /// concat given a member, a slice grown online): Virtual Allocation's storage expansion.
    /// The larger extent count is durable before any new extent is handed out, so no
    /// mapping past the recorded end ever reaches the disk. Checked at open, when an
    /// allocation finds nothing free and when the pool is described. Returns the extents
    /// added. The metadata region keeps its size: a pool grown far past the default sizing
    /// (about 860 bytes per extent) may run low on metadata first (`metadata low`).
    pub async fn grow(&self) -> Result<u64> {
        let fits = |pool: &ThinPool| {
            let size = pool.child.geometry().size;
            // A map entry holds physical extent + 1 in a u32.
            (size.saturating_sub(pool.record.data_start) / pool.record.extent_size)
                .min(u32::MAX as u64 - 1)
        };
        if fits(self) <= self.extents() {
            return Ok(0);
        }
        let _one = self.growing.lock().await;
        let (before, after) = (self.extents(), fits(self));
        if after <= before {
            return Ok(0);
        }
        let ids = self.ids;
        self.store.transact(TxnClass::Normal, |state, txn| {
            let mut record = PoolRecord::decode(state.blob(ids.pool).unwrap_or(&[]))
                .map_err(BlockError::InvalidArgument)?;
            record.extents = after;
            txn.put_blob(ids.pool, record.encode());
            Ok(())
        })?;
        self.store.commit().await?;
        self.allocator()?.grow(after);
        self.extents.store(after, Ordering::Release);
        tracing::info!(pool = %self.name, from = before, to = after, "thin pool grew with its device");
        self.watch_low_water();
        self.space_watch.freed.notify_waiters();
        Ok(after - before)
    }

    /// Records how many spare devices are set aside to grow this pool (the server appends
    /// them to the pool's device; the pool only reports the count).
    pub fn set_spares_left(&self, spares: u64) {
        self.spares_left.store(spares, Ordering::Release);
    }

    pub fn store(&self) -> &Arc<MetaStore> {
        &self.store
    }

    /// The pool's background work (its metadata committer): online changes quiesce it,
    /// shutdown stops it before the final flush.
    pub fn background(&self) -> &strata_core::Background {
        self.store.background()
    }

    /// Creates a volume of `size` bytes (a multiple of 512); it exists durably on return.
    pub async fn create_volume(self: &Arc<Self>, name: &str, size: u64) -> Result<Arc<ThinVolume>> {
        // `/` parts a pool from its volume and `@` a volume from its snapshot in names.
        if name.is_empty() || name.len() > 64 || name.contains(['/', '@']) {
            return Err(BlockError::InvalidArgument(format!("volume name {name:?}")));
        }
        if size == 0 || !size.is_multiple_of(512) {
            return Err(BlockError::InvalidArgument(format!(
                "volume size {size} is not a positive multiple of 512"
            )));
        }
        let record = self.store.transact(TxnClass::Normal, |state, txn| {
            self.stage_volume(state, txn, name, size)
        })?;
        self.store.commit().await?;
        tracing::info!(pool = %self.name, volume = name, size, "thin volume created");
        self.attach(record)
    }

    /// Stages a new volume (its record, the next id, an empty map) in `txn`; refused if the
    /// name is taken.
    pub(crate) fn stage_volume(
        &self,
        state: &strata_meta::State,
        txn: &mut strata_meta::Txn,
        name: &str,
        size: u64,
    ) -> Result<VolumeRecord> {
        let ids = self.ids;
        let mut volumes = decode_volumes(state.blob(ids.volumes).unwrap_or(&[]))
            .map_err(BlockError::InvalidArgument)?;
        if volumes.iter().any(|v| v.name == name) {
            return Err(BlockError::InvalidArgument(format!("volume {name} exists")));
        }
        let mut pool = PoolRecord::decode(state.blob(ids.pool).unwrap_or(&[]))
            .map_err(BlockError::InvalidArgument)?;
        let record = VolumeRecord {
            id: pool.next_volume,
            size,
            name: name.to_string(),
        };
        pool.next_volume += 1;
        volumes.push(record.clone());
        txn.put_blob(ids.pool, pool.encode());
        txn.put_blob(ids.volumes, encode_volumes(&volumes));
        txn.create_table(&map_name(record.id), 4);
        Ok(record)
    }

    /// A handle on the named volume. Handles share all state through the pool.
    pub fn volume(self: &Arc<Self>, name: &str) -> Option<Arc<ThinVolume>> {
        self.open_volume(name).map(Arc::new)
    }

    /// Like [`ThinPool::volume`], unwrapped, for callers that wrap it themselves.
    pub fn open_volume(self: &Arc<Self>, name: &str) -> Option<ThinVolume> {
        let (record, map) = self.volumes_lock().get(name).cloned()?;
        Some(ThinVolume::new(self.clone(), record, map))
    }

    pub fn volume_names(&self) -> Vec<String> {
        self.volumes_lock().keys().cloned().collect()
    }

    /// The extent locks: I/O to a virtual extent shares its stripe, a mapping change or a
    /// reclaim holds it exclusive; key with [`lock_key`].
    pub(crate) fn extent_locks(&self) -> &StripedLocks {
        &self.locks
    }

    /// Byte offset of a physical extent on the child.
    pub(crate) fn extent_offset(&self, phys: u64) -> u64 {
        debug_assert!(phys < self.extents());
        self.record.data_start + phys * self.record.extent_size
    }

    /// First live-bitmap bit of a physical extent.
    pub(crate) fn first_granule(&self, phys: u64) -> u64 {
        phys * (self.record.extent_size / GRANULE)
    }

    /// Reserves a free extent for a first write. When none is free, `when-full` decides:
    /// fail at once, or wait for a free (signalled by discard and zeroing, and polled, so
    /// any free is seen) up to the bound. Callers hold no lock stripe while this waits, or a
    /// discard or delete that would free space could not get in.
    pub(crate) async fn reserve_extent(&self) -> Result<u64> {
        let deadline = match self.when_full {
            WhenFull::Fail => None,
            WhenFull::Wait(bound) => Some(self.runtime.now() + bound),
        };
        let mut waiting = None;
        loop {
            // Registered before looking, so a free between the look and the wait is not lost.
            let freed = self.space_watch.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if let Some(extent) = self.try_reserve_extent().await? {
                self.space_watch.allocated();
                return Ok(extent);
            }
            let now = self.runtime.now();
            let Some(deadline) = deadline.filter(|deadline| now < *deadline) else {
                if self.space_watch.refused() {
                    tracing::warn!(pool = %self.name, policy = %self.when_full.describe(), "thin pool is out of data space; allocating writes fail with ENOSPC");
                }
                return Err(BlockError::NoSpace);
            };
            if waiting.is_none() {
                tracing::info!(pool = %self.name, "thin pool is full; an allocating write waits for space");
                waiting = Some(self.space_watch.waiting());
            }
            let nap = self.runtime.sleep((deadline - now).min(FULL_POLL));
            futures_util::future::select(freed, nap).await;
        }
    }

    /// A free extent, reserved, if there is one; commits once to release quarantined extents
    /// if nothing else is free.
    async fn try_reserve_extent(&self) -> Result<Option<u64>> {
        for attempt in 0..2 {
            let durable = self.store.durable_txn();
            let picked = self.store.read(|state| -> Result<Option<u64>> {
                let allocated = state.bitmap(self.ids.allocated).expect("pool bitmap");
                Ok(self.allocator()?.allocate(allocated, durable))
            })?;
            if picked.is_some() {
                return Ok(picked);
            }
            if attempt == 0 && self.allocator()?.quarantined() > 0 {
                self.store.commit().await?;
            } else if attempt == 0 && self.grow().await? > 0 {
                continue;
            }
        }
        Ok(None)
    }

    /// Gives back an extent reserved for a write that did not need it after all.
    pub(crate) fn release_reservation(&self, extent: u64) -> Result<()> {
        self.allocator()?.settle(extent);
        self.space_watch.freed.notify_waiters();
        Ok(())
    }

    /// Whether allocation is above the low-water mark now (judged as allocation does; a
    /// crossing is logged once). Cheap: two counters, no walk over the maps.
    pub fn above_low_water(&self) -> bool {
        self.watch_low_water()
    }

    /// Judges the low-water mark against the extents allocated now (logs a crossing).
    pub(crate) fn watch_low_water(&self) -> bool {
        self.watch_reserve();
        self.space_watch
            .observe(&self.name, self.extents(), || self.allocated_extents())
    }

    /// Makes every acknowledged write of every volume durable.
    pub async fn flush(&self) -> Result<()> {
        if self.store.uncommitted() > 0 {
            self.store.commit().await?;
        }
        // Overwrites of mapped extents change no metadata; they need the child flushed too,
        // and a concurrent commit may have flushed before they completed.
        self.child.flush().await
    }

    /// Extents mapped by any volume.
    pub fn allocated_extents(&self) -> u64 {
        self.store.read(|state| {
            state
                .bitmap(self.ids.allocated)
                .map_or(0, |b| b.count_ones())
        })
    }

    /// One volume's extents, live granules and partly dead extents. Reads the map a chunk
    /// at a time, so counting a large pool never holds writers up for long.
    fn volume_space(&self, name: &str, map: ObjectId) -> VolumeSpace {
        const CHUNK: usize = 4096;
        let per_extent = self.record.granules_per_extent();
        let mut space = VolumeSpace {
            name: name.to_string(),
            ..VolumeSpace::default()
        };
        let mut from = 0;
        loop {
            let last = self.store.read(|state| {
                // A volume deleted meanwhile has no map: it holds nothing.
                let table = state.table(map)?;
                let live = state.bitmap(self.ids.live).expect("pool live bitmap");
                let mut last = None;
                for (index, value) in table.iter_from(from).take(CHUNK) {
                    let phys = u32::from_le_bytes(value.try_into().expect("4-byte map")) as u64;
                    let granules = live.count_range(self.first_granule(phys - 1), per_extent);
                    space.extents_allocated += 1;
                    space.granules_live += granules;
                    space.extents_partly_dead += (granules < per_extent) as u64;
                    last = Some(index);
                }
                last
            });
            match last {
                Some(index) => from = index + 1,
                None => return space,
            }
        }
    }

    /// The pool's space: what is allocated and live, per pool and per volume, the low-water
    /// state (judged afresh) and the space events since the pool was opened.
    pub fn space(&self) -> PoolSpace {
        let volumes: Vec<(VolumeRecord, ObjectId)> =
            self.volumes_lock().values().cloned().collect();
        let volumes: Vec<VolumeSpace> = volumes
            .iter()
            .map(|(record, map)| self.volume_space(&record.name, *map))
            .collect();
        let (extents_allocated, granules_live) = self.store.read(|state| {
            let count = |id| state.bitmap(id).map_or(0, |b| b.count_ones());
            (count(self.ids.allocated), count(self.ids.live))
        });
        let mut space = PoolSpace {
            extents: self.extents(),
            extent_size: self.record.extent_size,
            extents_allocated,
            granules_live,
            extents_partly_dead: volumes.iter().map(|v| v.extents_partly_dead).sum(),
            low_space: self.watch_low_water(),
            spares_left: self.spares_left.load(Ordering::Acquire),
            volumes,
            ..PoolSpace::default()
        };
        self.space_watch.fill(&mut space);
        space
    }

    pub(crate) fn volume_status(&self, record: &VolumeRecord, map: ObjectId) -> NodeStatus {
        self.volume_node(record, &self.volume_space(&record.name, map))
    }

    fn volume_node(&self, record: &VolumeRecord, space: &VolumeSpace) -> NodeStatus {
        let mut node = self.volume_space_node(record, space);
        node.detail.extend(self.volume_policy_detail(&record.name));
        node
    }

    fn volume_space_node(&self, record: &VolumeRecord, space: &VolumeSpace) -> NodeStatus {
        NodeStatus {
            name: record.name.clone(),
            kind: "thin".into(),
            size: record.size,
            health: Health::Ok,
            detail: vec![
                ("pool".into(), self.name.clone()),
                ("extents mapped".into(), space.extents_allocated.to_string()),
                (
                    "bytes mapped".into(),
                    (space.extents_allocated * self.record.extent_size).to_string(),
                ),
                ("granules live".into(), space.granules_live.to_string()),
                (
                    "bytes live".into(),
                    (space.granules_live * GRANULE).to_string(),
                ),
                (
                    "extents partly dead".into(),
                    space.extents_partly_dead.to_string(),
                ),
            ],
            stats: None,
            children: Vec::new(),
            activity: None,
            config: None,
        }
    }

    pub async fn describe(&self) -> Result<NodeStatus> {
        if let Err(error) = self.grow().await {
            // Status still answers; the next allocation tries again.
            tracing::warn!(pool = %self.name, %error, "thin pool could not take in its grown device");
        }
        let meta = self.store.space();
        let space = self.space();
        let child = strata_core::describe(self.child.as_ref()).await?;
        let health = if meta.failed.is_some() {
            Health::Failed
        } else if meta.low_space || space.low_space {
            Health::Degraded
        } else {
            Health::Ok
        };
        let mut children = vec![child];
        let volumes: Vec<VolumeRecord> = self
            .volumes_lock()
            .values()
            .map(|(record, _)| record.clone())
            .collect();
        for record in volumes {
            if let Some(counts) = space.volumes.iter().find(|v| v.name == record.name) {
                children.push(self.volume_node(&record, counts));
            }
        }
        let percent = |n: u64, of: u64| format!("{:.1} %", n as f64 * 100.0 / of.max(1) as f64);
        let count = |key: &str, n: u64| (key.to_string(), n.to_string());
        let mut node = NodeStatus {
            name: self.name.clone(),
            kind: "thin-pool".into(),
            size: self.extents() * self.record.extent_size,
            health,
            detail: vec![
                ("extent size".into(), self.record.extent_size.to_string()),
                (
                    "extents allocated".into(),
                    format!("{} of {}", space.extents_allocated, space.extents),
                ),
                (
                    "data used".into(),
                    percent(space.extents_allocated, space.extents),
                ),
                (
                    "low water".into(),
                    format!(
                        "{} % ({} extents)",
                        self.space_watch.low_water().percent(),
                        space.low_water_extents
                    ),
                ),
                ("low space".into(), space.low_space.to_string()),
                count("low space events", space.low_space_events),
                count("spares for growth", space.spares_left),
                count("granules live", space.granules_live),
                (
                    "bytes live".into(),
                    (space.granules_live * GRANULE).to_string(),
                ),
                count("extents partly dead", space.extents_partly_dead),
                count("extents freed", space.extents_freed),
                count(
                    "extents freed by granule liveness",
                    space.extents_freed_by_granules,
                ),
                ("map commit".into(), self.map_commit.name().to_string()),
                ("when full".into(), self.when_full.describe()),
                count("writes waiting for space", space.writes_waiting),
                count("allocations refused", space.no_space_errors),
                (
                    "metadata used".into(),
                    format!("{} of {} bytes", meta.used_bytes, meta.capacity_bytes),
                ),
                ("metadata low".into(), meta.low_space.to_string()),
                (
                    "allocation head".into(),
                    self.allocator()
                        .map_or_else(|e| e.to_string(), |a| a.head().to_string()),
                ),
            ],
            stats: None,
            children,
            activity: None,
            config: self.config.get().cloned(),
        };
        node.detail.extend(self.policy_detail());
        Ok(node)
    }

    /// Records the configuration the pool runs with, for `describe` (and so for the labels
    /// written from it). The first call wins: a pool's options change only at a restart.
    pub fn set_config(&self, config: toml::Table) {
        let _ = self.config.set(config);
    }
}

fn store_options(name: &str, settings: &PoolRuntime) -> StoreOptions {
    let mut options = StoreOptions::new(&format!("{name} metadata"));
    options.unsafe_skip_data_barrier = settings.unsafe_skip_data_barrier
        || strata_core::planted::planted(strata_core::planted::Bug::ThinMapBeforeData);
    options
}

/// The object id of a volume's map, for tests and tools.
pub fn map_id(pool: &ThinPool, volume: u32) -> Option<ObjectId> {
    pool.store.read(|state| state.id(&map_name(volume)))
}

/// The key of one virtual extent of one volume in the extent lock table (a hash, so that the
/// same extent of different volumes does not always share a stripe).
pub(crate) fn lock_key(volume: u32, extent: u64) -> u64 {
    let hash = (volume as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ extent.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash >> 32
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use strata_backend::MemoryDevice;
    use strata_core::{BlockDevice, TokioRuntime, WriteFlags};

    use super::*;

    /// A panic inside an allocator change may leave it half updated; the pool then refuses
    /// allocating writes with a failure naming it, instead of panicking or allocating from it.
    #[tokio::test]
    async fn a_poisoned_allocator_fails_allocating_writes_and_nothing_else() {
        const EXTENT: u64 = 64 << 10;
        let disk: DeviceRef = Arc::new(MemoryDevice::new(4 << 20));
        let options = PoolOptions {
            extent_size: EXTENT,
            metadata_size: Some(1 << 20),
            start_mid: false,
        };
        let mut settings = PoolRuntime::new(TokioRuntime::current());
        settings.commit_interval = None;
        let pool = ThinPool::format("pool", disk, &options, settings)
            .await
            .unwrap();
        let volume = pool.create_volume("v", 1 << 20).await.unwrap();
        let block = || Bytes::from(vec![7u8; 4096]);
        volume
            .write(0, block(), WriteFlags::default())
            .await
            .unwrap();

        let poisoner = pool.clone();
        let panicked = std::thread::spawn(move || {
            let _held = poisoner.allocator.lock().unwrap();
            panic!("planted while the allocator is held");
        })
        .join();
        assert!(panicked.is_err());

        let refused = volume.write(EXTENT, block(), WriteFlags::default()).await;
        assert!(
            matches!(refused, Err(BlockError::Poisoned { what, .. }) if what == "the extent allocator"),
            "{refused:?}"
        );
        // Mapped data stays readable and overwritable: neither needs the allocator.
        assert_eq!(&volume.read(0, 4096).await.unwrap()[..], &block()[..]);
        volume
            .write(0, block(), WriteFlags::default())
            .await
            .unwrap();
        let node = pool.describe().await.unwrap();
        let head = node.detail.iter().find(|(key, _)| key == "allocation head");
        assert!(
            head.is_some_and(|(_, value)| value.contains("the extent allocator")),
            "status names the poisoned allocator: {head:?}"
        );
    }
}
