//! The hierarchy written on its own disks (Violin's idea): every disk under a layer carries a
//! label with the hierarchy's uuid, a generation, its own name and the whole graph, so that
//! `strata serve --assemble DISK…` rebuilds the stack from the disks alone.
//!
//! Label (format version 1): the first 64 KiB of the disk, two copies of up to 32 KiB at
//! offsets 0 and 32 KiB. Each copy is `"STRATAHL"`, version u32, crc32c u32 (of the JSON),
//! length u32, then the JSON `{uuid, generation, member, hierarchy}` where `hierarchy` is the
//! graph as TOML (disks without paths, layers, exports), serialised from the running stack:
//! each layer's options are its `describe()` config ([`Running`]). Copies are written one after the
//! other with FUA, so a torn write leaves the other; the newer valid copy wins. Layers see the
//! disk from 64 KiB on.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_core::{BlockDevice, WriteFlags};

use crate::config::Loaded;
use crate::graph::LayerConfig;

/// Bytes at the start of a labelled disk that hold its label.
pub const LABEL_BYTES: u64 = 64 << 10;
const COPY_BYTES: u64 = LABEL_BYTES / 2;
const MAGIC: &[u8; 8] = b"STRATAHL";
const VERSION: u32 = 1;
const HEADER: usize = 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    pub uuid: String,
    pub generation: u64,
    /// This disk's name in the graph.
    pub member: String,
    /// The graph as TOML: `[[disk]]` (no paths), `[[layer]]`, `[[export]]`.
    pub hierarchy: String,
}

fn encode(label: &Label) -> anyhow::Result<Vec<u8>> {
    let json = serde_json::to_vec(label)?;
    anyhow::ensure!(
        json.len() + HEADER <= COPY_BYTES as usize,
        "the hierarchy is too large for a disk label ({} bytes)",
        json.len()
    );
    let mut out = Vec::with_capacity(COPY_BYTES as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&json).to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.resize(COPY_BYTES as usize, 0);
    Ok(out)
}

fn decode(copy: &[u8]) -> Option<Label> {
    if &copy[..8] != MAGIC {
        return None;
    }
    let u32_at = |at: usize| u32::from_le_bytes(copy[at..at + 4].try_into().expect("4 bytes"));
    let (version, crc, len) = (u32_at(8), u32_at(12), u32_at(16) as usize);
    if version != VERSION || HEADER + len > copy.len() {
        return None;
    }
    let json = &copy[HEADER..HEADER + len];
    if crc32c::crc32c(json) != crc {
        return None;
    }
    serde_json::from_slice(json).ok()
}

/// What the two label copies at the start of a disk hold.
#[derive(Debug, PartialEq, Eq)]
pub struct LabelCopies {
    /// The newer valid copy.
    pub label: Option<Label>,
    /// Both copies are valid and the same. False with a label: one copy is damaged, or
    /// behind (a relabel cut between its two writes); a rewrite restores both.
    pub intact: bool,
}

/// Reads the label copies out of a disk's first [`LABEL_BYTES`].
pub fn label_copies(head: &[u8]) -> LabelCopies {
    let a = decode(&head[..COPY_BYTES as usize]);
    let b = decode(&head[COPY_BYTES as usize..LABEL_BYTES as usize]);
    let intact = a.is_some() && a == b;
    let label = [a, b]
        .into_iter()
        .flatten()
        .max_by_key(|label| label.generation);
    LabelCopies { label, intact }
}

/// Both label copies of `device` (none on a device smaller than a label).
pub async fn read_label_copies(device: &dyn BlockDevice) -> anyhow::Result<LabelCopies> {
    if device.geometry().size < LABEL_BYTES {
        return Ok(LabelCopies {
            label: None,
            intact: false,
        });
    }
    let data = device.read(0, LABEL_BYTES as usize).await?;
    Ok(label_copies(&data))
}

/// The newer valid label copy on `device`, if any.
pub async fn read_label(device: &dyn BlockDevice) -> anyhow::Result<Option<Label>> {
    Ok(read_label_copies(device).await?.label)
}

