//! Growing a raid5 online (ALV, and MD-Reshape as the baseline policy).
//!
//! - Every byte survives a grow under concurrent reads and writes, for several A(m, n) and
//!   both policies; the new capacity reads as zeros; after the grow every member can be lost
//!   in turn and every byte still reads back (the parity is right everywhere).
//! - Power cuts: at every mutating step of a small grow (enumerated) and at random points of
//!   grows under a workload (seeded); after each the array reopens, the grow finishes, every
//!   flushed write reads back and then any one member can be lost.
//! - A member failing mid-grow (old or new): the grow goes on degraded or waits for the
//!   replacement, as asked; pause and resume survive a restart; what a careful administrator
//!   would try and must be refused is refused.
//!
//! Replay a crash seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-raid --test suite -- raid5_grow::`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, Control, DeviceRef, Member, TokioRuntime, WriteFlags};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::{
    open_disks, sector_disk, CrashGroup, CrashPolicy, CrashRng, CrashRun, CrashStats, DeviceModel,
    DiskImage,
};
use strata_raid::raid5::{MemberState, Raid5, Settings, META_BYTES};

use common::{refused, DEGRADED};

const CHUNK: u64 = 4096;
const JOURNAL: u64 = 128 << 10;
const STRIPES: u64 = 192;

fn disk_bytes() -> u64 {
    (META_BYTES + JOURNAL).div_ceil(CHUNK) * CHUNK + STRIPES * CHUNK
}

fn settings(start: StartPolicy) -> Settings {
    settings_with(start, JOURNAL)
}

fn settings_with(start: StartPolicy, journal: u64) -> Settings {
    Settings {
        chunk: Some(CHUNK),
        journal: Some(journal),
        journal_device: None,
        unsafe_skip_journal: false,
        start,
    }
}

async fn open(children: Vec<Option<DeviceRef>>, start: StartPolicy) -> strata_core::Result<Raid5> {
    Raid5::open(
        "r5".into(),
        children,
        settings(start),
        TokioRuntime::current(),
    )
    .await
}

fn present(disks: &[strata_crash::CrashDisk]) -> Vec<Option<DeviceRef>> {
    disks
        .iter()
        .map(|d| Some(Arc::new(d.clone()) as DeviceRef))
        .collect()
}

fn grow_request(disks: &[strata_crash::CrashDisk], policy: &str, on_failure: &str) -> Control {
    let mut options = toml::Table::new();
    options.insert("policy".into(), policy.into());
    options.insert("on-failure".into(), on_failure.into());
    Control::GrowMembers {
        members: disks
            .iter()
            .map(|d| Member {
                name: format!("new{}", d.index()),
                device: Arc::new(d.clone()) as DeviceRef,
            })
            .collect(),
        options,
    }
}

/// Every disk of `group` after a clean stop (what was flushed is all there is), on new disks.
fn restarted(group: &CrashGroup) -> (CrashGroup, Vec<Option<DeviceRef>>) {
    let mut rng = CrashRng::seed_from_u64(0);
    let images = group.crash_with(CrashPolicy::DropAll, &mut rng);
    let again = CrashGroup::new();
    let children = images
        .iter()
        .map(|i| Some(Arc::new(again.disk_from(i.clone())) as DeviceRef))
        .collect();
    (again, children)
}

/// A raid5 verb without arguments (`grow-pause`, `grow-resume`).
fn call(verb: &str) -> Control {
    Control::Call {
        verb: verb.into(),
        args: toml::Table::new(),
    }
}

