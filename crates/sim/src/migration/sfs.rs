//! A **synthetic** SFS-like workload (Strata's construction, not SPECsfs): SPECsfs 3.0 is a
//! licensed, retired benchmark of NFSv3 operations, and what its NFS server sent to the disks
//! is not in the paper. The digest (§4.3, §8) says only: mostly small metadata operations and
//! reads, then writes; a creation phase (mostly writes), then a transaction phase of random
//! reads and writes; response time against delivered throughput. This generator issues the
//! block requests such a server could send, open loop:
//!
//! - the data set (`data_bytes`) is cut into a **metadata region** (the first sixteenth:
//!   inodes, directories) and a **file region** (the rest);
//! - each operation is one block request of one of the six kinds of [`MIX`], drawn by weight:
//!   4 KiB metadata reads and writes, 8 KiB file reads and writes, 64 KiB sequential file
//!   reads and writes;
//! - addresses are Zipf-distributed (`theta`) over 4 KiB blocks (metadata), 8 KiB pieces
//!   (small file I/O) or 64 KiB extents (large file I/O) of their region, each popularity
//!   rank scattered over the region by a fixed bijection, so hot data is spread over the
//!   chunks (and over the striped disks) and a small part of the data gets most accesses;
//! - arrivals are a Poisson process of `rate` operations per second from time 0 to
//!   `duration` (open loop: an operation arrives whatever is still outstanding).
//!
//! The creation phase is [`creation`]: the data set written front to back in 1 MiB writes.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};

use crate::model::{Io, Nanos, Op, Workload, SECONDS};
use crate::workload::generate::{coprime_step, scatter_rank};

const KIB: u64 = 1 << 10;

/// Where an operation's address is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Region {
    Metadata,
    Files,
}

/// One kind of operation of the mix.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct OpKind {
    pub name: &'static str,
    pub op: Op,
    pub bytes: u64,
    pub region: Region,
    /// Percent of operations.
    pub weight: u32,
}

/// The synthetic mix (weights in percent, summing to 100): 40 % metadata-like 4 KiB I/O,
/// 42 % small file I/O, 18 % larger sequential file I/O; two reads for every write.
pub const MIX: [OpKind; 6] = [
    OpKind {
        name: "metadata read",
        op: Op::Read,
        bytes: 4 * KIB,
        region: Region::Metadata,
        weight: 28,
    },
    OpKind {
        name: "metadata write",
        op: Op::Write,
        bytes: 4 * KIB,
        region: Region::Metadata,
        weight: 12,
    },
    OpKind {
        name: "small read",
        op: Op::Read,
        bytes: 8 * KIB,
        region: Region::Files,
        weight: 28,
    },
    OpKind {
        name: "small write",
        op: Op::Write,
        bytes: 8 * KIB,
        region: Region::Files,
        weight: 14,
    },
    OpKind {
        name: "large read",
        op: Op::Read,
        bytes: 64 * KIB,
        region: Region::Files,
        weight: 12,
    },
    OpKind {
        name: "large write",
        op: Op::Write,
        bytes: 64 * KIB,
        region: Region::Files,
        weight: 6,
    },
];

/// The metadata region's share of the data set: 1/`METADATA_FRACTION`.
pub const METADATA_FRACTION: u64 = 16;

/// Zipf over the aligned units of one region, ranks scattered.
/// Rank `r` lives at unit `(r · step + shift) mod units`: `shift` is drawn from the seed, so
/// that the hottest unit of each region is not always the region's first (which would put
/// the three hottest units on the same striped disk).
struct Spread {
    start: u64,
    unit: u64,
    units: u64,
    step: u64,
    shift: u64,
    zipf: Zipf<f64>,
}

impl Spread {
    fn new(
        start: u64,
        bytes: u64,
        unit: u64,
        theta: f64,
        rng: &mut ChaCha8Rng,
    ) -> Result<Spread, String> {
        let units = bytes / unit;
        if units == 0 {
            return Err(format!("a region of {bytes} bytes has no unit of {unit}"));
        }
        Ok(Spread {
            start,
            unit,
            units,
            step: coprime_step(units),
            shift: rng.random_range(0..units),
            zipf: Zipf::new(units as f64, theta).map_err(|e| format!("zipf: {e}"))?,
        })
    }

