//! Turns a validated configuration into devices and exports.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::registry::{self, LayerArgs, Options, StartPolicy};
use anyhow::Context;
use strata_backend::{FileDevice, FileOptions};
use strata_core::{
    BlockDevice, Control, ControlReply, DeviceRef, Metered, MetricsRegistry, NodeStatus, Runtime,
};
use strata_nbd::client::{ClientOptions, RemoteDevice};
use strata_nbd::tls::ClientTls;
use strata_nbd::{Export, Exports};
use strata_thin::ThinPool;
use tracing::{error, info};

use crate::config::{DiskConfig, Loaded};
use crate::graph::LayerConfig;
use crate::hierarchy;

/// What a named node of the stack is.
#[derive(Clone)]
pub enum NodeKind {
    /// A block device (a disk, a layer, a volume).
    Device(DeviceRef),
    /// A node whose devices are made by control verbs (a thin pool): not a device to export
    /// itself (size 0), the parent of the devices it makes (`Control::Volumes`, `Volume`,
    /// `CreateVolume`, `ResizeVolume`, `DeleteVolume`, `Space`).
    Maker(DeviceRef),
}

/// A named node the server holds, in configuration order.
#[derive(Clone)]
pub struct Node {
    pub name: String,
    pub kind: NodeKind,
    /// For a disk under a layer: the whole disk, label included (`kind` is the view after it).
    pub label_disk: Option<DeviceRef>,
}

impl Node {
    pub fn device(&self) -> Option<&DeviceRef> {
        match &self.kind {
            NodeKind::Device(device) => Some(device),
            NodeKind::Maker(_) => None,
        }
    }

    /// The device control calls go to: the block device, or the maker node itself.
    pub fn control_device(&self) -> &DeviceRef {
        match &self.kind {
            NodeKind::Device(device) | NodeKind::Maker(device) => device,
        }
    }

    pub async fn describe(&self) -> strata_core::Result<NodeStatus> {
        match &self.kind {
            NodeKind::Device(device) | NodeKind::Maker(device) => {
                strata_core::describe(device.as_ref()).await
            }
        }
    }

    pub async fn flush(&self) -> strata_core::Result<()> {
        match &self.kind {
            NodeKind::Device(device) | NodeKind::Maker(device) => device.flush().await,
        }
    }

    /// Ends the node's background work (rebuild, resync, committer) and waits for it.
    pub async fn stop_background(&self) -> strata_core::Result<()> {
        match &self.kind {
            NodeKind::Device(device) | NodeKind::Maker(device) => {
                strata_core::lifecycle::stop(device).await
            }
        }
    }

    /// The node's last step at shutdown, after its final flush (`Control::Leave`).
    pub async fn leave(&self) -> strata_core::Result<()> {
        match &self.kind {
            NodeKind::Device(device) | NodeKind::Maker(device) => {
                strata_core::lifecycle::leave(device).await
            }
        }
    }
}

/// What the operator allowed at this start (`strata serve --format LAYER --degraded`).
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// Layers that may format although their disks are not all blank.
    pub format: BTreeSet<String>,
    /// Layers may start with in-sync members missing.
    pub degraded: bool,
}

/// A device that did not start, and why. Everything above it is refused too; the rest of
/// the stack serves.
#[derive(Clone, Debug)]
pub struct Refused {
    pub name: String,
    /// "disk" or a layer kind.
    pub kind: String,
    pub reason: String,
    /// The disk files under it, for `strata check`.
    pub disks: Vec<PathBuf>,
}

impl Refused {
    /// What `strata check` to run on it.
    pub fn check_command(&self) -> String {
        let paths: Vec<String> = self.disks.iter().map(|p| p.display().to_string()).collect();
        format!("strata check {}", paths.join(" "))
    }

    /// Its entry in `strata status` (a `NodeStatus` with health "refused").
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "kind": self.kind,
            "size": 0,
            "health": "refused",
            "detail": [["refused", self.reason], ["check", self.check_command()]],
            "stats": null,
            "children": [],
            "activity": null,
        })
    }
}

