//! The contract between a layer kind and the stack that builds it: what a kind declares
//! (children, options, how many members may be missing) and what its constructor gets.
//!
//! The list of kinds lives in `strata-stack`'s registry: adding a layer is one module and one
//! line there. The configuration loader checks a `[[layer]]` table against its kind's entry,
//! and the builder calls its `build` with the children already built.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::{BlockError, BoxFuture, ByteSize, DeviceRef, Result, Runtime};

pub use crate::layer_config::{field_names, options_from_table, to_table, OptionsError};

/// How many children a kind takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildCount {
    Exactly(usize),
    AtLeast(usize),
}

impl ChildCount {
    pub fn allows(self, n: usize) -> bool {
        match self {
            ChildCount::Exactly(k) => n == k,
            ChildCount::AtLeast(k) => n >= k,
        }
    }

    pub fn describe(self) -> String {
        match self {
            ChildCount::Exactly(1) => "exactly 1 child".into(),
            ChildCount::Exactly(k) => format!("exactly {k} children"),
            ChildCount::AtLeast(k) => format!("at least {k} children"),
        }
    }
}

/// An option value as the configuration gave it.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionValue {
    Text(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
}

/// A layer's options as the configuration gave them. A kind reads them once, into its typed
/// config struct ([`Options::parse`]); the per-key accessors (`size`, `u64`, `bool`, `text`)
/// remain for the thin pool's build until it declares a struct too.
#[derive(Clone, Debug, Default)]
pub struct Options {
    values: BTreeMap<String, OptionValue>,
    /// Folder that relative paths (key files) resolve against.
    pub base: PathBuf,
}

fn bad(key: &str, what: impl std::fmt::Display) -> BlockError {
    BlockError::InvalidArgument(format!("field `{key}`: {what}"))
}

impl Options {
    pub fn new(values: BTreeMap<String, OptionValue>, base: PathBuf) -> Self {
        Options { values, base }
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    pub fn get(&self, key: &str) -> Option<&OptionValue> {
        self.values.get(key)
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &OptionValue)> {
        self.values.iter().map(|(key, value)| (key.as_str(), value))
    }

    /// The options as a kind's typed configuration `T` (a serde struct with
    /// `deny_unknown_fields`). Errors name the field: "field `chunk`: …".
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        crate::layer_config::parse(self).map_err(|e| BlockError::InvalidArgument(e.message))
    }

    /// A size: `"64KiB"` or a number of bytes.
    pub fn size(&self, key: &str) -> Result<Option<u64>> {
        match self.values.get(key) {
            None => Ok(None),
            Some(OptionValue::Integer(n)) if *n >= 0 => Ok(Some(*n as u64)),
            Some(OptionValue::Text(text)) => ByteSize::parse(text)
                .map(|s| Some(s.0))
                .map_err(|e| bad(key, e)),
            Some(other) => Err(bad(
                key,
                format!("{other:?} is not a size such as \"64KiB\""),
            )),
        }
    }

