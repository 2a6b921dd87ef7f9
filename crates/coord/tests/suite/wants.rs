use std::time::Duration;

use strata_coord::wants::WantEvent;

use crate::claims::volume;
use crate::etcd::{join, Etcd, TIMEOUT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_watching_wants_sees_them_come_and_go_with_the_wanter() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    let mut watch = coord.watch_wants("v").await.unwrap();
    let waiter = join(&coord, "waiter", 1).await;
    coord.want(&waiter, "v", 3).await.unwrap();
    assert_eq!(coord.wanted("v").await.unwrap(), vec![(3, "waiter".into())]);
    let next = tokio::time::timeout(Duration::from_secs(5), watch.next());
    assert_eq!(
        next.await.unwrap().unwrap().unwrap(),
        vec![WantEvent::Wanted {
            segment: 3,
            member: "waiter".into()
        }]
    );
    coord.unwant(&waiter, "v", 3).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), watch.next());
    assert_eq!(
        next.await.unwrap().unwrap().unwrap(),
        vec![WantEvent::Withdrawn {
            segment: 3,
            member: "waiter".into()
        }]
    );
    // A want is bound to its member's lease: it goes when the member dies.
    coord.want(&waiter, "v", 5).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), watch.next()).await;
    drop(waiter);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let next = tokio::time::timeout(Duration::from_secs(15), watch.next());
        let events = next.await.unwrap().unwrap().unwrap();
        if events.contains(&WantEvent::Withdrawn {
            segment: 5,
            member: "waiter".into(),
        }) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{events:?}");
    }
    assert!(coord.wanted("v").await.unwrap().is_empty());
}
