//! `strata brick ...` and `strata cluster ...`: bricks of shared volumes and the cluster
//! catalog they are listed in (issue 19; docs/shared-volumes.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use strata_backend::{FileDevice, FileOptions};
use strata_brick::metrics::BrickMetrics;
use strata_brick::resolve::resolve_in_doubt;
use strata_brick::rpc::{serve_service, BrickClient, BrickService};
use strata_brick::versions::VolumeVersions;
use strata_brick::{BrickOptions, BrickStore, SharedVolume};
use strata_coord::catalog::{BrickRecord, VolumeRecord, RECORD_FORMAT};
use strata_coord::session::{MemberRecord, Session};
use strata_coord::{Coord, CoordError};
use strata_core::{errln, outln, ByteSize, DeviceRef, TokioRuntime};

/// Where the cluster's etcd is.
#[derive(clap::Args, Clone, Debug)]
pub struct EtcdArgs {
    /// An etcd endpoint (`http://host:port`); repeat for each member of the etcd cluster.
    #[arg(long = "etcd", required = true)]
    pub endpoints: Vec<String>,
    /// The Strata cluster's name (its keys live under /strata/<name>/ in etcd).
    #[arg(long, default_value = "strata")]
    pub cluster: String,
}

impl EtcdArgs {
    async fn connect(&self) -> anyhow::Result<Coord> {
        Coord::connect(&self.endpoints, &self.cluster, Duration::from_secs(5))
            .await
            .with_context(|| format!("etcd at {}", self.endpoints.join(",")))
    }
}

