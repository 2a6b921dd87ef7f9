//! A single-threaded, deterministic executor with virtual time, on which Strata's layer code
//! runs unmodified (it reaches time and tasks only through [`strata_core::Runtime`]).
//!
//! One loop does everything: poll the next task in the FIFO ready queue; when nothing is
//! runnable, jump virtual time to the earliest pending event (a timer, or a completion of a
//! registered [`EventSource`] such as a simulated disk), fire every event due at that
//! instant, and go on. No thread is started and no clock is read, so a run is a pure
//! function of its inputs and its seed, and an idle disk costs no wall time however long
//! the virtual gap. Why not madsim, turmoil or tokio's paused clock: `docs/simulator.md`.
//!
//! What the seed drives here: events that fall due at the same virtual instant (two disks
//! finishing together, a timer and a completion) are woken in an order drawn from the seed
//! ([`SimConfig::shuffle_ties`]), so different seeds explore different interleavings of the
//! same workload while one seed always replays the same one. Other components draw their
//! randomness from [`Simulation::rng`].
//!
//! `Send`/`Sync`: [`Runtime`] and its futures must be `Send`, so the shared state sits behind
//! `Arc` and uncontended `Mutex`es even though only one thread ever touches it.

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_core::{BoxFuture, Runtime};

use crate::model::Nanos;

/// Something outside the task world that produces events in virtual time: a simulated
/// disk, a network link. The executor asks it when its next event is and moves it there.
pub trait EventSource: Send + Sync {
    /// The virtual time of the next event, or `None` when nothing is pending.
    fn next_event(&self) -> Option<Nanos>;

    /// Moves the source to `now` (never past its own `next_event`), appending the wakers of
    /// whatever completed at or before `now`.
    fn advance(&self, now: Nanos, wake: &mut Vec<Waker>);
}

/// How a simulation behaves; [`SimConfig::new`] gives the defaults for a seed.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// Wake events that fall due at the same instant in an order drawn from the seed
    /// (otherwise: timers by insertion, then sources in registration order).
    pub shuffle_ties: bool,
    /// Panic if virtual time would pass this (a run whose only pending events are
    /// background timers never deadlocks, it runs forever; this catches it).
    pub time_limit: Option<Nanos>,
}

impl SimConfig {
    pub fn new(seed: u64) -> Self {
        SimConfig {
            seed,
            shuffle_ties: true,
            time_limit: None,
        }
    }
}

/// The task the `block_on` future occupies in the ready queue; spawned tasks count from 1.
const MAIN: u64 = 0;

/// A pending timer. Ordered by deadline, then by insertion, so that equal deadlines fire
/// in the order they were set.
struct TimerEntry {
    at: Nanos,
    seq: u64,
    slot: Arc<TimerSlot>,
}

impl PartialEq for TimerEntry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for TimerEntry {
    /// Reversed: `BinaryHeap` is a max-heap and the earliest timer must come out first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Shared between a [`Sleep`] and its heap entry. The waker is replaced on every poll
/// because combinators (`join_all`, `select`) poll children with wakers of their own.
#[derive(Default)]
struct TimerSlot {
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

struct Task {
    /// `None` while the task is being polled (taken out so that the poll can spawn and wake
    /// without holding the task table).
    future: Option<BoxFuture<'static, ()>>,
    waker: Arc<TaskWaker>,
}

struct TaskWaker {
    id: u64,
    /// Already in the ready queue: waking twice before a poll queues it once.
    queued: AtomicBool,
    shared: Weak<Shared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            if let Some(shared) = self.shared.upgrade() {
                lock(&shared.ready).push_back(self.id);
            }
        }
    }
}

struct Timers {
    heap: BinaryHeap<TimerEntry>,
    next_seq: u64,
}

/// The event sources, with scratch space reused at every time step.
#[derive(Default)]
struct World {
    sources: Vec<Arc<dyn EventSource>>,
    next_events: Vec<Option<Nanos>>,
    wakers: Vec<Waker>,
}