    fn draw(&self, rng: &mut ChaCha8Rng) -> u64 {
        let rank = (self.zipf.sample(rng) as u64 - 1).min(self.units - 1);
        let unit = (scatter_rank(rank, self.units, self.step) + self.shift) % self.units;
        self.start + unit * self.unit
    }
}

/// The open-loop generator.
pub struct SfsLike {
    rng: ChaCha8Rng,
    metadata: Spread,
    small: Spread,
    large: Spread,
    mean_gap_ns: f64,
    clock_ns: f64,
    duration: Nanos,
}

impl SfsLike {
    /// `rate` operations per second for `duration`, over `[0, data_bytes)`.
    pub fn new(
        data_bytes: u64,
        theta: f64,
        rate: f64,
        duration: Nanos,
        seed: u64,
    ) -> Result<SfsLike, String> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(format!("rate {rate} must be positive"));
        }
        if !(theta.is_finite() && theta >= 0.0) {
            return Err(format!("theta {theta} must be a finite number >= 0"));
        }
        let meta = data_bytes / METADATA_FRACTION / (64 * KIB) * (64 * KIB);
        let files = (data_bytes - meta) / (64 * KIB) * (64 * KIB);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        Ok(SfsLike {
            metadata: Spread::new(0, meta, 4 * KIB, theta, &mut rng)?,
            small: Spread::new(meta, files, 8 * KIB, theta, &mut rng)?,
            large: Spread::new(meta, files, 64 * KIB, theta, &mut rng)?,
            rng,
            mean_gap_ns: SECONDS as f64 / rate,
            clock_ns: 0.0,
            duration,
        })
    }

    /// The next operation's kind, by weight.
    fn kind(&mut self) -> OpKind {
        let mut pick = self.rng.random_range(0..100u32);
        for kind in MIX {
            if pick < kind.weight {
                return kind;
            }
            pick -= kind.weight;
        }
        unreachable!("the weights sum to 100")
    }

    /// One operation, without its arrival (tests use it for the mix alone).
    pub fn draw(&mut self) -> (OpKind, u64) {
        let kind = self.kind();
        let offset = match (kind.region, kind.bytes) {
            (Region::Metadata, _) => self.metadata.draw(&mut self.rng),
            (Region::Files, b) if b <= 8 * KIB => self.small.draw(&mut self.rng),
            (Region::Files, _) => self.large.draw(&mut self.rng),
        };
        (kind, offset)
    }
}

impl Workload for SfsLike {
    fn next_io(&mut self) -> Option<Io> {
        // Inverse transform on (0, 1]: the logarithm is finite.
        let uniform: f64 = 1.0 - self.rng.random::<f64>();
        self.clock_ns += -uniform.ln() * self.mean_gap_ns;
        let arrival = self.clock_ns.round() as Nanos;
        if arrival >= self.duration {
            return None;
        }
        let (kind, offset) = self.draw();
        Some(Io {
            arrival: Some(arrival),
            op: kind.op,
            offset,
            len: kind.bytes,
        })
    }
}

