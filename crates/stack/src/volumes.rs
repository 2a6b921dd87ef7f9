//! Thin volumes created, listed, resized and deleted while serving (`strata volume …`).
//!
//! The pool's metadata is the source of truth: a volume exists when its pool says so, and at
//! start every volume the config neither exports nor puts under a layer is exported as
//! `<pool>/<volume>`. So `create` needs no config edit; `delete` of a volume the config lists
//! removes it from the config too (or the next start would create it again, empty), and
//! `resize` of a listed volume keeps the config's size truthful.
//!
//! NBD has no way to tell a connected client that its export changed size: clients see a
//! resize when they reconnect. A shrink takes effect at once for them all the same: past the
//! new end their requests fail.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use strata_core::{Control, ControlReply, DeviceRef, Metered, SpaceReport};
use strata_nbd::{Export, Exports, Server};
use toml_edit::{DocumentMut, Item};

use crate::build::{Node, NodeKind, Stack};
use crate::config::{self, Loaded};
use crate::control::ControlPlane;
use crate::plan::{Plan, Step};
use crate::reconfig::{Applying, DetachNode, Reconfig, RecordConfig};
use strata_core::ByteSize;

/// How long `delete --force` waits for the clients it disconnects to go.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A volume request on the admin socket.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum VolumeRequest {
    Create {
        volume: String,
        size: u64,
    },
    List,
    Resize {
        volume: String,
        size: u64,
        /// The operator agrees that data past the new end is discarded.
        shrink: bool,
    },
    Delete {
        volume: String,
        /// Close the connections of clients using it instead of refusing.
        force: bool,
    },
    /// Export a device the pool holds but does not export now: a snapshot
    /// (`POOL/VOLUME@SNAPSHOT`, read-only).
    Export {
        volume: String,
    },
    /// End such an export (its device stays in the pool).
    Unexport {
        volume: String,
        /// Close the connections of clients using it instead of refusing.
        force: bool,
    },
}

/// One pool in `strata volume list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PoolListing {
    pub pool: String,
    pub extent_size: u64,
    /// Physical data space.
    pub data_bytes: u64,
    pub allocated_bytes: u64,
    /// Sum of the volumes' virtual sizes.
    pub volume_bytes: u64,
    /// volume_bytes / data_bytes: above 1 the pool is over-committed.
    pub overcommit: f64,
    pub volumes: Vec<VolumeListing>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct VolumeListing {
    pub volume: String,
    pub size: u64,
    pub allocated_bytes: u64,
    pub exports: Vec<String>,
    pub clients: usize,
}

/// Answers a volume request; the reply is `{"done": summary}` or `{"pools": [...]}`.
pub async fn answer(
    state: &ControlPlane,
    request: VolumeRequest,
) -> anyhow::Result<serde_json::Value> {
    tracing::info!(?request, "volume request");
    let result = match request {
        VolumeRequest::List => list(state)
            .await
            .map(|pools| serde_json::json!({ "pools": pools })),
        VolumeRequest::Create { volume, size } => create(state, &volume, size).await,
        VolumeRequest::Resize {
            volume,
            size,
            shrink,
        } => resize(state, &volume, size, shrink).await,
        VolumeRequest::Delete { volume, force } => delete(state, &volume, force).await,
        VolumeRequest::Export { volume } => export(state, &volume).await,
        VolumeRequest::Unexport { volume, force } => unexport(state, &volume, force).await,
    };
    match &result {
        Ok(reply) => {
            if let Some(summary) = reply["done"].as_str() {
                tracing::info!("{summary}");
            }
        }
        Err(e) => tracing::warn!("volume request refused: {e:#}"),
    }
    result
}

fn done(summary: String) -> serde_json::Value {
    serde_json::json!({ "done": summary })
}

