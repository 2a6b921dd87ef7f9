//! What consistency intervals cost on large sequential writes, in virtual time: RIBD's
//! Fig. 6.8b (`shared/papers/orchestra-ribd.md`, R2: RAIN-10, writes of 512 KB to 1 MB and
//! more, "2PC acknowledgements cost 15–20 %") in shape, with Strata's own brick store and
//! two-phase commit (`strata sim ribd`, docs/shared-volumes.md, "In the simulator").
//!
//! One mirror set of two bricks, each a `BrickStore` on its own modelled disk (a slice at
//! the disk's start: the brick's metadata, its share and its staging area). Clients are
//! hosts of their own on the network; each writes its own stretch of the volume in 1 MiB
//! writes, one at a time, in one of two modes:
//! - **intervals**: each write is one interval, prepared on both bricks with the previous
//!   interval's commit carried by the prepare, and answered once both voted yes, as a host
//!   answers a flush (`prepare_interval`, `BrickStore::prepare_carrying`);
//! - **write through**: each write goes to both bricks at once and is answered when both
//!   made it durable (`BrickStore::write_direct`): the target's baseline, "the same RAIN-10
//!   without intervals" (`bench/shared.py`).
//!
//! The network is RIBD's: Gigabit Ethernet through one switch. Every node has one full-duplex
//! port; a message holds its sender's outgoing wire and its receiver's incoming wire for its
//! bytes at 125 MB/s (a switch forwarding at line rate; first come, first served), then
//! arrives one propagation delay later: half of the 295 µs the paper measured for a remote
//! null control request (Table 5.2), which includes the stacks on both sides. CPU costs
//! nothing here: what the run measures is the design's I/O and messages, not the code's
//! speed on a given machine (`bench/shared.py` measures that).
//!
//! Before the measured run every client writes its stretch once in the run's mode, as the
//! real bench fills its devices, so that the bricks are measured in their steady state (with
//! intervals, the data then lives in staging units rather than at home).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use strata_brick::commit::prepare_interval;
use strata_brick::participant::Participant;
use strata_brick::rpc::RpcError;
use strata_brick::{BrickOptions, BrickStore, Vote};
use strata_cluster::interval::{Decision, IntervalId, Status};
use strata_core::{async_trait, DeviceRef};
use strata_stateless::slice::Slice;

use crate::disk::{DataMode, DiskStats, SimDisk};
use crate::executor::{derive_seed, SimConfig, SimRuntime, Simulation};
use crate::model::{Nanos, MILLIS, SECONDS};
use crate::models;

const MIB: u64 = 1 << 20;
/// RIBD's network: Gigabit Ethernet.
pub const GIGABIT_BYTES_PER_S: u64 = 125_000_000;
/// Half the paper's remote null control round trip (295 µs, Table 5.2).
pub const ONE_WAY_NS: Nanos = 147_500;
/// What a message carries besides its payload (the request's ids and framing).
const HEADER_BYTES: u64 = 64;

/// How a run's clients write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Intervals,
    WriteThrough,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RibdConfig {
    pub seed: u64,
    /// The disk model preset under each brick.
    pub model: String,
    /// Client counts, one pair of runs (intervals, write through) each.
    pub clients: Vec<u64>,
    pub write_bytes: u64,
    /// Each brick's share (the volume: one mirror set), its staging area and its metadata.
    pub share_bytes: u64,
    pub staging_bytes: u64,
    pub meta_bytes: u64,
    /// Virtual time measured, after the fill.
    pub run_ns: Nanos,
    pub bytes_per_s: u64,
    pub one_way_ns: Nanos,
}

impl RibdConfig {
    /// The real bench's brick (`bench/shared.py`: a 1 GiB share, 64 MiB of metadata, the
    /// rest of 1216 MiB for staging) on a WD RE3 (a 7,200 rpm SATA drive, as RIBD's WD
    /// SATA disks were), 20 s per run.
    pub fn paper(seed: u64) -> Self {
        RibdConfig {
            seed,
            model: "wd-re3-1t".to_owned(),
            clients: vec![1, 4, 16],
            write_bytes: MIB,
            share_bytes: 1024 * MIB,
            staging_bytes: 128 * MIB,
            meta_bytes: 64 * MIB,
            run_ns: 20 * SECONDS,
            bytes_per_s: GIGABIT_BYTES_PER_S,
            one_way_ns: ONE_WAY_NS,
        }
    }
}

