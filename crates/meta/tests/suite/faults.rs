//! Damage and faults: the store reports them as errors, never as wrong state.

use std::sync::Arc;

use strata_core::{BlockError, DeviceRef};
use strata_crash::rand::SeedableRng;
use strata_crash::testkit::assert_refused;
use strata_crash::{sector_disk, CrashDisk, CrashGroup, CrashPolicy, CrashRng, DiskImage};
use strata_meta::{FormatOptions, Layout, MetaStore, ObjectId, StoreOptions, TxnClass};

const REGION: u64 = 64 * 4096;
const DISK: u64 = 80 * 4096;

struct Fixture {
    group: CrashGroup,
    disk: CrashDisk,
    store: Arc<MetaStore>,
    map: ObjectId,
}

async fn new_fixture() -> Fixture {
    let group = CrashGroup::new();
    let disk = group.disk(sector_disk(DISK));
    let (store, map) = format_with_map(Arc::new(disk.clone())).await;
    Fixture {
        group,
        disk,
        store,
        map,
    }
}

/// A store formatted on `device` with one committed table, "map".
async fn format_with_map(device: DeviceRef) -> (Arc<MetaStore>, ObjectId) {
    let mut format = FormatOptions::new("faults");
    format.first_generation = Some(500);
    let store = MetaStore::format(device, 0, REGION, format, StoreOptions::new("f"))
        .await
        .unwrap();
    let map = store
        .transact(TxnClass::Normal, |_, txn| Ok(txn.create_table("map", 8)))
        .unwrap();
    store.commit().await.unwrap();
    (store, map)
}

fn put(store: &MetaStore, map: ObjectId, index: u64) -> strata_core::Result<()> {
    store.transact(TxnClass::Normal, |_, txn| {
        txn.set(map, index, &(index + 1).to_le_bytes());
        Ok(())
    })
}

/// Commits `batches` batches of one transaction each and returns the durable image.
/// What the fixture's disk keeps when the power fails now, its cache dropped (the crash's
/// random choices seeded with `seed`).
fn image_after_power_cut(fixture: &Fixture, seed: u64) -> DiskImage {
    let mut rng = CrashRng::seed_from_u64(seed);
    fixture
        .group
        .crash_with(CrashPolicy::DropAll, &mut rng)
        .remove(0)
}

async fn with_batches(batches: u64) -> (Fixture, DiskImage) {
    let fixture = new_fixture().await;
    for i in 0..batches {
        put(&fixture.store, fixture.map, i).unwrap();
        fixture.store.commit().await.unwrap();
    }
    let image = image_after_power_cut(&fixture, 1);
    (fixture, image)
}

async fn open(image: DiskImage) -> strata_core::Result<Arc<MetaStore>> {
    let device: DeviceRef = Arc::new(CrashGroup::new().disk_from(image));
    MetaStore::open(device, 0, StoreOptions::new("f"))
        .await
        .map(|(store, _)| store)
}

fn layout() -> Layout {
    Layout::new(0, REGION, 0.25).unwrap()
}

/// Byte offset of `block` in journal copy `copy` (0 or 1) of a format version 2 store.
fn journal_block(copy: u64, block: u64) -> u64 {
    layout().journal_offset(copy * (layout().journal_blocks / 2) + block)
}

#[tokio::test]
async fn a_damaged_last_batch_is_a_torn_tail_but_a_damaged_middle_batch_is_an_error() {
    let (_, image) = with_batches(4).await;
    // Batch 0 (the fixture's create) and batches 1..=4 occupy journal blocks 0..=4 of each
    // copy. A torn tail is a commit interrupted before either copy was whole: damage both.
    let mut rng = CrashRng::seed_from_u64(2);
    let mut torn_tail = image.clone();
    for copy in 0..2 {
        torn_tail.corrupt(journal_block(copy, 4) + 100, 8, &mut rng);
    }
    let store = open(torn_tail)
        .await
        .expect("a torn tail is a normal crash");
    let len = store.read(|s| s.table(s.id("map").unwrap()).unwrap().len());
    assert_eq!(len, 3, "the three batches before the torn one are kept");

    let mut damaged = image.clone();
    for copy in 0..2 {
        damaged.corrupt(journal_block(copy, 1) + 100, 8, &mut rng);
    }
    assert_refused(
        open(damaged).await,
        "damage before later batches must not be ignored",
        &["corrupted on the medium"],
    );
}

