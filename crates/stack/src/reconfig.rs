//! Online reconfiguration: replace or add a member, fail one, grow a layer, while serving.
//!
//! Each change runs in this order:
//! 1. Validate the new configuration (the config file, edited in memory) before touching
//!    anything.
//! 2. Open the new disk, if the change has one.
//! 3. Tell the layer (`Control`). A layer that keeps state records its new shape durably.
//! 4. Only then write the edited config file (write a temporary file, then rename it) and
//!    relabel every disk of the hierarchy with the next generation.
//!
//! A crash between 3 and 4 leaves the layer ahead of the config. The layer then sees a member
//! it no longer lists, and its own metadata decides, as at any restart after a failure.
//! Changes are serialized by one lock.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use strata_backend::{FileDevice, FileOptions};
use strata_core::{Control, ControlReply, DeviceRef, Member, Metered, MetricsRegistry, Runtime};
use toml_edit::{value, Array, DocumentMut, Item, Table};

use crate::build::{Node, NodeKind};
use crate::config::{self, Loaded};
use crate::hierarchy::{self, Labelled};

/// A change an administrator asks for.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "change", rename_all = "kebab-case")]
pub enum Change {
    /// Put a new disk at `path` in the place of `member` (a name or an index) and rebuild.
    Replace {
        layer: String,
        member: String,
        path: PathBuf,
        name: Option<String>,
    },
    /// Add a new disk at `path` as a member of `layer` (a mirror leg, a concat's tail).
    AddMember {
        layer: String,
        path: PathBuf,
        name: Option<String>,
    },
    /// Stop using `member`, as if it had failed.
    FailMember { layer: String, member: String },
    /// Grow `layer` (a slice) to `size` bytes.
    Grow { layer: String, size: u64 },
    /// Append the thin pool's first `grow-from` spare to its concat child (the pool then
    /// takes in the new extents: Virtual Allocation's storage expansion).
    GrowPool { pool: String },
}

/// What reconfiguration needs from the server, behind one lock.
pub struct Reconfig {
    pub loaded: Loaded,
    pub runtime: Arc<dyn Runtime>,
    pub metrics: MetricsRegistry,
}

fn layer_index(loaded: &Loaded, layer: &str) -> anyhow::Result<usize> {
    loaded
        .layers
        .iter()
        .position(|l| l.name == layer)
        .with_context(|| format!("no layer named {layer:?}"))
}

fn member_index(children: &[String], member: &str) -> anyhow::Result<usize> {
    children
        .iter()
        .position(|c| c == member)
        .or_else(|| member.parse().ok().filter(|&i: &usize| i < children.len()))
        .with_context(|| {
            format!(
                "{member:?} is not a member (members: {})",
                children.join(", ")
            )
        })
}

fn new_disk_name(loaded: &Loaded, path: &Path, name: Option<String>) -> anyhow::Result<String> {
    let name = match name {
        Some(name) => name,
        None => path
            .file_stem()
            .and_then(|s| s.to_str())
            .context("cannot name the disk after its path; give --name")?
            .to_string(),
    };
    config::check_name(&name).map_err(anyhow::Error::msg)?;
    let taken = loaded
        .config
        .disks
        .iter()
        .any(|d| d.name.get_ref() == &name)
        || loaded.layers.iter().any(|l| l.name == name);
    if taken {
        bail!("a disk or layer named {name:?} exists; give another --name");
    }
    Ok(name)
}

/// The config text with `edit` applied to the table of `layer`.
fn edit_config(
    text: &str,
    layer: &str,
    edit: impl FnOnce(&mut Table) -> anyhow::Result<()>,
) -> anyhow::Result<DocumentMut> {
    let mut doc: DocumentMut = text
        .parse()
        .context("parsing the config file for editing")?;
    let layers = doc
        .get_mut("layer")
        .and_then(Item::as_array_of_tables_mut)
        .context("the config file has no [[layer]]")?;
    let table = layers
        .iter_mut()
        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some(layer))
        .with_context(|| format!("no [[layer]] named {layer:?} in the config file"))?;
    edit(table)?;
    Ok(doc)
}

fn add_disk(doc: &mut DocumentMut, name: &str, path: &Path, size: u64) {
    let mut disk = Table::new();
    disk.insert("name", value(name));
    disk.insert("path", value(path.display().to_string()));
    disk.insert("size", value(size as i64));
    if let Some(disks) = doc.get_mut("disk").and_then(Item::as_array_of_tables_mut) {
        disks.push(disk);
    } else {
        let mut disks = toml_edit::ArrayOfTables::new();
        disks.push(disk);
        doc.insert("disk", Item::ArrayOfTables(disks));
    }
}

/// Drops the `[[disk]]` of a member that left the hierarchy (its file stays where it is).
fn remove_disk(doc: &mut DocumentMut, name: &str) {
    if let Some(disks) = doc.get_mut("disk").and_then(Item::as_array_of_tables_mut) {
        disks.retain(|t| t.get("name").and_then(|n| n.as_str()) != Some(name));
    }
}

