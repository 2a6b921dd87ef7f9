//! The baseline, MD-Reshape (Linux 2.6.18 `raid5.c` `reshape_request`, `md.c`
//! `md_do_sync`), as a policy in the same terms as ALV (paper §3 "Baseline", §4, §6).
//!
//! - New rows (N1 chunks each) moved in 4 KiB units (`STRIPE_SIZE`), as many at a time as
//!   its stripe cache holds (`reshape_request` takes one row's stripe heads per call and
//!   `get_active_stripe` waits only when the cache is full, so `md_do_sync` keeps issuing
//!   rows until then), never past a row that needs a checkpoint first.
//! - Checkpoint before a step when its writes could reach old rows not yet recorded as
//!   moved (`writepos >= safepos`), or when the data moved since the last checkpoint
//!   exceed a fixed amount per new data disk ("3Meg").
//! - User I/O into [ckpt, moved) sleeps until the next checkpoint (`make_request` retries
//!   while `expand_lo <= sector < expand_progress`, reads included); ALV instead forces the
//!   checkpoint for writes and serves reads from the new copy.
//! - Rate: a funnel between `speed_limit_min` and `speed_limit_max` with idle detection,
//!   blind to user latency (§6).
//! - It reshapes to the end of the member devices, zero-filling the new tail (Table 1's
//!   write count is the whole new capacity): pass that end to `next_window_until`.

use std::time::Duration;

use super::window::Grow;
use super::{Gate, RateControl};

const SECTOR: u64 = 512;

/// MD's redistribution I/O unit (`STRIPE_SIZE`, one page).
pub const IO_UNIT_BYTES: u64 = 4096;

/// "3Meg" as 2.6.18 writes it: `(raid_disks-1)*3000*2` sectors, 3000 KiB per new data disk.
pub const KERNEL_CHECKPOINT_BYTES: u64 = 3000 << 10;

/// "3 MB" read as 3 MiB per new data disk: the reading nearest Table 1's 9,988 metadata
/// writes for A(3,1) at 30 GiB members and 64 KiB chunks. Over the whole device this gives
/// 10,042 checkpoints (+0.5%); the kernel's 3000 KiB gives 10,468 (+4.8%), 3,000,000 bytes
/// 10,696, and stopping at the end of the old data 6,698. No reading gives 9,988 exactly
/// (nor does any whole number of rows between checkpoints over 30 GiB or 30 GB members);
/// the paper does not say how it counted.
pub const CHECKPOINT_BYTES: u64 = 3 << 20;

/// The stripe cache of the paper's MD runs (§4: raised to 512 entries; md's default is 256).
/// An entry is one 4 KiB page on every member.
pub const STRIPE_CACHE_PAGES: u64 = 512;

/// MD-Reshape's knobs; defaults are MD's and the paper's baseline (§4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MdParams {
    pub chunk_bytes: u64,
    /// Checkpoint once more than this much per new data disk moved since the last one.
    pub checkpoint_bytes_per_data_disk: u64,
    /// Stripe-cache entries: they bound the rows in flight ([`Md::rows_in_flight`]).
    pub stripe_cache_pages: u64,
    pub funnel: FunnelConfig,
}

impl MdParams {
    pub fn new(chunk_bytes: u64) -> MdParams {
        MdParams {
            chunk_bytes,
            checkpoint_bytes_per_data_disk: CHECKPOINT_BYTES,
            stripe_cache_pages: STRIPE_CACHE_PAGES,
            funnel: FunnelConfig::default(),
        }
    }
}

/// MD-Reshape for one grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Md {
    pub grow: Grow,
    pub params: MdParams,
}

impl Md {
    pub fn new(grow: Grow, params: MdParams) -> Md {
        assert!(
            params.chunk_bytes.is_power_of_two() && params.chunk_bytes >= IO_UNIT_BYTES,
            "chunk {} is not a power of two of at least 4 KiB",
            params.chunk_bytes
        );
        assert!(params.checkpoint_bytes_per_data_disk.is_multiple_of(SECTOR));
        Md { grow, params }
    }

    fn chunk_sectors(&self) -> u64 {
        self.params.chunk_bytes / SECTOR
    }