#[tokio::test]
async fn a_damaged_checkpoint_is_an_error() {
    let (_, image) = with_batches(1).await;
    let recovered = {
        let device: DeviceRef = Arc::new(CrashGroup::new().disk_from(image.clone()));
        strata_meta::recover(device.as_ref(), 0).await.unwrap()
    };
    let slot = layout().slot_offset(recovered.superblock.active_slot);
    let mut damaged = image;
    damaged.write(slot + 50, &[0xff; 4]);
    assert_refused(
        open(damaged).await,
        "a damaged checkpoint must be reported",
        &["checkpoint"],
    );
}

/// The generation of the superblock copy the store on `disk` holds current.
async fn superblock_generation(disk: &CrashDisk) -> u64 {
    strata_meta::read_superblock(disk, 0)
        .await
        .unwrap()
        .0
        .generation
}

#[tokio::test]
async fn one_damaged_superblock_copy_is_survivable_unless_it_hides_newer_metadata() {
    // A checkpoint whose superblock write is torn by a crash (no batches of its epoch yet):
    // the older copy is a safe fallback. The power fails during that write (the checkpoint's
    // ops: flush, slot write, flush, superblock write), which lands and is then torn.
    let fixture = new_fixture().await;
    put(&fixture.store, fixture.map, 1).unwrap();
    let generation = strata_meta::read_superblock(&fixture.disk, 0)
        .await
        .unwrap()
        .0
        .generation
        + 1;
    fixture.group.arm_crash_at(fixture.group.mutating_ops() + 3);
    assert!(fixture.store.checkpoint_now().await.is_err());
    let mut rng = CrashRng::seed_from_u64(3);
    let image = fixture
        .group
        .crash_with(CrashPolicy::KeepAll, &mut rng)
        .remove(0);
    let landed = strata_meta::read_superblock(&CrashGroup::new().disk_from(image.clone()), 0)
        .await
        .unwrap()
        .0;
    assert_eq!(
        landed.generation, generation,
        "the crash hit the superblock write"
    );
    let mut torn = image.clone();
    torn.write((generation % 2) * 4096 + 64, &[0xee; 16]);
    let store = open(torn)
        .await
        .expect("the older copy is current after a torn write");
    // Indistinguishable from a crash during that superblock write, when the checkpoint (and
    // the transaction only it held) was not yet durable: the older state is a correct answer.
    let len = store.read(|s| s.table(s.id("map").unwrap()).unwrap().len());
    assert_eq!(len, 0);

    // A checkpoint that completed with a transaction only it holds is followed by an empty
    // batch of its epoch: damage to its superblock afterwards is refused, not rolled back.
    let fixture = new_fixture().await;
    put(&fixture.store, fixture.map, 1).unwrap();
    fixture.store.checkpoint_now().await.unwrap();
    let generation = superblock_generation(&fixture.disk).await;
    let mut damaged = fixture
        .group
        .crash_with(CrashPolicy::DropAll, &mut rng)
        .remove(0);
    damaged.write((generation % 2) * 4096 + 64, &[0xee; 16]);
    assert_refused(
        open(damaged).await,
        "must not roll back a completed checkpoint silently",
        &["would lose committed metadata"],
    );

    // Once batches of the newer epoch exist, falling back would lose them: refuse.
    let fixture = new_fixture().await;
    put(&fixture.store, fixture.map, 1).unwrap();
    fixture.store.commit().await.unwrap();
    let generation = superblock_generation(&fixture.disk).await;
    let image = fixture
        .group
        .crash_with(CrashPolicy::DropAll, &mut rng)
        .remove(0);
    let mut damaged = image;
    damaged.write((generation % 2) * 4096 + 64, &[0xee; 16]);
    assert_refused(
        open(damaged).await,
        "must not roll back silently",
        &["would lose committed metadata"],
    );
}

#[tokio::test]
async fn read_errors_fail_recovery_instead_of_inventing_state() {
    let (_, image) = with_batches(3).await;
    let disk = CrashGroup::new().disk_from(image.clone());
    disk.latent_sector_error(layout().journal_offset(1), 512);
    let device: DeviceRef = Arc::new(disk);
    let error = MetaStore::open(device, 0, StoreOptions::new("f"))
        .await
        .err()
        .unwrap();
    assert!(matches!(error, BlockError::Io { .. }), "{error:?}");

    let disk = CrashGroup::new().disk_from(image);
    disk.fail_reads(0, 8192);
    let device: DeviceRef = Arc::new(disk);
    assert!(MetaStore::open(device, 0, StoreOptions::new("f"))
        .await
        .is_err());
}

