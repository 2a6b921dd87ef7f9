//! Per-device counters and latency histograms, exported for Prometheus and shown by
//! `strata status`.
//!
//! [`Metered`] wraps any device and counts what passes through it, timing each call with the
//! runtime's clock (virtual time under the simulator).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::{
    BlockDevice, Capabilities, Control, ControlReply, Extent, Geometry, Result, Runtime,
    WriteFlags, ZeroFlags,
};

/// The operations we count separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
    BlockStatus,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Discard,
        Op::WriteZeroes,
        Op::BlockStatus,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
            Op::WriteZeroes => "write_zeroes",
            Op::BlockStatus => "block_status",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    device: String,
    op: String,
}

/// The metric families every device's counters live in. One per process (or per simulation).
/// Clones share the families.
#[derive(Clone)]
pub struct MetricsRegistry {
    ops: Family<OpLabels, Counter>,
    bytes: Family<OpLabels, Counter>,
    errors: Family<OpLabels, Counter>,
    latency: Family<OpLabels, Histogram>,
}

impl Default for MetricsRegistry {
    fn default() -> Self {
        MetricsRegistry {
            ops: Family::default(),
            bytes: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        }
    }
}

/// A latency histogram in seconds, the buckets every Strata latency uses: 10 µs to ~42 s in
/// 23 factor-2 steps, which covers a page-cache hit and a stalled disk.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10e-6, 2.0, 23))
}

impl MetricsRegistry {
    /// Registers the families under the `strata_device` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("strata_device");
        sub.register("ops", "Requests completed", self.ops.clone());
        sub.register(
            "bytes",
            "Bytes moved by completed requests",
            self.bytes.clone(),
        );
        sub.register("errors", "Requests that failed", self.errors.clone());
        sub.register(
            "latency_seconds",
            "Time from submission to completion",
            self.latency.clone(),
        );
    }

    /// Creates the counters of one device.
    pub fn device(&self, name: &str) -> Arc<DeviceStats> {
        let per_op = Op::ALL.map(|op| {
            let labels = OpLabels {
                device: name.to_string(),
                op: op.name().to_string(),
            };
            OpStats {
                ops: self.ops.get_or_create(&labels).clone(),
                bytes: self.bytes.get_or_create(&labels).clone(),
                errors: self.errors.get_or_create(&labels).clone(),
                latency: self.latency.get_or_create(&labels).clone(),
                latency_ns_total: AtomicU64::new(0),
            }
        });
        Arc::new(DeviceStats { per_op })
    }
}

struct OpStats {
    ops: Counter,
    bytes: Counter,
    errors: Counter,
    latency: Histogram,
    // The histogram keeps its sum privately; status needs the mean.
    latency_ns_total: AtomicU64,
}

/// The live counters of one device.
pub struct DeviceStats {
    per_op: [OpStats; 6],
}

/// A point-in-time copy of one operation's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpSnapshot {
    pub ops: u64,
    pub bytes: u64,
    pub errors: u64,
    pub latency_us_mean: u64,
}

/// A point-in-time copy of a device's counters, as `strata status` shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    pub read: OpSnapshot,
    pub write: OpSnapshot,
    pub flush: OpSnapshot,
    pub discard: OpSnapshot,
    pub write_zeroes: OpSnapshot,
    pub block_status: OpSnapshot,
}

impl DeviceStats {
    fn op(&self, op: Op) -> &OpStats {
        &self.per_op[op as usize]
    }