struct Shared {
    config: SimConfig,
    /// The virtual time past which the world stops (`u64::MAX`: none); starts as
    /// `config.time_limit`, movable with [`Simulation::set_time_limit`].
    time_limit: AtomicU64,
    now: AtomicU64,
    ready: Mutex<VecDeque<u64>>,
    tasks: Mutex<IdMap<Task>>,
    next_task: AtomicU64,
    timers: Mutex<Timers>,
    world: Mutex<World>,
    tie_rng: Mutex<ChaCha8Rng>,
    /// What layers draw through [`Runtime::random_u64`], from the seed.
    layer_rng: Mutex<ChaCha8Rng>,
    running: AtomicBool,
}

impl Shared {
    fn spawn(self: &Arc<Self>, future: BoxFuture<'static, ()>) {
        let id = self.next_task.fetch_add(1, Ordering::Relaxed);
        let waker = Arc::new(TaskWaker {
            id,
            queued: AtomicBool::new(true),
            shared: Arc::downgrade(self),
        });
        lock(&self.tasks).insert(
            id,
            Task {
                future: Some(future),
                waker,
            },
        );
        lock(&self.ready).push_back(id);
    }

    fn add_timer(&self, at: Nanos, slot: Arc<TimerSlot>) {
        let mut timers = lock(&self.timers);
        let seq = timers.next_seq;
        timers.next_seq += 1;
        timers.heap.push(TimerEntry { at, seq, slot });
    }

    fn poll_task(&self, id: u64) {
        let taken = {
            let mut tasks = lock(&self.tasks);
            tasks
                .get_mut(&id)
                .and_then(|task| Some((task.future.take()?, task.waker.clone())))
        };
        // A wake for a task that finished meanwhile: nothing to do.
        let Some((mut future, waker)) = taken else {
            return;
        };
        waker.queued.store(false, Ordering::Release);
        let std_waker = Waker::from(waker);
        let mut cx = Context::from_waker(&std_waker);
        let finished = future.as_mut().poll(&mut cx).is_ready();
        let mut tasks = lock(&self.tasks);
        if finished {
            tasks.remove(&id);
        } else if let Some(task) = tasks.get_mut(&id) {
            task.future = Some(future);
        }
    }

    /// Jumps to the earliest pending event and wakes everything due then.
    fn advance_world(&self) -> Advance {
        let mut world = lock(&self.world);
        let World {
            sources,
            next_events,
            wakers,
        } = &mut *world;
        next_events.clear();
        next_events.extend(sources.iter().map(|s| s.next_event()));
        // Held until the due timers are out: looked at twice (the earliest, then the due
        // ones), locked once.
        let mut timers = lock(&self.timers);
        // A dropped `Sleep` leaves its entry behind; time must not jump to it.
        while timers
            .heap
            .peek()
            .is_some_and(|t| lock(&t.slot.waker).is_none())
        {
            timers.heap.pop();
        }
        let next_timer = timers.heap.peek().map(|t| t.at);
        let Some(next) = next_events
            .iter()
            .copied()
            .chain([next_timer])
            .flatten()
            .min()
        else {
            return Advance::Idle;
        };
        let now = self.now.load(Ordering::Relaxed);
        assert!(
            next >= now,
            "an event source reported an event in the past ({next} < {now} ns)"
        );
        let limit = self.time_limit.load(Ordering::Relaxed);
        if next > limit {
            return Advance::PastLimit { limit, next };
        }
        self.now.store(next, Ordering::Relaxed);

        while timers.heap.peek().is_some_and(|t| t.at <= next) {
            let entry = timers.heap.pop().expect("peeked");
            entry.slot.fired.store(true, Ordering::Release);
            let waker = lock(&entry.slot.waker).take();
            wakers.extend(waker);
        }
        drop(timers);
        for (source, at) in sources.iter().zip(next_events.iter()) {
            if at.is_some_and(|t| t <= next) {
                source.advance(next, wakers);
            }
        }
        if self.config.shuffle_ties && wakers.len() > 1 {
            wakers.shuffle(&mut *lock(&self.tie_rng));
        }
        // Woken outside the world lock: a waker may run arbitrary code (a combinator's).
        let mut due = std::mem::take(wakers);
        drop(world);
        for waker in due.drain(..) {
            waker.wake();
        }
        lock(&self.world).wakers = due;
        Advance::Moved
    }
}

enum Advance {
    Moved,
    /// Nothing is pending anywhere.
    Idle,
    PastLimit {
        limit: Nanos,
        next: Nanos,
    },
}

