//! The stage's promises one by one: routing by size, reads gathered from both children,
//! destage placement, each trigger, fast-child failure, and the paper's home-range figure.

use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, DeviceRef, Health, WriteFlags};
use strata_crash::{CrashGroup, SECTOR};
use strata_stage::map::Location;
use strata_stage::{check_state, Stage, StageDevice};

use crate::common;
use common::*;

fn memory(size: u64) -> DeviceRef {
    Arc::new(MemoryDevice::new(size))
}

async fn write(device: &StageDevice, block: u64, data: Vec<u8>) {
    device
        .write(block * BLOCK, Bytes::from(data), WriteFlags::default())
        .await
        .unwrap();
}

/// `count` blocks from `block`, each tagged with its number and filled with `byte`.
fn blocks(block: u64, count: u64, byte: u8) -> Vec<u8> {
    (block..block + count)
        .flat_map(|b| block_data(b, byte))
        .collect()
}

async fn read(device: &StageDevice, block: u64, count: u64) -> Vec<u8> {
    device
        .read(block * BLOCK, (count * BLOCK) as usize)
        .await
        .unwrap()
        .to_vec()
}

fn assert_consistent(stage: &Stage) {
    let problems = stage.store().read(check_state);
    assert!(problems.is_empty(), "{problems:?}");
}

#[tokio::test]
async fn a_small_write_lands_in_the_log_and_a_large_one_on_the_slow_child() {
    let config = config("full");
    let slow = memory(4 << 20);
    let stage = format(memory(fast_size(64)), slow.clone(), &config).await;
    let device = StageDevice(stage.clone());
    write(&device, 5, blocks(5, 1, 0xa5)).await;
    assert!(
        matches!(stage.locate(5), Location::Log(_)),
        "{:?}",
        stage.locate(5)
    );
    // 32 KiB is the threshold: not smaller, so it goes to the slow child, at its home.
    write(&device, 16, blocks(16, 8, 0x16)).await;
    assert_eq!(stage.locate(16), Location::Disk(16));
    let on_disk = slow.read(16 * BLOCK, 8 * BLOCK as usize).await.unwrap();
    assert_eq!(on_disk.to_vec(), blocks(16, 8, 0x16));
    assert_eq!(read(&device, 5, 1).await, blocks(5, 1, 0xa5));
    assert_eq!(counter(&stage, "staged writes"), 1);
    assert_eq!(counter(&stage, "direct writes"), 1);
    assert_eq!(
        read(&device, 40, 1).await,
        vec![0; BLOCK as usize],
        "never written"
    );
    assert_consistent(&stage);
}

#[tokio::test]
async fn a_staged_overwrite_frees_the_old_block_and_reads_gather_both_children() {
    let config = config("full");
    let stage = format(memory(fast_size(64)), memory(4 << 20), &config).await;
    let device = StageDevice(stage.clone());
    write(&device, 0, blocks(0, 16, 1)).await;
    for b in [2, 7, 11] {
        write(&device, b, blocks(b, 1, 2)).await;
    }
    let allocated = |block: u64| {
        stage.store().read(|state| {
            let id = state.id(strata_stage::records::ALLOCATED).unwrap();
            state.bitmap(id).unwrap().get(block)
        })
    };
    assert!(!allocated(7), "the old on-disk block is free in the map");
    assert!(allocated(6));
    let mut expected = blocks(0, 16, 1);
    for b in [2u64, 7, 11] {
        let at = (b * BLOCK) as usize;
        expected[at..at + BLOCK as usize].copy_from_slice(&block_data(b, 2));
    }
    assert_eq!(
        read(&device, 0, 16).await,
        expected,
        "gathered from log and disk"
    );
    // Destaged, they go back home (their home blocks were freed, and the destage's first
    // commit made the frees durable): no map entry left.
    let report = stage.destage_all().await.unwrap();
    assert_eq!((report.blocks, report.batches), (3, 1));
    assert_eq!(report.placement.at_home_block, 3);
    assert_eq!(stage.locate(7), Location::Disk(7));
    assert_eq!(read(&device, 0, 16).await, expected);
    let moved = stage.store().read(|state| {
        let id = state.id(strata_stage::records::MOVED).unwrap();
        state.table(id).unwrap().len()
    });
    assert_eq!(moved, 0, "blocks back home cost no moved record");
    assert_consistent(&stage);
}

