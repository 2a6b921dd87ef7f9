//! Consistency intervals and globally consistent versions under network faults and crashes,
//! in virtual time (issue 19).
//!
//! Strata's own code runs here, unchanged: each brick is a `BrickStore` on a crash-harness
//! disk, clients run `commit::prepare_interval` and `decide_interval`, and every brick runs
//! `resolve::resolve_in_doubt` on a timer. Only the network is simulated ([`Participant`]
//! over [`Link`]s): a request or its reply is lost (the caller waits out its timeout, not
//! knowing whether it was applied), messages are delayed, bricks lose power (their disk's
//! cache kept in part, torn or reordered) and come back, and clients die inside an interval
//! or pause past their lease and wake up to send the decision they had taken. A brick runs a
//! request to its end whatever becomes of the caller, as its server does.
//!
//! **Versions.** While the clients run, a task announces versions: the volume's counter goes
//! up by one every 20 to 80 ms of virtual time. Each client tags each interval with the
//! counter as it reads it when the interval begins, so its tags never go down; clients write
//! disjoint units, so per unit the intervals commit in tag order, as the store requires. In
//! half the seeds a sealer seals versions during the run, as the admin would but reaching
//! the bricks directly (not over the faulty network): the oldest announced version not
//! sealed yet, once no live client runs an interval tagged below it (its acknowledgement),
//! every brick has power and no brick holds in doubt an interval tagged below it; a refusal
//! or a power cut leaves it for a later try.
//!
//! Once the faults stop, every brick is brought back, clients deliver what they owe, and the
//! bricks resolve what the dead left in doubt. Every announced version is then sealed on
//! every brick, in order, each once no brick holds in doubt an interval tagged below it
//! (none is left by then: asserted). Then, for the seed to pass:
//! - nothing is left in doubt, and no staging space is lost: free staging plus the bytes the
//!   versions hold is the whole staging area;
//! - **atomicity**: each interval is committed on every brick it wrote to, or on none;
//! - what a client reported committed (every brick voted yes; it reports before it sends a
//!   commit, and may die right after) is committed; what it reported aborted (a brick
//!   acknowledged the abort) is not;
//! - **per-client order and replica equality**: every brick's home is exactly the model's,
//!   each client's committed intervals applied in the order it ran them (clients write
//!   disjoint ranges), so the two copies of each mirror set are byte-identical;
//! - **versions**: every brick keeps exactly the versions announced, and `read_version(n)`
//!   is the model of the committed intervals tagged below `n`, each client's in its order;
//!   the two copies of a set read the same for every version; a prepare tagged below the
//!   newest sealed version is refused; no client that lived through its prepares was refused
//!   by a sealed version (the sealer waited for it);
//! - **roll-back**, in about half the seeds: every brick rolls back to a random announced
//!   version `n` (with the counter as spent); then its home is version `n`'s model, it keeps
//!   versions 1 to `n` only, each still reading as its model, and no staging space is lost.
//!
//! A *straggler* is counted when a commit reaches a brick that holds the interval prepared
//! and already keeps a version above its tag (a lower bound: a version created while the
//! commit runs is not counted).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_brick::commit::{decide_interval, prepare_interval, Outcome};
use strata_brick::participant::Participant;
use strata_brick::resolve::resolve_in_doubt;
use strata_brick::rpc::RpcError;
use strata_brick::{BrickOptions, BrickStore, Vote};
use strata_cluster::interval::{Decision, IntervalId, Status};
use strata_core::{async_trait, DeviceRef, Runtime};
use strata_crash::{open_disks, sector_disk, CrashGroup, CrashRng, DiskImage};

use crate::executor::{derive_seed, SimConfig, Simulation};

const META: u64 = 1 << 20;
const HOME: u64 = 96 << 10;
const DISK: u64 = 2 << 20;
/// Two mirror sets of two bricks: bricks 0 and 1 hold set 0, 2 and 3 set 1.
const SETS: usize = 2;
const COPIES: usize = 2;
const CLIENTS: u64 = 3;
/// Each client writes its own sectors of each set's home.
const CLIENT_SECTORS: u64 = HOME / 512 / CLIENTS;

/// What goes wrong in a run, and how often.
#[derive(Clone, Debug)]
pub struct Faults {
    /// Chance that a request is lost before the brick sees it.
    pub lose_request: f64,
    /// Chance that a reply is lost after the brick applied the request.
    pub lose_reply: f64,
    /// Messages take up to this long each way.
    pub max_delay: Duration,
    /// How long a caller waits for an answer that does not come.
    pub timeout: Duration,
    /// How many times, in a run, a brick loses power (and comes back later).
    pub brick_crashes: u32,
    /// Chance, per interval, that its client dies inside it.
    pub client_deaths: f64,
    /// Chance, per interval, that its client pauses past its lease just before sending its
    /// decision, then wakes up and sends it.
    pub client_pauses: f64,
    /// Planted bug for the harness's own test: bricks acknowledge `FenceClient` from a peer
    /// without recording it, so a resolution can read states a paused client still changes.
    pub unsafe_peers_ignore_fences: bool,
    /// Planted bug for the harness's own test: a client tags half its intervals one below
    /// the counter, so its tags can go down (a host that forgot its version floor). Per unit,
    /// intervals then commit out of tag order, which the bricks' copy-on-write by tag does
    /// not allow for: a version no longer reads as the intervals tagged below it.
    pub unsafe_tags_go_down: bool,
    /// Clients carry the commits of about half their committed intervals in their next
    /// interval's prepares (`BrickStore::prepare_carrying`), as a host does, and send alone
    /// what no prepare carried or answered for.
    pub carry_commits: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            lose_request: 0.03,
            lose_reply: 0.03,
            max_delay: Duration::from_millis(2),
            timeout: Duration::from_millis(20),
            brick_crashes: 2,
            client_deaths: 0.04,
            client_pauses: 0.08,
            unsafe_peers_ignore_fences: false,
            unsafe_tags_go_down: false,
            carry_commits: true,
        }
    }
}

