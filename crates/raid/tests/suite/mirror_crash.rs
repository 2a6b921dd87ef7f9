//! Crash and fault tests of the mirror.
//!
//! - The flat-device scenario over 2 and 3 members: the mirror must behave like one disk
//!   across power cuts.
//! - The write-intent property: after a power cut members may differ only in regions whose
//!   bit is set; the resync after reopen copies exactly those regions and leaves the members
//!   byte-identical.
//! - A member that vanishes or fails its writes partway: the volume keeps serving correct
//!   data, and after a power cut (the disk plugged back in) the member is still faulty.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashDisk, CrashGroup, CrashRng, CrashRun,
    CrashStats, DeviceModel, DiskImage, ScenarioConfig,
};
use strata_raid::mirror::{MemberState, Mirror, MirrorOptions};

use crate::common;
use common::{children, mirror_options, open_mirror};

const META: u64 = 64 << 10;
const DATA: u64 = 512 << 10;
const REGION: u64 = 32 << 10;

fn options() -> MirrorOptions {
    // Clean at every flush, with no timer: runs stay replayable from their seed.
    mirror_options(META, REGION, Duration::ZERO)
}

async fn open_over(disks: &[CrashDisk]) -> strata_core::Result<Mirror> {
    open_mirror(children(disks), options()).await
}

/// A mirror over `n` fresh crash disks of one group.
async fn fresh_mirror(n: usize) -> Result<(CrashGroup, Vec<CrashDisk>, Mirror), String> {
    let group = CrashGroup::new();
    let disks: Vec<CrashDisk> = (0..n)
        .map(|_| group.disk(sector_disk(META + DATA)))
        .collect();
    let mirror = open_over(&disks).await.map_err(|e| e.to_string())?;
    Ok((group, disks, mirror))
}

/// Disks made from what the crash left (carrying no faults), and the mirror reopened over
/// them.
async fn reopen(images: Vec<DiskImage>, seed: u64) -> Result<(Vec<CrashDisk>, Mirror), String> {
    let group = CrashGroup::new();
    let disks: Vec<CrashDisk> = images.into_iter().map(|i| group.disk_from(i)).collect();
    let mirror = open_over(&disks)
        .await
        .map_err(|e| format!("seed {seed}: reopen: {e}"))?;
    Ok((disks, mirror))
}

fn flat(n: usize, name: &'static str, replay: &'static str) {
    let mut config = ScenarioConfig::new(vec![sector_disk(META + DATA); n]);
    config.discard_zeroes = true;
    config.concurrency = 4;
    config.max_write = 48 << 10;
    CrashRun {
        name,
        replay,
        default_iterations: 300,
    }
    .run_async(|seed| {
        let config = config.clone();
        async move {
            flat_device_scenario(seed, &config, |group, images| {
                let disks = open_disks(group, &config.disks, images);
                async move { Ok(Arc::new(open_over(&disks).await?) as DeviceRef) }
            })
            .await
        }
    });
}

#[test]
fn flat_device_two_members() {
    flat(
        2,
        "mirror flat device, 2 members",
        "cargo test -p strata-raid --test suite -- mirror_crash::flat_device_two_members",
    );
}

#[test]
fn flat_device_three_members() {
    flat(
        3,
        "mirror flat device, 3 members",
        "cargo test -p strata-raid --test suite -- mirror_crash::flat_device_three_members",
    );
}

/// Regions of the data area where two images differ.
fn differing_regions(images: &[DiskImage]) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for r in 0..DATA / REGION {
        let at = META + r * REGION;
        if images.iter().any(|i| !i.range_eq(&images[0], at, REGION)) {
            out.insert(r);
        }
    }
    out
}

