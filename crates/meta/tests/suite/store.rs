//! The store against a plain memory device: round trips, checkpoints, space limits, failure.

use std::sync::Arc;

use strata_backend::MemoryDevice;
use strata_core::{BlockError, DeviceRef};
use strata_meta::{FormatOptions, JournalEnd, MetaStore, ObjectId, StoreOptions, TxnClass};

fn device(size: u64) -> DeviceRef {
    Arc::new(MemoryDevice::new(size))
}

async fn format(device: &DeviceRef, len: u64) -> Arc<MetaStore> {
    let mut format = FormatOptions::new("test");
    format.first_generation = Some(1000);
    MetaStore::format(device.clone(), 0, len, format, StoreOptions::new("t"))
        .await
        .unwrap()
}

fn create_map(store: &MetaStore) -> ObjectId {
    store
        .transact(TxnClass::Normal, |_, txn| Ok(txn.create_table("map", 8)))
        .unwrap()
}

fn put(store: &MetaStore, map: ObjectId, index: u64, value: u64) -> strata_core::Result<()> {
    store.transact(TxnClass::Normal, |_, txn| {
        txn.set(map, index, &value.to_le_bytes());
        Ok(())
    })
}

/// Closes `store` and reopens it from `dev`: the state read back equals the state it had.
async fn assert_reopens_the_same(store: Arc<MetaStore>, dev: DeviceRef) {
    let expected = store.read(|state| state.clone());
    drop(store);
    let (store, _) = MetaStore::open(dev, 0, StoreOptions::new("t"))
        .await
        .unwrap();
    store.read(|state| assert_eq!(*state, expected));
}

#[tokio::test]
async fn committed_state_survives_reopen_and_uncommitted_does_not() {
    let dev = device(8 << 20);
    let store = format(&dev, 1 << 20).await;
    let map = create_map(&store);
    for i in 0..100 {
        put(&store, map, i * 3, i + 1).unwrap();
    }
    store.commit().await.unwrap();
    put(&store, map, 5000, 9).unwrap(); // never committed
    let expected = store.read(|state| state.clone());
    drop(store);

    let (store, recovered) = MetaStore::open(dev.clone(), 0, StoreOptions::new("t"))
        .await
        .unwrap();
    assert_eq!(recovered.txns_replayed, 101);
    assert_eq!(recovered.batches_replayed, 1);
    assert_eq!(recovered.journal_end, JournalEnd::Clean);
    store.read(|state| {
        let table = state.table(state.id("map").unwrap()).unwrap();
        assert_eq!(table.len(), 100);
        assert_eq!(table.get(297).unwrap(), &100u64.to_le_bytes());
        assert_eq!(
            table.get(5000),
            None,
            "an uncommitted transaction came back"
        );
        assert_ne!(*state, expected);
    });
}

#[tokio::test]
async fn journal_overflow_checkpoints_and_everything_survives() {
    let dev = device(8 << 20);
    // 40 blocks: 10 journal blocks, 14-block slots.
    let store = format(&dev, 40 * 4096).await;
    let map = create_map(&store);
    for round in 0..200u64 {
        for i in 0..20 {
            put(&store, map, round * 20 + i, round + 1).unwrap();
        }
        store.commit().await.unwrap();
    }
    let counters = store.counters().snapshot();
    assert!(counters.checkpoints >= 5, "{counters:?}");
    assert_reopens_the_same(store, dev).await;
}

