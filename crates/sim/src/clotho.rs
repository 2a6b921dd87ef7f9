//! Clotho's evaluation (Flouris & Bilas, §3.4; `shared/papers/clotho-violin.md` §1.11)
//! reproduced in shape on Strata's thin pool with versions, over the calibrated Cheetah
//! 15K.5 model, in virtual time (`strata sim clotho`, docs/versions-sim.md).
//!
//! Three parts, each a set of runs of the same seeded workload on freshly built stacks (one
//! [`Simulation`] per run, built through the stack registry from `[[layer]]` text):
//!
//! - **(a) random reads** (the paper: Bonnie++'s random seek + read over a 2 GB file on ext2,
//!   overhead at most 7.5 % of the plain disk): 4 KiB reads at random block addresses of a
//!   file-sized region, at queue depth 3 (Bonnie++'s three seeker processes), on the bare
//!   partition, on a thin volume without versions (the paper's configuration: "latest version
//!   only"), and on a thin volume whose region was written, then snapshotted and partly
//!   overwritten several times so that its extents have chains.
//! - **(b) random overwrites with periodic versions** (the paper: SPEC SFS 3.0 with a version
//!   every 5 and every 10 minutes; "more frequent versions mean higher performance"): closed
//!   loop random 4 KiB overwrites of the written region for a fixed virtual duration, with a
//!   snapshot taken through the pool's `snapshot-create` verb every period.
//! - **(c) reads of a compacted version** (the paper: 2,000 random reads of a version after
//!   differential compaction; at 100 % compaction 2 disk accesses per read, about half the
//!   throughput of 0 %): a region written with incompressible data (v1), a snapshot, a share
//!   of its extents overwritten whole with the same bytes but a few per 4 KiB (v2), a
//!   snapshot, v1 compacted against v2 through the pool's `snapshot-compact` verb, then
//!   random 4 KiB reads of v1 through its snapshot device at queue depth 1. Only extents v2
//!   superseded can be compacted, so the share overwritten sets the share compacted. The
//!   disks store data here ([`DataMode::Stored`]): compaction encodes real bytes.
//!
//! Sizes and times scale together ([`ClothoConfig::scaled`]): dividing the region, the
//! partition, the run and the version periods by the same factor keeps the writes per
//! extent per version at a given write rate, which is what decides how many overwrites
//! after a snapshot go to new extents ([`expected_new_extent_share`]). Seeks get shorter as
//! the region shrinks, so the rates, and the costs of spreading data, do change with scale.

use std::path::Path;

use futures_util::future::join;
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_core::{Control, ControlReply, DeviceRef, WriteFlags};

use crate::disk::DataMode;
use crate::driver::{self, DriverConfig, RunOutput};
use crate::executor::{splitmix64, SimConfig, SimRuntime, Simulation};
use crate::model::{Io, Nanos, Workload, MILLIS, SECONDS};
use crate::results;
use crate::stack::{Stack, StackSpec};
use crate::workload::{AddressDist, ClosedLoop, Limited, Pattern, WeightedSize};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const MINUTE: Nanos = 60 * SECONDS;
/// Clotho's block (and the thin pool's granule): what a random read or overwrite moves.
const BLOCK: u64 = 4 * KIB;

/// What a run's stack is: the bare partition, or a thin pool on it in one of its two
/// snapshot-write modes (`snapshot-write = "remap" | "copy"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// The partition itself ("Disk" in the paper's figures).
    Disk,
    /// A thin volume, remap-on-write: the first write into an extent a version shares
    /// writes only its own 4 KiB granules, to a new extent (Clotho's way; the default).
    Remap,
    /// A thin volume, copy-on-write: that first write copies the whole extent to a new one
    /// (dm-thin's way; for comparison).
    Copy,
}

/// What a run is made of. [`ClothoConfig::paper`] has the paper's sizes where it gives them
/// and says where it does not.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClothoConfig {
    pub seed: u64,
    /// 1: the paper's sizes; N: sizes and times divided by N ([`ClothoConfig::scaled`]).
    pub scale: u64,
    /// The disk model preset (the calibrated one; the paper's IBM DTLA-307045 has none).
    pub model: String,
    /// The partition every run uses (the paper: 21 GB), a `slice` at the disk's start.
    pub partition_bytes: u64,
    /// The thin pool's allocation unit (Strata's smallest, 64 KiB; the paper: 4 KB).
    pub extent_bytes: u64,
    /// The region read and written (the paper's Bonnie++ file: 2 GB).
    pub file_bytes: u64,
    /// (a): random reads measured per configuration.
    pub read_ios: u64,
    /// (a): reads outstanding (Bonnie++ 1.02 runs three seeker processes).
    pub read_queue_depth: usize,
    /// (a): snapshots taken before the reads, each followed by an overwrite.
    pub read_versions: u32,
    /// (a): share of the region's 4 KiB blocks overwritten (random, with repeats) after
    /// each snapshot; the configurations without versions overwrite as much, in place.
    pub overwrite_share: f64,
    /// (b): how long the overwrite workload runs, in virtual time.
    pub write_duration: Nanos,
    /// (b): version periods to compare with no versions (the paper: 10 and 5 minutes).
    pub version_periods: Vec<Nanos>,
    /// (b): overwrites outstanding (an NFS server's daemons; SPEC SFS drives many clients).
    pub write_queue_depth: usize,
    /// (c): the region written, versioned and compacted (the paper: "large files", no size).
    pub compacted_file_bytes: u64,
    /// (c): random 4 KiB reads of the compacted version (the paper: 2,000).
    pub compacted_read_ios: u64,
    /// (c): reads outstanding (the paper's micro-benchmark: one process, assumed).
    pub compacted_queue_depth: usize,
    /// (c): shares of the region's extents superseded before the second version, each
    /// compacted (the paper plots 0 % to 100 % compaction).
    pub compacted_shares: Vec<f64>,
    /// (c): bytes that differ between the two versions in each 4 KiB block of a superseded
    /// extent (the "controlled similarity").
    pub changed_bytes_per_block: usize,
}

impl ClothoConfig {
    /// The paper's sizes: a 21 GiB partition, a 2 GiB region, versions every 10 and 5
    /// minutes. The run is 40 virtual minutes, not the paper's 3 hours: with 64 KiB extents
    /// the first overwrite of each extent after a version takes a new extent, so at a few
    /// overwrites per extent per version each version pins nearly a whole copy of the region
    /// (40 minutes at one every 5 minutes allocate about 16 of the 21 GiB; 3 hours would
    /// need about 70). Clotho's 4 KB extents pin only the blocks overwritten.
    pub fn paper(seed: u64) -> Self {
        ClothoConfig {
            seed,
            scale: 1,
            model: "cheetah-15k5-300g".into(),
            partition_bytes: 21 * GIB,
            extent_bytes: 64 * KIB,
            file_bytes: 2 * GIB,
            read_ios: 8_000,
            read_queue_depth: 3,
            read_versions: 3,
            overwrite_share: 0.1,
            write_duration: 40 * MINUTE,
            version_periods: vec![10 * MINUTE, 5 * MINUTE],
            write_queue_depth: 8,
            compacted_file_bytes: 512 * MIB,
            compacted_read_ios: 2_000,
            compacted_queue_depth: 1,
            compacted_shares: vec![0.0, 0.5, 1.0],
            changed_bytes_per_block: 16,
        }
    }

