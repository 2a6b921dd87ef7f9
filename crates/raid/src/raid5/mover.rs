//! The grow's data mover: the background task that copies window after window into the new
//! geometry, checkpoints when the policy says, writes the new capacity's stripes past the old
//! data, and ends the grow (docs/layers/raid5-grow.md).
//!
//! Each step is one window or one checkpoint, so a quiesce (an online change, shutdown)
//! waits for at most one of them. Between steps the mover obeys, in this order: the
//! administrator's pause, a member being rebuilt (always waits), a failed member (waits or
//! goes on degraded, as the grow was asked), and the rate control (ALV's valve or md's
//! funnel). Before it waits for any of them it records a checkpoint, so that a user write
//! into copied data (which waits for one under the MD-Reshape policy) is never left waiting
//! on a mover that sleeps; but not before ALV's valve holds it for a period: a user write
//! there forces its own checkpoint, and the lazy rule (paper §2.3) writes metadata only when
//! a sliding window is used up or such a write comes. (A checkpoint at every closing of the
//! valve made ALV's metadata writes grow with the time the grow took under load, one every
//! two seconds or so, not with the log of the volume.)

use std::sync::Arc;
use std::time::Duration;

use strata_core::{poison, Activity, Result};

use super::array::Array;
use super::grow::{policy_of, Observed, Transfer};
use super::members::MemberState;
use super::reshape::{self, Gate, Grow, Policy, PolicyKind, RateControl, UnrecordedWrite};
use super::shape::Shape;

/// Bytes per member an ALV window reads and writes at most (the aggregation buffer: the
/// paper's runs used 1-4 MiB).
pub const AGGREGATION_BYTES: u64 = 2 << 20;
/// The same while no user I/O came since the last window: a window then waits on nobody, and
/// each reposition of a disk between its read and its write range costs less against a
/// larger transfer (measured in `strata sim alv`, offline, against the bandwidth bound:
/// 2.10x with 2 MiB in 256 KiB pieces, see docs/raid5-grow-sim.md). The first user request
/// waits for at most one such window; the next window is the busy size again. An explicit
/// `buffer-kib` sets both.
pub const QUIET_AGGREGATION_BYTES: u64 = 8 << 20;
/// How often a waiting mover looks again (pause, rebuild, failed member).
const WAIT: Duration = Duration::from_millis(100);

/// A grow's progress as `describe` shows it.
pub struct GrowStatus {
    pub activity: Activity,
    /// Detail lines (state, policy, rate, eta, counters).
    pub detail: Vec<(String, String)>,
}

/// What the mover does next.
enum Next {
    Again,
    Sleep(Duration),
    Done,
}

/// The mover's own state: the policy and the rate control.
struct MoverState {
    policy: Policy,
    aggregation_chunks: u64,
    /// The aggregation window while users are quiet.
    quiet_aggregation_chunks: u64,
    rate: Box<dyn RateControl>,
}

impl Array {
    /// Runs the grow under way in the background (see the module docs).
    pub fn spawn_grow(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let runtime = self.runtime.clone();
        self.background
            .spawn(self.runtime.as_ref(), move |worker| async move {
                let mut state = None;
                loop {
                    let step = worker.step().await;
                    let Some(array) = weak.upgrade() else { return };
                    let Some(step) = step else { return };
                    let state = match &mut state {
                        Some(state) => state,
                        None => match array.mover_state() {
                            Ok(Some(made)) => state.insert(made),
                            Ok(None) => return,
                            Err(error) => return array.mover_stopped(error),
                        },
                    };
                    match array.grow_step(state).await {
                        // Requests and other tasks get their turn between windows.
                        Ok(Next::Again) => tokio::task::yield_now().await,
                        Ok(Next::Sleep(time)) => {
                            drop((step, array));
                            runtime.sleep(time).await;
                        }
                        Ok(Next::Done) => return,
                        Err(error) => return array.mover_stopped(error),
                    }
                }
            });
    }