#[tokio::test]
async fn full_store_refuses_normal_work_but_reclaim_uses_the_reserve() {
    let dev = device(8 << 20);
    let store = format(&dev, 40 * 4096).await;
    let map = create_map(&store);
    // Each new 64-entry page of 8-byte values costs 520 bytes; spread entries one per page.
    let mut written = 0;
    let full = loop {
        match put(&store, map, written * 64, 1) {
            Ok(()) => written += 1,
            Err(error) => break error,
        }
        assert!(written < 10_000, "the store never filled");
    };
    assert!(matches!(full, BlockError::NoSpace), "{full:?}");
    let space = store.space();
    assert!(space.low_space, "{space:?}");
    assert!(space.used_bytes <= space.capacity_bytes - space.reserve_bytes);
    assert_eq!(store.counters().snapshot().low_space_events, 1);
    // A refused transaction changed nothing.
    let len = store.read(|state| state.table(map).unwrap().len());
    assert_eq!(len, written);
    // Reclaim may grow into the reserve, and freeing works on a full store.
    store
        .transact(TxnClass::Reclaim, |_, txn| {
            txn.set(map, 64 * 10_000, &1u64.to_le_bytes());
            txn.set(map, 0, &[0; 8]);
            Ok(())
        })
        .unwrap();
    store.commit().await.unwrap();
    put(&store, map, 64 * 20_000, 1).unwrap_err();
    store
        .transact(TxnClass::Reclaim, |_, txn| {
            (1..written / 2).for_each(|i| txn.set(map, i * 64, &[0; 8]));
            Ok(())
        })
        .unwrap();
    put(&store, map, 64 * 20_000, 1).unwrap();
    store.commit().await.unwrap();
    assert!(!store.space().low_space);
    assert_reopens_the_same(store, dev).await;
}