/// Waits until the grow is complete (or `limit` of runtime time passed, then panics).
async fn wait_grown(raid: &Raid5) {
    for _ in 0..200_000 {
        if raid.moving().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the grow did not complete: {:?}", raid.moving());
}

/// Reads the whole array and compares with `expected` (then zeros up to the size).
async fn verify(raid: &Raid5, expected: &[u8], what: &str) {
    let size = raid.geometry().size;
    let step = 16 * CHUNK;
    for offset in (0..size).step_by(step as usize) {
        let len = step.min(size - offset) as usize;
        let bytes = raid
            .read(offset, len)
            .await
            .unwrap_or_else(|e| panic!("{what}: read at {offset}: {e}"));
        for (i, &b) in bytes.iter().enumerate() {
            let at = offset as usize + i;
            let want = expected.get(at).copied().unwrap_or(0);
            assert_eq!(b, want, "{what}: byte {at} (chunk {})", at as u64 / CHUNK);
        }
    }
}

/// After a flush: every member in turn taken away, the array reopened degraded, every byte
/// checked. Proves each stripe's parity matches its data in the geometry it is in.
async fn verify_each_member_can_be_lost(group: &CrashGroup, members: usize, expected: &[u8]) {
    let mut rng = CrashRng::seed_from_u64(1);
    let images: Vec<DiskImage> = group.crash_with(CrashPolicy::DropAll, &mut rng);
    for victim in 0..members {
        let again = CrashGroup::new();
        let children = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                (i != victim).then(|| Arc::new(again.disk_from(image.clone())) as DeviceRef)
            })
            .collect();
        let raid = open(children, DEGRADED)
            .await
            .unwrap_or_else(|e| panic!("reopen without member {victim}: {e}"));
        verify(&raid, expected, &format!("member {victim} lost")).await;
    }
}

/// A random write of whole sectors inside the old size, applied to `expected` when it
/// succeeds.
async fn random_write(raid: &Raid5, rng: &mut CrashRng, size: u64, expected: &mut [u8]) {
    let len = rng.random_range(1..=24u64) * 512;
    let offset = rng.random_range(0..(size - len) / 512) * 512;
    let byte = rng.random_range(1..=255u8);
    let data = vec![byte; len as usize];
    raid.write(offset, Bytes::from(data.clone()), WriteFlags::default())
        .await
        .unwrap();
    expected[offset as usize..(offset + len) as usize].copy_from_slice(&data);
}

async fn grow_under_load(m: usize, n: usize, policy: &str, seed: u64) {
    let mut rng = CrashRng::seed_from_u64(seed);
    let group = CrashGroup::new();
    let disks = open_disks(&group, &vec![sector_disk(disk_bytes()); m], None);
    let raid = open(present(&disks), StartPolicy::FRESH).await.unwrap();
    let old_size = raid.geometry().size;
    assert_eq!(old_size, STRIPES * (m as u64 - 1) * CHUNK);
    let mut expected: Vec<u8> = (0..old_size).map(|i| (i * 7 + i / 4096) as u8).collect();
    raid.write(0, Bytes::from(expected.clone()), WriteFlags::default())
        .await
        .unwrap();
    let added = open_disks(&group, &vec![sector_disk(disk_bytes()); n], None);
    raid.control(grow_request(&added, policy, "continue"))
        .await
        .unwrap();
    // Requests while the data move: writes and reads all over the old size.
    let mut requests = 0;
    while raid.moving().is_some() && requests < 4000 {
        if rng.random_bool(0.5) {
            random_write(&raid, &mut rng, old_size, &mut expected).await;
        } else {
            let len = rng.random_range(1..=32u64) * 512;
            let offset = rng.random_range(0..(old_size - len) / 512) * 512;
            let bytes = raid.read(offset, len as usize).await.unwrap();
            assert_eq!(
                &bytes[..],
                &expected[offset as usize..(offset + len) as usize],
                "A({m},{n}) {policy}: read at {offset} during the grow (request {requests}, at {:?})",
                raid.moving()
            );
        }
        requests += 1;
        if rng.random_bool(0.05) {
            raid.flush().await.unwrap();
        }
    }
    wait_grown(&raid).await;
    assert!(
        requests > 10,
        "the grow ended before the workload could overlap it"
    );
    let new_size = STRIPES * (m + n - 1) as u64 * CHUNK;
    assert_eq!(raid.geometry().size, new_size, "A({m},{n}) {policy}: size");
    assert_eq!(raid.layout().members, m + n);
    last_grow_counted(&raid, old_size).await;
    verify(&raid, &expected, &format!("A({m},{n}) {policy} grown")).await;
    // The new capacity is usable.
    expected.resize(new_size as usize, 0);
    for _ in 0..50 {
        random_write(&raid, &mut rng, new_size, &mut expected).await;
    }
    verify(
        &raid,
        &expected,
        &format!("A({m},{n}) {policy} written after"),
    )
    .await;
    raid.flush().await.unwrap();
    drop(raid);
    verify_each_member_can_be_lost(&group, m + n, &expected).await;
}

