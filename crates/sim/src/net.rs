//! A network link (propagation delay drawn from a seeded distribution, serialization at a
//! bandwidth, per direction) and `Remote`, a device model reached over such a link: the model
//! of a storage brick behind iSCSI in the user-centric migration paper.
//!
//! A message of `b` bytes sent at `t` in one direction starts when that direction's wire is
//! free, holds it for `b / bandwidth`, then arrives one sampled propagation delay later.
//! Delays are independent per message, so a late message can overtake an earlier one, as
//! packets do under netem jitter.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Normal};

use crate::model::{Completion, DeviceModel, Nanos, Op, Request, MILLIS, SECONDS};

/// One-way propagation delay. Samples below zero are clipped to zero.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum DelayDist {
    Constant {
        mean_ns: Nanos,
    },
    /// Symmetric jitter, as netem's `distribution normal`.
    Normal {
        mean_ns: Nanos,
        std_dev_ns: Nanos,
    },
    /// Right-skewed, never negative; parameterised by its own mean and standard deviation.
    LogNormal {
        mean_ns: Nanos,
        std_dev_ns: Nanos,
    },
}

impl DelayDist {
    pub fn mean_ns(&self) -> Nanos {
        match *self {
            DelayDist::Constant { mean_ns }
            | DelayDist::Normal { mean_ns, .. }
            | DelayDist::LogNormal { mean_ns, .. } => mean_ns,
        }
    }

