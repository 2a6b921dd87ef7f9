//! `hdd`: one child (a file, a memory disk, any layer) made to behave, in real time, like a
//! modelled hard disk: each read and write completes when the simulator's calibrated drive
//! model (`strata_devmodel::hdd`: zoned geometry, seek curve, rotation, on-drive queue with
//! an SPTF or FIFO scheduler) says it does. For benchmarks that need a slow child whose speed
//! depends on where requests fall and how many are queued; `delay` is position-blind.
//!
//! ```toml
//! [[layer]]
//! name = "slow"
//! kind = "hdd"
//! children = ["d0"]
//! model = "wd-re3-1t"      # an HDD preset (strata_devmodel::hdd::presets); required
//! queue-depth = 8          # commands at the drive, which it reorders (preset's default: 8)
//! scheduler = "sptf"       # "sptf" | "fifo" (preset's default: sptf)
//! seed = 1                 # the drive's initial arm position and platter angle (default 1)
//! ```
//!
//! The child may not be larger than the model's capacity (refused at build).
//!
//! Mechanism: one drive model (`Hdd::with_seed`) behind a mutex, with the time origin
//! (`runtime.now()` when the layer was built; model time is time since then, in
//! nanoseconds), a counter of request ids and the set of modelled completions not yet
//! collected. A read or write locks, moves the model to now (completions go into the set),
//! submits itself, unlocks, and calls the child at once, so the child's own time overlaps
//! the modelled time instead of adding to it. It then waits: lock, move the model to now,
//! stop if its id is in the set; otherwise read the model's next completion, unlock, sleep
//! until then, and again. The request completes when both the child I/O and the modelled
//! service are done. So concurrent requests queue in the model as on the drive, and the
//! drive's scheduler sees all of them.
//!
//! Models mechanics only: there is no write cache (a write completes when the modelled heads
//! have written it; only reads can come early, from read-ahead), `flush` costs nothing
//! beyond the child's, and `discard` costs nothing beyond the child's. `write_zeroes` costs a
//! write of its length. Zero-length requests cost nothing. A caller that stops waiting
//! leaves its command with the drive, which serves it as a real one would.
//!
//! Time comes from the injected `Runtime` (`now`, `sleep`), never the OS clock, so tests run
//! on a paused clock in virtual time. Wake-ups are as late as the timer makes them (tokio
//! rounds a sleep up to the next millisecond); a late wake-up delays the caller, never the
//! model, whose completion times depend only on submission times.
//!
//! Lock rule: the model's mutex is held only for model arithmetic, never across an await.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::join;
use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind, Options};
use strata_core::{
    async_trait, BlockDevice, BlockError, Control, ControlReply, DeviceRef, Filter, NodeStatus,
    Result, Runtime, WriteFlags, ZeroFlags,
};
use strata_devmodel::hdd::{presets, Hdd as Drive, HddParams, Scheduler};
use strata_devmodel::model::{Completion, DeviceModel, Nanos, Op, Request, MILLIS};

pub static KIND: LayerKind = LayerKind {
    // Describe makes the preset's queue depth and scheduler explicit; so does normalize.
    normalize: normalize_config,
    ..LayerKind::new::<HddConfig>("hdd", ChildCount::Exactly(1), |args| {
        Box::pin(async move { build(args).map(|d| Arc::new(d) as DeviceRef) })
    })
    .about("completes requests when a modelled hard disk would (seeks, rotation, SPTF queue)")
};

/// What to model: a `[[layer]]` table of kind `hdd`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HddConfig {
    /// An HDD preset's name ([`presets::by_name`]).
    #[serde(deserialize_with = "model_name")]
    pub model: String,
    /// Commands at the drive; `None` for the preset's.
    #[serde(
        default,
        deserialize_with = "queue_depth",
        skip_serializing_if = "Option::is_none"
    )]
    pub queue_depth: Option<usize>,
    /// `None` for the preset's.
    #[serde(
        default,
        deserialize_with = "scheduler",
        skip_serializing_if = "Option::is_none"
    )]
    pub scheduler: Option<Scheduler>,
    /// Seeds the drive's initial arm position and platter angle.
    #[serde(default = "default_seed")]
    pub seed: u64,
}

fn default_seed() -> u64 {
    1
}

impl HddConfig {
    /// A config for `model` with every other option at its default.
    pub fn new(model: &str) -> HddConfig {
        HddConfig {
            model: model.to_owned(),
            queue_depth: None,
            scheduler: None,
            seed: default_seed(),
        }
    }

