//! Versions of one brick's share: the cut by tag, stragglers, deletion, roll-back, fill-in of
//! partly written units, the format-1 upgrade, and damage refused.

use std::sync::Arc;

use bytes::Bytes;
use strata_brick::{BrickStore, IntervalRecord, RecordState, StagedExtent, Vote};
use strata_cluster::interval::{Decision, IntervalId};
use strata_core::{DeviceRef, WriteFlags};
use strata_crash::CrashGroup;
use strata_meta::{MetaStore, StoreOptions, TxnClass};

use crate::common::*;

const UNIT: usize = 4096;

async fn commit(store: &BrickStore, id: IntervalId, tag: u64, writes: Vec<(u64, Bytes)>) {
    prepare(store, id, tag, writes).await;
    assert!(store.decide(id, Decision::Commit).await.unwrap());
}

async fn prepare(store: &BrickStore, id: IntervalId, tag: u64, writes: Vec<(u64, Bytes)>) {
    let vote = store.prepare_tagged(id, vec![0], writes, &[], tag).await;
    assert_eq!(vote.unwrap(), Vote::Yes, "{id:?}");
}

async fn numbers(store: &BrickStore) -> Vec<u64> {
    let versions = store.versions().await.unwrap();
    versions.iter().map(|v| v.number).collect()
}

/// Free space and what versions keep add up to the staging region: nothing is lost.
async fn assert_no_space_lost(store: &BrickStore) {
    let held: u64 = (store.versions().await.unwrap())
        .iter()
        .map(|v| v.held_bytes)
        .sum();
    assert_eq!(
        store.staging_free().await + held,
        store.layout().staging_bytes,
        "free {} + kept by versions {held}",
        store.staging_free().await
    );
}

#[tokio::test]
async fn a_version_holds_what_was_tagged_before_its_cut_and_stragglers_land_inside_it() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let (a, b, c) = (id(1, 1), id(2, 1), id(1, 2));
    commit(&store, a, 0, vec![(0, data(a, 0, UNIT))]).await;
    // Version 1 announced: C was prepared before its host saw it (tag 0), B after (tag 1).
    // B commits first, which creates version 1 here; C still belongs before the cut.
    prepare(&store, c, 0, vec![(8192, data(c, 0, UNIT))]).await;
    commit(&store, b, 1, vec![(0, data(b, 0, UNIT))]).await;
    assert_eq!(numbers(&store).await, vec![1]);
    assert!(store.decide(c, Decision::Commit).await.unwrap());
    // Nothing below the cut is undecided any more: the version is sealed, final.
    store.seal_version(1).await.unwrap();
    assert_eq!(store.read(0, UNIT).await.unwrap(), data(b, 0, UNIT));
    assert_eq!(
        store.read_version(1, 0, UNIT).await.unwrap(),
        data(a, 0, UNIT)
    );
    assert_eq!(
        store.read_version(1, 8192, UNIT).await.unwrap(),
        data(c, 0, UNIT)
    );
    assert_eq!(store.read(8192, UNIT).await.unwrap(), data(c, 0, UNIT));
    let versions = store.versions().await.unwrap();
    assert_eq!(
        versions[0].held_bytes, UNIT as u64,
        "A's unit, kept for version 1"
    );
    assert_no_space_lost(&store).await;
    // The version survives a reopen.
    drop(store);
    let device: DeviceRef = Arc::new(open_disks_again(&group));
    let (store, _) = BrickStore::open(device).await.unwrap();
    assert_eq!(
        store.read_version(1, 0, UNIT).await.unwrap(),
        data(a, 0, UNIT)
    );
    assert_eq!(store.read(0, UNIT).await.unwrap(), data(b, 0, UNIT));
    assert!(
        store.read_version(2, 0, UNIT).await.is_err(),
        "no version 2"
    );
}