#[tokio::test]
async fn a_destage_places_new_blocks_next_to_their_neighbours_ascending() {
    let config = config("full");
    let stage = format(memory(fast_size(64)), memory(4 << 20), &config).await;
    let device = StageDevice(stage.clone());
    // Staged writes into never-written ranges 3 and 4 (ranges of 16 blocks), out of order.
    for b in [70, 50, 49, 66, 48] {
        write(&device, b, blocks(b, 1, b as u8)).await;
    }
    let report = stage.destage_all().await.unwrap();
    assert_eq!(report.blocks, 5);
    // Range 3's first base goes to physical range 3 (no neighbour has a base), range 4's
    // right after it: every block lands at its home.
    for b in [48, 49, 50, 66, 70] {
        assert_eq!(stage.locate(b), Location::Disk(b));
        assert_eq!(read(&device, b, 1).await, blocks(b, 1, b as u8));
    }
    // One extent (16 blocks × 4 ranges = 64 blocks per extent): 48-50 in extent 0, 66 and 70
    // in extent 1: two batches; 48-50 merge into one request.
    assert_eq!(report.batches, 2);
    assert_eq!(report.requests, 3);
    assert_consistent(&stage);
}

#[tokio::test]
async fn the_full_trigger_destages_when_the_log_has_no_room() {
    let config = config("full");
    let stage = format(memory(fast_size(16)), memory(4 << 20), &config).await;
    let device = StageDevice(stage.clone());
    for round in 0..3u8 {
        for b in 0..20 {
            write(&device, b * 3, blocks(b * 3, 1, round)).await;
        }
    }
    assert!(counter(&stage, "destages") >= 3, "{:?}", stage.counters());
    assert!(counter(&stage, "log full waits") >= 3);
    for b in 0..20 {
        assert_eq!(read(&device, b * 3, 1).await, blocks(b * 3, 1, 2));
    }
    assert_consistent(&stage);
}

#[tokio::test]
async fn the_density_trigger_destages_four_dense_extents_together() {
    let config = config("density"); // 8 blocks
    let stage = format(memory(fast_size(128)), memory(4 << 20), &config).await;
    let device = StageDevice(stage.clone());
    let extent_blocks = (256 << 10) / BLOCK;
    // Extent 9 gets one block: not dense, stays.
    write(&device, 9 * extent_blocks, blocks(9 * extent_blocks, 1, 7)).await;
    // Extents 0-3 fill up to 8 staged blocks each, in turn; the last block makes the fourth
    // dense extent, and the four go in one destage.
    for i in 0..8 {
        for e in 0..4 {
            assert_eq!(counter(&stage, "destages"), 0, "before {e}/{i}");
            let b = e * extent_blocks + i * 2;
            write(&device, b, blocks(b, 1, 7)).await;
        }
    }
    assert_eq!(counter(&stage, "destages"), 1);
    assert_eq!(counter(&stage, "destaged blocks"), 32);
    assert_eq!(counter(&stage, "batches"), 4);
    assert_eq!(stage.log_usage().unwrap().0, 1, "extent 9's block stays");
    assert!(matches!(stage.locate(9 * extent_blocks), Location::Log(_)));
    for e in 0..4 {
        for i in 0..8 {
            let b = e * extent_blocks + i * 2;
            assert_eq!(read(&device, b, 1).await, blocks(b, 1, 7));
        }
    }
    assert_consistent(&stage);
}