    pub fn sample(&self, rng: &mut ChaCha8Rng) -> Nanos {
        let drawn = match *self {
            DelayDist::Constant { mean_ns } => return mean_ns,
            DelayDist::Normal {
                mean_ns,
                std_dev_ns,
            } => Normal::new(mean_ns as f64, std_dev_ns as f64)
                .expect("a finite, non-negative deviation")
                .sample(rng),
            DelayDist::LogNormal {
                mean_ns,
                std_dev_ns,
            } => {
                assert!(mean_ns > 0, "a log-normal delay needs a positive mean");
                LogNormal::from_mean_cv(mean_ns as f64, std_dev_ns as f64 / mean_ns as f64)
                    .expect("a positive mean and finite deviation")
                    .sample(rng)
            }
        };
        drawn.max(0.0).round() as Nanos
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Duplex {
    /// Each direction has its own wire (switched Ethernet).
    Full,
    /// Both directions share one wire.
    Half,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    ToDevice,
    ToHost,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkParams {
    pub name: String,
    pub delay: DelayDist,
    /// `None`: serialization takes no time.
    pub bytes_per_s: Option<u64>,
    pub duplex: Duplex,
    /// Added to every message: a request without payload (a read command, a write
    /// acknowledgement) still crosses the link.
    pub header_bytes: u64,
}

pub use strata_devmodel::net::{RttRow, MIGRATION_TABLE1};

/// The paper's 100 Mb/s LAN.
pub const FAST_ETHERNET_BYTES_PER_S: u64 = 100_000_000 / 8;

/// An iSCSI basic header segment; Strata's choice of per-message overhead (TCP/IP headers and
/// the iSCSI data segment framing are left out).
pub const ISCSI_HEADER_BYTES: u64 = 48;

impl LinkParams {
    /// A link whose round trip matches a Table 1 row: each direction normal with half the mean
    /// and `mdev / √2` deviation, so the sum of two independent directions has the row's mean
    /// and deviation (ping's mdev is a standard deviation). The rows' min and max are not
    /// modelled (only clipping at zero); the netem command line is unspecified in the paper.
    pub fn from_rtt_row(row: &RttRow) -> Self {
        let mean_ns = (row.avg_ms * MILLIS as f64 / 2.0).round() as Nanos;
        let std_dev_ns = (row.mdev_ms * MILLIS as f64 / std::f64::consts::SQRT_2).round() as Nanos;
        Self {
            name: format!("rtt-{}ms", row.avg_ms),
            delay: DelayDist::Normal {
                mean_ns,
                std_dev_ns,
            },
            bytes_per_s: Some(FAST_ETHERNET_BYTES_PER_S),
            duplex: Duplex::Full,
            header_bytes: ISCSI_HEADER_BYTES,
        }
    }

    /// Table 1 by its average round trip (9, 17 or 25 ms).
    pub fn migration_rtt_ms(avg_ms: u32) -> Option<Self> {
        MIGRATION_TABLE1
            .iter()
            .find(|row| row.avg_ms == avg_ms as f64)
            .map(Self::from_rtt_row)
    }

    /// Time `bytes` hold the wire.
    pub fn serialization_ns(&self, bytes: u64) -> Nanos {
        match self.bytes_per_s {
            None => 0,
            Some(rate) => {
                assert!(rate > 0, "a link bandwidth of 0 never delivers");
                (bytes as u128 * SECONDS as u128).div_ceil(rate as u128) as Nanos
            }
        }
    }
}

pub struct Link {
    params: LinkParams,
    rng: ChaCha8Rng,
    /// When each wire is next free: [to device, to host]; half duplex uses only the first.
    wire_free_at: [Nanos; 2],
}

impl Link {
    pub fn new(params: LinkParams, seed: u64) -> Self {
        Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(seed),
            wire_free_at: [0, 0],
        }
    }

    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// Sends a message of `payload` bytes (plus the header) at `now`; returns its arrival.
    /// Calls must come in non-decreasing `now` per wire.
    pub fn send(&mut self, now: Nanos, direction: Direction, payload: u64) -> Nanos {
        let wire = match (self.params.duplex, direction) {
            (Duplex::Full, Direction::ToHost) => 1,
            _ => 0,
        };
        let start = now.max(self.wire_free_at[wire]);
        let sent = start
            + self
                .params
                .serialization_ns(payload + self.params.header_bytes);
        self.wire_free_at[wire] = sent;
        let arrival = sent + self.params.delay.sample(&mut self.rng);
        debug_assert!(arrival >= now);
        arrival
    }

    /// A one-way propagation delay, drawn from the link's stream (for statistics and tests).
    pub fn sample_delay(&mut self) -> Nanos {
        self.params.delay.sample(&mut self.rng)
    }
}

type Event = Reverse<(Nanos, u64, u64)>; // (at, sequence, request id)

/// A device behind a link: the request crosses to the device (carrying the payload if it is
/// a write), the device serves it, and the reply crosses back (carrying the payload if it is a
/// read). `busy_time` is the device's: the wire is not the brick.
///
/// `next_completion` reports the next internal event (a request reaching the device, the
/// device finishing, a reply arriving), which may complete nothing for the caller; that is
/// within the contract (the caller advances no later than it) and keeps the device's own
/// events on time.
pub struct Remote {
    name: String,
    link: Link,
    device: Box<dyn DeviceModel>,
    /// Requests on the wire towards the device.
    arriving: BinaryHeap<Event>,
    /// Replies on the wire towards the host.
    replying: BinaryHeap<Event>,
    /// Every accepted, uncompleted request, by id: needed when the device finishes it.
    requests: BTreeMap<u64, Request>,
    sequence: u64,
    device_done: Vec<Completion>,
    now: Nanos,
}

impl Remote {
    pub fn new(link: Link, device: Box<dyn DeviceModel>) -> Self {
        let name = format!("{}@{}", device.name(), link.params().name);
        Self {
            name,
            link,
            device,
            arriving: BinaryHeap::new(),
            replying: BinaryHeap::new(),
            requests: BTreeMap::new(),
            sequence: 0,
            device_done: Vec::new(),
            now: 0,
        }
    }

    pub fn device(&self) -> &dyn DeviceModel {
        self.device.as_ref()
    }

    fn next_sequence(&mut self) -> u64 {
        self.sequence += 1;
        self.sequence
    }

    /// Runs the link and the device up to `now`, in time order; at equal times the device
    /// finishes before a new request reaches it.
    fn run_until(&mut self, now: Nanos) {
        loop {
            let arrival = self.arriving.peek().map(|Reverse((at, _, _))| *at);
            let device = self.device.next_completion();
            match (arrival, device) {
                (_, Some(at)) if at <= now && arrival.is_none_or(|a| at <= a) => {
                    self.device_finishes(at)
                }
                (Some(at), _) if at <= now => self.reach_device(),
                _ => return,
            }
        }
    }

    fn reach_device(&mut self) {
        let Reverse((at, _, id)) = self.arriving.pop().expect("an arrival");
        let request = self.requests[&id];
        self.device.submit(at, request);
    }

    fn device_finishes(&mut self, at: Nanos) {
        let mut done = std::mem::take(&mut self.device_done);
        self.device.advance(at, &mut done);
        for completion in done.drain(..) {
            let request = self.requests[&completion.id];
            let payload = if request.op == Op::Read {
                request.len
            } else {
                0
            };
            let back_at = self.link.send(completion.at, Direction::ToHost, payload);
            let sequence = self.next_sequence();
            self.replying
                .push(Reverse((back_at, sequence, completion.id)));
        }
        self.device_done = done;
    }
}

impl DeviceModel for Remote {
    fn name(&self) -> &str {
        &self.name
    }

    fn capacity(&self) -> u64 {
        self.device.capacity()
    }

    fn submit(&mut self, now: Nanos, request: Request) {
        assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        assert!(
            !self.requests.contains_key(&request.id),
            "request id {} reused",
            request.id
        );
        self.run_until(now);
        self.now = now;
        let payload = if request.op == Op::Write {
            request.len
        } else {
            0
        };
        let at = self.link.send(now, Direction::ToDevice, payload);
        let sequence = self.next_sequence();
        self.arriving.push(Reverse((at, sequence, request.id)));
        self.requests.insert(request.id, request);
    }

    fn next_completion(&self) -> Option<Nanos> {
        let events = [
            self.arriving.peek().map(|Reverse((at, _, _))| *at),
            self.replying.peek().map(|Reverse((at, _, _))| *at),
            self.device.next_completion(),
        ];
        events.into_iter().flatten().min()
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        self.run_until(now);
        self.now = now;
        while let Some(&Reverse((at, _, id))) = self.replying.peek() {
            if at > now {
                break;
            }
            self.replying.pop();
            self.requests
                .remove(&id)
                .expect("a reply for a known request");
            done.push(Completion { id, at });
        }
    }

    fn outstanding(&self) -> usize {
        self.requests.len()
    }

    fn busy_time(&self) -> Nanos {
        self.device.busy_time()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table1_presets_split_the_round_trip_over_two_directions() {
        let link = LinkParams::migration_rtt_ms(9).expect("a Table 1 row");
        assert_eq!(
            link.delay,
            DelayDist::Normal {
                mean_ns: 4_500_000,
                std_dev_ns: 1_626_346
            }
        );
        assert!(LinkParams::migration_rtt_ms(17).is_some());
        assert!(LinkParams::migration_rtt_ms(25).is_some());
        assert!(LinkParams::migration_rtt_ms(10).is_none());
    }

    #[test]
    fn serialization_at_100_mbit() {
        let link = LinkParams::migration_rtt_ms(9).unwrap();
        // 4096 + 48 bytes at 12.5 MB/s = 331.52 µs.
        assert_eq!(link.serialization_ns(4096 + 48), 331_520);
    }

    #[test]
    fn one_wire_queues_messages_in_order() {
        let params = LinkParams {
            name: "test".into(),
            delay: DelayDist::Constant { mean_ns: 1_000 },
            bytes_per_s: Some(1_000_000_000), // 1 byte per ns
            duplex: Duplex::Half,
            header_bytes: 0,
        };
        let mut link = Link::new(params, 1);
        assert_eq!(link.send(0, Direction::ToDevice, 500), 1_500);
        assert_eq!(
            link.send(0, Direction::ToHost, 500),
            2_000,
            "half duplex shares the wire"
        );
    }

    #[test]
    fn negative_draws_clip_to_zero() {
        let dist = DelayDist::Normal {
            mean_ns: 10,
            std_dev_ns: 1_000_000,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let zeros = (0..1000).filter(|_| dist.sample(&mut rng) == 0).count();
        assert!((400..600).contains(&zeros), "about half clip: {zeros}");
    }
}