/// Reads a label straight from a file or block device, before any server opens it.
pub fn read_label_file(path: &std::path::Path) -> anyhow::Result<Option<Label>> {
    use std::io::Read;
    let mut data = vec![0u8; LABEL_BYTES as usize];
    let mut file =
        std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut filled = 0;
    while filled < data.len() {
        match file.read(&mut data[filled..])? {
            0 => return Ok(None),
            n => filled += n,
        }
    }
    Ok(label_copies(&data).label)
}

/// Writes both copies, one after the other, each durable before the next.
pub async fn write_label(device: &dyn BlockDevice, label: &Label) -> anyhow::Result<()> {
    let copy = Bytes::from(encode(label)?);
    for at in [0, COPY_BYTES] {
        device
            .write(at, copy.clone(), WriteFlags { fua: true })
            .await?;
    }
    Ok(())
}

pub fn uuid_text(uuid: [u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Each layer's options as it runs, by layer name: its `describe()`'s `config` (the kind's
/// typed config, defaults explicit). The label writer takes a layer's options from here; a
/// layer not in it (refused at this start) is recorded with its options as configured.
pub type Running = BTreeMap<String, toml::Table>;

/// A `[[disk]]` of the label's graph: no path (the disk is wherever it is found).
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct LabelDisk<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    direct: bool,
    inline_io: bool,
}

#[derive(Serialize)]
struct LabelVolume<'a> {
    name: &'a str,
    size: u64,
}

/// A `[[layer]]` of the label's graph: the options follow `children`, as a config writes them.
#[derive(Serialize)]
struct LabelLayer<'a> {
    name: &'a str,
    kind: &'a str,
    children: &'a [String],
    #[serde(flatten)]
    options: toml::Table,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    volumes: Vec<LabelVolume<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct LabelExport<'a> {
    name: &'a str,
    device: &'a str,
    read_only: bool,
    description: &'a str,
}

/// The graph a label carries, in the order of a config file.
#[derive(Serialize)]
struct LabelGraph<'a> {
    disk: Vec<LabelDisk<'a>>,
    layer: Vec<LabelLayer<'a>>,
    export: Vec<LabelExport<'a>>,
}

/// A layer's options as the label records them. A file an option names (`key-file`: any
/// `…-file`) is recorded as the absolute path it resolved to here: a relative path resolves
/// against the data folder, which differs when the stack is assembled elsewhere, and must
/// still name the same file.
fn label_options(mut options: toml::Table, data_dir: &Path) -> toml::Table {
    for (key, value) in options.iter_mut() {
        if let toml::Value::String(path) = value {
            if key.ends_with("-file") && Path::new(path.as_str()).is_relative() {
                let resolved = data_dir.join(path.as_str());
                let absolute = std::path::absolute(&resolved).unwrap_or(resolved);
                *path = absolute.display().to_string();
            }
        }
    }
    options
}

fn label_layer<'a>(layer: &'a LayerConfig, running: &Running, data_dir: &Path) -> LabelLayer<'a> {
    let options = running
        .get(&layer.name)
        .cloned()
        .unwrap_or_else(|| crate::graph::options_table(&layer.options));
    LabelLayer {
        name: &layer.name,
        kind: &layer.kind,
        children: &layer.children,
        options: label_options(options, data_dir),
        volumes: layer
            .volumes
            .iter()
            .map(|v| LabelVolume {
                name: &v.name,
                size: v.size,
            })
            .collect(),
    }
}

/// The graph of `loaded` as TOML, without paths or listeners: what a label carries. Each
/// layer's options are the running layer's (`running`, from `describe()`).
pub fn render_hierarchy(loaded: &Loaded, running: &Running) -> anyhow::Result<String> {
    let graph = LabelGraph {
        disk: loaded
            .config
            .disks
            .iter()
            .map(|disk| LabelDisk {
                name: disk.name.get_ref(),
                size: disk.size.as_ref().map(|size| size.get_ref().0),
                direct: disk.direct,
                inline_io: disk.inline_io,
            })
            .collect(),
        layer: loaded
            .build_order
            .iter()
            .map(|&index| label_layer(&loaded.layers[index], running, &loaded.data_dir))
            .collect(),
        export: loaded
            .config
            .exports
            .iter()
            .map(|export| LabelExport {
                name: export.name.get_ref(),
                device: export.device.get_ref(),
                read_only: export.read_only,
                description: &export.description,
            })
            .collect(),
    };
    Ok(toml::to_string(&graph)?)
}

