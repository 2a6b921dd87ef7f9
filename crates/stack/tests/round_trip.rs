//! Round trips over whole stacks (issue 13): for random valid stacks on memory disks,
//! `config → build → describe → config` gives the same typed configs (defaults explicit), and
//! the stack assembled from the labels it wrote describes the same as the stack that wrote
//! them. Built with the stack library's own entry points: `config::load`, `build::build_on`,
//! `hierarchy::assemble`. Also: a label written by the code before labels came from
//! `describe()` still assembles.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{DeviceRef, MetricsRegistry, TokioRuntime};
use strata_stack::build::{self, Disks, StartOptions};
use strata_stack::config::{self, Loaded};
use strata_stack::graph::options_table;
use strata_stack::hierarchy::{self, Running};
use strata_stack::registry::{self, Options};
use strata_thin::PoolConfig;

/// Memory disks are sparse: their size costs nothing until written.
const DISK_BYTES: u64 = 64 << 20;

/// splitmix64: proptest picks the seed (and shrinks it), this spreads it over the choices.
struct Picks(u64);

impl Picks {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % bound.max(1)
    }

    fn one_of<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.next(items.len() as u64) as usize]
    }

    /// Sometimes an option, sometimes left to its default.
    fn maybe(&mut self, key: &str, values: &[&str]) -> String {
        if self.next(3) == 0 {
            String::new()
        } else {
            format!("{key} = {}\n", self.one_of(values))
        }
    }

    fn take(&mut self, free: &mut Vec<String>, count: usize) -> Vec<String> {
        (0..count)
            .map(|_| free.remove(self.next(free.len() as u64) as usize))
            .collect()
    }
}

/// A random valid configuration over `disks` memory disks: kinds from the registry stacked
/// legally (each device under at most one layer), random valid options, sometimes a thin pool
/// on top. Returns the text and the name of the device exported.
fn random_config(seed: u64, disks: usize, key_dir: &Path) -> String {
    let mut pick = Picks(seed);
    let mut text = String::from("listen = [\"unix:nbd.sock\"]\n");
    let mut free: Vec<String> = (0..disks).map(|i| format!("d{i}")).collect();
    for name in &free {
        text.push_str(&format!(
            "[[disk]]\nname = \"{name}\"\npath = \"{name}.img\"\n"
        ));
    }
    let layers = 1 + pick.next(4);
    let mut top = String::new();
    for index in 0..layers {
        let mut kinds = vec!["slice", "concat", "crypt", "delay", "fault"];
        if free.len() >= 2 {
            kinds.extend(["stripe", "mirror"]);
        }
        if free.len() >= 3 {
            kinds.push("raid5");
        }
        let kind = pick.one_of(&kinds);
        let count = match kind {
            "concat" => 1 + pick.next(free.len() as u64) as usize,
            "stripe" => 2 + pick.next(free.len() as u64 - 1) as usize,
            "mirror" => 2 + pick.next(free.len().min(3) as u64 - 1) as usize,
            "raid5" => 3 + pick.next(free.len().min(4) as u64 - 2) as usize,
            _ => 1,
        };
        let children = pick.take(&mut free, count);
        let options = match kind {
            "slice" => {
                let offset = pick.next(16) * (64 << 10);
                // A slice of a layer runs to its end: layer sizes are not tracked here.
                let length = if children[0].starts_with('d') && pick.next(2) == 0 {
                    format!("length = \"{}MiB\"\n", 16 + pick.next(32))
                } else {
                    String::new()
                };
                format!("offset = \"{offset}\"\n{length}")
            }
            "concat" => String::new(),
            "crypt" => {
                let key = if pick.next(2) == 0 {
                    "\"keys/enc.key\"".to_string()
                } else {
                    format!("{:?}", key_dir.join("keys/enc.key").display().to_string())
                };
                let sector = pick.maybe("sector-size", &["512", "4096", "\"4KiB\""]);
                format!("key-file = {key}\n{sector}")
            }
            "delay" => {
                let read = pick.maybe("read-latency", &["\"0s\"", "\"10us\"", "\"1us\""]);
                let write = pick.maybe("write-latency", &["\"0s\"", "\"5us\""]);
                format!("{read}{write}")
            }
            "fault" => {
                let seed = pick.maybe("seed", &["0", "7", "123456789"]);
                let rate = pick.maybe("error-rate", &["0.0", "0"]);
                format!("{seed}{rate}")
            }
            "stripe" => pick.maybe("chunk", &["\"4KiB\"", "65536", "\"1MiB\""]),
            "mirror" => {
                let concurrency = pick.maybe("resync-concurrency", &["1", "4", "16"]);
                let clear = pick.maybe("bitmap-clear-ms", &["1", "500", "5000"]);
                format!("{concurrency}{clear}")
            }
            "raid5" => pick.maybe("chunk", &["\"4KiB\"", "\"16KiB\"", "65536"]),
            other => unreachable!("{other}"),
        };
        let name = format!("l{index}");
        let quoted: Vec<String> = children.iter().map(|c| format!("\"{c}\"")).collect();
        text.push_str(&format!(
            "[[layer]]\nname = \"{name}\"\nkind = \"{kind}\"\nchildren = [{}]\n{options}",
            quoted.join(", ")
        ));
        free.push(name.clone());
        top = name;
    }
    if pick.next(3) == 0 {
        let extent = pick.maybe("extent", &["\"64KiB\"", "\"128KiB\"", "\"1MiB\""]);
        let water = pick.maybe("low-water", &["\"75%\"", "\"92.5%\""]);
        let commit = pick.maybe("map-commit", &["\"batched\"", "\"extent\""]);
        text.push_str(&format!(
            "[[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"{top}\"]\n\
             {extent}{water}{commit}volumes = [{{ name = \"v\", size = \"1MiB\" }}]\n"
        ));
        top = "pool/v".into();
    }
    text.push_str(&format!("[[export]]\nname = \"e\"\ndevice = \"{top}\"\n"));
    text
}

