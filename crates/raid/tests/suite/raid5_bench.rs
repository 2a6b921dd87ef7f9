//! raid5 full-stripe write scaling with the file backend taken out of the picture.
//!
//! `bench/layers.sh` puts file disks behind `delay` (100 MiB/s each) and measures raid5
//! full-stripe writes against one member. This test builds the same shape from memory
//! devices behind the same `delay` layer, so that only the array's own costs remain (the
//! stripe journal's intents included; their FUA is free on memory). It separates "the
//! raid5 data path serializes" from "the member backend is slow at what raid5 asks of it".
//! Wall-clock timing, so not part of the default run:
//! `cargo test --release -p strata-raid --test suite -- raid5_bench:: --ignored --nocapture`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_backend::MemoryDevice;
use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, DeviceRef, TokioRuntime, WriteFlags};
use strata_raid::raid5::{Raid5, Settings};
use strata_stateless::delay::{Delay, DelayConfig};

const MEMBER_BW: u64 = 100 << 20;
const CHUNK: u64 = 64 << 10;
const QD: usize = 8;
const SECONDS: u64 = 3;

fn limited(size: u64) -> DeviceRef {
    let config = DelayConfig {
        bandwidth: Some(MEMBER_BW),
        ..Default::default()
    };
    let child = Arc::new(MemoryDevice::new(size));
    Arc::new(Delay::new(
        "lim".into(),
        child,
        config,
        TokioRuntime::current(),
    ))
}

/// Runs `QD` workers writing `bs` bytes for `SECONDS`; worker `w` takes each write's offset
/// and fill byte from `offsets(w)`. Returns the writes done and the seconds they took.
async fn writes_for<G>(device: DeviceRef, bs: u64, offsets: impl Fn(u64) -> G) -> (u64, f64)
where
    G: FnMut() -> (u64, u8) + Send + 'static,
{
    let start = Instant::now();
    let workers = (0..QD as u64).map(|w| {
        let device = device.clone();
        let mut next = offsets(w);
        tokio::spawn(async move {
            let mut done = 0u64;
            while start.elapsed() < Duration::from_secs(SECONDS) {
                let (offset, fill) = next();
                device
                    .write(
                        offset,
                        vec![fill; bs as usize].into(),
                        WriteFlags::default(),
                    )
                    .await
                    .unwrap();
                done += 1;
            }
            done
        })
    });
    let mut writes = 0;
    for worker in workers.collect::<Vec<_>>() {
        writes += worker.await.unwrap();
    }
    (writes, start.elapsed().as_secs_f64())
}

/// MiB/s of sequential `bs` writes at queue depth `QD` for `SECONDS`.
async fn write_rate(device: DeviceRef, bs: u64) -> f64 {
    let next = Arc::new(AtomicU64::new(0));
    let slots = device.geometry().size / bs;
    let (writes, seconds) = writes_for(device, bs, |_| {
        let next = next.clone();
        move || {
            let i = next.fetch_add(1, Ordering::Relaxed);
            (i % slots * bs, i as u8)
        }
    })
    .await;
    (writes * bs) as f64 / seconds / (1u64 << 20) as f64
}

/// raid5 over four bandwidth-limited members, with the default (in-member) journal.
async fn raid5_over_four_limited() -> DeviceRef {
    let children = (0..4).map(|_| Some(limited(1 << 30))).collect();
    let settings = Settings {
        chunk: Some(CHUNK),
        journal: None,
        journal_device: None,
        unsafe_skip_journal: false,
        start: StartPolicy::FRESH,
    };
    let raid = Raid5::open("r5".into(), children, settings, TokioRuntime::current())
        .await
        .unwrap();
    Arc::new(raid)
}

/// Runs a wall-clock benchmark on two worker threads.
fn on_two_threads(bench: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench);
}

#[test]
#[ignore = "wall-clock benchmark"]
fn full_stripe_writes_scale_over_bandwidth_limited_members() {
    on_two_threads(async {
        let stripe = 3 * CHUNK;
        let one = write_rate(limited(1 << 30), stripe).await;
        let raid = write_rate(raid5_over_four_limited().await, stripe).await;
        let ratio = raid / one;
        eprintln!("one member {one:.0} MiB/s, raid5 over 4 {raid:.0} MiB/s: {ratio:.2}x");
        assert!(ratio >= 2.7, "full-stripe writes scale {ratio:.2}x < 2.7x");
    });
}

/// IOPS of 4 KiB writes at random aligned offsets, queue depth `QD`, for `SECONDS`.
async fn random_write_iops(device: DeviceRef) -> f64 {
    let slots = device.geometry().size / 4096;
    let (writes, seconds) = writes_for(device, 4096, |w| {
        // A fixed LCG per worker: the same offsets on every run, no rand dependency.
        let mut x = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 17) % slots * 4096, x as u8)
        }
    })
    .await;
    writes as f64 / seconds
}

