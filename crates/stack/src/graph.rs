//! The hierarchy as a graph: `[[layer]]` tables parsed into layers, and the checks that make
//! a configuration a DAG the server can build.
//!
//! Checks, each with the line of the offending field: names unique across disks and layers;
//! a known kind; the right number of children for the kind; children that exist; no cycle;
//! a device under several parents only where they use disjoint ranges of it (two slices of
//! one disk; see [`used_range`]), and no device both under a layer and exported (writes that
//! bypass a layer corrupt it); only top-level devices exported; options the kind knows.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;

use crate::registry::{self, OptionValue};
use strata_core::layer::Options;
use strata_core::ByteSize;

#[derive(Debug, Clone, PartialEq)]
pub struct VolumeConfig {
    pub name: String,
    pub size: u64,
}

/// One `[[layer]]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConfig {
    pub name: String,
    pub kind: String,
    pub children: Vec<String>,
    /// Only for a kind that makes volumes (a thin pool): volumes created at start when missing.
    pub volumes: Vec<VolumeConfig>,
    /// Only for a kind with the `grow-pool` verb (a thin pool): spare disks (paths as written) appended to the pool's concat child,
    /// first to last, when allocation crosses the low-water mark.
    pub grow_from: Vec<String>,
    /// Everything else, for the kind to interpret.
    pub options: BTreeMap<String, OptionValue>,
    /// Where the table is in the file, for error locations.
    pub span: Range<usize>,
}

/// A parse or validation error at a byte offset of the configuration text.
pub struct Located {
    pub at: usize,
    pub message: String,
}

fn located(at: usize, message: impl Into<String>) -> Located {
    Located {
        at,
        message: message.into(),
    }
}

/// Byte offset of `key = …` inside `span` of `text`, or the span's start.
pub fn key_offset(text: &str, span: &Range<usize>, key: &str) -> usize {
    let body = &text[span.start..span.end.min(text.len())];
    let mut at = 0;
    for line in body.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(key) {
            if rest.trim_start().starts_with('=') {
                return span.start + at + (line.len() - trimmed.len());
            }
        }
        at += line.len();
    }
    span.start
}

/// Options back as the TOML table they were written as (for kinds that parse a serde struct).
pub fn options_table(options: &BTreeMap<String, OptionValue>) -> toml::Table {
    options
        .iter()
        .map(|(key, value)| {
            let value = match value {
                OptionValue::Text(s) => toml::Value::String(s.clone()),
                OptionValue::Integer(i) => toml::Value::Integer(*i),
                OptionValue::Float(f) => toml::Value::Float(*f),
                OptionValue::Bool(b) => toml::Value::Boolean(*b),
            };
            (key.clone(), value)
        })
        .collect()
}

fn option_value(value: &toml::Value) -> Option<OptionValue> {
    Some(match value {
        toml::Value::String(s) => OptionValue::Text(s.clone()),
        toml::Value::Integer(i) => OptionValue::Integer(*i),
        toml::Value::Float(f) => OptionValue::Float(*f),
        toml::Value::Boolean(b) => OptionValue::Bool(*b),
        _ => return None,
    })
}

/// Parses one `[[layer]]` table.
pub fn parse_layer(text: &str, table: &toml::Spanned<toml::Table>) -> Result<LayerConfig, Located> {
    parse_layer_at(text, table.span(), table.get_ref())
}

/// Parses a `[[layer]]` table that has no text around it (the simulator's stack files are
/// read as tables): errors carry the message only.
pub fn layer_from_table(table: &toml::Table) -> Result<LayerConfig, String> {
    parse_layer_at("", 0..0, table).map_err(|l| l.message)
}

