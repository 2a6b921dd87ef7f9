//! What the layer does, request by request, with response times the tests set: first-write
//! allocation (STR, SEQ), migration on read and on write in both directions, the δ rule,
//! the baselines, tokens, the candidate list, the merger, the spare-slot rule, status.

use std::sync::Arc;
use std::time::Duration;

use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_migrate::{Migrate, MigrateConfig, MigrateDevice};

use crate::common::*;

struct Rig {
    clock: Arc<ManualClock>,
    timed: Vec<Arc<Timed>>,
    layer: Arc<Migrate>,
    device: MigrateDevice,
}

impl Rig {
    /// Child 0 with 16 slots, the others with `slots` each, at these latencies.
    async fn new(config: &MigrateConfig, latencies_us: &[u64], slots: u64) -> Rig {
        let clock = ManualClock::new();
        let timed: Vec<Arc<Timed>> = latencies_us
            .iter()
            .enumerate()
            .map(|(i, &latency)| {
                let size = if i == 0 {
                    local_size(16)
                } else {
                    slots * CHUNK
                };
                let memory: DeviceRef = Arc::new(MemoryDevice::new(size));
                Timed::new(memory, &clock, latency)
            })
            .collect();
        let children: Vec<DeviceRef> = timed.iter().map(|t| t.clone() as DeviceRef).collect();
        let layer = format(children, config, &clock).await;
        let device = MigrateDevice(layer.clone());
        Rig {
            clock,
            timed,
            layer,
            device,
        }
    }

    async fn write(&self, block: u64, count: u64, byte: u8) {
        self.device
            .write(
                block * BLOCK,
                blocks_data(block, count, byte),
                WriteFlags::default(),
            )
            .await
            .unwrap();
    }

    /// Reads and checks the blocks, then waits for the migration the read may have handed
    /// to the background to land (or be dropped): the tests look at the map after it.
    async fn read_check(&self, block: u64, count: u64, byte: u8) {
        let got = self
            .device
            .read(block * BLOCK, (count * BLOCK) as usize)
            .await
            .unwrap();
        assert!(
            got[..] == blocks_data(block, count, byte)[..],
            "blocks {block}+{count}"
        );
        self.layer.settle().await;
    }

    fn device_of(&self, block: u64) -> usize {
        self.layer.locate(block).expect("written").0
    }
}

fn chunk(c: u64) -> u64 {
    c * CHUNK_BLOCKS
}

#[tokio::test]
async fn striping_round_robins_chunks_from_child_zero_and_sequential_fills_it_first() {
    let rig = Rig::new(&config("str", "nomig", "0"), &[0, 0, 0], 16).await;
    for c in 0..6 {
        rig.write(chunk(c), 1, 1).await;
    }
    let devices: Vec<usize> = (0..6).map(|c| rig.device_of(chunk(c))).collect();
    assert_eq!(devices, [0, 1, 2, 0, 1, 2]);

    let rig = Rig::new(&config("seq", "nomig", "0"), &[0, 0], 16).await;
    for c in 0..18 {
        rig.write(chunk(c), 1, 1).await;
    }
    let devices: Vec<usize> = (0..18).map(|c| rig.device_of(chunk(c))).collect();
    assert_eq!(devices[..16], [0; 16]);
    assert_eq!(devices[16..], [1, 1]);
}

#[tokio::test]
async fn a_read_from_the_slow_remote_moves_it_local_without_reading_the_remote_again() {
    let rig = Rig::new(&config("str", "mig", "2ms"), &[1000, 10000], 16).await;
    rig.write(chunk(0), 4, 1).await; // child 0
    rig.write(chunk(1), 4, 2).await; // child 1
    assert_eq!(rig.device_of(chunk(1)), 1);
    let (reads, writes) = (rig.timed[1].reads(), rig.timed[1].writes());
    rig.read_check(chunk(1), 4, 2).await;
    // One read of the source, nothing more: the data read is what is written locally.
    assert_eq!(rig.timed[1].reads() - reads, 1);
    assert_eq!(rig.timed[1].writes(), writes);
    assert!((0..4).all(|i| rig.device_of(chunk(1) + i) == 0));
    assert_eq!(counter(&rig.layer, "migrations"), 1);
    assert_eq!(counter(&rig.layer, "read migrations"), 1);
    assert_eq!(
        rig.layer.entry(1).locations[1],
        None,
        "the whole chunk moved"
    );
    // Served locally from now on.
    let reads = rig.timed[1].reads();
    rig.read_check(chunk(1), 4, 2).await;
    assert_eq!(rig.timed[1].reads(), reads);
    assert_invariants(&rig.layer);
    // And durable across a reopen once flushed.
    rig.device.flush().await.unwrap();
    let children: Vec<DeviceRef> = rig.timed.iter().map(|t| t.clone() as DeviceRef).collect();
    let reopened = reopen(children, &config("str", "mig", "2ms"), &rig.clock).await;
    assert_eq!(reopened.locate(chunk(1)).unwrap().0, 0);
    let got = MigrateDevice(reopened)
        .read(chunk(1) * BLOCK, (4 * BLOCK) as usize)
        .await
        .unwrap();
    assert!(got[..] == blocks_data(chunk(1), 4, 2)[..]);
}

