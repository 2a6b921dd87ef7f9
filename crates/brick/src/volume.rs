//! A shared volume as a block device, for the host that serves it to its clients: striped
//! over mirror sets of bricks (RAIN-10; one brick per set is RAIN-0), every write buffered
//! until the client's flush, and each flush one consistency interval committed on every
//! brick it touches, or on none.
//!
//! Replicas are kept identical by the interval itself: a write goes to every brick of its set
//! that is up. A brick that does not answer a prepare is taken down (unless it holds the last
//! current copy of something) and the interval is retried without it, after the regions it
//! misses are recorded in etcd (`Coord::mark_stale`): no host then reads them from it. When it
//! answers again, only those regions are copied back to it, each as an interval of its own,
//! before this host's next interval (RAIN-10's policy is `strata_cluster::rain`).
//!
//! Hosts share a volume by its lock segments (`crate::segments`): a write first claims its
//! segments for this host, the claims stay pinned until the write's interval has ended, and
//! every prepare carries their epochs, which the bricks check. Within the host, lock-aware
//! clients take byte-range locks ([`SharedVolume::lock`]); an unlock commits what is pending
//! first, so a range passes to the next holder only with its writes in place.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use std::collections::BTreeSet;
use strata_cluster::interval::{Decision, IntervalId};
use strata_cluster::locks::{Mode, RangeLocks};
use strata_cluster::rain::Rain10;
use strata_coord::session::{Heartbeat, MemberRecord, Session};
use strata_coord::Coord;
use strata_core::{
    async_trait, Activity, BlockDevice, BlockError, Capabilities, Control, ControlReply, Geometry,
    Health, NodeStatus, Result, WriteFlags,
};

use crate::commit::{run_interval, OVERLAP_REFUSAL};
use crate::rpc::{BrickClient, RpcError, MAX_MESSAGE};
use crate::segments::{Pin, SegmentClaims};

/// Writes buffered past this are committed as an interval of their own, before the flush:
/// one brick's share of an interval travels in one message.
const MAX_PENDING: u64 = (MAX_MESSAGE / 4) as u64;

/// How many intervals end between two rounds of telling the bricks to forget them.
const FORGET_EVERY: u64 = 64;

/// How long a segment claim nothing pins and nobody wants is kept: a host streaming writes,
/// or locking over and over, keeps its segments; a host waiting for one says so, and gets it
/// as soon as nothing pins it (`segments`).
const CLAIM_LINGER: Duration = Duration::from_secs(2);

/// Local locks never expire on their own: they live as long as their holder's `RangeLock`.
const LOCAL_LEASE_MS: u64 = u64::MAX / 4;

/// How often a brick that stopped answering is probed, in the background, to see if it is
/// back. A brick that is black-holed rather than gone costs a probe the whole timeout; the
/// flushes never wait for one.
const PROBE_PAUSE: Duration = Duration::from_millis(250);

pub struct SharedVolume {
    name: String,
    coord: Coord,
    /// Each brick's name in the catalog, by index.
    brick_names: Vec<String>,
    geometry: Geometry,
    unit: u64,
    /// Each mirror set's bricks, as indices into `bricks`.
    sets: Vec<Vec<usize>>,
    bricks: Vec<BrickClient>,
    /// Placement and the round-robin of reads over a set's copies.
    rain: Mutex<Rain10>,
    session: Session,
    heartbeat: Mutex<Option<Heartbeat>>,
    /// This host's claims on the volume's lock segments.
    claims: Arc<SegmentClaims>,
    _releaser: AbortOnDrop,
    /// How long a request waits for a brick, a segment or a lock.
    timeout: Duration,
    /// Byte-range locks of this host's lock holders, and a wake-up for their waiters.
    locks: Mutex<RangeLocks>,
    unlocked: tokio::sync::Notify,
    /// Per brick: whether it answers, as far as this host knows. A brick that did not answer
    /// is probed in the background until it does; until then no flush sends it anything (no
    /// owed decision, no probe, no copy back), so a brick that is unreachable without
    /// refusing connections (a cut link) costs the flushes nothing.
    reach: Vec<Arc<Mutex<Reach>>>,
    /// The copy back under way, for `strata status`.
    resyncing: Mutex<Option<Activity>>,
    counters: VolumeCounters,
    state: tokio::sync::Mutex<State>,
}

/// What this host's intervals came to, for `strata status`.
#[derive(Default)]
struct VolumeCounters {
    committed: AtomicU64,
    aborted: AtomicU64,
    regions_copied: AtomicU64,
}