/// `POOL/NAME` split in two.
fn split(volume: &str) -> anyhow::Result<(&str, &str)> {
    match volume.split_once('/') {
        Some((pool, name)) if !pool.is_empty() && !name.is_empty() => Ok((pool, name)),
        _ => bail!("{volume:?}: name a volume as POOL/NAME"),
    }
}

/// What a volume request names: `POOL/NAME` split, the pool found, and `POOL/NAME` again
/// (the node's and the default export's name).
fn target<'a>(
    state: &ControlPlane,
    volume: &'a str,
) -> anyhow::Result<(&'a str, &'a str, Pool, String)> {
    let (pool_name, name) = split(volume)?;
    let pool = find_pool(state, pool_name)?;
    Ok((pool_name, name, pool, format!("{pool_name}/{name}")))
}

/// A node whose devices are made by control verbs (a thin pool), as the volume plans use it:
/// every change goes through the verbs its kind declares, so any such kind works here.
#[derive(Clone)]
struct Pool {
    name: String,
    node: DeviceRef,
}

impl Pool {
    async fn ask(&self, request: Control) -> anyhow::Result<ControlReply> {
        let verb = request.verb();
        self.node
            .control(request)
            .await
            .with_context(|| format!("{} {verb}", self.name))
    }

    async fn names(&self) -> anyhow::Result<Vec<String>> {
        match self.ask(Control::Volumes).await? {
            ControlReply::Names(names) => Ok(names),
            other => bail!("{}: volumes answered {other:?}", self.name),
        }
    }

    async fn device(&self, name: &str) -> anyhow::Result<DeviceRef> {
        let name = name.to_string();
        match self.ask(Control::Volume { name }).await? {
            ControlReply::Device(device) => Ok(device),
            other => bail!("{}: volume answered {other:?}", self.name),
        }
    }

    /// The size of volume `name`, if the pool has it.
    async fn size_of(&self, name: &str) -> anyhow::Result<Option<u64>> {
        if !self.names().await?.iter().any(|n| n == name) {
            return Ok(None);
        }
        Ok(Some(self.device(name).await?.geometry().size))
    }

    async fn space(&self) -> anyhow::Result<SpaceReport> {
        match self.ask(Control::Space).await? {
            ControlReply::Space(space) => Ok(space),
            other => bail!("{}: volume-list answered {other:?}", self.name),
        }
    }

    async fn create(&self, name: &str, size: u64) -> anyhow::Result<()> {
        let name = name.to_string();
        self.ask(Control::CreateVolume { name, size }).await?;
        Ok(())
    }

    async fn resize(&self, name: &str, size: u64) -> anyhow::Result<()> {
        let name = name.to_string();
        self.ask(Control::ResizeVolume { name, size }).await?;
        Ok(())
    }

    async fn delete(&self, name: &str) -> anyhow::Result<()> {
        let name = name.to_string();
        self.ask(Control::DeleteVolume { name }).await?;
        Ok(())
    }
}

fn find_pool(state: &ControlPlane, pool: &str) -> anyhow::Result<Pool> {
    let nodes = state.nodes();
    match nodes.iter().find(|n| n.name == pool) {
        Some(Node {
            kind: NodeKind::Maker(node),
            ..
        }) => Ok(Pool {
            name: pool.to_string(),
            node: node.clone(),
        }),
        Some(_) => bail!("{pool:?} is not a thin pool"),
        None => {
            let pools: Vec<&str> = nodes
                .iter()
                .filter(|n| matches!(n.kind, NodeKind::Maker(_)))
                .map(|n| n.name.as_str())
                .collect();
            if pools.is_empty() {
                bail!("no thin pool named {pool:?} (this server has no thin pools)")
            }
            bail!("no thin pool named {pool:?} (pools: {})", pools.join(", "))
        }
    }
}

fn check_size(full: &str, size: u64) -> anyhow::Result<()> {
    if size == 0 || !size.is_multiple_of(512) {
        bail!("volume {full}: size {size} bytes is not a positive multiple of 512");
    }
    if size > i64::MAX as u64 {
        bail!("volume {full}: size {size} bytes is too large");
    }
    Ok(())
}

