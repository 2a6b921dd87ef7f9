//! Consistency intervals under network faults and crashes, in virtual time (issue 19).
//!
//! Strata's own code runs here, unchanged: each brick is a `BrickStore` on a crash-harness
//! disk, clients run `commit::run_interval`, and every brick runs `resolve::resolve_in_doubt`
//! on a timer. Only the network is simulated ([`Participant`] over [`Link`]s): a request or
//! its reply is lost (the caller waits out its timeout, not knowing whether it was applied),
//! messages are delayed, bricks lose power (their disk's cache kept in part, torn or
//! reordered) and come back, and clients die inside an interval or pause past their lease and
//! wake up to send the decision they had taken. A brick runs a request to its end whatever
//! becomes of the caller, as its server does.
//!
//! Once the faults stop, every brick is brought back, clients deliver what they owe, and the
//! bricks resolve what the dead left in doubt. Then, for the seed to pass:
//! - nothing is left in doubt, and no staging space is lost;
//! - **atomicity**: each interval is committed on every brick it wrote to, or on none;
//! - what a client saw committed (acknowledged by at least one brick) is committed; what it
//!   saw aborted is not;
//! - **per-client order and replica equality**: every brick's home is exactly the model's,
//!   each client's committed intervals applied in the order it ran them (clients write
//!   disjoint ranges), so the two copies of each mirror set are byte-identical.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_brick::commit::{run_interval, Outcome};
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
    /// The sender is a brick resolving: the planted bug applies to its fences.
    from_peer: bool,
    /// The sender is this client, which may pause before it sends a decision (a paused
    /// process sends nothing until it wakes up; its lease runs out meanwhile).
    client: Option<(u64, Arc<World>)>,
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
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<Vote, RpcError> {
        let fences = fences.to_vec();
        self.call(move |s| async move { s.prepare_tagged(id, bricks, writes, &fences, tag).await })
            .await
    }

    async fn decide(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        if let Some((client, world)) = &self.client {
            world.maybe_pause(*client).await;
        }
        self.call(move |s| async move { s.decide(id, decision).await })
            .await
    }

    async fn decide_resolved(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        self.call(move |s| async move { s.decide_resolved(id, decision).await })
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
}

#[derive(Default)]
struct Log {
    /// Every interval begun: its writes as (set, offset in the set's homes, data).
    writes: BTreeMap<IntervalId, Vec<(usize, u64, Bytes)>>,
    /// How each ended, as its client saw it (none: it died inside).
    outcomes: BTreeMap<IntervalId, Outcome>,
}

impl World {
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
    fn peer_links(&self, me: usize) -> BTreeMap<u64, Link> {
        (self.bricks.iter().enumerate())
            .filter(|&(b, _)| b != me)
            .map(|(b, brick)| {
                let link = Link {
                    brick: brick.clone(),
                    net: self.net.clone(),
                    from_peer: true,
                    client: None,
                };
                (b as u64, link)
            })
            .collect()
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
            from_peer: false,
            client: Some((client, world.clone())),
        })
        .collect();
    for seq in 1..=intervals {
        if world.dead.lock().unwrap().contains(&client) {
            // It paused past its lease: awake, it knows it is fenced and stops.
            return;
        }
        let id = IntervalId { client, seq };
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
        world.log.lock().unwrap().writes.insert(id, writes);
        world.stats.lock().unwrap().intervals += 1;
        let dies_at = world.draw(world.net.faults.client_deaths).then(|| {
            let nanos = world.rng.lock().unwrap().random_range(0..30_000_000u64);
            Duration::from_nanos(nanos)
        });
        // Tag 0: the simulated clients take no versions (yet).
        let run = run_interval(&links, id, by_brick, &[], 0);
        let outcome = match dies_at {
            None => run.await,
            Some(after) => {
                let death = world.runtime.sleep(after);
                match futures_util::future::select(Box::pin(run), death).await {
                    futures_util::future::Either::Left((outcome, _)) => outcome,
                    futures_util::future::Either::Right(_) => {
                        // Dropped mid-interval: whatever it sent stays sent.
                        world.dead.lock().unwrap().insert(client);
                        world.stats.lock().unwrap().client_deaths += 1;
                        return;
                    }
                }
            }
        };
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
    });
    for me in 0..world.bricks.len() {
        sim.spawn(resolver(world.clone(), me));
    }
    let run = {
        let world = world.clone();
        async move {
            let clients: Vec<_> = (1..=CLIENTS)
                .map(|c| client(world.clone(), c, intervals))
                .collect();
            let (_, cuts) = futures_util::future::join(
                futures_util::future::join_all(clients),
                power_cuts(world.clone()),
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
        async move { check(&world).await }
    };
    sim.try_block_on(check)
        .map_err(|stop| format!("the check stopped: {stop}"))??;
    let stats = *world.stats.lock().unwrap();
    Ok(stats)
}

/// Every brick has power; pauses are over; the bricks resolve until nothing is in doubt.
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
    Ok(())
}

async fn check(world: &Arc<World>) -> Result<(), String> {
    let stores: Vec<Arc<BrickStore>> = (world.bricks.iter())
        .map(|b| b.store().expect("every brick is back"))
        .collect();
    for (b, store) in stores.iter().enumerate() {
        let left = store.in_doubt().await;
        if !left.is_empty() {
            return Err(format!("brick {b} still holds in doubt: {left:?}"));
        }
    }
    let (all_writes, outcomes) = {
        let log = world.log.lock().unwrap();
        (log.writes.clone(), log.outcomes.clone())
    };
    let mut homes = vec![vec![0u8; HOME as usize]; SETS];
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
        if let Some(outcome) = outcomes.get(&id) {
            let acked = outcome.unacked.len() < bricks.len();
            if outcome.decision == Decision::Commit && acked && !committed {
                return Err(format!(
                    "interval {id:?}: its client saw it committed, the bricks say {statuses:?}"
                ));
            }
            if outcome.decision == Decision::Abort && committed {
                return Err(format!(
                    "interval {id:?}: its client saw it aborted, yet it is committed"
                ));
            }
        }
        if committed {
            // Log order is (client, seq): each client's intervals in the order it ran them.
            for (set, offset, bytes) in writes {
                let at = *offset as usize;
                homes[*set][at..at + bytes.len()].copy_from_slice(bytes);
            }
        }
    }
    for (b, store) in stores.iter().enumerate() {
        let home = store
            .read(0, HOME as usize)
            .await
            .map_err(|e| format!("brick {b}: {e}"))?;
        let want = &homes[b / COPIES];
        if let Some(at) = (0..HOME as usize).find(|&i| home[i] != want[i]) {
            let sector = at / 512 * 512;
            return Err(format!(
                "brick {b} differs from the model at byte {at}: holds {:?}, expected {:?}",
                String::from_utf8_lossy(&home[sector..sector + 40]),
                String::from_utf8_lossy(&want[sector..sector + 40]),
            ));
        }
        let (free, total) = (store.staging_free().await, store.layout().staging_bytes);
        if free != total {
            return Err(format!(
                "brick {b}: staging lost, {free} of {total} bytes free"
            ));
        }
    }
    Ok(())
}
