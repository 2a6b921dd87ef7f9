use std::sync::Arc;
use std::time::Duration;

use strata_brick::commit::OVERLAP_REFUSAL;
use strata_brick::{BrickSettings, BrickStore, OpenReport, Vote};
use strata_cluster::interval::{Decision, Status};
use strata_core::{BlockError, DeviceRef};
use strata_crash::CrashGroup;

use crate::common::*;

#[tokio::test]
async fn a_commit_shows_the_prepared_writes_and_an_abort_never_does() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let store = Arc::new(store);
    let free = store.staging_free().await;
    let one = id(1, 1);
    let writes = vec![(0, data(one, 0, 4096)), (65536, data(one, 1, 1024))];
    assert_eq!(
        store.prepare(one, vec![0, 1], writes, &[]).await.unwrap(),
        Vote::Yes
    );
    assert_eq!(store.status(one).await, Some(Status::Prepared));
    assert!(store.staging_free().await < free);
    // Prepared is not visible, nor is the old data served under it: the interval may be
    // committed already (every brick voted yes), so a read waits for its decision. Bytes
    // beside it are served at once.
    assert_eq!(store.undecided_over(0, 4096), Some(one));
    assert_eq!(store.undecided_over(4096, 4096), None);
    assert_eq!(&store.read(4096, 4096).await.unwrap()[..], &[0u8; 4096][..]);
    let held = {
        let store = store.clone();
        tokio::spawn(async move { store.read(0, 4096).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!held.is_finished(), "read under an undecided interval");
    assert!(store.decide(one, Decision::Commit).await.unwrap());
    let read = tokio::time::timeout(Duration::from_secs(5), held).await;
    assert_eq!(read.unwrap().unwrap().unwrap(), data(one, 0, 4096));
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
    let held = {
        let store = store.clone();
        tokio::spawn(async move { store.read(0, 4096).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!held.is_finished(), "read under an undecided interval");
    assert!(store.decide(two, Decision::Abort).await.unwrap());
    let read = tokio::time::timeout(Duration::from_secs(5), held).await;
    assert_eq!(read.unwrap().unwrap().unwrap(), data(one, 0, 4096));
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
            tombstones: 3,
            ..OpenReport::default()
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

/// A brick on a crash disk that yields once before each operation, so requests sent at once
/// interleave: the disk to count flushes on, and the store.
async fn yielding(group: &CrashGroup) -> (strata_crash::CrashDisk, DeviceRef, BrickStore) {
    let disk = group.disk(geometry());
    let device: DeviceRef = Arc::new(Yielding::new(Arc::new(disk.clone()), 1..=1, 0));
    // Requests meet inside a prepare, as on a multi-threaded runtime.
    let settings = BrickSettings {
        yields_while_staging: 1,
        ..BrickSettings::default()
    };
    let store = BrickStore::format_with(device.clone(), &options(), false, &settings)
        .await
        .unwrap();
    (disk, device, store)
}

#[tokio::test]
async fn prepares_in_flight_at_once_share_metadata_commits() {
    let group = CrashGroup::new();
    let (disk, _, store) = yielding(&group).await;
    let prepare = |seq: u64| {
        let iv = id(5, seq);
        let offset = seq * 8192;
        let store = &store;
        async move {
            store
                .prepare(iv, vec![0], vec![(offset, data(iv, 0, 8192))], &[])
                .await
                .unwrap()
        }
    };
    // One at a time, each prepare writes its staged data, then its record in a journal batch
    // of its own, and one flush after the batch makes both durable: one flush each.
    let batches = || store.metadata_counters().batches;
    let (flushes_before, batches_before) = (disk.stats().flushes, batches());
    for seq in 0..8 {
        assert_eq!(prepare(seq).await, Vote::Yes);
    }
    assert_eq!(disk.stats().flushes - flushes_before, 8);
    assert_eq!(batches() - batches_before, 8);
    // At once, the records made while one batch is being written share the next, and its
    // flush.
    let (flushes_before, batches_before) = (disk.stats().flushes, batches());
    let votes = futures_util::future::join_all((8..16).map(prepare)).await;
    assert!(votes.iter().all(|v| *v == Vote::Yes), "{votes:?}");
    let together = batches() - batches_before;
    assert!(
        together <= 2,
        "{together} journal batches for 8 prepares at once"
    );
    assert_eq!(disk.stats().flushes - flushes_before, together);
    assert_eq!(store.in_doubt().await.len(), 16);
}

#[tokio::test]
async fn a_decision_or_a_duplicate_arriving_during_a_prepare_is_handled() {
    let group = CrashGroup::new();
    let (_, device, store) = yielding(&group).await;
    let total = store.layout().staging_bytes;
    // An abort while the prepare writes its data (a peer resolving the interval): the abort
    // is recorded, and the prepare, checking again before it records, votes no.
    let one = id(6, 1);
    let (vote, aborted) = tokio::join!(
        store.prepare(one, vec![0, 1], vec![(0, data(one, 0, 4096))], &[]),
        store.decide(one, Decision::Abort),
    );
    assert!(matches!(vote.unwrap(), Vote::No(why) if why.contains("already decided")));
    assert!(aborted.unwrap());
    assert_eq!(
        store.status(one).await,
        Some(Status::Decided(Decision::Abort))
    );
    assert_eq!(
        store.staging_free().await,
        total,
        "the refused prepare's staging is free"
    );

    // The prepare sent again while the first runs waits for it and votes the same.
    let two = id(6, 2);
    let writes = vec![(4096, data(two, 0, 4096))];
    let (first, again) = tokio::join!(
        store.prepare(two, vec![0, 1], writes.clone(), &[]),
        store.prepare(two, vec![0, 1], writes, &[]),
    );
    assert_eq!((first.unwrap(), again.unwrap()), (Vote::Yes, Vote::Yes));
    assert_eq!(store.in_doubt().await, vec![(two, vec![0, 1])]);
    assert!(store.decide(two, Decision::Abort).await.unwrap());
    assert_eq!(store.staging_free().await, total, "staged once, freed once");

    // A commit while the prepare runs waits for its record.
    let three = id(6, 3);
    let (vote, committed) = tokio::join!(
        store.prepare(three, vec![0, 1], vec![(4096, data(three, 0, 4096))], &[]),
        store.decide(three, Decision::Commit),
    );
    assert_eq!(vote.unwrap(), Vote::Yes);
    assert!(committed.unwrap());
    assert_eq!(store.read(4096, 4096).await.unwrap(), data(three, 0, 4096));
    assert_eq!(store.staging_free().await, total);

    // A newer epoch recorded while an older prepare writes its data fences it.
    let (old, new) = (id(6, 4), id(6, 5));
    let (old_vote, new_vote) = tokio::join!(
        store.prepare(old, vec![0], vec![(0, data(old, 0, 16384))], &[(2, 10)]),
        store.prepare(new, vec![0], vec![(0, data(new, 0, 512))], &[(2, 11)]),
    );
    assert!(matches!(old_vote.unwrap(), Vote::No(why) if why.contains("fenced")));
    assert_eq!(new_vote.unwrap(), Vote::Yes);

    drop(store);
    let (store, report) = BrickStore::open(device).await.unwrap();
    assert_eq!(report.in_doubt, 1);
    assert_eq!(store.in_doubt().await, vec![(new, vec![0])]);
    assert_eq!(store.status(old).await, None);
    assert_eq!(
        store.status(one).await,
        Some(Status::Decided(Decision::Abort))
    );
}

#[tokio::test]
async fn overlapping_commits_at_once_reach_home_in_the_order_they_are_acknowledged() {
    // Over many interleavings: the disk yields a seeded 0 to 3 times before each operation.
    for seed in 0..100 {
        let group = CrashGroup::new();
        let disk: DeviceRef = Arc::new(group.disk(geometry()));
        let device: DeviceRef = Arc::new(Yielding::new(disk, 0..=3, seed));
        let store = BrickStore::format(device.clone(), &options(), false)
            .await
            .unwrap();
        let ids: Vec<_> = (1..=4).map(|seq| id(8, seq)).collect();
        for &iv in &ids {
            // Each overlaps the next by half, and all of them the first sector.
            let offset = (iv.seq - 1) * 4096;
            let writes = vec![(offset, data(iv, 0, 8192)), (0, data(iv, 1, 512))];
            assert_eq!(
                store.prepare(iv, vec![0], writes, &[]).await.unwrap(),
                Vote::Yes
            );
        }
        let order = std::cell::RefCell::new(Vec::new());
        let acks = futures_util::future::join_all(ids.iter().rev().map(|&iv| {
            let (store, order) = (&store, &order);
            async move {
                let done = store.decide(iv, Decision::Commit).await.unwrap();
                order.borrow_mut().push(iv);
                done
            }
        }))
        .await;
        assert!(acks.iter().all(|a| *a));
        let mut home = vec![0u8; 5 * 4096];
        for iv in order.borrow().iter() {
            let offset = (iv.seq - 1) as usize * 4096;
            home[offset..offset + 8192].copy_from_slice(&data(*iv, 0, 8192));
            home[..512].copy_from_slice(&data(*iv, 1, 512));
        }
        let found = store.read(0, 5 * 4096).await.unwrap();
        assert!(
            found[..] == home[..],
            "seed {seed}: home is not in acknowledgement order"
        );
        drop(store);
        // The last tombstone need not be durable yet (nothing committed after it): then its
        // interval is redone, and being the last, leaves home as it was.
        let (store, report) = BrickStore::open(device).await.unwrap();
        assert!(report.redone <= 1, "{report:?}");
        assert!(store.read(0, 5 * 4096).await.unwrap()[..] == home[..]);
    }
}
