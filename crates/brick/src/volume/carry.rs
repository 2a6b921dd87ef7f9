//! Commits carried by the next prepare. Once every brick voted yes on an interval, the host
//! reports it ended and owes each brick its commit (Sinfonia's rule,
//! `strata_cluster::interval`). Sent alone, that commit costs each brick a call and a
//! durable metadata write of its own, beside the next interval's prepare, which costs the
//! same again. So a commit first waits, for at most [`LINGER`], for the next prepare to the
//! same brick to take it: the brick applies it before that prepare and makes both durable
//! with one write (`BrickStore::prepare_carrying`). A commit no prepare took in time, or one
//! a prepare took but the brick did not answer for, is sent alone, as before.
//!
//! Nothing waits for a lingering commit without saying so: whoever waits for intervals in
//! flight to land (a read or an interval over their units, an unlock, the gate taken alone)
//! marks itself waiting in `Flights`, and the commits then go at once.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use strata_cluster::interval::IntervalId;
use tokio::sync::oneshot;

/// How long a commit waits for a prepare to carry it: long enough for a client writing
/// without pause to send its next interval (one writer of 1 MiB intervals sends one about
/// every millisecond here), short against what a reader of the data on another host waits.
pub(super) const LINGER: Duration = Duration::from_millis(2);

/// What became of a commit handed to a prepare: `Some(accepted)` as the brick answered for
/// it; `None` when it did not (the call failed, or the brick takes no carried commits), and
/// the commit must be sent alone.
pub(super) type Carried = Option<bool>;

/// A commit waiting to be carried, and where its answer goes.
type Waiter = (IntervalId, oneshot::Sender<Carried>);

/// Commits waiting for a prepare to carry them, per brick, in the order they were decided.
#[derive(Default)]
pub(super) struct Outbox {
    queued: Mutex<BTreeMap<usize, Vec<Waiter>>>,
}

/// The commits one prepare carries to one brick, answered when the prepare is.
pub(super) struct Taken {
    waiting: Vec<Waiter>,
}

impl Taken {
    pub(super) fn ids(&self) -> Vec<IntervalId> {
        self.waiting.iter().map(|(id, _)| *id).collect()
    }

    /// The brick's answer for each commit (`None`: it gave none).
    pub(super) fn answer(self, committed: Option<&Vec<bool>>) {
        for (i, (_, waiter)) in self.waiting.into_iter().enumerate() {
            // The land task may have given up waiting; then nothing needs the answer.
            let _ = waiter.send(committed.and_then(|c| c.get(i).copied()));
        }
    }
}

impl Outbox {
    /// Queues the commit of `id` for `brick`; the receiver gets what a prepare made of it.
    pub(super) fn queue(&self, brick: usize, id: IntervalId) -> oneshot::Receiver<Carried> {
        let (sender, receiver) = oneshot::channel();
        let mut queued = self.queued.lock().unwrap();
        queued.entry(brick).or_default().push((id, sender));
        receiver
    }

    /// Takes every commit queued for `brick`, for the prepare about to be sent to it.
    pub(super) fn take(&self, brick: usize) -> Option<Taken> {
        let waiting = self.queued.lock().unwrap().remove(&brick)?;
        Some(Taken { waiting })
    }

    /// Takes back the commit of `id` for `brick` if no prepare has taken it: true when it
    /// was still queued, and the caller now sends it alone.
    pub(super) fn take_back(&self, brick: usize, id: IntervalId) -> bool {
        let mut queued = self.queued.lock().unwrap();
        let Some(list) = queued.get_mut(&brick) else {
            return false;
        };
        let Some(at) = list.iter().position(|(queued, _)| *queued == id) else {
            return false;
        };
        list.remove(at);
        if list.is_empty() {
            queued.remove(&brick);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> IntervalId {
        IntervalId { client: 1, seq }
    }

    #[tokio::test]
    async fn a_prepare_takes_the_queued_commits_of_its_brick_in_order_and_answers_each() {
        let outbox = Outbox::default();
        let one = outbox.queue(0, id(1));
        let two = outbox.queue(0, id(2));
        let other = outbox.queue(1, id(2));
        let taken = outbox.take(0).expect("two queued for brick 0");
        assert_eq!(taken.ids(), vec![id(1), id(2)]);
        assert!(outbox.take(0).is_none(), "taken once");
        taken.answer(Some(&vec![true, false]));
        assert_eq!(one.await.unwrap(), Some(true));
        assert_eq!(two.await.unwrap(), Some(false));
        // Brick 1's commit is still queued: taken back, it is sent alone.
        assert!(outbox.take_back(1, id(2)));
        assert!(!outbox.take_back(1, id(2)));
        drop(other);
    }

    #[tokio::test]
    async fn a_commit_taken_by_a_prepare_cannot_be_taken_back_and_no_answer_means_send_it_alone() {
        let outbox = Outbox::default();
        let one = outbox.queue(3, id(7));
        let taken = outbox.take(3).unwrap();
        assert!(!outbox.take_back(3, id(7)), "the prepare has it");
        taken.answer(None);
        assert_eq!(one.await.unwrap(), None);
    }
}