#[tokio::test]
async fn a_write_to_data_on_the_slow_child_goes_to_the_fast_one_and_a_merge_rejoins_the_chunk() {
    let rig = Rig::new(&config("str", "mig", "2ms"), &[1000, 10000], 16).await;
    rig.write(chunk(0), 1, 1).await;
    rig.write(chunk(1), 4, 2).await;
    let writes = rig.timed[1].writes();
    rig.write(chunk(1), 1, 3).await; // block 0 of chunk 1 only
    assert_eq!(
        rig.timed[1].writes(),
        writes,
        "the slow child is not written"
    );
    assert_eq!(rig.device_of(chunk(1)), 0);
    assert_eq!(rig.device_of(chunk(1) + 1), 1);
    assert_eq!(rig.layer.partial_chunks(), 1);
    assert_eq!(counter(&rig.layer, "write migrations"), 1);
    assert_invariants(&rig.layer);
    // The merger brings it back to one place (the majority: 3 blocks on child 1).
    assert_eq!(rig.layer.merge_partial(10, true).await.unwrap(), 1);
    assert_eq!(rig.layer.partial_chunks(), 0);
    assert!((0..4).all(|i| rig.device_of(chunk(1) + i) == 1));
    rig.read_check(chunk(1), 1, 3).await;
    rig.read_check(chunk(1) + 1, 3, 2).await;
    assert_eq!(counter(&rig.layer, "merges"), 1);
    assert_invariants(&rig.layer);
}

#[tokio::test]
async fn the_background_merger_skips_chunks_still_in_the_candidate_list() {
    let mut cfg = config("str", "mig", "2ms");
    cfg.candidate_probability = 1.0;
    let rig = Rig::new(&cfg, &[1000, 10000], 16).await;
    rig.write(chunk(0), 1, 1).await;
    rig.write(chunk(1), 4, 2).await;
    rig.write(chunk(1), 1, 3).await; // listed, and partial
    assert_eq!(rig.layer.partial_chunks(), 1);
    assert_eq!(rig.layer.merge_partial(10, false).await.unwrap(), 0);
    assert_eq!(rig.layer.partial_chunks(), 1);
}

#[tokio::test]
async fn data_moves_off_a_slow_local_child_too() {
    // SEQ-MIG's case: everything local, the local disk overloaded.
    let rig = Rig::new(&config("seq", "mig", "5ms"), &[20000, 2000], 16).await;
    rig.write(chunk(0), 4, 1).await;
    rig.write(chunk(1), 4, 2).await;
    assert_eq!(rig.device_of(chunk(1)), 0);
    rig.read_check(chunk(1), 4, 2).await;
    assert_eq!(rig.device_of(chunk(1)), 1);
    assert_eq!(counter(&rig.layer, "migrations to child 1"), 1);
}

#[tokio::test]
async fn within_delta_nothing_moves() {
    let rig = Rig::new(&config("str", "mig", "5ms"), &[1000, 3000], 16).await;
    rig.write(chunk(0), 4, 1).await;
    rig.write(chunk(1), 4, 2).await;
    for _ in 0..10 {
        rig.read_check(chunk(1), 4, 2).await;
    }
    assert_eq!(rig.device_of(chunk(1)), 1);
    assert_eq!(counter(&rig.layer, "migrations"), 0);
}

#[tokio::test]
async fn the_destination_is_the_fastest_of_three() {
    let rig = Rig::new(&config("str", "mig", "1ms"), &[9000, 3000, 20000], 16).await;
    for c in 0..3 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    rig.read_check(chunk(2), 4, 2).await;
    assert_eq!(rig.device_of(chunk(2)), 1);
    rig.read_check(chunk(0), 4, 0).await;
    assert_eq!(rig.device_of(chunk(0)), 1);
    // Status says from where: one move from child 2 and one from child 0, both to child 1.
    let status = rig.layer.describe().await.unwrap();
    let pairs: Vec<(String, String)> = status
        .detail
        .into_iter()
        .filter(|(k, _)| k.starts_with("migrations child "))
        .collect();
    let expected = [
        ("0 to child 1", "1"),
        ("0 to child 2", "0"),
        ("1 to child 0", "0"),
        ("1 to child 2", "0"),
        ("2 to child 0", "0"),
        ("2 to child 1", "1"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, v)| (format!("migrations child {k}"), v.to_string()))
        .collect();
    assert_eq!(pairs, expected);
}

#[tokio::test]
async fn nomig_never_migrates() {
    let rig = Rig::new(&config("str", "nomig", "0"), &[1000, 50000], 16).await;
    for c in 0..4 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    for round in 0..5u8 {
        for c in 0..4 {
            rig.read_check(chunk(c), 4, c as u8 + round).await;
            rig.write(chunk(c), 4, c as u8 + round + 1).await;
        }
    }
    assert_eq!(counter(&rig.layer, "migrations"), 0);
    let devices: Vec<usize> = (0..4).map(|c| rig.device_of(chunk(c))).collect();
    assert_eq!(devices, [0, 1, 0, 1]);
}

#[tokio::test]
async fn locality_always_moves_toward_child_zero_even_when_it_is_slower() {
    let rig = Rig::new(&config("str", "locality", "0"), &[50000, 1000, 1000], 16).await;
    for c in 0..3 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    rig.read_check(chunk(1), 4, 1).await;
    rig.write(chunk(2), 2, 9).await;
    assert_eq!(rig.device_of(chunk(1)), 0);
    assert_eq!(rig.device_of(chunk(2)), 0);
    assert_eq!(
        rig.device_of(chunk(2) + 2),
        2,
        "only the accessed blocks moved"
    );
    // Data on child 0 stays there, however slow.
    rig.read_check(chunk(0), 4, 0).await;
    assert_eq!(rig.device_of(chunk(0)), 0);
    assert_eq!(counter(&rig.layer, "migrations"), 2);
}