/// What one seed went through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    pub intervals: u64,
    pub committed: u64,
    pub brick_crashes: u64,
    pub client_deaths: u64,
    pub client_pauses: u64,
    pub resolved: u64,
    /// Versions announced (the counter at the end).
    pub versions: u64,
    /// Versions sealed on every brick while the faults went on (the others at the end).
    pub sealed_in_run: u64,
    /// Intervals that committed on a brick already keeping a version above their tag.
    pub stragglers: u64,
    /// Roll-backs run on every brick and checked.
    pub rollbacks: u64,
    /// Commits carried by a prepare and applied (`Faults::carry_commits`).
    pub carried: u64,
}

/// One brick: its store, while it has power, and the disk group it lives on.
struct BrickSlot {
    index: u64,
    state: Mutex<SlotState>,
}

struct SlotState {
    group: CrashGroup,
    store: Option<Arc<BrickStore>>,
}

impl BrickSlot {
    fn store(&self) -> Option<Arc<BrickStore>> {
        self.state.lock().unwrap().store.clone()
    }

    fn is_current(&self, store: &Arc<BrickStore>) -> bool {
        (self.state.lock().unwrap().store.as_ref()).is_some_and(|s| Arc::ptr_eq(s, store))
    }

    /// Power fails: the disk keeps a random part of its cache.
    fn crash(&self, rng: &mut CrashRng) -> Vec<DiskImage> {
        let mut state = self.state.lock().unwrap();
        state.store = None;
        state.group.crash(rng)
    }

    async fn restart(&self, images: Vec<DiskImage>) -> Result<(), String> {
        let group = CrashGroup::new();
        let device: DeviceRef =
            Arc::new(open_disks(&group, &[sector_disk(DISK)], Some(images)).remove(0));
        let (store, _) = BrickStore::open(device)
            .await
            .map_err(|e| format!("brick {} does not reopen: {e}", self.index))?;
        let mut state = self.state.lock().unwrap();
        state.group = group;
        state.store = Some(Arc::new(store));
        Ok(())
    }
}

/// The network, shared by every link.
struct Net {
    runtime: Arc<dyn Runtime>,
    rng: Mutex<ChaCha8Rng>,
    faults: Faults,
    /// Off once the run's faults stop: messages then arrive, at once.
    faulty: AtomicBool,
}

impl Net {
    fn draw(&self, chance: f64) -> bool {
        self.faulty.load(Ordering::SeqCst) && self.rng.lock().unwrap().random_bool(chance)
    }

    async fn delay(&self) {
        if !self.faulty.load(Ordering::SeqCst) {
            return;
        }
        let max = self.faults.max_delay.as_nanos() as u64;
        let nanos = self.rng.lock().unwrap().random_range(0..=max);
        self.runtime.sleep(Duration::from_nanos(nanos)).await;
    }

    async fn lost(&self, address: &str, why: &str) -> RpcError {
        self.runtime.sleep(self.faults.timeout).await;
        RpcError::Unreachable {
            address: address.to_string(),
            why: why.to_string(),
        }
    }
}

/// One way to one brick, from a client or from another brick.
#[derive(Clone)]
struct Link {
    brick: Arc<BrickSlot>,
    net: Arc<Net>,
    /// The world, to pause a client and to note stragglers.
    world: Arc<World>,
    /// The sender is a brick resolving: the planted bug applies to its fences.
    from_peer: bool,
    /// The sender is this client, which may pause before it sends a decision (a paused
    /// process sends nothing until it wakes up; its lease runs out meanwhile).
    client: Option<u64>,
}

impl Link {
    async fn call<T, F, Fut>(&self, op: F) -> Result<T, RpcError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<BrickStore>) -> Fut,
        Fut: Future<Output = strata_core::Result<T>> + Send + 'static,
    {
        let address = format!("brick {}", self.brick.index);
        self.net.delay().await;
        if self.net.draw(self.net.faults.lose_request) {
            return Err(self.net.lost(&address, "request lost").await);
        }
        let Some(store) = self.brick.store() else {
            return Err(self.net.lost(&address, "no power").await);
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = op(store.clone());
        self.net.runtime.spawn(Box::pin(async move {
            let _ = tx.send(work.await);
        }));
        let result = rx.await.expect("the brick's task answers");
        self.net.delay().await;
        match result {
            Ok(value) if !self.net.draw(self.net.faults.lose_reply) => Ok(value),
            Ok(_) => Err(self.net.lost(&address, "reply lost").await),
            Err(error) if self.brick.is_current(&store) => Err(RpcError::Refused {
                address,
                why: error.to_string(),
            }),
            // The brick lost power under the request: no answer.
            Err(_) => Err(self.net.lost(&address, "lost power").await),
        }
    }
}

