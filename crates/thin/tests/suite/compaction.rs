//! Differential compaction of snapshots: a version whose extents no other version reads is
//! stored as deltas against its successor, reads back byte-identical (two reads per compacted
//! extent), survives a reopen, and uncompacts to the same bytes; what it must refuse it
//! refuses by name; a damaged delta is reported, never read as other data.

use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_crash::testkit::block_on;
use strata_stateless::count::Count;
use strata_thin::{check_state, ThinPool};

use crate::common;
use common::{pool_options, settings};

const EXTENT: u64 = 64 << 10;
const EXTENTS: u64 = 8;
const SIZE: u64 = EXTENTS * EXTENT;

/// A pool over a counting filter over a memory disk, and its volume "v".
async fn pool() -> (Arc<ThinPool>, Arc<Count>, DeviceRef) {
    let disk: DeviceRef = Arc::new(MemoryDevice::new((2 << 20) + 128 * EXTENT));
    let counted = Arc::new(Count::new("counted".into(), disk.clone()));
    let pool = ThinPool::format(
        "pool",
        counted.clone(),
        &pool_options(EXTENT, 2 << 20),
        settings(),
    )
    .await
    .unwrap();
    pool.create_volume("v", SIZE).await.unwrap();
    (pool, counted, disk)
}

/// Text-like bytes: a version is the one before with a few bytes edited in each 4 KiB.
fn generation(n: u8) -> Vec<u8> {
    (0..SIZE)
        .map(|i| {
            let base = b"the quick brown fox jumps over the lazy dog "[(i % 44) as usize];
            if i % 4096 == 1000 + n as u64 {
                b'0' + n
            } else {
                base
            }
        })
        .collect()
}

async fn write_all(pool: &Arc<ThinPool>, data: &[u8]) {
    let volume = pool.volume("v").unwrap();
    volume
        .write(0, Bytes::copy_from_slice(data), WriteFlags::default())
        .await
        .unwrap();
    pool.flush().await.unwrap();
}

async fn read_snapshot(pool: &Arc<ThinPool>, name: &str) -> Vec<u8> {
    let device = pool.snapshot_device("v", name).unwrap();
    device.read(0, SIZE as usize).await.unwrap().to_vec()
}

fn assert_consistent(pool: &ThinPool) {
    let problems = pool.store().read(check_state);
    assert!(problems.is_empty(), "{problems:?}");
}

/// Generations 1, 2, 3 written in full with snapshots s1, s2, s3 after each: s2's extents
/// are read by s2 alone (s3 and the volume read generation 3's).
async fn three_generations(pool: &Arc<ThinPool>) {
    for n in 1..=3u8 {
        write_all(pool, &generation(n)).await;
        pool.create_snapshot("v", Some(&format!("s{n}")))
            .await
            .unwrap();
    }
}

