//! Pure decisions of assembly: which member's metadata copy the array opens from, whether
//! it may be created, and what each member is at the start. Kept apart from I/O so each rule
//! is pinned by worked examples (the same rules as the mirror's `policy::choose_copy`).

use super::members::MemberState;
use crate::refusal::Refusal;

/// What one member's metadata region looked like, read only, at assembly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Copy {
    /// The member is absent.
    Missing,
    /// No superblock and the whole region reads as zeros: never written.
    Blank,
    /// Unusable: recovery refused, no superblock over a non-zero region, no raid5 record, or
    /// another array's or another layer's store. Never created over.
    Damaged(String),
    Valid {
        uuid: [u8; 16],
        next_txn: u64,
        /// The copy's record of every member: state and rebuild checkpoint.
        states: Vec<(MemberState, u64)>,
    },
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Every member present and blank, and the policy allows it: create the array.
    Create,
    /// Open from this member's copy.
    Open(usize),
}

/// Whether a copy's record of a member says that member missed writes: failed, or a
/// replacement that had not received any rebuild yet.
fn records_failed(state: Option<&(MemberState, u64)>) -> bool {
    matches!(
        state,
        Some((MemberState::Failed, _)) | Some((MemberState::Rebuilding, 0))
    )
}

fn recorded(copies: &[Copy], j: usize, i: usize) -> Option<&(MemberState, u64)> {
    match &copies[j] {
        Copy::Valid { states, .. } => states.get(i),
        _ => None,
    }
}

/// Chooses the copy to open from:
/// - copies of two different arrays: refuse (the configuration names a stranger);
/// - a copy recording its own slot failed: the members were reordered (a member's failure
///   is recorded only on the others): refuse;
/// - a copy another valid copy records failed is stale and never chosen; two copies that
///   record each other failed are a split brain: refuse, naming both;
/// - among the rest, the most transactions recovered (`next_txn`; every open commits one)
///   wins, ties to the lowest index;
/// - no valid copy: create only if every member is present and blank and `may_format`; any
///   damaged copy refuses (never created over).
pub fn choose(copies: &[Copy], may_format: bool) -> Result<Choice, Refusal> {
    let valid: Vec<usize> = (0..copies.len())
        .filter(|&i| matches!(copies[i], Copy::Valid { .. }))
        .collect();
    let uuid = |i: usize| match &copies[i] {
        Copy::Valid { uuid, .. } => *uuid,
        _ => unreachable!("valid"),
    };
    if let Some(w) = valid.windows(2).find(|w| uuid(w[0]) != uuid(w[1])) {
        return Err(Refusal::from(format!(
            "members {} and {} hold metadata of two different arrays",
            w[0], w[1]
        )));
    }
    if let Some(&i) = valid
        .iter()
        .find(|&&i| matches!(recorded(copies, i, i), Some((MemberState::Failed, _))))
    {
        return Err(Refusal::from(format!(
            "member {i}'s metadata records its own slot as failed: the members were reordered \
             or a disk moved between slots; configure them in their original order"
        )));
    }
    let failed_by = |i: usize, j: usize| j != i && records_failed(recorded(copies, j, i));
    for &i in &valid {
        for &j in valid.iter().filter(|&&j| j > i) {
            if failed_by(i, j) && failed_by(j, i) {
                return Err(Refusal::from(format!(
                    "split brain: members {i} and {j} each record the other as failed, so \
                     each may hold writes the other lacks; assemble without the one to drop \
                     (--degraded), then re-add it with `strata replace`"
                )));
            }
        }
    }
    let next_txn = |i: usize| match &copies[i] {
        Copy::Valid { next_txn, .. } => *next_txn,
        _ => unreachable!("valid"),
    };
    let best = valid
        .iter()
        .copied()
        .filter(|&i| !valid.iter().any(|&j| failed_by(i, j)))
        .fold(None, |best: Option<usize>, i| match best {
            Some(b) if next_txn(b) >= next_txn(i) => Some(b),
            _ => Some(i),
        });
    if let Some(i) = best {
        return Ok(Choice::Open(i));
    }
    if !valid.is_empty() {
        return Err(Refusal::from(format!(
            "split brain: every present copy (members {valid:?}) is recorded as failed by \
             another; assemble the one to keep with --degraded and re-add the others with \
             `strata replace`"
        )));
    }
    if let Some((i, why)) = copies.iter().enumerate().find_map(|(i, c)| match c {
        Copy::Damaged(why) => Some((i, why)),
        _ => None,
    }) {
        return Err(Refusal::Damaged(format!(
            "no readable metadata copy, and member {i}'s is damaged ({why}); refusing to \
             create an array over it: run `strata check`"
        )));
    }
    if copies.contains(&Copy::Missing) {
        return Err(Refusal::Refused(
            "no member holds raid5 metadata and a member is missing: a new array needs every \
             member present"
                .into(),
        ));
    }
    if !may_format {
        return Err(Refusal::Refused(
            "the disks are labelled as holding this hierarchy but no member has raid5 metadata \
             (zeroed, or never written); if this is a new layer, start it with \
             `strata serve --format LAYER`"
                .into(),
        ));
    }
    Ok(Choice::Create)
}