fn open_disks_again(group: &CrashGroup) -> strata_crash::CrashDisk {
    let images = group.crash(&mut strata_crash::rand::SeedableRng::seed_from_u64(1));
    let group = CrashGroup::new();
    strata_crash::open_disks(&group, &[geometry()], Some(images)).remove(0)
}

#[tokio::test]
async fn a_commit_tagged_past_the_newest_version_creates_the_versions_up_to_it() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let a = id(1, 1);
    commit(&store, a, 0, vec![(0, data(a, 0, UNIT))]).await;
    let b = id(1, 2);
    commit(&store, b, 2, vec![(0, data(b, 0, UNIT))]).await;
    assert_eq!(numbers(&store).await, vec![1, 2]);
    // Both cuts fall before B: both read A.
    for version in [1, 2] {
        assert_eq!(
            store.read_version(version, 0, UNIT).await.unwrap(),
            data(a, 0, UNIT)
        );
    }
    // A deleted number is not created again by a later commit tagged with it.
    assert!(store.delete_version(2).await.unwrap());
    let c = id(1, 4);
    commit(&store, c, 2, vec![(0, data(c, 0, UNIT))]).await;
    assert_eq!(numbers(&store).await, vec![1]);
    // A tag absurdly far ahead is refused, not answered with millions of tables.
    let far = store
        .prepare_tagged(id(1, 3), vec![0], vec![(0, data(a, 0, 512))], &[], 1 << 40)
        .await
        .unwrap();
    assert!(matches!(far, Vote::No(why) if why.contains("ahead")));
}

#[tokio::test]
async fn deleting_a_version_keeps_the_older_ones_whole_and_frees_the_rest() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let ids: Vec<IntervalId> = (1..=4).map(|seq| id(1, seq)).collect();
    // Unit 0 changes at every step; unit 1 only before version 2.
    commit(&store, ids[0], 0, vec![(0, data(ids[0], 0, 2 * UNIT))]).await;
    store.seal_version(1).await.unwrap();
    commit(&store, ids[1], 1, vec![(0, data(ids[1], 0, 2 * UNIT))]).await;
    store.seal_version(2).await.unwrap();
    commit(&store, ids[2], 2, vec![(0, data(ids[2], 0, UNIT))]).await;
    store.seal_version(3).await.unwrap();
    commit(&store, ids[3], 3, vec![(0, data(ids[3], 0, UNIT))]).await;
    let v1 = store.read_version(1, 0, 2 * UNIT).await.unwrap();
    let v3 = store.read_version(3, 0, 2 * UNIT).await.unwrap();
    assert_eq!(v1, data(ids[0], 0, 2 * UNIT));
    assert!(store.delete_version(2).await.unwrap());
    assert!(!store.delete_version(2).await.unwrap(), "already gone");
    assert_eq!(numbers(&store).await, vec![1, 3]);
    assert_eq!(store.read_version(1, 0, 2 * UNIT).await.unwrap(), v1);
    assert_eq!(store.read_version(3, 0, 2 * UNIT).await.unwrap(), v3);
    assert_no_space_lost(&store).await;
    let before = store.staging_free().await;
    assert!(store.delete_version(1).await.unwrap());
    assert!(store.delete_version(3).await.unwrap());
    assert!(store.staging_free().await > before);
    assert_eq!(store.staging_free().await, store.layout().staging_bytes);
    // A prepare tagged below the sealed version 3 is refused.
    let late = id(1, 9);
    let vote = store
        .prepare_tagged(late, vec![0], vec![(0, data(late, 0, UNIT))], &[], 2)
        .await
        .unwrap();
    assert!(matches!(vote, Vote::No(why) if why.contains("sealed")));
    assert!(numbers(&store).await.is_empty());
}

