//! One run: a plan's hierarchy built through the serve path (`config::load`, `build_on`,
//! labels and all) over crash disks in a simulation of its own, its steps played in order,
//! and after every start each target read whole and checked against its reference model.
//!
//! Each start ("boot") is a fresh [`Simulation`]: dropping the old one drops every task the
//! old stack left, as a process exit does. What carries over from boot to boot is only what
//! a real system keeps: the disks' images (after a crash, what the crash left of them) and
//! the models of what each target must hold.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::SeedableRng;
use strata_core::{Control, ControlReply, DeviceRef, Health, MetricsRegistry};
use strata_crash::{CrashDisk, CrashGroup, CrashPolicy, CrashRng, DeviceModel, DiskImage};
use strata_stack::build::{self, Disks, StartOptions};
use strata_stack::config::{self, Loaded};

use crate::executor::{derive_seed, SimConfig, Simulation};
use crate::explore::client::{self, Shared, Target as Client};
use crate::explore::coverage::Coverage;
use crate::explore::disks::{TimedDisk, Timing};
use crate::explore::generate::{self, Cut, Plan, Shape, Step, Target};
use crate::explore::site::SimSite;
use strata_stack::hierarchy;

const MIB: u64 = 1 << 20;

/// The largest rewrite of ranges reported lost.
const MAX_REWRITE: u64 = 1 << 20;

/// Disks online changes may add to a run, beyond the plan's.
const MAX_ADDED_DISKS: usize = 4;

/// How long a boot may run in virtual time before the run is called hung: an hour, far
/// beyond anything a step needs (the longest waits are rebuilds of a few MiB).
const BOOT_TIME_LIMIT: u64 = 3_600_000_000_000;

/// A defect: what was wrong, and the steps up to it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub message: String,
    /// Index into the plan's steps of the step that failed (None: the first start; the
    /// number of steps: the clean restart after the last).
    pub step: Option<usize>,
    pub log: Vec<String>,
}

/// What a run that found nothing wrong did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub coverage: Coverage,
    /// Requests the disks served, over every boot.
    pub disk_requests: u64,
    /// What happened, one line per step and start: the same seed gives the same lines.
    pub log: Vec<String>,
}

/// A running stack.
struct Boot {
    /// None: nothing could be served (an expected refusal of everything).
    stack: Option<build::Stack>,
    group: CrashGroup,
    /// By plan disk index: the disk, if it was given at this start.
    disks: Vec<Option<CrashDisk>>,
    timing: Arc<Timing>,
    // Dropped last: the stack's tasks hold handles into it.
    sim: Simulation,
}

impl Boot {
    fn nodes(&self) -> &[build::Node] {
        self.stack.as_ref().map_or(&[], |s| &s.nodes)
    }

    fn refused(&self) -> &[build::Refused] {
        self.stack.as_ref().map_or(&[], |s| &s.refused)
    }
}

/// What must be true of a start.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Everything starts.
    Serve,
    /// The array named by `refused_under` must not start; the rest serves.
    Refuse,
}

struct World<'a> {
    plan: &'a Plan,
    seed: u64,
    /// The hierarchy now: the plan's, with the disks and members online changes added.
    shape: Shape,
    /// The configuration the stack starts from, and its text (what a change edits).
    loaded: Loaded,
    config_text: String,
    /// Layers an online change grew: targets over them may grow too.
    grown: std::collections::BTreeSet<String>,
    boots: u64,
    boot: Option<Boot>,
    /// Where generated configurations find their key files.
    data_dir: std::path::PathBuf,
    /// The running stack was assembled from labels: targets on unlabelled disks are not
    /// served.
    assembled: bool,
    /// Unplugged disks and what they held when they went.
    gone: BTreeMap<usize, DiskImage>,
    /// Every target the clients know and its model.
    models: BTreeMap<Target, DeviceModel>,
    /// Units of a target reported lost that a rewrite through the target could not clear
    /// (a raid5 chunk lost in a crash while degraded, only part of which lies in this
    /// target): reads of them may fail; the clients leave them alone.
    lost: BTreeMap<Target, std::collections::BTreeSet<u64>>,
    /// Write ids for the next target's model start here (each target its own range, so a
    /// block from another volume names the volume it came from).
    next_model: u64,
    coverage: Coverage,
    disk_requests: u64,
    log: Vec<String>,
    step: Option<usize>,
}

/// Plays `plan` (run seed `seed`) with the steps `steps` (indexes into the plan's steps; all
/// when None). `data_dir` holds the key file a crypt layer reads.
pub fn run(
    plan: &Plan,
    seed: u64,
    steps: Option<&[usize]>,
    data_dir: &Path,
) -> Result<Outcome, Failure> {
    let loaded =
        config::load(&plan.config, "explore.toml", data_dir, Some(data_dir)).map_err(|e| {
            Failure {
                message: format!("the generated configuration does not load: {e}"),
                step: None,
                log: vec![plan.config.clone()],
            }
        })?;
    let mut world = World {
        plan,
        seed,
        shape: plan.shape.clone(),
        loaded,
        config_text: plan.config.clone(),
        grown: Default::default(),
        boots: 0,
        boot: None,
        data_dir: data_dir.to_path_buf(),
        assembled: false,
        gone: BTreeMap::new(),
        models: BTreeMap::new(),
        lost: BTreeMap::new(),
        next_model: 1,
        coverage: Coverage::default(),
        disk_requests: 0,
        log: Vec::new(),
        step: None,
    };
    for layer in &plan.shape.layers {
        world.coverage.count("layer", layer.kind);
    }
    let result = world.play(steps);
    world.shutdown_quietly();
    match result {
        Ok(()) => Ok(Outcome {
            coverage: world.coverage,
            disk_requests: world.disk_requests,
            log: world.log,
        }),
        Err(message) => Err(Failure {
            message,
            step: world.step,
            log: world.log,
        }),
    }
}