    /// Records one completed request.
    pub fn record(&self, op: Op, bytes: u64, latency: Duration, ok: bool) {
        let stats = self.op(op);
        stats.ops.inc();
        if ok {
            stats.bytes.inc_by(bytes);
        } else {
            stats.errors.inc();
        }
        stats.latency.observe(latency.as_secs_f64());
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        stats.latency_ns_total.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let one = |op| {
            let stats = self.op(op);
            let ops = stats.ops.get();
            let total_ns = stats.latency_ns_total.load(Ordering::Relaxed);
            OpSnapshot {
                ops,
                bytes: stats.bytes.get(),
                errors: stats.errors.get(),
                latency_us_mean: total_ns.checked_div(ops).unwrap_or(0) / 1000,
            }
        };
        StatsSnapshot {
            read: one(Op::Read),
            write: one(Op::Write),
            flush: one(Op::Flush),
            discard: one(Op::Discard),
            write_zeroes: one(Op::WriteZeroes),
            block_status: one(Op::BlockStatus),
        }
    }
}

/// Counts and times every call into `inner`.
pub struct Metered<D> {
    inner: D,
    stats: Arc<DeviceStats>,
    runtime: Arc<dyn Runtime>,
}

impl<D: BlockDevice> Metered<D> {
    pub fn new(inner: D, stats: Arc<DeviceStats>, runtime: Arc<dyn Runtime>) -> Self {
        Metered {
            inner,
            stats,
            runtime,
        }
    }

    pub fn stats(&self) -> &Arc<DeviceStats> {
        &self.stats
    }

    fn finish<T>(&self, op: Op, bytes: u64, started: Duration, result: Result<T>) -> Result<T> {
        let latency = self.runtime.now().saturating_sub(started);
        self.stats.record(op, bytes, latency, result.is_ok());
        result
    }
}

#[async_trait]
impl<D: BlockDevice> BlockDevice for Metered<D> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let started = self.runtime.now();
        let result = self.inner.read(offset, len).await;
        self.finish(Op::Read, len as u64, started, result)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let started = self.runtime.now();
        let len = data.len() as u64;
        let result = self.inner.write(offset, data, flags).await;
        self.finish(Op::Write, len, started, result)
    }

    async fn flush(&self) -> Result<()> {
        let started = self.runtime.now();
        let result = self.inner.flush().await;
        self.finish(Op::Flush, 0, started, result)
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let started = self.runtime.now();
        let result = self.inner.discard(offset, len).await;
        self.finish(Op::Discard, len, started, result)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let started = self.runtime.now();
        let result = self.inner.write_zeroes(offset, len, flags).await;
        self.finish(Op::WriteZeroes, len, started, result)
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let started = self.runtime.now();
        let result = self.inner.block_status(offset, len).await;
        self.finish(Op::BlockStatus, 0, started, result)
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        let connection = matches!(request, Control::Connection);
        let reply = self.inner.control(request).await?;
        Ok(match reply {
            // A connection's own view is counted with the device's.
            ControlReply::Device(view) if connection => ControlReply::Device(Arc::new(
                Metered::new(view, self.stats.clone(), self.runtime.clone()),
            )),
            ControlReply::Describe(mut node) => {
                node.stats = Some(self.stats.snapshot());
                ControlReply::Describe(node)
            }
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn record_counts_bytes_only_on_success_and_errors_only_on_failure() {
        let metrics = MetricsRegistry::default();
        let stats = metrics.device("d0");
        stats.record(Op::Read, 4096, Duration::from_micros(30), true);
        stats.record(Op::Read, 4096, Duration::from_micros(50), false);
        let snap = stats.snapshot();
        assert_eq!(snap.read.ops, 2);
        assert_eq!(snap.read.bytes, 4096);
        assert_eq!(snap.read.errors, 1);
        assert_eq!(snap.read.latency_us_mean, 40);
        assert_eq!(snap.write, OpSnapshot::default());
    }

    #[test]
    fn prometheus_text_names_device_and_op() {
        let metrics = MetricsRegistry::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics
            .device("d0")
            .record(Op::Write, 512, Duration::from_micros(20), true);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"strata_device_bytes_total{device="d0",op="write"} 512"#),
            "{text}"
        );
        assert!(
            text.contains("strata_device_latency_seconds_bucket"),
            "{text}"
        );
        assert_eq!(text.matches("# TYPE strata_device_ops counter").count(), 1);
    }
}