#[tokio::test]
async fn tokens_limit_migrations_per_second() {
    let mut cfg = config("str", "mig", "1ms");
    cfg.tokens = 1;
    cfg.token_cap = Some(1);
    let rig = Rig::new(&cfg, &[1000, 10000], 16).await;
    for c in 0..6 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    for c in [1, 3, 5] {
        rig.read_check(chunk(c), 4, c as u8).await;
    }
    assert_eq!(
        counter(&rig.layer, "migrations"),
        1,
        "one token in the bucket"
    );
    assert_eq!(counter(&rig.layer, "skipped no token"), 2);
    rig.clock.advance(Duration::from_secs(1));
    rig.read_check(chunk(3), 4, 3).await;
    rig.read_check(chunk(5), 4, 5).await;
    assert_eq!(
        counter(&rig.layer, "migrations"),
        2,
        "one more a second later"
    );
}

#[tokio::test]
async fn only_candidates_migrate() {
    let mut cfg = config("str", "mig", "1ms");
    cfg.candidate_probability = 0.0;
    let rig = Rig::new(&cfg, &[1000, 10000], 16).await;
    rig.write(chunk(0), 4, 0).await;
    rig.write(chunk(1), 4, 1).await;
    for _ in 0..20 {
        rig.read_check(chunk(1), 4, 1).await;
    }
    assert_eq!(counter(&rig.layer, "migrations"), 0);
    assert_eq!(counter(&rig.layer, "skipped not candidate"), 20);
}

/// SEQ over a 16-slot child 0 and a 16-slot child 1: 28 logical chunks. With 16 written
/// (all on child 0), 12 are unwritten and 16 slots free: a migration may take a slot only
/// while more than 12 stay free, so the unwritten chunks always find one.
#[tokio::test]
async fn migrations_never_take_the_slots_unwritten_chunks_need() {
    let rig = Rig::new(&config("seq", "mig", "1ms"), &[20000, 1000], 16).await;
    for c in 0..16 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    for c in 0..16 {
        rig.read_check(chunk(c), 4, c as u8).await;
    }
    assert_eq!(counter(&rig.layer, "migrations"), 4);
    for c in 16..28 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    for c in 0..28 {
        rig.read_check(chunk(c), 4, c as u8).await;
    }
    assert_invariants(&rig.layer);
}

#[tokio::test]
async fn a_discarded_chunk_frees_its_slot_once_durable_and_reads_zeros() {
    let rig = Rig::new(&config("seq", "nomig", "0"), &[0, 0], 16).await;
    rig.write(chunk(0), 4, 1).await;
    rig.device.flush().await.unwrap();
    rig.device.discard(0, CHUNK).await.unwrap();
    let zeros = rig.device.read(0, CHUNK as usize).await.unwrap();
    assert!(zeros.iter().all(|&b| b == 0));
    assert!(rig.layer.entry(0).is_empty());
    // The slot waits for the commit, then is taken again by the next first write.
    rig.write(chunk(1), 1, 2).await;
    assert_eq!(rig.layer.entry(1).locations[0].unwrap().slot, 1);
    rig.device.flush().await.unwrap();
    rig.write(chunk(2), 1, 3).await;
    assert_eq!(rig.layer.entry(2).locations[0].unwrap().slot, 0);
    assert_invariants(&rig.layer);
}

#[tokio::test]
async fn status_shows_response_times_delta_where_the_data_is_and_migrations() {
    let rig = Rig::new(&config("str", "mig", "2ms"), &[1000, 10000], 16).await;
    rig.write(chunk(0), 4, 0).await;
    rig.write(chunk(1), 4, 1).await;
    rig.read_check(chunk(1), 2, 1).await;
    let status = rig.layer.describe().await.unwrap();
    let get = |key: &str| {
        status
            .detail
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no {key:?} in {:?}", status.detail))
            .1
            .clone()
    };
    assert_eq!(get("policy"), "mig");
    assert_eq!(get("delta"), "fixed 2.00 ms");
    assert!(
        get("child 1 response").starts_with("10.00 ms"),
        "{}",
        get("child 1 response")
    );
    assert_eq!(get("child 0 blocks"), "6");
    assert_eq!(get("child 1 blocks"), "2");
    assert_eq!(get("migrations"), "1");
    assert_eq!(get("partial chunks"), "1");
    assert!(get("migrations per second").parse::<f64>().unwrap() > 0.0);
}

#[tokio::test]
async fn an_unmeasured_child_is_tried_once_then_judged_by_its_measurements() {
    let rig = Rig::new(&config("str", "mig", "adaptive"), &[1000, 10000], 16).await;
    rig.write(chunk(0), 1, 0).await;
    // Child 1 was never used: it counts as 0 ms, so the first read moves the block there,
    // which measures it (10 ms); the next read brings the block back.
    rig.read_check(chunk(0), 1, 0).await;
    assert_eq!(rig.device_of(chunk(0)), 1);
    rig.read_check(chunk(0), 1, 0).await;
    assert_eq!(rig.device_of(chunk(0)), 0);
    assert_eq!(counter(&rig.layer, "migrations"), 2);
}

