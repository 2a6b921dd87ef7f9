//! A device backed by a regular file or a raw block device.
//!
//! This is the backend real deployments store data on. It uses positional system calls
//! (pread, pwrite, fallocate, lseek SEEK_DATA) run on the runtime's blocking threads, so that
//! slow storage never stalls the async threads serving other connections; only work that the
//! page cache absorbs may run inline (see [`FileOptions::inline_cached_io`]).

mod aligned;
mod open;
mod syncs;
mod sys;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, run_blocking, BlockDevice, BlockError, Capabilities, Control, ControlReply,
    Extent, Geometry, Health, NodeStatus, Result, Runtime, WriteFlags, ZeroFlags,
};

use self::sys::Backing;

/// Largest write done on the async thread when `inline_cached_io` is on. Copying 64 KiB into
/// the page cache takes microseconds; larger writes measured faster on blocking threads,
/// where the copy overlaps with receiving the next request (bench/). Reads that hit the
/// cache run inline at any size: they measured faster inline.
const INLINE_WRITE_MAX: usize = 64 * 1024;

/// Large writes on blocking threads at once, per device. Buffered writes to one file
/// serialize on its inode lock, and a writer the kernel throttles for dirty pages sleeps
/// holding it: with a whole queue of writes behind that lock, one throttle pause delayed all
/// of them (1 MiB writes at QD8: p99 40 ms against nbdkit's 9 ms, bench/).
const WRITE_LANES: usize = 1;

/// How to open a [`FileDevice`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// A regular file or a block device.
    pub path: PathBuf,
    /// For a regular file: create it sparse with this size if it is missing, and grow it
    /// (sparse) if it is smaller. A larger file keeps its size. For a block device: the
    /// device must be at least this large. `None` opens an existing path as it is.
    pub size: Option<u64>,
    /// Bypass the page cache (O_DIRECT). Requests must then be aligned to `geometry().min_io`.
    pub direct: bool,
    /// Open read-only; writes, discards and zeroing fail with [`BlockError::ReadOnly`].
    pub read_only: bool,
    /// Serve page-cache work on the calling (async) thread: reads that hit the cache
    /// (RWF_NOWAIT) and writes of at most 64 KiB. Everything that can wait for the disk
    /// (misses, FUA, flush, fallocate, O_DIRECT) still runs on blocking threads.
    ///
    /// Handing a 4 KiB request to a blocking thread costs two context switches, which
    /// measured 2-3x slower than the copy itself (bench/). The price: a buffered write that
    /// the kernel throttles under dirty-page pressure stalls one async thread for that time.
    pub inline_cached_io: bool,
}

impl FileOptions {
    /// Opens an existing path read-write through the page cache.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileOptions {
            path: path.into(),
            size: None,
            direct: false,
            read_only: false,
            inline_cached_io: true,
        }
    }
}

/// A block device over a file or raw block device.
pub struct FileDevice {
    /// Shared with the blocking closures, which may outlive a cancelled request.
    backing: Arc<Backing>,
    runtime: Arc<dyn Runtime>,
    geometry: Geometry,
    direct: bool,
    read_only: bool,
    rotational: bool,
    /// Buffered and allowed to serve page-cache hits inline (see `FileOptions`).
    inline: bool,
    /// Admits large buffered writes to the blocking threads one at a time; see `WRITE_LANES`.
    write_lanes: Arc<tokio::sync::Semaphore>,
}

