use std::collections::{BTreeMap, BTreeSet};

use strata_coord::CoordError;

use crate::claims::volume;
use crate::etcd::{join, Etcd, TIMEOUT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_members_each_take_distinct_consecutive_versions() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    assert_eq!(coord.version("v").await.unwrap(), 0);
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let coord = coord.clone();
            tokio::spawn(async move {
                let mut taken = Vec::new();
                for _ in 0..25 {
                    taken.push(coord.next_version("v").await.unwrap());
                }
                taken
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    for task in tasks {
        for number in task.await.unwrap() {
            assert!(all.insert(number), "version {number} taken twice");
        }
    }
    assert_eq!(all, (1..=100).collect());
    assert_eq!(coord.version("v").await.unwrap(), 100);
    let stored = coord.volume("v").await.unwrap();
    coord.remove_volume("v", stored.revision).await.unwrap();
    assert!(matches!(
        coord.next_version("v").await,
        Err(CoordError::NotFound(_))
    ));
    // Removing the volume removed its counter: a new volume of the name starts again.
    assert_eq!(coord.version("v").await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_carries_the_version_counter_it_was_taken_under() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    let a = join(&coord, "a", 5).await;
    assert_eq!(coord.claim(&a, "v", 0).await.unwrap().version_at_claim, 0);
    coord.next_version("v").await.unwrap();
    coord.next_version("v").await.unwrap();
    let claim = coord.claim(&a, "v", 1).await.unwrap();
    assert_eq!(claim.version_at_claim, 2);
    // Asked again (a lost answer): the same claim, the counter as it is now.
    coord.next_version("v").await.unwrap();
    let again = coord.claim(&a, "v", 1).await.unwrap();
    assert_eq!((again.epoch, again.version_at_claim), (claim.epoch, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_waits_for_the_holders_at_its_announcement_and_is_recorded_complete() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    let a = join(&coord, "a", 5).await;
    let b = join(&coord, "b", 5).await;
    let _idle = join(&coord, "idle", 5).await;
    coord.claim(&a, "v", 0).await.unwrap();
    coord.claim(&a, "v", 1).await.unwrap();
    coord.claim(&b, "v", 2).await.unwrap();
    let taking = coord.begin_version("v").await.unwrap();
    assert_eq!(taking.number, 1);
    let holders: Vec<(&str, i64)> = (taking.record.holders.iter())
        .map(|h| (h.member.as_str(), h.lease))
        .collect();
    assert_eq!(holders, vec![("a", a.lease()), ("b", b.lease())]);
    assert_eq!(taking.record.stale_mark, 0);
    let records = coord.version_records("v").await.unwrap();
    assert_eq!(records.counter, 1);
    assert_eq!(records.taking[&1], taking.record);

    // Acks: a member's newest stands for every smaller number, and replaces its older one.
    coord.ack_version(&a, "v", 1, None).await.unwrap();
    assert_eq!(
        coord.version_acks("v").await.unwrap(),
        BTreeMap::from([("a".to_string(), 1)])
    );
    coord.next_version("v").await.unwrap();
    coord.ack_version(&a, "v", 2, Some(1)).await.unwrap();
    coord.ack_version(&b, "v", 1, None).await.unwrap();
    assert_eq!(
        coord.version_acks("v").await.unwrap(),
        BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 1)])
    );
    // An ack goes with its member's lease.
    b.close().await.unwrap();
    assert_eq!(
        coord.version_acks("v").await.unwrap(),
        BTreeMap::from([("a".to_string(), 2)])
    );

    coord.complete_version("v", 1).await.unwrap();
    coord.fail_version("v", 2, "brick b3 down").await.unwrap();
    let records = coord.version_records("v").await.unwrap();
    assert!(records.taking.is_empty(), "{records:?}");
    assert_eq!(records.complete.keys().copied().collect::<Vec<_>>(), [1]);
    assert!(records.complete[&1].completed_ms > 0);
    assert_eq!(records.failed[&2].why, "brick b3 down");
    // Ending a taking drops its acks.
    assert!(coord.version_acks("v").await.unwrap().is_empty());
    coord.forget_version("v", 2).await.unwrap();
    assert!(coord.version_records("v").await.unwrap().failed.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_version_is_announced_while_a_brick_is_stale_and_a_mark_moves_the_generation() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    assert_eq!(coord.stale_mark("v").await.unwrap(), 0);
    coord
        .mark_stale("v", "v-b1", &BTreeSet::from([3]))
        .await
        .unwrap();
    let marked = coord.stale_mark("v").await.unwrap();
    assert!(marked > 0);
    let refused = coord.begin_version("v").await.unwrap_err().to_string();
    assert!(
        refused.contains("v-b1") && refused.contains("stale"),
        "{refused}"
    );
    assert_eq!(coord.version("v").await.unwrap(), 0, "nothing announced");
    // Copied back: versions can be taken again, and the generation they start from is the
    // mark's (a clear does not move it; another mark would).
    coord
        .clear_stale("v", "v-b1", &BTreeSet::from([3]))
        .await
        .unwrap();
    assert_eq!(coord.stale_mark("v").await.unwrap(), marked);
    let taking = coord.begin_version("v").await.unwrap();
    assert_eq!(taking.record.stale_mark, marked);
    coord
        .mark_stale("v", "v-b0", &BTreeSet::from([1]))
        .await
        .unwrap();
    assert!(coord.stale_mark("v").await.unwrap() > marked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_intent_blocks_claims_and_versions_until_it_is_finished() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    let a = join(&coord, "a", 5).await;
    for n in 1..=3 {
        coord.begin_version("v").await.unwrap();
        coord.complete_version("v", n).await.unwrap();
    }
    // Refused to a version that is not complete, and while a segment is claimed.
    assert!(matches!(
        coord.begin_rollback("v", 7).await,
        Err(CoordError::Invalid(why)) if why.contains("no complete version 7")
    ));
    let claim = coord.claim(&a, "v", 0).await.unwrap();
    assert!(matches!(
        coord.begin_rollback("v", 2).await,
        Err(CoordError::Invalid(why)) if why.contains("\"a\"")
    ));
    coord.release(&claim).await.unwrap();

    coord.begin_rollback("v", 2).await.unwrap();
    // Running it again resumes it; another number is refused while it stands.
    coord.begin_rollback("v", 2).await.unwrap();
    assert!(matches!(
        coord.begin_rollback("v", 1).await,
        Err(CoordError::RollingBack { version: 2, .. })
    ));
    assert!(matches!(
        coord.claim(&a, "v", 0).await,
        Err(CoordError::RollingBack { version: 2, .. })
    ));
    assert!(matches!(
        coord.begin_version("v").await,
        Err(CoordError::RollingBack { version: 2, .. })
    ));
    assert_eq!(coord.rollback_pending("v").await.unwrap(), Some(2));
    assert!(coord.finish_rollback("v", 1).await.is_err());

    coord.finish_rollback("v", 2).await.unwrap();
    let records = coord.version_records("v").await.unwrap();
    assert_eq!(records.complete.keys().copied().collect::<Vec<_>>(), [1, 2]);
    assert_eq!(records.rollback, None);
    // The counter never goes back: a host that saw 3 tags its writes 3 or more.
    assert_eq!(records.counter, 3);
    assert_eq!(coord.claim(&a, "v", 0).await.unwrap().version_at_claim, 3);
    assert_eq!(coord.begin_version("v").await.unwrap().number, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_each_announcement() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    let mut watch = coord.watch_version("v").await.unwrap();
    coord.begin_version("v").await.unwrap();
    let seen = tokio::time::timeout(TIMEOUT, watch.next()).await.unwrap();
    assert_eq!(seen.unwrap(), Some(1));
    coord.next_version("v").await.unwrap();
    let seen = tokio::time::timeout(TIMEOUT, watch.next()).await.unwrap();
    assert_eq!(seen.unwrap(), Some(2));
}
