//! A thin pool's space management: a full pool (fail and wait policies), the low-water mark,
//! the usage counts, and what the extent map-commit mode costs and promises.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_core::{BlockDevice, BlockError, DeviceRef, WriteFlags, ZeroFlags};
use strata_crash::{sector_disk, CrashDisk, CrashGroup};
use strata_thin::{LowWater, MapCommit, PoolRuntime, ThinPool, ThinVolume, WhenFull};

use crate::common;
use common::{pool_options, settings};

const EXTENT: u64 = 64 << 10;
const META: u64 = 1 << 20;
/// Data extents in every test pool.
const EXTENTS: u64 = 10;
/// Each volume is bigger than the pool (over-committed).
const VOLUME: u64 = 2 << 20;

struct Pool {
    disk: CrashDisk,
    pool: Arc<ThinPool>,
    a: Arc<ThinVolume>,
    b: Arc<ThinVolume>,
}

async fn pool_with(configure: impl FnOnce(&mut PoolRuntime)) -> Pool {
    let disk = CrashGroup::new().disk(sector_disk(META + EXTENTS * EXTENT));
    let child: DeviceRef = Arc::new(disk.clone());
    let mut settings = settings();
    configure(&mut settings);
    let pool = ThinPool::format("pool", child, &pool_options(EXTENT, META), settings)
        .await
        .unwrap();
    assert_eq!(pool.extents(), EXTENTS);
    let a = pool.create_volume("a", VOLUME).await.unwrap();
    let b = pool.create_volume("b", VOLUME).await.unwrap();
    Pool { disk, pool, a, b }
}

fn fill(seed: u8, len: u64) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| seed ^ (i / 512) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// Writes extent after extent, alternating volumes, until the pool refuses; returns what
/// each volume was acknowledged.
async fn fill_pool(p: &Pool) -> Vec<(usize, u64, Bytes)> {
    let mut acknowledged = Vec::new();
    for i in 0..EXTENTS + 1 {
        let (index, volume) = if i % 2 == 0 { (0, &p.a) } else { (1, &p.b) };
        let offset = (i / 2) * EXTENT;
        let data = fill(i as u8 + 1, EXTENT);
        match volume
            .write(offset, data.clone(), WriteFlags::default())
            .await
        {
            Ok(()) => acknowledged.push((index, offset, data)),
            Err(error) => {
                assert!(matches!(error, BlockError::NoSpace), "{error:?}");
                assert_eq!(i, EXTENTS, "refused before the pool was full");
                return acknowledged;
            }
        }
    }
    panic!("an 11th extent was allocated in a 10-extent pool");
}

async fn check_acknowledged(p: &Pool, acknowledged: &[(usize, u64, Bytes)]) {
    for (index, offset, data) in acknowledged {
        let volume = if *index == 0 { &p.a } else { &p.b };
        let got = volume.read(*offset, data.len()).await.unwrap();
        assert!(got == data[..], "volume {index} at {offset} lost its data");
    }
}

