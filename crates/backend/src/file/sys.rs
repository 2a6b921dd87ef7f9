//! The system calls of [`FileDevice`](super::FileDevice). They run on the runtime's blocking
//! threads, except the page-cache fast paths `read_cached` and small buffered writes, which
//! `FileDevice` may run inline (see `FileOptions::inline_cached_io`).

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use rustix::fs::{FallocateFlags, SeekFrom};
use rustix::io::{Errno, ReadWriteFlags};
use strata_core::{push_extent, BlockError, Extent, ExtentState, Result, ZeroFlags};

use super::aligned::AlignedBuf;
use super::syncs::{SyncRefused, Syncs};

/// Bounce buffers and zero-filling work in pieces of this size, so that memory per request
/// stays bounded whatever the request length.
const CHUNK: usize = 1 << 20;

/// block_status stops after this many extents: a badly fragmented file must not make one
/// call walk the whole device. The caller asks again from where the answer ends.
const MAX_EXTENTS: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Regular,
    BlockDevice,
}

/// An open file or block device and what we know about how to talk to it.
pub(super) struct Backing {
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) kind: Kind,
    /// Memory alignment of O_DIRECT buffers; `None` for buffered I/O.
    pub(super) direct_align: Option<usize>,
    /// Every sync (fdatasync, FUA writes) goes through one of these, held alone.
    pub(super) syncs: Syncs,
}

impl Backing {
    /// An I/O error with what we were doing, for the log: "pwrite disks/d0.img at 4096".
    pub(super) fn error(&self, what: &str, offset: u64, source: io::Error) -> BlockError {
        BlockError::io(
            format!("{what} {} at {offset}", self.path.display()),
            source,
        )
    }

    /// Appends `len` bytes read at `offset` to the empty `buf`.
    pub(super) fn read_at(&self, buf: &mut Vec<u8>, len: usize, offset: u64) -> Result<()> {
        debug_assert!(buf.is_empty());
        let result = match self.direct_align {
            None => fill_from(&self.file, buf, len, offset, 0),
            Some(align) => self.read_direct(buf, len, offset, align),
        };
        result.map_err(|e| self.error("pread", offset, e))
    }

    /// Appends `len` bytes to `buf` from the page cache without blocking (RWF_NOWAIT), for
    /// the async threads. Returns false, having possibly appended part, when any of it would
    /// have to wait for the disk; the caller then clears `buf` and reads on a blocking thread,
    /// which also reports any error properly.
    pub(super) fn read_cached(&self, buf: &mut Vec<u8>, len: usize, offset: u64) -> bool {
        debug_assert!(
            self.direct_align.is_none(),
            "O_DIRECT never hits the page cache"
        );
        let nowait = libc::RWF_NOWAIT;
        fill_from(&self.file, buf, len, offset, nowait).is_ok()
    }

    fn read_direct(
        &self,
        buf: &mut Vec<u8>,
        len: usize,
        offset: u64,
        align: usize,
    ) -> io::Result<()> {
        let mut bounce = AlignedBuf::zeroed(len.min(CHUNK), align);
        let mut pos = offset;
        // CHUNK is a multiple of any O_DIRECT alignment, so every piece stays aligned.
        while buf.len() < len {
            let piece = (len - buf.len()).min(CHUNK);
            let window = &mut bounce.as_mut_slice()[..piece];
            self.file.read_exact_at(window, pos)?;
            buf.extend_from_slice(window);
            pos += piece as u64;
        }
        Ok(())
    }

    /// A FUA write (`fua`) is a sync too: it goes through a description of its own.
    pub(super) fn write_at(&self, data: &[u8], offset: u64, fua: bool) -> Result<()> {
        let write = |file: &File| match self.direct_align {
            None => write_all_at(file, data, offset, fua),
            Some(align) => write_direct(file, data, offset, fua, align),
        };
        if fua {
            return self.synced("pwrite with RWF_DSYNC", offset, write);
        }
        write(&self.file).map_err(|e| self.error("pwrite", offset, e))
    }

    pub(super) fn flush(&self) -> Result<()> {
        self.synced("fdatasync", 0, File::sync_data)
    }

    /// Runs a sync through a description of its own (see `syncs`).
    fn synced(
        &self,
        what: &str,
        offset: u64,
        sync: impl FnOnce(&File) -> io::Result<()>,
    ) -> Result<()> {
        let describe = |e: &io::Error| format!("{what} at {offset}: {e}");
        self.syncs
            .run(describe, sync)
            .map_err(|refused| match refused {
                SyncRefused::Now(e) => self.error(what, offset, e),
                SyncRefused::Earlier(first) => BlockError::io(
                    format!(
                        "{what} {}: an earlier sync of it failed ({first}), so writes made before \
                     that may be lost and no sync is vouched for until it is opened again",
                        self.path.display()
                    ),
                    io::Error::from_raw_os_error(libc::EIO),
                ),
            })
    }