/// Why [`Simulation::try_block_on`] stopped before its future completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimStop {
    /// The future is pending and nothing can ever wake it.
    Deadlock { at: Nanos, parked_tasks: usize },
    /// The next event lies past the time limit.
    TimeLimit { limit: Nanos, next: Nanos },
}

impl std::fmt::Display for SimStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimStop::Deadlock { at, parked_tasks } => write!(
                f,
                "simulation deadlock at virtual time {at} ns: the future given to block_on is \
                 pending, no task is runnable, no timer is set and no device has a request \
                 outstanding ({parked_tasks} spawned tasks parked)"
            ),
            SimStop::TimeLimit { limit, next } => write!(
                f,
                "simulation passed its virtual time limit of {limit} ns (next event at {next} ns)"
            ),
        }
    }
}

impl std::error::Error for SimStop {}

/// A deterministic simulation: owns the tasks, the timers and the event sources.
pub struct Simulation {
    shared: Arc<Shared>,
}

impl Simulation {
    /// A simulation at virtual time 0 with the default configuration for `seed`.
    pub fn new(seed: u64) -> Self {
        Self::with_config(SimConfig::new(seed))
    }

    pub fn with_config(config: SimConfig) -> Self {
        let tie_rng = ChaCha8Rng::seed_from_u64(derive_seed(config.seed, "executor-ties"));
        let layer_rng = ChaCha8Rng::seed_from_u64(derive_seed(config.seed, "runtime-random"));
        Simulation {
            shared: Arc::new(Shared {
                time_limit: AtomicU64::new(config.time_limit.unwrap_or(u64::MAX)),
                config,
                now: AtomicU64::new(0),
                ready: Mutex::new(VecDeque::new()),
                tasks: Mutex::new(IdMap::default()),
                next_task: AtomicU64::new(MAIN + 1),
                timers: Mutex::new(Timers {
                    heap: BinaryHeap::new(),
                    next_seq: 0,
                }),
                world: Mutex::new(World::default()),
                tie_rng: Mutex::new(tie_rng),
                layer_rng: Mutex::new(layer_rng),
                running: AtomicBool::new(false),
            }),
        }
    }

    pub fn seed(&self) -> u64 {
        self.shared.config.seed
    }

    /// Virtual time since the simulation started.
    pub fn now(&self) -> Nanos {
        self.shared.now.load(Ordering::Relaxed)
    }

    /// The runtime to hand to layers (`LayerArgs::runtime`).
    pub fn runtime(&self) -> Arc<dyn Runtime> {
        Arc::new(self.handle())
    }

    /// A cheap handle for code that needs the clock or timers of this simulation.
    pub fn handle(&self) -> SimRuntime {
        SimRuntime {
            shared: self.shared.clone(),
        }
    }