#[tokio::test]
async fn adaptive_delta_is_computed_from_the_measured_deviations() {
    let rig = Rig::new(&config("str", "mig", "adaptive"), &[1000, 10000], 16).await;
    rig.write(chunk(0), 1, 0).await;
    for _ in 0..50 {
        rig.read_check(chunk(0), 1, 0).await;
    }
    // Steady latencies: both deviations decay, and δ with them.
    let stats = rig.layer.response_times();
    let (s0, s1) = (stats[0].deviation_us, stats[1].deviation_us);
    let expected = 2.0 * s0 + 2.0 * (s1 * s1 - s0 * s0).max(0.0).sqrt();
    let delta = rig.layer.current_delta_us();
    assert!((delta - expected).abs() < 1e-6, "{delta} vs {expected}");
    // Jitter on child 1 (5 ms ↔ 25 ms): its deviation, so σ_RTT and δ, grow past the gap
    // between the means: a gap that size no longer moves data.
    rig.write(chunk(1), 4, 1).await;
    for i in 0..40 {
        rig.timed[1].set_latency_us(if i % 2 == 0 { 1000 } else { 25000 });
        rig.read_check(chunk(1), 1, 1).await;
        rig.write(chunk(3), 1, 3).await;
    }
    let stats = rig.layer.response_times();
    let gap = stats[1].mean_us - stats[0].mean_us;
    let delta = rig.layer.current_delta_us();
    assert!(
        delta > gap,
        "δ {delta} should exceed the gap {gap}: {stats:?}"
    );
    assert!(delta > 10_000.0, "{delta}");
}

/// The merger task, as a served layer runs it: every `merge-interval`, partial chunks that
/// left the candidate list are merged (tokio's clock paused: the sleeps pass at once).
#[tokio::test(start_paused = true)]
async fn the_background_merger_rejoins_chunks_once_they_leave_the_candidate_list() {
    let mut cfg = config("str", "mig", "2ms");
    cfg.merge_interval = "1s".into();
    cfg.candidates = 1;
    let rig = Rig::new(&cfg, &[1000, 10000], 16).await;
    rig.write(chunk(0), 1, 1).await;
    rig.write(chunk(1), 4, 2).await;
    rig.write(chunk(1), 1, 3).await; // chunk 1 partial, and the one candidate
    assert_eq!(rig.layer.partial_chunks(), 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rig.layer.partial_chunks(), 1, "still listed: still active");
    rig.read_check(chunk(0), 1, 1).await; // chunk 0 takes the list's only place
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rig.layer.partial_chunks(), 0);
    assert_eq!(counter(&rig.layer, "merges"), 1);
    rig.read_check(chunk(1), 1, 3).await;
    rig.read_check(chunk(1) + 1, 3, 2).await;
    assert_invariants(&rig.layer);
}

/// Children that fail: a failed child read fails the read; a migration whose write fails
/// after a good read leaves the data where it was, frees the slot it took, and the read
/// still answers.
#[tokio::test]
async fn a_failing_child_fails_reads_but_a_failed_migration_only_leaves_the_data_in_place() {
    let group = strata_crash::CrashGroup::new();
    let disks = [
        group.disk(strata_crash::sector_disk(local_size(16))),
        group.disk(strata_crash::sector_disk(16 * CHUNK)),
    ];
    let clock = ManualClock::new();
    let timed: Vec<Arc<Timed>> = disks
        .iter()
        .zip([1000, 10000])
        .map(|(disk, latency)| Timed::new(Arc::new(disk.clone()) as DeviceRef, &clock, latency))
        .collect();
    let children: Vec<DeviceRef> = timed.iter().map(|t| t.clone() as DeviceRef).collect();
    let config = config("str", "mig", "2ms");
    let layer = format(children, &config, &clock).await;
    let device = MigrateDevice(layer.clone());
    for c in 0..2u64 {
        let data = blocks_data(chunk(c), 4, c as u8 + 1);
        device
            .write(chunk(c) * BLOCK, data, WriteFlags::default())
            .await
            .unwrap();
    }
    let free_before = layer.describe().await.unwrap().detail;
    // Child 0's data area refuses writes: the migration toward it fails, the read does not.
    disks[0].fail_writes(METADATA, 16 * CHUNK);
    let got = device.read(chunk(1) * BLOCK, CHUNK as usize).await.unwrap();
    assert!(got[..] == blocks_data(chunk(1), 4, 2)[..]);
    layer.settle().await;
    assert_eq!(counter(&layer, "migration failures"), 1);
    assert_eq!(counter(&layer, "migrations"), 0);
    assert_eq!(layer.locate(chunk(1)).unwrap().0, 1);
    let free_after = layer.describe().await.unwrap().detail;
    let free = |detail: &Vec<(String, String)>| {
        detail
            .iter()
            .find(|(k, _)| k == "child 0 free slots")
            .unwrap()
            .1
            .clone()
    };
    assert_eq!(
        free(&free_before),
        free(&free_after),
        "the slot taken is given back"
    );
    assert_invariants(&layer);
    // Child 1 refuses reads: the read fails with EIO, nothing is served in its place.
    disks[0].clear_faults();
    disks[1].fail_reads(0, 16 * CHUNK);
    let error = device
        .read(chunk(1) * BLOCK, CHUNK as usize)
        .await
        .unwrap_err();
    assert_eq!(error.errno(), strata_core::errno::EIO, "{error}");
}

