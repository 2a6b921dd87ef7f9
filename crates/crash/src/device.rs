//! [`CrashDisk`]: one disk of a [`CrashGroup`] as a `BlockDevice`, with injected faults.
//!
//! Faults exist so that layers can show they report a failing medium as an error and never as
//! wrong data. The error kinds are fixed so tests can tell them apart:
//! - a read or write error, a latent sector error: `BlockError::Io` with OS error EIO (5);
//! - a disk that disappeared: `BlockError::Io` with OS error ENODEV (19), as an unplugged disk
//!   answers; both map to EIO on the NBD wire;
//! - after power failed: `BlockError::Shutdown`; the operation in flight at that moment gets
//!   `BlockError::Io` (EIO).
//!
//! Checks run in this order: power, presence, the request's range, the crash point, faults. A
//! request refused for its range touches nothing and does not count as a mutating operation; a
//! write refused by an injected fault counts but changes nothing.

use std::io;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, BlockError, Capabilities, Control, ControlReply, Extent, Geometry,
    Health, NodeStatus, Result, WriteFlags, ZeroFlags,
};

use crate::disk::{power_failure, GroupState, Mutation, SECTOR};
use crate::{CrashGroup, DiskCounters, DiskImage};

/// ENODEV: what an unplugged disk answers.
pub const ENODEV: i32 = 19;
const EIO: i32 = 5;

/// A disk in a crash group. Clone is cheap; clones are the same disk.
#[derive(Clone)]
pub struct CrashDisk {
    group: CrashGroup,
    index: usize,
    geometry: Geometry,
}

fn medium_error(what: &str, offset: u64, len: u64) -> BlockError {
    BlockError::io(
        format!("injected medium error on {what} [{offset}, +{len})"),
        io::Error::from_raw_os_error(EIO),
    )
}

impl CrashDisk {
    pub(crate) fn new(group: CrashGroup, index: usize, geometry: Geometry) -> Self {
        CrashDisk {
            group,
            index,
            geometry,
        }
    }

    /// The group this disk loses power with.
    pub fn group(&self) -> &CrashGroup {
        &self.group
    }

    /// Position of this disk in its group (the index of its image in `crash`'s result).
    pub fn index(&self) -> usize {
        self.index
    }

    fn with_faults(&self, change: impl FnOnce(&mut crate::disk::Faults)) {
        let mut state = self.group.lock();
        change(&mut state.disks[self.index].faults);
    }

    /// Reads touching `[offset, offset + len)` fail with EIO.
    pub fn fail_reads(&self, offset: u64, len: u64) {
        self.with_faults(|f| f.read_errors.push(offset..offset.saturating_add(len)));
    }

    /// Writes, write_zeroes and discards touching the range fail with EIO and change nothing.
    pub fn fail_writes(&self, offset: u64, len: u64) {
        self.with_faults(|f| f.write_errors.push(offset..offset.saturating_add(len)));
    }

    /// The 512-byte sectors touching the range become unreadable (EIO) until rewritten: a
    /// successful write or write_zeroes covering a whole sector heals it (a discard does not),
    /// as a disk remaps a bad sector on write.
    pub fn latent_sector_error(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let sectors = offset / SECTOR..=(offset + len - 1) / SECTOR;
        self.with_faults(|f| f.latent.extend(sectors));
    }

    /// How many 512-byte sectors are unreadable now (latent errors not yet rewritten).
    pub fn latent_sectors(&self) -> usize {
        let state = self.group.lock();
        state.disks[self.index].faults.latent.len()
    }

    /// The disk is unplugged: every later call fails with `BlockError::Io` carrying ENODEV.
    pub fn disappear(&self) {
        self.with_faults(|f| f.gone = true);
    }

    /// Removes every injected fault, including a disappearance (the disk is plugged back in).
    pub fn clear_faults(&self) {
        self.with_faults(|f| *f = Default::default());
    }

    /// What reads see now (durable content plus the cache), for debugging.
    pub fn image(&self) -> DiskImage {
        self.group.lock().disks[self.index].volatile.clone()
    }

    /// What would survive if every cached write were lost now.
    pub fn durable_image(&self) -> DiskImage {
        self.group.lock().disks[self.index].durable.clone()
    }

    pub fn stats(&self) -> DiskCounters {
        let state = self.group.lock();
        let disk = &state.disks[self.index];
        DiskCounters {
            pending: disk.pending.len() as u64,
            ..disk.counters
        }
    }

    /// Power, then presence.
    fn check_alive(&self, state: &GroupState) -> Result<()> {
        if state.powered_off {
            return Err(BlockError::Shutdown);
        }
        if state.disks[self.index].faults.gone {
            return Err(BlockError::io(
                format!("crash disk {} disappeared", self.index),
                io::Error::from_raw_os_error(ENODEV),
            ));
        }
        Ok(())
    }

    fn mutate(&self, what: &str, mutation: Mutation) -> Result<()> {
        let mut state = self.group.lock();
        self.check_alive(&state)?;
        let range = mutation.range();
        if let Some((offset, len)) = range {
            self.geometry.check_range(offset, len)?;
        }
        let number = state.ops;
        state.ops += 1;
        if state.armed.is_some_and(|armed| number >= armed) {
            state.armed = None;
            state.powered_off = true;
            state.disks[self.index].record_in_flight(mutation);
            return Err(power_failure(what));
        }
        let disk = &mut state.disks[self.index];
        if let Some((offset, len)) = range {
            if disk.faults.write_fails(offset, len) {
                return Err(medium_error(what, offset, len));
            }
        }
        disk.apply(mutation);
        Ok(())
    }
}

#[async_trait]
impl BlockDevice for CrashDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let mut state = self.group.lock();
        self.check_alive(&state)?;
        self.geometry.check_range(offset, len as u64)?;
        let disk = &mut state.disks[self.index];
        if disk.faults.read_fails(offset, len as u64) {
            return Err(medium_error("read", offset, len as u64));
        }
        let mut buf = BytesMut::zeroed(len);
        disk.volatile.read_into(offset, &mut buf);
        disk.counters.reads += 1;
        disk.counters.bytes_read += len as u64;
        Ok(buf)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let fua = flags.fua;
        self.mutate("write", Mutation::Write { offset, data, fua })
    }

    async fn flush(&self) -> Result<()> {
        self.mutate("flush", Mutation::Flush)
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.mutate("discard", Mutation::Discard { offset, len })
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let fua = flags.fua;
        self.mutate("write_zeroes", Mutation::Zeroes { offset, len, fua })
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let state = self.group.lock();
        self.check_alive(&state)?;
        self.geometry.check_range(offset, len)?;
        Ok(state.disks[self.index].volatile.extents(offset, len))
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        let state = self.group.lock();
        self.check_alive(&state)?;
        match request {
            Control::Describe => {
                let disk = &state.disks[self.index];
                Ok(ControlReply::Describe(NodeStatus {
                    name: format!("crash-disk-{}", self.index),
                    kind: "crash".into(),
                    size: self.geometry.size,
                    health: Health::Ok,
                    detail: vec![
                        ("pending".into(), disk.pending.len().to_string()),
                        ("ops".into(), state.ops.to_string()),
                    ],
                    stats: None,
                    children: Vec::new(),
                    activity: None,
                    config: None,
                }))
            }
            _ => Err(BlockError::Unsupported("control verb on a crash disk")),
        }
    }
}
