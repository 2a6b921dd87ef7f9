//! Media damage under the metadata store: bytes flipped on the medium after commits were
//! acknowledged (issue 12). The rule: never silent loss. Recovery either returns exactly the
//! acknowledged state, or refuses to open and says why.
//!
//! Each seed formats a small store (the journal holds 6 blocks per copy, so commits often
//! checkpoint), runs random transactions and commits, all acknowledged, cuts the power and
//! then damages the image with [`strata_crash::Damage`] in one of the places the format
//! protects: a superblock copy, the current checkpoint, or journal batches with at most one
//! copy of each batch hit. Two copies of one batch hit by two independent faults is the
//! format's limit when that batch is the last: see
//! `both_copies_of_the_last_acknowledged_batch_damaged_is_the_formats_limit`.
//!
//! Replay one seed: `STRATA_CRASH_SEED=<seed> cargo test -p strata-meta --test suite -- media_damage::`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use strata_core::DeviceRef;
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::{
    sector_disk, CrashDisk, CrashGroup, CrashPolicy, CrashRng, CrashRun, CrashStats, Damage,
    DiskImage,
};
use strata_meta::{
    FormatOptions, JournalEnd, MetaStore, Recovered, State, StoreOptions, Superblock, TxnClass,
};

const REGION: u64 = 48 * 4096;
const DISK: u64 = 64 * 4096;
const BLOCK: u64 = 4096;

/// A store after `commits` acknowledged commits, powered off.
struct Acknowledged {
    image: DiskImage,
    /// The state every acknowledged commit covered: what recovery must return.
    state: State,
    /// What recovery reads from the undamaged image.
    recovered: Recovered,
}

fn one_txn(store: &MetaStore, rng: &mut CrashRng) {
    let choice = rng.random_range(0..10u32);
    let index = rng.random_range(0..4000u64);
    let value = rng.random_range(1..1000u64);
    let size = rng.random_range(0..6000usize);
    store
        .transact(TxnClass::Normal, |state, txn| {
            let map = state.id("map").expect("map");
            match choice {
                0..=5 => txn.set(map, index, &value.to_le_bytes()),
                6..=7 => txn.set_bits(state.id("bits").expect("bits"), index, value, true),
                // Up to two blocks' worth: batches of one, two and three blocks.
                _ => txn.put_blob(state.id("blob").expect("blob"), vec![value as u8; size]),
            }
            Ok(())
        })
        .expect("the region is large enough for the workload");
}

async fn format(group: &CrashGroup, rng: &mut CrashRng) -> (Arc<MetaStore>, CrashDisk) {
    let disk = group.disk(sector_disk(DISK));
    let device: DeviceRef = Arc::new(disk.clone());
    let mut format = FormatOptions::new("media-damage");
    format.first_generation = Some(rng.random_range(1..1u64 << 40));
    let store = MetaStore::format(device, 0, REGION, format, StoreOptions::new("damage"))
        .await
        .unwrap();
    store
        .transact(TxnClass::Normal, |_, txn| {
            txn.create_table("map", 8);
            txn.create_bitmap("bits");
            txn.create_blob("blob");
            Ok(())
        })
        .unwrap();
    store.commit().await.unwrap();
    (store, disk)
}

/// Random transactions and 1..=12 commits (so sometimes several checkpoints, sometimes
/// none), all acknowledged; then the power is cut.
async fn acknowledged(rng: &mut CrashRng) -> Acknowledged {
    let group = CrashGroup::new();
    let (store, _) = format(&group, rng).await;
    for _ in 0..rng.random_range(1..=12u32) {
        for _ in 0..rng.random_range(1..=4u32) {
            one_txn(&store, rng);
        }
        store.commit().await.unwrap();
    }
    let state = store.read(|s| s.clone());
    // Every write of an acknowledged commit was FUA or flushed: any crash policy keeps it.
    let image = group.crash(rng).remove(0);
    let recovered = recover(&image).await.expect("the undamaged image recovers");
    assert_eq!(recovered.state, state, "undamaged recovery differs");
    Acknowledged {
        image,
        state,
        recovered,
    }
}

async fn recover(image: &DiskImage) -> Result<Recovered, String> {
    let disk = CrashGroup::new().disk_from(image.clone());
    strata_meta::recover(&disk, 0)
        .await
        .map_err(|e| e.to_string())
}

/// Opens the store as the server would; returns what it recovered, or the refusal.
async fn open(image: &DiskImage) -> Result<(State, Recovered), String> {
    let device: DeviceRef = Arc::new(CrashGroup::new().disk_from(image.clone()));
    let (store, recovered) = MetaStore::open(device, 0, StoreOptions::new("damage"))
        .await
        .map_err(|e| e.to_string())?;
    Ok((store.read(|s| s.clone()), recovered))
}

/// The journal batches of the current epoch in copy 1: (first block, block count).
fn batches(image: &DiskImage, superblock: &Superblock, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < end {
        let header = image.read(superblock.journal_copy_offset(0, at), 32);
        let count = u32::from_le_bytes(header[28..32].try_into().unwrap()) as u64;
        assert!(
            count > 0 && at + count <= end,
            "batch at {at}: {count} blocks"
        );
        out.push((at, count));
        at += count;
    }
    out
}

