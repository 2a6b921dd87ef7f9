//! The disk model checked against the papers' published figures. Every check drives an
//! [`Hdd`] directly (submit / next_completion / advance) from a fixed seed, so the table is
//! the same on every run. A row passes within ±5 % of the paper.
//!
//! The experiments follow Proximal I/O §2 as described there:
//! - 1 OP: the mean service time of random 4 KiB reads over the whole disk, one at a time;
//! - strands: pick a random place on the disk, draw D requests uniformly within a span of
//!   LBNs from it, sort them ascending, issue all at once; the strand time runs from issue
//!   to the last completion, and per-request cost is strand time / D, in OP;
//! - semi-sequential: each request on the next track, placed so that it comes under the
//!   head just after the previous request plus the minimal switch time;
//! - queue depth: the same 8-request proximal strands with 1 and with 8 commands at the
//!   drive at a time.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::birthday;
use crate::hdd::{presets, Hdd, HddParams};
use crate::model::{Completion, DeviceModel, Nanos, Op, Request};

/// Relative tolerance of every row.
pub const TOLERANCE: f64 = 0.05;

const IO_BYTES: u64 = 4096;
const RANDOM_IOS: usize = 20_000;
const STRAND_TRIALS: usize = 4_000;

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ValidationRow {
    pub model: String,
    pub metric: String,
    pub paper: f64,
    pub simulated: f64,
    pub ratio: f64,
    pub within_tolerance: bool,
}

impl ValidationRow {
    fn new(model: &str, metric: &str, paper: f64, simulated: f64) -> Self {
        let ratio = simulated / paper;
        Self {
            model: model.to_owned(),
            metric: metric.to_owned(),
            paper,
            simulated,
            ratio,
            within_tolerance: (ratio - 1.0).abs() <= TOLERANCE,
        }
    }
}

/// How a strand's requests are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Uniformly at random within `span` sectors from a random start.
    Random { span: u64 },
    /// One per track on consecutive tracks, each just reachable after the previous one.
    SemiSequential,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrandSpec {
    pub requests: usize,
    pub placement: Placement,
    /// Commands at the drive at a time.
    pub queue_depth: usize,
}

/// Submits `requests` at `now` and runs the drive until all complete; returns the last
/// completion time.
pub fn run_batch(drive: &mut Hdd, now: Nanos, requests: &[Request]) -> Nanos {
    for request in requests {
        drive.submit(now, *request);
    }
    let mut done: Vec<Completion> = Vec::with_capacity(requests.len());
    let mut last = now;
    while let Some(at) = drive.next_completion() {
        drive.advance(at, &mut done);
        last = at;
    }
    assert_eq!(done.len(), requests.len(), "every request completes");
    last
}

fn random_offset(rng: &mut ChaCha8Rng, capacity: u64) -> u64 {
    rng.random_range(0..capacity / IO_BYTES) * IO_BYTES
}

/// Mean service time of random 4 KiB reads issued one at a time (1 OP).
pub fn mean_random_service(params: &HddParams, ios: usize, seed: u64) -> f64 {
    let mut drive = Hdd::with_seed(params.clone(), seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0b5e);
    let capacity = drive.capacity();
    let mut now = 0;
    let mut total = 0u128;
    for id in 0..ios as u64 {
        let request = Request {
            id,
            op: Op::Read,
            offset: random_offset(&mut rng, capacity),
            len: IO_BYTES,
        };
        let done = run_batch(&mut drive, now, &[request]);
        total += u128::from(done - now);
        now = done;
    }
    total as f64 / ios as f64
}

fn random_strand(drive: &Hdd, rng: &mut ChaCha8Rng, requests: usize, span: u64) -> Vec<u64> {
    let sectors = drive.params().capacity_sectors;
    let io_sectors = IO_BYTES / u64::from(drive.params().sector_bytes);
    let start = rng.random_range(0..sectors - span);
    let mut lbns: Vec<u64> = (0..requests)
        .map(|_| start + rng.random_range(0..span - io_sectors))
        .collect();
    lbns.sort_unstable();
    lbns
}