    pub fn u64(&self, key: &str) -> Result<Option<u64>> {
        match self.values.get(key) {
            None => Ok(None),
            Some(OptionValue::Integer(n)) if *n >= 0 => Ok(Some(*n as u64)),
            Some(other) => Err(bad(key, format!("{other:?} is not a non-negative integer"))),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.values.get(key) {
            None => Ok(None),
            Some(OptionValue::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(bad(key, format!("{other:?} is not true or false"))),
        }
    }

    pub fn text(&self, key: &str) -> Result<Option<String>> {
        match self.values.get(key) {
            None => Ok(None),
            Some(OptionValue::Text(text)) => Ok(Some(text.clone())),
            Some(other) => Err(bad(key, format!("{other:?} is not a string"))),
        }
    }
}

/// What the server lets a stateful layer do at this start. Both default to the careful answer:
/// no formatting, no start with members missing that the layer's metadata counts as in sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StartPolicy {
    /// Every disk under the layer was blank and unlabelled before this start (or the
    /// operator asked for a format): the layer may format metadata regions that are all
    /// zeros. Damaged metadata is never formatted over, whatever this says.
    pub may_format: bool,
    /// The operator asked to start degraded (`strata serve --degraded`): members missing that
    /// the metadata records as in sync may be treated as failed.
    pub allow_degraded: bool,
}

impl StartPolicy {
    /// A fresh stack on blank devices that may come up with members missing: what tests and
    /// the simulator build.
    pub const FRESH: StartPolicy = StartPolicy {
        may_format: true,
        allow_degraded: true,
    };
}

/// What a layer's constructor gets.
pub struct LayerArgs {
    pub name: String,
    /// Children in configuration order, already built. `None` is a member missing at
    /// assembly, allowed only up to the kind's `tolerates_missing`.
    pub children: Vec<Option<DeviceRef>>,
    pub child_names: Vec<String>,
    pub options: Options,
    pub runtime: Arc<dyn Runtime>,
    pub start: StartPolicy,
}

impl LayerArgs {
    /// All children, or an error naming the missing one (for kinds that tolerate none).
    pub fn all_children(&self) -> Result<Vec<DeviceRef>> {
        self.children
            .iter()
            .zip(&self.child_names)
            .map(|(child, name)| {
                child.clone().ok_or_else(|| {
                    BlockError::InvalidArgument(format!(
                        "layer {}: member {name} is missing",
                        self.name
                    ))
                })
            })
            .collect()
    }
}

/// Builds a layer's device from its children. A kind whose devices are made by control verbs
/// (a thin pool and its volumes) builds a node device that is not exported itself (size 0)
/// and answers [`crate::Control::Volumes`], `Volume` and `CreateVolume`: the stack then
/// names its devices `layer/volume`.
pub type Build = fn(LayerArgs) -> BoxFuture<'static, Result<DeviceRef>>;

/// What a verb's argument is, for its help and the CLI's parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// A member of the layer: its name or its index among the children.
    Member,
    /// A disk path (a file, created sparse, or a block device).
    Path,
    /// A size such as "8GiB".
    Size,
    /// A name (of a volume, of a new disk).
    Name,
    /// An on/off switch.
    Flag,
}

/// One argument of a [`Verb`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    pub name: &'static str,
    pub kind: ArgKind,
    pub help: &'static str,
    /// May be left out (a flag always may: it is then off).
    pub optional: bool,
}

/// An online change a kind handles, as the admin socket and `strata kinds` name it. A verb
/// sent to a layer whose kind does not declare it goes down to the child that does (a
/// filter over a mirror passes `fail-member` to the mirror).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verb {
    pub name: &'static str,
    pub args: &'static [Arg],
    pub help: &'static str,
}

impl Verb {
    /// "fail-member MEMBER": the name and its arguments, for help lines.
    pub fn usage(&self) -> String {
        let mut usage = self.name.to_string();
        for arg in self.args {
            usage.push(' ');
            let name = arg.name.to_uppercase();
            if arg.optional || arg.kind == ArgKind::Flag {
                usage.push_str(&format!("[{name}]"));
            } else {
                usage.push_str(&name);
            }
        }
        usage
    }

    /// The arguments of a call, as `name=value` pairs from the command line, checked against
    /// this declaration and typed: sizes in bytes (`"64KiB"` → 65536), flags as booleans
    /// (given bare, `name`, or `name=true|false`), everything else as text. Refused, naming
    /// the argument, when one is unknown, given twice, malformed or missing.
    pub fn arguments(
        &self,
        given: &[(String, Option<String>)],
    ) -> std::result::Result<toml::Table, String> {
        let mut table = toml::Table::new();
        for (name, value) in given {
            let Some(arg) = self.args.iter().find(|arg| arg.name == name) else {
                let known: Vec<&str> = self.args.iter().map(|arg| arg.name).collect();
                return Err(format!(
                    "{} has no argument {name:?} (its arguments: {})",
                    self.name,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ));
            };
            if table.contains_key(name.as_str()) {
                return Err(format!("argument {name:?} is given twice"));
            }
            let typed = match (arg.kind, value.as_deref()) {
                (ArgKind::Flag, None | Some("true")) => toml::Value::Boolean(true),
                (ArgKind::Flag, Some("false")) => toml::Value::Boolean(false),
                (ArgKind::Flag, Some(other)) => {
                    return Err(format!(
                        "argument {name:?} is a flag: true or false, not {other:?}"
                    ))
                }
                (_, None) => return Err(format!("argument {name:?} needs a value ({name}=…)")),
                (ArgKind::Size, Some(text)) => {
                    let bytes = ByteSize::parse(text)
                        .map_err(|e| format!("argument {name:?}: {e}"))?
                        .0;
                    let bytes = i64::try_from(bytes)
                        .map_err(|_| format!("argument {name:?}: {text} is too large"))?;
                    toml::Value::Integer(bytes)
                }
                (ArgKind::Name | ArgKind::Member | ArgKind::Path, Some(text)) => {
                    if text.is_empty() {
                        return Err(format!("argument {name:?} is empty"));
                    }
                    toml::Value::String(text.to_string())
                }
            };
            table.insert(name.clone(), typed);
        }
        for arg in self.args {
            if arg.kind == ArgKind::Flag {
                table.entry(arg.name).or_insert(toml::Value::Boolean(false));
            } else if !arg.optional && !table.contains_key(arg.name) {
                return Err(format!(
                    "{} needs the argument {:?}: {}",
                    self.name, arg.name, arg.help
                ));
            }
        }
        Ok(table)
    }
}