fn parse_layer_at(
    text: &str,
    span: Range<usize>,
    table: &toml::Table,
) -> Result<LayerConfig, Located> {
    let at = |key: &str| key_offset(text, &span, key);
    let string = |key: &str| -> Result<String, Located> {
        match table.get(key) {
            Some(toml::Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(located(at(key), format!("field `{key}`: must be a string"))),
            None => Err(located(
                span.start,
                format!("missing field `{key}` in [[layer]]"),
            )),
        }
    };
    let name = string("name")?;
    let kind = string("kind")?;
    let children = match table.get("children") {
        Some(toml::Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| located(at("children"), "field `children`: must be a list of names"))?,
        Some(_) => {
            return Err(located(
                at("children"),
                "field `children`: must be a list of names",
            ))
        }
        None => {
            return Err(located(
                span.start,
                format!("missing field `children` in layer {name}"),
            ))
        }
    };
    let mut layer = LayerConfig {
        name,
        kind,
        children,
        volumes: Vec::new(),
        grow_from: Vec::new(),
        options: BTreeMap::new(),
        span: span.clone(),
    };
    for (key, value) in table {
        match key.as_str() {
            "name" | "kind" | "children" => {}
            "volumes" => {
                layer.volumes = parse_volumes(value).map_err(|m| located(at("volumes"), m))?
            }
            "grow-from" => {
                layer.grow_from = parse_paths(value).map_err(|m| located(at("grow-from"), m))?
            }
            _ => {
                let value = option_value(value).ok_or_else(|| {
                    located(
                        at(key),
                        format!("field `{key}`: must be a string, number or boolean"),
                    )
                })?;
                layer.options.insert(key.clone(), value);
            }
        }
    }
    Ok(layer)
}

fn parse_paths(value: &toml::Value) -> Result<Vec<String>, String> {
    let shape = "field `grow-from`: must be a list of spare disk paths like [\"spare1.img\"]";
    let paths = value
        .as_array()
        .ok_or(shape)?
        .iter()
        .map(|item| item.as_str().filter(|s| !s.is_empty()).map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or(shape)?;
    let unique: HashSet<&String> = paths.iter().collect();
    if unique.len() != paths.len() {
        return Err("field `grow-from`: a spare is listed twice".into());
    }
    Ok(paths)
}

fn parse_volumes(value: &toml::Value) -> Result<Vec<VolumeConfig>, String> {
    let shape = "field `volumes`: must be a list like [{ name = \"vol\", size = \"4GiB\" }]";
    let items = value.as_array().ok_or(shape)?;
    items
        .iter()
        .map(|item| {
            let table = item.as_table().ok_or(shape)?;
            let name = table
                .get("name")
                .and_then(|v| v.as_str())
                .ok_or(shape)?
                .to_string();
            let size = match table.get("size") {
                Some(toml::Value::String(s)) => {
                    ByteSize::parse(s)
                        .map_err(|e| format!("volume {name}: {e}"))?
                        .0
                }
                Some(toml::Value::Integer(n)) if *n > 0 => *n as u64,
                _ => return Err(format!("volume {name}: needs a size such as \"4GiB\"")),
            };
            if table.keys().any(|k| k != "name" && k != "size") {
                return Err(format!("volume {name}: only `name` and `size` are allowed"));
            }
            Ok(VolumeConfig { name, size })
        })
        .collect()
}

/// Names of disks, layers, exports and volumes: what a file name, a metric label and an NBD
/// export name can all carry.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name (1-64 characters: letters, digits, '-', '_', '.')"
        ))
    }
}

