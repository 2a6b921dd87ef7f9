//! Round trips over whole stacks (issue 13): for random valid stacks on memory disks,
//! `config → build → describe → config` gives the same typed configs (defaults explicit), and
//! the stack assembled from the labels it wrote describes the same as the stack that wrote
//! them. Built with the stack library's own entry points: `config::load`, `build::build_on`,
//! `hierarchy::assemble`. Also: a label written by the code before labels came from
//! `describe()` still assembles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use strata_backend::MemoryDevice;
use strata_core::{DeviceRef, MetricsRegistry, TokioRuntime};
use strata_raid::raid5::journal::{device_bytes, least_bytes};
use strata_stack::build::{self, Disks, StartOptions};
use strata_stack::config::{self, Loaded};
use strata_stack::graph::options_table;
use strata_stack::hierarchy::{self, Running};
use strata_stack::registry::{self, Options};
use strata_thin::PoolConfig;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Disk sizes, in MiB. What building a stack costs grows with them: a raid5 zeroes its
/// members (encrypting the zeros when a crypt is below it), a mirror resyncs, a crypt encrypts
/// what is written through it. So the disks are small (which is what lets the property run on
/// thousands of stacks) but unequal, and large enough for every layer's defaults somewhere.
const DISK_MIB: (u64, u64) = (6, 16);

/// Every device the generator makes keeps at least this much: room for one more layer with
/// its smallest options (a raid5's 1 MiB record, a 1 MiB journal and a chunk; a thin pool's
/// 2 MiB of metadata and an extent).
const ROOM: u64 = 4 * MIB;

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

    /// One of `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next(high - low + 1)
    }

    fn one_of<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.next(items.len() as u64) as usize]
    }

    /// Sometimes one of `values`, sometimes none (the option left to its default).
    fn maybe(&mut self, values: &[&str]) -> Option<String> {
        (self.next(3) != 0).then(|| self.one_of(values).to_string())
    }

    fn take(&mut self, free: &mut Vec<Device>, count: usize) -> Vec<Device> {
        (0..count)
            .map(|_| free.remove(self.next(free.len() as u64) as usize))
            .collect()
    }
}

/// A device of the stack being generated and the least size it can have (sizes are followed
/// from the disks up by each kind's rule, rounding down wherever a kind may round).
#[derive(Clone, Debug)]
struct Device {
    name: String,
    size: u64,
}

/// `key = value` lines for the options given; nothing for those left to their defaults.
fn lines<const N: usize>(options: [(&str, Option<String>); N]) -> String {
    options
        .into_iter()
        .filter_map(|(key, value)| Some(format!("{key} = {}\n", value?)))
        .collect()
}

/// A size written the way a configuration might: bytes, or KiB/MiB when exact.
fn size_text(pick: &mut Picks, bytes: u64) -> String {
    match pick.next(3) {
        0 => bytes.to_string(),
        1 if bytes.is_multiple_of(MIB) => format!("\"{}MiB\"", bytes / MIB),
        _ if bytes.is_multiple_of(KIB) => format!("\"{}KiB\"", bytes / KIB),
        _ => format!("\"{bytes}\""),
    }
}

/// A size option from `choices` (bytes), or its default (None); in the text and in bytes.
fn size_option(pick: &mut Picks, choices: &[u64]) -> Option<(String, u64)> {
    let bytes = (pick.next(3) != 0).then(|| pick.one_of(choices))?;
    Some((size_text(pick, bytes), bytes))
}

/// The text of a size option picked by [`size_option`].
fn option_text(option: &Option<(String, u64)>) -> Option<String> {
    option.as_ref().map(|(text, _)| text.clone())
}