#[tokio::test]
async fn a_transaction_is_all_or_nothing() {
    let dev = device(4 << 20);
    let store = format(&dev, 1 << 20).await;
    let map = create_map(&store);
    let error = store
        .transact(TxnClass::Normal, |_, txn| {
            txn.set(map, 1, &7u64.to_le_bytes());
            txn.set(map, 2, &[1, 2, 3]); // wrong size
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(error, BlockError::InvalidArgument(_)), "{error:?}");
    store.read(|state| assert_eq!(state.table(map).unwrap().len(), 0));
    assert_eq!(store.uncommitted(), 1, "only the create is pending");
}

#[tokio::test]
async fn open_refuses_a_region_without_a_store() {
    let dev = device(1 << 20);
    let error = MetaStore::open(dev, 0, StoreOptions::new("t"))
        .await
        .err()
        .unwrap();
    assert!(error.to_string().contains("no valid superblock"), "{error}");
}

/// The stated bounds (docs/metadata-format.md): a dense table costs one 64-entry page per 64
/// records, so checkpoint bytes (what recovery reads) and page memory grow linearly with
/// entries: 4.25 bytes per 4-byte record (a 16-byte page header and 64 values of 4) plus
/// 16.25 bytes for 128 bits of bitmap (520-byte pages of 4096 bits). A sparse table costs its
/// values plus a page header each, not whole pages: 24 bytes per 8-byte record alone in its
/// page (the format version 1 and 2 checkpoints stored 520).
#[tokio::test]
async fn state_size_per_entry_is_what_the_docs_say() {
    let dev = device(64 << 20);
    let store = format(&dev, 32 << 20).await;
    let (map, live) = store
        .transact(TxnClass::Normal, |_, txn| {
            Ok((txn.create_table("map.1", 4), txn.create_bitmap("live")))
        })
        .unwrap();
    let empty = store.space().used_bytes;
    let entries = 64 * 1000;
    for chunk in 0..entries / 1000 {
        store
            .transact(TxnClass::Normal, |_, txn| {
                for i in chunk * 1000..(chunk + 1) * 1000 {
                    txn.set_u32(map, i, i as u32 + 1);
                    txn.set_bits(live, i * 128, 128, true);
                }
                Ok(())
            })
            .unwrap();
    }
    let per_entry = (store.space().used_bytes - empty) as f64 / entries as f64;
    assert!(
        (per_entry - (4.25 + 16.25)).abs() < 0.01,
        "{per_entry} bytes per entry"
    );
    store.read(|state| {
        assert_eq!(state.table(map).unwrap().pages(), entries / 64);
        assert_eq!(state.bitmap(live).unwrap().pages(), entries * 128 / 4096);
    });
    store.commit().await.unwrap();
    drop(store);
    let (store, recovered) = MetaStore::open(dev.clone(), 0, StoreOptions::new("t"))
        .await
        .unwrap();
    assert_eq!(
        recovered.txns_replayed, 65,
        "the create and 64 batches of sets"
    );
    assert_eq!(store.read(|s| s.table(map).unwrap().len()), entries);

    let before = store.space().used_bytes;
    let sparse = store
        .transact(TxnClass::Normal, |_, txn| {
            let sparse = txn.create_table("scattered", 8);
            for i in 0..1000u64 {
                txn.set(sparse, i * 64 * 7 + i % 64, &(i + 1).to_le_bytes());
            }
            Ok(sparse)
        })
        .unwrap();
    let header = 4 + 1 + 1 + "scattered".len() as u64 + 4 + 8;
    assert_eq!(store.space().used_bytes - before, header + 1000 * (16 + 8));
    store.commit().await.unwrap();
    drop(store);
    let (store, _) = MetaStore::open(dev, 0, StoreOptions::new("t"))
        .await
        .unwrap();
    assert_eq!(store.read(|s| s.table(sparse).unwrap().len()), 1000);
    assert_eq!(store.space().used_bytes - before, header + 1000 * (16 + 8));
}

#[tokio::test]
async fn only_a_commit_carrying_a_transaction_whose_data_may_not_be_durable_flushes_the_data() {
    let group = strata_crash::CrashGroup::new();
    let data = group.disk(strata_crash::sector_disk(1 << 20));
    let mut options = StoreOptions::new("t");
    options.data_devices = vec![Arc::new(data.clone())];
    let store = MetaStore::format(
        device(8 << 20),
        0,
        1 << 20,
        FormatOptions::new("t"),
        options,
    )
    .await
    .unwrap();
    let map = create_map(&store);
    store.commit().await.unwrap();
    let flushes = || data.stats().flushes;
    let durable_put = |index: u64| {
        store.transact_data_durable(TxnClass::Normal, |_, txn| {
            txn.set(map, index, &1u64.to_le_bytes());
            Ok(())
        })
    };
    // Only transactions whose callers made their data durable: no data barrier.
    let before = flushes();
    durable_put(1).unwrap();
    durable_put(2).unwrap();
    store.commit().await.unwrap();
    assert_eq!(flushes(), before);
    // One ordinary transaction among them: the batch gets its barrier.
    durable_put(3).unwrap();
    put(&store, map, 4, 1).unwrap();
    durable_put(5).unwrap();
    store.commit().await.unwrap();
    assert_eq!(flushes(), before + 1);
    // The flag went with that batch.
    durable_put(6).unwrap();
    store.commit().await.unwrap();
    assert_eq!(flushes(), before + 1);
    assert_eq!(store.uncommitted(), 0);
}

/// A transaction whose data is not durable yet (`transact_data_covered`): its commit writes
/// the journal batch and then flushes once, which leaves the data durable with it. With the
/// planted bug the copies go as FUA writes only, and the data is not durable.
#[tokio::test]
async fn a_covered_transaction_and_its_data_become_durable_under_one_flush() {
    for planted in [false, true] {
        let group = strata_crash::CrashGroup::new();
        let disk = group.disk(strata_crash::sector_disk(8 << 20));
        let mut options = StoreOptions::new("t");
        options.unsafe_skip_data_barrier = planted;
        let store = MetaStore::format(
            Arc::new(disk.clone()),
            0,
            1 << 20,
            FormatOptions::new("t"),
            options,
        )
        .await
        .unwrap();
        let map = create_map(&store);
        store.commit().await.unwrap();
        let data = bytes::Bytes::from(vec![0x5a; 4096]);
        strata_core::BlockDevice::write(&disk, 4 << 20, data.clone(), Default::default())
            .await
            .unwrap();
        let before = disk.stats().flushes;
        store
            .transact_data_covered(TxnClass::Normal, |_, txn| {
                txn.set(map, 1, &1u64.to_le_bytes());
                Ok(())
            })
            .unwrap();
        store.commit().await.unwrap();
        let durable = disk.durable_image().read(4 << 20, 4096);
        if planted {
            assert_eq!(disk.stats().flushes, before);
            assert_ne!(durable, data[..], "the planted bug left the data durable");
        } else {
            assert_eq!(disk.stats().flushes, before + 1);
            assert_eq!(durable, data[..]);
        }
        // A later batch of ordinary durable-data transactions does not flush again.
        store
            .transact_data_durable(TxnClass::Normal, |_, txn| {
                txn.set(map, 2, &1u64.to_le_bytes());
                Ok(())
            })
            .unwrap();
        let before = disk.stats().flushes;
        store.commit().await.unwrap();
        assert_eq!(disk.stats().flushes, before);
    }
}
