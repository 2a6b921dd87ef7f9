//! `stripe` against a byte-array model over children of odd sizes (each child must hold
//! exactly the chunks `locate` assigns it), error propagation, and power cuts under the crash
//! harness.
//!
//! Replay a crash seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-stateless --test suite -- stripe::`.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, BlockError, DeviceRef, ExtentState, WriteFlags};
use strata_crash::testkit::block_on;
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashGroup, CrashRun, ScenarioConfig,
};
use strata_stateless::stripe::{locate, Stripe};

use crate::common;
use common::{apply, request, status_shape, Op};

fn stripe_over(children: &[Arc<MemoryDevice>], chunk: u64) -> Stripe {
    let devices: Vec<DeviceRef> = children.iter().map(|c| c.clone() as DeviceRef).collect();
    let names = (0..children.len()).map(|i| format!("d{i}")).collect();
    Stripe::new("s".into(), devices, names, chunk).unwrap()
}

/// Every byte of the device sits where `locate` says, on the child it says.
async fn check_layout(children: &[Arc<MemoryDevice>], chunk: u64, model: &[u8]) {
    let mut images = Vec::new();
    for child in children {
        let size = child.geometry().size as usize;
        images.push(child.read(0, size).await.unwrap());
    }
    for (offset, &byte) in model.iter().enumerate() {
        let (child, at) = locate(children.len(), chunk, offset as u64);
        assert_eq!(images[child][at as usize], byte, "device byte {offset}");
    }
}

fn run(sizes: Vec<u64>, chunk: u64, ops: Vec<Op>) {
    block_on(async {
        let children: Vec<_> = sizes
            .iter()
            .map(|&s| Arc::new(MemoryDevice::new(s)))
            .collect();
        let stripe = stripe_over(&children, chunk);
        let smallest = sizes.iter().min().unwrap();
        let size = smallest / chunk * chunk * sizes.len() as u64;
        assert_eq!(stripe.geometry().size, size);
        let mut model = vec![0; size as usize];
        for op in &ops {
            apply(&stripe, &mut model, op).await;
        }
        check_layout(&children, chunk, &model).await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn stripe_matches_a_byte_array(
        sizes in prop::collection::vec(20_000u64..70_000, 2..5),
        chunk_shift in 12u32..15,
        ops in prop::collection::vec(request(40_000), 1..40),
    ) {
        run(sizes, 1 << chunk_shift, ops);
    }
}

#[tokio::test]
async fn size_is_members_times_the_smallest_rounded_to_chunk() {
    let children: Vec<_> = [100_000, 70_001, 90_000]
        .iter()
        .map(|&s| Arc::new(MemoryDevice::new(s)))
        .collect();
    let stripe = stripe_over(&children, 16 << 10);
    // 70_001 rounds down to 4 chunks of 16 KiB.
    assert_eq!(stripe.geometry().size, 3 * 4 * (16 << 10));
    assert_eq!(stripe.geometry().preferred_io, 3 * (16 << 10));
    let bad = |chunk| {
        let devices = children.iter().map(|c| c.clone() as DeviceRef).collect();
        Stripe::new("s".into(), devices, vec![], chunk)
            .err()
            .unwrap()
            .to_string()
    };
    assert!(bad(3000).contains("power of two"), "{}", bad(3000));
    assert!(bad(2048).contains("at least 4096"), "{}", bad(2048));
    assert!(bad(1 << 20).contains("no whole"), "{}", bad(1 << 20));
}

#[tokio::test]
async fn block_status_interleaves_the_childrens_answers() {
    let children: Vec<_> = (0..2)
        .map(|_| Arc::new(MemoryDevice::new(64 << 10)))
        .collect();
    let stripe = stripe_over(&children, 4096);
    // Data on device chunk 1 only (child 1 at 0): the device shows hole, data, hole.
    children[1]
        .write(0, Bytes::from(vec![1; 4096]), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(
        status_shape(&stripe, 0, 4 * 4096).await,
        vec![
            (0, 4096, ExtentState::Hole),
            (4096, 4096, ExtentState::Data),
            (8192, 8192, ExtentState::Hole),
        ]
    );
    // A whole-device query is answered for a bounded prefix, still starting at the offset.
    let whole = stripe.block_status(512, (128 << 10) - 512).await.unwrap();
    assert_eq!(whole[0].offset, 512);
}

#[tokio::test]
async fn a_failing_child_fails_the_request() {
    let group = CrashGroup::new();
    let disks: Vec<_> = (0..3).map(|_| group.disk(sector_disk(1 << 20))).collect();
    let devices: Vec<DeviceRef> = disks
        .iter()
        .map(|d| Arc::new(d.clone()) as DeviceRef)
        .collect();
    let stripe = Stripe::new("s".into(), devices, vec![], 64 << 10).unwrap();
    stripe
        .write(0, Bytes::from(vec![5; 3 << 16]), WriteFlags::default())
        .await
        .unwrap();
    // Device chunk 2 is child 2's first chunk.
    disks[2].fail_reads(4096, 512);
    let error = stripe.read(0, 3 << 16).await.unwrap_err();
    assert!(matches!(error, BlockError::Io { .. }), "{error:?}");
    assert_eq!(error.errno(), 5);
    assert_eq!(
        stripe.read(0, 2 << 16).await.unwrap()[..],
        vec![5; 2 << 16][..]
    );
    disks[0].fail_writes(0, 512);
    let error = stripe
        .write(0, Bytes::from(vec![6; 8192]), WriteFlags::default())
        .await
        .unwrap_err();
    assert_eq!(error.errno(), 5);
    disks[1].disappear();
    assert!(stripe.flush().await.is_err());
}

const DISK: u64 = 256 << 10;

#[test]
fn stripe_keeps_every_flushed_write_through_power_cuts() {
    let run = CrashRun {
        name: "stripe",
        replay: "cargo test -p strata-stateless --test suite -- stripe::stripe_keeps",
        default_iterations: 300,
    };
    let mut config = ScenarioConfig::new(vec![sector_disk(DISK); 3]);
    config.max_write = 96 << 10;
    config.concurrency = 4;
    config.discard_zeroes = true;
    let summary = run.run_async(|seed| {
        let config = config.clone();
        async move {
            flat_device_scenario(seed, &config, |group, images| {
                let disks = open_disks(group, &config.disks, images);
                async move {
                    let devices = disks
                        .into_iter()
                        .map(|d| Arc::new(d) as DeviceRef)
                        .collect();
                    let stripe = Stripe::new("s".into(), devices, vec![], 4096)?;
                    // A fresh stack has nothing to format; the harness asks for durability.
                    stripe.flush().await?;
                    Ok(Arc::new(stripe) as DeviceRef)
                }
            })
            .await
        }
    });
    assert!(summary.crash_points >= summary.iterations);
}
