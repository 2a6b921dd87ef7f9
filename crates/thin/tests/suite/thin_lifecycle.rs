//! Thin volumes grown, shrunk and deleted at run time, against a byte-array model: reads
//! match after every step and after a reopen, cut-off regions never show old bytes again,
//! freed extents go back to the pool (and to other volumes, as zeros), and handles opened
//! before a change cannot write past the new end or into a deleted volume.

use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, BlockError, DeviceRef, WriteFlags};
use strata_crash::testkit::{block_on, Intercepted, Interceptor, Request};
use strata_thin::{check_state, ThinPool, VolumeUsage};

use crate::common;
use common::{format_pool, pool_options, settings};

const EXTENT: u64 = 64 << 10;
const EXTENTS: u64 = 16;
const KIB: u64 = 1024;

/// 1 MiB of metadata and 16 extents of 64 KiB.
async fn new_pool() -> (DeviceRef, Arc<ThinPool>) {
    let child: DeviceRef = Arc::new(MemoryDevice::new((1 << 20) + EXTENTS * EXTENT));
    let pool = format_pool(child.clone(), EXTENT, 1 << 20).await;
    (child, pool)
}

/// Reopens the pool from its device without flushing it (as after a power cut) and checks
/// every invariant of its records.
async fn reopen(child: &DeviceRef, pool: Arc<ThinPool>) -> Arc<ThinPool> {
    drop(pool);
    let pool = ThinPool::open("pool", child.clone(), settings())
        .await
        .unwrap()
        .0;
    let problems = pool.store().read(check_state);
    assert!(problems.is_empty(), "{problems:?}");
    pool
}

/// Every volume and its contents, as the pool should show them.
#[derive(Default)]
struct Model {
    volumes: std::collections::BTreeMap<String, Vec<u8>>,
}

impl Model {
    fn resize(&mut self, name: &str, size: u64) {
        self.volumes.get_mut(name).unwrap().resize(size as usize, 0);
    }

