//! The mirror's metadata: one `MetaStore` kept in the metadata region of every member.
//!
//! The store sees one small device, [`MetaFanout`], whose writes and flushes go to the region
//! of every member that is not faulty, and whose reads come from the member whose copy won at
//! open. So all copies receive the same writes and differ only where a crash or a failing
//! member cut one short. A member that fails a metadata write is dropped from the fanout (the
//! store carries on with the others, so losing a member never fails the mirror's metadata)
//! and reported through [`MetaMembers::take_dropped`]; the mirror then marks it faulty.
//!
//! At open every present member's copy is recovered on its own (read only), the winner and
//! the membership are decided from those views (`policy::choose_copy`, `assemble_states`),
//! and only then is the store opened from the winner. Opening writes a fresh checkpoint
//! through the fanout, which rewrites every kept copy to the winner.

use std::sync::{Arc, LockResult, Mutex, MutexGuard, PoisonError};

use strata_core::{BlockDevice, BlockError, DeviceRef, Geometry, Result};
use strata_meta::{
    FormatOptions, MetaStore, ObjectId, RecoveryError, Replicas, ReplicatedDevice, StoreOptions,
};

use super::policy::{
    assemble_states, choose_copy, CopyChoice, CopyView, MemberState, MirrorRecord,
};
use strata_core::layer::StartPolicy;

pub const CONFIG_BLOB: &str = "mirror.config";
pub const MEMBERS_TABLE: &str = "mirror.members";
pub const DIRTY_BITMAP: &str = "mirror.dirty";

/// Whether `a` and `b` are the same device (one `Arc`). Compares the data pointers only: two
/// `dyn` pointers to one object may carry different vtable pointers.
pub fn same_device(a: &DeviceRef, b: &DeviceRef) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

/// Ids of the mirror's objects in the store.
#[derive(Clone, Copy, Debug)]
pub struct Ids {
    pub config: ObjectId,
    pub members: ObjectId,
    pub dirty: ObjectId,
}

/// The metadata regions of the non-faulty members, as one device.
pub type MetaFanout = ReplicatedDevice<MetaMembers>;

/// A fanout over `targets` (member index, device), reading from `read_from` first.
pub fn fanout(
    region_len: u64,
    min_io: u32,
    targets: Vec<(usize, DeviceRef)>,
    read_from: usize,
) -> Arc<MetaFanout> {
    let geometry = Geometry {
        size: region_len,
        min_io: min_io.max(512),
        logical_block: 512,
        physical_block: 4096,
        preferred_io: 4096,
        max_io: 32 << 20,
    };
    let members = MetaMembers {
        targets: Mutex::new(targets),
        read_from: Mutex::new(read_from),
        dropped: Mutex::new(Vec::new()),
    };
    Arc::new(ReplicatedDevice::new(geometry, members))
}

/// The members holding the mirror's metadata: a member that fails a write is dropped at once
/// and reported through [`MetaMembers::take_dropped`].
pub struct MetaMembers {
    targets: Mutex<Vec<(usize, DeviceRef)>>,
    /// Member whose copy reads come from (the winner at open).
    read_from: Mutex<usize>,
    /// Members dropped since the last `take_dropped`, with the device that failed: the slot
    /// may hold a replacement by the time the mirror looks, and only that device is faulty.
    dropped: Mutex<Vec<(usize, DeviceRef, String)>>,
}

