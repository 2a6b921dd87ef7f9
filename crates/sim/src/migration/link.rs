//! Several users sharing bricks (the paper's §4.4 multi-user setups, Fig. 7–9): each user's
//! own `migrate` layer, each with its own local drive, all over the same simulated drives.
//!
//! Drive `k` is local to user `k` and remote to every other user, so one drive is reached
//! both directly and over the network. The `link` disk option puts a whole drive behind a
//! link, so here the network is [`Linked`]: a simulator-side block device that sends each
//! request over its own [`Link`] (a Table 1 row: the same delay distribution, 100 Mb/s wire
//! and header as the disk option's `Remote`), calls the device below when the request
//! arrives, and sends the reply back. Each (user, remote drive) pair has its own link, as each
//! iSCSI session had its own path through the router.
//!
//! Each drive holds one partition per user (a `slice` of `partition_bytes / users`, user `u`
//! at `u ·` that), so the users' data is intermixed on every drive. User `u`'s children are
//! drive `u`, `u + 1`, … (mod the users): A over A, B, C; B over B, C, A (the paper's order).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use strata_core::async_trait;
use strata_core::{
    Control, ControlReply, DeviceRef, Filter, Result as BlockResult, WriteFlags, ZeroFlags,
};
use strata_stack::graph;
use strata_stack::registry::{self, LayerArgs, Options, StartPolicy};

use super::{
    config_name, measure, migrate_layer, quiet, run_phase, sfs, Allocation, Counters,
    MigrationConfig, Point, PointSetup, Policy, Workload,
};
use crate::disk::DataMode;
use crate::driver;
use crate::executor::{derive_seed, SimConfig, SimRuntime, Simulation};
use crate::model::{Nanos, SECONDS};
use crate::net::{Direction, Link, LinkParams};
use crate::stack::StackSpec;

/// A device reached over a network link, as a block device (see the module comment).
pub struct Linked {
    child: DeviceRef,
    link: Mutex<Link>,
    clock: SimRuntime,
}

impl Linked {
    pub fn new(child: DeviceRef, params: LinkParams, seed: u64, clock: SimRuntime) -> Linked {
        Linked {
            child,
            link: Mutex::new(Link::new(params, seed)),
            clock,
        }
    }

    /// Sends `bytes` of payload one way now and waits until it arrives.
    async fn cross(&self, direction: Direction, bytes: u64) {
        let now = self.clock.now_nanos();
        let arrival = self
            .link
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(now, direction, bytes);
        if arrival > now {
            self.clock.sleep_until(arrival).await;
        }
    }
}

#[async_trait]
impl Filter for Linked {
    fn next(&self) -> &DeviceRef {
        &self.child
    }

    async fn read(&self, offset: u64, len: usize) -> BlockResult<BytesMut> {
        self.cross(Direction::ToDevice, 0).await;
        let result = self.child.read(offset, len).await;
        self.cross(Direction::ToHost, len as u64).await;
        result
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> BlockResult<()> {
        self.cross(Direction::ToDevice, data.len() as u64).await;
        let result = self.child.write(offset, data, flags).await;
        self.cross(Direction::ToHost, 0).await;
        result
    }

    async fn flush(&self) -> BlockResult<()> {
        self.cross(Direction::ToDevice, 0).await;
        let result = self.child.flush().await;
        self.cross(Direction::ToHost, 0).await;
        result
    }

    async fn discard(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.cross(Direction::ToDevice, 0).await;
        let result = self.child.discard(offset, len).await;
        self.cross(Direction::ToHost, 0).await;
        result
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BlockResult<()> {
        self.cross(Direction::ToDevice, 0).await;
        let result = self.child.write_zeroes(offset, len, flags).await;
        self.cross(Direction::ToHost, 0).await;
        result
    }

    async fn control(&self, request: Control) -> BlockResult<ControlReply> {
        self.child.control(request).await
    }
}

/// One shared setup: users, their load ratio, the allocation.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SharedSetup {
    pub name: String,
    pub allocation: Allocation,
    /// Each user's load is `ratio[u] ×` the sweep's unit load.
    pub ratio: Vec<f64>,
}

/// One load point: every user's measurement, and where each drive's requests came from.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SharedPoint {
    pub unit: f64,
    pub users: Vec<Point>,
    /// `disk_requests[k][u]`: requests user `u` sent drive `k` over the transaction phase.
    pub disk_requests: Vec<Vec<u64>>,
    /// Per drive over the transaction phase: I/Os and utilization.
    pub disk_ios: Vec<u64>,
    pub disk_util: Vec<f64>,
}

impl SharedPoint {
    /// Mean response time over all users' operations (request-weighted), ms.
    pub fn mean_ms(&self) -> f64 {
        let n: u64 = self.users.iter().map(|p| p.operations).sum();
        self.users
            .iter()
            .map(|p| p.mean_ms * p.operations as f64)
            .sum::<f64>()
            / n.max(1) as f64
    }