#[derive(Default)]
struct Reach {
    /// A request to it failed, and no probe has seen it answer since.
    unreachable: bool,
    /// A background probe is running.
    probing: bool,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A holder of byte-range locks on this host: a thread, a connection, a test client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockOwner(strata_cluster::locks::Session);

/// A byte-range lock held; give it back with [`SharedVolume::unlock`].
pub struct RangeLock {
    owner: LockOwner,
    token: u64,
    range: Range<u64>,
    pin: Pin,
}

impl RangeLock {
    pub fn range(&self) -> Range<u64> {
        self.range.clone()
    }

    /// The fencing token of the local grant.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// `(segment, epoch)` of the segment claims the lock stands on.
    pub fn fences(&self) -> &[(u32, i64)] {
        self.pin.fences()
    }
}

struct State {
    /// Written since the last interval, in order: a later write wins where they overlap.
    pending: Vec<(u64, Bytes)>,
    pending_bytes: u64,
    next_seq: u64,
    /// Intervals ended on every brick since the bricks were last told to forget.
    ended_since_forget: u64,
    /// Decisions a brick has not acknowledged: delivered before anything else goes to it,
    /// and the brick is not read from until they are.
    owed: BTreeMap<usize, Vec<(IntervalId, Decision)>>,
    /// The segment claims the pending writes stand on, held until they are committed.
    pins: Vec<Pin>,
    pinned: BTreeSet<u32>,
}

fn io_error(context: String) -> BlockError {
    BlockError::Io {
        context,
        source: std::io::Error::other("shared volume"),
    }
}

impl SharedVolume {
    /// Opens `volume` from the cluster's catalog, joining the cluster as `member` (a client).
    /// The session's lease id names this host's intervals: when the host dies and its lease
    /// runs out, the bricks resolve what it left in doubt.
    pub async fn open(
        coord: &Coord,
        volume: &str,
        member: &str,
        timeout: Duration,
        lease: Duration,
    ) -> anyhow::Result<SharedVolume> {
        let record = coord.volume(volume).await?.record;
        let catalog = coord.bricks().await?;
        let mut bricks = Vec::new();
        let brick_names: Vec<String> = record.bricks().cloned().collect();
        for name in record.bricks() {
            let brick = catalog
                .iter()
                .find(|b| &b.record.name == name)
                .ok_or_else(|| {
                    anyhow::anyhow!("brick {name} of volume {volume} is not in the catalog")
                })?;
            bricks.push(BrickClient::new(&brick.record.address, timeout)?);
        }
        let copies = record.copies();
        let sets: Vec<Vec<usize>> = (0..record.mirror_sets.len())
            .map(|set| (set * copies..(set + 1) * copies).collect())
            .collect();
        let session = Session::open(
            coord,
            MemberRecord {
                name: member.to_string(),
                role: "client".into(),
                address: String::new(),
            },
            lease,
        )
        .await?;
        let heartbeat = session.heartbeat();
        let claims = SegmentClaims::new(
            coord.clone(),
            session.clone(),
            volume,
            record.size_bytes,
            record.segment_bytes,
            CLAIM_LINGER,
        );
        let releaser = AbortOnDrop(claims.spawn_releaser());
        tracing::info!(
            volume,
            member,
            client = session.lease(),
            bricks = bricks.len(),
            "shared volume opened"
        );
        let mut rain = Rain10::new(record.unit_bytes, record.unit_bytes, sets.clone());
        for (brick, regions) in coord.stale(volume).await? {
            let index = brick_names
                .iter()
                .position(|b| *b == brick)
                .ok_or_else(|| {
                    anyhow::anyhow!("a stale record names brick {brick}, not of volume {volume}")
                })?;
            tracing::warn!(
                volume,
                brick,
                regions = regions.len(),
                "brick is stale: not read from until copied back"
            );
            rain.restore(index, regions);
        }
        let reach = (0..brick_names.len())
            .map(|_| Arc::new(Mutex::new(Reach::default())))
            .collect();
        Ok(SharedVolume {
            name: volume.to_string(),
            coord: coord.clone(),
            brick_names,
            geometry: Geometry {
                size: record.size_bytes,
                min_io: 512,
                logical_block: 512,
                physical_block: 4096,
                preferred_io: record.unit_bytes.min(1 << 20) as u32,
                max_io: 4 << 20,
            },
            unit: record.unit_bytes,
            rain: Mutex::new(rain),
            sets,
            bricks,
            session,
            heartbeat: Mutex::new(Some(heartbeat)),
            claims,
            _releaser: releaser,
            timeout,
            locks: Mutex::new(RangeLocks::new(LOCAL_LEASE_MS)),
            unlocked: tokio::sync::Notify::new(),
            reach,
            resyncing: Mutex::new(None),
            counters: VolumeCounters::default(),
            state: tokio::sync::Mutex::new(State {
                pending: Vec::new(),
                pending_bytes: 0,
                next_seq: 1,
                ended_since_forget: 0,
                owed: BTreeMap::new(),
                pins: Vec::new(),
                pinned: BTreeSet::new(),
            }),
        })
    }

