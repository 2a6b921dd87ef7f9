//! The flat-device scenario: a bare disk and a correct two-disk layer pass it, and layers
//! with planted bugs are caught with a seed that replays.

use std::collections::BTreeMap;
use std::future::{ready, Ready};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, Capabilities, Control, ControlReply, DeviceRef, Extent, Geometry,
    Result, WriteFlags, ZeroFlags,
};
use strata_crash::testkit::{block_on, panic_report};
use strata_crash::{
    flat_device_scenario, open_disks, sector_disk, CrashGroup, CrashPlan, CrashRun, DiskImage,
    ScenarioConfig, DEFAULT_BASE_SEED,
};

type Opened = Ready<Result<DeviceRef>>;

/// `open` for a stack that is the disk itself.
fn bare(geometry: Geometry) -> impl FnMut(&CrashGroup, Option<Vec<DiskImage>>) -> Opened {
    move |group, images| {
        let disk = open_disks(group, &[geometry], images).remove(0);
        ready(Ok(Arc::new(disk) as DeviceRef))
    }
}

fn run(name: &'static str, iterations: u64) -> CrashRun {
    CrashRun {
        name,
        replay: "cargo test -p strata-crash --test suite -- scenario::",
        default_iterations: iterations,
    }
}

#[test]
fn a_bare_disk_survives_ten_thousand_crashes() {
    let mut config = ScenarioConfig::new(vec![sector_disk(256 << 10)]);
    config.rounds = 5;
    config.discard_zeroes = true;
    let geometry = config.disks[0];
    let summary = run("bare disk", 2000)
        .run_async(|seed| flat_device_scenario(seed, &config, bare(geometry)));
    assert_eq!(summary.crash_points, summary.iterations * 5);
}

#[test]
fn a_bare_disk_with_4k_sectors_and_concurrent_writes_survives() {
    let geometry = Geometry {
        min_io: 4096,
        logical_block: 4096,
        ..sector_disk(1 << 20)
    };
    let mut config = ScenarioConfig::new(vec![geometry]);
    config.concurrency = 4;
    config.discard_zeroes = true;
    // `open` as an async block, the way a layer that awaits while opening writes it.
    let summary = run("bare 4k disk, concurrent", 400).run_async(|seed| {
        flat_device_scenario(seed, &config, |group, images| {
            let disk = open_disks(group, &[geometry], images).remove(0);
            async move {
                tokio::task::yield_now().await;
                Ok(Arc::new(disk) as DeviceRef)
            }
        })
    });
    assert_eq!(summary.crash_points, summary.iterations * 3);
}

/// A correct layer over two disks: the first half of the device on one, the rest on the other.
struct Concat {
    disks: Vec<DeviceRef>,
    half: u64,
    /// Planted bug: flush only the first disk.
    flush_one: bool,
}

impl Concat {
    /// The parts of `[offset, offset + len)` on each disk: (disk, offset there, offset in request).
    fn split(&self, offset: u64, len: u64) -> Vec<(usize, u64, u64, u64)> {
        let mut parts = Vec::new();
        if offset < self.half {
            parts.push((0, offset, 0, len.min(self.half - offset)));
        }
        let end = offset + len;
        if end > self.half {
            let start = offset.max(self.half);
            parts.push((1, start - self.half, start - offset, end - start));
        }
        parts
    }
}

#[async_trait]
impl BlockDevice for Concat {
    fn geometry(&self) -> Geometry {
        sector_disk(2 * self.half)
    }

    fn capabilities(&self) -> Capabilities {
        self.disks[0].capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry().check_range(offset, len as u64)?;
        let mut out = BytesMut::with_capacity(len);
        for (disk, at, _, part) in self.split(offset, len as u64) {
            out.extend_from_slice(&self.disks[disk].read(at, part as usize).await?);
        }
        Ok(out)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.geometry().check_range(offset, data.len() as u64)?;
        for (disk, at, from, part) in self.split(offset, data.len() as u64) {
            let piece = data.slice(from as usize..(from + part) as usize);
            self.disks[disk].write(at, piece, flags).await?;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let count = if self.flush_one { 1 } else { 2 };
        for disk in &self.disks[..count] {
            disk.flush().await?;
        }
        Ok(())
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        for (disk, at, _, part) in self.split(offset, len) {
            self.disks[disk].discard(at, part).await?;
        }
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        for (disk, at, _, part) in self.split(offset, len) {
            self.disks[disk].write_zeroes(at, part, flags).await?;
        }
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.disks[0].block_status(offset, len).await
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        self.disks[0].control(request).await
    }
}

fn concat(
    config: &ScenarioConfig,
    flush_one: bool,
) -> impl FnMut(&CrashGroup, Option<Vec<DiskImage>>) -> Opened + '_ {
    move |group, images| {
        let disks = open_disks(group, &config.disks, images);
        let disks = disks
            .into_iter()
            .map(|d| Arc::new(d) as DeviceRef)
            .collect();
        let half = config.disks[0].size;
        ready(Ok(Arc::new(Concat {
            disks,
            half,
            flush_one,
        }) as DeviceRef))
    }
}

fn two_disks() -> ScenarioConfig {
    let mut config = ScenarioConfig::new(vec![sector_disk(256 << 10); 2]);
    config.discard_zeroes = true;
    config.concurrency = 3;
    config
}