    /// The paper's configuration with the partition, the region, the run and the version
    /// periods divided by `scale`: at the same write rate the writes per extent per version
    /// stay the same. (c)'s region is divided too. The number of reads, queue depths and
    /// shares do not change.
    pub fn scaled(seed: u64, scale: u64) -> Self {
        let scale = scale.max(1);
        let paper = Self::paper(seed);
        let size = |bytes: u64| (bytes / scale).next_multiple_of(paper.extent_bytes);
        ClothoConfig {
            scale,
            partition_bytes: size(paper.partition_bytes),
            file_bytes: size(paper.file_bytes),
            compacted_file_bytes: size(paper.compacted_file_bytes),
            write_duration: paper.write_duration / scale,
            version_periods: paper.version_periods.iter().map(|p| p / scale).collect(),
            ..paper
        }
    }
}

/// The times, from a run's start, at which a version is taken every `period` during a run
/// of `duration`: every whole period strictly inside the run (none at its start, none at
/// its end).
pub fn version_times(duration: Nanos, period: Nanos) -> Vec<Nanos> {
    if period == 0 {
        return Vec::new();
    }
    (1..)
        .map(|k| k * period)
        .take_while(|&at| at < duration)
        .collect()
}

/// How much slower `measured` is than `baseline`, both in I/Os per second, in percent of
/// the baseline (negative: faster). The paper's "overhead of at most 7.5 % of the regular
/// disk" is this with the disk as the baseline.
pub fn overhead_percent(baseline_iops: f64, measured_iops: f64) -> f64 {
    100.0 * (baseline_iops - measured_iops) / baseline_iops
}

/// What a run did, from the driver's records and the disk's counters.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Measured {
    pub ios: u64,
    pub failed: u64,
    pub iops: f64,
    pub mean_ms: f64,
    pub p99_ms: f64,
    /// Requests the disk served per I/O of the run (reads and writes, metadata included).
    pub disk_ios_per_io: f64,
    /// Reads the disk served per I/O of the run.
    pub disk_reads_per_io: f64,
}

impl Measured {
    pub fn of(output: &RunOutput) -> Measured {
        let summary = results::summarize(&output.records);
        let all = &summary.latency[0].summary;
        let ios = summary.throughput.ios.max(1) as f64;
        let (reads, writes) = output.disks.iter().fold((0, 0), |(r, w), disk| {
            (r + disk.stats.reads, w + disk.stats.writes)
        });
        Measured {
            ios: summary.throughput.ios,
            failed: summary.failed,
            iops: summary.throughput.iops,
            mean_ms: all.mean_ns / MILLIS as f64,
            p99_ms: all.p99_ns as f64 / MILLIS as f64,
            disk_ios_per_io: (reads + writes) as f64 / ios,
            disk_reads_per_io: reads as f64 / ios,
        }
    }
}

/// One configuration of part (a).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReadRun {
    pub configuration: String,
    pub layout: Layout,
    /// Versions taken before the reads (each followed by an overwrite).
    pub versions: u32,
    pub reads: Measured,
    /// Bytes of the partition allocated to the volume and its versions (0 on the bare disk).
    pub allocated_bytes: u64,
    /// Overhead against the bare disk, in percent ([`overhead_percent`]).
    pub overhead_percent: f64,
}

/// One configuration of part (b).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WriteRun {
    pub configuration: String,
    pub layout: Layout,
    /// Version period; None: no versions.
    pub period_ns: Option<Nanos>,
    pub versions_taken: u32,
    pub writes: Measured,
    pub allocated_bytes: u64,
    /// Share of the overwrites that went to a newly allocated extent: the first write into
    /// an extent after a version ([`new_extent_share`]).
    pub new_extent_share: f64,
    /// What [`new_extent_share`] should be if exactly the first write into each extent after
    /// a version goes to a new extent ([`expected_new_extent_share`]).
    pub expected_new_extent_share: f64,
    /// Throughput against the thin volume without versions.
    pub ratio_to_no_versions: f64,
}

/// The share of `writes` uniform random overwrites over `extents` extents, spread evenly over
/// a run of `duration`, that go to a new extent when a version is taken at each of `times`:
/// after a version every extent is shared, and the first write into it in that epoch (and
/// only that one) is remapped. An epoch of `w` writes touches `E · (1 − e^(−w/E))` extents
/// on average. The epoch before the first version remaps nothing.
pub fn expected_new_extent_share(
    writes: u64,
    extents: u64,
    duration: Nanos,
    times: &[Nanos],
) -> f64 {
    if writes == 0 || extents == 0 || duration == 0 || times.is_empty() {
        return 0.0;
    }
    let extents = extents as f64;
    let ends = times.iter().skip(1).copied().chain([duration]);
    let remapped: f64 = times
        .iter()
        .zip(ends)
        .map(|(&from, to)| {
            let epoch_writes = writes as f64 * to.saturating_sub(from) as f64 / duration as f64;
            extents * (1.0 - (-epoch_writes / extents).exp())
        })
        .sum();
    remapped / writes as f64
}

/// The share of `writes` overwrites that allocated an extent, from the space the pool
/// allocated beyond the region's own extents (every overwrite that allocates takes exactly
/// one extent, and nothing is freed while versions are only taken).
pub fn new_extent_share(allocated: u64, region: u64, extent: u64, writes: u64) -> f64 {
    if writes == 0 {
        return 0.0;
    }
    (allocated.saturating_sub(region) / extent) as f64 / writes as f64
}

/// One configuration of part (c).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CompactedRun {
    pub configuration: String,
    /// Share of the region's extents the second version superseded (overwritten whole).
    pub superseded_share: f64,
    /// Whether the first version was compacted (the control row is not).
    pub compacted: bool,
    /// The region's extents, and those of the first version now read through a delta.
    pub extents: u64,
    pub extents_compacted: u64,
    /// Extents the compaction could take but kept, their delta not halving them.
    pub extents_kept: u64,
    /// The first version's bytes replaced by deltas, and the deltas' bytes.
    pub data_bytes: u64,
    pub delta_bytes: u64,
    /// The random reads of the first version.
    pub reads: Measured,
    /// Bytes the disk read per 4 KiB read.
    pub disk_bytes_per_read: f64,
    /// Blocks of the first version read back after the run and found as written.
    pub verified_blocks: u64,
    /// Throughput against the 0 % configuration.
    pub ratio_to_uncompacted: f64,
}

impl CompactedRun {
    /// The share of the first version's extents compacted.
    pub fn compacted_share(&self) -> f64 {
        self.extents_compacted as f64 / self.extents.max(1) as f64
    }
}