/// The layer whose child the volume is, if any: changing it under that layer is refused.
fn parent_layer(loaded: &Loaded, full: &str) -> Option<String> {
    loaded
        .layers
        .iter()
        .find(|l| l.children.iter().any(|c| c == full))
        .map(|l| l.name.clone())
}

fn node_device(state: &ControlPlane, full: &str) -> Option<DeviceRef> {
    state
        .nodes()
        .iter()
        .find(|n| n.name == full)
        .and_then(|n| n.device().cloned())
}

/// The exports that serve `device`, under any name.
fn exports_of(state: &ControlPlane, device: &DeviceRef) -> Vec<Arc<Export>> {
    state
        .exports
        .list()
        .into_iter()
        .filter(|e| Arc::ptr_eq(&e.device, device))
        .collect()
}

async fn list(state: &ControlPlane) -> anyhow::Result<Vec<PoolListing>> {
    let nodes = state.nodes();
    let mut pools = Vec::new();
    for node in &nodes {
        let NodeKind::Maker(device) = &node.kind else {
            continue;
        };
        let pool = Pool {
            name: node.name.clone(),
            node: device.clone(),
        };
        let space = pool.space().await?;
        let mut volumes = Vec::new();
        for share in space.devices {
            let full = format!("{}/{}", node.name, share.name);
            let exports = node_device(state, &full)
                .map(|device| exports_of(state, &device))
                .unwrap_or_default();
            volumes.push(VolumeListing {
                volume: share.name,
                size: share.size,
                allocated_bytes: share.allocated_bytes,
                clients: exports.iter().map(|e| state.server.clients_of(e)).sum(),
                exports: exports.iter().map(|e| e.name.clone()).collect(),
            });
        }
        let volume_bytes: u64 = volumes.iter().map(|v| v.size).sum();
        pools.push(PoolListing {
            pool: node.name.clone(),
            extent_size: space.unit_bytes,
            data_bytes: space.data_bytes,
            allocated_bytes: space.allocated_bytes,
            volume_bytes,
            overcommit: volume_bytes as f64 / space.data_bytes as f64,
            volumes,
        });
    }
    Ok(pools)
}

async fn create(
    state: &ControlPlane,
    volume: &str,
    size: u64,
) -> anyhow::Result<serde_json::Value> {
    let mut reconfig = state.reconfig.lock().await;
    let (_, name, pool, full) = target(state, volume)?;
    config::check_name(name).map_err(|e| anyhow::anyhow!("volume {full}: {e}"))?;
    check_size(&full, size)?;
    if pool.size_of(name).await?.is_some() {
        bail!("volume {full} exists");
    }
    if let Some(other) = state.exports.lookup(&full) {
        bail!(
            "volume {full}: an export of that name exists already ({})",
            other.description
        );
    }
    let plan = Plan::new()
        .then(CreateVolume {
            pool: pool.clone(),
            name: name.to_string(),
            size,
        })
        .then(ExportVolume::new(state, pool, name, &full));
    apply(state, &mut reconfig, plan).await?;
    Ok(done(format!(
        "created volume {full} of {} ({size} bytes), exported as {full:?}",
        ByteSize(size)
    )))
}

fn volume_export(full: &str, device: DeviceRef) -> Export {
    Export {
        name: full.to_string(),
        description: format!("thin volume {full}"),
        device,
        read_only: false,
        allow: Vec::new(),
    }
}

