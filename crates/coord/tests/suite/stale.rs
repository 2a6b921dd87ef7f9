use std::collections::BTreeSet;

use crate::claims::volume;
use crate::etcd::{Etcd, TIMEOUT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_regions_gather_from_every_host_and_go_as_they_are_copied() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    assert!(coord.stale("v").await.unwrap().is_empty());
    // Four hosts record what brick v-b1 misses, at once: every region is kept.
    let tasks: Vec<_> = (0..4u64)
        .map(|host| {
            let coord = coord.clone();
            tokio::spawn(async move {
                for i in 0..10 {
                    let regions = BTreeSet::from([host * 100 + i]);
                    coord.mark_stale("v", "v-b1", &regions).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stale = coord.stale("v").await.unwrap();
    let expected: BTreeSet<u64> = (0..4)
        .flat_map(|h| (0..10).map(move |i| h * 100 + i))
        .collect();
    assert_eq!(stale["v-b1"], expected);
    coord
        .mark_stale("v", "v-b3", &BTreeSet::from([7]))
        .await
        .unwrap();
    // Copied back in part, then whole: the record goes.
    let first: BTreeSet<u64> = expected.iter().copied().take(20).collect();
    coord.clear_stale("v", "v-b1", &first).await.unwrap();
    assert_eq!(coord.stale("v").await.unwrap()["v-b1"].len(), 20);
    coord.clear_stale("v", "v-b1", &expected).await.unwrap();
    let left = coord.stale("v").await.unwrap();
    assert_eq!(left.keys().collect::<Vec<_>>(), ["v-b3"]);
    // Removing the volume removes what it recorded.
    let stored = coord.volume("v").await.unwrap();
    coord.remove_volume("v", stored.revision).await.unwrap();
    assert!(coord.stale("v").await.unwrap().is_empty());
    assert!(coord
        .mark_stale("v", "v-b3", &BTreeSet::from([1]))
        .await
        .is_err());
}