    fn mover_stopped(&self, error: strata_core::BlockError) {
        tracing::error!(array = %self.name, %error, "raid5: grow stopped; it resumes at the next start");
        if let Ok(mut stats) = self.grow_stats() {
            stats.stopped = Some(error.to_string());
        }
    }

    fn mover_state(&self) -> Result<Option<MoverState>> {
        let Some(record) = self.reshape_record()? else {
            return Ok(None);
        };
        let shape = self.shape();
        let grow = Grow {
            m: record.old_members,
            n: shape.layout.members - record.old_members,
        };
        let kind = policy_of(record.policy);
        let tuning = *poison::check(self.grow.tuning.lock(), &self.name, "the grow's tuning")?;
        let policy = tuning.apply(Policy::new(kind, grow, shape.layout.chunk_bytes));
        Ok(Some(MoverState {
            policy,
            aggregation_chunks: grow.aggregation_chunks(
                tuning.buffer_bytes.unwrap_or(AGGREGATION_BYTES),
                shape.layout.chunk_bytes,
            ),
            quiet_aggregation_chunks: grow.aggregation_chunks(
                tuning.buffer_bytes.unwrap_or(QUIET_AGGREGATION_BYTES),
                shape.layout.chunk_bytes,
            ),
            rate: policy.rate_control(self.runtime.now()),
        }))
    }

    /// One step of the mover.
    async fn grow_step(&self, state: &mut MoverState) -> Result<Next> {
        let Some(record) = self.reshape_record()? else {
            return Ok(Next::Done);
        };
        let members = self.members.snapshot();
        let rebuilding = members.iter().any(|m| m.state == MemberState::Rebuilding);
        let failed = members.iter().any(|m| m.state == MemberState::Failed);
        if record.paused || rebuilding || (failed && record.on_failure == 1) {
            self.checkpoint_now(false).await?;
            self.set_running(false)?;
            return Ok(Next::Sleep(WAIT));
        }
        let now = self.runtime.now();
        let seen = std::mem::take(&mut self.grow_stats()?.seen);
        let quiet = seen.completed == 0 && !seen.congested && self.no_user_requests();
        feed(state.rate.as_mut(), &seen, self.layout().members);
        if let Gate::SleepUntil(until) = state.rate.gate(now) {
            if state.policy.on_write_in_unrecorded() == UnrecordedWrite::Wait {
                self.checkpoint_now(false).await?;
            }
            self.set_running(false)?;
            return Ok(Next::Sleep(
                until.saturating_sub(now).max(Duration::from_millis(1)),
            ));
        }
        self.set_running(true)?;
        let shape = self.shape();
        let Some(moving) = shape.moving else {
            return Ok(Next::Done);
        };
        let total = shape.new_chunks();
        if moving.moved >= total {
            if moving.checkpoint < total {
                self.checkpoint_now(false).await?;
                return Ok(Next::Again);
            }
            self.finish_grow().await?;
            return Ok(Next::Done);
        }
        // Past the old data the windows go on to the end of the members: the new capacity's
        // stripes get their zeros and parity the same way.
        let aggregation = if quiet {
            state.quiet_aggregation_chunks
        } else {
            state.aggregation_chunks
        };
        let window =
            state
                .policy
                .next_window_until(moving.checkpoint, moving.moved, total, aggregation);
        let Some((lo, hi)) = window else {
            // The sliding window is used up: its checkpoint lets the next one start.
            self.checkpoint_now(false).await?;
            return Ok(Next::Again);
        };
        if state
            .policy
            .checkpoint_due(moving.checkpoint, moving.moved, (lo, hi))
        {
            self.checkpoint_now(false).await?;
            return Ok(Next::Again);
        }
        let transfer = Transfer::of(state.policy.io_unit(), quiet);
        self.move_window(&shape, transfer, lo, hi).await?;
        let rows = (hi - lo) / shape.layout.data_chunks() as u64;
        state.rate.moved(rows * shape.layout.chunk_bytes / 512);
        Ok(Next::Again)
    }

