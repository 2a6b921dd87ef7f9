//! When to destage, and what: a pure policy over the log's usage and the staged blocks per
//! extent. No I/O, no clock.
//!
//! - `full` (the paper's prototype): nothing in the background; when a write finds no room in
//!   the log, everything staged is destaged.
//! - `watermark`: once the log is at `high` percent, destage the extents with the most staged
//!   blocks first until what is left is at most `low` percent (start at high, stop at low).
//! - `density` (proposed in the paper, §4.3, never built there): destage an extent as soon as
//!   its staged blocks reach `density`, enough for a dense batch (8 fill a drive's queue);
//!   densest first, at most an eighth of the log per destage.
//!
//! Every trigger keeps a full-log destage as its backstop: a write that finds the log full
//! destages (everything for `full`, the densest eighth of the log for the others:
//! `Trigger::backstop`) and goes on; writers that find it full are served in turn, so an
//! overload makes them wait, never fail (`Stage::reserve_slots`).

use serde::{Deserialize, Serialize};

/// The trigger as configured (`trigger = "…"`). Read through a string: the layer options'
/// deserializer takes plain values, and the error then lists the three names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum TriggerKind {
    #[default]
    Full,
    Watermark,
    Density,
}

impl TryFrom<String> for TriggerKind {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        [
            TriggerKind::Full,
            TriggerKind::Watermark,
            TriggerKind::Density,
        ]
        .into_iter()
        .find(|kind| kind.name() == name)
        .ok_or_else(|| format!("{name:?} is not \"full\", \"watermark\" or \"density\""))
    }
}

impl From<TriggerKind> for String {
    fn from(kind: TriggerKind) -> String {
        kind.name().to_string()
    }
}

impl TriggerKind {
    pub fn name(self) -> &'static str {
        match self {
            TriggerKind::Full => "full",
            TriggerKind::Watermark => "watermark",
            TriggerKind::Density => "density",
        }
    }
}

/// The trigger with its parameters, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Full,
    /// Percentages of the log's slots.
    Watermark {
        high_percent: u64,
        low_percent: u64,
    },
    /// Staged blocks in one extent that start its destage.
    Density {
        blocks: u64,
    },
}

/// What to destage now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Nothing,
    /// Everything staged (the full-log destage).
    All,
    /// These extents, in this order.
    Extents(Vec<u64>),
}

impl Trigger {
    /// The background decision, given the log's slots in use and in all, and the staged
    /// blocks per extent (`(extent, blocks)`, any order).
    pub fn decide(&self, used_slots: u64, log_slots: u64, staged: &[(u64, u64)]) -> Decision {
        debug_assert!(used_slots <= log_slots);
        match *self {
            Trigger::Full => Decision::Nothing,
            Trigger::Watermark {
                high_percent,
                low_percent,
            } => {
                if used_slots * 100 < high_percent * log_slots {
                    return Decision::Nothing;
                }
                // Slots that must go to come down to the low mark.
                let keep = low_percent * log_slots / 100;
                densest_covering(staged, used_slots.saturating_sub(keep), 0)
            }
            Trigger::Density { blocks: density } => {
                // At most a slice of the log per destage (at least one extent): when many
                // extents reach the density together (uniform random writes fill them
                // alike), one destage of all of them would hold writers for all of it.
                densest_covering(staged, (log_slots / 8).max(1), density)
            }
        }
    }

    /// What a writer that found the log full destages. `full`: everything (the paper's
    /// prototype). The background triggers: the densest extents holding at least `needed`
    /// blocks and an eighth of the log, so that writers overtaking the background destager
    /// wait for a slice of the log, not for all of it (on a 1 GiB log over one disk, all of
    /// it is minutes).
    pub fn backstop(&self, needed: u64, log_slots: u64, staged: &[(u64, u64)]) -> Decision {
        if *self == Trigger::Full {
            return Decision::All;
        }
        densest_covering(staged, needed.max(log_slots / 8), 0)
    }
}

