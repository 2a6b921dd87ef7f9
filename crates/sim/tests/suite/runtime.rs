//! The simulator's runtime: virtual time, simulated disks and the driver, with Strata's real
//! layers (stripe, mirror, raid5) on top, over a trivial fixed-latency disk model.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_sim::disk::{DataMode, SimDisk};
use strata_sim::driver::{self, pattern, sectors_match, DriverConfig, RunOutput};
use strata_sim::executor::{SimConfig, Simulation};
use strata_sim::model::{
    Completion, DeviceModel, Io, Nanos, Op, Request, Workload, MICROS, MILLIS, SECONDS,
};
use strata_stack::registry::{self, LayerArgs, OptionValue, Options, StartPolicy};

/// Serves one request at a time, first come first served, each in `service` whatever its
/// size or address.
struct FixedLatency {
    capacity: u64,
    service: Nanos,
    queue: VecDeque<u64>,
    /// The request in service and when it completes.
    current: Option<(u64, Nanos)>,
    busy: Nanos,
}

impl FixedLatency {
    fn new(capacity: u64, service: Nanos) -> Box<Self> {
        Box::new(FixedLatency {
            capacity,
            service,
            queue: VecDeque::new(),
            current: None,
            busy: 0,
        })
    }
}

impl DeviceModel for FixedLatency {
    fn name(&self) -> &str {
        "fixed"
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn submit(&mut self, now: Nanos, request: Request) {
        if self.current.is_none() {
            self.current = Some((request.id, now + self.service));
        } else {
            self.queue.push_back(request.id);
        }
    }

    fn next_completion(&self) -> Option<Nanos> {
        self.current.map(|(_, at)| at)
    }

    fn advance(&mut self, now: Nanos, done: &mut Vec<Completion>) {
        while let Some((id, at)) = self.current.filter(|&(_, at)| at <= now) {
            done.push(Completion { id, at });
            self.busy += self.service;
            self.current = self.queue.pop_front().map(|next| (next, at + self.service));
        }
    }

    fn outstanding(&self) -> usize {
        self.queue.len() + usize::from(self.current.is_some())
    }

    fn busy_time(&self) -> Nanos {
        self.busy
    }
}

/// `count` I/Os of `len` bytes one after another from `start`, closed loop.
struct Sequential {
    op: Op,
    next: u64,
    len: u64,
    left: u64,
}

impl Workload for Sequential {
    fn next_io(&mut self) -> Option<Io> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let io = Io {
            arrival: None,
            op: self.op,
            offset: self.next,
            len: self.len,
        };
        self.next += self.len;
        Some(io)
    }
}

/// `count` random 4 KiB reads and writes inside `span` bytes, closed loop.
struct Uniform {
    rng: ChaCha8Rng,
    span: u64,
    left: u64,
}

impl Workload for Uniform {
    fn next_io(&mut self) -> Option<Io> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let op = if self.rng.random_range(0..3) == 0 {
            Op::Read
        } else {
            Op::Write
        };
        Some(Io {
            arrival: None,
            op,
            offset: self.rng.random_range(0..self.span / 4096) * 4096,
            len: 4096,
        })
    }
}

/// Open loop: reads arriving at the given times.
struct Arrivals(VecDeque<Nanos>);

impl Workload for Arrivals {
    fn next_io(&mut self) -> Option<Io> {
        self.0.pop_front().map(|at| Io {
            arrival: Some(at),
            op: Op::Read,
            offset: 0,
            len: 4096,
        })
    }
}

const DISK: u64 = 256 << 20;

fn disks(sim: &Simulation, n: usize, service: Nanos) -> Vec<Arc<SimDisk>> {
    (0..n)
        .map(|i| {
            SimDisk::new(
                sim,
                format!("d{i}"),
                FixedLatency::new(DISK, service),
                DataMode::Stored,
            )
        })
        .collect()
}

/// Builds a layer of `kind` over `children` through the registry, as the configuration does.
fn layer(
    sim: &Simulation,
    kind: &str,
    children: &[Arc<SimDisk>],
    options: &[(&str, OptionValue)],
) -> DeviceRef {
    let kind = registry::find(kind).expect("a registered kind");
    let values: BTreeMap<String, OptionValue> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let args = LayerArgs {
        name: kind.kind.to_string(),
        children: children
            .iter()
            .map(|d| Some(d.clone() as DeviceRef))
            .collect(),
        child_names: children.iter().map(|d| d.name().to_string()).collect(),
        options: Options::new(values, PathBuf::new()),
        runtime: sim.runtime(),
        start: StartPolicy::FRESH,
    };
    sim.block_on((kind.build)(args)).expect("the layer builds")
}