#[tokio::test]
async fn a_roll_back_restores_the_cut_and_deletes_newer_versions() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let (a, b, c) = (id(1, 1), id(1, 2), id(1, 3));
    commit(&store, a, 0, vec![(0, data(a, 0, 3 * UNIT))]).await;
    store.seal_version(1).await.unwrap();
    commit(&store, b, 1, vec![(UNIT as u64, data(b, 0, 2 * UNIT))]).await;
    store.seal_version(2).await.unwrap();
    commit(&store, c, 2, vec![(0, data(c, 0, 2 * UNIT))]).await;
    // Refused while an interval is in doubt here.
    let pending = id(2, 1);
    prepare(&store, pending, 2, vec![(65536, data(pending, 0, 512))]).await;
    let refused = store.rollback(1, 3).await.unwrap_err().to_string();
    assert!(refused.contains("in doubt"), "{refused}");
    assert!(store.decide(pending, Decision::Abort).await.unwrap());
    store.rollback(1, 3).await.unwrap();
    assert_eq!(store.read(0, 3 * UNIT).await.unwrap(), data(a, 0, 3 * UNIT));
    assert_eq!(numbers(&store).await, vec![1]);
    assert_eq!(
        store.read_version(1, 0, 3 * UNIT).await.unwrap(),
        data(a, 0, 3 * UNIT)
    );
    assert_no_space_lost(&store).await;
    // Writing goes on after it, tagged with the counter (3), and version 1 stays what it
    // was; the spent numbers 2 and 3 are not created again.
    let d = id(1, 4);
    commit(&store, d, 3, vec![(0, data(d, 0, UNIT))]).await;
    assert_eq!(numbers(&store).await, vec![1]);
    assert_eq!(store.read(0, UNIT).await.unwrap(), data(d, 0, UNIT));
    assert_eq!(
        store.read_version(1, 0, 3 * UNIT).await.unwrap(),
        data(a, 0, 3 * UNIT)
    );
    assert!(store.rollback(7, 7).await.is_err(), "no version 7");
}

#[tokio::test]
async fn a_unit_written_in_part_is_filled_in_from_the_current_data() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let (a, b) = (id(1, 1), id(1, 2));
    commit(&store, a, 0, vec![(0, data(a, 0, 2 * UNIT))]).await;
    store.seal_version(1).await.unwrap();
    // One interval: a sector in unit 0, then a write across units 0 and 1 that overlaps it
    // in part, then the first sector again.
    let writes = vec![
        (512, data(b, 0, 512)),
        (3072, data(b, 1, 2048)),
        (512, data(b, 2, 512)),
    ];
    commit(&store, b, 1, writes.clone()).await;
    let mut expected = data(a, 0, 2 * UNIT).to_vec();
    for (offset, bytes) in &writes {
        expected[*offset as usize..*offset as usize + bytes.len()].copy_from_slice(bytes);
    }
    assert_eq!(&store.read(0, 2 * UNIT).await.unwrap()[..], &expected[..]);
    assert_eq!(
        store.read_version(1, 0, 2 * UNIT).await.unwrap(),
        data(a, 0, 2 * UNIT)
    );
    assert_no_space_lost(&store).await;
}

#[tokio::test]
async fn direct_writes_are_refused_while_the_brick_keeps_versions() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let a = id(1, 1);
    store
        .write_direct(vec![(0, data(a, 0, UNIT))])
        .await
        .unwrap();
    assert_eq!(store.read(0, UNIT).await.unwrap(), data(a, 0, UNIT));
    store.seal_version(1).await.unwrap();
    let refused = store.write_direct(vec![(0, data(a, 1, UNIT))]).await;
    assert!(refused.unwrap_err().to_string().contains("versions"));
    assert_eq!(
        store.read_version(1, 0, UNIT).await.unwrap(),
        data(a, 0, UNIT)
    );
}

