//! The metadata service under the crash harness.
//!
//! Each seed runs random transactions (tables, bitmaps, blobs, objects created and deleted,
//! normal and reclaim classes) over a small region, so that the journal fills and
//! checkpoints often, with commits in between; power fails at a random mutating operation and
//! the disk keeps a random subset of its unflushed writes, torn and reordered. Then the store
//! is reopened from what is left, and recovery must:
//! - succeed with no help;
//! - return exactly the state after some prefix of the transactions run;
//! - lose none that a completed commit covered.
//!
//! Replay one seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-meta --test suite -- crash::`.
//! Run longer: `STRATA_CRASH_ITERATIONS=100000 cargo test -p strata-meta --release --test suite -- crash::`.

use std::sync::Arc;

use strata_core::{BlockError, DeviceRef};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::{sector_disk, CrashGroup, CrashRng, CrashRun, CrashStats, DiskImage};
use strata_meta::{FormatOptions, MetaStore, State, StoreOptions, TxnClass};

/// Region size: small, so that the journal (10 blocks) fills every few commits.
const REGION: u64 = 48 * 4096;
const DISK: u64 = 64 * 4096;
const ROUNDS: u32 = 4;

/// States after each transaction since the last durable point: `history[i]` is the state
/// after `base + i` transactions.
struct History {
    base: u64,
    states: Vec<State>,
}

impl History {
    fn applied(&self) -> u64 {
        self.base + self.states.len() as u64 - 1
    }

    fn durable(&mut self, upto: u64) {
        let drop = (upto - self.base) as usize;
        self.states.drain(..drop);
        self.base = upto;
    }
}

/// One random transaction. Returns Ok(true) if it applied, Ok(false) if refused as full.
fn random_txn(store: &MetaStore, rng: &mut CrashRng) -> Result<bool, BlockError> {
    let class = if rng.random_bool(0.2) {
        TxnClass::Reclaim
    } else {
        TxnClass::Normal
    };
    let choice = rng.random_range(0..100u32);
    let index = rng.random_range(0..2000u64);
    let value = rng.random_range(0..4u64);
    let result = store.transact(class, |state, txn| {
        let tables: Vec<_> = state
            .objects()
            .filter(|(_, o)| o.name.starts_with('t'))
            .map(|(id, _)| id)
            .collect();
        let bitmap = state.id("bits").expect("bits");
        let blob = state.id("blob").expect("blob");
        match choice {
            0..=49 if !tables.is_empty() => {
                let table = tables[index as usize % tables.len()];
                for step in 0..1 + index % 5 {
                    txn.set(table, index * 7 + step * 64, &value.to_le_bytes());
                }
            }
            50..=69 => txn.set_bits(bitmap, index * 3, 1 + index % 300, value % 2 == 1),
            70..=79 => txn.put_blob(blob, vec![value as u8; (index % 3000) as usize]),
            80..=89 if tables.len() < 6 => {
                let id = txn.create_table(&format!("t{}", state.next_id()), 8);
                txn.set(id, index, &(value + 1).to_le_bytes());
            }
            90..=94 if !tables.is_empty() => txn.delete(tables[index as usize % tables.len()]),
            _ => txn.set_bits(bitmap, index, 1, true),
        }
        Ok(())
    });
    match result {
        Ok(()) => Ok(true),
        Err(BlockError::NoSpace) => Ok(false),
        Err(error) => Err(error),
    }
}

async fn reopen(
    group: &CrashGroup,
    images: Vec<DiskImage>,
    seed: u64,
) -> Result<Arc<MetaStore>, String> {
    let disk = group.disk_from(images.into_iter().next().expect("one disk"));
    let device: DeviceRef = Arc::new(disk);
    MetaStore::open(device, 0, StoreOptions::new("crash"))
        .await
        .map(|(store, _)| store)
        .map_err(|e| format!("seed {seed}: recovery failed: {e}"))
}

async fn scenario(seed: u64) -> Result<CrashStats, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let mut group = CrashGroup::new();
    let device: DeviceRef = Arc::new(group.disk(sector_disk(DISK)));
    let mut format = FormatOptions::new("crash-test");
    format.first_generation = Some(rng.random_range(1..1u64 << 40));
    let mut store = MetaStore::format(device, 0, REGION, format, StoreOptions::new("crash"))
        .await
        .map_err(|e| format!("format: {e}"))?;
    store
        .transact(TxnClass::Normal, |_, txn| {
            txn.create_bitmap("bits");
            txn.create_blob("blob");
            txn.create_table("t0", 8);
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    store.commit().await.map_err(|e| e.to_string())?;
    let mut history = History {
        base: store.next_txn(),
        states: vec![store.read(|s| s.clone())],
    };
    let mut stats = CrashStats::default();
    for round in 0..ROUNDS {
        group.arm_crash_at(group.mutating_ops() + rng.random_range(0..60u64));
        // Run until power fails; a failed call is how the workload learns of it.
        for _ in 0..400 {
            let step = if rng.random_bool(0.15) {
                let upto = store.next_txn();
                store.commit().await.map(|()| history.durable(upto))
            } else {
                random_txn(&store, &mut rng).map(|applied| {
                    if applied {
                        history.states.push(store.read(|s| s.clone()));
                    }
                })
            };
            if step.is_err() || group.is_powered_off() {
                break;
            }
        }
        let images = group.crash(&mut rng);
        stats.crash_points += 1;
        group = CrashGroup::new();
        store = reopen(&group, images, seed).await?;
        let recovered = store.next_txn();
        let context = format!(
            "seed {seed}, round {round}: recovered {recovered} transactions; {} durable, {} run",
            history.base,
            history.applied()
        );
        if recovered < history.base || recovered > history.applied() {
            return Err(format!(
                "{context}: not a prefix that keeps every committed transaction"
            ));
        }
        let expected = &history.states[(recovered - history.base) as usize];
        let matches = store.read(|state| state == expected);
        if !matches {
            return Err(format!("{context}: the recovered state differs from the state after that many transactions"));
        }
        history = History {
            base: recovered,
            states: vec![expected.clone()],
        };
    }
    Ok(stats)
}

#[test]
fn metadata_recovers_a_committed_prefix_after_every_crash() {
    let run = CrashRun {
        name: "metadata recovery",
        replay: "cargo test -p strata-meta --test suite -- crash::",
        default_iterations: 3000,
    };
    let summary = run.run_async(scenario);
    assert!(summary.crash_points >= summary.iterations * ROUNDS as u64);
}
