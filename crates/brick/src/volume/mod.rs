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
//!
//! Every interval carries a tag that places it between two of the volume's version cuts, and
//! the host acknowledges each version announced once nothing it tagged before is undecided
//! (`tags`; docs/shared-volumes.md, "Versions").

mod begin;
mod carry;
mod catalog;
mod connection;
mod flights;
mod locks;
mod reach;
mod resync;
mod stale;
mod status;
mod tags;
mod through;

pub use begin::Interval;
use connection::ConnectionView;
use flights::Flights;
pub use locks::{LockOwner, RangeLock};
use reach::Reach;
pub use resync::Rebuilt;
use stale::StaleView;
use status::VolumeCounters;
use tags::Tags;

use std::collections::{BTreeMap, HashMap};
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
use strata_coord::{Coord, CoordError};
use strata_core::lock::{HeldLock, LockHolder, LockPart, LockRequest};
use strata_core::{
    async_trait, Activity, BlockDevice, BlockError, Capabilities, Control, ControlReply, Geometry,
    Health, NodeStatus, Result, WriteFlags,
};

use crate::commit::{decide_interval, prepare_interval, Outcome, Votes, OVERLAP_REFUSAL};
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

pub struct SharedVolume {
    name: String,
    coord: Coord,
    /// Each brick's name in the catalog, by index. A replacement changes one in place
    /// (`catalog`): read them through `brick_name` and `brick`.
    brick_names: Mutex<Vec<String>>,
    geometry: Geometry,
    unit: u64,
    /// Each mirror set's bricks, as indices into `bricks`.
    sets: Vec<Vec<usize>>,
    bricks: Mutex<Vec<BrickClient>>,
    /// Placement and the round-robin of reads over a set's copies.
    rain: Mutex<Rain10>,
    session: Session,
    heartbeat: Mutex<Option<Heartbeat>>,
    /// Set by `close`: the host has left the cluster.
    closed: std::sync::atomic::AtomicBool,
    /// Writes go to the bricks at once, without intervals (`through`: a benchmark's baseline).
    without_intervals: std::sync::atomic::AtomicBool,
    /// This host's claims on the volume's lock segments.
    claims: Arc<SegmentClaims>,
    _releaser: AbortOnDrop,
    /// How long a request waits for a brick, a segment or a lock.
    timeout: Duration,
    /// Byte-range locks of this host's lock holders, and a wake-up for their waiters.
    locks: Mutex<RangeLocks>,
    unlocked: tokio::sync::Notify,
    /// The lock table's owner for each holder locking through a stack (`Control::Lock`),
    /// with the number of locks it holds here; dropped at its last unlock.
    holders: Mutex<HashMap<LockHolder, (LockOwner, usize)>>,
    /// Per brick: whether it answers, as far as this host knows. A brick that did not answer
    /// is probed in the background until it does; until then no flush sends it anything (no
    /// owed decision, no probe, no copy back), so a brick that is unreachable without
    /// refusing connections (a cut link) costs the flushes nothing.
    reach: Vec<Arc<Mutex<Reach>>>,
    /// The copy back under way, for `strata status`.
    resyncing: Mutex<Option<Activity>>,
    counters: VolumeCounters,
    /// The version cut this host's intervals come after, and its acks of announcements.
    tags: Tags,
    /// Follows the volume's version counter while the volume is open.
    versions: Mutex<Option<AbortOnDrop>>,
    /// Follows the volume's record while the volume is open (`catalog`).
    catalog: Mutex<Option<AbortOnDrop>>,
    /// When the stale records in etcd must be read again (`stale`), and the watch that says.
    stale: StaleView,
    stale_follower: Mutex<Option<AbortOnDrop>>,
    state: tokio::sync::Mutex<State>,
    /// Held shared by each interval of client writes from its planning to its outcome, and
    /// alone by what must see no interval in flight: delivering owed decisions, copying back,
    /// a brick replaced. Taken before `state`, never after.
    gate: Arc<tokio::sync::RwLock<()>>,
    /// The footprints of the intervals in flight: overlapping ones go one after the other.
    flights: Arc<Flights>,
    /// Commits waiting for the next prepare to their brick to carry them (`carry`).
    outbox: carry::Outbox,
    /// The stream of the volume's own callers (a layer above, a lock-aware program); each
    /// NBD connection has its own (`ConnectionView`).
    own: tokio::sync::Mutex<Stream>,
    /// Streams whose connection ended with writes unflushed: the volume's next flush takes
    /// them into its own stream and commits them.
    left: Mutex<Vec<Stream>>,
    /// This volume, for the connection views it hands out.
    me: std::sync::Weak<SharedVolume>,
}

