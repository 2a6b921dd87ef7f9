//! raid5 under power cuts.
//!
//! - `flat_scenario`: the generic flat-device scenario over 3 and 4 crash disks (workload,
//!   power cut, reopen with every member, whole-device check), concurrent operations included.
//! - `write_hole`: a workload, a power cut at a random point, then one random member is
//!   *removed* and the array reopened degraded. Every sector must still hold a value the model
//!   allows: the journal must have kept the other data of half-updated stripes derivable.
//!   Reads may fail (never return wrong data) only on chunks the array reports lost: a
//!   full-stripe write torn by the crash on the missing member, every sector of which the
//!   model still has in doubt.
//! - `write_hole_without_journal_is_caught`: the same with the journal switched off
//!   (`unsafe_skip_journal`); the check must fail for some seed.
//! - `write_hole_with_journal_reclaims` and `flat_scenario_small_journals`: journals of 64 to
//!   128 KiB, reclaimed every few writes, so that power fails during reclaims (after the cut,
//!   during the member flush, between the two superblock copies of a tail move).
//!
//! Replay: `STRATA_CRASH_SEED=<seed> cargo test -p strata-raid --test suite -- raid5_crash::<name>`.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, DeviceRef, TokioRuntime, WriteFlags};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashGroup, CrashRng, CrashRun, CrashStats,
    DeviceModel, DiskImage, ScenarioConfig,
};
use strata_raid::raid5::{Raid5, Settings, META_BYTES};

const CHUNK: u64 = 4096;
const JOURNAL: u64 = 64 << 10;
const STRIPES: u64 = 24;

fn disk_bytes() -> u64 {
    disk_bytes_for(JOURNAL)
}

fn disk_bytes_for(journal: u64) -> u64 {
    (META_BYTES + journal).div_ceil(CHUNK) * CHUNK + STRIPES * CHUNK
}

/// Bytes of a journal device for `members` journals (its header block plus the journals).
fn journal_device_bytes(members: usize, journal: u64) -> u64 {
    4096 + members as u64 * journal
}

fn settings(skip_journal: bool, journal_device: Option<usize>, journal: u64) -> Settings {
    Settings {
        chunk: Some(CHUNK),
        journal: Some(journal),
        journal_device,
        unsafe_skip_journal: skip_journal,
        start: StartPolicy::FRESH,
    }
}

/// Opens over `children`, the last of them the journal device if `journal_device`.
async fn open_with(
    children: Vec<Option<DeviceRef>>,
    skip_journal: bool,
    journal_device: bool,
    journal: u64,
) -> strata_core::Result<Raid5> {
    let last = journal_device.then(|| children.len() - 1);
    Raid5::open(
        "r5".into(),
        children,
        settings(skip_journal, last, journal),
        TokioRuntime::current(),
    )
    .await
}

async fn open(children: Vec<Option<DeviceRef>>, skip_journal: bool) -> strata_core::Result<Raid5> {
    open_with(children, skip_journal, false, JOURNAL).await
}

fn flat(members: usize, concurrency: usize, name: &'static str, iterations: u64) {
    flat_with(members, false, concurrency, name, iterations)
}

/// The flat scenario with at most `max_write` bytes per write.
fn flat_small(members: usize, concurrency: usize, max_write: usize, name: &'static str) {
    let config = ScenarioConfig {
        max_write,
        concurrency,
        ..ScenarioConfig::new(vec![sector_disk(disk_bytes()); members])
    };
    flat_run(config, false, name, 300);
}

fn flat_with(
    members: usize,
    journal_device: bool,
    concurrency: usize,
    name: &'static str,
    iterations: u64,
) {
    flat_sized(
        members,
        journal_device,
        concurrency,
        JOURNAL,
        name,
        iterations,
    )
}

fn flat_sized(
    members: usize,
    journal_device: bool,
    concurrency: usize,
    journal: u64,
    name: &'static str,
    iterations: u64,
) {
    let mut disks = vec![sector_disk(disk_bytes_for(journal)); members];
    if journal_device {
        disks.push(sector_disk(journal_device_bytes(members, journal)));
    }
    let mut config = ScenarioConfig::new(disks);
    config.max_write = 3 * CHUNK as usize * (members - 1);
    config.concurrency = concurrency;
    flat_run_sized(config, journal_device, journal, name, iterations);
}

fn flat_run(config: ScenarioConfig, journal_device: bool, name: &'static str, iterations: u64) {
    flat_run_sized(config, journal_device, JOURNAL, name, iterations)
}

