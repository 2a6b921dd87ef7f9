//! `delay`: latency and a bandwidth limit in front of one child, so that files sharing one SSD
//! behave like separate, slower disks in benchmarks and demonstrations (nbdkit's `delay` and
//! `rate` filters).
//!
//! ```toml
//! [[layer]]
//! name = "slow"
//! kind = "delay"
//! children = ["d0"]
//! read-latency = "2ms"     # added to every read; units ns, us (µs), ms, s
//! write-latency = "5ms"    # added to every write, write_zeroes, discard and flush
//! bandwidth = "100MiB"     # bytes per second for reads and writes together ("/s" optional)
//! rtt = "9ms"              # a network round trip per request: the migration paper's
//!                          # Table 1 row (9, 17 or 25 ms average, with its deviation)
//! seed = 1                 # the round trips' random sequence (default 0)
//! ```
//!
//! With `rtt`, every request also waits one round trip drawn from the row's distribution
//! (normal, the row's mean and deviation, as the simulator's link): a `delay` in front of a
//! remote disk makes a brick on this machine look like one across the paper's network.
//!
//! A request reserves its transfer in a bandwidth schedule shared by every request of this
//! device when it arrives, and completes `latency` after its transfer is paid (so a lone
//! 1 MiB read at 100 MiB/s with 2 ms latency takes 12 ms, and the latencies of concurrent
//! requests overlap, as on a disk with a queue). The child is called at once, so a slow
//! child's own time overlaps the emulated time instead of adding to it; the request
//! completes when both are done. One sleep per request, so timer rounding happens once.
//!
//! The schedule ([`Schedule`]) is virtual scheduling (GCRA): it remembers when the link is
//! next free; a request of `b` bytes arriving at `t` is paid at `max(t - slack, free) + b /
//! rate`, which becomes the new `free`. Queued requests are thus paid back to back, exactly:
//! 20 concurrent 1 MiB reads at 100 MiB/s finish at 10, 20, …, 200 ms.
//!
//! Why the slack ([`SLACK`], 1 ms): timers are coarse (tokio's wheel ticks every millisecond
//! and rounds sleeps up), so a request that waited until it was paid wakes up to a tick late,
//! and a client issuing one request at a time would lose that time on every request: 64 KiB
//! reads at 100 MiB/s (0.625 ms each) would run at 62 MiB/s. Letting a request start up to
//! `SLACK` in the past gives the oversleep back. The cost is a burst allowance of `SLACK`
//! worth of bytes (200 KiB at 100 MiB/s) after an idle moment; over any window longer than
//! that, the rate holds.
//! write_zeroes and discard move no data and pay latency only.
//!
//! Time comes from the injected `Runtime` (`now`, `sleep`), never the OS clock, so tests run
//! on a paused clock in virtual time.
//!
//! Lock rule: the schedule's mutex is held only for the arithmetic of one reservation.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::join;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use strata_core::{
    async_trait, BlockDevice, BlockError, ByteSize, Control, ControlReply, DeviceRef, Filter,
    NodeStatus, Result, Runtime, WriteFlags, ZeroFlags,
};
use strata_devmodel::net::RttRow;

use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind};

pub static KIND: LayerKind =
    LayerKind::new::<DelayConfig>("delay", ChildCount::Exactly(1), |args| {
        Box::pin(async move { build(args).map(|d| Arc::new(d) as DeviceRef) })
    })
    .about("adds latency and a bandwidth limit (emulates a slower disk)");

/// What to emulate: a `[[layer]]` table of kind `delay`. Absent options add nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct DelayConfig {
    #[serde(with = "duration_text")]
    pub read_latency: Duration,
    #[serde(with = "duration_text")]
    pub write_latency: Duration,
    /// Bytes per second; `None` for no limit.
    #[serde(with = "bandwidth_text", skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<u64>,
    /// A round trip per request from Table 1's row with this average, in milliseconds.
    #[serde(with = "rtt_text", skip_serializing_if = "Option::is_none")]
    pub rtt: Option<u32>,
    /// Seeds the round trips' random sequence, so that runs repeat.
    pub seed: u64,
}

/// `rtt = "9ms"`: one of Table 1's averages.
mod rtt_text {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use strata_devmodel::net::{RttRow, MIGRATION_TABLE1};