async fn resize(
    state: &ControlPlane,
    volume: &str,
    size: u64,
    shrink: bool,
) -> anyhow::Result<serde_json::Value> {
    let mut reconfig = state.reconfig.lock().await;
    let (pool_name, name, pool, full) = target(state, volume)?;
    let old = (pool.size_of(name).await?)
        .with_context(|| format!("no volume {full} in pool {pool_name}"))?;
    check_size(&full, size)?;
    if let Some(layer) = parent_layer(&reconfig.loaded, &full) {
        bail!(
            "volume {full} is under layer {layer:?}, which does not follow a resize of its child"
        );
    }
    if size < old && !shrink {
        bail!(
            "volume {full}: {} → {} is a shrink, which discards everything stored past {}; \
             pass --shrink to confirm",
            ByteSize(old),
            ByteSize(size),
            ByteSize(size)
        );
    }
    let edited = edit_listed_volume(&reconfig.loaded, pool_name, name, |volumes, at| {
        if let Some(table) = volumes.get_mut(at).and_then(|v| v.as_inline_table_mut()) {
            table.insert("size", toml_edit::Value::from(size as i64));
        }
    })?;
    let record = recording(&reconfig, edited)?;
    let plan = Plan::new()
        .then(ResizeVolume {
            pool,
            name: name.to_string(),
            size,
            old,
        })
        .then_some(record);
    let recorded = apply(state, &mut reconfig, plan).await?;
    let mut summary = format!(
        "resized volume {full} from {} to {}",
        ByteSize(old),
        ByteSize(size)
    );
    if !recorded.is_empty() {
        summary.push_str(&format!("; {}", recorded.trim_start_matches("done; ")));
    }
    let clients: usize = node_device(state, &full)
        .map(|device| {
            exports_of(state, &device)
                .iter()
                .map(|e| state.server.clients_of(e))
                .sum()
        })
        .unwrap_or(0);
    if clients > 0 {
        summary.push_str(&format!(
            "; {clients} connected client(s) keep seeing {} until they reconnect (NBD cannot \
             announce a new size){}",
            ByteSize(old),
            if size < old {
                ", and their requests past the new end fail"
            } else {
                ""
            }
        ));
    }
    Ok(done(summary))
}

async fn delete(
    state: &ControlPlane,
    volume: &str,
    force: bool,
) -> anyhow::Result<serde_json::Value> {
    let mut reconfig = state.reconfig.lock().await;
    let (pool_name, name, pool, full) = target(state, volume)?;
    if pool.size_of(name).await?.is_none() {
        bail!("no volume {full} in pool {pool_name}");
    }
    if let Some(layer) = parent_layer(&reconfig.loaded, &full) {
        bail!("volume {full} is under layer {layer:?}: remove that layer from the config first");
    }
    let device = node_device(state, &full);
    let exports = device
        .as_ref()
        .map(|d| exports_of(state, d))
        .unwrap_or_default();
    refuse_if_busy(state, &format!("volume {full}"), &exports, force)?;
    // Prepared and validated before anything changes. The config is recorded before the
    // volume is deleted: a crash between them leaves the volume in the pool, exported under
    // its default name at the next start, rather than a config that would create it again.
    let record = recording(
        &reconfig,
        edit_config_for_delete(&reconfig.loaded, pool_name, name)?,
    )?;
    let closed: usize = if force {
        exports.iter().map(|e| state.server.clients_of(e)).sum()
    } else {
        0
    };
    let plan = Plan::new()
        .then(WithdrawExports {
            exports: exports.clone(),
            from: state.exports.clone(),
        })
        .then(Disconnect {
            full: full.clone(),
            exports: exports.clone(),
            server: state.server.clone(),
            force,
        })
        .then_some(record)
        .then(DeleteVolume {
            pool,
            name: name.to_string(),
        })
        .then(DetachNode::new(full.clone()));
    let recorded = apply(state, &mut reconfig, plan).await?;
    let mut summary = format!("deleted volume {full}");
    if !recorded.is_empty() {
        summary.push_str(&format!("; {}", recorded.trim_start_matches("done; ")));
    }
    if !exports.is_empty() {
        let names: Vec<String> = exports.iter().map(|e| format!("{:?}", e.name)).collect();
        summary.push_str(&format!("; export {} removed", names.join(", ")));
    }
    if closed > 0 {
        summary.push_str(&format!(
            "; {closed} client connection(s) closed after their in-flight requests were \
             answered (their further I/O fails)"
        ));
    }
    Ok(done(summary))
}