/// Block status: written blocks are data, never-written and discarded ones holes, wherever
/// the data lives; extents are cut to the range asked.
#[tokio::test]
async fn block_status_reports_holes_for_unwritten_and_discarded_blocks() {
    use strata_core::{Extent, ExtentState};
    let rig = Rig::new(&config("str", "mig", "2ms"), &[1000, 10000], 16).await;
    rig.write(chunk(0), 1, 1).await; // child 0
    rig.write(chunk(1) + 1, 2, 2).await; // child 1
    rig.write(chunk(1), 1, 3).await; // block 0 of chunk 1 migrates to child 0
    rig.device
        .discard((chunk(1) + 2) * BLOCK, BLOCK)
        .await
        .unwrap();
    let extents = rig.device.block_status(0, 3 * CHUNK).await.unwrap();
    let e = |offset: u64, len: u64, state| Extent { offset, len, state };
    assert_eq!(
        extents,
        vec![
            e(0, BLOCK, ExtentState::Data),
            e(BLOCK, CHUNK - BLOCK, ExtentState::Hole),
            e(CHUNK, 2 * BLOCK, ExtentState::Data),
            e(CHUNK + 2 * BLOCK, CHUNK + 2 * BLOCK, ExtentState::Hole),
        ]
    );
    // One block; an unaligned range is refused (the layer's blocks are 4 KiB).
    let one = rig
        .device
        .block_status(CHUNK + 2 * BLOCK, BLOCK)
        .await
        .unwrap();
    assert_eq!(one, vec![e(CHUNK + 2 * BLOCK, BLOCK, ExtentState::Hole)]);
    assert!(rig.device.block_status(CHUNK + 512, 1024).await.is_err());
}

