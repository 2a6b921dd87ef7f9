//! The workloads of the ALV evaluation (paper §5.1; digest §5, §9): the WebSearch trace
//! replayed open loop and looped, and two synthetic stand-ins for the traces that are not
//! available here (TPC-C from BYU, HP's Cello-99), built from the paper's description of
//! them. Every one runs until the grow ends ([`WhileGrowing`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::model::{Io, Nanos, Workload, SECONDS};
use crate::workload::{
    AddressDist, Pattern, Poisson, ReplayOptions, TraceRecord, TraceWorkload, WeightedSize,
};

/// What runs on the array while it grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Load {
    /// The SPC WebSearch trace (../shared/traces), as the paper's SPC-Web: 99.98 % reads.
    WebSearch,
    /// Synthetic, TPC-C-like: small random requests, a third of them writes.
    Tpcc,
    /// Synthetic, Cello-like: on/off bursts, no locality.
    Cello,
    /// Nothing: the offline grow.
    Offline,
}

impl Load {
    pub const ALL: [Load; 4] = [Load::WebSearch, Load::Tpcc, Load::Cello, Load::Offline];

    pub fn name(self) -> &'static str {
        match self {
            Load::WebSearch => "websearch",
            Load::Tpcc => "tpcc",
            Load::Cello => "cello",
            Load::Offline => "offline",
        }
    }

    /// How the report names it: synthetic loads say so.
    pub fn label(self) -> &'static str {
        match self {
            Load::WebSearch => "WebSearch (SPC trace)",
            Load::Tpcc => "TPC-C-like (synthetic)",
            Load::Cello => "Cello-like (synthetic)",
            Load::Offline => "none (offline)",
        }
    }

    pub fn parse(text: &str) -> Result<Load, String> {
        Load::ALL
            .into_iter()
            .find(|l| l.name() == text)
            .ok_or_else(|| format!("{text:?} is not a load (websearch, tpcc, cello, offline)"))
    }
}

/// The synthetic loads' parameters (Strata's choices from the paper's words; the paper's
/// traces give no numbers beyond their traits).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SyntheticParams {
    /// TPC-C-like: Poisson arrivals of 8 KiB requests, 2/3 reads, zipf(0.9) pages.
    pub tpcc_iops: f64,
    /// Cello-like: arrivals during a burst (Poisson at this rate).
    pub cello_burst_iops: f64,
    /// Cello-like: burst and gap lengths, Pareto with these means (shape 1.5), each at
    /// most 20 times its mean.
    pub cello_burst_mean_ns: Nanos,
    pub cello_gap_mean_ns: Nanos,
    /// Cello-like: share of reads (the file-system cache above absorbed most reads).
    pub cello_read_share: f64,
}

impl Default for SyntheticParams {
    fn default() -> SyntheticParams {
        SyntheticParams {
            tpcc_iops: 120.0,
            cello_burst_iops: 400.0,
            cello_burst_mean_ns: SECONDS / 2,
            cello_gap_mean_ns: SECONDS,
            cello_read_share: 0.4,
        }
    }
}

/// TPC-C-like (digest §9: "small random, write-containing"): the simulator's
/// `Pattern::tpcc_like` (8 KiB pages, two reads per write, zipf 0.9 scattered).
pub fn tpcc(params: &SyntheticParams, volume: u64, seed: u64) -> Result<Poisson, String> {
    Poisson::new(Pattern::tpcc_like(), params.tpcc_iops, volume, seed)
}

/// Cello-like (paper §5.1: "filtered by the file-system cache, so temporal locality is
/// poor; highly bursty"): uniform addresses, a size mix of 4-64 KiB, mostly writes, in
/// Pareto on/off bursts.
pub fn cello(params: &SyntheticParams, volume: u64, seed: u64) -> Result<OnOff<Poisson>, String> {
    let sizes = [(4096, 40), (8192, 30), (16384, 15), (65536, 15)];
    let pattern = Pattern {
        address: AddressDist::Uniform,
        sizes: sizes
            .iter()
            .map(|&(bytes, weight)| WeightedSize { bytes, weight })
            .collect(),
        read_share: params.cello_read_share,
        align: 4096,
    };
    let inner = Poisson::new(pattern, params.cello_burst_iops, volume, seed)?;
    Ok(OnOff::new(
        inner,
        params.cello_burst_mean_ns,
        params.cello_gap_mean_ns,
        crate::executor::derive_seed(seed, "cello-bursts"),
    ))
}

/// Bursts: the inner workload's arrivals are its *busy* time; a gap is inserted after each
/// burst, so requests come in bursts at the inner rate separated by silences.
pub struct OnOff<W> {
    inner: W,
    burst_mean: f64,
    gap_mean: f64,
    rng: ChaCha8Rng,
    /// Inner time at which the current burst ends, and the silence added before it.
    burst_end: Nanos,
    shift: Nanos,
}

/// Pareto shape of burst and gap lengths: heavy-tailed, finite mean.
const PARETO_SHAPE: f64 = 1.5;
/// No burst or gap longer than this many means (bounded, as everything here).
const PARETO_CAP: f64 = 20.0;

impl<W: Workload> OnOff<W> {
    pub fn new(inner: W, burst_mean: Nanos, gap_mean: Nanos, seed: u64) -> OnOff<W> {
        assert!(
            burst_mean > 0 && gap_mean > 0,
            "bursts and gaps have lengths"
        );
        let mut on_off = OnOff {
            inner,
            burst_mean: burst_mean as f64,
            gap_mean: gap_mean as f64,
            rng: ChaCha8Rng::seed_from_u64(seed),
            burst_end: 0,
            shift: 0,
        };
        on_off.burst_end = on_off.pareto(on_off.burst_mean);
        on_off
    }