/// What a start found on the disks under layers, before any layer is built on them.
pub struct Survey {
    /// Disks that had no label and zeros where it goes before this start: blank, so their
    /// layers may format over them.
    pub fresh: HashSet<String>,
    /// Disks that may not be labelled (name, why): they hold somebody's data.
    pub refused: Vec<(String, String)>,
}

/// Reads the labels of the disks under layers at a start, before the layers are built (the
/// labels are written after, from the running layers: see [`reconcile`]). Disks that hold
/// data and no label are left out (refused, for their layer to do without) instead of
/// failing the whole start, and the blank ones are reported; disks of different hierarchies
/// fail the start before any layer touches them.
pub async fn survey_at_start(disks: &[(String, strata_core::DeviceRef)]) -> anyhow::Result<Survey> {
    let mut fresh = HashSet::new();
    let mut refused = Vec::new();
    let mut labels = Vec::new();
    for (name, device) in disks {
        let label = read_label(device.as_ref()).await?;
        if label.is_none() {
            if let Err(e) = refuse_to_overwrite(name, device.as_ref()).await {
                refused.push((name.clone(), format!("{e:#}")));
                continue;
            }
            fresh.insert(name.clone());
        }
        labels.push((name, label));
    }
    one_hierarchy(&labels)?;
    Ok(Survey { fresh, refused })
}

/// The uuid the labelled disks share, refusing disks of different hierarchies.
fn one_hierarchy(labels: &[(&String, Option<Label>)]) -> anyhow::Result<Option<String>> {
    let mut uuid: Option<(&str, &str)> = None;
    for (name, label) in labels {
        let Some(label) = label else { continue };
        match uuid {
            Some((other, id)) if id != label.uuid => anyhow::bail!(
                "disks {other} and {name} belong to different hierarchies ({id} and {}): refusing to mix them",
                label.uuid
            ),
            _ => uuid = Some((name.as_str(), label.uuid.as_str())),
        }
    }
    Ok(uuid.map(|(_, id)| id.to_string()))
}

/// Whether `error` is the medium failing (the disk died or was pulled), not damage or a
/// refusal.
fn medium_failed(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<strata_core::BlockError>(),
        Some(strata_core::BlockError::Io { .. })
    )
}