/// Damage to one copy (chosen per batch) of some of the current epoch's batches, or none
/// when the epoch has none yet. Returns the damage and how many batches it hits.
fn journal_damage(rng: &mut CrashRng, ack: &Acknowledged) -> (Vec<Damage>, usize) {
    let superblock = &ack.recovered.superblock;
    let batches = batches(&ack.image, superblock, ack.recovered.journal_end_block);
    let mut damage = Vec::new();
    for (first, count) in batches {
        if !damage.is_empty() && rng.random_bool(0.5) {
            continue;
        }
        let copy = rng.random_range(0..2u64);
        let offset = superblock.journal_copy_offset(copy, first);
        let bytes = rng.random_range(1..=8usize);
        damage.push(Damage::new(offset, count * BLOCK, bytes));
    }
    let hit = damage.len();
    (damage, hit)
}

#[derive(Clone, Copy, Debug)]
enum Target {
    SuperblockA,
    SuperblockB,
    CurrentSuperblockAndJournal,
    Checkpoint,
    Journal,
}

const TARGETS: [Target; 5] = [
    Target::SuperblockA,
    Target::SuperblockB,
    Target::CurrentSuperblockAndJournal,
    Target::Checkpoint,
    Target::Journal,
];

#[derive(Default)]
struct Outcomes {
    refused: AtomicU64,
    intact: AtomicU64,
}

async fn never_lose(seed: u64, outcomes: &Outcomes) -> Result<CrashStats, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let ack = acknowledged(&mut rng).await;
    let superblock = &ack.recovered.superblock;
    let target = TARGETS[rng.random_range(0..TARGETS.len())];
    let bytes = rng.random_range(1..=8usize);
    let damage = match target {
        Target::SuperblockA => vec![Damage::new(0, BLOCK, bytes)],
        Target::SuperblockB => vec![Damage::new(BLOCK, BLOCK, bytes)],
        Target::CurrentSuperblockAndJournal => {
            let mut damage = journal_damage(&mut rng, &ack).0;
            damage.push(Damage::new(superblock.copy() * BLOCK, BLOCK, bytes));
            damage
        }
        Target::Checkpoint => {
            let slot = superblock.layout.slot_offset(superblock.active_slot);
            vec![Damage::new(
                slot,
                superblock.checkpoint_blocks * BLOCK,
                bytes,
            )]
        }
        Target::Journal => journal_damage(&mut rng, &ack).0,
    };
    let mut image = ack.image.clone();
    let mut applied = Vec::new();
    for fault in &damage {
        applied.push(fault.apply(std::slice::from_mut(&mut image), &mut rng));
    }
    let context = || {
        format!(
            "seed {seed}: {target:?} after {} acknowledged transactions (generation {}, {} \
             batches in the journal)\n  {}",
            ack.recovered.next_txn,
            superblock.generation,
            ack.recovered.batches_replayed,
            applied.join("\n  ")
        )
    };
    match open(&image).await {
        Err(_) => {
            outcomes.refused.fetch_add(1, Relaxed);
        }
        Ok((state, recovered)) => {
            if state != ack.state {
                return Err(format!(
                    "{}\nsilent loss: the store opened after damage with {} transactions, not \
                     {}, and {} journal copy findings",
                    context(),
                    recovered.next_txn,
                    ack.recovered.next_txn,
                    recovered.journal_copy_faults.len()
                ));
            }
            outcomes.intact.fetch_add(1, Relaxed);
        }
    }
    Ok(CrashStats { crash_points: 1 })
}

#[test]
fn media_damage_never_loses_acknowledged_metadata() {
    let run = CrashRun {
        name: "metadata media damage",
        replay: "cargo test -p strata-meta --test suite -- media_damage::never_loses",
        default_iterations: 12000,
    };
    let outcomes = Outcomes::default();
    let summary = run.run_async(|seed| never_lose(seed, &outcomes));
    let (refused, intact) = (outcomes.refused.into_inner(), outcomes.intact.into_inner());
    eprintln!("media damage: {refused} refused, {intact} intact");
    assert_eq!(refused + intact, summary.iterations);
    // Both outcomes happen (a damaged checkpoint is always refused; a damaged older
    // superblock copy never matters): the test reaches both branches.
    if summary.iterations >= 100 {
        assert!(
            refused > 0 && intact > 0,
            "{refused} refused, {intact} intact"
        );
    }
}