/// The verbs several kinds share, declared once.
pub mod verbs {
    use super::{Arg, ArgKind, Verb};

    const MEMBER: Arg = Arg {
        name: "member",
        kind: ArgKind::Member,
        help: "the member: its name or its index among the layer's children",
        optional: false,
    };
    const PATH: Arg = Arg {
        name: "path",
        kind: ArgKind::Path,
        help: "the new disk (a file, created sparse, or a block device)",
        optional: false,
    };
    const DISK_NAME: Arg = Arg {
        name: "name",
        kind: ArgKind::Name,
        help: "name of the new disk (default: the file's stem)",
        optional: true,
    };

    pub const REPLACE: Verb = Verb {
        name: "replace",
        args: &[MEMBER, PATH, DISK_NAME],
        help: "put a new disk in the place of a member, online; the layer rebuilds onto it",
    };
    pub const ADD_MEMBER: Verb = Verb {
        name: "add-member",
        args: &[PATH, DISK_NAME],
        help: "add a new disk as a member, online",
    };
    pub const GROW_MEMBERS: Verb = Verb {
        name: "grow-members",
        args: &[
            Arg {
                name: "path",
                kind: ArgKind::Path,
                help: "the new disks (one or more)",
                optional: false,
            },
            Arg {
                name: "policy",
                kind: ArgKind::Name,
                help: "how the data move: alv (default) or md (md's reshape, the baseline)",
                optional: true,
            },
            Arg {
                name: "on-failure",
                kind: ArgKind::Name,
                help: "with a member failed: continue (default, degraded) or wait (for its replacement)",
                optional: true,
            },
        ],
        help: "add disks and spread the data over them all, online (the size grows at the end)",
    };
    pub const FAIL_MEMBER: Verb = Verb {
        name: "fail-member",
        args: &[MEMBER],
        help: "stop using a member, as if it had failed",
    };
    pub const GROW: Verb = Verb {
        name: "grow",
        args: &[Arg {
            name: "size",
            kind: ArgKind::Size,
            help: "the new size, e.g. 8GiB",
            optional: false,
        }],
        help: "grow the layer to a new size, online",
    };
}

/// The verb that makes a kind's devices (a node whose devices are made by verbs declares it).
pub const CREATE_VOLUME: &str = "volume-create";

/// One kind of layer.
pub struct LayerKind {
    pub kind: &'static str,
    pub about: &'static str,
    pub children: ChildCount,
    /// The option names a `[[layer]]` table of this kind may use: its config struct's fields
    /// (`field_names::<Config>`).
    pub options: fn() -> &'static [&'static str],
    /// Checks a table's options against the kind's config struct without building
    /// (`check::<Config>`): what the loader runs on every `[[layer]]`.
    pub check: fn(&Options) -> Result<()>,
    /// The options read into the kind's config struct and written back as a table
    /// (`normalize::<Config>`): sizes in one spelling, serde defaults filled in. A running
    /// layer's `describe` reports at least this (it may also make explicit defaults that are
    /// decided at build, such as raid5's chunk).
    pub normalize: fn(&Options) -> Result<toml::Table>,
    /// Members that may be missing when the hierarchy is assembled (1 for raid5, n-1 for a
    /// mirror, 0 for most).
    pub tolerates_missing: fn(children: usize) -> usize,
    /// The online changes this kind handles (see [`Verb`]).
    pub verbs: &'static [Verb],
    pub build: Build,
}