/// Makes the labels on `disks` (present labelled disks, by name) describe `loaded` with each
/// layer's options as it runs (`running`): one uuid (refusing disks of another hierarchy),
/// and a new generation whenever the graph or a label differs. Returns the generation now on
/// the disks.
///
/// A disk whose label cannot be read or written because its medium fails is left at the
/// label it has, with a warning: its layer has failed it or will, and its older generation
/// marks it stale at the next assembly, as a disk absent from the change would be. Without
/// this, adding a mirror leg in place of a dead one (the usual repair) failed after the
/// mirror had taken the leg.
pub async fn reconcile(
    loaded: &Loaded,
    running: &Running,
    disks: &[(String, strata_core::DeviceRef)],
) -> anyhow::Result<u64> {
    let hierarchy = render_hierarchy(loaded, running)?;
    let mut labels = Vec::new();
    let mut all_intact = true;
    let mut reachable = Vec::new();
    for (name, device) in disks {
        let copies = match read_label_copies(device.as_ref()).await {
            Ok(copies) => copies,
            Err(e) if medium_failed(&e) => {
                tracing::warn!(
                    disk = %name,
                    error = %format!("{e:#}"),
                    "the hierarchy label cannot be read: the disk keeps the label it has"
                );
                continue;
            }
            Err(e) => return Err(e),
        };
        reachable.push((name, device));
        if copies.label.is_none() {
            refuse_to_overwrite(name, device.as_ref()).await?;
        } else if !copies.intact {
            // One copy carries the label alone now: one more fault and the disk would be
            // refused as holding unknown data. Rewriting both copies restores the margin.
            tracing::warn!(
                disk = %name,
                "one copy of the hierarchy label is damaged or behind the other: rewriting both"
            );
            all_intact = false;
        }
        labels.push((name, copies.label));
    }
    let uuid = one_hierarchy(&labels)?;
    let newest = labels
        .iter()
        .filter_map(|(_, l)| l.as_ref().map(|l| l.generation))
        .max()
        .unwrap_or(0);
    let current = labels.iter().all(|(name, label)| {
        label.as_ref().is_some_and(|l| {
            l.generation == newest && l.hierarchy == hierarchy && &&l.member == name
        })
    });
    if current && all_intact {
        return Ok(newest);
    }
    let uuid = uuid.unwrap_or_else(|| uuid_text(strata_meta::random_uuid()));
    let generation = newest + 1;
    let mut written = 0;
    for (name, device) in reachable {
        let label = Label {
            uuid: uuid.clone(),
            generation,
            member: name.to_string(),
            hierarchy: hierarchy.clone(),
        };
        match write_label(device.as_ref(), &label).await {
            Ok(()) => written += 1,
            Err(e) if medium_failed(&e) => tracing::warn!(
                disk = %name,
                error = %format!("{e:#}"),
                "the hierarchy label cannot be written: the disk keeps the label it had"
            ),
            Err(e) => return Err(e),
        }
    }
    tracing::info!(generation, %uuid, disks = written, "hierarchy labels written");
    Ok(generation)
}

/// A disk without a label gets one only if its first 64 KiB are zeros: anything else is
/// somebody's data (a disk used before, a file system), and a label would destroy it.
pub async fn refuse_to_overwrite(name: &str, device: &dyn BlockDevice) -> anyhow::Result<()> {
    if device.geometry().size < LABEL_BYTES {
        anyhow::bail!("disk {name} is smaller than its {LABEL_BYTES}-byte hierarchy label");
    }
    let head = device.read(0, LABEL_BYTES as usize).await?;
    if head.iter().any(|&b| b != 0) {
        anyhow::bail!(
            "disk {name} holds data where its hierarchy label goes (its first {} KiB are not \
             zeros) and no Strata label: refusing to overwrite it. Use an empty disk, or clear \
             those bytes if the data is not wanted",
            LABEL_BYTES >> 10
        );
    }
    Ok(())
}

/// Disks that sit under a layer and so carry a label.
pub fn labelled_disks(loaded: &Loaded) -> Vec<String> {
    let children: std::collections::HashSet<&str> = loaded
        .layers
        .iter()
        .flat_map(|l| l.children.iter().map(String::as_str))
        .collect();
    loaded
        .config
        .disks
        .iter()
        .map(|d| d.name.get_ref().clone())
        .filter(|name| children.contains(name.as_str()))
        .collect()
}

/// What `--assemble` found on the disks it was given.
pub struct Assembly {
    pub label: Label,
    /// Member name → path, for the members found.
    pub paths: BTreeMap<String, std::path::PathBuf>,
}

/// Reads the labels of `paths` and picks the hierarchy they belong to. Refuses disks of
/// different hierarchies, and disks whose generation is older than the newest label and
/// whose name the newest graph no longer lists (members that left the hierarchy).
pub fn assemble(labels: Vec<(std::path::PathBuf, Option<Label>)>) -> anyhow::Result<Assembly> {
    let mut found = Vec::new();
    for (path, label) in labels {
        let label = label.ok_or_else(|| {
            anyhow::anyhow!("{} carries no Strata hierarchy label", path.display())
        })?;
        found.push((path, label));
    }
    let newest = found
        .iter()
        .map(|(_, l)| l)
        .max_by_key(|l| l.generation)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("--assemble needs at least one disk"))?;
    let mut paths = BTreeMap::new();
    for (path, label) in &found {
        anyhow::ensure!(
            label.uuid == newest.uuid,
            "{} belongs to hierarchy {}, the others to {}: refusing to mix hierarchies",
            path.display(),
            label.uuid,
            newest.uuid
        );
        let listed = members_of(&newest.hierarchy).contains(&label.member);
        anyhow::ensure!(
            label.generation == newest.generation || listed,
            "{} ({}) is at generation {}, the hierarchy at {}, and no longer lists it: it left the hierarchy",
            path.display(),
            label.member,
            label.generation,
            newest.generation
        );
        anyhow::ensure!(
            paths.insert(label.member.clone(), path.clone()).is_none(),
            "two disks claim to be member {}",
            label.member
        );
    }
    Ok(Assembly {
        label: newest,
        paths,
    })
}

