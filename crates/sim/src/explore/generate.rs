//! A run's plan from its seed: a random valid hierarchy (disks, registry kinds stacked in any
//! legal way, random options, sometimes a thin pool with volumes on top) and a random list of
//! steps (bursts of client work, power cuts, crashes, member failures and returns, online
//! changes). The plan is data, so a failing run can be shrunk by dropping steps.
//!
//! Sizes are followed from the disks up by each kind's rule (rounding down wherever a kind
//! may round) so that every layer fits: each device keeps at least [`ROOM`] for whatever is
//! stacked on it.

use std::fmt;

use rand::RngExt;
use strata_raid::raid5::journal::{device_bytes, least_bytes};
use strata_raid::raid5::META_BYTES;
use strata_stack::hierarchy::LABEL_BYTES;

use crate::explore::rng::Picks;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Disk sizes, in MiB: small, so that building a stack (a raid5 zeroes its members, a mirror
/// resyncs) and checking every byte of it after each restart stay cheap, but unequal.
const DISK_MIB: (u64, u64) = (6, 14);

/// Every device the generator makes keeps at least this much: room for one more layer with
/// its smallest options (a raid5's 1 MiB record, a 1 MiB journal and a chunk; a thin pool's
/// 2 MiB of metadata and an extent).
const ROOM: u64 = 4 * MIB;

/// The kinds that keep data through a member's loss.
pub const REDUNDANT: [&str; 2] = ["mirror", "raid5"];

/// One layer of the hierarchy, as the plan knows it (the options are in the config text).
#[derive(Clone, Debug)]
pub struct LayerShape {
    pub name: String,
    pub kind: &'static str,
    pub children: Vec<String>,
    /// A raid5's journal device: the last child, which is not a member.
    pub journal_device: bool,
}

/// Something a client writes to: a layer device, or a thin pool's volume.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Device(String),
    Volume { pool: String, volume: String },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Device(name) => write!(f, "{name}"),
            Target::Volume { pool, volume } => write!(f, "{pool}/{volume}"),
        }
    }
}

/// A crash's kind: what the disks keep of their unflushed writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Power fails: any part of the caches lands, torn and reordered.
    Power,
    /// The process dies; the disks (the page cache) keep everything written.
    Process,
}

/// One step of a run.
#[derive(Clone, Debug)]
pub enum Step {
    /// Clients run `ops` operations in all, spread over `clients` concurrent clients per
    /// target, drawn from `seed`.
    Work { seed: u64, ops: u32, clients: u32 },
    /// Work as above, and a crash of `cut` about `after` disk writes into it; then the stack
    /// is reassembled from what the disks kept and every target checked.
    Crash {
        seed: u64,
        ops: u32,
        clients: u32,
        after: u32,
        cut: Cut,
    },
    /// A clean shutdown (flush, background work stopped) and a start from the labels.
    Restart,
    /// A clean shutdown and a start from a configuration assembled from the disks' labels
    /// alone (`strata serve --assemble`); then a restart from the configuration.
    Assemble,
    /// Disk `disk` (an index into the plan's disks, modulo those that may fail) is unplugged.
    FailDisk { disk: u32 },
    /// Every unplugged disk comes back, as it was when it went, at a restart.
    ReturnDisks,
    /// A restart with one unplugged disk back and every other member of its array missing:
    /// the array must not start (the operator did not say `--degraded`, and the disk is
    /// stale). Then a restart with all disks.
    StaleAlone { disk: u32 },
    /// An unplugged disk that is a member of a mirror or raid5 is replaced online by a new,
    /// blank disk (which takes its name): the array resyncs or rebuilds onto it.
    ReplaceDisk { disk: u32 },
    /// A disk's requests take `millis` longer for the next `requests` requests.
    LatencySpike {
        disk: u32,
        millis: u32,
        requests: u32,
    },
    /// A thin volume is made, named `v{id}`, of `mib` MiB.
    CreateVolume { id: u32, mib: u32 },
    /// The `nth` volume (modulo those there are) is deleted.
    DeleteVolume { nth: u32 },
    /// The `nth` volume is resized to `mib` MiB (shrinking discards past the end).
    ResizeVolume { nth: u32, mib: u32 },
    /// An online change that adds disks or room, through the server's change path (the
    /// config edited, new disks labelled, every label rewritten): a mirror's new leg, a
    /// concat's new tail, a raid5 grown onto `disks` (1 or 2) new disks, or a longer slice.
    Grow { pick: u32, disks: u32 },
}