/// Checks the layers against the disks and exports; returns the layers in build order
/// (children before parents).
pub fn validate(
    text: &str,
    disks: &[(String, usize)],
    layers: &[LayerConfig],
    exports: &[(String, usize)],
) -> Result<Vec<usize>, Located> {
    let mut defined: HashMap<&str, usize> = HashMap::new();
    for (name, at) in disks {
        if defined.insert(name, *at).is_some() {
            return Err(located(
                *at,
                format!("field `name`: a disk named {name:?} is already defined"),
            ));
        }
    }
    for layer in layers {
        let at = key_offset(text, &layer.span, "name");
        check_name(&layer.name).map_err(|m| located(at, format!("field `name`: {m}")))?;
        if defined.insert(&layer.name, at).is_some() {
            return Err(located(
                at,
                format!(
                    "field `name`: a disk or layer named {:?} is already defined",
                    layer.name
                ),
            ));
        }
        check_kind(text, layer)?;
    }
    let volumes: HashSet<String> = layers
        .iter()
        .flat_map(|l| {
            l.volumes
                .iter()
                .map(move |v| format!("{}/{}", l.name, v.name))
        })
        .collect();
    let pools: HashSet<&str> = layers
        .iter()
        .filter(|l| registry::find(&l.kind).is_some_and(|kind| kind.makes_volumes()))
        .map(|l| l.name.as_str())
        .collect();
    for pool in layers.iter().filter(|l| !l.grow_from.is_empty()) {
        let child = &pool.children[0];
        if !layers
            .iter()
            .any(|l| &l.name == child && l.kind == "concat")
        {
            return Err(located(
                key_offset(text, &pool.span, "grow-from"),
                format!(
                    "field `grow-from`: the pool grows by appending spares to its child, which must be a concat layer ({child:?} is not)"
                ),
            ));
        }
    }
    // The first parent of each device (for messages), and every range its parents use.
    let mut parent: HashMap<&str, &str> = HashMap::new();
    let mut used: HashMap<&str, Vec<(&str, Used)>> = HashMap::new();
    for layer in layers {
        let at = key_offset(text, &layer.span, "children");
        for child in &layer.children {
            if pools.contains(child.as_str()) {
                return Err(located(at, format!(
                    "field `children`: {child:?} is a thin pool, not a device; use one of its volumes, <pool>/<volume>"
                )));
            }
            if !defined.contains_key(child.as_str()) && !volumes.contains(child) {
                return Err(located(
                    at,
                    format!("field `children`: no disk or layer named {child:?}"),
                ));
            }
            let range = used_range(layer).map_err(|m| located(at, m))?;
            let users = used.entry(child.as_str()).or_default();
            if let Some((other, other_range)) = users.iter().find(|(_, r)| r.overlaps(&range)) {
                return Err(located(
                    at,
                    format!(
                    "field `children`: {child:?} is already a child of {other:?} ({other_range}), \
                     and {:?} uses {range}: the ranges overlap (a device may have several \
                     parents only where they use disjoint ranges of it)",
                    layer.name
                ),
                ));
            }
            users.push((layer.name.as_str(), range));
            parent.entry(child.as_str()).or_insert(layer.name.as_str());
        }
    }
    let order = topological_order(text, layers)?;
    for (device, at) in exports {
        if let Some(owner) = parent.get(device.as_str()) {
            return Err(located(*at, format!(
                "field `device`: {device:?} is inside layer {owner:?}; export the top of the hierarchy instead"
            )));
        }
        let pool = pools.contains(device.as_str());
        if pool || (!defined.contains_key(device.as_str()) && !volumes.contains(device)) {
            let hint = if pool {
                " (a pool is not a device: export one of its volumes, <pool>/<volume>)"
            } else {
                ""
            };
            return Err(located(
                *at,
                format!("field `device`: no disk, layer or volume named {device:?}{hint}"),
            ));
        }
    }
    Ok(order)
}

fn check_kind(text: &str, layer: &LayerConfig) -> Result<(), Located> {
    let kind_at = key_offset(text, &layer.span, "kind");
    let kind = registry::find(&layer.kind).ok_or_else(|| {
        located(
            kind_at,
            format!(
                "field `kind`: unknown layer kind {:?} (known: {})",
                layer.kind,
                registry::kind_names().join(", ")
            ),
        )
    })?;
    let (children, options) = (kind.children, (kind.options)());
    if !layer.grow_from.is_empty() && kind.verb("grow-pool").is_none() {
        return Err(located(
            key_offset(text, &layer.span, "grow-from"),
            format!("field `grow-from`: a {} has no such option", layer.kind),
        ));
    }
    if !children.allows(layer.children.len()) {
        let at = key_offset(text, &layer.span, "children");
        return Err(located(
            at,
            format!(
                "field `children`: a {} takes {}, not {}",
                layer.kind,
                children.describe(),
                layer.children.len()
            ),
        ));
    }
    if let Some(key) = layer
        .options
        .keys()
        .find(|k| !options.contains(&k.as_str()))
    {
        let at = key_offset(text, &layer.span, key);
        return Err(located(
            at,
            format!(
                "field `{key}`: a {} has no such option (known: {})",
                layer.kind,
                options.join(", ")
            ),
        ));
    }
    // Every kind's typed config is checked here, so that a bad size or a wrong type is
    // reported with its place in the file, not at build without one.
    let options = Options::new(layer.options.clone(), Default::default());
    (kind.check)(&options).map_err(|error| {
        let problem = match error {
            strata_core::BlockError::InvalidArgument(problem) => problem,
            other => other.to_string(),
        };
        at_field(text, layer, problem)
    })?;
    if !kind.makes_volumes() && !layer.volumes.is_empty() {
        return Err(located(
            key_offset(text, &layer.span, "volumes"),
            "field `volumes`: only a kind that makes volumes (a thin-pool) has them",
        ));
    }
    Ok(())
}

