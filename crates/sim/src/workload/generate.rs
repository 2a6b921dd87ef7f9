//! Synthetic workloads, every choice drawn from one seeded ChaCha8 stream: closed-loop
//! generators (uniform, zipf, sequential addresses; weighted size mixes; a read share) and an
//! open-loop Poisson generator over the same patterns.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};

use crate::model::{Io, Nanos, Op, Workload, SECONDS};

use super::replay::SECTOR_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum AddressDist {
    /// Every aligned block equally likely.
    Uniform,
    /// Block of popularity rank k (1-based) drawn with probability ∝ k^-theta. With `scatter`
    /// the ranks are spread over the volume by a fixed bijection, so hot blocks are not all
    /// at the volume's start; without it rank k is block k-1.
    Zipf {
        theta: f64,
        #[serde(default = "default_true")]
        scatter: bool,
    },
    /// One stream from `start`, each request right after the previous, wrapping at the end.
    Sequential {
        #[serde(default)]
        start: u64,
    },
}

fn default_true() -> bool {
    true
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedSize {
    pub bytes: u64,
    pub weight: u32,
}

/// What every generated I/O is drawn from.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern {
    pub address: AddressDist,
    pub sizes: Vec<WeightedSize>,
    /// Probability that an I/O is a read.
    pub read_share: f64,
    /// Offsets are multiples of this (a multiple of 512).
    pub align: u64,
}

impl Pattern {
    /// Synthetic, TPC-C-like (Strata's choice, not from the papers, whose TPC-C trace is not
    /// available): 8 KiB pages, two reads per write (read share 2/3), page popularity zipf
    /// with theta 0.9, scattered over the volume.
    pub fn tpcc_like() -> Self {
        Self {
            address: AddressDist::Zipf {
                theta: 0.9,
                scatter: true,
            },
            sizes: vec![WeightedSize {
                bytes: 8192,
                weight: 1,
            }],
            read_share: 2.0 / 3.0,
            align: 8192,
        }
    }

    pub fn validate(&self, volume_size: u64) -> Result<(), String> {
        if self.align == 0 || !self.align.is_multiple_of(SECTOR_BYTES) {
            return Err(format!(
                "align {} is not a positive multiple of 512",
                self.align
            ));
        }
        if !(0.0..=1.0).contains(&self.read_share) {
            return Err(format!(
                "read share {} is not within 0..=1",
                self.read_share
            ));
        }
        if self.sizes.iter().all(|s| s.weight == 0) {
            return Err("the size mix needs at least one size with a positive weight".into());
        }
        if let Some(bad) = self
            .sizes
            .iter()
            .find(|s| s.bytes == 0 || !s.bytes.is_multiple_of(SECTOR_BYTES))
        {
            return Err(format!(
                "size {} is not a positive multiple of 512",
                bad.bytes
            ));
        }
        let largest = self.sizes.iter().map(|s| s.bytes).max().unwrap_or(0);
        if volume_size < self.align || volume_size < largest {
            return Err(format!(
                "volume of {volume_size} bytes is smaller than a request"
            ));
        }
        if let AddressDist::Zipf { theta, .. } = self.address {
            if !(theta.is_finite() && theta >= 0.0) {
                return Err(format!("zipf theta {theta} must be a finite number >= 0"));
            }
        }
        Ok(())
    }
}

/// Draws (op, offset, len) from a pattern over one volume.
struct Sampler {
    pattern: Pattern,
    volume_size: u64,
    blocks: u64,
    zipf: Option<Zipf<f64>>,
    scatter_step: u64,
    cursor: u64,
    size_total_weight: u64,
    rng: ChaCha8Rng,
}

