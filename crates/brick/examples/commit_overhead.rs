//! What consistency intervals cost: 1 MiB sequential writes to a mirror set of two bricks on
//! loopback, each write its own interval (prepare, commit on both), against the same writes
//! sent straight home to both bricks (`WriteDirect`, "the same RAIN-10 without intervals"),
//! at 1 to 16 outstanding writes. Issue 19's targets: intervals cost at most 10 % at 1 MiB,
//! and throughput grows with outstanding writes up to 16.
//!
//! `cargo run --release -p strata-brick --example commit_overhead -- [DIR] [MiB per run]
//! [written]` (DIR holds the two brick files; /var/tmp when left out; `memory` keeps them in
//! memory; `written` writes the files whole before formatting them, as a brick that has run
//! for a while: every block allocated and written once). `ROUNDS=n` runs each depth's pair
//! n times, alternating which goes first, and prints the medians and the cost's range.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use strata_backend::{FileDevice, FileOptions, MemoryDevice};
use strata_brick::commit::run_interval;
use strata_brick::rpc::{serve, BrickClient};
use strata_brick::{BrickOptions, BrickStore, Vote};
use strata_cluster::interval::{Decision, IntervalId};
use strata_core::{async_trait, DeviceRef, Filter, TokioRuntime, WriteFlags};

const MIB: u64 = 1 << 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/var/tmp".into()));
    let total: u64 = args.next().map_or(256, |a| a.parse().expect("MiB per run"));
    let home = total * MIB;
    let written = args.next().is_some_and(|a| a == "written");
    let rounds: usize = std::env::var("ROUNDS").map_or(1, |r| r.parse().expect("ROUNDS"));
    let mut clients = Vec::new();
    let mut stores = Vec::new();
    let mut syncs = Vec::new();
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
        let counted = Arc::new(SyncCounter {
            inner: device,
            syncs: AtomicU64::new(0),
        });
        syncs.push(counted.clone());
        let device: DeviceRef = counted;
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
        "| outstanding | without intervals | with intervals | intervals cost{} | bytes written per byte, without / with |",
        if rounds > 1 {
            format!(" (median of {rounds} rounds, and the range)")
        } else {
            String::new()
        }
    );
    println!("|---:|---:|---:|---:|---:|");
    let mut seq = 0;
    // DEPTHS="8 16" runs only those; PROFILE=direct or PROFILE=intervals only that variant,
    // to profile it alone (the table then shows it against nothing).
    let depths: Vec<u64> = std::env::var("DEPTHS").map_or(vec![1, 2, 4, 8, 16], |d| {
        d.split_whitespace()
            .map(|n| n.parse().expect("DEPTHS"))
            .collect()
    });
    let only = std::env::var("PROFILE").ok();
    for depth in depths {
        // Each variant's MiB/s and bytes written per round; which runs first alternates, so
        // neither always inherits the other's dirty pages or warm caches.
        let (mut direct, mut intervals) = (Vec::new(), Vec::new());
        let mut costs = Vec::new();
        for round in 0..rounds {
            let mut pair = [None, None];
            for with_intervals in [round % 2 == 1, round % 2 == 0] {
                let label = if with_intervals {
                    "intervals"
                } else {
                    "direct"
                };
                if only.as_deref().is_some_and(|only| only != label) {
                    pair[usize::from(with_intervals)] = Some((f64::NAN, 0));
                    continue;
                }
                let before = written_bytes(&dir);
                let syncs_before = syncs[0].syncs.load(Relaxed);
                let counters = stores[0].metadata_counters();
                let cpu = cpu_seconds();
                let base = with_intervals.then(|| {
                    seq += 1;
                    seq * 1000
                });
                let speed = run(&clients, total, depth, base).await;
                let cpu = cpu_seconds() - cpu;
                let written = written_bytes(&dir) - before;
                let per_write = (syncs[0].syncs.load(Relaxed) - syncs_before) as f64 / total as f64;
                eprintln!(
                    "depth {depth}, round {}: brick 0 made {per_write:.2} syncs per write",
                    round + 1
                );
                if with_intervals {
                    let now = stores[0].metadata_counters();
                    let commits = now.commits - counters.commits;
                    eprintln!(
                        "depth {depth}, round {}: intervals used {cpu:.2} CPU s; brick 0 made {commits} metadata commits for {total} intervals, {:.1} ms each, {} checkpoints",
                        round + 1,
                        (now.commit_seconds_total - counters.commit_seconds_total) * 1000.0
                            / commits.max(1) as f64,
                        now.checkpoints - counters.checkpoints
                    );
                } else {
                    eprintln!(
                        "depth {depth}, round {}: direct writes used {cpu:.2} CPU s",
                        round + 1
                    );
                }
                pair[usize::from(with_intervals)] = Some((speed, written));
            }
            let [Some(without), Some(with)] = pair else {
                unreachable!("both variants ran")
            };
            costs.push(without.0 / with.0 - 1.0);
            direct.push(without);
            intervals.push(with);
        }
        // Both bricks get every byte: the data is 2 × total.
        let data = (2 * total * MIB) as f64;
        let per_byte = |runs: &[(f64, u64)]| {
            runs.iter().map(|r| r.1 as f64).sum::<f64>() / runs.len() as f64 / data
        };
        let speeds = |runs: &[(f64, u64)]| median(runs.iter().map(|r| r.0).collect());
        let spread = if rounds > 1 {
            let low = costs.iter().copied().fold(f64::INFINITY, f64::min);
            let high = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!(" ({:+.0} to {:+.0})", low * 100.0, high * 100.0)
        } else {
            String::new()
        };
        println!(
            "| {depth} | {:.0} MiB/s | {:.0} MiB/s | {:+.0} %{spread} | {:.2} / {:.2} |",
            speeds(&direct),
            speeds(&intervals),
            median(costs) * 100.0,
            per_byte(&direct),
            per_byte(&intervals),
        );
    }
    phases(&clients, total, seq + 1).await;
    for i in 0..2 {
        let _ = std::fs::remove_file(dir.join(format!("commit-overhead-b{i}.img")));
    }
}