/// One run: a mode and a client count.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Run {
    pub mode: Mode,
    pub clients: u64,
    /// Writes answered within the measured time, and their bytes per second (MiB/s).
    pub writes: u64,
    pub mib_per_s: f64,
    /// Mean time from sending a write to its answer.
    pub mean_ms: f64,
    /// Per brick, over the measured time (both bricks summed, then halved): the disk's
    /// write requests per MiB the clients wrote, and the share of the time it was busy.
    pub disk_writes_per_mib: f64,
    pub disk_busy: f64,
}

/// The network: one full-duplex Gigabit port per node, through a switch.
struct Fabric {
    clock: SimRuntime,
    bytes_per_s: u64,
    one_way_ns: Nanos,
    /// Per node, when its outgoing and its incoming wires are next free.
    ports: Mutex<Vec<[Nanos; 2]>>,
}

impl Fabric {
    /// Carries `payload` bytes from node `from` to node `to`; returns on arrival.
    async fn carry(&self, from: usize, to: usize, payload: u64) {
        let arrival = {
            let mut ports = self.ports.lock().expect("fabric lock");
            let start = self.clock.now_nanos().max(ports[from][0]).max(ports[to][1]);
            let bytes = payload + HEADER_BYTES;
            let end = start
                + (bytes as u128 * SECONDS as u128).div_ceil(self.bytes_per_s as u128) as Nanos;
            ports[from][0] = end;
            ports[to][1] = end;
            end + self.one_way_ns
        };
        self.clock.sleep_until(arrival).await;
    }
}

/// A client's way to one brick over the fabric.
struct Wire {
    fabric: Arc<Fabric>,
    client: usize,
    brick: usize,
    store: Arc<BrickStore>,
}

impl Wire {
    async fn call<T>(
        &self,
        sent: u64,
        work: impl std::future::Future<Output = strata_core::Result<T>>,
    ) -> Result<T, RpcError> {
        self.fabric.carry(self.client, self.brick, sent).await;
        let answer = work.await;
        self.fabric.carry(self.brick, self.client, 0).await;
        answer.map_err(|error| RpcError::Refused {
            address: format!("brick {}", self.brick),
            why: error.to_string(),
        })
    }

    async fn write_direct(&self, writes: Vec<(u64, Bytes)>) -> Result<(), RpcError> {
        let bytes = payload(&writes);
        self.call(bytes, self.store.write_direct(writes)).await
    }
}

fn payload(writes: &[(u64, Bytes)]) -> u64 {
    writes.iter().map(|(_, data)| data.len() as u64 + 16).sum()
}

#[async_trait]
impl Participant for Wire {
    async fn prepare(
        &self,
        carried: &[IntervalId],
        id: IntervalId,
        bricks: Vec<u64>,
        writes: Vec<(u64, Bytes)>,
        fences: &[(u32, i64)],
        tag: u64,
    ) -> Result<(Vote, Option<Vec<bool>>), RpcError> {
        let bytes = payload(&writes) + 16 * carried.len() as u64;
        let work = async {
            let (vote, committed) = self
                .store
                .prepare_carrying(carried, id, bricks, writes, fences, tag)
                .await?;
            Ok((vote, Some(committed)))
        };
        self.call(bytes, work).await
    }

    async fn decide(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        self.call(16, self.store.decide(id, decision)).await
    }

    async fn decide_resolved(&self, id: IntervalId, decision: Decision) -> Result<bool, RpcError> {
        self.call(16, self.store.decide_resolved(id, decision))
            .await
    }

    async fn status(&self, id: IntervalId) -> Result<Option<Status>, RpcError> {
        self.call(16, async { Ok(self.store.status(id).await) })
            .await
    }

    async fn fence_client(&self, client: u64) -> Result<(), RpcError> {
        self.call(16, self.store.fence_client(client)).await
    }
}

const BRICKS: usize = 2;

/// What one client did while measured.
#[derive(Default)]
struct Tally {
    writes: u64,
    latency_ns: u128,
}

/// Runs every client count in both modes.
pub fn run(config: &RibdConfig) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    for &clients in &config.clients {
        for mode in [Mode::Intervals, Mode::WriteThrough] {
            runs.push(run_one(config, mode, clients)?);
        }
    }
    Ok(runs)
}