/// Everything `strata sim clotho` reports.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClothoReport {
    pub config: ClothoConfig,
    pub reads: Vec<ReadRun>,
    pub writes: Vec<WriteRun>,
    pub compacted: Vec<CompactedRun>,
}

impl ClothoReport {
    /// The read run on `layout` with (or without) versions.
    pub fn read(&self, layout: Layout, versions: bool) -> Option<&ReadRun> {
        self.reads
            .iter()
            .find(|r| r.layout == layout && (r.versions > 0) == versions)
    }

    /// The write run on `layout` with version period `period` (None: without versions).
    pub fn write(&self, layout: Layout, period: Option<Nanos>) -> Option<&WriteRun> {
        self.writes
            .iter()
            .find(|r| r.layout == layout && r.period_ns == period)
    }
}

/// The stack of a run, in the serve config's syntax: the disk, the partition, and (but for
/// [`Layout::Disk`]) a thin pool on it with one volume of `volume_bytes` (the region).
fn stack_text(config: &ClothoConfig, layout: Layout, volume_bytes: u64) -> String {
    let mut text = format!(
        "[[disk]]\nname = \"d0\"\nmodel = \"{}\"\n\n\
         [[layer]]\nname = \"part\"\nkind = \"slice\"\nchildren = [\"d0\"]\nlength = {}\n",
        config.model, config.partition_bytes
    );
    let mode = match layout {
        Layout::Disk => return text,
        Layout::Remap => "remap",
        Layout::Copy => "copy",
    };
    text.push_str(&format!(
        "\n[[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"part\"]\n\
         extent = {}\nsnapshot-write = \"{mode}\"\nvolumes = [{{ name = \"vol\", size = {} }}]\n",
        config.extent_bytes, volume_bytes
    ));
    text
}

/// A freshly built stack in a new simulation, its disk keeping data or not (`mode`).
fn build(
    config: &ClothoConfig,
    layout: Layout,
    volume_bytes: u64,
    mode: DataMode,
) -> Result<(Simulation, Stack), String> {
    let table: toml::Table = stack_text(config, layout, volume_bytes)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let spec = StackSpec::from_toml(&table)?;
    let sim = Simulation::with_config(SimConfig::new(config.seed));
    let stack = spec.build(&sim, &crate::models::build, mode, Path::new("."))?;
    Ok((sim, stack))
}

fn pattern(address: AddressDist, bytes: u64, read_share: f64) -> Pattern {
    Pattern {
        address,
        sizes: vec![WeightedSize { bytes, weight: 1 }],
        read_share,
        align: bytes,
    }
}

/// Ends a closed-loop workload once virtual time reaches `until`: I/Os in flight then
/// finish, no new one starts.
struct Until<W> {
    inner: W,
    clock: SimRuntime,
    until: Nanos,
}

impl<W: Workload> Workload for Until<W> {
    fn next_io(&mut self) -> Option<Io> {
        if self.clock.now_nanos() >= self.until {
            return None;
        }
        self.inner.next_io()
    }
}

/// One simulated stack being driven through the phases of a run.
struct Bench {
    sim: Simulation,
    stack: Stack,
    file: u64,
    /// Draws of each phase's workload come from their own seed.
    phase: u64,
}

impl Bench {
    /// (a) and (b): the region is `file_bytes`, and nothing is stored (timing only).
    fn new(config: &ClothoConfig, layout: Layout) -> Result<Bench, String> {
        Self::with(config, layout, config.file_bytes, DataMode::TimingOnly)
    }

    fn with(
        config: &ClothoConfig,
        layout: Layout,
        file: u64,
        mode: DataMode,
    ) -> Result<Bench, String> {
        let (sim, stack) = build(config, layout, file, mode)?;
        Ok(Bench {
            sim,
            stack,
            file,
            phase: 0,
        })
    }

    fn next_seed(&mut self) -> u64 {
        self.phase += 1;
        crate::executor::derive_seed(self.sim.seed(), &format!("clotho-phase-{}", self.phase))
    }

    /// Runs `workload` on the region and returns what the driver recorded.
    fn drive(&mut self, workload: &mut dyn Workload, queue_depth: usize) -> RunOutput {
        let top = self.stack.top.clone();
        self.drive_on(top, workload, queue_depth)
    }

    /// Runs `workload` on `device` (the volume, or a snapshot of it).
    fn drive_on(
        &mut self,
        device: DeviceRef,
        workload: &mut dyn Workload,
        queue_depth: usize,
    ) -> RunOutput {
        let config = DriverConfig {
            queue_depth,
            sample_interval: None,
            verify_data: false,
            outstanding_limit: None,
        };
        self.sim.block_on(driver::drive(
            self.sim.handle(),
            device,
            workload,
            &self.stack.disks,
            &config,
        ))
    }

    /// Writes the whole region once, front to back, in 1 MiB writes one at a time (as a
    /// file is first written), so extents are laid out in the region's order.
    fn fill(&mut self) -> Result<(), String> {
        let seed = self.next_seed();
        let sequential = pattern(AddressDist::Sequential { start: 0 }, MIB, 0.0);
        let inner = ClosedLoop::new(sequential, self.file, seed)?;
        let mut workload = Limited::new(inner, Some(self.file / MIB), None);
        check(&self.drive(&mut workload, 1), "filling the region")?;
        self.flush()
    }

    /// Overwrites `share` of the region's blocks, at random (with repeats).
    fn overwrite(&mut self, share: f64, queue_depth: usize) -> Result<(), String> {
        let seed = self.next_seed();
        let count = (share * (self.file / BLOCK) as f64).round() as u64;
        let inner = ClosedLoop::new(pattern(AddressDist::Uniform, BLOCK, 0.0), self.file, seed)?;
        let mut workload = Limited::new(inner, Some(count), None);
        check(&self.drive(&mut workload, queue_depth), "overwriting")?;
        self.flush()
    }

    /// `count` random 4 KiB reads of the region.
    fn random_reads(&mut self, count: u64, queue_depth: usize) -> Result<RunOutput, String> {
        let top = self.stack.top.clone();
        self.random_reads_of(top, count, queue_depth)
    }

    /// `count` random 4 KiB reads of the region on `device`.
    fn random_reads_of(
        &mut self,
        device: DeviceRef,
        count: u64,
        queue_depth: usize,
    ) -> Result<RunOutput, String> {
        let seed = self.next_seed();
        let inner = ClosedLoop::new(pattern(AddressDist::Uniform, BLOCK, 1.0), self.file, seed)?;
        let mut workload = Limited::new(inner, Some(count), None);
        let output = self.drive_on(device, &mut workload, queue_depth);
        check(&output, "random reads")?;
        Ok(output)
    }

