//! What a shared volume's range locks cost (issue 19). Orchestra measured 14 µs to lock and
//! 15 µs to unlock a range locally, through its whole stack, and 310 µs more when the lock
//! was served by another node. Here:
//! - **local**: a 4 KiB lock and its unlock on a segment this host already holds: the host's
//!   own lock table, no network;
//! - **claim**: the first lock on a segment nobody holds: the segment is claimed in etcd;
//! - **handoff**: a lock on a segment another host holds, idle: the waiter says it wants it,
//!   the holder (watching the wants) gives it back, the waiter claims it.
//!
//! It starts its own single-node etcd (Debian's `etcd-server`) in a scratch folder, on
//! loopback, and kills it at the end. The volume's bricks are listed in the catalog but never
//! written to: locks do not reach them.
//!
//! `cargo run --release -p strata-brick --example lock_latency`

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use strata_brick::SharedVolume;
use strata_cluster::locks::Mode;
use strata_coord::catalog::{BrickRecord, VolumeRecord, RECORD_FORMAT};
use strata_coord::Coord;

const SEGMENT: u64 = 4 << 20;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Median and 99th percentile, in microseconds.
fn summary(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.5), at(0.99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = std::env::temp_dir().join(format!("lock-latency-{}", std::process::id()));
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{client}");
    let mut etcd = Command::new("etcd")
        .arg("--data-dir")
        .arg(&dir)
        .args(["--listen-client-urls", &endpoint])
        .args(["--advertise-client-urls", &endpoint])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
        ])
        .args([
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{peer}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd runs (apt-get install etcd-server)");
    let result = measure(&endpoint).await;
    let _ = etcd.kill();
    let _ = etcd.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result.unwrap();
}

async fn measure(endpoint: &str) -> anyhow::Result<()> {
    let coord = loop {
        let attempt = async {
            let coord =
                Coord::connect(&[endpoint.to_string()], "bench", Duration::from_secs(5)).await?;
            coord.bricks().await?;
            Ok::<_, anyhow::Error>(coord)
        };
        match attempt.await {
            Ok(coord) => break coord,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    for name in ["b0", "b1"] {
        coord
            .add_brick(&BrickRecord {
                format: RECORD_FORMAT,
                name: name.into(),
                // Never contacted: nothing is written.
                address: "127.0.0.1:9".into(),
                size_bytes: 1 << 30,
            })
            .await?;
    }
    coord
        .create_volume(&VolumeRecord {
            format: RECORD_FORMAT,
            name: "v".into(),
            size_bytes: 1 << 30,
            unit_bytes: 1 << 20,
            segment_bytes: SEGMENT,
            mirror_sets: vec![vec!["b0".into(), "b1".into()]],
        })
        .await?;
    let timeout = Duration::from_secs(5);
    let lease = Duration::from_secs(10);
    let a = SharedVolume::open(&coord, "v", "a", timeout, lease).await?;
    let b = SharedVolume::open(&coord, "v", "b", timeout, lease).await?;
    let (owner_a, owner_b) = (a.lock_owner(), b.lock_owner());

    // Local: segment 0 is held from the first lock on.
    let first = a.lock(owner_a, 0, 4096, Mode::Exclusive).await?;
    a.unlock(first).await?;
    let (mut locks, mut unlocks) = (Vec::new(), Vec::new());
    for i in 0..20_000u64 {
        let at = (i % 1024) * 4096;
        let started = Instant::now();
        let lock = a.lock(owner_a, at, 4096, Mode::Exclusive).await?;
        let locked = Instant::now();
        a.unlock(lock).await?;
        locks.push(locked - started);
        unlocks.push(locked.elapsed());
    }

    // Claim: each lock on a segment nobody held.
    let mut claims = Vec::new();
    for segment in 1..=100u64 {
        let started = Instant::now();
        let lock = a
            .lock(owner_a, segment * SEGMENT, 4096, Mode::Exclusive)
            .await?;
        claims.push(started.elapsed());
        a.unlock(lock).await?;
    }

    // Handoff: A holds segments 1..=100 (idle, within their linger); B locks each.
    let mut handoffs = Vec::new();
    for segment in 1..=100u64 {
        let started = Instant::now();
        let lock = b
            .lock(owner_b, segment * SEGMENT, 4096, Mode::Exclusive)
            .await?;
        handoffs.push(started.elapsed());
        b.unlock(lock).await?;
    }

    println!("| 4 KiB exclusive lock | median | 99th percentile |");
    println!("|---|---:|---:|");
    let rows = [
        ("local lock (segment held)", summary(locks)),
        ("local unlock (nothing pending)", summary(unlocks)),
        ("lock with a claim from etcd", summary(claims)),
        ("lock handed off from another host", summary(handoffs)),
    ];
    for (what, (median, p99)) in rows {
        println!("| {what} | {median:.1} µs | {p99:.1} µs |");
    }
    Ok(())
}
