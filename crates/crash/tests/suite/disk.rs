//! CrashDisk as a block device, its crash outcomes, and its injected faults.

use std::collections::BTreeSet;

use bytes::Bytes;
use strata_core::{
    BlockDevice, BlockError, Control, ControlReply, ExtentState, Geometry, WriteFlags, ZeroFlags,
};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::{sector_disk, CrashDisk, CrashGroup, CrashPolicy, CrashRng, DiskImage};

const FUA: WriteFlags = WriteFlags { fua: true };
const PLAIN: WriteFlags = WriteFlags { fua: false };

fn filled(len: usize, byte: u8) -> Bytes {
    Bytes::from(vec![byte; len])
}

async fn read(disk: &CrashDisk, offset: u64, len: usize) -> Vec<u8> {
    disk.read(offset, len).await.expect("read").to_vec()
}

fn errno_of(result: strata_core::Result<impl std::fmt::Debug>) -> i32 {
    match result {
        Err(BlockError::Io { source, .. }) => source.raw_os_error().expect("an OS error"),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

/// Seeded random operations against a `Vec<u8>`: without a crash the disk is a plain disk.
#[tokio::test]
async fn without_a_crash_it_is_a_correct_block_device() {
    for seed in 0..24u64 {
        let mut rng = CrashRng::seed_from_u64(seed);
        let geometry = if seed % 3 == 0 {
            Geometry {
                min_io: 4096,
                logical_block: 4096,
                ..sector_disk(192 << 10)
            }
        } else {
            sector_disk(256 << 10)
        };
        let size = geometry.size as usize;
        let unit = geometry.min_io as usize;
        let disk = CrashGroup::new().disk(geometry);
        let mut model = vec![0u8; size];
        for _ in 0..300 {
            let count = rng.random_range(1..=(32 << 10) / unit);
            let offset = rng.random_range(0..=size / unit - count) * unit;
            let len = count * unit;
            match rng.random_range(0..8u32) {
                0 | 1 => {
                    let mut data = vec![0u8; len];
                    rng.fill(&mut data[..]);
                    let flags = WriteFlags {
                        fua: rng.random_bool(0.3),
                    };
                    disk.write(offset as u64, Bytes::from(data.clone()), flags)
                        .await
                        .unwrap();
                    model[offset..offset + len].copy_from_slice(&data);
                }
                2 => {
                    let flags = ZeroFlags {
                        fua: rng.random_bool(0.3),
                        ..ZeroFlags::default()
                    };
                    disk.write_zeroes(offset as u64, len as u64, flags)
                        .await
                        .unwrap();
                    model[offset..offset + len].fill(0);
                }
                3 => {
                    disk.discard(offset as u64, len as u64).await.unwrap();
                    model[offset..offset + len].fill(0);
                }
                4 => disk.flush().await.unwrap(),
                5 => assert_eq!(
                    read(&disk, offset as u64, len).await,
                    &model[offset..offset + len]
                ),
                6 => {
                    let extents = disk.block_status(offset as u64, len as u64).await.unwrap();
                    let mut pos = offset as u64;
                    for extent in extents {
                        assert_eq!(extent.offset, pos, "extents are contiguous");
                        let range = extent.offset as usize..(extent.offset + extent.len) as usize;
                        if extent.state == ExtentState::Hole {
                            assert!(model[range].iter().all(|&b| b == 0), "a hole with data");
                        }
                        pos += extent.len;
                    }
                    assert_eq!(pos, (offset + len) as u64);
                }
                _ => {
                    // Refused requests touch nothing (the final comparison shows it).
                    let misaligned = disk.write(offset as u64 + 1, filled(unit, 0xee), PLAIN);
                    assert!(matches!(
                        misaligned.await,
                        Err(BlockError::InvalidArgument(_))
                    ));
                    let past = disk.write_zeroes(
                        geometry.size - unit as u64,
                        2 * unit as u64,
                        ZeroFlags::default(),
                    );
                    assert!(matches!(past.await, Err(BlockError::OutOfRange { .. })));
                    assert!(disk.read(geometry.size, unit).await.is_err());
                }
            }
        }
        assert_eq!(read(&disk, 0, size).await, model);
        let mut expected = DiskImage::zeroed(geometry);
        expected.write(0, &model);
        assert_eq!(disk.image(), expected);
        disk.flush().await.unwrap();
        assert_eq!(disk.durable_image(), expected);
        assert_eq!(disk.stats().pending, 0);
    }
}

#[tokio::test]
async fn keep_all_is_what_reads_saw_and_drop_all_is_flushed_plus_fua() {
    let group = CrashGroup::new();
    let disk = group.disk(sector_disk(64 << 10));
    disk.write(0, filled(4096, 1), PLAIN).await.unwrap();
    disk.flush().await.unwrap();
    disk.write(0, filled(1024, 2), PLAIN).await.unwrap();
    disk.write(8192, filled(2048, 3), FUA).await.unwrap();
    disk.write_zeroes(2048, 1024, ZeroFlags::default())
        .await
        .unwrap();
    disk.discard(3072, 512).await.unwrap();
    let seen = disk.image();
    let mut rng = CrashRng::seed_from_u64(1);

    let kept = group.crash_with(CrashPolicy::KeepAll, &mut rng);
    assert_eq!(kept, vec![seen]);
    let dropped = group.crash_with(CrashPolicy::DropAll, &mut rng);
    let mut durable = DiskImage::zeroed(sector_disk(64 << 10));
    durable.write(0, &[1; 4096]);
    durable.write(8192, &[3; 2048]);
    assert_eq!(dropped, vec![durable]);
    assert!(group.is_powered_off());
    assert!(matches!(disk.read(0, 512).await, Err(BlockError::Shutdown)));
}

#[tokio::test]
async fn an_older_cached_write_never_lands_over_newer_fua_data() {
    for seed in 0..200 {
        let group = CrashGroup::new();
        let disk = group.disk(sector_disk(16 << 10));
        disk.write(0, filled(4096, 1), PLAIN).await.unwrap();
        disk.write(1024, filled(1024, 2), FUA).await.unwrap();
        disk.write(3072, filled(1024, 3), PLAIN).await.unwrap();
        let images = group.crash(&mut CrashRng::seed_from_u64(seed));
        let image = &images[0];
        assert_eq!(image.read(1024, 1024), vec![2; 1024], "seed {seed}");
        for sector in [0, 512, 2048, 2560] {
            let byte = image.read(sector, 512);
            assert!(byte == [1; 512] || byte == [0; 512], "seed {seed}");
        }
        for sector in [3072, 3584] {
            let byte = image.read(sector, 512)[0];
            assert!([0, 1, 3].contains(&byte), "seed {seed}");
        }
    }
}

#[tokio::test]
async fn writes_tear_at_sectors_and_land_in_any_order() {
    let group = CrashGroup::new();
    let disk = group.disk(sector_disk(16 << 10));
    disk.write(0, filled(512, 1), PLAIN).await.unwrap();
    disk.write(0, filled(512, 2), PLAIN).await.unwrap();
    disk.write(4096, filled(8 * 512, 7), PLAIN).await.unwrap();
    let mut first_sector = BTreeSet::new();
    let mut torn_counts = BTreeSet::new();
    for seed in 0..300 {
        let image = group.crash(&mut CrashRng::seed_from_u64(seed)).remove(0);
        first_sector.insert(image.read(0, 512)[0]);
        let mut kept = 0;
        for sector in 0..8 {
            let bytes = image.read(4096 + sector * 512, 512);
            assert!(
                bytes == [7; 512] || bytes == [0; 512],
                "a sector is whole or absent"
            );
            kept += u32::from(bytes[0] == 7);
        }
        torn_counts.insert(kept);
    }
    // Either version of a twice-written sector may survive, or neither.
    assert_eq!(first_sector, BTreeSet::from([0, 1, 2]));
    assert!(torn_counts.contains(&0) && torn_counts.contains(&8));
    assert!(
        torn_counts.iter().any(|&k| k > 0 && k < 8),
        "{torn_counts:?}"
    );
}

/// At sector granularity tearing can mimic reordering; inside one sector only a reorder can
/// leave the older write on top of the newer one while the newer one's other bytes landed.
#[tokio::test]
async fn cached_writes_land_in_any_order() {
    let group = CrashGroup::new();
    let disk = group.disk(Geometry::byte_addressable(4096));
    disk.write(0, filled(100, 1), PLAIN).await.unwrap();
    disk.write(50, filled(100, 2), PLAIN).await.unwrap();
    let mut outcomes = BTreeSet::new();
    for seed in 0..300 {
        let image = group.crash(&mut CrashRng::seed_from_u64(seed)).remove(0);
        let (overlap, tail) = (image.read(50, 50), image.read(100, 50));
        let newer_on_top = overlap == [2; 50] && tail == [2; 50];
        let older_on_top = overlap == [1; 50] && tail == [2; 50];
        outcomes.insert((newer_on_top, older_on_top));
    }
    assert!(outcomes.contains(&(true, false)), "in order: {outcomes:?}");
    assert!(outcomes.contains(&(false, true)), "reordered: {outcomes:?}");
}

#[tokio::test]
async fn a_crash_is_reproducible_from_its_seed() {
    let group = CrashGroup::new();
    let disk = group.disk(sector_disk(64 << 10));
    for i in 0..40u64 {
        let offset = (i * 7 % 100) * 512;
        disk.write(offset, filled(1024, i as u8 + 1), PLAIN)
            .await
            .unwrap();
    }
    let a = group.crash(&mut CrashRng::seed_from_u64(9));
    let b = group.crash(&mut CrashRng::seed_from_u64(9));
    assert_eq!(a, b);
    let differs = (10..20).any(|s| group.crash(&mut CrashRng::seed_from_u64(s)) != a);
    assert!(differs, "different seeds give different outcomes");
}

#[tokio::test]
async fn power_fails_at_the_armed_op_across_the_group() {
    let group = CrashGroup::new();
    let d0 = group.disk(sector_disk(8192));
    let d1 = group.disk(sector_disk(8192));
    group.arm_crash_at(3);
    d0.write(0, filled(512, 1), PLAIN).await.unwrap(); // op 0
    assert!(d0.read(0, 512).await.is_ok()); // reads do not count
    d1.write(0, filled(512, 2), PLAIN).await.unwrap(); // op 1
    d0.flush().await.unwrap(); // op 2: flushes d0 only
    assert!(d1.write(0, filled(9, 0), PLAIN).await.is_err()); // refused: not counted
    assert_eq!(group.mutating_ops(), 3);
    let in_flight = d1.write(512, filled(512, 3), FUA).await; // op 3
    assert_eq!(errno_of(in_flight), 5);
    assert!(group.is_powered_off());
    assert!(matches!(d0.read(0, 512).await, Err(BlockError::Shutdown)));
    assert!(matches!(d1.flush().await, Err(BlockError::Shutdown)));
    assert_eq!(group.mutating_ops(), 4);

    let mut rng = CrashRng::seed_from_u64(0);
    let kept = group.crash_with(CrashPolicy::KeepAll, &mut rng);
    assert_eq!(kept[0].read(0, 512), vec![1; 512]);
    assert_eq!(kept[1].read(0, 1024), [vec![2; 512], vec![3; 512]].concat());
    let dropped = group.crash_with(CrashPolicy::DropAll, &mut rng);
    assert_eq!(dropped[0].read(0, 512), vec![1; 512]);
    assert_eq!(
        dropped[1].read(0, 1024),
        vec![0; 1024],
        "FUA in flight is not durable"
    );

    // Reopen from what was left: the new disks hold it, durable.
    let group = CrashGroup::new();
    let reopened = group.disk_from(kept[1].clone());
    assert_eq!(read(&reopened, 0, 1024).await[512], 3);
    assert_eq!(reopened.durable_image(), kept[1]);
}

#[tokio::test]
async fn a_flush_cut_by_the_crash_promises_nothing() {
    let group = CrashGroup::new();
    let disk = group.disk(sector_disk(8192));
    disk.write(0, filled(512, 1), PLAIN).await.unwrap();
    group.arm_crash_at(group.mutating_ops());
    assert!(disk.flush().await.is_err());
    let images = group.crash_with(CrashPolicy::DropAll, &mut CrashRng::seed_from_u64(0));
    assert_eq!(images[0].read(0, 512), vec![0; 512]);
}

#[tokio::test]
async fn power_off_now_stops_everything() {
    let group = CrashGroup::new();
    let disk = group.disk(sector_disk(8192));
    group.power_off();
    assert!(matches!(
        disk.write(0, filled(512, 1), PLAIN).await,
        Err(BlockError::Shutdown)
    ));
    assert!(matches!(
        disk.block_status(0, 512).await,
        Err(BlockError::Shutdown)
    ));
    assert_eq!(group.mutating_ops(), 0);
}

#[tokio::test]
async fn read_and_write_errors_hit_only_their_range() {
    let disk = CrashGroup::new().disk(sector_disk(16 << 10));
    disk.write(0, filled(16 << 10, 1), PLAIN).await.unwrap();
    disk.fail_reads(4096, 512);
    assert_eq!(errno_of(disk.read(512, 4096).await), 5);
    assert_eq!(read(&disk, 0, 4096).await, vec![1; 4096]);
    disk.write(4096, filled(512, 2), PLAIN).await.unwrap(); // writes still work there

    disk.fail_writes(8192, 1024);
    assert_eq!(errno_of(disk.write(7680, filled(1024, 3), FUA).await), 5);
    let zeroes = disk.write_zeroes(9216 - 512, 512, ZeroFlags::default());
    assert_eq!(errno_of(zeroes.await), 5);
    assert_eq!(errno_of(disk.discard(8192, 512).await), 5);
    assert_eq!(
        read(&disk, 7680, 2048).await,
        vec![1; 2048],
        "nothing changed"
    );
    disk.write(9216, filled(512, 4), PLAIN).await.unwrap();

    disk.clear_faults();
    assert_eq!(read(&disk, 4096, 512).await, vec![2; 512]);
    disk.write(8192, filled(512, 5), PLAIN).await.unwrap();
    assert_eq!(read(&disk, 8192, 512).await, vec![5; 512]);
}

#[tokio::test]
async fn a_latent_sector_error_lasts_until_the_sector_is_rewritten() {
    let group = CrashGroup::new();
    let disk = group.disk(Geometry::byte_addressable(16 << 10));
    disk.write(0, filled(16 << 10, 1), PLAIN).await.unwrap();
    disk.latent_sector_error(1100, 10); // sector 2: [1024, 1536)
    assert_eq!(errno_of(disk.read(1500, 100).await), 5);
    assert_eq!(errno_of(disk.read(1500, 100).await), 5, "still there");
    assert_eq!(read(&disk, 0, 1024).await, vec![1; 1024]);
    assert_eq!(read(&disk, 1536, 512).await, vec![1; 512]);
    disk.write(1024, filled(100, 2), PLAIN).await.unwrap(); // part of the sector
    assert_eq!(errno_of(disk.read(1024, 512).await), 5);
    disk.discard(1024, 512).await.unwrap(); // not a rewrite
    assert_eq!(errno_of(disk.read(1024, 512).await), 5);
    disk.write(1000, filled(600, 3), PLAIN).await.unwrap(); // covers it whole
    assert_eq!(read(&disk, 1024, 512).await, vec![3; 512]);

    disk.latent_sector_error(4096, 512);
    let flags = ZeroFlags::default();
    disk.write_zeroes(4096, 512, flags).await.unwrap();
    assert_eq!(read(&disk, 4096, 512).await, vec![0; 512]);
}

#[tokio::test]
async fn a_disk_that_disappears_answers_enodev_until_plugged_back() {
    let group = CrashGroup::new();
    let disk = group.disk(sector_disk(8192));
    let other = group.disk(sector_disk(8192));
    disk.write(0, filled(512, 1), PLAIN).await.unwrap();
    disk.disappear();
    assert_eq!(errno_of(disk.read(0, 512).await), strata_crash::ENODEV);
    assert_eq!(errno_of(disk.write(0, filled(512, 2), PLAIN).await), 19);
    assert_eq!(errno_of(disk.flush().await), 19);
    assert_eq!(errno_of(disk.discard(0, 512).await), 19);
    assert_eq!(
        errno_of(disk.write_zeroes(0, 512, ZeroFlags::default()).await),
        19
    );
    assert_eq!(errno_of(disk.block_status(0, 512).await), 19);
    assert_eq!(errno_of(disk.control(Control::Describe).await), 19);
    assert!(BlockError::io("x", std::io::Error::from_raw_os_error(19)).errno() == 5);
    other.write(0, filled(512, 3), PLAIN).await.unwrap(); // the rest of the group lives
    disk.clear_faults();
    assert_eq!(read(&disk, 0, 512).await, vec![1; 512]);
}

#[tokio::test]
async fn describes_itself_and_counts() {
    let disk = CrashGroup::new().disk(sector_disk(8192));
    disk.write(0, filled(1024, 1), FUA).await.unwrap();
    disk.write(1024, filled(512, 1), PLAIN).await.unwrap();
    read(&disk, 0, 2048).await;
    let ControlReply::Describe(node) = disk.control(Control::Describe).await.unwrap() else {
        panic!("expected a description");
    };
    assert_eq!(node.kind, "crash");
    assert_eq!(node.size, 8192);
    let stats = disk.stats();
    assert_eq!(
        (
            stats.writes,
            stats.fua_writes,
            stats.bytes_written,
            stats.pending
        ),
        (2, 1, 1536, 1)
    );
    assert_eq!((stats.reads, stats.bytes_read), (1, 2048));
    assert!(disk.capabilities().flush && disk.capabilities().fua);
}
