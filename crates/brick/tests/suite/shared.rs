//! Shared volumes written by several hosts at once: two `SharedVolume`s (two hosts, each its
//! own etcd session) over the same mirror set of two bricks, with a real etcd. Lock safety
//! (no increment lost under range locks), fencing of a host whose lease ran out (by itself and
//! by the bricks), a host that died inside a commit holding up the next writer until its
//! interval is resolved, never landing after it, and an etcd gone silent holding no flush
//! past the host's lease.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use strata_brick::commit::run_interval;
use strata_brick::resolve::resolve_in_doubt;
use strata_brick::rpc::{serve_with_faults, BrickClient, RpcError, ServerFaults};
use strata_brick::{BrickStore, SharedVolume, Vote};
use strata_cluster::interval::{Decision, IntervalId, Status};
use strata_cluster::locks::Mode;
use strata_coord::catalog::{BrickRecord, VolumeRecord, RECORD_FORMAT};
use strata_coord::Coord;
use strata_core::{BlockDevice, DeviceRef, Filter, WriteFlags};
use strata_crash::CrashGroup;
use tokio::task::JoinHandle;

use crate::common::*;
use crate::etcd::Etcd;

pub(crate) const SEGMENT: u64 = 64 << 10;
pub(crate) const UNIT: u64 = 64 << 10;
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);
pub(crate) const LEASE: Duration = Duration::from_secs(1);

pub(crate) struct Cluster {
    pub(crate) etcd: Etcd,
    pub(crate) coord: Coord,
    pub(crate) stores: Vec<Arc<BrickStore>>,
    pub(crate) clients: Vec<BrickClient>,
    pub(crate) faults: Vec<Arc<ServerFaults>>,
    /// Per brick: set it, and the brick's disk fails every request from then on.
    pub(crate) pulled: Vec<Arc<AtomicBool>>,
    _servers: Vec<JoinHandle<()>>,
    _group: CrashGroup,
}

/// A disk that can be pulled: every request fails with EIO once `pulled` is set.
struct Pullable {
    next: DeviceRef,
    pulled: Arc<AtomicBool>,
}

impl Pullable {
    fn check(&self) -> strata_core::Result<()> {
        if self.pulled.load(Ordering::SeqCst) {
            return Err(strata_core::BlockError::Io {
                context: "pulled test disk".into(),
                source: std::io::Error::from_raw_os_error(5),
            });
        }
        Ok(())
    }
}

#[strata_core::async_trait]
impl Filter for Pullable {
    fn next(&self) -> &DeviceRef {
        &self.next
    }
    async fn read(&self, offset: u64, len: usize) -> strata_core::Result<BytesMut> {
        self.check()?;
        self.next.read(offset, len).await
    }
    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> strata_core::Result<()> {
        self.check()?;
        self.next.write(offset, data, flags).await
    }
    async fn flush(&self) -> strata_core::Result<()> {
        self.check()?;
        self.next.flush().await
    }
}

/// etcd, two bricks served on loopback and listed in the catalog, and volume `v`: one mirror
/// set of both, 256 KiB in four 64 KiB lock segments.
pub(crate) async fn cluster() -> Cluster {
    cluster_with_spares(0).await
}