    /// Random 4 KiB overwrites for `duration` of virtual time, a version taken at each of
    /// `times` (from the start). Returns the records and the versions taken.
    fn overwrites_with_versions(
        &mut self,
        duration: Nanos,
        times: &[Nanos],
        queue_depth: usize,
    ) -> Result<(RunOutput, u32), String> {
        let seed = self.next_seed();
        let clock = self.sim.handle();
        let start = clock.now_nanos();
        let inner = ClosedLoop::new(pattern(AddressDist::Uniform, BLOCK, 0.0), self.file, seed)?;
        let mut workload = Until {
            inner,
            clock: clock.clone(),
            until: start + duration,
        };
        let pool = self.pool().cloned();
        let versions = async {
            let mut taken = 0u32;
            for &at in times {
                clock.sleep_until(start + at).await;
                snapshot(pool.as_ref().ok_or("versions need a thin pool")?).await?;
                taken += 1;
            }
            Ok::<u32, String>(taken)
        };
        let config = DriverConfig {
            queue_depth,
            sample_interval: None,
            verify_data: false,
            outstanding_limit: None,
        };
        let drive = driver::drive(
            clock.clone(),
            self.stack.top.clone(),
            &mut workload,
            &self.stack.disks,
            &config,
        );
        let (output, taken) = self.sim.block_on(join(drive, versions));
        let taken = taken?;
        check(&output, "overwrites with versions")?;
        self.flush()?;
        Ok((output, taken))
    }

    fn pool(&self) -> Option<&DeviceRef> {
        self.stack.nodes.get("pool")
    }

    fn snapshot(&mut self) -> Result<(), String> {
        let pool = self.pool().ok_or("versions need a thin pool")?.clone();
        self.sim.block_on(snapshot(&pool))
    }

    /// Calls one of the pool's verbs on the volume with `args` besides (as `strata snapshot
    /// create --name`, `strata snapshot compact` do).
    fn call(&mut self, verb: &str, args: &[(&str, &str)]) -> Result<toml::Table, String> {
        let pool = self.pool().ok_or("versions need a thin pool")?.clone();
        let args = (args.iter())
            .map(|&(key, value)| (key.to_string(), toml::Value::from(value)))
            .collect();
        self.sim.block_on(call(&pool, verb, args))
    }

