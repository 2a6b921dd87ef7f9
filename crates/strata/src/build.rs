//! Turns a validated configuration into devices and exports.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use strata_backend::{FileDevice, FileOptions};
use strata_core::{
    BlockDevice, Control, ControlReply, DeviceRef, Metered, MetricsRegistry, NodeStatus, Runtime,
};
use strata_layers::delay::parse_duration;
use strata_layers::registry::{self, LayerArgs, Options, StartPolicy};
use strata_layers::thin::{LowWater, MapCommit, PoolOptions, PoolRuntime, ThinPool, WhenFull};
use strata_nbd::{Export, Exports};

use crate::config::Loaded;
use crate::graph::LayerConfig;
use crate::hierarchy;

/// What a named node of the stack is.
#[derive(Clone)]
pub enum NodeKind {
    /// A block device (a disk, a layer, a volume).
    Device(DeviceRef),
    /// A thin pool: not a device itself, the parent of its volumes.
    Pool(Arc<ThinPool>),
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
            NodeKind::Pool(_) => None,
        }
    }

    pub async fn describe(&self) -> strata_core::Result<NodeStatus> {
        match &self.kind {
            NodeKind::Device(device) => match device.control(Control::Describe).await? {
                ControlReply::Describe(status) => Ok(status),
                _ => Err(strata_core::BlockError::Unsupported("describe")),
            },
            NodeKind::Pool(pool) => pool.describe().await,
        }
    }

    pub async fn flush(&self) -> strata_core::Result<()> {
        match &self.kind {
            NodeKind::Device(device) => device.flush().await,
            NodeKind::Pool(pool) => pool.flush().await,
        }
    }
}

/// What the configuration built.
pub struct Stack {
    pub nodes: Vec<Node>,
    pub exports: Arc<Exports>,
    /// Generation of the hierarchy labels on the disks (0: no disk is under a layer).
    pub generation: u64,
}

impl Stack {
    pub fn pools(&self) -> Vec<Arc<ThinPool>> {
        self.nodes
            .iter()
            .filter_map(|node| match &node.kind {
                NodeKind::Pool(pool) => Some(pool.clone()),
                NodeKind::Device(_) => None,
            })
            .collect()
    }

    fn device(&self, name: &str) -> Option<DeviceRef> {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .and_then(|node| node.device().cloned())
    }
}

pub async fn build(
    loaded: &Loaded,
    runtime: Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<Stack> {
    let mut stack = Stack {
        nodes: Vec::new(),
        exports: Arc::new(Exports::new()),
        generation: 0,
    };
    for disk in loaded.config.disks.iter().filter(|d| !d.missing) {
        let name = disk.name.get_ref().clone();
        let path = loaded.resolve(&disk.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("disk {name}: creating {}", parent.display()))?;
        }
        let options = FileOptions {
            path: path.clone(),
            size: disk.size.map(|size| size.0),
            direct: disk.direct,
            read_only: disk.read_only,
            inline_cached_io: disk.inline_io,
        };
        let file = FileDevice::open(options, runtime.clone())
            .with_context(|| format!("disk {name}: opening {}", path.display()))?;
        let device = Metered::new(file, metrics.device(&name), runtime.clone());
        stack.nodes.push(Node {
            name,
            kind: NodeKind::Device(Arc::new(device)),
            label_disk: None,
        });
    }
    stack.generation = label_disks(&mut stack, loaded).await?;
    for &index in &loaded.build_order {
        let layer = &loaded.layers[index];
        if layer.kind == "thin-pool" {
            build_thin_pool(&mut stack, layer, loaded, runtime.clone(), metrics).await?;
        } else {
            build_layer(&mut stack, layer, loaded, runtime.clone(), metrics).await?;
        }
    }
    for export in &loaded.config.exports {
        let device_name = export.device.get_ref();
        let device = stack
            .device(device_name)
            .expect("config validation checked every export's device");
        stack.exports.insert(Export {
            name: export.name.get_ref().clone(),
            description: export.description.clone(),
            device,
            read_only: export.read_only,
        });
    }
    crate::volume_cmd::export_unlisted_volumes(&stack, loaded);
    Ok(stack)
}

/// Writes or checks the hierarchy labels of the disks under layers, and gives those layers
/// the disks' labelled views.
async fn label_disks(stack: &mut Stack, loaded: &Loaded) -> anyhow::Result<u64> {
    let labelled = hierarchy::labelled_disks(loaded);
    let disks: Vec<(String, DeviceRef)> = labelled
        .iter()
        .filter_map(|name| stack.device(name).map(|d| (name.clone(), d)))
        .collect();
    if disks.is_empty() {
        return Ok(0);
    }
    let generation = hierarchy::reconcile(loaded, &disks).await?;
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
    Ok(generation)
}

