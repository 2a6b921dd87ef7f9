//! The mirror's in-memory state and how it is assembled at open.
//!
//! Locks: `slots` and `regions` are std locks held only for in-memory work, never across an
//! await; `slots` may be taken inside `regions`, never the other way round. The per-region
//! locks (`locks`, striped) are async: writes hold them shared for the whole write, a resync
//! copy or a read repair holds one exclusive while it copies.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use strata_core::{
    poison, Activity, Background, BlockError, DeviceRef, Geometry, Result, StripedLocks,
};
use strata_meta::{MetaStore, TxnClass};

use super::meta::{self, same_device, FormatPlan, Ids, MetaFanout};
use super::policy::{MemberState, MirrorRecord};
use super::{invalid, MirrorOptions, RuntimeRef};

/// Region lock stripes: enough that unrelated regions rarely share one.
const STRIPES: usize = 256;

pub(super) struct Slot {
    pub name: String,
    pub device: Option<DeviceRef>,
    pub state: MemberState,
}

/// What the bitmap code tracks about a region whose bit is set or that has writes in flight.
#[derive(Default)]
pub(super) struct Track {
    pub inflight: u32,
    /// Bumped by every write (and resync copy) that starts in the region.
    pub generation: u64,
    pub last_write: Duration,
    /// Transaction that last set the bit; the bit is durable once this one is.
    pub set_txn: Option<u64>,
}

#[derive(Default)]
pub(super) struct Regions {
    pub track: BTreeMap<u64, Track>,
    /// Regions dirty at open and not yet made identical: reads there go to the sync source.
    pub needs_sync: BTreeSet<u64>,
}

#[derive(Default)]
pub(super) struct Counters {
    pub read_errors: AtomicU64,
    pub repairs: AtomicU64,
    pub resynced_bytes: AtomicU64,
    pub dirty_synced: AtomicU64,
    pub dirty_at_open: AtomicU64,
}

#[derive(Default)]
pub(super) struct ResyncControl {
    pub running: bool,
    /// Work was added while a pass ran; run another.
    pub again: bool,
    pub activity: Option<Activity>,
}

pub(super) struct Inner {
    pub name: String,
    pub runtime: RuntimeRef,
    pub options: MirrorOptions,
    pub store: Arc<MetaStore>,
    pub fanout: Arc<MetaFanout>,
    pub ids: Ids,
    pub data_offset: u64,
    pub size: u64,
    pub region: u64,
    pub geometry: Geometry,
    pub slots: RwLock<Vec<Slot>>,
    pub regions: Mutex<Regions>,
    locks: StripedLocks,
    pub turn: AtomicUsize,
    pub resync: Mutex<ResyncControl>,
    pub counters: Counters,
    /// The resync and the bitmap cleaner: quiesced by online changes, stopped at shutdown.
    pub background: Background,
}

/// A RAID-1 mirror; see the module docs.
pub struct Mirror {
    pub(super) inner: Arc<Inner>,
}

/// Counters for tests and status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MirrorStats {
    /// Bits set in the write-intent bitmap when the mirror was opened.
    pub dirty_at_open: u64,
    /// Of those, regions copied so far.
    pub dirty_regions_synced: u64,
    /// Bytes copied by resyncs of new or replaced members.
    pub resynced_bytes: u64,
    pub read_errors: u64,
    pub repairs: u64,
    /// Bits set now.
    pub dirty_regions: u64,
}