impl LayerKind {
    /// A kind whose `[[layer]]` options are the config struct `C` and that tolerates no
    /// missing member; `about` and `tolerating` fill in the rest.
    pub const fn new<C: serde::de::DeserializeOwned + serde::Serialize + 'static>(
        kind: &'static str,
        children: ChildCount,
        build: Build,
    ) -> LayerKind {
        LayerKind {
            kind,
            about: "",
            children,
            options: field_names::<C>,
            check: check::<C>,
            normalize: normalize::<C>,
            tolerates_missing: none_missing,
            verbs: &[],
            build,
        }
    }

    /// The online changes the kind handles.
    pub const fn verbs(self, verbs: &'static [Verb]) -> LayerKind {
        LayerKind { verbs, ..self }
    }

    /// A check of the options beyond their types (an extent size's rule), run by the loader
    /// in place of the plain parse.
    pub const fn checked(self, check: fn(&Options) -> Result<()>) -> LayerKind {
        LayerKind { check, ..self }
    }

    pub fn verb(&self, name: &str) -> Option<&'static Verb> {
        self.verbs.iter().find(|verb| verb.name == name)
    }

    /// Whether the kind's devices are made by verbs (its node is not a device to export).
    pub fn makes_volumes(&self) -> bool {
        self.verb(CREATE_VOLUME).is_some()
    }

    /// The one-line description `strata kinds` shows.
    pub const fn about(self, about: &'static str) -> LayerKind {
        LayerKind { about, ..self }
    }

    /// Members that may be missing at assembly, as a function of how many there are.
    pub const fn tolerating(self, missing: fn(children: usize) -> usize) -> LayerKind {
        LayerKind {
            tolerates_missing: missing,
            ..self
        }
    }
}

/// A kind shows as its name (its entry is functions).
impl std::fmt::Debug for LayerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LayerKind({})", self.kind)
    }
}

pub fn none_missing(_: usize) -> usize {
    0
}

/// A kind's [`LayerKind::check`]: the options parse as its config `T`.
pub fn check<T: DeserializeOwned>(options: &Options) -> Result<()> {
    options.parse::<T>().map(drop)
}