    /// A Pareto length of mean `mean` (shape 1.5: minimum mean/3), capped.
    fn pareto(&mut self, mean: f64) -> Nanos {
        let minimum = mean * (PARETO_SHAPE - 1.0) / PARETO_SHAPE;
        let uniform: f64 = 1.0 - self.rng.random::<f64>();
        let length = minimum / uniform.powf(1.0 / PARETO_SHAPE);
        length.min(mean * PARETO_CAP).round() as Nanos
    }
}

impl<W: Workload> Workload for OnOff<W> {
    fn next_io(&mut self) -> Option<Io> {
        let mut io = self.inner.next_io()?;
        let busy = io.arrival.expect("an open-loop inner workload");
        // Bounded: each turn moves the burst end forward by at least a third of a mean.
        while busy >= self.burst_end {
            self.shift += self.pareto(self.gap_mean);
            self.burst_end += self.pareto(self.burst_mean);
        }
        io.arrival = Some(busy + self.shift);
        Some(io)
    }
}

/// The trace replayed open loop by timestamp, addresses folded into the volume, over and
/// over: each pass starts one mean inter-arrival after the previous pass's last request.
pub struct LoopedTrace {
    records: Arc<Vec<TraceRecord>>,
    options: ReplayOptions,
    current: TraceWorkload,
    base: Nanos,
    period: Nanos,
    pub passes: u64,
}

impl LoopedTrace {
    pub fn new(records: Arc<Vec<TraceRecord>>, volume: u64) -> Result<LoopedTrace, String> {
        if records.len() < 2 {
            return Err("the trace needs at least two requests to be looped".into());
        }
        let options = ReplayOptions::new(volume);
        let first = records.iter().map(|r| r.timestamp_ns).min().unwrap_or(0);
        let last = records.iter().map(|r| r.timestamp_ns).max().unwrap_or(0);
        let span = last - first;
        let period = span + span / (records.len() as u64 - 1);
        Ok(LoopedTrace {
            current: TraceWorkload::new(records.to_vec(), options)?,
            records,
            options,
            base: 0,
            period,
            passes: 1,
        })
    }

    /// Requests per second of the trace as recorded.
    pub fn rate_iops(&self) -> f64 {
        self.records.len() as f64 * SECONDS as f64 / self.period as f64
    }
}

impl Workload for LoopedTrace {
    fn next_io(&mut self) -> Option<Io> {
        if let Some(mut io) = self.current.next_io() {
            io.arrival = io.arrival.map(|at| at + self.base);
            return Some(io);
        }
        self.base += self.period;
        self.passes += 1;
        self.current = TraceWorkload::new(self.records.to_vec(), self.options).ok()?;
        let mut io = self.current.next_io()?;
        io.arrival = io.arrival.map(|at| at + self.base);
        Some(io)
    }
}

/// Ends a workload once the grow is over: no request arriving after it is issued.
pub struct WhileGrowing {
    pub inner: Box<dyn Workload>,
    pub done: Arc<AtomicBool>,
}

impl Workload for WhileGrowing {
    fn next_io(&mut self) -> Option<Io> {
        if self.done.load(Ordering::Relaxed) {
            return None;
        }
        self.inner.next_io()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Op;

    struct Every(Nanos, Nanos);

    impl Workload for Every {
        fn next_io(&mut self) -> Option<Io> {
            self.1 += self.0;
            Some(Io {
                arrival: Some(self.1),
                op: Op::Read,
                offset: 0,
                len: 4096,
            })
        }
    }

    #[test]
    fn bursts_keep_the_inner_rate_and_add_silences() {
        let mut on_off = OnOff::new(Every(1_000_000, 0), SECONDS / 2, SECONDS, 7);
        let arrivals: Vec<Nanos> = (0..20_000)
            .map(|_| on_off.next_io().unwrap().arrival.unwrap())
            .collect();
        assert!(arrivals.windows(2).all(|w| w[0] < w[1]));
        let gaps: Vec<Nanos> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
        let inside = gaps.iter().filter(|&&g| g == 1_000_000).count();
        let silences = gaps.iter().filter(|&&g| g > 1_000_000).count();
        // 20 s of busy time in bursts of 0.5 s on average: about 40 silences.
        assert!((15..=80).contains(&silences), "{silences} silences");
        assert_eq!(inside + silences, gaps.len());
        // Silences of 1 s on average: the run lasts about three times its busy time.
        let total = *arrivals.last().unwrap() as f64 / 20.0 / SECONDS as f64;
        assert!((1.8..=5.0).contains(&total), "{total}x the busy time");
    }

    #[test]
    fn the_trace_loops_with_a_period_of_its_span_and_one_gap() {
        let record = |timestamp_ns| TraceRecord {
            timestamp_ns,
            device: 0,
            op: Op::Read,
            offset: 4096,
            len: 4096,
        };
        let records = Arc::new(vec![record(1_000), record(2_000), record(4_000)]);
        let mut looped = LoopedTrace::new(records, 1 << 20).unwrap();
        let arrivals: Vec<Nanos> = (0..7)
            .map(|_| looped.next_io().unwrap().arrival.unwrap())
            .collect();
        // Span 3,000 ns, mean gap 1,500: a pass every 4,500 ns.
        assert_eq!(arrivals, [0, 1_000, 3_000, 4_500, 5_500, 7_500, 9_000]);
        assert_eq!(looped.passes, 3);
    }

    #[test]
    fn a_workload_stops_when_the_grow_is_done() {
        let done = Arc::new(AtomicBool::new(false));
        let mut load = WhileGrowing {
            inner: Box::new(Every(10, 0)),
            done: done.clone(),
        };
        assert!(load.next_io().is_some());
        done.store(true, Ordering::Relaxed);
        assert!(load.next_io().is_none());
    }
}