/// One run on fresh bricks: the fill, then `run_ns` measured.
pub fn run_one(config: &RibdConfig, mode: Mode, clients: u64) -> Result<Run, String> {
    if clients == 0 || config.write_bytes == 0 || !config.write_bytes.is_multiple_of(4096) {
        return Err("at least one client, and writes of whole 4 KiB units".into());
    }
    let stretch = config.share_bytes / clients / config.write_bytes * config.write_bytes;
    if stretch == 0 {
        return Err(format!(
            "a {} MiB share has no whole write for each of {clients} clients",
            config.share_bytes / MIB
        ));
    }
    // Both modes get the same seed, hence the same drives (initial angle and arm position):
    // the comparison is of the modes on identical input.
    let seed = derive_seed(config.seed, &format!("ribd-{clients}"));
    let mut sim_config = SimConfig::new(seed);
    sim_config.time_limit = Some(config.run_ns.saturating_mul(100).max(3600 * SECONDS));
    let sim = Simulation::with_config(sim_config);
    let options = BrickOptions {
        meta_bytes: config.meta_bytes,
        home_bytes: config.share_bytes,
        min_staging_bytes: config.staging_bytes,
    };
    let brick_bytes = config.meta_bytes + config.share_bytes + config.staging_bytes + 4 * MIB;
    let mut disks = Vec::new();
    for b in 0..BRICKS {
        let model = models::build(
            &config.model,
            &toml::Table::new(),
            derive_seed(seed, &format!("disk-{b}")),
        )?;
        disks.push(SimDisk::new(
            &sim,
            format!("d{b}"),
            model,
            DataMode::TimingOnly,
        ));
    }
    let stores: Vec<Arc<BrickStore>> = sim.block_on(async {
        let mut stores = Vec::new();
        for disk in &disks {
            let slice = Slice::new(
                "brick".into(),
                disk.clone() as DeviceRef,
                0,
                Some(brick_bytes),
            )
            .map_err(|e| e.to_string())?;
            let store = BrickStore::format(Arc::new(slice), &options, false)
                .await
                .map_err(|e| format!("formatting a brick: {e}"))?;
            stores.push(Arc::new(store));
        }
        Ok::<_, String>(stores)
    })?;
    let fabric = Arc::new(Fabric {
        clock: sim.handle(),
        bytes_per_s: config.bytes_per_s,
        one_way_ns: config.one_way_ns,
        ports: Mutex::new(vec![[0, 0]; BRICKS + clients as usize]),
    });
    let wires = |client: u64| -> Vec<Wire> {
        (0..BRICKS)
            .map(|brick| Wire {
                fabric: fabric.clone(),
                client: BRICKS + client as usize - 1,
                brick,
                store: stores[brick].clone(),
            })
            .collect()
    };
    let data = Bytes::from(vec![0x5a; config.write_bytes as usize]);
    let clock = sim.handle();
    // The fill: every client writes its stretch once, unmeasured.
    let fill = futures_util::future::join_all((1..=clients).map(|client| {
        let wires = wires(client);
        let data = data.clone();
        let clock = clock.clone();
        async move {
            let mut writer = Writer::new(mode, client, (client - 1) * stretch, stretch);
            while writer.wrapped == 0 {
                writer.write(&wires, &data, &clock, None).await?;
            }
            Ok::<_, String>(writer)
        }
    }));
    let writers: Vec<Writer> = sim
        .try_block_on(fill)
        .map_err(|stop| format!("the fill stopped: {stop}"))?
        .into_iter()
        .collect::<Result<_, _>>()?;
    let before: Vec<DiskStats> = disks.iter().map(|d| d.stats()).collect();
    let start = sim.now();
    let end = start + config.run_ns;
    let measured = futures_util::future::join_all(writers.into_iter().map(|mut writer| {
        let wires = wires(writer.id.client);
        let data = data.clone();
        let clock = clock.clone();
        async move {
            let mut tally = Tally::default();
            while clock.now_nanos() < end {
                writer
                    .write(&wires, &data, &clock, Some((end, &mut tally)))
                    .await?;
            }
            writer.finish(&wires).await?;
            Ok::<_, String>(tally)
        }
    }));
    let tallies: Vec<Tally> = sim
        .try_block_on(measured)
        .map_err(|stop| format!("the run stopped: {stop}"))?
        .into_iter()
        .collect::<Result<_, _>>()?;
    let writes: u64 = tallies.iter().map(|t| t.writes).sum();
    let latency: u128 = tallies.iter().map(|t| t.latency_ns).sum();
    let seconds = config.run_ns as f64 / SECONDS as f64;
    let mib = (writes * config.write_bytes) as f64 / MIB as f64;
    let disk: Vec<DiskStats> = disks
        .iter()
        .zip(&before)
        .map(|(d, b)| d.stats().since(b))
        .collect();
    let disk_writes: u64 = disk.iter().map(|s| s.writes).sum();
    // Busy up to the end of the measured time (the last writes may run past it).
    let busy: Nanos = disk.iter().map(|s| s.busy_time).sum();
    let elapsed = (sim.now() - start).max(1);
    Ok(Run {
        mode,
        clients,
        writes,
        mib_per_s: mib / seconds,
        mean_ms: if writes == 0 {
            0.0
        } else {
            latency as f64 / writes as f64 / MILLIS as f64
        },
        disk_writes_per_mib: if mib == 0.0 {
            0.0
        } else {
            disk_writes as f64 / BRICKS as f64 / mib
        },
        disk_busy: busy as f64 / BRICKS as f64 / elapsed as f64,
    })
}

