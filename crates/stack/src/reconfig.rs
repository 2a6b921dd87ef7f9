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
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use strata_backend::{FileDevice, FileOptions};
use strata_core::{Control, ControlReply, DeviceRef, Member, Metered, MetricsRegistry, Runtime};
use toml_edit::{value, Array, DocumentMut, Item, Table};

use crate::build::{Node, NodeKind};
use crate::config::{self, Loaded};
use crate::hierarchy::{self, Labelled};
use crate::plan::{Plan, Quiesced, Step};
use crate::registry;

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
    /// Add new disks at `paths` to `layer` at once and spread the data over them all (a
    /// raid5 grow); `options` are the layer's (raid5: `policy`, `on-failure`).
    GrowMembers {
        layer: String,
        paths: Vec<PathBuf>,
        #[serde(default)]
        options: toml::Table,
    },
    /// Stop using `member`, as if it had failed.
    FailMember { layer: String, member: String },
    /// Grow `layer` (a slice) to `size` bytes.
    Grow { layer: String, size: u64 },
    /// Append the thin pool's first `grow-from` spare to its concat child (the pool then
    /// takes in the new extents: Virtual Allocation's storage expansion).
    GrowPool { pool: String },
}

impl Change {
    /// The verb, as kinds declare it in their registry entries.
    pub fn verb(&self) -> &'static str {
        match self {
            Change::Replace { .. } => "replace",
            Change::AddMember { .. } => "add-member",
            Change::GrowMembers { .. } => "grow-members",
            Change::FailMember { .. } => "fail-member",
            Change::Grow { .. } => "grow",
            Change::GrowPool { .. } => "grow-pool",
        }
    }

    /// The layer the change is sent to.
    pub fn layer(&self) -> &str {
        match self {
            Change::Replace { layer, .. }
            | Change::AddMember { layer, .. }
            | Change::GrowMembers { layer, .. }
            | Change::FailMember { layer, .. }
            | Change::Grow { layer, .. } => layer,
            Change::GrowPool { pool } => pool,
        }
    }

    fn sent_to(mut self, target: String) -> Change {
        match &mut self {
            Change::Replace { layer, .. }
            | Change::AddMember { layer, .. }
            | Change::GrowMembers { layer, .. }
            | Change::FailMember { layer, .. }
            | Change::Grow { layer, .. } => *layer = target,
            Change::GrowPool { pool } => *pool = target,
        }
        self
    }
}

/// The layer that handles `change`: the one it names if that layer's kind declares the verb,
/// else the first layer below it (children in order, depth first) whose kind does, so that a
/// filter over a mirror passes `fail-member` down. Refused, naming the layer's verbs, when
/// no layer on the way handles it.
pub fn route(loaded: &Loaded, change: Change) -> anyhow::Result<Change> {
    let target = route_verb(loaded, change.layer(), change.verb())?;
    Ok(change.sent_to(target))
}

/// The layer that handles `verb` sent to `layer` (see [`route`]), or a refusal naming the
/// layer's verbs.
pub(crate) fn route_verb(loaded: &Loaded, layer: &str, verb: &str) -> anyhow::Result<String> {
    let named = &loaded.layers[layer_index(loaded, layer)?];
    match handler(loaded, &named.name, verb) {
        Some(target) => Ok(target),
        None => {
            let known: Vec<&str> = registry::find(&named.kind)
                .map(|kind| kind.verbs.iter().map(|v| v.name).collect())
                .unwrap_or_default();
            bail!(
                "layer {} ({}) has no verb {verb:?}, nor any layer below it (its verbs: {})",
                named.name,
                named.kind,
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )
        }
    }
}

/// The layer that handles `verb` when it is sent to `layer`: `layer` itself if its kind
/// declares the verb, else the first layer below it (children in order, depth first) whose
/// kind does.
fn handler(loaded: &Loaded, layer: &str, verb: &str) -> Option<String> {
    let config = loaded.layers.iter().find(|l| l.name == layer)?;
    if registry::find(&config.kind).is_some_and(|kind| kind.verb(verb).is_some()) {
        return Some(config.name.clone());
    }
    config
        .children
        .iter()
        .find_map(|child| handler(loaded, child, verb))
}

