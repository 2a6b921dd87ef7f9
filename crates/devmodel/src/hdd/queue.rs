//! The drive's command queue policy: which queued command to serve next. The mechanics
//! (how long positioning takes) live with the drive; this module only chooses.

/// How the drive orders the commands queued at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheduler {
    /// Arrival order: what a drive does at queue depth 1, or with queueing disabled.
    Fifo,
    /// Shortest positioning time first (seek plus rotational wait), the firmware scheduler
    /// Proximal I/O relies on (§2, ref [34]).
    Sptf,
}

/// The index in `queued` (held in arrival order) of the command to serve next.
/// `positioning` gives a command's positioning time from the current head state.
/// SPTF breaks ties by arrival, so the choice is deterministic.
pub fn pick<T>(
    scheduler: Scheduler,
    queued: &[T],
    mut positioning: impl FnMut(&T) -> u64,
) -> usize {
    assert!(!queued.is_empty(), "nothing queued to pick from");
    match scheduler {
        Scheduler::Fifo => 0,
        Scheduler::Sptf => {
            let mut best = (u64::MAX, 0);
            for (index, command) in queued.iter().enumerate() {
                let cost = positioning(command);
                if cost < best.0 {
                    best = (cost, index);
                }
            }
            best.1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_takes_the_oldest_and_sptf_the_cheapest() {
        let costs = [5u64, 3, 9, 3];
        assert_eq!(pick(Scheduler::Fifo, &costs, |&c| c), 0);
        // Two commands cost 3: the older one wins.
        assert_eq!(pick(Scheduler::Sptf, &costs, |&c| c), 1);
    }
}
