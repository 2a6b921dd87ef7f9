//! A stack described the way `strata serve` describes one: `[[disk]]` tables (here naming a
//! device model instead of a file) and `[[layer]]` tables in the serve config's own syntax,
//! built through the same layer registry, so the layer code under simulation is the code
//! that serves NBD.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use strata_core::DeviceRef;
use strata_stack::registry::{self, LayerArgs, OptionValue, Options, StartPolicy};

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

/// One `[[layer]]` table: the serve config's syntax (name, kind, children, options).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    pub name: String,
    pub kind: String,
    pub children: Vec<String>,
    pub options: BTreeMap<String, OptionValue>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackSpec {
    pub disks: Vec<DiskSpec>,
    pub layers: Vec<LayerSpec>,
    /// The device the workload runs against; by default the one device that is nobody's
    /// child.
    pub top: Option<String>,
}

/// A built stack: its disks (for sampling and reports) and its top device.
pub struct Stack {
    pub disks: Vec<Arc<SimDisk>>,
    pub top: DeviceRef,
    pub top_name: String,
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
            let mut rest = layer.clone();
            let name = take_string(&mut rest, "name").map_err(|e| format!("layer {i}: {e}"))?;
            let kind = take_string(&mut rest, "kind").map_err(|e| format!("layer {name}: {e}"))?;
            let children = match rest.remove("children") {
                Some(toml::Value::Array(items)) => items
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| format!("layer {name}: `children` must be a list of names"))?,
                _ => return Err(format!("layer {name}: needs `children`, a list of names")),
            };
            let mut options = BTreeMap::new();
            for (key, value) in rest {
                let value = match value {
                    toml::Value::String(s) => OptionValue::Text(s),
                    toml::Value::Integer(n) => OptionValue::Integer(n),
                    toml::Value::Float(x) => OptionValue::Float(x),
                    toml::Value::Boolean(b) => OptionValue::Bool(b),
                    _ => {
                        return Err(format!(
                            "layer {name}: field `{key}` must be a string, number or boolean"
                        ))
                    }
                };
                options.insert(key, value);
            }
            spec.layers.push(LayerSpec {
                name,
                kind,
                children,
                options,
            });
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

    /// Names unique, kinds known, children defined and used once, one top.
    fn check(&self) -> Result<(), String> {
        let mut names = BTreeSet::new();
        for name in self
            .disks
            .iter()
            .map(|d| &d.name)
            .chain(self.layers.iter().map(|l| &l.name))
        {
            if !names.insert(name.clone()) {
                return Err(format!("two devices are named {name:?}"));
            }
        }
        let mut used = BTreeSet::new();
        for layer in &self.layers {
            let kind = registry::find(&layer.kind).ok_or_else(|| {
                format!(
                    "layer {}: unknown kind {:?} (the simulator builds: {})",
                    layer.name,
                    layer.kind,
                    registry::KINDS
                        .iter()
                        .map(|k| k.kind)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            if !kind.children.allows(layer.children.len()) {
                return Err(format!(
                    "layer {}: a {} takes {}",
                    layer.name,
                    layer.kind,
                    kind.children.describe()
                ));
            }
            for child in &layer.children {
                if !names.contains(child) {
                    return Err(format!("layer {}: no device named {child:?}", layer.name));
                }
                if !used.insert(child.clone()) {
                    return Err(format!("{child:?} is the child of two layers"));
                }
            }
        }
        self.top_name(&used).map(|_| ())
    }

    fn top_name(&self, used: &BTreeSet<String>) -> Result<String, String> {
        if let Some(top) = &self.top {
            let known = self.disks.iter().any(|d| &d.name == top)
                || self.layers.iter().any(|l| &l.name == top);
            return if known {
                Ok(top.clone())
            } else {
                Err(format!("`top`: no device named {top:?}"))
            };
        }
        let roots: Vec<&String> = self
            .disks
            .iter()
            .map(|d| &d.name)
            .chain(self.layers.iter().map(|l| &l.name))
            .filter(|n| !used.contains(*n))
            .collect();
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
        let mut disks = Vec::new();
        for (i, spec) in self.disks.iter().enumerate() {
            let seed = crate::executor::derive_seed(sim.seed(), &format!("disk-{i}"));
            let model = models(&spec.model, &spec.options, seed)
                .map_err(|e| format!("disk {}: {e}", spec.name))?;
            let disk = SimDisk::new(sim, spec.name.clone(), model, mode);
            built.insert(spec.name.clone(), disk.clone());
            disks.push(disk);
        }
        let mut left: Vec<&LayerSpec> = self.layers.iter().collect();
        while !left.is_empty() {
            let ready = left
                .iter()
                .position(|l| l.children.iter().all(|c| built.contains_key(c)))
                .ok_or("the layers form a cycle")?;
            let layer = left.remove(ready);
            let kind = registry::find(&layer.kind).expect("checked");
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
            built.insert(layer.name.clone(), device);
        }
        let used: BTreeSet<String> = self
            .layers
            .iter()
            .flat_map(|l| l.children.iter().cloned())
            .collect();
        let top_name = self.top_name(&used)?;
        Ok(Stack {
            disks,
            top: built[&top_name].clone(),
            top_name,
        })
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