impl FileDevice {
    /// Opens (and if asked, creates or grows) the backing. Opening is synchronous: it happens
    /// once, at startup or when an operator adds a disk.
    pub fn open(options: FileOptions, runtime: Arc<dyn Runtime>) -> Result<FileDevice> {
        let opened = open::open(&options)?;
        tracing::debug!(
            path = %options.path.display(), size = opened.geometry.size,
            min_io = opened.geometry.min_io, direct = options.direct,
            read_only = options.read_only, "opened backing"
        );
        Ok(FileDevice {
            backing: Arc::new(opened.backing),
            runtime,
            geometry: opened.geometry,
            direct: options.direct,
            read_only: options.read_only,
            rotational: opened.rotational,
            inline: options.inline_cached_io && !options.direct,
            write_lanes: Arc::new(tokio::sync::Semaphore::new(WRITE_LANES)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.backing.path
    }

    /// Runs `work` on a blocking thread with access to the backing.
    async fn blocking<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Backing) -> Result<T> + Send + 'static,
    {
        let backing = Arc::clone(&self.backing);
        run_blocking(self.runtime.as_ref(), move || work(&backing)).await
    }

    /// The checks every modifying request passes before it touches anything.
    fn check_write(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        if self.read_only {
            return Err(BlockError::ReadOnly);
        }
        Ok(())
    }

    /// The writes, then one sync of the file, on one blocking thread.
    async fn write_and_sync(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        for (offset, data) in &writes {
            self.check_write(*offset, data.len() as u64)?;
        }
        let bytes: usize = writes.iter().map(|(_, data)| data.len()).sum();
        let lane = if self.direct || bytes <= INLINE_WRITE_MAX {
            None
        } else {
            let lanes = Arc::clone(&self.write_lanes);
            Some(
                lanes
                    .acquire_owned()
                    .await
                    .expect("the lanes are never closed"),
            )
        };
        self.blocking(move |backing| {
            for (offset, data) in &writes {
                backing.write_at(data, *offset, false)?;
            }
            drop(lane);
            backing.flush()
        })
        .await
    }
}

/// Hands a filled vector over as a `BytesMut` without copying (the vector is unique).
fn owned(data: Vec<u8>) -> BytesMut {
    BytesMut::from(Bytes::from(data))
}

#[async_trait]
impl BlockDevice for FileDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        // All of it: FUA is RWF_DSYNC (syncs just the one write); fast zeroing is answered
        // honestly per request (without fallocate support it fails with Unsupported rather
        // than writing zeros); all openers share the kernel's page cache (or bypass it together
        // with O_DIRECT), and fdatasync on any descriptor covers the whole file.
        Capabilities {
            read_only: self.read_only,
            rotational: self.rotational,
            ..Capabilities::ALL
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry.check_range(offset, len as u64)?;
        let mut buf = Vec::with_capacity(len);
        if len == 0 {
            return Ok(BytesMut::new());
        }
        // Most reads of a buffered file hit the page cache: serve those on this thread and
        // save the two context switches of a blocking thread.
        if self.inline && self.backing.read_cached(&mut buf, len, offset) {
            return Ok(owned(buf));
        }
        buf.clear();
        self.blocking(move |backing| {
            backing.read_at(&mut buf, len, offset)?;
            Ok(owned(buf))
        })
        .await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.check_write(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        if self.inline && !flags.fua && data.len() <= INLINE_WRITE_MAX {
            return self.backing.write_at(&data, offset, false);
        }
        // O_DIRECT writes dirty no page cache, so the kernel never throttles them under the
        // inode lock: they need no lane. Small writes dirty too little to be held up for
        // long, and a journal's small FUA writes must not queue behind each other
        // (measured: raid5 journal writes on a direct journal device; a brick's two journal
        // copies on a buffered file, issued at once, took twice one copy's time in one lane).
        let _lane = if self.direct || data.len() <= INLINE_WRITE_MAX {
            None
        } else {
            Some(self.write_lanes.acquire().await)
        };
        self.blocking(move |backing| backing.write_at(&data, offset, flags.fua))
            .await
    }

    async fn flush(&self) -> Result<()> {
        // Even read-only: another opener's writes are in the same page cache, and the
        // contract says a flush on any opener covers them.
        self.blocking(|backing| backing.flush()).await
    }

    /// Every write, then one `fdatasync`, on one blocking thread: one trip to that thread for
    /// all of them, and one device cache flush, where a write with FUA (RWF_DSYNC) pays one
    /// each. Large buffered writes hold the write lane only while they copy, not through the
    /// sync: other writers' syncs must not queue behind this one's.
    async fn write_durable(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        self.write_and_sync(writes).await
    }

    /// The same as `write_durable`: its one sync covers the whole file, earlier writes too.
    async fn write_and_flush(&self, writes: Vec<(u64, Bytes)>) -> Result<()> {
        self.write_and_sync(writes).await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_write(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.blocking(move |backing| backing.discard(offset, len))
            .await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.check_write(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.blocking(move |backing| backing.write_zeroes(offset, len, flags))
            .await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.geometry.check_range(offset, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        self.blocking(move |backing| backing.extents(offset, len))
            .await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => {
                let path = self.path().display().to_string();
                let sync_failure = self.backing.syncs.failure();
                let mut detail = vec![
                    ("path".into(), path.clone()),
                    ("direct".into(), self.direct.to_string()),
                    ("inline_cached_io".into(), self.inline.to_string()),
                    ("read_only".into(), self.read_only.to_string()),
                ];
                if let Some(first) = sync_failure {
                    detail.push(("sync_failed".into(), first.to_string()));
                }
                Ok(ControlReply::Describe(NodeStatus {
                    name: path,
                    kind: "file".into(),
                    size: self.geometry.size,
                    health: if sync_failure.is_some() {
                        // Its syncs fail from then on (`syncs`).
                        Health::Failed
                    } else if self.read_only {
                        Health::ReadOnly
                    } else {
                        Health::Ok
                    },
                    detail,
                    stats: None,
                    children: Vec::new(),
                    activity: None,
                    config: None,
                }))
            }
            _ => Err(BlockError::Unsupported("control verb on a file device")),
        }
    }
}