impl Step {
    /// The event kind, for coverage and for the event list.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Work { .. } => "work",
            Step::Crash {
                cut: Cut::Power, ..
            } => "power-cut",
            Step::Crash {
                cut: Cut::Process, ..
            } => "process-crash",
            Step::Restart => "restart",
            Step::Assemble => "assemble",
            Step::FailDisk { .. } => "fail-disk",
            Step::ReturnDisks => "return-disks",
            Step::StaleAlone { .. } => "stale-alone",
            Step::ReplaceDisk { .. } => "replace-disk",
            Step::LatencySpike { .. } => "latency-spike",
            Step::CreateVolume { .. } => "volume-create",
            Step::DeleteVolume { .. } => "volume-delete",
            Step::ResizeVolume { .. } => "volume-resize",
            Step::Grow { .. } => "grow",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Work { ops, clients, .. } => {
                write!(f, "work: {ops} ops, {clients} clients per target")
            }
            Step::Crash {
                ops,
                clients,
                after,
                ..
            } => write!(
                f,
                "{}: {ops} ops, {clients} clients per target, about {after} disk writes in",
                self.kind()
            ),
            Step::FailDisk { disk } => write!(f, "fail-disk: pick {disk}"),
            Step::StaleAlone { disk } => write!(f, "stale-alone: pick {disk}"),
            Step::ReplaceDisk { disk } => write!(f, "replace-disk: pick {disk}"),
            Step::LatencySpike {
                disk,
                millis,
                requests,
            } => write!(
                f,
                "latency-spike: pick {disk}, +{millis} ms for {requests} requests"
            ),
            Step::CreateVolume { id, mib } => write!(f, "volume-create: v{id}, {mib} MiB"),
            Step::DeleteVolume { nth } => write!(f, "volume-delete: pick {nth}"),
            Step::ResizeVolume { nth, mib } => write!(f, "volume-resize: pick {nth} to {mib} MiB"),
            Step::Grow { pick, disks } => write!(f, "grow: pick {pick}, {disks} new disks"),
            Step::Restart | Step::Assemble | Step::ReturnDisks => write!(f, "{}", self.kind()),
        }
    }
}

/// The hierarchy's disks and layers (a run's online changes add disks and members).
#[derive(Clone, Debug)]
pub struct Shape {
    /// Disk sizes in bytes; disk `i` is named `d{i}`.
    pub disks: Vec<u64>,
    pub layers: Vec<LayerShape>,
}

/// A run: its hierarchy and its steps.
#[derive(Clone, Debug)]
pub struct Plan {
    pub shape: Shape,
    /// The serve configuration of the hierarchy.
    pub config: String,
    /// The thin pool on top, if any (its starting volumes are among `targets`).
    pub pool: Option<String>,
    /// What clients write to at the start.
    pub targets: Vec<Target>,
    pub steps: Vec<Step>,
}

impl Shape {
    /// The layer that has `child` among its children, if any.
    pub fn parent_of(&self, child: &str) -> Option<&LayerShape> {
        self.layers
            .iter()
            .find(|l| l.children.iter().any(|c| c == child))
    }

    /// The redundant layers `disk` lies under, nearest first, each with the child of it the
    /// disk lies under (a journal device is no member: an array does not survive its loss).
    pub fn redundant_ancestors(&self, disk: &str) -> Vec<(&LayerShape, String)> {
        let mut found = Vec::new();
        let mut name = disk.to_string();
        while let Some(parent) = self.parent_of(&name) {
            let journal = parent.journal_device && parent.children.last() == Some(&name);
            if REDUNDANT.contains(&parent.kind) && !journal {
                found.push((parent, name.clone()));
            }
            name = parent.name.clone();
        }
        found
    }