/// A kind's [`LayerKind::normalize`]: the options parsed as its config `T`, as a table.
pub fn normalize<T: DeserializeOwned + serde::Serialize>(options: &Options) -> Result<toml::Table> {
    let config: T = options.parse()?;
    to_table(&config).ok_or_else(|| {
        BlockError::InvalidArgument("the options hold a value TOML cannot carry".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Default, PartialEq, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
    struct ChunkAndCount {
        chunk: Option<ByteSize>,
        count: u64,
    }

    fn options(pairs: &[(&str, OptionValue)]) -> Options {
        let values = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        Options::new(values, PathBuf::new())
    }

    const TAKE: Verb = Verb {
        name: "take",
        args: &[
            Arg {
                name: "volume",
                kind: ArgKind::Name,
                help: "the volume",
                optional: false,
            },
            Arg {
                name: "label",
                kind: ArgKind::Name,
                help: "a label",
                optional: true,
            },
            Arg {
                name: "size",
                kind: ArgKind::Size,
                help: "a size",
                optional: true,
            },
            Arg {
                name: "keep",
                kind: ArgKind::Flag,
                help: "a flag",
                optional: true,
            },
        ],
        help: "a verb for tests",
    };

    fn given(pairs: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    #[test]
    fn verb_arguments_are_typed_against_the_declaration() {
        let table = TAKE
            .arguments(&given(&[
                ("volume", Some("v")),
                ("size", Some("64KiB")),
                ("keep", None),
            ]))
            .unwrap();
        assert_eq!(table["volume"].as_str(), Some("v"));
        assert_eq!(table["size"].as_integer(), Some(65536));
        assert_eq!(table["keep"].as_bool(), Some(true));
        assert!(
            !table.contains_key("label"),
            "an optional name left out stays out"
        );
        let flags_default_off = TAKE.arguments(&given(&[("volume", Some("v"))])).unwrap();
        assert_eq!(flags_default_off["keep"].as_bool(), Some(false));
        assert_eq!(TAKE.usage(), "take VOLUME [LABEL] [SIZE] [KEEP]");
    }

    #[test]
    fn verb_arguments_refuse_what_the_declaration_does_not_allow() {
        let refused = |pairs: &[(&str, Option<&str>)]| TAKE.arguments(&given(pairs)).unwrap_err();
        assert!(refused(&[]).contains("needs the argument \"volume\""));
        assert!(refused(&[("volume", Some("v")), ("colour", Some("red"))])
            .contains("no argument \"colour\" (its arguments: volume, label, size, keep)"));
        assert!(refused(&[("volume", Some("v")), ("volume", Some("w"))]).contains("twice"));
        assert!(refused(&[("volume", Some("v")), ("size", Some("lots"))]).contains("\"size\""));
        assert!(refused(&[("volume", None)]).contains("needs a value"));
        assert!(refused(&[("volume", Some(""))]).contains("empty"));
        assert!(refused(&[("volume", Some("v")), ("keep", Some("maybe"))]).contains("flag"));
    }

    #[test]
    fn parse_reads_typed_structs_and_names_the_failing_field() {
        let parsed: ChunkAndCount = options(&[
            ("chunk", OptionValue::Text("64KiB".into())),
            ("count", OptionValue::Integer(3)),
        ])
        .parse()
        .unwrap();
        assert_eq!(
            parsed,
            ChunkAndCount {
                chunk: Some(ByteSize(64 << 10)),
                count: 3
            }
        );
        assert_eq!(
            options(&[]).parse::<ChunkAndCount>().unwrap(),
            ChunkAndCount::default()
        );
        for (pairs, field) in [
            (vec![("count", OptionValue::Text("3".into()))], "`count`"),
            (vec![("count", OptionValue::Integer(-1))], "`count`"),
            (vec![("chunk", OptionValue::Text("lots".into()))], "`chunk`"),
            (vec![("chunk", OptionValue::Bool(true))], "`chunk`"),
            (vec![("chunks", OptionValue::Integer(1))], "`chunks`"),
        ] {
            let error = options(&pairs)
                .parse::<ChunkAndCount>()
                .unwrap_err()
                .to_string();
            assert!(error.contains(&format!("field {field}: ")), "{error}");
        }
        assert_eq!(field_names::<ChunkAndCount>(), ["chunk", "count"]);
    }

    #[test]
    fn a_config_goes_to_a_table_and_back() {
        let config = ChunkAndCount {
            chunk: Some(ByteSize(3 << 20)),
            count: 7,
        };
        let table = to_table(&config).unwrap();
        assert_eq!(table["chunk"].as_str(), Some("3MiB"));
        let options = options_from_table(&table, PathBuf::new()).unwrap();
        assert_eq!(options.parse::<ChunkAndCount>().unwrap(), config);
    }

    #[test]
    fn options_are_typed_and_name_their_field() {
        let mut values = BTreeMap::new();
        values.insert("chunk".to_string(), OptionValue::Text("64KiB".into()));
        values.insert("count".to_string(), OptionValue::Integer(3));
        values.insert("on".to_string(), OptionValue::Text("yes".into()));
        let options = Options::new(values, PathBuf::from("/base"));
        assert_eq!(options.size("chunk").unwrap(), Some(64 << 10));
        assert_eq!(options.size("count").unwrap(), Some(3));
        assert_eq!(options.size("absent").unwrap(), None);
        let error = options.bool("on").unwrap_err().to_string();
        assert!(error.contains("`on`"), "{error}");
        let error = options.parse::<ChunkAndCount>().unwrap_err().to_string();
        assert!(
            error.contains("`on`") && error.contains("known: chunk, count"),
            "{error}"
        );
        assert!(ChildCount::AtLeast(2).allows(3));
        assert!(!ChildCount::Exactly(1).allows(2));
    }
}
