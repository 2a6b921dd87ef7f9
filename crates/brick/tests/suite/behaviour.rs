use std::sync::Arc;

use strata_brick::commit::OVERLAP_REFUSAL;
use strata_brick::{BrickStore, OpenReport, Vote};
use strata_cluster::interval::{Decision, Status};
use strata_core::{BlockError, DeviceRef};
use strata_crash::CrashGroup;

use crate::common::*;

#[tokio::test]
async fn a_commit_shows_the_prepared_writes_and_an_abort_never_does() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let free = store.staging_free().await;
    let one = id(1, 1);
    let writes = vec![(0, data(one, 0, 4096)), (65536, data(one, 1, 1024))];
    assert_eq!(
        store.prepare(one, vec![0, 1], writes, &[]).await.unwrap(),
        Vote::Yes
    );
    assert_eq!(store.status(one).await, Some(Status::Prepared));
    assert!(store.staging_free().await < free);
    // Prepared is not visible.
    assert_eq!(&store.read(0, 4096).await.unwrap()[..], &[0u8; 4096][..]);
    assert!(store.decide(one, Decision::Commit).await.unwrap());
    assert_eq!(store.read(0, 4096).await.unwrap(), data(one, 0, 4096));
    assert_eq!(store.read(65536, 1024).await.unwrap(), data(one, 1, 1024));
    assert_eq!(
        store.staging_free().await,
        free,
        "the tombstone holds no staging"
    );

    let two = id(1, 2);
    let vote = store
        .prepare(two, vec![0], vec![(0, data(two, 0, 512))], &[])
        .await;
    assert_eq!(vote.unwrap(), Vote::Yes);
    assert!(store.decide(two, Decision::Abort).await.unwrap());
    assert_eq!(store.read(0, 4096).await.unwrap(), data(one, 0, 4096));

    // The rules: a late prepare of a decided interval is refused, a commit never prepared
    // too, a contrary decision is refused, a repeated one acknowledged.
    let late = store
        .prepare(two, vec![0], vec![(0, data(two, 0, 512))], &[])
        .await;
    assert!(matches!(late.unwrap(), Vote::No(why) if why.contains("already decided")));
    assert!(!store.decide(id(1, 3), Decision::Commit).await.unwrap());
    assert!(!store.decide(one, Decision::Abort).await.unwrap());
    assert!(store.decide(one, Decision::Commit).await.unwrap());
    assert!(store.decide(id(1, 4), Decision::Abort).await.unwrap());
    assert_eq!(
        store.status(id(1, 4)).await,
        Some(Status::Decided(Decision::Abort))
    );

    // Reopen: the tombstones answer peers; nothing is in doubt.
    drop(store);
    let (store, report) = BrickStore::open(device).await.unwrap();
    assert_eq!(
        report,
        OpenReport {
            in_doubt: 0,
            redone: 0,
            tombstones: 3
        }
    );
    assert_eq!(
        store.status(one).await,
        Some(Status::Decided(Decision::Commit))
    );
    assert_eq!(store.read(65536, 1024).await.unwrap(), data(one, 1, 1024));
}

#[tokio::test]
async fn a_prepared_interval_stays_in_doubt_across_a_restart() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let one = id(7, 1);
    let writes = vec![(8192, data(one, 0, 8192))];
    assert_eq!(
        store
            .prepare(one, vec![0, 2], writes.clone(), &[])
            .await
            .unwrap(),
        Vote::Yes
    );
    // The client sends it again (its first answer was lost): the same yes.
    assert_eq!(
        store.prepare(one, vec![0, 2], writes, &[]).await.unwrap(),
        Vote::Yes
    );
    drop(store);
    let (store, report) = BrickStore::open(device).await.unwrap();
    assert_eq!(report.in_doubt, 1);
    assert_eq!(store.in_doubt().await, vec![(one, vec![0, 2])]);
    assert!(store.decide(one, Decision::Commit).await.unwrap());
    assert_eq!(store.read(8192, 8192).await.unwrap(), data(one, 0, 8192));
    assert!(store.in_doubt().await.is_empty());
}