/// What the configuration built.
pub struct Stack {
    pub nodes: Vec<Node>,
    pub exports: Arc<Exports>,
    /// Generation of the hierarchy labels on the disks (0: no disk is under a layer).
    pub generation: u64,
    /// Devices that did not start.
    pub refused: Vec<Refused>,
    /// Disks under layers that had no label and zeros where it goes before this start.
    fresh: HashSet<String>,
    /// Disks under layers that are absent (marked missing, vanished, refused): their layer
    /// gets `None` for them and decides. Name → why.
    absent: BTreeMap<String, String>,
}

impl Stack {
    /// The thin pools among the device-making nodes (for their metrics).
    pub async fn thin_pools(&self) -> Vec<Arc<ThinPool>> {
        let mut pools = Vec::new();
        for node in &self.nodes {
            if let NodeKind::Maker(device) = &node.kind {
                pools.extend(ThinPool::of(device).await);
            }
        }
        pools
    }

    /// The stages among the layers (for their metrics).
    pub async fn stages(&self) -> Vec<Arc<strata_stage::Stage>> {
        let mut stages = Vec::new();
        for node in &self.nodes {
            if let NodeKind::Device(device) = &node.kind {
                stages.extend(strata_stage::Stage::of(device).await);
            }
        }
        stages
    }

    /// The migrate layers among the layers (for their metrics).
    pub async fn migrates(&self) -> Vec<Arc<strata_migrate::Migrate>> {
        let mut layers = Vec::new();
        for node in &self.nodes {
            if let NodeKind::Device(device) = &node.kind {
                layers.extend(strata_migrate::Migrate::of(device).await);
            }
        }
        layers
    }

    fn device(&self, name: &str) -> Option<DeviceRef> {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .and_then(|node| node.device().cloned())
    }

    fn refused(&self, name: &str) -> Option<&Refused> {
        self.refused.iter().find(|r| r.name == name)
    }
}

/// The disks under `name` (itself if it is a disk), through every layer below it.
fn disks_under(loaded: &Loaded, name: &str) -> Vec<String> {
    match loaded.layers.iter().find(|l| l.name == name) {
        Some(layer) => layer
            .children
            .iter()
            .flat_map(|child| disks_under(loaded, child))
            .collect(),
        None => vec![name.to_string()],
    }
}

/// What `layer` may do at this start: format only if every disk under it (through the
/// layers below) was blank before this start, or if the operator named it in `--format`;
/// start with in-sync members missing only with `--degraded`.
fn start_policy(
    loaded: &Loaded,
    layer: &str,
    fresh: &HashSet<String>,
    start: &StartOptions,
) -> StartPolicy {
    StartPolicy {
        may_format: start.format.contains(layer)
            || disks_under(loaded, layer).iter().all(|d| fresh.contains(d)),
        allow_degraded: start.degraded,
    }
}

/// The files of `disks`, as an operator would type them into `strata check`.
fn disk_paths(loaded: &Loaded, disks: &[String]) -> Vec<PathBuf> {
    disks
        .iter()
        .filter_map(|name| {
            loaded
                .config
                .disks
                .iter()
                .find(|d| d.name.get_ref() == name && !d.missing)
        })
        // A remote disk is examined on its server, not here.
        .filter_map(|d| d.file())
        .map(|file| {
            let path = loaded.resolve(file);
            std::fs::canonicalize(&path)
                .or_else(|_| std::path::absolute(&path))
                .unwrap_or(path)
        })
        .collect()
}

/// Records `name` as refused, and says so at ERROR with the command that examines it.
fn refuse(stack: &mut Stack, loaded: &Loaded, name: &str, kind: &str, reason: String) {
    let refused = Refused {
        name: name.to_string(),
        kind: kind.to_string(),
        reason,
        disks: disk_paths(loaded, &disks_under(loaded, name)),
    };
    error!(
        device = %name,
        "refusing to start {kind} {name}: {}. The rest of the stack serves. Examine its disks with: {}",
        refused.reason,
        refused.check_command()
    );
    stack.refused.push(refused);
}