#[tokio::test]
async fn a_failed_commit_fails_the_store_and_reopen_recovers_what_was_committed() {
    let fixture = new_fixture().await;
    put(&fixture.store, fixture.map, 1).unwrap();
    fixture.store.commit().await.unwrap();
    fixture
        .disk
        .fail_writes(layout().journal_offset(0), layout().journal_blocks * 4096);
    put(&fixture.store, fixture.map, 2).unwrap();
    let error = fixture.store.commit().await.unwrap_err();
    assert!(matches!(error, BlockError::Io { .. }), "{error:?}");
    assert!(fixture.store.space().failed.is_some());
    let refused = put(&fixture.store, fixture.map, 3).unwrap_err();
    assert!(refused.to_string().contains("failed earlier"), "{refused}");
    fixture.disk.clear_faults();
    let mut rng = CrashRng::seed_from_u64(4);
    let image = fixture
        .group
        .crash_with(CrashPolicy::Random, &mut rng)
        .remove(0);
    let store = open(image).await.unwrap();
    store.read(|s| {
        let map = s.table(s.id("map").unwrap()).unwrap();
        assert_eq!(map.get(1), Some(&2u64.to_le_bytes()[..]));
        assert_eq!(map.get(3), None, "a refused transaction came back");
    });
}

#[tokio::test]
async fn a_disk_that_disappears_fails_commits_not_reads_of_memory() {
    let fixture = new_fixture().await;
    put(&fixture.store, fixture.map, 1).unwrap();
    fixture.disk.disappear();
    assert!(fixture.store.commit().await.is_err());
    assert!(put(&fixture.store, fixture.map, 2).is_err());
}

/// Issue 12, case 3: the last batch was acknowledged by a completed commit, then its blocks
/// were damaged on the medium. Version 1 could not tell this from a torn, never-acknowledged
/// tail and dropped the batch silently; the twin copy must bring it back, and say so.
#[tokio::test]
async fn an_acknowledged_last_batch_damaged_after_the_fact_is_not_lost() {
    let (_, image) = with_batches(4).await;
    // Batch 0 (the fixture's create) and batches 1..=4 occupy journal blocks 0..=4 of the
    // first copy; damage every one of batch 4's blocks there.
    let mut rng = CrashRng::seed_from_u64(12);
    let mut damaged = image.clone();
    damaged.corrupt(layout().journal_offset(4), 4096, &mut rng);
    let device: DeviceRef = Arc::new(CrashGroup::new().disk_from(damaged.clone()));
    let recovered = strata_meta::recover(device.as_ref(), 0).await.unwrap();
    assert_eq!(recovered.batches_replayed, 5);
    assert_eq!(recovered.journal_copy_faults.len(), 1, "{recovered:?}");
    let finding = &recovered.journal_copy_faults[0];
    assert!(
        finding.starts_with("journal batch 4 (epoch ")
            && finding.contains("copy 1 failed its check")
            && finding.ends_with("replayed from the other copy"),
        "{finding}"
    );
    let store = open(damaged).await.expect("the batch has another copy");
    let len = store.read(|s| s.table(s.id("map").unwrap()).unwrap().len());
    assert_eq!(len, 4, "the acknowledged last batch was dropped");
}

/// Damage to copy 2 of a middle batch is recovered from copy 1 the same way.
#[tokio::test]
async fn a_damaged_second_copy_is_replayed_from_the_first() {
    let (_, image) = with_batches(4).await;
    let mut rng = CrashRng::seed_from_u64(13);
    let mut damaged = image.clone();
    damaged.corrupt(journal_block(1, 2) + 40, 64, &mut rng);
    let device: DeviceRef = Arc::new(CrashGroup::new().disk_from(damaged.clone()));
    let recovered = strata_meta::recover(device.as_ref(), 0).await.unwrap();
    assert_eq!(recovered.batches_replayed, 5);
    assert_eq!(recovered.journal_copy_faults.len(), 1);
    assert!(recovered.journal_copy_faults[0].contains("batch 2 (epoch"));
    assert!(recovered.journal_copy_faults[0].contains("copy 2 failed"));
}

