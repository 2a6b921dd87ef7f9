//! The disk model checked against the papers' published figures. Every check drives an
//! [`Hdd`] directly (submit / next_completion / advance) from a fixed seed, so the table is
//! the same on every run. A row with a figure from the paper passes within ±5 % of it; a row
//! whose paper source is a statement without a figure (Table 1 and Figure 4 are lost) passes
//! inside a band that reads the statement, and says so in its metric.
//!
//! The experiments follow Proximal I/O §2 as described there:
//! - 1 OP: the mean service time of random 4 KiB reads over the whole disk, one at a time;
//! - strands: pick a random place on the disk, draw D requests uniformly within a span of
//!   LBNs from it, sort them ascending, issue all at once; the strand time runs from issue
//!   to the last completion, and per-request cost is strand time / D, in OP;
//! - semi-sequential: each request on the next track, placed so that it comes under the
//!   head just after the previous request plus the minimal switch time;
//! - queue depth: the same 8-request proximal strands with 1 and with 8 commands at the
//!   drive at a time;
//! - writes: the same strands (same places) as writes, against the reads;
//! - issue order (§2.7): the same strands issued ascending and in a random order, on a drive
//!   with and without the order quirk.

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

/// What a row is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Anchor {
    /// A figure the paper quotes: the row passes within ±[`TOLERANCE`] of it.
    Value,
    /// A statement without a figure: the row passes inside `[low, high]`, our reading of
    /// the statement, which the metric's text gives. `paper` is the reference the statement
    /// is relative to (1 for "costs the same" in a ratio).
    Bound,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ValidationRow {
    pub model: String,
    pub metric: String,
    pub paper: f64,
    pub simulated: f64,
    pub ratio: f64,
    pub anchor: Anchor,
    pub low: f64,
    pub high: f64,
    pub within_tolerance: bool,
}

impl ValidationRow {
    fn new(model: &str, metric: &str, paper: f64, simulated: f64) -> Self {
        let (low, high) = (paper * (1.0 - TOLERANCE), paper * (1.0 + TOLERANCE));
        let mut row = Self::bounded(model, metric, paper, (low, high), simulated);
        row.anchor = Anchor::Value;
        // The same test as the band, written on the ratio as every row always was.
        row.within_tolerance = (row.ratio - 1.0).abs() <= TOLERANCE;
        row
    }