#[test]
fn a_compacted_snapshot_reads_the_same_with_two_reads_and_frees_its_extents() {
    block_on(async {
        let (pool, counted, _) = pool().await;
        three_generations(&pool).await;
        let allocated = pool.allocated_extents();
        let report = pool.compact_snapshot("v", "s2").await.unwrap();
        assert_eq!(report.base, "s3");
        assert_eq!(report.extents_compacted, EXTENTS);
        assert_eq!(report.extents_freed, EXTENTS, "s2's own extents");
        assert_eq!(report.delta_extents, 1, "tiny deltas pack into one extent");
        assert!(report.delta_bytes * 20 < report.data_bytes, "{report:?}");
        assert_eq!(pool.allocated_extents(), allocated - EXTENTS + 1);
        assert_eq!(report.bytes_saved, ((EXTENTS - 1) * EXTENT) as i64);
        assert_consistent(&pool);

        // Byte-identical, every version; one compacted read costs its record and its base.
        assert_eq!(read_snapshot(&pool, "s2").await, generation(2));
        assert_eq!(read_snapshot(&pool, "s1").await, generation(1));
        assert_eq!(read_snapshot(&pool, "s3").await, generation(3));
        let device = pool.snapshot_device("v", "s2").unwrap();
        let before = counted.counts();
        device.read(3 * EXTENT + 4096, 4096).await.unwrap();
        let after = counted.counts();
        assert_eq!(
            after.reads - before.reads,
            2,
            "the delta record and the base extent"
        );

        let listed = pool.snapshots(Some("v")).unwrap();
        let s2 = listed.iter().find(|s| s.name == "s2").unwrap();
        assert_eq!(s2.compacted_against.as_deref(), Some("s3"));
        assert_eq!(s2.delta_bytes, report.delta_bytes);

        // Compacting again finds nothing left to do.
        let again = pool.compact_snapshot("v", "s2").await.unwrap();
        assert_eq!(again.extents_compacted, 0);

        let undone = pool.uncompact_snapshot("v", "s2").await.unwrap();
        assert_eq!(undone.extents_restored, EXTENTS);
        assert_eq!(undone.delta_extents_freed, 1);
        assert_eq!(read_snapshot(&pool, "s2").await, generation(2));
        assert_eq!(pool.allocated_extents(), allocated);
        assert_consistent(&pool);
        let listed = pool.snapshots(Some("v")).unwrap();
        assert!(listed.iter().all(|s| s.compacted_against.is_none()));
    });
}

#[test]
fn the_base_deleted_stays_as_a_shadow_and_everything_survives_a_reopen() {
    block_on(async {
        let (pool, _, disk) = pool().await;
        three_generations(&pool).await;
        pool.compact_snapshot("v", "s2").await.unwrap();
        // s3 goes; its extents stay as long as s2's deltas need them.
        pool.delete_snapshot("v", "s3").await.unwrap();
        assert_eq!(read_snapshot(&pool, "s2").await, generation(2));
        let listed = pool.snapshots(Some("v")).unwrap();
        let s2 = listed.iter().find(|s| s.name == "s2").unwrap();
        assert!(s2.compacted_against.as_deref().unwrap().contains("deleted"));
        // The volume moves on; s2 does not.
        write_all(&pool, &generation(4)).await;
        assert_eq!(read_snapshot(&pool, "s2").await, generation(2));
        assert_consistent(&pool);

        drop(pool);
        let counted = Arc::new(Count::new("counted".into(), disk));
        let pool = ThinPool::open("pool", counted, settings()).await.unwrap().0;
        assert_eq!(read_snapshot(&pool, "s2").await, generation(2));
        assert_eq!(read_snapshot(&pool, "s1").await, generation(1));
        let volume = pool.volume("v").unwrap();
        assert_eq!(
            volume.read(0, SIZE as usize).await.unwrap().to_vec(),
            generation(4)
        );
        assert_consistent(&pool);

        // Deleting the compacted snapshot frees its deltas and, with them, the shadow.
        let allocated = pool.allocated_extents();
        pool.delete_snapshot("v", "s2").await.unwrap();
        assert!(pool.allocated_extents() < allocated);
        assert_consistent(&pool);
        assert_eq!(read_snapshot(&pool, "s1").await, generation(1));
    });
}

#[test]
fn what_compaction_cannot_do_is_refused_by_name() {
    block_on(async {
        let (pool, _, _) = pool().await;
        three_generations(&pool).await;
        let newest = pool
            .compact_snapshot("v", "s3")
            .await
            .unwrap_err()
            .to_string();
        assert!(newest.contains("no later snapshot"), "{newest}");
        pool.compact_snapshot("v", "s2").await.unwrap();
        let rollback = pool.rollback("v", "s2").await.unwrap_err().to_string();
        assert!(rollback.contains("uncompact it"), "{rollback}");
        let clone = pool
            .clone_snapshot("v", "s2", "c")
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(clone.contains("uncompact it"), "{clone}");
        let not = pool
            .uncompact_snapshot("v", "s1")
            .await
            .unwrap_err()
            .to_string();
        assert!(not.contains("not compacted"), "{not}");
        pool.compact_snapshot("v", "s1").await.unwrap();
        // s2 is compacted and s1's deltas are made against it: s2 stays until s1 is whole.
        let base = pool
            .delete_snapshot("v", "s2")
            .await
            .unwrap_err()
            .to_string();
        assert!(base.contains("uncompact s1 first"), "{base}");
        pool.uncompact_snapshot("v", "s1").await.unwrap();
        pool.clone_snapshot("v", "s1", "c").await.unwrap();
        let cloned = pool
            .compact_snapshot("v", "s1")
            .await
            .unwrap_err()
            .to_string();
        assert!(cloned.contains("clone(s) read it"), "{cloned}");
        pool.delete_snapshot("v", "s2").await.unwrap();
        assert_eq!(read_snapshot(&pool, "s1").await, generation(1));
        assert_consistent(&pool);
    });
}