    /// The id this host's intervals carry: its session's lease.
    pub fn client_id(&self) -> u64 {
        self.session.lease() as u64
    }

    /// Test-only: stops renewing the lease, as a host paused past it (SIGSTOP) would.
    #[doc(hidden)]
    pub fn stop_heartbeat(&self) {
        self.heartbeat.lock().unwrap().take();
    }

    /// The segments this host holds now, with their epochs.
    pub fn claimed_segments(&self) -> Vec<(u32, i64)> {
        self.claims.held()
    }

    /// A new holder of byte-range locks on this host.
    pub fn lock_owner(&self) -> LockOwner {
        LockOwner(self.locks.lock().unwrap().join(0))
    }

    /// Locks `[offset, offset + len)` for `owner`: first the segments it meets are claimed
    /// for this host (waiting for other hosts to give them back), then this host's own
    /// conflicting locks are waited for. Fails with a message naming the holder after the
    /// volume's timeout. Shared locks share only within a host: across hosts a segment has
    /// one holder at a time.
    pub async fn lock(
        &self,
        owner: LockOwner,
        offset: u64,
        len: u64,
        mode: Mode,
    ) -> Result<RangeLock> {
        self.check(offset, len)?;
        let deadline = Instant::now() + self.timeout;
        let segments = self.claims.segments_of(offset, len);
        let pin = self
            .claims
            .acquire(&segments, self.timeout)
            .await
            .map_err(|e| io_error(format!("volume {}: {e}", self.name)))?;
        let range = offset..offset + len;
        loop {
            // Registered before the attempt, so an unlock between the two is not missed.
            let notified = self.unlocked.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let attempt = self
                .locks
                .lock()
                .unwrap()
                .trylock(owner.0, range.clone(), mode, 0);
            match attempt {
                Ok(grant) => {
                    return Ok(RangeLock {
                        owner,
                        token: grant.token,
                        range,
                        pin,
                    })
                }
                Err(strata_cluster::locks::LockError::Conflict(holder)) => {
                    if Instant::now() >= deadline {
                        return Err(io_error(format!(
                            "volume {}: [{}, {}) is locked on this host by {:?} (token {}); \
                             waited {:?}",
                            self.name,
                            holder.range.start,
                            holder.range.end,
                            holder.session,
                            holder.token,
                            self.timeout
                        )));
                    }
                }
                Err(other) => return Err(BlockError::InvalidArgument(other.to_string())),
            }
            let _ = tokio::time::timeout_at(deadline.into(), notified).await;
        }
    }

    /// Gives a lock back. What this host has pending is committed first: a range passes to
    /// the next holder, here or on another host, only with its writes in place. If that
    /// commit fails, its error is returned and the lock is released all the same; the
    /// segments under the uncommitted writes stay this host's until they are committed.
    pub async fn unlock(&self, lock: RangeLock) -> Result<()> {
        let committed = self.flush().await;
        let RangeLock {
            owner, token, pin, ..
        } = lock;
        let released = self.locks.lock().unwrap().unlock(owner.0, token, 0);
        self.unlocked.notify_waiters();
        // A segment another host wants goes back once this was its last pin; the others stay
        // this host's, so the next lock here costs no etcd round trip.
        drop(pin);
        released.map_err(|e| BlockError::InvalidArgument(e.to_string()))?;
        committed
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry.check_range(offset, len)?;
        if !offset.is_multiple_of(512) || !len.is_multiple_of(512) {
            return Err(BlockError::InvalidArgument(format!(
                "[{offset}, +{len}) is not in whole 512-byte sectors"
            )));
        }
        Ok(())
    }