impl Mirror {
    /// Assembles a mirror over `children` (None = missing); formats it only if every member
    /// is blank and `options.start.may_format` (see `policy::choose_copy`).
    pub async fn open(
        name: String,
        names: Vec<String>,
        children: Vec<Option<DeviceRef>>,
        options: MirrorOptions,
        runtime: RuntimeRef,
    ) -> Result<Mirror> {
        assert_eq!(names.len(), children.len());
        let present: Vec<&DeviceRef> = children.iter().flatten().collect();
        if present.is_empty() {
            return Err(invalid(&name, "every member is missing"));
        }
        if options.region == 0 || !options.region.is_multiple_of(4096) {
            return Err(invalid(
                &name,
                "region must be a positive multiple of 4 KiB",
            ));
        }
        if !options.metadata_size.is_multiple_of(4096) {
            return Err(invalid(&name, "metadata-size must be a multiple of 4 KiB"));
        }
        let geometry = combined_geometry(&present);
        let align = u64::from(geometry.min_io).max(4096);
        let size_hint = present
            .iter()
            .map(|d| d.geometry().size.saturating_sub(options.metadata_size))
            .min()
            .unwrap_or(0)
            / align
            * align;
        let plan = FormatPlan {
            metadata_size: options.metadata_size,
            region: options.region,
            size_hint,
        };
        let opened = meta::open_or_format(
            &name,
            &names,
            &children,
            geometry.min_io,
            plan,
            options.start,
            runtime.as_ref(),
        )
        .await?;
        let record = opened.record;
        let states = opened.states.clone();
        // Record the reconciled membership and give every usable member a full copy.
        let ids = opened.ids;
        let store = opened.store.clone();
        let record = MirrorRecord {
            members: children.len() as u32,
            ..record
        };
        store.transact(TxnClass::Normal, |state, txn| {
            txn.put_blob(ids.config, record.encode());
            let table = state.table(ids.members).map(|t| t.len()).unwrap_or(0);
            for (i, s) in states.iter().enumerate() {
                txn.set(ids.members, i as u64, &s.encode());
            }
            for i in states.len() as u64..table.max(states.len() as u64) {
                txn.set(ids.members, i, &[0u8; 16]);
            }
            Ok(())
        })?;
        for (i, (child, state)) in children.iter().zip(&states).enumerate() {
            if let (Some(device), true) = (child, state.receives_writes()) {
                opened.fanout.replicas().add(i, device.clone());
            }
        }
        store.checkpoint_now().await?;
        store.checkpoint_now().await?;
        let nregions = record.size.div_ceil(record.region);
        let needs_sync: BTreeSet<u64> = store.read(|s| {
            let bitmap = s.bitmap(ids.dirty).expect("dirty bitmap");
            let mut set = BTreeSet::new();
            let mut at = 0;
            while let Some(bit) = bitmap.next(at, nregions, true) {
                set.insert(bit);
                at = bit + 1;
            }
            set
        });
        let mut regions = Regions::default();
        for &r in &needs_sync {
            // Durable already: transaction 0 precedes everything the open just committed.
            let track = Track {
                set_txn: Some(0),
                ..Track::default()
            };
            regions.track.insert(r, track);
        }
        regions.needs_sync = needs_sync;
        let slots = names
            .into_iter()
            .zip(children)
            .zip(&states)
            .map(|((name, device), &state)| Slot {
                name,
                device,
                state,
            })
            .collect();
        let counters = Counters::default();
        counters
            .dirty_at_open
            .store(regions.needs_sync.len() as u64, Ordering::Relaxed);
        let inner = Arc::new(Inner {
            name,
            runtime,
            store,
            fanout: opened.fanout,
            ids,
            data_offset: record.data_offset,
            size: record.size,
            region: record.region,
            geometry: Geometry {
                size: record.size,
                ..geometry
            },
            slots: RwLock::new(slots),
            regions: Mutex::new(regions),
            locks: StripedLocks::new(STRIPES),
            turn: AtomicUsize::new(0),
            resync: Mutex::new(ResyncControl::default()),
            counters,
            background: Background::new(),
            options,
        });
        tracing::info!(mirror = %inner.name, size = inner.size, dirty = inner.counters.dirty_at_open.load(Ordering::Relaxed), "mirror assembled");
        // Members that failed the open's metadata rewrite become faulty now.
        inner.commit().await?;
        inner.kick_resync()?;
        inner.start_cleaner();
        Ok(Mirror { inner })
    }

    /// Member states, by slot.
    pub fn member_states(&self) -> Vec<MemberState> {
        let slots = self.inner.slots.read();
        let slots = slots.unwrap_or_else(PoisonError::into_inner);
        slots.iter().map(|s| s.state).collect()
    }

    pub fn stats(&self) -> MirrorStats {
        let c = &self.inner.counters;
        MirrorStats {
            dirty_at_open: c.dirty_at_open.load(Ordering::Relaxed),
            dirty_regions_synced: c.dirty_synced.load(Ordering::Relaxed),
            resynced_bytes: c.resynced_bytes.load(Ordering::Relaxed),
            read_errors: c.read_errors.load(Ordering::Relaxed),
            repairs: c.repairs.load(Ordering::Relaxed),
            dirty_regions: self.inner.dirty_bits(),
        }
    }

    /// Regions whose write-intent bit is set now, ascending.
    pub fn dirty_region_list(&self) -> Vec<u64> {
        let limit = self.inner.size.div_ceil(self.inner.region);
        self.inner.store.read(|s| {
            let mut out = Vec::new();
            if let Some(bitmap) = s.bitmap(self.inner.ids.dirty) {
                let mut at = 0;
                while let Some(bit) = bitmap.next(at, limit, true) {
                    out.push(bit);
                    at = bit + 1;
                }
            }
            out
        })
    }

    /// Where the data area starts on every member.
    pub fn data_offset(&self) -> u64 {
        self.inner.data_offset
    }

    /// Whether no resync is running or pending.
    pub fn resync_idle(&self) -> bool {
        let control = self.inner.resync.lock();
        !control.unwrap_or_else(PoisonError::into_inner).running
    }

