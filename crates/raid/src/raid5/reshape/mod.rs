//! `reshape`: the pure policy of online RAID-5 grow A(m, n), ALV's and the MD-Reshape
//! baseline's, for an engine to drive. No I/O, no async, no locks: every function here is
//! arithmetic on chunk numbers or a small state machine fed with observations and times.
//!
//! Why ALV (G. Zhang, W. Zheng, J. Shu, "ALV: A New Data Redistribution Approach to RAID-5
//! Scaling", IEEE TC 2009; digest in `/work/shared/papers/alv-raid5-scaling.md`): growing
//! an m-disk RAID-5 by n disks while keeping round-robin order moves almost every chunk.
//! From the state where everything below x has moved, the next R(m,n,x) chunks can move in
//! any order without overwriting live data (Theorem 1, §1.3). ALV uses that freedom three
//! ways:
//!
//! - **Aggregation** (§2.2, `aggregate`): a window of whole new rows is read with one I/O
//!   per old member and written with one I/O per new member, full-stripe, so no parity is
//!   read.
//! - **Lazy checkpoints** (§2.3, `window`, `regions`): progress is recorded only when the
//!   sliding window (R from the checkpoint, aligned to new rows) is used up, or when a user
//!   write hits copied-but-unrecorded data. Copies never overwrite their originals inside
//!   the window (the row rule), so a crash only wastes work. Windows grow about N1/(m−1)
//!   times each, so checkpoints are logarithmic in the volume (31 sliding windows for
//!   Table 1's A(3,1), where the paper counts 28 metadata updates).
//! - **Valve** (§2.4, `valve`): the mover runs or sleeps per 1 s period by whether the last
//!   period saw congestion or too many requests slower than B.
//!
//! MD-Reshape (§3 "Baseline", §6; `md`) moves one new row at a time in 4 KiB units,
//! checkpoints every ~3 MB per data disk or on an overwrite hazard, makes user I/O into
//! the unrecorded range wait, and throttles with a min/max funnel.
//!
//! The start, [0, C) (§1.4), is the engine's: no stripe-aligned window fits there, so it
//! moves those rows through a backup and records C before calling `next_window`. The paper
//! does not address it; MD relies on mdadm's backup of the same region.
//!
//! Engine loop: `next_window` → if `checkpoint_due`, flush and record `moved` as the
//! checkpoint and ask again → move the window (`aggregate::window_io`, `shuffle`) → moved
//! = hi. User requests map through `regions::region`.
//!
//! Files: `window` (Theorem 1, sliding window, critical section), `aggregate` (window I/O
//! and the buffer shuffle), `regions` (user-request mapping, lazy-checkpoint rules),
//! `valve` (ALV's rate control), `md` (the baseline and its funnel).

pub mod aggregate;
pub mod md;
pub mod regions;
pub mod valve;
pub mod window;

#[cfg(test)]
mod proofs;
#[cfg(test)]
mod testkit;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use aggregate::{shuffle, window_io, MemberRows, WindowIo};
pub use md::{Funnel, FunnelConfig, Md, MdParams};
pub use regions::{Placement, Region};
pub use valve::{Valve, ValveConfig};
pub use window::Grow;

/// Which redistribution policy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Alv,
    Md,
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PolicyKind::Alv => "alv",
            PolicyKind::Md => "md",
        })
    }
}

impl FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<PolicyKind, String> {
        match s {
            "alv" => Ok(PolicyKind::Alv),
            "md" => Ok(PolicyKind::Md),
            other => Err(format!("unknown reshape policy {other:?} (alv or md)")),
        }
    }
}

/// What a user write into [ckpt, moved) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnrecordedWrite {
    /// Checkpoint at `moved` now, then serve the write in the new geometry (ALV, State 3 → 4).
    ForceCheckpoint,
    /// Sleep until the mover's next checkpoint (MD).
    Wait,
}

/// What a user read from [ckpt, moved) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnrecordedRead {
    /// Both copies are current; read the new one (ALV).
    UseNew,
    /// Sleep until the next checkpoint (MD's `make_request` blocks reads there too).
    Wait,
}

/// Whether the mover may start a window now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Run,
    /// Ask again at this time.
    SleepUntil(Duration),
}

/// Rate control behind one interface: the engine reports what it sees and asks before
/// each window. Each controller uses only the observations it needs (the valve: arrivals
/// and latencies; the funnel: sectors), so the rest default to doing nothing.
pub trait RateControl: Send {
    /// A user request arrived; `congested` if it could not enter service at once.
    fn user_arrival(&mut self, _congested: bool) {}
    /// A user request completed after `latency` inside the volume.
    fn user_completion(&mut self, _latency: Duration) {}
    /// `sectors` (512 B) of user I/O were issued to `member`.
    fn user_sectors(&mut self, _member: usize, _sectors: u64) {}
    /// The mover advanced by `sectors` per member.
    fn moved(&mut self, _sectors: u64) {}
    /// Whether the mover may start its next window at `now`.
    fn gate(&mut self, now: Duration) -> Gate;
}

impl RateControl for Valve {
    fn user_arrival(&mut self, congested: bool) {
        self.arrival(congested);
    }

    fn user_completion(&mut self, latency: Duration) {
        self.completion(latency);
    }

    fn gate(&mut self, now: Duration) -> Gate {
        if self.tick(now) {
            Gate::Run
        } else {
            Gate::SleepUntil(self.period_end())
        }
    }
}

