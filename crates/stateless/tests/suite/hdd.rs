//! `hdd` in virtual time: data passes through, requests complete when the bare drive model
//! says (to tokio's 1 ms timer granularity), queued requests are reordered by the drive, and
//! bad options are refused naming the field.
//!
//! Every timed test runs on tokio's paused clock (`start_paused`), so it is exact and instant.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use strata_backend::MemoryDevice;
use strata_core::layer::OptionValue;
use strata_core::{
    BlockDevice, Control, ControlReply, DeviceRef, Runtime, TokioRuntime, WriteFlags, ZeroFlags,
};
use strata_devmodel::hdd::{presets, Hdd, Scheduler};
use strata_devmodel::model::{Completion, DeviceModel, Nanos, Op, Request, MILLIS};
use strata_stateless::hdd::{self, HddConfig, HddLayer};
use tokio::time::Instant;

use crate::common;
use common::one_child_args;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const MODEL: &str = "wd-re3-1t";

/// The runtime of a `start_paused` test: `TokioRuntime` reads tokio's clock, which the paused
/// clock advances, so sleeps and `now` both run in virtual time.
fn paused() -> Arc<dyn Runtime> {
    TokioRuntime::current()
}

fn layer(config: HddConfig, child_size: u64) -> HddLayer {
    let child = Arc::new(MemoryDevice::new(child_size));
    HddLayer::new("slow".into(), child, config, paused()).unwrap()
}

fn pattern(seed: u8, len: u64) -> Bytes {
    (0..len)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn data_passes_through_unchanged() {
    let device = layer(HddConfig::new(MODEL), 64 * MIB);
    let writes = [
        (0, 4 * KIB, 1u8),
        (12 * MIB + 512, 3 * KIB, 2),
        (40 * MIB, MIB, 3),
        (64 * MIB - 4 * KIB, 4 * KIB, 4),
    ];
    // Concurrently, so the drive reorders them; the data must not care.
    join_all(writes.iter().map(|&(offset, len, seed)| {
        device.write(offset, pattern(seed, len), WriteFlags::default())
    }))
    .await
    .into_iter()
    .collect::<Result<Vec<()>, _>>()
    .unwrap();
    for &(offset, len, seed) in &writes {
        let read = device.read(offset, len as usize).await.unwrap();
        assert_eq!(&read[..], &pattern(seed, len)[..], "at {offset}");
    }
    device
        .write_zeroes(40 * MIB + 4 * KIB, 8 * KIB, ZeroFlags::default())
        .await
        .unwrap();
    device.discard(0, 4 * KIB).await.unwrap();
    device.flush().await.unwrap();
    let read = device.read(40 * MIB, 16 * KIB as usize).await.unwrap();
    let mut expected = pattern(3, MIB)[..16 * KIB as usize].to_vec();
    expected[4 * KIB as usize..12 * KIB as usize].fill(0);
    assert_eq!(&read[..], &expected[..]);
    // MemoryDevice reads discarded blocks as zeros.
    assert!(device.read(0, 4096).await.unwrap().iter().all(|&b| b == 0));
}

/// One request the test issued: in the order the layer submitted it to its model.
#[derive(Clone, Copy, Debug)]
struct Issued {
    op: Op,
    offset: u64,
    len: u64,
    /// Virtual time since the layer was built.
    submitted: Duration,
    completed: Duration,
}

/// Issues requests through `device` and records, in submission order, when each was
/// submitted and when it completed.
struct Recorder<'a> {
    device: &'a HddLayer,
    start: Instant,
    log: RefCell<Vec<Option<Issued>>>,
}

impl Recorder<'_> {
    async fn io(&self, op: Op, offset: u64, len: u64) {
        // The push and the layer's submission happen in the same poll: the log's order is
        // the model's.
        let submitted = self.start.elapsed();
        let index = {
            let mut log = self.log.borrow_mut();
            log.push(None);
            log.len() - 1
        };
        match op {
            Op::Read => drop(self.device.read(offset, len as usize).await.unwrap()),
            Op::Write => {
                let data = pattern(index as u8, len);
                self.device
                    .write(offset, data, WriteFlags::default())
                    .await
                    .unwrap()
            }
        }
        self.log.borrow_mut()[index] = Some(Issued {
            op,
            offset,
            len,
            submitted,
            completed: self.start.elapsed(),
        });
    }
}