#[derive(clap::Subcommand)]
pub enum BrickCommand {
    /// Lay a new, empty brick on a file (created, and allocated whole, when missing) or
    /// block device. Refused over a device that holds Strata metadata, unless --force.
    Format {
        path: PathBuf,
        /// Leave a new file sparse. Versions then cost more: the old data they keep pushes
        /// new writes into parts of the file never written, and the file system allocates
        /// at each (docs/shared-volumes.md, "Measured: what versions cost").
        #[arg(long)]
        sparse: bool,
        /// Write a new file whole with zeros before formatting it. A file allocated with
        /// fallocate holds unwritten extents: the file system converts each at its first
        /// write and journals that at the next sync, so a fresh volume's first pass runs at
        /// half speed (docs/benchmarks.md, run K). This costs one full write of the file,
        /// now. Only for a file this command creates.
        #[arg(long, conflicts_with = "sparse")]
        zero: bool,
        /// The share of a volume the brick holds (its home region).
        #[arg(long)]
        home: String,
        /// The device's size, for a file that does not exist yet.
        #[arg(long)]
        size: Option<String>,
        /// The brick's metadata region.
        #[arg(long, default_value = "16M")]
        meta: String,
        /// Format even over Strata metadata (destroys what it describes).
        #[arg(long)]
        force: bool,
    },
    /// Write a brick's share (or a version of it) to a file, as its durable metadata says.
    /// Opens the brick read-only and writes nothing to it: safe while it is served.
    Dump {
        path: PathBuf,
        /// Where to write the share (the whole of it).
        #[arg(long)]
        output: PathBuf,
        /// A version of the share instead of its current data.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Serve a brick's transaction channel. With --etcd, join the cluster as a brick (listed
    /// in its catalog) and resolve the intervals in doubt of clients whose lease is gone.
    Serve {
        path: PathBuf,
        #[arg(long, default_value = "127.0.0.1:10810")]
        listen: String,
        /// The brick's name in the cluster (default: the file's stem).
        #[arg(long)]
        name: Option<String>,
        #[arg(long = "etcd")]
        endpoints: Vec<String>,
        #[arg(long, default_value = "strata")]
        cluster: String,
        /// The brick's etcd lease: how long after it dies the cluster counts it gone.
        #[arg(long, default_value = "10s")]
        lease: String,
        /// Serve Prometheus metrics at http://ADDR/metrics (host:port).
        #[arg(long)]
        metrics: Option<String>,
    },
    /// What a served brick holds now: its format and share, units used, free and kept by
    /// versions, its versions, the intervals it holds in doubt, and a roll-back or deletion
    /// with its progress.
    Status {
        /// The brick's transaction channel (host:port, its `serve --listen`).
        address: String,
        /// How long to wait for its answer.
        #[arg(long, default_value = "5s")]
        timeout: String,
    },
}

#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// List the cluster's live members, bricks, shared volumes and their lock claims.
    Status {
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Create a shared volume over bricks of the catalog: each --mirror is one mirror set
    /// (comma-separated bricks, two or more for RAIN-10); data is striped over the sets.
    CreateVolume {
        #[command(flatten)]
        etcd: EtcdArgs,
        name: String,
        #[arg(long)]
        size: String,
        #[arg(long = "mirror", required = true)]
        mirrors: Vec<String>,
        /// The stripe unit.
        #[arg(long, default_value = "1M")]
        unit: String,
        /// The lock segment: the unit in which lock servers claim the volume.
        #[arg(long, default_value = "64M")]
        segment: String,
    },
    /// Put brick NEW in the place of OLD in a shared volume (OLD failed, or is to be moved
    /// off), then copy NEW's share to it from its mirror peers, with progress. NEW must be
    /// formatted, served and in the catalog, and in no volume. Hosts serving the volume go on
    /// writing; NEW is read only where copied to.
    ReplaceBrick {
        #[command(flatten)]
        etcd: EtcdArgs,
        volume: String,
        old: String,
        new: String,
        /// Only record the replacement: the copy is left to `strata cluster rebuild` (hosts
        /// that write copy some regions at each flush too).
        #[arg(long)]
        no_rebuild: bool,
    },
    /// Copy to the bricks of a shared volume every region they miss (a replaced brick, one
    /// that was down), with progress; returns once none is left.
    Rebuild {
        #[command(flatten)]
        etcd: EtcdArgs,
        volume: String,
        /// How long the copy may make no progress (a brick down, a region whose every copy
        /// is stale) before it gives up.
        #[arg(long, default_value = "60s")]
        stall: String,
    },
    /// Globally consistent versions of a shared volume: take one while hosts write, list,
    /// delete, roll back (docs/shared-volumes.md, "Versions").
    Version {
        #[command(subcommand)]
        command: VersionCommand,
    },
}

#[derive(clap::Subcommand)]
pub enum VersionCommand {
    /// Take the next version: a cut consistent across every brick. Waits for every host that
    /// holds claims on the volume to acknowledge it; refused while a brick is stale or down.
    Create {
        #[command(flatten)]
        etcd: EtcdArgs,
        volume: String,
        /// How long to wait for the hosts and bricks before the version is recorded failed.
        #[arg(long, default_value = "30s")]
        wait: String,
        /// Then delete the oldest complete versions until only the newest N remain.
        #[arg(long, value_name = "N")]
        keep: Option<usize>,
        /// Take one every DURATION (`30s`, `5m`), until SIGINT or SIGTERM: a version that fails
        /// or is refused (a brick down) is reported and the next one taken on time.
        #[arg(long, value_name = "DURATION")]
        every: Option<String>,
    },
    /// The versions recorded in etcd and the ones each brick keeps, with the bytes they hold.
    List {
        #[command(flatten)]
        etcd: EtcdArgs,
        volume: String,
    },
    /// Delete a version on every brick, then its record.
    Delete {
        #[command(flatten)]
        etcd: EtcdArgs,
        volume: String,
        number: u64,
    },
    /// Roll the volume back to a complete version on every brick (the newer ones are
    /// deleted). Refused while any host holds claims on it or a brick is stale or down; run
    /// it again to finish one that was interrupted.
    Rollback {
        #[command(flatten)]
        etcd: EtcdArgs,
        volume: String,
        number: u64,
    },
}

/// Takes one version, then deletes the oldest beyond `keep`.
async fn take_version(
    versions: &VolumeVersions,
    volume: &str,
    wait: Duration,
    keep: Option<usize>,
) -> anyhow::Result<()> {
    let number = versions.create(wait).await?;
    outln!("volume {volume}: version {number} complete");
    if let Some(keep) = keep {
        for deleted in versions.prune(keep).await? {
            outln!("volume {volume}: version {deleted} deleted (keeping the newest {keep})");
        }
    }
    Ok(())
}

/// Takes a version every `every` until SIGINT or SIGTERM, which end the wait between two,
/// never a version being taken (an interrupted one would stay recorded as being taken). A
/// version that fails is reported on stderr and the schedule goes on; a period that a taking
/// overruns is skipped, not made up.
async fn take_versions_every(
    versions: &VolumeVersions,
    volume: &str,
    wait: Duration,
    keep: Option<usize>,
    every: Duration,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        // A signal that came during the last taking is seen here, before the next tick.
        tokio::select! {
            biased;
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = ticks.tick() => {}
        }
        if let Err(error) = take_version(versions, volume, wait, keep).await {
            tracing::warn!(volume, %error, "scheduled version not taken");
            errln!("strata: volume {volume}: scheduled version not taken: {error:#}");
        }
    }
    outln!("volume {volume}: stopped taking versions");
    Ok(())
}

