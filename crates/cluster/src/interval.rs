//! Consistency intervals (RIBD §2.5): a client's group of block writes across bricks that
//! either all become visible, on every brick, or none do, whatever fails.
//!
//! The protocol, as pure state machines (the network, the clocks and the disks are the
//! caller's, so the server, the simulator and the tests run the same code):
//! 1. At `end`, the client sends each brick the interval touches a **prepare** with that
//!    brick's writes and the list of every brick involved. A brick records the prepare
//!    durably in its log before it votes yes; nothing of it is visible yet.
//! 2. **The interval is committed once every brick has voted yes**, unless an abort is
//!    durable on one of them (Sinfonia's rule, Aguilera et al., SOSP 2007). The client
//!    reports it ended then, and sends **commit** to each brick after, off the interval's
//!    path: a brick records the decision durably and makes the writes visible. Any refusal
//!    or silence before every yes: the client sends **abort**, and reports the interval
//!    aborted only once a brick has acknowledged that abort (made it durable). Until then the
//!    interval may still land whole: a brick that voted yes in a reply the client never got
//!    holds it prepared, and if every brick does, it is committed.
//! 3. **In doubt.** A brick holding a prepare with no decision (the client died, or went
//!    silent) may decide it only once the client is fenced (its lease ran out, so no message
//!    of it is taken any more, prepares included). It asks the other bricks of the interval
//!    ([`resolve`]): one that aborted, or never prepared, means abort (no brick can prepare
//!    it any more, so the client never had every yes); every one prepared or committed means
//!    commit (the client may have had every yes, and reported it ended).
//!
//! Unlike RIBD, a brick votes yes only once its prepare is durable, and acknowledges an abort
//! only once it is durable, so what the client reports survives any crash (RIBD acknowledged
//! before the data reached the disk, to save time in the commit). RIBD kept the commit on the
//! interval's path; Sinfonia's rule takes it off, so an interval costs one round trip and one
//! durable write per brick.

use std::collections::{BTreeMap, BTreeSet};

/// An interval: the client that runs it and its sequence number (monotone per client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IntervalId {
    pub client: u64,
    pub seq: u64,
}

/// A brick, by index in the cluster's list.
pub type Brick = usize;

/// One block written: address and contents (a token of them, for the state machine).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub block: u64,
    pub value: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Commit,
    Abort,
}

/// What a brick's log records of an interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Prepared, undecided: the writes and every brick of the interval.
    Prepared {
        writes: Vec<Write>,
        bricks: Vec<Brick>,
    },
    Decided(Decision),
}

impl Entry {
    pub fn status(&self) -> Status {
        match self {
            Entry::Prepared { .. } => Status::Prepared,
            Entry::Decided(decision) => Status::Decided(*decision),
        }
    }
}

/// Where an interval stands on one brick, without its writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Prepared,
    Decided(Decision),
}

/// What a brick does with a prepare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepareAction {
    /// Record it durably, then vote yes.
    Record,
    /// Already prepared (the client sent it again): vote yes again, keep the first.
    Repeat,
    /// Already decided: vote no. An abort resolved before a late prepare arrived must stay
    /// an abort, and a committed interval is not prepared twice.
    Refuse,
}

/// The brick's rule for a prepare, from what its log says of the interval (`None`: nothing).
pub fn prepare_action(status: Option<Status>) -> PrepareAction {
    match status {
        None => PrepareAction::Record,
        Some(Status::Prepared) => PrepareAction::Repeat,
        Some(Status::Decided(_)) => PrepareAction::Refuse,
    }
}

/// What a brick does with a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecideAction {
    /// Commit of a prepared interval: record the decision durably, make its writes visible.
    Apply,
    /// Abort of a prepared interval: record the decision, drop its writes.
    Drop,
    /// Abort of an interval this brick never prepared: remember it, so a late prepare is
    /// refused.
    Remember,
    /// Already decided: acknowledged if it is the same decision, refused if not.
    Repeat { same: bool },
    /// Commit of an interval this brick never prepared: refused, nothing changes.
    Refuse,
}

/// The brick's rule for a decision, from what its log says of the interval.
pub fn decide_action(status: Option<Status>, decision: Decision) -> DecideAction {
    match (status, decision) {
        (Some(Status::Prepared), Decision::Commit) => DecideAction::Apply,
        (Some(Status::Prepared), Decision::Abort) => DecideAction::Drop,
        (Some(Status::Decided(done)), _) => DecideAction::Repeat {
            same: done == decision,
        },
        (None, Decision::Abort) => DecideAction::Remember,
        (None, Decision::Commit) => DecideAction::Refuse,
    }
}