    /// New rows in flight at most: each takes chunk / 4 KiB destination stripe heads, and as
    /// many again for each old row it reads from (⌈N1 / (m − 1)⌉ of them; source heads are
    /// released once copied, so this slightly undercounts what fits). At least one row.
    /// A(3,1) at 64 KiB chunks with 512 entries: 10 rows, 640 KiB per member.
    pub fn rows_in_flight(&self) -> u64 {
        let pages = self.params.chunk_bytes / IO_UNIT_BYTES;
        let sources = self.grow.n1().div_ceil(self.grow.old_data());
        (self.params.stripe_cache_pages / (pages * (1 + sources))).max(1)
    }

    /// The next rows to move from `moved`, or None at `end`: the first row, then more while
    /// the stripe cache has room and the next row needs no checkpoint first (the rows are
    /// issued together, as md's pipeline does; each is copied whole in 4 KiB units). MD has
    /// no aggregation: each row is its own full-stripe write.
    pub fn next_window_until(&self, ckpt: u64, moved: u64, end: u64) -> Option<(u64, u64)> {
        let n1 = self.grow.n1();
        assert!(
            ckpt <= moved,
            "checkpoint {ckpt} is ahead of the moved data {moved}"
        );
        assert!(moved.is_multiple_of(n1), "moved {moved} is not a new row");
        assert!(end.is_multiple_of(n1), "end {end} is not a new row");
        if moved >= end {
            return None;
        }
        let limit = moved + self.rows_in_flight() * n1;
        let mut hi = moved + n1;
        while hi < end.min(limit) && !self.due(ckpt, hi) {
            hi += n1;
        }
        debug_assert!(hi > moved && hi <= end && hi.is_multiple_of(n1));
        Some((moved, hi))
    }

    /// `reshape_request`'s test before a row, in its own units (sectors; `sector_div`
    /// floors). The overwrite test is one row stricter than the row rule when the checkpoint
    /// is a multiple of m−1 (`>=` where touching would do) and equal to it otherwise (for
    /// m ≤ 9 at 4 KiB chunks and up: the scaled `safepos` then lies at least a sector into
    /// the checkpoint's old row).
    ///
    /// With nothing unrecorded (`ckpt == moved`) it is never due: MD writes the row right
    /// after its checkpoint without testing again, and inside the critical section (where
    /// the test stays true) relies on mdadm's backup, as the engine does for [0, C).
    pub fn checkpoint_due(&self, ckpt: u64, moved: u64, window: (u64, u64)) -> bool {
        let n1 = self.grow.n1();
        assert_eq!(window.0, moved, "windows start where the moved data end");
        assert!(
            window.1 > moved && (window.1 - moved).is_multiple_of(n1),
            "MD moves whole rows"
        );
        assert!(
            ckpt <= moved,
            "checkpoint {ckpt} is ahead of the moved data {moved}"
        );
        // The rows after the first were admitted by `next_window_until` against `ckpt`.
        ckpt != moved && self.due(ckpt, moved)
    }

    /// The test for the row starting at chunk `at`, with `ckpt` recorded.
    fn due(&self, ckpt: u64, at: u64) -> bool {
        let n1 = self.grow.n1();
        let moved = at;
        let cs = self.chunk_sectors();
        let progress = moved.checked_mul(cs).expect("sector overflow");
        // Per-member sector where the row about to be written ends, and where the old row
        // holding the checkpoint's chunk starts (scaled, as the kernel does).
        let writepos = (progress + cs * n1) / n1;
        let safepos = ckpt * cs / self.grow.old_data();
        let gap = progress - ckpt * cs;
        let limit = n1 * (self.params.checkpoint_bytes_per_data_disk / SECTOR);
        writepos >= safepos || gap > limit
    }

    pub fn funnel(&self, now: Duration) -> Funnel {
        Funnel::new(self.params.funnel, self.grow.m + self.grow.n, now)
    }
}

/// The funnel's knobs: `md_do_sync`'s throttle (2.6.18).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunnelConfig {
    /// `speed_limit_min` in KiB/s per member (MD's default 1,000).
    pub speed_limit_min_kbps: u64,
    /// `speed_limit_max` in KiB/s per member (MD's default 200,000).
    pub speed_limit_max_kbps: u64,
    /// A member is busy when it saw more than this many non-reshape sectors since it was
    /// last found busy (`is_mddev_idle`: `> 32`; kernels after 2.6.18 changed this).
    pub idle_sectors: u64,
    /// How long the mover sleeps when throttled (`msleep(500)`).
    pub sleep: Duration,
    /// The speed is measured over `marks` marks `mark_step` apart (10 × 3 s).
    pub mark_step: Duration,
    pub marks: usize,
    /// The throttle is checked once per this much progress (`window`, 32 pages).
    pub check_sectors: u64,
}