    /// A snapshot of the volume as a read-only device (`vol@name`, as the stack names it).
    fn snapshot_device(&mut self, snapshot: &str) -> Result<DeviceRef, String> {
        let pool = self.pool().ok_or("versions need a thin pool")?.clone();
        let name = format!("vol@{snapshot}");
        match self
            .sim
            .block_on(pool.control(Control::Volume { name: name.clone() }))
        {
            Ok(ControlReply::Device(device)) => Ok(device),
            Ok(other) => Err(format!("{name} answered {other:?}")),
            Err(e) => Err(format!("{name}: {e}")),
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        let top = self.stack.top.clone();
        self.sim
            .block_on(top.flush())
            .map_err(|e| format!("flush: {e}"))
    }

    /// Bytes of the partition the pool has allocated (0 without a pool).
    fn allocated_bytes(&mut self) -> Result<u64, String> {
        let Some(pool) = self.pool().cloned() else {
            return Ok(0);
        };
        match self.sim.block_on(pool.control(Control::Space)) {
            Ok(ControlReply::Space(space)) => Ok(space.allocated_bytes),
            Ok(other) => Err(format!("the pool's space answered {other:?}")),
            Err(e) => Err(format!("the pool's space: {e}")),
        }
    }
}

/// Takes a version of the volume through the pool's verb, as `strata snapshot create` does.
async fn snapshot(pool: &DeviceRef) -> Result<(), String> {
    call(pool, "snapshot-create", toml::Table::new())
        .await
        .map(|_| ())
}

/// Calls the pool's `verb` on the volume "vol" with `args` besides.
async fn call(pool: &DeviceRef, verb: &str, mut args: toml::Table) -> Result<toml::Table, String> {
    args.insert("volume".into(), "vol".into());
    let request = Control::Call {
        verb: verb.into(),
        args,
    };
    match pool.control(request).await {
        Ok(ControlReply::Table(table)) => Ok(table),
        Ok(other) => Err(format!("{verb} answered {other:?}")),
        Err(e) => Err(format!("{verb}: {e}")),
    }
}

fn check(output: &RunOutput, what: &str) -> Result<(), String> {
    let failed = output.records.iter().filter(|r| r.failed).count();
    if failed > 0 {
        return Err(format!(
            "{what}: {failed} of {} I/Os failed",
            output.records.len()
        ));
    }
    Ok(())
}

/// Part (a): one configuration. Every configuration fills the region and overwrites the
/// same share of it `read_versions` times; with `versions`, a snapshot comes before each
/// overwrite, so the overwrites go to new extents and the chains grow.
fn read_run(config: &ClothoConfig, layout: Layout, versions: bool) -> Result<ReadRun, String> {
    let mut bench = Bench::new(config, layout)?;
    bench.fill()?;
    for _ in 0..config.read_versions {
        if versions {
            bench.snapshot()?;
        }
        bench.overwrite(config.overwrite_share, config.write_queue_depth)?;
    }
    let output = bench.random_reads(config.read_ios, config.read_queue_depth)?;
    Ok(ReadRun {
        configuration: match (layout, versions) {
            (Layout::Disk, _) => "disk".into(),
            (_, false) => "thin, no versions".into(),
            (_, true) => format!("thin, {} versions, chains", config.read_versions),
        },
        layout,
        versions: if versions { config.read_versions } else { 0 },
        reads: Measured::of(&output),
        allocated_bytes: bench.allocated_bytes()?,
        overhead_percent: 0.0,
    })
}

/// Part (a): the bare partition, a thin volume without versions, one with chains.
pub fn read_overhead(config: &ClothoConfig) -> Result<Vec<ReadRun>, String> {
    let mut runs = [
        (Layout::Disk, false),
        (Layout::Remap, false),
        (Layout::Remap, true),
    ]
    .into_iter()
    .map(|(layout, versions)| read_run(config, layout, versions))
    .collect::<Result<Vec<_>, _>>()?;
    let disk = runs[0].reads.iops;
    for run in &mut runs {
        run.overhead_percent = overhead_percent(disk, run.reads.iops);
    }
    Ok(runs)
}

/// Part (b): one configuration, `period` None for no versions.
fn write_run(
    config: &ClothoConfig,
    layout: Layout,
    period: Option<Nanos>,
) -> Result<WriteRun, String> {
    let mut bench = Bench::new(config, layout)?;
    bench.fill()?;
    let times = period.map_or_else(Vec::new, |p| version_times(config.write_duration, p));
    let (output, taken) =
        bench.overwrites_with_versions(config.write_duration, &times, config.write_queue_depth)?;
    let writes = Measured::of(&output);
    let allocated_bytes = bench.allocated_bytes()?;
    let configuration = match (layout, period) {
        (Layout::Disk, _) => "disk".to_string(),
        (_, None) => "thin, no versions".to_string(),
        (Layout::Remap, Some(p)) => format!("thin, a version every {}", duration_text(p)),
        (Layout::Copy, Some(p)) => format!("thin copy-on-write, every {}", duration_text(p)),
    };
    Ok(WriteRun {
        configuration,
        layout,
        period_ns: period,
        versions_taken: taken,
        new_extent_share: match layout {
            Layout::Disk => 0.0,
            _ => new_extent_share(
                allocated_bytes,
                config.file_bytes,
                config.extent_bytes,
                writes.ios,
            ),
        },
        expected_new_extent_share: match layout {
            Layout::Disk => 0.0,
            _ => expected_new_extent_share(
                writes.ios,
                config.file_bytes / config.extent_bytes,
                config.write_duration,
                &times,
            ),
        },
        writes,
        allocated_bytes,
        ratio_to_no_versions: 1.0,
    })
}

/// Part (b): the bare partition and a thin volume without versions, then a version every
/// period (remap-on-write), then copy-on-write at the shortest period, for comparison.
pub fn write_path(config: &ClothoConfig) -> Result<Vec<WriteRun>, String> {
    let mut setups = vec![(Layout::Disk, None), (Layout::Remap, None)];
    setups.extend(
        config
            .version_periods
            .iter()
            .map(|&p| (Layout::Remap, Some(p))),
    );
    if let Some(&shortest) = config.version_periods.iter().min() {
        setups.push((Layout::Copy, Some(shortest)));
    }
    let mut runs = setups
        .into_iter()
        .map(|(layout, period)| write_run(config, layout, period))
        .collect::<Result<Vec<_>, _>>()?;
    let none = runs[1].writes.iops;
    for run in &mut runs {
        run.ratio_to_no_versions = run.writes.iops / none;
    }
    Ok(runs)
}

/// Version 1's bytes of extent `index` in part (c): a ChaCha8 keystream drawn from the seed
/// and the extent, so that no block is like another and nothing compresses on its own: a
/// small delta can only come from the base being like it.
pub fn first_version(seed: u64, index: u64, extent_bytes: u64) -> Vec<u8> {
    let stream = crate::executor::derive_seed(seed, "clotho-first-version");
    let mut rng = ChaCha8Rng::seed_from_u64(splitmix64(stream.wrapping_add(index)));
    let mut bytes = vec![0u8; extent_bytes as usize];
    rng.fill_bytes(&mut bytes);
    bytes
}

/// Version 2's bytes of extent `index` in part (c): version 1's with `changed` bytes of each
/// 4 KiB block altered, one in each of `changed` equal stretches of the block, at a place
/// and by a value drawn from the seed.
pub fn second_version(seed: u64, index: u64, extent_bytes: u64, changed: usize) -> Vec<u8> {
    let mut bytes = first_version(seed, index, extent_bytes);
    let changed = changed.min(BLOCK as usize);
    if changed == 0 {
        return bytes;
    }
    let stream = crate::executor::derive_seed(seed, "clotho-second-version");
    let mut rng = ChaCha8Rng::seed_from_u64(splitmix64(stream.wrapping_add(index)));
    let stretch = BLOCK as usize / changed;
    for block in bytes.chunks_mut(BLOCK as usize) {
        for k in 0..changed {
            let at = k * stretch + rng.random_range(0..stretch);
            block[at] ^= rng.random_range(1..=u8::MAX);
        }
    }
    bytes
}

/// Whether part (c)'s second version supersedes extent `index` when it overwrites `share`
/// of the region's extents: spread evenly (every other one at 0.5), floor(n x share) of
/// the first n.
pub fn superseded(index: u64, share: f64) -> bool {
    let upto = |n: u64| (n as f64 * share).floor();
    upto(index + 1) > upto(index)
}

impl Bench {
    /// Writes the extents `indices` (ascending) with `content`, adjacent ones together up
    /// to 1 MiB a write, one write at a time, then flushes.
    fn write_extents(
        &mut self,
        extent_bytes: u64,
        indices: impl Iterator<Item = u64>,
        content: impl Fn(u64) -> Vec<u8>,
    ) -> Result<(), String> {
        let per_write = (MIB / extent_bytes).max(1);
        let top = self.stack.top.clone();
        let mut pending: Option<(u64, Vec<u8>, u64)> = None;
        let write = |sim: &Simulation, offset: u64, data: Vec<u8>| {
            let top = top.clone();
            sim.block_on(async move {
                top.write(offset, data.into(), WriteFlags::default())
                    .await
                    .map_err(|e| format!("write at {offset}: {e}"))
            })
        };
        for index in indices {
            match &mut pending {
                Some((first, data, count)) if *first + *count == index && *count < per_write => {
                    data.extend_from_slice(&content(index));
                    *count += 1;
                }
                _ => {
                    if let Some((first, data, _)) = pending.take() {
                        write(&self.sim, first * extent_bytes, data)?;
                    }
                    pending = Some((index, content(index), 1));
                }
            }
        }
        if let Some((first, data, _)) = pending {
            write(&self.sim, first * extent_bytes, data)?;
        }
        self.flush()
    }

    /// Reads one 4 KiB block of every few extents of `device` (a different block in each,
    /// and extents of both parities) and compares it with `expected`'s.
    fn verify_blocks(
        &mut self,
        device: &DeviceRef,
        extent_bytes: u64,
        expected: impl Fn(u64) -> Vec<u8>,
    ) -> Result<u64, String> {
        let extents = self.file / extent_bytes;
        let blocks = extent_bytes / BLOCK;
        let step = ((extents / 128).max(1)) | 1;
        let mut checked = 0;
        for index in (0..extents).step_by(step as usize) {
            let block = index % blocks;
            let offset = index * extent_bytes + block * BLOCK;
            let device = device.clone();
            let read = self
                .sim
                .block_on(async move { device.read(offset, BLOCK as usize).await })
                .map_err(|e| format!("reading back {offset}: {e}"))?;
            let want = expected(index);
            let want = &want[(block * BLOCK) as usize..((block + 1) * BLOCK) as usize];
            if read[..] != *want {
                return Err(format!(
                    "the block at {offset} does not read back as the version wrote it"
                ));
            }
            checked += 1;
        }
        Ok(checked)
    }
}

/// A count from a verb's reply.
fn reply_count(table: &toml::Table, key: &str) -> Result<u64, String> {
    table
        .get(key)
        .and_then(toml::Value::as_integer)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| format!("the reply has no count {key:?}: {table:?}"))
}