fn flat_run_sized(
    config: ScenarioConfig,
    journal_device: bool,
    journal: u64,
    name: &'static str,
    iterations: u64,
) {
    CrashRun {
        name,
        replay: "cargo test -p strata-raid --test suite -- raid5_crash::flat",
        default_iterations: iterations,
    }
    .run_async(|seed| {
        flat_device_scenario(seed, &config, |group, images| {
            let disks = open_disks(group, &config.disks, images);
            async move {
                let children: Vec<Option<DeviceRef>> = disks
                    .into_iter()
                    .map(|d| Some(Arc::new(d) as DeviceRef))
                    .collect();
                let raid = open_with(children, false, journal_device, journal).await?;
                Ok(Arc::new(raid) as DeviceRef)
            }
        })
    });
}

#[test]
fn flat_scenario_three_members() {
    flat(3, 1, "raid5 flat, 3 members", 150);
}

#[test]
fn flat_scenario_four_members_concurrent() {
    flat(4, 4, "raid5 flat, 4 members, concurrent", 150);
}

/// Many small writes in flight over few stripes: most stripe updates carry several writes
/// (coalesced, one journal record for all), and the cut falls inside such updates.
#[test]
fn flat_scenario_small_writes_coalescing() {
    flat_small(
        5,
        8,
        4096,
        "raid5 flat, 5 members, 8 small writes in flight",
    );
}

#[test]
fn flat_scenario_journal_device() {
    flat_with(3, true, 1, "raid5 flat, 3 members + journal device", 100);
    flat_with(
        4,
        true,
        4,
        "raid5 flat, 4 members + journal device, concurrent",
        100,
    );
}

/// What the write-hole scenario runs over.
#[derive(Clone, Copy)]
struct Case {
    skip_journal: bool,
    /// The last disk holds the journals and is never the one removed.
    journal_device: bool,
    journal: u64,
    /// Operations of the workload; power fails within the first `window` mutating ones.
    ops: usize,
    window: u64,
    /// Writes issued at once.
    concurrency: usize,
    /// Member requests yield to the other tasks 0–2 times first (the crash disks complete
    /// at once otherwise, so an update would never be caught between its journal append and
    /// its in-place writes).
    yields: bool,
}

/// Yields a seeded random number of times before each request.
struct Yields(std::sync::Mutex<CrashRng>);

#[strata_core::async_trait]
impl strata_crash::testkit::Interceptor for Yields {
    async fn before(&self, _: strata_crash::testkit::Request) -> strata_core::Result<()> {
        let times = self.0.lock().unwrap().random_range(0..3);
        for _ in 0..times {
            tokio::task::yield_now().await;
        }
        Ok(())
    }
}

const CASE: Case = Case {
    skip_journal: false,
    journal_device: false,
    journal: JOURNAL,
    ops: 40,
    window: 60,
    concurrency: 1,
    yields: false,
};

/// What the seeds of a run saw of journal reclaim: reclaims completed before the power cut,
/// and power cuts that interrupted one (it failed on the dead disks).
#[derive(Default)]
struct Reclaims {
    completed: Cell<u64>,
    cut: Cell<u64>,
}

/// One seed of the write-hole scenario. Ok(()) when every sector is legal.
async fn write_hole_seed(seed: u64, skip_journal: bool) -> Result<CrashStats, String> {
    let case = Case {
        skip_journal,
        ..CASE
    };
    write_hole_seed_with(seed, case, Rc::default()).await
}