fn closed(queue_depth: usize) -> DriverConfig {
    DriverConfig {
        queue_depth,
        ..DriverConfig::default()
    }
}

/// IOPS of a run, from its records.
fn iops(output: &RunOutput) -> f64 {
    output.records.len() as f64 * SECONDS as f64 / output.end as f64
}

#[test]
fn ten_virtual_hours_take_well_under_a_wall_second() {
    let sim = Simulation::new(1);
    let disk = SimDisk::new(
        &sim,
        "slow",
        FixedLatency::new(DISK, SECONDS),
        DataMode::Stored,
    );
    // A background task ticking every simulated minute, as a layer's cleaner would.
    let ticks = Arc::new(Mutex::new(0u64));
    let runtime = sim.runtime();
    let counter = ticks.clone();
    sim.spawn(async move {
        loop {
            runtime.sleep(Duration::from_secs(60)).await;
            *counter.lock().unwrap() += 1;
        }
    });
    let wall = Instant::now();
    // Unchecked reads: the test measures the runtime, not pattern generation and checks
    // (slow in a debug build).
    let mut workload = Sequential {
        op: Op::Read,
        next: 0,
        len: 4096,
        left: 36_000,
    };
    let config = DriverConfig {
        verify_data: false,
        outstanding_limit: None,
        ..closed(1)
    };
    let output = driver::run(&sim, disk.clone(), &mut workload, &[disk], &config);
    let elapsed = wall.elapsed();
    assert_eq!(output.end, 36_000 * SECONDS, "10 hours of 1 s requests");
    assert_eq!(sim.now(), 36_000 * SECONDS);
    // One tick per simulated minute; the one due at the same instant as the last completion
    // may be handled after the driver returns (ties are ordered by the seed).
    let ticks = *ticks.lock().unwrap();
    assert!((599..=600).contains(&ticks), "{ticks} ticks");
    assert!(
        elapsed < Duration::from_secs(1),
        "10 simulated hours took {elapsed:?} of wall time"
    );
}

#[test]
fn one_fixed_disk_serves_requests_back_to_back_and_queues_the_rest() {
    let sim = Simulation::new(3);
    let disk = &disks(&sim, 1, MILLIS)[0];
    let mut workload = Sequential {
        op: Op::Write,
        next: 0,
        len: 4096,
        left: 30,
    };
    let output = driver::run(
        &sim,
        disk.clone(),
        &mut workload,
        std::slice::from_ref(disk),
        &DriverConfig {
            queue_depth: 3,
            sample_interval: Some(10 * MILLIS),
            verify_data: true,
            outstanding_limit: None,
        },
    );
    assert_eq!(output.end, 30 * MILLIS);
    assert_eq!(output.records.len(), 30);
    // Three outstanding on one FIFO server: each waits for the two ahead of it.
    let steady: Vec<Nanos> = output.records[3..]
        .iter()
        .map(|r| r.completed - r.issued)
        .collect();
    assert!(steady.iter().all(|&l| l == 3 * MILLIS), "{steady:?}");
    assert_eq!(output.disks[0].stats.writes, 30);
    assert_eq!(output.disks[0].stats.busy_time, 30 * MILLIS);
    // Fully busy with the queue kept at depth 3 (2 at the instant of the last sample,
    // which falls on a completion before the driver refills).
    assert_eq!(output.samples.len(), 3);
    assert!(output.samples.iter().all(|s| s.utilization == 1.0));
    assert!(output.samples[..2].iter().all(|s| s.queue_depth >= 2));
}

#[test]
fn open_loop_issues_at_arrival_whatever_is_outstanding() {
    let sim = Simulation::new(4);
    let disk = &disks(&sim, 1, MILLIS)[0];
    // Spaced 2 ms apart: each is served alone in 1 ms.
    let mut spaced = Arrivals((0..10).map(|i| i * 2 * MILLIS).collect());
    let output = driver::run(
        &sim,
        disk.clone(),
        &mut spaced,
        std::slice::from_ref(disk),
        &closed(1),
    );
    assert!(output
        .records
        .iter()
        .all(|r| r.completed - r.issued == MILLIS));
    assert_eq!(output.end, 19 * MILLIS);
    // Ten arriving at once with queue depth 1 still all go out at once: the n-th waits
    // for n - 1 ahead of it.
    let mut burst = Arrivals(std::iter::repeat_n(5 * MILLIS, 10).collect());
    let output = driver::run(
        &sim,
        disk.clone(),
        &mut burst,
        std::slice::from_ref(disk),
        &closed(1),
    );
    let mut latencies: Vec<Nanos> = output
        .records
        .iter()
        .map(|r| r.completed - r.issued)
        .collect();
    latencies.sort_unstable();
    assert_eq!(latencies, (1..=10).map(|n| n * MILLIS).collect::<Vec<_>>());
    assert!(output.records.iter().all(|r| r.issued == 5 * MILLIS));
}