/// One seed of the write-intent test; returns (dirty regions at reopen, regions in all,
/// regions where the members' images differed).
async fn bitmap_seed(seed: u64, n: usize) -> Result<(u64, u64, u64), String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let (group, _disks, mirror) = fresh_mirror(n).await?;
    let crash_at = group.mutating_ops() + rng.random_range(0..200);
    group.arm_crash_at(crash_at);
    // Regions written since the start of the last flush that completed: the only ones whose
    // bit may still be set (flushes clean idle regions and commit the clears).
    let mut written: BTreeSet<u64> = BTreeSet::new();
    while !group.is_powered_off() {
        if rng.random_bool(0.15) {
            if mirror.flush().await.is_ok() {
                written.clear();
            }
            continue;
        }
        // A few writes at once, each in its own region so none overlap.
        let count = rng.random_range(1..=4u64);
        let mut regions: Vec<u64> = (0..count)
            .map(|_| rng.random_range(0..DATA / REGION))
            .collect();
        regions.sort_unstable();
        regions.dedup();
        written.extend(&regions);
        let writes = regions.iter().map(|&r| {
            let len = rng.random_range(1..=16u64) * 512;
            let offset = r * REGION + rng.random_range(0..=(REGION - len) / 512) * 512;
            let data = bytes::Bytes::from(vec![rng.random::<u8>() | 1; len as usize]);
            let fua = rng.random_bool(0.2);
            mirror.write(offset, data, WriteFlags { fua })
        });
        let results = futures_util::future::join_all(writes).await;
        if !group.is_powered_off() {
            for result in results {
                result.map_err(|e| format!("seed {seed}: write failed with power on: {e}"))?;
            }
        }
    }
    let images = group.crash(&mut rng);
    drop(mirror);
    let differ = differing_regions(&images);
    let (disks, mirror) = reopen(images, seed).await?;
    let dirty: BTreeSet<u64> = mirror.dirty_region_list().into_iter().collect();
    if !dirty.is_subset(&written) {
        return Err(format!(
            "seed {seed}: dirty regions {dirty:?} but only {written:?} were written since the last flush"
        ));
    }
    if !differ.is_subset(&dirty) {
        return Err(format!(
            "seed {seed}: members differ in regions {differ:?} but only {dirty:?} are marked dirty"
        ));
    }
    mirror.wait_resync().await;
    mirror.flush().await.map_err(|e| e.to_string())?;
    let stats = mirror.stats();
    if stats.dirty_at_open != dirty.len() as u64
        || stats.dirty_regions_synced != stats.dirty_at_open
    {
        return Err(format!(
            "seed {seed}: {stats:?} with {} dirty regions",
            dirty.len()
        ));
    }
    let now: Vec<DiskImage> = disks.iter().map(|d| d.image()).collect();
    let still = differing_regions(&now);
    if !still.is_empty() {
        return Err(format!(
            "seed {seed}: members still differ in {still:?} after resync"
        ));
    }
    if mirror
        .member_states()
        .iter()
        .any(|s| *s != MemberState::InSync)
    {
        return Err(format!("seed {seed}: {:?}", mirror.member_states()));
    }
    Ok((dirty.len() as u64, DATA / REGION, differ.len() as u64))
}

fn bitmap_test(n: usize, base: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut dirty, mut total, mut differing_seeds) = (0, 0, 0);
    for seed in base..base + 200 {
        let (d, t, x) = runtime
            .block_on(bitmap_seed(seed, n))
            .unwrap_or_else(|e| panic!("{e}"));
        dirty += d;
        total += t;
        differing_seeds += u64::from(x > 0);
    }
    eprintln!(
        "{n} members: {dirty} dirty regions resynced of {total} ({differing_seeds} seeds where members differed)"
    );
    // Exercised (some crashes left the members different), and never a full resync.
    assert!(differing_seeds > 0);
    assert!(dirty < total, "{dirty} of {total}");
}

#[test]
fn after_a_crash_only_dirty_regions_resync_two_members() {
    bitmap_test(2, 1000);
}

