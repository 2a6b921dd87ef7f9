//! How full a pool is and what it does about it: the low-water mark, writes held while the
//! pool is full, and the usage counts (allocated extents, live granules, partly dead extents).
//!
//! Counts of what the map holds are derived from the metadata when asked for, never kept on
//! the side, so nothing can drift from the truth (a volume delete changes them all at once).
//! Event counters (frees, refusals, crossings) count since the pool was opened.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use tokio::sync::Notify;

use super::policy::LowWater;

/// One volume's share of the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeSpace {
    pub name: String,
    /// Physical extents the volume maps.
    pub extents_allocated: u64,
    /// 4 KiB granules holding the volume's data (the rest of its extents read as zeros).
    pub granules_live: u64,
    /// Mapped extents with some granules not live: never written, discarded, or zeroed.
    pub extents_partly_dead: u64,
}

/// A pool's space, its low-space state and its space events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSpace {
    pub extents: u64,
    pub extent_size: u64,
    pub extents_allocated: u64,
    pub granules_live: u64,
    pub extents_partly_dead: u64,
    /// Allocated extents at which the pool reports low space.
    pub low_water_extents: u64,
    pub low_space: bool,
    /// Times allocation crossed the low-water mark upwards since the pool was opened.
    pub low_space_events: u64,
    /// Extents freed by discard or zeroing since the pool was opened.
    pub extents_freed: u64,
    /// Of those, extents whose last discard did not cover them whole: the granules died over
    /// several requests. A tracker with whole-extent liveness only (the paper's VA, whose
    /// future-work section asks for sub-extent valid bits) would still hold them.
    pub extents_freed_by_granules: u64,
    /// Allocating writes refused with ENOSPC since the pool was opened.
    pub no_space_errors: u64,
    /// Allocating writes waiting for space right now (`when-full = "wait"`).
    pub writes_waiting: u64,
    /// Spare devices left to grow the pool with when it crosses its low-water mark.
    pub spares_left: u64,
    pub volumes: Vec<VolumeSpace>,
}

/// The pool's space state that is not in the metadata.
pub(crate) struct SpaceWatch {
    low_water: LowWater,
    /// Whether the pool is above its low-water mark; a mutex so that crossings are judged one
    /// at a time against a fresh count and each is logged once.
    low: Mutex<bool>,
    low_space_events: AtomicU64,
    extents_freed: AtomicU64,
    extents_freed_by_granules: AtomicU64,
    no_space_errors: AtomicU64,
    writes_waiting: AtomicU64,
    /// Set once "out of space" is logged, cleared by the next successful allocation, so a
    /// client hammering a full pool does not flood the log.
    full_logged: AtomicBool,
    /// Signalled when an extent is freed, for writes waiting for space.
    pub(crate) freed: Notify,
}

impl SpaceWatch {
    pub(crate) fn new(low_water: LowWater) -> Self {
        SpaceWatch {
            low_water,
            low: Mutex::new(false),
            low_space_events: AtomicU64::new(0),
            extents_freed: AtomicU64::new(0),
            extents_freed_by_granules: AtomicU64::new(0),
            no_space_errors: AtomicU64::new(0),
            writes_waiting: AtomicU64::new(0),
            full_logged: AtomicBool::new(false),
            freed: Notify::new(),
        }
    }

    pub(crate) fn low_water(&self) -> LowWater {
        self.low_water
    }

    /// Judges the low-water mark against `allocated()`, read under the watch's lock; logs a
    /// crossing (a warning once per upward crossing) and returns whether space is low.
    pub(crate) fn observe(
        &self,
        pool: &str,
        extents: u64,
        allocated: impl FnOnce() -> u64,
    ) -> bool {
        let mut low = self.low.lock().unwrap_or_else(|p| p.into_inner());
        let allocated = allocated();
        let threshold = self.low_water.threshold(extents);
        let above = allocated >= threshold;
        if above && !*low {
            self.low_space_events.fetch_add(1, Relaxed);
            tracing::warn!(
                pool,
                allocated,
                extents,
                low_water = format!("{}%", self.low_water.percent()),
                "thin pool data space is running low"
            );
        } else if !above && *low {
            tracing::info!(
                pool,
                allocated,
                extents,
                "thin pool data space is back under its low-water mark"
            );
        }
        *low = above;
        above
    }

    /// An extent went back to the pool; `partial` if its last discard did not cover it.
    pub(crate) fn extent_freed(&self, partial: bool) {
        self.extents_freed.fetch_add(1, Relaxed);
        if partial {
            self.extents_freed_by_granules.fetch_add(1, Relaxed);
        }
        self.freed.notify_waiters();
    }

    pub(crate) fn allocated(&self) {
        self.full_logged.store(false, Relaxed);
    }

    /// An allocating write is refused; returns whether this is the first refusal since the
    /// last successful allocation (the one worth logging).
    pub(crate) fn refused(&self) -> bool {
        self.no_space_errors.fetch_add(1, Relaxed);
        !self.full_logged.swap(true, Relaxed)
    }

    /// Counts a write as waiting for space while the guard lives.
    pub(crate) fn waiting(&self) -> WaitingGuard<'_> {
        self.writes_waiting.fetch_add(1, Relaxed);
        WaitingGuard(self)
    }

    /// Fills in the event counters of `space`.
    pub(crate) fn fill(&self, space: &mut PoolSpace) {
        space.low_water_extents = self.low_water.threshold(space.extents);
        space.low_space_events = self.low_space_events.load(Relaxed);
        space.extents_freed = self.extents_freed.load(Relaxed);
        space.extents_freed_by_granules = self.extents_freed_by_granules.load(Relaxed);
        space.no_space_errors = self.no_space_errors.load(Relaxed);
        space.writes_waiting = self.writes_waiting.load(Relaxed);
    }
}

pub(crate) struct WaitingGuard<'a>(&'a SpaceWatch);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.writes_waiting.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crossing_counts_once_until_the_pool_drops_back_under_the_mark() {
        let watch = SpaceWatch::new(LowWater::parse("80%").unwrap());
        assert!(!watch.observe("p", 10, || 7));
        assert!(watch.observe("p", 10, || 8));
        assert!(watch.observe("p", 10, || 9));
        let mut space = PoolSpace {
            extents: 10,
            ..PoolSpace::default()
        };
        watch.fill(&mut space);
        assert_eq!(space.low_space_events, 1, "one crossing");
        assert_eq!(space.low_water_extents, 8);
        assert!(!watch.observe("p", 10, || 5));
        assert!(watch.observe("p", 10, || 10));
        watch.fill(&mut space);
        assert_eq!(
            space.low_space_events, 2,
            "a second crossing after dropping under"
        );
    }

    #[test]
    fn refusals_are_logged_once_per_full_episode() {
        let watch = SpaceWatch::new(LowWater::default());
        assert!(watch.refused());
        assert!(!watch.refused());
        watch.allocated();
        assert!(watch.refused());
        let mut space = PoolSpace::default();
        watch.fill(&mut space);
        assert_eq!(space.no_space_errors, 3);
    }
}