/// Once a grow is over `describe` has no "grow" line (what `strata raid5 watch` waits for)
/// but keeps its counters as "last grow" lines: at least one checkpoint, every old byte read
/// (the critical section's are read twice: once for the backup) and more written.
async fn last_grow_counted(raid: &Raid5, old_size: u64) {
    let Ok(strata_core::ControlReply::Describe(node)) = raid.control(Control::Describe).await
    else {
        panic!("raid5 describes itself");
    };
    let detail = |key: &str| {
        node.detail
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(detail("grow"), None, "{:?}", node.detail);
    let number = |key: &str| -> u64 { detail(key).unwrap_or_default().parse().unwrap() };
    assert!(
        number("last grow metadata writes") >= 1,
        "{:?}",
        node.detail
    );
    assert!(number("last grow windows") >= 1, "{:?}", node.detail);
    let bytes = detail("last grow bytes read / written").unwrap();
    let (read, written) = bytes.split_once(" / ").unwrap();
    let (read, written): (u64, u64) = (read.parse().unwrap(), written.parse().unwrap());
    assert!(read >= old_size && written > read, "{bytes}");
    assert!(detail("last grow time").unwrap().ends_with(" s"));
}

#[tokio::test]
async fn a_grow_under_load_keeps_every_byte_and_adds_the_new_capacity() {
    grow_under_load(3, 1, "alv", 1).await;
    grow_under_load(3, 2, "alv", 2).await;
    grow_under_load(4, 1, "alv", 3).await;
    grow_under_load(5, 3, "alv", 4).await;
}

#[tokio::test]
async fn the_md_reshape_baseline_keeps_every_byte_too() {
    grow_under_load(3, 1, "md", 5).await;
    grow_under_load(4, 2, "md", 6).await;
}

/// One grow under power cuts. Returns the number of crash points it went through.
async fn grow_crash_seed(seed: u64, crash_at: Option<u64>) -> Result<CrashStats, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let (m, n) = match crash_at {
        Some(_) => (3, 1),
        None => (rng.random_range(3..=4usize), rng.random_range(1..=2usize)),
    };
    let policy = if crash_at.is_none() && rng.random_bool(0.3) {
        "md"
    } else {
        "alv"
    };
    let group = CrashGroup::new();
    let disks = open_disks(&group, &vec![sector_disk(disk_bytes()); m], None);
    let raid = open(present(&disks), StartPolicy::FRESH)
        .await
        .map_err(|e| format!("create: {e}"))?;
    let old_size = raid.geometry().size;
    let mut model = DeviceModel::new(old_size);
    let stripe = CHUNK * (m as u64 - 1);
    for offset in (0..old_size).step_by((4 * stripe) as usize) {
        let len = (4 * stripe).min(old_size - offset) as usize;
        let (id, data) = model.pattern_write_started(offset, len);
        raid.write(offset, data, WriteFlags::default())
            .await
            .map_err(|e| format!("fill: {e}"))?;
        model.write_completed(id, false);
    }
    let id = model.flush_started();
    raid.flush().await.map_err(|e| format!("flush: {e}"))?;
    model.flush_completed(id);
    let added = open_disks(&group, &vec![sector_disk(disk_bytes()); n], None);
    let start = group.mutating_ops();
    group.arm_crash_at(start + crash_at.unwrap_or_else(|| rng.random_range(0..5000)));
    let mut log = vec![format!("A({m},{n}) {policy}")];
    // In a third of the seeds a member dies during the grow, before the power cut: by an
    // administrator's fail-member, or by its I/O failing under the mover (mid-window).
    let dying = (crash_at.is_none() && rng.random_bool(0.33)).then(|| {
        (
            rng.random_range(0..m + n),
            rng.random_range(0..200u64),
            rng.random_bool(0.5),
        )
    });
    log.push(format!("dying member (index, step, by faults): {dying:?}"));
    let started = raid.control(grow_request(&added, policy, "continue")).await;
    log.push(format!("grow started: {}", started.is_ok()));
    // A workload while the grow runs, until the power fails or the grow ends.
    for step in 0..2000 {
        if group.is_powered_off() || raid.moving().is_none() {
            break;
        }
        if let Some((victim, at, faults)) = dying {
            if step == at {
                if faults {
                    let disk = if victim < m {
                        &disks[victim]
                    } else {
                        &added[victim - m]
                    };
                    disk.fail_reads(0, disk_bytes());
                    disk.fail_writes(0, disk_bytes());
                } else {
                    let _ = raid.control(Control::FailMember { index: victim }).await;
                }
                log.push(format!("{step}: member {victim} dies"));
            }
        }
        // The mover gets a few windows' turns between requests, so that cuts land all
        // along the grow, its end included.
        for _ in 0..rng.random_range(0..4) {
            tokio::task::yield_now().await;
        }
        if crash_at.is_some() || rng.random_bool(0.5) {
            tokio::task::yield_now().await;
            continue;
        }
        if rng.random_bool(0.15) {
            let id = model.flush_started();
            match raid.flush().await {
                Ok(()) => model.flush_completed(id),
                Err(_) => model.flush_failed(id),
            }
            log.push("flush".into());
            continue;
        }
        let sectors = rng.random_range(1..=16u64);
        let offset = rng.random_range(0..=(old_size / 512 - sectors)) * 512;
        let fua = rng.random_bool(0.2);
        let (id, data) = model.pattern_write_started(offset, (sectors * 512) as usize);
        let result = raid.write(offset, data, WriteFlags { fua }).await;
        log.push(format!(
            "{step}: {id} write [{offset}, +{}) fua={fua}: {}",
            sectors * 512,
            result.is_ok()
        ));
        match result {
            Ok(()) => model.write_completed(id, fua),
            Err(_) => model.write_failed(id),
        }
    }
    // Either the power failed or the grow finished: cut the power now in any case.
    let finished = raid.moving().is_none() && !group.is_powered_off();
    log.push(format!("grow finished before the cut: {finished}"));
    let images: Vec<DiskImage> = group.crash(&mut rng);
    model.crashed();
    drop(raid);
    let fail = |what: String| format!("seed {seed}: {what}\n  {}", log.join("\n  "));
    // The restart: the configuration names the new disks once the grow was recorded; before
    // that the server never wrote them into it, so it starts with the old ones.
    let again = CrashGroup::new();
    let all: Vec<Option<DeviceRef>> = images
        .iter()
        .map(|image| Some(Arc::new(again.disk_from(image.clone())) as DeviceRef))
        .collect();
    let (raid, members) = match open(all, StartPolicy::FRESH).await {
        Ok(raid) => (raid, m + n),
        Err(error)
            if error
                .to_string()
                .contains(&format!("created with {m} members")) =>
        {
            let old: Vec<Option<DeviceRef>> = images[..m]
                .iter()
                .map(|image| Some(Arc::new(again.disk_from(image.clone())) as DeviceRef))
                .collect();
            let raid = open(old, StartPolicy::FRESH)
                .await
                .map_err(|e| fail(format!("reopen with the old members: {e}")))?;
            (raid, m)
        }
        Err(error) => return Err(fail(format!("reopen: {error}"))),
    };
    if raid.moving().is_some() {
        for _ in 0..200_000 {
            if raid.moving().is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if raid.moving().is_some() {
            return Err(fail(format!(
                "the grow did not finish after the restart: {:?}",
                raid.moving()
            )));
        }
    }
    let expect_size = STRIPES * (members as u64 - 1) * CHUNK;
    if raid.geometry().size != expect_size {
        return Err(fail(format!(
            "size {} after the restart, expected {expect_size}",
            raid.geometry().size
        )));
    }
    let mut settled = vec![0u8; expect_size as usize];
    for offset in (0..expect_size).step_by(CHUNK as usize) {
        let bytes = raid
            .read(offset, CHUNK as usize)
            .await
            .map_err(|e| fail(format!("read at {offset}: {e}")))?;
        if offset < old_size {
            model
                .check(offset, &bytes)
                .map_err(|e| fail(format!("wrong data at {offset}\n{e}")))?;
        } else if bytes.iter().any(|&b| b != 0) {
            return Err(fail(format!("the new capacity at {offset} is not zeros")));
        }
        settled[offset as usize..(offset + CHUNK) as usize].copy_from_slice(&bytes);
    }
    raid.flush()
        .await
        .map_err(|e| fail(format!("flush: {e}")))?;
    let degraded = raid
        .member_states()
        .iter()
        .any(|s| *s != MemberState::Active);
    drop(raid);
    if degraded {
        // A member is gone already: a second loss is beyond RAID-5.
        return Ok(CrashStats { crash_points: 1 });
    }
    // Parity everywhere: lose one member at random and read everything again.
    let victim = rng.random_range(0..members);
    let images: Vec<DiskImage> = again.crash_with(CrashPolicy::DropAll, &mut rng);
    let last = CrashGroup::new();
    let children = images[..members]
        .iter()
        .enumerate()
        .map(|(i, image)| {
            (i != victim).then(|| Arc::new(last.disk_from(image.clone())) as DeviceRef)
        })
        .collect();
    let raid = open(children, DEGRADED)
        .await
        .map_err(|e| fail(format!("reopen without member {victim}: {e}")))?;
    for offset in (0..expect_size).step_by(CHUNK as usize) {
        let bytes = raid
            .read(offset, CHUNK as usize)
            .await
            .map_err(|e| fail(format!("degraded read at {offset}: {e}")))?;
        if bytes[..] != settled[offset as usize..(offset + CHUNK) as usize] {
            return Err(fail(format!(
                "member {victim} lost: chunk at {offset} reads differently (parity wrong)"
            )));
        }
    }
    Ok(CrashStats { crash_points: 1 })
}

#[test]
fn power_cuts_at_random_points_of_grows_under_load() {
    CrashRun {
        name: "raid5 grow: power cut at a random point, restart, finish, lose a member",
        replay: "cargo test -p strata-raid --test suite -- raid5_grow::power_cuts_at_random",
        default_iterations: 300,
    }
    .run_async(|seed| grow_crash_seed(seed, None));
}

/// A power cut at every mutating step of an A(3,1) grow with no other I/O.
#[test]
fn a_power_cut_at_every_step_of_a_small_grow() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // How many mutating steps a whole grow takes (the cut armed beyond them never fires).
    let steps = runtime.block_on(async {
        let group = CrashGroup::new();
        let disks = open_disks(&group, &[sector_disk(disk_bytes()); 3], None);
        let raid = open(present(&disks), StartPolicy::FRESH).await.unwrap();
        let added = open_disks(&group, &[sector_disk(disk_bytes())], None);
        let before = group.mutating_ops();
        raid.control(grow_request(&added, "alv", "continue"))
            .await
            .unwrap();
        wait_grown(&raid).await;
        group.mutating_ops() - before
    });
    assert!(
        steps > 20,
        "a grow of {STRIPES} stripes took only {steps} steps"
    );
    for at in 0..=steps {
        if let Err(failure) = runtime.block_on(grow_crash_seed(at, Some(at))) {
            panic!("power cut at step {at} of {steps}: {failure}");
        }
    }
    eprintln!("a power cut at each of the {steps} steps of an A(3,1) grow: all recovered");
}