    /// The disks under `device` (itself, if it is one).
    pub fn disks_under(&self, device: &str) -> Vec<String> {
        match self.layers.iter().find(|l| l.name == device) {
            None => vec![device.to_string()],
            Some(layer) => layer
                .children
                .iter()
                .flat_map(|c| self.disks_under(c))
                .collect(),
        }
    }
}

/// A device being generated and the least size it has.
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

fn quoted(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("\"{}MiB\"", bytes / MIB)
    } else {
        format!("\"{}KiB\"", bytes / KIB)
    }
}

/// A size option from `choices`, or its default (None); in the text and in bytes.
fn size_option(pick: &mut Picks, choices: &[u64]) -> Option<(String, u64)> {
    let bytes = (pick.next(3) != 0).then(|| pick.one_of(choices))?;
    Some((quoted(bytes), bytes))
}

fn text(option: &Option<(String, u64)>) -> Option<String> {
    option.as_ref().map(|(text, _)| text.clone())
}

/// One layer of `kind` over `children`: its options, the least size it has, and whether
/// its last child is a journal device.
fn layer(pick: &mut Picks, kind: &str, children: &[Device]) -> (String, u64, bool) {
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
                ("offset", Some(offset.to_string())),
                ("length", length.map(|l| l.to_string())),
            ]);
            (text, length.unwrap_or(room), false)
        }
        "concat" => (
            String::new(),
            children.iter().map(|c| c.size / 4096 * 4096).sum(),
            false,
        ),
        "crypt" => {
            // 512 only: a 4096-byte XTS sector torn by a power cut at 512 bytes decrypts to
            // garbage (see docs/explore.md, "Findings").
            let sector = pick.maybe(&["512"]);
            let text = lines([
                ("key-file", Some("\"keys/enc.key\"".into())),
                ("sector-size", sector),
            ]);
            (text, smallest / 4096 * 4096, false)
        }
        "delay" => {
            let durations = ["\"0s\"", "\"10us\"", "\"200us\"", "\"2ms\""];
            let rtt = (pick.next(8) == 0).then(|| "\"9ms\"".to_string());
            let text = lines([
                ("read-latency", pick.maybe(&durations)),
                ("write-latency", pick.maybe(&durations)),
                ("rtt", rtt),
                ("seed", pick.maybe(&["1", "42"])),
            ]);
            (text, smallest, false)
        }
        "hdd" => {
            let text = lines([
                (
                    "model",
                    Some(
                        pick.one_of(&["\"cheetah-15k5-300g\"", "\"wd-re3-1t\""])
                            .into(),
                    ),
                ),
                ("queue-depth", pick.maybe(&["1", "8"])),
                ("scheduler", pick.maybe(&["\"sptf\"", "\"fifo\""])),
            ]);
            (text, smallest, false)
        }
        "count" => (String::new(), smallest, false),
        "stripe" => {
            let chunk = size_option(pick, &[4 * KIB, 64 * KIB, 256 * KIB]);
            let bytes = chunk.as_ref().map_or(64 * KIB, |c| c.1);
            (
                lines([("chunk", text(&chunk))]),
                n * (smallest / bytes * bytes),
                false,
            )
        }
        "mirror" => {
            let metadata = size_option(pick, &[64 * KIB, 256 * KIB, MIB]);
            let reserved = metadata.as_ref().map_or(4 * MIB, |m| m.1);
            let text = lines([
                ("resync-concurrency", pick.maybe(&["1", "4"])),
                ("bitmap-clear-ms", pick.maybe(&["0", "1", "500"])),
                ("region", text(&size_option(pick, &[64 * KIB, MIB]))),
                ("metadata-size", text(&metadata)),
            ]);
            (text, smallest.saturating_sub(reserved) / 4096 * 4096, false)
        }
        "raid5" => {
            let chunk = size_option(pick, &[4 * KIB, 16 * KIB, 64 * KIB]);
            let chunk_bytes = chunk.as_ref().map_or(64 * KIB, |c| c.1);
            // Small journals too, so that reclaims and full journals come often; never
            // below what the array needs for its largest record.
            let record = n * chunk_bytes + 4096;
            let journals: Vec<u64> = [128 * KIB, 256 * KIB, MIB, 2 * MIB]
                .into_iter()
                .filter(|&j| j >= least_bytes(record))
                .collect();
            let journal = size_option(pick, &journals);
            let last = &children[children.len() - 1];
            let journal_device = n >= 4
                && pick.next(3) == 0
                && last.size
                    >= device_bytes(n as usize - 1, journal.as_ref().map_or(4 * MIB, |j| j.1));
            let members = if journal_device { n - 1 } else { n };
            let least = least_bytes(members * chunk_bytes + 4096);
            let journal_bytes = journal.as_ref().map_or(least.max(4 * MIB), |j| j.1);
            let smallest = children[..members as usize]
                .iter()
                .map(|c| c.size)
                .min()
                .expect("members");
            let data_start = (META_BYTES + journal_bytes).next_multiple_of(chunk_bytes);
            let stripes = smallest.saturating_sub(data_start) / chunk_bytes;
            let text = lines([
                ("chunk", text(&chunk)),
                ("journal", text(&journal)),
                (
                    "journal-device",
                    journal_device.then(|| format!("\"{}\"", last.name)),
                ),
            ]);
            (text, (members - 1) * stripes * chunk_bytes, journal_device)
        }
        "stage" => {
            // [fast, slow]: the fast child holds the metadata and the log.
            let range = size_option(pick, &[64 * KIB, MIB]);
            let range_bytes = range.as_ref().map_or(MIB, |r| r.1);
            let extent = (pick.next(3) != 0).then(|| quoted(range_bytes * pick.one_of(&[1, 4])));
            let text = lines([
                ("threshold", pick.maybe(&["\"32KiB\"", "65536"])),
                ("range", text(&range)),
                ("extent", extent),
                (
                    "trigger",
                    pick.maybe(&["\"full\"", "\"watermark\"", "\"density\""]),
                ),
                ("destage-depth", pick.maybe(&["1", "8"])),
            ]);
            (text, children[1].size / range_bytes * range_bytes, false)
        }
        "migrate" => {
            let chunk = size_option(pick, &[16 * KIB, 128 * KIB]);
            let chunk_bytes = chunk.as_ref().map_or(128 * KIB, |c| c.1);
            let slots: u64 = children
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let start = if i == 0 { MIB } else { 0 };
                    c.size.saturating_sub(start) / chunk_bytes
                })
                .sum();
            let text = lines([
                (
                    "policy",
                    pick.maybe(&["\"mig\"", "\"nomig\"", "\"locality\""]),
                ),
                ("delta", pick.maybe(&["\"0\"", "\"adaptive\""])),
                ("tokens", pick.maybe(&["4", "100"])),
                ("chunk", text(&chunk)),
                ("candidate-probability", pick.maybe(&["0.05", "1.0"])),
                ("merge-interval", pick.maybe(&["\"0\"", "\"250ms\""])),
            ]);
            (
                text,
                (slots - slots.div_ceil(8).max(1)) * chunk_bytes,
                false,
            )
        }
        other => unreachable!("{other}"),
    }
}