#[tokio::test]
async fn a_full_pool_refuses_new_extents_keeps_mapped_ones_and_resumes_after_discard() {
    let p = pool_with(|_| {}).await;
    let acknowledged = fill_pool(&p).await;
    assert_eq!(acknowledged.len() as u64, EXTENTS);
    assert_eq!(p.pool.allocated_extents(), EXTENTS);
    // A second refusal, in the other volume: no partial allocation, nothing corrupted.
    let error =
        p.b.write(VOLUME - 4096, fill(99, 4096), WriteFlags::default())
            .await
            .unwrap_err();
    assert!(matches!(error, BlockError::NoSpace), "{error:?}");
    // Overwrites of mapped extents keep working on a full pool, FUA and flush included.
    let overwrite = fill(77, 8192);
    p.a.write(4096, overwrite.clone(), WriteFlags { fua: true })
        .await
        .unwrap();
    p.a.flush().await.unwrap();
    let mut expected = acknowledged.clone();
    let mut first = expected[0].2.to_vec();
    first[4096..4096 + 8192].copy_from_slice(&overwrite);
    expected[0].2 = Bytes::from(first);
    check_acknowledged(&p, &expected).await;
    let space = p.pool.space();
    assert_eq!(space.no_space_errors, 2);
    assert!(space.low_space);
    // Discard works on a full pool and the freed extent serves the next allocating write.
    let (index, offset, _) = expected.pop().unwrap();
    assert_eq!(index, 1);
    p.b.discard(offset, EXTENT).await.unwrap();
    assert_eq!(p.pool.allocated_extents(), EXTENTS - 1);
    p.b.write(VOLUME - 4096, fill(99, 4096), WriteFlags::default())
        .await
        .unwrap();
    assert_eq!(p.pool.allocated_extents(), EXTENTS);
    check_acknowledged(&p, &expected).await;
    assert_eq!(&p.b.read(offset, 4096).await.unwrap()[..], &[0u8; 4096][..]);
}

#[tokio::test]
async fn write_zeroes_frees_space_on_a_full_pool() {
    let p = pool_with(|_| {}).await;
    let acknowledged = fill_pool(&p).await;
    let flags = ZeroFlags {
        may_trim: true,
        ..ZeroFlags::default()
    };
    p.a.write_zeroes(0, EXTENT, flags).await.unwrap();
    p.b.write(VOLUME - 4096, fill(5, 4096), WriteFlags::default())
        .await
        .unwrap();
    check_acknowledged(&p, &acknowledged[1..]).await;
}

