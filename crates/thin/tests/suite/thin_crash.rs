//! The thin pool under the crash harness: a volume must behave like one disk with a volatile
//! cache through any power cut: flushed and FUA writes survive, nothing reads back that was
//! never written there (another extent's old bytes included). Both map-commit modes run the
//! flat scenario; the extent mode also runs its own, which checks what only it promises: a
//! write that changed the map (allocated an extent or revived discarded granules) is durable
//! once it completes, flush or not. The batched mode must fail that check, or the check
//! could not tell the modes apart.
//!
//! Replay one seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-thin --test suite -- thin_crash::`.
//! Run longer: `STRATA_CRASH_ITERATIONS=100000 cargo test -p strata-thin --test suite -- thin_crash::`.

use std::sync::Arc;

use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::testkit::panic_report;
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashGroup, CrashPlan, CrashRng, CrashRun,
    CrashStats, DeviceModel, DiskImage, ScenarioConfig,
};
use strata_thin::{check_state, MapCommit, ThinPool, ThinVolume};

use crate::common;
use common::{pool_options, settings};

const EXTENT: u64 = 64 << 10;
/// 1 MiB of metadata and 24 extents of data, for a 1 MiB (16-extent) volume: extents are
/// freed and reused within a run.
const DISK: u64 = (1 << 20) + 24 * EXTENT;
const VOLUME: u64 = 1 << 20;

async fn open_in_mode(
    group: &CrashGroup,
    images: Option<Vec<DiskImage>>,
    planted_bug: bool,
    mode: MapCommit,
) -> strata_core::Result<Arc<ThinVolume>> {
    let fresh = images.is_none();
    let disk = open_disks(group, &[sector_disk(DISK)], images).remove(0);
    let child: DeviceRef = Arc::new(disk);
    let mut settings = settings();
    settings.unsafe_skip_data_barrier = planted_bug;
    settings.map_commit = mode;
    let pool = if fresh {
        let pool =
            ThinPool::format("pool", child, &pool_options(EXTENT, 1 << 20), settings).await?;
        pool.create_volume("v", VOLUME).await?;
        pool
    } else {
        ThinPool::open("pool", child, settings).await?.0
    };
    let problems = pool.store().read(check_state);
    assert!(
        problems.is_empty(),
        "pool invariants broken after reopen: {problems:?}"
    );
    Ok(pool.volume("v").expect("volume v"))
}

/// One seed of the flat-device scenario over a volume committing its map in `mode`, with the
/// data barrier removed when `planted_bug`.
async fn flat_seed(
    seed: u64,
    config: ScenarioConfig,
    mode: MapCommit,
    planted_bug: bool,
) -> Result<CrashStats, String> {
    flat_device_scenario(seed, &config, |group, images| {
        let group = group.clone();
        async move {
            let volume = open_in_mode(&group, images, planted_bug, mode).await?;
            Ok(volume as DeviceRef)
        }
    })
    .await
}

/// `run` of the flat-device scenario with `concurrency` requests in flight over a volume
/// committing its map in `mode`; every seed must reach a crash point.
fn run_flat(run: &CrashRun, concurrency: usize, mode: MapCommit) {
    let mut config = config();
    config.concurrency = concurrency;
    let summary = run.run_async(|seed| flat_seed(seed, config.clone(), mode, false));
    assert!(summary.crash_points >= summary.iterations);
}

fn config() -> ScenarioConfig {
    let mut config = ScenarioConfig::new(vec![sector_disk(DISK)]);
    config.rounds = 4;
    config.ops_per_round = 40;
    config.max_write = 128 << 10;
    config
}

#[test]
fn thin_volume_keeps_every_flushed_write_through_power_cuts() {
    let run = CrashRun {
        name: "thin volume",
        replay: "cargo test -p strata-thin --test suite -- thin_crash::thin_volume_keeps",
        default_iterations: 1500,
    };
    run_flat(&run, 1, MapCommit::Batched);
}