/// One client: where it writes next, and (with intervals) the commit its next prepare
/// carries.
struct Writer {
    mode: Mode,
    id: IntervalId,
    first: u64,
    stretch: u64,
    offset_in_stretch: u64,
    wrapped: u64,
    carried: Option<IntervalId>,
}

impl Writer {
    fn new(mode: Mode, client: u64, first: u64, stretch: u64) -> Self {
        Writer {
            mode,
            id: IntervalId { client, seq: 0 },
            first,
            stretch,
            offset_in_stretch: 0,
            wrapped: 0,
            carried: None,
        }
    }

    /// Writes the next block and waits for its answer; counts it in `tally` when it was
    /// answered before `end`.
    async fn write(
        &mut self,
        wires: &[Wire],
        data: &Bytes,
        clock: &SimRuntime,
        tally: Option<(Nanos, &mut Tally)>,
    ) -> Result<(), String> {
        let offset = self.first + self.offset_in_stretch;
        let writes = vec![(offset, data.clone())];
        let sent = clock.now_nanos();
        match self.mode {
            Mode::Intervals => {
                self.id.seq += 1;
                let all: BTreeMap<usize, Vec<(u64, Bytes)>> =
                    (0..wires.len()).map(|b| (b, writes.clone())).collect();
                let carried: BTreeMap<usize, Vec<IntervalId>> = self
                    .carried
                    .iter()
                    .flat_map(|&c| (0..wires.len()).map(move |b| (b, vec![c])))
                    .collect();
                let votes = prepare_interval(wires, self.id, all, &[], 0, &carried).await;
                if !votes.committed() {
                    return Err(format!(
                        "interval {:?} was not committed: {:?}",
                        self.id, votes.refusals
                    ));
                }
                if votes
                    .carried
                    .values()
                    .any(|c| c.as_ref().is_none_or(|c| c.contains(&false)))
                {
                    return Err(format!(
                        "a carried commit was not applied: {:?}",
                        votes.carried
                    ));
                }
                self.carried = Some(self.id);
            }
            Mode::WriteThrough => {
                let answers = futures_util::future::join_all(
                    wires.iter().map(|wire| wire.write_direct(writes.clone())),
                )
                .await;
                if let Some(Err(error)) = answers.into_iter().find(Result::is_err) {
                    return Err(format!("a write through failed: {error}"));
                }
            }
        }
        let answered = clock.now_nanos();
        if let Some((end, tally)) = tally {
            if answered <= end {
                tally.writes += 1;
                tally.latency_ns += u128::from(answered - sent);
            }
        }
        self.offset_in_stretch += data.len() as u64;
        if self.offset_in_stretch + data.len() as u64 > self.stretch {
            self.offset_in_stretch = 0;
            self.wrapped += 1;
        }
        Ok(())
    }

    /// Sends the last interval's commit, which no later prepare carries.
    async fn finish(&mut self, wires: &[Wire]) -> Result<(), String> {
        let Some(last) = self.carried.take() else {
            return Ok(());
        };
        for wire in wires {
            wire.decide(last, Decision::Commit)
                .await
                .map_err(|e| format!("the last commit: {e}"))?;
        }
        Ok(())
    }
}

