//! Creating an array, and assembling one from its members after a restart or a crash.
//!
//! Every member carries a copy of the metadata store in its first [`META_BYTES`]. After a
//! crash the copies may differ: a commit reached some members and not others, or a member
//! failed earlier and stopped receiving commits (or went on alone, started degraded). Which
//! copy wins, whether the array may be created, and which members are out is decided by
//! `assembly` (pure) from read-only looks at every member, before anything is written. The
//! chosen region is then copied over the other members' before the store is opened on the
//! mirror, so that every copy starts identical again.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use strata_core::{BlockError, DeviceRef, Result, Runtime, StripedLocks, WriteFlags};
use strata_meta::{FormatOptions, MetaStore, Recovered, StoreOptions, TxnClass};

use super::array::{Array, FullWrites, STRIPE_LOCKS};
use super::assembly;
use super::journal::{
    decode_device_header, device_bytes, device_journal_base, encode_device_header, least_bytes,
    Journal, JBLOCK,
};
use super::layout::Layout;
use super::members::{metadata_device, Member, MemberState, Members, META_BYTES};
use super::record::{ArrayRecord, BLOB, LOST};
use super::shape::{Moving, Shape};
use strata_core::layer::StartPolicy;

pub const OWNER: &str = "raid5";
pub const DEFAULT_CHUNK: u64 = 64 << 10;
pub const DEFAULT_JOURNAL: u64 = 4 << 20;

/// The journal an array of `members` data members with `chunk`-byte chunks gets when the
/// configuration names none: [`DEFAULT_JOURNAL`], or more if its largest record needs it.
pub fn default_journal(members: usize, chunk: u64) -> u64 {
    DEFAULT_JOURNAL.max(least_bytes(members as u64 * chunk + JBLOCK))
}

/// What the configuration asks for.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Chunk size; fixed at creation, checked at every open.
    pub chunk: Option<u64>,
    /// Journal bytes per member; fixed at creation.
    pub journal: Option<u64>,
    /// Which of the children is the journal device (fixed at creation), if any: every
    /// member's journal then lives there instead of on the member, so journal writes stop
    /// costing member I/O and stop queueing behind member data (md's `--write-journal`).
    pub journal_device: Option<usize>,
    /// Test-only: run without the stripe journal (plants the write hole).
    pub unsafe_skip_journal: bool,
    /// Whether this start may create the array on blank members, and start with members
    /// missing that the metadata records as working. The default refuses both.
    pub start: StartPolicy,
}

fn invalid(name: &str, what: impl std::fmt::Display) -> BlockError {
    BlockError::InvalidArgument(format!("raid5 {name}: {what}"))
}

fn member(state: MemberState) -> Member {
    Member {
        state,
        cursor: 0,
        extra: Default::default(),
        durable: true,
    }
}

/// Opens the array on `children`; creates it only when every member is blank and
/// `settings.start.may_format` (see `assembly`).
/// What an open was given besides the members: carried from [`assemble`] to [`create`] and
/// [`build`].
struct Given {
    journal_device: Option<DeviceRef>,
    settings: Settings,
    runtime: Arc<dyn Runtime>,
}