#[tokio::test(start_paused = true)]
async fn a_waiting_write_resumes_when_a_discard_frees_an_extent() {
    let bound = Duration::from_secs(30);
    let p = pool_with(|s| s.when_full = WhenFull::Wait(bound)).await;
    let acknowledged = fill_pool_waiting(&p).await;
    let b = p.b.clone();
    let started = tokio::time::Instant::now();
    let waiting = tokio::spawn(async move {
        b.write(VOLUME - 8192, fill(42, 8192), WriteFlags { fua: true })
            .await
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!waiting.is_finished(), "the write did not wait for space");
    assert_eq!(p.pool.space().writes_waiting, 1);
    // The discard gets through while the write waits (it holds no lock stripe).
    p.a.discard(0, EXTENT).await.unwrap();
    waiting.await.unwrap().unwrap();
    assert!(started.elapsed() < bound);
    assert_eq!(p.pool.space().writes_waiting, 0);
    assert_eq!(
        &p.b.read(VOLUME - 8192, 8192).await.unwrap()[..],
        &fill(42, 8192)[..]
    );
    check_acknowledged(&p, &acknowledged[1..]).await;
}

#[tokio::test(start_paused = true)]
async fn a_waiting_write_fails_with_enospc_after_the_bound() {
    let bound = Duration::from_secs(30);
    let p = pool_with(|s| s.when_full = WhenFull::Wait(bound)).await;
    fill_pool_waiting(&p).await;
    let started = tokio::time::Instant::now();
    let error =
        p.b.write(VOLUME - 4096, fill(1, 4096), WriteFlags::default())
            .await
            .unwrap_err();
    assert!(matches!(error, BlockError::NoSpace), "{error:?}");
    let waited = started.elapsed();
    assert!(
        waited >= bound && waited < bound + Duration::from_secs(1),
        "{waited:?}"
    );
    // Writes into mapped extents never wait.
    let before = tokio::time::Instant::now();
    p.a.write(0, fill(3, 4096), WriteFlags::default())
        .await
        .unwrap();
    assert!(before.elapsed() < Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn deleting_a_volume_releases_a_waiting_write() {
    let p = pool_with(|s| s.when_full = WhenFull::Wait(Duration::from_secs(30))).await;
    fill_pool_waiting(&p).await;
    let a = p.a.clone();
    let waiting = tokio::spawn(async move {
        a.write(VOLUME - 4096, fill(8, 4096), WriteFlags::default())
            .await
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished());
    p.pool.delete_volume("b").await.unwrap();
    waiting.await.unwrap().unwrap();
    assert_eq!(
        &p.a.read(VOLUME - 4096, 4096).await.unwrap()[..],
        &fill(8, 4096)[..]
    );
}

/// Fills the pool of a `wait` pool: the write that would take an 11th extent is not made.
async fn fill_pool_waiting(p: &Pool) -> Vec<(usize, u64, Bytes)> {
    let mut acknowledged = Vec::new();
    for i in 0..EXTENTS {
        let (index, volume) = if i % 2 == 0 { (0, &p.a) } else { (1, &p.b) };
        let offset = (i / 2) * EXTENT;
        let data = fill(i as u8 + 1, EXTENT);
        volume
            .write(offset, data.clone(), WriteFlags::default())
            .await
            .unwrap();
        acknowledged.push((index, offset, data));
    }
    assert_eq!(p.pool.allocated_extents(), EXTENTS);
    acknowledged
}

#[tokio::test]
async fn the_low_water_mark_is_crossed_once_and_rearmed_by_frees() {
    let p = pool_with(|s| s.low_water = LowWater::parse("70%").unwrap()).await;
    for i in 0..6 {
        p.a.write(i * EXTENT, fill(1, 4096), WriteFlags::default())
            .await
            .unwrap();
    }
    let space = p.pool.space();
    assert!(!space.low_space);
    assert_eq!(space.low_water_extents, 7);
    for i in 6..9 {
        p.a.write(i * EXTENT, fill(1, 4096), WriteFlags::default())
            .await
            .unwrap();
    }
    let space = p.pool.space();
    assert!(space.low_space);
    assert_eq!(
        space.low_space_events, 1,
        "7, 8 and 9 extents: one crossing"
    );
    let status = p.pool.describe().await.unwrap();
    let detail: std::collections::HashMap<_, _> = status.detail.iter().cloned().collect();
    assert_eq!(detail["low space"], "true");
    assert_eq!(detail["extents allocated"], "9 of 10");
    assert_eq!(format!("{:?}", status.health), "Degraded");
    // Back under the mark, then over it again: a second event.
    p.a.discard(0, 3 * EXTENT).await.unwrap();
    assert!(!p.pool.space().low_space);
    p.a.write(0, fill(1, 4096), WriteFlags::default())
        .await
        .unwrap();
    assert!(p.pool.space().low_space);
    assert_eq!(p.pool.space().low_space_events, 2);
}

#[tokio::test]
async fn counts_per_volume_and_what_granule_liveness_frees() {
    let p = pool_with(|_| {}).await;
    // a: one full extent, one extent with 3 live granules. b: two full extents.
    p.a.write(0, fill(1, EXTENT), WriteFlags::default())
        .await
        .unwrap();
    p.a.write(EXTENT + 4096, fill(2, 3 * 4096), WriteFlags::default())
        .await
        .unwrap();
    p.b.write(0, fill(3, 2 * EXTENT), WriteFlags::default())
        .await
        .unwrap();
    let per_extent = EXTENT / 4096;
    let space = p.pool.space();
    assert_eq!(space.extents_allocated, 4);
    assert_eq!(space.granules_live, 3 * per_extent + 3);
    assert_eq!(space.extents_partly_dead, 1);
    // Per volume: name, extents allocated, granules live, extents partly dead.
    let usage: Vec<_> = space
        .volumes
        .iter()
        .map(|v| {
            let name = v.name.as_str();
            (
                name,
                v.extents_allocated,
                v.granules_live,
                v.extents_partly_dead,
            )
        })
        .collect();
    assert_eq!(
        usage,
        [("a", 2, per_extent + 3, 1), ("b", 2, 2 * per_extent, 0)]
    );
    // b's first extent dies in two discards: per-granule liveness frees it, whole-extent
    // liveness would not have. b's second extent goes in one discard covering it: both free it.
    p.b.discard(0, EXTENT / 2).await.unwrap();
    assert_eq!(p.pool.space().volumes[1].extents_partly_dead, 1);
    p.b.discard(EXTENT / 2, EXTENT / 2).await.unwrap();
    p.b.discard(EXTENT, EXTENT).await.unwrap();
    // a's partial extent: its live granules discarded one request each.
    for g in 1..4 {
        p.a.discard(EXTENT + g * 4096, 4096).await.unwrap();
    }
    let space = p.pool.space();
    assert_eq!(space.extents_freed, 3);
    assert_eq!(space.extents_freed_by_granules, 2);
    assert_eq!(space.extents_allocated, 1);
    assert_eq!(space.granules_live, per_extent);
    assert_eq!(space.extents_partly_dead, 0);
    let status = p.pool.describe().await.unwrap();
    let volume_a = status.children.iter().find(|c| c.name == "a").unwrap();
    let detail: std::collections::HashMap<_, _> = volume_a.detail.iter().cloned().collect();
    assert_eq!(detail["granules live"], per_extent.to_string());
    assert_eq!(detail["extents mapped"], "1");
}

#[tokio::test]
async fn extent_mode_commits_a_new_mapping_before_the_write_completes() {
    for mode in [MapCommit::Batched, MapCommit::Extent] {
        let p = pool_with(|s| s.map_commit = mode).await;
        let flushes = p.disk.stats().flushes;
        p.a.write(0, fill(1, 4096), WriteFlags::default())
            .await
            .unwrap();
        let committed = p.pool.store().uncommitted() == 0;
        let flushed = p.disk.stats().flushes > flushes;
        assert_eq!(committed, mode == MapCommit::Extent, "{mode:?}");
        assert_eq!(flushed, mode == MapCommit::Extent, "{mode:?}");
        // Overwrites of live granules commit nothing in either mode.
        let flushes = p.disk.stats().flushes;
        p.a.write(0, fill(2, 4096), WriteFlags::default())
            .await
            .unwrap();
        assert_eq!(p.disk.stats().flushes, flushes, "{mode:?}");
        // Reviving discarded granules of a mapped extent is a map change too.
        p.a.write(8192, fill(3, 4096), WriteFlags::default())
            .await
            .unwrap();
        p.a.flush().await.unwrap();
        p.a.discard(8192, 4096).await.unwrap();
        p.a.flush().await.unwrap();
        p.a.write(8192, fill(4, 4096), WriteFlags::default())
            .await
            .unwrap();
        assert_eq!(
            p.pool.store().uncommitted() == 0,
            mode == MapCommit::Extent,
            "{mode:?}"
        );
    }
}

/// Discard and delete run as `Reclaim` transactions, which may use the metadata reserve: with
/// the metadata region full to its ordinary limit they still work, while a write that needs a
/// new mapping is refused with ENOSPC and changes nothing.
#[tokio::test]
async fn discard_and_delete_work_when_the_metadata_is_full() {
    let p = pool_with(|_| {}).await;
    p.a.write(0, fill(1, 2 * EXTENT), WriteFlags::default())
        .await
        .unwrap();
    p.b.write(0, fill(2, EXTENT), WriteFlags::default())
        .await
        .unwrap();
    // A volume with nothing mapped: its first write needs a new map page.
    let c = p.pool.create_volume("c", VOLUME).await.unwrap();
    // Fill the metadata with ballast up to the ordinary limit.
    let store = p.pool.store().clone();
    let ballast = store
        .transact(strata_meta::TxnClass::Normal, |_, txn| {
            Ok(txn.create_blob("ballast"))
        })
        .unwrap();
    let mut size = 0usize;
    for step in [64 << 10, 4 << 10, 512, 64, 8, 1] {
        while store
            .transact(strata_meta::TxnClass::Normal, |_, txn| {
                txn.put_blob(ballast, vec![0xee; size + step]);
                Ok(())
            })
            .is_ok()
        {
            size += step;
        }
    }
    assert!(size > 0);
    let error = c
        .write(0, fill(3, 4096), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(error, BlockError::NoSpace), "{error:?}");
    assert_eq!(
        p.pool.allocated_extents(),
        3,
        "the refused write mapped nothing"
    );
    assert!(c.read(0, 4096).await.unwrap().iter().all(|&b| b == 0));
    // A partial discard (liveness only), a whole one (a free), then a delete.
    p.a.discard(4096, 8192).await.unwrap();
    p.a.discard(EXTENT, EXTENT).await.unwrap();
    assert_eq!(p.pool.allocated_extents(), 2);
    p.pool.delete_volume("b").await.unwrap();
    assert_eq!(p.pool.allocated_extents(), 1);
    p.a.flush().await.unwrap();
    let got = p.a.read(0, EXTENT as usize).await.unwrap();
    assert_eq!(&got[..4096], &fill(1, 4096)[..]);
    assert!(got[4096..12288].iter().all(|&b| b == 0));
    assert_eq!(&got[12288..], &fill(1, EXTENT)[12288..]);
}

/// Virtual Allocation's storage expansion: when the pool's device grows (a concat given a
/// member), a full pool takes the new extents in at its next allocation, durably: a reopen
/// over the grown device finds them, and the data written into them.
#[tokio::test]
async fn a_full_pool_grows_with_its_device() {
    use strata_backend::MemoryDevice;
    use strata_core::{Control, Member};
    use strata_stateless::concat::Concat;

    let first = Arc::new(MemoryDevice::new(META + 4 * EXTENT));
    let second = Arc::new(MemoryDevice::new(4 * EXTENT));
    let member = |name: &str, device: &Arc<MemoryDevice>| Member {
        name: name.to_string(),
        device: device.clone(),
    };
    let concat = Arc::new(Concat::new("c".into(), vec![member("m0", &first)]).unwrap());
    let settings = settings();
    let pool = ThinPool::format(
        "pool",
        concat.clone(),
        &pool_options(EXTENT, META),
        settings.clone(),
    )
    .await
    .unwrap();
    let volume = pool.create_volume("v", VOLUME).await.unwrap();
    for i in 0..4 {
        volume
            .write(i * EXTENT, fill(i as u8, EXTENT), WriteFlags::default())
            .await
            .unwrap();
    }
    let error = volume
        .write(4 * EXTENT, fill(4, EXTENT), WriteFlags::default())
        .await
        .unwrap_err();
    assert!(matches!(error, BlockError::NoSpace), "{error:?}");
    assert!(pool.space().low_space);
    concat
        .control(Control::AddMember(member("m1", &second)))
        .await
        .unwrap();
    for i in 4..8 {
        volume
            .write(i * EXTENT, fill(i as u8, EXTENT), WriteFlags::default())
            .await
            .unwrap();
    }
    assert_eq!(pool.extents(), 8);
    assert_eq!(pool.allocated_extents(), 8);
    volume.flush().await.unwrap();
    drop((volume, pool));
    let grown = Arc::new(
        Concat::new(
            "c".into(),
            vec![member("m0", &first), member("m1", &second)],
        )
        .unwrap(),
    );
    let (pool, _) = ThinPool::open("pool", grown, settings).await.unwrap();
    assert_eq!(pool.extents(), 8, "the grown extent count is recorded");
    assert!(pool.store().read(strata_thin::check_state).is_empty());
    let volume = pool.volume("v").unwrap();
    for i in 0..8 {
        let got = volume.read(i * EXTENT, EXTENT as usize).await.unwrap();
        assert!(got == fill(i as u8, EXTENT)[..], "extent {i}");
    }
}