/// A small write to an old stripe logs its result in the stripe journal; once the grow has
/// moved that stripe's chunks and written new stripes over its row, replaying that record
/// after a crash would write old-geometry bytes over them. Each checkpoint starts a new
/// journal epoch so that it never is.
#[tokio::test]
async fn a_journal_record_of_a_moved_row_is_never_replayed_over_its_new_contents() {
    let group = CrashGroup::new();
    let disks = open_disks(&group, &[sector_disk(disk_bytes()); 3], None);
    let raid = open(present(&disks), StartPolicy::FRESH).await.unwrap();
    let old_size = raid.geometry().size;
    let mut expected: Vec<u8> = (0..old_size).map(|i| (i / 512 % 253) as u8).collect();
    raid.write(0, Bytes::from(expected.clone()), WriteFlags::default())
        .await
        .unwrap();
    let added = open_disks(&group, &[sector_disk(disk_bytes())], None);
    raid.control(grow_request(&added, "alv", "continue"))
        .await
        .unwrap();
    raid.control(call("grow-pause")).await.unwrap();
    let start = raid.moving().expect("paused at its start");
    // Chunk 80 lives in old row 40; new row 40 (chunks 120..123) is written only after the
    // checkpoint has passed chunk 82.
    let row = 40u64;
    assert!(start.moved < 2 * row, "{start:?}");
    let offset = 2 * row * CHUNK + 1024;
    let small = vec![0xA5u8; 512];
    raid.write(offset, Bytes::from(small.clone()), WriteFlags::default())
        .await
        .unwrap();
    expected[offset as usize..offset as usize + 512].copy_from_slice(&small);
    raid.control(call("grow-resume")).await.unwrap();
    while raid.moving().is_some_and(|mv| mv.moved < 3 * (row + 2)) {
        tokio::task::yield_now().await;
    }
    raid.control(call("grow-pause")).await.unwrap();
    // A paused mover records what it copied before it sleeps.
    while raid.moving().is_some_and(|mv| mv.checkpoint < mv.moved) {
        tokio::task::yield_now().await;
    }
    let at = raid.moving().expect("paused mid-grow");
    assert!(
        at.checkpoint >= 3 * (row + 1),
        "new row {row} is written: {at:?}"
    );
    raid.flush().await.unwrap();
    drop(raid);
    let (_again, children) = restarted(&group);
    let raid = open(children, common::RESTART).await.unwrap();
    verify(&raid, &expected, "after the restart, paused").await;
    raid.control(call("grow-resume")).await.unwrap();
    wait_grown(&raid).await;
    expected.resize(raid.geometry().size as usize, 0);
    verify(&raid, &expected, "grown").await;
}