#[tokio::test]
async fn forgetting_drops_tombstones_and_still_refuses_late_prepares() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    for seq in 1..=5 {
        let iv = id(3, seq);
        store
            .prepare(iv, vec![0], vec![(0, data(iv, 0, 512))], &[])
            .await
            .unwrap();
        let decision = if seq % 2 == 0 {
            Decision::Abort
        } else {
            Decision::Commit
        };
        assert!(store.decide(iv, decision).await.unwrap());
    }
    let pending = id(3, 6);
    store
        .prepare(pending, vec![0], vec![(512, data(pending, 0, 512))], &[])
        .await
        .unwrap();
    // Forgetting below 7 drops the five tombstones but never an interval still in doubt.
    assert_eq!(store.forget(3, 7).await.unwrap(), 5);
    assert_eq!(store.status(id(3, 2)).await, None);
    assert_eq!(store.status(pending).await, Some(Status::Prepared));
    let late = store
        .prepare(id(3, 2), vec![0], vec![(0, data(id(3, 2), 0, 512))], &[])
        .await;
    assert!(matches!(late.unwrap(), Vote::No(why) if why.contains("forgotten")));
    drop(store);
    let (store, report) = BrickStore::open(device).await.unwrap();
    assert_eq!((report.in_doubt, report.tombstones), (1, 0));
    let late = store
        .prepare(id(3, 4), vec![0], vec![(0, data(id(3, 4), 0, 512))], &[])
        .await;
    assert!(
        matches!(late.unwrap(), Vote::No(_)),
        "the mark survives a restart"
    );
    assert_eq!(store.read(0, 512).await.unwrap(), data(id(3, 5), 0, 512));
}

#[tokio::test]
async fn bad_requests_are_refused_and_change_nothing() {
    let group = CrashGroup::new();
    let (_device, store) = fresh(&group).await;
    let iv = id(1, 1);
    let misaligned = store
        .prepare(iv, vec![0], vec![(100, data(iv, 0, 512))], &[])
        .await;
    assert!(
        matches!(misaligned, Err(BlockError::InvalidArgument(_))),
        "{misaligned:?}"
    );
    let beyond = store
        .prepare(iv, vec![0], vec![(HOME - 512, data(iv, 0, 1024))], &[])
        .await;
    assert!(
        matches!(beyond, Err(BlockError::OutOfRange { .. })),
        "{beyond:?}"
    );
    assert_eq!(store.status(iv).await, None);
    // More than the staging region holds: a no vote, with the numbers.
    let free = store.staging_free().await;
    let mut writes = Vec::new();
    let mut total = 0;
    while total <= free {
        writes.push((0, data(iv, writes.len(), 128 << 10)));
        total += 128 << 10;
    }
    let vote = store.prepare(iv, vec![0], writes, &[]).await.unwrap();
    assert!(
        matches!(&vote, Vote::No(why) if why.contains("no staging space")),
        "{vote:?}"
    );
    assert_eq!(store.staging_free().await, free);
    assert_eq!(store.status(iv).await, None);
}

#[tokio::test]
async fn a_brick_is_never_formatted_over_metadata_nor_opened_from_anothers() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let iv = id(1, 1);
    store
        .prepare(iv, vec![0], vec![(0, data(iv, 0, 512))], &[])
        .await
        .unwrap();
    store.decide(iv, Decision::Commit).await.unwrap();
    drop(store);
    let again = BrickStore::format(device.clone(), &options(), false).await;
    assert!(
        matches!(&again, Err(BlockError::InvalidArgument(why)) if why.contains("refusing to format")),
        "{:?}",
        again.err()
    );
    let (store, _) = BrickStore::open(device.clone()).await.unwrap();
    assert_eq!(store.read(0, 512).await.unwrap(), data(iv, 0, 512));
    drop(store);

    // Metadata of another owner: refused by name.
    let other: DeviceRef = Arc::new(group.disk(geometry()));
    strata_meta::MetaStore::format(
        other.clone(),
        0,
        META,
        strata_meta::FormatOptions::new("thin pool"),
        strata_meta::StoreOptions::new("t"),
    )
    .await
    .unwrap();
    let wrong = BrickStore::open(other).await;
    assert!(
        matches!(&wrong, Err(BlockError::InvalidArgument(why)) if why.contains("\"thin pool\"")),
        "{:?}",
        wrong.err()
    );
    // A blank device is not an empty brick.
    let blank: DeviceRef = Arc::new(group.disk(geometry()));
    assert!(matches!(
        BrickStore::open(blank).await,
        Err(BlockError::Corrupt(_))
    ));
}