/// The densest extents holding at least `at_least` blocks each, densest first, until they
/// hold `need` blocks (or none qualify).
fn densest_covering(staged: &[(u64, u64)], mut need: u64, at_least: u64) -> Decision {
    let mut chosen = Vec::new();
    for (extent, blocks) in densest_first(staged) {
        if need == 0 || blocks < at_least {
            break;
        }
        chosen.push(extent);
        need = need.saturating_sub(blocks);
    }
    as_decision(chosen)
}

/// Extents by staged blocks, most first; ties by extent, so the order is deterministic.
fn densest_first(staged: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut sorted = staged.to_vec();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    sorted
}

fn as_decision(extents: Vec<u64>) -> Decision {
    if extents.is_empty() {
        Decision::Nothing
    } else {
        Decision::Extents(extents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WATERMARK: Trigger = Trigger::Watermark {
        high_percent: 80,
        low_percent: 20,
    };

    #[test]
    fn a_full_log_destages_everything_for_full_and_a_slice_for_the_others() {
        let staged = [(1, 10), (2, 40), (3, 30), (4, 20)];
        assert_eq!(Trigger::Full.backstop(1, 100, &staged), Decision::All);
        // An eighth of a 100-slot log is 12 blocks: the densest extent covers it.
        let density = Trigger::Density { blocks: 8 };
        assert_eq!(
            density.backstop(1, 100, &staged),
            Decision::Extents(vec![2])
        );
        // A write needing more than an eighth takes as many extents as cover it.
        assert_eq!(
            WATERMARK.backstop(60, 100, &staged),
            Decision::Extents(vec![2, 3])
        );
        // Nothing staged: nothing to destage.
        assert_eq!(WATERMARK.backstop(5, 100, &[]), Decision::Nothing);
    }

    #[test]
    fn full_never_destages_in_the_background() {
        assert_eq!(
            Trigger::Full.decide(100, 100, &[(0, 100)]),
            Decision::Nothing
        );
        assert_eq!(Trigger::Full.decide(0, 100, &[]), Decision::Nothing);
    }

    #[test]
    fn watermark_starts_at_high_and_stops_at_low() {
        // 79 % used: below high, nothing.
        assert_eq!(WATERMARK.decide(79, 100, &[(1, 79)]), Decision::Nothing);
        // 80 % used over three extents: down to 20 % needs 60 slots, densest first.
        let staged = [(1, 10), (2, 40), (3, 30)];
        assert_eq!(
            WATERMARK.decide(80, 100, &staged),
            Decision::Extents(vec![2, 3])
        );
        // The two densest leave 10 slots, at most 20 %: the third is not needed.
        let staged = [(5, 45), (6, 35)];
        assert_eq!(
            WATERMARK.decide(80, 100, &staged),
            Decision::Extents(vec![5, 6])
        );
    }

    #[test]
    fn density_picks_every_extent_that_fills_a_batch() {
        let trigger = Trigger::Density { blocks: 8 };
        let staged = [(4, 7), (9, 8), (2, 30)];
        assert_eq!(
            trigger.decide(45, 1000, &staged),
            Decision::Extents(vec![2, 9])
        );
        assert_eq!(trigger.decide(7, 1000, &[(4, 7)]), Decision::Nothing);
        // At most an eighth of the log per destage: 40 of an 80-slot log's 10 is one extent,
        // the densest; the next destage takes the next.
        assert_eq!(
            trigger.decide(70, 80, &[(4, 30), (9, 40)]),
            Decision::Extents(vec![9])
        );
    }

    #[test]
    fn densest_first_breaks_ties_by_extent() {
        let sorted = densest_first(&[(3, 5), (1, 5), (2, 9)]);
        assert_eq!(sorted, vec![(2, 9), (1, 5), (3, 5)]);
    }
}