/// When the bare model completes each of `issued`, submitted at the same times in the same
/// order.
fn bare_model(config: &HddConfig, issued: &[Issued]) -> Vec<Nanos> {
    let mut drive = Hdd::with_seed(config.params().unwrap(), config.seed);
    for (id, io) in issued.iter().enumerate() {
        let request = Request {
            id: id as u64,
            op: io.op,
            offset: io.offset,
            len: io.len,
        };
        drive.submit(io.submitted.as_nanos() as Nanos, request);
    }
    let mut done: Vec<Completion> = Vec::new();
    drive.advance(Nanos::MAX / 2, &mut done);
    assert_eq!(done.len(), issued.len());
    let mut at = vec![0; issued.len()];
    for completion in done {
        at[completion.id as usize] = completion.at;
    }
    at
}

/// tokio's timer: a sleep ends on the first whole millisecond at or after its deadline.
fn timer_rounded(at: Nanos) -> Duration {
    Duration::from_nanos(at.div_ceil(MILLIS) * MILLIS)
}

#[tokio::test(start_paused = true)]
async fn requests_complete_when_the_bare_model_says() {
    let config = HddConfig::new(MODEL);
    let device = layer(config.clone(), 512 * MIB);
    let recorder = Recorder {
        device: &device,
        start: Instant::now(),
        log: RefCell::new(Vec::new()),
    };
    let r = &recorder;
    // Eight at once, reads and writes spread over 512 MiB: the drive reorders them.
    join_all((0..8u64).map(|i| {
        let op = if i % 3 == 0 { Op::Write } else { Op::Read };
        r.io(op, (i * 37 % 8) * 61 * MIB + i * 4 * KIB, 4 * KIB + i * 512)
    }))
    .await;
    // Idle, then one at a time: a sequential run, then far jumps.
    tokio::time::sleep(Duration::from_micros(3300)).await;
    for (op, offset, len) in [
        (Op::Read, 100 * MIB, 64 * KIB),
        (Op::Read, 100 * MIB + 64 * KIB, 64 * KIB),
        (Op::Write, 7 * MIB, 4 * KIB),
        (Op::Write, 500 * MIB, 128 * KIB),
        (Op::Read, 3 * MIB, 512),
    ] {
        r.io(op, offset, len).await;
    }
    // Requests arriving while others are queued: three now, four 5 ms later.
    let first = join_all((0..3u64).map(|i| r.io(Op::Write, 200 * MIB + i * 3 * MIB, 8 * KIB)));
    let later = async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        join_all((0..4u64).map(|i| r.io(Op::Read, 300 * MIB - i * 5 * MIB, 16 * KIB))).await;
    };
    futures_util::future::join(first, later).await;

    let issued: Vec<Issued> = recorder
        .log
        .take()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(issued.len(), 20);
    let model = bare_model(&config, &issued);
    let mut total_service = 0;
    for (io, &at) in issued.iter().zip(&model) {
        let submitted = io.submitted.as_nanos() as Nanos;
        total_service += at - submitted;
        assert_eq!(
            io.completed,
            timer_rounded(at),
            "{io:?}: the model completes it at {at} ns"
        );
    }
    // Not trivially equal: the requests took the model's time, and it varies.
    let services: Vec<Nanos> = issued
        .iter()
        .zip(&model)
        .map(|(io, &at)| at - io.submitted.as_nanos() as Nanos)
        .collect();
    assert!(services.iter().all(|&s| s > 0));
    assert!(services.iter().max() > services.iter().min());
    // Describe counts them and reports the model's mean service.
    let ControlReply::Describe(node) = device.control(Control::Describe).await.unwrap() else {
        panic!("no description");
    };
    let detail = |key: &str| {
        node.detail
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no {key} in {:?}", node.detail))
            .1
            .clone()
    };
    assert_eq!(detail("model"), MODEL);
    assert_eq!(detail("queue-depth"), "8");
    assert_eq!(detail("scheduler"), "sptf");
    assert_eq!(detail("requests"), "20");
    let mean = total_service as f64 / 20.0 / MILLIS as f64;
    assert_eq!(detail("mean-service-ms"), format!("{mean:.3}"));
    eprintln!("20 requests, mean modelled service {mean:.3} ms");
}