#[test]
fn an_outstanding_limit_holds_arrivals_until_a_slot_frees() {
    let sim = Simulation::new(4);
    let disk = &disks(&sim, 1, MILLIS)[0];
    // Ten arriving at once, at most two outstanding: issued two at a time as the disk
    // finishes, in arrival order; each waits for at most one ahead of it at the disk.
    let config = DriverConfig {
        outstanding_limit: Some(2),
        ..closed(1)
    };
    let run = |mut arrivals: Arrivals| {
        driver::run(
            &sim,
            disk.clone(),
            &mut arrivals,
            std::slice::from_ref(disk),
            &config,
        )
    };
    let output = run(Arrivals(std::iter::repeat_n(5 * MILLIS, 10).collect()));
    assert_eq!(output.records.len(), 10);
    let mut issued: Vec<Nanos> = output.records.iter().map(|r| r.issued).collect();
    issued.sort_unstable();
    // Two at 5 ms, then one at each completion: 6, 7, …, 13 ms.
    let expected: Vec<Nanos> = [5, 5, 6, 7, 8, 9, 10, 11, 12, 13]
        .iter()
        .map(|ms| ms * MILLIS)
        .collect();
    assert_eq!(issued, expected);
    assert!(output
        .records
        .iter()
        .all(|r| r.completed - r.issued <= 2 * MILLIS));
    assert_eq!(output.end, 15 * MILLIS);
    // Arrivals spaced wider than the service never meet the limit.
    let output = run(Arrivals((0..10).map(|i| i * 2 * MILLIS).collect()));
    assert!(output
        .records
        .iter()
        .all(|r| r.completed - r.issued == MILLIS && r.issued % (2 * MILLIS) == 0));
}

#[test]
fn stripe_over_three_disks_serves_three_times_one_disk_and_keeps_the_data() {
    const CHUNK: u64 = 64 << 10;
    const COUNT: u64 = 300;
    let sequential = |op| Sequential {
        op,
        next: 0,
        len: CHUNK,
        left: COUNT,
    };

    let single_sim = Simulation::new(9);
    let single = &disks(&single_sim, 1, MILLIS)[0];
    let one = driver::run(
        &single_sim,
        single.clone(),
        &mut sequential(Op::Write),
        std::slice::from_ref(single),
        &closed(3),
    );

    let sim = Simulation::new(9);
    let members = disks(&sim, 3, MILLIS);
    let stripe = layer(
        &sim,
        "stripe",
        &members,
        &[("chunk", OptionValue::Text("64KiB".into()))],
    );
    let written = driver::run(
        &sim,
        stripe.clone(),
        &mut sequential(Op::Write),
        &members,
        &closed(3),
    );
    let ratio = iops(&written) / iops(&one);
    assert!((2.9..=3.1).contains(&ratio), "stripe/one = {ratio}");
    assert!(written.records.iter().all(|r| !r.failed));
    for report in &written.disks {
        assert_eq!(report.stats.writes, COUNT / 3, "{}", report.name);
    }

    // Read back through the stack, with the driver checking every sector...
    let read = driver::run(
        &sim,
        stripe.clone(),
        &mut sequential(Op::Read),
        &members,
        &closed(3),
    );
    assert_eq!(read.read_mismatches, 0);
    // ...and directly: the bytes are the pattern, not merely non-garbage.
    let seed = strata_sim::executor::derive_seed(sim.seed(), "driver-data");
    let bytes = sim
        .block_on(stripe.read(0, (COUNT * CHUNK) as usize))
        .unwrap();
    assert_eq!(&bytes[..], &pattern(seed, 0, (COUNT * CHUNK) as usize)[..]);
    // Chunk 1 of the volume is chunk 0 of the second disk.
    let on_d1 = sim.block_on(members[1].read(0, CHUNK as usize)).unwrap();
    assert_eq!(&on_d1[..], &pattern(seed, CHUNK, CHUNK as usize)[..]);
}