/// A change refused before anything was touched, because it is not safe now.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Whether `device` is `ancestor` or lies under it (in the configuration's graph).
fn lies_under(loaded: &Loaded, device: &str, ancestor: &str) -> bool {
    device == ancestor
        || loaded
            .layers
            .iter()
            .find(|l| l.name == ancestor)
            .is_some_and(|l| l.children.iter().any(|c| lies_under(loaded, device, c)))
}

/// What a device or anything under it is growing by, if a grow is under way (a raid5's
/// reshape reports its activity as "growing …").
fn growing(status: &strata_core::NodeStatus) -> Option<String> {
    let own = status.activity.as_ref().map(|a| &a.what);
    own.filter(|what| what.starts_with("growing"))
        .map(|what| format!("{}: {what}", status.name))
        .or_else(|| status.children.iter().find_map(growing))
}

/// What reconfiguration needs from the server, behind one lock.
pub struct Reconfig {
    pub loaded: Loaded,
    pub runtime: Arc<dyn Runtime>,
    pub metrics: MetricsRegistry,
    /// Where the config text lives and where a change's new disks come from.
    pub site: Arc<dyn Site>,
}

/// Where a server keeps its config text and finds the disks a change brings: files for
/// `strata serve` ([`Files`]); memory and simulated disks for the simulator's explorer,
/// which so runs the same change path (validation, labels, the layer's order, relabelling).
pub trait Site: Send + Sync {
    /// The config file's text.
    fn read_config(&self, source: &Path) -> anyhow::Result<String>;
    /// Replaces the config file's text, atomically.
    fn write_config(&self, source: &Path, text: &str) -> anyhow::Result<()>;
    /// Opens (creating, sparse, `size` bytes) the disk at `path`, named `name`.
    fn open_disk(
        &self,
        name: &str,
        path: &Path,
        size: u64,
        direct: bool,
        runtime: &Arc<dyn Runtime>,
        metrics: &MetricsRegistry,
    ) -> anyhow::Result<DeviceRef>;
}

/// The config file and disks as files (or block devices), as `strata serve` has them.
pub struct Files;

impl Site for Files {
    fn read_config(&self, source: &Path) -> anyhow::Result<String> {
        std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))
    }

    fn write_config(&self, source: &Path, text: &str) -> anyhow::Result<()> {
        let temporary = source.with_extension("toml.new");
        std::fs::write(&temporary, text)
            .with_context(|| format!("writing {}", temporary.display()))?;
        std::fs::rename(&temporary, source)
            .with_context(|| format!("replacing {}", source.display()))
    }

    fn open_disk(
        &self,
        name: &str,
        path: &Path,
        size: u64,
        direct: bool,
        runtime: &Arc<dyn Runtime>,
        metrics: &MetricsRegistry,
    ) -> anyhow::Result<DeviceRef> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let mut options = FileOptions::new(path.to_path_buf());
        options.size = Some(size);
        options.direct = direct;
        let file = FileDevice::open(options, runtime.clone())
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(Arc::new(Metered::new(
            file,
            metrics.device(name),
            runtime.clone(),
        )))
    }
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

/// A disk a change adds bypasses the page cache (`direct = true`) when every disk of the
/// hierarchy does: an administrator who chose O_DIRECT for the members wants the new one the
/// same (and a buffered member would be flushed whole at every metadata commit).
fn direct_for_new_disks(config: &config::Config) -> bool {
    !config.disks.is_empty() && config.disks.iter().all(|d| d.direct)
}