    /// A row for a statement without a figure: `paper` is what it is relative to.
    fn bounded(
        model: &str,
        metric: &str,
        paper: f64,
        (low, high): (f64, f64),
        simulated: f64,
    ) -> Self {
        assert!(low < high, "{metric}: empty band");
        assert!(paper > 0.0, "{metric}: no reference");
        Self {
            model: model.to_owned(),
            metric: metric.to_owned(),
            paper,
            simulated,
            ratio: simulated / paper,
            anchor: Anchor::Bound,
            low,
            high,
            within_tolerance: (low..=high).contains(&simulated),
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

/// The order a strand's requests are submitted in (all at the same instant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IssueOrder {
    /// Ascending LBN, as the paper issued every strand it reports (§2.7).
    Ascending,
    /// A random permutation (from its own seeded stream, so the places do not change).
    Random,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrandSpec {
    pub requests: usize,
    pub placement: Placement,
    /// Commands at the drive at a time.
    pub queue_depth: usize,
    pub op: Op,
    pub order: IssueOrder,
}

impl StrandSpec {
    /// Reads within `span` LBNs, ascending, all `requests` at the drive at once.
    pub fn reads(requests: usize, span: u64) -> Self {
        Self {
            requests,
            placement: Placement::Random { span },
            queue_depth: requests,
            op: Op::Read,
            order: IssueOrder::Ascending,
        }
    }
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

/// Mean strand time over `trials` strands, each at a fresh random place. The places depend
/// only on `seed` and the placement, so specs that differ in op, order or queue depth see
/// the same strands.
pub fn mean_strand_time(params: &HddParams, spec: StrandSpec, trials: usize, seed: u64) -> f64 {
    let mut params = params.clone();
    params.queue_depth = spec.queue_depth;
    let mut drive = Hdd::with_seed(params, seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x57a4d);
    let mut order_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x04de5);
    let sector_bytes = u64::from(drive.params().sector_bytes);
    let (mut now, mut id, mut total) = (0, 0u64, 0u128);
    for _ in 0..trials {
        let mut lbns = match spec.placement {
            Placement::Random { span } => random_strand(&drive, &mut rng, spec.requests, span),
            Placement::SemiSequential => semi_sequential_strand(&drive, &mut rng, spec.requests),
        };
        if spec.order == IssueOrder::Random {
            shuffle(&mut lbns, &mut order_rng);
        }
        let requests: Vec<Request> = lbns
            .iter()
            .map(|&lbn| {
                id += 1;
                Request {
                    id,
                    op: spec.op,
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

/// Fisher-Yates, drawing from `rng`.
fn shuffle(items: &mut [u64], rng: &mut ChaCha8Rng) {
    for last in (1..items.len()).rev() {
        items.swap(last, rng.random_range(0..=last));
    }
}

/// The paper's proximal span (§2: 100,000 LBNs) and track-approximate span (1,024 LBNs,
/// "the approximate size of the disk's track, rounded down to the power of two").
const PROXIMAL_SPAN: u64 = 100_000;
const TRACK_SPAN: u64 = 1024;

fn proximal(queue_depth: usize) -> StrandSpec {
    StrandSpec {
        queue_depth,
        ..StrandSpec::reads(8, PROXIMAL_SPAN)
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
        placement: Placement::SemiSequential,
        ..StrandSpec::reads(8, TRACK_SPAN)
    };
    let semi = mean_strand_time(params, semi_spec, STRAND_TRIALS, 3);
    let track = mean_strand_time(params, StrandSpec::reads(8, TRACK_SPAN), STRAND_TRIALS, 2);
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
                "track-approx. strand D=8 span 1024, OP/request (= proximal)",
                0.39,
                track / 8.0 / op,
            ),
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

/// What §3 says 8 proximal writes cost per request: "3.2 OP of resources (i.e., 0.4 OP per
/// request as shown in Figure 1)". Figure 1 plots reads (0.39), so 0.4 is that figure
/// rounded to one decimal, not a write measurement: the band is its rounding interval,
/// from the reads' 0.39 (§2: writes cost more) to 0.45.
const EIGHT_WRITES_OP: (f64, f64) = (0.39, 0.45);

/// Our reading of "the slightly higher strand response time" of writes (§2; Table 1, which
/// had the figures, is lost): above the reads, and by no more than §3's rounding allows,
/// 0.45 / 0.39 = 1.15 times.
const WRITES_SLIGHTLY_HIGHER: (f64, f64) = (1.0, EIGHT_WRITES_OP.1 / EIGHT_WRITES_OP.0);

/// Write strands against the same read strands (same places, same seeds).
fn write_rows(rows: &mut Vec<ValidationRow>, params: &HddParams, op: f64) {
    let name = &params.name;
    let time = |spec: StrandSpec| mean_strand_time(params, spec, STRAND_TRIALS, 2);
    let writes = |spec: StrandSpec| StrandSpec {
        op: Op::Write,
        ..spec
    };
    for requests in [1, 2, 4, 8] {
        let reads = StrandSpec::reads(requests, PROXIMAL_SPAN);
        let (read, write) = (time(reads), time(writes(reads)));
        if requests == 8 {
            rows.push(ValidationRow::bounded(
                name,
                "write strand D=8 span 100k, OP/request (§3: 0.4, rounded)",
                0.4,
                EIGHT_WRITES_OP,
                write / 8.0 / op,
            ));
        }
        let metric = format!("write/read strand time, D={requests} span 100k (slightly higher)");
        rows.push(ValidationRow::bounded(
            name,
            &metric,
            1.0,
            WRITES_SLIGHTLY_HIGHER,
            write / read,
        ));
    }
    let reads = StrandSpec::reads(8, TRACK_SPAN);
    rows.push(ValidationRow::bounded(
        name,
        "write/read strand time, D=8 span 1024 (slightly higher)",
        1.0,
        WRITES_SLIGHTLY_HIGHER,
        time(writes(reads)) / time(reads),
    ));
}

/// Our reading of "issuing requests in a random order ... does not work" (§2.7; Figure 4's
/// figures are lost): slower than ascending issue by more than this table's tolerance, and
/// no slower than no reordering at all, which Figure 2 puts at 1 / (1 - 0.32) = 1.47 times
/// the reordered strand.
const RANDOM_ORDER_DOES_NOT_WORK: (f64, f64) = (1.0 + TOLERANCE, 1.0 / (1.0 - 0.32));

/// The same proximal strands of 8 issued ascending and in a random order, on the drive with
/// the §2.7 order quirk and on the same drive without it.
fn order_rows(rows: &mut Vec<ValidationRow>, quirky: &HddParams, sound: &HddParams) {
    let ascending = proximal(8);
    let random = StrandSpec {
        order: IssueOrder::Random,
        ..ascending
    };
    let time = |params, spec| mean_strand_time(params, spec, STRAND_TRIALS, 4);
    let quirky_ascending = time(quirky, ascending);
    let sound_ascending = time(sound, ascending);
    rows.push(ValidationRow::bounded(
        &quirky.name,
        "random/ascending issue, strand D=8 span 100k (does not work)",
        1.0,
        RANDOM_ORDER_DOES_NOT_WORK,
        time(quirky, random) / quirky_ascending,
    ));
    push_rows(
        rows,
        &quirky.name,
        &[(
            "ascending issue, strand D=8 span 100k, vs fixed firmware (works)",
            1.0,
            quirky_ascending / sound_ascending,
        )],
    );
    push_rows(
        rows,
        &sound.name,
        &[(
            "random/ascending issue, strand D=8 span 100k (fixed firmware)",
            1.0,
            time(sound, random) / sound_ascending,
        )],
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
        ("track-approximate (span 1024)", TRACK_SPAN),
        ("proximal (span 100k)", PROXIMAL_SPAN),
        ("band (span 624k)", 624_000),
    ] {
        for (kind, op_kind) in [("reads", Op::Read), ("writes", Op::Write)] {
            for requests in [1, 2, 4, 8] {
                let spec = StrandSpec {
                    op: op_kind,
                    ..StrandSpec::reads(requests, span)
                };
                let time = mean_strand_time(params, spec, STRAND_TRIALS, 2);
                out.push((
                    format!("{label} {kind}, D={requests}"),
                    time / requests as f64 / op,
                ));
            }
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
    write_rows(&mut rows, &cheetah, op);
    birthday_rows(&mut rows, &cheetah);
    order_rows(
        &mut rows,
        &presets::wd_re3_1tb_order_quirk(),
        &presets::wd_re3_1tb(),
    );
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
        "{:<model_width$}  {:<metric_width$}  {:>11}  {:>9}  {:>6}  ok\n",
        "model", "metric", "paper", "simulated", "ratio"
    );
    for r in rows {
        // A band prints as its bounds: the paper gave a statement, not this figure.
        let paper = match r.anchor {
            Anchor::Value => format!("{:.4}", r.paper),
            Anchor::Bound => format!("{:.2}-{:.2}", r.low, r.high),
        };
        out.push_str(&format!(
            "{:<model_width$}  {:<metric_width$}  {:>11}  {:>9.4}  {:>6.3}  {}\n",
            r.model,
            r.metric,
            paper,
            r.simulated,
            r.ratio,
            if r.within_tolerance { "yes" } else { "NO" }
        ));
    }
    out
}