#[tokio::test]
async fn when_versions_keep_the_space_a_prepare_is_refused_saying_so() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let staging = store.layout().staging_bytes as usize;
    // Each round overwrites the whole share after a new version: the versions keep it all.
    let mut seq = 0;
    let refusal = loop {
        seq += 1;
        store.seal_version(seq).await.unwrap();
        let iv = id(1, seq);
        let vote = store
            .prepare_tagged(iv, vec![0], vec![(0, data(iv, 0, HOME as usize))], &[], seq)
            .await
            .unwrap();
        match vote {
            Vote::Yes => assert!(store.decide(iv, Decision::Commit).await.unwrap()),
            Vote::No(why) => break why,
        }
        assert!(seq as usize <= staging / HOME as usize + 1, "never ran out");
    };
    assert!(
        refusal.contains("no staging space") && refusal.contains("versions keep"),
        "{refusal}"
    );
    // Deleting the oldest frees room again.
    assert!(store.delete_version(1).await.unwrap());
    let iv = id(1, seq);
    let vote = store
        .prepare_tagged(iv, vec![0], vec![(0, data(iv, 0, HOME as usize))], &[], seq)
        .await
        .unwrap();
    assert_eq!(vote, Vote::Yes);
}

/// Rewrites a fresh brick's metadata as format 1 left it: layout version 1, no map, no
/// versions blob, and the given records; data placed at the given device offsets.
async fn as_format_one(
    device: &DeviceRef,
    records: Vec<(IntervalId, IntervalRecord)>,
    staged: Vec<(u64, Bytes)>,
) {
    for (offset, bytes) in staged {
        device
            .write(offset, bytes, WriteFlags::default())
            .await
            .unwrap();
    }
    let recovered = strata_meta::recover(device.as_ref(), 0).await.unwrap();
    let (meta, _) = MetaStore::open_recovered(
        device.clone(),
        recovered,
        StoreOptions::new("forging format 1"),
    )
    .await
    .unwrap();
    meta.transact(TxnClass::Normal, |state, txn| {
        let layout = state.id("layout").unwrap();
        let mut bytes = state.blob(layout).unwrap().to_vec();
        bytes[0] = 1;
        txn.put_blob(layout, bytes);
        txn.delete(state.id("map").unwrap());
        txn.delete(state.id("versions").unwrap());
        for (id, record) in &records {
            // Format 1's encoding: version 1, no tag.
            let mut encoded = record.encode();
            encoded[0] = 1;
            encoded.drain(2..10);
            let blob = txn.create_blob(&format!("iv.{:016x}.{:016x}", id.client, id.seq));
            txn.put_blob(blob, encoded);
        }
        Ok(())
    })
    .unwrap();
    meta.commit().await.unwrap();
}

#[tokio::test]
async fn a_format_one_brick_is_upgraded_and_its_committed_intervals_redone() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let layout = store.layout();
    drop(store);
    let a = id(1, 1);
    // Committed in format 1, its copy home not done: packed at an odd place in staging.
    let record = IntervalRecord {
        state: RecordState::Committed,
        tag: 0,
        bricks: vec![0],
        extents: vec![StagedExtent {
            home: layout.home_offset + 1024,
            staging: layout.staging_offset + 512,
            len: 1024,
            crc: None,
        }],
    };
    as_format_one(
        &device,
        vec![(a, record)],
        vec![(layout.staging_offset + 512, data(a, 0, 1024))],
    )
    .await;
    let (store, report) = BrickStore::open(device.clone()).await.unwrap();
    assert!(report.upgraded);
    assert_eq!(report.redone, 1);
    assert_eq!(store.read(1024, 1024).await.unwrap(), data(a, 0, 1024));
    assert_no_space_lost(&store).await;
    // And it is format 3 now: versions work.
    store.seal_version(1).await.unwrap();
    let b = id(1, 2);
    commit(&store, b, 1, vec![(0, data(b, 0, UNIT))]).await;
    assert_eq!(
        &store.read_version(1, 1024, 1024).await.unwrap()[..],
        &data(a, 0, 1024)[..]
    );
    drop(store);
    let (_, report) = BrickStore::open(device).await.unwrap();
    assert!(!report.upgraded, "upgraded once");
}

