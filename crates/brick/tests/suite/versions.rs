//! Globally consistent versions of a shared volume and roll-back (docs/shared-volumes.md,
//! "Versions"): two hosts (each its own etcd session) over one mirror set of two bricks served
//! in-process, a real etcd, and the administrator's side (`VolumeVersions`) run while the
//! hosts write.
//!
//! The tests that seal, read or roll back a version on the bricks need the store's versions
//! (`BrickStore::seal_version` and the rest), and fail with `Unsupported` until it has them:
//! `a_version_taken_while_two_hosts_write_is_exactly_their_writes_tagged_before_it`,
//! `a_host_whose_lease_ran_out_does_not_hold_a_version_up`, and, since the store refuses any
//! tag but 0 until then, `a_host_tags_with_the_counter_it_saw_or_claimed_under`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_brick::versions::{VersionError, VolumeVersions};
use strata_brick::SharedVolume;
use strata_cluster::locks::Mode;
use strata_core::{BlockDevice, WriteFlags};

use crate::common::HOME;
use crate::shared::{cluster, host, sector, until_lease_gone, Cluster, SEGMENT};

const WAIT: Duration = Duration::from_secs(10);

async fn admin(cluster: &Cluster) -> VolumeVersions {
    VolumeVersions::open(&cluster.coord, "v", Duration::from_secs(5))
        .await
        .unwrap()
}

/// Where the shared counter lives: segment 2, written by both hosts under a lock.
const COUNTER: u64 = 2 * SEGMENT;

/// What one host wrote, each write with the tag of the interval that committed it.
#[derive(Default)]
struct Written {
    /// (offset, data, tag), in the order written.
    sectors: Vec<(u64, Bytes, u64)>,
    /// (count written, tag).
    increments: Vec<(u64, u64)>,
}

/// Writes its own sectors of segment `h` round and round, flushing each, and every third
/// round increments the shared counter under an exclusive lock, until `stop`.
async fn writer(host: Arc<SharedVolume>, h: u64, stop: Arc<AtomicBool>) -> Written {
    let mut written = Written::default();
    let owner = host.lock_owner();
    let mut round = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let at = h * SEGMENT + (round % 8) * 512;
        let data = sector(&format!("h{h} round {round}"));
        host.write(at, data.clone(), WriteFlags::default())
            .await
            .unwrap();
        host.flush().await.unwrap();
        written.sectors.push((at, data, host.last_tag().await));
        if round.is_multiple_of(3) {
            let lock = host
                .lock(owner, COUNTER, 512, Mode::Exclusive)
                .await
                .unwrap();
            let held = host.read(COUNTER, 512).await.unwrap();
            let count = u64::from_le_bytes(held[..8].try_into().unwrap()) + 1;
            let mut next = count.to_le_bytes().to_vec();
            next.resize(512, 0);
            host.write(COUNTER, Bytes::from(next), WriteFlags::default())
                .await
                .unwrap();
            // The unlock commits the increment.
            host.unlock(lock).await.unwrap();
            written.increments.push((count, host.last_tag().await));
        }
        round += 1;
    }
    written
}

/// The share's content made of exactly the writes tagged below `number` (all of them for
/// `u64::MAX`): one mirror set, so a brick's offsets are the volume's.
fn content_before(number: u64, written: &[Written]) -> Vec<u8> {
    let mut image = vec![0u8; HOME as usize];
    for host in written {
        for (at, data, _) in host.sectors.iter().filter(|(_, _, tag)| *tag < number) {
            image[*at as usize..*at as usize + data.len()].copy_from_slice(data);
        }
    }
    let count = (written.iter())
        .flat_map(|w| &w.increments)
        .filter(|(_, tag)| *tag < number)
        .map(|(count, _)| *count)
        .max();
    if let Some(count) = count {
        image[COUNTER as usize..COUNTER as usize + 8].copy_from_slice(&count.to_le_bytes());
    }
    image
}