/// Each brick request of a version command waits at most this.
const BRICK_TIMEOUT: Duration = Duration::from_secs(10);

async fn run_version(command: VersionCommand) -> anyhow::Result<()> {
    match command {
        VersionCommand::Create {
            etcd,
            volume,
            wait,
            keep,
            every,
        } => {
            let wait = strata_core::duration::parse_duration(&wait)
                .map_err(anyhow::Error::msg)
                .context("--wait")?;
            if keep == Some(0) {
                bail!("--keep 0 would delete the version just taken: keep at least 1");
            }
            let every = every
                .map(|every| strata_core::duration::parse_duration(&every))
                .transpose()
                .map_err(anyhow::Error::msg)
                .context("--every")?;
            if every.is_some_and(|every| every.is_zero()) {
                bail!("--every must be longer than 0");
            }
            let versions =
                VolumeVersions::open(&etcd.connect().await?, &volume, BRICK_TIMEOUT).await?;
            match every {
                None => take_version(&versions, &volume, wait, keep).await?,
                Some(every) => take_versions_every(&versions, &volume, wait, keep, every).await?,
            }
        }
        VersionCommand::List { etcd, volume } => {
            let versions =
                VolumeVersions::open(&etcd.connect().await?, &volume, BRICK_TIMEOUT).await?;
            let list = versions.list().await?;
            outln!("volume {volume}: version counter {}", list.counter);
            if let Some(to) = list.rollback {
                outln!(
                    "  rolling back to version {to}, unfinished: run `strata cluster version \
                     rollback {volume} {to}` again"
                );
            }
            for (number, record) in &list.complete {
                outln!(
                    "  version {number}: complete at {}",
                    unix_ms(record.completed_ms)
                );
            }
            for (number, record) in &list.taking {
                let holders: Vec<&str> = record.holders.iter().map(|h| h.member.as_str()).collect();
                outln!(
                    "  version {number}: being taken since {} (or interrupted), waiting for {holders:?}",
                    unix_ms(record.started_ms)
                );
            }
            for (number, record) in &list.failed {
                outln!(
                    "  version {number}: failed at {}: {}",
                    unix_ms(record.failed_ms),
                    record.why
                );
            }
            for (brick, answer) in &list.bricks {
                match answer {
                    Ok(kept) if kept.is_empty() => outln!("  brick {brick}: no versions"),
                    Ok(kept) => {
                        let kept: Vec<String> = (kept.iter())
                            .map(|v| format!("{} ({} bytes held)", v.number, v.held_bytes))
                            .collect();
                        outln!("  brick {brick}: versions {}", kept.join(", "));
                    }
                    Err(error) => outln!("  brick {brick}: did not answer: {error}"),
                }
            }
        }
        VersionCommand::Delete {
            etcd,
            volume,
            number,
        } => {
            let versions =
                VolumeVersions::open(&etcd.connect().await?, &volume, BRICK_TIMEOUT).await?;
            versions.delete(number).await?;
            outln!("volume {volume}: version {number} deleted");
        }
        VersionCommand::Rollback {
            etcd,
            volume,
            number,
        } => {
            let versions =
                VolumeVersions::open(&etcd.connect().await?, &volume, BRICK_TIMEOUT).await?;
            versions.rollback(number).await?;
            outln!("volume {volume}: rolled back to version {number}");
        }
    }
    Ok(())
}