/// Every slot taken or waiting for a commit: a first write commits to get the slots freed
/// back, instead of failing for lack of space.
#[tokio::test]
async fn a_first_write_with_only_frees_pending_commits_and_finds_a_slot() {
    let rig = Rig::new(&config("seq", "mig", "1ms"), &[20000, 1000], 16).await;
    for c in 0..28 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    // The 4 spare slots (on child 1) are taken by migrations off the slow child 0; the
    // slots those leave on child 0 wait for a commit.
    for c in 0..4 {
        rig.read_check(chunk(c), 4, c as u8).await;
    }
    assert_eq!(counter(&rig.layer, "migrations"), 4);
    rig.device.discard(chunk(27) * BLOCK, CHUNK).await.unwrap();
    let status = rig.layer.describe().await.unwrap();
    let free: Vec<&String> = status
        .detail
        .iter()
        .filter(|(k, _)| k.ends_with("free slots"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(free, ["0 of 16", "0 of 16"]);
    rig.write(chunk(27), 4, 99).await;
    assert_eq!(
        rig.device_of(chunk(27)),
        0,
        "a slot child 0 freed, once committed"
    );
    rig.read_check(chunk(27), 4, 99).await;
    for c in 0..27 {
        rig.read_check(chunk(c), 4, c as u8).await;
    }
    assert_invariants(&rig.layer);
}

/// Stationary response times: data moves once, to the fastest child, and then stays (no
/// ping-pong: migration stops when every accessed block is where the rule is satisfied).
#[tokio::test]
async fn with_steady_response_times_migration_stops_once_the_data_is_on_the_fastest_child() {
    let rig = Rig::new(&config("str", "mig", "adaptive"), &[1000, 10000], 16).await;
    for c in 0..8 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    for _ in 0..10 {
        for c in 0..8 {
            rig.read_check(chunk(c), 4, c as u8).await;
        }
    }
    // The 4 chunks striped onto child 1 moved to child 0, once each.
    assert_eq!(counter(&rig.layer, "migrations to child 0"), 4);
    assert_eq!(counter(&rig.layer, "migrations to child 1"), 0);
    assert!((0..8).all(|c| rig.device_of(chunk(c)) == 0));
}

/// A child whose next read, once armed, waits to be released: lets a test put a write
/// between a read's child read and its migration.
struct Gate {
    inner: DeviceRef,
    armed: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[strata_core::async_trait]
impl BlockDevice for Gate {
    fn geometry(&self) -> strata_core::Geometry {
        self.inner.geometry()
    }

    fn capabilities(&self) -> strata_core::Capabilities {
        self.inner.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> strata_core::Result<bytes::BytesMut> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.entered.notify_one();
            self.release.notified().await;
        }
        self.inner.read(offset, len).await
    }

    async fn write(
        &self,
        offset: u64,
        data: bytes::Bytes,
        flags: WriteFlags,
    ) -> strata_core::Result<()> {
        self.inner.write(offset, data, flags).await
    }

    async fn flush(&self) -> strata_core::Result<()> {
        self.inner.flush().await
    }
}

/// A read's migration carries the data it read: if a write to the chunk comes between the
/// read and the move, the move is dropped, or it would put the old data back over the new.
#[tokio::test]
async fn a_write_between_a_read_and_its_migration_drops_the_migration() {
    let clock = ManualClock::new();
    let gate = Arc::new(Gate {
        inner: Arc::new(MemoryDevice::new(16 * CHUNK)),
        armed: Default::default(),
        entered: Default::default(),
        release: Default::default(),
    });
    let timed = [
        Timed::new(Arc::new(MemoryDevice::new(local_size(16))), &clock, 1000),
        Timed::new(gate.clone(), &clock, 10000),
    ];
    let mut cfg = config("str", "mig", "2ms");
    cfg.tokens = 1;
    cfg.token_cap = Some(1);
    let children: Vec<DeviceRef> = timed.iter().map(|t| t.clone() as DeviceRef).collect();
    let layer = format(children, &cfg, &clock).await;
    let device = Arc::new(MigrateDevice(layer.clone()));
    let at = chunk(1) * BLOCK;
    device
        .write(0, blocks_data(0, 1, 9), WriteFlags::default())
        .await
        .unwrap();
    device
        .write(at, blocks_data(chunk(1), 4, 1), WriteFlags::default())
        .await
        .unwrap();
    gate.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let reader = tokio::spawn({
        let device = device.clone();
        async move { device.read(at, BLOCK as usize).await.unwrap() }
    });
    gate.entered.notified().await; // the read holds the chunk (shared), inside the child read
    let writer = tokio::spawn({
        let device = device.clone();
        async move {
            let data = blocks_data(chunk(1), 1, 2);
            device.write(at, data, WriteFlags::default()).await.unwrap()
        }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await; // the writer queues for the chunk
    }
    gate.release.notify_one();
    let read = reader.await.unwrap();
    assert!(
        read[..] == blocks_data(chunk(1), 1, 1)[..],
        "the read saw the old data"
    );
    writer.await.unwrap();
    layer.settle().await;
    let now = device.read(at, BLOCK as usize).await.unwrap();
    assert!(
        now[..] == blocks_data(chunk(1), 1, 2)[..],
        "the write's data stays"
    );
    // The read took the only token and let the writer in before its move: dropped.
    assert_eq!(counter(&layer, "migrations dropped by a race"), 1);
    assert_eq!(counter(&layer, "migrations"), 0);
    assert_invariants(&layer);
}

/// A child that refuses requests larger than its `max_io`.
struct Limited {
    inner: DeviceRef,
    max_io: u32,
}

#[strata_core::async_trait]
impl BlockDevice for Limited {
    fn geometry(&self) -> strata_core::Geometry {
        strata_core::Geometry {
            max_io: self.max_io,
            ..self.inner.geometry()
        }
    }

    fn capabilities(&self) -> strata_core::Capabilities {
        self.inner.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> strata_core::Result<bytes::BytesMut> {
        assert!(len <= self.max_io as usize, "a read of {len} bytes");
        self.inner.read(offset, len).await
    }

    async fn write(
        &self,
        offset: u64,
        data: bytes::Bytes,
        flags: WriteFlags,
    ) -> strata_core::Result<()> {
        assert!(
            data.len() <= self.max_io as usize,
            "a write of {}",
            data.len()
        );
        self.inner.write(offset, data, flags).await
    }

    async fn flush(&self) -> strata_core::Result<()> {
        self.inner.flush().await
    }
}

/// The merger moves a run of blocks in requests no larger than the children take.
#[tokio::test]
async fn the_merger_respects_the_childrens_largest_request() {
    let chunk_bytes = 64 << 10;
    let clock = ManualClock::new();
    let limited = |size: u64| -> DeviceRef {
        Arc::new(Limited {
            inner: Arc::new(MemoryDevice::new(size)),
            max_io: 8192,
        })
    };
    let children: Vec<DeviceRef> = vec![
        limited(METADATA + 8 * chunk_bytes),
        limited(8 * chunk_bytes),
    ];
    // Chunk 1 written whole on child 1 without migration, then half of it moved to child 0
    // by the locality policy: 8 blocks in each place, a run of 32 KiB for the merger.
    let mut cfg = config("str", "nomig", "0");
    cfg.chunk = strata_core::ByteSize(chunk_bytes);
    let layer = format(children.clone(), &cfg, &clock).await;
    let put = |layer: &Arc<strata_migrate::Migrate>, block: u64, byte: u8| {
        let device = MigrateDevice(layer.clone());
        async move {
            let data = blocks_data(block, 2, byte);
            device
                .write(block * BLOCK, data, WriteFlags::default())
                .await
                .unwrap()
        }
    };
    assert_eq!(MigrateDevice(layer.clone()).geometry().max_io, 8192);
    for block in (16..32).step_by(2) {
        put(&layer, block, 2).await;
    }
    MigrateDevice(layer.clone()).flush().await.unwrap();
    drop(layer);
    cfg.policy = "locality".to_string().try_into().unwrap();
    let layer = reopen(children, &cfg, &clock).await;
    for block in (16..24).step_by(2) {
        put(&layer, block, 3).await;
    }
    assert_eq!(layer.partial_chunks(), 1);
    assert_eq!(layer.merge_partial(10, true).await.unwrap(), 1);
    assert_eq!(layer.partial_chunks(), 0);
    let device = MigrateDevice(layer.clone());
    for block in (16..32).step_by(2) {
        let got = device.read(block * BLOCK, 8192).await.unwrap();
        let byte = if block < 24 { 3 } else { 2 };
        assert!(got[..] == blocks_data(block, 2, byte)[..], "block {block}");
    }
    assert_invariants(&layer);
}

/// A child whose writes at or past `from`, once armed, wait for the test to open the gate:
/// lets a test hold a migration inside its destination write.
struct WriteGate {
    inner: DeviceRef,
    from: u64,
    armed: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Notify,
    open: tokio::sync::Notify,
}

#[strata_core::async_trait]
impl BlockDevice for WriteGate {
    fn geometry(&self) -> strata_core::Geometry {
        self.inner.geometry()
    }

    fn capabilities(&self) -> strata_core::Capabilities {
        self.inner.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> strata_core::Result<bytes::BytesMut> {
        self.inner.read(offset, len).await
    }

    async fn write(
        &self,
        offset: u64,
        data: bytes::Bytes,
        flags: WriteFlags,
    ) -> strata_core::Result<()> {
        if offset >= self.from && self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            self.entered.notify_one();
            self.open.notified().await;
        }
        self.inner.write(offset, data, flags).await
    }

    async fn flush(&self) -> strata_core::Result<()> {
        self.inner.flush().await
    }
}

/// The paper's [S] design: a read that migrates is answered once its source read completes;
/// the data it read goes to the destination afterwards, in the background. The destination's
/// data writes wait on a closed gate: the read still returns (with the old, synchronous
/// migration it would wait forever: the timeout fails the test), the map does not change
/// until the write lands, a stop waits for the migration under way, and afterwards the data
/// is read from the destination, the source having been read exactly once.
#[tokio::test]
async fn a_read_is_answered_before_its_migration_writes_the_destination() {
    let clock = ManualClock::new();
    let gate = Arc::new(WriteGate {
        inner: Arc::new(MemoryDevice::new(local_size(16))),
        from: METADATA,
        armed: Default::default(),
        entered: Default::default(),
        open: Default::default(),
    });
    let timed = [
        Timed::new(gate.clone(), &clock, 1000),
        Timed::new(Arc::new(MemoryDevice::new(16 * CHUNK)), &clock, 10000),
    ];
    let children: Vec<DeviceRef> = timed.iter().map(|t| t.clone() as DeviceRef).collect();
    let layer = format(children, &config("str", "mig", "2ms"), &clock).await;
    let device = Arc::new(MigrateDevice(layer.clone()));
    let at = chunk(1) * BLOCK;
    let data = blocks_data(chunk(1), 4, 2);
    device
        .write(0, blocks_data(0, 4, 1), WriteFlags::default())
        .await
        .unwrap();
    device
        .write(at, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(layer.locate(chunk(1)).unwrap().0, 1);
    let (source_reads, source_writes) = (timed[1].reads(), timed[1].writes());
    gate.armed.store(true, std::sync::atomic::Ordering::SeqCst);

    let got = tokio::time::timeout(Duration::from_secs(10), device.read(at, CHUNK as usize))
        .await
        .expect("the read is answered while its destination write waits")
        .unwrap();
    assert!(got[..] == data[..]);
    // The migration is under way, inside its destination write: the map has not changed.
    gate.entered.notified().await;
    assert_eq!(layer.migrations_in_flight(), 1);
    assert_eq!(counter(&layer, "migrations"), 0);
    assert!((0..4).all(|i| layer.locate(chunk(1) + i).unwrap().0 == 1));
    // A stop waits for the migration under way.
    let stopping = tokio::spawn({
        let device = device.clone();
        async move { device.control(strata_core::Control::Stop).await }
    });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(!stopping.is_finished(), "the stop waits for the migration");
    gate.armed.store(false, std::sync::atomic::Ordering::SeqCst);
    gate.open.notify_one();
    stopping.await.unwrap().unwrap();
    layer.settle().await;

    assert_eq!(layer.migrations_in_flight(), 0);
    assert_eq!(counter(&layer, "migrations"), 1);
    assert_eq!(counter(&layer, "read migrations"), 1);
    assert_eq!(counter(&layer, "migrations cancelled"), 0);
    assert_eq!(timed[1].reads() - source_reads, 1, "the source read once");
    assert_eq!(timed[1].writes(), source_writes);
    assert!((0..4).all(|i| layer.locate(chunk(1) + i).unwrap().0 == 0));
    assert_eq!(layer.entry(1).locations[1], None, "the whole chunk moved");
    // The destination holds exactly the data read.
    let (device_0, offset) = layer.locate(chunk(1)).unwrap();
    assert_eq!(device_0, 0);
    let raw = gate.inner.read(offset, CHUNK as usize).await.unwrap();
    assert!(raw[..] == data[..]);
    // Served by the destination from now on.
    let (local_reads, source_reads) = (timed[0].reads(), timed[1].reads());
    let again = device.read(at, CHUNK as usize).await.unwrap();
    assert!(again[..] == data[..]);
    assert_eq!(timed[1].reads(), source_reads);
    assert_eq!(timed[0].reads(), local_reads + 1);
    assert_invariants(&layer);
}

/// A write that comes after a read was answered but before its migration ran: the
/// migration (held back by a quiesce) finds the chunk changed and is dropped, or it would
/// put the data the read carried back over the write's.
#[tokio::test]
async fn a_write_after_a_read_was_answered_drops_its_pending_migration() {
    let rig = Rig::new(&config("str", "mig", "2ms"), &[1000, 10000], 16).await;
    rig.write(chunk(0), 4, 1).await;
    rig.write(chunk(1), 4, 2).await;
    rig.layer.background().quiesce().await;
    let got = rig
        .device
        .read(chunk(1) * BLOCK, BLOCK as usize)
        .await
        .unwrap();
    assert!(got[..] == blocks_data(chunk(1), 1, 2)[..]);
    assert_eq!(rig.layer.migrations_in_flight(), 1);
    rig.write(chunk(1), 1, 3).await;
    rig.layer.background().resume();
    rig.layer.settle().await;
    assert_eq!(counter(&rig.layer, "migrations dropped by a race"), 1);
    assert_eq!(counter(&rig.layer, "read migrations"), 0);
    // Chunk 0's slot and the write's migration's (block 0 moved to child 0) are taken; the
    // slot the dropped read migration held is given back.
    assert_eq!(counter(&rig.layer, "write migrations"), 1);
    assert_eq!(child_0_free(&rig.layer).await, "14 of 16");
    rig.read_check(chunk(1), 1, 3).await;
    rig.read_check(chunk(1) + 1, 3, 2).await;
    assert_invariants(&rig.layer);
}

/// At most `MAX_MIGRATIONS_IN_FLIGHT` read migrations wait or run at once, one per chunk:
/// a read beyond is served without migrating (`skipped in flight`), taking no token.
#[tokio::test]
async fn read_migrations_in_flight_are_capped_and_one_per_chunk() {
    assert_eq!(strata_migrate::MAX_MIGRATIONS_IN_FLIGHT, 8);
    // SEQ: ten chunks on the slow child 0; child 1 (64 slots) has room for all of them.
    let rig = Rig::new(&config("seq", "mig", "1ms"), &[20000, 1000], 64).await;
    for c in 0..10 {
        rig.write(chunk(c), 4, c as u8).await;
    }
    rig.layer.background().quiesce().await;
    let read = |c: u64| {
        let device = &rig.device;
        async move {
            let got = device.read(chunk(c) * BLOCK, BLOCK as usize).await.unwrap();
            assert!(
                got[..] == blocks_data(chunk(c), 1, c as u8)[..],
                "chunk {c}"
            );
        }
    };
    read(0).await;
    read(0).await; // chunk 0 has one in flight already
    assert_eq!(rig.layer.migrations_in_flight(), 1);
    assert_eq!(counter(&rig.layer, "skipped in flight"), 1);
    for c in 1..9 {
        read(c).await; // chunk 8 finds 8 in flight
    }
    assert_eq!(rig.layer.migrations_in_flight(), 8);
    assert_eq!(counter(&rig.layer, "skipped in flight"), 2);
    assert_eq!(counter(&rig.layer, "skipped no token"), 0);
    let status = rig.layer.describe().await.unwrap();
    let get = |key: &str| {
        status
            .detail
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no {key:?}"))
            .1
            .clone()
    };
    assert_eq!(get("migrations in flight"), "8 (at most 8)");
    assert_eq!(get("child 1 free slots"), "56 of 64", "a slot each, held");
    assert_eq!(counter(&rig.layer, "migrations"), 0);
    rig.layer.background().resume();
    rig.layer.settle().await;
    assert_eq!(counter(&rig.layer, "migrations"), 8);
    assert!((0..8).all(|c| rig.device_of(chunk(c)) == 1));
    assert_eq!(rig.device_of(chunk(8)), 0);
    // Room again: the next read of chunk 8 migrates it.
    rig.read_check(chunk(8), 1, 8).await;
    assert_eq!(rig.device_of(chunk(8)), 1);
    assert_eq!(counter(&rig.layer, "migrations"), 9);
    for c in 0..10 {
        rig.read_check(chunk(c), 4, c as u8).await;
    }
    assert_invariants(&rig.layer);
}

/// Stopping the layer's background work (shutdown) cancels the read migrations still
/// waiting: the slots they took are given back, the data stays at the source; a read after
/// the stop migrates nothing.
#[tokio::test]
async fn a_stop_cancels_waiting_read_migrations_and_gives_their_slots_back() {
    let rig = Rig::new(&config("str", "mig", "2ms"), &[1000, 10000], 16).await;
    rig.write(chunk(0), 4, 1).await;
    rig.write(chunk(1), 4, 2).await;
    let before = child_0_free(&rig.layer).await;
    rig.layer.background().quiesce().await;
    let got = rig
        .device
        .read(chunk(1) * BLOCK, CHUNK as usize)
        .await
        .unwrap();
    assert!(got[..] == blocks_data(chunk(1), 4, 2)[..]);
    assert_eq!(rig.layer.migrations_in_flight(), 1);
    assert_ne!(
        child_0_free(&rig.layer).await,
        before,
        "the migration holds a slot"
    );
    tokio::time::timeout(
        Duration::from_secs(10),
        rig.device.control(strata_core::Control::Stop),
    )
    .await
    .expect("a stop does not wait for quiesced migrations")
    .unwrap();
    assert_eq!(rig.layer.migrations_in_flight(), 0);
    assert_eq!(counter(&rig.layer, "migrations cancelled"), 1);
    assert_eq!(counter(&rig.layer, "migrations"), 0);
    assert_eq!(child_0_free(&rig.layer).await, before);
    assert!((0..4).all(|i| rig.device_of(chunk(1) + i) == 1));
    // After the stop: served, nothing migrates, nothing is held.
    rig.read_check(chunk(1), 4, 2).await;
    assert_eq!(counter(&rig.layer, "migrations cancelled"), 2);
    assert_eq!(counter(&rig.layer, "migrations"), 0);
    assert_eq!(child_0_free(&rig.layer).await, before);
    assert_invariants(&rig.layer);
}

async fn child_0_free(layer: &Migrate) -> String {
    let status = layer.describe().await.unwrap();
    status
        .detail
        .iter()
        .find(|(k, _)| k == "child 0 free slots")
        .unwrap()
        .1
        .clone()
}