#[test]
fn thin_volume_with_concurrent_requests_survives_power_cuts() {
    let run = CrashRun {
        name: "thin volume, concurrent",
        replay: "cargo test -p strata-thin --test suite -- thin_crash::concurrent",
        default_iterations: 500,
    };
    run_flat(&run, 4, MapCommit::Batched);
}

/// The ordering bug every thin layer must not have: metadata committed before the data it
/// points to is durable. The harness must catch it, and say how to replay it.
#[test]
fn the_harness_catches_metadata_committed_before_its_data() {
    let run = CrashRun {
        name: "thin volume with the data barrier removed",
        replay: "cargo test -p strata-thin --test suite -- thin_crash::catches",
        default_iterations: 0,
    };
    let config = config();
    let plan = CrashPlan {
        first: 0xBAD_0000,
        count: 400,
    };
    let message = panic_report(
        || {
            run.run_plan_async(plan, |seed| {
                flat_seed(seed, config.clone(), MapCommit::Batched, true)
            })
        },
        "400 seeds ran with the ordering bug planted and none failed",
    );
    assert!(message.contains("replay: STRATA_CRASH_SEED="), "{message}");
    assert!(message.contains("after the crash"), "{message}");
}

#[test]
fn extent_mode_keeps_every_flushed_write_through_power_cuts() {
    for (name, concurrency, iterations) in [
        ("thin volume, extent mode", 1, 800),
        ("thin volume, extent mode, concurrent", 4, 300),
    ] {
        let run = CrashRun {
            name,
            replay: "cargo test -p strata-thin --test suite -- thin_crash::extent_mode_keeps",
            default_iterations: iterations,
        };
        run_flat(&run, concurrency, MapCommit::Extent);
    }
}

#[test]
fn extent_mode_makes_a_write_that_changes_the_map_durable_when_it_completes() {
    let run = CrashRun {
        name: "thin volume, extent mode, map changes hardened",
        replay: "cargo test -p strata-thin --test suite -- thin_crash::hardened",
        default_iterations: 600,
    };
    let summary = run.run_async(|seed| hardening_scenario(seed, MapCommit::Extent));
    assert!(summary.crash_points >= summary.iterations);
}

/// The same check over the batched mode must fail: its allocating writes are not durable
/// before a FLUSH, and the scenario must notice.
#[test]
fn the_hardening_check_fails_the_batched_mode() {
    let run = CrashRun {
        name: "thin volume, batched mode, held to extent mode's promise",
        replay: "cargo test -p strata-thin --test suite -- thin_crash::fails_the_batched",
        default_iterations: 0,
    };
    let plan = CrashPlan {
        first: 0xBA7C_0000,
        count: 200,
    };
    let message = panic_report(
        || run.run_plan_async(plan, |seed| hardening_scenario(seed, MapCommit::Batched)),
        "200 seeds held batched mode to extent mode's promise and none failed",
    );
    assert!(
        message.contains("a hardened write did not survive the power cut"),
        "{message}"
    );
    assert!(message.contains("replay: STRATA_CRASH_SEED="), "{message}");
}