#[tokio::test]
async fn the_density_trigger_destages_a_lone_dense_extent_once_the_log_is_seven_eighths_full() {
    let config = config("density"); // 8 blocks
    let stage = format(memory(fast_size(64)), memory(4 << 20), &config).await;
    let device = StageDevice(stage.clone());
    let extent_blocks = (256 << 10) / BLOCK;
    let lone = 15 * extent_blocks + 6;
    write(&device, lone, blocks(lone, 1, 8)).await;
    for b in 0..8 {
        write(&device, b * 2, blocks(b * 2, 1, 7)).await;
    }
    // One dense extent of two staged, the log an eighth full: it waits for company.
    assert_eq!(counter(&stage, "destages"), 0);
    // Sparse blocks (at most 7 per extent) in extents 1-15 up to 55 of 64 slots: still waits.
    let sparse: Vec<u64> = (0..46)
        .map(|i| (1 + i % 15) * extent_blocks + i / 15)
        .collect();
    for &b in &sparse {
        write(&device, b, blocks(b, 1, 8)).await;
    }
    assert_eq!(stage.log_usage().unwrap().0, 55);
    assert_eq!(counter(&stage, "destages"), 0);
    // The 56th slot: 7/8 full, the dense extent goes alone.
    write(
        &device,
        15 * extent_blocks + 5,
        blocks(15 * extent_blocks + 5, 1, 8),
    )
    .await;
    assert_eq!(counter(&stage, "destages"), 1);
    assert_eq!(counter(&stage, "destaged blocks"), 8);
    assert_eq!(stage.log_usage().unwrap().0, 48);
    for b in 0..8 {
        assert_eq!(read(&device, b * 2, 1).await, blocks(b * 2, 1, 7));
    }
    assert_consistent(&stage);
}

#[tokio::test]
async fn the_watermark_trigger_starts_at_high_and_stops_at_low() {
    let mut config = config("watermark");
    config.high = 50;
    config.low = 25;
    let stage = format(memory(fast_size(64)), memory(4 << 20), &config).await;
    let device = StageDevice(stage.clone());
    // 31 blocks over four extents (64 blocks each): below 50 % of 64 slots.
    let targets: Vec<u64> = (0..31).map(|i| (i % 4) * 64 + i / 4).collect();
    for &b in &targets {
        write(&device, b, blocks(b, 1, 3)).await;
    }
    assert_eq!(counter(&stage, "destages"), 0);
    write(&device, 200, blocks(200, 1, 3)).await; // 32 = 50 %
                                                  // Down to 25 % (16 blocks) in slices of an eighth of the log (8 slots), densest extent
                                                  // first: the two extents of 8 staged blocks, one destage each.
    assert_eq!(counter(&stage, "destages"), 2);
    let backlog = stage.log_usage().unwrap().0;
    assert_eq!(backlog, 16, "stopped at {backlog}, not at the low mark");
    // Below high again: the next write does not destage.
    write(&device, 201, blocks(201, 1, 3)).await;
    assert_eq!(counter(&stage, "destages"), 2);
    for &b in targets.iter().chain([200, 201].iter()) {
        assert_eq!(read(&device, b, 1).await, blocks(b, 1, 3));
    }
    assert_consistent(&stage);
}

#[tokio::test]
async fn a_failed_fast_child_fails_reads_of_staged_data_loudly() {
    let config = config("full");
    let group = CrashGroup::new();
    let fast = group.disk(strata_crash::sector_disk(fast_size(64)));
    let fast_ref: DeviceRef = Arc::new(fast.clone());
    let stage = format(fast_ref, memory(4 << 20), &config).await;
    let device = StageDevice(stage.clone());
    write(&device, 0, blocks(0, 8, 1)).await; // direct
    write(&device, 20, blocks(20, 1, 2)).await; // staged
    assert_eq!(SECTOR, 512);
    fast.fail_reads(METADATA, 64 * BLOCK);
    let error = device.read(20 * BLOCK, BLOCK as usize).await.unwrap_err();
    assert_eq!(error.errno(), 5, "EIO, not zeros or stale data: {error}");
    // Data on the slow child still reads.
    assert_eq!(read(&device, 0, 8).await, blocks(0, 8, 1));
    let status = stage.describe().await.unwrap();
    assert_eq!(status.health, Health::Failed);
    let fast_line = status
        .detail
        .iter()
        .find(|(k, _)| k == "fast child")
        .unwrap();
    assert!(fast_line.1.contains("read of staged data"), "{fast_line:?}");
}