/// [`cluster`], with `spares` more bricks (`b2`, …) served and in the catalog but in no
/// volume.
pub(crate) async fn cluster_with_spares(spares: usize) -> Cluster {
    let etcd = Etcd::single();
    let coord = etcd.coord("t", Duration::from_secs(5)).await;
    let group = CrashGroup::new();
    let (mut stores, mut clients, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    let (mut faults, mut pulls) = (Vec::new(), Vec::new());
    for i in 0..2 + spares {
        let pulled = Arc::new(AtomicBool::new(false));
        let disk: DeviceRef = Arc::new(Pullable {
            next: Arc::new(group.disk(geometry())),
            pulled: pulled.clone(),
        });
        pulls.push(pulled);
        let store = BrickStore::format(disk, &options(), false).await.unwrap();
        let store = Arc::new(store);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let served = store.clone();
        let fault = Arc::new(ServerFaults::default());
        faults.push(fault.clone());
        servers.push(tokio::spawn(async move {
            serve_with_faults(served, listener, std::future::pending(), fault)
                .await
                .unwrap();
        }));
        coord
            .add_brick(&BrickRecord {
                format: RECORD_FORMAT,
                name: format!("b{i}"),
                address: address.clone(),
                size_bytes: HOME,
            })
            .await
            .unwrap();
        stores.push(store);
        clients.push(BrickClient::new(&address, Duration::from_secs(5)).unwrap());
    }
    coord
        .create_volume(&VolumeRecord {
            format: RECORD_FORMAT,
            name: "v".into(),
            size_bytes: HOME,
            unit_bytes: UNIT,
            segment_bytes: SEGMENT,
            mirror_sets: vec![vec!["b0".into(), "b1".into()]],
        })
        .await
        .unwrap();
    Cluster {
        etcd,
        coord,
        stores,
        clients,
        faults,
        pulled: pulls,
        _servers: servers,
        _group: group,
    }
}

pub(crate) async fn host(cluster: &Cluster, member: &str) -> Arc<SharedVolume> {
    host_waiting(cluster, member, TIMEOUT).await
}

/// A host whose requests (a brick's answer, a segment, a lock) wait at most `timeout`.
pub(crate) async fn host_waiting(
    cluster: &Cluster,
    member: &str,
    timeout: Duration,
) -> Arc<SharedVolume> {
    SharedVolume::open(&cluster.coord, "v", member, timeout, LEASE)
        .await
        .unwrap_or_else(|e| panic!("{member} opens v: {e:#}\n{}", cluster.etcd.logs()))
}

pub(crate) fn sector(text: &str) -> Bytes {
    let mut out = text.as_bytes().to_vec();
    out.resize(512, b'.');
    Bytes::from(out)
}

/// Both bricks hold exactly `want` at `at` (one mirror set: a brick's offset is the volume's).
pub(crate) async fn assert_replicas(cluster: &Cluster, at: u64, want: &Bytes) {
    for (i, client) in cluster.clients.iter().enumerate() {
        let held = client.read(at, want.len() as u32).await.unwrap();
        assert_eq!(
            held,
            *want,
            "brick b{i} at {at}: {:?}",
            String::from_utf8_lossy(&held[..40])
        );
    }
}

/// Host `a` has written and flushed a sector of segment 0: it holds that segment alone.
pub(crate) async fn host_a_wrote_segment_0(
    cluster: &Cluster,
) -> (Arc<SharedVolume>, Vec<(u32, i64)>) {
    let a = host(cluster, "a").await;
    a.write(0, sector("a1"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    let fences = a.claimed_segments();
    assert_eq!(fences.len(), 1, "{fences:?}");
    assert_eq!(fences[0].0, 0);
    (a, fences)
}

/// Waits until etcd has let `lease` run out.
pub(crate) async fn until_lease_gone(cluster: &Cluster, lease: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.coord.lease_alive(lease as i64).await.unwrap() {
        assert!(Instant::now() < deadline, "lease {lease:x} still alive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_increment_shared_counters_under_range_locks_and_lose_none() {
    let cluster = cluster().await;
    let hosts = [host(&cluster, "h1").await, host(&cluster, "h2").await];
    // Two counters in segment 0, one in segment 1, one at the end of the volume: workers of
    // both hosts meet on each, within a host and across hosts.
    let counters = [0u64, 4096, SEGMENT + 512, HOME - 512];
    const ROUNDS: u64 = 6;
    let mut workers = Vec::new();
    for (h, host) in hosts.iter().enumerate() {
        for w in 0..2 {
            let host = host.clone();
            workers.push(tokio::spawn(async move {
                let owner = host.lock_owner();
                for round in 0..ROUNDS {
                    for c in 0..counters.len() {
                        // Each worker visits the counters in its own order.
                        let at = counters[(c + h + 2 * w) % counters.len()];
                        let lock = host.lock(owner, at, 512, Mode::Exclusive).await.unwrap();
                        let held = host.read(at, 512).await.unwrap();
                        let count = u64::from_le_bytes(held[..8].try_into().unwrap());
                        let mut next = (count + 1).to_le_bytes().to_vec();
                        next.extend(format!(" h{h} w{w} r{round}").bytes());
                        next.resize(512, 0);
                        host.write(at, Bytes::from(next), WriteFlags::default())
                            .await
                            .unwrap();
                        host.unlock(lock).await.unwrap();
                    }
                }
            }));
        }
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let total = 2 * 2 * ROUNDS;
    for &at in &counters {
        for (h, host) in hosts.iter().enumerate() {
            let held = host.read(at, 512).await.unwrap();
            let count = u64::from_le_bytes(held[..8].try_into().unwrap());
            assert_eq!(count, total, "counter at {at} as host h{} reads it", h + 1);
        }
        let first = cluster.clients[0].read(at, 512).await.unwrap();
        assert_replicas(&cluster, at, &first.clone()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_lease_ran_out_is_refused_by_itself_and_by_the_bricks() {
    let cluster = cluster().await;
    let (a, a_fences) = host_a_wrote_segment_0(&cluster).await;

    // A stops renewing, as a host paused past its lease; its claim goes with the lease.
    a.stop_heartbeat();
    until_lease_gone(&cluster, a.client_id()).await;
    let b = host(&cluster, "b").await;
    b.write(0, sector("b1"), WriteFlags::default())
        .await
        .unwrap();
    b.flush().await.unwrap();
    let b_fences = b.claimed_segments();
    assert!(
        b_fences[0].1 > a_fences[0].1,
        "{b_fences:?} after {a_fences:?}"
    );

    // A wakes up: it knows its lease is gone and refuses to write.
    let refused = a.write(0, sector("a2"), WriteFlags::default()).await;
    let message = refused.expect_err("a fenced host's write").to_string();
    assert!(message.contains("lease"), "{message}");
    // Had it raced its own check, the bricks refuse the epoch it holds.
    let late = IntervalId {
        client: a.client_id(),
        seq: 1000,
    };
    let writes = BTreeMap::from([(0, vec![(0, sector("a2"))]), (1, vec![(0, sector("a2"))])]);
    let outcome = run_interval(&cluster.clients, late, writes, &a_fences, 0).await;
    assert_eq!(outcome.decision, Decision::Abort, "{outcome:?}");
    assert_eq!(outcome.refusals.len(), 2, "{outcome:?}");
    assert!(
        outcome
            .refusals
            .iter()
            .all(|(_, why)| why.contains("fenced")),
        "{outcome:?}"
    );
    assert_replicas(&cluster, 0, &sector("b1")).await;
    assert_eq!(b.read(0, 512).await.unwrap(), sector("b1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_dead_inside_a_commit_holds_up_the_next_writer_until_resolved_never_after() {
    // A's prepare reached brick 0 only: A never had every yes, so the interval is aborted.
    dead_inside_a_commit(&[0], Decision::Abort).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_dead_after_every_yes_has_its_interval_committed_before_the_next_writer() {
    // Both bricks voted yes: A may have reported the interval ended before it sent a commit,
    // so the bricks commit it, and B's write lands over it.
    dead_inside_a_commit(&[0, 1], Decision::Commit).await;
}

/// Host A prepares an interval over sector 0 on `prepared_on` and dies before sending a
/// decision; host B then writes the same sector. B waits until the bricks resolve A's
/// interval as `resolved`, and its write lands after A's, never before.
async fn dead_inside_a_commit(prepared_on: &[usize], resolved: Decision) {
    let cluster = cluster().await;
    let (a, a_fences) = host_a_wrote_segment_0(&cluster).await;
    let doomed = IntervalId {
        client: a.client_id(),
        seq: 500,
    };
    for &brick in prepared_on {
        let vote = cluster.clients[brick]
            .prepare(doomed, vec![0, 1], vec![(0, sector("a2"))], &a_fences)
            .await
            .unwrap();
        assert_eq!(vote, Vote::Yes);
    }
    a.stop_heartbeat();
    until_lease_gone(&cluster, a.client_id()).await;

    // B takes the segment and writes over the same sector: its prepares are refused while the
    // bricks hold A's interval undecided there, so B waits. The bricks' resolvers run.
    let b = host(&cluster, "b").await;
    let writer = {
        let b = b.clone();
        tokio::spawn(async move {
            b.write(0, sector("b1"), WriteFlags::default()).await?;
            b.flush().await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !writer.is_finished(),
        "B committed over A's undecided interval"
    );
    let peers = |me: usize| {
        (0..2)
            .filter(|&p| p != me)
            .map(|p| (p as u64, cluster.clients[p].clone()))
            .collect::<BTreeMap<u64, BrickClient>>()
    };
    // The first resolver also tells its peer, which then has nothing left in doubt.
    let mut decided = Vec::new();
    for (me, store) in cluster.stores.iter().enumerate() {
        let coord = cluster.coord.clone();
        let fenced = move |client: u64| {
            let coord = coord.clone();
            async move { matches!(coord.lease_alive(client as i64).await, Ok(false)) }
        };
        decided.extend(
            resolve_in_doubt(store, me as u64, &peers(me), fenced)
                .await
                .unwrap(),
        );
    }
    assert_eq!(decided, vec![(doomed, resolved)]);
    tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("B commits once A's interval is resolved")
        .unwrap()
        .unwrap();

    // A's decisions, had they been sent late, change nothing: the bricks fenced A.
    for client in &cluster.clients {
        let contrary = match resolved {
            Decision::Commit => Decision::Abort,
            Decision::Abort => Decision::Commit,
        };
        assert!(!client.decide(doomed, contrary).await.unwrap());
        assert_eq!(
            client.status(doomed).await.unwrap(),
            Some(Status::Decided(resolved))
        );
    }
    assert_replicas(&cluster, 0, &sector("b1")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_waits_for_its_holder_here_and_gives_up_on_another_host_naming_it() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let b = host_waiting(&cluster, "b", Duration::from_secs(1)).await;
    let (first, second) = (a.lock_owner(), a.lock_owner());
    let held = a.lock(first, 4096, 8192, Mode::Exclusive).await.unwrap();
    // Another holder on the same host waits for the overlapping range...
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.lock(second, 8192, 512, Mode::Exclusive).await })
    };
    // ...while a range beside it is granted at once, and readers share.
    let beside = a.lock(second, 0, 4096, Mode::Exclusive).await.unwrap();
    a.unlock(beside).await.unwrap();
    let (r1, r2) = (
        a.lock(second, 32768, 512, Mode::Shared).await.unwrap(),
        a.lock(a.lock_owner(), 32768, 512, Mode::Shared)
            .await
            .unwrap(),
    );
    a.unlock(r1).await.unwrap();
    a.unlock(r2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "an overlapping lock was granted while held"
    );

    // Host B cannot have segment 0 while A's lock pins it: it gives up after its timeout,
    // naming the holder.
    let refused = b.lock(b.lock_owner(), 0, 512, Mode::Exclusive).await;
    let message = refused
        .err()
        .expect("a lock on a segment held elsewhere")
        .to_string();
    assert!(message.contains("held by a"), "{message}");

    a.unlock(held).await.unwrap();
    let second_lock = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the range once it is unlocked")
        .unwrap()
        .unwrap();
    a.unlock(second_lock).await.unwrap();
    // Nothing pins segment 0 on A now: B wants it and gets it.
    let lock = b
        .lock(b.lock_owner(), 0, 512, Mode::Exclusive)
        .await
        .unwrap();
    assert!(lock.fences()[0].1 > 0);
    assert!(
        a.claimed_segments().is_empty(),
        "{:?}",
        a.claimed_segments()
    );
    b.unlock(lock).await.unwrap();
}

/// etcd goes silent just as a brick fails to acknowledge a commit: recording that brick
/// stale cannot be done, and the next flush, which must record it too before it commits
/// around the brick, fails within the host's lease and the brick's timeout, not after etcd's
/// timeout twice over (the CI run of 2026-12-02 waited 13 s on a 3 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_etcd_holds_no_flush_past_the_lease() {
    let cluster = cluster().await; // etcd calls wait up to 5 s
    let brick_timeout = Duration::from_secs(1);
    let a = host_waiting(&cluster, "a", brick_timeout).await;
    a.write(0, sector("a1"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.unwrap();
    a.landed().await;
    cluster.faults[0]
        .swallow_decisions
        .store(true, Ordering::SeqCst);
    cluster.etcd.pause(0);
    a.write(0, sector("a2"), WriteFlags::default())
        .await
        .unwrap();
    // Both bricks vote yes: committed, though b0 never acknowledges the commit.
    a.flush().await.expect("committed");
    let started = Instant::now();
    a.write(4096, sector("a3"), WriteFlags::default())
        .await
        .unwrap();
    // The commit's landing takes in b0's silence (and fails to record it) before the flush.
    a.landed().await;
    let refused = a.flush().await;
    let took = started.elapsed();
    cluster.etcd.resume(0);
    let message = refused
        .expect_err("a flush with etcd silent past the lease")
        .to_string();
    assert!(
        message.contains("lease") || message.contains("stale"),
        "{message}"
    );
    let bound = LEASE + brick_timeout + Duration::from_millis(1500);
    assert!(took < bound, "the flush failed after {took:?}: {message}");
    a.landed().await;
}

/// A commit no brick acknowledged, pinned deterministically. Both bricks vote yes and then
/// never hear the decision (as if they died first): the interval is committed all the same
/// (every brick holds it prepared, so a crash of them all resolves it as committed), and the
/// flush reports it. The commit stays owed; meanwhile neither brick serves the old data under
/// it, to this host or to another; it lands once they answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_no_brick_acknowledged_is_reported_and_lands_later_never_old_data_before() {
    let cluster = cluster().await;
    let a = host_waiting(&cluster, "a", Duration::from_secs(1)).await;
    for fault in &cluster.faults {
        fault.swallow_decisions.store(true, Ordering::SeqCst);
    }
    a.write(0, sector("unacked"), WriteFlags::default())
        .await
        .unwrap();
    a.flush().await.expect("every brick voted yes: committed");
    a.landed().await;
    let mut held = Vec::new();
    for store in &cluster.stores {
        let doubt = store.in_doubt().await;
        assert_eq!(doubt.len(), 1, "the interval waits prepared: {doubt:?}");
        held.push(doubt[0].0);
    }
    assert_eq!(held[0], held[1]);
    // Not served as old data: the host reads from no brick it owes a decision, and a brick
    // refuses to read bytes an undecided interval holds.
    let read = a.read(0, 512).await;
    assert!(read.is_err(), "read under an owed commit: {read:?}");
    for client in &cluster.clients {
        let refused = client.read(0, 512).await;
        assert!(
            matches!(&refused, Err(RpcError::Refused { why, .. }) if why.contains("undecided")),
            "{refused:?}"
        );
    }
    // The bricks answer again: the host's probes see it, and its next flush first delivers
    // the commit it owes them.
    for fault in &cluster.faults {
        fault.swallow_decisions.store(false, Ordering::SeqCst);
    }
    a.write(4096, sector("next"), WriteFlags::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(error) = a.flush().await {
        assert!(Instant::now() < deadline, "{error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for client in &cluster.clients {
        assert_eq!(
            client.status(held[0]).await.unwrap(),
            Some(Status::Decided(Decision::Commit))
        );
    }
    assert_replicas(&cluster, 0, &sector("unacked")).await;
    assert_replicas(&cluster, 4096, &sector("next")).await;
}

/// The benchmark's baseline, a volume written through without intervals
/// (`unsafe-without-intervals`): a write is on both bricks when it is answered, before any
/// flush, and a brick that cannot take it fails the write, by name, rather than leaving the
/// replicas different in silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_without_intervals_writes_through_to_every_brick_and_names_one_that_fails() {
    let cluster = cluster().await;
    let a = host_waiting(&cluster, "a", Duration::from_secs(3)).await;
    a.unsafe_without_intervals();
    a.write(4096, sector("through"), WriteFlags::default())
        .await
        .unwrap();
    assert_replicas(&cluster, 4096, &sector("through")).await;
    assert_eq!(a.read(4096, 512).await.unwrap(), sector("through"));
    a.flush().await.expect("nothing is left for a flush to do");
    cluster.pulled[1].store(true, Ordering::SeqCst);
    let started = Instant::now();
    let refused = a
        .write(8192, sector("one copy"), WriteFlags::default())
        .await
        .expect_err("a write only one brick took is not answered as written");
    assert!(
        refused.to_string().contains("writing through to brick b1"),
        "{refused}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