    /// The drive's parameters: the preset with this config's queue depth and scheduler.
    pub fn params(&self) -> Result<HddParams> {
        let mut params = preset(&self.model).map_err(BlockError::InvalidArgument)?;
        if let Some(depth) = self.queue_depth {
            if depth == 0 {
                return Err(BlockError::InvalidArgument(format!(
                    "field `queue-depth`: {QUEUE_DEPTH_ZERO}"
                )));
            }
            params.queue_depth = depth;
        }
        if let Some(scheduler) = self.scheduler {
            params.scheduler = scheduler;
        }
        Ok(params)
    }

    /// This config with the preset's defaults made explicit (what `describe` reports).
    pub fn explicit(&self) -> Result<HddConfig> {
        let params = self.params()?;
        Ok(HddConfig {
            queue_depth: Some(params.queue_depth),
            scheduler: Some(params.scheduler),
            ..self.clone()
        })
    }
}

/// The HDD preset `name`, or an error naming the presets there are.
fn preset(name: &str) -> std::result::Result<HddParams, String> {
    presets::by_name(name).ok_or_else(|| {
        let known: Vec<String> = presets::all().into_iter().map(|p| p.name).collect();
        format!("unknown HDD model `{name}` (known: {})", known.join(", "))
    })
}

fn model_name<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    let name = String::deserialize(d)?;
    preset(&name).map_err(serde::de::Error::custom)?;
    Ok(name)
}

const QUEUE_DEPTH_ZERO: &str = "must be at least 1 (the command in service counts)";

fn queue_depth<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<usize>, D::Error> {
    match usize::deserialize(d)? {
        0 => Err(serde::de::Error::custom(QUEUE_DEPTH_ZERO)),
        depth => Ok(Some(depth)),
    }
}

/// `"sptf"` or `"fifo"` (read as text: the options deserializer hands enums over as strings).
fn scheduler<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Scheduler>, D::Error> {
    match String::deserialize(d)?.as_str() {
        "sptf" => Ok(Some(Scheduler::Sptf)),
        "fifo" => Ok(Some(Scheduler::Fifo)),
        other => Err(serde::de::Error::custom(format!(
            "unknown scheduler `{other}` (known: sptf, fifo)"
        ))),
    }
}

/// The kind's `normalize`: the options read and written back with the preset's queue depth
/// and scheduler explicit, as `describe` reports them.
fn normalize_config(options: &Options) -> Result<toml::Table> {
    let config: HddConfig = options.parse()?;
    layer::to_table(&config.explicit()?).ok_or_else(|| {
        BlockError::InvalidArgument("the options hold a value TOML cannot carry".into())
    })
}

fn build(args: LayerArgs) -> Result<HddLayer> {
    let config: HddConfig = args.options.parse()?;
    let child = args.all_children()?.remove(0);
    HddLayer::new(args.name, child, config, args.runtime)
}

/// The model and what the waiting requests need of it, behind one mutex.
struct State {
    drive: Drive,
    next_id: u64,
    /// Modelled completions not yet collected by their request: id → when it completed.
    done: HashMap<u64, Nanos>,
    /// Requests whose caller went away before their modelled completion: dropped when it
    /// comes, so `done` does not keep them.
    abandoned: HashSet<u64>,
    /// The latest time the model was given (model time never goes back).
    clock: Nanos,
    /// Requests collected, and the sum of their modelled service (submission to completion,
    /// queueing included).
    requests: u64,
    service: Nanos,
}

impl State {
    /// Moves the model to `now`; its completions go into `done`.
    fn advance(&mut self, now: Nanos) {
        let mut completions: Vec<Completion> = Vec::new();
        self.drive.advance(now, &mut completions);
        for completion in completions {
            if !self.abandoned.remove(&completion.id) {
                self.done.insert(completion.id, completion.at);
            }
        }
    }
}

pub struct HddLayer {
    name: String,
    child: DeviceRef,
    /// As configured, with the preset's defaults explicit.
    config: HddConfig,
    /// The drive's, for describe.
    queue_depth: usize,
    scheduler: Scheduler,
    /// Bytes the model addresses.
    capacity: u64,
    runtime: Arc<dyn Runtime>,
    /// Model time 0.
    origin: Duration,
    state: Mutex<State>,
}

