//! Helpers shared by the integration tests.

#![allow(dead_code)] // Each test crate uses a different subset.

use std::path::Path;

use strata_backend::{FileDevice, FileOptions};
use strata_core::{BlockDevice, BlockError, Result, TokioRuntime};

/// Opens with the tokio runtime the test runs in.
pub fn open(options: FileOptions) -> Result<FileDevice> {
    FileDevice::open(options, TokioRuntime::current())
}

/// Creates (or opens) `path` with `size` bytes, buffered and read-write.
pub fn create(path: &Path, size: u64) -> FileDevice {
    open(FileOptions {
        size: Some(size),
        ..FileOptions::new(path)
    })
    .expect("open a test file")
}

/// Opens with O_DIRECT, or returns `None` (after saying so) if this file system refuses it.
pub fn open_direct(path: &Path, size: u64) -> Option<FileDevice> {
    let options = FileOptions {
        size: Some(size),
        direct: true,
        ..FileOptions::new(path)
    };
    match open(options) {
        Ok(dev) => Some(dev),
        Err(BlockError::Io { source, .. }) if source.raw_os_error() == Some(22) => {
            eprintln!("note: the file system under {path:?} refuses O_DIRECT (EINVAL); skipping");
            None
        }
        Err(BlockError::Unsupported(why)) => {
            eprintln!("note: {why} under {path:?}; skipping");
            None
        }
        Err(e) => panic!("open {path:?} with O_DIRECT: {e}"),
    }
}

pub async fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> Result<Vec<u8>> {
    let data = dev.read(offset, len).await?;
    assert_eq!(
        data.len(),
        len,
        "a read returns exactly the bytes asked for"
    );
    Ok(data.to_vec())
}

/// Non-zero bytes that depend on their position, so a write landing in the wrong place shows.
pub fn pattern(seed: u8, offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64)
        .map(|pos| ((pos.wrapping_mul(131) + u64::from(seed) * 7) % 251) as u8 + 1)
        .collect()
}