async fn write_hole_seed_with(
    seed: u64,
    case: Case,
    reclaims: Rc<Reclaims>,
) -> Result<CrashStats, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let members = rng.random_range(3..=4usize);
    let mut geometries = vec![sector_disk(disk_bytes_for(case.journal)); members];
    if case.journal_device {
        geometries.push(sector_disk(journal_device_bytes(members, case.journal)));
    }
    let reopen = |children: Vec<Option<DeviceRef>>| {
        open_with(
            children,
            case.skip_journal,
            case.journal_device,
            case.journal,
        )
    };
    let group = CrashGroup::new();
    let disks = open_disks(&group, &geometries, None);
    let children = disks
        .into_iter()
        .map(|d| {
            let disk = Arc::new(d) as DeviceRef;
            if !case.yields {
                return Some(disk);
            }
            let rng = CrashRng::seed_from_u64(rng.random());
            Some(strata_crash::testkit::Intercepted::new(disk, Yields(rng.into())) as DeviceRef)
        })
        .collect();
    let raid = reopen(children).await.map_err(|e| format!("create: {e}"))?;
    let size = raid.geometry().size;
    let stripe = CHUNK * (members as u64 - 1);
    let mut model = DeviceModel::new(size);
    let mut log = Vec::new();
    // Power fails somewhere in the first `window` mutating operations of the workload.
    let at = group.mutating_ops() + rng.random_range(0..case.window);
    group.arm_crash_at(at);
    for _ in 0..case.ops {
        if group.is_powered_off() {
            break;
        }
        if rng.random_bool(0.15) {
            let id = model.flush_started();
            match raid.flush().await {
                Ok(()) => model.flush_completed(id),
                Err(_) => model.flush_failed(id),
            }
            log.push("flush".to_string());
            continue;
        }
        // Small writes and whole stripes, in a few hot stripes so stripes are updated twice;
        // up to `concurrency` at once.
        let count = match case.concurrency {
            1 => 1,
            most => rng.random_range(1..=most),
        };
        let mut batch = Vec::with_capacity(count);
        for _ in 0..count {
            let sectors = if rng.random_bool(0.3) {
                stripe / 512
            } else {
                rng.random_range(1..=16)
            };
            let hot = 4 * stripe;
            let offset = rng.random_range(0..=(hot / 512 - sectors)) * 512;
            let offset = if rng.random_bool(0.3) {
                offset / stripe * stripe
            } else {
                offset
            };
            let fua = rng.random_bool(0.2);
            let len = sectors * 512;
            // Concurrent writes must not overlap (a block device leaves that undefined).
            let overlaps = |&(_, o, _, ref d): &(_, u64, _, bytes::Bytes)| {
                offset < o + d.len() as u64 && o < offset + len
            };
            if batch.iter().any(overlaps) {
                continue;
            }
            let (id, data) = model.pattern_write_started(offset, len as usize);
            batch.push((id, offset, fua, data));
        }
        let writes = batch.iter().map(|(_, offset, fua, data)| {
            raid.write(*offset, data.clone(), WriteFlags { fua: *fua })
        });
        let results = futures_util::future::join_all(writes).await;
        for ((id, offset, fua, data), result) in batch.into_iter().zip(results) {
            log.push(format!(
                "{id} write [{offset}, +{}) fua={fua}: {}",
                data.len(),
                result.is_ok()
            ));
            match result {
                Ok(()) => model.write_completed(id, fua),
                Err(_) => model.write_failed(id),
            }
        }
    }
    reclaims
        .completed
        .set(reclaims.completed.get() + raid.journal_reclaims());
    // Let a reclaim the power cut interrupted run into its failed I/O.
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    if raid.journal_reclaims_failed() > 0 {
        reclaims.cut.set(reclaims.cut.get() + 1);
    }
    let images: Vec<DiskImage> = group.crash(&mut rng);
    model.crashed();
    drop(raid);
    let victim = rng.random_range(0..members);
    let group = CrashGroup::new();
    let children: Vec<Option<DeviceRef>> = images
        .into_iter()
        .enumerate()
        .map(|(i, image)| (i != victim).then(|| Arc::new(group.disk_from(image)) as DeviceRef))
        .collect();
    let fail = |what: String| {
        format!(
            "seed {seed}, {members} members, member {victim} removed: {what}\n  {}",
            log.join("\n  ")
        )
    };
    let raid = reopen(children)
        .await
        .map_err(|e| fail(format!("reopen: {e}")))?;
    let lost = raid.lost_ranges();
    for offset in (0..size).step_by(CHUNK as usize) {
        match raid.read(offset, CHUNK as usize).await {
            Ok(bytes) => model
                .check(offset, &bytes)
                .map_err(|e| fail(format!("wrong data\n{e}")))?,
            Err(error) => {
                let declared = lost.iter().any(|&(o, l)| o <= offset && offset < o + l);
                let in_doubt = (offset..offset + CHUNK)
                    .step_by(512)
                    .all(|s| model.allowed(s).len() > 1);
                if !declared || !in_doubt {
                    return Err(fail(format!("read of [{offset}, +{CHUNK}) failed: {error} (declared lost: {declared}, in doubt: {in_doubt})")));
                }
            }
        }
    }
    Ok(CrashStats { crash_points: 1 })
}

#[test]
fn write_hole() {
    CrashRun {
        name: "raid5 write hole: crash, then lose a member",
        replay: "cargo test -p strata-raid --test suite -- raid5_crash::write_hole",
        default_iterations: 300,
    }
    .run_async(|seed| write_hole_seed(seed, false));
}

#[test]
fn write_hole_journal_device() {
    CrashRun {
        name: "raid5 write hole, journals on a journal device: crash, then lose a member",
        replay: "cargo test -p strata-raid --test suite -- raid5_crash::write_hole_journal_device",
        default_iterations: 300,
    }
    .run_async(|seed| {
        let case = Case {
            journal_device: true,
            ..CASE
        };
        write_hole_seed_with(seed, case, Rc::default())
    });
}