/// LBNs of a semi-sequential strand: request i + 1 on the track after request i's, at the
/// first slot the head can reach after finishing request i and switching tracks.
fn semi_sequential_strand(drive: &Hdd, rng: &mut ChaCha8Rng, requests: usize) -> Vec<u64> {
    let geometry = drive.geometry();
    let params = drive.params();
    let io_sectors = IO_BYTES / u64::from(params.sector_bytes);
    // Queued behind the previous request, a command's processing is already done.
    let switch = params.seek.settle.max(params.head_switch);
    'retry: loop {
        let mut lbn = rng.random_range(0..params.capacity_sectors - 64 * 2048);
        let mut lbns = vec![lbn];
        let first = geometry.locate(lbn);
        let spt = u64::from(first.sectors_per_track);
        let gap = (switch * spt).div_ceil(drive.revolution());
        for _ in 1..requests {
            let here = geometry.locate(lbn);
            let next_track = lbn - u64::from(here.sector) + spt;
            let track = geometry.locate(next_track);
            if u64::from(track.sectors_per_track) != spt {
                continue 'retry; // crossed into another zone: draw again
            }
            let slot = (u64::from(here.slot) + io_sectors + gap) % spt;
            let sector = (slot + spt - u64::from(track.slot)) % spt;
            lbn = next_track + sector;
            lbns.push(lbn);
        }
        return lbns;
    }
}

/// Mean strand time over `trials` strands, each at a fresh random place.
pub fn mean_strand_time(params: &HddParams, spec: StrandSpec, trials: usize, seed: u64) -> f64 {
    let mut params = params.clone();
    params.queue_depth = spec.queue_depth;
    let mut drive = Hdd::with_seed(params, seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x57a4d);
    let sector_bytes = u64::from(drive.params().sector_bytes);
    let (mut now, mut id, mut total) = (0, 0u64, 0u128);
    for _ in 0..trials {
        let lbns = match spec.placement {
            Placement::Random { span } => random_strand(&drive, &mut rng, spec.requests, span),
            Placement::SemiSequential => semi_sequential_strand(&drive, &mut rng, spec.requests),
        };
        let requests: Vec<Request> = lbns
            .iter()
            .map(|&lbn| {
                id += 1;
                Request {
                    id,
                    op: Op::Read,
                    offset: lbn * sector_bytes,
                    len: IO_BYTES,
                }
            })
            .collect();
        let done = run_batch(&mut drive, now, &requests);
        total += u128::from(done - now);
        now = done;
    }
    total as f64 / trials as f64
}

fn proximal(queue_depth: usize) -> StrandSpec {
    StrandSpec {
        requests: 8,
        placement: Placement::Random { span: 100_000 },
        queue_depth,
    }
}

/// The effective track-switch time of a drive in the birthday model: the shortest time from
/// one queued request's start on one track to the next one's start on another (a 4 KiB
/// transfer and a one-cylinder switch; queued commands' overhead is hidden).
pub fn birthday_switch_time(params: &HddParams) -> Nanos {
    let drive = Hdd::new(params.clone());
    let outer_spt = u64::from(params.zones[0].sectors_per_track);
    let io_sectors = IO_BYTES / u64::from(params.sector_bytes);
    let transfer = io_sectors * drive.revolution() / outer_spt;
    transfer + params.seek.settle.max(params.head_switch)
}

fn single_io_rows(
    rows: &mut Vec<ValidationRow>,
    params: &HddParams,
    paper_ms: f64,
    paper_per_rev: f64,
) -> f64 {
    let op = mean_random_service(params, RANDOM_IOS, 1);
    let revolution = Hdd::new(params.clone()).revolution() as f64;
    push_rows(
        rows,
        &params.name,
        &[
            ("random 4 KiB read, QD 1 (1 OP), ms", paper_ms, op / 1e6),
            (
                "random I/Os per revolution, QD 1",
                paper_per_rev,
                revolution / op,
            ),
        ],
    );
    op
}

/// One row for `model` per `(metric, paper value, simulated value)`.
fn push_rows(rows: &mut Vec<ValidationRow>, model: &str, metrics: &[(&str, f64, f64)]) {
    for &(metric, paper, simulated) in metrics {
        rows.push(ValidationRow::new(model, metric, paper, simulated));
    }
}