async fn export(state: &ControlPlane, volume: &str) -> anyhow::Result<serde_json::Value> {
    let mut reconfig = state.reconfig.lock().await;
    let (_, name, pool, full) = target(state, volume)?;
    if let Some(other) = state.exports.lookup(&full) {
        bail!("{full} is exported already ({})", other.description);
    }
    let device = pool.device(name).await?;
    let read_only = device.capabilities().read_only;
    let plan = Plan::new().then(ExportVolume::new(state, pool, name, &full));
    apply(state, &mut reconfig, plan).await?;
    Ok(done(format!(
        "exported {full} ({}, {}) until it is unexported, deleted or the server stops",
        ByteSize(device.geometry().size),
        if read_only { "read-only" } else { "read-write" }
    )))
}

async fn unexport(
    state: &ControlPlane,
    volume: &str,
    force: bool,
) -> anyhow::Result<serde_json::Value> {
    let mut reconfig = state.reconfig.lock().await;
    let (pool_name, name) = split(volume)?;
    let full = format!("{pool_name}/{name}");
    let export = state
        .exports
        .lookup(&full)
        .with_context(|| format!("no export named {full:?}"))?;
    if reconfig
        .loaded
        .config
        .exports
        .iter()
        .any(|e| e.name.get_ref() == &full)
    {
        bail!("{full} is exported by the config: edit the config to remove it");
    }
    let exports = vec![export];
    refuse_if_busy(state, &full, &exports, force)?;
    let plan = withdrawal(state, &full, exports, force);
    apply(state, &mut reconfig, plan).await?;
    Ok(done(format!("{full} is no longer exported")))
}

/// Withdraws `exports` of the node `full`, disconnects their clients (with `force`; without,
/// there must be none), and detaches the node.
fn withdrawal<'a>(
    state: &ControlPlane,
    full: &str,
    exports: Vec<Arc<Export>>,
    force: bool,
) -> Plan<Applying<'a>> {
    Plan::new()
        .then(WithdrawExports {
            exports: exports.clone(),
            from: state.exports.clone(),
        })
        .then(Disconnect {
            full: full.to_string(),
            exports,
            server: state.server.clone(),
            force,
        })
        .then(DetachNode::new(full.to_string()))
}

/// After a pool's own verb ran (`strata call`, `strata snapshot …`): exports the volumes it
/// made (a clone) as `<pool>/<volume>`, and ends the exports of devices it no longer holds
/// (a deleted snapshot), closing their clients' connections. Returns what it did.
pub async fn reconcile(
    state: &ControlPlane,
    reconfig: &mut Reconfig,
    pool_name: &str,
) -> anyhow::Result<Vec<String>> {
    let pool = find_pool(state, pool_name)?;
    let mut said = Vec::new();
    let prefix = format!("{pool_name}/");
    for name in pool.names().await? {
        let full = format!("{prefix}{name}");
        if state.nodes().iter().any(|n| n.name == full) {
            continue;
        }
        let plan = Plan::new().then(ExportVolume::new(state, pool.clone(), &name, &full));
        apply(state, reconfig, plan).await?;
        said.push(format!("exported {full}"));
    }
    let gone: Vec<String> = {
        let mut gone = Vec::new();
        for node in state.nodes() {
            let Some(name) = node.name.strip_prefix(&prefix) else {
                continue;
            };
            if pool.device(name).await.is_err() {
                gone.push(node.name.clone());
            }
        }
        gone
    };
    for full in gone {
        let exports = node_device(state, &full)
            .map(|d| exports_of(state, &d))
            .unwrap_or_default();
        let plan = withdrawal(state, &full, exports, true);
        apply(state, reconfig, plan).await?;
        said.push(format!("{full} is gone: its export ended"));
    }
    Ok(said)
}