/// Small writes are where the stripe journal costs most (every one logs data and parity):
/// this measures them over the same members, to compare journal formats. It prints IOPS and
/// fails only if the array cannot sustain a tenth of what one member does alone, which
/// would mean the journal serializes small writes entirely.
#[test]
#[ignore = "wall-clock benchmark"]
fn small_random_writes_over_bandwidth_limited_members() {
    on_two_threads(async {
        let one = random_write_iops(limited(1 << 30)).await;
        let raid = random_write_iops(raid5_over_four_limited().await).await;
        eprintln!(
            "4 KiB random writes QD{QD}: one member {one:.0} IOPS, raid5 over 4 {raid:.0} IOPS"
        );
        assert!(
            raid >= one / 10.0,
            "small writes {raid:.0} IOPS < a tenth of one member"
        );
    });
}

/// A member whose flushes take `delay` (a disk writing back its cache; page-cache members
/// writing back dirty pages), counting them.
struct SlowFlush {
    delay: Duration,
    flushes: AtomicU64,
}

#[strata_core::async_trait]
impl strata_crash::testkit::Interceptor for SlowFlush {
    async fn before(&self, request: strata_crash::testkit::Request) -> strata_core::Result<()> {
        if request == strata_crash::testkit::Request::Flush {
            self.flushes.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.delay).await;
        }
        Ok(())
    }
}

/// What a run of sustained writes saw: MiB/s, member flushes, and the writes that waited at
/// least `stall` (and how long they waited in all).
struct Stalls {
    rate: f64,
    flushes: u64,
    stalled: u64,
    stalled_s: f64,
}

/// Sequential full-stripe writes (no client flush) at queue depth `QD` for `SECONDS` over four
/// bandwidth-limited members whose flushes take `flush_ms`, with a 1 MiB journal per member
/// (one lane of 127 blocks per copy: a journal fills with intents every ~500 full-stripe
/// writes).
async fn full_stripes_with_slow_flush(flush_ms: u64) -> Stalls {
    let members: Vec<_> = (0..4)
        .map(|_| {
            strata_crash::testkit::Intercepted::new(
                limited(1 << 30),
                SlowFlush {
                    delay: Duration::from_millis(flush_ms),
                    flushes: AtomicU64::new(0),
                },
            )
        })
        .collect();
    let raid: DeviceRef = Arc::new(crate::common::fresh_raid5(&members, CHUNK, 1 << 20).await);
    let flushes = || -> u64 {
        members
            .iter()
            .map(|m| m.flushes.load(Ordering::Relaxed))
            .sum()
    };
    let before = flushes();
    let (bs, stall) = (3 * CHUNK, Duration::from_millis(40));
    let slots = raid.geometry().size / bs;
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let workers = (0..QD).map(|_| {
        let (raid, next) = (raid.clone(), next.clone());
        tokio::spawn(async move {
            let (mut done, mut stalled, mut stalled_s) = (0u64, 0u64, 0f64);
            while start.elapsed() < Duration::from_secs(SECONDS) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let began = Instant::now();
                raid.write(
                    i % slots * bs,
                    vec![i as u8; bs as usize].into(),
                    WriteFlags::default(),
                )
                .await
                .unwrap();
                if began.elapsed() >= stall {
                    stalled += 1;
                    stalled_s += began.elapsed().as_secs_f64();
                }
                done += 1;
            }
            (done, stalled, stalled_s)
        })
    });
    let mut out = Stalls {
        rate: 0.0,
        flushes: 0,
        stalled: 0,
        stalled_s: 0.0,
    };
    let mut writes = 0;
    for worker in workers.collect::<Vec<_>>() {
        let (done, stalled, stalled_s) = worker.await.unwrap();
        writes += done;
        out.stalled += stalled;
        out.stalled_s += stalled_s;
    }
    out.rate = (writes * bs) as f64 / start.elapsed().as_secs_f64() / (1u64 << 20) as f64;
    out.flushes = flushes() - before;
    out
}

/// Time lost to making journal space: the same sustained full-stripe writes with member
/// flushes that take 0, 50 and 100 ms. A journal that stops the writes while it flushes the
/// members makes every write in flight wait for the flush at every reset; one reclaimed in
/// the background does not (as long as half a journal outlasts a flush: here ~250
/// full-stripe writes, ~190 ms). Writes that take 40 ms or more (a full-stripe write takes
/// ~2 ms here) are counted as stalled; fails if the stalls of the runs with slow flushes add
/// up to a second or more (on a loaded machine a few writes stall without any flush).
#[test]
#[ignore = "wall-clock benchmark"]
fn full_stripe_writes_do_not_stall_on_slow_member_flushes() {
    on_two_threads(async {
        let mut stalled_s = 0.0;
        for flush_ms in [0, 50, 100] {
            let run = full_stripes_with_slow_flush(flush_ms).await;
            eprintln!(
                "full stripes QD{QD}, 1 MiB journals, member flush {flush_ms} ms: {:.0} MiB/s, \
                 {} member flushes, {} writes waited >= 40 ms ({:.2} s in all)",
                run.rate, run.flushes, run.stalled, run.stalled_s
            );
            if flush_ms > 0 {
                stalled_s += run.stalled_s;
            }
        }
        assert!(
            stalled_s < 1.0,
            "writes waited {stalled_s:.2} s for member flushes"
        );
    });
}
