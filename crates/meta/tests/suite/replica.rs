//! The replicated metadata device and the two-copy journal write.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use strata_core::{
    BlockDevice, BlockError, DeviceRef, ExtentState, Geometry, WriteFlags, ZeroFlags,
};
use strata_crash::{sector_disk, CrashDisk, CrashGroup};
use strata_meta::{write_copies, Replicas, ReplicatedDevice};

const SIZE: u64 = 64 << 10;

/// Members as a test sees them: fixed targets, failures recorded.
struct Copies {
    devices: Vec<(usize, DeviceRef)>,
    failed: Mutex<Vec<(usize, &'static str)>>,
}

impl Replicas for Copies {
    fn targets(&self) -> Vec<(usize, DeviceRef)> {
        let failed = self.failed.lock().unwrap();
        let gone = |i: &usize| failed.iter().any(|(m, _)| m == i);
        self.devices
            .iter()
            .filter(|(i, _)| !gone(i))
            .cloned()
            .collect()
    }

    fn sources(&self) -> Vec<(usize, DeviceRef)> {
        self.targets()
    }

    fn failed(&self, member: usize, _device: &DeviceRef, what: &'static str, _error: &BlockError) {
        self.failed.lock().unwrap().push((member, what));
    }

    fn none_left(&self, _what: &'static str, first: Option<BlockError>) -> BlockError {
        first.unwrap_or(BlockError::Shutdown)
    }
}

fn replicated(disks: &[CrashDisk]) -> ReplicatedDevice<Copies> {
    let devices = disks
        .iter()
        .enumerate()
        .map(|(i, d)| (i, Arc::new(d.clone()) as DeviceRef))
        .collect();
    let copies = Copies {
        devices,
        failed: Mutex::new(Vec::new()),
    };
    ReplicatedDevice::new(sector_disk(SIZE), copies)
}

fn disks(n: usize) -> Vec<CrashDisk> {
    let group = CrashGroup::new();
    (0..n).map(|_| group.disk(sector_disk(SIZE))).collect()
}

async fn bytes_at(disk: &CrashDisk, offset: u64, len: usize) -> Vec<u8> {
    disk.read(offset, len).await.unwrap().to_vec()
}

#[tokio::test]
async fn every_copy_gets_every_write_and_one_survivor_is_enough() {
    let disks = disks(3);
    let device = replicated(&disks);
    device
        .write(512, Bytes::from(vec![7; 1024]), WriteFlags { fua: true })
        .await
        .unwrap();
    for disk in &disks {
        assert_eq!(bytes_at(disk, 512, 1024).await, vec![7; 1024]);
    }
    // Member 1 fails a write: it is reported and dropped, the write still succeeds.
    disks[1].fail_writes(0, SIZE);
    device
        .write(0, Bytes::from(vec![9; 512]), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(
        *device.replicas().failed.lock().unwrap(),
        vec![(1, "write")]
    );
    assert_eq!(bytes_at(&disks[2], 0, 512).await, vec![9; 512]);
    device.flush().await.unwrap();
    // Reads fall through to the next copy when one fails.
    disks[0].fail_reads(0, SIZE);
    assert_eq!(&device.read(0, 512).await.unwrap()[..], &[9; 512][..]);
    // No copy takes it: the owner's answer, with the first error.
    disks[0].fail_writes(0, SIZE);
    disks[2].fail_writes(0, SIZE);
    let error = device
        .write(0, Bytes::from(vec![1; 512]), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(error, BlockError::Io { .. }), "{error:?}");
}

#[tokio::test]
async fn the_defaults_are_the_answers_both_raid_layers_now_share() {
    let disks = disks(2);
    let device = replicated(&disks);
    device
        .write(0, Bytes::from(vec![5; 4096]), WriteFlags::default())
        .await
        .unwrap();
    // Discard is a hint that keeps the contents (raid5 answered Ok, mirror Unsupported).
    device.discard(0, 4096).await.unwrap();
    assert_eq!(bytes_at(&disks[1], 0, 4096).await, vec![5; 4096]);
    assert!(
        device.discard(0, 100).await.is_err(),
        "ranges are still checked"
    );
    // write_zeroes reaches every copy.
    device
        .write_zeroes(0, 2048, ZeroFlags::default())
        .await
        .unwrap();
    for disk in &disks {
        assert_eq!(
            bytes_at(disk, 0, 4096).await,
            [vec![0; 2048], vec![5; 2048]].concat()
        );
    }
    let extents = device.block_status(0, SIZE).await.unwrap();
    assert_eq!(extents.len(), 1);
    assert_eq!(extents[0].state, ExtentState::Data);
    assert!(matches!(
        device.control(strata_core::Control::Describe).await,
        Err(BlockError::Unsupported(_))
    ));
    let geometry: Geometry = device.geometry();
    assert_eq!(geometry.size, SIZE);
    assert!(device.capabilities().fua);
}

#[tokio::test]
async fn write_copies_writes_every_offset_and_reports_a_failed_copy() {
    let disk = disks(1).remove(0);
    write_copies(&disk, [0, 8192], Bytes::from(vec![3; 1024]))
        .await
        .unwrap();
    assert_eq!(bytes_at(&disk, 0, 1024).await, vec![3; 1024]);
    assert_eq!(bytes_at(&disk, 8192, 1024).await, vec![3; 1024]);
    disk.fail_writes(8192, 512);
    let error = write_copies(&disk, [0, 8192], Bytes::from(vec![4; 1024]))
        .await
        .unwrap_err();
    assert!(matches!(error, BlockError::Io { .. }), "{error:?}");
    // The copy that could be written was written (the caller treats the record as failed).
    assert_eq!(bytes_at(&disk, 0, 1024).await, vec![4; 1024]);
}