/// Where a stack's disks come from.
pub enum Disks {
    /// Each `[[disk]]`'s file, opened (created on a config's first start); the data folder
    /// records them.
    Files,
    /// Devices given by disk name (tests, tools): no file is opened or created and the data
    /// folder is not written. A disk not given is absent.
    Given(BTreeMap<String, DeviceRef>),
}

/// Builds the stack of `loaded` on its disk files.
pub async fn build(
    loaded: &Loaded,
    start: &StartOptions,
    runtime: Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<Stack> {
    build_on(loaded, &Disks::Files, start, runtime, metrics).await
}

/// Builds the stack of `loaded` on `disks`: labels read, layers built in graph order, labels
/// written from the running layers, exports made.
pub async fn build_on(
    loaded: &Loaded,
    disks: &Disks,
    start: &StartOptions,
    runtime: Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<Stack> {
    let files = matches!(disks, Disks::Files);
    let mut stack = Stack {
        nodes: Vec::new(),
        exports: Arc::new(Exports::new()),
        generation: 0,
        refused: Vec::new(),
        fresh: HashSet::new(),
        absent: BTreeMap::new(),
    };
    let labelled = hierarchy::labelled_disks(loaded);
    let state = if files {
        DiskState::read(&loaded.data_dir)?
    } else {
        None
    };
    let started_before = state.is_some() || (files && any_disk_labelled(loaded, &labelled));
    let state = state.unwrap_or_default();
    for disk in &loaded.config.disks {
        let name = disk.name.get_ref().clone();
        if disk.missing {
            stack
                .absent
                .insert(name, "not found at assembly".to_string());
            continue;
        }
        let opened = match disks {
            Disks::Files if disk.uri.is_some() => {
                open_remote(loaded, disk, &runtime, metrics).await
            }
            Disks::Files if disk.shared.is_some() => open_shared(disk, &runtime, metrics).await,
            Disks::Files => open_disk(loaded, disk, started_before, &state, &runtime, metrics),
            Disks::Given(devices) => devices
                .get(&name)
                .cloned()
                .with_context(|| format!("disk {name}: no device given")),
        };
        match opened {
            Ok(device) => stack.nodes.push(Node {
                name,
                kind: NodeKind::Device(device),
                label_disk: None,
            }),
            Err(e) if labelled.contains(&name) => {
                // Its layer decides: a mirror or raid5 may run without it (if allowed).
                let reason = format!("{e:#}");
                error!(disk = %name, "disk {name} is missing for its layer: {reason}");
                stack.absent.insert(name, reason);
            }
            Err(e) => refuse(&mut stack, loaded, &name, "disk", format!("{e:#}")),
        }
    }
    label_disks(&mut stack, loaded).await?;
    for &index in &loaded.build_order {
        let layer = &loaded.layers[index];
        // Over an absent disk, a layer decides. Over a refused layer, one that can do without
        // members (a mirror, a raid5) decides too, as if that child were missing: a raid5
        // over crypt members whose disk died starts degraded (with `--degraded`, which
        // its own rules ask for) instead of taking the whole array down. Others cannot start.
        let refused_children: Vec<Refused> = layer
            .children
            .iter()
            .filter_map(|c| stack.refused(c).cloned())
            .collect();
        let kind = registry::find(&layer.kind).expect("config validation checked the kind");
        if let Some(child) = refused_children.first() {
            if refused_children.len() > (kind.tolerates_missing)(layer.children.len()) {
                let reason = format!("its child {} was refused ({})", child.name, child.reason);
                refuse(&mut stack, loaded, &layer.name, &layer.kind, reason);
                continue;
            }
            for child in &refused_children {
                stack
                    .absent
                    .insert(child.name.clone(), format!("refused ({})", child.reason));
            }
        }
        let policy = start_policy(loaded, &layer.name, &stack.fresh, start);
        let built = build_layer(&mut stack, layer, loaded, policy, runtime.clone(), metrics).await;
        if let Err(e) = built {
            let mut reason = format!("{e:#}");
            for child in &layer.children {
                if let Some(why) = stack.absent.get(child) {
                    reason.push_str(&format!("; member {child}: {why}"));
                }
            }
            refuse(&mut stack, loaded, &layer.name, &layer.kind, reason);
        }
    }
    // From the running layers: what each one describes is what its label records.
    stack.generation = write_labels(loaded, &stack.nodes).await?;
    for export in &loaded.config.exports {
        let device_name = export.device.get_ref();
        let Some(device) = stack.device(device_name) else {
            // Refused (or a volume of a refused pool): logged above with its reason.
            error!(
                export = %export.name.get_ref(),
                "export {} is not served: its device {device_name} did not start",
                export.name.get_ref()
            );
            continue;
        };
        stack.exports.insert(Export {
            name: export.name.get_ref().clone(),
            description: export.description.clone(),
            device,
            read_only: export.read_only,
            allow: export.allow.iter().map(|a| a.get_ref().clone()).collect(),
        });
    }
    crate::volumes::export_unlisted_volumes(&stack, loaded).await;
    if stack.exports.list().is_empty() {
        // Nothing to serve: a server that only reports refusals would look like success.
        let reasons: Vec<String> = stack
            .refused
            .iter()
            .map(|r| {
                format!(
                    "{} {}: {} ({})",
                    r.kind,
                    r.name,
                    r.reason,
                    r.check_command()
                )
            })
            .collect();
        anyhow::bail!(
            "no export could be served: {}",
            if reasons.is_empty() {
                "no device started".to_string()
            } else {
                reasons.join("; ")
            }
        );
    }
    if files {
        state
            .record(loaded, &stack)
            .context("recording the disks of this config in the data folder")?;
    }
    Ok(stack)
}

/// Whether any disk under a layer already carries a hierarchy label: then this config (or
/// the hierarchy it describes) has started before, whatever the data folder says.
fn any_disk_labelled(loaded: &Loaded, labelled: &[String]) -> bool {
    loaded
        .config
        .disks
        .iter()
        .filter(|d| !d.missing && labelled.contains(d.name.get_ref()))
        .filter_map(|d| d.file())
        .any(|file| {
            let path = loaded.resolve(file);
            matches!(hierarchy::read_label_file(&path), Ok(Some(_)))
        })
}

/// Opens a disk's file, creating it only when that cannot hide a vanished disk: on the
/// config's first start, or for a disk marked `create = true` that the data folder does not
/// record as created before.
fn open_disk(
    loaded: &Loaded,
    disk: &DiskConfig,
    started_before: bool,
    state: &DiskState,
    runtime: &Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<DeviceRef> {
    let name = disk.name.get_ref();
    let file = disk
        .file()
        .with_context(|| format!("disk {name}: no `path`"))?;
    let path = loaded.resolve(file);
    // metadata() follows symlinks: a dangling link is a missing disk.
    if std::fs::metadata(&path).is_err() {
        let known = state.knows(name);
        // A read-only disk is never created: empty and unwritable, it can only hide a typo.
        let create = if known || disk.read_only {
            false
        } else {
            disk.create || !started_before
        };
        if !create {
            let why = if disk.read_only {
                "it is read-only (a read-only disk is never created)".to_string()
            } else if known {
                format!(
                    "the data folder records disk {name} as created at {}",
                    state.path_of(name).unwrap_or_default()
                )
            } else {
                "this config has started before".to_string()
            };
            anyhow::bail!(
                "disk {name}: {} does not exist, and {why}: it is not created again (a deleted \
                 member, an unmounted file system or a mistyped path would otherwise become an \
                 empty disk). Restore it; or, for a new disk, add `create = true` to its [[disk]]",
                path.display()
            );
        }
        create_file(loaded, disk, &path)?;
    }
    let options = FileOptions {
        path: path.clone(),
        size: disk.size.as_ref().map(|size| size.get_ref().0),
        direct: disk.direct,
        read_only: disk.read_only,
        inline_cached_io: disk.inline_io,
    };
    let file = FileDevice::open(options, runtime.clone())
        .with_context(|| format!("disk {name}: opening {}", path.display()))?;
    Ok(Arc::new(Metered::new(
        file,
        metrics.device(name),
        runtime.clone(),
    )))
}

/// Opens a shared volume from its cluster's catalog. An unreachable etcd or a volume not in
/// the catalog is a missing disk: nothing is created.
async fn open_shared(
    disk: &DiskConfig,
    runtime: &Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<DeviceRef> {
    let name = disk.name.get_ref();
    let volume = disk.shared.as_ref().expect("a shared disk").get_ref();
    let cluster = disk.cluster.as_deref().unwrap_or("strata");
    let coord =
        strata_coord::Coord::connect(&disk.etcd, cluster, std::time::Duration::from_secs(5))
            .await
            .with_context(|| format!("disk {name}: etcd at {}", disk.etcd.join(",")))?;
    let member = disk
        .member
        .clone()
        .unwrap_or_else(|| format!("{name}-{}", std::process::id()));
    let lease = disk
        .lease
        .as_ref()
        .and_then(|l| strata_core::duration::parse_duration(l.get_ref()).ok())
        .unwrap_or(std::time::Duration::from_secs(10));
    let shared =
        strata_brick::SharedVolume::open(&coord, volume, &member, disk.remote_timeout(), lease)
            .await
            .with_context(|| format!("disk {name}: shared volume {volume} of cluster {cluster}"))?;
    if disk.unsafe_without_intervals {
        shared.unsafe_without_intervals();
    }
    info!(disk = %name, volume = %volume, size = shared.geometry().size, "opened shared volume");
    Ok(Arc::new(Metered::new(
        shared,
        metrics.device(name),
        runtime.clone(),
    )))
}

/// Connects to a remote disk's export. An unreachable server or a refused export is a
/// missing disk, reported with the URI, exactly as a missing file is: nothing is created.
async fn open_remote(
    loaded: &Loaded,
    disk: &DiskConfig,
    runtime: &Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<DeviceRef> {
    let name = disk.name.get_ref();
    let uri = disk
        .remote()
        .with_context(|| format!("disk {name}: no valid `uri`"))?;
    let options = ClientOptions {
        timeout: disk.remote_timeout(),
        connections: disk.remote_connections(),
        ..ClientOptions::default()
    };
    let text = uri.text.clone();
    let tls = match loaded.disk_tls(disk) {
        Some((files, server_name)) => Some(
            ClientTls::load(&files, &server_name)
                .with_context(|| format!("disk {name}: TLS settings"))?,
        ),
        None => None,
    };
    let remote = RemoteDevice::connect_with(uri, options, tls)
        .await
        .with_context(|| format!("disk {name}: the remote export {text} cannot be reached"))?
        .read_only(disk.read_only);
    info!(disk = %name, uri = %text, size = remote.geometry().size, "connected remote disk");
    Ok(Arc::new(Metered::new(
        remote,
        metrics.device(name),
        runtime.clone(),
    )))
}

/// Creates a disk's file at its configured size. A file the file system cannot make that
/// large is removed again: a 0-byte file left behind would be "created" at the next start.
fn create_file(loaded: &Loaded, disk: &DiskConfig, path: &Path) -> anyhow::Result<()> {
    let name = disk.name.get_ref();
    let Some(size) = &disk.size else {
        anyhow::bail!(
            "{}: disk {name}: {} does not exist and the disk has no field `size` to create it with",
            loaded.at(disk.name.span().start),
            path.display()
        );
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("disk {name}: creating {}", parent.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("disk {name}: creating {}", path.display()))?;
    let bytes = size.get_ref().0;
    // The file and its size must survive a crash before the first flush, and so must the
    // directory entry that names it.
    let sized = file
        .set_len(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| match path.parent() {
            Some(parent) => std::fs::File::open(parent)?.sync_all(),
            None => Ok(()),
        });
    if let Err(e) = sized {
        let _ = std::fs::remove_file(path);
        anyhow::bail!(
            "{}: field `size`: disk {name}: cannot create {} with {bytes} bytes: {e}",
            loaded.at(size.span().start),
            path.display()
        );
    }
    info!(disk = %name, path = %path.display(), size = bytes, "created disk file");
    Ok(())
}

/// Reads the hierarchy labels of the disks under layers, and gives those layers the disks'
/// labelled views. A disk that may not be labelled (it holds somebody's data) is absent for
/// its layer. The labels are written once the layers run ([`write_labels`]).
async fn label_disks(stack: &mut Stack, loaded: &Loaded) -> anyhow::Result<()> {
    let labelled = hierarchy::labelled_disks(loaded);
    let disks: Vec<(String, DeviceRef)> = labelled
        .iter()
        .filter_map(|name| stack.device(name).map(|d| (name.clone(), d)))
        .collect();
    if disks.is_empty() {
        return Ok(());
    }
    let survey = hierarchy::survey_at_start(&disks).await?;
    for (name, reason) in survey.refused {
        error!(disk = %name, "disk {name} is missing for its layer: {reason}");
        stack.nodes.retain(|n| n.name != name);
        stack.absent.insert(name, reason);
    }
    stack.fresh = survey.fresh;
    for node in stack
        .nodes
        .iter_mut()
        .filter(|n| labelled.contains(&n.name))
    {
        if let NodeKind::Device(disk) = &node.kind {
            let view = hierarchy::Labelled::new(&node.name, disk.clone())
                .with_context(|| format!("disk {}: too small for a hierarchy label", node.name))?;
            node.label_disk = Some(disk.clone());
            node.kind = NodeKind::Device(Arc::new(view));
        }
    }
    Ok(())
}

/// Each running layer's options, from its `describe()` (see [`hierarchy::Running`]). A layer
/// that did not start, or that describes no config, is left out: its label entry keeps the
/// options as configured.
pub async fn running_configs(loaded: &Loaded, nodes: &[Node]) -> hierarchy::Running {
    let mut running = hierarchy::Running::new();
    for layer in &loaded.layers {
        let Some(node) = nodes.iter().find(|n| n.name == layer.name) else {
            continue;
        };
        match node.describe().await {
            Ok(status) => {
                if let Some(config) = status.config {
                    running.insert(layer.name.clone(), config);
                }
            }
            Err(e) => {
                tracing::warn!(layer = %layer.name, "describe failed; its label keeps the options as configured: {e}")
            }
        }
    }
    running
}

/// Writes the labels of the disks under layers from the running stack. Returns the
/// generation now on them (0: no disk is under a layer).
pub async fn write_labels(loaded: &Loaded, nodes: &[Node]) -> anyhow::Result<u64> {
    let disks: Vec<(String, DeviceRef)> = hierarchy::labelled_disks(loaded)
        .into_iter()
        .filter_map(|name| {
            let disk = nodes.iter().find(|n| n.name == name)?.label_disk.clone()?;
            Some((name, disk))
        })
        .collect();
    if disks.is_empty() {
        return Ok(0);
    }
    let running = running_configs(loaded, nodes).await;
    hierarchy::reconcile(loaded, &running, &disks).await
}

/// `<data-dir>/disks.state`: the disks this data folder's config has started with (name and
/// path, one per line, tab-separated), written after each successful start. A disk it lists
/// is never created again: if its file is gone, it vanished.
#[derive(Default)]
struct DiskState {
    disks: BTreeMap<String, String>,
}

const DISK_STATE: &str = "disks.state";

impl DiskState {
    fn read(data_dir: &Path) -> anyhow::Result<Option<DiskState>> {
        let path = data_dir.join(DISK_STATE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let disks = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('\t'))
            .map(|(name, path)| (name.to_string(), path.to_string()))
            .collect();
        Ok(Some(DiskState { disks }))
    }

    fn knows(&self, name: &str) -> bool {
        self.disks.contains_key(name)
    }

    fn path_of(&self, name: &str) -> Option<String> {
        self.disks.get(name).cloned()
    }

    /// Adds the disks this start opened, and writes the file if that changed anything
    /// (a temporary file renamed over it, so that a crash leaves the old list or the new).
    fn record(mut self, loaded: &Loaded, stack: &Stack) -> anyhow::Result<()> {
        let before = self.disks.clone();
        for disk in &loaded.config.disks {
            let name = disk.name.get_ref();
            // A remote disk is never created, so there is nothing to remember creating.
            let Some(file) = disk.file() else { continue };
            if stack.nodes.iter().any(|n| &n.name == name) {
                let path = loaded.resolve(file);
                self.disks.insert(name.clone(), path.display().to_string());
            }
        }
        let path = loaded.data_dir.join(DISK_STATE);
        if before == self.disks && path.exists() {
            return Ok(());
        }
        let mut text = String::from(
            "# Disks this config has started with (name, path). Strata never creates a listed\n\
             # disk again: if its file is gone, it vanished. Written by strata serve.\n",
        );
        for (name, path) in &self.disks {
            text.push_str(&format!("{name}\t{path}\n"));
        }
        let temporary = loaded.data_dir.join(format!("{DISK_STATE}.new"));
        std::fs::write(&temporary, text)?;
        std::fs::rename(&temporary, &path)?;
        Ok(())
    }
}

fn layer_options(layer: &LayerConfig, loaded: &Loaded) -> Options {
    Options::new(layer.options.clone(), loaded.data_dir.clone())
}

/// Builds one registered layer over its (already built) children.
async fn build_layer(
    stack: &mut Stack,
    layer: &LayerConfig,
    loaded: &Loaded,
    start: StartPolicy,
    runtime: Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<()> {
    let kind = registry::find(&layer.kind).expect("config validation checked the kind");
    let children: Vec<Option<DeviceRef>> = layer
        .children
        .iter()
        .map(|name| stack.device(name))
        .collect();
    // The registry says how many members a kind can lose; nothing below checks it (a raid5
    // started with two of three members gone, measured), so the server does.
    let missing: Vec<&str> = layer
        .children
        .iter()
        .zip(&children)
        .filter(|(_, child)| child.is_none())
        .map(|(name, _)| name.as_str())
        .collect();
    let tolerated = (kind.tolerates_missing)(children.len());
    if missing.len() > tolerated {
        anyhow::bail!(
            "{} ({}): {} of its {} members are missing ({}); a {} can do without at most {tolerated}",
            layer.name,
            layer.kind,
            missing.len(),
            children.len(),
            missing.join(", "),
            layer.kind
        );
    }
    let args = LayerArgs {
        name: layer.name.clone(),
        children,
        child_names: layer.children.clone(),
        options: layer_options(layer, loaded),
        runtime: runtime.clone(),
        start,
    };
    let device = (kind.build)(args)
        .await
        .with_context(|| format!("layer {} ({})", layer.name, layer.kind))?;
    let Some(volumes) = made_devices(layer, &device).await? else {
        let metered = Metered::new(device, metrics.device(&layer.name), runtime);
        stack.nodes.push(Node {
            name: layer.name.clone(),
            kind: NodeKind::Device(Arc::new(metered)),
            label_disk: None,
        });
        return Ok(());
    };
    stack.nodes.push(Node {
        name: layer.name.clone(),
        kind: NodeKind::Maker(device),
        label_disk: None,
    });
    for (name, volume) in volumes {
        let metered = Metered::new(volume, metrics.device(&name), runtime.clone());
        stack.nodes.push(Node {
            name,
            kind: NodeKind::Device(Arc::new(metered)),
            label_disk: None,
        });
    }
    Ok(())
}

/// The devices a layer's node makes by control verbs (a thin pool's volumes), named
/// `layer/volume`, after creating those its `[[layer]]` lists that it does not have yet; None
/// for a layer that is a device itself. The simulator builds its stacks with this too.
pub async fn made_devices(
    layer: &LayerConfig,
    node: &DeviceRef,
) -> anyhow::Result<Option<Vec<(String, DeviceRef)>>> {
    let kind = registry::find(&layer.kind).expect("config validation checked the kind");
    if !kind.makes_volumes() {
        return Ok(None);
    }
    let name = &layer.name;
    let list = || async {
        match node.control(Control::Volumes).await? {
            ControlReply::Names(names) => Ok(names),
            other => anyhow::bail!("layer {name}: listing its devices answered {other:?}"),
        }
    };
    let present = list().await?;
    for volume in layer.volumes.iter().filter(|v| !present.contains(&v.name)) {
        node.control(Control::CreateVolume {
            name: volume.name.clone(),
            size: volume.size,
        })
        .await
        .with_context(|| format!("thin pool {name}: creating volume {}", volume.name))?;
    }
    let names = list().await?;
    let mut devices = Vec::new();
    for volume in names {
        let request = Control::Volume {
            name: volume.clone(),
        };
        match node.control(request).await? {
            ControlReply::Device(device) => devices.push((format!("{name}/{volume}"), device)),
            other => anyhow::bail!("layer {name}: volume {volume} answered {other:?}"),
        }
    }
    Ok(Some(devices))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(text: &str) -> Loaded {
        crate::config::load(text, "test.toml", Path::new("/nonexistent-base"), None).unwrap()
    }

    const NESTED: &str = "listen = [\"unix:s\"]\n\
        [[disk]]\nname = \"a\"\npath = \"a.img\"\n\
        [[disk]]\nname = \"b\"\npath = \"b.img\"\n\
        [[disk]]\nname = \"c\"\npath = \"c.img\"\n\
        [[layer]]\nname = \"m\"\nkind = \"mirror\"\nchildren = [\"a\", \"b\"]\n\
        [[layer]]\nname = \"all\"\nkind = \"concat\"\nchildren = [\"m\", \"c\"]\n\
        [[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"all\"]\n\
        volumes = [{ name = \"v\", size = \"1GiB\" }]\n\
        [[export]]\nname = \"e\"\ndevice = \"pool/v\"\n";

    #[test]
    fn a_layer_may_format_only_over_blank_disks_or_when_named() {
        let loaded = loaded(NESTED);
        let fresh =
            |names: &[&str]| -> HashSet<String> { names.iter().map(|n| n.to_string()).collect() };
        let careful = StartOptions::default();
        let all_blank = fresh(&["a", "b", "c"]);
        for layer in ["m", "all", "pool"] {
            let policy = start_policy(&loaded, layer, &all_blank, &careful);
            assert!(policy.may_format, "{layer} over blank disks");
            assert!(!policy.allow_degraded, "{layer}: no --degraded");
        }
        // c was labelled before: the mirror under it may still format, nothing above it.
        let c_used = fresh(&["a", "b"]);
        assert!(start_policy(&loaded, "m", &c_used, &careful).may_format);
        assert!(!start_policy(&loaded, "all", &c_used, &careful).may_format);
        assert!(
            !start_policy(&loaded, "pool", &c_used, &careful).may_format,
            "the pool sits on c through the concat"
        );
        // One leg missing or used: the mirror may not format.
        assert!(!start_policy(&loaded, "m", &fresh(&["a"]), &careful).may_format);
        let named = StartOptions {
            format: ["pool".to_string()].into_iter().collect(),
            degraded: true,
        };
        let policy = start_policy(&loaded, "pool", &fresh(&[]), &named);
        assert!(policy.may_format && policy.allow_degraded);
        assert!(
            !start_policy(&loaded, "m", &fresh(&[]), &named).may_format,
            "--format names one layer, not those under it"
        );
    }
}
