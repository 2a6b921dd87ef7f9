//! The facts the engine relies on, checked across modules: Theorem 1 against brute force,
//! the row rule for stripe-aligned windows, and the engine loop under both policies.

use proptest::prelude::*;

use super::testkit::{move_chunks, old_owner, permutation};
use super::*;

fn grow_strategy() -> impl Strategy<Value = Grow> {
    (3usize..=9, 1usize..=4).prop_map(|(m, n)| Grow::new(m, n))
}

proptest! {
    /// Theorem 1 (digest §8 item 2): from S(m,n,x), any order of [x, x+R) never overwrites
    /// an unmoved chunk's old copy, counting parity of new rows completed in the window.
    #[test]
    fn any_order_within_r_is_safe(grow in grow_strategy(), k in 0u64..600, seed: u64) {
        let x = grow.old_data() + k;
        let order = permutation(x, x + grow.reorder_window(x), seed);
        prop_assert_eq!(move_chunks(grow, x, &order).err(), None::<String>, "x={}", x);
    }

    /// The row rule, (a): every write of an aligned window [lo, hi) ⊆ [c, e(c)) lands on a
    /// row below g = ⌊c/(m−1)⌋, so on the old members it only overwrites old rows lying
    /// wholly below c (data and parity); old rows from g up stay intact.
    #[test]
    fn aligned_windows_leave_old_rows_from_the_checkpoint_intact(
        grow in grow_strategy(), k in 0u64..3000, a in 0u64..1000, b in 0u64..1000,
    ) {
        let n1 = grow.n1();
        let c = grow.critical_end() + k;
        let e = grow.sliding_end(c).expect("a window from every c ≥ C");
        let g = c / grow.old_data();
        let first = c.div_ceil(n1);
        let rows = e / n1 - first;
        prop_assume!(rows > 0);
        let lo_row = first + a % rows;
        let hi_row = lo_row + 1 + b % (e / n1 - lo_row);
        let io = window_io(grow, lo_row * n1, hi_row * n1, u64::MAX);
        for w in &io.writes {
            prop_assert!(w.end_row() <= g, "{:?} reaches row {} (c={})", w, g, c);
            if w.member >= grow.m {
                continue;
            }
            for row in w.first_row..w.end_row() {
                for member in 0..grow.m {
                    let below = old_owner(grow, member, row).is_none_or(|z| z < c);
                    prop_assert!(below, "old row {} holds a chunk ≥ {}", row, c);
                }
            }
        }
    }

    /// The row rule, (b): the whole sliding window [c, e(c)) moved chunk by chunk in any
    /// order never overwrites an unmoved chunk of [c, ∞), and writes only rows below g.
    #[test]
    fn sliding_window_in_any_order_is_safe(
        grow in grow_strategy(), k in 0u64..300, seed: u64,
    ) {
        let c = grow.critical_end() + k * grow.n1();
        let e = grow.sliding_end(c).unwrap();
        let written = move_chunks(grow, c, &permutation(c, e, seed));
        let written = written.map_err(|why| TestCaseError::fail(format!("c={c}: {why}")))?;
        let g = c / grow.old_data();
        prop_assert!(written.iter().all(|&(_, row)| row < g));
        prop_assert_eq!(written.len() as u64, (e - c) + (e - c) / grow.n1());
    }

    /// The engine loop under ALV with user writes landing anywhere: windows stay within
    /// R(ckpt) of the checkpoint and obey the row rule, and a forced checkpoint never
    /// shrinks the sliding window.
    #[test]
    fn alv_loop_with_user_writes(
        grow in grow_strategy(), total in 1u64..5000, agg_rows in 1u64..40, seed: u64,
    ) {
        let policy = Policy::Alv(Alv { grow, valve: ValveConfig::default() });
        let writes = permutation(0, total, seed);
        let stats = run_engine(&policy, total, agg_rows * grow.n1(), &writes[..total as usize / 4]);
        prop_assert_eq!(stats.moved, grow.round_up(total).max(grow.critical_end()));
    }
}

#[derive(Debug, Default)]
struct Stats {
    moved: u64,
    windows: u64,
    checkpoints: u64,
    forced: u64,
}