/// A thin pool's options over a device of `size` bytes, if they fit, and the volume sizes
/// it starts with (together sometimes larger than the pool: thin pools overcommit).
fn thin_pool(pick: &mut Picks, size: u64) -> Option<(String, Vec<u64>)> {
    let extent = size_option(pick, &[64 * KIB, 128 * KIB, MIB]);
    let extent_bytes = extent.as_ref().map_or(512 * KIB, |e| e.1);
    let metadata = size_option(pick, &[MIB, 2 * MIB]);
    let metadata_bytes = metadata.as_ref().map_or(2 * MIB, |m| m.1);
    if size < metadata_bytes.next_multiple_of(extent_bytes) + extent_bytes {
        return None;
    }
    let options = lines([
        ("extent", text(&extent)),
        ("metadata-size", text(&metadata)),
        ("map-commit", pick.maybe(&["\"batched\"", "\"extent\""])),
        ("commit-interval-ms", pick.maybe(&["1", "100"])),
        ("snapshot-write", pick.maybe(&["\"remap\"", "\"copy\""])),
    ]);
    let volumes = (0..1 + pick.next(3))
        .map(|_| pick.between(1, 6) * MIB)
        .collect();
    Some((options, volumes))
}

/// The plan of run `seed`.
pub fn plan(seed: u64) -> Plan {
    let mut pick = Picks::new(seed);
    let mut config = String::from("listen = [\"unix:explore.sock\"]\n");
    let disk_count = pick.between(2, 7) as usize;
    let disks: Vec<u64> = (0..disk_count)
        .map(|_| pick.between(DISK_MIB.0, DISK_MIB.1) * MIB)
        .collect();
    let mut free: Vec<Device> = disks
        .iter()
        .enumerate()
        .map(|(i, size)| Device {
            name: format!("d{i}"),
            size: size - LABEL_BYTES,
        })
        .collect();
    for device in &free {
        let name = &device.name;
        config.push_str(&format!(
            "[[disk]]\nname = \"{name}\"\npath = \"{name}.img\"\n"
        ));
    }
    let mut layers = Vec::new();
    let layer_count = 1 + pick.next(4);
    for index in 0..layer_count {
        let name = format!("l{index}");
        let (kind, children, options, size, journal_device) = (0..4)
            .find_map(|_| {
                let mut kinds = vec!["slice", "concat", "count", "crypt", "delay", "hdd"];
                if free.len() >= 2 {
                    kinds.extend(["stripe", "mirror", "mirror", "stage", "migrate"]);
                }
                if free.len() >= 3 {
                    kinds.extend(["raid5", "raid5"]);
                }
                let kind = pick.one_of(&kinds);
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
                let (options, size, journal_device) = layer(&mut pick, kind, &children);
                (size >= ROOM).then(|| {
                    free = left;
                    (kind, children, options, size, journal_device)
                })
            })
            .unwrap_or_else(|| {
                let children = pick.take(&mut free, 1);
                let size = children[0].size;
                ("count", children, String::new(), size, false)
            });
        let names: Vec<String> = children.iter().map(|c| c.name.clone()).collect();
        let list: Vec<String> = names.iter().map(|c| format!("\"{c}\"")).collect();
        config.push_str(&format!(
            "[[layer]]\nname = \"{name}\"\nkind = \"{kind}\"\nchildren = [{}]\n{options}",
            list.join(", ")
        ));
        layers.push(LayerShape {
            name: name.clone(),
            kind,
            children: names,
            journal_device,
        });
        free.push(Device { name, size });
    }
    // The top layer, and every device nobody uses, is a target; or a thin pool over the top.
    let top = free.pop().expect("a top device");
    let mut targets: Vec<Target> = Vec::new();
    let mut pool = None;
    let pooled = (pick.next(2) == 0)
        .then(|| thin_pool(&mut pick, top.size))
        .flatten();
    match pooled {
        Some((options, volumes)) => {
            let list: Vec<String> = volumes
                .iter()
                .enumerate()
                .map(|(i, size)| format!("{{ name = \"v{i}\", size = \"{}MiB\" }}", size / MIB))
                .collect();
            config.push_str(&format!(
                "[[layer]]\nname = \"pool\"\nkind = \"thin-pool\"\nchildren = [\"{}\"]\n\
                 {options}volumes = [{}]\n",
                top.name,
                list.join(", ")
            ));
            layers.push(LayerShape {
                name: "pool".into(),
                kind: "thin-pool",
                children: vec![top.name.clone()],
                journal_device: false,
            });
            targets.extend((0..volumes.len()).map(|i| Target::Volume {
                pool: "pool".into(),
                volume: format!("v{i}"),
            }));
            pool = Some("pool".to_string());
        }
        None => targets.push(Target::Device(top.name.clone())),
    }
    // Devices left unused (disks no layer took, layers under nothing) are written to too:
    // their data must survive the rest of the stack's crashes.
    targets.extend(free.iter().map(|d| Target::Device(d.name.clone())));
    for (i, target) in targets.iter().enumerate() {
        config.push_str(&format!(
            "[[export]]\nname = \"e{i}\"\ndevice = \"{target}\"\n"
        ));
    }
    let steps = steps(&mut pick, pool.is_some());
    Plan {
        shape: Shape { disks, layers },
        config,
        pool,
        targets,
        steps,
    }
}

