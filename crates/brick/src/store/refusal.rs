//! Why a brick voted no to a prepare, by class, and how often: an operator tells a brick out
//! of space from a client fenced or a host writing over another's undecided interval without
//! reading the reasons in the log.

use std::sync::atomic::{AtomicU64, Ordering};

/// The class of a prepare's `No` (`Vote::No` carries the full reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepareRefusal {
    /// A roll-back or a version's deletion is running.
    Busy,
    /// The client is fenced, or its claim epoch is older than one seen for its segment.
    Fenced,
    /// Tagged below a sealed version, or too far ahead of the newest.
    Tag,
    /// Below its client's forgotten mark, or already decided.
    Late,
    /// Overlaps another client's undecided interval: the client waits and tries again.
    Overlap,
    /// Not enough free units, after what versions keep.
    NoSpace,
}

impl PrepareRefusal {
    pub const ALL: [PrepareRefusal; 6] = [
        PrepareRefusal::Busy,
        PrepareRefusal::Fenced,
        PrepareRefusal::Tag,
        PrepareRefusal::Late,
        PrepareRefusal::Overlap,
        PrepareRefusal::NoSpace,
    ];

    /// The label value a metric carries.
    pub fn name(self) -> &'static str {
        match self {
            PrepareRefusal::Busy => "busy",
            PrepareRefusal::Fenced => "fenced",
            PrepareRefusal::Tag => "tag",
            PrepareRefusal::Late => "late",
            PrepareRefusal::Overlap => "overlap",
            PrepareRefusal::NoSpace => "no_space",
        }
    }
}

/// Refusals counted since the brick was opened, one counter per class.
#[derive(Debug, Default)]
pub(super) struct RefusalCounts([AtomicU64; PrepareRefusal::ALL.len()]);

impl RefusalCounts {
    pub(super) fn count(&self, class: PrepareRefusal) {
        self.0[class as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> Vec<(PrepareRefusal, u64)> {
        PrepareRefusal::ALL
            .iter()
            .map(|&class| (class, self.0[class as usize].load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_counts_apart_and_names_itself_once() {
        let counts = RefusalCounts::default();
        counts.count(PrepareRefusal::NoSpace);
        counts.count(PrepareRefusal::NoSpace);
        counts.count(PrepareRefusal::Fenced);
        let snapshot = counts.snapshot();
        assert_eq!(snapshot.len(), PrepareRefusal::ALL.len());
        for (class, count) in snapshot {
            let expected = match class {
                PrepareRefusal::NoSpace => 2,
                PrepareRefusal::Fenced => 1,
                _ => 0,
            };
            assert_eq!(count, expected, "{}", class.name());
        }
        let mut names: Vec<&str> = PrepareRefusal::ALL.iter().map(|c| c.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PrepareRefusal::ALL.len());
    }
}