/// `…-file` options resolved against the data folder, as a label records them: a stack
/// assembled from labels names its key file by the absolute path.
fn resolved(mut running: Running, data_dir: &Path) -> Running {
    for table in running.values_mut() {
        for (key, value) in table.iter_mut() {
            if let toml::Value::String(path) = value {
                if key.ends_with("-file") {
                    *path = data_dir.join(path.as_str()).display().to_string();
                }
            }
        }
    }
    running
}

/// The typed form of a layer's options as configured: the kind's config struct written
/// back, defaults filled in (for a thin pool, [`PoolConfig::explicit`]).
fn normalized(
    loaded: &Loaded,
    kind: &str,
    options: &BTreeMap<String, registry::OptionValue>,
) -> toml::Table {
    if kind == "thin-pool" {
        let config = PoolConfig::from_table(options_table(options)).unwrap();
        return toml::Table::try_from(config.explicit()).unwrap();
    }
    let kind = registry::find(kind).unwrap();
    (kind.normalize)(&Options::new(options.clone(), loaded.data_dir.clone())).unwrap()
}

fn normalized_table(loaded: &Loaded, kind: &str, table: &toml::Table) -> toml::Table {
    let options = strata_core::layer::options_from_table(table, loaded.data_dir.clone()).unwrap();
    let values = options
        .entries()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    normalized(loaded, kind, &values)
}

async fn build_on(loaded: &Loaded, disks: &BTreeMap<String, DeviceRef>) -> build::Stack {
    build::build_on(
        loaded,
        &Disks::Given(disks.clone()),
        &StartOptions::default(),
        TokioRuntime::current(),
        &MetricsRegistry::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", loaded.text))
}

async fn round_trip(seed: u64, disk_count: usize, data_dir: &Path) {
    let text = random_config(seed, disk_count, data_dir);
    let loaded = config::load(&text, "random.toml", data_dir, Some(data_dir))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let disks: BTreeMap<String, DeviceRef> = (0..disk_count)
        .map(|i| {
            (
                format!("d{i}"),
                Arc::new(MemoryDevice::new(DISK_BYTES)) as DeviceRef,
            )
        })
        .collect();
    let stack = build_on(&loaded, &disks).await;
    assert!(stack.refused.is_empty(), "{:?}\n{text}", stack.refused);
    let running = build::running_configs(&loaded, &stack.nodes).await;

    // config → build → describe → config: every layer describes its typed config; what the
    // configuration gave is in it unchanged (the rest are defaults made explicit), and it
    // reads back as itself.
    for layer in &loaded.layers {
        let described = running
            .get(&layer.name)
            .unwrap_or_else(|| panic!("{} describes no config\n{text}", layer.name));
        let given = normalized(&loaded, &layer.kind, &layer.options);
        for (key, value) in &given {
            assert_eq!(
                described.get(key),
                Some(value),
                "{}: `{key}`\n{text}",
                layer.name
            );
        }
        if !["raid5", "slice"].contains(&layer.kind.as_str()) {
            // raid5 decides its chunk and journal at build, a slice its length (to the end
            // of its child); every other default is the struct's, so nothing may be added.
            assert_eq!(described, &given, "{}\n{text}", layer.name);
        }
        assert_eq!(
            &normalized_table(&loaded, &layer.kind, described),
            described,
            "{}: its described config does not read back as itself\n{text}",
            layer.name
        );
    }
    for node in &stack.nodes {
        node.flush().await.unwrap();
    }
    let generation = stack.generation;
    drop(stack);

    // The labels it wrote assemble into a stack that describes the same.
    let mut found = Vec::new();
    for name in hierarchy::labelled_disks(&loaded) {
        let label = hierarchy::read_label(disks[&name].as_ref()).await.unwrap();
        assert!(label.is_some(), "{name} carries no label\n{text}");
        found.push((PathBuf::from(&name), label));
    }
    let assembly = hierarchy::assemble(found).unwrap();
    assert_eq!(assembly.label.generation, generation);
    let assembled_text = hierarchy::assembled_config(&assembly).unwrap();
    let assembled = config::load(&assembled_text, "assembled.toml", data_dir, Some(data_dir))
        .unwrap_or_else(|e| panic!("{e}\n{assembled_text}"));
    let graph = |loaded: &Loaded| -> Vec<(String, String, Vec<String>)> {
        let mut layers: Vec<_> = loaded
            .layers
            .iter()
            .map(|l| (l.name.clone(), l.kind.clone(), l.children.clone()))
            .collect();
        layers.sort();
        layers
    };
    assert_eq!(graph(&assembled), graph(&loaded), "{assembled_text}");
    let again = build_on(&assembled, &disks).await;
    assert!(
        again.refused.is_empty(),
        "{:?}\n{assembled_text}",
        again.refused
    );
    let described_again = build::running_configs(&assembled, &again.nodes).await;
    assert_eq!(
        resolved(described_again, data_dir),
        resolved(running, data_dir),
        "\n{text}\n{assembled_text}"
    );
    assert_eq!(
        again.generation, generation,
        "the assembled stack relabelled its disks: it describes itself differently"
    );
    for node in &again.nodes {
        node.flush().await.unwrap();
    }
}

fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("keys")).unwrap();
    let key: Vec<u8> = (0..64).collect();
    std::fs::write(dir.path().join("keys/enc.key"), key).unwrap();
    dir
}

