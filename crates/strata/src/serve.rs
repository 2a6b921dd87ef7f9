//! `strata serve`: build the stack, bind the listeners, serve until a signal, then close
//! in order (stop accepting, answer in-flight requests, flush every device).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use prometheus_client::registry::Registry;
use strata_core::{outln, MetricsRegistry, TokioRuntime};
use strata_nbd::tls::{ServerTls, TlsMode};
use strata_nbd::{Limits, Listener, Server};
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use strata_stack::build;
use strata_stack::config::{self, ListenAddr, Loaded};
use strata_stack::control::ControlPlane;
use strata_stack::hierarchy;
use strata_stack::reconfig::Reconfig;

use crate::admin::{self, AdminState};
use crate::migrate_metrics::MigrateCollector;
use crate::pool_metrics::PoolCollector;
use crate::stage_metrics::StageCollector;

/// How long shutdown waits for clients to take their last replies.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// `strata serve`'s flags.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Data folder (default ./strata-data; overrides the config's data-dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Rebuild the hierarchy from the labels on these disks instead of a config (members
    /// not given are served as missing where their layer tolerates it).
    #[arg(long, num_args = 1.., conflicts_with = "config")]
    pub assemble: Vec<PathBuf>,
    /// Let LAYER format its metadata even though its disks are not blank (repeatable).
    /// Without it a layer formats only when every disk under it had no label and zeros
    /// where the label goes before this start. Damaged metadata is never formatted over.
    #[arg(long = "format", value_name = "LAYER")]
    pub format: Vec<String>,
    /// Start layers with members missing that their metadata counts as in sync (they are
    /// then treated as failed). Without it such a layer is refused, and the others serve.
    #[arg(long)]
    pub degraded: bool,
    /// Serve on ADDR instead of where the config (or an assembled hierarchy) says
    /// (repeatable): `unix:PATH` (a relative path is in the data folder) or
    /// `tcp:HOST:PORT`, as in the config's `listen`.
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<ListenAddr>,
}

/// Checks the start flags against the loaded config, before anything is created or opened.
pub fn start_options(args: &ServeArgs, loaded: &Loaded) -> anyhow::Result<build::StartOptions> {
    let mut format = std::collections::BTreeSet::new();
    for name in &args.format {
        if !loaded.layers.iter().any(|l| &l.name == name) {
            let known: Vec<&str> = loaded.layers.iter().map(|l| l.name.as_str()).collect();
            bail!(
                "--format {name}: no layer named {name:?} in {} (layers: {})",
                loaded.file,
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            );
        }
        format.insert(name.clone());
    }
    if args.degraded {
        warn!(
            "starting with --degraded: layers may start with members missing that their \
             metadata counts as in sync, and treat them as failed (they then need `strata replace`)"
        );
    }
    Ok(build::StartOptions {
        format,
        degraded: args.degraded,
    })
}

/// The data folder of a start without a config file: `--data-dir`, else `./strata-data`;
/// created if missing.
fn data_dir(args: &ServeArgs) -> anyhow::Result<PathBuf> {
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("strata-data"));
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating data folder {}", data_dir.display()))?;
    Ok(data_dir)
}

/// Loads `text`, the content of `path`: the file later reconfiguration records into.
fn load_file(
    text: &str,
    path: PathBuf,
    base: &Path,
    data_dir: Option<&Path>,
) -> anyhow::Result<Loaded> {
    let mut loaded = config::load(text, &path.display().to_string(), base, data_dir)?;
    loaded.source = Some(path);
    Ok(loaded)
}

/// `--assemble`: the hierarchy the disks' labels describe, written to
/// `<data-dir>/assembled.toml` (so that later reconfiguration has a file to record into).
fn assemble_config(args: &ServeArgs) -> anyhow::Result<Loaded> {
    let mut labels = Vec::new();
    for path in &args.assemble {
        let path =
            std::fs::canonicalize(path).with_context(|| format!("disk {}", path.display()))?;
        let label = hierarchy::read_label_file(&path)?;
        labels.push((path, label));
    }
    let assembly = hierarchy::assemble(labels)?;
    let text = hierarchy::assembled_config(&assembly)?;
    let data_dir = data_dir(args)?;
    let path = data_dir.join("assembled.toml");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    info!(
        hierarchy = %assembly.label.uuid,
        generation = assembly.label.generation,
        members = assembly.paths.len(),
        "assembled from disk labels into {}",
        path.display()
    );
    load_file(&text, path, Path::new("."), Some(&data_dir))
}

