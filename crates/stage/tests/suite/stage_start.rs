//! Format or open, never silently: a stage formats only a blank fast child it may format,
//! opens its own metadata, and refuses damage and a changed shape, naming why.

use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, ByteSize, DeviceRef, WriteFlags};
use strata_crash::{sector_disk, CrashGroup};
use strata_stage::{open_or_format, StageDevice};

use crate::common;
use common::*;

fn memory(size: u64) -> DeviceRef {
    Arc::new(MemoryDevice::new(size))
}

const MAY: StartPolicy = StartPolicy {
    may_format: true,
    allow_degraded: false,
};

async fn start(
    fast: &DeviceRef,
    slow: &DeviceRef,
    config: &strata_stage::StageConfig,
    start: StartPolicy,
) -> strata_core::Result<Arc<strata_stage::Stage>> {
    open_or_format(
        "st",
        fast.clone(),
        slow.clone(),
        config,
        settings(config),
        start,
    )
    .await
}

#[tokio::test]
async fn a_blank_fast_child_is_formatted_only_when_allowed_then_opened() {
    let config = config("full");
    let (fast, slow) = (memory(fast_size(64)), memory(4 << 20));
    let error = start(&fast, &slow, &config, StartPolicy::default())
        .await
        .err()
        .expect("a blank region without permission is refused");
    assert!(error.to_string().contains("--format"), "{error}");
    let stage = start(&fast, &slow, &config, MAY).await.unwrap();
    StageDevice(stage.clone())
        .write(0, Bytes::from(vec![5; 4096]), WriteFlags { fua: true })
        .await
        .unwrap();
    drop(stage);
    // Opened, not formatted again, whatever the policy: the data is there.
    let stage = start(&fast, &slow, &config, MAY).await.unwrap();
    let data = StageDevice(stage).read(0, 4096).await.unwrap();
    assert_eq!(data.to_vec(), vec![5; 4096]);
}

#[tokio::test]
async fn a_fast_child_holding_other_data_is_refused_even_when_formatting_is_allowed() {
    let config = config("full");
    let (fast, slow) = (memory(fast_size(64)), memory(4 << 20));
    fast.write(8192, Bytes::from(vec![1; 4096]), WriteFlags::default())
        .await
        .unwrap();
    let error = start(&fast, &slow, &config, MAY).await.err().unwrap();
    assert_eq!(error.errno(), strata_core::errno::EIO, "{error}");
    assert!(error.to_string().contains("not blank"), "{error}");
    assert!(error.to_string().contains("strata check"), "{error}");
}

#[tokio::test]
async fn damaged_metadata_is_refused_not_served_as_empty() {
    let config = config("full");
    let (fast, slow) = (memory(fast_size(64)), memory(4 << 20));
    drop(start(&fast, &slow, &config, MAY).await.unwrap());
    // Both superblock copies destroyed: the checkpoints behind them are still there.
    fast.write(0, Bytes::from(vec![0xff; 8192]), WriteFlags::default())
        .await
        .unwrap();
    let error = start(&fast, &slow, &config, MAY).await.err().unwrap();
    assert!(
        error.to_string().contains("refusing to open or format"),
        "{error}"
    );
}

#[tokio::test]
async fn a_shape_fixed_at_creation_cannot_change_at_a_reopen() {
    let config = config("full");
    let (fast, slow) = (memory(fast_size(64)), memory(4 << 20));
    drop(start(&fast, &slow, &config, MAY).await.unwrap());
    let mut other = config.clone();
    other.range = ByteSize(128 << 10);
    let error = start(&fast, &slow, &other, MAY).await.err().unwrap();
    assert!(error.to_string().contains("field `range`"), "{error}");
    // Settings that are not fixed may change.
    let mut other = config.clone();
    other.threshold = ByteSize(8 << 10);
    other.trigger = strata_stage::trigger::TriggerKind::Density;
    start(&fast, &slow, &other, MAY).await.unwrap();
}

#[tokio::test]
async fn a_fast_child_that_refuses_writes_fails_staged_writes_and_shows_in_status() {
    let config = config("full");
    let group = CrashGroup::new();
    let fast = group.disk(sector_disk(fast_size(64)));
    let fast_ref: DeviceRef = Arc::new(fast.clone());
    let stage = start(&fast_ref, &memory(4 << 20), &config, MAY)
        .await
        .unwrap();
    let device = StageDevice(stage.clone());
    fast.fail_writes(METADATA, 64 * BLOCK);
    let error = device
        .write(0, Bytes::from(vec![1; 4096]), WriteFlags::default())
        .await
        .unwrap_err();
    assert_eq!(error.errno(), strata_core::errno::EIO, "{error}");
    let status = stage.describe().await.unwrap();
    assert_eq!(status.health, strata_core::Health::Failed);
    // Nothing was recorded for the failed write: the block still reads as never written.
    fast.clear_faults();
    let data = device.read(0, 4096).await.unwrap();
    assert_eq!(data.to_vec(), vec![0; 4096]);
}

/// Every byte of `device`, to show a refusal wrote nothing.
async fn contents(device: &DeviceRef) -> Vec<u8> {
    device
        .read(0, device.geometry().size as usize)
        .await
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn swapped_children_are_refused_by_name_and_nothing_is_written_even_when_formatting_is_allowed(
) {
    let config = config("full");
    for with_data in [false, true] {
        let (fast, slow) = (memory(fast_size(64)), memory(4 << 20));
        let stage = start(&fast, &slow, &config, MAY).await.unwrap();
        if with_data {
            // A large write goes straight to the slow child, from its first block.
            StageDevice(stage.clone())
                .write(0, Bytes::from(vec![7; 256 << 10]), WriteFlags { fua: true })
                .await
                .unwrap();
        }
        drop(stage);
        let before = (contents(&fast).await, contents(&slow).await);
        // Without data the slow child's start is blank: a stage that only looked at its
        // first child would take it for a new fast child and format it.
        let error = start(&slow, &fast, &config, MAY)
            .await
            .err()
            .expect("swapped children are refused");
        assert!(error.to_string().contains("swapped"), "{error}");
        assert!(!error.to_string().contains("--format"), "{error}");
        assert_eq!(before, (contents(&fast).await, contents(&slow).await));
        // In the right order again, the stage opens with its data.
        let stage = start(&fast, &slow, &config, StartPolicy::default())
            .await
            .unwrap();
        let expected = if with_data { 7 } else { 0 };
        let data = StageDevice(stage).read(0, 4096).await.unwrap();
        assert_eq!(data.to_vec(), vec![expected; 4096]);
    }
}