/// A brick's side: its durable log of intervals and the blocks visible on it.
#[derive(Clone, Debug, Default)]
pub struct Participant {
    log: BTreeMap<IntervalId, Entry>,
    visible: BTreeMap<u64, u64>,
}

impl Participant {
    /// Records the prepare and votes yes, or no if the interval was already decided (an
    /// abort resolved before a late prepare arrived must stay an abort).
    pub fn prepare(&mut self, id: IntervalId, writes: Vec<Write>, bricks: Vec<Brick>) -> bool {
        match prepare_action(self.log.get(&id).map(Entry::status)) {
            PrepareAction::Record => {
                self.log.insert(id, Entry::Prepared { writes, bricks });
                true
            }
            PrepareAction::Repeat => true,
            PrepareAction::Refuse => false,
        }
    }

    /// Applies a decision: a commit makes the prepared writes visible. Returns false for a
    /// commit of an interval this brick never prepared (or aborted): refused, nothing changes.
    pub fn decide(&mut self, id: IntervalId, decision: Decision) -> bool {
        match decide_action(self.log.get(&id).map(Entry::status), decision) {
            DecideAction::Apply => {
                if let Some(Entry::Prepared { writes, .. }) = self.log.get(&id) {
                    for w in writes.clone() {
                        self.visible.insert(w.block, w.value);
                    }
                }
                self.log.insert(id, Entry::Decided(Decision::Commit));
                true
            }
            DecideAction::Drop | DecideAction::Remember => {
                self.log.insert(id, Entry::Decided(Decision::Abort));
                true
            }
            DecideAction::Repeat { same } => same,
            DecideAction::Refuse => false,
        }
    }

    /// What this brick's log says of `id`.
    pub fn entry(&self, id: IntervalId) -> Option<&Entry> {
        self.log.get(&id)
    }

    /// Intervals prepared and undecided here.
    pub fn in_doubt(&self) -> Vec<IntervalId> {
        (self.log.iter())
            .filter(|(_, e)| matches!(e, Entry::Prepared { .. }))
            .map(|(&id, _)| id)
            .collect()
    }

    /// The blocks visible on this brick.
    pub fn visible(&self) -> &BTreeMap<u64, u64> {
        &self.visible
    }
}

/// How an in-doubt interval ends, from what each of its bricks' logs says (`None` for a
/// brick that has no entry for it). Call only once the client is fenced: while it may still
/// send a commit, an all-prepared interval is not the bricks' to abort.
pub fn resolve(entries: &[Option<&Entry>]) -> Decision {
    let statuses: Vec<Option<Status>> = entries.iter().map(|e| e.map(Entry::status)).collect();
    resolve_statuses(&statuses)
}

/// [`resolve`] from each brick's status alone, as a brick asking its peers over the network
/// gets them. Every brick of the interval must have answered: a brick that did not answer is
/// not a brick that never prepared.
pub fn resolve_statuses(statuses: &[Option<Status>]) -> Decision {
    let committed = statuses.contains(&Some(Status::Decided(Decision::Commit)));
    let aborted = (statuses.iter())
        .any(|status| matches!(status, None | Some(Status::Decided(Decision::Abort))));
    if committed || !aborted {
        // A brick committed it, or every brick holds it prepared: the client may have had
        // every yes and reported the interval ended.
        Decision::Commit
    } else {
        // Someone aborted, or never prepared and now never will (the client is fenced): the
        // client never had every yes, so it never reported the interval ended.
        Decision::Abort
    }
}

/// The client's side of one interval at `end`.
#[derive(Clone, Debug)]
pub struct Coordinator {
    pub id: IntervalId,
    /// Each brick's writes.
    pub writes: BTreeMap<Brick, Vec<Write>>,
    votes: BTreeMap<Brick, bool>,
    acks: BTreeSet<Brick>,
    decision: Option<Decision>,
}

impl Coordinator {
    pub fn new(id: IntervalId, writes: BTreeMap<Brick, Vec<Write>>) -> Self {
        assert!(!writes.is_empty(), "an interval writes somewhere");
        Coordinator {
            id,
            writes,
            votes: BTreeMap::new(),
            acks: BTreeSet::new(),
            decision: None,
        }
    }