/// One layer of `kind` over `children`: its options and the least size it has.
fn layer(pick: &mut Picks, kind: &str, children: &[Device], key_dir: &Path) -> (String, u64) {
    let smallest = children.iter().map(|c| c.size).min().expect("children");
    let n = children.len() as u64;
    match kind {
        "slice" => {
            let mut offset = pick.next(16) * 64 * KIB;
            if smallest - offset < ROOM {
                offset = 0;
            }
            let room = smallest - offset;
            let length = (pick.next(2) == 0)
                .then(|| ROOM + pick.next((room - ROOM) / (64 * KIB) + 1) * 64 * KIB);
            let text = lines([
                ("offset", Some(size_text(pick, offset))),
                ("length", length.map(|l| size_text(pick, l))),
            ]);
            (text, length.unwrap_or(room))
        }
        "concat" => (
            String::new(),
            children.iter().map(|c| c.size / 4096 * 4096).sum(),
        ),
        "crypt" => {
            let key = if pick.next(2) == 0 {
                "\"keys/enc.key\"".to_string()
            } else {
                format!("{:?}", key_dir.join("keys/enc.key").display().to_string())
            };
            let sector = pick.maybe(&["512", "4096", "\"4KiB\"", "\"512B\""]);
            let text = lines([("key-file", Some(key)), ("sector-size", sector)]);
            (text, smallest / 4096 * 4096)
        }
        "delay" => {
            let durations = [
                "\"0s\"",
                "\"0\"",
                "\"10us\"",
                "\"1us\"",
                "\"2.5us\"",
                "\"0.001ms\"",
                "\"7ns\"",
            ];
            // Bandwidths high enough that the writes a build makes are not slowed much.
            let bandwidths = ["\"8GiB\"", "\"16GiB/s\"", "8589934592", "\"10000000000\""];
            // A round trip costs every request milliseconds of real time: one stack in ten.
            let rtt =
                (pick.next(10) == 0).then(|| pick.one_of(&["\"9ms\"", "\"25ms\""]).to_string());
            let text = lines([
                ("read-latency", pick.maybe(&durations)),
                ("write-latency", pick.maybe(&durations)),
                ("bandwidth", pick.maybe(&bandwidths)),
                ("rtt", rtt),
                ("seed", pick.maybe(&["1", "42"])),
            ]);
            (text, smallest)
        }
        "hdd" => {
            // Every preset holds far more than any disk here (6-16 MiB).
            let models = [
                "\"wd-re3-1t\"",
                "\"wd-re3-1t-order-quirk\"",
                "\"cheetah-15k5-300g\"",
                "\"fc-10k-146g\"",
            ];
            let text = lines([
                ("model", Some(pick.one_of(&models).to_string())),
                ("queue-depth", pick.maybe(&["1", "4", "8", "32"])),
                ("scheduler", pick.maybe(&["\"sptf\"", "\"fifo\""])),
                ("seed", pick.maybe(&["0", "1", "987654321"])),
            ]);
            (text, smallest)
        }
        "count" => (String::new(), smallest),
        "fault" => {
            // Ranges past the end of any device here: written and read back, never hit.
            let ranges = [
                "\"\"",
                "\"1TiB+4KiB\"",
                "\"2TiB+1MiB, 1TiB+512\"",
                "\"4294967296+65536\"",
            ];
            let text = lines([
                ("seed", pick.maybe(&["0", "7", "123456789"])),
                ("error-rate", pick.maybe(&["0.0", "0"])),
                ("fail-read", pick.maybe(&ranges)),
                ("fail-write", pick.maybe(&ranges)),
            ]);
            (text, smallest)
        }
        "stripe" => {
            let chunk = size_option(pick, &[4 * KIB, 64 * KIB, MIB]);
            let bytes = chunk.as_ref().map_or(64 * KIB, |c| c.1);
            (
                lines([("chunk", option_text(&chunk))]),
                n * (smallest / bytes * bytes),
            )
        }
        "mirror" => {
            let metadata = size_option(pick, &[64 * KIB, 256 * KIB, MIB, 4 * MIB]);
            let reserved = metadata.as_ref().map_or(4 * MIB, |m| m.1);
            let text = lines([
                ("resync-concurrency", pick.maybe(&["0", "1", "4", "16"])),
                ("bitmap-clear-ms", pick.maybe(&["0", "1", "500", "5000"])),
                (
                    "region",
                    option_text(&size_option(pick, &[64 * KIB, MIB, 64 * MIB])),
                ),
                ("metadata-size", option_text(&metadata)),
            ]);
            (text, smallest.saturating_sub(reserved) / 4096 * 4096)
        }
        "raid5" => {
            let chunk = size_option(pick, &[4 * KIB, 16 * KIB, 64 * KIB]);
            let chunk_bytes = chunk.as_ref().map_or(64 * KIB, |c| c.1);
            let journal = size_option(pick, &[MIB, 2 * MIB, 4 * MIB]);
            // Sometimes the last child holds every member's journal, when it has room (the
            // room checked for the journal as configured or, by default, at least 4 MiB).
            let last = &children[children.len() - 1];
            let journal_device = (n >= 4
                && pick.next(2) == 0
                && last.size
                    >= device_bytes(n as usize - 1, journal.as_ref().map_or(4 * MIB, |j| j.1)))
            .then(|| format!("\"{}\"", last.name));
            let members = if journal_device.is_some() { n - 1 } else { n };
            let least = least_bytes(members * chunk_bytes + 4096);
            let journal_bytes = journal.as_ref().map_or(least.max(4 * MIB), |j| j.1);
            assert!(journal_bytes >= least, "{journal_bytes} < {least}");
            let smallest = children[..members as usize]
                .iter()
                .map(|c| c.size)
                .min()
                .unwrap();
            let data_start =
                (strata_raid::raid5::META_BYTES + journal_bytes).next_multiple_of(chunk_bytes);
            let stripes = smallest.saturating_sub(data_start) / chunk_bytes;
            let text = lines([
                ("chunk", option_text(&chunk)),
                ("journal", option_text(&journal)),
                ("journal-device", journal_device),
            ]);
            (text, (members - 1) * stripes * chunk_bytes)
        }
        "stage" => {
            // [fast, slow]: the fast child (at least ROOM) holds the metadata and the log.
            let range = size_option(pick, &[64 * KIB, MIB]);
            let range_bytes = range.as_ref().map_or(MIB, |r| r.1);
            let extent = (pick.next(3) != 0).then(|| {
                let bytes = range_bytes * pick.one_of(&[1, 4, 16]);
                size_text(pick, bytes)
            });
            let high = pick.between(21, 100); // above the default low (20)
            let text = lines([
                (
                    "threshold",
                    pick.maybe(&["\"32KiB\"", "\"168KiB\"", "65536"]),
                ),
                ("range", option_text(&range)),
                ("extent", extent),
                ("window", pick.maybe(&["0", "8", "100"])),
                (
                    "trigger",
                    pick.maybe(&["\"full\"", "\"watermark\"", "\"density\""]),
                ),
                ("high", (pick.next(3) != 0).then(|| high.to_string())),
                (
                    "low",
                    (pick.next(3) != 0).then(|| pick.next(high.min(20)).to_string()),
                ),
                ("density", pick.maybe(&["1", "8", "64"])),
                ("destage-depth", pick.maybe(&["1", "8"])),
                (
                    "metadata-size",
                    option_text(&size_option(pick, &[MIB, 2 * MIB])),
                ),
            ]);
            (text, children[1].size / range_bytes * range_bytes)
        }
        "migrate" => {
            // Child 0 holds the metadata (1 MiB here unless configured); every whole chunk
            // after it, and of the other children, is a slot; an eighth of them is spare.
            let chunk = size_option(pick, &[16 * KIB, 128 * KIB, 256 * KIB]);
            let chunk_bytes = chunk.as_ref().map_or(128 * KIB, |c| c.1);
            let metadata = size_option(pick, &[MIB, 2 * MIB]);
            let metadata_bytes = metadata.as_ref().map_or(MIB, |m| m.1);
            let slots: u64 = children
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let start = if i == 0 { metadata_bytes } else { 0 };
                    c.size.saturating_sub(start) / chunk_bytes
                })
                .sum();
            let text = lines([
                ("allocation", pick.maybe(&["\"str\"", "\"seq\""])),
                (
                    "policy",
                    pick.maybe(&["\"mig\"", "\"nomig\"", "\"locality\""]),
                ),
                (
                    "delta",
                    pick.maybe(&["\"adaptive\"", "\"pair\"", "\"0\"", "\"5ms\""]),
                ),
                ("smoothing", pick.maybe(&["\"10s\"", "\"250ms\""])),
                ("tokens", pick.maybe(&["0", "4", "100"])),
                ("token-cap", pick.maybe(&["1", "8"])),
                ("chunk", option_text(&chunk)),
                ("candidate-probability", pick.maybe(&["0.05", "1.0", "0.0"])),
                ("candidates", pick.maybe(&["1", "4096"])),
                (
                    "merge-interval",
                    pick.maybe(&["\"0\"", "\"1s\"", "\"250ms\""]),
                ),
                ("seed", pick.maybe(&["0", "42"])),
                ("metadata-size", option_text(&metadata)),
            ]);
            (text, (slots - slots.div_ceil(8).max(1)) * chunk_bytes)
        }
        other => unreachable!("{other}"),
    }
}