#[async_trait]
impl Participant for Link {
    async fn prepare(
        &self,
        carried: &[IntervalId],
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<(Vote, Option<Vec<bool>>), RpcError> {
        if let (Some(client), false) = (self.client, carried.is_empty()) {
            // It may pause with the commits it carries, as with one it sends alone.
            self.world.maybe_pause(client).await;
        }
        let (fences, carried) = (fences.to_vec(), carried.to_vec());
        self.call(move |s| async move {
            let (vote, committed) =
                (s.prepare_carrying(&carried, id, bricks, writes, &fences, tag)).await?;
            Ok((vote, Some(committed)))
        })
        .await
    }

    async fn decide(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        if let Some(client) = self.client {
            self.world.maybe_pause(client).await;
        }
        let world = self.world.clone();
        self.call(move |s| async move { world.decide_watched(&s, id, decision, false).await })
            .await
    }

    async fn decide_resolved(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        let world = self.world.clone();
        self.call(move |s| async move { world.decide_watched(&s, id, decision, true).await })
            .await
    }

    async fn status(&self, id: IntervalId) -> Result<Option<Status>, RpcError> {
        self.call(move |s| async move { Ok(s.status(id).await) })
            .await
    }

    async fn fence_client(&self, client: u64) -> Result<(), RpcError> {
        let ignore = self.from_peer && self.net.faults.unsafe_peers_ignore_fences;
        self.call(move |s| async move {
            if ignore {
                return Ok(());
            }
            s.fence_client(client).await
        })
        .await
    }
}

/// What every task of a run shares.
struct World {
    runtime: Arc<dyn Runtime>,
    net: Arc<Net>,
    bricks: Vec<Arc<BrickSlot>>,
    rng: Mutex<ChaCha8Rng>,
    /// Clients whose lease ran out: the bricks may resolve their intervals.
    dead: Mutex<BTreeSet<u64>>,
    /// Per client, the virtual time its current pause ends, once it paused.
    paused_until: Mutex<BTreeMap<u64, Duration>>,
    log: Mutex<Log>,
    stats: Mutex<RunStats>,
    stop_resolvers: AtomicBool,
    /// The volume's version counter: versions 1 to it are announced.
    counter: AtomicU64,
    /// Per live client, the tag of the interval it is running (until its decision is
    /// delivered): its "acknowledgement" of a version is this tag at or above it, or none.
    running: Mutex<BTreeMap<u64, u64>>,
    /// The versions sealed on every brick during the run: 1 to this.
    sealed_in_run: AtomicU64,
    /// Every client has run its intervals (or died): announcing and sealing stop.
    clients_done: AtomicBool,
    /// Intervals that committed on some brick already keeping a version above their tag.
    stragglers: Mutex<BTreeSet<IntervalId>>,
    /// Draws for the versions' tasks, apart from the workload's.
    versions_rng: Mutex<ChaCha8Rng>,
}

#[derive(Default)]
struct Log {
    /// Every interval begun: its writes as (set, offset in the set's homes, data).
    writes: BTreeMap<IntervalId, Vec<(usize, u64, Bytes)>>,
    /// How each ended, as its client saw it (none: it died inside).
    outcomes: BTreeMap<IntervalId, Outcome>,
    /// What each client reported of its intervals: committed at the last yes vote, aborted
    /// once a brick acknowledged the abort (none: neither, or it died first).
    reported: BTreeMap<IntervalId, Decision>,
    /// The version tag of each interval begun.
    tags: BTreeMap<IntervalId, u64>,
}

impl World {
    /// The client was dropped mid-interval: whatever it sent stays sent.
    fn client_died(&self, client: u64) {
        self.dead.lock().unwrap().insert(client);
        self.running.lock().unwrap().remove(&client);
        self.stats.lock().unwrap().client_deaths += 1;
    }

    fn draw(&self, chance: f64) -> bool {
        self.net.faulty.load(Ordering::SeqCst) && self.rng.lock().unwrap().random_bool(chance)
    }

    /// A client about to send a decision may pause past its lease; it is dead to the bricks
    /// from the moment it pauses, and sends its decisions when it wakes up.
    async fn maybe_pause(&self, client: u64) {
        let until = {
            let mut paused = self.paused_until.lock().unwrap();
            match paused.get(&client) {
                Some(&until) => Some(until),
                None if self.draw(self.net.faults.client_pauses) => {
                    let pause = self.rng.lock().unwrap().random_range(1..200u64);
                    let until = self.runtime.now() + Duration::from_millis(pause);
                    paused.insert(client, until);
                    self.dead.lock().unwrap().insert(client);
                    self.stats.lock().unwrap().client_pauses += 1;
                    Some(until)
                }
                None => None,
            }
        };
        if let Some(until) = until {
            let now = self.runtime.now();
            if until > now {
                self.runtime.sleep(until - now).await;
            }
        }
    }

    /// A brick's links to its peers.
    fn peer_links(self: &Arc<Self>, me: usize) -> BTreeMap<u64, Link> {
        (self.bricks.iter().enumerate())
            .filter(|&(b, _)| b != me)
            .map(|(b, brick)| {
                let link = Link {
                    brick: brick.clone(),
                    net: self.net.clone(),
                    world: self.clone(),
                    from_peer: true,
                    client: None,
                };
                (b as u64, link)
            })
            .collect()
    }

