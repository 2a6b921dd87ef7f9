use std::time::Duration;

use strata_coord::session::Session;
use strata_coord::CoordError;

use crate::etcd::{join, member, Etcd, TIMEOUT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_name_is_taken_while_its_member_lives() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    let first = join(&coord, "host-a", 5).await;
    let again = Session::open(&coord, member("host-a"), Duration::from_secs(5)).await;
    assert!(
        matches!(&again, Err(CoordError::Exists(what)) if what.contains("host-a")),
        "{:?}",
        again.err()
    );
    let members = coord.members().await.unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].record, member("host-a"));
    assert_eq!(members[0].lease, first.lease());
    first.close().await.unwrap();
    assert!(coord.members().await.unwrap().is_empty());
    join(&coord, "host-a", 5).await;
    // Another cluster on the same etcd keeps its own members.
    let other = etcd.coord("d", TIMEOUT).await;
    assert!(other.members().await.unwrap().is_empty());
    join(&other, "host-a", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_are_refused_before_reaching_etcd() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    for bad in ["", "a/b", "../x", ".hidden"] {
        let result = Session::open(&coord, member(bad), Duration::from_secs(5)).await;
        assert!(matches!(result, Err(CoordError::Invalid(_))), "{bad:?}");
    }
    let zero = Session::open(&coord, member("a"), Duration::ZERO).await;
    assert!(matches!(zero, Err(CoordError::Invalid(_))));
    assert!(coord.members().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_renewing_is_fenced_and_its_name_freed() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    let paused = join(&coord, "host-a", 1).await;
    assert!(paused.is_live());
    // No heartbeat: as if the process were stopped. Watch both views until etcd drops it:
    // whenever etcd no longer lists the member, the member must already count itself lost.
    let mut listed = true;
    for _ in 0..100 {
        listed = !coord.members().await.unwrap().is_empty();
        let live = paused.is_live();
        assert!(
            listed || !live,
            "etcd dropped the member before it counted itself lost"
        );
        if !listed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!listed, "the lease never ran out");
    let renewed = paused.renew().await;
    assert!(matches!(renewed, Err(CoordError::Fenced(_))), "{renewed:?}");
    assert!(!paused.is_live());
    // Fencing is final even for a renewal that might otherwise be accepted later.
    assert!(matches!(paused.renew().await, Err(CoordError::Fenced(_))));
    join(&coord, "host-a", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_keeps_a_member_past_its_ttl() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    let session = join(&coord, "host-a", 1).await;
    let heartbeat = session.heartbeat();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(session.is_live());
    assert_eq!(coord.members().await.unwrap().len(), 1);
    drop(heartbeat);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(!session.is_live());
    assert!(coord.members().await.unwrap().is_empty());
}