#[tokio::test]
async fn a_prepare_under_an_older_claim_epoch_is_fenced_even_after_a_restart() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let (old, new) = (id(1, 1), id(2, 1));
    // Segment 4's writes land at 0, segment 3's at 8192: different segments, different bytes.
    let write = |iv| vec![(0, data(iv, 0, 512))];
    let write_3 = |iv| vec![(8192, data(iv, 0, 512))];
    // Client 2 took segment 4 over at epoch 20; client 1 still believes in its epoch 10.
    assert_eq!(
        store
            .prepare(new, vec![0], write(new), &[(4, 20)])
            .await
            .unwrap(),
        Vote::Yes
    );
    let stale = store
        .prepare(old, vec![0], write(old), &[(3, 10), (4, 10)])
        .await
        .unwrap();
    assert!(
        matches!(&stale, Vote::No(why) if why.contains("segment 4 was claimed at epoch 20")),
        "{stale:?}"
    );
    assert_eq!(
        store.status(old).await,
        None,
        "a fenced prepare records nothing"
    );
    // Other segments, and the same epoch again, are fine.
    assert_eq!(
        store
            .prepare(id(1, 2), vec![0], write_3(id(1, 2)), &[(3, 10)])
            .await
            .unwrap(),
        Vote::Yes
    );
    assert_eq!(
        store
            .prepare(id(2, 2), vec![0], write(id(2, 2)), &[(4, 20)])
            .await
            .unwrap(),
        Vote::Yes
    );
    drop(store);
    let (store, _) = BrickStore::open(device).await.unwrap();
    let after = store
        .prepare(id(1, 3), vec![0], write(id(1, 3)), &[(4, 19)])
        .await
        .unwrap();
    assert!(matches!(after, Vote::No(_)), "the epoch survives a restart");
}

#[tokio::test]
async fn a_prepare_over_another_clients_undecided_interval_waits_until_it_is_decided() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let (first, second) = (id(2, 1), id(1, 1));
    let over = |iv, at, len| vec![(at, data(iv, 0, len))];
    assert_eq!(
        store
            .prepare(first, vec![0], over(first, 1024, 1024), &[])
            .await
            .unwrap(),
        Vote::Yes
    );
    // Another client over any of those bytes is refused, even after a restart...
    let refused = |vote: &Vote| matches!(vote, Vote::No(why) if why.contains(OVERLAP_REFUSAL));
    let vote = store
        .prepare(second, vec![0], over(second, 1536, 4096), &[])
        .await
        .unwrap();
    assert!(refused(&vote), "{vote:?}");
    drop(store);
    let (store, _) = BrickStore::open(device).await.unwrap();
    let vote = store
        .prepare(second, vec![0], over(second, 512, 1024), &[])
        .await
        .unwrap();
    assert!(refused(&vote), "{vote:?}");
    assert_eq!(
        store.status(second).await,
        None,
        "a refused prepare records nothing"
    );
    // ...while bytes beside them, and the same client's own next interval, are fine.
    assert_eq!(
        store
            .prepare(id(1, 2), vec![0], over(id(1, 2), 2048, 512), &[])
            .await
            .unwrap(),
        Vote::Yes
    );
    assert_eq!(
        store
            .prepare(id(2, 2), vec![0], over(id(2, 2), 1024, 512), &[])
            .await
            .unwrap(),
        Vote::Yes
    );
    // Once the first is decided, the second goes ahead.
    assert!(store.decide(first, Decision::Abort).await.unwrap());
    assert!(store.decide(id(2, 2), Decision::Commit).await.unwrap());
    assert_eq!(
        store
            .prepare(second, vec![0], over(second, 1024, 1024), &[])
            .await
            .unwrap(),
        Vote::Yes
    );
}