/// An interval every brick voted yes on, its commits not yet sent: still in flight.
struct Voted {
    votes: Votes,
    tag: u64,
    touched: BTreeMap<usize, BTreeSet<u64>>,
    gate: tokio::sync::OwnedRwLockReadGuard<()>,
    boarded: flights::Boarding,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One stream of intervals: the writes of one opener (an NBD connection, or the host's own
/// callers) since its last flush, each flush committing them as one interval. Streams are
/// independent: one's flush does not commit another's writes, and one's reads see its own
/// writes and the committed ones, not another's pending.
#[derive(Default)]
pub(super) struct Stream {
    /// Written since the last interval, in order: a later write wins where they overlap.
    pending: Vec<(u64, Bytes)>,
    pending_bytes: u64,
    /// The segment claims the pending writes stand on, held until they are committed.
    pins: Vec<Pin>,
    pinned: BTreeSet<u32>,
}

/// What the host's streams share: intervals are numbered and planned under this lock, run
/// with it given up (many at once, `flights` keeping overlapping ones apart), and their
/// outcomes taken in under it again.
struct State {
    next_seq: u64,
    /// The intervals of client writes planned and not yet taken in, by sequence number, with
    /// their tags: no version below one of them is acknowledged, and no brick told to forget
    /// from one of them on.
    in_flight: BTreeMap<u64, u64>,
    /// Intervals ended on every brick since the bricks were last told to forget.
    ended_since_forget: u64,
    /// Decisions a brick has not acknowledged, with each interval's tag: delivered before
    /// anything else goes to it, and the brick is not read from until they are.
    owed: BTreeMap<usize, Vec<(IntervalId, Decision, u64)>>,
    /// The tag of the last interval of client writes committed.
    last_tag: u64,
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
    /// runs out, the bricks resolve what it left in doubt. Refused while a roll-back of the
    /// volume is under way.
    pub async fn open(
        coord: &Coord,
        volume: &str,
        member: &str,
        timeout: Duration,
        lease: Duration,
    ) -> anyhow::Result<Arc<SharedVolume>> {
        let stored = coord.volume(volume).await?;
        let record = &stored.record;
        if let Some(to) = coord.rollback_pending(volume).await? {
            return Err(CoordError::RollingBack {
                volume: volume.to_string(),
                version: to,
            }
            .into());
        }
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
            stored.revision,
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
            // A brick replaced since: a host that still wrote by the old record marked it.
            let Some(index) = brick_names.iter().position(|b| *b == brick) else {
                tracing::info!(
                    volume,
                    brick,
                    "stale record of a brick no longer in the volume: ignored"
                );
                continue;
            };
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
        // Before the first write: every interval of this host comes after the versions
        // announced before it opened.
        let announced = coord.version(volume).await?;
        let shared = Arc::new_cyclic(|me| SharedVolume {
            name: volume.to_string(),
            coord: coord.clone(),
            brick_names: Mutex::new(brick_names),
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
            bricks: Mutex::new(bricks),
            session,
            heartbeat: Mutex::new(Some(heartbeat)),
            closed: Default::default(),
            without_intervals: Default::default(),
            claims,
            _releaser: releaser,
            timeout,
            locks: Mutex::new(RangeLocks::new(LOCAL_LEASE_MS)),
            unlocked: tokio::sync::Notify::new(),
            holders: Mutex::new(HashMap::new()),
            reach,
            resyncing: Mutex::new(None),
            counters: VolumeCounters::default(),
            tags: Tags::new(announced),
            versions: Mutex::new(None),
            catalog: Mutex::new(None),
            stale: StaleView::default(),
            stale_follower: Mutex::new(None),
            gate: Arc::new(tokio::sync::RwLock::new(())),
            flights: Arc::new(Flights::default()),
            outbox: carry::Outbox::default(),
            state: tokio::sync::Mutex::new(State {
                next_seq: 1,
                in_flight: BTreeMap::new(),
                ended_since_forget: 0,
                owed: BTreeMap::new(),
                last_tag: 0,
            }),
            own: tokio::sync::Mutex::new(Stream::default()),
            left: Mutex::new(Vec::new()),
            me: me.clone(),
        });
        *shared.catalog.lock().unwrap() = Some(shared.follow_catalog());
        *shared.stale_follower.lock().unwrap() = Some(shared.follow_stale());
        let follower = shared.follow_versions();
        *shared.versions.lock().unwrap() = Some(follower);
        Ok(shared)
    }

    /// The id this host's intervals carry: its session's lease.
    pub fn client_id(&self) -> u64 {
        self.session.lease() as u64
    }

    /// Leaves the cluster for good, for a host that is done with the volume (a rebuild run
    /// from the command line): what it has pending is committed, then its lease is revoked,
    /// so its segment claims go at once rather than at the lease's expiry, and the hosts
    /// waiting for them get them now. The volume refuses to commit afterwards. Closing
    /// again does nothing (a filter over the volume passes the server's `Leave` down too).
    pub async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let flushed = self.flush().await;
        // The commits of what it reported ended land before the lease goes.
        self.landed().await;
        self.heartbeat.lock().unwrap().take();
        let left = self
            .session
            .clone()
            .close()
            .await
            .map_err(|e| io_error(format!("volume {}: leaving the cluster: {e}", self.name)));
        flushed.and(left)
    }

    /// Waits until the commits of every interval reported ended so far have landed: each
    /// brick has acknowledged its commit, or is owed it. What the bricks hold is then what
    /// this host's reads see.
    pub async fn landed(&self) {
        self.flights.clear_of(0..u64::MAX).await;
    }

    /// Test-only: stops renewing the lease, as a host paused past it (SIGSTOP) would.
    #[doc(hidden)]
    pub fn stop_heartbeat(&self) {
        self.heartbeat.lock().unwrap().take();
    }

    fn brick(&self, index: usize) -> BrickClient {
        self.bricks.lock().unwrap()[index].clone()
    }

    fn brick_clients(&self) -> Vec<BrickClient> {
        self.bricks.lock().unwrap().clone()
    }

    fn brick_name(&self, index: usize) -> String {
        self.brick_names.lock().unwrap()[index].clone()
    }

    fn brick_names(&self) -> Vec<String> {
        self.brick_names.lock().unwrap().clone()
    }

    fn brick_count(&self) -> usize {
        self.reach.len()
    }

    /// The segments this host holds now, with their epochs.
    pub fn claimed_segments(&self) -> Vec<(u32, i64)> {
        self.claims.held()
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
            for (id, decision, tag) in decisions {
                if !left.is_empty() || !self.answers(brick) {
                    left.push((id, decision, tag));
                    continue;
                }
                match self.brick(brick).decide(id, decision).await {
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(volume = %self.name, brick, %error, "decision still owed");
                        self.unreachable(brick);
                        left.push((id, decision, tag));
                    }
                }
            }
            if !left.is_empty() {
                state.owed.insert(brick, left);
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

    /// Commits what `stream` has pending as one interval on every brick that is up, or
    /// fails. A brick that does not answer is taken down and the interval retried without
    /// it. Streams commit concurrently: only intervals that share a brick unit wait for each
    /// other (`flights`).
    ///
    /// Returns once every brick voted yes: the interval is committed then (Sinfonia's rule,
    /// `strata_cluster::interval`), and its commits go to the bricks in the background. Until
    /// they are acknowledged it stays in flight: reads of its units here, unlocks of its
    /// ranges, overlapping intervals and the release of its segments wait for it. On failure
    /// the writes stay pending in `stream`, for the next flush.
    pub(super) async fn commit(&self, stream: &mut Stream) -> Result<()> {
        if stream.pending.is_empty() {
            return Ok(());
        }
        let volume = self.me.upgrade().ok_or(BlockError::Shutdown)?;
        match self.vote_pending(stream).await {
            Err(error) => {
                self.release_claims().await;
                Err(error)
            }
            Ok(voted) => {
                // Committed: the commits go in a task of their own, and the flush returns.
                let mut stream = std::mem::take(stream);
                // Every brick holds the data now; only the pins must last until it lands.
                // Given back at once, the buffers the writes came in are reused while still
                // in the processor's cache, not one interval later.
                stream.pending = Vec::new();
                stream.pending_bytes = 0;
                tokio::spawn(async move { volume.land(voted, stream).await });
                Ok(())
            }
        }
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

    /// Runs an etcd call an interval waits on, for no longer than this host's lease has
    /// left: an etcd gone silent must not hold a flush past the lease, only for the lease
    /// check after it to refuse the interval anyway. A call cut short may still land in etcd;
    /// each caller only ever adds to what is recorded stale, or drops what was copied back.
    async fn within_lease<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = std::result::Result<T, CoordError>>,
    ) -> std::result::Result<T, CoordError> {
        let left = self.session.time_left();
        match tokio::time::timeout(left, call).await {
            Ok(answer) => answer,
            Err(_) => Err(CoordError::Unavailable {
                what: what.to_string(),
                why: format!("no answer within the {left:?} this host's lease had left"),
            }),
        }
    }

    /// What an interval first brings up to date: which bricks other hosts found stale (read
    /// from etcd only when that may have changed, `stale`), the decisions bricks are owed,
    /// and a few regions copied back to a brick that returned. The last two need no interval
    /// in flight, so they hold the gate alone, and only when there is something to do: a
    /// host whose bricks are all well lets its intervals by.
    async fn upkeep(&self) {
        self.refresh_stale_if_needed().await;
        if self.state.lock().await.owed.is_empty() && !self.resync_wanted() {
            return;
        }
        let _alone = self.alone().await;
        let mut state = self.state.lock().await;
        self.settle(&mut state).await;
        self.resync(&mut state).await;
    }

    /// Whether some brick misses regions and may be reached to copy them back.
    fn resync_wanted(&self) -> bool {
        let behind: Vec<(usize, bool)> = {
            let rain = self.rain.lock().unwrap();
            (0..self.brick_count())
                .filter(|&brick| !rain.in_sync(brick))
                .map(|brick| (brick, rain.is_down(brick)))
                .collect()
        };
        behind
            .into_iter()
            .any(|(brick, down)| !down || self.answers(brick))
    }

    /// Takes the gate alone (see `gate`), once the intervals in flight have landed: their
    /// commits stop waiting to be carried (`carry`) meanwhile.
    async fn alone(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        let _waiting = self.flights.waiting();
        self.gate.write().await
    }

    /// Delivers the commits of an interval every brick voted yes on, each carried by the next
    /// prepare to its brick or sent alone (`carry`), and takes in how they went. Until then
    /// the interval stays in flight, and its stream's segments stay pinned.
    async fn land(&self, voted: Voted, stream: Stream) {
        let Voted {
            votes,
            tag,
            touched,
            gate,
            boarded,
        } = voted;
        let id = votes.id;
        let deliveries = (votes.members.iter()).map(|&brick| self.deliver(brick as usize, id));
        let mut unacked = Vec::new();
        for (brick, acked) in futures_util::future::join_all(deliveries).await {
            match acked {
                Ok(true) => {}
                Ok(false) => {
                    tracing::error!(?id, brick, "commit refused");
                    unacked.push(brick);
                }
                Err(error) => {
                    tracing::warn!(?id, brick, %error, "commit unacknowledged");
                    unacked.push(brick);
                }
            }
        }
        let outcome = Outcome {
            decision: Decision::Commit,
            bricks: votes.members.len(),
            unacked,
            refusals: votes.refusals,
            silent: votes.silent,
        };
        self.take_in_commit(id, tag, outcome, &touched).await;
        drop((boarded, gate, stream));
        self.release_claims().await;
    }

    /// Delivers the commit of `id` to `brick`: carried by a prepare if one takes it within
    /// `carry::LINGER` and nobody waits for it to land, else alone. Whether it was accepted.
    async fn deliver(
        &self,
        brick: usize,
        id: IntervalId,
    ) -> (usize, std::result::Result<bool, RpcError>) {
        let mut carried = self.outbox.queue(brick, id);
        let answer = tokio::select! {
            answer = &mut carried => answer.ok().flatten(),
            _ = tokio::time::sleep(carry::LINGER) => None,
            _ = self.flights.waited_for() => None,
        };
        let answer = match answer {
            Some(accepted) => Some(accepted),
            // A prepare took it meanwhile: its answer comes with the prepare's.
            None if !self.outbox.take_back(brick, id) => carried.await.ok().flatten(),
            None => None,
        };
        match answer {
            Some(accepted) => (brick, Ok(accepted)),
            None => (brick, self.brick(brick).decide(id, Decision::Commit).await),
        }
    }

    /// Claims are given back only once nothing is owed: a brick holding this host's
    /// interval undecided must not take the next holder's writes first.
    async fn release_claims(&self) {
        let state = self.state.lock().await;
        self.claims.keep_all(!state.owed.is_empty());
    }

    /// Prepares `stream`'s writes as one interval until every brick votes yes, retrying
    /// without bricks that do not answer and after intervals of other hosts in the way.
    async fn vote_pending(&self, stream: &Stream) -> Result<Voted> {
        self.check_live()?;
        // Every segment written is pinned since its write; the bricks check these epochs.
        let fences: Vec<(u32, i64)> = stream
            .pins
            .iter()
            .flat_map(|pin| pin.fences().iter().copied())
            .collect::<BTreeMap<u32, i64>>()
            .into_iter()
            .collect();
        self.upkeep().await;
        let gate = self.gate.clone().read_owned().await;
        let boarded = self
            .flights
            .board(flights::footprint(&stream.pending))
            .await;
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(5);
        let mut downs = 0;
        while downs <= self.brick_count() {
            let (id, tag, writes, touched) = self.plan_interval(stream).await?;
            // Commits of this host's earlier intervals ride along (`carry`).
            let taken: BTreeMap<usize, carry::Taken> = (writes.keys())
                .filter_map(|&brick| Some((brick, self.outbox.take(brick)?)))
                .collect();
            let carried = (taken.iter())
                .map(|(&brick, taken)| (brick, taken.ids()))
                .collect();
            let clients = self.brick_clients();
            let votes = prepare_interval(&clients, id, writes, &fences, tag, &carried).await;
            for (brick, taken) in taken {
                taken.answer(votes.carried.get(&brick).and_then(Option::as_ref));
            }
            if votes.committed() {
                let mut state = self.state.lock().await;
                state.last_tag = state.last_tag.max(tag);
                return Ok(Voted {
                    votes,
                    tag,
                    touched,
                    gate,
                    boarded,
                });
            }
            let outcome = decide_interval(&self.brick_clients(), votes).await;
            let mut guard = self.state.lock().await;
            let state = &mut *guard;
            state.in_flight.remove(&id.seq);
            for &brick in outcome.unacked.iter().chain(&outcome.silent) {
                self.unreachable(brick);
            }
            for &brick in &outcome.unacked {
                state
                    .owed
                    .entry(brick)
                    .or_default()
                    .push((id, outcome.decision, tag));
            }
            self.counters.aborted.fetch_add(1, Ordering::Relaxed);
            match outcome {
                // A brick still holds another client's interval over these writes undecided
                // (a host that died or paused mid-commit, or one owing it a decision): this
                // one must wait until that is settled, or it could land first.
                _ if !outcome.refusals.is_empty()
                    && outcome.silent.is_empty()
                    && (outcome.refusals.iter()).all(|(_, why)| why.contains(OVERLAP_REFUSAL))
                    && Instant::now() < deadline =>
                {
                    tracing::debug!(volume = %self.name, refusals = ?outcome.refusals, "waiting for an earlier interval to be settled");
                    drop(guard);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                _ if outcome.refusals.is_empty() && !outcome.silent.is_empty() => {
                    downs += 1;
                    let mut rain = self.rain.lock().unwrap();
                    for &brick in &outcome.silent {
                        rain.down(brick).map_err(|e| {
                            io_error(format!(
                                "volume {}: interval {} aborted: {e}",
                                self.name, id.seq
                            ))
                        })?;
                        tracing::warn!(volume = %self.name, brick = %self.brick_name(brick), "brick down: going on without it");
                    }
                }
                // The writes stay pending (and readable here): the next flush tries again.
                // Until a brick has taken the abort, every brick may hold the interval
                // prepared, and then it is committed all the same: the failure is "unknown".
                _ => {
                    let what = match outcome.reported() {
                        Some(_) => "aborted",
                        None => {
                            "failed, and no brick took its abort yet, so it may still land whole"
                        }
                    };
                    return Err(io_error(format!(
                        "volume {}: interval {} {what} (refused: {:?}; unanswered: {:?})",
                        self.name,
                        id.seq,
                        outcome.refusals,
                        outcome
                            .silent
                            .iter()
                            .map(|&b| self.brick(b).address().to_string())
                            .collect::<Vec<_>>()
                    )));
                }
            }
        }
        Err(io_error(format!(
            "volume {}: no interval committed",
            self.name
        )))
    }

    /// Takes in how the commits of interval `id` went, every brick having voted yes. A brick
    /// that did not acknowledge its commit is owed it, and holds the interval undecided, its
    /// regions not yet home: no host may read them from it until they are copied back.
    async fn take_in_commit(
        &self,
        id: IntervalId,
        tag: u64,
        outcome: Outcome,
        touched: &BTreeMap<usize, BTreeSet<u64>>,
    ) {
        let mut guard = self.state.lock().await;
        let state = &mut *guard;
        state.in_flight.remove(&id.seq);
        for &brick in &outcome.unacked {
            self.unreachable(brick);
            state
                .owed
                .entry(brick)
                .or_default()
                .push((id, Decision::Commit, tag));
        }
        self.counters.committed.fetch_add(1, Ordering::Relaxed);
        if outcome.unacked.len() == outcome.bricks {
            // Every brick holds it prepared: it lands when they are paid what they are owed,
            // or when they resolve it, whichever comes first. None is read from meanwhile.
            tracing::warn!(volume = %self.name, interval = id.seq, "interval committed, but no brick acknowledged its commit yet");
            return;
        }
        for &brick in &outcome.unacked {
            // This host stops reading those regions from it first, then records them for the
            // others. In that order the stale watch, which brings this host's own mark back,
            // finds the brick already down here, and a mark that cannot be recorded still
            // keeps this host's reads off it.
            {
                let mut rain = self.rain.lock().unwrap();
                if !rain.is_down(brick) {
                    let mut dirty: BTreeSet<u64> = touched[&brick].iter().copied().collect();
                    // What it already missed stays missed.
                    let brick_regions = self
                        .geometry
                        .size
                        .div_ceil(self.unit)
                        .div_ceil(self.sets.len() as u64);
                    dirty.extend((0..brick_regions).filter(|&r| !rain.is_current(brick, r)));
                    rain.restore(brick, dirty);
                    tracing::warn!(volume = %self.name, brick = %self.brick_name(brick), "brick did not acknowledge a commit: going on without it");
                }
            }
            // Not recorded: another host may read the brick's old data of these regions
            // until it is paid. The brick itself holds the interval undecided, and holds
            // reads of its units back until it is decided (`BrickStore::read`).
            let name = self.brick_name(brick);
            let mark = (self.coord).mark_stale(&self.name, &name, &touched[&brick]);
            if let Err(error) = self.within_lease("recording a stale brick", mark).await {
                tracing::error!(volume = %self.name, interval = id.seq, brick = %name, %error, "interval committed, but the brick did not acknowledge it and that cannot be recorded");
            }
        }
        if outcome.unacked.is_empty() && state.owed.is_empty() {
            self.forget_ended(state);
        }
    }

    /// Plans one try at committing `stream`'s writes, under the state lock: its id, its tag,
    /// each brick's writes and the regions each touches. The regions of bricks that are down
    /// are recorded stale first. The interval is then in flight until its outcome is taken
    /// in (`State::in_flight`).
    #[allow(clippy::type_complexity)]
    async fn plan_interval(
        &self,
        stream: &Stream,
    ) -> Result<(
        IntervalId,
        u64,
        BTreeMap<usize, Vec<(u64, Bytes)>>,
        BTreeMap<usize, BTreeSet<u64>>,
    )> {
        let mut state = self.state.lock().await;
        let state = &mut *state;
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
                tracing::warn!(volume = %self.name, brick = %self.brick_name(brick), "brick owes a decision: going on without it");
            }
        }
        let (writes, missed) = self.plan(&stream.pending)?;
        if !missed.is_empty() {
            // A host whose lease may have run out could not commit after the marking anyway.
            self.check_live()?;
        }
        for (brick, regions) in &missed {
            let name = self.brick_name(*brick);
            let mark = (self.coord).mark_stale(&self.name, &name, regions);
            self.within_lease("recording a stale brick", mark)
                .await
                .map_err(|e| {
                    io_error(format!(
                        "volume {}: brick {name} is down and what it misses cannot be recorded: {e}",
                        self.name
                    ))
                })?;
        }
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
        let id = self.next_id(state);
        // Read under the state lock, and the interval put in flight under the same hold: an
        // acknowledgement of a version raises what this reads, then takes the lock to look
        // at what is in flight, so an interval tagged below an acknowledged version has
        // ended before the acknowledgement.
        let tag = self.tag();
        state.in_flight.insert(id.seq, tag);
        Ok((id, tag, writes, touched))
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
        // Not from an interval still in flight on: its prepare may reach a brick after.
        let below = (state.in_flight.keys().next().copied()).unwrap_or(state.next_seq);
        for (brick, client) in self.brick_clients().into_iter().enumerate() {
            if self.rain.lock().unwrap().is_down(brick) {
                continue;
            }
            // In the background: a brick that is slow or stopped must not hold up the flush
            // that happened to end the 64th interval.
            let (client, id) = (client.clone(), self.client_id());
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
            match self.brick(brick).read(brick_offset, len as u32).await {
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
        self.read_in(&self.own, offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.write_in(&self.own, offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        let mut own = self.own.lock().await;
        for left in std::mem::take(&mut *self.left.lock().unwrap()) {
            own.pending.extend(left.pending);
            own.pending_bytes += left.pending_bytes;
            own.pins.extend(left.pins);
            own.pinned.extend(left.pinned);
        }
        self.commit(&mut own).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.describe())),
            Control::Connection => {
                let volume = self.me.upgrade().ok_or(BlockError::Shutdown)?;
                Ok(ControlReply::Device(Arc::new(ConnectionView::new(volume))))
            }
            Control::Lock(request) => {
                let volume = self.me.upgrade().ok_or(BlockError::Shutdown)?;
                Ok(ControlReply::Lock(volume.lock_for(request).await?))
            }
            Control::Leave => {
                self.close().await?;
                Ok(ControlReply::Done)
            }
            other => Err(strata_core::refuse(&other)),
        }
    }
}

impl SharedVolume {
    /// Reads through `stream`: the committed data, with the stream's own pending writes over
    /// it.
    async fn read_in(
        &self,
        stream: &tokio::sync::Mutex<Stream>,
        offset: u64,
        len: usize,
    ) -> Result<BytesMut> {
        self.check(offset, len as u64)?;
        let pending = stream.lock().await.pending.clone();
        // After the intervals over it whose commits are still on their way: the bricks do
        // not show them yet, and may owe this host their decision when they land.
        let end = offset + len as u64;
        self.flights.clear_of(offset..end).await;
        let owed: Vec<usize> = {
            let state = self.state.lock().await;
            state.owed.keys().copied().collect()
        };
        let mut out = BytesMut::with_capacity(len);
        for (_, set, brick_offset, piece) in self.pieces(offset, len as u64) {
            out.extend_from_slice(&self.read_piece(set, brick_offset, piece, &owed).await?);
        }
        // This host's writes not yet committed, in order.
        for (at, data) in &pending {
            let (from, to) = ((*at).max(offset), (at + data.len() as u64).min(end));
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
            }
        }
        Ok(out)
    }

    async fn write_in(
        &self,
        stream: &tokio::sync::Mutex<Stream>,
        offset: u64,
        data: Bytes,
        flags: WriteFlags,
    ) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        if self.writes_through() {
            return self.write_through(offset, data).await;
        }
        // The segments written are this host's from now until the interval that carries the
        // write has ended (usually already held: a claim lingers after its last use).
        let segments = self.claims.segments_of(offset, data.len() as u64);
        let pin = self.pin(&segments, self.timeout).await?;
        let mut stream = stream.lock().await;
        if !segments.is_subset(&stream.pinned) {
            stream.pinned.extend(segments);
            stream.pins.push(pin);
        }
        stream.pending_bytes += data.len() as u64;
        stream.pending.push((offset, data));
        if flags.fua || stream.pending_bytes > MAX_PENDING {
            self.commit(&mut stream).await?;
        }
        Ok(())
    }
}