/// The disks a graph puts under layers (the members its labels are written to).
fn members_of(hierarchy: &str) -> std::collections::HashSet<String> {
    let doc: toml::Table = toml::from_str(hierarchy).unwrap_or_default();
    let layers = doc
        .get("layer")
        .and_then(|l| l.as_array())
        .cloned()
        .unwrap_or_default();
    layers
        .iter()
        .filter_map(|l| l.get("children").and_then(|c| c.as_array()))
        .flatten()
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect()
}

/// The configuration text `--assemble` serves: the label's graph, with the paths found and
/// every member not found marked missing.
pub fn assembled_config(assembly: &Assembly) -> anyhow::Result<String> {
    let mut doc: toml::Table = toml::from_str(&assembly.label.hierarchy)?;
    if let Some(toml::Value::Array(disks)) = doc.get_mut("disk") {
        for disk in disks.iter_mut().filter_map(|d| d.as_table_mut()) {
            let name = disk
                .get("name")
                .and_then(|n| n.as_str())
                .unwrap_or_default()
                .to_string();
            match assembly.paths.get(&name) {
                Some(path) => {
                    disk.insert(
                        "path".into(),
                        toml::Value::String(path.display().to_string()),
                    );
                }
                None => {
                    disk.insert(
                        "path".into(),
                        toml::Value::String(format!("missing/{name}")),
                    );
                    disk.insert("missing".into(), toml::Value::Boolean(true));
                }
            }
        }
    }
    // No `listen`: served where a config without one is, like any other config; `strata
    // serve --listen` chooses other addresses.
    let mut text = format!(
        "# Assembled from the disks' hierarchy labels. Without `listen`, served where a config \
         without it is: {}.\nadmin = \"admin.sock\"\n",
        crate::config::DEFAULT_LISTEN.join(", ")
    );
    text.push_str(&toml::to_string(&doc)?);
    Ok(text)
}

/// A labelled disk as its layer sees it: everything after the label. Describes itself as the
/// disk it is, so `strata status` shows no extra level.
pub struct Labelled {
    disk: strata_core::DeviceRef,
    view: strata_core::DeviceRef,
}

impl Labelled {
    pub fn new(name: &str, disk: strata_core::DeviceRef) -> anyhow::Result<Labelled> {
        let view =
            strata_stateless::slice::Slice::new(name.to_string(), disk.clone(), LABEL_BYTES, None)?;
        Ok(Labelled {
            disk,
            view: std::sync::Arc::new(view),
        })
    }
}

/// Everything but `control` goes to the view past the label (see [`strata_core::Filter`]).
#[strata_core::async_trait]
impl strata_core::Filter for Labelled {
    fn next(&self) -> &strata_core::DeviceRef {
        &self.view
    }

