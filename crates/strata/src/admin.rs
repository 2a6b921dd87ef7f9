//! The admin interface: a unix socket that answers one JSON request per connection.
//! `strata status` and `strata metrics` are its clients.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use strata_core::{Control, ControlReply};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tracing::{debug, warn};

use strata_stack::build::NodeKind;
use strata_stack::call::Call;
use strata_stack::control::ControlPlane;
use strata_stack::reconfig::Change;
use strata_stack::volumes::VolumeRequest;

/// Everything the admin interface reports on: the control plane, and what only the serving
/// process knows (its listeners, its uptime, its metrics registry).
pub struct AdminState {
    pub started: Instant,
    pub data_dir: String,
    pub listeners: Vec<String>,
    pub plane: Arc<ControlPlane>,
    pub registry: Registry,
}

impl std::ops::Deref for AdminState {
    type Target = ControlPlane;

    fn deref(&self) -> &ControlPlane {
        &self.plane
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum AdminRequest {
    Status,
    Metrics,
    Change(Change),
    /// `strata volume …`: thin volumes created, listed, resized, deleted.
    Volume(VolumeRequest),
    /// `strata call …`: a verb a layer declares and handles itself.
    Call(Call),
    /// Lock verbs: the connection becomes a lock session (`lock_session`).
    LockSession,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ExportStatus {
    pub name: String,
    pub device: String,
    pub size: u64,
    pub read_only: bool,
    pub description: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Connections {
    pub open: usize,
    pub total: u64,
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub version: &'static str,
    pub uptime_s: u64,
    pub data_dir: String,
    pub listeners: Vec<String>,
    pub connections: Connections,
    pub exports: Vec<ExportStatus>,
    /// Each a `NodeStatus`, or a refused device (health "refused", its reason in detail).
    pub devices: Vec<serde_json::Value>,
}

/// The largest request line we read; requests are a few dozen bytes.
const MAX_REQUEST_BYTES: u64 = 64 * 1024;

pub async fn run(listener: UnixListener, state: Arc<AdminState>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!("admin accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &state).await {
                debug!("admin request failed: {e:#}");
            }
        });
    }
}

async fn answer(stream: tokio::net::UnixStream, state: &AdminState) -> anyhow::Result<()> {
    let (reader, mut writer) = stream.into_split();
    let mut line = String::new();
    let mut reader =
        tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(reader, MAX_REQUEST_BYTES));
    reader.read_line(&mut line).await?;
    let reply = match serde_json::from_str::<AdminRequest>(&line) {
        Ok(AdminRequest::LockSession) => {
            // Each of the session's lines has its own limit.
            reader.get_mut().set_limit(u64::MAX);
            return crate::lock_session::run(reader, writer, state).await;
        }
        Ok(AdminRequest::Status) => serde_json::to_string(&status(state).await)?,
        Ok(AdminRequest::Metrics) => {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &state.registry)?;
            serde_json::to_string(&serde_json::json!({ "metrics": text }))?
        }
        Ok(AdminRequest::Change(change)) => match state.change(change).await {
            Ok(summary) => serde_json::to_string(&serde_json::json!({ "done": summary }))?,
            Err(e) => serde_json::to_string(&serde_json::json!({ "error": format!("{e:#}") }))?,
        },
        Ok(AdminRequest::Volume(request)) => {
            match strata_stack::volumes::answer(&state.plane, request).await {
                Ok(reply) => serde_json::to_string(&reply)?,
                Err(e) => serde_json::to_string(&serde_json::json!({ "error": format!("{e:#}") }))?,
            }
        }
        Ok(AdminRequest::Call(call)) => match strata_stack::call::call(&state.plane, call).await {
            Ok(answer) => serde_json::to_string(&serde_json::json!({ "answer": answer }))?,
            Err(e) => serde_json::to_string(&serde_json::json!({ "error": format!("{e:#}") }))?,
        },
        Err(e) => serde_json::to_string(&serde_json::json!({ "error": e.to_string() }))?,
    };
    writer.write_all(reply.as_bytes()).await?;
    writer.write_all(b"\n").await?;
    writer.shutdown().await?;
    Ok(())
}