    /// An independent random stream for a named component ("workload", "disk d0"), derived
    /// from the seed, so that adding a consumer does not shift the numbers another one draws.
    pub fn rng(&self, stream: &str) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(derive_seed(self.seed(), stream))
    }

    /// Adds an event source; the executor consults it whenever nothing is runnable.
    pub fn register(&self, source: Arc<dyn EventSource>) {
        lock(&self.shared.world).sources.push(source);
    }

    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.shared.spawn(Box::pin(future));
    }

    /// Runs `future` (and every task, timer and device it depends on) to completion in
    /// virtual time. Tasks still pending when it returns stay parked for the next call.
    ///
    /// # Panics
    /// On deadlock (the future is pending and nothing can ever wake it), past the time
    /// limit, when a task panics, and when called from inside a simulation task.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.try_block_on(future)
            .unwrap_or_else(|stop| panic!("{stop}"))
    }

    /// [`Simulation::block_on`], with a deadlock or the time limit as an error instead of a
    /// panic (the future is dropped; the simulation stays usable).
    pub fn try_block_on<F: Future>(&self, future: F) -> Result<F::Output, SimStop> {
        let shared = &self.shared;
        assert!(
            !shared.running.swap(true, Ordering::AcqRel),
            "Simulation::block_on called from inside the simulation"
        );
        let _running = ResetOnDrop(&shared.running);
        let mut future = pin!(future);
        let main = Arc::new(TaskWaker {
            id: MAIN,
            queued: AtomicBool::new(true),
            shared: Arc::downgrade(shared),
        });
        lock(&shared.ready).push_back(MAIN);
        let main_waker = Waker::from(main.clone());
        let mut cx = Context::from_waker(&main_waker);
        loop {
            let next = lock(&shared.ready).pop_front();
            match next {
                Some(MAIN) => {
                    main.queued.store(false, Ordering::Release);
                    if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                        return Ok(output);
                    }
                }
                Some(id) => shared.poll_task(id),
                None => match shared.advance_world() {
                    Advance::Moved => {}
                    Advance::Idle => {
                        return Err(SimStop::Deadlock {
                            at: self.now(),
                            parked_tasks: lock(&shared.tasks).len(),
                        })
                    }
                    Advance::PastLimit { limit, next } => {
                        return Err(SimStop::TimeLimit { limit, next })
                    }
                },
            }
        }
    }

    /// Moves the time limit (`None`: no limit), e.g. to count it from the start of a run
    /// rather than from time 0, which assembling a stack may have moved far.
    pub fn set_time_limit(&self, limit: Option<Nanos>) {
        self.shared
            .time_limit
            .store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

impl Drop for Simulation {
    /// Tasks hold runtime handles that point back at the simulation; dropping them (outside
    /// the locks, as their destructors may touch the simulation) breaks the cycle.
    fn drop(&mut self) {
        let tasks = std::mem::take(&mut *lock(&self.shared.tasks));
        let sources = std::mem::take(&mut lock(&self.shared.world).sources);
        let timers = std::mem::take(&mut lock(&self.shared.timers).heap);
        drop((tasks, sources, timers));
    }
}

struct ResetOnDrop<'a>(&'a AtomicBool);

impl Drop for ResetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Hashes the sequential ids of tasks and requests with one multiplication (Fibonacci
/// hashing): SipHash was a visible share of a simulated request's cost, and these keys
/// come from a counter, not from an adversary.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by sequential ids.
pub(crate) type IdMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

/// Locks, ignoring poison: the simulation is single-threaded, so a panic that poisoned a
/// lock has already ended the run, and the cleanup after it must not panic again.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Mixes a component name into the seed (FNV-1a, then SplitMix64), stable across releases.
pub fn derive_seed(seed: u64, stream: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in stream.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    splitmix64(seed ^ hash)
}

pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// [`Runtime`] in virtual time: `now` is the simulation's clock, `sleep` a virtual timer,
/// `spawn` a task of the simulation.
#[derive(Clone)]
pub struct SimRuntime {
    shared: Arc<Shared>,
}

impl SimRuntime {
    pub fn now_nanos(&self) -> Nanos {
        self.shared.now.load(Ordering::Relaxed)
    }

    /// Completes once virtual time reaches `at` (at once if it has).
    pub fn sleep_until(&self, at: Nanos) -> Sleep {
        Sleep {
            shared: self.shared.clone(),
            at,
            slot: None,
        }
    }

    pub fn seed(&self) -> u64 {
        self.shared.config.seed
    }
}

impl Runtime for SimRuntime {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        let at = self
            .now_nanos()
            .saturating_add(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX));
        Box::pin(self.sleep_until(at))
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) {
        self.shared.spawn(task);
    }

    /// Runs the work at once, on the caller's stack. Sound here because a simulated stack
    /// has no real I/O below it (its leaves are in-memory disks), so "blocking" work is
    /// plain computation that takes no virtual time: finishing it before the caller's next
    /// poll is one of the schedules a real blocking pool could produce. What it excludes is
    /// blocking work that waits for an async task (it would hang the only thread), which no
    /// layer does: blocking work there is a system call.
    fn spawn_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) {
        work();
    }

    /// From the seed (the stream `"runtime-random"`), in the order layers ask, which is
    /// itself a function of the seed.
    fn random_u64(&self) -> u64 {
        lock(&self.shared.layer_rng).random()
    }
}

