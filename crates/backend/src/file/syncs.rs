//! Syncs of a backing, each through an open file description it holds alone.
//!
//! Linux reports a writeback error to each open file description once (errseq, since 4.13):
//! `fdatasync`, or a write with RWF_DSYNC, returns an error recorded since that description
//! last checked, and marks it seen for that description only. Two syncs running at once
//! through one description race for the report: the first to check returns the error, the
//! other returns success although pages it covers never reached the disk. A device serving
//! several connections runs syncs at once, so each sync here holds one of a fixed set of
//! descriptions alone. All of them are opened with the device, before any write through it:
//! a writeback failure after that is reported by the next sync through every one of them, so
//! a sync hears of every failure since the last sync through its description, and with them
//! of any failure among the writes it covers.
//!
//! After a failed writeback the kernel may drop the pages that failed and mark them clean,
//! and once each description has reported the error, later syncs succeed: "synced" would then
//! cover writes that are gone. So the first failure is kept, and every later sync of the
//! device fails with it until the device is opened again (PostgreSQL stops for the same
//! reason). The description that reported it is given back only after the failure is kept:
//! a sync that gets that description again, which would hear nothing, sees the failure first.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use rustix::fs::OFlags;

/// Descriptions per device: syncs beyond this many at once wait for one. Concurrent syncs of
/// one file mostly wait on the same journal commit and cache flush; sixteen writers each
/// syncing (a brick written through, `bench/shared.py`) share eight.
pub(super) const DESCRIPTIONS: usize = 8;

pub(super) struct Syncs {
    idle: Mutex<Vec<File>>,
    given_back: Condvar,
    /// The first sync that failed, with its error.
    failure: OnceLock<String>,
}