/// A thin pool's options over a device of at least `size` bytes, if they fit: the metadata
/// (as configured, or the pool's guess: 1 or 2 MiB on these sizes) and one extent.
fn thin_pool(pick: &mut Picks, size: u64) -> Option<String> {
    let extent = size_option(pick, &[64 * KIB, 128 * KIB, MIB]);
    let extent_bytes = extent.as_ref().map_or(512 * KIB, |e| e.1);
    let metadata = size_option(pick, &[MIB, 1536 * KIB, 2 * MIB]);
    let metadata_bytes = metadata
        .as_ref()
        .map_or(2 * MIB, |m| m.1.next_multiple_of(MIB));
    if size < metadata_bytes.next_multiple_of(extent_bytes) + extent_bytes {
        return None;
    }
    let when_full = pick.maybe(&["\"fail\"", "\"wait\""]);
    let full_wait = if when_full.as_deref() == Some("\"wait\"") {
        pick.maybe(&["\"30s\"", "\"1.5s\"", "\"250ms\""])
    } else {
        None
    };
    // A reserve for versions comes with its policy (the pool describes both once set).
    let snapshot_reserve = pick.maybe(&["\"10%\"", "\"2.5%\"", "\"1MiB\""]);
    let when_reserve_low = snapshot_reserve.as_ref().map(|_| {
        pick.one_of(&["\"refuse\"", "\"delete-oldest\""])
            .to_string()
    });
    Some(lines([
        ("extent", option_text(&extent)),
        ("metadata-size", option_text(&metadata)),
        ("low-water", pick.maybe(&["\"75%\"", "\"92.5%\""])),
        ("map-commit", pick.maybe(&["\"batched\"", "\"extent\""])),
        ("commit-interval-ms", pick.maybe(&["1", "100", "5000"])),
        ("start-mid", pick.maybe(&["true", "false"])),
        ("when-full", when_full),
        ("full-wait", full_wait),
        ("snapshot-write", pick.maybe(&["\"remap\"", "\"copy\""])),
        ("snapshot-reserve", snapshot_reserve),
        ("when-reserve-low", when_reserve_low),
    ]))
}