/// Member states (with rebuild checkpoints) at the start, and the members this start takes
/// out (to be recorded failed, with a warning).
pub type Start = (Vec<(MemberState, u64)>, Vec<usize>);

/// Member states at the start, from the chosen copy's record:
/// - recorded failed: failed, whatever its disk holds (it returns through `strata replace`);
/// - recorded active or rebuilding but missing, or without a valid copy of this array: it
///   is out. An active one out means starting degraded: only with `allow_degraded`;
/// - more than one member out (a rebuilding one counts) because of this start: the array
///   could not serve its data; refused, since starting would record the failures and fail
///   the array for good.
///
/// Returns the states and the members newly out (to be recorded failed, with a warning).
pub fn member_states(
    record: &[(MemberState, u64)],
    copies: &[Copy],
    allow_degraded: bool,
) -> Result<Start, String> {
    let mut states = record.to_vec();
    let mut newly_out = Vec::new();
    let mut active_out = Vec::new();
    for (i, state) in states.iter_mut().enumerate() {
        let usable = matches!(copies.get(i), Some(Copy::Valid { .. }));
        if state.0 != MemberState::Failed && !usable {
            if state.0 == MemberState::Active {
                active_out.push(i);
            }
            newly_out.push(i);
            *state = (MemberState::Failed, 0);
        }
    }
    let out: Vec<usize> = (0..states.len())
        .filter(|&i| states[i].0 == MemberState::Failed)
        .collect();
    let rebuilding = states
        .iter()
        .filter(|s| s.0 == MemberState::Rebuilding)
        .count();
    // Only a start that would record a new failure is refused: an array already recorded
    // with two members out opens as it was left (failed), which changes nothing on disk.
    if !newly_out.is_empty() && out.len() + rebuilding > 1 {
        let list: Vec<String> = out.iter().map(|i| format!("member {i}")).collect();
        return Err(format!(
            "{} unusable (missing, damaged or recorded failed){}: one member short is the \
             most raid5 can serve; nothing was written; bring the missing members back",
            list.join(", "),
            if rebuilding > 0 {
                ", and a member is still rebuilding"
            } else {
                ""
            }
        ));
    }
    if !active_out.is_empty() && !allow_degraded {
        let list: Vec<String> = active_out.iter().map(|i| format!("member {i}")).collect();
        return Err(format!(
            "{} missing or unreadable, and the newest metadata records it working; starting \
             without it needs `--degraded` (it will be marked failed)",
            list.join(", ")
        ));
    }
    Ok((states, newly_out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemberState::{Active, Failed, Rebuilding};

    fn valid(next_txn: u64, states: &[MemberState]) -> Copy {
        Copy::Valid {
            uuid: [7; 16],
            next_txn,
            states: states.iter().map(|&s| (s, 0)).collect(),
        }
    }

    #[test]
    fn the_newest_copy_not_recorded_failed_wins() {
        let all = [Active, Active, Active];
        assert_eq!(
            choose(&[valid(5, &all), valid(6, &all), valid(6, &all)], false),
            Ok(Choice::Open(1))
        );
        // Member 2 went on alone (newest), but 0 records it failed: 0 wins.
        let copies = [
            valid(5, &[Active, Active, Failed]),
            Copy::Missing,
            valid(9, &all),
        ];
        assert_eq!(choose(&copies, false), Ok(Choice::Open(0)));
        // A damaged copy is outvoted by a valid one.
        let copies = [Copy::Damaged("crc".into()), valid(3, &all), valid(3, &all)];
        assert_eq!(choose(&copies, false), Ok(Choice::Open(1)));
    }

    #[test]
    fn split_brains_strangers_and_reorders_are_refused() {
        let a = valid(5, &[Active, Failed, Active]);
        let b = valid(9, &[Failed, Active, Active]);
        let error = choose(&[a, b, Copy::Missing], true).unwrap_err();
        assert!(
            error.contains("split brain") && error.contains("members 0 and 1"),
            "{error}"
        );
        let other = Copy::Valid {
            uuid: [8; 16],
            next_txn: 1,
            states: vec![],
        };
        assert!(choose(&[valid(1, &[Active; 3]), other], true)
            .unwrap_err()
            .contains("two different arrays"));
        assert!(choose(&[valid(1, &[Failed, Active, Active])], true)
            .unwrap_err()
            .contains("reordered"));
    }

    #[test]
    fn creates_only_on_all_blank_members_with_the_policy() {
        let blank = [Copy::Blank, Copy::Blank, Copy::Blank];
        assert_eq!(choose(&blank, true), Ok(Choice::Create));
        assert!(choose(&blank, false)
            .unwrap_err()
            .contains("strata serve --format"));
        let damaged = [Copy::Blank, Copy::Damaged("crc".into()), Copy::Blank];
        let refused = choose(&damaged, true).unwrap_err();
        assert!(refused.contains("strata check"));
        assert!(matches!(
            refused.error("raid5 r"),
            strata_core::BlockError::Corrupt(_)
        ));
        assert!(matches!(
            choose(&blank, false).unwrap_err().error("raid5 r"),
            strata_core::BlockError::InvalidArgument(_)
        ));
        assert!(choose(&[Copy::Blank, Copy::Blank, Copy::Missing], true).is_err());
    }

    #[test]
    fn members_out_need_the_flag_and_two_out_are_refused() {
        let record = [(Active, 0), (Active, 0), (Failed, 0)];
        let present = [valid(1, &[]), valid(1, &[]), valid(1, &[])];
        // The recorded-failed member stays failed though its copy is fine.
        let (states, out) = member_states(&record, &present, false).unwrap();
        assert_eq!(states[2].0, Failed);
        assert!(out.is_empty());
        // One active member missing: flag needed.
        let record = [(Active, 0); 3];
        let copies = [valid(1, &[]), Copy::Missing, valid(1, &[])];
        let error = member_states(&record, &copies, false).unwrap_err();
        assert!(
            error.contains("member 1") && error.contains("--degraded"),
            "{error}"
        );
        let (states, out) = member_states(&record, &copies, true).unwrap();
        assert_eq!(states[1].0, Failed);
        assert_eq!(out, vec![1]);
        // A damaged copy counts as out too.
        let copies = [valid(1, &[]), Copy::Damaged("x".into()), valid(1, &[])];
        assert!(member_states(&record, &copies, false).is_err());
        // Two out: refused whatever the flag.
        let record = [(Active, 0), (Active, 0), (Failed, 0)];
        let copies = [Copy::Missing, valid(1, &[]), valid(1, &[])];
        let error = member_states(&record, &copies, true).unwrap_err();
        assert!(
            error.contains("member 0") && error.contains("member 2"),
            "{error}"
        );
        // A rebuilding member missing drops out without the flag.
        let record = [(Active, 0), (Active, 0), (Rebuilding, 4)];
        let copies = [valid(1, &[]), valid(1, &[]), Copy::Missing];
        let (states, out) = member_states(&record, &copies, false).unwrap();
        assert_eq!(states[2].0, Failed);
        assert_eq!(out, vec![2]);
    }
}
