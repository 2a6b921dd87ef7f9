use std::collections::BTreeSet;

use strata_coord::CoordError;

use crate::claims::volume;
use crate::etcd::{Etcd, TIMEOUT};

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