fn layer_options(layer: &LayerConfig, loaded: &Loaded) -> Options {
    Options::new(layer.options.clone(), loaded.data_dir.clone())
}

/// Builds one registered layer over its (already built) children.
async fn build_layer(
    stack: &mut Stack,
    layer: &LayerConfig,
    loaded: &Loaded,
    runtime: Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<()> {
    let kind = registry::find(&layer.kind).expect("config validation checked the kind");
    let children = layer
        .children
        .iter()
        .map(|name| stack.device(name))
        .collect();
    let args = LayerArgs {
        name: layer.name.clone(),
        children,
        child_names: layer.children.clone(),
        options: layer_options(layer, loaded),
        runtime: runtime.clone(),
        start: StartPolicy::FRESH,
    };
    let device = (kind.build)(args)
        .await
        .with_context(|| format!("layer {} ({})", layer.name, layer.kind))?;
    let metered = Metered::new(device, metrics.device(&layer.name), runtime);
    stack.nodes.push(Node {
        name: layer.name.clone(),
        kind: NodeKind::Device(Arc::new(metered)),
        label_disk: None,
    });
    Ok(())
}

/// Opens (or formats, the first time) a thin pool and creates its configured volumes.
async fn build_thin_pool(
    stack: &mut Stack,
    layer: &LayerConfig,
    loaded: &Loaded,
    runtime: Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<()> {
    let name = layer.name.clone();
    let child_name = &layer.children[0];
    let child = stack
        .device(child_name)
        .expect("config validation checked every child");
    let opts = layer_options(layer, loaded);
    let invalid = |e: strata_core::BlockError| anyhow::anyhow!("thin pool {name}: {e}");
    let extent_size = opts.size("extent").map_err(invalid)?.unwrap_or(512 << 10);
    if !extent_size.is_power_of_two() || !(64 << 10..=4 << 20).contains(&extent_size) {
        anyhow::bail!("thin pool {name}: field `extent`: {extent_size} bytes is not a power of two from 64KiB to 4MiB");
    }
    let options = PoolOptions {
        extent_size,
        metadata_size: opts.size("metadata-size").map_err(invalid)?,
        start_mid: opts.bool("start-mid").map_err(invalid)?.unwrap_or(false),
    };
    let mut settings = PoolRuntime::new(runtime.clone());
    if let Some(ms) = opts.u64("commit-interval-ms").map_err(invalid)? {
        settings.commit_interval = Some(Duration::from_millis(ms.max(1)));
    }
    let field =
        |key: &str, problem: String| anyhow::anyhow!("thin pool {name}: field `{key}`: {problem}");
    if let Some(mode) = opts.text("map-commit").map_err(invalid)? {
        settings.map_commit = MapCommit::parse(&mode).map_err(|e| field("map-commit", e))?;
    }
    let full_wait = opts
        .text("full-wait")
        .map_err(invalid)?
        .map(|text| parse_duration(&text).map_err(|e| field("full-wait", e)))
        .transpose()?;
    let when_full = opts.text("when-full").map_err(invalid)?;
    settings.when_full = WhenFull::parse(when_full.as_deref(), full_wait)
        .map_err(|e| anyhow::anyhow!("thin pool {name}: {e}"))?;
    if let Some(mark) = opts.text("low-water").map_err(invalid)? {
        settings.low_water = LowWater::parse(&mark).map_err(|e| field("low-water", e))?;
    }
    let pool = ThinPool::open_or_format(&name, child, &options, settings, StartPolicy::FRESH)
        .await
        .with_context(|| format!("thin pool {name}: opening on {child_name}"))?;
    for volume in &layer.volumes {
        let volume_name = &volume.name;
        if pool.volume(volume_name).is_none() {
            pool.create_volume(volume_name, volume.size)
                .await
                .with_context(|| format!("thin pool {name}: creating volume {volume_name}"))?;
        }
    }
    stack.nodes.push(Node {
        name: name.clone(),
        kind: NodeKind::Pool(pool.clone()),
        label_disk: None,
    });
    for volume_name in pool.volume_names() {
        let volume = pool.open_volume(&volume_name).expect("listed volume");
        let full_name = format!("{name}/{volume_name}");
        let metered = Metered::new(volume, metrics.device(&full_name), runtime.clone());
        let device: Arc<dyn BlockDevice> = Arc::new(metered);
        stack.nodes.push(Node {
            name: full_name,
            kind: NodeKind::Device(device),
            label_disk: None,
        });
    }
    Ok(())
}