    /// Punches a hole where the backing can; elsewhere discarding is a no-op, which the
    /// contract allows (the range may keep its old contents).
    pub(super) fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        if !self.try_fallocate(punch, offset, len)? {
            tracing::debug!(path = %self.path.display(), "cannot punch holes; discard ignored");
        }
        Ok(())
    }

    pub(super) fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.zero(offset, len, flags)?;
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }

    fn zero(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        let zero_range = FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE;
        // On a block device, PUNCH_HOLE zeroes in hardware or fails; ZERO_RANGE may make the
        // kernel write zeros itself, so only a punch is known to be fast there.
        if flags.may_trim && self.try_fallocate(punch, offset, len)? {
            return Ok(());
        }
        if flags.fast && self.kind == Kind::BlockDevice {
            return Err(BlockError::Unsupported(
                "fast zeroing without trim on a block device",
            ));
        }
        if self.try_fallocate(zero_range, offset, len)? {
            return Ok(());
        }
        if flags.fast {
            return Err(BlockError::Unsupported(
                "fast zeroing: fallocate is not supported here",
            ));
        }
        self.fill_zeros(offset, len)
            .map_err(|e| self.error("pwrite zeros", offset, e))
    }

    /// `Ok(false)` when this file system or device does not implement `mode`.
    fn try_fallocate(&self, mode: FallocateFlags, offset: u64, len: u64) -> Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        match rustix::fs::fallocate(&self.file, mode, offset, len) {
            Ok(()) => Ok(true),
            Err(Errno::OPNOTSUPP | Errno::NOSYS) => Ok(false),
            Err(e) => Err(self.error("fallocate", offset, e.into())),
        }
    }

    /// The slow way to zero: write them.
    pub(super) fn fill_zeros(&self, offset: u64, len: u64) -> io::Result<()> {
        let chunk = len.min(CHUNK as u64) as usize;
        let zeros = AlignedBuf::zeroed(chunk, self.direct_align.unwrap_or(1));
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let piece = (end - pos).min(chunk as u64) as usize;
            write_all_at(&self.file, &zeros.as_slice()[..piece], pos, false)?;
            pos += piece as u64;
        }
        Ok(())
    }

    /// Walks the range with SEEK_DATA / SEEK_HOLE. File systems without them fall back to the
    /// kernel's generic version, which calls the whole file data; so do we if the kernel
    /// does not know the whence values at all.
    pub(super) fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let end = offset + len;
        let mut extents = Vec::new();
        let mut pos = offset;
        while pos < end && extents.len() < MAX_EXTENTS {
            let data = match rustix::fs::seek(&self.file, SeekFrom::Data(pos)) {
                Ok(data) => data.min(end),
                // No data at or after `pos` up to the end of the file.
                Err(Errno::NXIO) => end,
                Err(Errno::INVAL) => {
                    push_extent(&mut extents, extent(pos, end, ExtentState::Data));
                    break;
                }
                Err(e) => return Err(self.error("lseek SEEK_DATA", pos, e.into())),
            };
            push_extent(&mut extents, extent(pos, data, ExtentState::Hole));
            pos = data;
            if pos >= end {
                break;
            }
            let hole = match rustix::fs::seek(&self.file, SeekFrom::Hole(pos)) {
                Ok(hole) => hole.min(end),
                // Someone truncated the file under us: what is gone reads as a hole.
                Err(Errno::NXIO) => pos,
                Err(e) => return Err(self.error("lseek SEEK_HOLE", pos, e.into())),
            };
            push_extent(&mut extents, extent(pos, hole, ExtentState::Data));
            pos = hole;
        }
        Ok(extents)
    }
}

fn extent(start: u64, end: u64, state: ExtentState) -> Extent {
    Extent {
        offset: start,
        len: end - start,
        state,
    }
}