#[tokio::test]
async fn a_format_one_brick_with_intervals_in_doubt_is_refused_not_guessed() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let layout = store.layout();
    drop(store);
    let record = IntervalRecord {
        state: RecordState::Prepared,
        tag: 0,
        bricks: vec![0, 1],
        extents: vec![StagedExtent {
            home: layout.home_offset,
            staging: layout.staging_offset + 512,
            len: 512,
            crc: None,
        }],
    };
    as_format_one(&device, vec![(id(1, 1), record)], Vec::new()).await;
    let refused = BrickStore::open(device).await.err().unwrap().to_string();
    assert!(
        refused.contains("format-1 brick with 1 intervals in doubt"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_unit_the_map_and_a_version_both_claim_refuses_the_brick() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let a = id(1, 1);
    commit(&store, a, 0, vec![(0, data(a, 0, UNIT))]).await;
    store.seal_version(1).await.unwrap();
    commit(&store, id(1, 2), 1, vec![(0, data(a, 1, UNIT))]).await;
    drop(store);
    // Point unit 1 of the map at the unit version 1 keeps for unit 0.
    let recovered = strata_meta::recover(device.as_ref(), 0).await.unwrap();
    let (meta, _) =
        MetaStore::open_recovered(device.clone(), recovered, StoreOptions::new("damaging"))
            .await
            .unwrap();
    meta.transact(TxnClass::Normal, |state, txn| {
        let version = state.id("version.0000000000000001").unwrap();
        let kept = state.table(version).unwrap().get(0).unwrap().to_vec();
        txn.set(state.id("map").unwrap(), 1, &kept);
        Ok(())
    })
    .unwrap();
    meta.commit().await.unwrap();
    let refused = BrickStore::open(device).await.err().unwrap().to_string();
    assert!(refused.contains("another owner"), "{refused}");
}

#[tokio::test]
async fn a_sealed_version_is_final_stragglers_after_it_are_refused() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let (a, late) = (id(1, 1), id(2, 1));
    // Sealing waits for what is undecided below the cut: it could still change the version.
    prepare(&store, a, 0, vec![(0, data(a, 0, UNIT))]).await;
    let refused = store.seal_version(1).await.unwrap_err().to_string();
    assert!(refused.contains("undecided"), "{refused}");
    assert!(store.decide(a, Decision::Commit).await.unwrap());
    store.seal_version(1).await.unwrap();
    store.seal_version(1).await.unwrap();
    // A host whose lease ran out before the version was taken still tags 0: refused.
    let vote = store
        .prepare_tagged(late, vec![0], vec![(0, data(late, 0, UNIT))], &[], 0)
        .await
        .unwrap();
    assert!(
        matches!(&vote, Vote::No(why) if why.contains("sealed")),
        "{vote:?}"
    );
    assert_eq!(
        store.read_version(1, 0, UNIT).await.unwrap(),
        data(a, 0, UNIT)
    );
    // Tagged with the version or later: taken.
    commit(&store, id(2, 2), 1, vec![(0, data(late, 1, UNIT))]).await;
    assert_eq!(
        store.read_version(1, 0, UNIT).await.unwrap(),
        data(a, 0, UNIT)
    );
    let listed = store.try_in_doubt_tagged().await.unwrap();
    assert!(listed.is_empty());
}

/// Opens the brick's metadata store by itself, to read or forge what a brick left.
async fn meta_of(device: &DeviceRef) -> Arc<MetaStore> {
    let recovered = strata_meta::recover(device.as_ref(), 0).await.unwrap();
    let (meta, _) =
        MetaStore::open_recovered(device.clone(), recovered, StoreOptions::new("inspecting"))
            .await
            .unwrap();
    meta
}

fn record_of(meta: &MetaStore, id: IntervalId) -> (strata_meta::ObjectId, IntervalRecord) {
    meta.read(|state| {
        let blob = state.id(&strata_brick::blob_name(id)).unwrap();
        let record = IntervalRecord::decode(state.blob(blob).unwrap()).unwrap();
        (blob, record)
    })
}