/// Eight 4 KiB writes within one MiB (two tracks of the WD RE3's outer zone), in an order
/// that is not the drive's.
fn eight_offsets() -> [u64; 8] {
    [5, 0, 7, 2, 6, 1, 4, 3].map(|i| SPAN + i * 128 * KIB + (i % 3) * 4 * KIB)
}

const SPAN: u64 = 10 * MIB;

async fn write(device: &HddLayer, offset: u64) -> strata_core::Result<()> {
    let data = pattern(offset as u8, 4 * KIB);
    device.write(offset, data, WriteFlags::default()).await
}

/// A drive of `config` whose arm has been brought to the span (the seek from the seeded
/// start position is paid before the clock starts).
async fn positioned(config: HddConfig) -> HddLayer {
    let device = layer(config, 64 * MIB);
    write(&device, SPAN + 64 * KIB).await.unwrap();
    device
}

#[tokio::test(start_paused = true)]
async fn concurrent_writes_finish_sooner_than_one_at_a_time() {
    let one_at_a_time = {
        let device = positioned(HddConfig::new(MODEL)).await;
        let start = Instant::now();
        for offset in eight_offsets() {
            write(&device, offset).await.unwrap();
        }
        start.elapsed()
    };
    let concurrent = |scheduler| async move {
        let config = HddConfig {
            scheduler: Some(scheduler),
            ..HddConfig::new(MODEL)
        };
        let device = positioned(config).await;
        let start = Instant::now();
        join_all(eight_offsets().map(|offset| write(&device, offset)))
            .await
            .into_iter()
            .collect::<Result<Vec<()>, _>>()
            .unwrap();
        start.elapsed()
    };
    let sptf = concurrent(Scheduler::Sptf).await;
    let fifo = concurrent(Scheduler::Fifo).await;
    eprintln!(
        "eight 4 KiB writes in 1 MiB: one at a time {one_at_a_time:?}, \
         concurrent with SPTF {sptf:?}, concurrent with FIFO {fifo:?}"
    );
    assert_eq!(
        presets::wd_re3_1tb().scheduler,
        Scheduler::Sptf,
        "the default"
    );
    assert!(
        sptf.as_secs_f64() < 0.5 * one_at_a_time.as_secs_f64(),
        "SPTF {sptf:?} vs one at a time {one_at_a_time:?}"
    );
    // The drive's scheduler does it, not the overlap: queued in arrival order, the same
    // writes gain no more than the command overhead (0.1 ms each) and the timer's rounding.
    assert!(
        fifo + Duration::from_millis(2) >= one_at_a_time,
        "FIFO {fifo:?} vs one at a time {one_at_a_time:?}"
    );
}

async fn build(
    options: Vec<(&str, OptionValue)>,
    child_size: u64,
) -> strata_core::Result<DeviceRef> {
    let args = one_child_args("slow", child_size, &options, Path::new(""), paused());
    (hdd::KIND.build)(args).await
}

async fn refused(options: Vec<(&str, OptionValue)>, child_size: u64) -> String {
    build(options, child_size).await.err().unwrap().to_string()
}