/// A random valid stack: the sizes of its memory disks and its configuration.
struct Generated {
    disks: Vec<u64>,
    text: String,
}

/// A random valid configuration over `disks` memory disks of random sizes: kinds from the
/// registry stacked legally (each device under at most one layer), random valid options
/// (each device keeping at least [`ROOM`]), sometimes a thin pool on top, one export.
fn random_config(seed: u64, disks: usize, key_dir: &Path) -> Generated {
    let mut pick = Picks(seed);
    let mut text = String::from("listen = [\"unix:nbd.sock\"]\n");
    let sizes: Vec<u64> = (0..disks)
        .map(|_| pick.between(DISK_MIB.0, DISK_MIB.1) * MIB)
        .collect();
    let mut free: Vec<Device> = sizes
        .iter()
        .enumerate()
        .map(|(i, size)| Device {
            name: format!("d{i}"),
            size: size - hierarchy::LABEL_BYTES,
        })
        .collect();
    for device in &free {
        let name = &device.name;
        text.push_str(&format!(
            "[[disk]]\nname = \"{name}\"\npath = \"{name}.img\"\n"
        ));
    }
    let layers = 1 + pick.next(4);
    let mut top = free[0].clone();
    for index in 0..layers {
        let name = format!("l{index}");
        // A few tries at a layer that leaves room for the next; then one that takes none.
        let (kind, children, options, size) = (0..4)
            .find_map(|_| {
                let mut kinds = vec!["slice", "concat", "count", "crypt", "delay", "hdd", "fault"];
                if free.len() >= 2 {
                    kinds.extend(["stripe", "mirror", "stage", "migrate"]);
                }
                if free.len() >= 3 {
                    kinds.push("raid5");
                }
                let mut kind = pick.one_of(&kinds);
                // An `hdd` waits in real time for its modelled drive (milliseconds a
                // request): stacks with one took five times as long to round-trip as the
                // others (100 ms against 20), so it is kept one time in six.
                if kind == "hdd" && pick.next(6) != 0 {
                    kinds.retain(|&k| k != "hdd");
                    kind = pick.one_of(&kinds);
                }
                let count = match kind {
                    "concat" => 1 + pick.next(free.len() as u64) as usize,
                    "stripe" => 2 + pick.next(free.len() as u64 - 1) as usize,
                    "mirror" => 2 + pick.next(free.len().min(3) as u64 - 1) as usize,
                    "stage" => 2,
                    "migrate" => 2 + pick.next(free.len().min(3) as u64 - 1) as usize,
                    "raid5" => 3 + pick.next(free.len().min(5) as u64 - 2) as usize,
                    _ => 1,
                };
                let mut left = free.clone();
                let children = pick.take(&mut left, count);
                let (options, size) = layer(&mut pick, kind, &children, key_dir);
                (size >= ROOM).then(|| {
                    free = left;
                    (kind, children, options, size)
                })
            })
            .unwrap_or_else(|| {
                let children = pick.take(&mut free, 1);
                let size = children[0].size;
                ("delay", children, String::new(), size)
            });
        let quoted: Vec<String> = children.iter().map(|c| format!("\"{}\"", c.name)).collect();
        text.push_str(&format!(
            "[[layer]]\nname = \"{name}\"\nkind = \"{kind}\"\nchildren = [{}]\n{options}",
            quoted.join(", ")
        ));
        top = Device { name, size };
        free.push(top.clone());
    }
    let mut export = top.name.clone();
    if pick.next(3) == 0 {
        if let Some(options) = thin_pool(&mut pick, top.size) {
            text.push_str(&format!(
                "[[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"{}\"]\n\
                 {options}volumes = [{{ name = \"v\", size = \"1MiB\" }}]\n",
                top.name
            ));
            export = "pool/v".into();
        }
    }
    text.push_str(&format!(
        "[[export]]\nname = \"e\"\ndevice = \"{export}\"\n"
    ));
    Generated { disks: sizes, text }
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

async fn round_trip(stack: &Generated, data_dir: &Path) {
    let Generated { disks: sizes, text } = stack;
    let loaded = config::load(text, "random.toml", data_dir, Some(data_dir))
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let disks: BTreeMap<String, DeviceRef> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            (
                format!("d{i}"),
                Arc::new(MemoryDevice::new(size)) as DeviceRef,
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
        if !["raid5", "slice", "stage", "migrate"].contains(&layer.kind.as_str()) {
            // raid5 decides its chunk and journal at build, a slice its length (to the end
            // of its child), a stage and a migrate layer their metadata size (from their
            // children's sizes); every other default is the struct's, so nothing may be added.
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

/// Runs the round trip of `stack` in a data folder of its own, on a runtime of its own.
fn check(stack: impl FnOnce(&Path) -> Generated) {
    let dir = data_dir();
    let stack = stack(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(round_trip(&stack, dir.path()));
}

/// Stacks per run: `PROPTEST_CASES` if set (for longer runs locally), else 3000 (each stack
/// is built twice, from its configuration and from its labels).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(3000)
}

// One property in two tests of half the cases each, so that the harness runs them on two
// threads (a stack takes about as long whatever its number of disks).
proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases() / 2))]

    #[test]
    fn stacks_round_trip_through_describe_and_their_labels(seed: u64, disks in 2usize..=6) {
        check(|dir| random_config(seed, disks, dir));
    }

    #[test]
    fn more_stacks_round_trip_through_describe_and_their_labels(seed: u64, disks in 2usize..=6) {
        check(|dir| random_config(seed, disks, dir));
    }
}

