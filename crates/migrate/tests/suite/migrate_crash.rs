//! The migrate layer under the crash harness: it must behave like one disk with a volatile
//! cache through any power cut, while data migrates (δ = 0, every chunk a candidate, the
//! fastest child changing every few requests) and while chunks merge, and after every
//! reopen every written block must be valid in exactly one place.
//!
//! Replay one seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-migrate --test suite -- migrate_crash::`.
//! Run longer: `STRATA_CRASH_ITERATIONS=100000 cargo test -p strata-migrate --test suite -- migrate_crash::`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::{async_trait, BlockDevice, Capabilities, DeviceRef, Geometry, WriteFlags};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::testkit::panic_report;
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashGroup, CrashPlan, CrashPolicy, CrashRng,
    CrashRun, CrashStats, DiskImage, ScenarioConfig,
};
use strata_migrate::{check_state, Migrate, MigrateDevice};

use crate::common::*;

/// Child 0: 1 MiB of metadata and 24 slots; children 1 and 2: 16 slots each. 56 slots, 7
/// spare: 49 chunks of 16 KiB (784 KiB).
fn disks() -> Vec<Geometry> {
    vec![
        sector_disk(local_size(24)),
        sector_disk(16 * CHUNK),
        sector_disk(16 * CHUNK),
    ]
}

/// A child whose response time depends on a counter of requests shared by all children: a
/// different child is the fast one every 16 requests, so data keeps migrating. Each read and
/// write yields once first, as a real device's would not complete at once: the layer's
/// background migrations run between the requests, as they would when served.
struct Rotating {
    inner: DeviceRef,
    index: u64,
    requests: Arc<AtomicU64>,
    clock: Arc<ManualClock>,
}

impl Rotating {
    fn tick(&self) {
        let n = self.requests.fetch_add(1, Ordering::SeqCst);
        let fast = (n / 16) % 3 == self.index;
        let latency_us = if fast { 100 } else { 5000 + 100 * (n % 7) };
        self.clock
            .advance(std::time::Duration::from_micros(latency_us));
    }
}

#[async_trait]
impl BlockDevice for Rotating {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> strata_core::Result<BytesMut> {
        tokio::task::yield_now().await;
        let result = self.inner.read(offset, len).await;
        self.tick();
        result
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> strata_core::Result<()> {
        tokio::task::yield_now().await;
        let result = self.inner.write(offset, data, flags).await;
        self.tick();
        result
    }