#[tokio::test]
async fn a_destage_whose_slow_writes_fail_keeps_every_block_in_the_log_and_retries() {
    // Twelve extents staged: more than a destage has in flight at once, so batches are
    // running when the first one fails and others have not started.
    let config = config("full");
    let group = CrashGroup::new();
    let slow = group.disk(strata_crash::sector_disk(4 << 20));
    let slow_ref: DeviceRef = Arc::new(slow.clone());
    let stage = format(memory(fast_size(64)), slow_ref, &config).await;
    let device = StageDevice(stage.clone());
    let extent_blocks = (256 << 10) / BLOCK;
    let staged: Vec<u64> = (0..12).map(|e| e * extent_blocks + 5).collect();
    for &b in &staged {
        write(&device, b, blocks(b, 1, 7)).await;
        write(&device, b + 2, blocks(b + 2, 1, 8)).await;
    }
    slow.fail_writes(0, 4 << 20);
    let error = stage.destage_all().await.unwrap_err();
    assert_eq!(error.errno(), 5, "{error}");
    assert_eq!(counter(&stage, "destage failures"), 1);
    assert_eq!(stage.log_usage().unwrap().0, 24, "every block still staged");
    for &b in &staged {
        assert_eq!(
            read(&device, b, 3).await[..],
            {
                let mut want = blocks(b, 1, 7);
                want.extend(vec![0; BLOCK as usize]);
                want.extend(blocks(b + 2, 1, 8));
                want
            }[..]
        );
    }
    assert_consistent(&stage);

    slow.clear_faults();
    let report = stage.destage_all().await.unwrap();
    assert_eq!((report.blocks, report.batches), (24, 12));
    assert_eq!(stage.log_usage().unwrap().0, 0);
    for &b in &staged {
        assert_eq!(read(&device, b, 1).await, blocks(b, 1, 7));
        assert_eq!(read(&device, b + 2, 1).await, blocks(b + 2, 1, 8));
    }
    assert_consistent(&stage);
}

#[tokio::test]
async fn status_shows_trigger_log_backlog_and_counters() {
    let config = config("density");
    let stage = format(memory(fast_size(64)), memory(4 << 20), &config).await;
    let device = StageDevice(stage.clone());
    write(&device, 3, blocks(3, 1, 1)).await;
    let status = stage.describe().await.unwrap();
    let detail = |key: &str| {
        status
            .detail
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no {key} in {:?}", status.detail))
            .1
            .clone()
    };
    assert_eq!(status.kind, "stage");
    assert_eq!(status.health, Health::Ok);
    assert!(detail("trigger").starts_with("density (8 blocks"));
    assert!(
        detail("log").starts_with("1 of 64 slots busy"),
        "{}",
        detail("log")
    );
    assert_eq!(detail("backlog"), "1 blocks staged in 1 extents");
    assert_eq!(detail("staged writes"), "1");
    assert_eq!(
        status.children.len(),
        2,
        "fast and slow children described inside"
    );
}

/// The paper's workload at small scale (§5.2): extents filled serially to 89 %, random 4 KiB
/// updates staged in a log of 1 % of the capacity, destaged whenever it fills. Over 99 % of
/// destaged blocks must land in their home range (§9 C.12).
#[tokio::test]
async fn the_papers_workload_keeps_destaged_blocks_in_their_home_range() {
    let mut config = config("full");
    config.range = strata_core::ByteSize(1 << 20);
    config.extent = strata_core::ByteSize(16 << 20);
    config.threshold = strata_core::ByteSize(168 << 10);
    config.window = 100;
    let slow_size = 64u64 << 20; // four 16 MiB extents
    let slots = slow_size / BLOCK / 100; // 1 %
    let stage = format(memory(fast_size(slots)), memory(slow_size), &config).await;
    let device = StageDevice(stage.clone());
    let filled = slow_size / BLOCK * 89 / 100;
    let chunk = 256; // 1 MiB direct writes
    for first in (0..filled).step_by(chunk as usize) {
        let n = chunk.min(filled - first);
        if n * BLOCK < (168 << 10) {
            break;
        }
        write(&device, first, vec![1; (n * BLOCK) as usize]).await;
    }
    let mut state = 0x9e3779b97f4a7c15u64;
    for _ in 0..4 * 2000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let block = state % (filled / 256 * 256);
        write(&device, block, block_data(block, 2)).await;
    }
    stage.destage_all().await.unwrap();
    eprintln!("paper workload: {:?}", stage.counters());
    let home_range = counter(&stage, "placed in home range");
    let destaged = counter(&stage, "destaged blocks");
    assert!(destaged > 7000, "{:?}", stage.counters());
    assert!(
        home_range * 100 > destaged * 99,
        "{home_range} of {destaged} in their home range: {:?}",
        stage.counters()
    );
    assert_eq!(counter(&stage, "placed outside window"), 0);
    assert_consistent(&stage);
}

