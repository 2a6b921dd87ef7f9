use std::time::{Duration, Instant};

use strata_coord::CoordError;

use crate::claims::volume;
use crate::etcd::{join, Etcd};

/// A three-node etcd: with one node down the cluster goes on; with two down the minority
/// left cannot decide anything, and says so within the timeout instead of acting; with a
/// node back, the majority decides again and nothing decided before is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_decides_nothing_and_a_majority_loses_nothing() {
    let mut etcd = Etcd::cluster(3);
    let timeout = Duration::from_secs(2);
    let coord = etcd.coord("c", timeout).await;
    volume(&coord, "v").await;
    let member = join(&coord, "a", 4).await;
    let _beat = member.heartbeat();
    let first = coord.claim(&member, "v", 0).await.unwrap();

    etcd.kill(2);
    // Two of three go on, once an election (if the leader was killed) is over.
    let second = eventually(&etcd, || coord.claim(&member, "v", 1)).await;
    // A number is never handed out twice, but a retried request whose first answer was lost
    // in the election may have taken one already: numbers can skip, never repeat.
    let before = eventually(&etcd, || coord.next_version("v")).await;
    assert!(before >= 1);

    etcd.kill(1);
    let started = Instant::now();
    let refused = coord.claim(&member, "v", 2).await;
    assert!(
        matches!(
            refused,
            Err(CoordError::Unavailable { .. }) | Err(CoordError::Fenced(_))
        ),
        "{refused:?}"
    );
    assert!(matches!(
        coord.next_version("v").await,
        Err(CoordError::Unavailable { .. })
    ));
    assert!(started.elapsed() < 3 * timeout, "{:?}", started.elapsed());

    etcd.start(1);
    let third = eventually(&etcd, || coord.claim(&member, "v", 2)).await;
    // The lease lived through the outage (etcd extends leases across an election), so the
    // member's earlier claims stand, and the new claim's epoch is larger than theirs.
    coord.confirm(&first).await.unwrap();
    coord.confirm(&second).await.unwrap();
    assert!(third.epoch > second.epoch && second.epoch > first.epoch);
    assert!(eventually(&etcd, || coord.next_version("v")).await > before);
    assert_eq!(coord.claims("v").await.unwrap().len(), 3);
}

/// Retries a request that may meet an election in progress, for up to 30 s.
async fn eventually<T, F, Fut>(etcd: &Etcd, mut request: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CoordError>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match request().await {
            Ok(answer) => return answer,
            Err(e) => assert!(Instant::now() < deadline, "{e}\n{}", etcd.logs()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
