//! The SSD, the network link and the remote brick, driven through the `DeviceModel` contract.

use strata_sim::model::{Completion, DeviceModel, Nanos, Op, Request, MICROS, MILLIS};
use strata_sim::net::{
    DelayDist, Duplex, Link, LinkParams, Remote, ISCSI_HEADER_BYTES, MIGRATION_TABLE1,
};
use strata_sim::ssd::{FlashTiming, Ssd, SsdParams};

/// Submits each request at its time and advances to every reported event, as a driver
/// would; returns all completions in order.
fn drive(model: &mut dyn DeviceModel, mut submits: Vec<(Nanos, Request)>) -> Vec<Completion> {
    submits.reverse();
    let mut done = Vec::new();
    loop {
        let next_submit = submits.last().map(|(at, _)| *at);
        match (next_submit, model.next_completion()) {
            (Some(at), Some(event)) if event < at => model.advance(event, &mut done),
            (Some(at), _) => {
                let (_, request) = submits.pop().unwrap();
                model.submit(at, request);
            }
            (None, Some(event)) => model.advance(event, &mut done),
            (None, None) => break,
        }
    }
    assert_eq!(model.outstanding(), 0);
    done
}

fn request(id: u64, op: Op, len: u64) -> Request {
    Request {
        id,
        op,
        offset: id * len,
        len,
    }
}

fn four_channel_ssd() -> SsdParams {
    SsdParams {
        name: "test-ssd".into(),
        capacity_bytes: 1 << 30,
        channels: 4,
        read: FlashTiming {
            latency_ns: 50 * MICROS,
            channel_bytes_per_s: 100_000_000,
        },
        write: FlashTiming {
            latency_ns: 200 * MICROS,
            channel_bytes_per_s: 50_000_000,
        },
        stripe_bytes: None,
    }
}

#[test]
fn ssd_serves_n_requests_on_n_channels_together_and_queues_the_next() {
    let mut ssd = Ssd::new(four_channel_ssd());
    // 4096 B at 100 MB/s = 40.96 µs, plus 50 µs.
    let service = 50 * MICROS + 40_960;
    let submits = (0..5).map(|id| (0, request(id, Op::Read, 4096))).collect();
    let done = drive(&mut ssd, submits);
    let times: Vec<(u64, Nanos)> = done.iter().map(|c| (c.id, c.at)).collect();
    assert_eq!(
        times,
        vec![
            (0, service),
            (1, service),
            (2, service),
            (3, service),
            (4, 2 * service)
        ]
    );
    assert_eq!(
        ssd.busy_time(),
        2 * service,
        "busy while any channel serves"
    );
}

#[test]
fn ssd_writes_use_write_timing_and_fifo_order() {
    let mut ssd = Ssd::new(SsdParams {
        channels: 1,
        ..four_channel_ssd()
    });
    // 8192 B at 50 MB/s = 163.84 µs, plus 200 µs; a read behind it waits in FIFO order.
    let write = 200 * MICROS + 163_840;
    let read = 50 * MICROS + 40_960;
    let done = drive(
        &mut ssd,
        vec![
            (0, request(0, Op::Write, 8192)),
            (10, request(1, Op::Read, 4096)),
        ],
    );
    assert_eq!(
        done,
        vec![
            Completion { id: 0, at: write },
            Completion {
                id: 1,
                at: write + read
            }
        ]
    );
}

/// Round trip = two independent one-way delays.
fn round_trips(params: LinkParams, seed: u64, count: usize) -> Vec<f64> {
    let mut link = Link::new(params, seed);
    (0..count)
        .map(|_| (link.sample_delay() + link.sample_delay()) as f64)
        .collect()
}

fn mean_and_std_dev(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64;
    (mean, variance.sqrt())
}

#[test]
fn table1_links_reproduce_mean_and_deviation_of_the_round_trip() {
    for row in &MIGRATION_TABLE1 {
        let params = LinkParams::migration_rtt_ms(row.avg_ms as u32).unwrap();
        let (mean, std_dev) = mean_and_std_dev(&round_trips(params, 11, 50_000));
        let (mean_ms, std_dev_ms) = (mean / MILLIS as f64, std_dev / MILLIS as f64);
        assert!(
            (mean_ms / row.avg_ms - 1.0).abs() < 0.01,
            "RTT {}: mean {mean_ms}",
            row.avg_ms
        );
        assert!(
            (std_dev_ms / row.mdev_ms - 1.0).abs() < 0.05,
            "RTT {}: deviation {std_dev_ms}",
            row.avg_ms
        );
    }
}