/// The runs as a table: MiB/s and mean write time per mode, and what intervals cost.
pub fn format_report(config: &RibdConfig, runs: &[Run]) -> String {
    let mut out = format!(
        "RAIN-10 of 2 bricks on {} (seed {}), {} KiB sequential writes, Gigabit Ethernet \
         ({:.0} µs one way), {} s per run after a fill\n\n",
        config.model,
        config.seed,
        config.write_bytes / 1024,
        config.one_way_ns as f64 / 1000.0,
        config.run_ns / SECONDS,
    );
    out.push_str(
        "| clients | write through, MiB/s | intervals, MiB/s | intervals cost | mean write, ms \
         (through / intervals) | disk writes per MiB (through / intervals) | disk busy \
         (through / intervals) |\n|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &clients in &config.clients {
        let find = |mode| runs.iter().find(|r| r.clients == clients && r.mode == mode);
        let (Some(through), Some(intervals)) = (find(Mode::WriteThrough), find(Mode::Intervals))
        else {
            continue;
        };
        out.push_str(&format!(
            "| {clients} | {:.1} | {:.1} | {:+.1} % | {:.2} / {:.2} | {:.2} / {:.2} | {:.0} % / {:.0} % |\n",
            through.mib_per_s,
            intervals.mib_per_s,
            cost(through, intervals) * 100.0,
            through.mean_ms,
            intervals.mean_ms,
            through.disk_writes_per_mib,
            intervals.disk_writes_per_mib,
            through.disk_busy * 100.0,
            intervals.disk_busy * 100.0,
        ));
    }
    out
}

/// What intervals cost against writing through: the throughput lost, as a share of the
/// intervals' own (so +20 % means the baseline ran 1.2 times as fast).
pub fn cost(through: &Run, intervals: &Run) -> f64 {
    through.mib_per_s / intervals.mib_per_s - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(model: &str, clients: Vec<u64>) -> RibdConfig {
        RibdConfig {
            model: model.to_owned(),
            clients,
            share_bytes: 64 * MIB,
            staging_bytes: 32 * MIB,
            run_ns: 3 * SECONDS,
            ..RibdConfig::paper(7)
        }
    }

    fn pair(runs: &[Run], clients: u64) -> (&Run, &Run) {
        let find = |mode| {
            runs.iter()
                .find(|r| r.clients == clients && r.mode == mode)
                .expect("a run for each mode")
        };
        (find(Mode::WriteThrough), find(Mode::Intervals))
    }

    #[test]
    fn the_same_seed_gives_the_same_runs() {
        let config = small("wd-re3-1t", vec![4]);
        assert_eq!(run(&config).unwrap(), run(&config).unwrap());
    }

    #[test]
    fn one_client_pays_for_both_copies_on_its_port_and_for_the_journal_on_the_disk() {
        let runs = run(&small("wd-re3-1t", vec![1])).unwrap();
        let (through, intervals) = pair(&runs, 1);
        // Both copies of a MiB leave through the client's one Gigabit port: 16.8 ms
        // before the second brick has it, whatever the disk does.
        let both_copies_ms =
            2.0 * (MIB + HEADER_BYTES + 16) as f64 / GIGABIT_BYTES_PER_S as f64 * 1e3;
        assert!(through.mean_ms > both_copies_ms, "{through:?}");
        assert!(intervals.mean_ms > both_copies_ms, "{intervals:?}");
        // A write through is one disk write per MiB; a prepare alone (one interval at a
        // time, nothing to share its batch) adds its metadata batch, written twice.
        assert!(
            (0.99..1.05).contains(&through.disk_writes_per_mib),
            "{through:?}"
        );
        assert!(intervals.disk_writes_per_mib > 2.9, "{intervals:?}");
        // Those writes cost time: intervals are slower, within the network's bound.
        assert!(intervals.mean_ms > through.mean_ms, "{runs:?}");
        assert!(cost(through, intervals) > 0.0, "{runs:?}");
    }

    #[test]
    fn more_clients_share_metadata_batches_and_fill_the_disks() {
        let runs = run(&small("wd-re3-1t", vec![1, 16])).unwrap();
        let (through_1, intervals_1) = pair(&runs, 1);
        let (through_16, intervals_16) = pair(&runs, 16);
        assert!(through_16.mib_per_s > through_1.mib_per_s * 1.5, "{runs:?}");
        assert!(
            intervals_16.mib_per_s > intervals_1.mib_per_s * 1.5,
            "{runs:?}"
        );
        // Group commit: sixteen prepares in flight share their metadata batches.
        assert!(
            intervals_16.disk_writes_per_mib < intervals_1.disk_writes_per_mib - 1.0,
            "{runs:?}"
        );
        assert!(intervals_16.disk_busy > 0.95, "{runs:?}");
    }

    #[test]
    fn a_run_too_small_for_its_clients_is_refused() {
        let mut config = small("wd-re3-1t", vec![128]);
        config.share_bytes = 64 * MIB;
        let error = run(&config).unwrap_err();
        assert!(error.contains("no whole write"), "{error}");
    }
}