fn strand_rows(rows: &mut Vec<ValidationRow>, params: &HddParams, op: f64) {
    let name = &params.name;
    let deep = mean_strand_time(params, proximal(8), STRAND_TRIALS, 2);
    let shallow = mean_strand_time(params, proximal(1), STRAND_TRIALS, 2);
    let semi_spec = StrandSpec {
        requests: 8,
        placement: Placement::SemiSequential,
        queue_depth: 8,
    };
    let semi = mean_strand_time(params, semi_spec, STRAND_TRIALS, 3);
    push_rows(
        rows,
        name,
        &[
            (
                "proximal strand D=8 span 100k, OP/request",
                0.39,
                deep / 8.0 / op,
            ),
            ("proximal strand of 8 reads, ms", 17.1, deep / 1e6),
            (
                "semi-sequential strand D=8, OP/request",
                0.23,
                semi / 8.0 / op,
            ),
            (
                "strand of 8: QD 1 -> 8 reduction, %",
                32.0,
                100.0 * (1.0 - deep / shallow),
            ),
        ],
    );
}

fn birthday_rows(rows: &mut Vec<ValidationRow>, params: &HddParams) {
    let revolution = Hdd::new(params.clone()).revolution();
    let bins = birthday::bins_per_track(revolution, birthday_switch_time(params));
    let model = format!("birthday model, B = {bins:.2} ({})", params.name);
    let mode = birthday::most_likely_revolutions(8, bins);
    push_rows(
        rows,
        &model,
        &[
            (
                "P(no extra revolution), D=6",
                0.02,
                birthday::no_extra_revolution(6, bins),
            ),
            ("most likely revolutions, D=8", 3.0, f64::from(mode)),
        ],
    );
}

/// Per-request cost in OP of strands the paper plots without quoting numbers (Figure 1's
/// other points, track-approximate spans, writes), for the docs: (label, OP per request).
pub fn strand_survey(params: &HddParams) -> Vec<(String, f64)> {
    let op = mean_random_service(params, RANDOM_IOS, 1);
    let mut out = Vec::new();
    for (label, span) in [
        ("track-approximate (span 1024)", 1024),
        ("proximal (span 100k)", 100_000),
        ("band (span 624k)", 624_000),
    ] {
        for requests in [1, 2, 4, 8] {
            let spec = StrandSpec {
                requests,
                placement: Placement::Random { span },
                queue_depth: requests,
            };
            let time = mean_strand_time(params, spec, STRAND_TRIALS, 2);
            out.push((
                format!("{label}, D={requests}"),
                time / requests as f64 / op,
            ));
        }
    }
    for queue_depth in [1, 2, 4, 8] {
        let time = mean_strand_time(params, proximal(queue_depth), STRAND_TRIALS, 2);
        out.push((format!("proximal D=8, QD={queue_depth}"), time / 8.0 / op));
    }
    out
}

/// Every check of the disk model against the papers, one row each.
pub fn validate_disk() -> Vec<ValidationRow> {
    let mut rows = Vec::new();
    let cheetah = presets::cheetah_15k5();
    let op = single_io_rows(&mut rows, &cheetah, 5.6, 0.71);
    single_io_rows(&mut rows, &presets::wd_re3_1tb(), 11.1, 0.75);
    strand_rows(&mut rows, &cheetah, op);
    birthday_rows(&mut rows, &cheetah);
    rows
}

/// The rows as an aligned text table.
pub fn format_table(rows: &[ValidationRow]) -> String {
    let model_width = rows.iter().map(|r| r.model.len()).max().unwrap_or(5).max(5);
    let metric_width = rows
        .iter()
        .map(|r| r.metric.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let mut out = format!(
        "{:<model_width$}  {:<metric_width$}  {:>9}  {:>9}  {:>6}  ok\n",
        "model", "metric", "paper", "simulated", "ratio"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<model_width$}  {:<metric_width$}  {:>9.4}  {:>9.4}  {:>6.3}  {}\n",
            r.model,
            r.metric,
            r.paper,
            r.simulated,
            r.ratio,
            if r.within_tolerance { "yes" } else { "NO" }
        ));
    }
    out
}
