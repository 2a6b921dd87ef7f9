//! Statistics on known data, CSV/JSON round trips, SVG plots and the terminal table.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use strata_sim::model::{
    Completion, DeviceModel, DeviceSample, IoRecord, Nanos, Op, Request, Workload, MILLIS, SECONDS,
};
use strata_sim::net::{Link, LinkParams, Remote};
use strata_sim::results::*;
use strata_sim::ssd::{Ssd, SsdParams};
use strata_sim::workload::WorkloadSpec;

/// 1000 reads of latency 1..=1000 µs and 100 writes of 10 ms, issued in shuffled order one
/// millisecond apart, plus 3 failed reads.
fn known_records() -> Vec<IoRecord> {
    let mut latencies: Vec<(Op, Nanos)> = (1..=1000).map(|us| (Op::Read, us * 1_000)).collect();
    latencies.extend((0..100).map(|_| (Op::Write, 10 * MILLIS)));
    latencies.shuffle(&mut ChaCha8Rng::seed_from_u64(1));
    let mut records: Vec<IoRecord> = latencies
        .into_iter()
        .enumerate()
        .map(|(i, (op, latency))| {
            let issued = i as Nanos * MILLIS;
            IoRecord {
                op,
                offset: i as u64 * 4096,
                len: 4096,
                issued,
                completed: issued + latency,
                failed: false,
            }
        })
        .collect();
    records.extend((0..3).map(|_| IoRecord {
        op: Op::Read,
        offset: 0,
        len: 4096,
        issued: 0,
        completed: 1,
        failed: true,
    }));
    records
}

fn scope(summary: &RunSummary, scope: Scope) -> &LatencySummary {
    &summary
        .latency
        .iter()
        .find(|s| s.scope == scope)
        .unwrap()
        .summary
}

#[test]
fn percentiles_per_op_on_known_data() {
    let summary = summarize(&known_records());
    assert_eq!(summary.failed, 3);
    let read = scope(&summary, Scope::Read);
    assert_eq!(read.count, 1000);
    assert_eq!(
        (read.min_ns, read.p50_ns, read.p90_ns, read.p95_ns),
        (1_000, 500_000, 900_000, 950_000)
    );
    assert_eq!(
        (read.p99_ns, read.p999_ns, read.max_ns),
        (990_000, 999_000, 1_000_000)
    );
    assert_eq!(read.mean_ns, 500_500.0);
    // Population deviation of 1..=1000 µs: sqrt((1000² - 1) / 12) µs.
    assert!((read.stddev_ns - (999_999.0f64 / 12.0).sqrt() * 1_000.0).abs() < 1e-6);
    let write = scope(&summary, Scope::Write);
    assert_eq!(
        (write.count, write.min_ns, write.max_ns, write.stddev_ns),
        (100, 10 * MILLIS, 10 * MILLIS, 0.0)
    );
    let all = scope(&summary, Scope::All);
    assert_eq!(all.count, 1100);
    // Rank 990 of 1100 is the 990th read (990 µs); 1000 reads sit below the 100 writes.
    assert_eq!(
        (all.p90_ns, all.p95_ns, all.max_ns),
        (990_000, 10 * MILLIS, 10 * MILLIS)
    );
}

#[test]
fn throughput_over_the_run() {
    let records = known_records();
    let t = throughput(&records);
    // The last one issued at 1099 ms completes at most 10 ms later; the first at 0.
    let last = records
        .iter()
        .filter(|r| !r.failed)
        .map(|r| r.completed)
        .max()
        .unwrap();
    assert_eq!((t.ios, t.bytes, t.span_ns), (1100, 1100 * 4096, last));
    assert!((t.iops - 1100.0 / (last as f64 / SECONDS as f64)).abs() < 1e-9);
    assert!((t.mib_per_s - t.iops * 4096.0 / 1_048_576.0).abs() < 1e-9);
}

#[test]
fn cdf_and_time_buckets() {
    let records = known_records();
    let cdf = latency_cdf(&records, Some(Op::Read), 10);
    let expected: Vec<(Nanos, f64)> = (1..=10).map(|k| (k * 100_000, k as f64 / 10.0)).collect();
    assert_eq!(
        cdf.iter()
            .map(|p| (p.latency_ns, p.fraction))
            .collect::<Vec<_>>(),
        expected
    );
    let buckets = latency_over_time(&records, 100 * MILLIS);
    assert_eq!(buckets.iter().map(|b| b.count).sum::<u64>(), 1100);
    assert!(buckets.windows(2).all(|w| w[0].at_ns < w[1].at_ns));
    assert!(buckets
        .iter()
        .all(|b| b.mean_latency_ns <= b.max_latency_ns as f64));
}