fn config_text(loaded: &Loaded) -> anyhow::Result<Option<(PathBuf, DocumentMut)>> {
    let Some(source) = &loaded.source else {
        return Ok(None);
    };
    let text =
        std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    let doc: DocumentMut = text
        .parse()
        .with_context(|| format!("parsing {} for editing", source.display()))?;
    Ok(Some((source.clone(), doc)))
}

/// Applies `edit` to the pool's `volumes` array at the volume's entry, if the config lists
/// it; returns the new text, or None when there is nothing to change.
fn edit_listed_volume(
    loaded: &Loaded,
    pool: &str,
    name: &str,
    edit: impl FnOnce(&mut toml_edit::Array, usize),
) -> anyhow::Result<Option<String>> {
    let listed = loaded
        .layers
        .iter()
        .any(|l| l.name == pool && l.volumes.iter().any(|v| v.name == name));
    if !listed {
        return Ok(None);
    }
    let Some((source, mut doc)) = config_text(loaded)? else {
        return Ok(None);
    };
    let volumes = doc
        .get_mut("layer")
        .and_then(Item::as_array_of_tables_mut)
        .and_then(|layers| {
            layers
                .iter_mut()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some(pool))
        })
        .and_then(|t| t.get_mut("volumes"))
        .and_then(Item::as_array_mut)
        .with_context(|| {
            format!(
                "{}: no `volumes` list in the [[layer]] {pool:?}",
                source.display()
            )
        })?;
    let at = volumes
        .iter()
        .position(|v| {
            v.as_inline_table()
                .and_then(|t| t.get("name"))
                .and_then(|n| n.as_str())
                == Some(name)
        })
        .with_context(|| {
            format!(
                "{}: volume {name:?} is not in the `volumes` of {pool:?}",
                source.display()
            )
        })?;
    edit(volumes, at);
    Ok(Some(doc.to_string()))
}

/// The config without the volume: out of its pool's `volumes`, and without the `[[export]]`
/// tables that serve it. None when the config mentions it nowhere.
fn edit_config_for_delete(
    loaded: &Loaded,
    pool: &str,
    name: &str,
) -> anyhow::Result<Option<String>> {
    let full = format!("{pool}/{name}");
    let exported = loaded
        .config
        .exports
        .iter()
        .any(|e| e.device.get_ref() == &full);
    let text = edit_listed_volume(loaded, pool, name, |volumes, at| {
        volumes.remove(at);
        // The next entry's leading space was a separator after the one removed.
        if let (0, Some(first)) = (at, volumes.get_mut(0)) {
            first.decor_mut().set_prefix("");
        }
    })?;
    if !exported {
        return Ok(text);
    }
    let mut doc: DocumentMut = match text {
        Some(text) => text.parse()?,
        None => match config_text(loaded)? {
            Some((_, doc)) => doc,
            None => return Ok(None),
        },
    };
    if let Some(exports) = doc.get_mut("export").and_then(Item::as_array_of_tables_mut) {
        exports.retain(|t| t.get("device").and_then(|d| d.as_str()) != Some(full.as_str()));
        if exports.is_empty() {
            doc.remove("export");
        }
    }
    let mut text = doc.to_string();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(Some(text))
}