/// A member failing mid-grow: with `continue` the grow finishes degraded; the replacement
/// then rebuilds in the new geometry. With `wait` it stops until the replacement is rebuilt.
async fn failure_mid_grow(victim: usize, on_failure: &str) {
    let (m, n) = (3, 1);
    let group = CrashGroup::new();
    let disks = open_disks(&group, &vec![sector_disk(disk_bytes()); m], None);
    let raid = open(present(&disks), StartPolicy::FRESH).await.unwrap();
    let old_size = raid.geometry().size;
    let mut expected: Vec<u8> = (0..old_size).map(|i| (i / 512 * 31) as u8).collect();
    raid.write(0, Bytes::from(expected.clone()), WriteFlags::default())
        .await
        .unwrap();
    let added = open_disks(&group, &vec![sector_disk(disk_bytes()); n], None);
    raid.control(grow_request(&added, "alv", on_failure))
        .await
        .unwrap();
    // Let it move some windows, pause it there, fail the member, resume.
    let total = STRIPES * (m + n - 1) as u64;
    while raid.moving().is_some_and(|mv| mv.moved < total / 4) {
        tokio::task::yield_now().await;
    }
    raid.control(call("grow-pause")).await.unwrap();
    let paused = raid.moving().expect("paused mid-grow");
    assert!(paused.moved < total, "{paused:?}");
    let what = format!("member {victim} failed mid-grow at {paused:?} ({on_failure})");
    raid.control(Control::FailMember { index: victim })
        .await
        .unwrap();
    raid.control(call("grow-resume")).await.unwrap();
    assert_eq!(raid.member_states()[victim], MemberState::Failed);
    let mut rng = CrashRng::seed_from_u64(victim as u64);
    for _ in 0..20 {
        random_write(&raid, &mut rng, old_size, &mut expected).await;
    }
    if on_failure == "wait" {
        let at = raid.moving().expect("still growing").moved;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let still = raid.moving().expect("waits for the replacement");
        assert_eq!(
            still.moved, at,
            "{what}: the grow must not move while it waits"
        );
        verify(&raid, &expected, &format!("{what}, waiting")).await;
    } else {
        wait_grown(&raid).await;
        verify(&raid, &expected, &format!("{what}, finished degraded")).await;
    }
    let spare = open_disks(&group, &[sector_disk(disk_bytes())], None);
    raid.control(common::replace(
        victim,
        "spare",
        Arc::new(spare[0].clone()) as DeviceRef,
    ))
    .await
    .unwrap();
    for _ in 0..200_000 {
        if raid
            .member_states()
            .iter()
            .all(|s| *s == MemberState::Active)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        raid.member_states()
            .iter()
            .all(|s| *s == MemberState::Active),
        "{what}: rebuilt"
    );
    wait_grown(&raid).await;
    expected.resize(raid.geometry().size as usize, 0);
    verify(&raid, &expected, &format!("{what}, replaced")).await;
    raid.flush().await.unwrap();
    drop(raid);
    // The array's members now: the survivors, the new disk and the spare in the victim's place.
    let mut rng = CrashRng::seed_from_u64(9);
    let images = group.crash_with(CrashPolicy::DropAll, &mut rng);
    let mut members: Vec<DiskImage> = images[..m + n].to_vec();
    members[victim] = images[m + n].clone();
    for lost in 0..m + n {
        let again = CrashGroup::new();
        let children = members
            .iter()
            .enumerate()
            .map(|(i, image)| {
                (i != lost).then(|| Arc::new(again.disk_from(image.clone())) as DeviceRef)
            })
            .collect();
        let raid = open(children, DEGRADED).await.unwrap();
        verify(
            &raid,
            &expected,
            &format!("{what}, then member {lost} lost"),
        )
        .await;
    }
}