/// A spare's size: it exists before it is needed (a disk set aside), unlike the new disk of
/// a replace, which is created.
fn spare_size(path: &Path) -> anyhow::Result<u64> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("spare {} is not there", path.display()))?;
    let size = if meta.file_type().is_file() {
        meta.len()
    } else {
        use std::io::Seek;
        let mut device =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        device
            .seek(std::io::SeekFrom::End(0))
            .with_context(|| format!("sizing {}", path.display()))?
    };
    if size <= hierarchy::LABEL_BYTES {
        bail!("spare {} is too small ({size} bytes)", path.display());
    }
    Ok(size)
}

fn children_array(table: &mut Table) -> anyhow::Result<&mut Array> {
    table
        .get_mut("children")
        .and_then(Item::as_array_mut)
        .context("the layer's `children` is not an array")
}

impl Reconfig {
    fn source(&self) -> anyhow::Result<PathBuf> {
        self.loaded
            .source
            .clone()
            .context("this server has no config file to record changes in")
    }

    pub(crate) fn reload(&self, text: &str) -> anyhow::Result<Loaded> {
        let source = self.source()?;
        let mut loaded = config::load(
            text,
            &source.display().to_string(),
            source.parent().unwrap_or(Path::new(".")),
            Some(&self.loaded.data_dir),
        )?;
        loaded.source = Some(source);
        Ok(loaded)
    }