    fn set_running(&self, running: bool) -> Result<()> {
        let now = self.runtime.now();
        let moved = self.shape().moving.map_or(0, |m| m.moved);
        let mut stats = self.grow_stats()?;
        if running && !stats.running {
            stats.since = Some((now, moved));
        }
        stats.running = running;
        Ok(())
    }

    /// Copies chunks `[lo, hi)` to their new rows: block requests into them (waiting for the
    /// ones already in), read their old rows under the row locks (no user write tears the
    /// rest of those rows while they are read), lay them out, write the new rows whole with
    /// their parity, then open the window again with the boundary past it.
    async fn move_window(&self, shape: &Shape, transfer: Transfer, lo: u64, hi: u64) -> Result<()> {
        let _mover = self.grow.mover.lock().await;
        let moving = shape.moving.expect("a grow is under way");
        let old = moving.old;
        let grow = Grow {
            m: old.members,
            n: shape.layout.members - old.members,
        };
        self.change_boundaries(|m| m.inflight = Some((lo, hi)));
        self.drain(lo, hi).await;
        let copied = self.copy_window(shape, transfer, grow, lo, hi).await;
        // Requests waiting on the window go on whatever happened; it counts as moved only if
        // it was copied whole.
        self.change_boundaries(|m| {
            m.inflight = None;
            if copied.is_ok() {
                m.moved = hi;
            }
        });
        copied?;
        self.grow_stats()?.windows += 1;
        Ok(())
    }

    async fn copy_window(
        &self,
        shape: &Shape,
        transfer: Transfer,
        grow: Grow,
        lo: u64,
        hi: u64,
    ) -> Result<()> {
        let old = shape.moving.expect("a grow is under way").old;
        let old_chunks = shape.old_chunks();
        let io = reshape::window_io(grow, lo, hi, old_chunks);
        let sources = if io.reads.is_empty() {
            Vec::new()
        } else {
            let first = io.reads.iter().map(|r| r.first_row).min().unwrap_or(0);
            let last = io
                .reads
                .iter()
                .map(|r| r.first_row + r.rows)
                .max()
                .unwrap_or(0);
            let _rows = self.locks.write_range(first..last).await;
            self.read_window(old, &io.reads, transfer).await?
        };
        let buffers =
            reshape::shuffle(grow, lo, hi, old_chunks, &sources, old.chunk_bytes as usize);
        self.write_window(shape.layout, &io.writes, buffers, transfer)
            .await
    }

    /// Ends the grow: the new capacity is in use from here on.
    async fn finish_grow(&self) -> Result<()> {
        let _mover = self.grow.mover.lock().await;
        self.array_record()?.reshape = None;
        self.persist().await?;
        let mut shape = self.shape();
        shape.moving = None;
        self.set_shape(shape);
        *poison::check(self.activity.lock(), &self.name, "the grow progress")? = None;
        self.grow_stats()?.finished = Some(self.runtime.now());
        tracing::info!(array = %self.name, members = shape.layout.members, size = shape.layout.size(), "raid5: grow complete");
        Ok(())
    }