/// Part (c): one configuration. The region is written as version 1 and snapshotted ("v1");
/// `share` of its extents is overwritten whole with version 2's bytes and the volume is
/// snapshotted again ("v2"); v1 is compacted against v2 (or not); then v1 is read at random
/// through its snapshot device.
fn compacted_run(config: &ClothoConfig, share: f64, compact: bool) -> Result<CompactedRun, String> {
    let (seed, extent) = (config.seed, config.extent_bytes);
    let extents = config.compacted_file_bytes / extent;
    let changed = config.changed_bytes_per_block;
    // The disk keeps what is written: compaction encodes the bytes it reads, and zeros
    // against zeros (what a timing-only disk returns) give tiny deltas whatever the
    // versions are.
    let mut bench = Bench::with(
        config,
        Layout::Remap,
        config.compacted_file_bytes,
        DataMode::Stored,
    )?;
    bench.write_extents(extent, 0..extents, |i| first_version(seed, i, extent))?;
    bench.call("snapshot-create", &[("name", "v1")])?;
    let overwritten = (0..extents).filter(|&i| superseded(i, share));
    bench.write_extents(extent, overwritten, |i| {
        second_version(seed, i, extent, changed)
    })?;
    bench.call("snapshot-create", &[("name", "v2")])?;
    let (mut compacted, mut kept, mut data_bytes, mut delta_bytes) = (0, 0, 0, 0);
    if compact {
        let report = bench.call("snapshot-compact", &[("snapshot", "v1")])?;
        compacted = reply_count(&report, "extents-compacted")?;
        kept = reply_count(&report, "extents-kept")?;
        data_bytes = reply_count(&report, "data-bytes")?;
        delta_bytes = reply_count(&report, "delta-bytes")?;
    }
    bench.flush()?;
    let v1 = bench.snapshot_device("v1")?;
    let output = bench.random_reads_of(
        v1.clone(),
        config.compacted_read_ios,
        config.compacted_queue_depth,
    )?;
    let reads = Measured::of(&output);
    let read_bytes: u64 = output.disks.iter().map(|d| d.stats.read_bytes).sum();
    let verified_blocks = bench.verify_blocks(&v1, extent, |i| first_version(seed, i, extent))?;
    let percent = share * 100.0;
    Ok(CompactedRun {
        configuration: if compact {
            format!("{percent:.0} % superseded, compacted")
        } else {
            format!("{percent:.0} % superseded, not compacted")
        },
        superseded_share: share,
        compacted: compact,
        extents,
        extents_compacted: compacted,
        extents_kept: kept,
        data_bytes,
        delta_bytes,
        disk_bytes_per_read: read_bytes as f64 / reads.ios.max(1) as f64,
        reads,
        verified_blocks,
        ratio_to_uncompacted: 1.0,
    })
}

/// Part (c): v1 compacted at each of the shares, then, as a control, the largest share
/// superseded but not compacted (the same history and placement, no deltas). Throughput is
/// compared with the first share's (0 %: nothing to compact).
pub fn compacted_reads(config: &ClothoConfig) -> Result<Vec<CompactedRun>, String> {
    let mut runs = config
        .compacted_shares
        .iter()
        .map(|&share| compacted_run(config, share, true))
        .collect::<Result<Vec<_>, _>>()?;
    let largest = config.compacted_shares.iter().copied().fold(0.0, f64::max);
    if largest > 0.0 {
        runs.push(compacted_run(config, largest, false)?);
    }
    if let Some(baseline) = runs.first().map(|r| r.reads.iops) {
        for run in &mut runs {
            run.ratio_to_uncompacted = run.reads.iops / baseline;
        }
    }
    Ok(runs)
}

/// Which parts a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    pub reads: bool,
    pub writes: bool,
    pub compacted: bool,
}

impl Parts {
    pub const ALL: Parts = Parts {
        reads: true,
        writes: true,
        compacted: true,
    };
}

/// Runs all three parts.
pub fn run(config: &ClothoConfig) -> Result<ClothoReport, String> {
    run_parts(config, Parts::ALL)
}

/// Runs the parts asked for.
pub fn run_parts(config: &ClothoConfig, parts: Parts) -> Result<ClothoReport, String> {
    Ok(ClothoReport {
        config: config.clone(),
        reads: if parts.reads {
            read_overhead(config)?
        } else {
            Vec::new()
        },
        writes: if parts.writes {
            write_path(config)?
        } else {
            Vec::new()
        },
        compacted: if parts.compacted {
            compacted_reads(config)?
        } else {
            Vec::new()
        },
    })
}

/// "5 min", "18.75 s", "400 ms".
pub fn duration_text(ns: Nanos) -> String {
    if ns >= MINUTE && ns.is_multiple_of(MINUTE) {
        format!("{} min", ns / MINUTE)
    } else if ns >= SECONDS {
        let s = ns as f64 / SECONDS as f64;
        trim(format!("{s:.2}")) + " s"
    } else {
        format!("{} ms", ns / MILLIS)
    }
}

fn trim(text: String) -> String {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

fn bytes_text(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{} GiB", trim(format!("{:.2}", bytes as f64 / GIB as f64)))
    } else if bytes >= MIB || bytes == 0 {
        format!("{} MiB", trim(format!("{:.1}", bytes as f64 / MIB as f64)))
    } else {
        format!("{} KiB", trim(format!("{:.1}", bytes as f64 / KIB as f64)))
    }
}