#[test]
fn a_correct_layer_over_two_disks_survives() {
    let config = two_disks();
    let summary = run("concat", 400)
        .run_async(|seed| flat_device_scenario(seed, &config, concat(&config, false)));
    assert_eq!(summary.crash_points, 400 * 3);
}

/// The bugs a layer can plant over one disk.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// Acknowledges FLUSH without flushing the disk.
    IgnoreFlush,
    /// Drops the FUA flag on the way down.
    DropFua,
    /// Writes one sector below where it was asked to (at offset 0, where asked).
    ShiftWrites,
    /// Caches sectors it read and never invalidates them on write.
    StaleReads,
}

struct Buggy {
    disk: DeviceRef,
    bug: Bug,
    cache: Mutex<BTreeMap<u64, Bytes>>,
}

#[async_trait]
impl strata_core::Filter for Buggy {
    fn next(&self) -> &DeviceRef {
        &self.disk
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        let mut fresh = self.disk.read(offset, len).await?;
        if self.bug == Bug::StaleReads {
            let mut cache = self.cache.lock().unwrap();
            for (i, sector) in fresh.chunks_mut(512).enumerate() {
                let at = offset + 512 * i as u64;
                let cached = cache
                    .entry(at)
                    .or_insert_with(|| Bytes::copy_from_slice(sector));
                sector.copy_from_slice(cached);
            }
        }
        Ok(fresh)
    }
    async fn write(&self, offset: u64, data: Bytes, mut flags: WriteFlags) -> Result<()> {
        let mut offset = offset;
        match self.bug {
            Bug::DropFua => flags.fua = false,
            Bug::ShiftWrites => offset = offset.saturating_sub(512),
            _ => {}
        }
        self.disk.write(offset, data, flags).await
    }
    async fn flush(&self) -> Result<()> {
        if self.bug == Bug::IgnoreFlush {
            return Ok(());
        }
        self.disk.flush().await
    }
    async fn write_zeroes(&self, offset: u64, len: u64, mut flags: ZeroFlags) -> Result<()> {
        if self.bug == Bug::DropFua {
            flags.fua = false;
        }
        self.disk.write_zeroes(offset, len, flags).await
    }
}

fn buggy(
    geometry: Geometry,
    bug: Bug,
) -> impl FnMut(&CrashGroup, Option<Vec<DiskImage>>) -> Opened {
    move |group, images| {
        let disk = Arc::new(open_disks(group, &[geometry], images).remove(0));
        ready(Ok(Arc::new(Buggy {
            disk,
            bug,
            cache: Mutex::new(BTreeMap::new()),
        }) as DeviceRef))
    }
}

/// Runs up to `seeds` seeds of a scenario that must fail; returns the report after checking
/// that it names a seed which, replayed alone, fails again.
fn caught<F>(seeds: u64, mut scenario: F) -> String
where
    F: FnMut(u64) -> std::result::Result<strata_crash::CrashStats, String>,
{
    let plan = CrashPlan {
        first: DEFAULT_BASE_SEED,
        count: seeds,
    };
    let report = panic_report(
        || run("planted bug", seeds).run_plan(plan, &mut scenario),
        "the planted bug must be caught",
    );
    let replay = report
        .split("replay: STRATA_CRASH_SEED=")
        .nth(1)
        .unwrap_or_else(|| panic!("no replay line in: {report}"));
    assert!(replay.starts_with(|c: char| c.is_ascii_digit()), "{report}");
    let seed: u64 = replay.split(' ').next().unwrap().parse().unwrap();
    assert!(
        scenario(seed).is_err(),
        "seed {seed} must fail again on replay"
    );
    report
}

fn one_disk() -> ScenarioConfig {
    ScenarioConfig::new(vec![sector_disk(256 << 10)])
}

/// The report of the first of `seeds` seeds that catches `bug` planted over one disk.
fn caught_over_one_disk(seeds: u64, bug: Bug) -> String {
    let config = one_disk();
    let g = config.disks[0];
    caught(seeds, |seed| {
        block_on(flat_device_scenario(seed, &config, buggy(g, bug)))
    })
}

#[test]
fn a_layer_that_ignores_flush_is_caught() {
    let report = caught_over_one_disk(200, Bug::IgnoreFlush);
    assert!(
        report.contains("wrong data after the crash and reopen"),
        "{report}"
    );
    assert!(report.contains("durable"), "{report}");
}

#[test]
fn a_layer_that_drops_fua_is_caught() {
    let report = caught_over_one_disk(200, Bug::DropFua);
    assert!(report.contains("completed with FUA, durable"), "{report}");
}

#[test]
fn a_layer_that_writes_to_the_wrong_offset_is_caught() {
    let report = caught_over_one_disk(50, Bug::ShiftWrites);
    assert!(report.contains("(misplaced)"), "{report}");
}

#[test]
fn a_layer_that_returns_stale_data_is_caught() {
    let report = caught_over_one_disk(50, Bug::StaleReads);
    assert!(report.contains("a read returned wrong data"), "{report}");
    assert!(
        report.contains("superseded (stale if read now)"),
        "{report}"
    );
}

#[test]
fn a_layer_that_flushes_one_of_two_disks_is_caught() {
    let config = two_disks();
    let report = caught(200, |seed| {
        block_on(flat_device_scenario(seed, &config, concat(&config, true)))
    });
    assert!(
        report.contains("wrong data after the crash and reopen"),
        "{report}"
    );
}