/// Journals of 64 to 128 KiB (one lane of 7 to 15 blocks a copy; a largest record takes 4 or 5)
/// and longer workloads: every seed reclaims many times, and power fails during reclaims.
/// Every sector must still be legal after a member is then removed.
#[test]
fn write_hole_with_journal_reclaims() {
    let reclaims = Rc::new(Reclaims::default());
    let summary = CrashRun {
        name: "raid5 write hole, small journals reclaimed: crash, then lose a member",
        replay: "cargo test -p strata-raid --test suite -- raid5_crash::write_hole_with_journal_reclaims",
        default_iterations: 1000,
    }
    .run_async(|seed| {
        let case = Case {
            journal: [64 << 10, 96 << 10, 128 << 10][(seed % 3) as usize],
            journal_device: seed % 4 == 3,
            ops: 60,
            window: 300,
            concurrency: 4,
            yields: true,
            ..CASE
        };
        write_hole_seed_with(seed, case, reclaims.clone())
    });
    let (completed, cut) = (reclaims.completed.get(), reclaims.cut.get());
    eprintln!(
        "{} seeds: {completed} journal reclaims before the power cuts, {cut} cuts during one",
        summary.iterations
    );
    assert!(
        completed >= 3 * summary.iterations,
        "too few reclaims: {completed}"
    );
    assert!(
        20 * cut >= summary.iterations,
        "too few cuts during a reclaim: {cut}"
    );
}

/// The flat scenario (concurrent writes and flushes, whole-device check after the reopen)
/// over journals small enough to be reclaimed every few writes.
#[test]
fn flat_scenario_small_journals() {
    flat_sized(
        3,
        false,
        4,
        64 << 10,
        "raid5 flat, 3 members, 64 KiB journals",
        150,
    );
    flat_sized(
        4,
        true,
        4,
        96 << 10,
        "raid5 flat, 4 members + journal device, 96 KiB journals",
        150,
    );
}

#[test]
fn write_hole_without_journal_is_caught() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let caught = (0..300u64)
        .map(|i| runtime.block_on(write_hole_seed(0x5EED_0000 + i, true)))
        .filter(|outcome| matches!(outcome, Err(e) if e.contains("wrong data")))
        .count();
    eprintln!("without the journal, {caught} of 300 seeds end with wrong data");
    assert!(caught > 0, "the harness did not catch the open write hole");
}

/// A member whose writes fail is failed durably: the write still succeeds (degraded), the
/// data read back are right, and after a power cut the reopened array still knows the member
/// failed (its stale chunks are never read). A second member's failure fails the array: EIO,
/// never wrong data.
#[test]
fn failing_member_is_recorded_and_a_second_failure_stops_the_array() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let geometries = vec![sector_disk(disk_bytes()); 3];
        let group = CrashGroup::new();
        let disks = open_disks(&group, &geometries, None);
        let children = disks
            .iter()
            .cloned()
            .map(|d| Some(Arc::new(d) as DeviceRef))
            .collect();
        let raid = open(children, false).await.unwrap();
        disks[1].fail_writes(META_BYTES + JOURNAL, disk_bytes());
        let data = vec![5u8; 3 * CHUNK as usize];
        raid.write(0, data.clone().into(), WriteFlags::default())
            .await
            .unwrap();
        assert_eq!(
            raid.member_states()[1],
            strata_raid::raid5::MemberState::Failed
        );
        assert_eq!(&raid.read(0, data.len()).await.unwrap()[..], &data[..]);
        raid.flush().await.unwrap();
        let mut rng = CrashRng::seed_from_u64(7);
        let images = group.crash_with(strata_crash::CrashPolicy::DropAll, &mut rng);
        let group = CrashGroup::new();
        let children = images
            .into_iter()
            .map(|i| Some(Arc::new(group.disk_from(i)) as DeviceRef))
            .collect();
        let raid = open(children, false).await.unwrap();
        assert_eq!(
            raid.member_states()[1],
            strata_raid::raid5::MemberState::Failed
        );
        assert_eq!(&raid.read(0, data.len()).await.unwrap()[..], &data[..]);
        raid.control(strata_core::Control::FailMember { index: 0 })
            .await
            .unwrap_err();
        assert!(raid.read(0, 512).await.is_err());
        assert!(raid
            .write(0, vec![1u8; 512].into(), WriteFlags::default())
            .await
            .is_err());
    });
}
