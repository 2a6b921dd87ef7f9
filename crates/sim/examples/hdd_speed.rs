//! How many simulated disk requests the HDD model serves per second of wall time.
//!
//! A closed loop keeps `outstanding` random 4 KiB reads at a Cheetah 15K.5 preset (drive
//! queue depth 8, SPTF, and FIFO for comparison); each completion issues the next request.
//!
//! `cargo run --release -p strata-sim --example hdd_speed [requests] [outstanding] [drive depth]`
//! `cargo run --release -p strata-sim --example hdd_speed validate` prints the validation
//! table instead, and `survey` the strand costs behind docs/simulator.md.

use std::time::Instant;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_sim::hdd::{presets, Hdd, Scheduler};
use strata_sim::model::{Completion, DeviceModel, Op, Request};
use strata_sim::validate;

const IO_BYTES: u64 = 4096;

struct Outcome {
    wall_seconds: f64,
    simulated_seconds: f64,
    requests: u64,
}

fn run(scheduler: Scheduler, requests: u64, outstanding: u64, drive_depth: usize) -> Outcome {
    let mut params = presets::cheetah_15k5();
    params.scheduler = scheduler;
    params.queue_depth = drive_depth;
    let mut drive = Hdd::with_seed(params, 7);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let blocks = drive.capacity() / IO_BYTES;
    let mut next_id = 0u64;
    let mut issue = |drive: &mut Hdd, now| {
        let offset = rng.random_range(0..blocks) * IO_BYTES;
        drive.submit(
            now,
            Request {
                id: next_id,
                op: Op::Read,
                offset,
                len: IO_BYTES,
            },
        );
        next_id += 1;
    };
    let started = Instant::now();
    for _ in 0..outstanding {
        issue(&mut drive, 0);
    }
    let mut done: Vec<Completion> = Vec::with_capacity(outstanding as usize);
    let (mut completed, mut now) = (0u64, 0);
    while completed < requests {
        now = drive.next_completion().expect("requests are outstanding");
        done.clear();
        drive.advance(now, &mut done);
        completed += done.len() as u64;
        for _ in 0..done.len() {
            issue(&mut drive, now);
        }
    }
    Outcome {
        wall_seconds: started.elapsed().as_secs_f64(),
        simulated_seconds: now as f64 / 1e9,
        requests: completed,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("validate") {
        print!("{}", validate::format_table(&validate::validate_disk()));
        return;
    }
    if args.first().map(String::as_str) == Some("survey") {
        for (label, op) in validate::strand_survey(&presets::cheetah_15k5()) {
            println!("{label:<40} {op:.3} OP/request");
        }
        return;
    }
    let requests = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000_000);
    let outstanding = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(8);
    let drive_depth = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(8);
    for scheduler in [Scheduler::Sptf, Scheduler::Fifo] {
        let o = run(scheduler, requests, outstanding, drive_depth);
        println!(
            "{scheduler:?}: {} requests, {outstanding} outstanding, drive depth {drive_depth}: \
             {:.0} requests/s wall, \
             {:.1} s simulated ({:.0} IOPS simulated) in {:.2} s wall",
            o.requests,
            o.requests as f64 / o.wall_seconds,
            o.simulated_seconds,
            o.requests as f64 / o.simulated_seconds,
            o.wall_seconds,
        );
    }
}