impl Sampler {
    fn new(pattern: Pattern, volume_size: u64, seed: u64) -> Result<Self, String> {
        pattern.validate(volume_size)?;
        let blocks = volume_size / pattern.align;
        let zipf = match pattern.address {
            AddressDist::Zipf { theta, .. } => {
                Some(Zipf::new(blocks as f64, theta).map_err(|e| format!("zipf: {e}"))?)
            }
            _ => None,
        };
        let cursor = match pattern.address {
            AddressDist::Sequential { start } => start - start % SECTOR_BYTES,
            _ => 0,
        };
        let size_total_weight = pattern.sizes.iter().map(|s| s.weight as u64).sum();
        Ok(Self {
            scatter_step: coprime_step(blocks),
            pattern,
            volume_size,
            blocks,
            zipf,
            cursor,
            size_total_weight,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    fn next(&mut self) -> (Op, u64, u64) {
        let op = if self.rng.random_bool(self.pattern.read_share) {
            Op::Read
        } else {
            Op::Write
        };
        let len = self.size();
        let offset = match self.pattern.address {
            AddressDist::Uniform => self.rng.random_range(0..self.blocks) * self.pattern.align,
            AddressDist::Zipf { scatter, .. } => {
                let rank = self
                    .zipf
                    .as_ref()
                    .expect("zipf set up")
                    .sample(&mut self.rng) as u64
                    - 1;
                let block = if scatter {
                    scatter_rank(rank, self.blocks, self.scatter_step)
                } else {
                    rank
                };
                block * self.pattern.align
            }
            AddressDist::Sequential { .. } => {
                if self.cursor + len > self.volume_size {
                    self.cursor = 0;
                }
                let offset = self.cursor;
                self.cursor += len;
                return (op, offset, len);
            }
        };
        // A block near the end whose request would cross it moves back to end there.
        let last_start = (self.volume_size - len) / self.pattern.align * self.pattern.align;
        (op, offset.min(last_start), len)
    }

    fn size(&mut self) -> u64 {
        let mut pick = self.rng.random_range(0..self.size_total_weight);
        for size in &self.pattern.sizes {
            if pick < size.weight as u64 {
                return size.bytes;
            }
            pick -= size.weight as u64;
        }
        unreachable!("pick is below the total weight")
    }
}

/// A multiplier coprime with `blocks`, so `rank * step mod blocks` is a bijection; near the
/// golden ratio of `blocks` so that neighbouring ranks land far apart.
pub fn coprime_step(blocks: u64) -> u64 {
    if blocks <= 1 {
        return 1;
    }
    let mut step = ((blocks as f64 * 0.618_033_988_75) as u64).max(1);
    while gcd(step, blocks) != 1 {
        step += 1;
    }
    step
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Where the block of popularity `rank` (0-based) lives.
pub fn scatter_rank(rank: u64, blocks: u64, step: u64) -> u64 {
    ((rank as u128 * step as u128) % blocks as u128) as u64
}

/// Closed loop: `arrival` is `None`, the driver issues the next I/O when a slot frees.
pub struct ClosedLoop {
    sampler: Sampler,
}

impl ClosedLoop {
    pub fn new(pattern: Pattern, volume_size: u64, seed: u64) -> Result<Self, String> {
        Ok(Self {
            sampler: Sampler::new(pattern, volume_size, seed)?,
        })
    }
}

impl Workload for ClosedLoop {
    fn next_io(&mut self) -> Option<Io> {
        let (op, offset, len) = self.sampler.next();
        Some(Io {
            arrival: None,
            op,
            offset,
            len,
        })
    }
}

/// Open loop: arrivals form a Poisson process of `rate_iops` (exponential inter-arrival
/// times with mean 1/rate), the first one an inter-arrival after time 0.
pub struct Poisson {
    sampler: Sampler,
    mean_gap_ns: f64,
    clock_ns: f64,
}

impl Poisson {
    pub fn new(
        pattern: Pattern,
        rate_iops: f64,
        volume_size: u64,
        seed: u64,
    ) -> Result<Self, String> {
        if !(rate_iops.is_finite() && rate_iops > 0.0) {
            return Err(format!("rate {rate_iops} IOPS must be a positive number"));
        }
        let sampler = Sampler::new(pattern, volume_size, seed)?;
        Ok(Self {
            sampler,
            mean_gap_ns: SECONDS as f64 / rate_iops,
            clock_ns: 0.0,
        })
    }
}

impl Workload for Poisson {
    fn next_io(&mut self) -> Option<Io> {
        // Inverse transform on (0, 1]: 1 - U never is 0, so the logarithm is finite.
        let uniform: f64 = 1.0 - self.sampler.rng.random::<f64>();
        self.clock_ns += -uniform.ln() * self.mean_gap_ns;
        let (op, offset, len) = self.sampler.next();
        Some(Io {
            arrival: Some(self.clock_ns.round() as Nanos),
            op,
            offset,
            len,
        })
    }
}

/// Ends a workload after `max_ios` I/Os or at the first arrival after `until` (open loop).
pub struct Limited<W> {
    inner: W,
    max_ios: Option<u64>,
    until: Option<Nanos>,
    issued: u64,
    ended: bool,
}

impl<W: Workload> Limited<W> {
    pub fn new(inner: W, max_ios: Option<u64>, until: Option<Nanos>) -> Self {
        Self {
            inner,
            max_ios,
            until,
            issued: 0,
            ended: false,
        }
    }
}

impl<W: Workload> Workload for Limited<W> {
    fn next_io(&mut self) -> Option<Io> {
        if self.ended || self.max_ios.is_some_and(|max| self.issued >= max) {
            return None;
        }
        let io = self.inner.next_io();
        let late = matches!((io, self.until), (Some(Io { arrival: Some(at), .. }), Some(until)) if at > until);
        if io.is_none() || late {
            self.ended = true;
            return None;
        }
        self.issued += 1;
        io
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_is_a_bijection() {
        for blocks in [1u64, 2, 10, 12, 97, 1000] {
            let step = coprime_step(blocks);
            let mut seen: Vec<u64> = (0..blocks).map(|r| scatter_rank(r, blocks, step)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..blocks).collect::<Vec<_>>(), "blocks {blocks}");
        }
    }

    #[test]
    fn size_mix_follows_weights() {
        let pattern = Pattern {
            address: AddressDist::Uniform,
            sizes: vec![
                WeightedSize {
                    bytes: 4096,
                    weight: 3,
                },
                WeightedSize {
                    bytes: 65536,
                    weight: 1,
                },
            ],
            read_share: 1.0,
            align: 4096,
        };
        let mut gen = ClosedLoop::new(pattern, 1 << 30, 7).unwrap();
        let small = (0..40_000)
            .filter(|_| gen.next_io().unwrap().len == 4096)
            .count();
        assert!((29_400..30_600).contains(&small), "3/4 of 40,000: {small}");
    }

    #[test]
    fn sequential_wraps_at_the_end() {
        let pattern = Pattern {
            address: AddressDist::Sequential { start: 8192 },
            sizes: vec![WeightedSize {
                bytes: 4096,
                weight: 1,
            }],
            read_share: 0.0,
            align: 4096,
        };
        let mut gen = ClosedLoop::new(pattern, 16384, 1).unwrap();
        let offsets: Vec<u64> = (0..4).map(|_| gen.next_io().unwrap().offset).collect();
        assert_eq!(offsets, vec![8192, 12288, 0, 4096]);
    }

    #[test]
    fn limits_stop_by_count_and_time() {
        let pattern = Pattern::tpcc_like();
        let closed = ClosedLoop::new(pattern.clone(), 1 << 30, 1).unwrap();
        assert_eq!(
            std::iter::from_fn({
                let mut w = Limited::new(closed, Some(5), None);
                move || w.next_io()
            })
            .count(),
            5
        );
        let open = Poisson::new(pattern, 1000.0, 1 << 30, 1).unwrap();
        let mut limited = Limited::new(open, None, Some(SECONDS));
        let arrivals: Vec<Nanos> = std::iter::from_fn(|| limited.next_io())
            .map(|io| io.arrival.unwrap())
            .collect();
        assert!(arrivals.iter().all(|&at| at <= SECONDS));
        assert!(
            (900..1100).contains(&arrivals.len()),
            "about 1000 in 1 s: {}",
            arrivals.len()
        );
    }
}
