//! The lock table against a reference model that tracks every 512-byte unit of a small
//! volume separately: who holds it and how, and who is alive. Random sequences of joins,
//! heartbeats, locks, unlocks, time passing, expiry and write checks must give the same
//! answers, and at no time may two live sessions hold a unit in conflicting modes.

use std::collections::BTreeMap;

use proptest::prelude::*;
use strata_cluster::locks::{Grant, LockError, Mode, RangeLocks, Session};

const UNIT: u64 = 512;
const UNITS: u64 = 32;
const LEASE: u64 = 100;

#[derive(Clone, Debug)]
enum Op {
    Join,
    Heartbeat(usize),
    Lock {
        who: usize,
        at: u64,
        units: u64,
        exclusive: bool,
    },
    Unlock {
        who: usize,
        nth: usize,
    },
    Wait(u64),
    Expire,
    MayWrite {
        who: usize,
        at: u64,
        units: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Join),
        2 => (0..6usize).prop_map(Op::Heartbeat),
        6 => (0..6usize, 0..UNITS, 1..8u64, any::<bool>())
            .prop_map(|(who, at, units, exclusive)| Op::Lock { who, at, units, exclusive }),
        3 => (0..6usize, 0..4usize).prop_map(|(who, nth)| Op::Unlock { who, nth }),
        2 => (1..60u64).prop_map(Op::Wait),
        1 => Just(Op::Expire),
        3 => (0..6usize, 0..UNITS, 1..8u64).prop_map(|(who, at, units)| Op::MayWrite { who, at, units }),
    ]
}

/// Per session: lease end, fenced, and its grants (token → units and mode).
#[derive(Default)]
struct Model {
    leases: BTreeMap<Session, u64>,
    grants: BTreeMap<u64, (Session, Vec<u64>, Mode)>,
}

impl Model {
    fn live(&self, s: Session, now: u64) -> bool {
        self.leases.get(&s).is_some_and(|&until| now < until)
    }

    fn units(at: u64, units: u64) -> Vec<u64> {
        (at..(at + units).min(UNITS)).collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn the_table_answers_as_the_per_unit_model(ops in proptest::collection::vec(op(), 1..120)) {
        let mut table = RangeLocks::new(LEASE);
        let mut model = Model::default();
        let mut sessions: Vec<Session> = Vec::new();
        let mut now = 0u64;
        let mut last_token = 0;
        for op in ops {
            match op {
                Op::Join => {
                    let s = table.join(now);
                    prop_assert!(!sessions.contains(&s), "a session id is never reused");
                    model.leases.insert(s, now + LEASE);
                    sessions.push(s);
                }
                Op::Heartbeat(i) if i < sessions.len() => {
                    let s = sessions[i];
                    let got = table.heartbeat(s, now);
                    if model.live(s, now) {
                        prop_assert_eq!(got, Ok(()));
                        model.leases.insert(s, now + LEASE);
                    } else {
                        prop_assert_eq!(got, Err(LockError::Fenced(s)));
                    }
                }
                Op::Lock { who, at, units, exclusive } if who < sessions.len() => {
                    let s = sessions[who];
                    let mode = if exclusive { Mode::Exclusive } else { Mode::Shared };
                    let wanted = Model::units(at, units);
                    let range = at * UNIT..(at * UNIT + wanted.len() as u64 * UNIT);
                    let got = table.trylock(s, range.clone(), mode, now);
                    if !model.live(s, now) {
                        prop_assert_eq!(got, Err(LockError::Fenced(s)));
                        continue;
                    }
                    let conflict = model.grants.values().any(|(holder, held, m)| {
                        *holder != s && model.live(*holder, now)
                            && held.iter().any(|u| wanted.contains(u))
                            && (mode == Mode::Exclusive || *m == Mode::Exclusive)
                    });
                    match got {
                        Ok(Grant { token, session, range: granted, mode: m }) => {
                            prop_assert!(!conflict, "granted over a conflicting lock");
                            prop_assert!(token > last_token, "fencing tokens only grow");
                            last_token = token;
                            prop_assert_eq!((session, granted, m), (s, range, mode));
                            model.grants.insert(token, (s, wanted, mode));
                        }
                        Err(LockError::Conflict(holder)) => {
                            prop_assert!(conflict, "refused with no conflict");
                            prop_assert!(holder.session != s && model.live(holder.session, now));
                        }
                        Err(other) => prop_assert!(false, "unexpected {other}"),
                    }
                }
                Op::Unlock { who, nth } if who < sessions.len() => {
                    let s = sessions[who];
                    let mine: Vec<u64> = model.grants.iter()
                        .filter(|(_, (holder, ..))| *holder == s)
                        .map(|(&t, _)| t)
                        .collect();
                    let token = mine.get(nth).copied().unwrap_or(u64::MAX);
                    let got = table.unlock(s, token, now);
                    if !model.live(s, now) {
                        prop_assert_eq!(got, Err(LockError::Fenced(s)));
                    } else if mine.contains(&token) {
                        prop_assert_eq!(got, Ok(()));
                        model.grants.remove(&token);
                    } else {
                        prop_assert_eq!(got, Err(LockError::NotHeld(token)));
                    }
                }
                Op::Wait(ms) => now += ms,
                Op::Expire => {
                    let mut dead = table.expire(now);
                    dead.sort();
                    let expected: Vec<Session> = model.leases.iter()
                        .filter(|(_, &until)| until <= now)
                        .map(|(&s, _)| s)
                        .collect();
                    prop_assert_eq!(&dead, &expected);
                    for s in &expected {
                        model.leases.remove(s);
                    }
                    model.grants.retain(|_, (holder, ..)| !expected.contains(holder));
                }
                Op::MayWrite { who, at, units } if who < sessions.len() => {
                    let s = sessions[who];
                    let wanted = Model::units(at, units);
                    let range = at * UNIT..(at * UNIT + wanted.len() as u64 * UNIT);
                    let got = table.may_write(s, range, now);
                    if !model.live(s, now) {
                        prop_assert_eq!(got, Err(LockError::Fenced(s)));
                    } else {
                        let covered = wanted.iter().all(|u| model.grants.values().any(
                            |(holder, held, m)| *holder == s && *m == Mode::Exclusive && held.contains(u)));
                        prop_assert_eq!(got, Ok(covered));
                    }
                }
                _ => {}
            }
            // Safety at every step: no unit held in conflicting modes by two live sessions.
            let live: Vec<&Grant> = table.grants().filter(|g| model.live(g.session, now)).collect();
            for (i, a) in live.iter().enumerate() {
                for b in &live[i + 1..] {
                    let overlap = a.range.start < b.range.end && b.range.start < a.range.end;
                    let conflicting = a.mode == Mode::Exclusive || b.mode == Mode::Exclusive;
                    prop_assert!(
                        a.session == b.session || !overlap || !conflicting,
                        "{:?} and {:?} conflict", a, b
                    );
                }
            }
        }
    }
}
