//! Faults under a thin volume come back as errors, never as wrong data.

use std::sync::Arc;

use bytes::Bytes;
use strata_core::{BlockDevice, BlockError, DeviceRef, WriteFlags};
use strata_crash::{sector_disk, CrashDisk, CrashGroup};
use strata_thin::{ThinPool, ThinVolume};

use crate::common;
use common::{pool_options, settings};

const EXTENT: u64 = 64 << 10;
const META: u64 = 1 << 20;

async fn volume() -> (CrashDisk, Arc<ThinVolume>) {
    let disk = CrashGroup::new().disk(sector_disk(META + 16 * EXTENT));
    let child: DeviceRef = Arc::new(disk.clone());
    let settings = settings();
    let pool = ThinPool::format("pool", child, &pool_options(EXTENT, META), settings)
        .await
        .unwrap();
    let volume = pool.create_volume("v", 1 << 20).await.unwrap();
    (disk, volume)
}

fn data(byte: u8, len: usize) -> Bytes {
    Bytes::from(vec![byte; len])
}

#[tokio::test]
async fn read_errors_and_latent_sector_errors_surface_as_eio() {
    let (disk, volume) = volume().await;
    volume
        .write(0, data(1, 8192), WriteFlags::default())
        .await
        .unwrap();
    // Extent 0 is the first data extent, right after the metadata region.
    disk.latent_sector_error(META + 4096, 512);
    let error = volume.read(0, 8192).await.unwrap_err();
    assert!(matches!(error, BlockError::Io { .. }), "{error:?}");
    assert_eq!(error.errno(), 5);
    // Unaffected sectors still read, and a rewrite heals the medium.
    assert_eq!(&volume.read(0, 4096).await.unwrap()[..], &[1u8; 4096][..]);
    volume
        .write(4096, data(2, 4096), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(
        &volume.read(4096, 4096).await.unwrap()[..],
        &[2u8; 4096][..]
    );
    // Never-written blocks need no read at all.
    disk.fail_reads(0, META + 16 * EXTENT);
    assert_eq!(
        &volume.read(EXTENT, 4096).await.unwrap()[..],
        &[0u8; 4096][..]
    );
    assert!(volume.read(0, 512).await.is_err());
}

#[tokio::test]
async fn a_failed_write_leaves_old_or_new_data_and_never_publishes_a_mapping() {
    let (disk, volume) = volume().await;
    disk.fail_writes(META, 16 * EXTENT);
    let error = volume
        .write(0, data(3, 4096), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(error, BlockError::Io { .. }), "{error:?}");
    disk.clear_faults();
    assert_eq!(
        &volume.read(0, 4096).await.unwrap()[..],
        &[0u8; 4096][..],
        "an unwritten extent must stay unmapped"
    );
    assert_eq!(volume.pool().allocated_extents(), 0);
    volume
        .write(0, data(4, 4096), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(&volume.read(0, 4096).await.unwrap()[..], &[4u8; 4096][..]);
}

#[tokio::test]
async fn a_disk_that_disappears_fails_every_request() {
    let (disk, volume) = volume().await;
    volume
        .write(0, data(5, 4096), WriteFlags::default())
        .await
        .unwrap();
    disk.disappear();
    assert!(volume.read(0, 4096).await.is_err());
    assert!(volume
        .write(EXTENT, data(6, 4096), WriteFlags::default())
        .await
        .is_err());
    assert!(volume.flush().await.is_err());
}