pub async fn status(state: &AdminState) -> Status {
    let mut devices = Vec::new();
    // Show each tree once, from its root: a node inside a layer appears under it, and every
    // volume of a pool (the config's and those made at run time) under its pool.
    let mut pool_volumes: Vec<String> = Vec::new();
    for node in state.nodes() {
        if let NodeKind::Maker(device) = &node.kind {
            if let Ok(ControlReply::Names(volumes)) = device.control(Control::Volumes).await {
                pool_volumes.extend(volumes.iter().map(|v| format!("{}/{v}", node.name)));
            }
        }
    }
    let inner: std::collections::HashSet<String> = {
        let reconfig = state.reconfig.lock().await;
        reconfig
            .loaded
            .layers
            .iter()
            .flat_map(|l| {
                let volumes = l
                    .volumes
                    .iter()
                    .map(move |v| format!("{}/{}", l.name, v.name));
                l.children.iter().cloned().chain(volumes)
            })
            .chain(pool_volumes)
            .collect()
    };
    for node in state.nodes().iter().filter(|n| !inner.contains(&n.name)) {
        match node.describe().await {
            Ok(mut status) => {
                status.name = node.name.clone();
                devices.push(serde_json::to_value(&status).unwrap_or_default());
            }
            Err(e) => warn!(device = %node.name, "describe failed: {e}"),
        }
    }
    // A refused layer shows the children that did start under it (they are not roots).
    let layers = state.reconfig.lock().await.loaded.layers.clone();
    for refused in &state.refused {
        let mut entry = refused.status();
        let children = layers
            .iter()
            .find(|l| l.name == refused.name)
            .map(|l| l.children.clone())
            .unwrap_or_default();
        for node in state.nodes().iter().filter(|n| children.contains(&n.name)) {
            if let (Ok(mut child), Some(list)) =
                (node.describe().await, entry["children"].as_array_mut())
            {
                child.name = node.name.clone();
                list.push(serde_json::to_value(&child).unwrap_or_default());
            }
        }
        devices.push(entry);
    }
    let exports = state
        .exports
        .list()
        .iter()
        .map(|export| ExportStatus {
            name: export.name.clone(),
            device: device_name(state, export),
            size: export.device.geometry().size,
            read_only: export.read_only || export.device.capabilities().read_only,
            description: export.description.clone(),
        })
        .collect();
    Status {
        version: env!("CARGO_PKG_VERSION"),
        uptime_s: state.started.elapsed().as_secs(),
        data_dir: state.data_dir.clone(),
        listeners: state.listeners.clone(),
        connections: Connections {
            open: state.server.connections_open(),
            total: state.server.connections_total(),
        },
        exports,
        devices,
    }
}

fn device_name(state: &AdminState, export: &strata_nbd::Export) -> String {
    state
        .nodes()
        .iter()
        .find(|node| {
            node.device()
                .is_some_and(|d| Arc::ptr_eq(d, &export.device))
        })
        .map(|node| node.name.clone())
        .unwrap_or_default()
}

/// Sends one request to a running server's admin socket and returns the JSON reply.
pub fn request(socket: &Path, request: &AdminRequest) -> anyhow::Result<serde_json::Value> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the admin socket {} (is `strata serve` running?)",
            socket.display()
        )
    })?;
    let mut line = serde_json::to_string(request)?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply)?;
    let value: serde_json::Value =
        serde_json::from_str(&reply).context("the server sent a reply that is not JSON")?;
    if let Some(error) = value.get("error") {
        let reason = error
            .as_str()
            .map_or_else(|| error.to_string(), str::to_string);
        anyhow::bail!("the server refused the request: {reason}");
    }
    Ok(value)
}