    /// Waits (polling through the runtime) until no resync runs.
    pub async fn wait_resync(&self) {
        while !self.resync_idle() {
            self.inner.runtime.sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The geometry every member can honour.
fn combined_geometry(members: &[&DeviceRef]) -> Geometry {
    let mut g = Geometry {
        size: 0,
        min_io: 512,
        logical_block: 512,
        physical_block: 512,
        preferred_io: 4096,
        max_io: u32::MAX,
    };
    for m in members {
        let mg = m.geometry();
        g.min_io = g.min_io.max(mg.min_io);
        g.logical_block = g.logical_block.max(mg.logical_block);
        g.physical_block = g.physical_block.max(mg.physical_block);
        g.preferred_io = g.preferred_io.max(mg.preferred_io);
        g.max_io = g.max_io.min(mg.max_io);
    }
    g
}

impl Inner {
    /// The member table, or a failure of the mirror if a panic poisoned it.
    pub fn slots_read(&self) -> Result<RwLockReadGuard<'_, Vec<Slot>>> {
        poison::check(self.slots.read(), &self.name, "the member table")
    }

    pub fn slots_write(&self) -> Result<RwLockWriteGuard<'_, Vec<Slot>>> {
        poison::check(self.slots.write(), &self.name, "the member table")
    }

    pub fn regions_lock(&self) -> Result<MutexGuard<'_, Regions>> {
        poison::check(self.regions.lock(), &self.name, "the region table")
    }

    pub fn resync_control(&self) -> Result<MutexGuard<'_, ResyncControl>> {
        poison::check(self.resync.lock(), &self.name, "the resync state")
    }

    pub fn states(&self) -> Result<Vec<MemberState>> {
        Ok(self.slots_read()?.iter().map(|s| s.state).collect())
    }

    /// Devices and states, for one request.
    pub fn snapshot(&self) -> Result<Vec<(Option<DeviceRef>, MemberState)>> {
        Ok(self
            .slots_read()?
            .iter()
            .map(|s| (s.device.clone(), s.state))
            .collect())
    }

    /// The region locks (striped): writes share them, a resync copy or a read repair holds
    /// them exclusive.
    pub fn region_locks(&self) -> &StripedLocks {
        &self.locks
    }

    pub fn dirty_bits(&self) -> u64 {
        self.store.read(|s| {
            s.bitmap(self.ids.dirty)
                .map(|b| b.count_ones())
                .unwrap_or(0)
        })
    }

    /// Commits, and turns members the metadata fanout dropped meanwhile into faulty ones.
    pub async fn commit(&self) -> Result<()> {
        loop {
            self.store.commit().await?;
            let dropped = self.fanout.replicas().take_dropped();
            if dropped.is_empty() {
                return Ok(());
            }
            for (index, device, why) in dropped {
                self.stage_faulty(index, Some(&device), &why)?;
            }
        }
    }

    /// Marks `index` faulty in memory and in a transaction (not yet durable). With `device`,
    /// only if the slot still holds that device: an I/O error is a fact about one disk, and
    /// it can be reported after the slot was given a replacement (a background flush or
    /// metadata write to the old disk that failed while `ReplaceMember` ran). Faulting the
    /// slot then would fail a healthy replacement, and with it possibly the last good copy.
    fn stage_faulty(&self, index: usize, device: Option<&DeviceRef>, why: &str) -> Result<()> {
        let mut slots = self.slots_write()?;
        let slot = &mut slots[index];
        if slot.state == MemberState::Faulty {
            return Ok(());
        }
        if let Some(device) = device {
            if !slot.device.as_ref().is_some_and(|d| same_device(d, device)) {
                tracing::info!(mirror = %self.name, member = %slot.name, %why, "error of a device no longer in this slot; ignored");
                return Ok(());
            }
        }
        tracing::error!(mirror = %self.name, member = %slot.name, %why, "member is faulty");
        slot.state = MemberState::Faulty;
        if let Some(current) = &slot.device {
            self.fanout.replicas().remove(index, current);
        }
        let encoded = MemberState::Faulty.encode();
        self.store.transact(TxnClass::Normal, |_, txn| {
            txn.set(self.ids.members, index as u64, &encoded);
            Ok(())
        })
    }

    /// Marks slot `index` faulty, whatever device it holds, durably, before returning (the
    /// operator's `FailMember`, a member being replaced).
    pub async fn mark_faulty(&self, index: usize, why: &str) -> Result<()> {
        self.stage_faulty(index, None, why)?;
        self.commit().await
    }

    /// Marks `device` faulty, durably, before returning, if slot `index` still holds it (see
    /// `stage_faulty`). Every I/O error path uses this, with the device the I/O went to.
    pub async fn mark_device_faulty(
        &self,
        index: usize,
        device: &DeviceRef,
        why: &str,
    ) -> Result<()> {
        self.stage_faulty(index, Some(device), why)?;
        self.commit().await
    }

    /// Records the state (resync progress, in-sync at the end) of `device` in slot `index`,
    /// durably. Refused (`Unsupported`) if the slot is faulty or holds another device by now:
    /// progress made on one disk must never be credited to its replacement.
    pub async fn record_state(
        &self,
        index: usize,
        device: &DeviceRef,
        state: MemberState,
    ) -> Result<()> {
        {
            let mut slots = self.slots_write()?;
            let slot = &mut slots[index];
            let same = slot.device.as_ref().is_some_and(|d| same_device(d, device));
            if slot.state == MemberState::Faulty || !same {
                return Err(BlockError::Unsupported(
                    "member became faulty or was replaced",
                ));
            }
            slot.state = state;
            self.store.transact(TxnClass::Normal, |_, txn| {
                txn.set(self.ids.members, index as u64, &state.encode());
                Ok(())
            })?;
        }
        self.commit().await
    }
}