/// ALV for one grow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Alv {
    pub grow: Grow,
    pub valve: ValveConfig,
}

impl Alv {
    /// The next aggregation window from `moved`: at most `aggregation_chunks` (rounded down
    /// to whole new rows, at least one), within the sliding window of `ckpt` if there is
    /// room left, else within the one a checkpoint at `moved` would open.
    pub fn next_window_until(
        &self,
        ckpt: u64,
        moved: u64,
        end: u64,
        aggregation_chunks: u64,
    ) -> Option<(u64, u64)> {
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
        assert!(
            moved >= self.grow.critical_end(),
            "[0, {}) is the critical section: move it through the backup first",
            self.grow.critical_end()
        );
        let sliding = match self.grow.sliding_end(ckpt) {
            Some(e) if e > moved => e,
            _ => self
                .grow
                .sliding_end(moved)
                .expect("every position from C opens a window"),
        };
        let aggregation = (aggregation_chunks / n1).max(1) * n1;
        let hi = (moved + aggregation).min(sliding).min(end);
        assert!(hi > moved && hi.is_multiple_of(n1));
        Some((moved, hi))
    }

    pub fn checkpoint_due(&self, ckpt: u64, moved: u64, window: (u64, u64)) -> bool {
        assert_eq!(window.0, moved, "windows start where the moved data end");
        regions::checkpoint_before(window.1, self.grow.sliding_end(ckpt))
    }
}

/// A redistribution policy: what the engine asks before each window and on user I/O.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    Alv(Alv),
    Md(Md),
}

impl Policy {
    /// `kind`'s policy with the paper's defaults (§4).
    pub fn new(kind: PolicyKind, grow: Grow, chunk_bytes: u64) -> Policy {
        match kind {
            PolicyKind::Alv => Policy::Alv(Alv {
                grow: Grow::new(grow.m, grow.n),
                valve: ValveConfig::default(),
            }),
            PolicyKind::Md => Policy::Md(Md::new(grow, MdParams::new(chunk_bytes))),
        }
    }

    pub fn kind(&self) -> PolicyKind {
        match self {
            Policy::Alv(_) => PolicyKind::Alv,
            Policy::Md(_) => PolicyKind::Md,
        }
    }

    pub fn grow(&self) -> Grow {
        match self {
            Policy::Alv(alv) => alv.grow,
            Policy::Md(md) => md.grow,
        }
    }

    /// C: the engine moves [0, min(C, end)) through its backup before the first
    /// `next_window` (which refuses to start below C) and records that as the checkpoint.
    pub fn critical_end(&self) -> u64 {
        self.grow().critical_end()
    }

    /// The next window [lo, hi) from `moved` (multiples of N1, hi ≤ the sliding end, ≤ the
    /// old data rounded up to a whole new row), or None when the data are all moved.
    pub fn next_window(
        &self,
        ckpt: u64,
        moved: u64,
        old_total: u64,
        aggregation_chunks: u64,
    ) -> Option<(u64, u64)> {
        let end = self.grow().round_up(old_total);
        self.next_window_until(ckpt, moved, end, aggregation_chunks)
    }

    /// As `next_window`, to an explicit `end` (a multiple of N1): MD reshapes to the end of
    /// the members, zero-filling the tail.
    pub fn next_window_until(
        &self,
        ckpt: u64,
        moved: u64,
        end: u64,
        aggregation_chunks: u64,
    ) -> Option<(u64, u64)> {
        match self {
            Policy::Alv(alv) => alv.next_window_until(ckpt, moved, end, aggregation_chunks),
            Policy::Md(md) => md.next_window_until(ckpt, moved, end),
        }
    }

    /// Whether `moved` must be recorded as the checkpoint before `next_window` moves. Never
    /// true when `ckpt == moved`, so the engine's loop always makes progress.
    pub fn checkpoint_due(&self, ckpt: u64, moved: u64, next_window: (u64, u64)) -> bool {
        match self {
            Policy::Alv(alv) => alv.checkpoint_due(ckpt, moved, next_window),
            Policy::Md(md) => md.checkpoint_due(ckpt, moved, next_window),
        }
    }

    /// Bytes per redistribution I/O: None for one I/O per member range (ALV), Some(4096)
    /// for MD's page-sized stripe heads.
    pub fn io_unit(&self) -> Option<u64> {
        match self {
            Policy::Alv(_) => None,
            Policy::Md(_) => Some(md::IO_UNIT_BYTES),
        }
    }

    pub fn on_write_in_unrecorded(&self) -> UnrecordedWrite {
        match self {
            Policy::Alv(_) => UnrecordedWrite::ForceCheckpoint,
            Policy::Md(_) => UnrecordedWrite::Wait,
        }
    }

    pub fn on_read_in_unrecorded(&self) -> UnrecordedRead {
        match self {
            Policy::Alv(_) => UnrecordedRead::UseNew,
            Policy::Md(_) => UnrecordedRead::Wait,
        }
    }

    /// A fresh rate controller whose clock starts at `now`.
    pub fn rate_control(&self, now: Duration) -> Box<dyn RateControl> {
        match self {
            Policy::Alv(alv) => Box::new(Valve::new(alv.valve, now)),
            Policy::Md(md) => Box::new(md.funnel(now)),
        }
    }
}