#[tokio::test]
async fn an_old_member_failing_mid_grow_leaves_it_degraded_but_correct() {
    failure_mid_grow(1, "continue").await;
}

#[tokio::test]
async fn a_new_member_failing_mid_grow_leaves_it_degraded_but_correct() {
    failure_mid_grow(3, "continue").await;
}

#[tokio::test]
async fn with_on_failure_wait_the_grow_waits_for_the_replacement() {
    failure_mid_grow(0, "wait").await;
}

#[tokio::test]
async fn pause_holds_the_grow_across_a_restart_and_resume_finishes_it() {
    let group = CrashGroup::new();
    let disks = open_disks(&group, &[sector_disk(disk_bytes()); 3], None);
    let raid = open(present(&disks), StartPolicy::FRESH).await.unwrap();
    let old_size = raid.geometry().size;
    let expected: Vec<u8> = (0..old_size).map(|i| (i % 251) as u8).collect();
    raid.write(0, Bytes::from(expected.clone()), WriteFlags::default())
        .await
        .unwrap();
    let added = open_disks(&group, &[sector_disk(disk_bytes())], None);
    raid.control(grow_request(&added, "alv", "continue"))
        .await
        .unwrap();
    raid.control(call("grow-pause")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let held = raid.moving().expect("paused, not done");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        raid.moving().unwrap().moved,
        held.moved,
        "paused: nothing moves"
    );
    raid.flush().await.unwrap();
    drop(raid);
    let (_again, children) = restarted(&group);
    let raid = open(children, common::RESTART).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = raid.moving().expect("still paused after the restart");
    assert_eq!(after.moved, after.checkpoint);
    verify(&raid, &expected, "paused, restarted").await;
    raid.control(call("grow-resume")).await.unwrap();
    wait_grown(&raid).await;
    let mut grown = expected.clone();
    grown.resize(raid.geometry().size as usize, 0);
    verify(&raid, &grown, "resumed and finished").await;
}

