//! `strata_core::blank` against a real (memory) device: lives here because core cannot
//! depend on a backend.

use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::blank::region_is_zero;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};

#[tokio::test]
async fn one_non_zero_byte_anywhere_in_the_region_is_not_blank() {
    let device: DeviceRef = Arc::new(MemoryDevice::new(8 << 20));
    assert!(region_is_zero(device.as_ref(), 0, 4 << 20).await.unwrap());
    // Written zeros are data to block_status but still blank.
    device
        .write(1 << 20, Bytes::from(vec![0u8; 8192]), WriteFlags::default())
        .await
        .unwrap();
    assert!(region_is_zero(device.as_ref(), 0, 4 << 20).await.unwrap());
    // One byte deep in the region (where a checkpoint or journal would be).
    device
        .write(3 << 20, Bytes::from(vec![0u8, 1]), WriteFlags::default())
        .await
        .unwrap();
    assert!(!region_is_zero(device.as_ref(), 0, 4 << 20).await.unwrap());
    // Outside the region it does not count; a region past the device is clamped.
    assert!(region_is_zero(device.as_ref(), 0, 3 << 20).await.unwrap());
    assert!(region_is_zero(device.as_ref(), 4 << 20, 64 << 20)
        .await
        .unwrap());
}