#[test]
fn csv_and_json_round_trip() {
    let records = known_records();
    assert_eq!(
        records_from_csv(&records_to_csv(&records).unwrap()).unwrap(),
        records
    );
    let header = records_to_csv(&records[..1]).unwrap();
    assert!(
        header.starts_with("op,offset,len,issued,completed,failed\n"),
        "{header}"
    );
    let samples = vec![
        DeviceSample {
            at: MILLIS,
            device: "disk,0".into(),
            queue_depth: 3,
            utilization: 0.25,
        },
        DeviceSample {
            at: 2 * MILLIS,
            device: "disk,0".into(),
            queue_depth: 0,
            utilization: 1.0 / 3.0,
        },
    ];
    assert_eq!(
        samples_from_csv(&samples_to_csv(&samples).unwrap()).unwrap(),
        samples
    );
    let summary = summarize(&records);
    assert_eq!(
        summary_from_json(&to_json(&summary).unwrap()).unwrap(),
        summary
    );
    let latencies = summary_latencies_from_csv(&summary_to_csv(&summary).unwrap()).unwrap();
    assert_eq!(latencies, summary.latency);
}

fn well_formed_svg(svg: &str) -> roxmltree::Document<'_> {
    let document = roxmltree::Document::parse(svg).expect("well-formed XML");
    assert_eq!(document.root_element().tag_name().name(), "svg");
    document
}

/// Point counts of the data lines: 2-px polylines with more than two points (axes and ticks
/// are 1 px; legend samples have two points).
fn data_lines(document: &roxmltree::Document) -> Vec<usize> {
    document
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
        .map(|n| {
            n.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count()
        })
        .filter(|&points| points > 2)
        .collect()
}

fn texts(document: &roxmltree::Document) -> Vec<String> {
    document
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_owned()))
        .collect()
}

#[test]
fn svg_plots_are_written_and_well_formed() {
    let records = known_records();
    let dir = tempfile::tempdir().unwrap();
    let read = latency_cdf(&records, Some(Op::Read), 200);
    let write = latency_cdf(&records, Some(Op::Write), 200);
    let svg = latency_cdf_svg("latency CDF", &[("read", &read), ("write", &write)]).unwrap();
    let path = dir.path().join("cdf.svg");
    write_text(&path, &svg).unwrap();
    let on_disk = std::fs::read_to_string(&path).unwrap();
    let document = well_formed_svg(&on_disk);
    let labels = texts(&document);
    for label in ["latency CDF", "latency (ms, log scale)", "read", "write"] {
        assert!(
            labels.iter().any(|t| t == label),
            "{label} missing from {labels:?}"
        );
    }
    assert_eq!(data_lines(&document), vec![read.len(), write.len()]);

    let over_time = latency_over_time_svg(
        "latency over time",
        &latency_over_time(&records, 50 * MILLIS),
    )
    .unwrap();
    assert!(texts(&well_formed_svg(&over_time))
        .iter()
        .any(|t| t == "mean latency (ms)"));
}

#[test]
fn device_plots_have_one_line_per_device() {
    let samples: Vec<DeviceSample> = (1..=20u64)
        .flat_map(|t| {
            ["disk0", "disk1", "disk2"]
                .into_iter()
                .enumerate()
                .map(move |(d, name)| DeviceSample {
                    at: t * 100 * MILLIS,
                    device: name.into(),
                    queue_depth: (t as usize + d) % 8,
                    utilization: ((t + d as u64) % 10) as f64 / 10.0,
                })
        })
        .collect();
    for svg in [
        utilization_svg("utilization", &samples).unwrap(),
        queue_depth_svg("queue depth", &samples).unwrap(),
    ] {
        let document = well_formed_svg(&svg);
        assert_eq!(data_lines(&document), vec![20, 20, 20]);
        let labels = texts(&document);
        assert!(
            ["disk0", "disk1", "disk2"]
                .iter()
                .all(|d| labels.iter().any(|t| t == d)),
            "{labels:?}"
        );
    }
    let devices = summarize_devices(&samples);
    let names: Vec<&str> = devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(names, vec!["disk0", "disk1", "disk2"]);
    // disk0 over t = 1..=20: utilization (t % 10) / 10 averages 0.45; depth t % 8 peaks at 7.
    assert_eq!((devices[0].samples, devices[0].max_queue_depth), (20, 7));
    assert!((devices[0].mean_utilization - 0.45).abs() < 1e-12);
    let expected_depth = (1..=20).map(|t| (t % 8) as f64).sum::<f64>() / 20.0;
    assert!((devices[0].mean_queue_depth - expected_depth).abs() < 1e-12);
    let table = format_device_table(&devices);
    assert_eq!(table.lines().count(), 4);
    assert!(
        table.lines().nth(1).unwrap().starts_with("disk0     45.0"),
        "{table}"
    );
    let csv = device_summaries_to_csv(&devices).unwrap();
    assert!(csv.starts_with("device,samples,mean_utilization,mean_queue_depth,max_queue_depth\n"));
}