#[tokio::test]
async fn what_a_careful_administrator_tries_is_refused_precisely() {
    let group = CrashGroup::new();
    let disks = open_disks(&group, &[sector_disk(disk_bytes()); 3], None);
    let raid = open(present(&disks), StartPolicy::FRESH).await.unwrap();
    // A new disk smaller than the members.
    let small = open_disks(&group, &[sector_disk(disk_bytes() - CHUNK)], None);
    refused(
        raid.control(grow_request(&small, "alv", "continue")).await,
        &["needs", "bytes"],
    );
    // An unknown policy.
    let added = open_disks(&group, &[sector_disk(disk_bytes())], None);
    refused(
        raid.control(grow_request(&added, "fast", "continue")).await,
        &["policy"],
    );
    // Tuning knobs: those of the other policy's rate control, out of range, or unknown.
    for (policy, key, value, words) in [
        (
            "md",
            "bound-ms",
            "10",
            &["bound-ms, slack and buffer-kib tune ALV"][..],
        ),
        (
            "alv",
            "speed-max",
            "7000",
            &["speed-min, speed-max and stripe-cache tune md"][..],
        ),
        ("alv", "stripe-cache", "256", &["stripe-cache tune md"][..]),
        (
            "md",
            "stripe-cache",
            "0",
            &["stripe-cache must be at least 1"][..],
        ),
        ("alv", "slack", "1.5", &["slack is a ratio"][..]),
        ("md", "buffer-kib", "4096", &["buffer-kib tune ALV"][..]),
        (
            "alv",
            "buffer-kib",
            "2",
            &["buffer-kib must be at least 4"][..],
        ),
        ("alv", "bound-ms", "0", &["bound-ms must be above 0"][..]),
        (
            "alv",
            "bound-ms",
            "soon",
            &["bound-ms", "expected a number"][..],
        ),
        (
            "md",
            "speed-min",
            "300000",
            &["must not exceed speed-max"][..],
        ),
        ("alv", "rate", "5", &["no option \"rate\"", "bound-ms"][..]),
    ] {
        let mut request = grow_request(&added, policy, "continue");
        if let Control::GrowMembers { options, .. } = &mut request {
            options.insert(key.into(), value.into());
        }
        refused(raid.control(request).await, words);
    }
    assert_eq!(raid.layout().members, 3, "nothing changed");
    // A journal too small for the records of the new geometry (its size is fixed at creation).
    let five = open_disks(&group, &[sector_disk(disk_bytes()); 5], None);
    let small_journal = Raid5::open(
        "r5".into(),
        present(&five),
        settings_with(StartPolicy::FRESH, 64 << 10),
        TokioRuntime::current(),
    )
    .await
    .unwrap();
    let three = open_disks(&group, &[sector_disk(disk_bytes()); 3], None);
    refused(
        small_journal
            .control(grow_request(&three, "alv", "continue"))
            .await,
        &["journal", "too small", "8 members"],
    );
    assert_eq!(small_journal.layout().members, 5, "nothing changed");
    // A degraded array.
    raid.control(Control::FailMember { index: 2 })
        .await
        .unwrap();
    refused(
        raid.control(grow_request(&added, "alv", "continue")).await,
        &["failed or rebuilding"],
    );
    assert_eq!(raid.layout().members, 3, "nothing changed");

    // A grow recorded but the configuration still names the old members (a crash before it
    // was rewritten): the open is refused, naming what to add.
    let group = CrashGroup::new();
    let disks = open_disks(&group, &[sector_disk(disk_bytes()); 3], None);
    let raid = open(present(&disks), StartPolicy::FRESH).await.unwrap();
    let added = open_disks(&group, &[sector_disk(disk_bytes())], None);
    // With the valve's knobs set (as `strata sim alv`'s sweeps do): accepted.
    let mut request = grow_request(&added, "alv", "continue");
    if let Control::GrowMembers { options, .. } = &mut request {
        options.insert("bound-ms".into(), 8.into());
        options.insert("slack".into(), 0.05.into());
    }
    raid.control(request).await.unwrap();
    // A second grow while one runs.
    let more = open_disks(&group, &[sector_disk(disk_bytes())], None);
    if raid.moving().is_some() {
        refused(
            raid.control(grow_request(&more, "alv", "continue")).await,
            &["already under way"],
        );
    }
    raid.control(call("grow-pause")).await.unwrap();
    raid.flush().await.unwrap();
    drop(raid);
    let mut rng = CrashRng::seed_from_u64(5);
    let images = group.crash_with(CrashPolicy::DropAll, &mut rng);
    let again = CrashGroup::new();
    let old_only = images[..3]
        .iter()
        .map(|i| Some(Arc::new(again.disk_from(i.clone())) as DeviceRef))
        .collect();
    refused(
        open(old_only, common::RESTART).await,
        &["grow from 3 to 4 members", "new3", "children"],
    );
}