#[test]
fn a_series_of_versions_compacts_each_against_the_next_and_reads_the_same() {
    block_on(async {
        let (pool, counted, _) = pool().await;
        for n in 1..=5u8 {
            write_all(&pool, &generation(n)).await;
            pool.create_snapshot("v", Some(&format!("s{n}")))
                .await
                .unwrap();
        }
        let allocated = pool.allocated_extents();
        // Oldest first and newest first give the same: each is made against the next's view.
        for name in ["s1", "s3", "s2", "s4"] {
            let report = pool.compact_snapshot("v", name).await.unwrap();
            assert_eq!(report.extents_compacted, EXTENTS, "{name}: {report:?}");
        }
        for n in 1..=5u8 {
            assert_eq!(
                read_snapshot(&pool, &format!("s{n}")).await,
                generation(n),
                "s{n}"
            );
        }
        assert!(pool.allocated_extents() <= allocated - 4 * EXTENTS + 4);
        assert_consistent(&pool);
        // A read of s1 walks its bases down to s5's extent: one read per delta and one base.
        let device = pool.snapshot_device("v", "s1").unwrap();
        let before = counted.counts();
        device.read(EXTENT, 4096).await.unwrap();
        assert_eq!(counted.counts().reads - before.reads, 5);
        // Uncompacting in the middle of the series changes no version.
        pool.uncompact_snapshot("v", "s3").await.unwrap();
        pool.uncompact_snapshot("v", "s1").await.unwrap();
        for n in 1..=5u8 {
            assert_eq!(
                read_snapshot(&pool, &format!("s{n}")).await,
                generation(n),
                "s{n}"
            );
        }
        assert_consistent(&pool);
    });
}

#[test]
fn a_damaged_delta_is_reported_not_read_as_other_data() {
    block_on(async {
        let (pool, _, disk) = pool().await;
        three_generations(&pool).await;
        pool.compact_snapshot("v", "s2").await.unwrap();
        let device = pool.snapshot_device("v", "s2").unwrap();
        let good = device.read(0, 4096).await.unwrap();
        assert_eq!(&good[..], &generation(2)[..4096]);
        drop(device);
        // The delta extent is the one whose records start with our header then zstd's magic.
        let mut delta_extent = None;
        for phys in 0..128u64 {
            let head = disk.read((2 << 20) + phys * EXTENT, 512).await.unwrap();
            if head
                .windows(4)
                .take(128)
                .any(|w| w == [0x28, 0xb5, 0x2f, 0xfd])
            {
                delta_extent = Some(phys);
                break;
            }
        }
        let delta_extent = delta_extent.expect("a delta extent");
        let offset = (2 << 20) + delta_extent * EXTENT;
        disk.write(
            offset + 20,
            Bytes::from(vec![0xAA; 8]),
            WriteFlags::default(),
        )
        .await
        .unwrap();
        let device = pool.snapshot_device("v", "s2").unwrap();
        let error = device.read(0, 4096).await.unwrap_err().to_string();
        assert!(error.contains("damaged"), "{error}");
        // The volume and the other snapshots are not affected.
        assert_eq!(read_snapshot(&pool, "s1").await, generation(1));
        assert_eq!(read_snapshot(&pool, "s3").await, generation(3));
    });
}