impl World<'_> {
    fn play(&mut self, steps: Option<&[usize]>) -> Result<(), String> {
        let images: Vec<Option<DiskImage>> = self
            .shape
            .disks
            .iter()
            .map(|&size| Some(DiskImage::zeroed(strata_crash::sector_disk(size))))
            .collect();
        self.start(images, Expect::Serve, None)?;
        let all: Vec<usize> = (0..self.plan.steps.len()).collect();
        for &index in steps.unwrap_or(&all) {
            self.step = Some(index);
            let step = self.plan.steps[index].clone();
            self.log.push(format!("step {index}: {step}"));
            self.coverage.count("event", step.kind());
            self.play_step(&step)?;
            // Always, so that tracing does not change the run: asking every layer for its
            // status lets the simulation run what is ready.
            self.trace_layers(std::env::var_os("STRATA_EXPLORE_TRACE").is_some());
        }
        self.step = Some(self.plan.steps.len());
        // Last, a clean restart: everything written is flushed and must come back exactly.
        self.restart(false)
    }

    fn play_step(&mut self, step: &Step) -> Result<(), String> {
        match *step {
            Step::Work { seed, ops, clients } => self.work(seed, ops, clients, None),
            Step::Crash {
                seed,
                ops,
                clients,
                after,
                cut,
            } => {
                self.work(seed, ops, clients, Some(after))?;
                self.crash(cut)
            }
            Step::Restart => self.restart(false),
            Step::Assemble => self.assemble(),
            Step::FailDisk { disk } => self.fail_disk(disk),
            Step::ReturnDisks => {
                if self.gone.is_empty() {
                    return self.skip("return-disks");
                }
                self.restart(true)
            }
            Step::StaleAlone { disk } => self.stale_alone(disk),
            Step::ReplaceDisk { disk } => self.replace_disk(disk),
            Step::LatencySpike {
                disk,
                millis,
                requests,
            } => {
                let boot = self.boot.as_ref().expect("running");
                let index = disk as usize % self.shape.disks.len();
                boot.timing
                    .spike(index, Duration::from_millis(millis.into()), requests);
                Ok(())
            }
            Step::CreateVolume { id, mib } => self.create_volume(id, mib),
            Step::DeleteVolume { nth } => self.delete_volume(nth),
            Step::ResizeVolume { nth, mib } => self.resize_volume(nth, mib),
            Step::Grow { pick, disks } => self.grow(pick, disks),
        }
    }

    /// Asks every layer for its status; with `log`, into the log.
    fn trace_layers(&mut self, log: bool) {
        let Some(boot) = self.boot.as_ref() else {
            return;
        };
        let mut lines = Vec::new();
        for node in boot.nodes() {
            let described = boot.sim.try_block_on(node.describe());
            if let (true, Ok(Ok(status))) = (log, described) {
                let detail: Vec<String> = status
                    .detail
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                lines.push(format!(
                    "    {} ({:?}): {}",
                    node.name,
                    status.health,
                    detail.join(", ")
                ));
            }
        }
        self.log.extend(lines);
    }

    fn skip(&mut self, what: &str) -> Result<(), String> {
        self.coverage.count("skipped", what);
        self.log
            .push(format!("  skipped: {what} has nothing to act on"));
        Ok(())
    }

    // ---- starting and stopping -----------------------------------------------------------

    /// Starts the stack on `images` (None: the disk is absent) and checks every target.
    fn start(
        &mut self,
        images: Vec<Option<DiskImage>>,
        expect: Expect,
        refused_under: Option<&str>,
    ) -> Result<(), String> {
        // The operator knows a disk died and says so (`--degraded`); never for the start
        // whose point is that an array must not start without it.
        let degraded = expect == Expect::Serve && images.iter().any(|i| i.is_none());
        self.boots += 1;
        let boot_seed = derive_seed(self.seed, &format!("boot-{}", self.boots));
        let sim = Simulation::with_config(SimConfig {
            time_limit: Some(BOOT_TIME_LIMIT),
            ..SimConfig::new(boot_seed)
        });
        let timing = Timing::new(
            derive_seed(boot_seed, "timing"),
            self.plan.shape.disks.len() + MAX_ADDED_DISKS,
            sim.runtime(),
        );
        self.check_images(&sim, &images)?;
        let group = CrashGroup::new();
        let mut given: BTreeMap<String, DeviceRef> = BTreeMap::new();
        let disks: Vec<Option<CrashDisk>> = images
            .into_iter()
            .enumerate()
            .map(|(i, image)| {
                let disk = group.disk_from(image?);
                let timed = TimedDisk::new(disk.clone(), i, timing.clone());
                given.insert(format!("d{i}"), Arc::new(timed) as DeviceRef);
                Some(disk)
            })
            .collect();
        let present: Vec<String> = disks
            .iter()
            .enumerate()
            .map(|(i, d)| format!("d{i}{}", if d.is_some() { "" } else { " (absent)" }))
            .collect();
        self.log
            .push(format!("  start {}: {}", self.boots, present.join(", ")));
        let built = sim.try_block_on(build::build_on(
            &self.loaded,
            &Disks::Given(given),
            &StartOptions {
                degraded,
                ..StartOptions::default()
            },
            sim.runtime(),
            &MetricsRegistry::default(),
        ));
        let stack = match built {
            Ok(Ok(stack)) => Some(stack),
            Ok(Err(e))
                if expect == Expect::Refuse
                    && format!("{e:#}").contains("no export could be served") =>
            {
                self.log.push(format!("  nothing served: {e:#}"));
                None
            }
            Ok(Err(e)) => return Err(format!("the stack did not start: {e:#}")),
            Err(stop) => return Err(format!("starting the stack hung: {stop}")),
        };
        for refused in stack.iter().flat_map(|s| &s.refused) {
            self.log
                .push(format!("  refused {}: {}", refused.name, refused.reason));
        }
        self.boot = Some(Boot {
            stack,
            group,
            disks,
            timing,
            sim,
        });
        // With disks absent, the layers over them that cannot do without them are refused
        // (the arrays above run degraded); nothing else may be.
        let absent: Vec<String> = self
            .boot()
            .disks
            .iter()
            .enumerate()
            .filter(|(_, d)| d.is_none())
            .map(|(i, _)| format!("d{i}"))
            .collect();
        let unexplained: Vec<String> = self
            .boot()
            .refused()
            .iter()
            .filter(|r| !absent.iter().any(|d| self.under(&r.name, d)))
            .map(|r| format!("{} ({})", r.name, r.reason))
            .collect();
        match expect {
            Expect::Serve if !unexplained.is_empty() => {
                return Err(format!(
                    "a start refused devices with all their disks present: {}",
                    unexplained.join("; ")
                ));
            }
            Expect::Refuse => {
                let array = refused_under.expect("an array to refuse");
                let under = self.shape.disks_under(array);
                let served = self
                    .boot()
                    .nodes()
                    .iter()
                    .any(|n| n.name == array && n.device().is_some());
                if served {
                    return Err(format!(
                        "{array} started with only a stale member of it present ({}) and \
                         without --degraded",
                        under.join(", ")
                    ));
                }
                self.coverage.count("refused-as-expected", array);
            }
            Expect::Serve => {}
        }
        self.check_layers()?;
        // The targets' models begin at the first start, over what it formatted.
        let created = if self.boots == 1 {
            self.plan.targets.clone()
        } else {
            Vec::new()
        };
        for target in created {
            let size = self.resolve(&target)?.geometry().size;
            let model = self.new_model(size);
            self.models.insert(target, model);
        }
        self.verify_all(refused_under)
    }

    /// `strata check` over every labelled disk image a start is given, as an operator runs it
    /// on the disks before a start: whatever a crash, a pulled disk or a change left, no
    /// disk's metadata may be damaged (a torn journal tail is a warning, not damage).
    fn check_images(
        &mut self,
        sim: &Simulation,
        images: &[Option<DiskImage>],
    ) -> Result<(), String> {
        for (name, image) in self.labelled(images) {
            let disk: DeviceRef = Arc::new(CrashGroup::new().disk_from(image.clone()));
            let path = Path::new(&name);
            let report = match sim.try_block_on(strata_stack::check::check_device(path, disk)) {
                Ok(Ok(report)) => report,
                Ok(Err(e)) => return Err(format!("strata check {name}: {e:#}")),
                Err(stop) => return Err(format!("strata check {name} hung: {stop}")),
            };
            if !report.errors.is_empty() {
                return Err(format!(
                    "strata check finds {name} damaged: {}",
                    report.errors.join("; ")
                ));
            }
            let what = match (&report.owner, report.not_strata) {
                (_, true) => "blank",
                (Some(_), _) => "metadata",
                (None, _) => "label only",
            };
            self.coverage.count("strata-check", what);
        }
        Ok(())
    }

    /// The present images of disks under a layer (those carry a hierarchy label), by name.
    fn labelled<'i>(&self, images: &'i [Option<DiskImage>]) -> Vec<(String, &'i DiskImage)> {
        (images.iter().enumerate())
            .filter_map(|(i, image)| Some((format!("d{i}"), image.as_ref()?)))
            .filter(|(name, _)| self.shape.parent_of(name).is_some())
            .collect()
    }

    /// A model for a new target of `size` bytes, with write ids of its own.
    fn new_model(&mut self, size: u64) -> DeviceModel {
        let model = DeviceModel::with_first_id(size, self.next_model);
        self.next_model += 1 << 40;
        model
    }

    fn boot(&self) -> &Boot {
        self.boot.as_ref().expect("a running stack")
    }

    /// Each stateful layer's own invariants over its metadata (what its tests assert after a
    /// reopen): a thin pool's, a stage's, a migrate layer's `check_state`.
    fn check_layers(&mut self) -> Result<(), String> {
        let boot = self.boot.as_ref().expect("running");
        for layer in &self.shape.layers {
            let check: fn(&strata_meta::State) -> Vec<String> = match layer.kind {
                "thin-pool" => strata_thin::check_state,
                "stage" => strata_stage::check_state,
                "migrate" => strata_migrate::check_state,
                _ => continue,
            };
            let Some(node) = boot.nodes().iter().find(|n| n.name == layer.name) else {
                continue;
            };
            let handle = match boot
                .sim
                .try_block_on(node.control_device().control(Control::Handle))
            {
                Ok(Ok(ControlReply::Handle(handle))) => handle,
                _ => return Err(format!("{}: no handle to check its state", layer.name)),
            };
            let store = if let Some(pool) = handle.downcast_ref::<strata_thin::ThinPool>() {
                pool.store().clone()
            } else if let Some(stage) = handle.downcast_ref::<strata_stage::Stage>() {
                stage.store().clone()
            } else if let Some(migrate) = handle.downcast_ref::<strata_migrate::Migrate>() {
                migrate.store().clone()
            } else {
                return Err(format!(
                    "{}: its handle is not a {}",
                    layer.name, layer.kind
                ));
            };
            let problems = store.read(check);
            if !problems.is_empty() {
                return Err(format!(
                    "{} ({}) fails its own checks after a start: {}",
                    layer.name,
                    layer.kind,
                    problems.join("; ")
                ));
            }
            self.coverage.count("state-checked", layer.kind);
        }
        Ok(())
    }

    /// A target's device in the running stack.
    fn resolve(&self, target: &Target) -> Result<DeviceRef, String> {
        let boot = self.boot();
        match target {
            Target::Device(name) => boot
                .nodes()
                .iter()
                .find(|n| &n.name == name)
                .and_then(|n| n.device().cloned())
                .ok_or_else(|| format!("{name} is not served")),
            Target::Volume { pool, volume } => {
                let node = boot
                    .nodes()
                    .iter()
                    .find(|n| &n.name == pool)
                    .ok_or_else(|| format!("pool {pool} is not served"))?;
                let request = Control::Volume {
                    name: volume.clone(),
                };
                match boot
                    .sim
                    .try_block_on(node.control_device().control(request))
                {
                    Ok(Ok(ControlReply::Device(device))) => Ok(device),
                    Ok(Ok(_)) => Err(format!("{target}: the pool answered something else")),
                    Ok(Err(e)) => Err(format!("{target} is not served: {e}")),
                    Err(stop) => Err(format!("looking up {target} hung: {stop}")),
                }
            }
        }
    }

    /// A target that is a disk under no layer: it carries no hierarchy label.
    fn unlabelled(&self, target: &Target) -> bool {
        matches!(target, Target::Device(name) if self.shape.layers.iter().all(|l| &l.name != name)
            && self.shape.parent_of(name).is_none())
    }

    /// Whether `target` lies over `array` (so a refused array takes it down).
    fn over(&self, target: &Target, array: &str) -> bool {
        match target {
            Target::Device(name) => self.under(name, array),
            Target::Volume { pool, .. } => self.under(pool, array),
        }
    }

    fn under(&self, device: &str, array: &str) -> bool {
        device == array
            || self
                .shape
                .layers
                .iter()
                .find(|l| l.name == device)
                .is_some_and(|l| l.children.iter().any(|c| self.under(c, array)))
    }

    /// Reads every target whole and checks it against its model; pins the model to what was
    /// read (a later crash cannot take back what a start presented).
    fn verify_all(&mut self, refused_under: Option<&str>) -> Result<(), String> {
        let targets: Vec<Target> = self.models.keys().cloned().collect();
        for target in targets {
            if self.assembled && self.unlabelled(&target) {
                continue;
            }
            if refused_under.is_some_and(|array| self.over(&target, array)) {
                if self.resolve(&target).is_ok() {
                    return Err(format!(
                        "{target} is served although {} under it was refused",
                        refused_under.unwrap_or_default()
                    ));
                }
                continue;
            }
            let device = self.resolve(&target)?;
            self.adopt_growth(&target, &device)?;
            let model = self.models.get_mut(&target).expect("model");
            let size = device.geometry().size;
            if size != model.size() {
                return Err(format!(
                    "{target} has {size} bytes after a start; it had {}",
                    model.size()
                ));
            }
            let sim = &self.boot.as_ref().expect("running").sim;
            let stuck = self.lost.entry(target.clone()).or_default();
            let lost = read_and_check(sim, &target, &device, model, Some(stuck))?;
            if lost > 0 {
                self.coverage.add("reported-lost", "sectors", lost);
                self.log.push(format!(
                    "  {target}: {lost} sectors reported lost, rewritten"
                ));
            }
            self.coverage.add("verified", "MiB", size / MIB);
        }
        Ok(())
    }

    /// Flushes every target, ends background work and closes the stack; returns the disks'
    /// images (everything was flushed, so all of it is durable).
    fn stop(&mut self) -> Result<Vec<Option<DiskImage>>, String> {
        let targets: Vec<Target> = self.models.keys().cloned().collect();
        for target in targets {
            if self.assembled && self.unlabelled(&target) {
                continue;
            }
            let device = self.resolve(&target)?;
            let model = self.models.get_mut(&target).expect("model");
            let boot = self.boot.as_ref().expect("running");
            let id = model.flush_started();
            match boot.sim.try_block_on(device.flush()) {
                Ok(Ok(())) => model.flush_completed(id),
                Ok(Err(e)) => return Err(format!("{target}: flush at shutdown failed: {e}")),
                Err(stop) => return Err(format!("{target}: flush at shutdown hung: {stop}")),
            }
        }
        let boot = self.boot.take().expect("running");
        // Disks have no background work; an unplugged one answers nothing.
        let layers = boot
            .nodes()
            .iter()
            .filter(|n| self.shape.layers.iter().any(|l| l.name == n.name));
        for node in layers.rev() {
            match boot.sim.try_block_on(node.stop_background()) {
                Ok(Ok(())) => {}
                // A layer over an unplugged disk may say so (its array has failed it).
                Ok(Err(_))
                    if self
                        .gone
                        .keys()
                        .any(|d| self.under(&node.name, &format!("d{d}"))) => {}
                Ok(Err(e)) => return Err(format!("{}: stopping failed: {e}", node.name)),
                Err(stop) => return Err(format!("{}: stopping hung: {stop}", node.name)),
            }
        }
        Ok(self.images_of(boot, CrashPolicy::KeepAll))
    }

    /// The images a boot's disks leave (absent disks: None), and the boot dropped.
    fn images_of(&mut self, boot: Boot, policy: CrashPolicy) -> Vec<Option<DiskImage>> {
        let mut rng =
            CrashRng::seed_from_u64(derive_seed(self.seed, &format!("crash-{}", self.boots)));
        let images = boot.group.crash_with(policy, &mut rng);
        self.disk_requests += boot.timing.requests();
        let by_disk = boot
            .disks
            .iter()
            .map(|d| d.as_ref().map(|d| images[d.index()].clone()))
            .collect();
        drop(boot);
        by_disk
    }

    /// The images for the next start: a gone disk stays absent unless `with_gone`.
    fn next_images(
        &mut self,
        mut images: Vec<Option<DiskImage>>,
        with_gone: bool,
    ) -> Vec<Option<DiskImage>> {
        for (&disk, image) in &self.gone {
            images[disk] = with_gone.then(|| image.clone());
        }
        if with_gone {
            self.gone.clear();
        }
        images
    }

    fn restart(&mut self, with_gone: bool) -> Result<(), String> {
        let images = self.stop()?;
        let images = self.next_images(images, with_gone);
        self.start(images, Expect::Serve, None)
    }

    /// A clean shutdown, and a start from the disks' labels alone, as `strata serve
    /// --assemble` does: the labelled disks present are read, their hierarchy picked, and
    /// its configuration built with the disks found. A disk under no layer carries no
    /// label, so targets on such disks are not served by it. Then a restart from the
    /// configuration.
    fn assemble(&mut self) -> Result<(), String> {
        let images = self.stop()?;
        let images = self.next_images(images, false);
        let mut labels = Vec::new();
        for (name, image) in self.labelled(&images) {
            let head = image.read(0, hierarchy::LABEL_BYTES as usize);
            labels.push((
                std::path::PathBuf::from(&name),
                hierarchy::label_copies(&head).label,
            ));
        }
        let assembly = hierarchy::assemble(labels).map_err(|e| format!("assembly: {e:#}"))?;
        let text = hierarchy::assembled_config(&assembly).map_err(|e| format!("{e:#}"))?;
        let assembled = config::load(
            &text,
            "assembled.toml",
            &self.data_dir,
            Some(&self.data_dir),
        )
        .map_err(|e| format!("the assembled configuration does not load: {e}\n{text}"))?;
        let configured = std::mem::replace(&mut self.loaded, assembled);
        self.assembled = true;
        let images = match self.start(images, Expect::Serve, None) {
            Ok(()) => self.stop(),
            Err(e) => Err(format!("started from its labels: {e}")),
        };
        self.assembled = false;
        self.loaded = configured;
        let images = self.next_images(images?, false);
        self.start(images, Expect::Serve, None)
    }

    fn shutdown_quietly(&mut self) {
        if let Some(boot) = self.boot.take() {
            self.disk_requests += boot.timing.requests();
        }
    }

    // ---- steps ---------------------------------------------------------------------------

    /// Clients on every target; with `crash_after`, power fails about that many disk writes
    /// in (or at the end, if the work is done first).
    fn work(
        &mut self,
        seed: u64,
        ops: u32,
        clients: u32,
        crash_after: Option<u32>,
    ) -> Result<(), String> {
        // A raid5 grow ends in the background: its new capacity is the clients' from now.
        self.adopt_grown_targets()?;
        let boot = self.boot.as_ref().expect("running");
        if let Some(after) = crash_after {
            boot.group
                .arm_crash_at(boot.group.mutating_ops() + u64::from(after));
        }
        let mut targets = Vec::new();
        for (target, model) in std::mem::take(&mut self.models) {
            let device = self.resolve(&target)?;
            let may_fill = matches!(target, Target::Volume { .. });
            let name = target.to_string();
            let unit = u64::from(device.geometry().min_io).max(512);
            let mut client = Client::new(name, device, model, may_fill);
            for &at in self.lost.get(&target).into_iter().flatten() {
                client.reserve(at, unit);
            }
            targets.push((target, Rc::new(RefCell::new(client))));
        }
        let boot = self.boot.as_ref().expect("running");
        let coverage = RefCell::new(std::mem::take(&mut self.coverage));
        let shared = Shared {
            group: &boot.group,
            coverage: &coverage,
            failure: RefCell::new(None),
            timing: &boot.timing,
        };
        let per_client = ops.div_ceil(clients.max(1));
        let mut futures = Vec::new();
        for (t, (_, state)) in targets.iter().enumerate() {
            for c in 0..clients {
                let seed = derive_seed(seed, &format!("target-{t}-client-{c}"));
                futures.push(client::client(state.clone(), &shared, seed, per_client));
            }
        }
        let done = boot.sim.try_block_on(join_all(futures));
        let failure = shared.failure.borrow_mut().take();
        self.log.extend(boot.timing.take_trace());
        self.coverage = coverage.into_inner();
        for (target, state) in targets {
            let state = Rc::try_unwrap(state)
                .ok()
                .expect("clients done")
                .into_inner();
            self.models.insert(target, state.model);
        }
        if let Err(stop) = done {
            return Err(format!("clients hung: {stop}"));
        }
        if let Some(failure) = failure {
            return Err(failure);
        }
        Ok(())
    }

    /// Power fails (or the process dies) now, if it has not already; the stack restarts from
    /// what the disks kept.
    fn crash(&mut self, cut: Cut) -> Result<(), String> {
        let boot = self.boot.take().expect("running");
        let fired = boot.group.is_powered_off();
        self.log.push(format!(
            "  {} {}",
            if cut == Cut::Power {
                "power cut"
            } else {
                "process crash"
            },
            if fired {
                "during the work"
            } else {
                "after the work"
            }
        ));
        let policy = match cut {
            Cut::Power => CrashPolicy::Random,
            Cut::Process => CrashPolicy::KeepAll,
        };
        let images = self.images_of(boot, policy);
        for model in self.models.values_mut() {
            model.crashed();
        }
        let images = self.next_images(images, false);
        self.start(images, Expect::Serve, None)
    }

    /// Unplugs a disk the stack can do without: one under a redundant array that is healthy,
    /// as is every array above it, with no disk missing under any of them. (Stacked
    /// redundancy could survive more, but an array degraded by one loss and then crashed may
    /// report chunks lost, which its parent array would take as a second failure: exploring
    /// that is left for later, see docs/explore.md.)
    fn fail_disk(&mut self, pick: u32) -> Result<(), String> {
        let candidates: Vec<usize> = (0..self.shape.disks.len())
            .filter(|&d| self.boot().disks[d].is_some() && !self.gone.contains_key(&d))
            .filter(|&d| {
                let arrays = self.shape.redundant_ancestors(&format!("d{d}"));
                // Every array above healthy: one back stale from an earlier failure is
                // degraded with all its disks present.
                !arrays.is_empty()
                    && arrays.iter().all(|(array, _)| {
                        self.nothing_missing_under(&array.name) && self.healthy_node(&array.name)
                    })
            })
            .collect();
        if candidates.is_empty() {
            return self.skip("fail-disk");
        }
        let disk = candidates[pick as usize % candidates.len()];
        let crash_disk = self.boot().disks[disk].clone().expect("present");
        // What the disk will hold if it comes back: what it made durable.
        self.gone.insert(disk, crash_disk.durable_image());
        crash_disk.disappear();
        self.log.push(format!("  d{disk} unplugged"));
        Ok(())
    }

    /// Every disk under `array` is present and plugged in.
    fn nothing_missing_under(&self, array: &str) -> bool {
        self.shape.disks_under(array).iter().all(|d| {
            let index: usize = d[1..].parse().expect("disk name");
            !self.gone.contains_key(&index) && self.boot().disks[index].is_some()
        })
    }

    /// `name` reports itself healthy, with nothing under way, and so do its children.
    fn healthy_node(&self, name: &str) -> bool {
        let boot = self.boot();
        let Some(node) = boot.nodes().iter().find(|n| n.name == name) else {
            return false;
        };
        match boot.sim.try_block_on(node.describe()) {
            Ok(Ok(status)) => healthy(&status),
            _ => false,
        }
    }

    /// A restart with one unplugged (stale) disk back and the other members of its array
    /// missing: the array must refuse. Then a restart with every disk.
    fn stale_alone(&mut self, pick: u32) -> Result<(), String> {
        let candidates: Vec<(usize, String)> = self
            .gone
            .keys()
            .filter_map(|&d| {
                let ancestors = self.shape.redundant_ancestors(&format!("d{d}"));
                ancestors.first().map(|(array, _)| (d, array.name.clone()))
            })
            .collect();
        if candidates.is_empty() {
            return self.skip("stale-alone");
        }
        let (disk, array) = candidates[pick as usize % candidates.len()].clone();
        let images = self.stop()?;
        let stale = self.gone.remove(&disk).expect("gone");
        let mut alone = self.next_images(images.clone(), false);
        alone[disk] = Some(stale);
        for other in self.shape.disks_under(&array) {
            let index: usize = other[1..].parse().expect("disk name");
            if index != disk {
                alone[index] = None;
            }
        }
        self.log.push(format!("  d{disk} alone in {array}"));
        self.start(alone, Expect::Refuse, Some(&array))?;
        // Then every disk of the array back, the stale one as the lone start left it: the
        // array must still know it is stale. Disks unplugged elsewhere stay out.
        let boot = self.boot.take().expect("running");
        let after_alone = self.images_of(boot, CrashPolicy::KeepAll);
        let mut all = images;
        for (index, image) in after_alone.into_iter().enumerate() {
            if let Some(image) = image {
                all[index] = Some(image);
            }
        }
        let all = self.next_images(all, false);
        self.start(all, Expect::Serve, None)
    }

    /// Replaces an unplugged disk that is a mirror's or raid5's member by a new blank disk,
    /// online (`Control::ReplaceMember`, what `strata replace` sends). The new disk carries
    /// the hierarchy label under the old disk's name, as a replacement does.
    fn replace_disk(&mut self, pick: u32) -> Result<(), String> {
        let candidates: Vec<(usize, String, usize)> = self
            .gone
            .keys()
            .filter(|&&d| self.boot().disks[d].is_some())
            .filter_map(|&d| {
                let name = format!("d{d}");
                let parent = self.shape.parent_of(&name)?;
                let index = parent.children.iter().position(|c| *c == name)?;
                let journal = parent.journal_device && index + 1 == parent.children.len();
                (generate::REDUNDANT.contains(&parent.kind) && !journal)
                    .then(|| (d, parent.name.clone(), index))
            })
            .collect();
        if candidates.is_empty() {
            return self.skip("replace-disk");
        }
        let (disk, array, index) = candidates[pick as usize % candidates.len()].clone();
        let name = format!("d{disk}");
        // The label the array's other members carry, under this disk's name.
        let sibling = self
            .shape
            .parent_of(&name)
            .expect("a parent")
            .children
            .iter()
            .filter_map(|c| c.strip_prefix('d').and_then(|i| i.parse::<usize>().ok()))
            .find(|&i| i != disk && !self.gone.contains_key(&i) && self.boot().disks[i].is_some());
        let Some(sibling) = sibling else {
            return self.skip("replace-disk");
        };
        let boot = self.boot.as_mut().expect("running");
        let sibling_disk = boot.disks[sibling].clone().expect("present");
        let mut label = match boot.sim.try_block_on(hierarchy::read_label(&sibling_disk)) {
            Ok(Ok(Some(label))) => label,
            other => return Err(format!("d{sibling} has no readable label: {other:?}")),
        };
        label.member = name.clone();
        let fresh = boot
            .group
            .disk(strata_crash::sector_disk(self.shape.disks[disk]));
        let timed: DeviceRef = Arc::new(TimedDisk::new(fresh.clone(), disk, boot.timing.clone()));
        if let Err(e) = boot
            .sim
            .try_block_on(hierarchy::write_label(timed.as_ref(), &label))
        {
            return Err(format!("labelling the replacement of {name}: {e:?}"));
        }
        let view = hierarchy::Labelled::new(&name, timed).map_err(|e| format!("{e:#}"))?;
        let member = strata_core::Member {
            name: name.clone(),
            device: Arc::new(view),
        };
        let node = boot
            .nodes()
            .iter()
            .find(|n| n.name == array)
            .map(|n| n.control_device().clone())
            .ok_or_else(|| format!("{array} is not running"))?;
        // An array that has not noticed the disk is gone yet is told first, as an operator
        // runs `strata fail` before `strata replace`.
        let replace = |member| Control::ReplaceMember { index, member };
        if let Err(e) = self.control(&node, replace(member.clone())) {
            if !e.contains("only a failed member can be replaced") {
                return Err(e);
            }
            self.control(&node, Control::FailMember { index })?;
            self.control(&node, replace(member))?;
        }
        let boot = self.boot.as_mut().expect("running");
        boot.disks[disk] = Some(fresh);
        self.gone.remove(&disk);
        self.log
            .push(format!("  {name} replaced in {array} by a blank disk"));
        Ok(())
    }

    fn pool_node(&self) -> Option<(DeviceRef, String)> {
        let pool = self.plan.pool.as_ref()?;
        let node = self.boot().nodes().iter().find(|n| &n.name == pool)?;
        Some((node.control_device().clone(), pool.clone()))
    }

    fn control(&self, device: &DeviceRef, request: Control) -> Result<ControlReply, String> {
        let what = format!("{request:?}");
        match self.boot().sim.try_block_on(device.control(request)) {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(format!("{what} failed: {e}")),
            Err(stop) => Err(format!("{what} hung: {stop}")),
        }
    }

    fn volumes(&self) -> Vec<Target> {
        self.models
            .keys()
            .filter(|t| matches!(t, Target::Volume { .. }))
            .cloned()
            .collect()
    }

    fn create_volume(&mut self, id: u32, mib: u32) -> Result<(), String> {
        let Some((pool, pool_name)) = self.pool_node() else {
            return self.skip("volume-create");
        };
        let name = format!("v{id}");
        let target = Target::Volume {
            pool: pool_name,
            volume: name.clone(),
        };
        if self.models.contains_key(&target) {
            return self.skip("volume-create");
        }
        let size = u64::from(mib) * MIB;
        let request = Control::CreateVolume {
            name: name.clone(),
            size,
        };
        match self.boot().sim.try_block_on(pool.control(request)) {
            Ok(Ok(_)) => {}
            // A full pool may refuse a new volume for want of metadata space.
            Ok(Err(strata_core::BlockError::NoSpace)) => return self.skip("volume-create"),
            Ok(Err(e)) => return Err(format!("creating {name} failed: {e}")),
            Err(stop) => return Err(format!("creating {name} hung: {stop}")),
        }
        let model = self.new_model(size);
        self.models.insert(target.clone(), model);
        // A new volume reads as zeros, whatever the pool held before.
        let device = self.resolve(&target)?;
        self.check_whole(&target, &device)
    }

    fn check_whole(&mut self, target: &Target, device: &DeviceRef) -> Result<(), String> {
        let model = self.models.get_mut(target).expect("model");
        let sim = &self.boot.as_ref().expect("running").sim;
        read_and_check(sim, target, device, model, None).map(|_| ())
    }

    fn delete_volume(&mut self, nth: u32) -> Result<(), String> {
        let volumes = self.volumes();
        let Some((pool, _)) = self.pool_node() else {
            return self.skip("volume-delete");
        };
        if volumes.is_empty() {
            return self.skip("volume-delete");
        }
        let target = volumes[nth as usize % volumes.len()].clone();
        let Target::Volume { volume, .. } = &target else {
            unreachable!("volumes only")
        };
        self.control(
            &pool,
            Control::DeleteVolume {
                name: volume.clone(),
            },
        )?;
        self.models.remove(&target);
        self.lost.remove(&target);
        self.log.push(format!("  deleted {target}"));
        Ok(())
    }

    fn resize_volume(&mut self, nth: u32, mib: u32) -> Result<(), String> {
        let volumes = self.volumes();
        let Some((pool, _)) = self.pool_node() else {
            return self.skip("volume-resize");
        };
        if volumes.is_empty() {
            return self.skip("volume-resize");
        }
        let target = volumes[nth as usize % volumes.len()].clone();
        let Target::Volume { volume, .. } = &target else {
            unreachable!("volumes only")
        };
        let size = u64::from(mib) * MIB;
        self.control(
            &pool,
            Control::ResizeVolume {
                name: volume.clone(),
                size,
            },
        )?;
        self.models.get_mut(&target).expect("model").resize(size);
        if let Some(lost) = self.lost.get_mut(&target) {
            lost.retain(|&at| at < size);
        }
        let device = self.resolve(&target)?;
        if device.geometry().size != size {
            return Err(format!(
                "{target} resized to {size} bytes has {}",
                device.geometry().size
            ));
        }
        self.log.push(format!("  resized {target} to {mib} MiB"));
        self.check_whole(&target, &device)
    }

    /// An online change through the server's own path (`Reconfig::apply` over [`SimSite`]):
    /// a new leg for a mirror, a new tail for a concat, a raid5 grown onto `count` new disks
    /// (a healthy one: a degraded array refuses to grow), or a slice made longer. The config and every label
    /// are rewritten, as `strata add-member` and `strata grow` do; later starts are from the
    /// edited config.
    fn grow(&mut self, pick: u32, count: u32) -> Result<(), String> {
        let room = self.plan.shape.disks.len() + MAX_ADDED_DISKS - self.shape.disks.len();
        let running = |name: &str| {
            (self.boot().nodes().iter()).any(|n| n.name == name && n.device().is_some())
        };
        let kinds = ["mirror", "concat", "raid5", "slice"];
        let candidates: Vec<(String, &'static str)> = (self.shape.layers.iter())
            .filter(|l| kinds.contains(&l.kind) && running(&l.name))
            .filter(|l| match l.kind {
                "raid5" => {
                    count as usize <= room
                        && self.nothing_missing_under(&l.name)
                        && self.healthy_node(&l.name)
                }
                "mirror" => room > 0 && l.children.len() < 4,
                "slice" => self
                    .slice_room(&l.name)
                    .is_some_and(|(now, most)| now < most),
                _ => room > 0,
            })
            .map(|l| (l.name.clone(), l.kind))
            .collect();
        if candidates.is_empty() {
            return self.skip("grow");
        }
        let (layer, kind) = candidates[pick as usize % candidates.len()].clone();
        let first = self.shape.disks.len();
        let path = |i: usize| std::path::PathBuf::from(format!("d{i}.img"));
        let change = match kind {
            "raid5" => {
                let mut options = toml::Table::new();
                let policy = if pick.is_multiple_of(2) { "alv" } else { "md" };
                options.insert("policy".into(), policy.into());
                strata_stack::reconfig::Change::GrowMembers {
                    layer: layer.clone(),
                    paths: (first..first + count as usize).map(path).collect(),
                    options,
                }
            }
            "slice" => {
                // Longer by 64 KiB to all the room its child leaves.
                let (now, most) = self.slice_room(&layer).expect("a candidate");
                let steps = (most - now) / (64 << 10);
                let size = now + (1 + u64::from(pick) % steps.max(1)) * (64 << 10);
                strata_stack::reconfig::Change::Grow {
                    layer: layer.clone(),
                    size: size.min(most),
                }
            }
            _ => strata_stack::reconfig::Change::AddMember {
                layer: layer.clone(),
                path: path(first),
                name: Some(format!("d{first}")),
            },
        };
        let boot = self.boot.as_mut().expect("running");
        let site = Arc::new(SimSite::new(
            self.config_text.clone(),
            boot.group.clone(),
            boot.timing.clone(),
        ));
        let mut loaded = self.loaded.clone();
        loaded.source = Some(self.data_dir.join("explore.toml"));
        let mut reconfig = strata_stack::reconfig::Reconfig {
            loaded,
            runtime: boot.sim.runtime(),
            metrics: MetricsRegistry::default(),
            site: site.clone(),
        };
        let stack = boot.stack.as_mut().expect("a running stack");
        let mut nodes = std::mem::take(&mut stack.nodes);
        let applied = boot.sim.try_block_on(reconfig.apply(change, &mut nodes));
        stack.nodes = nodes;
        let summary = match applied {
            Ok(Ok(summary)) => summary,
            // The layer refused the change (a raid5 journal too small for more members): the
            // change path undid what it had done, and nothing may have changed.
            Ok(Err(e)) if refused(&e) => {
                if site.text() != self.config_text {
                    return Err(format!(
                        "a refused grow of {layer} changed the config: {e:#}"
                    ));
                }
                self.coverage.count("grow-refused", kind);
                self.log
                    .push(format!("  growing {layer} ({kind}) refused: {e:#}"));
                return Ok(());
            }
            Ok(Err(e)) => return Err(format!("growing {layer} ({kind}) failed: {e:#}")),
            Err(stop) => return Err(format!("growing {layer} ({kind}) hung: {stop}")),
        };
        self.config_text = site.text();
        self.loaded = reconfig.loaded;
        self.loaded.source = None;
        for (index, disk) in site.made() {
            if index != self.shape.disks.len() {
                return Err(format!(
                    "a change added d{index}; d{} was next",
                    self.shape.disks.len()
                ));
            }
            self.shape
                .disks
                .push(strata_core::BlockDevice::geometry(&disk).size);
            boot.disks.push(Some(disk));
        }
        for layer in &mut self.shape.layers {
            if let Some(config) = self.loaded.layers.iter().find(|l| l.name == layer.name) {
                layer.children = config.children.clone();
            }
        }
        self.grown.insert(layer.clone());
        self.coverage.count("grown", kind);
        self.log.push(format!(
            "  {layer} ({kind}) grew onto d{first}..d{}: {summary}",
            self.shape.disks.len() - 1
        ));
        // A concat or a slice is bigger at once; a concat's new tail reads as it is (zeros,
        // on a blank disk).
        self.adopt_grown_targets()
    }

    /// A running slice's length now and the most it may grow to (its child's size past its
    /// offset), in whole 64 KiB.
    fn slice_room(&self, name: &str) -> Option<(u64, u64)> {
        let boot = self.boot();
        let node = boot.nodes().iter().find(|n| n.name == name)?;
        let status = boot.sim.try_block_on(node.describe()).ok()?.ok()?;
        let offset = match status.config.as_ref()?.get("offset")? {
            toml::Value::Integer(bytes) => *bytes as u64,
            toml::Value::String(text) => strata_core::ByteSize::parse(text).ok()?.0,
            _ => return None,
        };
        let layer = self.shape.layers.iter().find(|l| l.name == name)?;
        let child = boot.nodes().iter().find(|n| n.name == layer.children[0])?;
        let most = (child.device()?.geometry().size - offset) / (64 << 10) * (64 << 10);
        Some((status.size, most))
    }

    /// [`Self::adopt_growth`] for every target over a grown layer (the others' sizes are
    /// checked at each start).
    fn adopt_grown_targets(&mut self) -> Result<(), String> {
        let targets: Vec<Target> = (self.models.keys())
            .filter(|t| self.grown.iter().any(|layer| self.over(t, layer)))
            .cloned()
            .collect();
        for target in targets {
            let device = self.resolve(&target)?;
            self.adopt_growth(&target, &device)?;
        }
        Ok(())
    }

    /// A target over a grown layer may be bigger now: its model takes the new tail as it
    /// reads (a reshape may leave old copies of the array's own data there; a new blank disk
    /// reads zeros). A target that grew with nothing under it grown is a defect.
    fn adopt_growth(&mut self, target: &Target, device: &DeviceRef) -> Result<(), String> {
        let size = device.geometry().size;
        let old = self.models.get(target).expect("model").size();
        if size <= old {
            return Ok(());
        }
        if !self.grown.iter().any(|layer| self.over(target, layer)) {
            return Err(format!(
                "{target} grew from {old} to {size} bytes with no layer under it grown"
            ));
        }
        let sim = &self.boot().sim;
        let mut tail = bytes::BytesMut::with_capacity((size - old) as usize);
        let mut at = old;
        while at < size {
            let len = (size - at).min(MIB);
            match read(sim, target, device, at, len)? {
                Ok(data) => tail.extend_from_slice(&data),
                Err(e) => {
                    return Err(format!(
                        "{target}: reading its new capacity at {at} failed: {e}"
                    ))
                }
            }
            at += len;
        }
        (self.models.get_mut(target).expect("model")).grow_as_read(size, tail.freeze());
        self.coverage
            .add("grown-capacity", "MiB", (size - old) / MIB);
        self.log
            .push(format!("  {target} grew from {old} to {size} bytes"));
        Ok(())
    }
}