impl Default for FunnelConfig {
    fn default() -> FunnelConfig {
        FunnelConfig {
            speed_limit_min_kbps: 1_000,
            speed_limit_max_kbps: 200_000,
            idle_sectors: 32,
            sleep: Duration::from_millis(500),
            mark_step: Duration::from_secs(3),
            marks: 10,
            check_sectors: 32 * IO_UNIT_BYTES / SECTOR,
        }
    }
}

/// The funnel: run while slower than the minimum; above it, sleep 500 ms whenever faster
/// than the maximum or any member saw user I/O.
#[derive(Clone, Debug)]
pub struct Funnel {
    config: FunnelConfig,
    /// Per-member sectors the mover has done (`io_sectors`).
    moved_sectors: u64,
    /// (time, moved_sectors) samples, a ring; the speed is measured from `resync_mark`.
    marks: Vec<(Duration, u64)>,
    last_mark: usize,
    resync_mark: (Duration, u64),
    last_check: u64,
    /// Inside the `repeat:` loop: a sleep ended, test again without new progress.
    rechecking: bool,
    user_sectors: Vec<u64>,
    last_events: Vec<u64>,
}

impl Funnel {
    pub fn new(config: FunnelConfig, members: usize, now: Duration) -> Funnel {
        assert!(config.marks >= 2 && config.check_sectors > 0);
        assert!(config.speed_limit_min_kbps <= config.speed_limit_max_kbps);
        Funnel {
            config,
            moved_sectors: 0,
            marks: vec![(now, 0); config.marks],
            last_mark: 0,
            resync_mark: (now, 0),
            last_check: 0,
            rechecking: false,
            user_sectors: vec![0; members],
            last_events: vec![0; members],
        }
    }

    /// Progress in KiB/s per member, as `md_do_sync` computes it (whole seconds, +1s, +1).
    pub fn speed_kbps(&self, now: Duration) -> u64 {
        let (since, at) = self.resync_mark;
        let secs = now.saturating_sub(since).as_secs();
        (self.moved_sectors - at) / 2 / (secs + 1) + 1
    }

    /// `is_mddev_idle`: every member is checked (and a busy one re-based), no short cut.
    fn idle(&mut self) -> bool {
        let mut idle = true;
        for (now, last) in self.user_sectors.iter().zip(&mut self.last_events) {
            if now - *last > self.config.idle_sectors {
                *last = *now;
                idle = false;
            }
        }
        idle
    }

    fn step_marks(&mut self, now: Duration) {
        if now >= self.marks[self.last_mark].0 + self.config.mark_step {
            let next = (self.last_mark + 1) % self.marks.len();
            self.resync_mark = self.marks[next];
            self.marks[next] = (now, self.moved_sectors);
            self.last_mark = next;
        }
    }
}

impl RateControl for Funnel {
    fn user_sectors(&mut self, member: usize, sectors: u64) {
        self.user_sectors[member] += sectors;
    }

    fn moved(&mut self, sectors: u64) {
        self.moved_sectors += sectors;
    }