    /// A decision, as the brick runs it. A commit of an interval this brick still held
    /// prepared while it already kept a version above the interval's tag makes the interval
    /// a straggler: it lands inside a version created before it (a lower bound: a version
    /// created while the commit runs is not counted).
    async fn decide_watched(
        &self,
        store: &BrickStore,
        id: IntervalId,
        decision: Decision,
        resolved: bool,
    ) -> strata_core::Result<bool> {
        let tag = self.log.lock().unwrap().tags.get(&id).copied();
        let watch = match tag {
            Some(tag)
                if decision == Decision::Commit && tag < self.counter.load(Ordering::SeqCst) =>
            {
                let above = (store.versions().await.ok())
                    .is_some_and(|versions| versions.iter().any(|v| v.number > tag));
                above && store.try_status(id).await.ok() == Some(Some(Status::Prepared))
            }
            _ => false,
        };
        let answer = if resolved {
            store.decide_resolved(id, decision).await?
        } else {
            store.decide(id, decision).await?
        };
        if watch
            && answer
            && store.try_status(id).await.ok() == Some(Some(Status::Decided(Decision::Commit)))
        {
            self.stragglers.lock().unwrap().insert(id);
        }
        Ok(answer)
    }
}

/// Data naming its interval, write and sector, so a wrong sector explains itself.
fn data(id: IntervalId, write: usize, len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len);
    for sector in 0..len / 512 {
        let tag = format!("c{} s{} w{} sector{} ", id.client, id.seq, write, sector);
        out.extend(tag.bytes().cycle().take(512));
    }
    Bytes::from(out)
}

/// One client: `intervals` intervals one after another, each writing its own sectors; a
/// decision a brick did not acknowledge is delivered before anything else goes to it.
async fn client(world: Arc<World>, client: u64, intervals: u64) {
    let links: Vec<Link> = (world.bricks.iter())
        .map(|brick| Link {
            brick: brick.clone(),
            net: world.net.clone(),
            world: world.clone(),
            from_peer: false,
            client: Some(client),
        })
        .collect();
    // A committed interval whose commits wait to be carried by the next prepare to each of
    // its bricks (as a host's do, `volume::carry`), and its bricks.
    let mut carry: Option<(IntervalId, Vec<usize>)> = None;
    for seq in 1..=intervals {
        if world.dead.lock().unwrap().contains(&client) {
            // It paused past its lease: awake, it knows it is fenced and stops.
            world.running.lock().unwrap().remove(&client);
            return;
        }
        let id = IntervalId { client, seq };
        // Tagged with the counter as read now; a client's tags never go down, and clients
        // write disjoint units, so per unit the intervals commit in tag order.
        let tag = world.counter.load(Ordering::SeqCst);
        let tag = match world.net.faults.unsafe_tags_go_down {
            true if tag > 0 && world.draw(0.5) => tag - 1,
            _ => tag,
        };
        world.running.lock().unwrap().insert(client, tag);
        let writes: Vec<(usize, u64, Bytes)> = {
            let mut rng = world.rng.lock().unwrap();
            (0..rng.random_range(1..4usize))
                .map(|w| {
                    let set = rng.random_range(0..SETS);
                    let sectors = rng.random_range(1..=8u64);
                    let first = rng.random_range(0..=CLIENT_SECTORS - sectors);
                    let offset = ((client - 1) * CLIENT_SECTORS + first) * 512;
                    (set, offset, data(id, w, (sectors * 512) as usize))
                })
                .collect()
        };
        let mut by_brick: BTreeMap<usize, Vec<(u64, Bytes)>> = BTreeMap::new();
        for (set, offset, bytes) in &writes {
            for copy in 0..COPIES {
                (by_brick.entry(set * COPIES + copy).or_default()).push((*offset, bytes.clone()));
            }
        }
        {
            let mut log = world.log.lock().unwrap();
            log.writes.insert(id, writes);
            log.tags.insert(id, tag);
        }
        world.stats.lock().unwrap().intervals += 1;
        let dies_at = world.draw(world.net.faults.client_deaths).then(|| {
            let nanos = world.rng.lock().unwrap().random_range(0..30_000_000u64);
            Duration::from_nanos(nanos)
        });
        // The client reports the interval committed at its last yes vote, before it sends a
        // commit (Sinfonia's rule); it may die at any point of either phase.
        let mut death = Box::pin(async {
            match dies_at {
                Some(after) => world.runtime.sleep(after).await,
                None => std::future::pending().await,
            }
        });
        let carried: BTreeMap<usize, Vec<IntervalId>> = match &carry {
            Some((earlier, bricks)) => (bricks.iter())
                .filter(|b| by_brick.contains_key(b))
                .map(|&b| (b, vec![*earlier]))
                .collect(),
            None => BTreeMap::new(),
        };
        let prepare = Box::pin(prepare_interval(&links, id, by_brick, &[], tag, &carried));
        let votes = match futures_util::future::select(prepare, &mut death).await {
            futures_util::future::Either::Left((votes, _)) => votes,
            futures_util::future::Either::Right(_) => return world.client_died(client),
        };
        if let Some((earlier, bricks)) = carry.take() {
            // What no prepare carried, or carried without an answer, goes alone.
            let (applied, alone): (Vec<usize>, Vec<usize>) = (bricks.into_iter())
                .partition(|b| matches!(votes.carried.get(b), Some(Some(acks)) if acks == &[true]));
            world.stats.lock().unwrap().carried += applied.len() as u64;
            if !deliver(&world, &links, client, earlier, &alone).await {
                return;
            }
        }
        if votes.committed() {
            world
                .log
                .lock()
                .unwrap()
                .reported
                .insert(id, Decision::Commit);
            if world.net.faults.carry_commits && world.draw(0.5) {
                // Its commits wait for the next interval's prepares.
                carry = Some((id, votes.members.iter().map(|&b| b as usize).collect()));
                let outcome = Outcome {
                    decision: Decision::Commit,
                    bricks: votes.members.len(),
                    unacked: Vec::new(),
                    refusals: votes.refusals,
                    silent: votes.silent,
                };
                world.stats.lock().unwrap().committed += 1;
                world.log.lock().unwrap().outcomes.insert(id, outcome);
                world.running.lock().unwrap().remove(&client);
                continue;
            }
        }
        let decide = Box::pin(decide_interval(&links, votes));
        let outcome = match futures_util::future::select(decide, &mut death).await {
            futures_util::future::Either::Left((outcome, _)) => outcome,
            futures_util::future::Either::Right(_) => return world.client_died(client),
        };
        if outcome.reported() == Some(Decision::Abort) {
            world
                .log
                .lock()
                .unwrap()
                .reported
                .insert(id, Decision::Abort);
        }
        // A brick owed this decision gets it before anything else of this client.
        for &brick in &outcome.unacked {
            loop {
                if world.dead.lock().unwrap().contains(&client) {
                    break;
                }
                match links[brick].decide(id, outcome.decision).await {
                    Ok(_) => break,
                    Err(_) => world.runtime.sleep(Duration::from_millis(5)).await,
                }
            }
        }
        if outcome.decision == Decision::Commit {
            world.stats.lock().unwrap().committed += 1;
        }
        world.log.lock().unwrap().outcomes.insert(id, outcome);
        world.running.lock().unwrap().remove(&client);
    }
    if let Some((earlier, bricks)) = carry {
        deliver(&world, &links, client, earlier, &bricks).await;
    }
}