    pub fn bricks(&self) -> Vec<Brick> {
        self.writes.keys().copied().collect()
    }

    /// A brick's vote arrived. Returns the decision once it is made: commit when every brick
    /// voted yes, abort at the first no.
    pub fn vote(&mut self, brick: Brick, yes: bool) -> Option<Decision> {
        self.votes.insert(brick, yes);
        if self.decision.is_none() {
            if !yes {
                self.decision = Some(Decision::Abort);
            } else if self.writes.keys().all(|b| self.votes.get(b) == Some(&true)) {
                self.decision = Some(Decision::Commit);
            }
        }
        self.decision
    }

    /// The client gives up waiting (a brick is silent): abort, unless commit was decided.
    pub fn give_up(&mut self) -> Decision {
        *self.decision.get_or_insert(Decision::Abort)
    }

    pub fn decision(&self) -> Option<Decision> {
        self.decision
    }

    /// A brick acknowledged the decision. Returns true once every brick has: nothing of the
    /// interval is owed any more, and the bricks may be told to forget it.
    pub fn acked(&mut self, brick: Brick) -> bool {
        self.acks.insert(brick);
        self.writes.keys().all(|b| self.acks.contains(b))
    }

    /// What the client may report of the interval so far: committed as soon as every brick
    /// voted yes (before any commit is sent); aborted only once a brick has acknowledged the
    /// abort, which makes it durable there (before that, every brick may hold it prepared).
    pub fn reportable(&self) -> Option<Decision> {
        match self.decision? {
            Decision::Commit => Some(Decision::Commit),
            Decision::Abort => (!self.acks.is_empty()).then_some(Decision::Abort),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> IntervalId {
        IntervalId { client: 1, seq }
    }

    #[test]
    fn a_commit_makes_the_prepared_writes_visible_and_an_abort_drops_them() {
        let mut p = Participant::default();
        assert!(p.prepare(id(1), vec![Write { block: 7, value: 1 }], vec![0, 1]));
        assert!(p.visible().is_empty(), "prepared is not visible");
        assert!(p.decide(id(1), Decision::Commit));
        assert_eq!(p.visible().get(&7), Some(&1));
        assert!(p.prepare(id(2), vec![Write { block: 8, value: 2 }], vec![0]));
        assert!(p.decide(id(2), Decision::Abort));
        assert!(!p.visible().contains_key(&8));
        // A late prepare of an aborted interval is refused; a commit never prepared too.
        assert!(!p.prepare(id(2), vec![Write { block: 8, value: 2 }], vec![0]));
        assert!(!p.decide(id(3), Decision::Commit));
    }

    #[test]
    fn an_in_doubt_interval_commits_unless_a_brick_aborted_or_never_prepared() {
        let prepared = Entry::Prepared {
            writes: vec![],
            bricks: vec![0, 1],
        };
        let committed = Entry::Decided(Decision::Commit);
        let aborted = Entry::Decided(Decision::Abort);
        assert_eq!(
            resolve(&[Some(&prepared), Some(&committed)]),
            Decision::Commit
        );
        // Every brick prepared: the client may have had every yes and reported it ended.
        assert_eq!(
            resolve(&[Some(&prepared), Some(&prepared)]),
            Decision::Commit
        );
        assert_eq!(resolve(&[Some(&prepared), None]), Decision::Abort);
        assert_eq!(resolve(&[Some(&prepared), Some(&aborted)]), Decision::Abort);
    }

    #[test]
    fn a_commit_is_reportable_at_the_last_yes_and_an_abort_at_its_first_ack() {
        let writes = BTreeMap::from([(0, vec![]), (1, vec![])]);
        let mut commit = Coordinator::new(id(1), writes.clone());
        assert_eq!(commit.vote(0, true), None);
        assert_eq!(commit.reportable(), None);
        assert_eq!(commit.vote(1, true), Some(Decision::Commit));
        assert_eq!(
            commit.reportable(),
            Some(Decision::Commit),
            "before any commit is sent"
        );
        let mut abort = Coordinator::new(id(2), writes);
        assert_eq!(abort.vote(0, true), None);
        assert_eq!(abort.give_up(), Decision::Abort);
        assert_eq!(
            abort.reportable(),
            None,
            "brick 1 may have voted yes unheard"
        );
        assert!(!abort.acked(0));
        assert_eq!(abort.reportable(), Some(Decision::Abort));
    }
}