/// The engine's loop, from C, with `user_writes` (chunk numbers) arriving one per window.
/// Checks, per window: aligned, within the sliding window, within R(ckpt), the row rule.
fn run_engine(policy: &Policy, old_total: u64, agg: u64, user_writes: &[u64]) -> Stats {
    let grow = policy.grow();
    let c = policy.critical_end();
    let (mut ckpt, mut moved) = (c, c);
    let mut stats = Stats::default();
    let mut writes = user_writes.iter();
    while let Some(window) = policy.next_window(ckpt, moved, old_total, agg) {
        if policy.checkpoint_due(ckpt, moved, window) {
            let before = grow.sliding_end(ckpt);
            ckpt = moved;
            stats.checkpoints += 1;
            assert!(grow.sliding_end(ckpt) >= before);
            assert!(!policy.checkpoint_due(ckpt, moved, window));
        }
        let (lo, hi) = window;
        assert!(lo == moved && hi.is_multiple_of(grow.n1()) && hi <= grow.round_up(old_total));
        if policy.kind() == PolicyKind::Alv {
            assert!(hi <= grow.sliding_end(ckpt).unwrap());
            assert!(
                hi - ckpt <= grow.reorder_window(ckpt),
                "window past R at {ckpt}"
            );
        }
        assert!(hi / grow.n1() <= ckpt / grow.old_data(), "row rule");
        moved = hi;
        stats.windows += 1;
        if let Some(&chunk) = writes.next() {
            if regions::write_needs_checkpoint(chunk, ckpt, moved) {
                assert_eq!(
                    policy.on_write_in_unrecorded(),
                    UnrecordedWrite::ForceCheckpoint
                );
                ckpt = moved;
                stats.forced += 1;
            }
        }
    }
    stats.moved = moved;
    stats
}

/// Table 1's ALV run without user writes: A(3,1), 983,040 chunks, 2 MiB buffers per old
/// member at 64 KiB chunks (63-chunk windows). 31 sliding windows: the engine records C,
/// then 30 checkpoints open windows 2..31, then the completion record.
#[test]
fn alv_loop_for_table_1_checkpoints_once_per_sliding_window() {
    let grow = Grow::new(3, 1);
    let policy = Policy::new(PolicyKind::Alv, grow, 64 << 10);
    let agg = grow.aggregation_chunks(2 << 20, 64 << 10);
    let stats = run_engine(&policy, 983_040, agg, &[]);
    assert_eq!(stats.moved, 983_040);
    assert_eq!(stats.checkpoints, 30);
    assert_eq!(
        stats.checkpoints + 1,
        testkit::sliding_windows(grow, 983_040)
    );
    assert_eq!(stats.windows, 15_620);
    assert_eq!(stats.forced, 0);
}

/// A user write into copied-but-unrecorded data forces exactly one checkpoint, after
/// which the region is empty (a second write there needs none).
#[test]
fn alv_user_write_forces_one_checkpoint() {
    let grow = Grow::new(3, 1);
    let policy = Policy::new(PolicyKind::Alv, grow, 64 << 10);
    let (ckpt, mut moved) = (18, 18);
    let window = policy.next_window(ckpt, moved, 1000, 6).unwrap();
    assert_eq!(window, (18, 24));
    assert!(!policy.checkpoint_due(ckpt, moved, window));
    moved = window.1;
    assert_eq!(policy.next_window(ckpt, moved, 1000, 6), Some((24, 27)));
    assert_eq!(
        regions::region(20, ckpt, moved, None),
        Region::MovedUnrecorded
    );
    assert!(regions::write_needs_checkpoint(20, ckpt, moved));
    let ckpt = moved;
    assert!(!regions::write_needs_checkpoint(20, ckpt, moved));
    assert_eq!(regions::region(20, ckpt, moved, None), Region::New);
    // From checkpoint 24 the sliding window ends at 36, past the old one (27).
    assert_eq!(grow.sliding_end(24), Some(36));
    assert_eq!(policy.next_window(ckpt, moved, 1000, 30), Some((24, 36)));
}