/// Sends the commit of `id` alone to each of `bricks` until it is answered. False when the
/// client died meanwhile (its bricks resolve what it leaves).
async fn deliver(
    world: &World,
    links: &[Link],
    client: u64,
    id: IntervalId,
    bricks: &[usize],
) -> bool {
    for &brick in bricks {
        loop {
            if world.dead.lock().unwrap().contains(&client) {
                return false;
            }
            match links[brick].decide(id, Decision::Commit).await {
                Ok(_) => break,
                Err(_) => world.runtime.sleep(Duration::from_millis(5)).await,
            }
        }
    }
    true
}

/// Announces versions at random times while the clients run: the counter goes up by one
/// every 20 to 80 ms. Clients tag their next intervals with it.
async fn announcer(world: Arc<World>) {
    loop {
        let wait = world.versions_rng.lock().unwrap().random_range(20..=80u64);
        world.runtime.sleep(Duration::from_millis(wait)).await;
        if world.clients_done.load(Ordering::SeqCst) {
            return;
        }
        world.counter.fetch_add(1, Ordering::SeqCst);
        world.stats.lock().unwrap().versions += 1;
    }
}

/// Seals versions while the faults go on, as the admin would (but reaching the bricks
/// directly, not over the faulty network): the oldest announced version not sealed yet,
/// once every live client has moved past it, every brick has power, and no brick holds in
/// doubt an interval tagged below it. A refusal or a power cut leaves it for the next try;
/// sealing is idempotent.
async fn sealer(world: Arc<World>) {
    while !world.clients_done.load(Ordering::SeqCst) {
        let wait = world.versions_rng.lock().unwrap().random_range(5..=30u64);
        world.runtime.sleep(Duration::from_millis(wait)).await;
        let n = world.sealed_in_run.load(Ordering::SeqCst) + 1;
        if n > world.counter.load(Ordering::SeqCst) {
            continue;
        }
        let acked = {
            let dead = world.dead.lock().unwrap();
            (world.running.lock().unwrap().iter()).all(|(c, &tag)| dead.contains(c) || tag >= n)
        };
        let stores: Option<Vec<Arc<BrickStore>>> = world.bricks.iter().map(|b| b.store()).collect();
        let (true, Some(stores)) = (acked, stores) else {
            continue;
        };
        let mut clear = true;
        for store in &stores {
            match store.try_in_doubt_tagged().await {
                Ok(listed) if listed.iter().all(|&(_, _, tag)| tag >= n) => {}
                _ => clear = false,
            }
        }
        if !clear {
            continue;
        }
        let mut sealed = true;
        for store in &stores {
            sealed &= store.seal_version(n).await.is_ok();
        }
        if sealed {
            world.sealed_in_run.store(n, Ordering::SeqCst);
            world.stats.lock().unwrap().sealed_in_run += 1;
        }
    }
}

