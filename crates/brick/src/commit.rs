//! A client's two-phase commit of one interval over the network: the decision logic is
//! `strata_cluster::interval::Coordinator`'s, the messages go over the brick service.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures_util::future::join_all;
use strata_cluster::interval::{Coordinator, Decision, IntervalId};

use crate::participant::Participant;
use crate::rpc::RpcError;
use crate::store::Vote;

/// Part of a brick's refusal of a prepare that overlaps another client's interval it holds
/// undecided: not a failure, the client waits until that interval is settled and tries again.
pub const OVERLAP_REFUSAL: &str = "overlaps an undecided interval";

/// What the votes on an interval's prepares decided, before any decision is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Votes {
    pub id: IntervalId,
    pub decision: Decision,
    /// Every brick of the interval.
    pub members: Vec<u64>,
    /// Bricks that voted no, and why.
    pub refusals: Vec<(usize, String)>,
    /// Bricks that did not answer the prepare.
    pub silent: Vec<usize>,
    /// For each brick whose prepare carried commits of earlier intervals: whether it applied
    /// each of them, in order, or `None` when it applied none that it said (it did not
    /// answer, refused the prepare, or does not take carried commits). Those are sent again
    /// on their own.
    pub carried: BTreeMap<usize, Option<Vec<bool>>>,
}

impl Votes {
    /// Every brick voted yes: the interval is committed (`strata_cluster::interval`), and
    /// may be reported ended before any commit is sent.
    pub fn committed(&self) -> bool {
        self.decision == Decision::Commit
    }
}

/// How an interval ended, as far as the client saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    /// How many bricks the interval has.
    pub bricks: usize,
    /// Bricks that did not acknowledge the decision (unreachable). For a commit the interval
    /// is committed regardless: those bricks hold it prepared and learn the decision from a
    /// retry or from their peers once this client is fenced.
    pub unacked: Vec<usize>,
    /// Bricks that voted no, and why.
    pub refusals: Vec<(usize, String)>,
    /// Bricks that did not answer the prepare.
    pub silent: Vec<usize>,
}

impl Outcome {
    /// Committed and acknowledged everywhere: nothing of the interval is owed.
    pub fn ended(&self) -> bool {
        self.decision == Decision::Commit && self.unacked.is_empty()
    }

    /// What the client may report: committed (every brick voted yes), or aborted once a
    /// brick acknowledged the abort. `None`: aborted as far as this client goes, but every
    /// brick may hold it prepared, and then it is committed (its failure is "unknown").
    pub fn reported(&self) -> Option<Decision> {
        match self.decision {
            Decision::Commit => Some(Decision::Commit),
            Decision::Abort => (self.unacked.len() < self.bricks).then_some(Decision::Abort),
        }
    }
}

/// Runs the interval `id`: its prepares ([`prepare_interval`]), then its decision
/// ([`decide_interval`]).
pub async fn run_interval<P: Participant>(
    bricks: &[P],
    id: IntervalId,
    writes: BTreeMap<usize, Vec<(u64, Bytes)>>,
    fences: &[(u32, i64)],
    tag: u64,
) -> Outcome {
    let votes = prepare_interval(bricks, id, writes, fences, tag, &BTreeMap::new()).await;
    decide_interval(bricks, votes).await
}

/// Sends the prepares of interval `id`: `writes` maps each brick (an index into `bricks`) to
/// its writes. Prepares go to every brick at once; the decision is commit only if every one
/// voted yes. `tag` places the interval between two version cuts, on every brick alike.
/// `carried`: for some of the bricks, commits of the client's earlier intervals that their
/// prepare carries (`Participant::prepare`); what became of them is in [`Votes::carried`].
pub async fn prepare_interval<P: Participant>(
    bricks: &[P],
    id: IntervalId,
    writes: BTreeMap<usize, Vec<(u64, Bytes)>>,
    fences: &[(u32, i64)],
    tag: u64,
    carried: &BTreeMap<usize, Vec<IntervalId>>,
) -> Votes {
    let members: Vec<u64> = writes.keys().map(|&b| b as u64).collect();
    let mut coordinator = Coordinator::new(id, writes.keys().map(|&b| (b, Vec::new())).collect());
    let prepares = writes.into_iter().map(|(brick, writes)| {
        let members = members.clone();
        let carries = carried.get(&brick).map_or(&[][..], Vec::as_slice);
        async move {
            let vote = bricks[brick]
                .prepare(carries, id, members, writes, fences, tag)
                .await;
            (brick, vote)
        }
    });
    let mut refusals = Vec::new();
    let mut silent = Vec::new();
    let mut carried_answers = BTreeMap::new();
    for (brick, vote) in join_all(prepares).await {
        if carried.contains_key(&brick) {
            let answered = vote
                .as_ref()
                .ok()
                .and_then(|(_, committed)| committed.clone());
            carried_answers.insert(brick, answered);
        }
        let vote = vote.map(|(vote, _)| vote);
        match vote {
            Ok(Vote::Yes) => {
                coordinator.vote(brick, true);
            }
            Ok(Vote::No(why)) => {
                coordinator.vote(brick, false);
                refusals.push((brick, why));
            }
            Err(RpcError::Refused { why, .. }) => {
                coordinator.vote(brick, false);
                refusals.push((brick, why));
            }
            Err(error) => {
                tracing::warn!(?id, brick, %error, "prepare unanswered");
                silent.push(brick);
            }
        }
    }
    let decision = coordinator
        .decision()
        .unwrap_or_else(|| coordinator.give_up());
    Votes {
        id,
        decision,
        members,
        refusals,
        silent,
        carried: carried_answers,
    }
}

/// Sends the decision the votes took to the interval's bricks, including the ones silent on
/// the prepare for a commit (they may have prepared).
pub async fn decide_interval<P: Participant>(bricks: &[P], votes: Votes) -> Outcome {
    let Votes {
        id,
        decision,
        members,
        refusals,
        silent,
        ..
    } = votes;
    // An abort is not sent to a brick that was silent on the prepare: waiting out its
    // timeout again would double the cost of a brick gone quiet. It is owed instead (the
    // caller delivers it when the brick answers again), and until then the brick holds the
    // interval prepared at most. The other bricks' acknowledgements make the abort durable.
    let (told, skipped): (Vec<u64>, Vec<u64>) = members
        .iter()
        .partition(|&&brick| decision == Decision::Commit || !silent.contains(&(brick as usize)));
    let decisions = told.iter().map(|&brick| async move {
        let acked = bricks[brick as usize].decide(id, decision).await;
        (brick as usize, acked)
    });
    let mut unacked: Vec<usize> = skipped.iter().map(|&b| b as usize).collect();
    for (brick, acked) in join_all(decisions).await {
        match acked {
            Ok(true) => {}
            Ok(false) => {
                // A brick that voted yes cannot refuse the decision; one that never prepared
                // refuses a commit, which cannot be decided without its vote.
                tracing::error!(?id, brick, ?decision, "decision refused");
                unacked.push(brick);
            }
            Err(error) => {
                tracing::warn!(?id, brick, %error, ?decision, "decision unacknowledged");
                unacked.push(brick);
            }
        }
    }
    Outcome {
        decision,
        bricks: members.len(),
        unacked,
        refusals,
        silent,
    }
}