#[test]
fn mirror_and_raid5_from_the_registry_run_and_read_back_what_was_written() {
    for (kind, n) in [("mirror", 2), ("raid5", 4)] {
        let sim = Simulation::new(11);
        let members = disks(&sim, n, 200 * MICROS);
        let top = layer(&sim, kind, &members, &[]);
        let span = top.geometry().size.min(64 << 20);
        let mut workload = Uniform {
            rng: sim.rng("workload"),
            span,
            left: 2_000,
        };
        let output = driver::run(&sim, top.clone(), &mut workload, &members, &closed(8));
        assert_eq!(output.records.len(), 2_000, "{kind}");
        assert!(output.records.iter().all(|r| !r.failed), "{kind}");
        assert_eq!(output.read_mismatches, 0, "{kind}");
        // Every member did work, and a write cost more member I/O than a read.
        assert!(output.disks.iter().all(|d| d.stats.writes > 0), "{kind}");

        // Everything written reads back as the pattern (or zeros where nothing was).
        let seed = strata_sim::executor::derive_seed(sim.seed(), "driver-data");
        sim.block_on(top.flush()).unwrap();
        let whole = sim.block_on(top.read(0, span as usize)).unwrap();
        assert!(sectors_match(seed, 0, &whole), "{kind}");
        let written = whole.chunks(4096).filter(|p| p.iter().any(|&b| b != 0));
        assert!(written.count() > 500, "{kind}: the writes landed");
    }
}

#[test]
fn the_same_seed_gives_byte_identical_output_and_another_seed_differs() {
    let run = |seed: u64, random: bool| -> String {
        let sim = Simulation::new(seed);
        let members = disks(&sim, 3, MILLIS);
        let stripe = layer(
            &sim,
            "stripe",
            &members,
            &[("chunk", OptionValue::Text("4KiB".into()))],
        );
        let mut uniform = Uniform {
            rng: sim.rng("workload"),
            span: 16 << 20,
            left: 500,
        };
        let mut fixed = Sequential {
            op: Op::Write,
            next: 0,
            len: 4096,
            left: 500,
        };
        let workload: &mut dyn Workload = if random { &mut uniform } else { &mut fixed };
        let output = driver::run(
            &sim,
            stripe,
            workload,
            &members,
            &DriverConfig {
                queue_depth: 6,
                sample_interval: Some(20 * MILLIS),
                verify_data: true,
                outstanding_limit: None,
            },
        );
        serde_json::to_string(&output).unwrap()
    };
    assert_eq!(run(1, true), run(1, true));
    assert_ne!(run(1, true), run(2, true));
    // The same I/O sequence too: disks finishing at the same instant are handled in an
    // order drawn from the seed, so completion order (and what goes out next) differs.
    assert_eq!(run(1, false), run(1, false));
    assert_ne!(run(1, false), run(2, false));
}

#[test]
fn without_shuffled_ties_the_seed_does_not_change_a_fixed_workload() {
    let run = |seed| {
        let sim = Simulation::with_config(SimConfig {
            shuffle_ties: false,
            ..SimConfig::new(seed)
        });
        let members = disks(&sim, 3, MILLIS);
        let stripe = layer(&sim, "stripe", &members, &[]);
        let mut workload = Sequential {
            op: Op::Read,
            next: 0,
            len: 4096,
            left: 300,
        };
        let mut output = driver::run(&sim, stripe, &mut workload, &members, &closed(6));
        output.seed = 0;
        serde_json::to_string(&output).unwrap()
    };
    assert_eq!(run(1), run(2));
}

#[test]
fn flush_waits_for_the_writes_before_it_only() {
    let sim = Simulation::new(5);
    let disk = disks(&sim, 1, MILLIS).remove(0);
    let runtime = sim.handle();
    let times = sim.block_on(async {
        let early = disk.write(0, pattern(1, 0, 4096), WriteFlags::default());
        let flush = async {
            disk.flush().await.unwrap();
            runtime.now_nanos()
        };
        let (_, flushed) = futures_util::future::join(early, flush).await;
        let idle_flush_start = runtime.now_nanos();
        disk.flush().await.unwrap();
        (flushed, runtime.now_nanos() - idle_flush_start)
    });
    assert_eq!(times, (MILLIS, 0));
    assert_eq!(disk.stats().flushes, 2);
}