/// A prepare's record and its data share one sync, so a power cut can keep the record
/// without the data. The open finds it by its checksums and aborts the interval: never served
/// as prepared, a late duplicate of the prepare refused, its units free. Another interval in
/// doubt, whole, stays in doubt.
#[tokio::test]
async fn a_prepare_whose_data_did_not_land_is_aborted_at_the_open() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let (torn, whole) = (id(1, 1), id(2, 1));
    prepare(&store, torn, 0, vec![(0, data(torn, 0, 2 * UNIT))]).await;
    prepare(
        &store,
        whole,
        0,
        vec![(4 * UNIT as u64, data(whole, 0, UNIT))],
    )
    .await;
    drop(store);
    let (_, record) = record_of(&*meta_of(&device).await, torn);
    assert!(record.extents.iter().all(|e| e.crc.is_some()), "{record:?}");
    // The second unit of its data never reached the medium: what was there before stays.
    let second = record.extents.last().unwrap();
    let at = second.staging + u64::from(second.len) - 512;
    device
        .write(at, Bytes::from(vec![0u8; 512]), WriteFlags::default())
        .await
        .unwrap();
    let (store, report) = BrickStore::open(device.clone()).await.unwrap();
    assert_eq!((report.unlanded, report.in_doubt), (1, 1), "{report:?}");
    assert_eq!(
        store.status(torn).await,
        Some(strata_cluster::interval::Status::Decided(Decision::Abort))
    );
    let again = store
        .prepare(torn, vec![0], vec![(0, data(torn, 0, 2 * UNIT))], &[])
        .await
        .unwrap();
    assert!(
        matches!(&again, Vote::No(why) if why.contains("already decided")),
        "{again:?}"
    );
    assert_eq!(store.read(0, 2 * UNIT).await.unwrap(), vec![0u8; 2 * UNIT]);
    assert!(store.decide(whole, Decision::Commit).await.unwrap());
    assert_eq!(
        store.read(4 * UNIT as u64, UNIT).await.unwrap(),
        data(whole, 0, UNIT)
    );
    assert_no_space_lost(&store).await;
    // The abort is durable: the next open finds nothing to do.
    drop(store);
    let (_, report) = BrickStore::open(device).await.unwrap();
    assert_eq!((report.unlanded, report.in_doubt), (0, 0), "{report:?}");
}

/// Format 2 made a prepare's data durable before its record, which carries no checksums. Such
/// a brick is upgraded to format 3 at its next open, and its intervals in doubt are kept as
/// they are and can be committed.
#[tokio::test]
async fn a_format_two_brick_is_upgraded_and_its_prepares_kept_without_checksums() {
    let group = CrashGroup::new();
    let (device, store) = fresh(&group).await;
    let a = id(1, 1);
    prepare(&store, a, 0, vec![(UNIT as u64, data(a, 0, UNIT))]).await;
    drop(store);
    let meta = meta_of(&device).await;
    let (blob, mut record) = record_of(&meta, a);
    for extent in &mut record.extents {
        extent.crc = None;
    }
    meta.transact(TxnClass::Normal, |state, txn| {
        let layout = state.id("layout").unwrap();
        let mut bytes = state.blob(layout).unwrap().to_vec();
        bytes[0] = 2;
        txn.put_blob(layout, bytes);
        let encoded = record.encode();
        assert_eq!(encoded[0], 2);
        txn.put_blob(blob, encoded);
        Ok(())
    })
    .unwrap();
    meta.commit().await.unwrap();
    drop(meta);
    let (store, report) = BrickStore::open(device.clone()).await.unwrap();
    assert!(report.upgraded);
    assert_eq!((report.in_doubt, report.unlanded), (1, 0), "{report:?}");
    assert_eq!(store.summary().format, 3);
    assert!(store.decide(a, Decision::Commit).await.unwrap());
    assert_eq!(
        store.read(UNIT as u64, UNIT).await.unwrap(),
        data(a, 0, UNIT)
    );
    drop(store);
    let (_, report) = BrickStore::open(device).await.unwrap();
    assert!(!report.upgraded, "upgraded once");
}