    /// Cuts `[offset, offset + len)` at stripe-unit boundaries: (volume offset, set, offset
    /// on the set's bricks, length) per piece.
    fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, usize, u64, u64)> {
        let rain = self.rain.lock().unwrap();
        let mut out = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let take = (self.unit - at % self.unit).min(offset + len - at);
            let place = rain.place(at);
            out.push((at, place.set, place.offset, take));
            at += take;
        }
        out
    }

    /// Delivers what bricks are owed; the ones still unreachable keep their debt. A brick
    /// no probe has seen answer since it last failed is not tried: it keeps its debt at no
    /// cost to the flush.
    async fn settle(&self, state: &mut State) {
        let owed = std::mem::take(&mut state.owed);
        for (brick, decisions) in owed {
            let mut left = Vec::new();
            for (id, decision) in decisions {
                if !left.is_empty() || !self.answers(brick) {
                    left.push((id, decision));
                    continue;
                }
                match self.bricks[brick].decide(id, decision).await {
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(volume = %self.name, brick, %error, "decision still owed");
                        self.unreachable(brick);
                        left.push((id, decision));
                    }
                }
            }
            if !left.is_empty() {
                state.owed.insert(brick, left);
            }
        }
    }

    /// Whether `brick` may be sent something: it has not failed a request since a probe last
    /// saw it answer.
    fn answers(&self, brick: usize) -> bool {
        !self.reach[brick].lock().unwrap().unreachable
    }

    /// `brick` did not answer a request: nothing more is sent to it from the flushes until a
    /// background probe sees it answer (every `PROBE_PAUSE`, each probe bounded by the
    /// timeout). The probe ends when it does, or when the volume is dropped.
    fn unreachable(&self, brick: usize) {
        let mut reach = self.reach[brick].lock().unwrap();
        reach.unreachable = true;
        if reach.probing {
            return;
        }
        reach.probing = true;
        let (weak, client) = (
            Arc::downgrade(&self.reach[brick]),
            self.bricks[brick].clone(),
        );
        let (volume, name) = (self.name.clone(), self.brick_names[brick].clone());
        tokio::spawn(async move {
            let probe = IntervalId { client: 0, seq: 0 };
            loop {
                tokio::time::sleep(PROBE_PAUSE).await;
                let answered = client.status(probe).await.is_ok();
                let Some(reach) = weak.upgrade() else {
                    return;
                };
                if answered {
                    let mut reach = reach.lock().unwrap();
                    reach.unreachable = false;
                    reach.probing = false;
                    tracing::info!(%volume, brick = %name, "brick answers again");
                    return;
                }
            }
        });
    }

    /// Takes in what other hosts recorded as stale since this host last looked: it must not
    /// read those regions from those bricks either.
    async fn refresh_stale(&self) {
        // No longer than the lease has left: an etcd that went silent must not keep the flush
        // waiting past it, only for the lease check after to refuse the interval.
        let left = self.session.time_left();
        let Ok(read) = tokio::time::timeout(left, self.coord.stale(&self.name)).await else {
            tracing::warn!(volume = %self.name, waited = ?left, "no answer from etcd about stale bricks before the lease's end");
            return;
        };
        match read {
            Ok(stale) => {
                let mut rain = self.rain.lock().unwrap();
                for (name, regions) in stale {
                    let Some(brick) = self.brick_names.iter().position(|b| *b == name) else {
                        continue;
                    };
                    if !rain.is_down(brick) && regions.iter().any(|&r| rain.is_current(brick, r)) {
                        tracing::warn!(volume = %self.name, brick = %name, "another host recorded this brick stale");
                        rain.restore(brick, regions);
                    }
                }
            }
            Err(error) => {
                tracing::warn!(volume = %self.name, %error, "cannot read which bricks are stale")
            }
        }
    }

    fn set_of(&self, brick: usize) -> usize {
        (self.sets.iter())
            .position(|set| set.contains(&brick))
            .expect("every brick is in a set")
    }

    fn next_id(&self, state: &mut State) -> IntervalId {
        let id = IntervalId {
            client: self.client_id(),
            seq: state.next_seq,
        };
        state.next_seq += 1;
        id
    }

    /// Copies back to each brick that was down and answers again the regions it missed, from
    /// a current copy, each region as an interval on that brick alone.
    async fn resync(&self, state: &mut State) {
        for brick in 0..self.bricks.len() {
            // A brick back but with regions left to copy (their segments were busy, or no
            // copy could be read) is tried again at every interval until it is in sync.
            let (in_sync, down) = {
                let rain = self.rain.lock().unwrap();
                (rain.in_sync(brick), rain.is_down(brick))
            };
            if in_sync || state.owed.contains_key(&brick) {
                continue;
            }
            let probe = IntervalId { client: 0, seq: 0 };
            if down && !self.answers(brick) {
                continue;
            }
            if down && self.bricks[brick].status(probe).await.is_err() {
                self.unreachable(brick);
                continue;
            }
            let regions = self.rain.lock().unwrap().returned(brick);
            let name = &self.brick_names[brick];
            tracing::info!(volume = %self.name, brick = %name, regions = regions.len(), "brick is back: copying what it missed");
            let mut copied = BTreeSet::new();
            for (done, region) in regions.iter().enumerate() {
                *self.resyncing.lock().unwrap() = Some(Activity {
                    what: format!("copying back to {name} what it missed"),
                    done_bytes: done as u64 * self.unit,
                    total_bytes: regions.len() as u64 * self.unit,
                });
                let source = self.rain.lock().unwrap().source(brick, *region);
                let Some(source) = source else {
                    tracing::warn!(volume = %self.name, brick = %name, region, "no current copy reachable");
                    continue;
                };
                // The region is one stripe unit of the volume: its writer's segment must be
                // this host's, or the copy could overwrite that writer's newer data.
                let set = self.set_of(brick);
                let at = (region * self.sets.len() as u64 + set as u64) * self.unit;
                let segments = self
                    .claims
                    .segments_of(at, self.unit.min(self.geometry.size - at));
                let pin = match self.claims.acquire(&segments, Duration::ZERO).await {
                    Ok(pin) => pin,
                    Err(error) => {
                        tracing::debug!(volume = %self.name, brick = %name, region, %error, "region left for later");
                        continue;
                    }
                };
                let offset = region * self.unit;
                let data = match self.bricks[source].read(offset, self.unit as u32).await {
                    Ok(data) => data,
                    Err(error) => {
                        tracing::warn!(volume = %self.name, %error, "resync read failed");
                        continue;
                    }
                };
                let id = self.next_id(state);
                let writes = BTreeMap::from([(brick, vec![(offset, data)])]);
                let outcome = run_interval(&self.bricks, id, writes, pin.fences()).await;
                drop(pin);
                if outcome.ended() {
                    self.rain.lock().unwrap().copied(brick, *region);
                    copied.insert(*region);
                    self.counters.regions_copied.fetch_add(1, Ordering::Relaxed);
                } else if outcome.silent.is_empty() && outcome.unacked.is_empty() {
                    // Refused (the brick holds another host's interval there undecided, say):
                    // the region waits for a later interval.
                    tracing::info!(volume = %self.name, brick = %name, region, refusals = ?outcome.refusals, "region copy refused: left for later");
                } else {
                    for &b in &outcome.unacked {
                        state
                            .owed
                            .entry(b)
                            .or_default()
                            .push((id, outcome.decision));
                    }
                    tracing::warn!(volume = %self.name, brick = %name, "brick went away again during resync");
                    self.unreachable(brick);
                    let _ = self.rain.lock().unwrap().down(brick);
                    break;
                }
            }
            *self.resyncing.lock().unwrap() = None;
            if let Err(error) = self.coord.clear_stale(&self.name, name, &copied).await {
                // Harmless but for the next opener: it copies these again.
                tracing::warn!(volume = %self.name, %error, "copied regions not cleared in etcd");
            }
            tracing::info!(volume = %self.name, brick = %name, copied = copied.len(), of = regions.len(), "resync done");
        }
    }

    /// Commits what is pending as one interval on every brick that is up, or fails. A brick
    /// that does not answer is taken down and the interval retried without it.
    async fn commit(&self, state: &mut State) -> Result<()> {
        let result = self.commit_pending(state).await;
        // Claims are given back only once nothing is owed: a brick holding this host's
        // interval undecided must not take the next holder's writes first.
        self.claims.keep_all(!state.owed.is_empty());
        result
    }

    /// Refuses to commit once this host's lease may have run out: its segment claims may be
    /// another host's.
    fn check_live(&self) -> Result<()> {
        if !self.session.is_live() {
            return Err(io_error(format!(
                "volume {}: this host's lease ran out or was not renewed in time, so its \
                 segment claims may be another's; its writes are refused",
                self.name
            )));
        }
        Ok(())
    }

    async fn commit_pending(&self, state: &mut State) -> Result<()> {
        if state.pending.is_empty() {
            return Ok(());
        }
        self.check_live()?;
        // Every segment written is pinned since its write; the bricks check these epochs.
        let fences: Vec<(u32, i64)> = state
            .pins
            .iter()
            .flat_map(|pin| pin.fences().iter().copied())
            .collect::<BTreeMap<u32, i64>>()
            .into_iter()
            .collect();
        self.settle(state).await;
        self.refresh_stale().await;
        self.resync(state).await;
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(5);
        let mut downs = 0;
        while downs <= self.bricks.len() {
            // A brick that owes an earlier decision cannot take a later interval: it would
            // apply them out of order. It counts as down until it is paid.
            for &brick in state.owed.keys() {
                let mut rain = self.rain.lock().unwrap();
                if !rain.is_down(brick) {
                    rain.down(brick).map_err(|e| {
                        io_error(format!(
                            "volume {}: {e}; it owes an earlier decision",
                            self.name
                        ))
                    })?;
                    tracing::warn!(volume = %self.name, brick = %self.brick_names[brick], "brick owes a decision: going on without it");
                }
            }
            let id = self.next_id(state);
            let (writes, missed) = self.plan(&state.pending)?;
            for (brick, regions) in &missed {
                self.coord
                    .mark_stale(&self.name, &self.brick_names[*brick], regions)
                    .await
                    .map_err(|e| {
                        io_error(format!(
                            "volume {}: brick {} is down and what it misses cannot be recorded: {e}",
                            self.name, self.brick_names[*brick]
                        ))
                    })?;
            }
            let outcome_bricks = writes.len();
            let touched: BTreeMap<usize, BTreeSet<u64>> = writes
                .iter()
                .map(|(&brick, list)| {
                    let regions = list.iter().map(|(offset, _)| offset / self.unit).collect();
                    (brick, regions)
                })
                .collect();
            // Checked again here: what came before (etcd, bricks) may have taken long enough
            // for the lease to lapse.
            self.check_live()?;
            let outcome = run_interval(&self.bricks, id, writes, &fences).await;
            for &brick in outcome.unacked.iter().chain(&outcome.silent) {
                self.unreachable(brick);
            }
            for &brick in &outcome.unacked {
                state
                    .owed
                    .entry(brick)
                    .or_default()
                    .push((id, outcome.decision));
            }
            let counter = match outcome.decision {
                Decision::Commit => &self.counters.committed,
                Decision::Abort => &self.counters.aborted,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            match outcome.decision {
                Decision::Commit => {
                    state.pending.clear();
                    state.pending_bytes = 0;
                    state.pins.clear();
                    state.pinned.clear();
                    // Durable once one brick has recorded the commit: the others, if this
                    // host dies, find it when they resolve the interval. With none, a crash
                    // of them all would leave it prepared everywhere, and resolved as an
                    // abort: the write must not be reported done. It stays owed to them.
                    if outcome.unacked.len() == outcome_bricks {
                        return Err(io_error(format!(
                            "volume {}: interval {} is committed but no brick acknowledged it; \
                             it becomes visible when they return",
                            self.name, id.seq
                        )));
                    }
                    // A brick that did not acknowledge holds the interval undecided, its
                    // regions not yet home: no host may read them from it, this one dead
                    // or not, until they are copied back.
                    for &brick in &outcome.unacked {
                        self.coord
                            .mark_stale(&self.name, &self.brick_names[brick], &touched[&brick])
                            .await
                            .map_err(|e| {
                                io_error(format!(
                                    "volume {}: interval {} committed, but brick {} did not \
                                     acknowledge it and that cannot be recorded: {e}",
                                    self.name, id.seq, self.brick_names[brick]
                                ))
                            })?;
                        let mut rain = self.rain.lock().unwrap();
                        if !rain.is_down(brick) {
                            let regions = touched[&brick].iter().copied();
                            let mut dirty: BTreeSet<u64> = regions.collect();
                            // What it already missed stays missed.
                            let brick_regions = self
                                .geometry
                                .size
                                .div_ceil(self.unit)
                                .div_ceil(self.sets.len() as u64);
                            dirty
                                .extend((0..brick_regions).filter(|&r| !rain.is_current(brick, r)));
                            rain.restore(brick, dirty);
                            tracing::warn!(volume = %self.name, brick = %self.brick_names[brick], "brick did not acknowledge a commit: going on without it");
                        }
                    }
                    if outcome.unacked.is_empty() && state.owed.is_empty() {
                        self.forget_ended(state);
                    }
                    return Ok(());
                }
                // A brick still holds another client's interval over these writes undecided
                // (a host that died or paused mid-commit, or one owing it a decision): this
                // one must wait until that is settled, or it could land first.
                Decision::Abort
                    if !outcome.refusals.is_empty()
                        && outcome.silent.is_empty()
                        && (outcome.refusals.iter())
                            .all(|(_, why)| why.contains(OVERLAP_REFUSAL))
                        && Instant::now() < deadline =>
                {
                    tracing::debug!(volume = %self.name, refusals = ?outcome.refusals, "waiting for an earlier interval to be settled");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Decision::Abort if outcome.refusals.is_empty() && !outcome.silent.is_empty() => {
                    downs += 1;
                    let mut rain = self.rain.lock().unwrap();
                    for &brick in &outcome.silent {
                        rain.down(brick).map_err(|e| {
                            io_error(format!(
                                "volume {}: interval {} aborted: {e}",
                                self.name, id.seq
                            ))
                        })?;
                        tracing::warn!(volume = %self.name, brick = %self.brick_names[brick], "brick down: going on without it");
                    }
                }
                // The writes stay pending (and readable here): the next flush tries again.
                Decision::Abort => {
                    return Err(io_error(format!(
                        "volume {}: interval {} aborted (refused: {:?}; unanswered: {:?})",
                        self.name,
                        id.seq,
                        outcome.refusals,
                        outcome
                            .silent
                            .iter()
                            .map(|&b| self.bricks[b].address())
                            .collect::<Vec<_>>()
                    )))
                }
            }
        }
        Err(io_error(format!(
            "volume {}: no interval committed",
            self.name
        )))
    }

    /// Each brick's writes for the pending writes, and the regions of bricks that are down
    /// which they touch.
    #[allow(clippy::type_complexity)]
    fn plan(
        &self,
        pending: &[(u64, Bytes)],
    ) -> Result<(
        BTreeMap<usize, Vec<(u64, Bytes)>>,
        BTreeMap<usize, BTreeSet<u64>>,
    )> {
        let mut writes: BTreeMap<usize, Vec<(u64, Bytes)>> = BTreeMap::new();
        let mut missed: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
        for (offset, data) in pending {
            for (at, set, brick_offset, len) in self.pieces(*offset, data.len() as u64) {
                let from = (at - offset) as usize;
                let piece = data.slice(from..from + len as usize);
                let place = strata_cluster::rain::Place {
                    set,
                    offset: brick_offset,
                };
                let targets = self
                    .rain
                    .lock()
                    .unwrap()
                    .write(place)
                    .map_err(|e| io_error(format!("volume {}: {e}", self.name)))?;
                for &brick in &self.sets[set] {
                    if targets.contains(&brick) {
                        writes
                            .entry(brick)
                            .or_default()
                            .push((brick_offset, piece.clone()));
                    } else {
                        missed
                            .entry(brick)
                            .or_default()
                            .insert(brick_offset / self.unit);
                    }
                }
            }
        }
        Ok((writes, missed))
    }

    /// Every so often, once every interval of this host has ended on every brick (none is
    /// owed a decision), tells the bricks that are up to drop the tombstones of this host's
    /// intervals: without it they would fill the bricks' metadata. No brick can be in doubt
    /// about an interval that ended everywhere, so none will ask about it.
    fn forget_ended(&self, state: &mut State) {
        state.ended_since_forget += 1;
        if state.ended_since_forget < FORGET_EVERY {
            return;
        }
        state.ended_since_forget = 0;
        for (brick, client) in self.bricks.iter().enumerate() {
            if self.rain.lock().unwrap().is_down(brick) {
                continue;
            }
            // In the background: a brick that is slow or stopped must not hold up the flush
            // that happened to end the 64th interval.
            let (client, id, below) = (client.clone(), self.client_id(), state.next_seq);
            tokio::spawn(async move {
                if let Err(error) = client.forget(id, below).await {
                    tracing::debug!(brick, %error, "forget not delivered");
                }
            });
        }
    }

    /// Reads one piece from a current copy: round-robin, skipping bricks that owe a decision
    /// and ones that do not answer.
    async fn read_piece(
        &self,
        set: usize,
        brick_offset: u64,
        len: u64,
        owed: &[usize],
    ) -> Result<Bytes> {
        let first = {
            let mut rain = self.rain.lock().unwrap();
            rain.read_from(strata_cluster::rain::Place {
                set,
                offset: brick_offset,
            })
            .map_err(|e| io_error(e.to_string()))?
        };
        let bricks = &self.sets[set];
        let start = bricks.iter().position(|&b| b == first).unwrap_or(0);
        let region = brick_offset / self.unit;
        let mut last_error = None;
        for i in 0..bricks.len() {
            let brick = bricks[(start + i) % bricks.len()];
            if owed.contains(&brick) || !self.rain.lock().unwrap().is_current(brick, region) {
                continue;
            }
            match self.bricks[brick].read(brick_offset, len as u32).await {
                Ok(data) if data.len() as u64 == len => return Ok(data),
                Ok(data) => {
                    last_error = Some(format!("{} bytes of {len}", data.len()));
                }
                Err(RpcError::Unreachable { address, why }) => {
                    tracing::warn!(volume = %self.name, %address, %why, "read from another copy");
                    last_error = Some(format!("{address}: {why}"));
                }
                Err(RpcError::Refused { address, why }) => {
                    return Err(io_error(format!("brick {address} refused a read: {why}")));
                }
            }
        }
        Err(io_error(format!(
            "volume {}: no copy of set {set} answered ({})",
            self.name,
            last_error.unwrap_or_else(|| "no current copy is up".into())
        )))
    }
}

#[async_trait]
impl BlockDevice for SharedVolume {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            discard: false,
            write_zeroes: false,
            fast_zero: false,
            block_status: false,
            // Each host buffers its own interval: another opener does not see it until the
            // flush, so NBD multi-conn must not be advertised.
            consistent_across_openers: false,
            fua: false,
            ..Capabilities::ALL
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.check(offset, len as u64)?;
        let (pending, owed): (Vec<(u64, Bytes)>, Vec<usize>) = {
            let state = self.state.lock().await;
            (state.pending.clone(), state.owed.keys().copied().collect())
        };
        let mut out = BytesMut::with_capacity(len);
        for (_, set, brick_offset, piece) in self.pieces(offset, len as u64) {
            out.extend_from_slice(&self.read_piece(set, brick_offset, piece, &owed).await?);
        }
        // This host's writes not yet committed, in order.
        let end = offset + len as u64;
        for (at, data) in &pending {
            let (from, to) = ((*at).max(offset), (at + data.len() as u64).min(end));
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
            }
        }
        Ok(out)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        // The segments written are this host's from now until the interval that carries the
        // write has ended (usually already held: a claim lingers after its last use).
        let segments = self.claims.segments_of(offset, data.len() as u64);
        let pin = self
            .claims
            .acquire(&segments, self.timeout)
            .await
            .map_err(|e| io_error(format!("volume {}: {e}", self.name)))?;
        let mut state = self.state.lock().await;
        if !segments.is_subset(&state.pinned) {
            state.pinned.extend(segments);
            state.pins.push(pin);
        }
        state.pending_bytes += data.len() as u64;
        state.pending.push((offset, data));
        if flags.fua || state.pending_bytes > MAX_PENDING {
            self.commit(&mut state).await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        self.commit(&mut state).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.describe())),
            other => Err(strata_core::refuse(&other)),
        }
    }
}

