//! What consistency intervals cost: 1 MiB sequential writes to a mirror set of two bricks on
//! loopback, each write its own interval (prepare, commit on both), against the same writes
//! sent straight home to both bricks (`WriteDirect`, "the same RAIN-10 without intervals"),
//! at 1 to 16 outstanding writes. Issue 19's targets: intervals cost at most 10 % at 1 MiB,
//! and throughput grows with outstanding writes up to 16.
//!
//! `cargo run --release -p strata-brick --example commit_overhead -- [DIR] [MiB per run]
//! [written]` (DIR holds the two brick files; /var/tmp when left out; `memory` keeps them in
//! memory; `written` writes the files whole before formatting them, as a brick that has run
//! for a while: every block allocated and written once).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_backend::{FileDevice, FileOptions, MemoryDevice};
use strata_brick::commit::run_interval;
use strata_brick::rpc::{serve, BrickClient};
use strata_brick::{BrickOptions, BrickStore, Vote};
use strata_cluster::interval::{Decision, IntervalId};
use strata_core::{DeviceRef, TokioRuntime};

const MIB: u64 = 1 << 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/var/tmp".into()));
    let total: u64 = args.next().map_or(256, |a| a.parse().expect("MiB per run"));
    let home = total * MIB;
    let written = args.next().is_some_and(|a| a == "written");
    let mut clients = Vec::new();
    let mut stores = Vec::new();
    for i in 0..2 {
        let size = 64 * MIB + home + 64 * MIB;
        // "memory" measures the protocol and the store alone, without a file system's
        // write-back and syncs.
        let device: DeviceRef = if dir.as_os_str() == "memory" {
            Arc::new(MemoryDevice::new(size))
        } else {
            let path = dir.join(format!("commit-overhead-b{i}.img"));
            let _ = std::fs::remove_file(&path);
            if written {
                write_whole(&path, size);
            }
            let mut options = FileOptions::new(&path);
            options.size = Some(size);
            Arc::new(FileDevice::open(options, TokioRuntime::current()).expect("brick file"))
        };
        let layout = BrickOptions {
            meta_bytes: 64 * MIB,
            home_bytes: home,
            min_staging_bytes: 32 * MIB,
        };
        let store = Arc::new(BrickStore::format(device, &layout, true).await.unwrap());
        stores.push(store.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(store, listener, std::future::pending()));
        clients.push(BrickClient::new(&address, Duration::from_secs(30)).unwrap());
    }
    let clients = Arc::new(clients);
    println!(
        "{} MiB of 1 MiB sequential writes per run, two bricks (one mirror set) in {}",
        total,
        dir.display()
    );
    println!(
        "| outstanding | without intervals | with intervals | intervals cost | bytes written per byte, without / with |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let mut seq = 0;
    for depth in [1u64, 2, 4, 8, 16] {
        let before = written_bytes();
        let direct_cpu = cpu_seconds();
        let direct = run(&clients, total, depth, None).await;
        let direct_cpu = cpu_seconds() - direct_cpu;
        let between = written_bytes();
        seq += 1;
        let counters = stores[0].metadata_counters();
        let cpu = cpu_seconds();
        let intervals = run(&clients, total, depth, Some(seq * 1000)).await;
        let after = written_bytes();
        let now = stores[0].metadata_counters();
        eprintln!(
            "depth {depth}: {direct_cpu:.2} CPU s without intervals, {:.2} with; brick 0 made {} metadata commits for {total} intervals, {:.1} ms each, {} checkpoints",
            cpu_seconds() - cpu,
            now.commits - counters.commits,
            (now.commit_seconds_total - counters.commit_seconds_total) * 1000.0
                / (now.commits - counters.commits).max(1) as f64,
            now.checkpoints - counters.checkpoints
        );
        // Both bricks get every byte: the data is 2 × total.
        let data = (2 * total * MIB) as f64;
        println!(
            "| {depth} | {:.0} MiB/s | {:.0} MiB/s | {:+.0} % | {:.2} / {:.2} |",
            direct,
            intervals,
            (direct / intervals - 1.0) * 100.0,
            (between - before) as f64 / data,
            (after - between) as f64 / data,
        );
    }
    phases(&clients, total, seq + 1).await;
    for i in 0..2 {
        let _ = std::fs::remove_file(dir.join(format!("commit-overhead-b{i}.img")));
    }
}