/// Each brick resolves, every 10 ms, what dead clients left in doubt on it.
async fn resolver(world: Arc<World>, me: usize) {
    let peers = world.peer_links(me);
    while !world.stop_resolvers.load(Ordering::SeqCst) {
        world.runtime.sleep(Duration::from_millis(10)).await;
        resolve_once(&world, me, &peers).await;
    }
}

async fn resolve_once(world: &World, me: usize, peers: &BTreeMap<u64, Link>) {
    let Some(store) = world.bricks[me].store() else {
        return;
    };
    let dead = world.dead.lock().unwrap().clone();
    let fenced = |client: u64| {
        let dead = dead.contains(&client);
        async move { dead }
    };
    if let Ok(decided) = resolve_in_doubt(&store, me as u64, peers, fenced).await {
        world.stats.lock().unwrap().resolved += decided.len() as u64;
    }
}

/// Bricks lose power now and then, and come back a little later.
async fn power_cuts(world: Arc<World>) -> Result<(), String> {
    let crashes = world.net.faults.brick_crashes;
    for _ in 0..crashes {
        let (wait, brick, down, seed) = {
            let mut rng = world.rng.lock().unwrap();
            (
                rng.random_range(0..60u64),
                rng.random_range(0..world.bricks.len()),
                rng.random_range(1..40u64),
                rng.random_range(0..u64::MAX),
            )
        };
        world.runtime.sleep(Duration::from_millis(wait)).await;
        let images = world.bricks[brick].crash(&mut CrashRng::seed_from_u64(seed));
        world.stats.lock().unwrap().brick_crashes += 1;
        world.runtime.sleep(Duration::from_millis(down)).await;
        world.bricks[brick].restart(images).await?;
    }
    Ok(())
}

fn options() -> BrickOptions {
    BrickOptions {
        meta_bytes: META,
        home_bytes: HOME,
        min_staging_bytes: 256 << 10,
    }
}

/// Runs one seed: `intervals` per client under `faults`, then the checks of the module
/// comment. The error names what broke.
pub fn run_seed(seed: u64, intervals: u64, faults: &Faults) -> Result<RunStats, String> {
    let mut config = SimConfig::new(seed);
    config.time_limit = Some(600_000_000_000);
    let sim = Simulation::with_config(config);
    let runtime = sim.runtime();
    let net = Arc::new(Net {
        runtime: runtime.clone(),
        rng: Mutex::new(ChaCha8Rng::seed_from_u64(derive_seed(seed, "network"))),
        faults: faults.clone(),
        faulty: AtomicBool::new(true),
    });
    let bricks: Vec<Arc<BrickSlot>> = sim.block_on(async {
        let mut bricks = Vec::new();
        for index in 0..(SETS * COPIES) as u64 {
            let group = CrashGroup::new();
            let device: DeviceRef = Arc::new(group.disk(sector_disk(DISK)));
            let store = BrickStore::format(device, &options(), false)
                .await
                .expect("a fresh brick formats");
            bricks.push(Arc::new(BrickSlot {
                index,
                state: Mutex::new(SlotState {
                    group,
                    store: Some(Arc::new(store)),
                }),
            }));
        }
        bricks
    });
    let world = Arc::new(World {
        runtime: runtime.clone(),
        net,
        bricks,
        rng: Mutex::new(ChaCha8Rng::seed_from_u64(derive_seed(seed, "workload"))),
        dead: Mutex::new(BTreeSet::new()),
        paused_until: Mutex::new(BTreeMap::new()),
        log: Mutex::new(Log::default()),
        stats: Mutex::new(RunStats::default()),
        stop_resolvers: AtomicBool::new(false),
        counter: AtomicU64::new(0),
        running: Mutex::new(BTreeMap::new()),
        sealed_in_run: AtomicU64::new(0),
        clients_done: AtomicBool::new(false),
        stragglers: Mutex::new(BTreeSet::new()),
        versions_rng: Mutex::new(ChaCha8Rng::seed_from_u64(derive_seed(seed, "versions"))),
    });
    let (seal_in_run, roll_back) = {
        let mut rng = world.versions_rng.lock().unwrap();
        (rng.random_bool(0.5), rng.random_bool(0.5))
    };
    for me in 0..world.bricks.len() {
        sim.spawn(resolver(world.clone(), me));
    }
    let run = {
        let world = world.clone();
        async move {
            let clients: Vec<_> = (1..=CLIENTS)
                .map(|c| client(world.clone(), c, intervals))
                .collect();
            let clients = async {
                futures_util::future::join_all(clients).await;
                world.clients_done.store(true, Ordering::SeqCst);
            };
            let sealing = async {
                if seal_in_run {
                    sealer(world.clone()).await;
                }
            };
            let (_, cuts, _, _) = futures_util::future::join4(
                clients,
                power_cuts(world.clone()),
                announcer(world.clone()),
                sealing,
            )
            .await;
            cuts
        }
    };
    sim.try_block_on(run)
        .map_err(|stop| format!("the run stopped: {stop}"))??;
    // The faults stop: everything answers at once.
    world.net.faulty.store(false, Ordering::SeqCst);
    world.stop_resolvers.store(true, Ordering::SeqCst);
    let settle = {
        let world = world.clone();
        async move { settle(&world).await }
    };
    sim.try_block_on(settle)
        .map_err(|stop| format!("settling stopped: {stop}"))??;
    let check = {
        let world = world.clone();
        async move { check(&world, roll_back).await }
    };
    sim.try_block_on(check)
        .map_err(|stop| format!("the check stopped: {stop}"))??;
    let mut stats = *world.stats.lock().unwrap();
    stats.stragglers = world.stragglers.lock().unwrap().len() as u64;
    Ok(stats)
}

