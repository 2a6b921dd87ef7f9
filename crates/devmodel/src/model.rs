//! The interfaces every part of the simulator shares: virtual time, device requests and the
//! device-model contract. Models are pure discrete-event state machines: they never read a
//! clock, they are told the time.

/// Virtual time in nanoseconds since the simulation started.
pub type Nanos = u64;

pub const MICROS: Nanos = 1_000;
pub const MILLIS: Nanos = 1_000_000;
pub const SECONDS: Nanos = 1_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
}

/// One request as a device model sees it: bytes, not sectors, so every model speaks the
/// same unit; a model rounds to its own sector size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Unique per model instance; returned in the completion.
    pub id: u64,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub id: u64,
    /// When the request completed.
    pub at: Nanos,
}

/// A device model: a discrete-event state machine that accepts requests at given virtual
/// times and reports when each completes. It holds no data (the simulated block device does).
///
/// Contract: `submit` and `advance` are called with non-decreasing `now`. After `submit` the
/// caller asks `next_completion` and calls `advance(t)` no later than that time `t` (or
/// earlier, when another event comes first), so a model may start service lazily in
/// `advance` or eagerly in `submit`.
pub trait DeviceModel: Send {
    /// Preset or instance name, for reports.
    fn name(&self) -> &str;

    /// Addressable bytes.
    fn capacity(&self) -> u64;

    /// Accepts a request at `now`. A model with an on-device queue may hold it.
    fn submit(&mut self, now: Nanos, request: Request);

    /// The earliest time at which some accepted request will complete if nothing else is
    /// submitted, or `None` when no request is outstanding.
    fn next_completion(&self) -> Option<Nanos>;

    /// Moves the model to `now`, appending every request that completes at or before `now`
    /// to `done`, in completion order.
    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>);

    /// Accepted requests not yet completed (queued or in service).
    fn outstanding(&self) -> usize;

    /// Total time so far during which the device was serving at least one request (for
    /// utilization).
    fn busy_time(&self) -> Nanos;
}

/// One I/O a workload asks of the simulated stack (a whole request at the top, before any
/// layer splits it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Io {
    /// Open loop: when the I/O arrives, whatever is still outstanding. Closed loop (`None`):
    /// issued as soon as the driver has a free slot.
    pub arrival: Option<Nanos>,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
}

/// A source of I/Os: a trace being replayed or a generator. Deterministic: a generator owns
/// its seeded RNG, so the same seed gives the same sequence.
pub trait Workload: Send {
    /// The next I/O, or `None` when the workload is over.
    fn next_io(&mut self) -> Option<Io>;
}

/// A boxed workload is one (workloads chosen at run time wrap like any other).
impl<W: Workload + ?Sized> Workload for Box<W> {
    fn next_io(&mut self) -> Option<Io> {
        (**self).next_io()
    }
}

/// What the driver records of one completed top-level I/O; the input of every result
/// (latency statistics, throughput, plots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IoRecord {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    /// When the I/O arrived (open loop) or was issued (closed loop).
    pub issued: Nanos,
    pub completed: Nanos,
    /// Whether the stack returned an error.
    pub failed: bool,
}

/// One sample of a simulated device's state, taken by the driver at a fixed virtual-time
/// interval: the input of utilization and queue-depth plots.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceSample {
    pub at: Nanos,
    pub device: String,
    /// Requests outstanding at the device at `at`.
    pub queue_depth: usize,
    /// Busy fraction over the interval that ends at `at`, 0.0..=1.0.
    pub utilization: f64,
}
