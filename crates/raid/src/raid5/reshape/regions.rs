//! Where a user request's chunk lives during a grow (ALV paper §2.1, §2.3; Fig. 8).
//!
//! Three positions split the volume: `ckpt` (persisted: every chunk below it is in the new
//! geometry), `moved` (every chunk below it has been copied, durable or not) and the
//! in-flight aggregation window, which starts at `moved`. Crash safety rests on two facts:
//! the copy of a chunk in [ckpt, moved) never overwrote its original (the row rule of
//! `window`), so after a crash the originals are current; and that stays true only while
//! nobody writes the new copy, which is why a write there must checkpoint first (ALV) or
//! wait for the checkpoint (MD).

/// Which copy of a chunk serves a user request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// Below the checkpoint: new geometry only.
    New,
    /// In the aggregation window being moved: block until it completes (§2.5).
    InFlight,
    /// Copied but not checkpointed: both copies are valid. Reads use the new one; writes
    /// need the checkpoint first (the policy says whether to force it or wait for it).
    MovedUnrecorded,
    /// Not moved yet: old geometry.
    Old,
}

/// Which geometry a request reads from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Old,
    New,
}

impl Region {
    /// Where a read goes, or None when it must wait for the in-flight window.
    pub fn read_from(self) -> Option<Placement> {
        match self {
            Region::New | Region::MovedUnrecorded => Some(Placement::New),
            Region::Old => Some(Placement::Old),
            Region::InFlight => None,
        }
    }
}

/// The region of `chunk`, given the checkpoint, the move frontier and the window in flight
/// (which must start at `moved`: a window is recorded as moved only once it is complete).
pub fn region(chunk: u64, ckpt: u64, moved: u64, inflight: Option<(u64, u64)>) -> Region {
    assert!(
        ckpt <= moved,
        "checkpoint {ckpt} is ahead of the moved data {moved}"
    );
    if let Some((lo, hi)) = inflight {
        assert_eq!(
            lo, moved,
            "the window in flight starts where the moved data end"
        );
        assert!(lo < hi, "empty window in flight");
    }
    if chunk < ckpt {
        Region::New
    } else if inflight.is_some_and(|(lo, hi)| (lo..hi).contains(&chunk)) {
        Region::InFlight
    } else if chunk < moved {
        Region::MovedUnrecorded
    } else {
        Region::Old
    }
}

/// The lazy-checkpoint rule at a window boundary (Fig. 8, State 1 → 2): checkpoint before
/// moving a window that would end past the current sliding window, or when the current
/// checkpoint opens none (the critical section).
pub fn checkpoint_before(next_window_hi: u64, sliding_end: Option<u64>) -> bool {
    sliding_end.is_none_or(|end| next_window_hi > end)
}

/// The lazy-checkpoint rule for a user write (Fig. 8, State 3 → 4): a write into copied
/// but unrecorded data would leave the new copy as the only current one, which a crash
/// before the checkpoint would lose (the originals would be used).
pub fn write_needs_checkpoint(chunk: u64, ckpt: u64, moved: u64) -> bool {
    assert!(
        ckpt <= moved,
        "checkpoint {ckpt} is ahead of the moved data {moved}"
    );
    (ckpt..moved).contains(&chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sliding window 18..27 of S(3,1,18) (Fig. 4) with 6-chunk aggregation: 18..24
    /// copied but not recorded, 24..27 in flight.
    #[test]
    fn regions_split_at_ckpt_moved_and_the_window() {
        let at = |chunk| region(chunk, 18, 24, Some((24, 27)));
        assert_eq!(at(0), Region::New);
        assert_eq!(at(17), Region::New);
        assert_eq!(at(18), Region::MovedUnrecorded);
        assert_eq!(at(23), Region::MovedUnrecorded);
        assert_eq!(at(24), Region::InFlight);
        assert_eq!(at(26), Region::InFlight);
        assert_eq!(at(27), Region::Old);
        assert_eq!(region(24, 18, 24, None), Region::Old);
        assert_eq!(region(18, 18, 18, None), Region::Old);
    }

    #[test]
    fn reads_use_the_new_copy_once_moved_and_wait_in_flight() {
        assert_eq!(Region::New.read_from(), Some(Placement::New));
        assert_eq!(Region::MovedUnrecorded.read_from(), Some(Placement::New));
        assert_eq!(Region::Old.read_from(), Some(Placement::Old));
        assert_eq!(Region::InFlight.read_from(), None);
    }

    #[test]
    fn writes_need_a_checkpoint_only_between_ckpt_and_moved() {
        assert!(!write_needs_checkpoint(17, 18, 24));
        assert!(write_needs_checkpoint(18, 18, 24));
        assert!(write_needs_checkpoint(23, 18, 24));
        assert!(!write_needs_checkpoint(24, 18, 24));
        assert!(!write_needs_checkpoint(18, 18, 18), "nothing unrecorded");
        for chunk in 0..40 {
            let unrecorded = region(chunk, 18, 24, None) == Region::MovedUnrecorded;
            assert_eq!(write_needs_checkpoint(chunk, 18, 24), unrecorded, "{chunk}");
        }
    }

    #[test]
    fn checkpoint_before_a_window_past_the_sliding_end() {
        assert!(!checkpoint_before(27, Some(27)));
        assert!(checkpoint_before(30, Some(27)));
        assert!(!checkpoint_before(24, Some(27)));
        assert!(
            checkpoint_before(3, None),
            "no window opened: checkpoint first"
        );
    }

    #[test]
    #[should_panic(expected = "starts where the moved data end")]
    fn a_window_in_flight_must_start_at_moved() {
        region(20, 18, 24, Some((21, 27)));
    }
}