/// The middle value (the upper one of an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
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
        forget_ended(clients, id, i + 1 == total);
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

/// What a host does (`volume::forget_ended`): every 64 intervals that ended, it tells the
/// bricks, in the background, to drop the tombstones of its intervals below the next one;
/// here also when a writer has written its last. Without it, tombstones pile up and every
/// prepare's overlap check walks all of them: in the first version of this example the
/// intervals' cost grew from round to round.
fn forget_ended(clients: &Arc<Vec<BrickClient>>, ended: IntervalId, last: bool) {
    if !ended.seq.is_multiple_of(64) && !last {
        return;
    }
    for client in clients.iter() {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .forget(ended.client, ended.seq + 1)
                .await
                .expect("forget");
        });
    }
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

/// Bytes written so far to the block device that holds `dir` (sectors written, from
/// /sys/dev/block): what the bricks cost the disk, data, staging, metadata and all, and
/// anything else writing to that device meanwhile (a quiet machine is assumed). 0 for
/// `memory`. (`write_bytes` of /proc/self/io, used before, counted 5 bytes per byte for
/// intervals on files written whole first, where the device wrote no more than on sparse
/// files: it counts pages dirtied, not bytes sent to the disk.)
fn written_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return 0;
    };
    let (major, minor) = (libc_major(meta.dev()), libc_minor(meta.dev()));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat"))
        .ok()
        .and_then(|stat| stat.split_whitespace().nth(6)?.parse::<u64>().ok())
        .map_or(0, |sectors| sectors * 512)
}

/// The major and minor numbers of a `dev_t`, as glibc's `major()` and `minor()` split it.
fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)
}

fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
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
                            forget_ended(&clients, id, i + 1 == per_task);
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

/// A brick's device, counting the calls that make something durable: a flush, a FUA write,
/// and each set of writes made durable together (one `fdatasync` each on a file).
struct SyncCounter {
    inner: DeviceRef,
    syncs: AtomicU64,
}

#[async_trait]
impl Filter for SyncCounter {
    fn next(&self) -> &DeviceRef {
        &self.inner
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> strata_core::Result<()> {
        if flags.fua {
            self.syncs.fetch_add(1, Relaxed);
        }
        self.inner.write(offset, data, flags).await
    }

    async fn flush(&self) -> strata_core::Result<()> {
        self.syncs.fetch_add(1, Relaxed);
        self.inner.flush().await
    }

    async fn write_durable(&self, writes: Vec<(u64, Bytes)>) -> strata_core::Result<()> {
        self.syncs.fetch_add(1, Relaxed);
        self.inner.write_durable(writes).await
    }

    async fn write_and_flush(&self, writes: Vec<(u64, Bytes)>) -> strata_core::Result<()> {
        self.syncs.fetch_add(1, Relaxed);
        self.inner.write_and_flush(writes).await
    }
}