    pub fn serialize<S: Serializer>(value: &Option<u32>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(ms) => serializer.collect_str(&format_args!("{ms}ms")),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        let text = String::deserialize(d)?;
        let known = || {
            MIGRATION_TABLE1
                .iter()
                .map(|row| format!("\"{}ms\"", row.avg_ms))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let ms = text
            .trim()
            .strip_suffix("ms")
            .and_then(|n| n.trim().parse::<u32>().ok())
            .filter(|ms| RttRow::by_avg_ms(*ms).is_some())
            .ok_or_else(|| {
                D::Error::custom(format!(
                    "{text:?} is not a round trip of the migration paper's Table 1 (one of {})",
                    known()
                ))
            })?;
        Ok(Some(ms))
    }
}

fn build(args: LayerArgs) -> Result<Delay> {
    let config: DelayConfig = args.options.parse()?;
    let child = args.all_children()?.remove(0);
    Ok(Delay::new(args.name, child, config, args.runtime))
}

/// Durations as `"2ms"`: [`parse_duration`] in, [`format_duration`] out.
mod duration_text {
    use std::time::Duration;

    use serde::de::Error;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&super::format_duration(*value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        match toml_scalar(deserializer)? {
            Scalar::Text(text) => super::parse_duration(&text).map_err(D::Error::custom),
            Scalar::Integer(n) => Err(D::Error::custom(format!("{n} needs a unit, as in \"2ms\""))),
            Scalar::Float(x) => Err(D::Error::custom(format!("{x} needs a unit, as in \"2ms\""))),
        }
    }

    /// What the configuration wrote: text, or a bare number (which a duration refuses with a
    /// hint, since it is ambiguous, and a bandwidth takes as bytes per second).
    pub(super) enum Scalar {
        Text(String),
        Integer(i64),
        Float(f64),
    }

    pub(super) fn toml_scalar<'de, D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        struct ScalarVisitor;
        impl serde::de::Visitor<'_> for ScalarVisitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string such as \"2ms\" or \"100MiB\"")
            }
            fn visit_str<E: Error>(self, text: &str) -> Result<Scalar, E> {
                Ok(Scalar::Text(text.to_string()))
            }
            fn visit_i64<E: Error>(self, n: i64) -> Result<Scalar, E> {
                Ok(Scalar::Integer(n))
            }
            fn visit_u64<E: Error>(self, n: u64) -> Result<Scalar, E> {
                i64::try_from(n)
                    .map(Scalar::Integer)
                    .map_err(|_| E::custom(format!("{n} is too large")))
            }
            fn visit_f64<E: Error>(self, x: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(x))
            }
        }
        d.deserialize_any(ScalarVisitor)
    }
}

/// A rate as `"100MiB"` (a size, `"/s"` optional) or a number of bytes per second.
mod bandwidth_text {
    use serde::de::Error;
    use serde::{Deserializer, Serializer};
    use strata_core::ByteSize;

    use super::duration_text::{toml_scalar, Scalar};

    pub fn serialize<S: Serializer>(value: &Option<u64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(rate) => serializer.collect_str(&ByteSize(*rate)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let rate = match toml_scalar(d)? {
            Scalar::Text(text) => {
                let text = text.trim();
                let text = text.strip_suffix("/s").unwrap_or(text);
                ByteSize::parse(text).map_err(D::Error::custom)?.0
            }
            Scalar::Integer(n) => {
                u64::try_from(n).map_err(|_| D::Error::custom("a bandwidth cannot be negative"))?
            }
            Scalar::Float(x) => {
                return Err(D::Error::custom(format!(
                    "{x} is not a size such as \"64KiB\""
                )))
            }
        };
        if rate == 0 {
            return Err(D::Error::custom("must be more than 0 bytes per second"));
        }
        Ok(Some(rate))
    }
}

pub use strata_core::duration::{format_duration, parse_duration};

/// How far in the past a transfer may start: covers timer granularity (see the module docs).
pub const SLACK: Duration = Duration::from_millis(1);

/// The shared bandwidth schedule: when the emulated link is next free.
#[derive(Debug)]
pub struct Schedule {
    bytes_per_second: u64,
    free_at: Duration,
}

impl Schedule {
    pub fn new(bytes_per_second: u64) -> Schedule {
        assert!(bytes_per_second > 0);
        Schedule {
            bytes_per_second,
            free_at: Duration::ZERO,
        }
    }

    /// Reserves the transfer of `bytes` arriving at `now`; returns when it is paid.
    pub fn reserve(&mut self, now: Duration, bytes: u64) -> Duration {
        let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_second);
        let cost = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let start = self.free_at.max(now.saturating_sub(SLACK));
        self.free_at = start + cost;
        assert!(
            self.free_at + SLACK >= now,
            "never paid more than SLACK in the past"
        );
        self.free_at
    }
}