/// A random list of steps: work, with events between.
fn steps(pick: &mut Picks, pool: bool) -> Vec<Step> {
    let count = pick.between(3, 9);
    let mut steps = Vec::new();
    for _ in 0..count {
        let seed = pick.rng().random();
        let ops = pick.between(8, 120) as u32;
        let clients = pick.between(1, 4) as u32;
        let mut events = vec![
            "work", "work", "power", "power", "power", "process", "restart", "assemble", "fail",
            "fail", "return", "stale", "spike", "replace", "replace", "grow", "grow",
        ];
        if pool {
            events.extend(["create", "create", "delete", "resize"]);
        }
        let step = match pick.one_of(&events) {
            "work" => Step::Work { seed, ops, clients },
            kind @ ("power" | "process") => Step::Crash {
                seed,
                ops,
                clients,
                after: pick.between(0, 3 * ops as u64) as u32,
                cut: if kind == "power" {
                    Cut::Power
                } else {
                    Cut::Process
                },
            },
            "restart" => Step::Restart,
            "assemble" => Step::Assemble,
            "fail" => Step::FailDisk {
                disk: pick.next(64) as u32,
            },
            "return" => Step::ReturnDisks,
            "stale" => Step::StaleAlone {
                disk: pick.next(64) as u32,
            },
            "replace" => Step::ReplaceDisk {
                disk: pick.next(64) as u32,
            },
            "spike" => Step::LatencySpike {
                disk: pick.next(64) as u32,
                millis: pick.one_of(&[5, 50, 400]),
                requests: pick.between(1, 40) as u32,
            },
            "create" => Step::CreateVolume {
                id: 100 + pick.next(1000) as u32,
                mib: pick.between(1, 6) as u32,
            },
            "delete" => Step::DeleteVolume {
                nth: pick.next(64) as u32,
            },
            "grow" => Step::Grow {
                pick: pick.next(64) as u32,
                disks: pick.between(1, 2) as u32,
            },
            "resize" => Step::ResizeVolume {
                nth: pick.next(64) as u32,
                mib: pick.between(1, 8) as u32,
            },
            other => unreachable!("{other}"),
        };
        let failed = matches!(step, Step::FailDisk { .. });
        steps.push(step);
        // A disk that fails is usually dealt with a little later: replaced, returned, or
        // started alone (each needs a disk gone, so drawn alone they mostly find none).
        if failed && pick.next(3) != 0 {
            steps.push(Step::Work {
                seed: pick.rng().random(),
                ops: pick.between(8, 60) as u32,
                clients: pick.between(1, 3) as u32,
            });
            let disk = pick.next(64) as u32;
            steps.push(match pick.next(4) {
                0 | 1 => Step::ReplaceDisk { disk },
                2 => Step::ReturnDisks,
                _ => Step::StaleAlone { disk },
            });
        }
        // Work between events, so that each event has something to lose.
        if !matches!(steps.last(), Some(Step::Work { .. } | Step::Crash { .. })) {
            steps.push(Step::Work {
                seed: pick.rng().random(),
                ops: pick.between(8, 60) as u32,
                clients: pick.between(1, 3) as u32,
            });
        }
    }
    steps
}
