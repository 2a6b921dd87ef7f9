//! Consistency intervals under every interleaving proptest finds: three bricks, clients each
//! running intervals over some of them, messages delivered in any order or lost, clients
//! crashing at any point and clients giving up. Then the live clients finish, the dead ones
//! are fenced (their messages still in flight are refused), and every brick resolves what it
//! holds in doubt by asking the interval's other bricks.
//!
//! A client reports an interval committed at its last yes vote, before it sends any commit
//! (Sinfonia's rule), and aborted at the first brick's acknowledgement of the abort.
//!
//! Must hold after every schedule: each interval is visible on all its bricks or on none; an
//! interval its client reported committed is visible everywhere; one it reported aborted is
//! visible nowhere; nothing is left in doubt.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use strata_cluster::interval::{
    resolve, Brick, Coordinator, Decision, Entry, IntervalId, Participant, Write,
};

const BRICKS: usize = 3;

#[derive(Clone, Debug)]
enum Msg {
    Prepare(usize, Brick),
    Vote(usize, Brick, bool),
    Decide(usize, Brick, Decision),
    Ack(usize, Brick),
}

impl Msg {
    fn interval(&self) -> usize {
        match *self {
            Msg::Prepare(i, _) | Msg::Vote(i, ..) | Msg::Decide(i, ..) | Msg::Ack(i, _) => i,
        }
    }
}

struct World {
    bricks: Vec<Participant>,
    runs: Vec<Coordinator>,
    /// The client of each interval.
    client_of: Vec<usize>,
    dead: BTreeSet<usize>,
    queue: Vec<Msg>,
    /// Intervals whose client reported them ended, with the decision.
    reported: BTreeMap<usize, Decision>,
}

impl World {
    fn deliver(&mut self, msg: Msg) {
        let i = msg.interval();
        let id = self.runs[i].id;
        let client_alive = !self.dead.contains(&self.client_of[i]);
        match msg {
            Msg::Prepare(_, b) => {
                let writes = self.runs[i].writes[&b].clone();
                let yes = self.bricks[b].prepare(id, writes, self.runs[i].bricks());
                self.queue.push(Msg::Vote(i, b, yes));
            }
            Msg::Vote(_, b, yes) if client_alive => {
                let before = self.runs[i].decision();
                if let (None, Some(d)) = (before, self.runs[i].vote(b, yes)) {
                    self.report(i);
                    self.send_decision(i, d);
                }
            }
            Msg::Decide(_, b, d) => {
                if self.bricks[b].decide(id, d) {
                    self.queue.push(Msg::Ack(i, b));
                }
            }
            Msg::Ack(_, b) if client_alive => {
                self.runs[i].acked(b);
                self.report(i);
            }
            // To a dead client: lost.
            Msg::Vote(..) | Msg::Ack(..) => {}
        }
    }

    /// The client reports what it may of interval `i`, once.
    fn report(&mut self, i: usize) {
        if let Some(d) = self.runs[i].reportable() {
            let first = *self.reported.entry(i).or_insert(d);
            assert_eq!(first, d, "interval {i} reported two ways");
        }
    }

    fn send_decision(&mut self, i: usize, d: Decision) {
        for b in self.runs[i].bricks() {
            self.queue.push(Msg::Decide(i, b, d));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn every_interval_is_all_or_nothing_and_every_reported_commit_lasts(
        plans in proptest::collection::vec((0..3usize, 1..8u8), 1..6),
        schedule in proptest::collection::vec((0..10u8, any::<u16>()), 0..80),
    ) {
        let mut w = World {
            bricks: vec![Participant::default(); BRICKS],
            runs: Vec::new(),
            client_of: Vec::new(),
            dead: BTreeSet::new(),
            queue: Vec::new(),
            reported: BTreeMap::new(),
        };
        // Interval i of client c writes block 10·i + b on each brick b of its mask.
        for (i, &(client, mask)) in plans.iter().enumerate() {
            let writes: BTreeMap<Brick, Vec<Write>> = (0..BRICKS)
                .filter(|b| mask & (1 << b) != 0)
                .map(|b| (b, vec![Write { block: 10 * i as u64 + b as u64, value: i as u64 + 1 }]))
                .collect();
            let id = IntervalId { client: client as u64, seq: i as u64 };
            w.runs.push(Coordinator::new(id, writes));
            w.client_of.push(client);
            for b in w.runs[i].bricks() {
                w.queue.push(Msg::Prepare(i, b));
            }
        }
        for (kind, pick) in schedule {
            let pick = pick as usize;
            match kind {
                // Deliver a message (any of those in flight: the network reorders).
                0..=5 if !w.queue.is_empty() => {
                    let msg = w.queue.remove(pick % w.queue.len());
                    w.deliver(msg);
                }
                // Lose one.
                6 if !w.queue.is_empty() => {
                    w.queue.remove(pick % w.queue.len());
                }
                // A client dies.
                7 => {
                    w.dead.insert(pick % 3);
                }
                // A live client gives up on an undecided interval: abort.
                8 | 9 => {
                    let i = pick % w.runs.len();
                    if !w.dead.contains(&w.client_of[i]) && w.runs[i].decision().is_none() {
                        let d = w.runs[i].give_up();
                        w.send_decision(i, d);
                    }
                }
                _ => {}
            }
        }
        // The live clients finish: undecided intervals are given up, and the network delivers
        // what is in flight (a lost decision is sent again, as a client retries until acked).
        for i in 0..w.runs.len() {
            if w.dead.contains(&w.client_of[i]) {
                continue;
            }
            let d = match w.runs[i].decision() {
                Some(d) => d,
                None => w.runs[i].give_up(),
            };
            w.send_decision(i, d);
        }
        while !w.queue.is_empty() {
            let msg = w.queue.remove(0);
            w.deliver(msg);
        }
        // The dead clients are fenced now: nothing of theirs is in flight any more (the
        // bricks refuse it). Each brick resolves what it holds in doubt.
        for b in 0..BRICKS {
            for id in w.bricks[b].in_doubt() {
                let bricks = match w.bricks[b].entry(id) {
                    Some(Entry::Prepared { bricks, .. }) => bricks.clone(),
                    other => unreachable!("in doubt: {other:?}"),
                };
                let entries: Vec<Option<Entry>> =
                    bricks.iter().map(|&o| w.bricks[o].entry(id).cloned()).collect();
                let view: Vec<Option<&Entry>> = entries.iter().map(Option::as_ref).collect();
                let d = resolve(&view);
                prop_assert!(w.bricks[b].decide(id, d));
            }
        }
        for (i, run) in w.runs.iter().enumerate() {
            let visible: Vec<bool> = run.bricks().iter()
                .map(|&b| w.bricks[b].visible().get(&(10 * i as u64 + b as u64)) == Some(&(i as u64 + 1)))
                .collect();
            prop_assert!(
                visible.iter().all(|&v| v) || visible.iter().all(|&v| !v),
                "interval {} half applied: {:?}", i, visible
            );
            match w.reported.get(&i) {
                Some(Decision::Commit) => prop_assert!(visible[0], "reported committed, lost"),
                Some(Decision::Abort) => prop_assert!(!visible[0], "reported aborted, applied"),
                None => {}
            }
        }
        for brick in &w.bricks {
            prop_assert!(brick.in_doubt().is_empty());
        }
    }
}