    pub fn delivered(&self) -> f64 {
        self.users.iter().map(|p| p.delivered).sum()
    }

    /// Drive load balance: the least-loaded drive's requests over the most-loaded one's.
    pub fn balance(&self) -> f64 {
        let totals: Vec<u64> = self.disk_requests.iter().map(|d| d.iter().sum()).collect();
        let max = totals.iter().copied().max().unwrap_or(0);
        let min = totals.iter().copied().min().unwrap_or(0);
        min as f64 / max.max(1) as f64
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SharedCurve {
    pub setup: SharedSetup,
    pub policy: Policy,
    pub name: String,
    pub points: Vec<SharedPoint>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SharedReport {
    pub rtt_ms: u32,
    /// Unit loads of the sweep (ops/s of the lightest user).
    pub units: Vec<f64>,
    /// (MIG, NOMIG) per setup: 3 users striping 3:2:1, 2 users sequential 4:1.
    pub curves: Vec<(SharedCurve, SharedCurve)>,
}

/// The setups the digest describes: 3 users striping at 3:2:1 (Fig. 7, 8), 2 users
/// sequential with B at a quarter of A (Fig. 9).
pub fn setups() -> Vec<SharedSetup> {
    vec![
        SharedSetup {
            name: "3 users, striping, 3:2:1".into(),
            allocation: Allocation::Str,
            ratio: vec![3.0, 2.0, 1.0],
        },
        SharedSetup {
            name: "2 users, sequential, 4:1".into(),
            allocation: Allocation::Seq,
            ratio: vec![4.0, 1.0],
        },
    ]
}

/// The unit loads of a sweep: the single-user loads divided by the ratio's sum, so the total
/// offered load runs over the same range.
pub fn units(config: &MigrationConfig, setup: &SharedSetup) -> Vec<f64> {
    let sum: f64 = setup.ratio.iter().sum();
    config
        .loads
        .iter()
        .map(|l| l / sum * setup.ratio.len() as f64)
        .collect()
}

fn stack_text(config: &MigrationConfig, users: usize) -> String {
    let part = config.partition_bytes / users as u64 / (1 << 20) * (1 << 20);
    let mut text = String::from("top = \"d0u0\"\n\n");
    for k in 0..users {
        text.push_str(&format!(
            "[[disk]]\nname = \"d{k}\"\nmodel = \"{}\"\n\n",
            config.model
        ));
    }
    for k in 0..users {
        for u in 0..users {
            text.push_str(&format!(
                "[[layer]]\nname = \"d{k}u{u}\"\nkind = \"slice\"\nchildren = [\"d{k}\"]\noffset = {}\nlength = {part}\n\n",
                u as u64 * part
            ));
        }
    }
    text
}

/// One point of a shared setup, from a fresh simulation.
pub fn run_shared_point(
    config: &MigrationConfig,
    setup: &SharedSetup,
    policy: Policy,
    rtt_ms: u32,
    unit: f64,
) -> Result<SharedPoint, String> {
    let users = setup.ratio.len();
    let table: toml::Table = stack_text(config, users)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let spec = StackSpec::from_toml(&table)?;
    let sim = Simulation::with_config(SimConfig::new(config.seed));
    let stack = spec.build(
        &sim,
        &crate::models::build,
        DataMode::TimingOnly,
        Path::new("."),
    )?;
    let params = LinkParams::migration_rtt_ms(rtt_ms).ok_or("not a Table 1 RTT")?;
    let kind = registry::find("migrate").ok_or("no migrate layer in the registry")?;
    let mut tops = Vec::new();
    let mut setups = Vec::new();
    for (u, share) in setup.ratio.iter().enumerate() {
        let point = PointSetup {
            allocation: setup.allocation,
            policy,
            rtt_ms,
            tokens: config.tokens,
            load: unit * share,
        };
        let mut children = Vec::new();
        let mut names = Vec::new();
        for j in 0..users {
            let k = (u + j) % users;
            let name = format!("d{k}u{u}");
            let slice = stack.nodes[&name].clone();
            children.push(Some(if j == 0 {
                slice
            } else {
                Arc::new(Linked::new(
                    slice,
                    params.clone(),
                    derive_seed(config.seed, &format!("link-{u}-{k}")),
                    sim.handle(),
                )) as DeviceRef
            }));
            names.push(name);
        }
        let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        let text = migrate_layer(
            config,
            &format!("mig{u}"),
            &quoted.join(", "),
            &point,
            derive_seed(config.seed, &format!("migrate-policy-{u}")),
        );
        let parsed: toml::Table = text.parse().map_err(|e| format!("{e}"))?;
        let layer_table = parsed["layer"].as_array().and_then(|a| a[0].as_table());
        let layer = graph::layer_from_table(layer_table.ok_or("no layer table")?)
            .map_err(|e| format!("{e:?}"))?;
        let args = LayerArgs {
            name: layer.name.clone(),
            children,
            child_names: names,
            options: Options::new(layer.options.clone(), Path::new(".").to_path_buf()),
            runtime: sim.runtime(),
            start: StartPolicy::FRESH,
        };
        let device = sim
            .block_on((kind.build)(args))
            .map_err(|e| format!("layer mig{u}: {e}"))?;
        tops.push(device);
        setups.push(point);
    }
    // Creation phases, one user after the other.
    for top in &tops {
        driver::run(
            &sim,
            top.clone(),
            &mut super::Listed(sfs::creation(config.data_bytes).into_iter()),
            &[],
            &quiet(None),
        );
    }
    let seconds = config.warmup_s + config.measure_s;
    let workloads = setups
        .iter()
        .enumerate()
        .map(|(u, s)| {
            sfs::SfsLike::new(
                config.data_bytes,
                config.theta,
                s.load,
                (seconds * SECONDS as f64) as Nanos,
                derive_seed(config.seed, &format!("sfs-shared-{u}-{}", s.load)),
            )
            .map(|w| Box::new(w) as Box<dyn Workload>)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let interval = (config.sample_s * SECONDS as f64) as Nanos;
    let layers: Vec<(DeviceRef, usize)> = tops.iter().map(|t| (t.clone(), users)).collect();
    let (outputs, disk_ios, disk_util) = run_phase(
        &sim,
        &layers,
        workloads,
        interval,
        &stack.disks,
        config.processes,
    )?;
    let mut points = Vec::new();
    let mut disk_requests = vec![vec![0u64; users]; users];
    for (u, ((records, samples), s)) in outputs.iter().zip(&setups).enumerate() {
        let point = measure(config, *s, records, samples);
        let counters: &Counters = &point.counters;
        for (j, requests) in counters.requests.iter().enumerate() {
            disk_requests[(u + j) % users][u] += requests;
        }
        points.push(point);
    }
    Ok(SharedPoint {
        unit,
        users: points,
        disk_requests,
        disk_ios,
        disk_util,
    })
}

/// Both setups, MIG and NOMIG, over the unit loads, each sweep stopping past saturation (the
/// request-weighted mean over `stop_factor × bound_ms`).
pub fn run_shared(config: &MigrationConfig, rtt_ms: u32) -> Result<SharedReport, String> {
    let mut curves = Vec::new();
    for setup in setups() {
        let mut pair = Vec::new();
        for policy in [Policy::Mig, Policy::NoMig] {
            let mut points = Vec::new();
            for unit in units(config, &setup) {
                let point = run_shared_point(config, &setup, policy, rtt_ms, unit)?;
                let over = point.mean_ms() > config.stop_factor * config.bound_ms;
                points.push(point);
                if over {
                    break;
                }
            }
            pair.push(SharedCurve {
                setup: setup.clone(),
                policy,
                name: config_name(setup.allocation, policy),
                points,
            });
        }
        let nomig = pair.pop().expect("two");
        let mig = pair.pop().expect("two");
        curves.push((mig, nomig));
    }
    Ok(SharedReport {
        rtt_ms,
        units: config.loads.clone(),
        curves,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MILLIS;

    #[test]
    fn a_linked_device_adds_a_round_trip_of_the_table_1_row() {
        let sim = Simulation::new(1);
        let table: toml::Table = "[[disk]]\nname = \"d0\"\nmodel = \"intel-x25m-160gb\"\n"
            .parse()
            .unwrap();
        let stack = StackSpec::from_toml(&table)
            .unwrap()
            .build(
                &sim,
                &crate::models::build,
                DataMode::TimingOnly,
                Path::new("."),
            )
            .unwrap();
        let disk = stack.top.clone();
        let linked: DeviceRef = Arc::new(Linked::new(
            disk.clone(),
            LinkParams::migration_rtt_ms(17).unwrap(),
            9,
            sim.handle(),
        ));
        let time = |device: &DeviceRef| {
            let start = sim.now();
            sim.block_on(device.read(0, 4096)).unwrap();
            sim.now() - start
        };
        let n = 400;
        let direct: Nanos = (0..n).map(|_| time(&disk)).sum::<Nanos>() / n;
        let remote: Nanos = (0..n).map(|_| time(&linked)).sum::<Nanos>() / n;
        let added = (remote - direct) as f64 / MILLIS as f64;
        // 17 ms of round trip, plus 4 KiB and two headers at 100 Mb/s (≈ 0.34 ms).
        assert!((added - 17.34).abs() < 0.5, "added {added:.2} ms");
    }
}