pub async fn assemble(
    name: String,
    mut children: Vec<Option<DeviceRef>>,
    settings: Settings,
    runtime: Arc<dyn Runtime>,
) -> Result<Arc<Array>> {
    let journal_device = match settings.journal_device {
        Some(index) if index < children.len() => Some(children.remove(index).ok_or_else(|| {
            invalid(
                &name,
                "the journal device is missing; without it the array cannot know which \
                 stripes a crash left half-written, so it is not started",
            )
        })?),
        Some(index) => {
            return Err(invalid(
                &name,
                format!("no child {index} for the journal device"),
            ))
        }
        None => None,
    };
    let given = Given {
        journal_device,
        settings,
        runtime,
    };
    if children.len() < 3 {
        return Err(invalid(&name, "needs at least 3 members"));
    }
    // Every decision below is made from read-only views of the members: nothing is written
    // to any of them until the copy and the membership are settled.
    let mut copies = Vec::with_capacity(children.len());
    let mut recovered: Vec<Option<Recovered>> = Vec::with_capacity(children.len());
    for child in &children {
        let (copy, r) = view_copy(child.as_ref()).await;
        copies.push(copy);
        recovered.push(r);
    }
    let refuse = |why: String| invalid(&name, why);
    let source = match assembly::choose(&copies, given.settings.start.may_format)
        .map_err(|refusal| refusal.error(&format!("raid5 {name}")))?
    {
        assembly::Choice::Create => return create(name, children, given).await,
        assembly::Choice::Open(source) => source,
    };
    let best = recovered[source]
        .as_ref()
        .expect("a valid copy was recovered");
    let uuid = best.superblock.uuid;
    let record = record_of(&best.state).map_err(refuse)?;
    check_shape(&name, &record, children.len(), &given.settings)?;
    check_journal_device(&name, &record, uuid, given.journal_device.as_ref()).await?;
    check_journal_room(&name, &record)?;
    let (assigned, newly_out) =
        assembly::member_states(&record.states, &copies, given.settings.start.allow_degraded)
            .map_err(refuse)?;
    if !newly_out.is_empty() {
        tracing::warn!(array = %name, members = ?newly_out, "raid5: members missing or unreadable; starting degraded as asked (--degraded): they are recorded failed and need `strata replace`");
    }
    let states: Vec<Member> = assigned
        .iter()
        .enumerate()
        .map(|(index, &(state, cursor))| {
            let mut m = member(state);
            if state == MemberState::Rebuilding {
                m.cursor = cursor;
            }
            if newly_out.contains(&index) {
                m.durable = false;
            }
            m
        })
        .collect();
    let region = children[source]
        .as_ref()
        .expect("present")
        .read(0, META_BYTES as usize)
        .await?;
    for (index, state) in states.iter().enumerate() {
        if index != source && state.state != MemberState::Failed {
            let device = children[index].as_ref().expect("present member");
            device
                .write(0, region.clone().freeze(), WriteFlags { fua: true })
                .await?;
        }
    }
    let members = Members::new(children, states);
    let (store, _) =
        MetaStore::open(metadata_device(members.clone()), 0, store_options(&name)).await?;
    let array = build(name, members, store, record, given)?.shared();
    let _gate = array.gate.write().await;
    let replayed = array.replay().await?;
    tracing::info!(array = %array.name, updates = replayed.updates, resynced = replayed.resynced, lost = replayed.lost, "raid5: journals replayed");
    array.reset_journals_locked().await?;
    // Always a transaction, so that every open advances next_txn (the journal epochs and the
    // choice among metadata copies rely on it).
    array.persist().await?;
    drop(_gate);
    let critical = array
        .reshape_record()?
        .is_some_and(|r| r.phase == super::record::ReshapePhase::Critical);
    if critical {
        array.redo_critical().await?;
    }
    Ok(array)
}

/// One member's metadata copy, read only, and its recovered state when valid.
async fn view_copy(device: Option<&DeviceRef>) -> (assembly::Copy, Option<Recovered>) {
    let Some(device) = device else {
        return (assembly::Copy::Missing, None);
    };
    match strata_meta::recover(device.as_ref(), 0).await {
        Ok(r) if r.superblock.owner != OWNER => (
            assembly::Copy::Damaged(format!(
                "it holds metadata of a `{}`, not a raid5",
                r.superblock.owner
            )),
            None,
        ),
        Ok(r) => match record_of(&r.state) {
            Ok(record) => (
                assembly::Copy::Valid {
                    uuid: r.superblock.uuid,
                    next_txn: r.next_txn,
                    states: record.states,
                },
                Some(r),
            ),
            Err(why) => (assembly::Copy::Damaged(why), None),
        },
        Err(strata_meta::RecoveryError::NoSuperblock { a, b }) => {
            match strata_core::blank::region_is_zero(device.as_ref(), 0, META_BYTES).await {
                Ok(true) => (assembly::Copy::Blank, None),
                Ok(false) => (
                    assembly::Copy::Damaged(format!(
                        "no valid superblock (copy A: {a}; copy B: {b}) but the metadata \
                         region is not blank"
                    )),
                    None,
                ),
                Err(error) => (assembly::Copy::Damaged(error.to_string()), None),
            }
        }
        Err(error) => (assembly::Copy::Damaged(error.to_string()), None),
    }
}