#[tokio::test(start_paused = true)]
async fn bad_options_are_refused_naming_the_field() {
    let text = |s: &str| OptionValue::Text(s.into());

    let error = refused(vec![("model", text("st-1000"))], MIB).await;
    assert!(
        error.contains("field `model`: unknown HDD model `st-1000`"),
        "{error}"
    );
    for preset in presets::all() {
        assert!(error.contains(&preset.name), "{error}");
    }
    let error = refused(vec![], MIB).await;
    assert!(error.contains("field `model` is required"), "{error}");

    let error = refused(
        vec![
            ("model", text(MODEL)),
            ("queue-depth", OptionValue::Integer(0)),
        ],
        MIB,
    )
    .await;
    assert!(
        error.contains("field `queue-depth`: must be at least 1"),
        "{error}"
    );
    // Also when the config is built in code, not parsed.
    let zero = HddConfig {
        queue_depth: Some(0),
        ..HddConfig::new(MODEL)
    };
    let child = Arc::new(MemoryDevice::new(MIB));
    let error = HddLayer::new("slow".into(), child, zero, paused())
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("field `queue-depth`: must be at least 1"),
        "{error}"
    );

    let error = refused(
        vec![("model", text(MODEL)), ("scheduler", text("elevator"))],
        MIB,
    )
    .await;
    assert!(
        error.contains("field `scheduler`: unknown scheduler `elevator` (known: sptf, fifo)"),
        "{error}"
    );

    // The Cheetah holds 585,937,500 sectors of 512 bytes; one more sector is too many.
    let capacity = 585_937_500 * 512;
    let error = refused(vec![("model", text("cheetah-15k5-300g"))], capacity + 512).await;
    assert!(error.contains("field `model`"), "{error}");
    assert!(
        error.contains(&format!("{} bytes", capacity + 512)),
        "{error}"
    );
    assert!(error.contains(&format!("{capacity} bytes")), "{error}");
    // Exactly the capacity builds, with every option given.
    let device = build(
        vec![
            ("model", text("cheetah-15k5-300g")),
            ("queue-depth", OptionValue::Integer(1)),
            ("scheduler", text("fifo")),
            ("seed", OptionValue::Integer(9)),
        ],
        capacity,
    )
    .await
    .unwrap();
    let ControlReply::Describe(node) = device.control(Control::Describe).await.unwrap() else {
        panic!("no description");
    };
    let config = node.config.unwrap();
    assert_eq!(config["queue-depth"].as_integer(), Some(1));
    assert_eq!(config["scheduler"].as_str(), Some("fifo"));
    assert_eq!(config["seed"].as_integer(), Some(9));
}

#[tokio::test(start_paused = true)]
async fn describe_makes_the_presets_defaults_explicit() {
    let device: DeviceRef = Arc::new(layer(HddConfig::new("fc-10k-146g"), MIB));
    let ControlReply::Describe(node) = device.control(Control::Describe).await.unwrap() else {
        panic!("no description");
    };
    let config = node.config.unwrap();
    assert_eq!(config["model"].as_str(), Some("fc-10k-146g"));
    assert_eq!(config["queue-depth"].as_integer(), Some(8));
    assert_eq!(config["scheduler"].as_str(), Some("sptf"));
    assert_eq!(config["seed"].as_integer(), Some(1));
    let normalized = (hdd::KIND.normalize)(
        &strata_core::layer::options_from_table(
            &toml::toml! { model = "fc-10k-146g" },
            Default::default(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(normalized, config);
}

#[tokio::test(start_paused = true)]
async fn a_request_given_up_on_leaves_the_drive_working() {
    let config = HddConfig::new(MODEL);
    let device = layer(config.clone(), 64 * MIB);
    // The caller stops waiting at 1 ms; the drive goes on serving the read (it cannot take
    // a command back), so the next request queues behind it.
    let given_up = tokio::time::timeout(Duration::from_millis(1), device.read(0, 4096)).await;
    assert!(given_up.is_err(), "a lone read takes more than 1 ms");
    let start = Instant::now();
    device.read(32 * MIB, 4096).await.unwrap();
    let model = {
        let mut drive = Hdd::with_seed(config.params().unwrap(), config.seed);
        let read = |id, offset| Request {
            id,
            op: Op::Read,
            offset,
            len: 4096,
        };
        drive.submit(0, read(0, 0));
        drive.submit(MILLIS, read(1, 32 * MIB));
        let mut done: Vec<Completion> = Vec::new();
        drive.advance(Nanos::MAX / 2, &mut done);
        done.iter().find(|c| c.id == 1).unwrap().at
    };
    assert_eq!(
        start.elapsed() + Duration::from_millis(1),
        timer_rounded(model)
    );
    // Only the collected request counts.
    let ControlReply::Describe(node) = device.control(Control::Describe).await.unwrap() else {
        panic!("no description");
    };
    let requests = node.detail.iter().find(|(k, _)| k == "requests").unwrap();
    assert_eq!(requests.1, "1");
}