#[test]
fn terminal_table_lists_every_scope() {
    let table = format_summary_table(&summarize(&known_records()));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 6, "{table}");
    assert!(lines[1].starts_with("op") && lines[1].ends_with("max"));
    assert!(
        lines[3].starts_with("read") && lines[3].contains("0.500") && lines[3].ends_with("1.000"),
        "{table}"
    );
    assert!(lines[4].starts_with("write") && lines[4].ends_with("10.000"));
    assert!(lines[5].starts_with("throughput: 1100 I/Os") && lines[5].ends_with("failed: 3"));
}

/// A minimal open-loop driver (the simulator's real driver lives elsewhere): submits each
/// I/O at its arrival and records its completion.
fn replay_open_loop(model: &mut dyn DeviceModel, workload: &mut dyn Workload) -> Vec<IoRecord> {
    let mut issued = Vec::new();
    let mut done = Vec::new();
    let drain_until = |model: &mut dyn DeviceModel, now: Option<Nanos>, done: &mut Vec<_>| {
        while let Some(at) = model
            .next_completion()
            .filter(|&at| now.is_none_or(|now| at <= now))
        {
            model.advance(at, done);
        }
    };
    while let Some(io) = workload.next_io() {
        let at = io.arrival.expect("open loop");
        drain_until(model, Some(at), &mut done);
        let id = issued.len() as u64;
        model.submit(
            at,
            Request {
                id,
                op: io.op,
                offset: io.offset,
                len: io.len,
            },
        );
        issued.push((at, io));
    }
    drain_until(model, None, &mut done);
    let mut records: Vec<IoRecord> = done
        .iter()
        .map(|c: &Completion| {
            let (at, io) = issued[c.id as usize];
            IoRecord {
                op: io.op,
                offset: io.offset,
                len: io.len,
                issued: at,
                completed: c.at,
                failed: false,
            }
        })
        .collect();
    records.sort_by_key(|r| (r.issued, r.offset));
    records
}

#[test]
fn websearch_on_a_remote_x25m_end_to_end_is_byte_identical_per_seed() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/traces/websearch-spc.trace"
    );
    if !std::path::Path::new(path).exists() {
        eprintln!("skipped: {path} is absent");
        return;
    }
    let run = |seed: u64| {
        let spec: WorkloadSpec = toml::from_str(&format!(
            "kind = \"trace\"\npath = \"{path}\"\nformat = \"mqsim\"\n"
        ))
        .unwrap();
        let ssd = Ssd::new(SsdParams::intel_x25m_160gb());
        let mut remote = Remote::new(
            Link::new(LinkParams::migration_rtt_ms(9).unwrap(), seed),
            Box::new(ssd),
        );
        let records = replay_open_loop(&mut remote, spec.build(16 << 30, seed).unwrap().as_mut());
        (records_to_csv(&records).unwrap(), records)
    };
    let (csv, records) = run(1);
    assert_eq!(records.len(), 24_783);
    assert_eq!(csv, run(1).0, "same seed, same bytes");
    assert_ne!(csv, run(2).0, "another seed draws other network delays");
    let summary = summarize(&records);
    let all = &summary.latency[0].summary;
    // Without queueing each request would take the mean round trip, its command and reply
    // on the 100 Mb/s wire, and its flash service; the wire runs about half full (413 IOPS of
    // 15 KiB on 12.5 MB/s), so queueing behind other replies adds to that.
    let link = LinkParams::migration_rtt_ms(9).unwrap();
    let flash = SsdParams::intel_x25m_160gb();
    let unqueued: f64 = records
        .iter()
        .map(|r| {
            let part = r.len.div_ceil(flash.parts(r.len));
            let wire = link.serialization_ns(48) + link.serialization_ns(48 + r.len);
            (9 * MILLIS + wire + flash.read.service_ns(part)) as f64
        })
        .sum::<f64>()
        / records.len() as f64;
    println!("{}unqueued mean {unqueued}", format_summary_table(&summary));
    assert!(
        all.mean_ns > unqueued * 0.99,
        "{} vs {unqueued}",
        all.mean_ns
    );
    assert!(
        all.mean_ns < unqueued * 1.5,
        "{} vs {unqueued}",
        all.mean_ns
    );
    assert!(
        all.min_ns < 9 * MILLIS && all.p50_ns > 9 * MILLIS,
        "jitter around 9 ms"
    );
    assert!(
        (summary.throughput.iops - 24_783.0 / 60.06).abs() < 5.0,
        "{}",
        summary.throughput.iops
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let read = latency_cdf(&records, Some(Op::Read), 500);
    write_text(
        &dir.join("websearch-x25m-cdf.svg"),
        &latency_cdf_svg("WebSearch on a remote X25-M (9 ms RTT)", &[("read", &read)]).unwrap(),
    )
    .unwrap();
    write_text(
        &dir.join("websearch-x25m-time.svg"),
        &latency_over_time_svg(
            "WebSearch latency over time",
            &latency_over_time(&records, SECONDS),
        )
        .unwrap(),
    )
    .unwrap();
}