#[test]
fn addresses_hundreds_of_gigabytes_apart_allocate_only_what_is_touched() {
    const HUGE: u64 = 500 << 30;
    let sim = Simulation::new(6);
    let stored = SimDisk::new(
        &sim,
        "stored",
        FixedLatency::new(HUGE, MILLIS),
        DataMode::Stored,
    );
    let timing = SimDisk::new(
        &sim,
        "timing",
        FixedLatency::new(HUGE, MILLIS),
        DataMode::TimingOnly,
    );
    for disk in [&stored, &timing] {
        sim.block_on(async {
            for offset in [0, 200 << 30, HUGE - 8192] {
                disk.write(offset, pattern(2, offset, 8192), WriteFlags::default())
                    .await
                    .unwrap();
            }
        });
    }
    assert_eq!(stored.stored_pages(), 6);
    assert_eq!(timing.stored_pages(), 0);
    let far = 200 << 30;
    let back = sim.block_on(stored.read(far, 8192)).unwrap();
    assert_eq!(&back[..], &pattern(2, far, 8192)[..]);
    let zeros = sim.block_on(timing.read(far, 8192)).unwrap();
    assert!(zeros.iter().all(|&b| b == 0));
    assert_eq!(timing.stats().read_bytes, 8192);
    // Zeroing gives the pages back.
    sim.block_on(stored.write_zeroes(far, 8192, Default::default()))
        .unwrap();
    assert_eq!(stored.stored_pages(), 4);
    assert!(sim.block_on(stored.read(HUGE, 512)).is_err());
}

#[test]
#[should_panic(expected = "simulation deadlock")]
fn a_future_nothing_can_wake_is_reported_as_a_deadlock() {
    let sim = Simulation::new(7);
    let disk = disks(&sim, 1, MILLIS).remove(0);
    sim.block_on(async {
        disk.write(0, pattern(1, 0, 4096), WriteFlags::default())
            .await
            .unwrap();
        // Waits for a lock that the same task holds: nothing can ever release it.
        let lock = Arc::new(futures_util::lock::Mutex::new(()));
        let _held = lock.lock().await;
        let _again = lock.lock().await;
    });
}

#[test]
#[should_panic(expected = "virtual time limit")]
fn a_run_kept_alive_only_by_background_timers_hits_the_time_limit() {
    let sim = Simulation::with_config(SimConfig {
        time_limit: Some(3600 * SECONDS),
        ..SimConfig::new(8)
    });
    let runtime = sim.runtime();
    sim.spawn(async move {
        loop {
            runtime.sleep(Duration::from_secs(5)).await;
        }
    });
    sim.block_on(std::future::pending::<()>());
}

/// Simulated requests per wall second: `cargo test --release -p strata-sim --test suite
/// -- runtime:: --ignored --nocapture`.
#[test]
#[ignore]
fn measure_simulated_requests_per_wall_second() {
    for (label, members, queue_depth) in [
        ("1 disk, QD 1", 1, 1),
        ("1 disk, QD 32", 1, 32),
        ("stripe of 3, QD 32", 3, 32),
    ] {
        let sim = Simulation::new(1);
        let disks: Vec<Arc<SimDisk>> = (0..members)
            .map(|i| {
                SimDisk::new(
                    &sim,
                    format!("d{i}"),
                    FixedLatency::new(1 << 40, 100 * MICROS),
                    DataMode::TimingOnly,
                )
            })
            .collect();
        let top: DeviceRef = if members == 1 {
            disks[0].clone()
        } else {
            layer(&sim, "stripe", &disks, &[])
        };
        let mut workload = Uniform {
            rng: sim.rng("workload"),
            span: 1 << 40,
            left: 1_000_000,
        };
        let wall = Instant::now();
        let output = driver::run(
            &sim,
            top,
            &mut workload,
            &disks,
            &DriverConfig {
                queue_depth,
                sample_interval: Some(SECONDS),
                verify_data: false,
                outstanding_limit: None,
            },
        );
        let seconds = wall.elapsed().as_secs_f64();
        let disk_requests: u64 = output
            .disks
            .iter()
            .map(|d| d.stats.reads + d.stats.writes)
            .sum();
        println!(
            "{label}: {disk_requests} disk requests, {:.1} s simulated, in {seconds:.3} s wall: \
             {:.0} requests per wall second",
            output.end as f64 / SECONDS as f64,
            disk_requests as f64 / seconds
        );
    }
}