pub struct Delay {
    name: String,
    child: DeviceRef,
    config: DelayConfig,
    runtime: Arc<dyn Runtime>,
    schedule: Option<Mutex<Schedule>>,
    /// The round trips' row and random sequence, with `rtt`.
    network: Option<(&'static RttRow, Mutex<ChaCha8Rng>)>,
}

impl Delay {
    pub fn new(
        name: String,
        child: DeviceRef,
        config: DelayConfig,
        runtime: Arc<dyn Runtime>,
    ) -> Delay {
        let network = config.rtt.map(|ms| {
            let row = RttRow::by_avg_ms(ms).expect("checked when the config was parsed");
            let rng = ChaCha8Rng::seed_from_u64(config.seed);
            (row, Mutex::new(rng))
        });
        Delay {
            schedule: config.bandwidth.map(|rate| Mutex::new(Schedule::new(rate))),
            network,
            name,
            child,
            config,
            runtime,
        }
    }

    async fn sleep_until(&self, deadline: Duration) {
        let now = self.runtime.now();
        if deadline > now {
            self.runtime.sleep(deadline - now).await;
        }
    }

    /// Runs `op` on the child and completes no earlier than `latency` after the transfer of
    /// `bytes`, reserved now, is paid.
    async fn delayed<T>(
        &self,
        latency: Duration,
        bytes: u64,
        op: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let arrival = self.runtime.now();
        let paid = match &self.schedule {
            Some(schedule) if bytes > 0 => {
                let mut schedule = schedule.lock().unwrap_or_else(PoisonError::into_inner);
                schedule.reserve(arrival, bytes)
            }
            _ => arrival,
        };
        let round_trip = match &self.network {
            Some((row, rng)) => {
                let mut rng = rng.lock().unwrap_or_else(PoisonError::into_inner);
                Duration::from_nanos(row.sample_ns(&mut rng))
            }
            None => Duration::ZERO,
        };
        let deadline = paid + latency + round_trip;
        if deadline <= arrival {
            return op.await;
        }
        let (result, ()) = join(op, self.sleep_until(deadline)).await;
        result
    }
}

#[async_trait]
impl Filter for Delay {
    fn next(&self) -> &DeviceRef {
        &self.child
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let op = self.child.read(offset, len);
        self.delayed(self.config.read_latency, len as u64, op).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        let bytes = data.len() as u64;
        let op = self.child.write(offset, data, flags);
        self.delayed(self.config.write_latency, bytes, op).await
    }

    async fn flush(&self) -> Result<()> {
        let op = self.child.flush();
        self.delayed(self.config.write_latency, 0, op).await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let op = self.child.discard(offset, len);
        self.delayed(self.config.write_latency, 0, op).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let op = self.child.write_zeroes(offset, len, flags);
        self.delayed(self.config.write_latency, 0, op).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => {
                let child = strata_core::describe(self.child.as_ref()).await?;
                let mut node = NodeStatus::new(&self.name, "delay", self.child.geometry().size);
                node.health = child.health;
                node.detail = vec![
                    (
                        "read-latency".into(),
                        format!("{:?}", self.config.read_latency),
                    ),
                    (
                        "write-latency".into(),
                        format!("{:?}", self.config.write_latency),
                    ),
                    (
                        "bandwidth".into(),
                        self.config
                            .bandwidth
                            .map_or("unlimited".into(), |b| format!("{}/s", ByteSize(b))),
                    ),
                ];
                if let Some((row, _)) = &self.network {
                    node.detail.push((
                        "rtt".into(),
                        format!("{} ms avg, {} ms deviation", row.avg_ms, row.mdev_ms),
                    ));
                }
                node.config = layer::to_table(&self.config);
                node.children = vec![child];
                Ok(ControlReply::Describe(node))
            }
            _ => Err(BlockError::Unsupported("delay: control")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_units_except_zero() {
        assert_eq!(parse_duration("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_duration(" 250us "), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("40ns"), Ok(Duration::from_nanos(40)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("2").unwrap_err().contains("examples"));
        assert!(parse_duration("2 parsecs").is_err());
        assert!(parse_duration("-1ms").unwrap_err().contains("between"));
        assert!(parse_duration("2h").is_err());
    }

    #[test]
    fn the_schedule_queues_transfers_and_keeps_one_slack_of_idle_credit() {
        let mib = 1 << 20;
        let mut schedule = Schedule::new(100 * mib);
        let ms = Duration::from_millis;
        // Three 1 MiB requests at once: paid at 10, 20, 30 ms.
        assert_eq!(schedule.reserve(ms(0), mib), ms(10));
        assert_eq!(schedule.reserve(ms(0), mib), ms(20));
        assert_eq!(schedule.reserve(ms(1), mib), ms(30));
        // After an idle second the link is free, with only SLACK (1 ms) of burst saved up.
        assert_eq!(schedule.reserve(ms(1000), mib), ms(1009));
        assert_eq!(schedule.reserve(ms(1000), mib / 2), ms(1014));
        // A request woken 0.9 ms late by a coarse timer loses nothing.
        let late = schedule.reserve(ms(1014) + Duration::from_micros(900), mib);
        assert_eq!(late, ms(1024));
    }
}
