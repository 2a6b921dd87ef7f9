//! What versions cost a brick, and how long a roll-back takes (issue 19's targets: versions
//! every 30 s cost at most 5 % on 64 KiB random writes; a 1 TiB volume rolls back in under a
//! minute).
//!
//! 1. **Write cost.** 64 KiB random writes, 8 outstanding, each its own interval (prepare,
//!    commit) on a mirror set of two file-backed bricks in this process, for `SECONDS`
//!    without versions, then as long with a version sealed every `EVERY` seconds (every
//!    interval tagged with the newest one). No network: this measures what versions add at
//!    the brick, the copy-on-write of the map.
//! 2. **Roll-back.** One brick with a 1 TiB share (a sparse file): version 1 is taken, `GIB`
//!    GiB of 64 KiB random writes land after it, and the brick rolls back to version 1.
//!
//! `cargo run --release -p strata-brick --example version_cost -- [DIR] [SECONDS] [EVERY] [GIB]
//! [preallocate]` (defaults: /var/tmp, 60, 30, 2); `ROUNDS=n` runs the pair n times, which
//! goes first alternating, and prints the cost of each round and their median. With
//! `preallocate`, the brick files of the write-cost runs are allocated whole before they are
//! formatted (6 GiB of staging rather than 16, to fit), and the roll-back is skipped: this
//! tells apart what versions cost the brick from what a sparse file costs when kept units
//! push writes into parts never written. Allocated is not written: the file system still
//! marks each extent written at its first write.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_backend::{FileDevice, FileOptions};
use strata_brick::{BrickOptions, BrickStore, Vote};
use strata_cluster::interval::{Decision, IntervalId};
use strata_core::{DeviceRef, TokioRuntime};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const WRITE: u64 = 64 << 10;
const DEPTH: u64 = 8;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/var/tmp".into()));
    let seconds: u64 = args.next().map_or(60, |a| a.parse().expect("SECONDS"));
    let every: u64 = args.next().map_or(30, |a| a.parse().expect("EVERY"));
    let gib: u64 = args.next().map_or(2, |a| a.parse().expect("GIB"));
    let preallocate = args.next().is_some_and(|a| a == "preallocate");
    let spare = if preallocate { 6 * GIB } else { 16 * GIB };

    // Rounds of the pair, the order swapped every round: one pair is within the VM's noise.
    let rounds: usize = std::env::var("ROUNDS").map_or(1, |r| r.parse().expect("ROUNDS"));

    let files = if preallocate { "allocated" } else { "sparse" };
    println!("## 64 KiB random writes, {DEPTH} outstanding, two bricks in {files} files, {seconds} s per run");
    println!("| round | run | MiB/s | versions taken | kept by versions |");
    println!("|---:|---|---:|---:|---:|");
    let share = 4 * GIB;
    let mut costs = Vec::new();
    for round in 1..=rounds {
        let (mut plain, mut versioned) = (None, None);
        for with_versions in [round % 2 == 0, round % 2 == 1] {
            let name = if with_versions { "versioned" } else { "plain" };
            let stores = bricks(&dir, name, share, spare, preallocate).await;
            let run = write_for(&stores, share, seconds, with_versions.then_some(every)).await;
            let label = if with_versions {
                format!("a version every {every} s")
            } else {
                "without versions".to_string()
            };
            println!(
                "| {round} | {label} | {:.1} | {} | {} MiB |",
                run.mib_per_s,
                run.versions,
                run.kept / MIB
            );
            if with_versions {
                versioned = Some(run);
            } else {
                plain = Some(run);
            }
        }
        let (plain, versioned) = (plain.unwrap(), versioned.unwrap());
        costs.push((plain.mib_per_s / versioned.mib_per_s - 1.0) * 100.0);
    }
    costs.sort_by(f64::total_cmp);
    let listed: Vec<String> = costs.iter().map(|c| format!("{c:+.1} %")).collect();
    let median = (costs[(costs.len() - 1) / 2] + costs[costs.len() / 2]) / 2.0;
    println!(
        "\nversions cost {} of the throughput (median {median:+.1} %, {rounds} rounds)\n",
        listed.join(", "),
    );

    if preallocate {
        remove_files(&dir);
        return;
    }
    println!("## Roll-back of a 1 TiB share after {gib} GiB of 64 KiB random writes");
    let share = 1 << 40;
    let stores = bricks(&dir, "rollback", share, 2 * gib * GIB + 4 * GIB, false).await;
    let store = &stores[0];
    let before = store.read(0, WRITE as usize).await.unwrap();
    store.seal_version(1).await.unwrap();
    let writes = gib * GIB / WRITE;
    let started = Instant::now();
    write_count(&stores[..1], share, writes, 1).await;
    let wrote = started.elapsed();
    let kept = store.versions().await.unwrap()[0].held_bytes;
    let started = Instant::now();
    store.rollback(1, 1).await.unwrap();
    let took = started.elapsed();
    assert_eq!(store.read(0, WRITE as usize).await.unwrap(), before);
    assert_eq!(store.versions().await.unwrap()[0].held_bytes, 0);
    println!("| written after the version | kept by it | roll-back | units put back per s |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {gib} GiB in {:.1} s | {} MiB | {:.2} s | {:.0} |",
        wrote.as_secs_f64(),
        kept / MIB,
        took.as_secs_f64(),
        (kept / 4096) as f64 / took.as_secs_f64()
    );
    remove_files(&dir);
}

