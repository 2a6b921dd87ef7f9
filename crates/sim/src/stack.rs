//! A stack described the way `strata serve` describes one: `[[disk]]` tables (here naming a
//! device model instead of a file) and `[[layer]]` tables in the serve config's own syntax,
//! built through the same layer registry, so the layer code under simulation is the code
//! that serves NBD.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use strata_core::DeviceRef;
use strata_stack::build;
use strata_stack::graph::{self, LayerConfig};
use strata_stack::registry::{self, LayerArgs, Options, StartPolicy};

use crate::disk::{DataMode, SimDisk};
use crate::executor::Simulation;
use crate::model::DeviceModel;

/// One simulated disk: a name, a device-model preset and the preset's options.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskSpec {
    pub name: String,
    pub model: String,
    /// Model options (`queue = "fifo"`, `queue-depth = 8`, `link = "wan-17ms"` …), as given.
    pub options: toml::Table,
}

/// One `[[layer]]` table, parsed by the serve config's own parser.
pub type LayerSpec = LayerConfig;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackSpec {
    pub disks: Vec<DiskSpec>,
    pub layers: Vec<LayerSpec>,
    /// The device the workload runs against; by default the one device that is nobody's
    /// child.
    pub top: Option<String>,
}

/// A built stack: its disks (for sampling and reports), its top device, and every layer's
/// node by layer name (a thin pool's node included, which is not a device but answers the
/// pool's verbs: `Control::Call { verb: "snapshot-create", .. }`).
pub struct Stack {
    pub disks: Vec<Arc<SimDisk>>,
    pub top: DeviceRef,
    pub top_name: String,
    pub nodes: BTreeMap<String, DeviceRef>,
}

/// Makes a device model from a preset name and its options.
pub type ModelFactory<'a> =
    &'a dyn Fn(&str, &toml::Table, u64) -> Result<Box<dyn DeviceModel>, String>;

