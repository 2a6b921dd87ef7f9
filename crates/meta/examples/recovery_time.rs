//! Measures the metadata service's bounds: memory per entry and recovery time as a function
//! of state size. `cargo run --release -p strata-meta --example recovery_time`.
//!
//! The state is shaped like a thin pool's: a dense table of 4-byte records (a volume's map)
//! and a bitmap with 128 bits per record (liveness of 4 KiB granules in 512 KiB extents).
//! Memory is the process's resident-set growth while the state is built (approximate: it
//! includes allocator slack). Recovery is timed twice: from a checkpoint alone, and from a
//! checkpoint plus a full journal of small transactions to replay.

use std::sync::Arc;
use std::time::Instant;

use strata_backend::{FileDevice, FileOptions};
use strata_core::{DeviceRef, TokioRuntime};
use strata_meta::{FormatOptions, MetaStore, StoreOptions, TxnClass};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

async fn measure(entries: u64) {
    // Region: the checkpoint of `entries` records needs about 4.1 + 16.1 bytes each.
    let region = (entries * 64 + (8 << 20)).next_multiple_of(1 << 20);
    // A file, not memory, so that the device's contents do not count as the store's RSS.
    let dir = std::env::temp_dir().join(format!("strata-recovery-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut options = FileOptions::new(dir.join("meta.img"));
    options.size = Some(region);
    let device: DeviceRef = Arc::new(FileDevice::open(options, TokioRuntime::current()).unwrap());
    let store = MetaStore::format(
        device.clone(),
        0,
        region,
        FormatOptions::new("bench"),
        StoreOptions::new("bench"),
    )
    .await
    .unwrap();
    let (map, live) = store
        .transact(TxnClass::Normal, |_, txn| {
            Ok((txn.create_table("map.1", 4), txn.create_bitmap("live")))
        })
        .unwrap();
    let before = rss_bytes();
    let mut index = 0;
    while index < entries {
        let end = (index + 4096).min(entries);
        store
            .transact(TxnClass::Normal, |_, txn| {
                for i in index..end {
                    txn.set_u32(map, i, i as u32 + 1);
                    txn.set_bits(live, i * 128, 128, true);
                }
                Ok(())
            })
            .unwrap();
        index = end;
        store.commit().await.unwrap();
    }
    let grown = rss_bytes().saturating_sub(before);
    store.checkpoint_now().await.unwrap();
    let state_bytes = store.space().used_bytes;
    drop(store);

    let started = Instant::now();
    let (store, recovered) = MetaStore::open(device.clone(), 0, StoreOptions::new("bench"))
        .await
        .unwrap();
    let from_checkpoint = started.elapsed();
    assert_eq!(recovered.txns_replayed, 0);
    let recover_only = recovered.elapsed;

    // Fill the journal with small transactions (one record each, committed one by one).
    let journal_blocks = store.journal_capacity_blocks();
    let fill_started = store.counters().snapshot();
    let mut txns = 0u64;
    while store.counters().snapshot().journal_blocks + 1 < journal_blocks {
        store
            .transact(TxnClass::Normal, |_, txn| {
                txn.set_u32(map, txns % entries, 7);
                Ok(())
            })
            .unwrap();
        store.commit().await.unwrap();
        txns += 1;
    }
    // Mean latency of the fill loop's commits: one small batch each, so this is the cost of
    // a commit's journal write(s) plus its flush, on this machine's disk.
    let fill = store.counters().snapshot();
    let commit_us = (fill.commit_seconds_total - fill_started.commit_seconds_total) * 1e6
        / (fill.commits - fill_started.commits).max(1) as f64;
    drop(store);
    let (_, recovered) = MetaStore::open(device, 0, StoreOptions::new("bench"))
        .await
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    println!(
        "| {entries:>9} | {:>10.1} | {:>12} | {:>9.1} | {:>9.1} | {:>8} | {:>9.1} | {:>9.1} |",
        grown as f64 / entries as f64,
        state_bytes,
        recover_only.as_secs_f64() * 1e3,
        from_checkpoint.as_secs_f64() * 1e3,
        recovered.txns_replayed,
        recovered.elapsed.as_secs_f64() * 1e3,
        commit_us,
    );
}

fn main() {
    // Each size runs in a fresh process, so that memory freed by one does not hide the next.
    if let Some(entries) = std::env::args().nth(1).and_then(|a| a.parse().ok()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(measure(entries));
        return;
    }
    println!("| entries | RSS bytes/entry | state bytes | recover ms | open ms | journal txns | recover+replay ms | commit µs (mean) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for entries in [10_000u64, 100_000, 1_000_000, 4_000_000] {
        let exe = std::env::current_exe().unwrap();
        let status = std::process::Command::new(exe)
            .arg(entries.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}