    fn write(&mut self, name: &str, offset: u64, data: &[u8]) {
        let bytes = self.volumes.get_mut(name).unwrap();
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    async fn verify(&self, pool: &Arc<ThinPool>) {
        let names: Vec<String> = self.volumes.keys().cloned().collect();
        assert_eq!(pool.volume_names(), names);
        for (name, bytes) in &self.volumes {
            let volume = pool.volume(name).unwrap();
            assert_eq!(volume.geometry().size, bytes.len() as u64, "{name} size");
            let got = volume.read(0, bytes.len()).await.unwrap();
            if got[..] != bytes[..] {
                let at = got.iter().zip(bytes).position(|(a, b)| a != b).unwrap();
                panic!(
                    "{name}: byte {at} reads {:#x}, the model has {:#x}",
                    got[at], bytes[at]
                );
            }
        }
    }
}

fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

async fn write(pool: &Arc<ThinPool>, model: &mut Model, name: &str, offset: u64, data: Vec<u8>) {
    pool.volume(name)
        .unwrap()
        .write(offset, Bytes::from(data.clone()), WriteFlags::default())
        .await
        .unwrap();
    model.write(name, offset, &data);
}

fn mapped(pool: &ThinPool, name: &str) -> u64 {
    pool.volume_usage()
        .into_iter()
        .find(|u| u.name == name)
        .unwrap()
        .mapped_extents
}

#[tokio::test]
async fn grow_shrink_and_delete_follow_the_model_across_reopens() {
    let (child, mut pool) = new_pool().await;
    let mut model = Model::default();
    for (name, size) in [("a", 4 * EXTENT), ("b", 2 * EXTENT)] {
        pool.create_volume(name, size).await.unwrap();
        model.volumes.insert(name.into(), vec![0; size as usize]);
    }
    write(&pool, &mut model, "a", 0, pattern(1, 4 * EXTENT)).await;
    write(&pool, &mut model, "b", 512, pattern(2, EXTENT)).await;
    assert_eq!(pool.allocated_extents(), 6);

    // Grow: the old bytes stay, the new space reads as zeros and takes writes.
    pool.resize_volume("a", 8 * EXTENT).await.unwrap();
    model.resize("a", 8 * EXTENT);
    model.verify(&pool).await;
    write(
        &pool,
        &mut model,
        "a",
        6 * EXTENT + 4 * KIB,
        pattern(3, 8 * KIB),
    )
    .await;
    assert_eq!(pool.allocated_extents(), 7);
    // Writes need a flush to survive; resizes and deletes are durable when they return, so
    // the reopens below flush nothing.
    pool.flush().await.unwrap();
    pool = reopen(&child, pool).await;
    model.verify(&pool).await;

    // Shrink into the middle of a granule of the second extent: the extents past it go back
    // to the pool, the cut extent stays mapped.
    let cut = EXTENT + 8 * KIB + 1536;
    pool.resize_volume("a", cut).await.unwrap();
    model.resize("a", cut);
    assert_eq!(mapped(&pool, "a"), 2);
    assert_eq!(pool.allocated_extents(), 2 + 2);
    model.verify(&pool).await;
    pool = reopen(&child, pool).await;
    model.verify(&pool).await;

    // Grow again: nothing cut off comes back, not even the tail of the cut granule.
    pool.resize_volume("a", 8 * EXTENT).await.unwrap();
    model.resize("a", 8 * EXTENT);
    model.verify(&pool).await;
    let volume = pool.volume("a").unwrap();
    let tail = volume
        .read(cut, (EXTENT - cut % EXTENT) as usize)
        .await
        .unwrap();
    assert!(tail.iter().all(|&b| b == 0), "old bytes past the cut");
    pool = reopen(&child, pool).await;
    model.verify(&pool).await;

    // Delete: every extent of the volume goes back, the other volume is untouched.
    pool.delete_volume("a").await.unwrap();
    model.volumes.remove("a");
    assert_eq!(pool.allocated_extents(), 2);
    assert!(pool.volume("a").is_none());
    model.verify(&pool).await;
    pool = reopen(&child, pool).await;
    model.verify(&pool).await;
    assert_eq!(
        pool.volume_usage(),
        vec![VolumeUsage {
            name: "b".into(),
            size: 2 * EXTENT,
            mapped_extents: 2
        }]
    );

    // The name is free again and the new volume starts empty.
    pool.create_volume("a", 3 * EXTENT).await.unwrap();
    model
        .volumes
        .insert("a".into(), vec![0; 3 * EXTENT as usize]);
    model.verify(&pool).await;
    pool = reopen(&child, pool).await;
    model.verify(&pool).await;
}

#[tokio::test]
async fn a_shrink_to_an_extent_boundary_frees_a_wholly_cut_extent_and_keeps_the_rest() {
    let (child, mut pool) = new_pool().await;
    pool.create_volume("v", 4 * EXTENT).await.unwrap();
    let volume = pool.volume("v").unwrap();
    // Extent 0 fully written, extent 1 only in its second half: the cut at 1.5 extents
    // leaves extent 1 with nothing live, so it is freed too.
    volume
        .write(0, Bytes::from(pattern(4, EXTENT)), WriteFlags::default())
        .await
        .unwrap();
    volume
        .write(
            EXTENT + EXTENT / 2,
            Bytes::from(pattern(5, EXTENT / 2)),
            WriteFlags::default(),
        )
        .await
        .unwrap();
    assert_eq!(pool.allocated_extents(), 2);
    pool.resize_volume("v", EXTENT + EXTENT / 2).await.unwrap();
    assert_eq!(
        pool.allocated_extents(),
        1,
        "the cut extent held nothing below the cut"
    );
    pool = reopen(&child, pool).await;
    assert_eq!(pool.allocated_extents(), 1);
    let volume = pool.volume("v").unwrap();
    assert_eq!(
        &volume.read(0, EXTENT as usize).await.unwrap()[..],
        &pattern(4, EXTENT)[..]
    );
}

#[tokio::test]
async fn freed_extents_reach_another_volume_as_zeros() {
    let (child, mut pool) = new_pool().await;
    pool.create_volume("old", EXTENTS * EXTENT).await.unwrap();
    let old = pool.volume("old").unwrap();
    old.write(
        0,
        Bytes::from(vec![0xaa; (EXTENTS * EXTENT) as usize]),
        WriteFlags::default(),
    )
    .await
    .unwrap();
    old.flush().await.unwrap();
    pool.create_volume("new", EXTENTS * EXTENT).await.unwrap();
    let new = pool.volume("new").unwrap();
    assert!(
        matches!(
            new.write(0, Bytes::from(vec![1u8; 512]), WriteFlags::default())
                .await,
            Err(BlockError::NoSpace)
        ),
        "the pool is full"
    );

    // Deleting and shrinking work on a full pool.
    pool.resize_volume("old", 12 * EXTENT).await.unwrap();
    assert_eq!(pool.allocated_extents(), 12);
    pool.delete_volume("old").await.unwrap();
    assert_eq!(pool.allocated_extents(), 0);
    pool = reopen(&child, pool).await;
    assert_eq!(pool.allocated_extents(), 0);

    // The new volume takes every extent the old one had, one small write in each: the rest
    // of each extent reads as zeros, never 0xaa.
    let new = pool.volume("new").unwrap();
    for extent in 0..EXTENTS {
        new.write(
            extent * EXTENT + 1024,
            Bytes::from(vec![0x5b; 512]),
            WriteFlags::default(),
        )
        .await
        .unwrap();
    }
    assert_eq!(pool.allocated_extents(), EXTENTS);
    for reopened in [false, true] {
        if reopened {
            new.flush().await.unwrap();
            pool = reopen(&child, pool).await;
        }
        let new = pool.volume("new").unwrap();
        let got = new.read(0, (EXTENTS * EXTENT) as usize).await.unwrap();
        for extent in 0..EXTENTS as usize {
            let bytes = &got[extent * EXTENT as usize..(extent + 1) * EXTENT as usize];
            assert!(bytes[..1024].iter().all(|&b| b == 0), "extent {extent}");
            assert!(
                bytes[1024..1536].iter().all(|&b| b == 0x5b),
                "extent {extent}"
            );
            assert!(bytes[1536..].iter().all(|&b| b == 0), "extent {extent}");
        }
    }
}

#[tokio::test]
async fn handles_opened_before_a_change_see_it() {
    let (_child, pool) = new_pool().await;
    pool.create_volume("v", 4 * EXTENT).await.unwrap();
    let before = pool.volume("v").unwrap();
    before
        .write(
            0,
            Bytes::from(pattern(6, 4 * EXTENT)),
            WriteFlags::default(),
        )
        .await
        .unwrap();

    pool.resize_volume("v", 2 * EXTENT).await.unwrap();
    assert_eq!(before.geometry().size, 2 * EXTENT, "the size is read live");
    let past_the_end = before
        .write(
            3 * EXTENT,
            Bytes::from(vec![7u8; 4096]),
            WriteFlags::default(),
        )
        .await;
    assert!(
        matches!(past_the_end, Err(BlockError::OutOfRange { .. })),
        "{past_the_end:?}"
    );
    assert_eq!(pool.allocated_extents(), 2, "nothing mapped past the end");

    pool.resize_volume("v", 4 * EXTENT).await.unwrap();
    assert_eq!(before.geometry().size, 4 * EXTENT);
    let got = before
        .read(2 * EXTENT, (2 * EXTENT) as usize)
        .await
        .unwrap();
    assert!(got.iter().all(|&b| b == 0), "a grow shows zeros");

    pool.delete_volume("v").await.unwrap();
    assert_eq!(before.geometry().size, 0);
    assert!(before
        .write(0, Bytes::from(vec![7u8; 4096]), WriteFlags::default())
        .await
        .is_err());
    assert!(before.read(0, 4096).await.is_err());
    // A new volume under the same name is not the old handle's.
    pool.create_volume("v", 4 * EXTENT).await.unwrap();
    assert_eq!(before.geometry().size, 0);
    assert!(before
        .write(0, Bytes::from(vec![7u8; 4096]), WriteFlags::default())
        .await
        .is_err());
    assert_eq!(pool.allocated_extents(), 0);
    let problems = pool.store().read(check_state);
    assert!(problems.is_empty(), "{problems:?}");
}

#[tokio::test]
async fn writes_racing_a_shrink_never_map_past_the_end() {
    let (child, mut pool) = new_pool().await;
    pool.create_volume("v", EXTENTS * EXTENT).await.unwrap();
    let volume = pool.volume("v").unwrap();
    let writers: Vec<_> = (0..EXTENTS)
        .map(|extent| {
            let volume = volume.clone();
            tokio::spawn(async move {
                for round in 0..8u64 {
                    let offset = extent * EXTENT + round * 4096;
                    let _ = volume
                        .write(offset, Bytes::from(vec![9u8; 4096]), WriteFlags::default())
                        .await;
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::task::yield_now().await;
    pool.resize_volume("v", 3 * EXTENT).await.unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
    assert!(mapped(&pool, "v") <= 3);
    pool.flush().await.unwrap();
    pool = reopen(&child, pool).await;
    assert!(mapped(&pool, "v") <= 3);
}

#[tokio::test]
async fn bad_changes_are_refused_with_the_reason() {
    let (_child, pool) = new_pool().await;
    pool.create_volume("v", 4 * EXTENT).await.unwrap();
    let error = |r: strata_core::Result<()>| r.unwrap_err().to_string();
    assert!(error(pool.resize_volume("v", 1000).await).contains("not a positive multiple of 512"));
    assert!(error(pool.resize_volume("v", 0).await).contains("not a positive multiple of 512"));
    assert!(error(pool.resize_volume("w", 4096).await).contains("no volume named \"w\""));
    assert!(error(pool.delete_volume("w").await).contains("no volume named \"w\""));
    assert_eq!(pool.volume_size("v"), Some(4 * EXTENT));
    pool.resize_volume("v", 4 * EXTENT).await.unwrap();
}

/// Which change a power cut interrupts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Shrink,
    Delete,
}

/// Shrinks `a` to inside a granule of its third extent: the change writes zeros and commits.
const CUT: u64 = 2 * EXTENT + 8 * KIB + 512;

async fn open_crash_pool(
    group: &strata_crash::CrashGroup,
    images: Option<Vec<strata_crash::DiskImage>>,
) -> strata_core::Result<Arc<ThinPool>> {
    let geometry = strata_crash::sector_disk((1 << 20) + EXTENTS * EXTENT);
    let fresh = images.is_none();
    let disk = strata_crash::open_disks(group, &[geometry], images).remove(0);
    let child: DeviceRef = Arc::new(disk);
    if !fresh {
        return Ok(ThinPool::open("pool", child, settings()).await?.0);
    }
    ThinPool::format("pool", child, &pool_options(EXTENT, 1 << 20), settings()).await
}

/// Power fails at every mutating I/O of a shrink and of a delete, with several random
/// outcomes of the disk cache each: the pool reopens consistent, the other volume is intact,
/// and the changed volume is as before or as after (a shrink may already have zeroed the tail
/// of the granule it cuts, which lies past the new end).
#[tokio::test]
async fn a_power_cut_during_a_shrink_or_delete_leaves_the_volume_before_or_after() {
    use strata_crash::rand::SeedableRng;
    let a_data = pattern(8, 8 * EXTENT);
    let b_data = pattern(9, 4 * EXTENT);
    for change in [Change::Shrink, Change::Delete] {
        let mut outcomes = [0usize; 2];
        for cut in 0.. {
            let group = strata_crash::CrashGroup::new();
            let pool = open_crash_pool(&group, None).await.unwrap();
            pool.create_volume("a", 8 * EXTENT).await.unwrap();
            pool.create_volume("b", 4 * EXTENT).await.unwrap();
            for (name, data) in [("a", &a_data), ("b", &b_data)] {
                pool.volume(name)
                    .unwrap()
                    .write(0, Bytes::from(data.clone()), WriteFlags::default())
                    .await
                    .unwrap();
            }
            pool.flush().await.unwrap();
            group.arm_crash_at(group.mutating_ops() + cut);
            let result = match change {
                Change::Shrink => pool.resize_volume("a", CUT).await,
                Change::Delete => pool.delete_volume("a").await,
            };
            if !group.is_powered_off() {
                result.unwrap();
                assert!(cut > 1, "{change:?} did no I/O");
                break;
            }
            for seed in 0..4 {
                let mut rng = strata_crash::CrashRng::seed_from_u64(seed);
                let images = group.crash(&mut rng);
                let reopened_group = strata_crash::CrashGroup::new();
                let pool = open_crash_pool(&reopened_group, Some(images))
                    .await
                    .unwrap_or_else(|e| panic!("{change:?}, cut {cut}, seed {seed}: {e}"));
                let problems = pool.store().read(check_state);
                assert!(problems.is_empty(), "{change:?}, cut {cut}: {problems:?}");
                let b = pool.volume("b").unwrap();
                assert_eq!(&b.read(0, b_data.len()).await.unwrap()[..], &b_data[..]);
                let size = pool.volume_size("a");
                let after = match (change, size) {
                    (Change::Delete, None) | (Change::Shrink, Some(CUT)) => true,
                    (_, Some(size)) if size == 8 * EXTENT => false,
                    other => panic!("{change:?}, cut {cut}: volume a is {other:?}"),
                };
                outcomes[after as usize] += 1;
                if let Some(size) = size {
                    let got = pool
                        .volume("a")
                        .unwrap()
                        .read(0, size as usize)
                        .await
                        .unwrap();
                    let cut_granule = CUT as usize..(CUT as usize).next_multiple_of(4096);
                    for (at, (&got, &want)) in got.iter().zip(&a_data).enumerate() {
                        let zeroed_early = !after && cut_granule.contains(&at) && got == 0;
                        assert!(
                            got == want || zeroed_early,
                            "{change:?}, cut {cut}, seed {seed}: byte {at} of a"
                        );
                    }
                }
                if after && change == Change::Shrink {
                    pool.resize_volume("a", 8 * EXTENT).await.unwrap();
                    let a = pool.volume("a").unwrap();
                    let tail = a.read(CUT, (8 * EXTENT - CUT) as usize).await.unwrap();
                    assert!(
                        tail.iter().all(|&b| b == 0),
                        "{change:?}, cut {cut}: old bytes"
                    );
                }
            }
        }
        assert!(
            outcomes[0] > 0 && outcomes[1] > 0,
            "{change:?}: power cuts left only one outcome {outcomes:?}"
        );
    }
}

/// One step of the randomized run; positions and sizes are fractions, scaled to the volume's
/// size at the time.
#[derive(Clone, Debug)]
enum Step {
    Write {
        volume: usize,
        at: f64,
        sectors: u64,
        fill: u8,
    },
    Zero {
        volume: usize,
        at: f64,
        sectors: u64,
    },
    Resize {
        volume: usize,
        sectors: u64,
    },
    Recreate {
        volume: usize,
        sectors: u64,
    },
    Reopen,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    // Up to 2 MiB per volume, two volumes, 4 MiB of pool: never full, so every write lands.
    let sectors = 1u64..4096;
    prop_oneof![
        5 => (0usize..2, 0.0..1.0f64, 1u64..300, any::<u8>())
            .prop_map(|(volume, at, sectors, fill)| Step::Write { volume, at, sectors, fill: fill | 1 }),
        2 => (0usize..2, 0.0..1.0f64, 1u64..300)
            .prop_map(|(volume, at, sectors)| Step::Zero { volume, at, sectors }),
        3 => (0usize..2, sectors.clone()).prop_map(|(volume, sectors)| Step::Resize { volume, sectors }),
        1 => (0usize..2, sectors).prop_map(|(volume, sectors)| Step::Recreate { volume, sectors }),
        1 => Just(Step::Reopen),
    ]
}

/// A request inside a volume of `size` bytes: 512-aligned, at least one sector.
fn place(size: u64, at: f64, sectors: u64) -> (u64, u64) {
    let offset = ((size as f64 * at) as u64 / 512 * 512).min(size - 512);
    (offset, (sectors * 512).min(size - offset))
}

fn run_steps(steps: Vec<Step>) {
    block_on(async {
        let child: DeviceRef = Arc::new(MemoryDevice::new((1 << 20) + 64 * EXTENT));
        let mut pool = format_pool(child.clone(), EXTENT, 1 << 20).await;
        let names = ["a", "b"];
        let mut model = Model::default();
        for name in names {
            pool.create_volume(name, 256 * KIB).await.unwrap();
            model
                .volumes
                .insert(name.into(), vec![0; 256 * KIB as usize]);
        }
        for step in steps {
            match step {
                Step::Write {
                    volume,
                    at,
                    sectors,
                    fill,
                } => {
                    let name = names[volume];
                    let size = model.volumes[name].len() as u64;
                    let (offset, len) = place(size, at, sectors);
                    write(&pool, &mut model, name, offset, vec![fill; len as usize]).await;
                }
                Step::Zero {
                    volume,
                    at,
                    sectors,
                } => {
                    let name = names[volume];
                    let size = model.volumes[name].len() as u64;
                    let (offset, len) = place(size, at, sectors);
                    let flags = strata_core::ZeroFlags {
                        may_trim: true,
                        fast: false,
                        fua: false,
                    };
                    pool.volume(name)
                        .unwrap()
                        .write_zeroes(offset, len, flags)
                        .await
                        .unwrap();
                    model.write(name, offset, &vec![0; len as usize]);
                }
                Step::Resize { volume, sectors } => {
                    pool.resize_volume(names[volume], sectors * 512)
                        .await
                        .unwrap();
                    model.resize(names[volume], sectors * 512);
                }
                Step::Recreate { volume, sectors } => {
                    pool.delete_volume(names[volume]).await.unwrap();
                    pool.create_volume(names[volume], sectors * 512)
                        .await
                        .unwrap();
                    model
                        .volumes
                        .insert(names[volume].into(), vec![0; (sectors * 512) as usize]);
                }
                Step::Reopen => {
                    pool.flush().await.unwrap();
                    pool = reopen(&child, pool).await;
                }
            }
            model.verify(&pool).await;
            let problems = pool.store().read(check_state);
            assert!(problems.is_empty(), "{problems:?}");
            let mapped: u64 = pool.volume_usage().iter().map(|u| u.mapped_extents).sum();
            assert_eq!(mapped, pool.allocated_extents());
        }
    });
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]
    #[test]
    fn resizes_and_deletes_mixed_with_io_match_the_model(
        steps in proptest::collection::vec(step(), 1..40)
    ) {
        run_steps(steps);
    }
}

/// Holds flushes while `hold` is set, to look at the pool while a commit is in flight.
#[derive(Default)]
struct HeldFlush {
    hold: std::sync::atomic::AtomicBool,
    waiting: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[strata_core::async_trait]
impl Interceptor for HeldFlush {
    async fn before(&self, request: Request) -> strata_core::Result<()> {
        if request == Request::Flush && self.hold.load(std::sync::atomic::Ordering::SeqCst) {
            self.waiting.notify_one();
            self.release.notified().await;
        }
        Ok(())
    }
}

/// The extents a delete frees wait for its commit: a write that needs one while the commit
/// is in flight waits for it instead of taking an extent whose free a crash could undo.
#[tokio::test]
async fn extents_freed_by_a_delete_are_not_reused_before_its_commit() {
    let disk = Intercepted::new(
        Arc::new(MemoryDevice::new((1 << 20) + EXTENTS * EXTENT)),
        HeldFlush::default(),
    );
    let child: DeviceRef = disk.clone();
    let pool = format_pool(child, EXTENT, 1 << 20).await;
    pool.create_volume("a", 8 * EXTENT).await.unwrap();
    pool.create_volume("b", EXTENTS * EXTENT).await.unwrap();
    let (a, b) = (pool.volume("a").unwrap(), pool.volume("b").unwrap());
    a.write(
        0,
        Bytes::from(vec![0xaa; 8 * EXTENT as usize]),
        WriteFlags::default(),
    )
    .await
    .unwrap();
    b.write(
        0,
        Bytes::from(vec![0xbb; 8 * EXTENT as usize]),
        WriteFlags::default(),
    )
    .await
    .unwrap();
    pool.flush().await.unwrap();
    assert_eq!(pool.allocated_extents(), EXTENTS, "the pool is full");

    disk.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let deleting = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.delete_volume("a").await })
    };
    disk.waiting.notified().await; // the delete's commit is flushing
    assert_eq!(pool.allocated_extents(), EXTENTS - 8, "freed in memory");
    let writing = {
        let b = b.clone();
        tokio::spawn(async move {
            b.write(
                8 * EXTENT,
                Bytes::from(vec![0xcc; 4096]),
                WriteFlags::default(),
            )
            .await
        })
    };
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert!(
        !writing.is_finished(),
        "a write took a freed extent before the free was durable"
    );
    disk.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    disk.release.notify_waiters();
    deleting.await.unwrap().unwrap();
    writing.await.unwrap().unwrap();
    assert_eq!(pool.allocated_extents(), EXTENTS - 7);
    let got = b.read(8 * EXTENT, EXTENT as usize).await.unwrap();
    assert!(got[..4096].iter().all(|&x| x == 0xcc) && got[4096..].iter().all(|&x| x == 0));
}