/// A virtual-time timer (see [`SimRuntime::sleep_until`]).
pub struct Sleep {
    shared: Arc<Shared>,
    at: Nanos,
    slot: Option<Arc<TimerSlot>>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.shared.now.load(Ordering::Relaxed) >= self.at {
            return Poll::Ready(());
        }
        match &self.slot {
            Some(slot) if slot.fired.load(Ordering::Acquire) => Poll::Ready(()),
            Some(slot) => {
                *lock(&slot.waker) = Some(cx.waker().clone());
                Poll::Pending
            }
            None => {
                let slot = Arc::new(TimerSlot {
                    fired: AtomicBool::new(false),
                    waker: Mutex::new(Some(cx.waker().clone())),
                });
                self.shared.add_timer(self.at, slot.clone());
                self.slot = Some(slot);
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    /// A cancelled sleep stays in the heap (removing it would cost a search) until it reaches
    /// the top, where the executor discards it without moving time.
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            lock(&slot.waker).take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_with_equal_deadlines_fire_in_insertion_order_without_shuffling() {
        let sim = Simulation::with_config(SimConfig {
            shuffle_ties: false,
            ..SimConfig::new(1)
        });
        assert_eq!(wake_order(&sim, 5), vec![0, 1, 2, 3, 4]);
    }

    /// Spawns `tasks` tasks that all sleep until t = 10, and returns the order they woke in.
    fn wake_order(sim: &Simulation, tasks: usize) -> Vec<usize> {
        let order = Arc::new(Mutex::new(Vec::new()));
        for i in 0..tasks {
            let order = order.clone();
            let runtime = sim.handle();
            sim.spawn(async move {
                runtime.sleep_until(10).await;
                lock(&order).push(i);
            });
        }
        sim.block_on(sim.handle().sleep_until(20));
        let order = lock(&order).clone();
        order
    }

    #[test]
    fn shuffled_ties_depend_on_the_seed_only() {
        let run = |seed| wake_order(&Simulation::new(seed), 8);
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn time_does_not_jump_to_a_cancelled_sleep() {
        let sim = Simulation::new(2);
        let runtime = sim.handle();
        sim.block_on(async {
            let long = Box::pin(runtime.sleep_until(1_000));
            let short = Box::pin(runtime.sleep_until(10));
            match futures_util::future::select(long, short).await {
                futures_util::future::Either::Right(_) => {}
                futures_util::future::Either::Left(_) => panic!("the long sleep won"),
            }
        });
        assert_eq!(sim.now(), 10);
        sim.block_on(runtime.sleep_until(2_000));
        assert_eq!(sim.now(), 2_000);
        let woken = sim.block_on(async {
            let cancelled = Box::pin(runtime.sleep_until(3_000));
            drop(cancelled);
            runtime.sleep_until(5_000).await;
            runtime.now_nanos()
        });
        assert_eq!(woken, 5_000);
    }

    #[test]
    fn runtime_sleep_has_nanosecond_resolution() {
        let sim = Simulation::new(3);
        let runtime = sim.runtime();
        let elapsed = sim.block_on(async move {
            let before = runtime.now();
            runtime.sleep(Duration::from_nanos(100_001)).await;
            runtime.now() - before
        });
        assert_eq!(elapsed, Duration::from_nanos(100_001));
    }

    #[test]
    fn spawn_blocking_runs_inline_and_run_blocking_returns() {
        let sim = Simulation::new(0);
        let runtime = sim.runtime();
        let value = sim.block_on(async move { strata_core::run_blocking(&*runtime, || 7).await });
        assert_eq!(value, 7);
        assert_eq!(sim.now(), 0);
    }

    #[test]
    fn derived_streams_differ_by_name_and_seed() {
        assert_ne!(derive_seed(1, "a"), derive_seed(1, "b"));
        assert_ne!(derive_seed(1, "a"), derive_seed(2, "a"));
        assert_eq!(derive_seed(1, "a"), derive_seed(1, "a"));
    }

    #[test]
    fn layers_draw_random_bits_from_the_seed() {
        let draws = |seed| {
            let runtime = Simulation::new(seed).runtime();
            (0..4).map(|_| runtime.random_u64()).collect::<Vec<u64>>()
        };
        assert_eq!(draws(1), draws(1));
        assert_ne!(draws(1), draws(2));
        let first = draws(1);
        assert!(first.windows(2).all(|w| w[0] != w[1]), "{first:?}");
    }
}