/// Copies to the volume's bricks what they miss, as a host of the volume of its own (a
/// member named after this process), showing progress; see `SharedVolume::rebuild`.
async fn rebuild(coord: &Coord, volume: &str, stall: Duration) -> anyhow::Result<()> {
    let member = format!("rebuild-{}", std::process::id());
    let shared = SharedVolume::open(coord, volume, &member, stall, Duration::from_secs(10))
        .await
        .with_context(|| format!("opening volume {volume}"))?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} regions, eta {eta}")?
            .progress_chars("=> "),
    );
    bar.set_message(format!("volume {volume}: copying"));
    let started = std::time::Instant::now();
    let rebuilt = shared
        .rebuild(|copied, of| {
            bar.set_length(of);
            bar.set_position(copied);
        })
        .await;
    bar.finish_and_clear();
    // Its claims go with it at once: a writing host may be waiting for the last segment it
    // copied (it would wait out the lease otherwise, longer than a host's request timeout).
    let closed = shared.close().await;
    let rebuilt = rebuilt?;
    closed.context("leaving the cluster after the rebuild")?;
    let departed = coord.forget_stale_of_departed(volume).await?;
    if !departed.is_empty() {
        outln!(
            "volume {volume}: removed the stale records of bricks no longer in it: {}",
            departed.join(", ")
        );
    }
    outln!(
        "volume {volume}: rebuilt in {:.1} s; none missing: {} regions copied here, {} by hosts' flushes",
        started.elapsed().as_secs_f64(),
        rebuilt.copied,
        rebuilt.by_others,
    );
    Ok(())
}

/// Milliseconds since the Unix epoch, as `unix <seconds>.<millis>`.
fn unix_ms(ms: u64) -> String {
    format!("unix {}.{:03}", ms / 1000, ms % 1000)
}

fn size(text: &str) -> anyhow::Result<u64> {
    Ok(ByteSize::parse(text).map_err(anyhow::Error::msg)?.0)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata")
        .build()?)
}

fn open_file(path: &Path, size: Option<u64>) -> anyhow::Result<DeviceRef> {
    let mut options = FileOptions::new(path);
    options.size = size;
    let device = FileDevice::open(options, TokioRuntime::current())
        .with_context(|| format!("{}", path.display()))?;
    Ok(Arc::new(device))
}

/// Writes a new brick file whole with zeros, and syncs it, showing progress.
fn write_zeros(path: &Path, bytes: u64) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;

    const CHUNK: u64 = 8 << 20;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("{}", path.display()))?;
    let bar = indicatif::ProgressBar::new(bytes);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes}, eta {eta}",
        )?
        .progress_chars("=> "),
    );
    bar.set_message(format!("{}: writing zeros", path.display()));
    let zeros = vec![0u8; CHUNK as usize];
    let mut offset = 0;
    while offset < bytes {
        let len = CHUNK.min(bytes - offset) as usize;
        file.write_all_at(&zeros[..len], offset)
            .with_context(|| format!("writing zeros to {} at {offset}", path.display()))?;
        offset += len as u64;
        bar.set_position(offset);
    }
    file.sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    bar.finish_and_clear();
    Ok(())
}

/// Allocates a new brick file whole. Where the file system cannot (no fallocate), the file
/// stays sparse, which costs speed, not safety: said, not refused.
fn allocate(path: &Path, bytes: u64) {
    let allocated = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|file| {
            rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, bytes)
                .map_err(std::io::Error::from)
        });
    if let Err(error) = allocated {
        tracing::warn!(path = %path.display(), %error, "the brick file could not be allocated whole; it stays sparse");
    }
}