impl StackSpec {
    /// Reads `[[disk]]`, `[[layer]]` and `top` from an experiment or stack file's table.
    pub fn from_toml(table: &toml::Table) -> Result<StackSpec, String> {
        let mut spec = StackSpec::default();
        for (i, disk) in array_of_tables(table, "disk")?.iter().enumerate() {
            let mut options = disk.clone();
            let name = take_string(&mut options, "name").map_err(|e| format!("disk {i}: {e}"))?;
            let model =
                take_string(&mut options, "model").map_err(|e| format!("disk {name}: {e}"))?;
            spec.disks.push(DiskSpec {
                name,
                model,
                options,
            });
        }
        for (i, layer) in array_of_tables(table, "layer")?.iter().enumerate() {
            spec.layers
                .push(graph::layer_from_table(layer).map_err(|e| format!("layer {i}: {e}"))?);
        }
        spec.top = match table.get("top") {
            None => None,
            Some(toml::Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("`top` must be a device name".into()),
        };
        if spec.disks.is_empty() {
            return Err("a stack needs at least one [[disk]]".into());
        }
        spec.check()?;
        Ok(spec)
    }

    /// The serve config's checks (names, kinds, children, cycles: `strata_stack::graph`),
    /// then one top; returns the layers in build order.
    fn check(&self) -> Result<Vec<usize>, String> {
        let disks: Vec<(String, usize)> = self.disks.iter().map(|d| (d.name.clone(), 0)).collect();
        let order = graph::validate("", &disks, &self.layers, &[]).map_err(|l| l.message)?;
        self.top_name(&self.used())?;
        Ok(order)
    }

    /// Every device that is some layer's child.
    fn used(&self) -> BTreeSet<String> {
        self.layers
            .iter()
            .flat_map(|l| l.children.iter().cloned())
            .collect()
    }

    /// The devices: disks, layers, and each thin pool's volumes in place of the pool (a pool
    /// is not a device).
    fn devices(&self) -> Vec<String> {
        let disks = self.disks.iter().map(|d| d.name.clone());
        let layers = self.layers.iter().flat_map(|l| {
            if registry::find(&l.kind).is_some_and(|kind| kind.makes_volumes()) {
                l.volumes
                    .iter()
                    .map(|v| format!("{}/{}", l.name, v.name))
                    .collect()
            } else {
                vec![l.name.clone()]
            }
        });
        disks.chain(layers).collect()
    }

    fn top_name(&self, used: &BTreeSet<String>) -> Result<String, String> {
        let devices = self.devices();
        if let Some(top) = &self.top {
            return if devices.contains(top) {
                Ok(top.clone())
            } else {
                Err(format!("`top`: no device named {top:?}"))
            };
        }
        let roots: Vec<&String> = devices.iter().filter(|n| !used.contains(*n)).collect();
        match roots.as_slice() {
            [one] => Ok((*one).clone()),
            _ => Err(format!(
                "the stack has {} devices nobody uses ({}); name the one to run with `top`",
                roots.len(),
                roots
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// Builds the disks and the layers (children first) inside `sim`.
    pub fn build(
        &self,
        sim: &Simulation,
        models: ModelFactory<'_>,
        mode: DataMode,
        base: &Path,
    ) -> Result<Stack, String> {
        let mut built: BTreeMap<String, DeviceRef> = BTreeMap::new();
        let mut nodes: BTreeMap<String, DeviceRef> = BTreeMap::new();
        let mut disks = Vec::new();
        for (i, spec) in self.disks.iter().enumerate() {
            let seed = crate::executor::derive_seed(sim.seed(), &format!("disk-{i}"));
            let model = models(&spec.model, &spec.options, seed)
                .map_err(|e| format!("disk {}: {e}", spec.name))?;
            let disk = SimDisk::new(sim, spec.name.clone(), model, mode);
            built.insert(spec.name.clone(), disk.clone());
            disks.push(disk);
        }
        for index in self.check()? {
            let layer = &self.layers[index];
            let kind = registry::find(&layer.kind).ok_or_else(|| {
                format!(
                    "layer {}: the simulator cannot build a {}",
                    layer.name, layer.kind
                )
            })?;
            let args = LayerArgs {
                name: layer.name.clone(),
                children: layer
                    .children
                    .iter()
                    .map(|c| built.get(c).cloned())
                    .collect(),
                child_names: layer.children.clone(),
                options: Options::new(layer.options.clone(), base.to_path_buf()),
                runtime: sim.runtime(),
                start: StartPolicy::FRESH,
            };
            let device = sim
                .block_on((kind.build)(args))
                .map_err(|e| format!("layer {}: {e}", layer.name))?;
            // Built by the same code as under `strata serve`: a thin pool's volumes are the
            // devices, the pool is not one.
            match sim
                .block_on(build::made_devices(layer, &device))
                .map_err(|e| format!("{e:#}"))?
            {
                Some(volumes) => built.extend(volumes),
                None => {
                    built.insert(layer.name.clone(), device.clone());
                }
            }
            nodes.insert(layer.name.clone(), device);
        }
        let top_name = self.top_name(&self.used())?;
        Ok(Stack {
            disks,
            top: built[&top_name].clone(),
            top_name,
            nodes,
        })
    }
}

impl Stack {
    /// One more simulated disk in `sim`, not part of any layer: a disk to hand to a layer
    /// later (a raid5 grow's new member). Its model is seeded as the stack's disks are, by
    /// its place among them ("disk-3" after three), and it joins `disks`, so runs report it.
    pub fn add_disk(
        &mut self,
        sim: &Simulation,
        spec: &DiskSpec,
        models: ModelFactory<'_>,
        mode: DataMode,
    ) -> Result<Arc<SimDisk>, String> {
        if self.disks.iter().any(|d| d.name() == spec.name) || self.nodes.contains_key(&spec.name) {
            return Err(format!(
                "disk {}: the stack has a device of that name",
                spec.name
            ));
        }
        let index = self.disks.len();
        let seed = crate::executor::derive_seed(sim.seed(), &format!("disk-{index}"));
        let model = models(&spec.model, &spec.options, seed)
            .map_err(|e| format!("disk {}: {e}", spec.name))?;
        let disk = SimDisk::new(sim, spec.name.clone(), model, mode);
        self.disks.push(disk.clone());
        Ok(disk)
    }
}

fn array_of_tables(table: &toml::Table, key: &str) -> Result<Vec<toml::Table>, String> {
    match table.get(key) {
        None => Ok(Vec::new()),
        Some(toml::Value::Array(items)) => items
            .iter()
            .map(|item| item.as_table().cloned())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("`{key}` must be [[{key}]] tables")),
        Some(_) => Err(format!("`{key}` must be [[{key}]] tables")),
    }
}

fn take_string(table: &mut toml::Table, key: &str) -> Result<String, String> {
    match table.remove(key) {
        Some(toml::Value::String(s)) if !s.is_empty() => Ok(s),
        Some(_) => Err(format!("`{key}` must be a non-empty string")),
        None => Err(format!("missing `{key}`")),
    }
}
