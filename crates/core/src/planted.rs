//! Deliberate defects, off unless the simulator's explorer turns one on, so that its tests can
//! show each kind of defect it exists to find is found (issue 18).
//!
//! Why compiled into every build rather than behind a cargo feature: the explorer's CI runs
//! thousands of whole-stack runs through the release build (a debug build is several times
//! slower), and a feature would mean building every layer twice. FoundationDB's BUGGIFY makes
//! the same choice. The cost is one relaxed atomic load at each planted site, and the sites
//! are on rare paths (a commit, a flush, an assembly), never per byte. Nothing but
//! `strata sim explore --plant` calls [`plant`]; `strata serve` has no way to.

use std::sync::atomic::{AtomicU32, Ordering};

/// A defect a layer can be told to have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Bug {
    /// `stripe` answers a flush without flushing its children.
    StripeFlushDropped = 1,
    /// A thin pool commits its map without first making the data it points to durable.
    ThinMapBeforeData = 2,
    /// `raid5` writes a small update's data chunk but not the new parity.
    Raid5ParitySkipped = 3,
    /// `mirror` reads from a leg it knows is out of date.
    MirrorStaleLegRead = 4,
    /// `mirror` starts with members missing although the operator did not allow it.
    MirrorDegradedUnasked = 5,
}

impl Bug {
    pub const ALL: [Bug; 5] = [
        Bug::StripeFlushDropped,
        Bug::ThinMapBeforeData,
        Bug::Raid5ParitySkipped,
        Bug::MirrorStaleLegRead,
        Bug::MirrorDegradedUnasked,
    ];

    /// The name `--plant` takes.
    pub fn name(self) -> &'static str {
        match self {
            Bug::StripeFlushDropped => "stripe-flush-dropped",
            Bug::ThinMapBeforeData => "thin-map-before-data",
            Bug::Raid5ParitySkipped => "raid5-parity-skipped",
            Bug::MirrorStaleLegRead => "mirror-stale-leg-read",
            Bug::MirrorDegradedUnasked => "mirror-degraded-unasked",
        }
    }

    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|bug| bug.name() == name)
    }
}

static PLANTED: AtomicU32 = AtomicU32::new(0);

/// Turns `bug` on for the whole process (`None`: none). For the explorer only.
pub fn plant(bug: Option<Bug>) {
    PLANTED.store(bug.map_or(0, |b| b as u32), Ordering::Relaxed);
}

/// Whether `bug` is on.
#[inline]
pub fn planted(bug: Bug) -> bool {
    PLANTED.load(Ordering::Relaxed) == bug as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_is_planted_by_default() {
        for bug in Bug::ALL {
            assert_eq!(Bug::from_name(bug.name()), Some(bug));
            assert!(!planted(bug));
        }
        assert_eq!(Bug::from_name("no-such-bug"), None);
    }
}
