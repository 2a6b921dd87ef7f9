//! What a store reports about itself: space, and counters of its work.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::Serialize;

/// Usage and limits of a store's checkpoint space, which bounds its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpaceReport {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// Kept back for transactions that free space.
    pub reserve_bytes: u64,
    pub low_water_bytes: u64,
    /// Usage is above the low-water mark.
    pub low_space: bool,
    /// Why the store failed, if it has.
    pub failed: Option<String>,
}

/// Counters of a store's work since it was opened.
#[derive(Debug, Default)]
pub struct MetaCounters {
    txns: AtomicU64,
    ops: AtomicU64,
    commits: AtomicU64,
    batches: AtomicU64,
    journal_blocks: AtomicU64,
    checkpoints: AtomicU64,
    checkpoint_bytes: AtomicU64,
    low_space_events: AtomicU64,
    commit_ns_total: AtomicU64,
    commit_ns_max: AtomicU64,
}

/// A point-in-time copy of [`MetaCounters`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CountersSnapshot {
    pub txns: u64,
    pub ops: u64,
    pub commits: u64,
    pub batches: u64,
    /// Blocks of the batches written, each batch counted once although format version 2
    /// writes it twice: compare with `MetaStore::journal_capacity_blocks`.
    pub journal_blocks: u64,
    pub checkpoints: u64,
    pub checkpoint_bytes: u64,
    pub low_space_events: u64,
    pub commit_seconds_total: f64,
    pub commit_seconds_max: f64,
}

impl MetaCounters {
    pub(crate) fn txn(&self, ops: usize) {
        self.txns.fetch_add(1, Relaxed);
        self.ops.fetch_add(ops as u64, Relaxed);
    }

    pub(crate) fn commit(&self, took: Duration) {
        let ns = took.as_nanos() as u64;
        self.commits.fetch_add(1, Relaxed);
        self.commit_ns_total.fetch_add(ns, Relaxed);
        self.commit_ns_max.fetch_max(ns, Relaxed);
    }

    pub(crate) fn batch(&self, blocks: u64) {
        self.batches.fetch_add(1, Relaxed);
        self.journal_blocks.fetch_add(blocks, Relaxed);
    }

    pub(crate) fn checkpoint(&self, bytes: u64) {
        self.checkpoints.fetch_add(1, Relaxed);
        self.checkpoint_bytes.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn low_space_event(&self) {
        self.low_space_events.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            txns: self.txns.load(Relaxed),
            ops: self.ops.load(Relaxed),
            commits: self.commits.load(Relaxed),
            batches: self.batches.load(Relaxed),
            journal_blocks: self.journal_blocks.load(Relaxed),
            checkpoints: self.checkpoints.load(Relaxed),
            checkpoint_bytes: self.checkpoint_bytes.load(Relaxed),
            low_space_events: self.low_space_events.load(Relaxed),
            commit_seconds_total: self.commit_ns_total.load(Relaxed) as f64 / 1e9,
            commit_seconds_max: self.commit_ns_max.load(Relaxed) as f64 / 1e9,
        }
    }
}