#[test]
fn lognormal_delay_keeps_its_mean_and_deviation() {
    let params = LinkParams {
        delay: DelayDist::LogNormal {
            mean_ns: 4_500_000,
            std_dev_ns: 1_600_000,
        },
        ..LinkParams::migration_rtt_ms(9).unwrap()
    };
    let mut link = Link::new(params, 5);
    let samples: Vec<f64> = (0..50_000).map(|_| link.sample_delay() as f64).collect();
    let (mean, std_dev) = mean_and_std_dev(&samples);
    assert!((mean / 4.5e6 - 1.0).abs() < 0.01, "mean {mean}");
    assert!((std_dev / 1.6e6 - 1.0).abs() < 0.05, "deviation {std_dev}");
    assert!(samples.iter().all(|&s| s > 0.0));
}

fn constant_link(delay_ns: Nanos) -> LinkParams {
    LinkParams {
        name: "fixed".into(),
        delay: DelayDist::Constant { mean_ns: delay_ns },
        bytes_per_s: Some(12_500_000),
        duplex: Duplex::Full,
        header_bytes: ISCSI_HEADER_BYTES,
    }
}

#[test]
fn remote_brick_adds_two_one_way_delays_and_the_payload_on_the_right_side() {
    let params = constant_link(4 * MILLIS);
    let ser = |bytes: u64| params.serialization_ns(bytes);
    let service = 50 * MICROS + 40_960;
    let write_service = 200 * MICROS + 81_920;
    let mut remote = Remote::new(
        Link::new(params.clone(), 1),
        Box::new(Ssd::new(four_channel_ssd())),
    );
    let read = drive(&mut remote, vec![(0, request(0, Op::Read, 4096))]);
    // Command out (header only), device, data back (header + 4 KiB).
    let expected_read = 4 * MILLIS + ser(48) + service + ser(48 + 4096) + 4 * MILLIS;
    assert_eq!(
        read,
        vec![Completion {
            id: 0,
            at: expected_read
        }]
    );

    let mut remote = Remote::new(
        Link::new(params.clone(), 1),
        Box::new(Ssd::new(four_channel_ssd())),
    );
    let write = drive(&mut remote, vec![(0, request(1, Op::Write, 4096))]);
    let expected_write = 4 * MILLIS + ser(48 + 4096) + write_service + ser(48) + 4 * MILLIS;
    assert_eq!(
        write,
        vec![Completion {
            id: 1,
            at: expected_write
        }]
    );
    assert_eq!(
        remote.busy_time(),
        write_service,
        "the brick is busy only while its device is"
    );
    assert_eq!(remote.name(), "test-ssd@fixed");
}

#[test]
fn remote_brick_serializes_payloads_on_the_wire() {
    let params = constant_link(MILLIS);
    let per_message = params.serialization_ns(48 + 65_536);
    let mut remote = Remote::new(Link::new(params, 1), Box::new(Ssd::new(four_channel_ssd())));
    let writes = (0..3)
        .map(|id| (0, request(id, Op::Write, 65_536)))
        .collect();
    let done = drive(&mut remote, writes);
    // The three writes leave the wire one after another, so reach the device one message apart.
    let gaps: Vec<Nanos> = done.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert_eq!(gaps, vec![per_message, per_message]);
}

#[test]
fn jittered_remote_brick_is_deterministic_per_seed() {
    let run = |seed| {
        let link = Link::new(LinkParams::migration_rtt_ms(17).unwrap(), seed);
        let mut remote = Remote::new(link, Box::new(Ssd::new(SsdParams::intel_x25m_160gb())));
        let submits = (0..200)
            .map(|id| (id * 100 * MICROS, request(id, Op::Read, 8192)))
            .collect();
        drive(&mut remote, submits)
    };
    let first = run(1);
    assert_eq!(first.len(), 200);
    assert_eq!(first, run(1));
    assert_ne!(first, run(2));
    let mut ids: Vec<u64> = first.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..200).collect::<Vec<_>>(),
        "every request completes once"
    );
    assert!(
        first.windows(2).all(|w| w[0].at <= w[1].at),
        "completions in time order"
    );
}

proptest::proptest! {
    /// One channel is a single FIFO server: each completion follows Lindley's recursion,
    /// `done_i = max(arrival_i, done_{i-1}) + service_i`.
    #[test]
    fn one_channel_ssd_is_a_fifo_server(
        requests in proptest::collection::vec((0u64..500_000, 1u64..64, proptest::bool::ANY), 1..60)
    ) {
        let params = SsdParams { channels: 1, ..four_channel_ssd() };
        let mut arrival = 0;
        let mut submits = Vec::new();
        for (id, (gap, sectors, is_write)) in requests.into_iter().enumerate() {
            arrival += gap;
            let op = if is_write { Op::Write } else { Op::Read };
            submits.push((arrival, Request { id: id as u64, op, offset: 0, len: sectors * 512 }));
        }
        let mut expected = Vec::new();
        let mut previous = 0;
        for (at, request) in &submits {
            let timing = if request.op == Op::Read { params.read } else { params.write };
            previous = (*at).max(previous) + timing.service_ns(request.len);
            expected.push(Completion { id: request.id, at: previous });
        }
        let mut ssd = Ssd::new(params);
        proptest::prop_assert_eq!(drive(&mut ssd, submits), expected);
    }
}