/// Every brick has power; pauses are over; the bricks resolve until nothing is in doubt.
/// Then every announced version is sealed on every brick, as the admin would: for each `n`,
/// once no brick holds in doubt an interval tagged below `n` (none is left by now).
async fn settle(world: &Arc<World>) -> Result<(), String> {
    world.runtime.sleep(Duration::from_millis(300)).await;
    let peers: Vec<BTreeMap<u64, Link>> = (0..world.bricks.len())
        .map(|me| world.peer_links(me))
        .collect();
    for _ in 0..4 {
        for (me, peers) in peers.iter().enumerate() {
            resolve_once(world, me, peers).await;
        }
    }
    let stores = stores(world);
    for n in 1..=world.counter.load(Ordering::SeqCst) {
        for (b, store) in stores.iter().enumerate() {
            let listed =
                (store.try_in_doubt_tagged().await).map_err(|e| format!("brick {b}: {e}"))?;
            if let Some((id, _, tag)) = listed.iter().find(|&&(_, _, tag)| tag < n) {
                return Err(format!(
                    "brick {b} still holds {id:?}, tagged {tag}, in doubt: version {n} cannot be sealed"
                ));
            }
        }
        for (b, store) in stores.iter().enumerate() {
            (store.seal_version(n).await)
                .map_err(|e| format!("brick {b} refuses to seal version {n}: {e}"))?;
        }
    }
    Ok(())
}

fn stores(world: &World) -> Vec<Arc<BrickStore>> {
    (world.bricks.iter())
        .map(|b| b.store().expect("every brick is back"))
        .collect()
}

/// What each set's home holds with the committed intervals tagged below `below` applied
/// (all of them: `None`), each client's in the order it ran them (the log's order).
fn model(
    writes: &BTreeMap<IntervalId, Vec<(usize, u64, Bytes)>>,
    committed: &[(IntervalId, u64)],
    below: Option<u64>,
) -> Vec<Vec<u8>> {
    let mut homes = vec![vec![0u8; HOME as usize]; SETS];
    for (id, tag) in committed {
        if below.is_some_and(|n| *tag >= n) {
            continue;
        }
        for (set, offset, bytes) in &writes[id] {
            let at = *offset as usize;
            homes[*set][at..at + bytes.len()].copy_from_slice(bytes);
        }
    }
    homes
}

/// The first difference between what brick `b` holds as `what` and the model's.
fn differs(b: usize, what: &str, held: &[u8], want: &[u8]) -> Result<(), String> {
    if held == want {
        return Ok(());
    }
    match (0..held.len()).find(|&i| held.get(i) != want.get(i)) {
        None => Ok(()),
        Some(at) => {
            let sector = at / 512 * 512;
            Err(format!(
                "brick {b}: {what} differs from the model at byte {at}: holds {:?}, expected {:?}",
                String::from_utf8_lossy(&held[sector..sector + 40]),
                String::from_utf8_lossy(&want[sector..sector + 40]),
            ))
        }
    }
}

/// Free staging plus what the versions hold is all the staging space.
async fn staging_whole(b: usize, store: &BrickStore, when: &str) -> Result<(), String> {
    let versions = (store.versions().await).map_err(|e| format!("brick {b}: {e}"))?;
    let held: u64 = versions.iter().map(|v| v.held_bytes).sum();
    let (free, total) = (store.staging_free().await, store.layout().staging_bytes);
    if free + held != total {
        return Err(format!(
            "brick {b}{when}: staging lost, {free} bytes free and {held} held by versions, of {total}"
        ));
    }
    Ok(())
}

async fn version_numbers(b: usize, store: &BrickStore) -> Result<Vec<u64>, String> {
    let versions = (store.versions().await).map_err(|e| format!("brick {b}: {e}"))?;
    Ok(versions.iter().map(|v| v.number).collect())
}

