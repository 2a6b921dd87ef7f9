//! `raid5`: block-interleaved distributed parity over three or more members, left-asymmetric
//! (ALV paper §1.1), with a stripe journal that closes the write hole, degraded operation
//! with one member failed, and online rebuild onto a replacement.
//!
//! ```toml
//! [[layer]]
//! name = "r5"
//! kind = "raid5"
//! children = ["d0", "d1", "d2", "d3"]
//! chunk = "64KiB"      # power of two ≥ 4 KiB; fixed at creation (default 64 KiB)
//! journal = "4MiB"     # stripe journal per member; fixed at creation
//! ```
//!
//! With `journal-device = "nv0"` naming the last child (fixed at creation), every member's
//! journal lives on that device instead (a small fast disk, as md's `--write-journal`): a
//! small write then costs its 4 member I/Os and nothing more on the members, and journal
//! writes no longer queue behind member data. The array will not start without it; if it
//! fails, writes are refused (EIO) and reads go on.
//!
//! One member may be missing at assembly: the array runs degraded, if the metadata already
//! records it failed or the start policy allows a degraded start. The on-disk layout, the
//! journal protocol and what each write costs are in `docs/layers/raid5.md`.
//!
//! Files: `layout` (where chunks live), `plan` (pure: which member I/O a stripe's part of a
//! request needs), `members` (member states and the mirrored metadata device), `record`
//! (the persistent record), `journal` (write-hole log), `array` (shared state, failures,
//! flushes), `io` (the data path), `recover` (journal replay at open), `open` (create and
//! assemble), `rebuild`, `shape` (the geometry during a grow: where a request goes),
//! `reshape` (pure: ALV's and MD-Reshape's policies), `grow` (starting a grow, its critical
//! section, checkpoints), `mover` (the grow's background copy).

mod array;
pub mod assembly;
mod grow;
mod io;
pub mod journal;
pub mod layout;
pub mod members;
mod mover;
mod open;
pub mod plan;
mod rebuild;
pub mod record;
mod recover;
pub mod reshape;
pub mod shape;

use std::sync::Arc;
use strata_core::layer::verbs;

use bytes::{Bytes, BytesMut};
use futures_util::future::{join_all, try_join_all};
use strata_core::{
    async_trait, poison, BlockDevice, BlockError, Capabilities, Control, ControlReply, DeviceRef,
    Geometry, Health, NodeStatus, Result, Runtime, WriteFlags, ZeroFlags,
};

pub use grow::{GrowOptions, GrowTuning};
pub use layout::Layout;
pub use members::{MemberState, META_BYTES};
pub use open::{default_journal, Settings, DEFAULT_CHUNK, DEFAULT_JOURNAL};

use serde::{Deserialize, Serialize};
use strata_core::layer::{self, ChildCount, LayerArgs, LayerKind};
use strata_core::ByteSize;

pub static KIND: LayerKind =
    LayerKind::new::<Raid5Config>("raid5", ChildCount::AtLeast(3), |args| {
        Box::pin(async move { build(args).await.map(|r| Arc::new(r) as DeviceRef) })
    })
    .about("distributed parity over ≥ 3 members (left-asymmetric), journaled, degraded, rebuild")
    .tolerating(|_| 1)
    .verbs(&[
        verbs::REPLACE,
        verbs::FAIL_MEMBER,
        verbs::GROW_MEMBERS,
        GROW_PAUSE,
        GROW_RESUME,
    ]);

/// `strata raid5 pause`: the grow under way stops after its current window, durably.
pub const GROW_PAUSE: layer::Verb = layer::Verb {
    name: "grow-pause",
    args: &[],
    help: "pause the grow under way (it stays paused across restarts)",
};

/// `strata raid5 resume`.
pub const GROW_RESUME: layer::Verb = layer::Verb {
    name: "grow-resume",
    args: &[],
    help: "resume a paused grow",
};

/// A `[[layer]]` table of kind `raid5`. Chunk and journal are fixed at creation: absent,
/// an array takes what it was created with, and a new one [`DEFAULT_CHUNK`] and
/// [`default_journal`]; given, they must match what the array records. `describe` always
/// gives both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Raid5Config {
    /// A power of two, at least 4 KiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk: Option<ByteSize>,
    /// Stripe journal bytes per member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal: Option<ByteSize>,
    /// The child (the last one) that holds every member's journal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_device: Option<String>,
}