/// Sequential writes (mostly without FUA), whole-granule discards and a few flushes over one
/// volume, with power cuts. A write is durable at completion in the model when it carried FUA
/// or, as `mode` is held to extent mode's promise, when it ran a metadata transaction (so it
/// allocated an extent or revived discarded granules). After each cut every sector must hold
/// one of its candidates: such a write's data may not read back as zeros or older data.
async fn hardening_scenario(seed: u64, mode: MapCommit) -> Result<CrashStats, String> {
    const ROUNDS: u64 = 4;
    const OPS: u32 = 30;
    let mut rng = CrashRng::seed_from_u64(seed);
    let mut model = DeviceModel::new(VOLUME);
    let mut group = CrashGroup::new();
    let mut volume = open_in_mode(&group, None, false, mode)
        .await
        .map_err(|e| format!("seed {seed}: format: {e}"))?;
    let mut log = Vec::new();
    for round in 0..ROUNDS {
        let crash_op = rng.random_range(0..OPS);
        for n in 0..OPS {
            if n == crash_op {
                group.arm_crash_at(group.mutating_ops() + rng.random_range(0..4));
            }
            let roll = rng.random_range(0..100u32);
            if roll < 10 {
                flush_recorded(&mut model, &volume, &mut log).await;
            } else if roll < 25 {
                let (offset, len) = random_granules(&mut rng);
                let id = model.zeroes_started(offset, len);
                match volume.discard(offset, len).await {
                    Ok(()) => model.write_completed(id, false),
                    Err(_) => model.write_failed(id),
                }
                log.push(format!("{id} discard [{offset}, +{len})"));
            } else {
                let (offset, len) = random_sectors(&mut rng);
                let fua = rng.random_bool(0.1);
                let (id, data) = model.pattern_write_started(offset, len as usize);
                let txns = volume.pool().store().next_txn();
                match volume.write(offset, data, WriteFlags { fua }).await {
                    Ok(()) => {
                        let hardened = volume.pool().store().next_txn() > txns;
                        model.write_completed(id, fua || hardened);
                        log.push(format!(
                            "{id} write [{offset}, +{len}) fua={fua} hardened={hardened}"
                        ));
                    }
                    Err(_) => {
                        model.write_failed(id);
                        log.push(format!("{id} write [{offset}, +{len}): failed"));
                    }
                }
            }
            if group.is_powered_off() {
                break;
            }
        }
        let images = group.crash(&mut rng);
        model.crashed();
        log.push("--- power cut".to_string());
        drop(volume);
        group = CrashGroup::new();
        volume = open_in_mode(&group, Some(images), false, mode)
            .await
            .map_err(|e| format!("seed {seed}, round {round}: reopen: {e}"))?;
        let bytes = volume
            .read(0, VOLUME as usize)
            .await
            .map_err(|e| format!("seed {seed}: read after reopen: {e}"))?;
        if let Err(problem) = model.check(0, &bytes) {
            let recent = log[log.len().saturating_sub(12)..].join("\n  ");
            return Err(format!(
                "seed {seed}, round {round}: a hardened write did not survive the power cut\n{problem}\nrecent operations:\n  {recent}"
            ));
        }
        model.settle(0, &bytes);
    }
    Ok(CrashStats {
        crash_points: ROUNDS,
    })
}

/// Versions under power cuts: writes, zeroing and flushes on a volume mixed with snapshots
/// taken, deleted, rolled back to, compacted and uncompacted. After every cut: the pool's
/// records are consistent; every snapshot whose creation completed (and whose deletion did
/// not) is listed and reads exactly what the volume read when it was taken; a snapshot
/// caught mid-creation or mid-deletion either is gone or reads as it should; the volume keeps
/// every flushed write (a rollback caught mid-way leaves it as before or as the snapshot,
/// nothing else).
#[test]
fn versions_keep_every_completed_snapshot_and_flushed_write_through_power_cuts() {
    let run = CrashRun {
        name: "thin volume with versions",
        replay: "cargo test -p strata-thin --test suite -- thin_crash::versions_keep",
        default_iterations: 1000,
    };
    let summary = run.run_async(versions_scenario);
    assert!(summary.crash_points >= summary.iterations);
}

/// A run of up to 24 whole 4 KiB granules of the volume.
fn random_granules(rng: &mut CrashRng) -> (u64, u64) {
    let granules = VOLUME / 4096;
    let first = rng.random_range(0..granules);
    let count = rng.random_range(1..=(granules - first).min(24));
    (first * 4096, count * 4096)
}

/// A run of up to 256 sectors of the volume.
fn random_sectors(rng: &mut CrashRng) -> (u64, u64) {
    let sectors = VOLUME / 512;
    let first = rng.random_range(0..sectors);
    let count = rng.random_range(1..=(sectors - first).min(256));
    (first * 512, count * 512)
}

