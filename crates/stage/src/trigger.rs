//! When to destage, and what: a pure policy over the log's usage and the staged blocks per
//! extent. No I/O, no clock.
//!
//! - `full` (the paper's prototype): nothing in the background; when a write finds no room in
//!   the log, everything staged is destaged.
//! - `watermark`: once the log is at `high` percent, destage the extents with the most staged
//!   blocks first until what is left is at most `low` percent (start at high, stop at low),
//!   an eighth of the log per destage, so that each slice's slots are free before the next
//!   starts and a writer waiting for room waits for one slice, not for the whole drain.
//! - `density` (proposed in the paper, §4.3, never built there): destage an extent as soon as
//!   its staged blocks reach `density`, enough for a dense batch (8 fill a drive's queue),
//!   and as many other extents have (four: the batches a destage keeps in flight; or every
//!   staged extent, if fewer) or the log is seven eighths full; densest first, at most an
//!   eighth of the log per destage.
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
    /// Staged blocks in one extent that start its destage, once `together` extents (or
    /// every staged one) are there, or the log is 7/8 full: `together` is the batches a
    /// destage keeps in flight at once, so that the slow child's queues hold the next batch
    /// when one drains.
    Density {
        blocks: u64,
        together: usize,
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
    /// Whether a watermark drain is on after this look at the log: it starts when the log
    /// reaches `high` and goes on, slice after slice, until it is down to `low`. `was` is
    /// the answer of the look before. Always false for the other triggers.
    pub fn draining(&self, used_slots: u64, log_slots: u64, was: bool) -> bool {
        match *self {
            Trigger::Watermark {
                high_percent,
                low_percent,
            } => {
                used_slots * 100 >= high_percent * log_slots
                    || (was && used_slots * 100 > low_percent * log_slots)
            }
            _ => false,
        }
    }

    /// The background decision, given the log's slots in use and in all, the staged blocks
    /// per extent (`(extent, blocks)`, any order), and whether a watermark drain is on
    /// ([`Trigger::draining`]).
    pub fn decide(
        &self,
        used_slots: u64,
        log_slots: u64,
        staged: &[(u64, u64)],
        draining: bool,
    ) -> Decision {
        debug_assert!(used_slots <= log_slots);
        match *self {
            Trigger::Full => Decision::Nothing,
            Trigger::Watermark { low_percent, .. } => {
                if !draining {
                    return Decision::Nothing;
                }
                // Slots that must go to come down to the low mark, a slice at a time.
                let keep = low_percent * log_slots / 100;
                let slice = used_slots.saturating_sub(keep).min((log_slots / 8).max(1));
                densest_covering(staged, slice, 0)
            }
            Trigger::Density {
                blocks: density,
                together,
            } => {
                // Dense extents wait for company while the log has more than a slice free:
                // under a skewed load one hot extent would otherwise wait for the backstop.
                let ready = staged.iter().filter(|&&(_, n)| n >= density).count();
                let roomy = used_slots * 8 < log_slots * 7;
                if ready == 0 || (roomy && ready < together.min(staged.len())) {
                    return Decision::Nothing;
                }
                // At most a slice of the log per destage (but `together` extents if there
                // are): when many extents reach the density together (uniform random
                // writes fill them alike), one destage of all of them would hold writers
                // for all of it.
                let slice = (log_slots / 8).max(1);
                let (mut chosen, mut covered) = (Vec::new(), 0);
                for (extent, blocks) in densest_first(staged) {
                    if blocks < density || (covered >= slice && chosen.len() >= together) {
                        break;
                    }
                    chosen.push(extent);
                    covered += blocks;
                }
                as_decision(chosen)
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
        let density = Trigger::Density {
            blocks: 8,
            together: 1,
        };
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
            Trigger::Full.decide(100, 100, &[(0, 100)], false),
            Decision::Nothing
        );
        assert_eq!(Trigger::Full.decide(0, 100, &[], false), Decision::Nothing);
    }

    #[test]
    fn watermark_starts_at_high_and_stops_at_low() {
        // 79 % used, no drain on: below high, nothing.
        assert!(!WATERMARK.draining(79, 100, false));
        assert_eq!(
            WATERMARK.decide(79, 100, &[(1, 79)], false),
            Decision::Nothing
        );
        // 80 %: the drain starts, and stays on down to 21 %; at 20 % it stops, and it
        // does not start again below 80 %.
        assert!(WATERMARK.draining(80, 100, false));
        assert!(WATERMARK.draining(21, 100, true));
        assert!(!WATERMARK.draining(20, 100, true));
        assert!(!WATERMARK.draining(50, 100, false));
        // Each destage of the drain is a slice: an eighth of a 1,000-slot log is 125 slots,
        // densest extents first, however far the low mark is.
        let staged = [(1, 100), (2, 400), (3, 300)];
        assert_eq!(
            WATERMARK.decide(800, 1000, &staged, true),
            Decision::Extents(vec![2])
        );
        // Near the low mark, only what it takes to reach it: 210 used, 200 kept, 10 to go.
        let staged = [(5, 150), (6, 60)];
        assert_eq!(
            WATERMARK.decide(210, 1000, &staged, true),
            Decision::Extents(vec![5])
        );
        // The drain off: nothing, even above low.
        assert_eq!(
            WATERMARK.decide(500, 1000, &staged, false),
            Decision::Nothing
        );
    }

    #[test]
    fn density_picks_every_extent_that_fills_a_batch() {
        let trigger = Trigger::Density {
            blocks: 8,
            together: 1,
        };
        let staged = [(4, 7), (9, 8), (2, 30)];
        assert_eq!(
            trigger.decide(45, 1000, &staged, false),
            Decision::Extents(vec![2, 9])
        );
        assert_eq!(trigger.decide(7, 1000, &[(4, 7)], false), Decision::Nothing);
        // At most an eighth of the log per destage: 40 of an 80-slot log's 10 is one extent,
        // the densest; the next destage takes the next.
        assert_eq!(
            trigger.decide(70, 80, &[(4, 30), (9, 40)], false),
            Decision::Extents(vec![9])
        );
    }

    #[test]
    fn density_waits_until_enough_extents_fill_a_batch_to_keep_several_in_flight() {
        let trigger = Trigger::Density {
            blocks: 8,
            together: 4,
        };
        // Three extents at the density, five staged: the fourth is awaited.
        let staged = [(1, 9), (2, 8), (3, 12), (4, 2), (5, 7)];
        assert_eq!(trigger.decide(38, 1000, &staged, false), Decision::Nothing);
        // Four: all four go, densest first.
        let staged = [(1, 9), (2, 8), (3, 12), (4, 2), (5, 8)];
        assert_eq!(
            trigger.decide(39, 1000, &staged, false),
            Decision::Extents(vec![3, 1, 2, 5])
        );
        // Fewer extents staged than four, every one at the density: they go.
        let staged = [(1, 9), (2, 8)];
        assert_eq!(
            trigger.decide(17, 1000, &staged, false),
            Decision::Extents(vec![1, 2])
        );
        // ... but not while one of them is below it.
        let staged = [(1, 9), (2, 7)];
        assert_eq!(trigger.decide(16, 1000, &staged, false), Decision::Nothing);
        // Four go even when fewer would cover the slice (an eighth of the log, 12 here).
        let staged = [(1, 20), (2, 20), (3, 20), (4, 20), (5, 20)];
        assert_eq!(
            trigger.decide(100, 100, &staged, false),
            Decision::Extents(vec![1, 2, 3, 4])
        );
        // From 7/8 full on, a dense extent goes alone (a skewed load's one hot extent).
        let staged = [(1, 9), (2, 7)];
        assert_eq!(
            trigger.decide(875, 1000, &staged, false),
            Decision::Extents(vec![1])
        );
        assert_eq!(trigger.decide(874, 1000, &staged, false), Decision::Nothing);
    }

    #[test]
    fn densest_first_breaks_ties_by_extent() {
        let sorted = densest_first(&[(3, 5), (1, 5), (2, 9)]);
        assert_eq!(sorted, vec![(2, 9), (1, 5), (3, 5)]);
    }
}