/// Reads `device` whole, in pieces, and checks it against `model`: after a start (`settle`:
/// any candidate may be there, and the model is pinned to what was read), or live.
///
/// After a start (`lost`: the units already known lost), a piece that fails to read is
/// read again unit by unit: a unit may fail (damage reported, as a raid5 reports a chunk
/// lost in a crash while degraded) only if the model has every sector of it in doubt. Such
/// units are then rewritten with zeros, as the operator would (adjacent ones in one write:
/// a raid5 forgets a lost chunk only once one write covers it whole), and must read back.
/// A unit whose rewrite the array refused (the chunk reaches outside this target, which
/// cannot rewrite it whole) joins `lost` instead. Returns the sectors reported lost.
fn read_and_check(
    sim: &Simulation,
    target: &Target,
    device: &DeviceRef,
    model: &mut DeviceModel,
    mut lost: Option<&mut std::collections::BTreeSet<u64>>,
) -> Result<u64, String> {
    let settle = lost.is_some();
    let size = device.geometry().size;
    let unit = u64::from(device.geometry().min_io).max(512);
    let piece = 256 * 1024;
    let mut failed = Vec::new();
    let mut offset = 0;
    while offset < size {
        let len = piece.min(size - offset);
        match read(sim, target, device, offset, len)? {
            Ok(data) => check(target, model, offset, &data, settle)?,
            Err(e) if settle => {
                for at in (offset..offset + len).step_by(unit as usize) {
                    match read(sim, target, device, at, unit)? {
                        Ok(data) => check(target, model, at, &data, true)?,
                        Err(_) if lost.as_ref().is_some_and(|l| l.contains(&at)) => {}
                        Err(e) => failed.push((at, e)),
                    }
                }
                let known = lost
                    .as_ref()
                    .is_some_and(|l| l.range(offset..offset + len).next().is_some());
                if failed.is_empty() && !known {
                    return Err(format!(
                        "{target}: read [{offset}, +{len}) failed, its units did not: {e}"
                    ));
                }
            }
            Err(e) => return Err(format!("{target}: read [{offset}, +{len}) failed: {e}")),
        }
        offset += len;
    }
    for (at, e) in &failed {
        if !client::in_doubt(model, *at, unit) {
            return Err(format!(
                "{target}: read [{at}, +{unit}) failed after a start where the model holds a \
                 durable write: {e}"
            ));
        }
    }
    // Adjacent units are rewritten in one request: a raid5 forgets a lost chunk only when
    // one write covers it whole.
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &(at, _) in &failed {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == at && *len < MAX_REWRITE => *len += unit,
            _ => runs.push((at, unit)),
        }
    }
    // Runs the array refused to rewrite: only part of the lost chunk lies in this target.
    let mut refused: Vec<(u64, u64)> = Vec::new();
    for (at, len) in runs {
        let id = model.zeroes_started(at, len);
        let zeros = bytes::Bytes::from(vec![0u8; len as usize]);
        match sim.try_block_on(device.write(at, zeros, strata_core::WriteFlags { fua: true })) {
            Ok(Ok(())) => model.write_completed(id, true),
            Ok(Err(e)) if e.to_string().contains(client::LOST) => {
                model.write_failed(id);
                refused.push((at, len));
            }
            Ok(Err(e)) => {
                return Err(format!(
                    "{target}: [{at}, +{len}) was reported lost and cannot be rewritten: {e}"
                ))
            }
            Err(stop) => return Err(format!("{target}: a rewrite hung: {stop}")),
        }
    }
    for &(at, _) in &failed {
        let was_refused = refused
            .iter()
            .any(|&(start, len)| start <= at && at < start + len);
        match read(sim, target, device, at, unit)? {
            Ok(data) => check(target, model, at, &data, true)?,
            // Kept out of later checks: this target cannot rewrite the chunk whole.
            Err(_) if was_refused => {
                if let Some(lost) = lost.as_mut() {
                    lost.insert(at);
                }
            }
            // The array took the rewrite, with FUA: it must read back.
            Err(e) => {
                return Err(format!(
                    "{target}: [{at}, +{unit}) was rewritten after being reported lost and \
                     still fails: {e}"
                ))
            }
        }
    }
    Ok(failed.len() as u64 * unit / 512)
}

fn read(
    sim: &Simulation,
    target: &Target,
    device: &DeviceRef,
    offset: u64,
    len: u64,
) -> Result<strata_core::Result<bytes::BytesMut>, String> {
    sim.try_block_on(device.read(offset, len as usize))
        .map_err(|stop| format!("{target}: a read hung: {stop}"))
}

fn check(
    target: &Target,
    model: &mut DeviceModel,
    offset: u64,
    data: &[u8],
    settle: bool,
) -> Result<(), String> {
    if settle {
        model
            .check(offset, data)
            .map_err(|e| format!("{target} after a start: {e}"))?;
        model.settle(offset, data);
    } else {
        model
            .check_live(offset, data)
            .map_err(|e| format!("{target}: {e}"))?;
    }
    Ok(())
}

/// A change refused as unsafe now (by the change path) or invalid (by the layer), as
/// opposed to one that failed.
fn refused(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.is::<strata_stack::reconfig::Refused>()
            || matches!(
                cause.downcast_ref::<strata_core::BlockError>(),
                Some(strata_core::BlockError::InvalidArgument(_))
            )
    })
}

fn healthy(status: &strata_core::NodeStatus) -> bool {
    status.health == Health::Ok && status.activity.is_none() && status.children.iter().all(healthy)
}