/// The generator reaches every kind of the registry and every option of each kind, so the
/// property covers them all (the text only: nothing is built).
#[test]
fn the_generator_reaches_every_kind_and_option() {
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for seed in 0..3000u64 {
        let generated = random_config(seed, 2 + (seed % 5) as usize, Path::new("/srv/strata"));
        let doc: toml::Table = toml::from_str(&generated.text).unwrap();
        for layer in doc["layer"].as_array().unwrap() {
            let layer = layer.as_table().unwrap();
            let options = seen
                .entry(layer["kind"].as_str().unwrap().to_string())
                .or_default();
            let graph = ["name", "kind", "children", "volumes"];
            options.extend(
                layer
                    .keys()
                    .filter(|k| !graph.contains(&k.as_str()))
                    .cloned(),
            );
        }
    }
    for kind in registry::KINDS {
        let options = seen
            .get(kind.kind)
            .unwrap_or_else(|| panic!("no layer of kind {} generated", kind.kind));
        for option in (kind.options)() {
            assert!(
                options.contains(*option),
                "{}: `{option}` never generated",
                kind.kind
            );
        }
    }
}

/// Found by the generator once it wrote `resync-concurrency = 0`: the mirror ran with 1
/// ("0 counts as 1") and described 1, so the configuration did not come back as given.
#[test]
fn a_mirror_describes_the_resync_concurrency_it_was_given() {
    check(|_| Generated {
        disks: vec![8 * MIB, 9 * MIB],
        text: "listen = [\"unix:nbd.sock\"]\n\
               [[disk]]\nname = \"d0\"\npath = \"d0.img\"\n\
               [[disk]]\nname = \"d1\"\npath = \"d1.img\"\n\
               [[layer]]\nname = \"m\"\nkind = \"mirror\"\nchildren = [\"d0\", \"d1\"]\n\
               resync-concurrency = 0\nmetadata-size = \"64KiB\"\n\
               [[export]]\nname = \"e\"\ndevice = \"m\"\n"
            .into(),
    });
}

/// A label written by the code before labels came from `describe()` (hand-rendered TOML, the
/// options as configured; `tests/fixtures/previous-label.toml`, from
/// `previous-label.source.toml` with the data folder /srv/strata) still assembles and builds,
/// and the labels the new code writes for it keep the same graph.
#[tokio::test]
async fn a_label_of_the_previous_writer_still_assembles() {
    let dir = data_dir();
    let fixture = include_str!("../fixtures/previous-label.toml")
        .replace("/srv/strata", &dir.path().display().to_string());
    let disks: BTreeMap<String, DeviceRef> = (0..4)
        .map(|i| {
            (
                format!("d{i}"),
                Arc::new(MemoryDevice::new(64 * MIB)) as DeviceRef,
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