/// The creation phase: `[0, data_bytes)` written front to back in 1 MiB writes (closed loop).
pub fn creation(data_bytes: u64) -> Vec<Io> {
    let step = 1 << 20;
    (0..data_bytes.div_ceil(step))
        .map(|i| Io {
            arrival: None,
            op: Op::Write,
            offset: i * step,
            len: step.min(data_bytes - i * step),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_mix_is_drawn_in_its_proportions() {
        assert_eq!(MIX.iter().map(|k| k.weight).sum::<u32>(), 100);
        let mut w = SfsLike::new(256 * MIB, 1.0, 100.0, SECONDS, 7).unwrap();
        let n = 200_000;
        let mut counts = [0u64; 6];
        for _ in 0..n {
            let (kind, offset) = w.draw();
            let i = MIX.iter().position(|k| k.name == kind.name).unwrap();
            counts[i] += 1;
            // Inside its region, aligned to its size.
            let meta = 256 * MIB / METADATA_FRACTION;
            match kind.region {
                Region::Metadata => assert!(offset + kind.bytes <= meta),
                Region::Files => assert!(offset >= meta && offset + kind.bytes <= 256 * MIB),
            }
            assert_eq!(offset % kind.bytes, 0);
        }
        for (kind, count) in MIX.iter().zip(counts) {
            let share = count as f64 / n as f64 * 100.0;
            assert!(
                (share - kind.weight as f64).abs() < 0.5,
                "{}: {share:.2} % drawn, {} % wanted",
                kind.name,
                kind.weight
            );
        }
    }

    #[test]
    fn arrivals_are_poisson_at_the_rate_and_stop_at_the_duration() {
        let rate = 250.0;
        let duration = 400 * SECONDS;
        let mut w = SfsLike::new(64 * MIB, 1.0, rate, duration, 3).unwrap();
        let mut arrivals = Vec::new();
        while let Some(io) = w.next_io() {
            arrivals.push(io.arrival.unwrap());
        }
        let expected = rate * 400.0;
        let n = arrivals.len() as f64;
        // Poisson count: standard deviation sqrt(100,000) ≈ 316; 4 of them.
        assert!((n - expected).abs() < 4.0 * expected.sqrt(), "{n} arrivals");
        assert!(arrivals.windows(2).all(|p| p[0] <= p[1]));
        assert!(*arrivals.last().unwrap() < duration);
        // Exponential gaps: the coefficient of variation is 1.
        let gaps: Vec<f64> = arrivals.windows(2).map(|p| (p[1] - p[0]) as f64).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((mean - SECONDS as f64 / rate).abs() < 0.02 * SECONDS as f64 / rate);
        assert!(
            (var.sqrt() / mean - 1.0).abs() < 0.02,
            "cv {}",
            var.sqrt() / mean
        );
    }

    #[test]
    fn a_small_part_of_the_data_gets_most_accesses() {
        let mut w = SfsLike::new(256 * MIB, 1.0, 100.0, SECONDS, 11).unwrap();
        let mut per_chunk = std::collections::BTreeMap::<u64, u64>::new();
        let n = 100_000;
        for _ in 0..n {
            let (_, offset) = w.draw();
            *per_chunk.entry(offset / (128 << 10)).or_default() += 1;
        }
        let mut counts: Vec<u64> = per_chunk.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let chunks = 256 * MIB / (128 << 10);
        let top: u64 = counts.iter().take((chunks / 20) as usize).sum();
        assert!(
            top as f64 > 0.5 * n as f64,
            "the hottest 5 % of chunks get {top} of {n}"
        );
        // Uniform (theta 0) concentrates only as the mix does: 40 % of the operations on the
        // metadata region, a sixteenth of the chunks.
        let mut u = SfsLike::new(256 * MIB, 0.0, 100.0, SECONDS, 11).unwrap();
        let mut per_chunk = std::collections::BTreeMap::<u64, u64>::new();
        for _ in 0..n {
            let (_, offset) = u.draw();
            *per_chunk.entry(offset / (128 << 10)).or_default() += 1;
        }
        let mut counts: Vec<u64> = per_chunk.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top: u64 = counts.iter().take((chunks / 20) as usize).sum();
        assert!((top as f64) < 0.36 * n as f64, "uniform: {top}");
    }

    #[test]
    fn the_same_seed_gives_the_same_operations() {
        let ops = |seed| {
            let mut w = SfsLike::new(64 * MIB, 1.0, 100.0, 10 * SECONDS, seed).unwrap();
            std::iter::from_fn(|| w.next_io()).collect::<Vec<Io>>()
        };
        assert_eq!(ops(5), ops(5));
        assert_ne!(ops(5), ops(6));
        assert_eq!(creation(3 * MIB + 4096).len(), 4);
    }
}
