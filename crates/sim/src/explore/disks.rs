//! The explorer's disks: crash disks (a volatile cache that a power cut keeps any part of)
//! behind a wrapper that gives every request a small random service time in virtual time, so
//! that concurrent requests complete in orders the seed picks, and a disk a latency spike
//! (hundreds of milliseconds for a run of requests) when the plan says so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_core::{
    async_trait, BlockDevice, Capabilities, Control, ControlReply, Extent, Geometry, Result,
    Runtime, WriteFlags, ZeroFlags,
};
use strata_crash::CrashDisk;

/// What the disks of one boot share: the draw of service times and the request count.
pub struct Timing {
    rng: Mutex<ChaCha8Rng>,
    /// Per disk: extra latency and how many more requests it applies to.
    spikes: Mutex<Vec<(Duration, u32)>>,
    requests: AtomicU64,
    runtime: Arc<dyn Runtime>,
    /// Every request and its answer, when tracing (`STRATA_EXPLORE_TRACE=1`).
    trace: Option<Mutex<Vec<String>>>,
}

impl Timing {
    pub fn new(seed: u64, disks: usize, runtime: Arc<dyn Runtime>) -> Arc<Timing> {
        Arc::new(Timing {
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            spikes: Mutex::new(vec![(Duration::ZERO, 0); disks]),
            requests: AtomicU64::new(0),
            runtime,
            trace: std::env::var_os("STRATA_EXPLORE_TRACE").map(|_| Mutex::new(Vec::new())),
        })
    }

    /// Disk `disk`'s next `requests` requests take `extra` longer.
    pub fn spike(&self, disk: usize, extra: Duration, requests: u32) {
        self.spikes.lock().expect("spikes")[disk] = (extra, requests);
    }

    /// Requests the disks have served this boot.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Half the requests take no time; the others up to 20 µs, before and after the medium
    /// acts: enough to reorder requests in flight together, not to slow a run.
    fn service_time(&self, disk: usize) -> (Duration, Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut extra = Duration::ZERO;
        {
            let mut spikes = self.spikes.lock().expect("spikes");
            let (latency, left) = &mut spikes[disk];
            if *left > 0 {
                *left -= 1;
                extra = *latency;
            }
        }
        let mut rng = self.rng.lock().expect("timing rng");
        if rng.random_bool(0.5) {
            return (Duration::ZERO, extra);
        }
        let before = Duration::from_nanos(rng.random_range(0..20_000));
        let after = Duration::from_nanos(rng.random_range(0..20_000));
        (before, after + extra)
    }

    /// The trace so far (emptied).
    pub fn take_trace(&self) -> Vec<String> {
        self.trace
            .as_ref()
            .map(|t| std::mem::take(&mut *t.lock().expect("trace")))
            .unwrap_or_default()
    }

    /// Adds a line to the trace, stamped with virtual time, when tracing.
    pub fn record(&self, line: impl FnOnce() -> String) {
        if let Some(trace) = &self.trace {
            let line = format!("      [{:?}] {}", self.runtime.now(), line());
            trace.lock().expect("trace").push(line);
        }
    }

    async fn wait(&self, time: Duration) {
        if !time.is_zero() {
            self.runtime.sleep(time).await;
        }
    }
}

/// A crash disk with service times.
pub struct TimedDisk {
    disk: CrashDisk,
    index: usize,
    timing: Arc<Timing>,
}

impl TimedDisk {
    pub fn new(disk: CrashDisk, index: usize, timing: Arc<Timing>) -> Self {
        TimedDisk {
            disk,
            index,
            timing,
        }
    }

    async fn around<T>(
        &self,
        what: impl FnOnce() -> String + Send,
        op: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let (before, after) = self.timing.service_time(self.index);
        self.timing.wait(before).await;
        let result = op.await;
        let index = self.index;
        self.timing.record(|| {
            let answer = match &result {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("{e}"),
            };
            format!("d{index} {}: {answer}", what())
        });
        self.timing.wait(after).await;
        result
    }
}

#[async_trait]
impl BlockDevice for TimedDisk {
    fn geometry(&self) -> Geometry {
        self.disk.geometry()
    }

    fn capabilities(&self) -> Capabilities {
        self.disk.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.around(
            move || format!("read [{offset}, +{len})"),
            self.disk.read(offset, len),
        )
        .await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let len = data.len();
        self.around(
            move || format!("write [{offset}, +{len}) fua={}", flags.fua),
            self.disk.write(offset, data, flags),
        )
        .await
    }

    async fn flush(&self) -> Result<()> {
        self.around(|| "flush".to_string(), self.disk.flush()).await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.around(
            move || format!("discard [{offset}, +{len})"),
            self.disk.discard(offset, len),
        )
        .await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.around(
            move || format!("write_zeroes [{offset}, +{len})"),
            self.disk.write_zeroes(offset, len, flags),
        )
        .await
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.disk.block_status(offset, len).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        self.disk.control(request).await
    }
}
