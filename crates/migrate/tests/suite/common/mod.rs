//! Helpers shared by the migrate layer's tests: a clock the tests move, children whose
//! response time the tests set (each request advances the clock by its child's latency, so
//! the layer measures exactly that), and a small layer (16 KiB chunks, 1 MiB of metadata).

#![allow(dead_code)] // Each test module uses a different subset.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, BoxFuture, ByteSize, Capabilities, DeviceRef, Geometry, Result,
    Runtime, TokioRuntime, WriteFlags,
};
use strata_migrate::{Migrate, MigrateConfig, Settings};

pub const METADATA: u64 = 1 << 20;
pub const BLOCK: u64 = 4096;
pub const CHUNK: u64 = 16 << 10;
pub const CHUNK_BLOCKS: u64 = CHUNK / BLOCK;

/// A runtime whose clock only moves when a test (or a [`Timed`] child) moves it; spawning
/// and sleeping are tokio's.
pub struct ManualClock {
    nanos: AtomicU64,
    inner: Arc<TokioRuntime>,
}

impl ManualClock {
    pub fn new() -> Arc<ManualClock> {
        Arc::new(ManualClock {
            nanos: AtomicU64::new(0),
            inner: TokioRuntime::current(),
        })
    }

    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Runtime for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        self.inner.sleep(duration)
    }

    fn spawn(&self, task: BoxFuture<'static, ()>) {
        self.inner.spawn(task)
    }

    fn spawn_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) {
        self.inner.spawn_blocking(work)
    }

    fn random_u64(&self) -> u64 {
        0x5EED
    }
}

/// A child whose every request takes `latency_us` of the manual clock, and that counts its
/// reads and writes. Each read and write yields once first (a real device does not answer
/// at once), so the layer's background migrations run between and during requests.
pub struct Timed {
    pub inner: DeviceRef,
    pub clock: Arc<ManualClock>,
    pub latency_us: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
}

impl Timed {
    pub fn new(inner: DeviceRef, clock: &Arc<ManualClock>, latency_us: u64) -> Arc<Timed> {
        Arc::new(Timed {
            inner,
            clock: clock.clone(),
            latency_us: AtomicU64::new(latency_us),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        })
    }

    pub fn set_latency_us(&self, latency_us: u64) {
        self.latency_us.store(latency_us, Ordering::SeqCst);
    }

    fn tick(&self) {
        self.clock.advance(Duration::from_micros(
            self.latency_us.load(Ordering::SeqCst),
        ));
    }

    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl BlockDevice for Timed {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        tokio::task::yield_now().await;
        self.reads.fetch_add(1, Ordering::SeqCst);
        let result = self.inner.read(offset, len).await;
        self.tick();
        result
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        tokio::task::yield_now().await;
        self.writes.fetch_add(1, Ordering::SeqCst);
        let result = self.inner.write(offset, data, flags).await;
        self.tick();
        result
    }

    async fn flush(&self) -> Result<()> {
        self.inner.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.discard(offset, len).await
    }
}

/// A config for tests: 16 KiB chunks, 1 MiB of metadata, no background merger, a fixed
/// seed, `delta` as given ("0" forces a migration whenever another child is faster), every
/// accessed chunk a candidate, tokens enough for every request.
pub fn config(allocation: &str, policy: &str, delta: &str) -> MigrateConfig {
    MigrateConfig {
        allocation: allocation.to_string().try_into().unwrap(),
        policy: policy.to_string().try_into().unwrap(),
        delta: delta.into(),
        smoothing: "10s".into(),
        tokens: 1_000_000,
        token_cap: Some(1_000_000),
        chunk: ByteSize(CHUNK),
        candidate_probability: 1.0,
        candidates: 4096,
        merge_interval: "0".into(),
        seed: Some(7),
        metadata_size: Some(ByteSize(METADATA)),
    }
}

pub fn settings(config: &MigrateConfig, clock: &Arc<ManualClock>) -> Settings {
    Settings::from_config(config, clock.clone()).unwrap()
}

/// Child 0's size for `slots` chunk slots after the metadata.
pub fn local_size(slots: u64) -> u64 {
    METADATA + slots * CHUNK
}

pub async fn format(
    children: Vec<DeviceRef>,
    config: &MigrateConfig,
    clock: &Arc<ManualClock>,
) -> Arc<Migrate> {
    Migrate::format("mig", children, config, settings(config, clock))
        .await
        .unwrap()
}

pub async fn reopen(
    children: Vec<DeviceRef>,
    config: &MigrateConfig,
    clock: &Arc<ManualClock>,
) -> Arc<Migrate> {
    let layer = Migrate::open("mig", children, settings(config, clock))
        .await
        .unwrap();
    assert_invariants(&layer);
    layer
}

/// Every written block valid in exactly one place, no slot used twice.
pub fn assert_invariants(layer: &Migrate) {
    let problems = layer.store().read(strata_migrate::check_state);
    assert!(problems.is_empty(), "invariants broken: {problems:?}");
}

/// A block of `byte` repeated, tagged with its block number so a misplaced block shows.
pub fn block_data(block: u64, byte: u8) -> Vec<u8> {
    let mut data = vec![byte; BLOCK as usize];
    data[..8].copy_from_slice(&block.to_le_bytes());
    data
}

pub fn blocks_data(first: u64, count: u64, byte: u8) -> Bytes {
    Bytes::from(
        (first..first + count)
            .flat_map(|b| block_data(b, byte))
            .collect::<Vec<u8>>(),
    )
}

/// The value of a named counter.
pub fn counter(layer: &Migrate, name: &str) -> u64 {
    layer
        .counters()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no counter {name:?}"))
        .1
}