    /// Opens (creating, sparse) the disk a change brings, sized like the member it joins.
    fn open_disk(&self, name: &str, path: &Path, size: u64) -> anyhow::Result<DeviceRef> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let mut options = FileOptions::new(path.to_path_buf());
        options.size = Some(size);
        let file = FileDevice::open(options, self.runtime.clone())
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(Arc::new(Metered::new(
            file,
            self.metrics.device(name),
            self.runtime.clone(),
        )))
    }

    /// Size for a new member: the configured size of the layer's first disk member, else the
    /// size of its first present child plus the label.
    fn member_size(&self, layer: usize, nodes: &[Node]) -> anyhow::Result<u64> {
        let children = &self.loaded.layers[layer].children;
        for child in children {
            if let Some(disk) = self
                .loaded
                .config
                .disks
                .iter()
                .find(|d| d.name.get_ref() == child)
            {
                if let Some(size) = &disk.size {
                    return Ok(size.get_ref().0);
                }
            }
            if let Some(device) = nodes
                .iter()
                .find(|n| &n.name == child)
                .and_then(|n| n.device())
            {
                return Ok(device.geometry().size + hierarchy::LABEL_BYTES);
            }
        }
        bail!("cannot tell what size the new member should be")
    }

    /// Applies one change; returns the new nodes list and a summary for the operator.
    pub async fn apply(&mut self, change: Change, nodes: &mut Vec<Node>) -> anyhow::Result<String> {
        let text = std::fs::read_to_string(self.source()?)?;
        let (layer_name, doc, new_disk) = match &change {
            Change::Replace {
                layer,
                member,
                path,
                name,
            } => {
                let index = layer_index(&self.loaded, layer)?;
                let at = member_index(&self.loaded.layers[index].children, member)?;
                let name = new_disk_name(&self.loaded, path, name.clone())?;
                let size = self.member_size(index, nodes)?;
                let mut doc = edit_config(&text, layer, |t| {
                    children_array(t)?.replace(at, name.as_str());
                    Ok(())
                })?;
                add_disk(&mut doc, &name, path, size);
                let old = self.loaded.layers[index].children[at].clone();
                remove_disk(&mut doc, &old);
                (
                    layer.clone(),
                    doc,
                    Some((name, path.clone(), size, Some(at))),
                )
            }
            Change::AddMember { layer, path, name } => {
                let index = layer_index(&self.loaded, layer)?;
                let name = new_disk_name(&self.loaded, path, name.clone())?;
                let size = self.member_size(index, nodes)?;
                let mut doc = edit_config(&text, layer, |t| {
                    children_array(t)?.push(name.as_str());
                    Ok(())
                })?;
                add_disk(&mut doc, &name, path, size);
                (layer.clone(), doc, Some((name, path.clone(), size, None)))
            }
            Change::GrowPool { pool } => {
                let index = layer_index(&self.loaded, pool)?;
                let layer = &self.loaded.layers[index];
                let spare = layer.grow_from.first().with_context(|| {
                    format!("thin pool {pool} has no spare left in `grow-from`")
                })?;
                let concat = layer.children[0].clone();
                let path = self.loaded.resolve(Path::new(spare));
                let size = spare_size(&path)?;
                let name = new_disk_name(&self.loaded, &path, None)?;
                let mut doc = edit_config(&text, &concat, |t| {
                    children_array(t)?.push(name.as_str());
                    Ok(())
                })?;
                doc = edit_config(&doc.to_string(), pool, |t| {
                    let spares = t
                        .get_mut("grow-from")
                        .and_then(Item::as_array_mut)
                        .context("the pool's `grow-from` is not an array")?;
                    spares.remove(0);
                    spares.fmt();
                    Ok(())
                })?;
                // Recorded as written in `grow-from` (relative to the data folder, like every
                // disk path); opened resolved.
                add_disk(&mut doc, &name, Path::new(spare), size);
                (concat, doc, Some((name, path, size, None)))
            }
            Change::FailMember { layer, .. } => (layer.clone(), text.parse()?, None),
            Change::Grow { layer, size } => {
                let doc = edit_config(&text, layer, |t| {
                    t.insert("length", value(*size as i64));
                    Ok(())
                })?;
                (layer.clone(), doc, None)
            }
        };
        let new_text = doc.to_string();
        let loaded = self.reload(&new_text)?;
        let layer_device = nodes
            .iter()
            .find(|n| n.name == layer_name)
            .and_then(|n| n.device().cloned())
            .with_context(|| format!("layer {layer_name:?} is not a device this server built"))?;
        let control = match (&change, &new_disk) {
            (Change::Replace { .. }, Some((name, path, size, Some(at)))) => {
                let (disk, device) = self.labelled(name, path, *size).await?;
                nodes.push(Node {
                    name: name.clone(),
                    kind: NodeKind::Device(device.clone()),
                    label_disk: Some(disk),
                });
                Control::ReplaceMember {
                    index: *at,
                    member: Member {
                        name: name.clone(),
                        device,
                    },
                }
            }
            (
                Change::AddMember { .. } | Change::GrowPool { .. },
                Some((name, path, size, None)),
            ) => {
                let (disk, device) = self.labelled(name, path, *size).await?;
                nodes.push(Node {
                    name: name.clone(),
                    kind: NodeKind::Device(device.clone()),
                    label_disk: Some(disk),
                });
                Control::AddMember(Member {
                    name: name.clone(),
                    device,
                })
            }
            (Change::FailMember { member, .. }, _) => {
                let index = layer_index(&self.loaded, &layer_name)?;
                Control::FailMember {
                    index: member_index(&self.loaded.layers[index].children, member)?,
                }
            }
            (Change::Grow { size, .. }, _) => Control::Grow { size: *size },
            _ => unreachable!("every change was prepared above"),
        };
        match layer_device.control(control).await {
            Ok(ControlReply::Done) => {}
            Ok(other) => bail!("layer {layer_name} answered {other:?}"),
            Err(e) => {
                if let Some((name, ..)) = &new_disk {
                    nodes.retain(|n| &n.name != name);
                }
                return Err(e).with_context(|| format!("layer {layer_name}"));
            }
        }
        if let Change::Replace { member, .. } = &change {
            let old = member.clone();
            nodes.retain(|n| n.name != old);
        }
        self.record(&new_text, loaded, nodes).await
    }

    /// Opens a new member, refusing one that holds data (before the layer is told anything).
    async fn labelled(
        &self,
        name: &str,
        path: &Path,
        size: u64,
    ) -> anyhow::Result<(DeviceRef, DeviceRef)> {
        let disk = self.open_disk(name, path, size)?;
        if let Some(label) = hierarchy::read_label(disk.as_ref()).await? {
            bail!(
                "{} already belongs to hierarchy {} (as member {}): clear its first 64 KiB to reuse it",
                path.display(),
                label.uuid,
                label.member
            );
        }
        hierarchy::refuse_to_overwrite(name, disk.as_ref()).await?;
        let view: DeviceRef = Arc::new(Labelled::new(name, disk.clone())?);
        Ok((disk, view))
    }

    /// Writes the config file (atomically) and relabels the hierarchy's disks.
    pub(crate) async fn record(
        &mut self,
        text: &str,
        loaded: Loaded,
        nodes: &[Node],
    ) -> anyhow::Result<String> {
        let source = self.source()?;
        let temporary = source.with_extension("toml.new");
        std::fs::write(&temporary, text)
            .with_context(|| format!("writing {}", temporary.display()))?;
        std::fs::rename(&temporary, &source)
            .with_context(|| format!("replacing {}", source.display()))?;
        let disks: Vec<(String, DeviceRef)> = hierarchy::labelled_disks(&loaded)
            .into_iter()
            .filter_map(|name| {
                let disk = nodes.iter().find(|n| n.name == name)?.label_disk.clone()?;
                Some((name, disk))
            })
            .collect();
        let generation = hierarchy::reconcile(&loaded, &disks).await?;
        self.loaded = loaded;
        Ok(format!(
            "done; {} updated, hierarchy generation {generation}",
            source.display()
        ))
    }
}