/// Loads the configuration: the disks' labels (`--assemble`), the given file, else
/// `<data-dir>/strata.toml`, which is written from the embedded default on first start so that
/// the administrator can see and edit it. `--listen` replaces the listeners of any of them.
pub fn load_config(args: &ServeArgs) -> anyhow::Result<Loaded> {
    let mut loaded = if !args.assemble.is_empty() {
        assemble_config(args)?
    } else if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        load_file(&text, path.clone(), base, args.data_dir.as_deref())?
    } else {
        let data_dir = data_dir(args)?;
        let path = data_dir.join("strata.toml");
        if !path.exists() {
            std::fs::write(&path, config::EMBEDDED_DEFAULT)
                .with_context(|| format!("writing {}", path.display()))?;
            outln!(
                "Created {} with the embedded default configuration.",
                path.display()
            );
        }
        let text = std::fs::read_to_string(&path)?;
        load_file(&text, path, Path::new("."), Some(&data_dir))?
    };
    if !args.listen.is_empty() {
        loaded.listen = args.listen.clone();
    }
    Ok(loaded)
}

pub async fn serve(loaded: Loaded, start: build::StartOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    let runtime = TokioRuntime::current();
    let metrics = MetricsRegistry::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let stack = build::build(&loaded, &start, runtime.clone(), &metrics).await?;
    registry.register_collector(Box::new(PoolCollector::new(stack.thin_pools().await)));
    registry.register_collector(Box::new(StageCollector::new(stack.stages().await)));
    registry.register_collector(Box::new(MigrateCollector::new(stack.migrates().await)));
    let tls = match loaded.server_tls() {
        Some((mode, files)) => ServerTls::load(mode, &files).context("[tls]")?,
        None => ServerTls::off(),
    };
    let server = Server::with_tls(stack.exports.clone(), Limits::default(), tls);

    let mut names = Vec::new();
    for addr in &loaded.listen {
        let listener = bind(addr, &loaded).await?;
        names.push(listener.describe());
        tokio::spawn(server.clone().run(listener));
    }
    let admin_path = loaded.resolve(&loaded.config.admin);
    let admin_listener = bind_unix(&admin_path)?;
    let metrics_addr = loaded.config.metrics.as_ref().map(|m| m.get_ref().clone());
    let state = Arc::new(AdminState {
        started,
        data_dir: loaded.data_dir.display().to_string(),
        listeners: names.clone(),
        plane: Arc::new(ControlPlane {
            server: server.clone(),
            exports: stack.exports.clone(),
            nodes: std::sync::Mutex::new(stack.nodes),
            refused: stack.refused,
            reconfig: tokio::sync::Mutex::new(Reconfig {
                loaded: loaded.clone(),
                runtime,
                metrics: metrics.clone(),
                site: Arc::new(strata_stack::reconfig::Files),
            }),
        }),
        registry,
    });
    tokio::spawn(admin::run(admin_listener, state.clone()));
    if loaded.layers.iter().any(|l| !l.grow_from.is_empty()) {
        tokio::spawn(strata_stack::spares::grow_pools(state.plane.clone()));
    }
    if let Some(addr) = &metrics_addr {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics listener on {addr}"))?;
        tokio::spawn(crate::metrics_http::run(listener, state.clone()));
    }
    // The handlers are in place before "ready" is printed: a supervisor that stops the
    // server the moment it reads that line must get the orderly shutdown, not the
    // default action of SIGTERM (found by CI: a test's terminate landed in between).
    let signals = Signals::install()?;
    print_welcome(&loaded, &state, &admin_path, metrics_addr.as_deref());

    signals.wait().await;
    info!("shutting down: finishing in-flight requests");
    server.shutdown();
    if !server.wait_closed(DRAIN_TIMEOUT).await {
        warn!("some clients did not take their last replies within {DRAIN_TIMEOUT:?}");
    }
    // Background work ends before the final flush, so nothing writes behind it; an
    // unfinished rebuild or resync resumes from its checkpoint at the next start.
    let nodes = state.nodes();
    for node in &nodes {
        if let Err(e) = node.stop_background().await {
            warn!(device = %node.name, "stopping background work failed: {e}");
        }
    }
    let layers = state.plane.reconfig.lock().await.loaded.layers.clone();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let mut flushed = std::collections::HashSet::new();
    let mut failed = false;
    for i in flush_order(&names, &layers) {
        let node = &nodes[i];
        let covered_by = layers
            .iter()
            .filter(|l| l.children.contains(&node.name))
            .find(|l| flushed.contains(l.name.as_str()));
        if let Some(parent) = covered_by {
            // The layer above flushed what it needs of this device (a member it has failed,
            // such as a dead brick, it no longer needs at all).
            tracing::debug!(device = %node.name, parent = %parent.name, "flushed through its parent");
            continue;
        }
        match node.flush().await {
            Ok(()) => {
                flushed.insert(node.name.as_str());
            }
            Err(e) => {
                error!(device = %node.name, "final flush failed: {e}");
                failed = true;
            }
        }
    }
    let _ = std::fs::remove_file(&admin_path);
    if failed {
        bail!("some devices could not be flushed; see the log");
    }
    // Only once everything is flushed: a layer's flush may still write to a shared volume
    // below it, which refuses writes once it has left its cluster.
    for node in &nodes {
        if let Err(e) = node.leave().await {
            warn!(device = %node.name, "leaving its cluster failed (its claims go at its lease's expiry): {e}");
        }
    }
    info!("all devices flushed; goodbye");
    Ok(())
}

