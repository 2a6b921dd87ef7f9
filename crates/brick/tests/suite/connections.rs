//! Each NBD connection to a shared volume has its own stream of intervals
//! (`Control::Connection`): its flush commits its writes and only its writes, its reads see
//! its own writes before they are committed and no other connection's, and writes a
//! connection leaves unflushed are committed when it ends.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use strata_core::{BlockDevice, Control, ControlReply, DeviceRef, WriteFlags};

use crate::shared::*;

fn zeros() -> bytes::Bytes {
    bytes::Bytes::from(vec![0u8; 512])
}

async fn connection(volume: &strata_brick::SharedVolume) -> DeviceRef {
    match volume.control(Control::Connection).await.unwrap() {
        ControlReply::Device(view) => view,
        _ => panic!("a shared volume gives each connection a view"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_commits_its_own_connections_writes_and_no_others() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let (one, two) = (connection(&a).await, connection(&a).await);
    one.write(0, sector("one"), WriteFlags::default())
        .await
        .unwrap();
    two.write(UNIT, sector("two"), WriteFlags::default())
        .await
        .unwrap();
    two.flush().await.unwrap();
    // Only the second connection's write is on the bricks.
    assert_replicas(&cluster, UNIT, &sector("two")).await;
    assert_replicas(&cluster, 0, &zeros()).await;
    // Each reads its own pending write, and not the other's.
    assert_eq!(one.read(0, 512).await.unwrap(), sector("one"));
    assert_eq!(two.read(0, 512).await.unwrap(), zeros());
    assert_eq!(one.read(UNIT, 512).await.unwrap(), sector("two"));
    // The volume's own callers are a stream of their own too.
    assert_eq!(a.read(0, 512).await.unwrap(), zeros());
    one.flush().await.unwrap();
    assert_replicas(&cluster, 0, &sector("one")).await;
    assert_eq!(a.read(0, 512).await.unwrap(), sector("one"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_ends_unflushed_has_its_writes_committed() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let gone = connection(&a).await;
    gone.write(2 * UNIT, sector("left"), WriteFlags::default())
        .await
        .unwrap();
    drop(gone);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = cluster.clients[0].read(2 * UNIT, 512).await.unwrap();
        if held == sector("left") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unflushed write never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_replicas(&cluster, 2 * UNIT, &sector("left")).await;
}

/// Intervals begun and ended through the API (`SharedVolume::begin`), as client threads do:
/// each sees its own writes; `end` commits all of one on both bricks; a dropped one leaves
/// nothing; one cannot grow past what a prepare carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_begun_by_the_api_commits_at_its_end_and_an_abort_leaves_nothing() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let (mut kept, mut dropped) = (a.begin(), a.begin());
    // Two writes in two segments: one interval, all or nothing.
    kept.write(0, sector("kept")).await.unwrap();
    kept.write(SEGMENT, sector("kept too")).await.unwrap();
    dropped.write(2 * SEGMENT, sector("dropped")).await.unwrap();
    assert_eq!(kept.read(0, 512).await.unwrap(), sector("kept"));
    assert_eq!(kept.read(2 * SEGMENT, 512).await.unwrap(), zeros());
    assert_eq!(dropped.read(0, 512).await.unwrap(), zeros());
    assert_eq!(
        a.read(0, 512).await.unwrap(),
        zeros(),
        "visible before its end"
    );
    kept.end().await.unwrap();
    assert_replicas(&cluster, 0, &sector("kept")).await;
    assert_replicas(&cluster, SEGMENT, &sector("kept too")).await;
    dropped.abort();
    // Whatever the volume commits later, the aborted write is not in it.
    a.write(3 * SEGMENT, sector("later"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    assert_replicas(&cluster, 2 * SEGMENT, &zeros()).await;
    assert_eq!(a.read(2 * SEGMENT, 512).await.unwrap(), zeros());
    // Past what one prepare carries: refused, and what it held is still one interval.
    let mut big = a.begin();
    big.write(3 * SEGMENT + 4096, sector("big")).await.unwrap();
    let past = big
        .write(
            0,
            bytes::Bytes::from(vec![1u8; strata_brick::Interval::MAX_BYTES as usize]),
        )
        .await;
    assert!(
        matches!(&past, Err(strata_core::BlockError::InvalidArgument(why)) if why.contains("at most")),
        "{past:?}"
    );
    big.end().await.unwrap();
    assert_replicas(&cluster, 3 * SEGMENT + 4096, &sector("big")).await;
}

/// Flushes every connection at once and waits for them all.
async fn flush_all(connections: &[DeviceRef]) {
    let flushes = connections.iter().map(|c| c.flush());
    for flushed in futures_util::future::join_all(flushes).await {
        flushed.unwrap();
    }
}

/// The most prepares each brick had in progress at once since the last look.
fn most_at_once(cluster: &Cluster) -> Vec<usize> {
    (cluster.faults.iter())
        .map(|f| f.prepares_most.swap(0, Ordering::SeqCst))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_commit_at_once_when_apart_and_in_turn_when_they_share_a_unit() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let mut connections = Vec::new();
    for _ in 0..4 {
        connections.push(connection(&a).await);
    }
    // Slow bricks: an interval's prepare takes 400 ms, so intervals that run at once are
    // seen in progress together.
    for fault in &cluster.faults {
        fault.prepare_delay_ms.store(400, Ordering::SeqCst);
    }
    // Four connections, four 4 KiB units of one stripe unit: all four on both bricks at once.
    for (i, c) in connections.iter().enumerate() {
        let text = format!("apart {i}");
        c.write(i as u64 * 4096, sector(&text), WriteFlags::default())
            .await
            .unwrap();
    }
    most_at_once(&cluster);
    let started = Instant::now();
    flush_all(&connections).await;
    let took = started.elapsed();
    assert_eq!(most_at_once(&cluster), vec![4, 4], "took {took:?}");
    for i in 0..4 {
        assert_replicas(&cluster, i * 4096, &sector(&format!("apart {i}"))).await;
    }
    // Three connections, three sectors of one 4 KiB unit: one interval at a time, or a
    // brick could apply them in another order than its peer.
    for (i, c) in connections.iter().take(3).enumerate() {
        let text = format!("shared {i}");
        c.write(UNIT + i as u64 * 512, sector(&text), WriteFlags::default())
            .await
            .unwrap();
    }
    flush_all(&connections[..3]).await;
    assert_eq!(most_at_once(&cluster), vec![1, 1]);
    for i in 0..3 {
        assert_replicas(&cluster, UNIT + i * 512, &sector(&format!("shared {i}"))).await;
    }
    let intervals = (detail(&a).await.into_iter())
        .find(|(key, _)| key == "intervals")
        .map(|(_, value)| value);
    assert_eq!(
        intervals.as_deref(),
        Some("7 committed, 0 aborted, 0 in flight")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_writing_over_each_other_at_once_leave_identical_replicas() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    // Decisions sent to both bricks at once reach them in different orders.
    for fault in &cluster.faults {
        fault.decide_jitter_ms.store(10, Ordering::SeqCst);
    }
    let mut writers = Vec::new();
    for writer in 0..6u64 {
        let c = connection(&a).await;
        writers.push(tokio::spawn(async move {
            let mut seed = writer;
            for round in 0..40 {
                for _ in 0..1 + splitmix(&mut seed) % 3 {
                    // 32 sectors (four 4 KiB units) that every writer writes over.
                    let at = splitmix(&mut seed) % 32 * 512;
                    let text = format!("w{writer} r{round}");
                    c.write(at, sector(&text), WriteFlags::default())
                        .await
                        .unwrap();
                }
                c.flush().await.unwrap();
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let first = cluster.clients[0].read(0, 16384).await.unwrap();
    let second = cluster.clients[1].read(0, 16384).await.unwrap();
    let differ: Vec<u64> = (0..32u64)
        .filter(|&s| first[s as usize * 512..][..512] != second[s as usize * 512..][..512])
        .collect();
    assert!(differ.is_empty(), "replicas differ at sectors {differ:?}");
    assert_eq!(a.read(0, 16384).await.unwrap(), first);
}

/// SplitMix64: a seeded sequence of numbers, enough to scatter a test's writes.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The volume's detail lines, as `strata status` shows them.
async fn detail(volume: &strata_brick::SharedVolume) -> Vec<(String, String)> {
    let ControlReply::Describe(status) = volume.control(Control::Describe).await.unwrap() else {
        panic!("a shared volume describes itself");
    };
    status.detail
}

/// The bricks' states as `strata status` shows them, by brick name.
async fn brick_states(volume: &strata_brick::SharedVolume) -> Vec<String> {
    (detail(volume).await.into_iter())
        .filter(|(key, _)| key.starts_with("brick "))
        .map(|(key, value)| format!("{key}: {value}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intervals_read_the_stale_records_only_after_a_mark_or_a_new_claim() {
    let cluster = cluster().await;
    let (a, b) = (host(&cluster, "a").await, host(&cluster, "b").await);
    // The first write claims segment 0: its interval reads the records once.
    a.write(0, sector("a0"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    let after_claim = a.stale_reads();
    // Twenty more intervals in the segment it holds: nothing changed, nothing read.
    for i in 0..20 {
        a.write(512 * i, sector("again"), WriteFlags::default())
            .await
            .unwrap();
        a.flush().await.unwrap();
    }
    assert_eq!(a.stale_reads(), after_claim);
    // Another host records brick b1 stale in the second stripe unit, as a host that wrote
    // there with b1 down does: both hosts take it in from the watch, without writing.
    let regions = std::collections::BTreeSet::from([1]);
    cluster.coord.mark_stale("v", "b1", &regions).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    for volume in [&a, &b] {
        loop {
            let states = brick_states(volume).await;
            if states
                .iter()
                .any(|s| s.starts_with("brick b1: down, 1 regions"))
            {
                break;
            }
            assert!(Instant::now() < deadline, "{states:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(a.stale_reads() > after_claim);
    // A new claim is read after even with nothing marked: b takes segment 0 from a.
    let before = b.stale_reads();
    b.write(0, sector("b0"), WriteFlags::default())
        .await
        .unwrap();
    b.flush().await.unwrap();
    assert!(b.stale_reads() > before);
    assert_eq!(b.read(0, 512).await.unwrap(), sector("b0"));
}