#[test]
fn after_a_crash_only_dirty_regions_resync_three_members() {
    bitmap_test(3, 2000);
}

/// A member fails partway; the mirror keeps serving every write and read correctly; a power
/// cut later and with the disk back, the member is still faulty and the data is intact.
async fn member_failure_seed(seed: u64, n: usize) -> Result<CrashStats, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let (group, disks, mirror) = fresh_mirror(n).await?;
    let mut model = DeviceModel::new(DATA);
    let victim = rng.random_range(0..n);
    let fail_at = rng.random_range(0..60);
    let ops = 120;
    let crash_op = rng.random_range(fail_at + 1..ops);
    for step in 0..ops {
        if step == fail_at {
            if rng.random_bool(0.5) {
                disks[victim].disappear();
            } else {
                disks[victim].fail_writes(0, META + DATA);
            }
        }
        if step == crash_op {
            group.arm_crash_at(group.mutating_ops() + rng.random_range(0..4));
        }
        let len = rng.random_range(1..=32u64) * 512;
        let offset = rng.random_range(0..=(DATA - len) / 512) * 512;
        match rng.random_range(0..10) {
            0..=4 => {
                let (id, data) = model.pattern_write_started(offset, len as usize);
                let fua = rng.random_bool(0.2);
                match mirror.write(offset, data, WriteFlags { fua }).await {
                    Ok(()) => model.write_completed(id, fua),
                    Err(e) if group.is_powered_off() => {
                        let _ = e;
                        model.write_failed(id)
                    }
                    Err(e) => return Err(format!("seed {seed} step {step}: write: {e}")),
                }
            }
            5..=6 => {
                let id = model.flush_started();
                match mirror.flush().await {
                    Ok(()) => model.flush_completed(id),
                    Err(_) if group.is_powered_off() => model.flush_failed(id),
                    Err(e) => return Err(format!("seed {seed} step {step}: flush: {e}")),
                }
            }
            _ => match mirror.read(offset, len as usize).await {
                Ok(bytes) => model
                    .check_live(offset, &bytes)
                    .map_err(|e| format!("seed {seed} step {step}: {e}"))?,
                Err(_) if group.is_powered_off() => {}
                Err(e) => return Err(format!("seed {seed} step {step}: read: {e}")),
            },
        }
        if group.is_powered_off() {
            break;
        }
    }
    let marked = mirror.member_states()[victim] == MemberState::Faulty;
    let images = group.crash(&mut rng);
    drop(mirror);
    model.crashed();
    // The disk comes back: images carry no faults.
    let (_disks, mirror) = reopen(images, seed).await?;
    if marked && mirror.member_states()[victim] != MemberState::Faulty {
        return Err(format!(
            "seed {seed}: member {victim} was faulty before the crash and is {:?} after",
            mirror.member_states()[victim]
        ));
    }
    let bytes = mirror
        .read(0, DATA as usize)
        .await
        .map_err(|e| format!("seed {seed}: read after reopen: {e}"))?;
    model
        .check(0, &bytes)
        .map_err(|e| format!("seed {seed}: after the crash: {e}"))?;
    Ok(CrashStats { crash_points: 1 })
}

#[test]
fn a_failing_member_is_survived_and_stays_faulty() {
    for n in [2, 3] {
        CrashRun {
            name: "mirror member failure",
            replay: "cargo test -p strata-raid --test suite -- mirror_crash::a_failing_member",
            default_iterations: 150,
        }
        .run_async(|seed| member_failure_seed(seed, n));
    }
}

