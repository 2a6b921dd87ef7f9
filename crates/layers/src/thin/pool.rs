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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use strata_core::{
    BlockError, Control, ControlReply, DeviceRef, Health, NodeStatus, Result, Runtime,
};
use strata_meta::{FormatOptions, MetaStore, ObjectId, Recovered, StoreOptions, TxnClass};

use super::alloc::Allocator;
use super::map::GRANULE;
use super::records::{
    self, decode_volumes, encode_volumes, map_name, PoolIds, PoolRecord, VolumeRecord,
};
use super::volume::ThinVolume;

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
    /// Test-only: plant the ordering bug (see `StoreOptions::unsafe_skip_data_barrier`).
    #[doc(hidden)]
    pub unsafe_skip_data_barrier: bool,
}

impl PoolRuntime {
    pub fn new(runtime: Arc<dyn Runtime>) -> Self {
        PoolRuntime {
            runtime,
            commit_interval: Some(Duration::from_secs(1)),
            unsafe_skip_data_barrier: false,
        }
    }
}

/// Lock stripes guarding (volume, virtual extent) pairs; see `volume` for who takes which.
const LOCK_STRIPES: usize = 1024;

pub struct ThinPool {
    pub(crate) name: String,
    pub(crate) child: DeviceRef,
    pub(crate) store: Arc<MetaStore>,
    pub(crate) ids: PoolIds,
    pub(crate) record: PoolRecord,
    allocator: Mutex<Allocator>,
    /// Volumes by name, with their map's object id. Handles are made on demand so that the
    /// pool does not own its volumes (they own it).
    volumes: Mutex<BTreeMap<String, (VolumeRecord, ObjectId)>>,
    pub(super) locks: Vec<tokio::sync::RwLock<()>>,
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
        if !extent_size.is_power_of_two() || !(64 << 10..=4 << 20).contains(&extent_size) {
            return Err(BlockError::InvalidArgument(format!(
                "extent size {extent_size} is not a power of two from 64 KiB to 4 MiB"
            )));
        }
        let size = child.geometry().size;
        let guess = (size / extent_size * 860).clamp(256 << 10, 4 << 30);
        let metadata = options
            .metadata_size
            .unwrap_or(guess)
            .next_multiple_of(1 << 20);
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
            FormatOptions::new("thin-pool"),
            store_options(name, &settings),
        )
        .await?;
        let record = PoolRecord {
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
        let (store, recovered) =
            MetaStore::open(child.clone(), 0, store_options(name, &settings)).await?;
        if recovered.superblock.owner != "thin-pool" {
            return Err(BlockError::InvalidArgument(format!(
                "{name}: the metadata belongs to a {:?}, not a thin pool",
                recovered.superblock.owner
            )));
        }
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
        Ok((pool, recovered))
    }

    /// Opens the pool on `child` if it has one, formats it otherwise.
    pub async fn open_or_format(
        name: &str,
        child: DeviceRef,
        options: &PoolOptions,
        settings: PoolRuntime,
    ) -> Result<Arc<ThinPool>> {
        match strata_meta::read_superblock(child.as_ref(), 0).await {
            Ok(_) => Ok(Self::open(name, child, settings).await?.0),
            Err(strata_meta::RecoveryError::NoSuperblock { .. }) => {
                Self::format(name, child, options, settings).await
            }
            Err(error) => Err(error.into()),
        }
    }

    fn assemble(
        name: &str,
        child: DeviceRef,
        store: Arc<MetaStore>,
        head: u64,
        settings: PoolRuntime,
    ) -> Result<Arc<ThinPool>> {
        let corrupt = |problem: String| {
            BlockError::io(
                format!("thin pool {name}: {problem}"),
                std::io::Error::new(std::io::ErrorKind::InvalidData, "bad thin pool metadata"),
            )
        };
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
            allocator: Mutex::new(Allocator::new(record.extents, head.min(record.extents))),
            volumes: Mutex::new(BTreeMap::new()),
            locks: (0..LOCK_STRIPES)
                .map(|_| tokio::sync::RwLock::new(()))
                .collect(),
        });
        for volume in volume_records {
            pool.attach(volume)?;
        }
        Ok(pool)
    }

    fn attach(self: &Arc<Self>, record: VolumeRecord) -> Result<Arc<ThinVolume>> {
        let map = self
            .store
            .read(|state| state.id(&map_name(record.id)))
            .ok_or_else(|| {
                BlockError::InvalidArgument(format!("volume {} has no map", record.name))
            })?;
        let volume = Arc::new(ThinVolume::new(self.clone(), record.clone(), map));
        self.volumes_lock()
            .insert(record.name.clone(), (record, map));
        Ok(volume)
    }

    pub(super) fn volumes_lock(
        &self,
    ) -> MutexGuard<'_, BTreeMap<String, (VolumeRecord, ObjectId)>> {
        self.volumes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    pub(crate) fn allocator(&self) -> MutexGuard<'_, Allocator> {
        self.allocator
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn extent_size(&self) -> u64 {
        self.record.extent_size
    }

    pub fn extents(&self) -> u64 {
        self.record.extents
    }

    pub fn store(&self) -> &Arc<MetaStore> {
        &self.store
    }

    /// Creates a volume of `size` bytes (a multiple of 512); it exists durably on return.
    pub async fn create_volume(self: &Arc<Self>, name: &str, size: u64) -> Result<Arc<ThinVolume>> {
        if name.is_empty() || name.len() > 64 || name.contains('/') {
            return Err(BlockError::InvalidArgument(format!("volume name {name:?}")));
        }
        if size == 0 || !size.is_multiple_of(512) {
            return Err(BlockError::InvalidArgument(format!(
                "volume size {size} is not a positive multiple of 512"
            )));
        }
        let ids = self.ids;
        let record = self.store.transact(TxnClass::Normal, |state, txn| {
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
        })?;
        self.store.commit().await?;
        tracing::info!(pool = %self.name, volume = name, size, "thin volume created");
        self.attach(record)
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

    /// The lock stripe for one virtual extent of one volume.
    pub(crate) fn lock(&self, volume: u32, extent: u64) -> &tokio::sync::RwLock<()> {
        let hash = (volume as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ extent.wrapping_mul(0xff51_afd7_ed55_8ccd);
        &self.locks[(hash >> 32) as usize % LOCK_STRIPES]
    }

    /// Byte offset of a physical extent on the child.
    pub(crate) fn extent_offset(&self, phys: u64) -> u64 {
        debug_assert!(phys < self.record.extents);
        self.record.data_start + phys * self.record.extent_size
    }

    /// First live-bitmap bit of a physical extent.
    pub(crate) fn first_granule(&self, phys: u64) -> u64 {
        phys * (self.record.extent_size / GRANULE)
    }

    /// Reserves a free extent for a first write, committing once to release quarantined
    /// extents if nothing else is free.
    pub(crate) async fn reserve_extent(&self) -> Result<u64> {
        for attempt in 0..2 {
            let durable = self.store.durable_txn();
            let picked = self.store.read(|state| {
                let allocated = state.bitmap(self.ids.allocated).expect("pool bitmap");
                self.allocator().allocate(allocated, durable)
            });
            if let Some(extent) = picked {
                return Ok(extent);
            }
            if attempt == 0 && self.allocator().quarantined() > 0 {
                self.store.commit().await?;
            }
        }
        tracing::warn!(pool = %self.name, "thin pool is out of data space");
        Err(BlockError::NoSpace)
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

    pub(crate) fn volume_status(&self, record: &VolumeRecord, map: ObjectId) -> NodeStatus {
        let mapped = self
            .store
            .read(|state| state.table(map).map_or(0, |t| t.len()));
        NodeStatus {
            name: record.name.clone(),
            kind: "thin".into(),
            size: record.size,
            health: Health::Ok,
            detail: vec![
                ("pool".into(), self.name.clone()),
                ("extents mapped".into(), mapped.to_string()),
                (
                    "bytes mapped".into(),
                    (mapped * self.record.extent_size).to_string(),
                ),
            ],
            stats: None,
            children: Vec::new(),
            activity: None,
        }
    }

    pub async fn describe(&self) -> Result<NodeStatus> {
        let space = self.store.space();
        let allocated = self.allocated_extents();
        let ControlReply::Describe(child) = self.child.control(Control::Describe).await? else {
            return Err(BlockError::Unsupported("describe"));
        };
        let health = if space.failed.is_some() {
            Health::Failed
        } else if space.low_space || allocated == self.record.extents {
            Health::Degraded
        } else {
            Health::Ok
        };
        let mut children = vec![child];
        let volumes: Vec<(VolumeRecord, ObjectId)> =
            self.volumes_lock().values().cloned().collect();
        for (record, map) in volumes {
            children.push(self.volume_status(&record, map));
        }
        Ok(NodeStatus {
            name: self.name.clone(),
            kind: "thin-pool".into(),
            size: self.record.extents * self.record.extent_size,
            health,
            detail: vec![
                ("extent size".into(), self.record.extent_size.to_string()),
                (
                    "extents allocated".into(),
                    format!("{allocated} of {}", self.record.extents),
                ),
                (
                    "metadata used".into(),
                    format!("{} of {} bytes", space.used_bytes, space.capacity_bytes),
                ),
                ("metadata low".into(), space.low_space.to_string()),
                (
                    "allocation head".into(),
                    self.allocator().head().to_string(),
                ),
            ],
            stats: None,
            children,
            activity: None,
        })
    }
}

fn store_options(name: &str, settings: &PoolRuntime) -> StoreOptions {
    let mut options = StoreOptions::new(&format!("{name} metadata"));
    options.unsafe_skip_data_barrier = settings.unsafe_skip_data_barrier;
    options
}

/// The object id of a volume's map, for tests and tools.
pub fn map_id(pool: &ThinPool, volume: u32) -> Option<ObjectId> {
    pool.store.read(|state| state.id(&map_name(volume)))
}