/// The report as the terminal shows it: one table per part, the paper's figure beside
/// each simulated one.
pub fn format_report(report: &ClothoReport) -> String {
    let c = &report.config;
    let mut out = format!(
        "Clotho §3.4 on {} (seed {}, scale 1/{}): {} partition, {} region, {} extents\n\n",
        c.model,
        c.seed,
        c.scale,
        bytes_text(c.partition_bytes),
        bytes_text(c.file_bytes),
        bytes_text(c.extent_bytes),
    );
    if !report.reads.is_empty() {
        out.push_str(&format!(
            "(a) random 4 KiB reads, QD {}, {} reads, after the region was written and {} times \
         {:.0} % of its blocks overwritten (with a version before each: \"chains\")\n",
            c.read_queue_depth,
            c.read_ios,
            c.read_versions,
            c.overwrite_share * 100.0,
        ));
        let mut rows = vec![row(&[
            "configuration",
            "reads/s",
            "mean ms",
            "p99 ms",
            "disk reads/read",
            "allocated",
            "overhead %",
            "paper",
        ])];
        for r in &report.reads {
            rows.push(vec![
                r.configuration.clone(),
                format!("{:.1}", r.reads.iops),
                format!("{:.3}", r.reads.mean_ms),
                format!("{:.3}", r.reads.p99_ms),
                format!("{:.3}", r.reads.disk_reads_per_io),
                bytes_text(r.allocated_bytes),
                format!("{:.2}", r.overhead_percent),
                match r.layout {
                    Layout::Disk => "baseline".into(),
                    _ => "<= 7.5".into(),
                },
            ]);
        }
        out.push_str(&table(&rows));
        out.push('\n');
    }
    if !report.writes.is_empty() {
        out.push_str(&format!(
            "(b) random 4 KiB overwrites, QD {}, {} of virtual time per configuration\n",
            c.write_queue_depth,
            duration_text(c.write_duration)
        ));
        let mut rows = vec![row(&[
            "configuration",
            "versions",
            "writes/s",
            "mean ms",
            "p99 ms",
            "disk I/Os/write",
            "to new extent %",
            "expected %",
            "allocated",
            "x no versions",
            "paper",
        ])];
        for r in &report.writes {
            rows.push(vec![
                r.configuration.clone(),
                r.versions_taken.to_string(),
                format!("{:.1}", r.writes.iops),
                format!("{:.3}", r.writes.mean_ms),
                format!("{:.3}", r.writes.p99_ms),
                format!("{:.3}", r.writes.disk_ios_per_io),
                format!("{:.1}", r.new_extent_share * 100.0),
                format!("{:.1}", r.expected_new_extent_share * 100.0),
                bytes_text(r.allocated_bytes),
                format!("{:.3}", r.ratio_to_no_versions),
                match (r.layout, r.period_ns) {
                    (Layout::Disk, _) => "Clotho faster (Ext2)".into(),
                    (_, None) => "baseline".into(),
                    (Layout::Remap, Some(_)) => "higher when more frequent".into(),
                    (Layout::Copy, Some(_)) => "(not in the paper)".into(),
                },
            ]);
        }
        out.push_str(&table(&rows));
        out.push('\n');
    }
    if !report.compacted.is_empty() {
        out.push_str(&format!(
            "(c) random 4 KiB reads of a compacted version, QD {}, {} reads: a {} region \
             written (v1), a share of its extents overwritten whole with {} bytes per 4 KiB \
             changed (v2), v1 compacted against v2\n",
            c.compacted_queue_depth,
            c.compacted_read_ios,
            bytes_text(c.compacted_file_bytes),
            c.changed_bytes_per_block,
        ));
        let mut rows = vec![row(&[
            "configuration",
            "compacted %",
            "delta/data %",
            "reads/s",
            "mean ms",
            "p99 ms",
            "disk reads/read",
            "disk KiB/read",
            "x 0 %",
            "paper",
        ])];
        for r in &report.compacted {
            let paper = match (r.compacted, r.superseded_share) {
                (false, _) => "(not in the paper)",
                (true, 0.0) => "baseline",
                (true, 1.0) => "2 accesses/read, about 0.5x",
                (true, _) => "(figure data unavailable)",
            };
            rows.push(vec![
                r.configuration.clone(),
                format!("{:.1}", r.compacted_share() * 100.0),
                if r.data_bytes == 0 {
                    "-".into()
                } else {
                    format!("{:.2}", 100.0 * r.delta_bytes as f64 / r.data_bytes as f64)
                },
                format!("{:.1}", r.reads.iops),
                format!("{:.3}", r.reads.mean_ms),
                format!("{:.3}", r.reads.p99_ms),
                format!("{:.3}", r.reads.disk_reads_per_io),
                format!("{:.1}", r.disk_bytes_per_read / KIB as f64),
                format!("{:.3}", r.ratio_to_uncompacted),
                paper.into(),
            ]);
        }
        out.push_str(&table(&rows));
    }
    out
}

