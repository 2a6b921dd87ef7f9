//! Helpers shared by the mirror and raid5 tests: the options they open with, opening over a
//! list of children, the control requests they send and how they check a refusal.

#![allow(dead_code)] // Each test crate uses a different subset.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata_backend::MemoryDevice;
use strata_core::async_trait;
use strata_crash::testkit::{Intercepted, Interceptor, Request};

use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, Control, ControlReply, DeviceRef, Member, Result, TokioRuntime};
use strata_crash::testkit::{assert_refused, slot_names};
use strata_crash::CrashDisk;
use strata_raid::mirror::{Mirror, MirrorOptions};

/// Careful: what the server passes on an ordinary restart.
pub const RESTART: StartPolicy = StartPolicy {
    may_format: false,
    allow_degraded: false,
};

/// A restart that may start with members missing (`--degraded`).
pub const DEGRADED: StartPolicy = StartPolicy {
    may_format: false,
    allow_degraded: true,
};

/// Mirror options for tests: two resync workers copying 16 KiB at a time, progress
/// checkpointed every four regions, started fresh.
pub fn mirror_options(metadata_size: u64, region: u64, bitmap_clear: Duration) -> MirrorOptions {
    MirrorOptions {
        region,
        metadata_size,
        bitmap_clear,
        resync_concurrency: 2,
        copy_chunk: 16 << 10,
        resync_checkpoint: 4 * region,
        start: StartPolicy::FRESH,
    }
}

/// Opens mirror `m` over slots `d0`, `d1`, … holding `children` (None = missing).
pub async fn open_mirror(
    children: Vec<Option<DeviceRef>>,
    options: MirrorOptions,
) -> Result<Mirror> {
    let names = slot_names(children.len());
    Mirror::open(
        "m".into(),
        names,
        children,
        options,
        TokioRuntime::current(),
    )
    .await
}

/// Every crash disk as a present child.
pub fn children(disks: &[CrashDisk]) -> Vec<Option<DeviceRef>> {
    disks
        .iter()
        .map(|d| Some(Arc::new(d.clone()) as DeviceRef))
        .collect()
}

/// Fails member `index` of a mirror or raid5, as `strata fail` does.
pub async fn fail_member(array: &dyn BlockDevice, index: usize) -> Result<ControlReply> {
    array.control(Control::FailMember { index }).await
}

/// The request that replaces member `index` with `device`, named `name`.
pub fn replace(index: usize, name: &str, device: DeviceRef) -> Control {
    Control::ReplaceMember {
        index,
        member: Member {
            name: name.into(),
            device,
        },
    }
}

/// Asserts that `result` is a refusal whose message names every one of `words`.
#[track_caller]
pub fn refused<T>(result: Result<T>, words: &[&str]) {
    assert_refused(result, "refused", words);
}

/// Opens a new raid5 over `members` (chunk and journal bytes given, journals on the members).
pub async fn fresh_raid5<D: BlockDevice + 'static>(
    members: &[Arc<D>],
    chunk: u64,
    journal: u64,
) -> strata_raid::raid5::Raid5 {
    let children = members
        .iter()
        .map(|m| Some(m.clone() as DeviceRef))
        .collect();
    let settings = strata_raid::raid5::Settings {
        chunk: Some(chunk),
        journal: Some(journal),
        journal_device: None,
        unsafe_skip_journal: false,
        start: StartPolicy::FRESH,
    };
    strata_raid::raid5::Raid5::open("r5".into(), children, settings, TokioRuntime::current())
        .await
        .unwrap()
}

/// A gate requests can be held at: while it is closed, [`Gate::pass`] waits, counted.
#[derive(Default)]
pub struct Gate {
    held: AtomicBool,
    waiting: AtomicU64,
    released: tokio::sync::Notify,
}

impl Gate {
    pub fn hold(&self, held: bool) {
        self.held.store(held, Ordering::Release);
        self.released.notify_waiters();
    }

    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Requests waiting at the gate now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Waits while the gate is held.
    pub async fn pass(&self) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        while self.is_held() {
            let released = self.released.notified();
            if !self.is_held() {
                break;
            }
            released.await;
        }
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Holds member flushes at its gate.
#[derive(Default)]
pub struct HeldFlush {
    pub gate: Gate,
}

#[async_trait]
impl Interceptor for HeldFlush {
    async fn before(&self, request: Request) -> Result<()> {
        if request == Request::Flush && self.gate.is_held() {
            self.gate.pass().await;
        }
        Ok(())
    }
}

/// `n` members of `size` bytes whose flushes can be held.
pub fn held_members(n: usize, size: u64) -> Vec<Arc<Intercepted<HeldFlush>>> {
    (0..n)
        .map(|_| Intercepted::new(Arc::new(MemoryDevice::new(size)), HeldFlush::default()))
        .collect()
}

pub fn hold(members: &[Arc<Intercepted<HeldFlush>>], held: bool) {
    for member in members {
        member.gate.hold(held);
    }
}

pub fn flushes_waiting(members: &[Arc<Intercepted<HeldFlush>>]) -> u64 {
    members.iter().map(|m| m.gate.waiting()).sum()
}

/// Waits (yielding) until `raid` is healthy, or gives up after many turns; returns its
/// health then.
pub async fn settle_health(raid: &strata_raid::raid5::Raid5) -> strata_core::Health {
    for _ in 0..200_000 {
        if raid.health() == strata_core::Health::Ok {
            break;
        }
        tokio::task::yield_now().await;
    }
    raid.health()
}