    fn gate(&mut self, now: Duration) -> Gate {
        if !self.rechecking {
            if self.last_check + self.config.check_sectors > self.moved_sectors {
                return Gate::Run;
            }
            self.last_check = self.moved_sectors;
        }
        self.step_marks(now);
        let speed = self.speed_kbps(now);
        let c = self.config;
        // Short-circuit as the kernel does: idleness is sampled only between the limits.
        if speed > c.speed_limit_min_kbps && (speed > c.speed_limit_max_kbps || !self.idle()) {
            self.rechecking = true;
            return Gate::SleepUntil(now + c.sleep);
        }
        self.rechecking = false;
        Gate::Run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// Moves [0, end) as the engine would: checkpoint when due, then the row. Checks the
    /// row rule for every row from C on. Returns the checkpoints written.
    fn run(md: &Md, end: u64) -> u64 {
        let (mut ckpt, mut moved, mut checkpoints) = (0, 0, 0);
        let c = md.grow.critical_end();
        while let Some(window) = md.next_window_until(ckpt, moved, end) {
            if md.checkpoint_due(ckpt, moved, window) {
                ckpt = moved;
                checkpoints += 1;
                assert!(
                    !md.checkpoint_due(ckpt, moved, window),
                    "a fresh checkpoint admits"
                );
            }
            let window = md
                .next_window_until(ckpt, moved, end)
                .expect("not at the end");
            for row in window.0 / md.grow.n1()..window.1 / md.grow.n1() {
                if moved >= c {
                    assert!(
                        row < ckpt / md.grow.old_data(),
                        "row rule at row {row} from {moved}, ckpt {ckpt}"
                    );
                }
            }
            assert!((window.1 - window.0) / md.grow.n1() <= md.rows_in_flight());
            moved = window.1;
        }
        assert_eq!(moved, end);
        checkpoints
    }

    fn a_3_1(checkpoint_bytes: u64) -> Md {
        let mut params = MdParams::new(64 << 10);
        params.checkpoint_bytes_per_data_disk = checkpoint_bytes;
        Md::new(Grow::new(3, 1), params)
    }

    /// Table 1's MD-Reshape run: A(3,1), 30 GiB members, 64 KiB chunks, the whole device
    /// (491,520 rows). The paper counts 9,988 metadata updates; see [`CHECKPOINT_BYTES`].
    #[test]
    fn md_metadata_writes_for_table_1() {
        let rows = 30 * GIB / (64 << 10);
        let end = rows * 3;
        assert_eq!(
            run(&a_3_1(CHECKPOINT_BYTES), end),
            10_042,
            "3 MiB per data disk"
        );
        assert_eq!(
            run(&a_3_1(KERNEL_CHECKPOINT_BYTES), end),
            10_468,
            "3000 KiB"
        );
        assert_eq!(
            run(&a_3_1(3_000_000 / 512 * 512), end),
            10_696,
            "3,000,000 B"
        );
        let old_data = rows * 2;
        assert_eq!(
            run(&a_3_1(CHECKPOINT_BYTES), old_data),
            6_698,
            "old data only"
        );
    }

    /// The stripe cache bounds the rows in flight: a row takes chunk / 4 KiB destination
    /// heads and as many per old row it reads (two for A(3,1), whose 3 new chunks span 1.5
    /// old rows). Windows stop at the row that needs a checkpoint and at the end.
    #[test]
    fn md_moves_as_many_rows_as_its_stripe_cache_holds() {
        let rows = |m, n, chunk_kib: u64| {
            Md::new(Grow::new(m, n), MdParams::new(chunk_kib << 10)).rows_in_flight()
        };
        assert_eq!(rows(3, 1, 64), 10, "512 / (16 × 3)");
        assert_eq!(rows(3, 1, 16), 42, "512 / (4 × 3)");
        assert_eq!(rows(3, 1, 256), 2, "512 / (64 × 3)");
        assert_eq!(rows(9, 1, 64), 10, "9 new chunks span 2 old rows of 8");
        assert_eq!(rows(3, 3, 1024), 1, "never none");
        let md = a_3_1(CHECKPOINT_BYTES);
        assert_eq!(md.next_window_until(3000, 3000, 6000), Some((3000, 3030)));
        assert_eq!(md.next_window_until(3000, 3000, 3009), Some((3000, 3009)));
        // From 3000 + 141 moved, row 3144 is the first past 3 MiB per data disk.
        assert_eq!(md.next_window_until(3000, 3141, 6000), Some((3141, 3147)));
        assert!(md.checkpoint_due(3000, 3147, (3147, 3150)));
    }

    /// 3 MiB × 3 new data disks = 144 chunks of 64 KiB: 48 rows since the checkpoint do
    /// not trigger (`gap >`), 49 do.
    #[test]
    fn md_checkpoints_after_three_mib_per_data_disk() {
        let md = a_3_1(CHECKPOINT_BYTES);
        let ckpt = 3000;
        assert!(!md.checkpoint_due(ckpt, ckpt + 144, (ckpt + 144, ckpt + 147)));
        assert!(md.checkpoint_due(ckpt, ckpt + 147, (ckpt + 147, ckpt + 150)));
    }

    /// MD's overwrite test at ckpt = 12 (old row 6): row 5 is within the row rule
    /// (5 < 6) but `writepos (6) >= safepos (6)`, so MD checkpoints; at ckpt = 15 (old row
    /// 7.5 scaled) row 6 passes and row 7 does not, exactly the row rule.
    #[test]
    fn md_overwrite_test_is_the_row_rule_or_one_row_stricter() {
        let md = a_3_1(CHECKPOINT_BYTES);
        assert!(md.checkpoint_due(12, 15, (15, 18)));
        assert!(!md.checkpoint_due(15, 18, (18, 21)));
        assert!(md.checkpoint_due(15, 21, (21, 24)));
        for m in 3..=9 {
            for n in 1..=4 {
                let md = Md::new(Grow::new(m, n), MdParams::new(64 << 10));
                let rows = 3000 / md.grow.n1() + 1;
                run(&md, rows * md.grow.n1());
            }
        }
    }

    /// Exhaustively, with the gap rule out of the way: from an aligned checkpoint c ≥ C
    /// (old row g, remainder r), MD admits row h iff h < g − [r = 0].
    #[test]
    fn md_overwrite_test_in_closed_form() {
        for m in 3..=9 {
            for n in 1..=4 {
                let mut params = MdParams::new(4096);
                params.checkpoint_bytes_per_data_disk = 1 << 50;
                let md = Md::new(Grow::new(m, n), params);
                let (n1, old) = (md.grow.n1(), md.grow.old_data());
                for ckpt in (md.grow.critical_end()..3000).step_by(n1 as usize) {
                    let (g, r) = (ckpt / old, ckpt % old);
                    for h in ckpt / n1 + 1..g + 2 {
                        let due = md.checkpoint_due(ckpt, h * n1, (h * n1, h * n1 + n1));
                        let admitted = h + u64::from(r == 0) < g;
                        assert_eq!(due, !admitted, "A({m},{n}) ckpt {ckpt} row {h}");
                    }
                }
            }
        }
    }

    fn funnel(min: u64, max: u64) -> Funnel {
        let config = FunnelConfig {
            speed_limit_min_kbps: min,
            speed_limit_max_kbps: max,
            ..FunnelConfig::default()
        };
        Funnel::new(config, 4, Duration::ZERO)
    }

    const SEC: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn funnel_sleeps_above_max_and_rechecks_without_progress() {
        let mut f = funnel(1_000, 10_000);
        f.moved(100);
        assert_eq!(
            f.gate(Duration::ZERO),
            Gate::Run,
            "checked every 256 sectors only"
        );
        f.moved(40_960 - 100);
        assert_eq!(f.speed_kbps(SEC), 10_241, "20 MiB over 1 s (+1 s)");
        assert_eq!(f.gate(SEC), Gate::SleepUntil(1500 * MS));
        assert_eq!(
            f.gate(1500 * MS),
            Gate::SleepUntil(2000 * MS),
            "still 10,241 KiB/s"
        );
        assert_eq!(f.speed_kbps(2 * SEC), 6_827);
        assert_eq!(f.gate(2 * SEC), Gate::Run);
    }

    /// Between the limits the funnel yields to user I/O: more than 32 sectors on a member
    /// since it was last found busy. Below the minimum it never yields.
    #[test]
    fn funnel_yields_to_user_io_between_the_limits() {
        let mut f = funnel(1_000, 10_000);
        f.moved(20_480);
        f.user_sectors(2, 32);
        assert_eq!(f.gate(2 * SEC), Gate::Run, "32 sectors is idle");
        f.user_sectors(2, 1);
        f.moved(256);
        assert_eq!(
            f.gate(2 * SEC),
            Gate::SleepUntil(2500 * MS),
            "33 since last busy"
        );
        assert_eq!(f.gate(2500 * MS), Gate::Run, "re-based: idle again");
        let mut slow = funnel(1_000, 10_000);
        slow.moved(300);
        slow.user_sectors(0, 1 << 20);
        assert_eq!(slow.speed_kbps(SEC), 76);
        assert_eq!(slow.gate(SEC), Gate::Run, "under the minimum: never yields");
    }

    /// A mover that could do 6,400 KiB/s against a 4,000 KiB/s maximum: the 30 s window of
    /// marks holds the average just under the maximum.
    #[test]
    fn funnel_holds_the_mover_near_the_maximum() {
        let mut f = funnel(1_000, 4_000);
        let (mut now, mut sleeps) = (Duration::ZERO, 0);
        while now < 300 * SEC {
            match f.gate(now) {
                Gate::Run => {
                    f.moved(128);
                    now += 10 * MS;
                }
                Gate::SleepUntil(until) => {
                    sleeps += 1;
                    now = until;
                }
            }
        }
        let kbps = f.moved_sectors / 2 / 300;
        // Deterministic: 3,978 KiB/s, just under the maximum, after 227 half-second sleeps.
        assert!(
            (3_900..=4_000).contains(&kbps),
            "{kbps} KiB/s after {sleeps} sleeps"
        );
        assert_eq!(sleeps, 227);
    }
}
