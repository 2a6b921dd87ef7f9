//! Growing a served array by adding members (ALV; docs/layers/raid5-grow.md).
//!
//! `start_grow` (the `grow-members` control, under the stack's quiesce) puts the new members
//! in, records the grow and moves the *critical section*: the first `C` chunks, where no
//! window that leaves the old copies intact fits yet (`reshape::window`). Those are moved
//! through a backup written first to every new member's last rows, which nothing else uses
//! until the very end of the grow (md keeps its backup in a file, or in a new device's spare
//! room the same way). From `C` on the mover (`mover`) copies windows that never overwrite
//! an old copy it may still need, and records progress lazily.
//!
//! Requests during a grow are routed by `Shape` and registered, with the chunks they touch,
//! for as long as they are served (`Routed`). The mover changes the shape under the same
//! lock. Only the start of a window needs to wait for requests: those already in flight
//! inside it. Every other boundary move leaves each request's route valid: a window's end
//! moves no chunk anyone is using (requests into it wait), and a checkpoint only makes
//! copied chunks writable in the new geometry, where their reads already go.
//!
//! A checkpoint (`checkpoint_now`): flush every member (the copies it records must be
//! durable), commit the record, then empty the journals. The last step matters: a journal
//! record of an old-geometry write to a row the next windows will overwrite must not be
//! replayed over the new contents after a crash.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use futures_util::StreamExt;
use strata_core::{poison, BlockError, Member, Result, WriteFlags, ZeroFlags};
use tokio::sync::watch;

use super::array::{Array, Fault};
use super::journal::{device_bytes, device_journal_base, least_bytes, Journal, JBLOCK};
use super::layout::Layout;
use super::members::{MemberState, META_BYTES};
use super::plan::xor_into;
use super::record::{ReshapePhase, ReshapeRecord};
use super::reshape::{self, Grow, PolicyKind};
use super::shape::{Moving, Piece, Route, Shape};

/// ALV's I/O per member per window is one sequential stream, issued in pieces of this size,
/// [`STREAM_DEPTH`] at a time: sequential on the disk (each piece starts where the last
/// ended), but a user request to that member waits behind at most that many pieces (2.5 ms
/// each at 100 MiB/s) instead of the whole window's range (measured: p99 of 4 KiB user I/O
/// during a grow, 2.34x of none with one I/O per range).
pub const STREAM_PIECE: u64 = 256 << 10;
/// Pieces of one stream in flight at once. Measured with `bench/raid5_grow.sh` (members at
/// 100 MiB/s): one piece at a time, user p99 during a grow 1.24x of none; two at a time,
/// 1.47x. One keeps the latency target with a margin. The stream is for windows moved while
/// users are about; with none, [`Transfer::Whole`] keeps an offline grow near the bandwidth
/// bound (docs/layers/raid5-grow.md).
pub const STREAM_DEPTH: usize = 1;

/// How the mover sends a window's member ranges to the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// MD-Reshape: I/Os of this many bytes, all issued at once; reads take only the data
    /// blocks of the source rows (md reads its source stripes' data, not their parity).
    Units(u64),
    /// ALV while users are about: one sequential stream per member in [`STREAM_PIECE`]
    /// pieces, [`STREAM_DEPTH`] at a time, old parity read through.
    Stream,
    /// ALV with no user I/O since its last window: each member's range in one I/O, so that
    /// the disk streams it without waiting for the host between pieces.
    Whole,
}

impl Transfer {
    /// md's units, or ALV's stream or whole ranges as the users are about or not.
    pub fn of(unit: Option<u64>, quiet: bool) -> Transfer {
        match (unit, quiet) {
            (Some(unit), _) => Transfer::Units(unit.max(1)),
            (None, false) => Transfer::Stream,
            (None, true) => Transfer::Whole,
        }
    }
}

/// How a grow is asked to run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GrowOptions {
    pub policy: PolicyKind,
    /// With a member failed: wait for its replacement (true) or go on degraded.
    pub wait_on_failure: bool,
    pub tuning: GrowTuning,
}