    async fn flush(&self) -> strata_core::Result<()> {
        self.inner.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> strata_core::Result<()> {
        self.inner.discard(offset, len).await
    }
}

/// An ordering bug planted on purpose, for the harness to catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    None,
    /// The map committed before the children are flushed.
    MapBeforeData,
    /// A freed slot reused before the free is durable.
    EarlyReuse,
}

async fn open_layer(
    group: &CrashGroup,
    images: Option<Vec<DiskImage>>,
    bug: Bug,
) -> strata_core::Result<Arc<Migrate>> {
    let fresh = images.is_none();
    let clock = ManualClock::new();
    let requests = Arc::new(AtomicU64::new(0));
    let children: Vec<DeviceRef> = open_disks(group, &disks(), images)
        .into_iter()
        .enumerate()
        .map(|(i, disk)| {
            Arc::new(Rotating {
                inner: Arc::new(disk),
                index: i as u64,
                requests: requests.clone(),
                clock: clock.clone(),
            }) as DeviceRef
        })
        .collect();
    let config = config("str", "mig", "0");
    let mut settings = settings(&config, &clock);
    settings.unsafe_skip_data_barrier = bug == Bug::MapBeforeData;
    settings.unsafe_reuse_before_durable = bug == Bug::EarlyReuse;
    let layer = if fresh {
        Migrate::format("mig", children, &config, settings).await?
    } else {
        Migrate::open("mig", children, settings).await?
    };
    let problems = layer.store().read(check_state);
    assert!(
        problems.is_empty(),
        "invariants broken after reopen: {problems:?}"
    );
    Ok(layer)
}

fn scenario(concurrency: usize) -> ScenarioConfig {
    let mut scenario = ScenarioConfig::new(disks());
    scenario.rounds = 4;
    scenario.ops_per_round = 40;
    scenario.max_write = 48 << 10;
    scenario.concurrency = concurrency;
    scenario.discard_zeroes = true;
    scenario
}

async fn flat_seed(seed: u64, scenario: ScenarioConfig, bug: Bug) -> Result<CrashStats, String> {
    flat_device_scenario(seed, &scenario, |group, images| {
        let group = group.clone();
        async move {
            let layer = open_layer(&group, images, bug).await?;
            Ok(Arc::new(MigrateDevice(layer)) as DeviceRef)
        }
    })
    .await
}

fn run_flat(name: &'static str, iterations: u64, concurrency: usize) {
    let run = CrashRun {
        name,
        replay: "cargo test -p strata-migrate --test suite -- migrate_crash::",
        default_iterations: iterations,
    };
    let scenario = scenario(concurrency);
    let summary = run.run_async(|seed| flat_seed(seed, scenario.clone(), Bug::None));
    assert!(summary.crash_points >= summary.iterations);
}

#[test]
fn the_layer_keeps_every_flushed_write_through_power_cuts_while_migrating() {
    run_flat("migrate, rotating fastest child", 600, 1);
}

/// The runs above would pass vacuously if nothing migrated: the same scenario on a few
/// seeds, with every layer it opens kept, migrates often (134 times in 15 opens, 71 of them
/// read migrations landing in the background).
#[test]
fn the_crash_workload_does_migrate() {
    let kept: Arc<std::sync::Mutex<Vec<Arc<Migrate>>>> = Arc::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for seed in 0..3 {
        let kept = kept.clone();
        runtime
            .block_on(flat_device_scenario(
                seed,
                &scenario(1),
                move |group, images| {
                    let group = group.clone();
                    let kept = kept.clone();
                    async move {
                        let layer = open_layer(&group, images, Bug::None).await?;
                        kept.lock().unwrap().push(layer.clone());
                        Ok(Arc::new(MigrateDevice(layer)) as DeviceRef)
                    }
                },
            ))
            .unwrap();
    }
    let layers = kept.lock().unwrap();
    let migrations: u64 = layers.iter().map(|l| counter(l, "migrations")).sum();
    assert!(
        migrations >= 100,
        "{migrations} migrations in {} opens",
        layers.len()
    );
    let read_migrations: u64 = layers.iter().map(|l| counter(l, "read migrations")).sum();
    assert!(
        read_migrations >= 30,
        "{read_migrations} read migrations in {} opens",
        layers.len()
    );
}

#[test]
fn concurrent_requests_survive_power_cuts_while_migrating() {
    run_flat("migrate, rotating fastest child, concurrent", 300, 4);
}

/// The ordering bugs the layer must not have: a map change committed before the data it
/// names is durable; a freed slot reused while a crash could still bring back the entry
/// that names it. The harness must catch each.
#[test]
fn the_harness_catches_a_map_committed_before_its_data() {
    catches(Bug::MapBeforeData, 0xBAD_0000);
}

#[test]
fn the_harness_catches_a_slot_reused_before_its_free_is_durable() {
    catches(Bug::EarlyReuse, 0xBAD_1000);
}

fn catches(bug: Bug, first: u64) {
    let run = CrashRun {
        name: "migrate with an ordering bug planted",
        replay: "cargo test -p strata-migrate --test suite -- migrate_crash::the_harness_catches",
        default_iterations: 0,
    };
    let scenario = scenario(1);
    let plan = CrashPlan { first, count: 400 };
    let message = panic_report(
        || run.run_plan_async(plan, |seed| flat_seed(seed, scenario.clone(), bug)),
        "400 seeds ran with the ordering bug planted and none failed",
    );
    assert!(message.contains("replay: STRATA_CRASH_SEED="), "{message}");
}

/// Random writes, all flushed; then reads of everything (each migrating, as the fastest
/// child rotates) and a merge of every partial chunk, with the power cut at the `cut`-th
/// disk operation of that phase (None: no cut). Returns the phase's disk operations, the
/// images and the model.
async fn migrate_with_cut(
    seed: u64,
    cut: Option<u64>,
) -> Result<(u64, Vec<DiskImage>, Vec<u8>), String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let group = CrashGroup::new();
    let layer = open_layer(&group, None, Bug::None)
        .await
        .map_err(|e| e.to_string())?;
    let device = MigrateDevice(layer.clone());
    let size = layer.shape().size();
    let blocks = size / BLOCK;
    let mut model = vec![0u8; size as usize];
    for i in 0..rng.random_range(8..24u8) {
        let block = rng.random_range(0..blocks);
        let count = rng.random_range(1..9u64).min(blocks - block);
        let data = blocks_data(block, count, i + 1);
        let at = (block * BLOCK) as usize;
        model[at..at + data.len()].copy_from_slice(&data);
        let fua = rng.random_bool(0.2);
        device
            .write(block * BLOCK, data, WriteFlags { fua })
            .await
            .map_err(|e| e.to_string())?;
    }
    device.flush().await.map_err(|e| e.to_string())?;
    let before = group.mutating_ops();
    if let Some(cut) = cut {
        group.arm_crash_at(before + cut);
    }
    let phase = async {
        for chunk in 0..size / CHUNK {
            let first = rng.random_range(0..CHUNK_BLOCKS);
            device
                .read(chunk * CHUNK + first * BLOCK, BLOCK as usize)
                .await?;
        }
        // The reads' migrations land (or fail, once the power is cut) in the background:
        // all within the phase, so that a cut may fall at any of their steps.
        layer.settle().await;
        layer.merge_partial(u64::MAX, true).await?;
        device.flush().await
    };
    let done = phase.await;
    if cut.is_none() {
        done.map_err(|e| format!("the phase without a cut failed: {e}"))?;
        if counter(&layer, "migrations") == 0 {
            return Err("the phase migrated nothing".into());
        }
    }
    let ops = group.mutating_ops() - before;
    let images = group.crash_with(CrashPolicy::Random, &mut rng);
    Ok((ops, images, model))
}