/// The raid5 record in a recovered state.
fn record_of(state: &strata_meta::State) -> std::result::Result<ArrayRecord, String> {
    let blob = state
        .id(BLOB)
        .and_then(|id| state.blob(id))
        .ok_or("metadata has no raid5 record")?;
    ArrayRecord::decode(blob).map_err(|e| e.to_string())
}

fn check_shape(
    name: &str,
    record: &ArrayRecord,
    children: usize,
    settings: &Settings,
) -> Result<()> {
    if let Some(reshape) = record
        .reshape
        .as_ref()
        .filter(|_| record.members != children)
    {
        return Err(invalid(
            name,
            format!(
                "a grow from {} to {} members is under way (it added {}), but the configuration \
                 names {children} members: list the added disks after the others in `children` \
                 (`strata raid5 grow` does; a crash before it rewrote the configuration leaves \
                 it behind). Nothing was written",
                reshape.old_members,
                record.members,
                if reshape.added.is_empty() {
                    "disks not named in the record".to_string()
                } else {
                    reshape.added.join(", ")
                }
            ),
        ));
    }
    if record.members != children {
        return Err(invalid(
            name,
            format!(
                "the array was created with {} members, the configuration names {children}",
                record.members
            ),
        ));
    }
    if let Some(chunk) = settings.chunk.filter(|&c| c != record.chunk_bytes) {
        return Err(invalid(
            name,
            format!(
                "option chunk = {chunk} bytes, but the array was created with chunk = {} bytes; \
             the chunk size is fixed at creation",
                record.chunk_bytes
            ),
        ));
    }
    if let Some(journal) = settings.journal.filter(|&j| j != record.journal_bytes) {
        return Err(invalid(
            name,
            format!(
            "option journal = {journal} bytes, but the array was created with journal = {} bytes",
            record.journal_bytes
        ),
        ));
    }
    Ok(())
}

/// An array created by a version with one-copy journals (version 2) may have a journal too
/// small for version 3's two copies (its minimum was half as large). Refused before anything
/// is written, with what to do: the journal size is fixed at creation.
fn check_journal_room(name: &str, record: &ArrayRecord) -> Result<()> {
    let least = least_bytes(record.members as u64 * record.chunk_bytes + JBLOCK);
    if record.journal_bytes >= least {
        return Ok(());
    }
    Err(invalid(
        name,
        format!(
            "the stripe journal is {} bytes per member, but journal version 3 keeps two copies \
             of every record and needs at least {least} bytes for {} members of {}-byte chunks \
             (one block more than version 2's minimum); this array was created by an older \
             version with a journal of exactly that minimum. Nothing was \
             written: start it with the previous version, copy the data off, and create the \
             array again (the journal size is fixed at creation)",
            record.journal_bytes, record.members, record.chunk_bytes
        ),
    ))
}

/// The configuration and the array agree on the journal device, and the device configured
/// is this array's (its header names the array's uuid and shape).
async fn check_journal_device(
    name: &str,
    record: &ArrayRecord,
    uuid: [u8; 16],
    device: Option<&DeviceRef>,
) -> Result<()> {
    let device = match (record.journal_device, device) {
        (false, None) => return Ok(()),
        (false, Some(_)) => {
            return Err(invalid(
                name,
                "the array was created without a journal device; one cannot be added later",
            ))
        }
        (true, None) => {
            return Err(invalid(
                name,
                "the array was created with a journal device; the configuration names none",
            ))
        }
        (true, Some(device)) => device,
    };
    let header = device.read(0, JBLOCK as usize).await?;
    match decode_device_header(&header) {
        // The header is written once, at creation: a grow adds members after it.
        Some((found, members, bytes))
            if found == uuid && members <= record.members && bytes == record.journal_bytes =>
        {
            Ok(())
        }
        Some(_) => Err(invalid(
            name,
            "the journal device belongs to another array (or another shape of this one)",
        )),
        // A header block that starts with the magic but fails its checks was one: damage (a
        // header is written once, at creation, before the record naming the device).
        None if header[..4] == encode_device_header([0; 16], 0, 0)[..4] => Err(invalid(
            name,
            "the journal device's header is damaged (it fails its checksum); the array is not \
             started (run `strata check`; restore the journal device from a copy)",
        )),
        None => Err(invalid(
            name,
            "the journal device holds no raid5 journal header: not this array's journal device",
        )),
    }
}