/// Two valid copies of one batch that differ cannot come from one commit: refuse.
#[tokio::test]
async fn two_valid_copies_that_differ_are_refused() {
    let (_, image) = with_batches(2).await;
    // A second store made the same way (same first generation, so the same epoch and batch
    // numbers) whose batch 2 holds another transaction: its copy 2 is a valid block in every
    // respect but content.
    let fixture = new_fixture().await;
    put(&fixture.store, fixture.map, 0).unwrap();
    fixture.store.commit().await.unwrap();
    put(&fixture.store, fixture.map, 77).unwrap();
    fixture.store.commit().await.unwrap();
    let other = image_after_power_cut(&fixture, 14);
    let mut mixed = image.clone();
    mixed.write(journal_block(1, 2), &other.read(journal_block(1, 2), 4096));
    assert_ne!(mixed, image, "the two stores' batch 2 must differ");
    assert_refused(
        open(mixed).await,
        "differing copies",
        &["both valid but differ"],
    );
}

/// Turns a version 2 image into the version 1 image of the same store: both superblocks
/// say version 1, and the journal's second half (copy 2, which version 1 never wrote) is
/// zeros. Version 1 laid out the region exactly as version 2 does, with one journal copy.
/// (The image's checkpoint holds no table page, which is encoded alike in every version; a
/// version 3 image is therefore also this store's version 2 image.)
fn as_version_1(image: &DiskImage) -> DiskImage {
    let mut v1 = image.clone();
    for copy in 0..2u64 {
        let block = image.read(copy * 4096, 4096);
        if let Ok(mut superblock) = strata_meta::Superblock::decode(&block, 0) {
            superblock.format_version = 1;
            v1.write(copy * 4096, &superblock.encode());
        }
    }
    let half = layout().journal_blocks / 2;
    v1.zero(journal_block(1, 0), half * 4096);
    v1
}

#[tokio::test]
async fn a_version_1_store_opens_under_its_rules_and_is_upgraded_by_its_first_checkpoint() {
    let (_, image) = with_batches(4).await;
    let v1 = as_version_1(&image);
    let disk = CrashGroup::new().disk_from(v1.clone());
    let recovered = strata_meta::recover(&disk, 0).await.unwrap();
    assert_eq!(recovered.superblock.format_version, 1);
    assert_eq!(
        recovered.batches_replayed, 5,
        "one copy is all version 1 has"
    );
    assert!(recovered.journal_copy_faults.is_empty());
    let device: DeviceRef = Arc::new(disk.clone());
    let (store, _) = MetaStore::open(device, 0, StoreOptions::new("f"))
        .await
        .unwrap();
    let (superblock, _) = strata_meta::read_superblock(&disk, 0).await.unwrap();
    assert_eq!(superblock.format_version, strata_meta::FORMAT_VERSION);
    put(&store, strata_meta_map(&store), 100).unwrap();
    store.commit().await.unwrap();
    drop(store);
    let mut rng = CrashRng::seed_from_u64(15);
    let upgraded = disk
        .group()
        .crash_with(CrashPolicy::DropAll, &mut rng)
        .remove(0);
    let store = open(upgraded).await.unwrap();
    let len = store.read(|s| s.table(s.id("map").unwrap()).unwrap().len());
    assert_eq!(len, 5, "the upgraded store lost transactions");

    // Version 1's rules still apply to a version 1 journal: a damaged last batch is taken
    // as torn (the limit version 2 removes), a damaged middle batch is refused.
    let mut torn = v1.clone();
    torn.corrupt(layout().journal_offset(4) + 100, 8, &mut rng);
    let store = open(torn).await.unwrap();
    let len = store.read(|s| s.table(s.id("map").unwrap()).unwrap().len());
    assert_eq!(len, 3);
    let mut damaged = v1;
    damaged.corrupt(layout().journal_offset(1) + 100, 8, &mut rng);
    assert_refused(
        open(damaged).await,
        "damaged middle batch",
        &["corrupted on the medium"],
    );
}

fn strata_meta_map(store: &MetaStore) -> ObjectId {
    store.read(|s| s.id("map").unwrap())
}

/// A disk that answers writes with "no space" once told to (a thin volume under the store
/// whose pool filled up).
struct FillsUp {
    disk: DeviceRef,
    full: std::sync::atomic::AtomicBool,
}

