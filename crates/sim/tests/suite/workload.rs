//! Trace readers and replay (on the WebSearch trace and small MSR/SPC fixtures), generators
//! and `WorkloadSpec`.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use strata_sim::model::{Io, Nanos, Op, Workload, MICROS, SECONDS};
use strata_sim::workload::{
    fold_into_volume, read_trace, AddressDist, ClosedLoop, Pattern, Poisson, ReplayOptions,
    TraceFormat, TraceWorkload, WeightedSize, WorkloadSpec,
};

const GIB: u64 = 1 << 30;

fn websearch() -> Option<PathBuf> {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/traces/websearch-spc.trace"
    ));
    if path.exists() {
        Some(path.to_path_buf())
    } else {
        eprintln!("skipped: {} is absent", path.display());
        None
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn drain(workload: &mut dyn Workload) -> Vec<Io> {
    std::iter::from_fn(|| workload.next_io()).collect()
}

#[test]
fn websearch_trace_parses_completely() {
    let Some(path) = websearch() else { return };
    let records = read_trace(&path, TraceFormat::Mqsim).unwrap();
    // The file has 24,782 newlines and an unterminated last line: 24,783 requests (the
    // README's 24,782 is `wc -l`). 4 writes: 99.98 % reads, as ALV describes SPC-Web.
    assert_eq!(records.len(), 24_783);
    assert_eq!(records.iter().filter(|r| r.op == Op::Write).count(), 4);
    assert_eq!(
        (
            records[0].timestamp_ns,
            records[0].device,
            records[0].offset,
            records[0].len
        ),
        (11_413_000, 0, 657_728 * 512, 8192)
    );
    let last = records.last().unwrap();
    assert_eq!(
        (last.timestamp_ns, last.device, last.offset, last.len),
        (60_066_625_000, 1, 34_371_424 * 512, 32_768)
    );
}

#[test]
fn websearch_replay_folds_every_request_inside_the_volume() {
    let Some(path) = websearch() else { return };
    let records = read_trace(&path, TraceFormat::Mqsim).unwrap();
    let volume = GIB + 3 * 512; // smaller than the trace's 17.9 GB span, not a power of two
    let mut replay = TraceWorkload::new(records, ReplayOptions::new(volume)).unwrap();
    let ios = drain(&mut replay);
    assert_eq!(ios.len(), 24_783);
    for io in &ios {
        assert!(
            io.offset.is_multiple_of(512) && io.len.is_multiple_of(512) && io.len > 0,
            "{io:?}"
        );
        assert!(
            io.offset + io.len <= volume,
            "{io:?} crosses the end of {volume}"
        );
    }
    assert_eq!(ios[0].arrival, Some(0), "relative to the first request");
    assert_eq!(
        ios.last().unwrap().arrival,
        Some(60_066_625_000 - 11_413_000)
    );
    assert!(ios.windows(2).all(|w| w[0].arrival <= w[1].arrival));
}

#[test]
fn websearch_device_filter_and_speedup() {
    let Some(path) = websearch() else { return };
    let spec = WorkloadSpec::Trace {
        path,
        format: TraceFormat::Mqsim,
        speedup: 4.0,
        device: Some(2),
        count: None,
        duration_s: None,
    };
    let ios = drain(spec.build(GIB, 0).unwrap().as_mut());
    assert_eq!(ios.len(), 8_187, "device 2's requests");
    let span = ios.last().unwrap().arrival.unwrap() as f64;
    // Device 2 spans about 60 s of trace; at 4x it arrives within about 15 s.
    assert!(
        (14.0..15.1).contains(&(span / SECONDS as f64)),
        "span {span}"
    );
}

#[test]
fn msr_fixture_replays_in_filetime_order() {
    let records = read_trace(&fixture("msr-cambridge-sample.csv"), TraceFormat::MsrCsv).unwrap();
    assert_eq!(records.len(), 5);
    let options = ReplayOptions {
        volume_size: 16 * GIB,
        speedup: 1.0,
        device: Some(1),
    };
    let ios = drain(&mut TraceWorkload::new(records, options).unwrap());
    let arrivals: Vec<Nanos> = ios.iter().map(|io| io.arrival.unwrap()).collect();
    // Filetime ticks are 100 ns: 13,320,526 ticks between the first two device-1 lines.
    assert_eq!(
        arrivals,
        vec![0, 1_332_052_600, 3_317_170_800, 3_317_170_800]
    );
    assert_eq!(
        (ios[1].op, ios[1].offset, ios[1].len),
        (Op::Write, 3_677_929_472, 4096)
    );
    // 10 TB offset folded into 16 GiB.
    assert_eq!(ios[2].offset, 10_737_418_240_000 % (16 * GIB));
}

#[test]
fn msr_error_names_the_line() {
    let error = read_trace(&fixture("msr-bad.csv"), TraceFormat::MsrCsv).unwrap_err();
    assert_eq!(error.line(), Some(2));
    assert_eq!(
        error.to_string(),
        "line 2: field Type: `Erase` is neither Read nor Write"
    );
    let missing = read_trace(&fixture("no-such.csv"), TraceFormat::MsrCsv).unwrap_err();
    assert!(missing.line().is_none() && missing.to_string().contains("no-such.csv"));
}

#[test]
fn spc_fixture_in_bytes_and_seconds() {
    let records = read_trace(&fixture("spc-sample.csv"), TraceFormat::SpcCsv).unwrap();
    let summary: Vec<(u32, Op, u64, u64, Nanos)> = records
        .iter()
        .map(|r| (r.device, r.op, r.offset, r.len, r.timestamp_ns))
        .collect();
    assert_eq!(
        summary,
        vec![
            (0, Op::Write, 20_941_264 * 512, 8192, 551_706_000),
            (1, Op::Read, 1_306_124 * 512, 16_384, 554_041_000),
            (0, Op::Read, 20_939_840 * 512, 4096, 556_102_000),
            (2, Op::Write, 3_025_024 * 512, 8192, 1_250_000_000),
        ]
    );
}

proptest! {
    #[test]
    fn folding_keeps_requests_inside_and_aligned(offset in any::<u64>(), len in 0u64..(1 << 24), volume in 512u64..(1 << 40)) {
        let (folded, folded_len) = fold_into_volume(offset, len, volume);
        prop_assert!(folded.is_multiple_of(512) && folded_len.is_multiple_of(512) && folded_len >= 512);
        prop_assert!(folded + folded_len <= volume);
        prop_assert!(folded_len >= len.min(volume - volume % 512));
    }
}

fn harmonic(n: u64, theta: f64) -> f64 {
    (1..=n).map(|k| (k as f64).powf(-theta)).sum()
}

#[test]
fn zipf_top_tenth_of_blocks_gets_the_expected_share() {
    let blocks = 10_000u64;
    for theta in [0.5, 0.99, 1.2] {
        let pattern = Pattern {
            address: AddressDist::Zipf {
                theta,
                scatter: false,
            },
            sizes: vec![WeightedSize {
                bytes: 4096,
                weight: 1,
            }],
            read_share: 1.0,
            align: 4096,
        };
        let mut gen = ClosedLoop::new(pattern, blocks * 4096, 3).unwrap();
        let samples = 200_000;
        let hot = (0..samples)
            .filter(|_| gen.next_io().unwrap().offset < blocks / 10 * 4096)
            .count();
        let expected = harmonic(blocks / 10, theta) / harmonic(blocks, theta);
        let observed = hot as f64 / samples as f64;
        assert!(
            (observed - expected).abs() < 0.01,
            "theta {theta}: {observed} vs {expected}"
        );
    }
}

#[test]
fn scattered_zipf_spreads_the_hot_blocks() {
    let pattern = Pattern {
        address: AddressDist::Zipf {
            theta: 0.99,
            scatter: true,
        },
        ..Pattern::tpcc_like()
    };
    let mut gen = ClosedLoop::new(pattern, 10_000 * 8192, 3).unwrap();
    let first_tenth = (0..50_000)
        .filter(|_| gen.next_io().unwrap().offset < 1_000 * 8192)
        .count();
    // Unscattered, about 70 % would land in the first tenth; scattered, near 10 %.
    assert!(first_tenth < 50_000 / 5, "{first_tenth}");
}

fn all_specs() -> Vec<WorkloadSpec> {
    let text = r#"
        [[w]]
        kind = "uniform"
        read_share = 0.5
        count = 500
        [[w]]
        kind = "zipf"
        theta = 0.99
        read_share = 0.7
        sizes = [{ bytes = 4096, weight = 3 }, { bytes = 65536, weight = 1 }]
        count = 500
        [[w]]
        kind = "sequential"
        start = 1048576
        read_share = 1
        sizes = [{ bytes = 131072, weight = 1 }]
        count = 500
        [[w]]
        kind = "tpcc"
        count = 500
        [[w]]
        kind = "poisson"
        rate_iops = 2000
        address = { dist = "zipf", theta = 0.9 }
        read_share = 0.5
        duration_s = 0.25
    "#;
    #[derive(serde::Deserialize)]
    struct File {
        w: Vec<WorkloadSpec>,
    }
    toml::from_str::<File>(text).unwrap().w
}

#[test]
fn specs_are_deterministic_per_seed() {
    for spec in all_specs() {
        let first = drain(spec.build(4 * GIB, 7).unwrap().as_mut());
        assert!(first.len() > 100, "{spec:?}");
        assert_eq!(
            first,
            drain(spec.build(4 * GIB, 7).unwrap().as_mut()),
            "{spec:?}"
        );
        if !matches!(spec, WorkloadSpec::Sequential { .. }) {
            assert_ne!(
                first,
                drain(spec.build(4 * GIB, 8).unwrap().as_mut()),
                "{spec:?}"
            );
        }
        assert!(first.iter().all(|io| io.offset + io.len <= 4 * GIB));
    }
}

#[test]
fn spec_kinds_do_what_they_say() {
    let specs = all_specs();
    let ios: Vec<Vec<Io>> = specs
        .iter()
        .map(|s| drain(s.build(4 * GIB, 1).unwrap().as_mut()))
        .collect();
    assert!(ios[..4]
        .iter()
        .all(|w| w.len() == 500 && w.iter().all(|io| io.arrival.is_none())));
    let sequential: Vec<u64> = ios[2].iter().take(3).map(|io| io.offset).collect();
    assert_eq!(
        sequential,
        vec![1 << 20, (1 << 20) + 131_072, (1 << 20) + 262_144]
    );
    let tpcc_reads = ios[3].iter().filter(|io| io.op == Op::Read).count();
    assert!(ios[3]
        .iter()
        .all(|io| io.len == 8192 && io.offset.is_multiple_of(8192)));
    assert!(
        (290..380).contains(&tpcc_reads),
        "about 2/3 of 500: {tpcc_reads}"
    );
    let poisson = &ios[4];
    assert!(poisson.iter().all(|io| io.arrival.unwrap() <= SECONDS / 4));
    assert!(
        (400..600).contains(&poisson.len()),
        "2000 IOPS for 0.25 s: {}",
        poisson.len()
    );
}

#[test]
fn spec_rejects_unknown_fields_and_bad_values() {
    let typo = toml::from_str::<WorkloadSpec>(
        "kind = \"zipf\"\ntheta = 0.9\nread_share = 0.5\nskew = 1\n",
    );
    assert!(typo.unwrap_err().to_string().contains("skew"));
    let spec: WorkloadSpec = toml::from_str("kind = \"uniform\"\nread_share = 1.5\n").unwrap();
    assert_eq!(
        spec.build(GIB, 0).err().unwrap(),
        "read share 1.5 is not within 0..=1"
    );
    let spec: WorkloadSpec = toml::from_str(
        "kind = \"uniform\"\nread_share = 1\nsizes = [{ bytes = 1000, weight = 1 }]\n",
    )
    .unwrap();
    assert_eq!(
        spec.build(GIB, 0).err().unwrap(),
        "size 1000 is not a positive multiple of 512"
    );
    let mut spec: WorkloadSpec =
        toml::from_str("kind = \"trace\"\npath = \"x.trace\"\nformat = \"spc_csv\"\n").unwrap();
    spec.resolve_paths(Path::new("/experiments"));
    assert!(
        matches!(&spec, WorkloadSpec::Trace { path, .. } if path == Path::new("/experiments/x.trace"))
    );
    assert!(spec
        .build(GIB, 0)
        .err()
        .unwrap()
        .starts_with("reading /experiments/x.trace: "));
}

#[test]
fn poisson_inter_arrivals_have_the_rate_mean_and_unit_cv() {
    let rate = 5_000.0;
    let mut gen = Poisson::new(Pattern::tpcc_like(), rate, GIB, 9).unwrap();
    let arrivals: Vec<f64> = (0..50_000)
        .map(|_| gen.next_io().unwrap().arrival.unwrap() as f64)
        .collect();
    let gaps: Vec<f64> = std::iter::once(arrivals[0])
        .chain(arrivals.windows(2).map(|w| w[1] - w[0]))
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let std_dev = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
    assert!(
        (mean / (200 * MICROS) as f64 - 1.0).abs() < 0.02,
        "mean gap {mean}"
    );
    assert!(
        (std_dev / mean - 1.0).abs() < 0.03,
        "exponential gaps have cv 1: {}",
        std_dev / mean
    );
}
