//! RAIN-10's replica policy against the bytes: two mirror sets of three bricks, each brick a
//! map of units to values. Random writes, reads, bricks going down and coming back, and
//! region copies in any order: every read returns the latest value written, and once every
//! brick is back and copied to, the bricks of each set hold the same.

use std::collections::BTreeMap;

use proptest::prelude::*;
use strata_cluster::rain::{Rain10, RainError};

const UNIT: u64 = 512;
const REGION: u64 = 2048;
const VOLUME_UNITS: u64 = 64;

#[derive(Clone, Debug)]
enum Op {
    Write(u64),
    Read(u64),
    Down(usize),
    Return(usize),
    Copy(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..VOLUME_UNITS).prop_map(Op::Write),
        4 => (0..VOLUME_UNITS).prop_map(Op::Read),
        1 => (0..6usize).prop_map(Op::Down),
        1 => (0..6usize).prop_map(Op::Return),
        3 => any::<usize>().prop_map(Op::Copy),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    #[test]
    fn reads_see_the_latest_write_and_copies_leave_replicas_equal(
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        let sets = vec![vec![0, 1, 2], vec![3, 4, 5]];
        let mut rain = Rain10::new(UNIT, REGION, sets.clone());
        let mut stores: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); 6];
        let mut truth: BTreeMap<u64, u64> = BTreeMap::new();
        let mut down = [false; 6];
        let mut jobs: Vec<(usize, u64)> = Vec::new();
        let mut next_value = 1;
        let copy = |rain: &mut Rain10, stores: &mut Vec<BTreeMap<u64, u64>>, b: usize, region: u64| {
            let Some(src) = rain.source(b, region) else { return false };
            for offset in (region * REGION..(region + 1) * REGION).step_by(UNIT as usize) {
                match stores[src].get(&offset).copied() {
                    Some(v) => stores[b].insert(offset, v),
                    None => stores[b].remove(&offset),
                };
            }
            rain.copied(b, region);
            true
        };
        for op in ops {
            match op {
                Op::Write(unit) => {
                    let place = rain.place(unit * UNIT);
                    match rain.write(place) {
                        Ok(targets) => {
                            for b in targets {
                                prop_assert!(!down[b], "a write sent to a brick that is down");
                                stores[b].insert(place.offset, next_value);
                            }
                            truth.insert(unit, next_value);
                            next_value += 1;
                        }
                        Err(RainError::Unavailable(_)) => {}
                        Err(other) => prop_assert!(false, "{other}"),
                    }
                }
                Op::Read(unit) => {
                    let place = rain.place(unit * UNIT);
                    let b = rain.read_from(place).expect("a current copy is always up");
                    prop_assert!(!down[b]);
                    prop_assert_eq!(stores[b].get(&place.offset), truth.get(&unit), "stale read from brick {}", b);
                }
                Op::Down(b) if rain.down(b).is_ok() => {
                    down[b] = true;
                    jobs.retain(|&(j, _)| j != b);
                }
                Op::Return(b) if down[b] => {
                    down[b] = false;
                    jobs.extend(rain.returned(b).into_iter().map(|r| (b, r)));
                }
                Op::Copy(pick) if !jobs.is_empty() => {
                    let (b, region) = jobs[pick % jobs.len()];
                    if copy(&mut rain, &mut stores, b, region) {
                        jobs.retain(|&j| j != (b, region));
                    }
                }
                _ => {}
            }
        }
        // Everyone back, every copy done.
        for (b, gone) in down.iter_mut().enumerate() {
            if *gone {
                *gone = false;
                jobs.extend(rain.returned(b).into_iter().map(|r| (b, r)));
            }
        }
        while let Some((b, region)) = jobs.pop() {
            prop_assert!(copy(&mut rain, &mut stores, b, region), "no source for a region");
        }
        for set in &sets {
            for &b in set {
                prop_assert!(rain.in_sync(b), "brick {} not in sync", b);
                prop_assert_eq!(&stores[b], &stores[set[0]], "bricks {} and {} differ", b, set[0]);
            }
        }
    }
}
