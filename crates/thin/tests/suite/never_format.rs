//! Issue 12, case 2: a thin pool formats only when the start policy allows it AND its whole
//! metadata region reads as zeros. Damaged metadata is refused, naming the damage.

use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_thin::{PoolOptions, ThinPool};

const EXTENT: u64 = 64 << 10;
const META: u64 = 1 << 20;
const SIZE: u64 = META + 32 * EXTENT;

const RESTART: StartPolicy = StartPolicy {
    may_format: false,
    allow_degraded: false,
};

use crate::common;
use common::{pool_options, settings};

fn options() -> PoolOptions {
    pool_options(EXTENT, META)
}

async fn open(child: &DeviceRef, start: StartPolicy) -> strata_core::Result<Arc<ThinPool>> {
    ThinPool::open_or_format("pool", child.clone(), &options(), settings(), start).await
}

/// A pool with one volume holding 8 KiB of 0x5a at 0, flushed.
async fn pool_with_data() -> DeviceRef {
    let child: DeviceRef = Arc::new(MemoryDevice::new(SIZE));
    let pool = open(&child, StartPolicy::FRESH).await.unwrap();
    let volume = pool.create_volume("v", 1 << 20).await.unwrap();
    volume
        .write(0, Bytes::from(vec![0x5a; 8192]), WriteFlags::default())
        .await
        .unwrap();
    volume.flush().await.unwrap();
    drop(volume);
    drop(pool);
    child
}

async fn image(child: &DeviceRef) -> Vec<u8> {
    child.read(0, SIZE as usize).await.unwrap().to_vec()
}

fn refused(result: strata_core::Result<Arc<ThinPool>>, words: &[&str]) {
    let message = result.err().expect("refused").to_string();
    for word in words {
        assert!(message.contains(word), "{word:?} not in: {message}");
    }
}

#[tokio::test]
async fn damaged_superblocks_are_refused_whatever_the_policy() {
    let child = pool_with_data().await;
    // Both superblock copies damaged; checkpoints and journal survive.
    child
        .write(0, Bytes::from(vec![0xffu8; 8192]), WriteFlags::default())
        .await
        .unwrap();
    let before = image(&child).await;
    for start in [RESTART, StartPolicy::FRESH] {
        refused(open(&child, start).await, &["damaged", "strata check"]);
        assert!(image(&child).await == before, "a refused open wrote");
    }
    // Zeroed superblocks over surviving checkpoints are damage too, not a blank pool.
    child
        .write(0, Bytes::from(vec![0u8; 8192]), WriteFlags::default())
        .await
        .unwrap();
    refused(open(&child, StartPolicy::FRESH).await, &["strata check"]);
    let pool = ThinPool::open("pool", child.clone(), settings()).await;
    assert!(pool.is_err());
}

#[tokio::test]
async fn a_zeroed_region_is_formatted_only_when_the_policy_allows() {
    let child = pool_with_data().await;
    child
        .write(
            0,
            Bytes::from(vec![0u8; META as usize]),
            WriteFlags::default(),
        )
        .await
        .unwrap();
    let before = image(&child).await;
    refused(
        open(&child, RESTART).await,
        &["metadata is missing", "strata serve --format"],
    );
    assert!(image(&child).await == before, "a refused open wrote");
    // The operator's explicit format (may_format) on an all-zero region formats.
    let pool = open(&child, StartPolicy::FRESH).await.unwrap();
    assert!(pool.volume_names().is_empty());
}

#[tokio::test]
async fn a_valid_pool_opens_under_either_policy() {
    let child = pool_with_data().await;
    for start in [RESTART, StartPolicy::FRESH] {
        let pool = open(&child, start).await.unwrap();
        let volume = pool.volume("v").unwrap();
        assert_eq!(
            volume.read(0, 8192).await.unwrap().to_vec(),
            vec![0x5a; 8192]
        );
    }
}