/// At start: exports every volume the config neither exports nor puts under a layer (the
/// volumes made with `strata volume create`, or listed without an export) as
/// `<pool>/<volume>`.
pub async fn export_unlisted_volumes(stack: &Stack, loaded: &Loaded) {
    let used: std::collections::HashSet<&str> = loaded
        .config
        .exports
        .iter()
        .map(|e| e.device.get_ref().as_str())
        .chain(
            loaded
                .layers
                .iter()
                .flat_map(|l| l.children.iter().map(String::as_str)),
        )
        .collect();
    for node in &stack.nodes {
        let NodeKind::Maker(device) = &node.kind else {
            continue;
        };
        let names = match device.control(Control::Volumes).await {
            Ok(ControlReply::Names(names)) => names,
            other => {
                tracing::error!(node = %node.name, "listing its volumes failed: {other:?}");
                continue;
            }
        };
        for volume in names {
            let full = format!("{}/{volume}", node.name);
            if used.contains(full.as_str()) || stack.exports.lookup(&full).is_some() {
                continue;
            }
            let device = stack
                .nodes
                .iter()
                .find(|n| n.name == full)
                .and_then(|n| n.device().cloned());
            if let Some(device) = device {
                stack.exports.insert(volume_export(&full, device));
            }
        }
    }
}

/// Runs a volume plan over the control plane's nodes (under the reconfiguration lock the
/// caller holds); returns what recording the config said, if the plan recorded it.
async fn apply<'a>(
    plane: &ControlPlane,
    reconfig: &'a mut Reconfig,
    plan: Plan<Applying<'a>>,
) -> anyhow::Result<String> {
    let mut state = Applying::new(reconfig, plane.nodes());
    let result = plan.apply(&mut state).await;
    plane.set_nodes(state.nodes);
    result.map(|()| state.summary)
}

/// The step that records an edited config, validated now, if there is an edit.
fn recording(reconfig: &Reconfig, edited: Option<String>) -> anyhow::Result<Option<RecordConfig>> {
    let Some(text) = edited else {
        return Ok(None);
    };
    let old = reconfig.read_config()?;
    let loaded = reconfig.reload(&text)?;
    Ok(Some(RecordConfig::new(old, text, loaded)))
}

/// Creates the volume in its pool; undone by deleting it (it holds nothing yet).
struct CreateVolume {
    pool: Pool,
    name: String,
    size: u64,
}

#[async_trait]
impl<'a> Step<Applying<'a>> for CreateVolume {
    fn describe(&self) -> String {
        format!("volume {}/{}", self.pool.name, self.name)
    }

    async fn apply(&mut self, _: &mut Applying<'a>) -> anyhow::Result<()> {
        self.pool.create(&self.name, self.size).await
    }

    async fn undo(&mut self, _: &mut Applying<'a>) -> anyhow::Result<()> {
        self.pool.delete(&self.name).await
    }
}

/// Opens a pool's volume as a node of the stack and exports it as `<pool>/<volume>`.
struct ExportVolume {
    pool: Pool,
    name: String,
    full: String,
    exports: Arc<Exports>,
}

impl ExportVolume {
    fn new(state: &ControlPlane, pool: Pool, name: &str, full: &str) -> Self {
        ExportVolume {
            pool,
            name: name.to_string(),
            full: full.to_string(),
            exports: state.exports.clone(),
        }
    }
}

#[async_trait]
impl<'a> Step<Applying<'a>> for ExportVolume {
    fn describe(&self) -> String {
        format!("exporting volume {}", self.full)
    }

    async fn apply(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        let volume = (self.pool.device(&self.name).await)
            .context("the volume vanished right after its creation")?;
        let device: DeviceRef = Arc::new(Metered::new(
            volume,
            state.reconfig.metrics.device(&self.full),
            state.reconfig.runtime.clone(),
        ));
        state.nodes.push(Node {
            name: self.full.clone(),
            kind: NodeKind::Device(device.clone()),
            label_disk: None,
        });
        self.exports.insert(volume_export(&self.full, device));
        Ok(())
    }

    async fn undo(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        self.exports.remove(&self.full);
        state.nodes.retain(|n| n.name != self.full);
        Ok(())
    }
}

/// Resizes a volume; a grow is undone by shrinking back (nothing was stored past the old
/// end yet that a client was told about), a shrink cannot be undone.
struct ResizeVolume {
    pool: Pool,
    name: String,
    size: u64,
    old: u64,
}

#[async_trait]
impl<'a> Step<Applying<'a>> for ResizeVolume {
    fn describe(&self) -> String {
        format!("volume {}/{}", self.pool.name, self.name)
    }