/// Where one outstanding interval's time goes: the prepare on both bricks, then the commit on
/// both, each timed apart, against a direct write and its flush to both. Medians over
/// `total` writes each, at the same offsets as the runs above (the units are allocated).
async fn phases(clients: &Arc<Vec<BrickClient>>, total: u64, client: u64) {
    let data = Bytes::from(vec![0x5a; MIB as usize]);
    let (mut prepare, mut commit, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..total {
        let writes = vec![(i * MIB, data.clone())];
        let id = IntervalId { client, seq: i + 1 };
        let started = Instant::now();
        let (a, b) = tokio::join!(
            clients[0].prepare(id, vec![0, 1], writes.clone(), &[]),
            clients[1].prepare(id, vec![0, 1], writes.clone(), &[])
        );
        assert_eq!((a.unwrap(), b.unwrap()), (Vote::Yes, Vote::Yes));
        let prepared = Instant::now();
        let (a, b) = tokio::join!(
            clients[0].decide(id, Decision::Commit),
            clients[1].decide(id, Decision::Commit)
        );
        assert!(a.unwrap() && b.unwrap());
        prepare.push(prepared - started);
        commit.push(prepared.elapsed());
        let started = Instant::now();
        let (a, b) = tokio::join!(
            clients[0].write_direct(writes.clone()),
            clients[1].write_direct(writes)
        );
        a.unwrap();
        b.unwrap();
        direct.push(started.elapsed());
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2].as_secs_f64() * 1000.0
    };
    let (prepare, commit, direct) = (
        median(&mut prepare),
        median(&mut commit),
        median(&mut direct),
    );
    println!(
        "\none interval at a time, medians of {total}: prepare {prepare:.2} ms + commit {commit:.2} ms = {:.2} ms; a direct write and flush {direct:.2} ms",
        prepare + commit
    );
}

/// Writes zeros over the whole of a new file and syncs it: a brick file whose every block the
/// file system has already allocated and marked written, as on a brick that has run for a
/// while. A new file, sparse or allocated, makes the file system allocate or convert extents,
/// and commit its own journal, at the first `fdatasync` after each first write.
fn write_whole(path: &std::path::Path, size: u64) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).expect("brick file");
    let zeros = vec![0u8; MIB as usize];
    for _ in 0..size / MIB {
        file.write_all(&zeros).expect("zeros");
    }
    file.sync_all().expect("sync");
}

/// Bytes this process has had written to storage so far (`write_bytes` of /proc/self/io):
/// what the bricks cost the disk, data, staging, metadata and all.
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("write_bytes: "))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time this process has used, user and system.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime, fields 14 and 15 of stat, in clock ticks of 1/100 s.
    (ticks(11) + ticks(12)) / 100.0
}

/// MiB/s of `total` 1 MiB writes from `depth` tasks, each writing its own stretch in order;
/// as intervals (client ids from `client_base`) or straight home.
async fn run(
    clients: &Arc<Vec<BrickClient>>,
    total: u64,
    depth: u64,
    client_base: Option<u64>,
) -> f64 {
    let per_task = total / depth;
    let started = Instant::now();
    let tasks: Vec<_> = (0..depth)
        .map(|task| {
            let clients = clients.clone();
            tokio::spawn(async move {
                let data = Bytes::from(vec![task as u8 + 1; MIB as usize]);
                for i in 0..per_task {
                    let offset = (task * per_task + i) * MIB;
                    let writes = vec![(offset, data.clone())];
                    match client_base {
                        Some(base) => {
                            let id = IntervalId {
                                client: base + task,
                                seq: i + 1,
                            };
                            let by_brick = BTreeMap::from([(0, writes.clone()), (1, writes)]);
                            let outcome = run_interval(&clients, id, by_brick, &[], 0).await;
                            assert!(outcome.ended(), "{outcome:?}");
                        }
                        None => {
                            let (a, b) = tokio::join!(
                                clients[0].write_direct(writes.clone()),
                                clients[1].write_direct(writes)
                            );
                            a.unwrap();
                            b.unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (per_task * depth) as f64 / started.elapsed().as_secs_f64()
}