#[strata_core::async_trait]
impl strata_core::Filter for FillsUp {
    fn next(&self) -> &DeviceRef {
        &self.disk
    }

    async fn write(
        &self,
        offset: u64,
        data: strata_core::bytes::Bytes,
        flags: strata_core::WriteFlags,
    ) -> strata_core::Result<()> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(BlockError::NoSpace);
        }
        self.disk.write(offset, data, flags).await
    }
}

/// A store stopped by a full device keeps answering "no space" (ENOSPC for an NBD client),
/// not a generic I/O error, on every later call; a medium error stays EIO.
#[tokio::test]
async fn a_failed_store_keeps_the_kind_of_the_failure_that_stopped_it() {
    let group = CrashGroup::new();
    let disk = Arc::new(FillsUp {
        disk: Arc::new(group.disk(sector_disk(DISK))),
        full: Default::default(),
    });
    let (store, map) = format_with_map(disk.clone()).await;
    disk.full.store(true, std::sync::atomic::Ordering::SeqCst);
    put(&store, map, 1).unwrap();
    let error = store.commit().await.unwrap_err();
    assert!(matches!(error, BlockError::NoSpace), "{error:?}");
    let refused = put(&store, map, 2).unwrap_err();
    assert_eq!(refused.errno(), strata_core::errno::ENOSPC, "{refused:?}");
    assert!(matches!(refused, BlockError::NoSpace), "{refused:?}");
    let again = store.commit().await;
    // Nothing new to commit is fine; a commit with work pending is refused the same way.
    if let Err(again) = again {
        assert_eq!(again.errno(), strata_core::errno::ENOSPC, "{again:?}");
    }

    // A medium error stays an I/O error, and says what happened first.
    let fixture = new_fixture().await;
    fixture
        .disk
        .fail_writes(layout().journal_offset(0), layout().journal_blocks * 4096);
    put(&fixture.store, fixture.map, 2).unwrap();
    fixture.store.commit().await.unwrap_err();
    let refused = put(&fixture.store, fixture.map, 3).unwrap_err();
    assert_eq!(refused.errno(), strata_core::errno::EIO, "{refused:?}");
    assert!(refused.to_string().contains("failed earlier"), "{refused}");
    assert!(
        refused.to_string().contains("injected") || refused.to_string().contains("write"),
        "{refused}"
    );
}

/// Yields once before every write, so that a second commit can queue behind the first.
struct YieldBeforeWrites;

#[strata_core::async_trait]
impl strata_crash::testkit::Interceptor for YieldBeforeWrites {
    async fn before(&self, request: strata_crash::testkit::Request) -> strata_core::Result<()> {
        if let strata_crash::testkit::Request::Write { .. } = request {
            tokio::task::yield_now().await;
        }
        Ok(())
    }
}

/// Found by `strata sim explore` (issue 18): a commit that waited for the committer behind a
/// commit that then failed found the pending batch empty (the failed commit had taken it)
/// and recorded every transaction as durable before it saw the failure. Layers read that
/// record: a thin pool's or a migrate layer's FLUSH that found "nothing uncommitted"
/// answered success in the same instant as a power cut, and slots freed by transactions
/// that never reached the disk were reused.
#[tokio::test]
async fn a_commit_queued_behind_a_failed_commit_fails_too() {
    let group = CrashGroup::new();
    let disk = group.disk(sector_disk(DISK));
    let device: DeviceRef =
        strata_crash::testkit::Intercepted::new(Arc::new(disk.clone()), YieldBeforeWrites);
    let (store, map) = format_with_map(device).await;
    put(&store, map, 1).unwrap();
    let failed_txn = store.next_txn() - 1;
    disk.fail_writes(layout().journal_offset(0), layout().journal_blocks * 4096);
    let (first, second) = tokio::join!(store.commit(), store.commit());
    assert!(
        first.is_err(),
        "the commit whose journal write failed succeeded"
    );
    let second = second.expect_err("a commit queued behind a failed one succeeded");
    assert!(second.to_string().contains("failed earlier"), "{second}");
    assert!(
        store.durable_txn() <= failed_txn,
        "transaction {failed_txn} never reached the disk, yet the store records transactions \
         below {} as durable",
        store.durable_txn()
    );
    assert!(
        store.uncommitted() > 0,
        "the failed transaction counts as committed"
    );
}