    async fn apply(&mut self, _: &mut Applying<'a>) -> anyhow::Result<()> {
        self.pool.resize(&self.name, self.size).await
    }

    async fn undo(&mut self, _: &mut Applying<'a>) -> anyhow::Result<()> {
        self.pool.resize(&self.name, self.old).await
    }

    fn reversible(&self) -> bool {
        self.size >= self.old
    }
}

/// Takes a volume's exports away, so that no new client connects; undone by putting them
/// back.
struct WithdrawExports {
    exports: Vec<Arc<Export>>,
    from: Arc<Exports>,
}

#[async_trait]
impl<'a> Step<Applying<'a>> for WithdrawExports {
    fn describe(&self) -> String {
        "withdrawing the exports".to_string()
    }

    async fn apply(&mut self, _: &mut Applying<'a>) -> anyhow::Result<()> {
        for export in &self.exports {
            self.from.remove(&export.name);
        }
        Ok(())
    }

    async fn undo(&mut self, _: &mut Applying<'a>) -> anyhow::Result<()> {
        for export in &self.exports {
            self.from.insert(Export {
                name: export.name.clone(),
                description: export.description.clone(),
                device: export.device.clone(),
                read_only: export.read_only,
                allow: export.allow.clone(),
            });
        }
        Ok(())
    }
}

/// Makes sure no client still uses the withdrawn exports: with `force`, closes their
/// connections; without, refuses if one connected between the check and the withdrawal.
struct Disconnect {
    full: String,
    exports: Vec<Arc<Export>>,
    server: Arc<Server>,
    force: bool,
}

#[async_trait]
impl<'a> Step<Applying<'a>> for Disconnect {
    fn describe(&self) -> String {
        format!("volume {}", self.full)
    }

    async fn apply(&mut self, _: &mut Applying<'a>) -> anyhow::Result<()> {
        if self.force {
            for export in &self.exports {
                let left = self.server.disconnect(export, DISCONNECT_TIMEOUT).await;
                if left > 0 {
                    bail!(
                        "{left} client(s) of export {:?} did not disconnect within \
                         {DISCONNECT_TIMEOUT:?}; nothing deleted",
                        export.name
                    );
                }
            }
            return Ok(());
        }
        let busy = connected(&self.server, &self.exports);
        if !busy.is_empty() {
            bail!(
                "in use: client(s) connected ({}); nothing deleted",
                busy.join(", ")
            );
        }
        Ok(())
    }
}

/// "N on export E" for each of `exports` that has clients.
/// Refuses to go on while clients use `exports`, unless `force` (they are disconnected then).
fn refuse_if_busy(
    state: &ControlPlane,
    what: &str,
    exports: &[Arc<Export>],
    force: bool,
) -> anyhow::Result<()> {
    let busy = connected(&state.server, exports);
    if !busy.is_empty() && !force {
        bail!(
            "{what} is in use: client(s) connected ({}); disconnect them, or pass --force to \
             close their connections",
            busy.join(", ")
        );
    }
    Ok(())
}

fn connected(server: &Server, exports: &[Arc<Export>]) -> Vec<String> {
    exports
        .iter()
        .filter_map(|e| match server.clients_of(e) {
            0 => None,
            n => Some(format!("{n} on export {:?}", e.name)),
        })
        .collect()
}

/// Deletes the volume and its data: the point of no return.
struct DeleteVolume {
    pool: Pool,
    name: String,
}

#[async_trait]
impl<'a> Step<Applying<'a>> for DeleteVolume {
    fn describe(&self) -> String {
        format!("volume {}/{}", self.pool.name, self.name)
    }

    async fn apply(&mut self, _: &mut Applying<'a>) -> anyhow::Result<()> {
        self.pool.delete(&self.name).await
    }

    fn reversible(&self) -> bool {
        false
    }
}