/// A member is added and resynced while writes continue; power fails at a random point; the
/// reopened mirror serves exactly what the model allows, the new member resumes from its
/// durable checkpoint (never from zero once one was recorded), and when the resync ends all
/// members' data areas are identical. Returns whether the reopen found progress to resume.
async fn resync_crash_seed(seed: u64) -> Result<bool, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let group = CrashGroup::new();
    let geometry = sector_disk(META + DATA);
    let mut disks: Vec<CrashDisk> = (0..2).map(|_| group.disk(geometry)).collect();
    let mirror = open_over(&disks).await.map_err(|e| e.to_string())?;
    let mut model = DeviceModel::new(DATA);
    // Fill the volume so the copy has something to get wrong.
    for r in 0..DATA / REGION {
        let (id, data) = model.pattern_write_started(r * REGION, REGION as usize);
        mirror
            .write(r * REGION, data, WriteFlags::default())
            .await
            .map_err(|e| e.to_string())?;
        model.write_completed(id, false);
    }
    let id = model.flush_started();
    mirror.flush().await.map_err(|e| e.to_string())?;
    model.flush_completed(id);
    let third = group.disk(geometry);
    mirror
        .control(strata_core::Control::AddMember(strata_core::Member {
            name: "d2".into(),
            device: Arc::new(third.clone()),
        }))
        .await
        .map_err(|e| format!("seed {seed}: add: {e}"))?;
    disks.push(third);
    group.arm_crash_at(group.mutating_ops() + rng.random_range(0..150));
    while !group.is_powered_off() {
        // Let the resync run a step, then one request.
        tokio::task::yield_now().await;
        let len = rng.random_range(1..=16u64) * 512;
        let offset = rng.random_range(0..=(DATA - len) / 512) * 512;
        if rng.random_bool(0.2) {
            let id = model.flush_started();
            match mirror.flush().await {
                Ok(()) => model.flush_completed(id),
                Err(_) => model.flush_failed(id),
            }
        } else if rng.random_bool(0.5) {
            let (id, data) = model.pattern_write_started(offset, len as usize);
            match mirror.write(offset, data, WriteFlags::default()).await {
                Ok(()) => model.write_completed(id, false),
                Err(_) => model.write_failed(id),
            }
        } else if let Ok(bytes) = mirror.read(offset, len as usize).await {
            model
                .check_live(offset, &bytes)
                .map_err(|e| format!("seed {seed}: during resync: {e}"))?;
        }
        if mirror.resync_idle() && !group.is_powered_off() {
            group.power_off();
        }
    }
    let images = group.crash(&mut rng);
    drop(mirror);
    model.crashed();
    let (disks, mirror) = reopen(images, seed).await?;
    let resumed = matches!(
        mirror.member_states()[2],
        MemberState::Resyncing { done } if done > 0
    );
    let bytes = mirror
        .read(0, DATA as usize)
        .await
        .map_err(|e| e.to_string())?;
    model
        .check(0, &bytes)
        .map_err(|e| format!("seed {seed}: after the crash: {e}"))?;
    mirror.wait_resync().await;
    mirror.flush().await.map_err(|e| e.to_string())?;
    if mirror.member_states() != vec![MemberState::InSync; 3] {
        return Err(format!("seed {seed}: {:?}", mirror.member_states()));
    }
    let now: Vec<DiskImage> = disks.iter().map(|d| d.image()).collect();
    let still = differing_regions(&now);
    if !still.is_empty() {
        return Err(format!(
            "seed {seed}: members differ in {still:?} after resync"
        ));
    }
    // The third member alone must serve the whole volume.
    disks[0].disappear();
    disks[1].disappear();
    let again = mirror
        .read(0, DATA as usize)
        .await
        .map_err(|e| e.to_string())?;
    if again != bytes {
        return Err(format!("seed {seed}: the resynced member holds other data"));
    }
    Ok(resumed)
}

#[test]
fn resync_survives_a_crash_and_resumes() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut resumed = 0;
    for seed in 3000..3150 {
        resumed += u64::from(
            runtime
                .block_on(resync_crash_seed(seed))
                .unwrap_or_else(|e| panic!("{e}")),
        );
    }
    eprintln!("{resumed} of 150 reopens resumed a resync from a checkpoint");
    assert!(resumed > 0);
}