pub fn run_brick(command: BrickCommand) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        match command {
            BrickCommand::Format {
                path,
                sparse,
                zero,
                home,
                size: file_size,
                meta,
                force,
            } => {
                if file_size.is_none() && !path.exists() {
                    bail!(
                        "{} does not exist: give --size to create it",
                        path.display()
                    );
                }
                let new_file = !path.exists();
                if zero && !new_file {
                    // What is there may be data: only format's own checks may decide that.
                    bail!(
                        "{} exists: --zero writes only a file this command creates",
                        path.display()
                    );
                }
                let file_size = file_size.as_deref().map(size).transpose()?;
                let device = open_file(&path, file_size)?;
                if let (true, false, Some(bytes)) = (new_file, sparse, file_size) {
                    if zero {
                        write_zeros(&path, bytes)?;
                    } else {
                        allocate(&path, bytes);
                    }
                }
                let options = BrickOptions {
                    meta_bytes: size(&meta)?,
                    home_bytes: size(&home)?,
                    min_staging_bytes: 1 << 20,
                };
                let store = BrickStore::format(device, &options, force)
                    .await
                    .with_context(|| format!("formatting {}", path.display()))?;
                let layout = store.layout();
                outln!(
                    "brick {}: home {} bytes, staging {} bytes",
                    path.display(),
                    layout.home_bytes,
                    layout.staging_bytes
                );
                Ok(())
            }
            BrickCommand::Dump {
                path,
                output,
                version,
            } => {
                let mut options = FileOptions::new(&path);
                options.read_only = true;
                let device: DeviceRef = Arc::new(
                    FileDevice::open(options, TokioRuntime::current())
                        .with_context(|| format!("{}", path.display()))?,
                );
                let share = strata_brick::inspect::read_share(&device, version)
                    .await
                    .with_context(|| format!("reading the share of {}", path.display()))?;
                std::fs::write(&output, &share)
                    .with_context(|| format!("writing {}", output.display()))?;
                outln!(
                    "brick {}: {} bytes of its share{} written to {}",
                    path.display(),
                    share.len(),
                    version.map_or(String::new(), |n| format!(" (version {n})")),
                    output.display()
                );
                Ok(())
            }
            BrickCommand::Serve {
                path,
                listen,
                name,
                endpoints,
                cluster,
                lease,
                metrics: metrics_address,
            } => {
                let lease = strata_core::duration::parse_duration(&lease)
                    .map_err(anyhow::Error::msg)
                    .context("--lease")?;
                let name = match name {
                    Some(name) => name,
                    None => path
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .context("give --name")?,
                };
                let device = open_file(&path, None)?;
                let (store, report) = BrickStore::open(device)
                    .await
                    .with_context(|| format!("opening brick {}", path.display()))?;
                let store = Arc::new(store);
                let listener = tokio::net::TcpListener::bind(&listen)
                    .await
                    .with_context(|| format!("listening on {listen}"))?;
                let address = listener.local_addr()?.to_string();
                tracing::info!(brick = %name, %address, ?report, "serving brick");
                let member = if endpoints.is_empty() {
                    None
                } else {
                    let etcd = EtcdArgs { endpoints, cluster };
                    Some(join_as_brick(&etcd, &name, &address, &store, lease).await?)
                };
                let shutdown = async {
                    let _ = tokio::signal::ctrl_c().await;
                };
                let metrics = BrickMetrics::new(&name);
                if let Some(metrics_address) = &metrics_address {
                    serve_metrics(metrics_address, &metrics, &store).await?;
                }
                let service = BrickService::with_metrics(store.clone(), metrics);
                let served = tokio::spawn(serve_service(service, listener, shutdown));
                if let Some((coord, session)) = member {
                    let session = Arc::new(std::sync::Mutex::new(session));
                    let record = MemberRecord {
                        name: name.clone(),
                        role: "brick".into(),
                        address: address.clone(),
                    };
                    let membership = tokio::spawn(keep_membership(
                        coord.clone(),
                        session.clone(),
                        record,
                        lease,
                    ));
                    let resolver =
                        tokio::spawn(resolve_forever(coord, name.clone(), store.clone()));
                    served.await??;
                    resolver.abort();
                    membership.abort();
                    let session = session.lock().unwrap().clone();
                    session.close().await.ok();
                } else {
                    served.await??;
                }
                Ok(())
            }
            BrickCommand::Status { address, timeout } => {
                let timeout = strata_core::duration::parse_duration(&timeout)
                    .map_err(anyhow::Error::msg)
                    .context("--timeout")?;
                crate::brick_status::show(&address, timeout).await
            }
        }
    })
}

/// Serves the brick's metrics, its calls' and its store's, at `http://address/metrics`.
async fn serve_metrics(
    address: &str,
    metrics: &BrickMetrics,
    store: &Arc<BrickStore>,
) -> anyhow::Result<()> {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry, store.clone());
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("binding the metrics listener on {address}"))?;
    tracing::info!(address = %listener.local_addr()?, "serving brick metrics");
    tokio::spawn(crate::metrics_http::run(listener, Arc::new(registry)));
    Ok(())
}

