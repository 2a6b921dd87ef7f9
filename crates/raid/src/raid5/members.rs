//! Member states, and the small mirrored device that replicates the metadata region.
//!
//! Lock rule: `table` (a std Mutex) is held only for in-memory work, never across an await.
//! `copy_gate` (an async RwLock) is held shared by every metadata write and exclusively while
//! a replacement member receives a copy of the region, so that no write slips between the
//! copy and the moment the new member starts receiving writes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use strata_core::{BlockError, DeviceRef, Geometry, Result};
use strata_meta::{Replicas, ReplicatedDevice};

/// Bytes at the start of every member for the metadata store (256 blocks of 4 KiB).
pub const META_BYTES: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    Active,
    Failed,
    /// Receiving a rebuild; stripes below `cursor` (and those in `extra`) hold good data.
    Rebuilding,
}

impl MemberState {
    pub fn code(self) -> u8 {
        match self {
            MemberState::Active => 0,
            MemberState::Failed => 1,
            MemberState::Rebuilding => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<MemberState> {
        [
            MemberState::Active,
            MemberState::Failed,
            MemberState::Rebuilding,
        ]
        .into_iter()
        .find(|s| s.code() == code)
    }
}

#[derive(Clone, Debug)]
pub struct Member {
    pub state: MemberState,
    /// Rebuilding: every stripe below this is rebuilt.
    pub cursor: u64,
    /// Rebuilding: stripes at or above `cursor` already rebuilt (concurrent rebuild).
    pub extra: BTreeSet<u64>,
    /// The state recorded in the metadata matches `state` (a failure is not acted upon by a
    /// degraded write until this is true).
    pub durable: bool,
}

pub struct Members {
    devices: RwLock<Vec<Option<DeviceRef>>>,
    table: Mutex<Vec<Member>>,
    pub copy_gate: tokio::sync::RwLock<()>,
}

pub fn array_failed(what: &str) -> BlockError {
    BlockError::io(
        format!("raid5: {what}: two or more members are unusable, the array has failed"),
        std::io::Error::from_raw_os_error(5),
    )
}

impl Members {
    pub fn new(devices: Vec<Option<DeviceRef>>, states: Vec<Member>) -> Arc<Members> {
        assert_eq!(devices.len(), states.len());
        Arc::new(Members {
            devices: RwLock::new(devices),
            table: Mutex::new(states),
            copy_gate: tokio::sync::RwLock::new(()),
        })
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }

    pub fn lock(&self) -> MutexGuard<'_, Vec<Member>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether member `m` has failed: its writes, journal ones too, are dropped from then on.
    pub fn is_failed(&self, m: usize) -> bool {
        self.lock()[m].state == MemberState::Failed
    }

    pub fn device(&self, m: usize) -> Option<DeviceRef> {
        self.devices.read().unwrap_or_else(|p| p.into_inner())[m].clone()
    }

    /// A fault of member `m` as it is now: of the device in its slot (none if missing).
    pub fn fault(&self, m: usize) -> super::array::Fault {
        super::array::Fault {
            member: m,
            device: self.device(m),
        }
    }

    pub fn set_device(&self, m: usize, device: DeviceRef) {
        self.devices.write().unwrap_or_else(|p| p.into_inner())[m] = Some(device);
    }

    pub fn snapshot(&self) -> Vec<Member> {
        self.lock().clone()
    }

    /// Appends a member (a grow's new disk).
    pub fn add(&self, device: DeviceRef, member: Member) {
        let mut devices = self.devices.write().unwrap_or_else(|p| p.into_inner());
        let mut table = self.lock();
        devices.push(Some(device));
        table.push(member);
    }

    /// The one member among the first `count` (a geometry's) that cannot serve `stripe`, or
    /// an error when two cannot.
    pub fn unusable(&self, stripe: u64, count: usize) -> Result<Option<usize>> {
        let table = self.lock();
        let mut out = table
            .iter()
            .take(count)
            .enumerate()
            .filter(|(_, m)| !usable(m, stripe))
            .map(|(i, _)| i);
        let first = out.next();
        if out.next().is_some() {
            return Err(array_failed("stripe I/O"));
        }
        Ok(first)
    }

    /// Members that are failed or rebuilding (the array has failed at two).
    pub fn unhealthy(&self) -> usize {
        self.lock()
            .iter()
            .filter(|m| m.state != MemberState::Active)
            .count()
    }

    /// Marks `m` failed in memory. Returns whether that changed anything.
    pub fn mark_failed(&self, m: usize) -> bool {
        let mut table = self.lock();
        if table[m].state == MemberState::Failed {
            return false;
        }
        table[m].state = MemberState::Failed;
        table[m].durable = false;
        table[m].extra.clear();
        true
    }

    pub fn mark_durable(&self, snapshot: &[Member]) {
        let mut table = self.lock();
        for (now, saved) in table.iter_mut().zip(snapshot) {
            if now.state == saved.state {
                now.durable = true;
            }
        }
    }

    /// Members whose metadata copy is kept current.
    fn metadata_targets(&self) -> Vec<(usize, DeviceRef)> {
        let table = self.lock().clone();
        table
            .iter()
            .enumerate()
            .filter(|(_, m)| m.state != MemberState::Failed)
            .filter_map(|(i, _)| self.device(i).map(|d| (i, d)))
            .collect()
    }

    /// Active members, in index order: where metadata reads come from.
    fn read_sources(&self) -> Vec<(usize, DeviceRef)> {
        let table = self.lock().clone();
        table
            .iter()
            .enumerate()
            .filter(|(_, m)| m.state == MemberState::Active)
            .filter_map(|(i, _)| self.device(i).map(|d| (i, d)))
            .collect()
    }
}

fn usable(member: &Member, stripe: u64) -> bool {
    match member.state {
        MemberState::Active => true,
        MemberState::Failed => false,
        MemberState::Rebuilding => stripe < member.cursor || member.extra.contains(&stripe),
    }
}

/// raid5's members as holders of the metadata copies: writes go to every member that is not
/// failed, reads come from the active ones in order. A member whose write fails is marked
/// failed in memory (the array records it durably afterwards); the write succeeds if one copy
/// took it.
pub struct MetadataCopies {
    members: Arc<Members>,
}

/// The metadata region of every member as one device.
pub type MirrorDevice = ReplicatedDevice<MetadataCopies>;

/// The metadata device of `members`.
pub fn metadata_device(members: Arc<Members>) -> Arc<MirrorDevice> {
    let geometry = Geometry {
        min_io: 4096,
        ..Geometry::byte_addressable(META_BYTES)
    };
    Arc::new(ReplicatedDevice::new(geometry, MetadataCopies { members }))
}

impl Replicas for MetadataCopies {
    fn targets(&self) -> Vec<(usize, DeviceRef)> {
        self.members.metadata_targets()
    }

    fn sources(&self) -> Vec<(usize, DeviceRef)> {
        self.members.read_sources()
    }

    fn failed(&self, member: usize, _device: &DeviceRef, what: &'static str, error: &BlockError) {
        tracing::error!(member, %error, "raid5: metadata {what} failed; member marked failed");
        self.members.mark_failed(member);
    }

    fn none_left(&self, what: &'static str, first: Option<BlockError>) -> BlockError {
        match (what, first) {
            ("read", Some(error)) => error,
            ("read", None) => array_failed("metadata read"),
            _ => array_failed("metadata write"),
        }
    }

    fn write_gate(&self) -> Option<&tokio::sync::RwLock<()>> {
        Some(&self.members.copy_gate)
    }
}