/// The rate control's knobs for one grow, where they differ from the paper's defaults
/// (options `bound-ms`, `slack` for ALV's valve, `buffer-kib` for its windows; `speed-min`,
/// `speed-max` for md's funnel, `stripe-cache` for md's pipeline).
/// For experiments (the sensitivity sweeps of `strata sim alv`): kept in memory only, not in
/// the record, so a grow resumed after a restart runs with the defaults again.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GrowTuning {
    /// The valve's latency bound B (default 15 ms).
    pub latency_bound: Option<Duration>,
    /// The valve's slack θ (default 0.1).
    pub slack: Option<f64>,
    /// ALV's aggregation buffer per member in bytes (default 2 MiB, the paper's; its §5.7
    /// varies it from 1 to 4 MB).
    pub buffer_bytes: Option<u64>,
    /// md's `speed_limit_min` in KiB/s per member (default 1,000).
    pub speed_min_kibps: Option<u64>,
    /// md's `speed_limit_max` in KiB/s per member (default 200,000).
    pub speed_max_kibps: Option<u64>,
    /// md's stripe cache in entries (`stripe_cache_size`; default 512, the paper's): it
    /// bounds the rows md moves at once.
    pub stripe_cache_pages: Option<u64>,
}

impl GrowTuning {
    /// `policy` with these knobs set; a knob of the other policy's rate control is ignored
    /// (the options refuse that combination before it gets here).
    pub fn apply(&self, policy: reshape::Policy) -> reshape::Policy {
        match policy {
            reshape::Policy::Alv(mut alv) => {
                if let Some(bound) = self.latency_bound {
                    alv.valve.latency_bound = bound;
                }
                if let Some(slack) = self.slack {
                    alv.valve.slack = slack;
                }
                reshape::Policy::Alv(alv)
            }
            reshape::Policy::Md(mut md) => {
                let funnel = &mut md.params.funnel;
                if let Some(min) = self.speed_min_kibps {
                    funnel.speed_limit_min_kbps = min;
                }
                if let Some(max) = self.speed_max_kibps {
                    funnel.speed_limit_max_kbps = max;
                }
                if let Some(pages) = self.stripe_cache_pages {
                    md.params.stripe_cache_pages = pages;
                }
                assert!(
                    funnel.speed_limit_min_kbps <= funnel.speed_limit_max_kbps,
                    "md's minimum speed is above its maximum"
                );
                reshape::Policy::Md(md)
            }
        }
    }
}

/// What the data path and the mover share during a grow.
pub struct GrowControl {
    /// Requests routed during a grow and not finished; held while the shape changes, so that
    /// a request is routed and registered against one shape.
    pub requests: Mutex<InFlight>,
    /// A registered request finished.
    pub finished: tokio::sync::Notify,
    /// Bumped after every boundary move, so that a request waiting on one routes again.
    pub changed: watch::Sender<u64>,
    /// One window or one checkpoint at a time.
    pub mover: tokio::sync::Mutex<()>,
    pub stats: Mutex<GrowStats>,
    /// The knobs the grow was started with (defaults after a restart).
    pub tuning: Mutex<GrowTuning>,
}

impl Default for GrowControl {
    fn default() -> Self {
        GrowControl {
            requests: Mutex::new(InFlight::default()),
            finished: tokio::sync::Notify::new(),
            changed: watch::Sender::new(0),
            mover: tokio::sync::Mutex::new(()),
            stats: Mutex::new(GrowStats::default()),
            tuning: Mutex::new(GrowTuning::default()),
        }
    }
}

/// Requests routed during a grow: id → the chunks `[lo, hi)` they touch.
#[derive(Default)]
pub struct InFlight {
    next: u64,
    ranges: std::collections::BTreeMap<u64, (u64, u64)>,
}

impl InFlight {
    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    fn overlaps(&self, lo: u64, hi: u64) -> bool {
        self.ranges.values().any(|&(a, b)| a < hi && lo < b)
    }
}

/// A request's registration while it is served; dropping it tells a waiting mover.
pub struct Routed<'a> {
    array: &'a Array,
    id: Option<u64>,
}

impl Drop for Routed<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let grow = &self.array.grow;
            grow.requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .ranges
                .remove(&id);
            grow.finished.notify_waiters();
        }
    }
}

/// Counters of the grow under way (shown by `describe`), and the user I/O the rate control
/// looks at.
#[derive(Clone, Debug, Default)]
pub struct GrowStats {
    pub windows: u64,
    /// Checkpoints recorded (metadata writes of the grow).
    pub checkpoints: u64,
    /// Checkpoints a user write forced (ALV's lazy rule).
    pub forced: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Member I/Os the grow issued (one per member range for ALV, one per 4 KiB for md),
    /// metadata and journals not counted.
    pub reads: u64,
    pub writes: u64,
    /// Runtime time the mover started (or resumed) and the chunks moved then: the rate.
    pub since: Option<(Duration, u64)>,
    /// Whether the rate control let the mover run in the last period.
    pub running: bool,
    /// User I/O since the rate control last looked.
    pub seen: Observed,
    /// Why the mover stopped, if it did on an error.
    pub stopped: Option<String>,
    /// Runtime time this grow was started (in this process), and when it ended: `describe`
    /// keeps the counters of the last grow as "last grow …" lines once it is done.
    pub started: Option<Duration>,
    pub finished: Option<Duration>,
}