pub(crate) fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Left-aligned first column, the others right-aligned.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &w))| {
                let pad = w - cell.chars().count();
                if i == 0 {
                    format!("{cell}{}", " ".repeat(pad))
                } else {
                    format!("{}{cell}", " ".repeat(pad))
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_taken_every_whole_period_inside_the_run() {
        assert_eq!(
            version_times(40 * MINUTE, 10 * MINUTE),
            vec![10 * MINUTE, 20 * MINUTE, 30 * MINUTE]
        );
        assert_eq!(version_times(40 * MINUTE, 5 * MINUTE).len(), 7);
        assert_eq!(version_times(10 * MINUTE, 10 * MINUTE), Vec::<Nanos>::new());
        assert_eq!(version_times(10 * MINUTE, 0), Vec::<Nanos>::new());
        assert_eq!(version_times(7, 3), vec![3, 6]);
    }

    #[test]
    fn overhead_is_the_share_of_the_baseline_lost() {
        assert_eq!(overhead_percent(100.0, 92.5), 7.5);
        assert_eq!(overhead_percent(100.0, 100.0), 0.0);
        assert!(overhead_percent(100.0, 110.0) < 0.0, "faster is negative");
    }

    #[test]
    fn scaling_divides_sizes_and_times_together() {
        let paper = ClothoConfig::paper(1);
        assert_eq!(paper.partition_bytes, 21 * GIB);
        assert_eq!(paper.file_bytes, 2 * GIB);
        assert_eq!(paper.version_periods, vec![10 * MINUTE, 5 * MINUTE]);
        let small = ClothoConfig::scaled(1, 16);
        assert_eq!(small.file_bytes, 128 * MIB);
        assert_eq!(small.partition_bytes, 21 * GIB / 16);
        assert_eq!(small.write_duration, 150 * SECONDS);
        // Writes per extent per version: region / period is the same at every scale.
        let per = |c: &ClothoConfig| c.file_bytes as f64 / c.version_periods[1] as f64;
        assert!((per(&paper) / per(&small) - 1.0).abs() < 1e-9);
        assert_eq!((small.read_ios, small.read_queue_depth), (8_000, 3));
        assert_eq!(ClothoConfig::scaled(1, 1), paper);
        assert_eq!(
            ClothoConfig::scaled(1, 1000).file_bytes % paper.extent_bytes,
            0
        );
    }

    #[test]
    fn the_second_version_differs_from_the_first_in_a_few_bytes_per_block() {
        let extent = 64 * KIB;
        let first = first_version(1, 7, extent);
        let second = second_version(1, 7, extent, 16);
        assert_eq!(
            (first.len(), second.len()),
            (extent as usize, extent as usize)
        );
        for (a, b) in first
            .chunks(BLOCK as usize)
            .zip(second.chunks(BLOCK as usize))
        {
            let differ = a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert_eq!(differ, 16);
        }
        assert_eq!(second_version(1, 7, extent, 0), first);
        assert_eq!(
            first_version(1, 7, extent),
            first,
            "a function of seed and extent"
        );
        assert_ne!(first_version(1, 8, extent), first);
        assert_ne!(first_version(2, 7, extent), first);
        // No two blocks alike.
        let blocks: std::collections::BTreeSet<&[u8]> = first.chunks(BLOCK as usize).collect();
        assert_eq!(blocks.len(), (extent / BLOCK) as usize);
    }

    #[test]
    fn only_the_similarity_makes_the_delta_small() {
        // The pool's own encoder: v1 against v2 of the same extent is a small delta, v1
        // against an unrelated extent is not worth keeping (v1 does not compress by itself).
        use strata_thin::delta::{encode, worth_compacting, TakenLink};
        use strata_thin::versions::Granules;
        let extent = 64 * KIB;
        let granules = extent / BLOCK;
        let link = TakenLink {
            epoch: 1,
            data: Granules::from_fn(granules, |_| true),
            zeros: Granules::empty(granules),
        };
        let v1 = first_version(1, 3, extent);
        let similar = encode(
            std::slice::from_ref(&link),
            &v1,
            &second_version(1, 3, extent, 16),
        )
        .unwrap();
        assert!(worth_compacting(v1.len(), similar.len()));
        assert!(similar.len() < v1.len() / 20, "{}", similar.len());
        let unrelated = encode(
            std::slice::from_ref(&link),
            &v1,
            &first_version(1, 4, extent),
        )
        .unwrap();
        assert!(
            !worth_compacting(v1.len(), unrelated.len()),
            "{}",
            unrelated.len()
        );
    }

    #[test]
    fn a_share_supersedes_that_share_of_the_extents_spread_evenly() {
        let count = |share: f64| (0..128).filter(|&i| superseded(i, share)).count();
        assert_eq!(count(0.0), 0);
        assert_eq!(count(1.0), 128);
        assert_eq!(count(0.5), 64);
        assert_eq!(count(0.25), 32);
        let half: Vec<u64> = (0..6).filter(|&i| superseded(i, 0.5)).collect();
        assert_eq!(half, vec![1, 3, 5]);
    }

    #[test]
    fn the_stack_is_serve_config_text_with_the_pool_on_the_partition() {
        let config = ClothoConfig::scaled(1, 16);
        let thin = stack_text(&config, Layout::Remap, config.file_bytes);
        assert!(thin.contains("kind = \"thin-pool\""), "{thin}");
        assert!(thin.contains("children = [\"part\"]"), "{thin}");
        assert!(thin.contains("snapshot-write = \"remap\""), "{thin}");
        let copy = stack_text(&config, Layout::Copy, config.file_bytes);
        assert!(copy.contains("snapshot-write = \"copy\""), "{copy}");
        assert!(!stack_text(&config, Layout::Disk, config.file_bytes).contains("thin-pool"));
        let size = format!("size = {} }}", config.compacted_file_bytes);
        assert!(stack_text(&config, Layout::Remap, config.compacted_file_bytes).contains(&size));
        // Each parses and checks as a stack (registry kinds, children, one top).
        for layout in [Layout::Disk, Layout::Remap, Layout::Copy] {
            let text = stack_text(&config, layout, config.file_bytes);
            let table: toml::Table = text.parse().unwrap();
            StackSpec::from_toml(&table).unwrap();
        }
    }

    #[test]
    fn the_new_extent_share_counts_extents_beyond_the_region() {
        // 10 extents of 64 KiB beyond a 1 MiB region, over 100 writes.
        assert_eq!(
            new_extent_share(MIB + 10 * 64 * KIB, MIB, 64 * KIB, 100),
            0.1
        );
        assert_eq!(new_extent_share(MIB, MIB, 64 * KIB, 100), 0.0);
        assert_eq!(new_extent_share(0, MIB, 64 * KIB, 100), 0.0);
        assert_eq!(new_extent_share(2 * MIB, MIB, 64 * KIB, 0), 0.0);
    }

    #[test]
    fn the_expected_share_remaps_the_first_write_into_each_extent_per_epoch() {
        // One version halfway: the second half's writes (one per extent on average) touch
        // 1 - 1/e of the extents; over all the writes that is (1 - 1/e) / 2.
        let share = expected_new_extent_share(2_000, 1_000, 100, &[50]);
        assert!(
            (share - (1.0 - (-1.0f64).exp()) / 2.0).abs() < 1e-12,
            "{share}"
        );
        // Without versions nothing is remapped; with very few writes per epoch, almost every
        // write after the first version is a first write.
        let none = expected_new_extent_share(2_000, 1_000, 100, &[]);
        assert!(none == 0.0 && none.is_sign_positive(), "{none}");
        let sparse = expected_new_extent_share(100, 1 << 30, 100, &[10, 20, 30]);
        assert!((sparse - 0.9).abs() < 1e-6, "{sparse}");
        // More frequent versions remap more.
        let every_10 = expected_new_extent_share(100_000, 1_000, 40, &[10, 20, 30]);
        let every_5 = expected_new_extent_share(100_000, 1_000, 40, &version_times(40, 5));
        assert!(every_5 > every_10);
        assert_eq!(expected_new_extent_share(0, 1_000, 40, &[10]), 0.0);
    }

    #[test]
    fn the_report_prints_each_part_beside_the_papers_figure() {
        let measured = Measured {
            ios: 100,
            failed: 0,
            iops: 500.0,
            mean_ms: 6.0,
            p99_ms: 30.0,
            disk_ios_per_io: 1.0,
            disk_reads_per_io: 1.0,
        };
        let report = ClothoReport {
            config: ClothoConfig::scaled(1, 16),
            reads: vec![ReadRun {
                configuration: "disk".into(),
                layout: Layout::Disk,
                versions: 0,
                reads: measured.clone(),
                allocated_bytes: 0,
                overhead_percent: 0.0,
            }],
            writes: vec![WriteRun {
                configuration: "thin, a version every 5 min".into(),
                layout: Layout::Remap,
                period_ns: Some(5 * MINUTE),
                versions_taken: 7,
                writes: measured.clone(),
                allocated_bytes: 3 * GIB,
                new_extent_share: 0.159,
                expected_new_extent_share: 0.158,
                ratio_to_no_versions: 1.084,
            }],
            compacted: vec![CompactedRun {
                configuration: "100 % superseded, compacted".into(),
                superseded_share: 1.0,
                compacted: true,
                extents: 128,
                extents_compacted: 128,
                extents_kept: 0,
                data_bytes: 8 * MIB,
                delta_bytes: 78_000,
                reads: Measured {
                    disk_reads_per_io: 2.0,
                    ..measured
                },
                disk_bytes_per_read: 68.5 * KIB as f64,
                verified_blocks: 128,
                ratio_to_uncompacted: 0.456,
            }],
        };
        let text = format_report(&report);
        for expected in [
            "128 MiB region, 64 KiB extents",
            "baseline",
            "expected %",
            "15.9",
            "15.8",
            "1.084",
            "higher when more frequent",
            "(c) random 4 KiB reads of a compacted version, QD 1, 2000 reads: a 32 MiB region",
            "100 % superseded, compacted",
            "0.93",
            "2.000",
            "68.5",
            "0.456",
            "2 accesses/read, about 0.5x",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
        let only_c = format_report(&ClothoReport {
            reads: Vec::new(),
            writes: Vec::new(),
            ..report.clone()
        });
        assert!(
            !only_c.contains("(a)") && !only_c.contains("(b)") && only_c.contains("(c)"),
            "{only_c}"
        );
        let without_c = format_report(&ClothoReport {
            compacted: Vec::new(),
            ..report
        });
        assert!(!without_c.contains("(c)"), "{without_c}");
    }

    #[test]
    fn durations_print_in_the_papers_units() {
        assert_eq!(duration_text(5 * MINUTE), "5 min");
        assert_eq!(duration_text(18_750 * MILLIS), "18.75 s");
        assert_eq!(duration_text(150 * SECONDS), "150 s");
        assert_eq!(duration_text(400 * MILLIS), "400 ms");
    }
}
