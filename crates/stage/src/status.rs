//! What `strata status` shows of a stage: log usage, backlog, trigger, destage progress, the
//! counters the paper's tables need, and the fast child's health.

use std::sync::atomic::{AtomicU64, Ordering};

use strata_core::{describe, Activity, Health, NodeStatus, Result};

use crate::destage::DestageReport;
use crate::stage::Stage;

/// Running totals since the stage was opened.
#[derive(Debug, Default)]
pub struct Counters {
    pub staged_writes: AtomicU64,
    pub staged_blocks: AtomicU64,
    pub direct_writes: AtomicU64,
    pub direct_blocks: AtomicU64,
    pub destages: AtomicU64,
    pub destaged_blocks: AtomicU64,
    pub destage_skipped: AtomicU64,
    pub batches: AtomicU64,
    /// Child writes the destages issued (consecutive targets merged).
    pub destage_requests: AtomicU64,
    pub strands: AtomicU64,
    pub placed_at_home: AtomicU64,
    pub placed_in_home_range: AtomicU64,
    pub placed_in_window: AtomicU64,
    pub placed_outside_window: AtomicU64,
    pub destage_failures: AtomicU64,
    pub log_full_waits: AtomicU64,
    /// Staged writes that found the metadata store full and destaged to make room in it.
    pub metadata_full_destages: AtomicU64,
    /// Blocks that a discard (or a write-zeroes that may trim) made unwritten.
    pub unmapped_blocks: AtomicU64,
    pub fast_read_errors: AtomicU64,
    progress_done: AtomicU64,
    progress_total: AtomicU64,
}

/// A copy of the counters, by name (the order status prints them in).
pub type CountersSnapshot = Vec<(&'static str, u64)>;

impl Counters {
    pub fn bump(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn destaged(&self, report: &DestageReport) {
        if report.blocks + report.skipped == 0 {
            return;
        }
        self.bump(&self.destages, 1);
        self.bump(&self.destaged_blocks, report.blocks);
        self.bump(&self.destage_skipped, report.skipped);
        self.bump(&self.batches, report.batches);
        self.bump(&self.destage_requests, report.requests);
        self.bump(&self.strands, report.strands);
        let placed = report.placement;
        self.bump(&self.placed_at_home, placed.at_home_block);
        self.bump(&self.placed_in_home_range, placed.in_home_range);
        self.bump(&self.placed_in_window, placed.in_window);
        self.bump(&self.placed_outside_window, placed.outside_window);
    }

    pub(crate) fn set_progress(&self, done: u64, total: u64) {
        self.progress_done.store(done, Ordering::Relaxed);
        self.progress_total.store(total, Ordering::Relaxed);
    }

    /// `blocks` more of the running destage are on the slow child.
    pub(crate) fn add_progress(&self, blocks: u64) {
        self.progress_done.fetch_add(blocks, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> CountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("staged writes", get(&self.staged_writes)),
            ("staged blocks", get(&self.staged_blocks)),
            ("direct writes", get(&self.direct_writes)),
            ("direct blocks", get(&self.direct_blocks)),
            ("destages", get(&self.destages)),
            ("destaged blocks", get(&self.destaged_blocks)),
            ("destage skipped blocks", get(&self.destage_skipped)),
            ("batches", get(&self.batches)),
            ("destage I/Os", get(&self.destage_requests)),
            ("strands", get(&self.strands)),
            ("placed at home", get(&self.placed_at_home)),
            ("placed in home range", get(&self.placed_in_home_range)),
            ("placed in window", get(&self.placed_in_window)),
            ("placed outside window", get(&self.placed_outside_window)),
            ("destage failures", get(&self.destage_failures)),
            ("log full waits", get(&self.log_full_waits)),
            ("metadata full destages", get(&self.metadata_full_destages)),
            ("unmapped blocks", get(&self.unmapped_blocks)),
            ("fast read errors", get(&self.fast_read_errors)),
        ]
    }
}

/// `part / whole` with one decimal, "-" when `whole` is 0.
fn ratio(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}", part as f64 / whole as f64)
    }
}

impl Stage {
    /// The counters by name (tests, metrics).
    pub fn counters(&self) -> CountersSnapshot {
        self.counters.snapshot()
    }

    /// Live staged blocks (the destage backlog) and log slots busy, of `log_slots`.
    pub fn log_usage(&self) -> Result<(u64, u64)> {
        let space = self.space()?;
        Ok((space.staged_blocks(), space.log.busy()))
    }

    pub async fn describe(&self) -> Result<NodeStatus> {
        let (backlog, busy, extents, pending, free_blocks) = {
            let space = self.space()?;
            (
                space.staged_blocks(),
                space.log.busy(),
                space.staged.len(),
                space.log.pending_frees() + space.alloc.pending_frees(),
                space.alloc.free_blocks(),
            )
        };
        let slots = self.shape.log_slots;
        let mut node = NodeStatus::new(&self.name, "stage", self.shape.size());
        let store_space = self.store.space();
        let fast_failure = self.fast_failure().or(store_space.failed.clone());
        if fast_failure.is_some() {
            node.health = Health::Failed;
        }
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut detail: Vec<(String, String)> = vec![
            ("trigger".into(), self.trigger_text()),
            (
                "threshold".into(),
                strata_core::ByteSize(self.settings.threshold).to_string(),
            ),
            (
                "log".into(),
                format!(
                    "{busy} of {slots} slots busy ({:.1} %)",
                    busy as f64 * 100.0 / slots as f64
                ),
            ),
            (
                "backlog".into(),
                format!("{backlog} blocks staged in {extents} extents"),
            ),
            ("frees waiting for a commit".into(), pending.to_string()),
            (
                "slow child free blocks".into(),
                format!("{free_blocks} of {}", self.shape.blocks()),
            ),
            (
                "updates per batch".into(),
                ratio(get(&c.destaged_blocks), get(&c.batches)),
            ),
            (
                "destage I/Os per batch".into(),
                ratio(get(&c.destage_requests), get(&c.batches)),
            ),
            (
                "metadata".into(),
                format!(
                    "{} of {} bytes",
                    store_space.used_bytes, store_space.capacity_bytes
                ),
            ),
            (
                "fast child".into(),
                fast_failure.unwrap_or_else(|| "ok".into()),
            ),
        ];
        detail.extend(
            c.snapshot()
                .into_iter()
                .map(|(name, value)| (name.to_string(), value.to_string())),
        );
        node.detail = detail;
        let total = get(&c.progress_total);
        if self.running_destage() && total > 0 {
            node.activity = Some(Activity {
                what: "destaging".into(),
                done_bytes: get(&c.progress_done) * crate::shape::BLOCK,
                total_bytes: total * crate::shape::BLOCK,
            });
        }
        node.config = self.config().cloned();
        for child in [&self.fast, &self.slow] {
            if let Ok(status) = describe(child.as_ref()).await {
                node.children.push(status);
            }
        }
        Ok(node)
    }

    fn trigger_text(&self) -> String {
        match self.settings.trigger {
            crate::trigger::Trigger::Full => "full".into(),
            crate::trigger::Trigger::Watermark {
                high_percent,
                low_percent,
            } => format!("watermark (start at {high_percent} %, stop at {low_percent} %)"),
            crate::trigger::Trigger::Density { blocks, together } => {
                format!("density ({blocks} blocks in an extent, {together} extents at a time)")
            }
        }
    }
}