/// A slow child that takes at most 8 KiB per request, and remembers the largest it was given.
struct SmallRequests {
    inner: MemoryDevice,
    largest: std::sync::atomic::AtomicUsize,
}

#[strata_core::async_trait]
impl BlockDevice for SmallRequests {
    fn geometry(&self) -> strata_core::Geometry {
        strata_core::Geometry {
            max_io: 8192,
            ..self.inner.geometry()
        }
    }
    fn capabilities(&self) -> strata_core::Capabilities {
        self.inner.capabilities()
    }
    async fn read(&self, offset: u64, len: usize) -> strata_core::Result<bytes::BytesMut> {
        self.largest
            .fetch_max(len, std::sync::atomic::Ordering::Relaxed);
        self.inner.read(offset, len).await
    }
    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> strata_core::Result<()> {
        self.largest
            .fetch_max(data.len(), std::sync::atomic::Ordering::Relaxed);
        self.inner.write(offset, data, flags).await
    }
    async fn flush(&self) -> strata_core::Result<()> {
        self.inner.flush().await
    }
}

#[tokio::test]
async fn a_destage_run_longer_than_the_slow_child_takes_is_cut_into_requests_it_takes() {
    let config = config("full");
    let slow = Arc::new(SmallRequests {
        inner: MemoryDevice::new(4 << 20),
        largest: Default::default(),
    });
    let stage = format(memory(fast_size(64)), slow.clone(), &config).await;
    let device = StageDevice(stage.clone());
    assert_eq!(
        device.geometry().max_io,
        8192,
        "the stage passes the limit up"
    );
    for b in 0..5 {
        write(&device, b, blocks(b, 1, 4)).await; // five consecutive homes: one run
    }
    let report = stage.destage_all().await.unwrap();
    assert_eq!(report.requests, 1, "planned as one run");
    assert_eq!(
        slow.largest.load(std::sync::atomic::Ordering::Relaxed),
        8192
    );
    assert_eq!(read(&device, 0, 2).await, blocks(0, 2, 4));
    assert_eq!(read(&device, 2, 2).await, blocks(2, 2, 4));
    assert_eq!(read(&device, 4, 1).await, blocks(4, 1, 4));
}

/// Random updates cost the metadata store a `moved` and a `reverse` record each (the
/// `moved` ones sparse); when the store fills before the log does, a write destages
/// everything (which drops those records: the blocks go back home) and goes on, rather than
/// failing. The volume is written serially first, as the paper's aged volume is, so that
/// the blocks' homes already exist.
#[tokio::test]
async fn a_full_metadata_store_starts_a_destage_instead_of_refusing_writes() {
    let config = config("full");
    let spacing = 8; // updated blocks per page of 64 `moved` records: 8
    let updates = 24_000u64;
    let volume = updates * spacing * BLOCK;
    let (fast, slow) = (memory(fast_size(updates)), memory(volume));
    let stage = format(fast.clone(), slow.clone(), &config).await;
    let device = StageDevice(stage.clone());
    let chunk = 1 << 20;
    for at in (0..volume).step_by(chunk) {
        let data = Bytes::from(vec![7u8; chunk]);
        device.write(at, data, WriteFlags::default()).await.unwrap();
    }
    assert_eq!(counter(&stage, "staged writes"), 0);
    for i in 0..updates {
        let block = i * spacing;
        write(&device, block, block_data(block, 1)).await;
    }
    assert!(
        counter(&stage, "metadata full destages") >= 1,
        "{:?} {:?}",
        stage.counters(),
        stage.store().space()
    );
    assert_eq!(counter(&stage, "log full waits"), 0, "the log never filled");
    assert_consistent(&stage);
    device.flush().await.unwrap();
    drop(device);
    drop(stage);
    let stage = reopen(fast, slow, &config).await;
    let device = StageDevice(stage);
    for i in (0..updates).step_by(97) {
        let block = i * spacing;
        assert_eq!(
            read(&device, block, 1).await,
            block_data(block, 1),
            "block {block}"
        );
        assert_eq!(read(&device, block + 1, 1).await, vec![7u8; BLOCK as usize]);
    }
}