impl Syncs {
    /// Opens `count` more descriptions of `file`, opened at `path`, with its access mode and
    /// O_DIRECT: through /proc/self/fd (the same inode even if the path was renamed or
    /// removed since), or where there is no /proc, by the path, checked to name the same file.
    pub(super) fn open(
        file: &File,
        path: &Path,
        count: usize,
        read_only: bool,
    ) -> io::Result<Syncs> {
        let direct = rustix::fs::fcntl_getfl(file).map_err(io::Error::from)? & OFlags::DIRECT;
        let mut options = OpenOptions::new();
        options.read(true).write(!read_only);
        if !direct.is_empty() {
            // O_DIRECT fits in an int on every Linux architecture.
            options.custom_flags(OFlags::DIRECT.bits() as i32);
        }
        let by_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
        let reopen = || match options.open(&by_fd) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => reopen_by_path(file, path, &options),
            other => other,
        };
        let idle = (0..count)
            .map(|_| reopen())
            .collect::<io::Result<Vec<File>>>()?;
        Ok(Syncs {
            idle: Mutex::new(idle),
            given_back: Condvar::new(),
            failure: OnceLock::new(),
        })
    }

    /// The failure that stopped this device's syncs, if one did.
    pub(super) fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// Runs `sync` through a description it holds alone; `describe` names a failure for the
    /// record. Refused with the kept failure once a sync has failed.
    pub(super) fn run<T>(
        &self,
        describe: impl FnOnce(&io::Error) -> String,
        sync: impl FnOnce(&File) -> io::Result<T>,
    ) -> Result<T, SyncRefused> {
        if let Some(first) = self.failure() {
            return Err(SyncRefused::Earlier(first.to_string()));
        }
        let description = self.take();
        let result = sync(&description);
        if let Err(error) = &result {
            // Kept before the description goes back (see the module's comment).
            self.failure.get_or_init(|| describe(error));
        }
        self.lock().push(description);
        self.given_back.notify_one();
        result.map_err(SyncRefused::Now)
    }

    fn take(&self) -> File {
        let mut idle = self.lock();
        loop {
            if let Some(description) = idle.pop() {
                return description;
            }
            idle = self
                .given_back
                .wait(idle)
                .unwrap_or_else(|poison| poison.into_inner());
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<File>> {
        self.idle
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// `file` opened again at `path`, refused if the path now names another file: a sync through
/// it would not cover `file`'s writes.
fn reopen_by_path(file: &File, path: &Path, options: &OpenOptions) -> io::Result<File> {
    let again = options.open(path)?;
    let (was, is) = (file.metadata()?, again.metadata()?);
    if (was.dev(), was.ino()) != (is.dev(), is.ino()) {
        return Err(io::Error::other(format!(
            "{} names another file than the one opened there",
            path.display()
        )));
    }
    Ok(again)
}

/// Why a sync did not succeed.
#[derive(Debug)]
pub(super) enum SyncRefused {
    /// This sync failed.
    Now(io::Error),
    /// An earlier sync failed (its error as kept): nothing written before it can be vouched
    /// for any more.
    Earlier(String),
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom};
    use std::sync::Arc;

    use super::*;

    fn file(dir: &tempfile::TempDir) -> File {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("img"))
            .unwrap();
        file.set_len(1 << 20).unwrap();
        file
    }

    /// A `dup` would share the original's description (and its errseq cursor): descriptions
    /// of their own do not share a file offset.
    #[test]
    fn each_sync_has_a_description_of_its_own_on_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = file(&dir);
        let syncs = Syncs::open(&file, &dir.path().join("img"), 3, false).unwrap();
        let mut taken: Vec<File> = (0..3).map(|_| syncs.take()).collect();
        let inode = file.metadata().unwrap().ino();
        for (i, description) in taken.iter_mut().enumerate() {
            assert_eq!(description.metadata().unwrap().ino(), inode);
            description.seek(SeekFrom::Start(100 + i as u64)).unwrap();
        }
        assert_eq!(file.stream_position().unwrap(), 0);
        for (i, description) in taken.iter_mut().enumerate() {
            assert_eq!(description.stream_position().unwrap(), 100 + i as u64);
        }
    }

    /// Without /proc the path is opened again, and a path that now names another file (the
    /// disk's file replaced under a running server) is refused, not synced instead.
    #[test]
    fn reopening_by_path_refuses_a_path_that_names_another_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = file(&dir);
        let path = dir.path().join("img");
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        let again = reopen_by_path(&file, &path, &options).unwrap();
        assert_eq!(
            again.metadata().unwrap().ino(),
            file.metadata().unwrap().ino()
        );
        let other = dir.path().join("other");
        std::fs::write(&other, b"another file").unwrap();
        std::fs::rename(&other, &path).unwrap();
        let error = reopen_by_path(&file, &path, &options).unwrap_err();
        assert!(error.to_string().contains("names another file"), "{error}");
    }

    #[test]
    fn syncs_beyond_the_descriptions_wait_for_one_and_all_complete() {
        let dir = tempfile::tempdir().unwrap();
        let file = file(&dir);
        let syncs = Arc::new(Syncs::open(&file, &dir.path().join("img"), 2, false).unwrap());
        let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (syncs, held, most) = (syncs.clone(), held.clone(), most.clone());
                std::thread::spawn(move || {
                    syncs
                        .run(
                            |e| e.to_string(),
                            |description| {
                                use std::sync::atomic::Ordering::SeqCst;
                                let now = held.fetch_add(1, SeqCst) + 1;
                                most.fetch_max(now, SeqCst);
                                std::thread::sleep(std::time::Duration::from_millis(5));
                                held.fetch_sub(1, SeqCst);
                                description.sync_data()
                            },
                        )
                        .unwrap();
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(most.load(std::sync::atomic::Ordering::SeqCst) <= 2);
        assert_eq!(syncs.lock().len(), 2);
    }

    #[test]
    fn a_failed_sync_fails_every_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = file(&dir);
        let syncs = Syncs::open(&file, &dir.path().join("img"), 2, false).unwrap();
        let failed = syncs.run(
            |e| format!("fdatasync: {e}"),
            |_| -> io::Result<()> { Err(io::Error::from_raw_os_error(libc::EIO)) },
        );
        assert!(
            matches!(failed, Err(SyncRefused::Now(ref e)) if e.raw_os_error() == Some(libc::EIO))
        );
        let mut ran = false;
        let later = syncs.run(
            |e| e.to_string(),
            |description| {
                ran = true;
                description.sync_data()
            },
        );
        assert!(!ran, "a sync after a failed one must not run");
        match later {
            Err(SyncRefused::Earlier(first)) => assert!(first.contains("fdatasync")),
            other => panic!("expected the earlier failure, got {other:?}"),
        }
        assert_eq!(
            syncs.lock().len(),
            2,
            "the failed sync gave its description back"
        );
    }
}
