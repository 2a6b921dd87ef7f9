use strata_coord::catalog::{BrickRecord, VolumeRecord, RECORD_FORMAT};
use strata_coord::CoordError;

use crate::etcd::{Etcd, TIMEOUT};

fn brick(name: &str, size_bytes: u64) -> BrickRecord {
    BrickRecord {
        format: RECORD_FORMAT,
        name: name.into(),
        address: "127.0.0.1:10810".into(),
        size_bytes,
    }
}

fn mirrored(name: &str, bricks: [&str; 2], size_bytes: u64) -> VolumeRecord {
    VolumeRecord {
        format: RECORD_FORMAT,
        name: name.into(),
        size_bytes,
        unit_bytes: 1 << 20,
        segment_bytes: 1 << 20,
        mirror_sets: vec![bricks.iter().map(|b| b.to_string()).collect()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_needs_its_bricks_free_and_large_enough() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    for name in ["a", "b", "c", "d"] {
        coord.add_brick(&brick(name, 64 << 20)).await.unwrap();
    }
    assert!(matches!(
        coord.add_brick(&brick("a", 1 << 30)).await,
        Err(CoordError::Exists(_))
    ));
    assert_eq!(coord.bricks().await.unwrap()[0].record.size_bytes, 64 << 20);

    let missing = coord
        .create_volume(&mirrored("v", ["a", "z"], 32 << 20))
        .await;
    assert!(
        matches!(&missing, Err(CoordError::NotFound(w)) if w.contains("\"z\"")),
        "{missing:?}"
    );
    let too_big = coord
        .create_volume(&mirrored("v", ["a", "b"], 65 << 20))
        .await;
    assert!(
        matches!(&too_big, Err(CoordError::Invalid(w)) if w.contains("needs 68157440")),
        "{too_big:?}"
    );
    let same_twice = coord
        .create_volume(&mirrored("v", ["a", "a"], 32 << 20))
        .await;
    assert!(matches!(same_twice, Err(CoordError::Invalid(_))));
    assert!(coord.volumes().await.unwrap().is_empty());

    coord
        .create_volume(&mirrored("v", ["a", "b"], 64 << 20))
        .await
        .unwrap();
    let again = coord
        .create_volume(&mirrored("v", ["c", "d"], 32 << 20))
        .await;
    assert!(matches!(again, Err(CoordError::Exists(_))), "{again:?}");
    let shared = coord
        .create_volume(&mirrored("w", ["b", "c"], 32 << 20))
        .await;
    assert!(
        matches!(&shared, Err(CoordError::Invalid(w)) if w.contains("already serves volume \"v\"")),
        "{shared:?}"
    );
    coord
        .create_volume(&mirrored("w", ["c", "d"], 32 << 20))
        .await
        .unwrap();
    let listed = coord.volumes().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|v| v.record.name.as_str()).collect();
    assert_eq!(names, ["v", "w"]);
    assert_eq!(listed[0].record, mirrored("v", ["a", "b"], 64 << 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_volumes_racing_for_one_brick_cannot_both_win() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    for round in 0..8 {
        for name in ["x", "y", "shared"] {
            coord
                .add_brick(&brick(&format!("{name}{round}"), 1 << 30))
                .await
                .unwrap();
        }
        let shared = format!("shared{round}");
        let one = mirrored(
            &format!("p{round}"),
            [&format!("x{round}"), &shared],
            1 << 20,
        );
        let two = mirrored(
            &format!("q{round}"),
            [&format!("y{round}"), &shared],
            1 << 20,
        );
        let (c1, c2) = (coord.clone(), coord.clone());
        let (r1, r2) = tokio::join!(
            tokio::spawn(async move { c1.create_volume(&one).await }),
            tokio::spawn(async move { c2.create_volume(&two).await })
        );
        let won = [r1.unwrap(), r2.unwrap()];
        assert_eq!(
            won.iter().filter(|r| r.is_ok()).count(),
            1,
            "round {round}: {won:?}"
        );
        let users = coord
            .volumes()
            .await
            .unwrap()
            .into_iter()
            .filter(|v| v.record.bricks().any(|b| *b == shared))
            .count();
        assert_eq!(users, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_is_reported_never_taken_for_absent() {
    let etcd = Etcd::single();
    let coord = etcd.coord("c", TIMEOUT).await;
    coord.add_brick(&brick("a", 1 << 30)).await.unwrap();
    coord.add_brick(&brick("b", 1 << 30)).await.unwrap();
    coord
        .create_volume(&mirrored("v", ["a", "b"], 1 << 20))
        .await
        .unwrap();
    let mut raw = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .unwrap();
    raw.put("/strata/c/volumes/v", "{\"format\":1,\"name\":", None)
        .await
        .unwrap();
    let read = coord.volume("v").await;
    assert!(
        matches!(&read, Err(CoordError::Damaged { key, .. }) if key == "/strata/c/volumes/v"),
        "{read:?}"
    );
    assert!(matches!(
        coord.volumes().await,
        Err(CoordError::Damaged { .. })
    ));
    // Its bricks are not free for a new volume while the record cannot be read.
    let over = coord
        .create_volume(&mirrored("w", ["a", "b"], 1 << 20))
        .await;
    assert!(matches!(over, Err(CoordError::Damaged { .. })), "{over:?}");
    // A record from a newer format is refused the same way.
    let future = serde_json::to_string(&VolumeRecord {
        format: RECORD_FORMAT + 1,
        ..mirrored("v", ["a", "b"], 1 << 20)
    })
    .unwrap();
    raw.put("/strata/c/volumes/v", future, None).await.unwrap();
    let newer = coord.volume("v").await;
    assert!(
        matches!(&newer, Err(CoordError::Damaged { why, .. }) if why.contains("format 2")),
        "{newer:?}"
    );
    raw.put("/strata/c/versions/v", "seven", None)
        .await
        .unwrap();
    assert!(matches!(
        coord.version("v").await,
        Err(CoordError::Damaged { .. })
    ));
}