async fn until_no_claims(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.coord.claims("v").await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "claims still stand");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_taken_while_two_hosts_write_is_exactly_their_writes_tagged_before_it() {
    let cluster = cluster().await;
    let hosts = [host(&cluster, "h0").await, host(&cluster, "h1").await];
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (hosts.iter().enumerate())
        .map(|(h, host)| tokio::spawn(writer(host.clone(), h as u64, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let admin = admin(&cluster).await;
    let first = admin.create(WAIT).await.unwrap();
    assert_eq!(first, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = admin.create(WAIT).await.unwrap();
    assert_eq!(second, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let mut written = Vec::new();
    for worker in workers {
        written.push(worker.await.unwrap());
    }
    // The writers were not stopped: each wrote on both sides of each cut.
    for (h, w) in written.iter().enumerate() {
        for cut in [first, second] {
            assert!(
                w.sectors.iter().any(|(_, _, tag)| *tag < cut)
                    && w.sectors.iter().any(|(_, _, tag)| *tag >= cut),
                "host h{h} wrote on one side of cut {cut} only"
            );
        }
    }
    // Causality through the lock: a later increment never carries an older tag.
    let mut increments: Vec<(u64, u64)> = (written.iter())
        .flat_map(|w| w.increments.iter().copied())
        .collect();
    increments.sort();
    for pair in increments.windows(2) {
        assert_eq!(pair[1].0, pair[0].0 + 1, "{increments:?}");
        assert!(pair[1].1 >= pair[0].1, "{increments:?}");
    }
    // Each version on each brick is exactly the writes tagged below it; the replicas agree.
    for number in [first, second] {
        let want = content_before(number, &written);
        for (i, client) in cluster.clients.iter().enumerate() {
            let held = client.read_version(number, 0, HOME as u32).await.unwrap();
            assert!(
                held[..] == want[..],
                "version {number} on brick b{i} is not the cut"
            );
        }
    }
    let now = content_before(u64::MAX, &written);
    for client in &cluster.clients {
        assert!(client.read(0, HOME as u32).await.unwrap()[..] == now[..]);
    }
    let list = admin.list().await.unwrap();
    assert_eq!(list.complete.keys().copied().collect::<Vec<_>>(), [1, 2]);
    assert!(list.failed.is_empty() && list.taking.is_empty(), "{list:?}");
    for (name, versions) in &list.bricks {
        let numbers: Vec<u64> = versions
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| v.number)
            .collect();
        assert_eq!(numbers, [1, 2], "brick {name}");
    }

    // Roll back: refused while a host holds claims, done once none does.
    let refused = admin.rollback(first).await.unwrap_err().to_string();
    assert!(refused.contains("claims"), "{refused}");
    drop(hosts);
    until_no_claims(&cluster).await;
    admin.rollback(first).await.unwrap();
    let want = content_before(first, &written);
    for (i, client) in cluster.clients.iter().enumerate() {
        let held = client.read(0, HOME as u32).await.unwrap();
        assert!(held[..] == want[..], "brick b{i} after the roll-back");
    }
    // Running it again changes nothing; version 2 is gone, version 1 stays.
    admin.rollback(first).await.unwrap();
    let list = admin.list().await.unwrap();
    assert_eq!(list.complete.keys().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(list.rollback, None);
    // A host opened after it reads the cut, and writes on.
    let after = host(&cluster, "h2").await;
    assert_eq!(after.read(0, HOME as usize).await.unwrap()[..], want[..]);
    after
        .write(0, sector("after"), WriteFlags::default())
        .await
        .unwrap();
    after.flush().await.unwrap();
    // Deleted: gone from the bricks and from etcd.
    admin.delete(first).await.unwrap();
    let list = admin.list().await.unwrap();
    assert!(list.complete.is_empty(), "{list:?}");
    for (name, versions) in &list.bricks {
        assert!(versions.as_ref().unwrap().is_empty(), "brick {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_has_not_acknowledged_holds_a_version_up_and_is_named() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let b = host(&cluster, "b").await;
    a.write(0, sector("a"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    // B opened but claimed nothing: the version does not wait for it.
    a.hold_version_acks(true);
    let admin = admin(&cluster).await;
    let started = Instant::now();
    match admin.create(Duration::from_millis(1500)).await {
        Err(VersionError::Failed {
            number, held_by, ..
        }) => {
            assert_eq!((number, held_by), (1, vec!["a".to_string()]));
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!(
        b.acked_version(),
        Some(1),
        "the host that claimed nothing acked"
    );
    assert_eq!(a.acked_version(), None);
    let records = cluster.coord.version_records("v").await.unwrap();
    assert!(records.complete.is_empty(), "{records:?}");
    assert!(records.failed[&1].why.contains("\"a\""), "{records:?}");
    // The failed version is never rolled back to.
    let refused = admin.rollback(1).await.unwrap_err().to_string();
    assert!(refused.contains("no complete version 1"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_lease_ran_out_does_not_hold_a_version_up() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    a.write(0, sector("a"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    a.hold_version_acks(true);
    a.stop_heartbeat();
    // Announced while A's claim still stands: A is a holder the version must hear from...
    let admin = admin(&cluster).await;
    let creating = tokio::spawn(async move { admin.create(WAIT).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let taking = cluster.coord.version_records("v").await.unwrap().taking;
    assert_eq!(taking[&1].holders[0].member, "a", "{taking:?}");
    // ...or of, once its lease is gone: then the version completes without it.
    until_lease_gone(&cluster, a.client_id()).await;
    let number = tokio::time::timeout(WAIT, creating)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(number, 1);
    for client in &cluster.clients {
        let held = client.read_version(1, 0, 512).await.unwrap();
        assert_eq!(held, sector("a"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_version_is_announced_while_a_brick_is_stale() {
    let cluster = cluster().await;
    cluster
        .coord
        .mark_stale("v", "b1", &[0].into())
        .await
        .unwrap();
    let refused = admin(&cluster).await.create(WAIT).await;
    match refused {
        Err(VersionError::Refused { why, .. }) => {
            assert!(why.contains("b1") && why.contains("stale"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(cluster.coord.version("v").await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_being_rolled_back_can_be_neither_opened_nor_claimed() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    // A version recorded complete in etcd alone: enough for the intent (the bricks are not
    // asked here).
    cluster.coord.begin_version("v").await.unwrap();
    cluster.coord.complete_version("v", 1).await.unwrap();
    cluster.coord.begin_rollback("v", 1).await.unwrap();
    let refused = SharedVolume::open(&cluster.coord, "v", "b", WAIT, Duration::from_secs(1))
        .await
        .err()
        .expect("opened while being rolled back")
        .to_string();
    assert!(refused.contains("rolled back"), "{refused}");
    // A host open before it cannot claim a segment to write.
    let refused = a
        .write(0, sector("a"), WriteFlags::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("rolled back"), "{refused}");
    cluster.coord.finish_rollback("v", 1).await.unwrap();
    let _reopened = host(&cluster, "b").await;
}

/// Interval tags on the wire: what a brick would record. A host tags with the newest number
/// it saw announced; one that has not yet seen it but claims a segment after it was
/// announced still tags with it, read in its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tags_with_the_counter_it_saw_or_claimed_under() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    a.write(0, sector("a0"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    assert_eq!(a.last_tag().await, 0);
    // Announced without a taking: only the tags are looked at here.
    for _ in 0..2 {
        cluster.coord.next_version("v").await.unwrap();
    }
    // A new host's claim reads 2, whatever its watch has seen.
    let b = host(&cluster, "b").await;
    b.write(SEGMENT, sector("b"), WriteFlags::default())
        .await
        .unwrap();
    b.flush().await.unwrap();
    assert_eq!(b.last_tag().await, 2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.acked_version() != Some(2) {
        assert!(Instant::now() < deadline, "a never acked 2");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.write(0, sector("a1"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    assert_eq!(a.last_tag().await, 2);
}

/// The rule a host acknowledges by, with a real debt: its interval's decision never reached
/// the bricks (they swallow decisions, as if they died after voting). Until it is delivered
/// the bricks hold the interval prepared, and it could still land either side of the cut:
/// the host does not acknowledge, and the version fails naming it. Once the bricks answer
/// again, the idle host delivers what it owes by itself, and acknowledges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_owing_a_decision_from_before_the_cut_holds_it_up_until_it_is_delivered() {
    let cluster = cluster().await;
    let a = crate::shared::host_waiting(&cluster, "a", Duration::from_secs(1)).await;
    for fault in &cluster.faults {
        fault.swallow_decisions.store(true, Ordering::SeqCst);
    }
    a.write(0, sector("owed"), WriteFlags::default())
        .await
        .unwrap();
    a.flush()
        .await
        .expect("every brick voted yes: committed, its commit owed");
    a.landed().await;
    let admin = admin(&cluster).await;
    match admin.create(Duration::from_millis(2500)).await {
        Err(VersionError::Failed {
            number, held_by, ..
        }) => assert_eq!((number, held_by), (1, vec!["a".to_string()])),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.acked_version(), None);
    for fault in &cluster.faults {
        fault.swallow_decisions.store(false, Ordering::SeqCst);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.acked_version() != Some(1) {
        assert!(Instant::now() < deadline, "a never delivered what it owed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for store in &cluster.stores {
        assert!(store.in_doubt().await.is_empty());
    }
    crate::shared::assert_replicas(&cluster, 0, &sector("owed")).await;
}

/// A brick marked stale while a version is taken missed an interval of the cut, even once it
/// has been copied back: the version fails rather than seal a copy without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brick_marked_stale_while_a_version_is_taken_fails_it() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    a.write(0, sector("a"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    a.hold_version_acks(true);
    let admin = admin(&cluster).await;
    let creating = tokio::spawn(async move { admin.create(WAIT).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.coord.version("v").await.unwrap() == 0 {
        assert!(Instant::now() < deadline, "never announced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let regions = [0].into();
    cluster.coord.mark_stale("v", "b1", &regions).await.unwrap();
    cluster
        .coord
        .clear_stale("v", "b1", &regions)
        .await
        .unwrap();
    a.hold_version_acks(false);
    let failed = tokio::time::timeout(WAIT, creating)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(failed.contains("marked stale"), "{failed}");
    let records = cluster.coord.version_records("v").await.unwrap();
    assert!(records.failed.contains_key(&1), "{records:?}");
}