/// User requests the rate control has not looked at yet.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// A request could not go in at once (it waited for a window or a checkpoint): ALV's
    /// congestion signal.
    pub congested: bool,
    /// Time inside the array of each completed request (bounded: a period's worth is plenty
    /// to count latecomers).
    pub latencies: Vec<Duration>,
    /// Requests completed, latencies kept or not.
    pub completed: u64,
    /// Bytes of user I/O (MD's idleness test).
    pub bytes: u64,
}

/// Latencies kept per period; beyond, requests are counted but not timed.
const KEPT_LATENCIES: usize = 65_536;

impl Observed {
    pub fn completed(&mut self, latency: Duration, bytes: u64) {
        self.completed += 1;
        self.bytes += bytes;
        if self.latencies.len() < KEPT_LATENCIES {
            self.latencies.push(latency);
        }
    }
}

impl Array {
    pub(crate) fn grow_stats(&self) -> Result<std::sync::MutexGuard<'_, GrowStats>> {
        poison::check(self.grow.stats.lock(), &self.name, "the grow counters")
    }

    pub(crate) fn set_shape(&self, shape: Shape) {
        self.change_shape(|now| *now = shape);
    }

    /// Changes the shape under the request lock (see the module docs).
    fn change_shape(&self, change: impl FnOnce(&mut Shape)) {
        let _requests = self.grow.requests.lock().unwrap_or_else(|p| p.into_inner());
        let mut shape = self.shape.write().unwrap_or_else(|p| p.into_inner());
        change(&mut shape);
        drop(shape);
        self.grow.changed.send_modify(|n| *n += 1);
    }

    /// Changes the grow's boundaries.
    pub(crate) fn change_boundaries(&self, change: impl FnOnce(&mut Moving)) {
        self.change_shape(|shape| {
            if let Some(moving) = shape.moving.as_mut() {
                change(moving);
            }
        });
    }

    /// Waits until no request routed before now touches chunks `[lo, hi)` (the window the
    /// mover just closed to new ones).
    pub(crate) async fn drain(&self, lo: u64, hi: u64) {
        loop {
            let finished = self.grow.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            let busy = self
                .grow
                .requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .overlaps(lo, hi);
            if !busy {
                return;
            }
            finished.await;
        }
    }

    /// No user request is being served through the grow's routing.
    pub(crate) fn no_user_requests(&self) -> bool {
        self.grow
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The grow under way, as recorded.
    pub fn reshape_record(&self) -> Result<Option<ReshapeRecord>> {
        Ok(self.array_record()?.reshape.clone())
    }

    /// Cuts a request into pieces of one geometry each and returns them with the guard to
    /// hold while they are served (None when no grow is under way). Waits while the request
    /// touches the window being moved; a write into copied-but-unrecorded data first gets
    /// its checkpoint (ALV) or waits for the mover's (MD-Reshape).
    pub async fn route(
        &self,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<(Vec<Piece>, Routed<'_>)> {
        let unregistered = Routed {
            array: self,
            id: None,
        };
        loop {
            let shape = self.shape();
            if shape.moving.is_none() {
                // Grows start only with the stack's I/O quiesced, so a request that saw no
                // grow cannot be overtaken by one.
                let pieces = shape.pieces(offset, len, write).expect("no grow, no block");
                return Ok((pieces, unregistered));
            }
            let mut changed = self.grow.changed.subscribe();
            let blocked = {
                let mut requests = self.grow.requests.lock().unwrap_or_else(|p| p.into_inner());
                match self.shape().pieces(offset, len, write) {
                    Ok(pieces) => {
                        let chunk = self.layout().chunk_bytes;
                        let range = (offset / chunk, (offset + len).div_ceil(chunk));
                        let id = requests.next;
                        requests.next += 1;
                        requests.ranges.insert(id, range);
                        return Ok((
                            pieces,
                            Routed {
                                array: self,
                                id: Some(id),
                            },
                        ));
                    }
                    Err(blocked) => blocked,
                }
            };
            self.grow_stats()?.seen.congested = true;
            match blocked {
                Route::Checkpoint if self.policy()? == PolicyKind::Alv => {
                    self.checkpoint_now(true).await?
                }
                // MD-Reshape: wait for the mover's next checkpoint; a window in flight: wait
                // for its end. Either moves a boundary. A mover that stopped (an error, the
                // array failing) must not leave a request waiting forever: after a second
                // without a move the request records the checkpoint itself.
                _ => {
                    let timeout = self.runtime.sleep(Duration::from_secs(1));
                    // Biased: tokio picks a ready branch at random otherwise, which makes a
                    // simulated run depend on more than its seed.
                    tokio::select! {
                        biased;
                        _ = changed.changed() => {}
                        _ = timeout => {
                            if blocked == Route::Checkpoint {
                                self.checkpoint_now(true).await?;
                            }
                        }
                    }
                }
            }
        }
    }

    pub fn policy(&self) -> Result<PolicyKind> {
        Ok(policy_of(self.reshape_record()?.map_or(0, |r| r.policy)))
    }

    /// Records a user request's time inside the array for the rate control (during a grow).
    pub fn observe(&self, started: Duration, bytes: u64) {
        if self.shape().moving.is_none() {
            return;
        }
        let latency = self.runtime.now().saturating_sub(started);
        if let Ok(mut stats) = self.grow_stats() {
            stats.seen.completed(latency, bytes);
        }
    }

    /// Makes everything copied so far the durable checkpoint: flush the members, commit the
    /// record, empty the journals, then move the boundary. `forced`: a user write asked.
    pub async fn checkpoint_now(&self, forced: bool) -> Result<()> {
        let _mover = self.grow.mover.lock().await;
        let Some(moving) = self.shape().moving else {
            return Ok(());
        };
        if moving.moved == moving.checkpoint {
            return Ok(());
        }
        self.flush_all().await?;
        {
            let mut record = self.array_record()?;
            let reshape = record.reshape.as_mut().expect("a grow is recorded");
            reshape.checkpoint = moving.moved;
            reshape.phase = ReshapePhase::Moving;
        }
        self.persist().await?;
        self.reset_journals().await?;
        self.change_boundaries(|m| m.checkpoint = moving.moved);
        let mut stats = self.grow_stats()?;
        stats.checkpoints += 1;
        stats.forced += u64::from(forced);
        Ok(())
    }

    /// Starts growing onto `added` (under the stack's quiesce: no request is in flight).
    /// Returns once the grow is durably recorded and its critical section moved; the rest
    /// runs in the background.
    pub async fn start_grow(
        self: &Arc<Self>,
        added: Vec<Member>,
        options: GrowOptions,
    ) -> Result<()> {
        let invalid =
            |what: String| BlockError::InvalidArgument(format!("raid5 {}: {what}", self.name));
        let shape = self.shape();
        if shape.moving.is_some() {
            return Err(invalid(
                "a grow is already under way (`strata status` shows it)".into(),
            ));
        }
        if added.is_empty() {
            return Err(invalid("grow needs at least one new disk".into()));
        }
        let old = shape.layout;
        if self.members.unhealthy() > 0 {
            return Err(invalid(
                "a member is failed or rebuilding: grow a healthy array (replace and rebuild first)".into(),
            ));
        }
        if !self.lost_chunks()?.is_empty() {
            return Err(invalid(
                "chunks lost in an earlier crash are still marked (rewrite them first): a grow would move them".into(),
            ));
        }
        let (m, n) = (old.members, added.len());
        let grow = Grow { m, n };
        let new = Layout::new(m + n, old.chunk_bytes, old.data_start, old.stripes);
        let need = old.data_start + old.stripes * old.chunk_bytes;
        for member in &added {
            let size = member.device.geometry().size;
            if size < need {
                return Err(invalid(format!(
                    "{} has {size} bytes; a member of this array needs {need}",
                    member.name
                )));
            }
            if member.device.geometry().min_io > 4096 {
                return Err(invalid(format!("{} must accept 4 KiB I/O", member.name)));
            }
        }
        let (journal_bytes, uuid) = {
            let record = self.array_record()?;
            (record.journal_bytes, record.uuid)
        };
        let least = least_bytes((m + n) as u64 * old.chunk_bytes + JBLOCK);
        if journal_bytes < least {
            return Err(invalid(format!(
                "its stripe journal ({journal_bytes} bytes per member) is too small for {} members of {}-byte chunks (at least {least}); the journal size is fixed at creation",
                m + n,
                old.chunk_bytes
            )));
        }
        if let Some(device) = &self.journal_device {
            let needed = device_bytes(m + n, journal_bytes);
            if device.geometry().size < needed {
                return Err(invalid(format!(
                    "the journal device has {} bytes; {} journals need {needed}",
                    device.geometry().size,
                    m + n
                )));
            }
        }
        let critical = Critical::new(grow, old);
        if critical.backup_row(old) <= critical.new_rows() {
            return Err(invalid(format!(
                "{} stripes are too few to grow {m} → {} members (the first {} chunks move through a backup that needs {} stripes)",
                old.stripes,
                m + n,
                critical.chunks,
                critical.backup_rows(old)
            )));
        }
        // Counters start from zero for each grow (they outlive it, for "last grow" lines).
        *self.grow_stats()? = GrowStats {
            started: Some(self.runtime.now()),
            ..GrowStats::default()
        };
        // The new members' journals are zeroed before any record names them: recovery reads
        // zeros as an empty journal.
        let zero = ZeroFlags {
            may_trim: false,
            ..Default::default()
        };
        for (i, member) in added.iter().enumerate() {
            match &self.journal_device {
                Some(device) => {
                    device
                        .write_zeroes(
                            device_journal_base(m + i, journal_bytes),
                            journal_bytes,
                            zero,
                        )
                        .await?
                }
                None => {
                    member
                        .device
                        .write_zeroes(META_BYTES, journal_bytes, zero)
                        .await?
                }
            }
        }
        // Members in: a copy of the metadata region each (under the copy gate, so no commit
        // slips between the copy and the member joining the mirror), a journal each.
        {
            let _copy = self.members.copy_gate.write().await;
            let region = self.metadata_region().await?;
            for member in &added {
                member
                    .device
                    .write(0, region.clone(), WriteFlags { fua: true })
                    .await?;
            }
            let max_record = (m + n) as u64 * old.chunk_bytes + JBLOCK;
            let mut journals = self.journals.write().unwrap_or_else(|p| p.into_inner());
            for (i, member) in added.iter().enumerate() {
                let index = m + i;
                self.members.add(
                    member.device.clone(),
                    super::members::Member {
                        state: MemberState::Active,
                        cursor: 0,
                        extra: Default::default(),
                        durable: false,
                    },
                );
                let base = match &self.journal_device {
                    Some(_) => device_journal_base(index, journal_bytes),
                    None => META_BYTES,
                };
                journals.push(Arc::new(Journal::new(
                    index,
                    base,
                    journal_bytes,
                    max_record,
                    uuid,
                )));
            }
        }
        self.set_shape(Shape {
            layout: new,
            moving: Some(Moving {
                old,
                checkpoint: 0,
                moved: 0,
                inflight: None,
                unrecorded_reads_wait: options.policy == PolicyKind::Md,
            }),
        });
        // Every journal starts a new epoch: records of old-geometry writes to the rows the
        // critical section rewrites must never be replayed over them.
        self.reset_journals().await?;
        // A random id ties the backup to this grow: one left by an earlier grow of this array
        // on the same disk is never taken for it.
        let grow_id = self.runtime.random_u64();
        let sources = critical.read(self, old).await?;
        critical.write_backup(self, &sources, uuid, grow_id).await?;
        {
            let mut record = self.array_record()?;
            record.members = m + n;
            record
                .states
                .extend((0..n).map(|_| (MemberState::Active, 0)));
            record.reshape = Some(ReshapeRecord {
                old_members: m,
                policy: policy_code(options.policy),
                phase: ReshapePhase::Critical,
                paused: false,
                on_failure: u8::from(options.wait_on_failure),
                checkpoint: 0,
                grow_id,
                added: added.iter().map(|m| m.name.clone()).collect(),
            });
        }
        self.persist().await?;
        *poison::check(self.grow.tuning.lock(), &self.name, "the grow's tuning")? = options.tuning;
        tracing::info!(array = %self.name, from = m, to = m + n, policy = %options.policy, "raid5: grow started");
        critical.write_rows(self, &sources).await?;
        self.finish_critical(critical.chunks).await?;
        self.spawn_grow();
        Ok(())
    }

    /// The critical section's rows are written: flush, record the checkpoint past them.
    async fn finish_critical(&self, chunks: u64) -> Result<()> {
        self.flush_all().await?;
        {
            let mut record = self.array_record()?;
            let reshape = record.reshape.as_mut().expect("a grow is recorded");
            reshape.phase = ReshapePhase::Moving;
            reshape.checkpoint = chunks;
        }
        self.persist().await?;
        let mut shape = self.shape();
        if let Some(moving) = shape.moving.as_mut() {
            moving.checkpoint = chunks;
            moving.moved = chunks;
        }
        self.set_shape(shape);
        Ok(())
    }

    /// At open, in the critical phase: the rows may be half rewritten; the backup on the new
    /// members holds what they must hold.
    pub async fn redo_critical(&self) -> Result<()> {
        let shape = self.shape();
        let moving = shape.moving.expect("a grow is under way");
        let grow = Grow {
            m: moving.old.members,
            n: shape.layout.members - moving.old.members,
        };
        let critical = Critical::new(grow, moving.old);
        let (uuid, grow_id) = {
            let record = self.array_record()?;
            (
                record.uuid,
                record.reshape.as_ref().map_or(0, |r| r.grow_id),
            )
        };
        let sources = critical.read_backup(self, uuid, grow_id).await?;
        critical.write_rows(self, &sources).await?;
        self.finish_critical(critical.chunks).await?;
        tracing::info!(array = %self.name, "raid5: grow's critical section redone from its backup");
        Ok(())
    }

    /// Reads every old member's rows of a window (`reads`), reconstructing a failed old
    /// member's from the others (the rows are whole old stripes, intact with their parity).
    /// Each range goes as `transfer` says.
    pub async fn read_window(
        &self,
        old: Layout,
        reads: &[reshape::MemberRows],
        transfer: Transfer,
    ) -> Result<Vec<Vec<u8>>> {
        let chunk = old.chunk_bytes;
        let first = reads.iter().map(|r| r.first_row).min().unwrap_or(0);
        let last = reads
            .iter()
            .map(|r| r.first_row + r.rows)
            .max()
            .unwrap_or(0);
        for _ in 0..=old.members {
            let failed = self.members.unusable(first, old.members)?;
            let result = match failed {
                None => {
                    let all =
                        join_all(reads.iter().map(|r| self.read_rows(old, r, transfer))).await;
                    all.into_iter()
                        .collect::<std::result::Result<Vec<_>, Fault>>()
                }
                Some(missing) => {
                    // Every other old member's rows over the whole span, XORed.
                    let span = (last - first) * chunk;
                    let offset = old.member_offset(first, 0);
                    {
                        let mut stats = self.grow_stats()?;
                        stats.reads += old.members as u64 - 1;
                        stats.bytes_read += span * (old.members as u64 - 1);
                    }
                    let others = (0..old.members).filter(|&m| m != missing);
                    let all = join_all(others.map(|m| async move {
                        self.m_read(m, offset, span).await.map(|b| (m, b))
                    }))
                    .await;
                    match all
                        .into_iter()
                        .collect::<std::result::Result<Vec<_>, Fault>>()
                    {
                        Err(fault) => Err(fault),
                        Ok(spans) => {
                            let mut rebuilt = vec![0u8; span as usize];
                            for (_, bytes) in &spans {
                                xor_into(&mut rebuilt, bytes);
                            }
                            let of = |m: usize| -> &[u8] {
                                if m == missing {
                                    &rebuilt
                                } else {
                                    &spans.iter().find(|(i, _)| *i == m).expect("read").1
                                }
                            };
                            Ok(reads
                                .iter()
                                .map(|r| {
                                    let at = ((r.first_row - first) * chunk) as usize;
                                    of(r.member)[at..at + (r.rows * chunk) as usize].to_vec()
                                })
                                .collect())
                        }
                    }
                }
            };
            match result {
                Ok(buffers) => return Ok(buffers),
                Err(fault) => self.fail(fault).await?,
            }
        }
        Err(Array::io_error(format!(
            "raid5 {}: a grow window could not be read",
            self.name
        )))
    }

    /// One old member's rows of a window, as `transfer` says (md's units over its data rows
    /// only, the parity rows left as zeros: the shuffle drops them).
    async fn read_rows(
        &self,
        old: Layout,
        rows: &reshape::MemberRows,
        transfer: Transfer,
    ) -> std::result::Result<Vec<u8>, Fault> {
        let chunk = old.chunk_bytes;
        let (member, len) = (rows.member, rows.rows * chunk);
        let offset = old.member_offset(rows.first_row, 0);
        let unit = match transfer {
            Transfer::Units(unit) => unit.min(chunk),
            Transfer::Whole => {
                self.count_reads(1, len);
                return self.m_read(member, offset, len).await;
            }
            Transfer::Stream => {
                let pieces = len.div_ceil(STREAM_PIECE);
                self.count_reads(pieces, len);
                let pieces = (0..pieces).map(|i| {
                    let at = i * STREAM_PIECE;
                    self.m_read(member, offset + at, STREAM_PIECE.min(len - at))
                });
                let mut stream = futures_util::stream::iter(pieces).buffered(STREAM_DEPTH);
                let mut out = Vec::with_capacity(len as usize);
                while let Some(piece) = stream.next().await {
                    out.extend(piece?);
                }
                return Ok(out);
            }
        };
        let data_rows: Vec<u64> = (rows.first_row..rows.end_row())
            .filter(|&row| old.parity_member(row) != member)
            .collect();
        let units = chunk.div_ceil(unit);
        self.count_reads(
            data_rows.len() as u64 * units,
            data_rows.len() as u64 * chunk,
        );
        let parts = data_rows.iter().flat_map(|&row| {
            (0..units).map(move |i| {
                let at = i * unit;
                let offset = old.member_offset(row, at);
                async move {
                    (
                        row,
                        at,
                        self.m_read(member, offset, unit.min(chunk - at)).await,
                    )
                }
            })
        });
        let mut out = vec![0u8; len as usize];
        for (row, at, part) in join_all(parts).await {
            let start = ((row - rows.first_row) * chunk + at) as usize;
            let part = part?;
            out[start..start + part.len()].copy_from_slice(&part);
        }
        Ok(out)
    }

    fn count_reads(&self, ios: u64, bytes: u64) {
        if let Ok(mut stats) = self.grow_stats() {
            stats.reads += ios;
            stats.bytes_read += bytes;
        }
    }

    /// Writes a window's new rows (`writes`, one buffer each) to every member but a failed
    /// one (its share is in the new parity), as `transfer` says.
    pub async fn write_window(
        &self,
        new: Layout,
        writes: &[reshape::MemberRows],
        buffers: Vec<Vec<u8>>,
        transfer: Transfer,
    ) -> Result<()> {
        let all = join_all(writes.iter().zip(buffers).map(|(w, bytes)| async move {
            if self.members.is_failed(w.member) {
                return Ok(0);
            }
            let len = bytes.len() as u64;
            let offset = new.member_offset(w.first_row, 0);
            let bytes = Bytes::from(bytes);
            let step = match transfer {
                Transfer::Units(unit) => unit,
                Transfer::Stream => STREAM_PIECE,
                Transfer::Whole => len.max(1),
            };
            let ios = len.div_ceil(step);
            // md's units all at once; ALV's stream a piece at a time.
            let depth = match transfer {
                Transfer::Stream => STREAM_DEPTH,
                Transfer::Units(_) | Transfer::Whole => (ios as usize).max(1),
            };
            if let Ok(mut stats) = self.grow_stats() {
                stats.writes += ios;
            }
            let pieces = (0..ios).map(|i| {
                let at = i * step;
                let part = bytes.slice(at as usize..(at + step).min(len) as usize);
                self.m_write(w.member, offset + at, part, false)
            });
            let mut stream = futures_util::stream::iter(pieces).buffer_unordered(depth);
            while let Some(done) = stream.next().await {
                done?;
            }
            Ok(len)
        }))
        .await;
        for result in all {
            match result {
                Ok(bytes) => self.grow_stats()?.bytes_written += bytes,
                Err(fault) => self.fail(fault).await?,
            }
        }
        Ok(())
    }
}

/// The record's code for a policy.
pub fn policy_code(policy: PolicyKind) -> u8 {
    match policy {
        PolicyKind::Alv => 0,
        PolicyKind::Md => 1,
    }
}

pub fn policy_of(code: u8) -> PolicyKind {
    match code {
        1 => PolicyKind::Md,
        _ => PolicyKind::Alv,
    }
}

/// The first chunks of a grow, `[0, C)`: moved in one step from a backup (module docs).
struct Critical {
    grow: Grow,
    chunks: u64,
    io: reshape::WindowIo,
}

const BACKUP_MAGIC: u32 = 0x5335_4742; // "S5GB"
const BACKUP_VERSION: u32 = 1;
const BACKUP_HEADER: usize = 64;

impl Critical {
    fn new(grow: Grow, old: Layout) -> Critical {
        let chunks = grow.critical_end();
        let old_chunks = old.stripes * old.data_chunks() as u64;
        Critical {
            grow,
            chunks,
            io: reshape::window_io(grow, 0, chunks, old_chunks),
        }
    }

    /// New rows the critical section writes.
    fn new_rows(&self) -> u64 {
        self.chunks / self.grow.n1()
    }

    fn source_bytes(&self, chunk: u64) -> u64 {
        self.io.reads.iter().map(|r| r.rows * chunk).sum()
    }

    /// Rows of a new member the backup takes (a header block, then the source rows).
    fn backup_rows(&self, old: Layout) -> u64 {
        (JBLOCK + self.source_bytes(old.chunk_bytes)).div_ceil(old.chunk_bytes)
    }

    /// The first of them: the member's last rows, which only the grow's very end writes.
    fn backup_row(&self, old: Layout) -> u64 {
        old.stripes.saturating_sub(self.backup_rows(old))
    }

    async fn read(&self, array: &Array, old: Layout) -> Result<Vec<Vec<u8>>> {
        array
            .read_window(old, &self.io.reads, Transfer::Stream)
            .await
    }

    fn old(&self, array: &Array) -> Layout {
        array.shape().moving.expect("a grow is under way").old
    }

    async fn write_backup(
        &self,
        array: &Array,
        sources: &[Vec<u8>],
        uuid: [u8; 16],
        grow_id: u64,
    ) -> Result<()> {
        let old = self.old(array);
        let data: Vec<u8> = sources.concat();
        let mut header = Vec::with_capacity(JBLOCK as usize);
        header.extend(BACKUP_MAGIC.to_le_bytes());
        header.extend(BACKUP_VERSION.to_le_bytes());
        header.extend(uuid);
        header.extend(grow_id.to_le_bytes());
        header.extend((self.grow.m as u32).to_le_bytes());
        header.extend((self.grow.n as u32).to_le_bytes());
        header.extend(self.chunks.to_le_bytes());
        header.extend((data.len() as u64).to_le_bytes());
        header.extend(crc32c::crc32c(&data).to_le_bytes());
        let crc = crc32c::crc32c(&header);
        header.extend(crc.to_le_bytes());
        debug_assert_eq!(header.len(), BACKUP_HEADER);
        header.resize(JBLOCK as usize, 0);
        let mut unit = header;
        unit.extend(data);
        let offset = old.member_offset(self.backup_row(old), 0);
        let unit = Bytes::from(unit);
        for member in old.members..old.members + self.grow.n {
            if let Err(fault) = array.m_write(member, offset, unit.clone(), false).await {
                array.fail(fault).await?;
            }
            let flushed = match array.members.device(member) {
                Some(device) => device.flush().await.is_ok(),
                None => false,
            };
            if !flushed {
                array.fail_member(member).await?;
            }
        }
        Ok(())
    }

    /// The sources from the first new member whose backup is whole and this grow's.
    async fn read_backup(
        &self,
        array: &Array,
        uuid: [u8; 16],
        grow_id: u64,
    ) -> Result<Vec<Vec<u8>>> {
        let old = self.old(array);
        let chunk = old.chunk_bytes;
        let len = self.source_bytes(chunk);
        let offset = old.member_offset(self.backup_row(old), 0);
        let mut why = Vec::new();
        for member in old.members..old.members + self.grow.n {
            let bytes = match array.m_read(member, offset, JBLOCK + len).await {
                Ok(bytes) => bytes,
                Err(_) => {
                    why.push(format!("member {member}: unreadable"));
                    continue;
                }
            };
            match self.check_backup(&bytes, uuid, grow_id, len) {
                Ok(()) => {
                    let mut at = JBLOCK as usize;
                    return Ok(self
                        .io
                        .reads
                        .iter()
                        .map(|r| {
                            let part = (r.rows * chunk) as usize;
                            at += part;
                            bytes[at - part..at].to_vec()
                        })
                        .collect());
                }
                Err(reason) => why.push(format!("member {member}: {reason}")),
            }
        }
        Err(BlockError::Corrupt(format!(
            "raid5 {}: a grow was cut short in its critical section and no new member holds a whole backup of it ({}); the array is not started, because its first stripes may be half rewritten",
            array.name,
            why.join("; ")
        )))
    }

    fn check_backup(
        &self,
        bytes: &[u8],
        uuid: [u8; 16],
        grow_id: u64,
        len: u64,
    ) -> std::result::Result<(), String> {
        let header = &bytes[..BACKUP_HEADER];
        let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap());
        if u32_at(0) != BACKUP_MAGIC || u32_at(4) != BACKUP_VERSION {
            return Err("no backup header".into());
        }
        if crc32c::crc32c(&header[..BACKUP_HEADER - 4]) != u32_at(BACKUP_HEADER - 4) {
            return Err("backup header fails its checksum".into());
        }
        if header[8..24] != uuid || u64_at(24) != grow_id {
            return Err("the backup belongs to another array or another grow".into());
        }
        if u32_at(32) as usize != self.grow.m
            || u32_at(36) as usize != self.grow.n
            || u64_at(40) != self.chunks
            || u64_at(48) != len
        {
            return Err("the backup is of another shape".into());
        }
        let data = &bytes[JBLOCK as usize..(JBLOCK + len) as usize];
        if crc32c::crc32c(data) != u32_at(56) {
            return Err("backup data fail their checksum".into());
        }
        Ok(())
    }

    async fn write_rows(&self, array: &Array, sources: &[Vec<u8>]) -> Result<()> {
        let shape = array.shape();
        let old = shape.moving.expect("a grow is under way").old;
        let old_chunks = old.stripes * old.data_chunks() as u64;
        let buffers = reshape::shuffle(
            self.grow,
            0,
            self.chunks,
            old_chunks,
            sources,
            old.chunk_bytes as usize,
        );
        array
            .write_window(shape.layout, &self.io.writes, buffers, Transfer::Stream)
            .await
    }
}
