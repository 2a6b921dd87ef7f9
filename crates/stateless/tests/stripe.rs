//! `stripe` against a byte-array model over children of odd sizes (each child must hold
//! exactly the chunks `locate` assigns it), error propagation, and power cuts under the crash
//! harness.
//!
//! Replay a crash seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-stateless --test stripe`.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, BlockError, DeviceRef, ExtentState, WriteFlags, ZeroFlags};
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashGroup, CrashRun, ScenarioConfig,
};
use strata_stateless::stripe::{locate, Stripe};

#[derive(Clone, Debug)]
enum Op {
    Write { at: f64, len: u64, seed: u8 },
    Read { at: f64, len: u64 },
    Zero { at: f64, len: u64 },
    Discard { at: f64, len: u64 },
    Status { at: f64, len: u64 },
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    let at = 0.0..1.0f64;
    let len = 0u64..40_000;
    prop_oneof![
        6 => (at.clone(), len.clone(), any::<u8>()).prop_map(|(at, len, seed)| Op::Write { at, len, seed }),
        4 => (at.clone(), len.clone()).prop_map(|(at, len)| Op::Read { at, len }),
        2 => (at.clone(), len.clone()).prop_map(|(at, len)| Op::Zero { at, len }),
        2 => (at.clone(), len.clone()).prop_map(|(at, len)| Op::Discard { at, len }),
        2 => (at, len).prop_map(|(at, len)| Op::Status { at, len }),
        1 => Just(Op::Flush),
    ]
}

fn data(seed: u8, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|i| (i.wrapping_mul(7) as u8) ^ seed.wrapping_mul(31) ^ 0x5a)
        .collect()
}

fn place(size: u64, at: f64, len: u64) -> (u64, u64) {
    let offset = ((size as f64 * at) as u64).min(size);
    (offset, len.min(size - offset))
}

fn stripe_over(children: &[Arc<MemoryDevice>], chunk: u64) -> Stripe {
    let devices: Vec<DeviceRef> = children.iter().map(|c| c.clone() as DeviceRef).collect();
    let names = (0..children.len()).map(|i| format!("d{i}")).collect();
    Stripe::new("s".into(), devices, names, chunk).unwrap()
}

async fn apply(stripe: &Stripe, model: &mut [u8], op: &Op) {
    let size = model.len() as u64;
    match *op {
        Op::Write { at, len, seed } => {
            let (offset, len) = place(size, at, len);
            let bytes = data(seed, offset, len);
            stripe
                .write(offset, Bytes::from(bytes.clone()), WriteFlags::default())
                .await
                .unwrap();
            model[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
        }
        Op::Read { at, len } => {
            let (offset, len) = place(size, at, len);
            let got = stripe.read(offset, len as usize).await.unwrap();
            let want = &model[offset as usize..(offset + len) as usize];
            assert!(got[..] == *want, "read [{offset}, +{len}) differs");
        }
        Op::Zero { at, len } | Op::Discard { at, len } => {
            let (offset, len) = place(size, at, len);
            if matches!(op, Op::Zero { .. }) {
                let flags = ZeroFlags::default();
                stripe.write_zeroes(offset, len, flags).await.unwrap();
            } else {
                stripe.discard(offset, len).await.unwrap();
            }
            model[offset as usize..(offset + len) as usize].fill(0);
        }
        Op::Status { at, len } => {
            let (offset, len) = place(size, at, len);
            let extents = stripe.block_status(offset, len).await.unwrap();
            let mut pos = offset;
            for extent in &extents {
                assert_eq!(extent.offset, pos, "contiguous from the start");
                pos += extent.len;
                let bytes = &model[extent.offset as usize..pos as usize];
                if extent.state.reads_zero() {
                    assert!(bytes.iter().all(|&b| b == 0), "{extent:?} holds data");
                }
            }
            assert!(pos <= offset + len && (len == 0 || pos > offset));
        }
        Op::Flush => stripe.flush().await.unwrap(),
    }
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
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
        ops in prop::collection::vec(op(), 1..40),
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
    let extents = stripe.block_status(0, 4 * 4096).await.unwrap();
    let shape: Vec<_> = extents.iter().map(|e| (e.offset, e.len, e.state)).collect();
    assert_eq!(
        shape,
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
        replay: "cargo test -p strata-stateless --test stripe stripe_keeps",
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