/// When the sliding window is used up, the next window is the one the checkpoint at
/// `moved` opens, and it is due.
#[test]
fn alv_window_past_the_sliding_end_needs_the_checkpoint() {
    let policy = Policy::new(PolicyKind::Alv, Grow::new(3, 1), 64 << 10);
    let window = policy.next_window(18, 27, 1000, 300).unwrap();
    assert_eq!(window, (27, 39));
    assert!(policy.checkpoint_due(18, 27, window));
    assert!(!policy.checkpoint_due(27, 27, window));
    assert_eq!(
        policy.next_window(18, 27, 30, 300),
        Some((27, 30)),
        "capped at the data"
    );
    assert_eq!(policy.next_window(18, 30, 29, 300), None);
}

#[test]
#[should_panic(expected = "critical section")]
fn alv_refuses_the_critical_section() {
    Policy::new(PolicyKind::Alv, Grow::new(5, 1), 64 << 10).next_window(0, 5, 1000, 10);
}

#[test]
fn policy_kinds_parse_and_print() {
    for kind in [PolicyKind::Alv, PolicyKind::Md] {
        assert_eq!(kind.to_string().parse::<PolicyKind>(), Ok(kind));
    }
    assert_eq!(PolicyKind::Alv.to_string(), "alv");
    assert_eq!(PolicyKind::Md.to_string(), "md");
    assert!("ALV".parse::<PolicyKind>().is_err());
}

#[test]
fn policies_differ_where_the_paper_says() {
    let grow = Grow::new(3, 1);
    let alv = Policy::new(PolicyKind::Alv, grow, 64 << 10);
    let md = Policy::new(PolicyKind::Md, grow, 64 << 10);
    assert_eq!((alv.kind(), md.kind()), (PolicyKind::Alv, PolicyKind::Md));
    assert_eq!(alv.io_unit(), None);
    assert_eq!(md.io_unit(), Some(4096));
    assert_eq!(
        alv.on_write_in_unrecorded(),
        UnrecordedWrite::ForceCheckpoint
    );
    assert_eq!(md.on_write_in_unrecorded(), UnrecordedWrite::Wait);
    assert_eq!(alv.on_read_in_unrecorded(), UnrecordedRead::UseNew);
    assert_eq!(md.on_read_in_unrecorded(), UnrecordedRead::Wait);
    // MD ignores aggregation: rows as its stripe cache holds (10 here), never past one that
    // needs a checkpoint first (row 8, from checkpoint 18: old row 9, exactly).
    assert_eq!(md.next_window(18, 18, 1000, 63), Some((18, 24)));
    assert_eq!(md.next_window(300, 300, 1000, 63), Some((300, 330)));
    assert_eq!(alv.next_window(18, 18, 1000, 63), Some((18, 27)));
    // A stripe cache of one row's heads (16 destination + 32 source pages at 64 KiB): one
    // row per step, the engine's MD before the cache was modelled.
    let mut params = MdParams::new(64 << 10);
    params.stripe_cache_pages = 48;
    let one_row = Policy::Md(Md::new(grow, params));
    assert_eq!(one_row.next_window(300, 300, 1000, 63), Some((300, 303)));
    params.stripe_cache_pages = 1;
    assert_eq!(
        Md::new(grow, params).rows_in_flight(),
        1,
        "at least one row"
    );
}

/// The valve gates by period; the funnel by speed. Both behind the same interface.
#[test]
fn rate_controls_share_one_interface() {
    let grow = Grow::new(3, 1);
    let ms = Duration::from_millis(1);
    let mut valve = Policy::new(PolicyKind::Alv, grow, 64 << 10).rate_control(Duration::ZERO);
    valve.user_arrival(false);
    valve.user_completion(100 * ms);
    valve.moved(1 << 20);
    assert_eq!(valve.gate(500 * ms), Gate::Run);
    assert_eq!(valve.gate(1000 * ms), Gate::SleepUntil(2000 * ms));
    let mut funnel = Policy::new(PolicyKind::Md, grow, 64 << 10).rate_control(Duration::ZERO);
    funnel.user_completion(100 * ms);
    funnel.moved(1 << 30);
    assert_eq!(
        funnel.gate(1000 * ms),
        Gate::SleepUntil(1500 * ms),
        "above 200 MB/s"
    );
}
