//! A thin volume against a plain byte-array model: every read matches, across flushes,
//! reopens, discards and several volumes sharing one small pool.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, BlockError, DeviceRef, ExtentState, WriteFlags, ZeroFlags};
use strata_crash::testkit::block_on;
use strata_thin::{check_state, PoolOptions, ThinPool};

use crate::common;
use common::{format_pool, settings};

const EXTENT: u64 = 64 << 10;
const VOLUME: u64 = 1 << 20;

#[derive(Clone, Debug)]
enum Op {
    Write {
        volume: usize,
        offset: u64,
        len: u64,
        fill: u8,
        fua: bool,
    },
    Discard {
        volume: usize,
        offset: u64,
        len: u64,
    },
    Zero {
        volume: usize,
        offset: u64,
        len: u64,
        trim: bool,
    },
    Flush,
    Reopen,
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0u64..VOLUME / 512, 1u64..300).prop_map(|(start, sectors)| {
        let offset = start * 512;
        (offset, (sectors * 512).min(VOLUME - offset))
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..2, range(), any::<u8>(), any::<bool>()).prop_map(|(volume, (offset, len), fill, fua)| Op::Write { volume, offset, len, fill: fill | 1, fua }),
        2 => (0usize..2, range()).prop_map(|(volume, (offset, len))| Op::Discard { volume, offset, len }),
        2 => (0usize..2, range(), any::<bool>()).prop_map(|(volume, (offset, len), trim)| Op::Zero { volume, offset, len, trim }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

fn sector_is(sector: &[u8], fill: u8) -> bool {
    sector.iter().all(|&b| b == fill)
}

async fn open(child: &DeviceRef) -> Arc<ThinPool> {
    ThinPool::open("pool", child.clone(), settings())
        .await
        .unwrap()
        .0
}

fn run(ops: Vec<Op>) {
    block_on(async {
        // 1 MiB of metadata + 12 extents of data: two 1 MiB volumes over-commit it.
        let child: DeviceRef = Arc::new(MemoryDevice::new((1 << 20) + 12 * EXTENT));
        let mut pool = format_pool(child.clone(), EXTENT, 1 << 20).await;
        pool.create_volume("a", VOLUME).await.unwrap();
        pool.create_volume("b", VOLUME).await.unwrap();
        let mut models = vec![vec![0u8; VOLUME as usize]; 2];
        for op in ops {
            let volumes = [pool.volume("a").unwrap(), pool.volume("b").unwrap()];
            match op {
                Op::Write {
                    volume,
                    offset,
                    len,
                    fill,
                    fua,
                } => {
                    let data = Bytes::from(vec![fill; len as usize]);
                    match volumes[volume]
                        .write(offset, data, WriteFlags { fua })
                        .await
                    {
                        Ok(()) => {
                            models[volume][offset as usize..(offset + len) as usize].fill(fill)
                        }
                        Err(BlockError::NoSpace) => {
                            // The over-committed pool filled part way: each sector holds the
                            // old bytes or the new ones, nothing else.
                            let got = volumes[volume].read(offset, len as usize).await.unwrap();
                            let old = &mut models[volume][offset as usize..(offset + len) as usize];
                            for (sector, (now, before)) in
                                got.chunks(512).zip(old.chunks_mut(512)).enumerate()
                            {
                                let new = sector_is(now, fill);
                                assert!(
                                    new || now == before,
                                    "sector {sector} after a failed write is neither old nor new"
                                );
                                before.copy_from_slice(now);
                            }
                        }
                        Err(error) => panic!("write: {error}"),
                    }
                }
                Op::Discard {
                    volume,
                    offset,
                    len,
                } => {
                    // Thin discard promises zeros for whole granules; edges keep old data.
                    volumes[volume].discard(offset, len).await.unwrap();
                    let start = offset.next_multiple_of(4096);
                    let end = ((offset + len) / 4096) * 4096;
                    if end > start {
                        models[volume][start as usize..end as usize].fill(0);
                    }
                }
                Op::Zero {
                    volume,
                    offset,
                    len,
                    trim,
                } => {
                    let flags = ZeroFlags {
                        may_trim: trim,
                        fast: false,
                        fua: false,
                    };
                    match volumes[volume].write_zeroes(offset, len, flags).await {
                        Ok(()) => models[volume][offset as usize..(offset + len) as usize].fill(0),
                        Err(BlockError::NoSpace) if !trim => {
                            // Partly written before the pool filled: re-read to resync.
                            let got = volumes[volume].read(offset, len as usize).await.unwrap();
                            models[volume][offset as usize..(offset + len) as usize]
                                .copy_from_slice(&got);
                        }
                        Err(error) => panic!("zero: {error}"),
                    }
                }
                Op::Flush => volumes[0].flush().await.unwrap(),
                Op::Reopen => {
                    pool.flush().await.unwrap();
                    drop(volumes);
                    pool = open(&child).await;
                }
            }
            for (volume, model) in models.iter().enumerate() {
                let got = pool
                    .volume(["a", "b"][volume])
                    .unwrap()
                    .read(0, VOLUME as usize)
                    .await
                    .unwrap();
                if got[..] != model[..] {
                    let at = got
                        .iter()
                        .zip(model.iter())
                        .position(|(a, b)| a != b)
                        .unwrap();
                    panic!(
                        "volume {volume} differs at byte {at}: {} vs model {}",
                        got[at], model[at]
                    );
                }
            }
            let problems = pool.store().read(check_state);
            assert!(problems.is_empty(), "{problems:?}");
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn thin_volumes_match_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(ops);
    }
}

#[tokio::test]
async fn never_written_reads_zero_and_block_status_shows_holes() {
    let child: DeviceRef = Arc::new(MemoryDevice::new(8 << 20));
    let options = PoolOptions {
        extent_size: EXTENT,
        ..PoolOptions::default()
    };
    let pool = ThinPool::format("pool", child, &options, settings())
        .await
        .unwrap();
    let volume = pool.create_volume("v", 1 << 30).await.unwrap();
    assert_eq!(
        volume.geometry().size,
        1 << 30,
        "a volume may be larger than its pool"
    );
    assert!(volume
        .read(0, 1 << 20)
        .await
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    volume
        .write(
            EXTENT + 8192,
            Bytes::from(vec![7u8; 4096]),
            WriteFlags::default(),
        )
        .await
        .unwrap();
    let map = volume.block_status(0, 4 * EXTENT).await.unwrap();
    let data: Vec<_> = map
        .iter()
        .filter(|e| e.state == ExtentState::Data)
        .collect();
    assert_eq!(data.len(), 1, "{map:?}");
    assert_eq!((data[0].offset, data[0].len), (EXTENT + 8192, 4096));
    assert_eq!(pool.allocated_extents(), 1);
    volume.discard(EXTENT, EXTENT).await.unwrap();
    assert_eq!(
        pool.allocated_extents(),
        0,
        "a wholly dead extent returns to the pool"
    );
}

#[tokio::test]
async fn a_reused_extent_never_shows_its_old_content() {
    let child: DeviceRef = Arc::new(MemoryDevice::new((1 << 20) + EXTENT));
    let pool = format_pool(child, EXTENT, 1 << 20).await;
    assert_eq!(pool.extents(), 1);
    let a = pool.create_volume("a", VOLUME).await.unwrap();
    let b = pool.create_volume("b", VOLUME).await.unwrap();
    a.write(
        0,
        Bytes::from(vec![0xaa; EXTENT as usize]),
        WriteFlags::default(),
    )
    .await
    .unwrap();
    let full = b
        .write(0, Bytes::from(vec![0xbb; 512]), WriteFlags::default())
        .await;
    assert!(matches!(full, Err(BlockError::NoSpace)), "{full:?}");
    a.discard(0, EXTENT).await.unwrap();
    // The free is not durable yet; the pool commits to release it, then b gets the extent.
    b.write(1536, Bytes::from(vec![0xbb; 512]), WriteFlags::default())
        .await
        .unwrap();
    let got = b.read(0, EXTENT as usize).await.unwrap();
    assert!(
        got[..1536].iter().all(|&x| x == 0),
        "a's bytes leaked into b"
    );
    assert!(got[1536..2048].iter().all(|&x| x == 0xbb));
    assert!(
        got[2048..].iter().all(|&x| x == 0),
        "a's bytes leaked into b"
    );
}