async fn join_as_brick(
    etcd: &EtcdArgs,
    name: &str,
    address: &str,
    store: &BrickStore,
    lease: Duration,
) -> anyhow::Result<(Coord, Session)> {
    let coord = etcd.connect().await?;
    let record = MemberRecord {
        name: name.to_string(),
        role: "brick".into(),
        address: address.to_string(),
    };
    // A brick restarted quickly after a crash finds its previous session still live in etcd
    // until that lease runs out; so would a second process serving the same brick, which must
    // not join. Wait, saying so, rather than give up or take the name.
    let mut waited = Duration::ZERO;
    let session = loop {
        match Session::open(&coord, record.clone(), lease).await {
            Ok(session) => break session,
            Err(CoordError::Exists(what)) => {
                if waited.as_secs().is_multiple_of(5) {
                    tracing::warn!(%what, waited = ?waited, "another session of this brick is live; waiting for its lease to run out");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                waited += Duration::from_secs(1);
            }
            Err(e) => return Err(e.into()),
        }
    };
    let brick = BrickRecord {
        format: RECORD_FORMAT,
        name: name.to_string(),
        address: address.to_string(),
        size_bytes: store.layout().home_bytes,
    };
    match coord.add_brick(&brick).await {
        Ok(()) => {}
        Err(CoordError::Exists(_)) => {
            let listed = coord
                .bricks()
                .await?
                .into_iter()
                .find(|b| b.record.name == name)
                .context("brick vanished from the catalog")?;
            if listed.record.size_bytes != brick.size_bytes || listed.record.address != address {
                bail!(
                    "the catalog lists brick {name:?} at {} with {} bytes; this one is at \
                     {address} with {} (another brick of that name?)",
                    listed.record.address,
                    listed.record.size_bytes,
                    brick.size_bytes
                );
            }
        }
        Err(e) => return Err(e.into()),
    }
    Ok((coord, session))
}

/// Keeps the brick a member of the cluster: its heartbeat renews the lease, and if the lease
/// ran out anyway (a partition, a pause longer than the lease) the brick joins again under a
/// new one. A brick's membership fences nothing of its own (its answers do not depend on it),
/// but `strata cluster status` lists the bricks that are members.
async fn keep_membership(
    coord: Coord,
    session: Arc<std::sync::Mutex<Session>>,
    record: MemberRecord,
    lease: Duration,
) {
    let mut current = session.lock().unwrap().clone();
    let mut _heartbeat = current.heartbeat();
    loop {
        tokio::time::sleep((lease / 2).max(Duration::from_millis(200))).await;
        if current.is_live() {
            continue;
        }
        if !matches!(current.renew().await, Err(CoordError::Fenced(_))) {
            continue;
        }
        tracing::warn!(member = %current.name(), "this brick's lease ran out: joining the cluster again");
        match Session::open(&coord, record.clone(), lease).await {
            Ok(joined) => {
                tracing::info!(member = %joined.name(), "joined the cluster again");
                _heartbeat = joined.heartbeat();
                *session.lock().unwrap() = joined.clone();
                current = joined;
            }
            Err(error) => {
                tracing::warn!(%error, "joining again failed; trying later");
            }
        }
    }
}

/// Every two seconds: the intervals in doubt here whose client's lease is gone are resolved
/// from the other bricks of their volume.
async fn resolve_forever(coord: Coord, name: String, store: Arc<BrickStore>) {
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        match store.try_in_doubt().await {
            Ok(listed) if listed.is_empty() => continue,
            Ok(_) => {}
            Err(error) => {
                tracing::error!(%error, "this brick cannot list what it holds in doubt");
                continue;
            }
        }
        let (me, peers) = match peers_of(&coord, &name).await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, "cannot find this brick's volume; intervals stay in doubt");
                continue;
            }
        };
        let fenced = |client: u64| {
            let coord = coord.clone();
            // Unknown (etcd unavailable) counts as live: only a lease etcd says is gone fences.
            async move { matches!(coord.lease_alive(client as i64).await, Ok(false)) }
        };
        if let Err(error) = resolve_in_doubt(&store, me, &peers, fenced).await {
            tracing::error!(%error, "resolving intervals in doubt failed");
        }
    }
}

/// How long `cluster status` waits for a brick to say what it holds.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(2);

/// This brick's index in its volume, and a client of every other brick of it.
async fn peers_of(coord: &Coord, name: &str) -> anyhow::Result<(u64, BTreeMap<u64, BrickClient>)> {
    let volume = coord
        .volumes()
        .await?
        .into_iter()
        .find(|v| v.record.bricks().any(|b| b == name))
        .context("no volume uses this brick")?;
    let bricks = coord.bricks().await?;
    let mut me = None;
    let mut peers = BTreeMap::new();
    for (index, brick) in volume.record.bricks().enumerate() {
        if brick == name {
            me = Some(index as u64);
            continue;
        }
        let record = bricks
            .iter()
            .find(|b| &b.record.name == brick)
            .with_context(|| format!("brick {brick} is not in the catalog"))?;
        peers.insert(
            index as u64,
            BrickClient::new(&record.record.address, Duration::from_secs(5))?,
        );
    }
    Ok((me.expect("found above"), peers))
}