/// `problem` located at the field it names ("field `KEY`: …"), or at the kind.
fn at_field(text: &str, layer: &LayerConfig, problem: String) -> Located {
    let key = problem
        .split_once("field `")
        .and_then(|(_, rest)| rest.split('`').next())
        .unwrap_or("kind");
    located(key_offset(text, &layer.span, key), problem)
}

/// The bytes of its child a layer uses: `start..end`, `end` None for "to the end".
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Used {
    pub start: u64,
    pub end: Option<u64>,
}

impl Used {
    fn overlaps(&self, other: &Used) -> bool {
        let before = |a: &Used, b: &Used| a.end.is_some_and(|end| end <= b.start);
        !before(self, other) && !before(other, self)
    }
}

impl std::fmt::Display for Used {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.end {
            Some(end) => write!(f, "bytes {}..{}", ByteSize(self.start), ByteSize(end)),
            None if self.start == 0 => write!(f, "all of it"),
            None => write!(f, "bytes {}..the end", ByteSize(self.start)),
        }
    }
}

/// What part of its child `layer` uses: a slice its window (`offset`, `length`), every
/// other kind the whole device.
pub fn used_range(layer: &LayerConfig) -> Result<Used, String> {
    if layer.kind != "slice" {
        return Ok(Used {
            start: 0,
            end: None,
        });
    }
    let options = registry::Options::new(layer.options.clone(), Default::default());
    let start = options
        .size("offset")
        .map_err(|e| e.to_string())?
        .unwrap_or(0);
    let length = options.size("length").map_err(|e| e.to_string())?;
    Ok(Used {
        start,
        end: length.map(|length| start.saturating_add(length)),
    })
}

/// Layers in an order where every child comes before its parent; a cycle is an error naming
/// the layers on it.
fn topological_order(text: &str, layers: &[LayerConfig]) -> Result<Vec<usize>, Located> {
    let index: HashMap<&str, usize> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.as_str(), i))
        .collect();
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Visiting,
        Done,
    }
    let mut marks = vec![Mark::New; layers.len()];
    let mut order = Vec::new();
    fn visit(
        i: usize,
        layers: &[LayerConfig],
        index: &HashMap<&str, usize>,
        marks: &mut [Mark],
        order: &mut Vec<usize>,
        path: &mut Vec<usize>,
    ) -> Result<(), Vec<usize>> {
        match marks[i] {
            Mark::Done => return Ok(()),
            Mark::Visiting => {
                let start = path.iter().position(|&p| p == i).unwrap_or(0);
                return Err(path[start..].to_vec());
            }
            Mark::New => {}
        }
        marks[i] = Mark::Visiting;
        path.push(i);
        for child in &layers[i].children {
            // A pool's volume depends on the pool.
            let owner = child.split('/').next().unwrap_or(child);
            if let Some(&c) = index.get(owner) {
                visit(c, layers, index, marks, order, path)?;
            }
        }
        path.pop();
        marks[i] = Mark::Done;
        order.push(i);
        Ok(())
    }
    for i in 0..layers.len() {
        let mut path = Vec::new();
        if let Err(cycle) = visit(i, layers, &index, &mut marks, &mut order, &mut path) {
            let names: Vec<&str> = cycle.iter().map(|&c| layers[c].name.as_str()).collect();
            let first = &layers[cycle[0]];
            return Err(located(
                key_offset(text, &first.span, "children"),
                format!(
                    "field `children`: the layers {} form a cycle",
                    names.join(" → ")
                ),
            ));
        }
    }
    Ok(order)
}