async fn one_copy(seed: u64) -> Result<CrashStats, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let ack = acknowledged(&mut rng).await;
    let (damage, hit) = journal_damage(&mut rng, &ack);
    let mut image = ack.image.clone();
    let mut applied = Vec::new();
    for fault in &damage {
        applied.push(fault.apply(std::slice::from_mut(&mut image), &mut rng));
    }
    let context = format!("seed {seed}:\n  {}", applied.join("\n  "));
    let (state, recovered) = open(&image)
        .await
        .map_err(|e| format!("{context}\nrefused although every batch has a valid copy: {e}"))?;
    if state != ack.state {
        return Err(format!("{context}\nthe recovered state differs"));
    }
    if recovered.journal_copy_faults.len() != hit {
        return Err(format!(
            "{context}\n{hit} batches damaged, but the findings are {:?}",
            recovered.journal_copy_faults
        ));
    }
    Ok(CrashStats { crash_points: 1 })
}

#[test]
fn single_copy_journal_damage_anywhere_is_recovered_with_a_finding() {
    let run = CrashRun {
        name: "metadata single-copy journal damage",
        replay: "cargo test -p strata-meta --test suite -- media_damage::single_copy",
        default_iterations: 8000,
    };
    run.run_async(one_copy);
}

/// A commit cut by the power, then both copies of the batch it was writing damaged: the
/// batch was never acknowledged, so recovery may drop it (the never-completed rule) or
/// refuse; it must keep every acknowledged transaction.
async fn unacknowledged_tail(seed: u64) -> Result<CrashStats, String> {
    let mut rng = CrashRng::seed_from_u64(seed);
    let group = CrashGroup::new();
    let (store, disk) = format(&group, &mut rng).await;
    for _ in 0..rng.random_range(0..=4u32) {
        one_txn(&store, &mut rng);
        store.commit().await.unwrap();
    }
    let durable = store.read(|s| s.clone());
    // Where the next batch goes (the live disk reads what the commits made durable).
    let before = strata_meta::recover(&disk, 0)
        .await
        .map_err(|e| e.to_string())?;
    one_txn(&store, &mut rng);
    let pending = store.read(|s| s.clone());
    // Power fails inside the commit (its flush, its first or second copy) or just after it.
    group.arm_crash_at(group.mutating_ops() + rng.random_range(0..4u64));
    let acknowledged = store.commit().await.is_ok();
    let mut image = group.crash(&mut rng).remove(0);
    let at = before.journal_end_block;
    let superblock = &before.superblock;
    // Both copies of a batch that was never acknowledged; one copy of one that was (both
    // would be the format's limit, below).
    let copies: Vec<u64> = if acknowledged {
        vec![rng.random_range(0..2u64)]
    } else {
        vec![0, 1]
    };
    if at < superblock.journal_capacity() {
        for copy in copies {
            let offset = superblock.journal_copy_offset(copy, at);
            Damage::new(offset, BLOCK, 4).apply(std::slice::from_mut(&mut image), &mut rng);
        }
    }
    match open(&image).await {
        Err(e) if acknowledged => {
            return Err(format!(
                "seed {seed}: refused an acknowledged batch with one valid copy: {e}"
            ))
        }
        Err(_) => {}
        Ok((state, _)) => {
            if state != durable && state != pending {
                return Err(format!("seed {seed}: not a committed prefix"));
            }
            if acknowledged && state != pending {
                return Err(format!("seed {seed}: an acknowledged commit was lost"));
            }
        }
    }
    Ok(CrashStats { crash_points: 1 })
}

#[test]
fn an_unacknowledged_batch_with_both_copies_damaged_is_dropped_or_refused() {
    let run = CrashRun {
        name: "metadata unacknowledged tail damage",
        replay: "cargo test -p strata-meta --test suite -- media_damage::unacknowledged",
        default_iterations: 4000,
    };
    run.run_async(unacknowledged_tail);
}

/// The format's limit, written down: two independent media faults, one in each copy of the
/// last acknowledged batch, look exactly like a commit the power cut before either copy was
/// whole. Recovery cannot tell, and drops the batch. (One fault per batch is never lost, as
/// the tests above show; a batch with a later valid batch is refused, as `faults.rs` shows.)
#[tokio::test]
async fn both_copies_of_the_last_acknowledged_batch_damaged_is_the_formats_limit() {
    let mut rng = CrashRng::seed_from_u64(99);
    let group = CrashGroup::new();
    let (store, _) = format(&group, &mut rng).await;
    one_txn(&store, &mut rng);
    store.commit().await.unwrap();
    let next_txn = store.next_txn();
    let mut image = group.crash_with(CrashPolicy::DropAll, &mut rng).remove(0);
    let recovered = recover(&image).await.unwrap();
    let superblock = &recovered.superblock;
    let (last, count) = *batches(&image, superblock, recovered.journal_end_block)
        .last()
        .expect("a batch");
    for copy in 0..2 {
        let offset = superblock.journal_copy_offset(copy, last);
        Damage::new(offset, count * BLOCK, 4).apply(std::slice::from_mut(&mut image), &mut rng);
    }
    let damaged = recover(&image).await.unwrap();
    assert_eq!(
        damaged.next_txn,
        next_txn - 1,
        "the last transaction is gone"
    );
    assert!(
        damaged.journal_copy_faults.is_empty(),
        "and nothing says so"
    );
    assert_eq!(damaged.journal_end, JournalEnd::Clean);
}