/// A flush of the volume, as the model sees it.
async fn flush_recorded(model: &mut DeviceModel, volume: &ThinVolume, log: &mut Vec<String>) {
    let id = model.flush_started();
    match BlockDevice::flush(volume).await {
        Ok(()) => model.flush_completed(id),
        Err(_) => model.flush_failed(id),
    }
    log.push("flush".to_string());
}

/// Room for the versions' extents: 1 MiB of metadata and 128 extents.
const VERSIONS_DISK: u64 = (1 << 20) + 128 * EXTENT;

async fn open_versions(
    group: &CrashGroup,
    images: Option<Vec<DiskImage>>,
) -> strata_core::Result<Arc<ThinPool>> {
    let fresh = images.is_none();
    let disk = open_disks(group, &[sector_disk(VERSIONS_DISK)], images).remove(0);
    let child: DeviceRef = Arc::new(disk);
    if fresh {
        let pool =
            ThinPool::format("pool", child, &pool_options(EXTENT, 1 << 20), settings()).await?;
        pool.create_volume("v", VOLUME).await?;
        return Ok(pool);
    }
    let pool = ThinPool::open("pool", child, settings()).await?.0;
    let problems = pool.store().read(check_state);
    if !problems.is_empty() {
        return Err(strata_core::BlockError::Corrupt(format!(
            "pool invariants broken after reopen: {problems:?}"
        )));
    }
    Ok(pool)
}

/// The model restarted from `bytes`, definite (durable) content.
fn model_holding(bytes: &[u8], first_id: u64) -> DeviceModel {
    let mut model = DeviceModel::with_first_id(VOLUME, first_id);
    let id = model.write_started(0, bytes::Bytes::copy_from_slice(bytes));
    model.write_completed(id, true);
    model
}