/// The final flush's order: parents before their children, so that a child whose parent
/// layer flushed need not be flushed again (a layer's flush covers what it keeps on its
/// children). Indexes into `names`; nodes in no layer's children keep their order, first.
fn flush_order(names: &[&str], layers: &[strata_stack::graph::LayerConfig]) -> Vec<usize> {
    let depth = |name: &str| {
        // The longest chain of layers above `name`; configs are DAGs (checked at load).
        fn above(name: &str, layers: &[strata_stack::graph::LayerConfig], seen: usize) -> usize {
            if seen > layers.len() {
                return seen;
            }
            layers
                .iter()
                .filter(|l| l.children.iter().any(|c| c == name))
                .map(|l| 1 + above(&l.name, layers, seen + 1))
                .max()
                .unwrap_or(0)
        }
        above(name, layers, 0)
    };
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by_cached_key(|&i| depth(names[i]));
    order
}

async fn bind(addr: &ListenAddr, loaded: &Loaded) -> anyhow::Result<Listener> {
    match addr {
        ListenAddr::Unix(path) => {
            let path = loaded.resolve(path);
            let listener = bind_unix(&path)?;
            Ok(Listener::Unix { listener, path })
        }
        ListenAddr::Tcp(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            Ok(Listener::Tcp(listener))
        }
    }
}

/// Binds a unix socket, replacing a stale socket file but never a live server's.
fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "{} is in use by a running server (stop it, or choose another data folder)",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// SIGINT and SIGTERM, caught from the moment `install` returns.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => info!("SIGINT received"),
            _ = self.terminate.recv() => info!("SIGTERM received"),
        }
    }
}

fn print_welcome(loaded: &Loaded, state: &AdminState, admin: &Path, metrics: Option<&str>) {
    outln!(
        "Strata {} serving from {}",
        env!("CARGO_PKG_VERSION"),
        loaded.data_dir.display()
    );
    for export in state.exports.list() {
        let size = strata_core::ByteSize(export.device.geometry().size);
        // A read-only disk makes a read-only export whatever the export says.
        let mode = if export.read_only || export.device.capabilities().read_only {
            "read-only"
        } else {
            "read-write"
        };
        let who = if export.allow.is_empty() {
            String::new()
        } else {
            format!(", only for {}", export.allow.join(", "))
        };
        outln!("  export {:?}: {size}, {mode}{who}", export.name);
    }
    let first = state
        .exports
        .list()
        .first()
        .map(|e| e.name.clone())
        .unwrap_or_default();
    let tls = state.plane.server.tls_mode();
    let (scheme, tls_note) = match tls {
        TlsMode::Off => ("nbd", ""),
        TlsMode::On => ("nbd", " (TLS offered: nbds:// with the CA's certificate)"),
        TlsMode::Require => (
            "nbds",
            " (TLS required: give the client the CA's certificate)",
        ),
    };
    outln!("Connect with{tls_note}:");
    for addr in &loaded.listen {
        let uri = match addr {
            ListenAddr::Unix(path) => {
                format!(
                    "{scheme}+unix:///{first}?socket={}",
                    absolute(&loaded.resolve(path)).display()
                )
            }
            ListenAddr::Tcp(addr) => format!("{scheme}://{addr}/{first}"),
        };
        outln!("  nbdinfo '{uri}'");
        outln!("  qemu-img info '{uri}'");
        outln!("  mkdir -p /tmp/strata-fuse && nbdfuse /tmp/strata-fuse/nbd '{uri}' &");
    }
    outln!(
        "Status: strata status --admin {}",
        absolute(admin).display()
    );
    if let Some(addr) = metrics {
        outln!("Metrics: http://{addr}/metrics");
    }
    outln!(
        "ready: serving {} export(s) on {}",
        state.exports.list().len(),
        state.listeners.join(", ")
    );
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::flush_order;
    use strata_stack::graph::LayerConfig;

    fn layer(name: &str, children: &[&str]) -> LayerConfig {
        LayerConfig {
            name: name.into(),
            kind: "mirror".into(),
            children: children.iter().map(|c| c.to_string()).collect(),
            volumes: Vec::new(),
            grow_from: Vec::new(),
            options: Default::default(),
            span: 0..0,
        }
    }

    #[test]
    fn the_final_flush_goes_from_the_top_down() {
        let layers = [layer("m", &["b0", "b1"]), layer("pool", &["m"])];
        let names = ["b0", "b1", "m", "pool", "pool/vol", "spare"];
        let order: Vec<&str> = flush_order(&names, &layers)
            .into_iter()
            .map(|i| names[i])
            .collect();
        assert_eq!(order, ["pool", "pool/vol", "spare", "m", "b0", "b1"]);
    }
}