// 300 stacks (each built twice: from the config and from its labels) take ~18 s in a debug
// build; PROPTEST_CASES does not override this, raise it here for a longer run.
proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn stacks_round_trip_through_describe_and_their_labels(seed: u64, disks in 2usize..=6) {
        let dir = data_dir();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(round_trip(seed, disks, dir.path()));
    }
}

/// A label written by the code before labels came from `describe()` (hand-rendered TOML, the
/// options as configured; `tests/fixtures/previous-label.toml`, from
/// `previous-label.source.toml` with the data folder /srv/strata) still assembles and builds,
/// and the labels the new code writes for it keep the same graph.
#[tokio::test]
async fn a_label_of_the_previous_writer_still_assembles() {
    let dir = data_dir();
    let fixture = include_str!("fixtures/previous-label.toml")
        .replace("/srv/strata", &dir.path().display().to_string());
    let disks: BTreeMap<String, DeviceRef> = (0..4)
        .map(|i| {
            (
                format!("d{i}"),
                Arc::new(MemoryDevice::new(DISK_BYTES)) as DeviceRef,
            )
        })
        .collect();
    let found = (0..4)
        .map(|i| {
            let label = hierarchy::Label {
                uuid: hierarchy::uuid_text([3; 16]),
                generation: 1,
                member: format!("d{i}"),
                hierarchy: fixture.clone(),
            };
            (PathBuf::from(format!("d{i}")), Some(label))
        })
        .collect();
    let assembly = hierarchy::assemble(found).unwrap();
    let text = hierarchy::assembled_config(&assembly).unwrap();
    let loaded = config::load(&text, "assembled.toml", dir.path(), Some(dir.path())).unwrap();
    let stack = build_on(&loaded, &disks).await;
    assert!(stack.refused.is_empty(), "{:?}", stack.refused);
    assert!(stack.exports.list().iter().any(|e| e.name == "e"), "{text}");
    let label = hierarchy::read_label(disks["d0"].as_ref())
        .await
        .unwrap()
        .unwrap();
    let written: toml::Table = toml::from_str(&label.hierarchy).unwrap();
    let previous: toml::Table = toml::from_str(&fixture).unwrap();
    for part in ["disk", "export"] {
        assert_eq!(written[part], previous[part], "{part}");
    }
    let layers = |doc: &toml::Table| -> Vec<(String, String)> {
        doc["layer"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l["name"].to_string(), l["children"].to_string()))
            .collect()
    };
    assert_eq!(layers(&written), layers(&previous));
    // The options it had are kept; the crypt's key file is still the absolute path.
    let crypt = &written["layer"].as_array().unwrap()[1];
    assert_eq!(
        crypt["key-file"].as_str(),
        Some(
            dir.path()
                .join("keys/enc.key")
                .display()
                .to_string()
                .as_str()
        )
    );
    let pool = &written["layer"].as_array().unwrap()[3];
    assert_eq!(pool["extent"].as_str(), Some("64KiB"));
    assert_eq!(
        pool["volumes"],
        previous["layer"].as_array().unwrap()[3]["volumes"]
    );
}