/// Appends `len` bytes read at `offset` to `buf` with preadv2(`flags`), straight into the
/// vector's spare capacity: no zeroing first, which measured ~10% of the CPU of a 1 MiB
/// read served from the page cache (bench/). EOF before `len` is an error.
fn fill_from(
    file: &File,
    buf: &mut Vec<u8>,
    len: usize,
    offset: u64,
    flags: i32,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let start = buf.len();
    buf.reserve_exact(len);
    while buf.len() - start < len {
        let done = buf.len() - start;
        let want = len - done;
        let spare = &mut buf.spare_capacity_mut()[..want];
        let iov = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: want,
        };
        let pos = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `iov` describes `want` bytes of `buf`'s spare capacity, which `buf` owns and
        // which nothing else references while `spare` borrows it; the kernel writes at most
        // `iov_len` bytes there and touches no other memory. The descriptor is open for the
        // life of `file`.
        let read = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, pos, flags) };
        match read {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => {
                let n = n as usize;
                assert!(n <= want, "preadv2 reported more bytes than asked for");
                // SAFETY: the kernel initialised exactly `n` bytes right after the current
                // length, within the reserved capacity (n <= want <= spare capacity).
                unsafe { buf.set_len(buf.len() + n) };
            }
            _ => {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
    Ok(())
}

/// An O_DIRECT write through an aligned bounce buffer, a piece at a time.
fn write_direct(file: &File, data: &[u8], offset: u64, fua: bool, align: usize) -> io::Result<()> {
    let mut bounce = AlignedBuf::zeroed(data.len().min(CHUNK), align);
    let mut pos = offset;
    for piece in data.chunks(CHUNK) {
        let window = &mut bounce.as_mut_slice()[..piece.len()];
        window.copy_from_slice(piece);
        write_all_at(file, window, pos, fua)?;
        pos += piece.len() as u64;
    }
    Ok(())
}

/// pwrite until done; with `dsync` every piece is durable when the call returns.
///
/// RWF_DSYNC (Linux 4.7) makes FUA one system call that syncs only this write's data; where
/// the kernel lacks it we write and then fdatasync, which is correct but syncs more.
fn write_all_at(file: &File, data: &[u8], offset: u64, dsync: bool) -> io::Result<()> {
    if !dsync {
        return file.write_all_at(data, offset);
    }
    let mut done = 0;
    while done < data.len() {
        let pos = offset + done as u64;
        let slices = [IoSlice::new(&data[done..])];
        match rustix::io::pwritev2(file, &slices, pos, ReadWriteFlags::DSYNC) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(Errno::OPNOTSUPP | Errno::NOSYS) => {
                file.write_all_at(&data[done..], pos)?;
                return file.sync_data();
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing(dir: &tempfile::TempDir) -> Backing {
        let path = dir.path().join("img");
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        file.set_len(3 << 20).unwrap();
        Backing {
            syncs: Syncs::open(&file, &path, 2, false).unwrap(),
            file,
            path,
            kind: Kind::Regular,
            direct_align: None,
        }
    }

    // The fallback for file systems without fallocate cannot be reached through the device on
    // ext4 or tmpfs, so it is tested directly.
    #[test]
    fn fill_zeros_zeroes_exactly_the_range_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let backing = backing(&dir);
        let len = 3 << 20;
        backing.file.write_all_at(&vec![0xEE; len], 0).unwrap();
        let (start, count) = (1000u64, (CHUNK as u64) + 5000);
        backing.fill_zeros(start, count).unwrap();

        let mut back = vec![0u8; len];
        backing.file.read_exact_at(&mut back, 0).unwrap();
        for (i, &byte) in back.iter().enumerate() {
            let inside = (start..start + count).contains(&(i as u64));
            assert_eq!(byte, if inside { 0 } else { 0xEE }, "byte {i}");
        }
    }

    #[test]
    fn dsync_write_lands_at_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let backing = backing(&dir);
        write_all_at(&backing.file, b"durable", 4093, true).unwrap();
        let mut back = [0u8; 9];
        backing.file.read_exact_at(&mut back, 4092).unwrap();
        assert_eq!(&back, b"\0durable\0");
    }

    #[test]
    fn extents_stop_at_the_cap_and_stay_contiguous() {
        let dir = tempfile::tempdir().unwrap();
        let backing = backing(&dir);
        let size = 12u64 << 20;
        backing.file.set_len(size).unwrap();
        // Data in every other 4 KiB block: 3072 alternating extents, more than one call gives.
        let blocks = size / 4096;
        for block in (0..blocks).step_by(2) {
            backing.file.write_all_at(&[1; 4096], block * 4096).unwrap();
        }
        let extents = backing.extents(0, size).unwrap();
        assert!(
            (MAX_EXTENTS..=MAX_EXTENTS + 1).contains(&extents.len()),
            "{}",
            extents.len()
        );
        let mut pos = 0;
        for (i, e) in extents.iter().enumerate() {
            assert_eq!(e.offset, pos);
            assert_eq!(e.len, 4096);
            let expected = if i % 2 == 0 {
                ExtentState::Data
            } else {
                ExtentState::Hole
            };
            assert_eq!(e.state, expected, "extent {i}");
            pos += e.len;
        }
        assert!(pos < size);
        // Asking again from where the answer ended continues the walk.
        let rest = backing.extents(pos, size - pos).unwrap();
        assert_eq!(rest[0].offset, pos);
    }
}
