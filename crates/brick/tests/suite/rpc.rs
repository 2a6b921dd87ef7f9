//! Bricks served over the transaction channel on loopback, driven by the client's two-phase
//! commit and by each other's resolution of intervals left in doubt.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_brick::commit::run_interval;
use strata_brick::resolve::resolve_in_doubt;
use strata_brick::rpc::{serve, BrickClient, RpcError};
use strata_brick::{BrickStore, Vote};
use strata_cluster::interval::{Decision, IntervalId, Status};
use strata_core::DeviceRef;
use strata_crash::rand::SeedableRng;
use strata_crash::CrashGroup;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::common::*;

const TIMEOUT: Duration = Duration::from_secs(2);

/// A brick server on loopback over a device that outlives it (a restart reopens it).
struct Brick {
    device: DeviceRef,
    address: String,
    store: Option<Arc<BrickStore>>,
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Brick {
    async fn new(group: &CrashGroup) -> Brick {
        let (device, store) = fresh(group).await;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        let mut brick = Brick {
            device,
            address,
            store: None,
            running: None,
        };
        brick.start_with(Arc::new(store)).await;
        brick
    }

    async fn start_with(&mut self, store: Arc<BrickStore>) {
        let listener = tokio::net::TcpListener::bind(&self.address).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = store.clone();
        let task = tokio::spawn(async move {
            serve(served, listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        self.store = Some(store);
        self.running = Some((stop, task));
    }

    /// The server goes away (its store closed), as a brick process that exits.
    async fn stop(&mut self) {
        let (stop, task) = self.running.take().expect("running");
        let _ = stop.send(());
        task.await.unwrap();
        self.store = None;
    }

    async fn restart(&mut self) {
        let (store, _) = BrickStore::open(self.device.clone()).await.unwrap();
        self.start_with(Arc::new(store)).await;
    }

    fn store(&self) -> &BrickStore {
        self.store.as_ref().expect("running")
    }

    fn client(&self) -> BrickClient {
        BrickClient::new(&self.address, TIMEOUT).unwrap()
    }
}

async fn bricks(n: usize) -> (CrashGroup, Vec<Brick>, Vec<BrickClient>) {
    let group = CrashGroup::new();
    let mut bricks = Vec::new();
    for _ in 0..n {
        bricks.push(Brick::new(&group).await);
    }
    let clients = bricks.iter().map(Brick::client).collect();
    (group, bricks, clients)
}

fn writes(id: IntervalId, on: &[(usize, u64, usize)]) -> BTreeMap<usize, Vec<(u64, Bytes)>> {
    let mut map: BTreeMap<usize, Vec<(u64, Bytes)>> = BTreeMap::new();
    for (i, &(brick, offset, len)) in on.iter().enumerate() {
        map.entry(brick)
            .or_default()
            .push((offset, data(id, i, len)));
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_commits_on_every_brick_or_on_none() {
    let (_group, _bricks, clients) = bricks(3).await;
    let one = id(1, 1);
    let outcome = run_interval(
        &clients,
        one,
        writes(one, &[(0, 0, 8192), (2, 4096, 512)]),
        &[],
        0,
    )
    .await;
    assert!(outcome.ended(), "{outcome:?}");
    assert_eq!(clients[0].read(0, 8192).await.unwrap(), data(one, 0, 8192));
    assert_eq!(clients[2].read(4096, 512).await.unwrap(), data(one, 1, 512));
    assert_eq!(
        clients[1].status(one).await.unwrap(),
        None,
        "not a brick of it"
    );

    // One brick refuses its part (misaligned): nothing of the interval shows anywhere.
    let two = id(1, 2);
    let mut bad = writes(two, &[(0, 0, 4096), (1, 0, 4096)]);
    bad.get_mut(&1).unwrap()[0].0 = 100;
    let outcome = run_interval(&clients, two, bad, &[], 0).await;
    assert_eq!(outcome.decision, Decision::Abort);
    assert_eq!(outcome.refusals.len(), 1);
    assert!(outcome.refusals[0].1.contains("sectors"), "{outcome:?}");
    assert!(outcome.unacked.is_empty());
    assert_eq!(
        clients[0].read(0, 4096).await.unwrap(),
        data(one, 0, 8192).slice(..4096)
    );
    assert_eq!(
        clients[0].status(two).await.unwrap(),
        Some(Status::Decided(Decision::Abort))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_brick_makes_the_client_abort() {
    let (_group, mut bricks, clients) = bricks(2).await;
    bricks[1].stop().await;
    let one = id(1, 1);
    let outcome = run_interval(
        &clients,
        one,
        writes(one, &[(0, 0, 4096), (1, 0, 4096)]),
        &[],
        0,
    )
    .await;
    assert_eq!(outcome.decision, Decision::Abort);
    assert_eq!(
        (outcome.silent.clone(), outcome.unacked.clone()),
        (vec![1], vec![1])
    );
    assert_eq!(
        clients[0].status(one).await.unwrap(),
        Some(Status::Decided(Decision::Abort))
    );
    assert_eq!(
        &clients[0].read(0, 4096).await.unwrap()[..],
        &[0u8; 4096][..]
    );
    // Back: it never saw the interval, and the client's retry of the abort reaches it.
    bricks[1].restart().await;
    assert_eq!(clients[1].status(one).await.unwrap(), None);
    assert!(clients[1].decide(one, Decision::Abort).await.unwrap());
    let late = clients[1]
        .prepare(one, vec![0, 1], vec![(0, data(one, 1, 512))], &[])
        .await;
    assert!(matches!(late.unwrap(), Vote::No(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_clients_intervals_are_resolved_by_the_bricks() {
    let (_group, bricks, clients) = bricks(2).await;
    let peers = |me: u64| -> BTreeMap<u64, BrickClient> {
        (0..2u64)
            .filter(|&b| b != me)
            .map(|b| (b, clients[b as usize].clone()))
            .collect()
    };
    // The client prepared three intervals, then died: the first it committed on brick 0
    // only; the second had every yes (it may have been reported ended) and no commit sent;
    // the third reached brick 1 only.
    let (committed, all_yes, half) = (id(5, 1), id(5, 2), id(5, 3));
    for (iv, on) in [
        (committed, vec![0, 1]),
        (all_yes, vec![0, 1]),
        (half, vec![1]),
    ] {
        for brick in on {
            let write = vec![(iv.seq * 4096, data(iv, brick, 4096))];
            assert_eq!(
                clients[brick]
                    .prepare(iv, vec![0, 1], write, &[])
                    .await
                    .unwrap(),
                Vote::Yes
            );
        }
    }
    assert!(clients[0]
        .decide(committed, Decision::Commit)
        .await
        .unwrap());

    // While the client may still be alive, nothing is decided for it.
    let none = resolve_in_doubt(bricks[1].store(), 1, &peers(1), |_| async { false }).await;
    assert!(none.unwrap().is_empty());
    assert_eq!(bricks[1].store().in_doubt().await.len(), 3);

    // Fenced: the ones every brick prepared commit, the other aborts, on both bricks.
    let decided = resolve_in_doubt(bricks[1].store(), 1, &peers(1), |client| async move {
        client == 5
    })
    .await
    .unwrap();
    assert_eq!(
        decided,
        vec![
            (committed, Decision::Commit),
            (all_yes, Decision::Commit),
            (half, Decision::Abort)
        ]
    );
    for iv in [committed, all_yes] {
        for (brick, client) in clients.iter().enumerate() {
            assert_eq!(
                client.read(iv.seq * 4096, 4096).await.unwrap(),
                data(iv, brick, 4096)
            );
        }
    }
    assert_eq!(
        &clients[1].read(half.seq * 4096, 4096).await.unwrap()[..],
        &[0u8; 4096][..]
    );
    // Brick 0 was told every resolution: nothing is in doubt anywhere.
    assert!(bricks[0].store().in_doubt().await.is_empty());
    assert_eq!(
        clients[0].status(half).await.unwrap(),
        Some(Status::Decided(Decision::Abort))
    );
}

/// The race a lease alone does not close: a client paused inside its interval, past its
/// lease, wakes up and sends what it had not sent while the bricks resolve the interval. The
/// resolver fences the client on every brick before reading any state, so nothing late lands,
/// and both copies end alike: a late prepare cannot turn an abort into every yes, a late
/// abort cannot undo an interval every brick prepared, and a commit that landed before the
/// fence is carried everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_clients_late_messages_land_nowhere_once_the_bricks_fence_it() {
    let (_group, mut bricks, clients) = bricks(2).await;
    let peers = |me: u64| -> BTreeMap<u64, BrickClient> {
        (0..2u64)
            .filter(|&b| b != me)
            .map(|b| (b, clients[b as usize].clone()))
            .collect()
    };
    // `late`'s prepare reached brick 0 only before the pause; `all_yes` and `early` every
    // brick; `early`'s commit reached brick 0 before anything was fenced.
    let (late, all_yes, early) = (id(6, 1), id(6, 2), id(6, 3));
    for (iv, on) in [(late, vec![0]), (all_yes, vec![0, 1]), (early, vec![0, 1])] {
        for brick in on {
            let write = vec![(iv.seq * 4096, data(iv, 0, 4096))];
            let vote = clients[brick].prepare(iv, vec![0, 1], write, &[]).await;
            assert_eq!(vote.unwrap(), Vote::Yes);
        }
    }
    assert!(clients[0].decide(early, Decision::Commit).await.unwrap());
    // Brick 0's resolver has begun: its first step fences the client on its peer (here
    // brick 1), durably, before it reads brick 1's state.
    clients[1].fence_client(6).await.unwrap();
    bricks[1].stop().await;
    bricks[1].restart().await;
    // The client wakes up: its prepare of `late`, its abort of `all_yes` (it had given up
    // waiting) and any new prepare are refused there.
    let refused = clients[1]
        .prepare(late, vec![0, 1], vec![(4096, data(late, 0, 4096))], &[])
        .await
        .unwrap();
    assert!(
        matches!(&refused, Vote::No(why) if why.contains("fenced")),
        "{refused:?}"
    );
    assert!(!clients[1].decide(all_yes, Decision::Abort).await.unwrap());
    let refused = clients[1]
        .prepare(id(6, 4), vec![1], vec![(0, data(id(6, 4), 0, 512))], &[])
        .await
        .unwrap();
    assert!(
        matches!(&refused, Vote::No(why) if why.contains("fenced")),
        "{refused:?}"
    );
    assert_eq!(clients[1].status(late).await.unwrap(), None);
    assert_eq!(
        clients[1].status(all_yes).await.unwrap(),
        Some(Status::Prepared)
    );
    // The resolution: `late` never reached brick 1, so it is aborted on both; `all_yes` was
    // prepared on both, and `early` committed on brick 0: both commit everywhere.
    let decided = resolve_in_doubt(bricks[0].store(), 0, &peers(0), |c| async move { c == 6 })
        .await
        .unwrap();
    assert_eq!(
        decided,
        vec![(late, Decision::Abort), (all_yes, Decision::Commit)]
    );
    let decided = resolve_in_doubt(bricks[1].store(), 1, &peers(1), |c| async move { c == 6 })
        .await
        .unwrap();
    assert_eq!(decided, vec![(early, Decision::Commit)]);
    for client in &clients {
        assert_eq!(
            client.status(late).await.unwrap(),
            Some(Status::Decided(Decision::Abort))
        );
        assert_eq!(
            &client.read(4096, 4096).await.unwrap()[..],
            &[0u8; 4096][..]
        );
        assert_eq!(
            client.read(8192, 4096).await.unwrap(),
            data(all_yes, 0, 4096)
        );
        assert_eq!(
            client.read(12288, 4096).await.unwrap(),
            data(early, 0, 4096)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_stays_in_doubt_while_a_peer_is_down() {
    let (_group, mut bricks, clients) = bricks(2).await;
    let peers: BTreeMap<u64, BrickClient> = BTreeMap::from([(1, clients[1].clone())]);
    let iv = id(9, 1);
    for client in &clients {
        let vote = client
            .prepare(iv, vec![0, 1], vec![(0, data(iv, 0, 512))], &[])
            .await;
        assert_eq!(vote.unwrap(), Vote::Yes);
    }
    assert!(clients[1].decide(iv, Decision::Commit).await.unwrap());
    bricks[1].stop().await;
    let fenced = |_| async { true };
    let decided = resolve_in_doubt(bricks[0].store(), 0, &peers, fenced)
        .await
        .unwrap();
    assert!(
        decided.is_empty(),
        "decided without hearing from its peer: {decided:?}"
    );
    bricks[1].restart().await;
    let decided = resolve_in_doubt(bricks[0].store(), 0, &peers, fenced)
        .await
        .unwrap();
    assert_eq!(decided, vec![(iv, Decision::Commit)]);
    assert_eq!(clients[0].read(0, 512).await.unwrap(), data(iv, 0, 512));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_under_an_older_claim_cannot_commit() {
    let (_group, _bricks, clients) = bricks(2).await;
    let new = id(2, 1);
    let outcome = run_interval(
        &clients,
        new,
        writes(new, &[(0, 0, 512), (1, 0, 512)]),
        &[(0, 40)],
        0,
    )
    .await;
    assert!(outcome.ended());
    let old = id(1, 7);
    let outcome = run_interval(
        &clients,
        old,
        writes(old, &[(0, 0, 512), (1, 0, 512)]),
        &[(0, 39)],
        0,
    )
    .await;
    assert_eq!(outcome.decision, Decision::Abort);
    assert_eq!(outcome.refusals.len(), 2);
    assert!(outcome
        .refusals
        .iter()
        .all(|(_, why)| why.contains("fenced")));
    assert_eq!(clients[1].read(0, 512).await.unwrap(), data(new, 1, 512));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_over_the_wire_are_refused_and_the_brick_keeps_serving() {
    let (_group, _bricks, clients) = bricks(1).await;
    let iv = id(1, 1);
    let beyond = clients[0]
        .prepare(iv, vec![0], vec![(HOME, data(iv, 0, 512))], &[])
        .await;
    assert!(
        matches!(&beyond, Err(RpcError::Refused { why, .. }) if why.contains("reaches past the end")),
        "{beyond:?}"
    );
    let huge = clients[0].read(0, u32::MAX).await;
    assert!(
        matches!(&huge, Err(RpcError::Refused { why, .. }) if why.contains("exceeds")),
        "{huge:?}"
    );
    // A raw request with no decision in it.
    let mut raw = strata_brick::rpc::proto::brick_client::BrickClient::connect(format!(
        "http://{}",
        clients[0].address()
    ))
    .await
    .unwrap();
    let empty = raw
        .decide(strata_brick::rpc::proto::DecideRequest {
            id: None,
            decision: 1,
            resolution: false,
        })
        .await
        .unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    let nothing = raw
        .decide(strata_brick::rpc::proto::DecideRequest {
            id: Some(strata_brick::rpc::proto::Interval { client: 1, seq: 1 }),
            decision: 0,
            resolution: false,
        })
        .await
        .unwrap_err();
    assert_eq!(nothing.code(), tonic::Code::InvalidArgument);
    // Still serving, and nothing was recorded.
    assert_eq!(clients[0].status(iv).await.unwrap(), None);
    let outcome = run_interval(&clients, iv, writes(iv, &[(0, 0, 512)]), &[], 0).await;
    assert!(outcome.ended());
    // Nothing listens here: unreachable, not refused.
    let gone = BrickClient::new("127.0.0.1:1", TIMEOUT)
        .unwrap()
        .status(iv)
        .await;
    assert!(
        matches!(gone, Err(RpcError::Unreachable { .. })),
        "{gone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_carries_the_commits_of_its_clients_earlier_intervals() {
    let (group, mut bricks, clients) = bricks(1).await;
    let brick = &clients[0];
    let (one, two, three) = (id(4, 1), id(4, 2), id(4, 3));
    let prepare = |iv: IntervalId, carried: Vec<IntervalId>, offset: u64| async move {
        brick
            .prepare_carrying(
                &carried,
                iv,
                vec![0],
                vec![(offset, data(iv, 0, 4096))],
                &[],
                0,
            )
            .await
    };
    assert_eq!(
        prepare(one, vec![], 0).await.unwrap(),
        (Vote::Yes, Some(vec![]))
    );
    assert_eq!(
        prepare(two, vec![], 8192).await.unwrap(),
        (Vote::Yes, Some(vec![]))
    );
    // Two's prepare was answered: its commit rides in three's, with one's, and an interval
    // this brick never prepared, which it refuses as a `Decide` would.
    let never = id(4, 9);
    let (vote, committed) = prepare(three, vec![one, two, never], 4096).await.unwrap();
    assert_eq!(vote, Vote::Yes);
    assert_eq!(committed, Some(vec![true, true, false]));
    assert_eq!(brick.read(0, 4096).await.unwrap(), data(one, 0, 4096));
    assert_eq!(brick.read(8192, 4096).await.unwrap(), data(two, 0, 4096));
    assert_eq!(
        brick.status(one).await.unwrap(),
        Some(Status::Decided(Decision::Commit))
    );
    assert_eq!(brick.status(three).await.unwrap(), Some(Status::Prepared));
    // Carried again (the client never heard): answered as a repeat.
    let four = id(4, 4);
    let (_, committed) = prepare(four, vec![one], 12288).await.unwrap();
    assert_eq!(committed, Some(vec![true]));
    // Another client's interval cannot ride in this client's prepare.
    let other = id(5, 1);
    assert_eq!(prepare(other, vec![], 16384).await.unwrap().0, Vote::Yes);
    match prepare(id(4, 5), vec![other], 20480).await {
        Err(RpcError::Refused { why, .. }) => assert!(why.contains("another client"), "{why}"),
        answer => panic!("carried another client's commit: {answer:?}"),
    }
    assert_eq!(brick.status(other).await.unwrap(), Some(Status::Prepared));
    // A commit carried by a prepare the brick votes no on is applied and durable all the
    // same: after a power cut, three is committed.
    brick.decide(four, Decision::Abort).await.unwrap();
    let (vote, committed) = prepare(four, vec![three], 12288).await.unwrap();
    assert!(
        matches!(vote, Vote::No(ref why) if why.contains("already decided")),
        "{vote:?}"
    );
    assert_eq!(committed, Some(vec![true]));
    bricks[0].stop().await;
    for seed in 0..8 {
        let images = group.crash(&mut strata_crash::CrashRng::seed_from_u64(seed));
        let after = CrashGroup::new();
        let device: DeviceRef = Arc::new(after.disk_from(images.into_iter().next().unwrap()));
        let (store, _) = BrickStore::open(device).await.unwrap();
        assert_eq!(
            store.status(three).await,
            Some(Status::Decided(Decision::Commit)),
            "power cut {seed}"
        );
        assert_eq!(store.read(4096, 4096).await.unwrap(), data(three, 0, 4096));
    }
}