fn store_options(name: &str) -> StoreOptions {
    StoreOptions::new(&format!("{name} metadata"))
}

async fn create(
    name: String,
    children: Vec<Option<DeviceRef>>,
    given: Given,
) -> Result<Arc<Array>> {
    let Given {
        journal_device,
        settings,
        runtime,
    } = &given;
    let devices: Vec<DeviceRef> = children
        .iter()
        .map(|c| {
            c.clone()
                .ok_or_else(|| invalid(&name, "cannot create an array with a member missing"))
        })
        .collect::<Result<_>>()?;
    let n = devices.len();
    let chunk = settings.chunk.unwrap_or(DEFAULT_CHUNK);
    if !chunk.is_power_of_two() || chunk < 4096 {
        return Err(invalid(
            &name,
            format!("chunk = {chunk}: must be a power of two of at least 4 KiB"),
        ));
    }
    // Two copies, each with room for the largest record (a header and n chunks).
    let least = least_bytes(n as u64 * chunk + JBLOCK);
    let journal = settings.journal.unwrap_or(default_journal(n, chunk));
    if journal < least || !journal.is_multiple_of(JBLOCK) {
        return Err(invalid(&name, format!(
            "journal = {journal}: must be a multiple of 4 KiB and at least {least} bytes for {n} members of {chunk}-byte chunks"
        )));
    }
    if let Some(device) = &journal_device {
        let needed = device_bytes(n, journal);
        let size = device.geometry().size;
        if size < needed {
            return Err(invalid(
                &name,
                format!(
                "the journal device has {size} bytes; {n} journals of {journal} bytes need {needed}"
            ),
            ));
        }
        if device.geometry().min_io > 4096 {
            return Err(invalid(&name, "the journal device must accept 4 KiB I/O"));
        }
    }
    if let Some(d) = devices.iter().find(|d| d.geometry().min_io > 4096) {
        return Err(invalid(
            &name,
            format!(
                "members must accept 4 KiB I/O (min_io {})",
                d.geometry().min_io
            ),
        ));
    }
    let data_start = (META_BYTES + journal).div_ceil(chunk) * chunk;
    let smallest = devices
        .iter()
        .map(|d| d.geometry().size)
        .min()
        .expect("members");
    let stripes = smallest.saturating_sub(data_start) / chunk;
    if stripes == 0 {
        return Err(invalid(&name, format!("members of {smallest} bytes leave no room for data after {data_start} bytes of metadata and journal")));
    }
    // Parity must match data from the start: zero the data area (cheap on sparse backends).
    // The journal regions too, before the record naming them is committed: a crash before
    // the first journal reset then leaves zeros, which recovery reads as an empty journal,
    // while any other superblock that fails its checks is damage and refuses the open.
    let flags = strata_core::ZeroFlags {
        may_trim: false,
        ..Default::default()
    };
    for device in &devices {
        device.write_zeroes(META_BYTES, journal, flags).await?;
        device
            .write_zeroes(data_start, stripes * chunk, flags)
            .await?;
    }
    if let Some(device) = &journal_device {
        device
            .write_zeroes(device_journal_base(0, journal), n as u64 * journal, flags)
            .await?;
    }
    let members = Members::new(
        children,
        (0..n).map(|_| member(MemberState::Active)).collect(),
    );
    let mirror = metadata_device(members.clone());
    // The generation and uuid drawn through the runtime: in the simulator, from the seed
    // (the generation picks which superblock copy is written, hence where the drive seeks).
    let format = FormatOptions::new(OWNER).random_from(runtime.as_ref());
    let store = MetaStore::format(mirror, 0, META_BYTES, format, store_options(&name)).await?;
    let record = ArrayRecord {
        members: n,
        chunk_bytes: chunk,
        journal_bytes: journal,
        data_start,
        stripes,
        uuid: store.uuid(),
        states: vec![(MemberState::Active, 0); n],
        journal_device: journal_device.is_some(),
        reshape: None,
    };
    if let Some(device) = &journal_device {
        // Before the record that names it is committed: an array whose record says it has a
        // journal device always finds its header there.
        let header = encode_device_header(record.uuid, n, journal);
        device
            .write(0, Bytes::from(header), WriteFlags { fua: true })
            .await?;
    }
    store.transact(TxnClass::Normal, |_, txn| {
        let blob = txn.create_blob(BLOB);
        txn.put_blob(blob, record.encode());
        txn.create_table(LOST, 4);
        Ok(())
    })?;
    store.commit().await?;
    let array = build(name, members, store, record, given)?.shared();
    array.reset_journals().await?;
    array.persist().await?;
    Ok(array)
}