    async fn control(
        &self,
        request: strata_core::Control,
    ) -> strata_core::Result<strata_core::ControlReply> {
        match self.disk.control(request).await? {
            strata_core::ControlReply::Describe(mut node) => {
                // Read from the disk: reconfiguration relabels while the view lives on.
                let generation = match read_label(self.disk.as_ref()).await {
                    Ok(Some(label)) => label.generation.to_string(),
                    Ok(None) => "no label".into(),
                    Err(e) => format!("unreadable: {e}"),
                };
                node.detail
                    .push(("hierarchy generation".into(), generation));
                Ok(strata_core::ControlReply::Describe(node))
            }
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `--assemble` serves from /dev/d0 carrying the label `started` writes on its disk
    /// d0 (its only disk under a layer).
    fn assembled_from_d0(started: &Loaded) -> String {
        let label = Label {
            uuid: uuid_text([1; 16]),
            generation: 1,
            member: "d0".into(),
            hierarchy: render_hierarchy(started, &Running::new()).unwrap(),
        };
        let assembly = assemble(vec![(std::path::PathBuf::from("/dev/d0"), Some(label))]).unwrap();
        assembled_config(&assembly).unwrap()
    }

    /// A crypt's key file named relative to the data folder opens the same file when the
    /// stack is assembled from its labels into another data folder.
    #[test]
    fn a_key_file_in_a_label_resolves_to_the_same_file_when_assembled_elsewhere() {
        let text = "[[disk]]\nname = \"d0\"\npath = \"d0.img\"\n\
                    [[layer]]\nname = \"secret\"\nkind = \"crypt\"\nchildren = [\"d0\"]\n\
                    key-file = \"keys/enc.key\"\n\
                    [[export]]\nname = \"e\"\ndevice = \"secret\"\n";
        let started = crate::config::load(text, "t.toml", Path::new("/srv/first"), None).unwrap();
        let key_file = |loaded: &Loaded| {
            let options = crate::registry::Options::new(
                loaded.layers[0].options.clone(),
                loaded.data_dir.clone(),
            );
            options
                .base
                .join(options.text("key-file").unwrap().unwrap())
        };
        assert_eq!(key_file(&started), Path::new("/srv/first/keys/enc.key"));
        let assembled_text = assembled_from_d0(&started);
        let assembled = crate::config::load(
            &assembled_text,
            "assembled.toml",
            Path::new("."),
            Some(Path::new("/srv/elsewhere")),
        )
        .unwrap();
        assert_eq!(key_file(&assembled), key_file(&started));
    }

    #[test]
    fn label_copies_round_trip_and_reject_damage() {
        let label = Label {
            uuid: uuid_text([7; 16]),
            generation: 3,
            member: "d0".into(),
            hierarchy: "[[disk]]\nname = \"d0\"\n".into(),
        };
        let copy = encode(&label).unwrap();
        assert_eq!(copy.len() as u64, COPY_BYTES);
        assert_eq!(decode(&copy), Some(label.clone()));
        let mut torn = copy.clone();
        torn[HEADER + 5] ^= 1;
        assert_eq!(decode(&torn), None);
        assert_eq!(decode(&vec![0; COPY_BYTES as usize]), None);
    }

    /// Media damage on the label area, seeded: whatever bytes are flipped, the label read
    /// back is the one written or none at all (then the disk is refused as holding unknown
    /// data, never relabelled); with one copy untouched it is always the one written, and
    /// the damage is seen (not `intact`), so the next start rewrites both copies.
    #[test]
    fn damaged_labels_read_back_as_written_or_not_at_all() {
        let label = label(9, 12, "d1", &["d0", "d1", "d2"]);
        let copy = encode(&label).unwrap();
        let head: Vec<u8> = [copy.clone(), copy].concat();
        assert_eq!(
            label_copies(&head),
            LabelCopies {
                label: Some(label.clone()),
                intact: true
            }
        );
        let json_end = HEADER + serde_json::to_vec(&label).unwrap().len();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |bound: u64| {
            // splitmix64: enough randomness for placing faults, and no dependency.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % bound
        };
        let (mut lost, mut one_copy) = (0, 0);
        for _ in 0..20_000 {
            let mut damaged = head.clone();
            let both = next(4) == 0;
            let copies: &[u64] = if both { &[0, 1] } else { &[next(2)] };
            for &which in copies {
                for _ in 0..1 + next(8) {
                    // Mostly where the label lives (header and JSON), sometimes in the padding.
                    let within = if next(4) == 0 {
                        next(COPY_BYTES)
                    } else {
                        next(json_end as u64)
                    };
                    damaged[(which * COPY_BYTES + within) as usize] ^= 1 << next(8);
                }
            }
            let read = label_copies(&damaged);
            match &read.label {
                Some(found) => assert_eq!(found, &label, "damage produced another label"),
                None => {
                    assert!(both, "one copy was untouched, yet no label was read");
                    lost += 1;
                }
            }
            if !both {
                one_copy += 1;
                // The crc covers the header's fields and the JSON, not the zero padding.
                let hit = (0..2).any(|c| {
                    let at = (c * COPY_BYTES) as usize;
                    damaged[at..at + json_end] != head[at..at + json_end]
                });
                assert_eq!(
                    !read.intact, hit,
                    "damage seen {} but hit {hit}",
                    !read.intact
                );
            }
        }
        assert!(
            lost > 0 && one_copy > 10_000,
            "lost {lost}, one copy {one_copy}"
        );
    }

    fn label(uuid: u8, generation: u64, member: &str, members: &[&str]) -> Label {
        let disks: String = members
            .iter()
            .map(|m| format!("[[disk]]\nname = \"{m}\"\n"))
            .collect();
        let children: Vec<String> = members.iter().map(|m| format!("\"{m}\"")).collect();
        let hierarchy = format!(
            "{disks}[[layer]]\nname = \"l\"\nkind = \"concat\"\nchildren = [{}]\n",
            children.join(", ")
        );
        Label {
            uuid: uuid_text([uuid; 16]),
            generation,
            member: member.into(),
            hierarchy,
        }
    }

    #[test]
    fn assembly_refuses_mixed_hierarchies_and_departed_members() {
        let p = |s: &str| std::path::PathBuf::from(s);
        let ok = assemble(vec![
            (p("a"), Some(label(1, 5, "d0", &["d0", "d1"]))),
            (p("b"), Some(label(1, 4, "d1", &["d0", "d1"]))),
        ])
        .unwrap();
        assert_eq!(
            ok.label.generation, 5,
            "an interrupted generation bump is accepted"
        );
        let mixed = assemble(vec![
            (p("a"), Some(label(1, 5, "d0", &["d0"]))),
            (p("b"), Some(label(2, 5, "d1", &["d1"]))),
        ]);
        assert!(mixed.err().unwrap().to_string().contains("refusing to mix"));
        let departed = assemble(vec![
            (p("a"), Some(label(1, 6, "d0", &["d0", "d3"]))),
            (p("b"), Some(label(1, 5, "d2", &["d0", "d2"]))),
        ]);
        assert!(departed
            .err()
            .unwrap()
            .to_string()
            .contains("left the hierarchy"));
        let text = assembled_config(&ok).unwrap();
        assert!(text.contains("path = \"a\""), "{text}");
    }

    #[test]
    fn an_assembled_stack_listens_where_a_config_without_listen_does() {
        let text = "listen = [\"unix:elsewhere.sock\", \"tcp:127.0.0.1:1\"]\n\
                    [[disk]]\nname = \"d0\"\npath = \"d0.img\"\n\
                    [[layer]]\nname = \"c\"\nkind = \"concat\"\nchildren = [\"d0\"]\n\
                    [[export]]\nname = \"e\"\ndevice = \"c\"\n";
        let started = crate::config::load(text, "t.toml", Path::new("/srv"), None).unwrap();
        let assembled_text = assembled_from_d0(&started);
        let load = |text: &str| {
            crate::config::load(text, "a.toml", Path::new("."), Some(Path::new("/srv/a"))).unwrap()
        };
        let without_listen = "[[disk]]\nname = \"d0\"\npath = \"d0.img\"\n\
                              [[export]]\nname = \"e\"\ndevice = \"d0\"\n";
        // Not the listeners of the config that wrote the labels (a label carries none): the
        // defaults, the unix socket in the data folder and localhost's NBD port.
        assert_eq!(
            load(&assembled_text).listen,
            load(without_listen).listen,
            "{assembled_text}"
        );
        assert_eq!(
            load(&assembled_text).listen,
            [
                crate::config::ListenAddr::Unix("nbd.sock".into()),
                crate::config::ListenAddr::Tcp("127.0.0.1:10809".into())
            ]
        );
        assert_eq!(
            load(&assembled_text).resolve(Path::new("nbd.sock")),
            Path::new("/srv/a/nbd.sock")
        );
    }
}
