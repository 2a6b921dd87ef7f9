//! The stage against a reference model (a `Vec<u8>` disk): random reads, small and large
//! writes, FUA, discards and write-zeroes, flushes, destages and reopens (after a flush),
//! under each trigger, with a
//! log small enough to fill. Every read must equal the model, and the invariants must hold
//! after every destage and reopen.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, DeviceRef, WriteFlags, ZeroFlags};
use strata_stage::{check_state, StageDevice};

use crate::common;
use common::*;

const SLOW: u64 = 2 << 20; // 512 blocks, 32 ranges of 16 blocks, 8 extents
const BLOCKS: u64 = SLOW / BLOCK;

#[derive(Clone, Debug)]
enum Op {
    Write {
        block: u64,
        count: u64,
        fua: bool,
        byte: u8,
    },
    Read {
        block: u64,
        count: u64,
    },
    /// Discard, or write-zeroes (`trim`: may deallocate); both read as zeros after.
    Zero {
        block: u64,
        count: u64,
        discard: bool,
        trim: bool,
        fua: bool,
    },
    Flush,
    Destage,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    // Writes up to 16 blocks (64 KiB) cross the 32 KiB threshold both ways; a hot window
    // makes overwrites frequent.
    let block = prop_oneof![0..BLOCKS, 0..48u64];
    prop_oneof![
        8 => (block.clone(), 1..17u64, any::<bool>(), any::<u8>())
            .prop_map(|(block, count, fua, byte)| Op::Write { block, count, fua, byte }),
        4 => (block.clone(), 1..40u64).prop_map(|(block, count)| Op::Read { block, count }),
        2 => (block, 1..64u64, any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(block, count, discard, trim, fua)| Op::Zero { block, count, discard, trim, fua }),
        1 => Just(Op::Flush),
        1 => Just(Op::Destage),
        1 => Just(Op::Reopen),
    ]
}

fn run(trigger: &'static str, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let config = config(trigger);
        let fast: DeviceRef = Arc::new(MemoryDevice::new(fast_size(24)));
        let slow: DeviceRef = Arc::new(MemoryDevice::new(SLOW));
        let mut stage = format(fast.clone(), slow.clone(), &config).await;
        let mut model = vec![0u8; SLOW as usize];
        for op in ops {
            let device = StageDevice(stage.clone());
            match op {
                Op::Write {
                    block,
                    count,
                    fua,
                    byte,
                } => {
                    let count = count.min(BLOCKS - block);
                    let data: Vec<u8> = (block..block + count)
                        .flat_map(|b| block_data(b, byte))
                        .collect();
                    let at = (block * BLOCK) as usize;
                    model[at..at + data.len()].copy_from_slice(&data);
                    device
                        .write(block * BLOCK, Bytes::from(data), WriteFlags { fua })
                        .await
                        .unwrap();
                }
                Op::Read { block, count } => {
                    let count = count.min(BLOCKS - block);
                    let got = device
                        .read(block * BLOCK, (count * BLOCK) as usize)
                        .await
                        .unwrap();
                    let at = (block * BLOCK) as usize;
                    prop_assert!(
                        got[..] == model[at..at + got.len()],
                        "read of {} blocks at {} differs from the model",
                        count,
                        block
                    );
                }
                Op::Zero {
                    block,
                    count,
                    discard,
                    trim,
                    fua,
                } => {
                    let count = count.min(BLOCKS - block);
                    let (at, len) = (block * BLOCK, count * BLOCK);
                    model[at as usize..(at + len) as usize].fill(0);
                    if discard {
                        device.discard(at, len).await.unwrap();
                    } else {
                        let flags = ZeroFlags {
                            may_trim: trim,
                            fua,
                            ..ZeroFlags::default()
                        };
                        device.write_zeroes(at, len, flags).await.unwrap();
                    }
                }
                Op::Flush => device.flush().await.unwrap(),
                Op::Destage => {
                    stage.destage_all().await.unwrap();
                    prop_assert_eq!(stage.log_usage().unwrap().0, 0);
                    let problems = stage.store().read(check_state);
                    prop_assert!(problems.is_empty(), "{:?}", problems);
                }
                Op::Reopen => {
                    device.flush().await.unwrap();
                    drop(device);
                    drop(stage);
                    stage = reopen(fast.clone(), slow.clone(), &config).await;
                }
            }
        }
        let device = StageDevice(stage.clone());
        let all = device.read(0, SLOW as usize).await.unwrap();
        prop_assert!(
            all[..] == model[..],
            "the whole device differs from the model"
        );
        let problems = stage.store().read(check_state);
        prop_assert!(problems.is_empty(), "{:?}", problems);
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_full_trigger_reads_like_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run("full", ops)?;
    }

    #[test]
    fn the_watermark_trigger_reads_like_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run("watermark", ops)?;
    }

    #[test]
    fn the_density_trigger_reads_like_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run("density", ops)?;
    }
}