impl HddLayer {
    /// Refuses an unknown model and a child larger than the model's capacity.
    pub fn new(
        name: String,
        child: DeviceRef,
        config: HddConfig,
        runtime: Arc<dyn Runtime>,
    ) -> Result<HddLayer> {
        let params = config.params()?;
        let (queue_depth, scheduler) = (params.queue_depth, params.scheduler);
        let drive = Drive::with_seed(params, config.seed);
        let capacity = drive.capacity();
        let size = child.geometry().size;
        if size > capacity {
            return Err(BlockError::InvalidArgument(format!(
                "field `model`: {name}'s child holds {size} bytes ({:.1} GiB), more than \
                 model `{}` addresses: {capacity} bytes ({:.1} GiB)",
                gib(size),
                config.model,
                gib(capacity),
            )));
        }
        Ok(HddLayer {
            config: config.explicit()?,
            origin: runtime.now(),
            state: Mutex::new(State {
                drive,
                next_id: 0,
                done: HashMap::new(),
                abandoned: HashSet::new(),
                clock: 0,
                requests: 0,
                service: 0,
            }),
            queue_depth,
            scheduler,
            capacity,
            name,
            child,
            runtime,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Model time now; read under the lock, so that the model is given non-decreasing times.
    fn model_now(&self, state: &mut State) -> Nanos {
        let elapsed = self.runtime.now().saturating_sub(self.origin);
        let now = u64::try_from(elapsed.as_nanos()).unwrap_or(Nanos::MAX);
        state.clock = state.clock.max(now);
        state.clock
    }

    /// Runs `io` on the child and completes when both it and the modelled service of `op`
    /// over `offset..offset + len` are done.
    async fn modelled<T>(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        io: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if len == 0 {
            return io.await;
        }
        // Only a child that grew after the build can take requests past the model's end.
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.capacity)
        {
            return Err(BlockError::OutOfRange {
                offset,
                len,
                size: self.capacity,
            });
        }
        let pending = self.submit(op, offset, len);
        let (result, ()) = join(io, pending.serviced()).await;
        result
    }

    fn submit(&self, op: Op, offset: u64, len: u64) -> Pending<'_> {
        let mut state = self.lock();
        let now = self.model_now(&mut state);
        state.advance(now);
        let id = state.next_id;
        state.next_id += 1;
        state.drive.submit(
            now,
            Request {
                id,
                op,
                offset,
                len,
            },
        );
        Pending {
            layer: self,
            id,
            submitted: now,
            collected: false,
        }
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// A request submitted to the model and not yet collected. Dropped uncollected (its caller
/// went away), it leaves nothing behind in the state.
struct Pending<'a> {
    layer: &'a HddLayer,
    id: u64,
    submitted: Nanos,
    collected: bool,
}

impl Pending<'_> {
    /// Waits until the model has completed this request.
    async fn serviced(mut self) {
        loop {
            let next = {
                let mut state = self.layer.lock();
                let now = self.layer.model_now(&mut state);
                state.advance(now);
                if let Some(at) = state.done.remove(&self.id) {
                    state.requests += 1;
                    state.service += at - self.submitted;
                    self.collected = true;
                    return;
                }
                state
                    .drive
                    .next_completion()
                    .expect("a request not completed is outstanding in the model")
            };
            let deadline = self.layer.origin + Duration::from_nanos(next);
            let now = self.layer.runtime.now();
            if deadline > now {
                self.layer.runtime.sleep(deadline - now).await;
            }
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.collected {
            let mut state = self.layer.lock();
            if state.done.remove(&self.id).is_none() {
                state.abandoned.insert(self.id);
            }
        }
    }
}

#[async_trait]
impl Filter for HddLayer {
    fn next(&self) -> &DeviceRef {
        &self.child
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let io = self.child.read(offset, len);
        self.modelled(Op::Read, offset, len as u64, io).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let len = data.len() as u64;
        let io = self.child.write(offset, data, flags);
        self.modelled(Op::Write, offset, len, io).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let io = self.child.write_zeroes(offset, len, flags);
        self.modelled(Op::Write, offset, len, io).await
    }

    // flush and discard: the child's, at no modelled cost (Filter's defaults).

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => {
                let child = strata_core::describe(self.child.as_ref()).await?;
                let (requests, service) = {
                    let state = self.lock();
                    (state.requests, state.service)
                };
                let mean_ms = if requests == 0 {
                    0.0
                } else {
                    service as f64 / requests as f64 / MILLIS as f64
                };
                let mut node = NodeStatus::new(&self.name, "hdd", self.child.geometry().size);
                node.health = child.health;
                node.detail = vec![
                    ("model".into(), self.config.model.clone()),
                    ("queue-depth".into(), self.queue_depth.to_string()),
                    ("scheduler".into(), scheduler_name(self.scheduler).into()),
                    ("requests".into(), requests.to_string()),
                    ("mean-service-ms".into(), format!("{mean_ms:.3}")),
                ];
                node.config = layer::to_table(&self.config);
                node.children = vec![child];
                Ok(ControlReply::Describe(node))
            }
            _ => Err(BlockError::Unsupported("hdd: control")),
        }
    }
}

fn scheduler_name(scheduler: Scheduler) -> &'static str {
    match scheduler {
        Scheduler::Sptf => "sptf",
        Scheduler::Fifo => "fifo",
    }
}