    /// The grow's progress for `describe`.
    pub fn grow_status(&self) -> Result<Option<GrowStatus>> {
        let Some(record) = self.reshape_record()? else {
            return Ok(None);
        };
        let shape = self.shape();
        let Some(moving) = shape.moving else {
            return Ok(None);
        };
        let chunk = shape.layout.chunk_bytes;
        let stats = self.grow_stats()?.clone();
        let now = self.runtime.now();
        let rate = stats.since.and_then(|(since, from)| {
            let seconds = now.saturating_sub(since).as_secs_f64();
            (seconds > 0.5 && stats.running)
                .then(|| (moving.moved.saturating_sub(from) * chunk) as f64 / seconds)
        });
        let left = (shape.new_chunks() - moving.moved) * chunk;
        let eta = rate
            .filter(|r| *r > 0.0)
            .map(|r| format!("{:.0} s", left as f64 / r))
            .unwrap_or_else(|| "unknown".into());
        let policy = policy_of(record.policy);
        let state = if record.paused {
            "paused by the administrator".to_string()
        } else if let Some(error) = &stats.stopped {
            format!("stopped: {error}")
        } else if stats.running {
            "moving".to_string()
        } else {
            match policy {
                PolicyKind::Alv => "held by the valve or waiting for a member".to_string(),
                PolicyKind::Md => "held by the speed limits or waiting for a member".to_string(),
            }
        };
        let activity = Activity {
            what: format!(
                "growing {} → {} members ({policy})",
                moving.old.members, shape.layout.members
            ),
            done_bytes: moving.moved * chunk,
            total_bytes: shape.new_chunks() * chunk,
        };
        let detail = vec![
            ("grow".into(), state),
            ("grow policy".into(), policy.to_string()),
            (
                "grow on failure".into(),
                if record.on_failure == 1 {
                    "wait for the replacement".into()
                } else {
                    "go on degraded".into()
                },
            ),
            (
                "grow rate".into(),
                rate.map_or("-".into(), |r| format!("{:.1} MiB/s", r / 1048576.0)),
            ),
            ("grow eta".into(), eta),
            (
                "grow checkpoint".into(),
                format!("{} bytes", moving.checkpoint * chunk),
            ),
            ("grow windows".into(), stats.windows.to_string()),
            ("grow metadata writes".into(), stats.checkpoints.to_string()),
            ("grow forced checkpoints".into(), stats.forced.to_string()),
            (
                "grow bytes read / written".into(),
                format!("{} / {}", stats.bytes_read, stats.bytes_written),
            ),
            (
                "grow I/Os read / written".into(),
                format!("{} / {}", stats.reads, stats.writes),
            ),
        ];
        Ok(Some(GrowStatus { activity, detail }))
    }

    /// What the last grow completed in this process did, for `describe` once it is over
    /// (empty if none did): its time from the start ("-" for a grow resumed after a
    /// restart), windows, metadata writes and bytes moved.
    pub fn last_grow_detail(&self) -> Result<Vec<(String, String)>> {
        let stats = self.grow_stats()?;
        let Some(finished) = stats.finished else {
            return Ok(Vec::new());
        };
        let time = stats.started.map_or("-".into(), |s| {
            format!("{:.3} s", finished.saturating_sub(s).as_secs_f64())
        });
        Ok(vec![
            ("last grow time".into(), time),
            ("last grow windows".into(), stats.windows.to_string()),
            (
                "last grow metadata writes".into(),
                stats.checkpoints.to_string(),
            ),
            (
                "last grow forced checkpoints".into(),
                stats.forced.to_string(),
            ),
            (
                "last grow bytes read / written".into(),
                format!("{} / {}", stats.bytes_read, stats.bytes_written),
            ),
            (
                "last grow I/Os read / written".into(),
                format!("{} / {}", stats.reads, stats.writes),
            ),
        ])
    }

    /// Pauses (true) or resumes the grow, durably.
    pub async fn pause_grow(&self, paused: bool) -> Result<()> {
        {
            let mut record = self.array_record()?;
            let Some(reshape) = record.reshape.as_mut() else {
                return Err(strata_core::BlockError::InvalidArgument(format!(
                    "raid5 {}: no grow is under way",
                    self.name
                )));
            };
            reshape.paused = paused;
        }
        self.persist().await?;
        tracing::info!(array = %self.name, paused, "raid5: grow {}", if paused { "paused" } else { "resumed" });
        Ok(())
    }
}

/// Hands what the data path saw to the rate control: every completed request (one arrival,
/// congested if any request had to wait), and the user sectors spread over the members.
fn feed(rate: &mut dyn RateControl, seen: &Observed, members: usize) {
    let mut congested = seen.congested;
    for &latency in &seen.latencies {
        rate.user_arrival(std::mem::take(&mut congested));
        rate.user_completion(latency);
    }
    if congested {
        rate.user_arrival(true);
    }
    let sectors = seen.bytes / 512;
    for member in 0..members {
        rate.user_sectors(member, sectors / members as u64);
    }
}