async fn check(world: &Arc<World>, roll_back: bool) -> Result<(), String> {
    let stores = stores(world);
    for (b, store) in stores.iter().enumerate() {
        let left = store.in_doubt().await;
        if !left.is_empty() {
            return Err(format!("brick {b} still holds in doubt: {left:?}"));
        }
    }
    let (all_writes, outcomes, reported, tags) = {
        let log = world.log.lock().unwrap();
        (
            log.writes.clone(),
            log.outcomes.clone(),
            log.reported.clone(),
            log.tags.clone(),
        )
    };
    // Log order is (client, seq): each client's intervals in the order it ran them.
    let mut committed_ids = Vec::new();
    for (&id, writes) in &all_writes {
        let sets: BTreeSet<usize> = writes.iter().map(|(set, _, _)| *set).collect();
        let bricks: Vec<usize> = (sets.iter())
            .flat_map(|set| (0..COPIES).map(move |c| set * COPIES + c))
            .collect();
        let mut statuses = Vec::new();
        for &b in &bricks {
            statuses.push(stores[b].status(id).await);
        }
        let committed = statuses.contains(&Some(Status::Decided(Decision::Commit)));
        if committed
            && statuses
                .iter()
                .any(|s| *s != Some(Status::Decided(Decision::Commit)))
        {
            return Err(format!(
                "interval {id:?} is half committed: bricks {bricks:?} say {statuses:?}"
            ));
        }
        match reported.get(&id) {
            Some(Decision::Commit) if !committed => {
                return Err(format!(
                    "interval {id:?}: its client saw every yes and reported it committed, the \
                     bricks say {statuses:?}"
                ));
            }
            Some(Decision::Abort) if committed => {
                return Err(format!(
                    "interval {id:?}: its client saw a brick take the abort, yet it is committed"
                ));
            }
            _ => {}
        }
        if committed {
            committed_ids.push((id, tags[&id]));
        }
    }
    let homes = model(&all_writes, &committed_ids, None);
    for (b, store) in stores.iter().enumerate() {
        let home = store
            .read(0, HOME as usize)
            .await
            .map_err(|e| format!("brick {b}: {e}"))?;
        differs(b, "its home", &home, &homes[b / COPIES])?;
    }
    // Versions: every one announced, on every brick, exactly the intervals tagged below it.
    let counter = world.counter.load(Ordering::SeqCst);
    let announced: Vec<u64> = (1..=counter).collect();
    let models: BTreeMap<u64, Vec<Vec<u8>>> = (announced.iter())
        .map(|&n| (n, model(&all_writes, &committed_ids, Some(n))))
        .collect();
    for (b, store) in stores.iter().enumerate() {
        let numbers = version_numbers(b, store).await?;
        if numbers != announced {
            return Err(format!(
                "brick {b} keeps versions {numbers:?}, {counter} were announced"
            ));
        }
        let mut copies: Vec<Vec<u8>> = Vec::new();
        for &n in &announced {
            let held = (store.read_version(n, 0, HOME as usize).await)
                .map_err(|e| format!("brick {b}: version {n}: {e}"))?;
            differs(b, &format!("version {n}"), &held, &models[&n][b / COPIES])?;
            copies.push(held.to_vec());
        }
        // The model says so already; said again in the terms of the issue.
        if b % COPIES > 0 {
            let first = &stores[b - b % COPIES];
            for (i, &n) in announced.iter().enumerate() {
                let other = (first.read_version(n, 0, HOME as usize).await)
                    .map_err(|e| format!("brick {}: version {n}: {e}", b - b % COPIES))?;
                if other[..] != copies[i][..] {
                    return Err(format!(
                        "version {n} differs between the copies of brick {b}'s set"
                    ));
                }
            }
        }
        // A prepare tagged below the newest sealed version is refused, and leaves nothing.
        if counter > 0 {
            let id = IntervalId {
                client: CLIENTS + 1,
                seq: 1 + b as u64,
            };
            let write = vec![(0, Bytes::from(vec![7u8; 512]))];
            let vote = (store
                .prepare_tagged(id, vec![b as u64], write, &[], counter - 1)
                .await)
                .map_err(|e| format!("brick {b}: {e}"))?;
            if !matches!(&vote, Vote::No(why) if why.contains("sealed")) {
                return Err(format!(
                    "brick {b}: a prepare tagged {} under sealed version {counter} got {vote:?}",
                    counter - 1
                ));
            }
        }
        staging_whole(b, store, "").await?;
    }
    // The sealer waited for every live client to move past a version before sealing it: no
    // client that lived through its prepares was refused by a sealed version. (A client whose
    // tags go down, the planted bug, is refused so; the version checks above catch it.)
    if !world.net.faults.unsafe_tags_go_down {
        for (id, outcome) in &outcomes {
            if let Some((b, why)) =
                (outcome.refusals.iter()).find(|(_, why)| why.contains("is sealed here"))
            {
                return Err(format!(
                    "interval {id:?}, tagged {}, of a live client, was refused by brick {b}: {why}",
                    tags[id]
                ));
            }
        }
    }
    if roll_back && counter > 0 {
        let n = world.versions_rng.lock().unwrap().random_range(1..=counter);
        for (b, store) in stores.iter().enumerate() {
            (store.rollback(n, counter).await)
                .map_err(|e| format!("brick {b} refuses to roll back to {n}: {e}"))?;
        }
        for (b, store) in stores.iter().enumerate() {
            let when = format!(", rolled back to version {n}");
            let home =
                (store.read(0, HOME as usize).await).map_err(|e| format!("brick {b}: {e}"))?;
            differs(
                b,
                &format!("its home{when}"),
                &home,
                &models[&n][b / COPIES],
            )?;
            let numbers = version_numbers(b, store).await?;
            if numbers != announced[..n as usize] {
                return Err(format!("brick {b}{when}: keeps versions {numbers:?}"));
            }
            for m in 1..=n {
                let held = (store.read_version(m, 0, HOME as usize).await)
                    .map_err(|e| format!("brick {b}{when}: version {m}: {e}"))?;
                differs(
                    b,
                    &format!("version {m}{when}"),
                    &held,
                    &models[&m][b / COPIES],
                )?;
            }
            staging_whole(b, store, &when).await?;
        }
        world.stats.lock().unwrap().rollbacks += 1;
    }
    Ok(())
}