async fn versions_scenario(seed: u64) -> Result<CrashStats, String> {
    use std::collections::BTreeMap;
    const ROUNDS: u64 = 4;
    const OPS: u32 = 30;
    let mut rng = CrashRng::seed_from_u64(seed);
    let mut model = DeviceModel::new(VOLUME);
    let mut group = CrashGroup::new();
    let fail = |round: u64, what: String| format!("seed {seed}, round {round}: {what}");
    let mut pool = open_versions(&group, None)
        .await
        .map_err(|e| fail(0, format!("format: {e}")))?;
    // Snapshots known to exist, with what they hold; and those in doubt (a create or a
    // delete the cut interrupted): None for a create, whose content the model bounds.
    let mut snapshots: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut in_doubt: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
    let mut next = 0u32;
    let mut log = Vec::new();
    for round in 0..ROUNDS {
        let crash_op = rng.random_range(0..OPS);
        let mut rollback_in_doubt: Option<Vec<u8>> = None;
        let volume = pool.volume("v").expect("volume v");
        for n in 0..OPS {
            if n == crash_op {
                group.arm_crash_at(group.mutating_ops() + rng.random_range(0..6));
            }
            let roll = rng.random_range(0..100u32);
            let names: Vec<String> = snapshots.keys().cloned().collect();
            if roll < 8 {
                flush_recorded(&mut model, &volume, &mut log).await;
            } else if roll < 16 {
                let (offset, len) = random_granules(&mut rng);
                let id = model.zeroes_started(offset, len);
                let flags = strata_core::ZeroFlags {
                    may_trim: true,
                    ..Default::default()
                };
                match volume.write_zeroes(offset, len, flags).await {
                    Ok(()) => model.write_completed(id, false),
                    Err(_) => model.write_failed(id),
                }
                log.push(format!("{id} zero [{offset}, +{len})"));
            } else if roll < 28 {
                let name = format!("s{next}");
                next += 1;
                // Taking a snapshot flushes first: it holds every acknowledged write.
                let id = model.flush_started();
                match pool.create_snapshot("v", Some(&name)).await {
                    Ok(_) => {
                        model.flush_completed(id);
                        let bytes = volume
                            .read(0, VOLUME as usize)
                            .await
                            .map_err(|e| fail(round, format!("read after snapshot {name}: {e}")))?;
                        model
                            .check_live(0, &bytes)
                            .map_err(|p| fail(round, format!("volume at snapshot {name}: {p}")))?;
                        snapshots.insert(name.clone(), bytes.to_vec());
                        log.push(format!("snapshot {name}"));
                    }
                    Err(_) => {
                        model.flush_failed(id);
                        in_doubt.insert(name.clone(), None);
                        log.push(format!("snapshot {name}: failed"));
                    }
                }
            } else if roll < 33 && !names.is_empty() {
                let name = names[rng.random_range(0..names.len())].clone();
                let bytes = snapshots.remove(&name).expect("listed");
                match pool.delete_snapshot("v", &name).await {
                    Ok(_) => log.push(format!("delete {name}")),
                    Err(_) => {
                        in_doubt.insert(name.clone(), Some(bytes));
                        log.push(format!("delete {name}: failed"));
                    }
                }
            } else if roll < 36 && !names.is_empty() {
                let name = names[rng.random_range(0..names.len())].clone();
                let bytes = snapshots[&name].clone();
                match pool.rollback("v", &name).await {
                    Ok(_) => {
                        model = model_holding(&bytes, model.next_write_id().0);
                        log.push(format!("rollback to {name}"));
                    }
                    Err(_) => {
                        rollback_in_doubt = Some(bytes);
                        log.push(format!("rollback to {name}: failed"));
                    }
                }
            } else if roll < 40 && !names.is_empty() {
                // Compaction changes where a snapshot's bytes live, never what they are.
                let name = names[rng.random_range(0..names.len())].clone();
                let done = pool.compact_snapshot("v", &name).await;
                log.push(format!(
                    "compact {name}: {:?}",
                    done.map(|r| r.extents_compacted)
                ));
            } else if roll < 42 && !names.is_empty() {
                let name = names[rng.random_range(0..names.len())].clone();
                let done = pool.uncompact_snapshot("v", &name).await;
                log.push(format!(
                    "uncompact {name}: {:?}",
                    done.map(|r| r.extents_restored)
                ));
            } else {
                // Now and then the whole volume, so that older versions own extents alone.
                let (offset, len) = if roll < 46 {
                    (0, VOLUME)
                } else {
                    random_sectors(&mut rng)
                };
                let fua = rng.random_bool(0.1);
                let (id, data) = model.pattern_write_started(offset, len as usize);
                match volume.write(offset, data, WriteFlags { fua }).await {
                    Ok(()) => model.write_completed(id, fua),
                    Err(_) => model.write_failed(id),
                }
                log.push(format!("{id} write [{offset}, +{len}) fua={fua}"));
            }
            if group.is_powered_off() {
                break;
            }
        }
        let images = group.crash(&mut rng);
        model.crashed();
        log.push("--- power cut".to_string());
        drop(volume);
        drop(pool);
        group = CrashGroup::new();
        let recent = |log: &Vec<String>| log[log.len().saturating_sub(14)..].join("\n  ");
        pool = open_versions(&group, Some(images))
            .await
            .map_err(|e| fail(round, format!("reopen: {e}\nrecent:\n  {}", recent(&log))))?;
        let listed: Vec<String> = pool
            .snapshots(Some("v"))
            .map_err(|e| fail(round, format!("list: {e}")))?
            .into_iter()
            .map(|s| s.name)
            .collect();
        for name in &listed {
            if !snapshots.contains_key(name) && !in_doubt.contains_key(name) {
                return Err(fail(
                    round,
                    format!("snapshot {name} appeared from nowhere"),
                ));
            }
        }
        for (name, expected) in &snapshots {
            if !listed.contains(name) {
                return Err(fail(
                    round,
                    format!(
                        "completed snapshot {name} is gone\nrecent:\n  {}",
                        recent(&log)
                    ),
                ));
            }
            let device = pool
                .snapshot_device("v", name)
                .map_err(|e| fail(round, e.to_string()))?;
            let bytes = device
                .read(0, VOLUME as usize)
                .await
                .map_err(|e| fail(round, format!("read snapshot {name}: {e}")))?;
            if bytes[..] != expected[..] {
                let at = bytes
                    .iter()
                    .zip(expected)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Err(fail(
                    round,
                    format!(
                        "snapshot {name} changed at byte {at}\nrecent:\n  {}",
                        recent(&log)
                    ),
                ));
            }
        }
        for (name, expected) in std::mem::take(&mut in_doubt) {
            if !listed.contains(&name) {
                continue;
            }
            let device = pool
                .snapshot_device("v", &name)
                .map_err(|e| fail(round, e.to_string()))?;
            let bytes = device
                .read(0, VOLUME as usize)
                .await
                .map_err(|e| fail(round, format!("read snapshot {name}: {e}")))?;
            match &expected {
                Some(expected) if bytes[..] != expected[..] => {
                    return Err(fail(
                        round,
                        format!("snapshot {name}, deletion cut short, changed"),
                    ));
                }
                Some(_) => {}
                // A creation cut short that committed holds the flushed writes: the model's
                // candidates bound it.
                None => model.check(0, &bytes).map_err(|p| {
                    fail(round, format!("snapshot {name}, creation cut short: {p}"))
                })?,
            }
            snapshots.insert(name, bytes.to_vec());
        }
        let volume = pool.volume("v").expect("volume v");
        let bytes = volume
            .read(0, VOLUME as usize)
            .await
            .map_err(|e| fail(round, format!("read after reopen: {e}")))?;
        match rollback_in_doubt {
            Some(target) if bytes[..] == target[..] => {
                model = model_holding(&bytes, model.next_write_id().0);
            }
            _ => {
                model.check(0, &bytes).map_err(|p| {
                    fail(
                        round,
                        format!("volume after the cut: {p}\nrecent:\n  {}", recent(&log)),
                    )
                })?;
                model.settle(0, &bytes);
            }
        }
    }
    Ok(CrashStats {
        crash_points: ROUNDS,
    })
}