pub fn run_cluster(command: ClusterCommand) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        match command {
            ClusterCommand::Status { etcd } => {
                let coord = etcd.connect().await?;
                outln!("cluster {}", coord.cluster());
                outln!("members:");
                for member in coord.members().await? {
                    let r = &member.record;
                    outln!(
                        "  {} ({}) {} lease {:x}",
                        r.name,
                        r.role,
                        r.address,
                        member.lease
                    );
                }
                outln!("bricks:");
                let bricks = coord.bricks().await?;
                // Each brick is asked what it holds, all at once, each for at most
                // DESCRIBE_TIMEOUT: a brick down costs the status that long, not more.
                let answers = futures_util::future::join_all(bricks.iter().map(|brick| async {
                    let client = BrickClient::new(&brick.record.address, DESCRIBE_TIMEOUT)
                        .map_err(|e| strata_brick::rpc::RpcError::Unreachable {
                            address: brick.record.address.clone(),
                            why: e.to_string(),
                        })?;
                    client.describe().await
                }))
                .await;
                for (brick, answer) in bricks.iter().zip(&answers) {
                    let r = &brick.record;
                    outln!(
                        "  {} at {}, {} bytes: {}",
                        r.name,
                        r.address,
                        r.size_bytes,
                        crate::brick_status::brief(answer)
                    );
                }
                outln!("volumes:");
                for volume in coord.volumes().await? {
                    let r = &volume.record;
                    let sets: Vec<String> = r.mirror_sets.iter().map(|s| s.join("+")).collect();
                    outln!(
                        "  {}: {} bytes, unit {}, sets [{}], version {}, {} of {} segments claimed",
                        r.name,
                        r.size_bytes,
                        r.unit_bytes,
                        sets.join(", "),
                        coord.version(&r.name).await?,
                        coord.claims(&r.name).await?.len(),
                        r.segments()
                    );
                    if let Some(to) = coord.rollback_pending(&r.name).await? {
                        outln!(
                            "    rolling back to version {to}: unfinished until \
                             `strata cluster version rollback {} {to}` is run again",
                            r.name
                        );
                    }
                    for (brick, regions) in coord.stale(&r.name).await? {
                        outln!(
                            "    brick {brick} is stale: {} regions to copy back",
                            regions.len()
                        );
                    }
                }
                Ok(())
            }
            ClusterCommand::CreateVolume {
                etcd,
                name,
                size: volume_size,
                mirrors,
                unit,
                segment,
            } => {
                let coord = etcd.connect().await?;
                let record = VolumeRecord {
                    format: RECORD_FORMAT,
                    name: name.clone(),
                    size_bytes: size(&volume_size)?,
                    unit_bytes: size(&unit)?,
                    segment_bytes: size(&segment)?,
                    mirror_sets: mirrors
                        .iter()
                        .map(|set| set.split(',').map(|b| b.trim().to_string()).collect())
                        .collect(),
                };
                coord.create_volume(&record).await?;
                outln!(
                    "volume {name}: {} bytes over {} sets of {} bricks",
                    record.size_bytes,
                    record.mirror_sets.len(),
                    record.copies()
                );
                Ok(())
            }
            ClusterCommand::ReplaceBrick {
                etcd,
                volume,
                old,
                new,
                no_rebuild,
            } => {
                let coord = etcd.connect().await?;
                let replaced = coord.replace_brick(&volume, &old, &new).await?;
                outln!(
                    "volume {volume}: brick {new} replaces {old}; {} regions to copy to it",
                    replaced.regions
                );
                if no_rebuild {
                    return Ok(());
                }
                rebuild(&coord, &volume, Duration::from_secs(60)).await
            }
            ClusterCommand::Rebuild {
                etcd,
                volume,
                stall,
            } => {
                let stall = strata_core::duration::parse_duration(&stall)
                    .map_err(anyhow::Error::msg)
                    .context("--stall")?;
                rebuild(&etcd.connect().await?, &volume, stall).await
            }
            ClusterCommand::Version { command } => run_version(command).await,
        }
    })
}