/// Every critical section on these locks is one `Vec` operation (clone, retain, push, take)
/// that leaves the list whole even if it panics, so a poisoned lock's list is sound and is
/// used as it is rather than failing every later metadata write.
fn sound<T>(taken: LockResult<MutexGuard<'_, T>>) -> MutexGuard<'_, T> {
    taken.unwrap_or_else(PoisonError::into_inner)
}

impl MetaMembers {
    fn current(&self) -> Vec<(usize, DeviceRef)> {
        sound(self.targets.lock()).clone()
    }

    pub fn add(&self, index: usize, device: DeviceRef) {
        let mut targets = sound(self.targets.lock());
        targets.retain(|(i, _)| *i != index);
        targets.push((index, device));
    }

    /// Stops writing to `device` in slot `index`. A no-op if the slot holds another device
    /// now: an I/O to a replaced disk that fails late must not drop its replacement.
    pub fn remove(&self, index: usize, device: &DeviceRef) {
        sound(self.targets.lock()).retain(|(i, d)| *i != index || !same_device(d, device));
    }

    /// Members dropped since the last call, with the device and the error that dropped them.
    pub fn take_dropped(&self) -> Vec<(usize, DeviceRef, String)> {
        std::mem::take(&mut *sound(self.dropped.lock()))
    }
}

impl Replicas for MetaMembers {
    fn targets(&self) -> Vec<(usize, DeviceRef)> {
        self.current()
    }

    fn sources(&self) -> Vec<(usize, DeviceRef)> {
        let first = *sound(self.read_from.lock());
        let mut targets = self.current();
        targets.sort_by_key(|(i, _)| *i != first);
        targets
    }

    fn failed(&self, member: usize, device: &DeviceRef, what: &'static str, error: &BlockError) {
        tracing::error!(member, %error, "mirror metadata {what} failed on a member; dropping it");
        self.remove(member, device);
        sound(self.dropped.lock()).push((member, device.clone(), error.to_string()));
    }

    fn none_left(&self, what: &'static str, first: Option<BlockError>) -> BlockError {
        match (what, first) {
            (_, Some(error)) => error,
            ("read", None) => BlockError::Unsupported("mirror metadata: no member"),
            (_, None) => BlockError::io(
                format!("mirror metadata {what}"),
                std::io::Error::other("no member left to hold the metadata"),
            ),
        }
    }
}

/// Looks at one member's copy without writing anything. `region` is how much of the member
/// must read as zeros for a copy without superblock to count as blank.
pub async fn view_copy(device: Option<&DeviceRef>, region: u64) -> CopyView {
    let Some(device) = device else {
        return CopyView::Missing;
    };
    match strata_meta::recover(device.as_ref(), 0).await {
        Ok(recovered) => match state_of(&recovered.state) {
            Ok((_, _, states)) => CopyView::Valid {
                uuid: recovered.superblock.uuid,
                owner: recovered.superblock.owner,
                generation: recovered.superblock.generation,
                next_txn: recovered.next_txn,
                states,
            },
            // Another owner's store has no mirror objects; the choice names the owner.
            Err(_) if recovered.superblock.owner != super::OWNER => CopyView::Valid {
                uuid: recovered.superblock.uuid,
                owner: recovered.superblock.owner,
                generation: recovered.superblock.generation,
                next_txn: recovered.next_txn,
                states: Vec::new(),
            },
            Err(why) => CopyView::Damaged {
                why,
                generation: Some(recovered.superblock.generation),
            },
        },
        Err(RecoveryError::NoSuperblock { a, b }) => {
            match strata_core::blank::region_is_zero(device.as_ref(), 0, region).await {
                Ok(true) => CopyView::Blank,
                Ok(false) => CopyView::Unlabelled(format!(
                    "no valid superblock (copy A: {a}; copy B: {b}) but the metadata region \
                     is not blank"
                )),
                Err(error) => CopyView::Damaged {
                    why: error.to_string(),
                    generation: None,
                },
            }
        }
        Err(error) => {
            // The newest superblock that still reads names how new this copy is.
            let generation = match &error {
                RecoveryError::Checkpoint { generation, .. } => Some(*generation),
                _ => strata_meta::read_superblock(device.as_ref(), 0)
                    .await
                    .ok()
                    .map(|(sb, _)| sb.generation),
            };
            CopyView::Damaged {
                why: error.to_string(),
                generation,
            }
        }
    }
}

/// The store, opened or freshly formatted, with what it says.
pub struct Opened {
    pub store: Arc<MetaStore>,
    pub fanout: Arc<MetaFanout>,
    pub ids: Ids,
    pub record: MirrorRecord,
    /// One per configured child, reconciled (`policy::assemble_states`).
    pub states: Vec<MemberState>,
}

/// What a fresh mirror is formatted with.
pub struct FormatPlan {
    pub metadata_size: u64,
    pub region: u64,
    pub size_hint: u64,
}

/// Opens the mirror's store from the copy `policy::choose_copy` picks among `children`, or
/// formats every member if none has ever held one and the start policy allows it. Every
/// decision, refusals included, is made from read-only views of the copies: nothing is
/// written to any member before the choice and the membership are settled.
pub async fn open_or_format(
    name: &str,
    names: &[String],
    children: &[Option<DeviceRef>],
    min_io: u32,
    plan: FormatPlan,
    start: StartPolicy,
    runtime: &dyn strata_core::Runtime,
) -> Result<Opened> {
    let mut copies = Vec::with_capacity(children.len());
    for child in children {
        copies.push(view_copy(child.as_ref(), plan.metadata_size).await);
    }
    let refuse = |why: String| BlockError::InvalidArgument(format!("mirror {name}: {why}"));
    let choice = choose_copy(&copies, names, start.may_format)
        .map_err(|refusal| refusal.error(&format!("mirror {name}")))?;
    let store_options = StoreOptions::new(&format!("{name} metadata"));
    match choice {
        CopyChoice::Format => {
            // Checked before formatting: a refused open writes nothing.
            if plan.size_hint == 0 {
                return Err(refuse("members leave no room for data".into()));
            }
            let targets: Vec<(usize, DeviceRef)> = children
                .iter()
                .enumerate()
                .map(|(i, c)| (i, c.clone().expect("format needs every member")))
                .collect();
            let fanout = fanout(plan.metadata_size, min_io, targets, 0);
            let store = MetaStore::format(
                fanout.clone(),
                0,
                plan.metadata_size,
                FormatOptions::new(super::OWNER).random_from(runtime),
                store_options,
            )
            .await?;
            let record = MirrorRecord {
                members: children.len() as u32,
                data_offset: plan.metadata_size,
                size: plan.size_hint,
                region: plan.region,
            };
            let ids = store.transact(strata_meta::TxnClass::Normal, |_, txn| {
                let config = txn.create_blob(CONFIG_BLOB);
                let members = txn.create_table(MEMBERS_TABLE, 16);
                let dirty = txn.create_bitmap(DIRTY_BITMAP);
                txn.put_blob(config, record.encode());
                for i in 0..children.len() {
                    txn.set(members, i as u64, &MemberState::InSync.encode());
                }
                Ok(Ids {
                    config,
                    members,
                    dirty,
                })
            })?;
            store.commit().await?;
            tracing::info!(mirror = %name, members = children.len(), "mirror formatted");
            Ok(Opened {
                store,
                fanout,
                ids,
                record,
                states: vec![MemberState::InSync; children.len()],
            })
        }
        CopyChoice::Open(winner) => {
            let source = children[winner].clone().expect("a valid copy is present");
            let CopyView::Valid {
                states: recorded, ..
            } = &copies[winner]
            else {
                unreachable!("the chosen copy is valid")
            };
            // Read again (read only) for the record: its data area decides which members fit.
            let recovered = strata_meta::recover(source.as_ref(), 0)
                .await
                .map_err(BlockError::from)?;
            let (_, record, _) = state_of(&recovered.state).map_err(refuse)?;
            let need = record.data_offset + record.size;
            let fits: Vec<bool> = children
                .iter()
                .map(|c| c.as_ref().is_some_and(|d| d.geometry().size >= need))
                .collect();
            for (i, child) in children.iter().enumerate() {
                if child.is_some() && !fits[i] {
                    tracing::error!(mirror = %name, member = %names[i], "member is smaller than the mirror; faulty");
                }
            }
            let assembly = assemble_states(
                recorded,
                recovered.superblock.generation,
                &copies,
                &fits,
                names,
                start.allow_degraded,
            )
            .map_err(refuse)?;
            if !assembly.missing_in_sync.is_empty() {
                let missing: Vec<&str> = assembly
                    .missing_in_sync
                    .iter()
                    .map(|&i| names[i].as_str())
                    .collect();
                tracing::warn!(mirror = %name, missing = %missing.join(", "), "members recorded in sync are missing or their metadata is damaged; starting degraded as asked (--degraded): they are marked faulty and need `strata replace`");
            }
            for &i in &assembly.behind {
                tracing::warn!(mirror = %name, member = %names[i], "member's metadata is generations behind the others (a replaced disk configured again?); its data is not trusted: resyncing it from the start");
            }
            if recorded.len() > children.len() {
                tracing::warn!(mirror = %name, recorded = recorded.len(), configured = children.len(), "members past the configured children are dropped");
            }
            let region_len =
                recovered.superblock.layout.region_blocks * strata_meta::BLOCK_SIZE as u64;
            // Only the members the assembly keeps get the rewrite (added by the caller once
            // the membership is recorded), so start with the winner alone.
            let fanout = fanout(region_len, min_io, vec![(winner, source)], winner);
            let (store, _) = MetaStore::open(fanout.clone(), 0, store_options).await?;
            let (ids, record, _) = store.read(state_of).map_err(refuse)?;
            Ok(Opened {
                store,
                fanout,
                ids,
                record,
                states: assembly.states,
            })
        }
    }
}

/// The mirror's objects in a recovered state: ids, record, and one state per recorded slot.
fn state_of(
    state: &strata_meta::State,
) -> std::result::Result<(Ids, MirrorRecord, Vec<MemberState>), String> {
    let id = |name: &str| state.id(name).ok_or(format!("metadata has no `{name}`"));
    let ids = Ids {
        config: id(CONFIG_BLOB)?,
        members: id(MEMBERS_TABLE)?,
        dirty: id(DIRTY_BITMAP)?,
    };
    let record = MirrorRecord::decode(state.blob(ids.config).unwrap_or_default())?;
    let table = state.table(ids.members).ok_or("members is not a table")?;
    let states = (0..u64::from(record.members))
        .map(|i| {
            table
                .get(i)
                .and_then(MemberState::decode)
                .ok_or(format!("member slot {i} has no valid state"))
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    Ok((ids, record, states))
}