/// Many more writers than a tiny log holds, all at once: each waits its turn for a destage
/// to make room, and none is refused (an overload makes writers wait, never fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_overloading_a_full_log_all_wait_their_turn_and_none_fails() {
    let config = config("full");
    let stage = format(memory(fast_size(16)), memory(16 << 20), &config).await;
    let device = Arc::new(StageDevice(stage.clone()));
    let writers: Vec<_> = (0..64u64)
        .map(|w| {
            let device = device.clone();
            tokio::spawn(async move {
                for round in 0..20u64 {
                    let block = (w * 37 + round * 101) % 4092;
                    let count = 1 + (w + round) % 4;
                    let data = (block..block + count)
                        .flat_map(|b| block_data(b, w as u8))
                        .collect::<Vec<u8>>();
                    device
                        .write(block * BLOCK, Bytes::from(data), WriteFlags::default())
                        .await
                        .unwrap_or_else(|e| panic!("writer {w}, round {round}: {e}"));
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    assert!(counter(&stage, "log full waits") > 0);
    assert!(counter(&stage, "destages") > 0);
    assert_consistent(&stage);
}

/// A discard makes its blocks unwritten wherever they lived (the log, their home, off home):
/// they read as zeros, their log slots and slow-child blocks are free once it is flushed,
/// the neighbours are untouched, and all of it holds after a reopen.
#[tokio::test]
async fn a_discard_unmaps_staged_and_destaged_blocks_and_frees_their_places() {
    let config = config("full");
    let (fast, slow) = (memory(fast_size(64)), memory(4 << 20));
    let stage = format(fast.clone(), slow.clone(), &config).await;
    let device = StageDevice(stage.clone());
    write(&device, 0, blocks(0, 32, 1)).await; // direct: at home
    for b in [3, 5, 40, 41] {
        write(&device, b, blocks(b, 1, 2)).await; // staged
    }
    stage.destage_all().await.unwrap();
    for b in [5, 7, 41, 42] {
        write(&device, b, blocks(b, 1, 3)).await; // staged again, over destaged blocks
    }
    device.flush().await.unwrap();
    let (staged, _) = stage.log_usage().unwrap();
    assert_eq!(staged, 4);

    device.discard(4 * BLOCK, 40 * BLOCK).await.unwrap(); // blocks 4..44
    device.flush().await.unwrap();
    assert_eq!(read(&device, 4, 40).await, vec![0u8; 40 * BLOCK as usize]);
    assert_eq!(read(&device, 3, 1).await, blocks(3, 1, 2));
    assert_eq!(read(&device, 0, 3).await, blocks(0, 3, 1));
    assert_eq!(
        stage.log_usage().unwrap().0,
        0,
        "the staged blocks in the range are gone"
    );
    // Live in 4..44: 26 blocks at home (4..32 but 5 and 7), 40 at home, and 5, 7, 41, 42 in
    // the log.
    assert_eq!(counter(&stage, "unmapped blocks"), 26 + 1 + 4);
    // Only blocks 0..4 still live on the slow child (the frees are reclaimed by a destage's
    // bookkeeping once durable).
    stage.destage_all().await.unwrap();
    let described = stage.describe().await.unwrap();
    assert_eq!(detail(&described, "slow child free blocks"), 1024 - 4);
    assert_consistent(&stage);

    // Write-zeroes that may trim does the same; one that may not writes zeros.
    let trim = strata_core::ZeroFlags {
        may_trim: true,
        ..Default::default()
    };
    device.write_zeroes(0, BLOCK, trim).await.unwrap();
    device
        .write_zeroes(BLOCK, BLOCK, strata_core::ZeroFlags::default())
        .await
        .unwrap();
    assert_eq!(read(&device, 0, 2).await, vec![0u8; 2 * BLOCK as usize]);
    assert_eq!(counter(&stage, "unmapped blocks"), 26 + 1 + 4 + 1);
    device.flush().await.unwrap();
    drop(device);
    drop(stage);
    let stage = reopen(fast, slow, &config).await;
    let device = StageDevice(stage);
    assert_eq!(read(&device, 0, 2).await, vec![0u8; 2 * BLOCK as usize]);
    assert_eq!(read(&device, 3, 1).await, blocks(3, 1, 2));
    assert_eq!(read(&device, 4, 40).await, vec![0u8; 40 * BLOCK as usize]);
    // The places are reusable: the whole device written again, then discarded whole.
    let size = device.geometry().size;
    device
        .write(
            0,
            Bytes::from(vec![9u8; size as usize]),
            WriteFlags::default(),
        )
        .await
        .unwrap();
    device.discard(0, size).await.unwrap();
    assert_eq!(
        read(&device, 0, size / BLOCK).await,
        vec![0u8; size as usize]
    );
    assert_consistent(&device.0);
}

fn detail(node: &strata_core::NodeStatus, key: &str) -> u64 {
    node.detail
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key:?} in {:?}", node.detail))
        .1
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Block status: blocks never written or unmapped are holes, staged and destaged ones
/// data, in maximal runs; an answer covers at most 16 MiB.
#[tokio::test]
async fn block_status_reports_unwritten_blocks_as_holes() {
    use strata_core::{Extent, ExtentState};
    let config = config("full");
    let stage = format(memory(fast_size(64)), memory(32 << 20), &config).await;
    let device = StageDevice(stage.clone());
    write(&device, 16, blocks(16, 16, 1)).await; // direct, blocks 16..32
    write(&device, 40, blocks(40, 2, 2)).await; // staged
    device.discard(20 * BLOCK, 4 * BLOCK).await.unwrap(); // 20..24
    let extent = |start: u64, end: u64, state| Extent {
        offset: start * BLOCK,
        len: (end - start) * BLOCK,
        state,
    };
    use ExtentState::{Data, Hole};
    assert_eq!(
        device.block_status(0, 64 * BLOCK).await.unwrap(),
        vec![
            extent(0, 16, Hole),
            extent(16, 20, Data),
            extent(20, 24, Hole),
            extent(24, 32, Data),
            extent(32, 40, Hole),
            extent(40, 42, Data),
            extent(42, 64, Hole),
        ]
    );
    stage.destage_all().await.unwrap();
    let after = device.block_status(36 * BLOCK, 8 * BLOCK).await.unwrap();
    assert_eq!(
        after,
        vec![
            extent(36, 40, Hole),
            extent(40, 42, Data),
            extent(42, 44, Hole)
        ]
    );
    let whole = device.block_status(0, 32 << 20).await.unwrap();
    let covered: u64 = whole.iter().map(|e| e.len).sum();
    assert_eq!(covered, 16 << 20, "one answer covers 16 MiB");
    assert_eq!(whole.last().unwrap().state, Hole);
}

/// Found by `strata sim explore` (issue 18, seed 4 run 470): on a stage whose every block had
/// been written (a raid5 above zeroes its members whole), a large write over blocks that were
/// in the log needed fresh places on the slow child, and the only free ones were the places
/// the staged writes had freed, not yet durable. The write failed with NoSpace, and the raid5
/// above failed the stage as a member. It must commit and use them.
#[tokio::test]
async fn a_large_write_over_staged_blocks_of_a_full_stage_commits_to_find_room() {
    let config = config("full");
    let slow = memory(1 << 20);
    let stage = format(memory(fast_size(64)), slow, &config).await;
    let device = StageDevice(stage.clone());
    let blocks_total = device.geometry().size / BLOCK;
    // Every block written directly: the slow child has no free block left.
    for first in (0..blocks_total).step_by(8) {
        write(&device, first, blocks(first, 8, 0x11)).await;
    }
    // Four staged overwrites: their old places are freed, once that is durable.
    for block in [8, 9, 10, 11] {
        write(&device, block, blocks(block, 1, 0x22)).await;
        assert!(matches!(stage.locate(block), Location::Log(_)));
    }
    // A direct write over them must find places for them.
    write(&device, 8, blocks(8, 8, 0x33)).await;
    assert_eq!(read(&device, 8, 8).await, blocks(8, 8, 0x33));
    for block in [8, 9, 10, 11] {
        assert!(
            matches!(stage.locate(block), Location::Disk(_)),
            "{:?}",
            stage.locate(block)
        );
    }
    assert_consistent(&stage);
}
