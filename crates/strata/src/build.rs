//! Turns a validated configuration into devices and exports.

use std::sync::Arc;

use anyhow::Context;
use strata_backend::{FileDevice, FileOptions};
use strata_core::{DeviceRef, Metered, MetricsRegistry, Runtime};
use strata_nbd::{Export, Exports};

use crate::config::Loaded;

/// A named device the server holds, in configuration order.
pub struct Node {
    pub name: String,
    pub device: DeviceRef,
}

/// What the configuration built.
pub struct Stack {
    pub nodes: Vec<Node>,
    pub exports: Arc<Exports>,
}

pub fn build(
    loaded: &Loaded,
    runtime: Arc<dyn Runtime>,
    metrics: &MetricsRegistry,
) -> anyhow::Result<Stack> {
    let mut nodes = Vec::new();
    for disk in &loaded.config.disks {
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
        nodes.push(Node {
            name,
            device: Arc::new(device),
        });
    }
    let exports = Arc::new(Exports::new());
    for export in &loaded.config.exports {
        let device_name = export.device.get_ref();
        let node = nodes
            .iter()
            .find(|node| &node.name == device_name)
            .expect("config validation checked every export's device");
        exports.insert(Export {
            name: export.name.get_ref().clone(),
            description: export.description.clone(),
            device: node.device.clone(),
            read_only: export.read_only,
        });
    }
    Ok(Stack { nodes, exports })
}