fn build(
    name: String,
    members: Arc<Members>,
    store: Arc<MetaStore>,
    record: ArrayRecord,
    given: Given,
) -> Result<Array> {
    let Given {
        journal_device,
        settings,
        runtime,
    } = given;
    let (blob_id, lost_id, lost) = store
        .read(|state| {
            let blob = state.id(BLOB)?;
            let lost_id = state.id(LOST)?;
            let table = state.table(lost_id)?;
            let lost: BTreeMap<u64, usize> = table
                .iter_from(0)
                .map(|(stripe, v)| {
                    (
                        stripe,
                        u32::from_le_bytes(v.try_into().unwrap()) as usize - 1,
                    )
                })
                .collect();
            Some((blob, lost_id, lost))
        })
        .ok_or_else(|| invalid(&name, "metadata lacks the raid5 objects"))?;
    let layout = Layout::new(
        record.members,
        record.chunk_bytes,
        record.data_start,
        record.stripes,
    );
    let moving = record.reshape.as_ref().map(|reshape| Moving {
        old: Layout::new(
            reshape.old_members,
            record.chunk_bytes,
            record.data_start,
            record.stripes,
        ),
        checkpoint: reshape.checkpoint,
        moved: reshape.checkpoint,
        inflight: None,
        unrecorded_reads_wait: reshape.policy == 1,
    });
    let min_io = (0..record.members)
        .filter_map(|m| members.device(m))
        .map(|d| d.geometry().min_io)
        .max()
        .unwrap_or(512)
        .max(512);
    let journals = (0..record.members)
        .map(|m| {
            let max_record = record.members as u64 * record.chunk_bytes + JBLOCK;
            let base = match journal_device {
                Some(_) => device_journal_base(m, record.journal_bytes),
                None => META_BYTES,
            };
            Arc::new(Journal::new(
                m,
                base,
                record.journal_bytes,
                max_record,
                record.uuid,
            ))
        })
        .collect();
    Ok(Array {
        epoch_base: store.next_txn() << 20,
        name,
        runtime,
        shape: std::sync::RwLock::new(Shape { layout, moving }),
        min_io,
        members,
        store,
        blob_id,
        lost_id,
        record: Mutex::new(record),
        journals: std::sync::RwLock::new(journals),
        journal_device,
        journal_failed: Mutex::new(None),
        locks: StripedLocks::new(STRIPE_LOCKS),
        writers: StripedLocks::new(STRIPE_LOCKS),
        queued: Mutex::new(HashMap::new()),
        stripe_updates: AtomicU64::new(0),
        coalesced_writes: AtomicU64::new(0),
        gate: tokio::sync::RwLock::new(()),
        fail_lock: tokio::sync::Mutex::new(()),
        full: Mutex::new(FullWrites::default()),
        lost: Mutex::new(lost),
        activity: Mutex::new(None),
        skip_journal: settings.unsafe_skip_journal,
        resets: AtomicU64::new(0),
        reclaim_lock: tokio::sync::Mutex::new(()),
        reclaims: AtomicU64::new(0),
        reclaims_failed: AtomicU64::new(0),
        reclaim_spawned: Default::default(),
        this: Default::default(),
        journal_findings: AtomicU64::new(0),
        background: strata_core::Background::new(),
        grow: Default::default(),
    })
}