/// Versions policies under power cuts: a volume with a policy (a snapshot every 3 write
/// requests, keep 2) takes automatic snapshots and deletes the oldest beyond 2 (two steps: a
/// cut can fall between them) while manual snapshots are taken and snapshots protected and
/// unprotected. After every cut: the records are consistent, the policy is still set, every
/// completed manual snapshot and every protected one is there and reads as it did, a
/// protection that completed holds, nothing appeared that was not asked for, and the next
/// pass brings the policy's unprotected snapshots back to its last K (a cut between a
/// snapshot and its keep-K deletions, or among those deletions, leaves more).
#[test]
fn versions_policy_keeps_manual_and_protected_snapshots_through_power_cuts() {
    let run = CrashRun {
        name: "thin volume with a versions policy",
        replay: "cargo test -p strata-thin --test suite -- thin_crash::versions_policy_keeps",
        default_iterations: 500,
    };
    let summary = run.run_async(policy_scenario);
    assert!(summary.crash_points >= summary.iterations);
}

async fn policy_scenario(seed: u64) -> Result<CrashStats, String> {
    use std::collections::{BTreeMap, BTreeSet};
    const ROUNDS: u64 = 3;
    const OPS: u32 = 30;
    const KEEP: usize = 2;
    const POLICY: &str = "every 3 writes, keep 2";
    let mut rng = CrashRng::seed_from_u64(seed);
    let mut model = DeviceModel::new(VOLUME);
    let mut group = CrashGroup::new();
    let fail = |round: u64, what: String| format!("seed {seed}, round {round}: {what}");
    let mut pool = open_versions(&group, None)
        .await
        .map_err(|e| fail(0, format!("format: {e}")))?;
    let every_three = strata_thin::Schedule::parse(None, Some("3"), Some("2")).unwrap();
    let mut clock = 1_795_629_600_000u64;
    pool.set_snapshot_policy("v", Some(every_three), clock)
        .await
        .map_err(|e| fail(0, format!("set policy: {e}")))?;
    // Snapshots known to exist and what they hold; those whose creation, deletion or
    // protection a cut may have interrupted; protections that completed.
    let mut snapshots: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut protected: BTreeSet<String> = BTreeSet::new();
    let mut next = 0u32;
    let mut log = Vec::new();
    for round in 0..ROUNDS {
        let crash_op = rng.random_range(0..OPS);
        let mut in_doubt: BTreeSet<String> = BTreeSet::new();
        let mut tick_in_doubt = false;
        let volume = pool.volume("v").expect("volume v");
        for n in 0..OPS {
            if n == crash_op {
                group.arm_crash_at(group.mutating_ops() + rng.random_range(0..6));
            }
            let roll = rng.random_range(0..100u32);
            let names: Vec<String> = snapshots.keys().cloned().collect();
            if roll < 8 {
                flush_recorded(&mut model, &volume, &mut log).await;
            } else if roll < 16 {
                let name = format!("m{next}");
                next += 1;
                let id = model.flush_started();
                match pool.create_snapshot("v", Some(&name)).await {
                    Ok(_) => {
                        model.flush_completed(id);
                        match volume.read(0, VOLUME as usize).await {
                            Ok(bytes) => {
                                snapshots.insert(name.clone(), bytes.to_vec());
                            }
                            // The power went right after: its content is learnt at reopen.
                            Err(_) if group.is_powered_off() => {
                                in_doubt.insert(name.clone());
                            }
                            Err(e) => return Err(fail(round, format!("read at {name}: {e}"))),
                        }
                        log.push(format!("snapshot {name}"));
                    }
                    Err(_) => {
                        model.flush_failed(id);
                        in_doubt.insert(name.clone());
                        log.push(format!("snapshot {name}: failed"));
                    }
                }
            } else if roll < 24 && !names.is_empty() {
                let name = names[rng.random_range(0..names.len())].clone();
                let protect = !protected.contains(&name);
                match pool.protect_snapshot("v", &name, protect).await {
                    Ok(()) if protect => {
                        protected.insert(name.clone());
                    }
                    Ok(()) => {
                        protected.remove(&name);
                    }
                    // In doubt either way: no longer promised to be protected.
                    Err(_) => {
                        protected.remove(&name);
                        in_doubt.insert(name.clone());
                    }
                }
                log.push(format!("protect {name} = {protect}"));
            } else if roll < 40 {
                clock += 1000;
                let id = model.flush_started();
                let report = pool.policy_tick(clock).await;
                if report.taken.is_empty() {
                    model.flush_failed(id);
                } else {
                    model.flush_completed(id);
                }
                for (_, name) in &report.taken {
                    let device = pool
                        .snapshot_device("v", name)
                        .map_err(|e| fail(round, e.to_string()))?;
                    match device.read(0, VOLUME as usize).await {
                        Ok(bytes) => {
                            snapshots.insert(name.clone(), bytes.to_vec());
                        }
                        Err(_) if group.is_powered_off() => {
                            in_doubt.insert(name.clone());
                        }
                        Err(e) => return Err(fail(round, format!("read {name}: {e}"))),
                    }
                }
                for (_, name) in &report.kept_deleted {
                    if protected.contains(name) {
                        return Err(fail(round, format!("keep-K deleted protected {name}")));
                    }
                    snapshots.remove(name);
                }
                if !report.refused.is_empty() {
                    // Cut short: a snapshot or a deletion may or may not have happened.
                    tick_in_doubt = true;
                    in_doubt.extend(snapshots.keys().cloned());
                }
                log.push(format!("tick: {report:?}"));
            } else {
                let (offset, len) = random_sectors(&mut rng);
                let (id, data) = model.pattern_write_started(offset, len as usize);
                match volume.write(offset, data, WriteFlags::default()).await {
                    Ok(()) => model.write_completed(id, false),
                    Err(_) => model.write_failed(id),
                }
                log.push(format!("{id} write [{offset}, +{len})"));
            }
            if group.is_powered_off() {
                break;
            }
        }
        let images = group.crash(&mut rng);
        model.crashed();
        log.push("--- power cut".to_string());
        drop(volume);
        drop(pool);
        group = CrashGroup::new();
        let recent = |log: &Vec<String>| log[log.len().saturating_sub(14)..].join("\n  ");
        pool = open_versions(&group, Some(images))
            .await
            .map_err(|e| fail(round, format!("reopen: {e}\nrecent:\n  {}", recent(&log))))?;
        let status = pool
            .snapshot_policy("v")
            .map_err(|e| fail(round, format!("policy: {e}")))?;
        if status.policy.as_deref() != Some(POLICY) {
            return Err(fail(round, format!("the policy is {:?}", status.policy)));
        }
        let listed: BTreeSet<String> = pool
            .snapshots(Some("v"))
            .map_err(|e| fail(round, format!("list: {e}")))?
            .into_iter()
            .map(|s| s.name)
            .collect();
        for name in &listed {
            let known = snapshots.contains_key(name) || in_doubt.contains(name);
            let from_a_cut_tick = name.starts_with("auto-") && tick_in_doubt;
            if !(known || from_a_cut_tick) {
                return Err(fail(
                    round,
                    format!("snapshot {name} appeared from nowhere"),
                ));
            }
        }
        let promised = |name: &String| {
            !in_doubt.contains(name)
                && (!name.starts_with("auto-") || protected.contains(name) || !tick_in_doubt)
        };
        for (name, expected) in &snapshots {
            if !listed.contains(name) {
                if promised(name) {
                    return Err(fail(
                        round,
                        format!("snapshot {name} is gone\nrecent:\n  {}", recent(&log)),
                    ));
                }
                continue;
            }
            let bytes = pool
                .snapshot_device("v", name)
                .map_err(|e| fail(round, e.to_string()))?
                .read(0, VOLUME as usize)
                .await
                .map_err(|e| fail(round, format!("read snapshot {name}: {e}")))?;
            if bytes[..] != expected[..] {
                return Err(fail(round, format!("snapshot {name} changed")));
            }
        }
        for name in &protected {
            if !status.protected.contains(name) {
                return Err(fail(round, format!("{name} lost its protection")));
            }
        }
        // Write counts restart at zero: the next pass takes nothing and keeps K.
        let report = pool.policy_tick(clock).await;
        if !report.taken.is_empty() || !report.refused.is_empty() {
            return Err(fail(round, format!("first pass after the cut: {report:?}")));
        }
        let status = pool
            .snapshot_policy("v")
            .map_err(|e| fail(round, e.to_string()))?;
        let unprotected = (status.policy_snapshots.iter())
            .filter(|name| !status.protected.contains(name))
            .count();
        let newest_protected = (status.policy_snapshots.iter().rev().take(KEEP))
            .filter(|name| status.protected.contains(name))
            .count();
        if unprotected > KEEP - newest_protected {
            return Err(fail(round, format!("keep-K left {status:?}")));
        }
        // What exists now is what the next round knows, read back (an interrupted creation
        // that committed holds flushed writes only: the model bounds it).
        snapshots.clear();
        let listed: Vec<String> = pool
            .snapshots(Some("v"))
            .map_err(|e| fail(round, e.to_string()))?
            .into_iter()
            .map(|s| s.name)
            .collect();
        for name in listed {
            let bytes = pool
                .snapshot_device("v", &name)
                .map_err(|e| fail(round, e.to_string()))?
                .read(0, VOLUME as usize)
                .await
                .map_err(|e| fail(round, e.to_string()))?;
            snapshots.insert(name, bytes.to_vec());
        }
        protected = status.protected.iter().cloned().collect();
        let volume = pool.volume("v").expect("volume v");
        let bytes = volume
            .read(0, VOLUME as usize)
            .await
            .map_err(|e| fail(round, format!("read after reopen: {e}")))?;
        model.check(0, &bytes).map_err(|p| {
            fail(
                round,
                format!("volume after the cut: {p}\nrecent:\n  {}", recent(&log)),
            )
        })?;
        model.settle(0, &bytes);
    }
    Ok(CrashStats {
        crash_points: ROUNDS,
    })
}
