//! A brick's disk failing under it, and the brick replaced: the volume goes on with the
//! failed brick's peer, the new brick is rebuilt from it while a host writes, and the two end
//! byte-identical (a real etcd, bricks on loopback; `shared::cluster_with_spares`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use strata_brick::resolve::resolve_in_doubt;
use strata_brick::rpc::{BrickClient, RpcError};
use strata_brick::{SharedVolume, Vote};
use strata_cluster::interval::{Decision, IntervalId};
use strata_coord::session::{MemberRecord, Session};
use strata_coord::CoordError;
use strata_core::{BlockDevice, WriteFlags};

use crate::common::HOME;
use crate::shared::*;

/// `len` bytes of `byte`.
fn fill(byte: u8, len: usize) -> Bytes {
    Bytes::from(vec![byte; len])
}

/// Writes `data` at `at` through `host` and into the model of what the volume holds.
async fn write(host: &SharedVolume, model: &mut [u8], at: u64, data: Bytes) {
    model[at as usize..at as usize + data.len()].copy_from_slice(&data);
    host.write(at, data, WriteFlags::default()).await.unwrap();
}

async fn assert_reads(host: &SharedVolume, model: &[u8]) {
    let held = host.read(0, HOME as usize).await.unwrap();
    let first = (0..model.len()).find(|&i| held[i] != model[i]);
    assert!(
        first.is_none(),
        "the volume differs from the model at {first:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brick_whose_disk_fails_is_left_and_the_volume_goes_on_with_its_peer() {
    let cluster = cluster().await;
    let a = host(&cluster, "a").await;
    let mut model = vec![0u8; HOME as usize];
    write(&a, &mut model, 0, fill(1, 4096)).await;
    write(&a, &mut model, 128 << 10, fill(2, 4096)).await;
    a.flush().await.unwrap();
    // Pulled once both bricks have the commit (a flush returns before it is sent).
    a.landed().await;

    cluster.pulled[1].store(true, Ordering::SeqCst);
    write(&a, &mut model, 512, fill(3, 1024)).await;
    write(&a, &mut model, 192 << 10, fill(4, 8192)).await;
    a.flush().await.expect("the flush goes on with the peer");
    // What the host records of its commits it does once they land.
    a.landed().await;

    let failure = cluster.stores[1].disk_failure().expect("b1's disk failed");
    assert!(failure.contains("pulled test disk"), "{failure}");
    // The brick answers nothing now, not even what it could from memory: it is down.
    let answer = cluster.clients[1].read(128 << 10, 4096).await;
    assert!(
        matches!(&answer, Err(RpcError::Unreachable { why, .. }) if why.contains("disk failed")),
        "{answer:?}"
    );
    let stale = cluster.coord.stale("v").await.unwrap();
    assert_eq!(
        stale
            .get("b1")
            .map(|r| r.iter().copied().collect::<Vec<_>>()),
        Some(vec![0, 3]),
        "b1 misses the regions written since it failed: {stale:?}"
    );
    assert!(!stale.contains_key("b0"), "{stale:?}");
    assert_reads(&a, &model).await;
    // Another host reads b1 nowhere it missed writes.
    let b = host(&cluster, "b").await;
    assert_reads(&b, &model).await;
    // Writes go on.
    write(&a, &mut model, 64 << 10, fill(5, 4096)).await;
    a.flush().await.unwrap();
    assert_reads(&b, &model).await;
}

/// Volume `v` over b0 and b1, with spare b2; host `a` wrote every region, then b1's disk
/// failed and `a` wrote a region more without it. Returns the model of the volume.
async fn b1_failed_after_a_wrote_everywhere() -> (Cluster, Arc<SharedVolume>, Vec<u8>) {
    let cluster = cluster_with_spares(1).await;
    let a = host(&cluster, "a").await;
    let mut model = vec![0u8; HOME as usize];
    for region in 0..4u64 {
        write(
            &a,
            &mut model,
            region * UNIT,
            fill(10 + region as u8, UNIT as usize),
        )
        .await;
    }
    a.flush().await.unwrap();
    cluster.pulled[1].store(true, Ordering::SeqCst);
    write(&a, &mut model, 4096, fill(20, 4096)).await;
    a.flush().await.unwrap();
    (cluster, a, model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_brick_is_replaced_and_rebuilt_while_a_host_writes() {
    let (cluster, a, model) = b1_failed_after_a_wrote_everywhere().await;
    let mut model = model;

    // What an administrator could get wrong is refused, naming why.
    let refused = |r: Result<_, CoordError>| r.unwrap_err().to_string();
    let why = refused(cluster.coord.replace_brick("v", "b0", "b2").await);
    assert!(why.contains("current only on \"b0\""), "{why}");
    let why = refused(cluster.coord.replace_brick("v", "b1", "b0").await);
    assert!(why.contains("already serves volume \"v\""), "{why}");
    let why = refused(cluster.coord.replace_brick("v", "b9", "b2").await);
    assert!(why.contains("not a brick of the volume"), "{why}");
    assert!(cluster.coord.volume("v").await.unwrap().record.mirror_sets[0] == ["b0", "b1"]);

    let before = cluster.coord.volume("v").await.unwrap().revision;
    let replaced = cluster.coord.replace_brick("v", "b1", "b2").await.unwrap();
    // A claim made by the record as it was is refused: its maker must read the volume again.
    let session = Session::open(
        &cluster.coord,
        MemberRecord {
            name: "late".into(),
            role: "client".into(),
            address: String::new(),
        },
        LEASE,
    )
    .await
    .unwrap();
    let late = cluster
        .coord
        .claim_under(&session, "v", 1, Some(before))
        .await;
    assert!(
        matches!(late, Err(CoordError::CatalogChanged { .. })),
        "{late:?}"
    );
    // By the new record it is an ordinary claim: refused only because host a holds it.
    let now = (cluster.coord)
        .claim_under(&session, "v", 1, Some(replaced.revision))
        .await;
    assert!(matches!(now, Err(CoordError::Held { .. })), "{now:?}");
    session.close().await.unwrap();
    assert_eq!(
        replaced.record.mirror_sets,
        vec![vec!["b0".to_string(), "b2".into()]]
    );
    assert_eq!(replaced.regions, 4);
    let stale = cluster.coord.stale("v").await.unwrap();
    assert_eq!(stale.get("b2").map(|r| r.len()), Some(4), "{stale:?}");
    assert!(
        !stale.contains_key("b1"),
        "the old brick's record goes: {stale:?}"
    );
    // A host still writing by the old record marks the old brick; the rebuild's end clears
    // such records, and leaves the new brick's.
    (cluster.coord.mark_stale("v", "b1", &[1].into()))
        .await
        .unwrap();
    assert_eq!(
        cluster.coord.forget_stale_of_departed("v").await.unwrap(),
        vec!["b1".to_string()]
    );
    let stale = cluster.coord.stale("v").await.unwrap();
    assert!(
        !stale.contains_key("b1") && stale.contains_key("b2"),
        "{stale:?}"
    );

    // The rebuild, as `strata cluster rebuild` runs it: a host of its own.
    let tool = host(&cluster, "rebuild").await;
    let seen = Mutex::new(Vec::new());
    let rebuilt = tool
        .rebuild(|copied, of| seen.lock().unwrap().push((copied, of)))
        .await
        .unwrap();
    assert_eq!((rebuilt.copied, rebuilt.by_others), (4, 0), "{rebuilt:?}");
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.last(), Some(&(4, 4)), "{seen:?}");
    assert!(!cluster.coord.stale("v").await.unwrap().contains_key("b2"));

    // Host a took the new brick in (its watch of the record) and gave its claims back for
    // the copy; it writes to both bricks from now on.
    for region in 0..4u64 {
        write(
            &a,
            &mut model,
            region * UNIT + 8192,
            fill(30 + region as u8, 4096),
        )
        .await;
    }
    a.flush().await.unwrap();
    assert_eq!(a.missing_regions(), 0);
    let b0 = cluster.clients[0].read(0, HOME as u32).await.unwrap();
    let b2 = cluster.clients[2].read(0, HOME as u32).await.unwrap();
    assert!(b0 == b2, "the replicas differ after the rebuild");
    assert!(b0[..] == model[..], "the replicas differ from the model");
    assert_reads(&a, &model).await;
    assert_reads(&tool, &model).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_runs_while_a_host_writes_and_the_replicas_end_equal() {
    let (cluster, a, model) = b1_failed_after_a_wrote_everywhere().await;
    cluster.coord.replace_brick("v", "b1", "b2").await.unwrap();

    let tool = host(&cluster, "rebuild").await;
    let writer = {
        let (a, mut model) = (a.clone(), model.clone());
        tokio::spawn(async move {
            // Every segment, over and over: each copy must wait for a write, or be followed
            // by one.
            for i in 0..48u64 {
                let at = (i * 37 % 64) * 4096;
                write(&a, &mut model, at, fill(40 + i as u8, 4096)).await;
                a.flush().await.unwrap();
            }
            model
        })
    };
    let rebuilt = tool.rebuild(|_, _| {}).await.unwrap();
    let model = writer.await.unwrap();
    // Each region is copied once as far as the rebuild knows: by it, or by host a's flushes.
    assert_eq!(rebuilt.copied + rebuilt.by_others, 4, "{rebuilt:?}");
    assert_eq!(tool.missing_regions(), 0);
    assert!(!cluster.coord.stale("v").await.unwrap().contains_key("b2"));
    a.flush().await.unwrap();
    let b0 = cluster.clients[0].read(0, HOME as u32).await.unwrap();
    let b2 = cluster.clients[2].read(0, HOME as u32).await.unwrap();
    let first = (0..b0.len()).find(|&i| b0[i] != b2[i]);
    assert!(first.is_none(), "the replicas differ at {first:?}");
    assert!(b0[..] == model[..], "the replicas differ from the model");
    assert_reads(&a, &model).await;
    assert_reads(&tool, &model).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_in_doubt_with_a_failed_brick_is_resolved_once_that_brick_is_replaced() {
    let cluster = cluster_with_spares(1).await;
    let (a, a_fences) = host_a_wrote_segment_0(&cluster).await;
    // A prepares an interval on b0 and b1, dies before deciding it, and b1's disk fails.
    let doomed = IntervalId {
        client: a.client_id(),
        seq: 500,
    };
    for client in &cluster.clients[..2] {
        let vote = (client.prepare(doomed, vec![0, 1], vec![(0, sector("a2"))], &a_fences))
            .await
            .unwrap();
        assert_eq!(vote, Vote::Yes);
    }
    a.stop_heartbeat();
    until_lease_gone(&cluster, a.client_id()).await;
    cluster.pulled[1].store(true, Ordering::SeqCst);
    // b0 resolves with its peers as the catalog names them, as `strata brick serve` does.
    let resolve = || async {
        let record = cluster.coord.volume("v").await.unwrap().record;
        let bricks = cluster.coord.bricks().await.unwrap();
        let peers: BTreeMap<u64, BrickClient> = (record.bricks().enumerate())
            .filter(|(index, _)| *index != 0)
            .map(|(index, name)| {
                let brick = bricks.iter().find(|b| &b.record.name == name).unwrap();
                let client = BrickClient::new(&brick.record.address, TIMEOUT).unwrap();
                (index as u64, client)
            })
            .collect();
        let coord = cluster.coord.clone();
        let fenced = move |client: u64| {
            let coord = coord.clone();
            async move { matches!(coord.lease_alive(client as i64).await, Ok(false)) }
        };
        resolve_in_doubt(&cluster.stores[0], 0, &peers, fenced)
            .await
            .unwrap()
    };
    // b1 might have committed it: b0 cannot tell, and keeps it in doubt.
    assert_eq!(resolve().await, vec![]);
    assert_eq!(cluster.stores[0].in_doubt().await.len(), 1);
    // b2 takes b1's place; it never prepared the interval, so no commit was ever sent.
    cluster.coord.replace_brick("v", "b1", "b2").await.unwrap();
    assert_eq!(resolve().await, vec![(doomed, Decision::Abort)]);
    assert!(cluster.stores[0].in_doubt().await.is_empty());
    let held = cluster.clients[0].read(0, 512).await.unwrap();
    assert_eq!(held, sector("a1"), "the aborted interval is not applied");
}