async fn build(args: LayerArgs) -> Result<Raid5> {
    let config: Raid5Config = args.options.parse()?;
    let journal_device = match &config.journal_device {
        Some(child) => Some(
            args.child_names
                .iter()
                .position(|name| name == child)
                .ok_or_else(|| {
                    BlockError::InvalidArgument(format!(
                        "raid5 {}: journal-device = \"{child}\" is not one of its children ({})",
                        args.name,
                        args.child_names.join(", ")
                    ))
                })?,
        ),
        None => None,
    };
    // Last, so that a member's place among the children is its index in the array (the
    // admin verbs name members by that place).
    if journal_device.is_some_and(|j| j + 1 != args.child_names.len()) {
        return Err(BlockError::InvalidArgument(format!(
            "raid5 {}: the journal device must be the last of the children",
            args.name
        )));
    }
    let settings = Settings {
        chunk: config.chunk.map(|c| c.0),
        journal: config.journal.map(|j| j.0),
        journal_device,
        unsafe_skip_journal: false,
        start: args.start,
    };
    let mut raid5 = Raid5::open(args.name, args.children, settings, args.runtime).await?;
    raid5.journal_device_name = config.journal_device;
    Ok(raid5)
}

/// Largest request accepted in one call.
const MAX_IO: u32 = 32 << 20;

pub struct Raid5 {
    array: Arc<array::Array>,
    /// The journal device's name in the configuration, for `describe`.
    journal_device_name: Option<String>,
}

impl Raid5 {
    /// Opens the array on `children` (None = a member missing), creating it only on blank
    /// members when `settings.start` allows, and resumes an interrupted rebuild.
    pub async fn open(
        name: String,
        children: Vec<Option<DeviceRef>>,
        settings: Settings,
        runtime: Arc<dyn Runtime>,
    ) -> Result<Raid5> {
        let array = open::assemble(name, children, settings, runtime).await?;
        let rebuilding = array
            .members
            .snapshot()
            .iter()
            .position(|m| m.state == MemberState::Rebuilding);
        if let Some(index) = rebuilding {
            array.spawn_rebuild(index);
        }
        if array.reshape_record()?.is_some() {
            array.spawn_grow();
        }
        Ok(Raid5 {
            array,
            journal_device_name: None,
        })
    }

    /// The geometry the array has, or grows to.
    pub fn layout(&self) -> Layout {
        self.array.layout()
    }

    /// Where a grow stands (None when no grow is under way).
    pub fn moving(&self) -> Option<shape::Moving> {
        self.array.shape().moving
    }

    /// Member states now.
    pub fn member_states(&self) -> Vec<MemberState> {
        self.array
            .members
            .snapshot()
            .iter()
            .map(|m| m.state)
            .collect()
    }