/// Every step of a migration phase: for each seed, the phase's disk operations are counted
/// once, then the power is cut at each of them in turn (with a random survival of the
/// unflushed ones). Everything was flushed before the phase, so after each cut the device
/// must read exactly as before it, with every block in one place.
#[test]
fn a_power_cut_at_every_step_of_migrations_and_merges_loses_nothing() {
    let run = CrashRun {
        name: "migrate, cut at every migration step",
        replay: "cargo test -p strata-migrate --test suite -- migrate_crash::every_step",
        default_iterations: 30,
    };
    let summary = run.run_async(|seed| async move {
        let (steps, _, _) = migrate_with_cut(seed, None).await?;
        let mut stats = CrashStats::default();
        for cut in 0..steps {
            let (_, images, model) = migrate_with_cut(seed, Some(cut)).await?;
            let group = CrashGroup::new();
            let layer = open_layer(&group, Some(images), Bug::None)
                .await
                .map_err(|e| format!("cut at step {cut} of {steps}: reopen: {e}"))?;
            let device = MigrateDevice(layer.clone());
            let read = device
                .read(0, model.len())
                .await
                .map_err(|e| e.to_string())?;
            if read[..] != model[..] {
                let bad = (0..model.len()).find(|&i| read[i] != model[i]).unwrap();
                return Err(format!(
                    "cut at step {cut} of {steps}: block {} differs after the reopen",
                    bad as u64 / BLOCK
                ));
            }
            stats.crash_points += 1;
        }
        Ok(stats)
    });
    assert!(
        summary.crash_points >= summary.iterations * 10,
        "{summary:?}"
    );
}