impl SharedVolume {
    /// What `strata status` shows: each brick's state as this host sees it, the segments it
    /// holds, what its intervals came to, and the copy back under way.
    fn describe(&self) -> NodeStatus {
        let mut node = NodeStatus::new(self.name.clone(), "shared", self.geometry.size);
        // Not behind a commit that may be waiting on a brick: unknown then.
        let owed: Option<BTreeMap<usize, usize>> = self
            .state
            .try_lock()
            .ok()
            .map(|state| state.owed.iter().map(|(&b, d)| (b, d.len())).collect());
        let mut detail = vec![
            ("volume".to_string(), self.name.clone()),
            ("member".to_string(), self.session.name().to_string()),
            ("client".to_string(), format!("{:x}", self.client_id())),
        ];
        let mut degraded = false;
        {
            let rain = self.rain.lock().unwrap();
            for (brick, name) in self.brick_names.iter().enumerate() {
                let missing = rain.missing(brick);
                let mut state = match (rain.is_down(brick), missing) {
                    (true, 0) => "down".to_string(),
                    (true, n) => format!("down, {n} regions to copy back"),
                    (false, 0) => "up".to_string(),
                    (false, n) => format!("stale, {n} regions to copy back"),
                };
                degraded |= rain.is_down(brick) || missing > 0;
                if !self.answers(brick) {
                    state.push_str(", not answering (probed)");
                }
                if let Some(&n) = owed.as_ref().and_then(|owed| owed.get(&brick)) {
                    state.push_str(&format!(", owed {n} decisions"));
                    degraded = true;
                }
                let address = self.bricks[brick].address();
                detail.push((format!("brick {name}"), format!("{state} ({address})")));
            }
        }
        let held = self.claims.held();
        detail.push((
            "segments held".to_string(),
            if held.is_empty() {
                "none".to_string()
            } else {
                (held.iter())
                    .map(|(segment, epoch)| format!("{segment} (epoch {epoch})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ));
        let counters = &self.counters;
        detail.push((
            "intervals".to_string(),
            format!(
                "{} committed, {} aborted",
                counters.committed.load(Ordering::Relaxed),
                counters.aborted.load(Ordering::Relaxed)
            ),
        ));
        detail.push((
            "regions copied back".to_string(),
            counters.regions_copied.load(Ordering::Relaxed).to_string(),
        ));
        node.detail = detail;
        node.health = if !self.session.is_live() {
            Health::Failed
        } else if degraded {
            Health::Degraded
        } else {
            Health::Ok
        };
        node.activity = self.resyncing.lock().unwrap().clone();
        node
    }
}