    /// Journal reclaims completed since the array was opened (records freed while the writes
    /// go on; the synchronous resets at open, replace and grow are not counted).
    pub fn journal_reclaims(&self) -> u64 {
        self.array
            .reclaims
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Journal reclaims that ended in an error (a write or flush under them failed; the
    /// records stay and the next reclaim frees them).
    pub fn journal_reclaims_failed(&self) -> u64 {
        self.array
            .reclaims_failed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a journal reclaim (or a journal reset) is under way now.
    pub fn journal_reclaiming(&self) -> bool {
        self.array.reclaim_lock.try_lock().is_err()
    }

    /// Array byte ranges that read as errors because a crash tore them while degraded.
    pub fn lost_ranges(&self) -> Vec<(u64, u64)> {
        let shape = self.array.shape();
        let lost = self.array.lost.lock();
        let lost = lost
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        lost.into_iter()
            .filter_map(|(stripe, member)| {
                let layout = shape.row_layout(stripe)?;
                let r = layout.data_index(stripe, member)? as u64;
                let offset = stripe * layout.stripe_bytes() + r * layout.chunk_bytes;
                Some((offset, layout.chunk_bytes))
            })
            .collect()
    }

    pub fn health(&self) -> Health {
        let a = &self.array;
        let Ok(journal_failed) =
            poison::check(a.journal_failed.lock(), &a.name, "the journal state")
        else {
            return Health::Failed;
        };
        match a.members.unhealthy() {
            0 | 1 if journal_failed.is_some() => Health::ReadOnly,
            0 => Health::Ok,
            1 => Health::Degraded,
            _ => Health::Failed,
        }
    }

    async fn describe(&self) -> Result<NodeStatus> {
        let a = &self.array;
        let shape = a.shape();
        let layout = shape.layout;
        let mut node = NodeStatus::new(&a.name, "raid5", shape.size());
        // Activity before health: a rebuild marks its member in sync just before clearing
        // its activity, and a healthy array must not show a rebuild still running.
        let activity = poison::check(a.activity.lock(), &a.name, "the rebuild progress")?.clone();
        let grow = a.grow_status()?;
        node.health = self.health();
        let journal_bytes = a.array_record()?.journal_bytes;
        let journal_failed =
            poison::check(a.journal_failed.lock(), &a.name, "the journal state")?.clone();
        let states = a.members.snapshot();
        node.detail = vec![
            ("chunk".into(), layout.chunk_bytes.to_string()),
            ("members".into(), layout.members.to_string()),
            ("layout".into(), "left-asymmetric".into()),
            ("journal bytes".into(), journal_bytes.to_string()),
            ("lost chunks".into(), a.lost_chunks()?.len().to_string()),
            (
                "journal findings".into(),
                a.journal_findings
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .to_string(),
            ),
            (
                "journal reclaims".into(),
                a.reclaims
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .to_string(),
            ),
            (
                "stripe updates".into(),
                a.stripe_updates
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .to_string(),
            ),
            (
                "coalesced writes".into(),
                a.coalesced_writes
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .to_string(),
            ),
        ];
        for (i, m) in states.iter().enumerate() {
            node.detail.push((
                format!("member {i}"),
                format!("{:?}", m.state).to_lowercase(),
            ));
        }
        for (i, m) in states.iter().enumerate() {
            let child = match a.members.device(i) {
                Some(device) => match device.control(Control::Describe).await {
                    Ok(ControlReply::Describe(status)) => status,
                    _ => NodeStatus::new(format!("member {i}"), "unknown", device.geometry().size),
                },
                None => NodeStatus::new(format!("member {i}"), "missing", 0),
            };
            let mut child = child;
            if m.state == MemberState::Failed {
                child.health = Health::Failed;
            }
            node.children.push(child);
        }
        let mut config = Raid5Config {
            chunk: Some(ByteSize(layout.chunk_bytes)),
            journal: Some(ByteSize(journal_bytes)),
            journal_device: None,
        };
        if let Some(device) = &a.journal_device {
            node.detail.push((
                "journal device".into(),
                journal_failed
                    .clone()
                    .map_or("ok".into(), |reason| format!("failed: {reason}")),
            ));
            let mut child = match device.control(Control::Describe).await {
                Ok(ControlReply::Describe(status)) => status,
                _ => NodeStatus::new("journal device", "unknown", device.geometry().size),
            };
            if journal_failed.is_some() {
                child.health = Health::Failed;
            }
            // A Raid5 opened directly (not from a configuration) knows its journal device
            // only by what the device calls itself.
            config.journal_device = Some(
                self.journal_device_name
                    .clone()
                    .unwrap_or(child.name.clone()),
            );
            node.children.push(child);
        }
        node.config = layer::to_table(&config);
        node.activity = activity.filter(|_| node.health != Health::Ok);
        if let Some(grow) = grow {
            // A rebuild during a (waiting) grow is the more urgent news.
            if node.activity.is_none() {
                node.activity = Some(grow.activity);
            }
            node.detail.extend(grow.detail);
        } else {
            node.detail.extend(a.last_grow_detail()?);
        }
        Ok(node)
    }

    async fn write_range(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        let a = &self.array;
        a.check_writable()?;
        let started = a.runtime.now();
        let (routed, _window) = a.route(offset, data.len() as u64, true).await?;
        let mut stripes = Vec::new();
        for (layout, at, len, src) in routed {
            for (stripe, within, part, done) in layout.split(at, len) {
                stripes.push((layout, stripe, within, src + done, part));
            }
        }
        // join_all, not try_join_all: a failed stripe must not cancel its siblings halfway
        // through their updates (the journal would then hold records nobody waits for).
        let results = join_all(
            stripes
                .into_iter()
                .map(|(layout, stripe, within, src, len)| {
                    let data = data.slice(src as usize..(src + len) as usize);
                    async move { a.write_stripe(layout, stripe, within, data, fua).await }
                }),
        )
        .await;
        a.observe(started, data.len() as u64);
        results.into_iter().collect()
    }
}

#[async_trait]
impl BlockDevice for Raid5 {
    fn geometry(&self) -> Geometry {
        let shape = self.array.shape();
        let layout = shape.layout;
        Geometry {
            size: shape.size(),
            min_io: self.array.min_io,
            logical_block: self.array.min_io,
            physical_block: 4096.max(self.array.min_io),
            preferred_io: layout.stripe_bytes().min(u64::from(MAX_IO)) as u32,
            max_io: MAX_IO,
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            discard: false,
            fast_zero: false,
            block_status: false,
            ..Capabilities::ALL
        }
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.geometry().check_range(offset, len as u64)?;
        let a = &self.array;
        a.check_alive()?;
        let started = a.runtime.now();
        let (routed, _window) = a.route(offset, len as u64, false).await?;
        let mut buf = BytesMut::zeroed(len);
        let mut rest: &mut [u8] = &mut buf;
        let mut parts = Vec::new();
        // Pieces come in request order, and so do their stripes.
        for (layout, at, piece, _) in routed {
            for (stripe, within, part, _) in layout.split(at, piece) {
                let (head, tail) = rest.split_at_mut(part as usize);
                parts.push(a.read_stripe(layout, stripe, within, head));
                rest = tail;
            }
        }
        try_join_all(parts).await?;
        a.observe(started, len as u64);
        Ok(buf)
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.geometry().check_range(offset, data.len() as u64)?;
        self.write_range(offset, data, flags.fua).await
    }

    async fn flush(&self) -> Result<()> {
        self.array.flush().await
    }

    /// Discard is a no-op: the contract allows old contents to stay.
    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.geometry().check_range(offset, len)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.geometry().check_range(offset, len)?;
        if flags.fast {
            return Err(BlockError::Unsupported("raid5: fast zero"));
        }
        // Zeros go through the ordinary write path, in stripe-aligned pieces of bounded size.
        let step = self.array.layout().stripe_bytes() * 16;
        let mut pos = offset;
        while pos < offset + len {
            let take = (step - pos % step).min(offset + len - pos);
            self.write_range(pos, Bytes::from(vec![0u8; take as usize]), flags.fua)
                .await?;
            pos += take;
        }
        Ok(())
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        if let Some(reply) = self.array.background.control(&request).await {
            return Ok(reply);
        }
        match request {
            Control::Describe => Ok(ControlReply::Describe(self.describe().await?)),
            Control::FailMember { index } if index < self.array.layout().members => {
                let result = self.array.fail_member(index).await;
                if self.array.members.unhealthy() >= 2 {
                    return Err(result
                        .err()
                        .unwrap_or_else(|| members::array_failed("fail member")));
                }
                Ok(ControlReply::Done)
            }
            Control::ReplaceMember { index, member } => {
                self.array.replace_member(index, member).await?;
                Ok(ControlReply::Done)
            }
            Control::GrowMembers { members, options } => {
                let options = grow_options(&self.array.name, &options)?;
                self.array.start_grow(members, options).await?;
                Ok(ControlReply::Done)
            }
            Control::Call { verb, .. } if verb == GROW_PAUSE.name || verb == GROW_RESUME.name => {
                self.array.pause_grow(verb == GROW_PAUSE.name).await?;
                Ok(ControlReply::Table(toml::Table::new()))
            }
            Control::FailMember { index } => Err(BlockError::InvalidArgument(format!(
                "raid5 {}: no member {index}",
                self.array.name
            ))),
            _ => Err(BlockError::Unsupported("raid5: control")),
        }
    }
}

/// A grow's options from the verb's arguments: `policy = "alv" | "md"` (default alv),
/// `on-failure = "continue" | "wait"` (default continue), and the rate control's knobs for
/// experiments (`GrowTuning`, not persisted): ALV's `bound-ms` (B, default 15), `slack`
/// (θ, 0 to 1, default 0.1) and `buffer-kib` (its aggregation buffer per member, default
/// 2048), md's `speed-min` and `speed-max` (KiB/s per member, defaults
/// 1,000 and 200,000) and `stripe-cache` (entries, default 512). A knob of the other
/// policy, or an unknown key, is refused.
fn grow_options(name: &str, args: &toml::Table) -> Result<GrowOptions> {
    let invalid = |what: String| BlockError::InvalidArgument(format!("raid5 {name}: {what}"));
    let text = |key: &str, default: &str| -> Result<String> {
        match args.get(key) {
            None => Ok(default.to_string()),
            Some(toml::Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(invalid(format!("{key} = {other}: expected a string"))),
        }
    };
    // A number given as TOML or as text (the CLI passes every argument as text).
    let number = |key: &str| -> Result<Option<f64>> {
        let value = match args.get(key) {
            None => return Ok(None),
            Some(toml::Value::Integer(i)) => *i as f64,
            Some(toml::Value::Float(f)) => *f,
            Some(toml::Value::String(s)) => s
                .parse()
                .map_err(|_| invalid(format!("{key} = {s:?}: expected a number")))?,
            Some(other) => return Err(invalid(format!("{key} = {other}: expected a number"))),
        };
        if !value.is_finite() || value < 0.0 {
            return Err(invalid(format!("{key} = {value}: expected a number >= 0")));
        }
        Ok(Some(value))
    };
    const KEYS: [&str; 8] = [
        "policy",
        "on-failure",
        "bound-ms",
        "slack",
        "buffer-kib",
        "speed-min",
        "speed-max",
        "stripe-cache",
    ];
    if let Some(key) = args.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(invalid(format!(
            "a grow has no option {key:?} (options: {})",
            KEYS.join(", ")
        )));
    }
    let policy: reshape::PolicyKind = text("policy", "alv")?
        .parse()
        .map_err(|e: String| invalid(format!("policy: {e}")))?;
    let wait_on_failure = match text("on-failure", "continue")?.as_str() {
        "continue" => false,
        "wait" => true,
        other => {
            return Err(invalid(format!(
                "on-failure = {other:?}: expected \"continue\" or \"wait\""
            )))
        }
    };
    let latency_bound = match number("bound-ms")? {
        None => None,
        Some(ms) if ms > 0.0 => Some(std::time::Duration::from_secs_f64(ms / 1000.0)),
        Some(_) => return Err(invalid("bound-ms must be above 0".into())),
    };
    let tuning = GrowTuning {
        latency_bound,
        slack: number("slack")?,
        buffer_bytes: number("buffer-kib")?.map(|kib| (kib * 1024.0) as u64),
        speed_min_kibps: number("speed-min")?.map(|v| v as u64),
        speed_max_kibps: number("speed-max")?.map(|v| v as u64),
        stripe_cache_pages: number("stripe-cache")?.map(|v| v as u64),
    };
    check_tuning(policy, &tuning).map_err(invalid)?;
    Ok(GrowOptions {
        policy,
        wait_on_failure,
        tuning,
    })
}

/// The knobs must belong to the policy's rate control and make sense together.
fn check_tuning(
    policy: reshape::PolicyKind,
    tuning: &GrowTuning,
) -> std::result::Result<(), String> {
    let valve =
        tuning.latency_bound.is_some() || tuning.slack.is_some() || tuning.buffer_bytes.is_some();
    let md = tuning.speed_min_kibps.is_some()
        || tuning.speed_max_kibps.is_some()
        || tuning.stripe_cache_pages.is_some();
    if policy == reshape::PolicyKind::Md && valve {
        return Err("bound-ms, slack and buffer-kib tune ALV; policy md has a funnel (speed-min, speed-max) and a stripe cache".into());
    }
    if policy == reshape::PolicyKind::Alv && md {
        return Err("speed-min, speed-max and stripe-cache tune md; policy alv has a valve (bound-ms, slack) and a buffer (buffer-kib)".into());
    }
    if tuning.buffer_bytes.is_some_and(|bytes| bytes < 4096) {
        return Err("buffer-kib must be at least 4".into());
    }
    if tuning.stripe_cache_pages == Some(0) {
        return Err("stripe-cache must be at least 1".into());
    }
    if tuning.slack.is_some_and(|slack| slack > 1.0) {
        return Err("slack is a ratio from 0 to 1".into());
    }
    let defaults = reshape::FunnelConfig::default();
    let min = tuning
        .speed_min_kibps
        .unwrap_or(defaults.speed_limit_min_kbps);
    let max = tuning
        .speed_max_kibps
        .unwrap_or(defaults.speed_limit_max_kbps);
    if min > max || max == 0 {
        return Err(format!(
            "speed-min ({min} KiB/s) must not exceed speed-max ({max} KiB/s), and speed-max must be above 0"
        ));
    }
    Ok(())
}
