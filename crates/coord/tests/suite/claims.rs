use std::time::Duration;

use strata_coord::catalog::{BrickRecord, VolumeRecord, RECORD_FORMAT};
use strata_coord::{Coord, CoordError};

use crate::etcd::{join, Etcd, TIMEOUT};

/// A RAIN-10 volume of 64 MiB over bricks b0..b3, its locks in 16 segments.
pub async fn volume(coord: &Coord, name: &str) {
    for i in 0..4 {
        let brick = BrickRecord {
            format: RECORD_FORMAT,
            name: format!("{name}-b{i}"),
            address: format!("10.0.0.{i}:10810"),
            size_bytes: 1 << 30,
        };
        coord.add_brick(&brick).await.unwrap();
    }
    let record = VolumeRecord {
        format: RECORD_FORMAT,
        name: name.into(),
        size_bytes: 64 << 20,
        unit_bytes: 1 << 20,
        segment_bytes: 4 << 20,
        mirror_sets: vec![
            vec![format!("{name}-b0"), format!("{name}-b1")],
            vec![format!("{name}-b2"), format!("{name}-b3")],
        ],
    };
    coord.create_volume(&record).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_has_one_holder_and_each_new_claim_a_larger_epoch() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    let a = join(&coord, "a", 5).await;
    let b = join(&coord, "b", 5).await;
    let first = coord.claim(&a, "v", 3).await.unwrap();
    assert_eq!((first.holder.as_str(), first.segment), ("a", 3));
    match coord.claim(&b, "v", 3).await {
        Err(CoordError::Held { holder, epoch, .. }) => {
            assert_eq!((holder.as_str(), epoch), ("a", first.epoch))
        }
        other => panic!("{other:?}"),
    }
    // Asking again (as after a lost answer) returns the same claim: one claim, one epoch.
    assert_eq!(coord.claim(&a, "v", 3).await.unwrap(), first);
    let other_segment = coord.claim(&b, "v", 4).await.unwrap();
    coord.confirm(&first).await.unwrap();
    coord.release(&first).await.unwrap();
    assert!(matches!(
        coord.confirm(&first).await,
        Err(CoordError::Fenced(_))
    ));
    let second = coord.claim(&b, "v", 3).await.unwrap();
    assert!(second.epoch > first.epoch && second.epoch > other_segment.epoch);
    // The old claim stays fenced: releasing it cannot free the new holder's segment.
    assert!(matches!(
        coord.release(&first).await,
        Err(CoordError::Fenced(_))
    ));
    coord.confirm(&second).await.unwrap();
    let listed = coord.claims("v").await.unwrap();
    assert_eq!(listed, vec![second.clone(), other_segment.clone()]);
    assert!(listed.iter().all(|c| c.lease == b.lease()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_goes_with_its_members_lease() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    let paused = join(&coord, "paused", 1).await;
    let next = join(&coord, "next", 5).await;
    let _beat = next.heartbeat();
    let old = coord.claim(&paused, "v", 0).await.unwrap();
    let started = std::time::Instant::now();
    let new = loop {
        match coord.claim(&next, "v", 0).await {
            Ok(claim) => break claim,
            Err(CoordError::Held { holder, .. }) => assert_eq!(holder, "paused"),
            Err(e) => panic!("{e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(new.epoch > old.epoch);
    assert!(!paused.is_live());
    // The member that paused wakes up: everything it held is refused.
    assert!(matches!(
        coord.confirm(&old).await,
        Err(CoordError::Fenced(_))
    ));
    assert!(matches!(
        coord.release(&old).await,
        Err(CoordError::Fenced(_))
    ));
    assert!(matches!(
        coord.claim(&paused, "v", 1).await,
        Err(CoordError::Fenced(_))
    ));
    coord.confirm(&new).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_frees_its_claims_at_once_and_a_claimed_volume_stays() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    volume(&coord, "v").await;
    let a = join(&coord, "a", 30).await;
    for segment in 0..16 {
        coord.claim(&a, "v", segment).await.unwrap();
    }
    let no_such = coord.claim(&a, "v", 16).await;
    assert!(
        matches!(&no_such, Err(CoordError::Invalid(why)) if why.contains("16 lock segments")),
        "{no_such:?}"
    );
    assert!(matches!(
        coord.claim(&a, "nothing", 0).await,
        Err(CoordError::NotFound(_))
    ));
    let stored = coord.volume("v").await.unwrap();
    let in_use = coord.remove_volume("v", stored.revision).await;
    assert!(
        matches!(&in_use, Err(CoordError::Invalid(why)) if why.contains("in use")),
        "{in_use:?}"
    );
    a.close().await.unwrap();
    assert!(coord.claims("v").await.unwrap().is_empty());
    let stale = coord.remove_volume("v", stored.revision - 1).await;
    assert!(matches!(stale, Err(CoordError::Conflict(_))), "{stale:?}");
    coord.remove_volume("v", stored.revision).await.unwrap();
    assert!(matches!(
        coord.volume("v").await,
        Err(CoordError::NotFound(_))
    ));
}