fn remove_files(dir: &Path) {
    for name in ["plain", "versioned", "rollback"] {
        for i in 0..2 {
            let _ = std::fs::remove_file(path(dir, name, i));
        }
    }
}

fn path(dir: &Path, name: &str, i: usize) -> PathBuf {
    dir.join(format!("version-cost-{name}-b{i}.img"))
}

/// Two bricks in files (sparse, or allocated whole): a share of `share` bytes and `spare`
/// bytes of staging.
async fn bricks(
    dir: &Path,
    name: &str,
    share: u64,
    spare: u64,
    preallocate: bool,
) -> Vec<Arc<BrickStore>> {
    let mut stores = Vec::new();
    for i in 0..2 {
        let path = path(dir, name, i);
        let _ = std::fs::remove_file(&path);
        let meta = 512 * MIB;
        let size = meta + share + spare + MIB;
        let mut options = FileOptions::new(&path);
        options.size = Some(size);
        if preallocate {
            let file = std::fs::File::create(&path).expect("brick file");
            rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, size)
                .expect("allocating the brick file");
        }
        let device: DeviceRef =
            Arc::new(FileDevice::open(options, TokioRuntime::current()).expect("brick file"));
        let layout = BrickOptions {
            meta_bytes: meta,
            home_bytes: share,
            min_staging_bytes: spare,
        };
        stores.push(Arc::new(
            BrickStore::format(device, &layout, true).await.unwrap(),
        ));
    }
    stores
}

struct Run {
    mib_per_s: f64,
    versions: u64,
    kept: u64,
}

/// A generator per task, seeded: the runs write the same offsets.
fn next_offset(state: &mut u64, share: u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state % (share / WRITE)) * WRITE
}

async fn interval(stores: &[Arc<BrickStore>], id: IntervalId, offset: u64, tag: u64) {
    let data = Bytes::from(vec![(id.seq % 251) as u8 + 1; WRITE as usize]);
    let bricks: Vec<u64> = (0..stores.len() as u64).collect();
    let votes = futures_util::future::join_all(stores.iter().map(|store| {
        store.prepare_tagged(id, bricks.clone(), vec![(offset, data.clone())], &[], tag)
    }))
    .await;
    for vote in votes {
        assert_eq!(vote.unwrap(), Vote::Yes);
    }
    for done in futures_util::future::join_all(
        stores
            .iter()
            .map(|store| store.decide(id, Decision::Commit)),
    )
    .await
    {
        assert!(done.unwrap());
    }
}

async fn write_for(
    stores: &[Arc<BrickStore>],
    share: u64,
    seconds: u64,
    every: Option<u64>,
) -> Run {
    let tag = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let done = Arc::new(AtomicU64::new(0));
    let versions = every.map(|every| {
        let (stores, tag) = (stores.to_vec(), tag.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(every)).await;
                if Instant::now() >= deadline {
                    return;
                }
                // Announce: new intervals are tagged with it at once. Then seal, as the
                // administrator does, once nothing tagged below it is undecided.
                let next = tag.load(Ordering::SeqCst) + 1;
                tag.store(next, Ordering::SeqCst);
                for store in &stores {
                    while store.seal_version(next).await.is_err() {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            }
        })
    });
    let started = Instant::now();
    let tasks: Vec<_> = (0..DEPTH)
        .map(|task| {
            let (stores, tag, done) = (stores.to_vec(), tag.clone(), done.clone());
            tokio::spawn(async move {
                let mut state = 0x9E37_79B9_7F4A_7C15 ^ (task + 1);
                let mut seq = 0;
                while Instant::now() < deadline {
                    seq += 1;
                    // One client, as one host: tasks that land on the same bytes are
                    // ordered by it, not refused as another host's.
                    let id = IntervalId {
                        client: 1,
                        seq: (task << 40) + seq,
                    };
                    let offset = next_offset(&mut state, share);
                    interval(&stores, id, offset, tag.load(Ordering::SeqCst)).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(versions) = versions {
        versions.await.unwrap();
    }
    let listed = stores[0].versions().await.unwrap();
    let meta = stores[0].metadata_counters();
    eprintln!(
        "brick 0: {} metadata commits, {:.1} ms each, {} checkpoints of {} KiB on average, {} journal blocks",
        meta.commits,
        meta.commit_seconds_total * 1000.0 / meta.commits.max(1) as f64,
        meta.checkpoints,
        meta.checkpoint_bytes / meta.checkpoints.max(1) / 1024,
        meta.journal_blocks
    );
    Run {
        mib_per_s: (done.load(Ordering::Relaxed) * WRITE) as f64 / MIB as f64 / elapsed,
        versions: listed.len() as u64,
        kept: listed.iter().map(|v| v.held_bytes).sum(),
    }
}

async fn write_count(stores: &[Arc<BrickStore>], share: u64, count: u64, tag: u64) {
    let tasks: Vec<_> = (0..DEPTH)
        .map(|task| {
            let stores = stores.to_vec();
            tokio::spawn(async move {
                let mut state = 0x2545_F491_4F6C_DD1D ^ (task + 1);
                for seq in 1..=count / DEPTH {
                    let id = IntervalId {
                        client: 2,
                        seq: (task << 40) + seq,
                    };
                    interval(&stores, id, next_offset(&mut state, share), tag).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}