/// A new `[[disk]]` (`direct` from [`direct_for_new_disks`]).
fn add_disk(doc: &mut DocumentMut, name: &str, path: &Path, size: u64, direct: bool) {
    let mut disk = Table::new();
    disk.insert("name", value(name));
    disk.insert("path", value(path.display().to_string()));
    disk.insert("size", value(size as i64));
    if direct {
        disk.insert("direct", value(true));
    }
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

/// Appends `names` to a layer's children; a raid5's journal device stays the last child, so
/// they go before it.
fn add_members(table: &mut Table, names: &[String]) -> anyhow::Result<()> {
    let journal = table.get("journal-device").and_then(|j| j.as_str());
    let journal = journal.map(str::to_string);
    let children = children_array(table)?;
    let last = children.iter().last().and_then(|c| c.as_str());
    let at = match journal {
        Some(journal) if last == Some(journal.as_str()) => children.len() - 1,
        _ => children.len(),
    };
    for (i, name) in names.iter().enumerate() {
        children.insert(at + i, name.as_str());
    }
    Ok(())
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

    pub fn reload(&self, text: &str) -> anyhow::Result<Loaded> {
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

    /// The config file's text now.
    pub fn read_config(&self) -> anyhow::Result<String> {
        self.site.read_config(&self.source()?)
    }

    /// Opens (creating, sparse) the disk a change brings, sized like the member it joins.
    fn open_disk(&self, name: &str, path: &Path, size: u64) -> anyhow::Result<DeviceRef> {
        let direct = direct_for_new_disks(&self.loaded.config);
        (self.site).open_disk(name, path, size, direct, &self.runtime, &self.metrics)
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

    /// Applies one change (updating `nodes`); returns a summary for the operator.
    pub async fn apply(&mut self, change: Change, nodes: &mut Vec<Node>) -> anyhow::Result<String> {
        let change = route(&self.loaded, change)?;
        self.refuse_shifts(&change, nodes).await?;
        let plan = self.plan(&change, nodes)?;
        let mut state = Applying {
            reconfig: self,
            nodes: std::mem::take(nodes),
            attached: Vec::new(),
            summary: String::new(),
        };
        let result = plan.apply(&mut state).await;
        *nodes = state.nodes;
        result.map(|()| state.summary)
    }

    /// Only a concat's last child may change size: a concat lays its children end to end by
    /// the sizes they have at each start, so a middle child that grew would move every child
    /// after it (their data would read at other offsets). Refuses a change that grows a
    /// device under a middle child of a concat, and a new member of a concat whose last
    /// child is still growing (a raid5 grow exports its new size only at its end).
    async fn refuse_shifts(&self, change: &Change, nodes: &[Node]) -> anyhow::Result<()> {
        let loaded = &self.loaded;
        let layer = &loaded.layers[layer_index(loaded, change.layer())?];
        let grown = match change {
            Change::AddMember { .. } if layer.kind == "concat" => Some(layer.name.as_str()),
            Change::GrowMembers { .. } | Change::Grow { .. } => Some(layer.name.as_str()),
            Change::GrowPool { .. } => layer.children.first().map(String::as_str),
            _ => None,
        };
        let Some(grown) = grown else { return Ok(()) };
        for concat in loaded.layers.iter().filter(|l| l.kind == "concat") {
            let middle = &concat.children[..concat.children.len().saturating_sub(1)];
            if let Some(child) = middle.iter().find(|c| lies_under(loaded, grown, c)) {
                return Err(Refused(format!(
                    "growing {grown} would move the data of concat {}'s children after {child} \
                     (only a concat's last child may grow)",
                    concat.name
                ))
                .into());
            }
        }
        if layer.kind != "concat" || !matches!(change, Change::AddMember { .. }) {
            return Ok(());
        }
        let Some(last) = layer.children.last() else {
            return Ok(());
        };
        let Some(node) = nodes.iter().find(|n| &n.name == last) else {
            return Ok(());
        };
        // A child that cannot describe itself (its disk died) is not growing.
        let status = node.describe().await.ok();
        if let Some(what) = status.as_ref().and_then(growing) {
            return Err(Refused(format!(
                "concat {}'s last child {last} is still growing ({what}): add the member once \
                 that ends, or the new member would move when it does",
                layer.name
            ))
            .into());
        }
        Ok(())
    }

    /// The steps of a change, prepared and validated (the edited config loads) before
    /// anything is touched: attach the new disk, tell the layer (the point of no return),
    /// drop the member it replaced, record the config and relabel.
    fn plan<'a>(&self, change: &Change, nodes: &[Node]) -> anyhow::Result<Plan<Applying<'a>>> {
        let text = self.read_config()?;
        let direct = direct_for_new_disks(&self.loaded.config);
        let (layer_name, doc, new_disks) = match change {
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
                add_disk(&mut doc, &name, path, size, direct);
                let old = self.loaded.layers[index].children[at].clone();
                remove_disk(&mut doc, &old);
                (layer.clone(), doc, vec![(name, path.clone(), size)])
            }
            Change::AddMember { layer, path, name } => {
                let index = layer_index(&self.loaded, layer)?;
                let name = new_disk_name(&self.loaded, path, name.clone())?;
                let size = self.member_size(index, nodes)?;
                let mut doc = edit_config(&text, layer, |t| {
                    children_array(t)?.push(name.as_str());
                    Ok(())
                })?;
                add_disk(&mut doc, &name, path, size, direct);
                (layer.clone(), doc, vec![(name, path.clone(), size)])
            }
            Change::GrowMembers { layer, paths, .. } => {
                let index = layer_index(&self.loaded, layer)?;
                let size = self.member_size(index, nodes)?;
                if paths.is_empty() {
                    bail!("grow needs at least one new disk");
                }
                let mut names: Vec<String> = Vec::new();
                for path in paths {
                    let name = new_disk_name(&self.loaded, path, None)?;
                    if names.contains(&name) {
                        bail!(
                            "two new disks would both be named {name:?}: give files distinct names"
                        );
                    }
                    names.push(name);
                }
                let mut doc = edit_config(&text, layer, |t| add_members(t, &names))?;
                for (name, path) in names.iter().zip(paths) {
                    add_disk(&mut doc, name, path, size, direct);
                }
                let disks = names
                    .into_iter()
                    .zip(paths)
                    .map(|(name, path)| (name, path.clone(), size))
                    .collect();
                (layer.clone(), doc, disks)
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
                add_disk(&mut doc, &name, Path::new(spare), size, direct);
                (concat, doc, vec![(name, path, size)])
            }
            Change::FailMember { layer, .. } => (layer.clone(), text.parse()?, Vec::new()),
            Change::Grow { layer, size } => {
                let doc = edit_config(&text, layer, |t| {
                    t.insert("length", value(*size as i64));
                    Ok(())
                })?;
                (layer.clone(), doc, Vec::new())
            }
        };
        let new_text = doc.to_string();
        let loaded = self.reload(&new_text)?;
        let device = nodes
            .iter()
            .find(|n| n.name == layer_name)
            .and_then(|n| n.device().cloned())
            .with_context(|| format!("layer {layer_name:?} is not a device this server built"))?;
        let index = layer_index(&self.loaded, &layer_name)?;
        let children = &self.loaded.layers[index].children;
        let (order, replaced) = match change {
            Change::Replace { member, .. } => {
                let at = member_index(children, member)?;
                (Order::ReplaceMember(at), Some(children[at].clone()))
            }
            Change::AddMember { .. } | Change::GrowPool { .. } => (Order::AddMember, None),
            Change::GrowMembers { options, .. } => (Order::GrowMembers(options.clone()), None),
            Change::FailMember { member, .. } => {
                (Order::FailMember(member_index(children, member)?), None)
            }
            Change::Grow { size, .. } => (Order::Grow(*size), None),
        };
        let mut plan = Plan::new();
        for (name, path, size) in new_disks {
            plan = plan.then(AttachDisk { name, path, size });
        }
        Ok(plan
            .then(Quiesced::new(
                device.clone(),
                TellLayer {
                    layer: layer_name,
                    device,
                    order,
                },
            ))
            .then_some(replaced.map(DetachNode::new))
            .then(RecordConfig::new(text, new_text, loaded)))
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
    pub async fn record(
        &mut self,
        text: &str,
        loaded: Loaded,
        nodes: &[Node],
    ) -> anyhow::Result<String> {
        let source = self.source()?;
        self.site.write_config(&source, text)?;
        let generation = crate::build::write_labels(&loaded, nodes).await?;
        self.loaded = loaded;
        Ok(format!(
            "done; {} updated, hierarchy generation {generation}",
            source.display()
        ))
    }
}

/// What the steps of a change work on: the reconfiguration state (behind its lock), the
/// server's nodes, the disk a step attached, and the summary for the operator.
pub struct Applying<'a> {
    pub reconfig: &'a mut Reconfig,
    pub nodes: Vec<Node>,
    /// In the order attached.
    attached: Vec<DeviceRef>,
    pub summary: String,
}

impl<'a> Applying<'a> {
    pub fn new(reconfig: &'a mut Reconfig, nodes: Vec<Node>) -> Self {
        Applying {
            reconfig,
            nodes,
            attached: Vec::new(),
            summary: String::new(),
        }
    }
}

/// Opens the new disk of a change (refusing one that holds data) and labels it in.
struct AttachDisk {
    name: String,
    path: PathBuf,
    size: u64,
}

#[async_trait]
impl<'a> Step<Applying<'a>> for AttachDisk {
    fn describe(&self) -> String {
        format!("attaching disk {} ({})", self.name, self.path.display())
    }

    async fn apply(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        let (disk, device) = state
            .reconfig
            .labelled(&self.name, &self.path, self.size)
            .await?;
        state.nodes.push(Node {
            name: self.name.clone(),
            kind: NodeKind::Device(device.clone()),
            label_disk: Some(disk),
        });
        state.attached.push(device);
        Ok(())
    }

    async fn undo(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        state.nodes.retain(|n| n.name != self.name);
        state.attached.pop();
        Ok(())
    }
}

/// What a layer is told; the member, where there is one, is the disk attached before.
enum Order {
    ReplaceMember(usize),
    AddMember,
    GrowMembers(toml::Table),
    FailMember(usize),
    Grow(u64),
}

/// Tells the layer (`Control`). A layer that keeps state records its new shape durably, so
/// this is the point of no return.
struct TellLayer {
    layer: String,
    device: DeviceRef,
    order: Order,
}

#[async_trait]
impl<'a> Step<Applying<'a>> for TellLayer {
    fn describe(&self) -> String {
        format!("layer {}", self.layer)
    }

    async fn apply(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        let named = |device: &DeviceRef| -> Member {
            let name = state
                .nodes
                .iter()
                .find(|n| n.device().is_some_and(|d| Arc::ptr_eq(d, device)))
                .map(|n| n.name.clone())
                .unwrap_or_default();
            Member {
                name,
                device: device.clone(),
            }
        };
        let member = || -> anyhow::Result<Member> {
            let device = state
                .attached
                .last()
                .context("no disk was attached for the layer")?;
            Ok(named(device))
        };
        let control = match &self.order {
            Order::ReplaceMember(index) => Control::ReplaceMember {
                index: *index,
                member: member()?,
            },
            Order::AddMember => Control::AddMember(member()?),
            Order::GrowMembers(options) => Control::GrowMembers {
                members: state.attached.iter().map(named).collect(),
                options: options.clone(),
            },
            Order::FailMember(index) => Control::FailMember { index: *index },
            Order::Grow(size) => Control::Grow { size: *size },
        };
        match self.device.control(control).await? {
            ControlReply::Done => Ok(()),
            other => bail!("answered {other:?}"),
        }
    }

    fn reversible(&self) -> bool {
        false
    }
}

/// Drops a node the server no longer uses (the member a replace took out).
pub struct DetachNode {
    name: String,
    detached: Option<Node>,
}

impl DetachNode {
    pub fn new(name: String) -> Self {
        DetachNode {
            name,
            detached: None,
        }
    }
}

#[async_trait]
impl<'a> Step<Applying<'a>> for DetachNode {
    fn describe(&self) -> String {
        format!("detaching {}", self.name)
    }

    async fn apply(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        if let Some(at) = state.nodes.iter().position(|n| n.name == self.name) {
            self.detached = Some(state.nodes.remove(at));
        }
        Ok(())
    }

    async fn undo(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        state.nodes.extend(self.detached.take());
        Ok(())
    }
}

/// Writes the edited config file (atomically) and relabels the hierarchy's disks; undone by
/// recording the text it replaced (a label generation later).
pub struct RecordConfig {
    old_text: String,
    old_loaded: Option<Loaded>,
    text: String,
    loaded: Option<Loaded>,
}

impl RecordConfig {
    /// `old_text` is the file as it is now; `loaded` is `text` loaded (validated).
    pub fn new(old_text: String, text: String, loaded: Loaded) -> Self {
        RecordConfig {
            old_text,
            old_loaded: None,
            text,
            loaded: Some(loaded),
        }
    }
}

#[async_trait]
impl<'a> Step<Applying<'a>> for RecordConfig {
    fn describe(&self) -> String {
        "recording the config".to_string()
    }

    async fn apply(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        let loaded = self.loaded.take().context("recorded twice")?;
        let previous = state.reconfig.loaded.clone();
        state.summary = state
            .reconfig
            .record(&self.text, loaded, &state.nodes)
            .await?;
        self.old_loaded = Some(previous);
        Ok(())
    }

    async fn undo(&mut self, state: &mut Applying<'a>) -> anyhow::Result<()> {
        let old = self.old_loaded.take().context("nothing recorded")?;
        state
            .reconfig
            .record(&self.old_text, old, &state.nodes)
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delay filter over a mirror over two disks; a thin pool over a concat.
    const STACK: &str = "listen = [\"unix:s\"]\n\
        [[disk]]\nname = \"a\"\npath = \"a.img\"\n\
        [[disk]]\nname = \"b\"\npath = \"b.img\"\n\
        [[disk]]\nname = \"c\"\npath = \"c.img\"\n\
        [[layer]]\nname = \"m\"\nkind = \"mirror\"\nchildren = [\"a\", \"b\"]\n\
        [[layer]]\nname = \"slow\"\nkind = \"delay\"\nchildren = [\"m\"]\n\
        [[layer]]\nname = \"all\"\nkind = \"concat\"\nchildren = [\"c\"]\n\
        [[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"all\"]\n\
        volumes = [{ name = \"v\", size = \"1GiB\" }]\n\
        [[export]]\nname = \"e\"\ndevice = \"slow\"\n\
        [[export]]\nname = \"f\"\ndevice = \"pool/v\"\n";

    fn loaded() -> Loaded {
        config::load(STACK, "test.toml", Path::new("/nonexistent-base"), None).unwrap()
    }

    #[test]
    fn a_new_disk_bypasses_the_page_cache_when_every_disk_does() {
        let direct = |disks: &[&str]| {
            let mut text = STACK.to_string();
            for disk in disks {
                let path = format!("path = \"{disk}.img\"\n");
                text = text.replace(&path, &format!("{path}direct = true\n"));
            }
            let loaded = config::load(&text, "test.toml", Path::new("/nonexistent-base"), None);
            direct_for_new_disks(&loaded.unwrap().config)
        };
        assert!(direct(&["a", "b", "c"]));
        assert!(
            !direct(&["a", "b"]),
            "one buffered disk: the new one is too"
        );
        assert!(!direct(&[]));
        // The flag reaches the new `[[disk]]`, and only when asked.
        let added = |direct: bool| {
            let mut doc: DocumentMut = STACK.parse().unwrap();
            add_disk(&mut doc, "n", Path::new("n.img"), 1 << 20, direct);
            let disks = doc["disk"].as_array_of_tables().unwrap();
            let added = disks.iter().last().unwrap();
            assert_eq!(added["name"].as_str(), Some("n"));
            added.get("direct").and_then(|d| d.as_bool())
        };
        assert_eq!(added(true), Some(true));
        assert_eq!(added(false), None);
    }

    #[test]
    fn a_grow_puts_new_members_before_a_raid5_journal_device() {
        let grown = |layer: &str| -> Vec<String> {
            let mut doc: DocumentMut = layer.parse().unwrap();
            let table = doc.as_table_mut();
            add_members(table, &["n1".into(), "n2".into()]).unwrap();
            let children = table["children"].as_array().unwrap();
            children
                .iter()
                .map(|c| c.as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            grown("children = [\"a\", \"b\", \"c\", \"nv\"]\njournal-device = \"nv\"\n"),
            ["a", "b", "c", "n1", "n2", "nv"]
        );
        assert_eq!(
            grown("children = [\"a\", \"b\", \"c\"]\n"),
            ["a", "b", "c", "n1", "n2"]
        );
    }

    #[test]
    fn a_verb_sent_to_a_filter_reaches_the_mirror_below_it() {
        let change = Change::FailMember {
            layer: "slow".into(),
            member: "b".into(),
        };
        let routed = route(&loaded(), change).unwrap();
        assert_eq!(routed.layer(), "m");
        assert!(matches!(routed, Change::FailMember { member, .. } if member == "b"));
        // A layer that declares the verb keeps it.
        let direct = Change::FailMember {
            layer: "m".into(),
            member: "a".into(),
        };
        assert_eq!(route(&loaded(), direct).unwrap().layer(), "m");
        // A pool does not add members; its concat does.
        let add = Change::AddMember {
            layer: "pool".into(),
            path: "d.img".into(),
            name: None,
        };
        assert_eq!(route(&loaded(), add).unwrap().layer(), "all");
    }

    #[test]
    fn a_verb_no_layer_on_the_way_handles_is_refused_with_the_known_verbs() {
        let grow = Change::Grow {
            layer: "m".into(),
            size: 1 << 30,
        };
        let error = route(&loaded(), grow).unwrap_err().to_string();
        assert!(error.contains("has no verb \"grow\""), "{error}");
        assert!(
            error.contains("its verbs: replace, add-member, fail-member"),
            "{error}"
        );
        let grow_pool = Change::GrowPool {
            pool: "slow".into(),
        };
        let error = route(&loaded(), grow_pool).unwrap_err().to_string();
        assert!(
            error.contains("layer slow (delay)") && error.contains("its verbs: none"),
            "{error}"
        );
    }
}
