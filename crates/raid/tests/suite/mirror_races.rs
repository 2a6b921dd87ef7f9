//! Deterministic reproductions of the mirror's races, with a member whose flush can be held at
//! a gate: the interleavings that `tests/suite/mirror.rs` hits only now and then under CPU load
//! (a worker thread descheduled between an I/O finishing and its result being acted upon).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use strata_core::{async_trait, BlockDevice, Control, DeviceRef, Result, WriteFlags};
use strata_crash::testkit::{Intercepted, Interceptor, Request};
use strata_crash::{sector_disk, CrashDisk, CrashGroup};
use strata_raid::mirror::{MemberState, Mirror, MirrorOptions};
use tokio::sync::Notify;

use crate::common;
use common::{fail_member, mirror_options, open_mirror, replace};

const META: u64 = 128 << 10;
const DATA: u64 = 1 << 20;
const REGION: u64 = 64 << 10;

fn options() -> MirrorOptions {
    // No cleaner timer: the only flushes are the ones the test issues.
    mirror_options(META, REGION, Duration::ZERO)
}

/// Which request of a [`GatedDisk`] waits at the gate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    Flush,
    /// A read of the data area (metadata reads pass: the store reads from this disk too).
    DataRead,
}

/// A disk whose next flush or data read, once armed, waits at a gate before it reaches the
/// disk.
type GatedDisk = Intercepted<Gates>;

struct Gates {
    armed: Mutex<Option<Gate>>,
    entered: Notify,
    release: Notify,
}

impl Gates {
    fn over(disk: &CrashDisk) -> Arc<GatedDisk> {
        Intercepted::new(
            Arc::new(disk.clone()),
            Gates {
                armed: Mutex::new(None),
                entered: Notify::new(),
                release: Notify::new(),
            },
        )
    }

    fn arm(&self, gate: Gate) {
        *self.armed.lock().unwrap() = Some(gate);
    }

    /// Waits at the gate if it is armed for `gate` (once).
    async fn pass(&self, gate: Gate) {
        let gated = {
            let mut armed = self.armed.lock().unwrap();
            let hit = *armed == Some(gate);
            if hit {
                *armed = None;
            }
            hit
        };
        if gated {
            // notify_one stores a permit, so neither side can miss the other.
            self.entered.notify_one();
            self.release.notified().await;
        }
    }
}

#[async_trait]
impl Interceptor for Gates {
    async fn before(&self, request: Request) -> Result<()> {
        match request {
            Request::Read { offset, .. } if offset >= META => self.pass(Gate::DataRead).await,
            Request::Flush => self.pass(Gate::Flush).await,
            _ => {}
        }
        Ok(())
    }
}

/// A fresh disk of `group`, sized for a member.
fn member_disk(group: &CrashGroup) -> CrashDisk {
    group.disk(sector_disk(META + DATA))
}

/// Two fresh disks `d0` and `d1` of one group, the one in slot `gated_slot` behind a gate,
/// and mirror `m` over them.
async fn gated_pair(
    gated_slot: usize,
) -> (CrashGroup, [CrashDisk; 2], Arc<GatedDisk>, Arc<Mirror>) {
    let group = CrashGroup::new();
    let disks = [member_disk(&group), member_disk(&group)];
    let gated = Gates::over(&disks[gated_slot]);
    let mut children: Vec<Option<DeviceRef>> = disks
        .iter()
        .map(|d| Some(Arc::new(d.clone()) as DeviceRef))
        .collect();
    children[gated_slot] = Some(gated.clone());
    let mirror = Arc::new(open_mirror(children, options()).await.expect("open"));
    (group, disks, gated, mirror)
}

/// A flush to a disk that has disappeared is in flight while the operator fails that member
/// and replaces it, and the replacement resyncs. The old disk's error arrives last. It is an
/// error of the old disk: the replacement must stay in sync. Before the fix the mirror marked
/// the *slot* faulty, failing the healthy replacement; in `tests/suite/mirror.rs` this took out the
/// last good copies ("no member can serve the request", "no member left to hold the
/// metadata", resyncs stopped for want of a source).
#[tokio::test(flavor = "current_thread")]
async fn late_error_of_a_replaced_disk_does_not_fail_its_replacement() {
    let (group, [_, d1], gated, mirror) = gated_pair(1).await;
    let data = Bytes::from(vec![0xa5u8; 8192]);
    mirror
        .write(4096, data.clone(), WriteFlags::default())
        .await
        .unwrap();

    // d1 vanishes while a client flush is on its way to it.
    d1.disappear();
    gated.arm(Gate::Flush);
    let flushing = {
        let mirror = mirror.clone();
        tokio::spawn(async move { mirror.flush().await })
    };
    gated.entered.notified().await;

    // Meanwhile the operator fails d1 and replaces it; the replacement resyncs fully.
    fail_and_replace(&mirror, "r1", &group).await;
    mirror.wait_resync().await;
    assert_both_in_sync(&mirror, "the resync did not bring both members in sync");

    // Now the old disk's flush fails. d0 took the flush, so it succeeds, and r1 stays.
    gated.release.notify_one();
    flushing.await.unwrap().expect("flush: d0 took it");
    assert_both_in_sync(
        &mirror,
        "an error of the replaced disk d1 failed its replacement r1",
    );

    // r1 alone serves the data: failing d0 is allowed and reads still succeed.
    fail_member(&mirror, 0)
        .await
        .expect("r1 is in sync, so d0 may be failed");
    assert_eq!(&mirror.read(4096, 8192).await.unwrap()[..], &data[..]);
}

/// Fails member 1 and replaces it with a fresh disk of `group` named `name`.
async fn fail_and_replace(mirror: &Mirror, name: &str, group: &CrashGroup) {
    fail_member(mirror, 1).await.unwrap();
    let replacement = Arc::new(member_disk(group));
    mirror.control(replace(1, name, replacement)).await.unwrap();
}

/// Both members are in sync; `why` says what went wrong if not.
#[track_caller]
fn assert_both_in_sync(mirror: &Mirror, why: &str) {
    let states = mirror.member_states();
    assert_eq!(states, [MemberState::InSync, MemberState::InSync], "{why}");
}

/// Polls (through the runtime, so spawned tasks run) until `done` holds; panics after 10 s.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The same race in the metadata fan-out: a metadata commit's flush to a disk that has
/// disappeared is in flight while that member is failed and replaced; its error arrives after
/// the replacement joined the fan-out. Before the fix the fan-out dropped the *slot* (the
/// replacement stopped receiving metadata) and the mirror then marked the replacement
/// faulty; with the other member gone too, the store had no member left ("no member left to
/// hold the metadata" in `tests/suite/mirror.rs`).
#[tokio::test(flavor = "current_thread")]
async fn late_metadata_error_of_a_replaced_disk_keeps_its_replacement() {
    let (group, [_, d1], gated, mirror) = gated_pair(1).await;

    // d1 vanishes; a write to a clean region commits its bit, and the commit's flush to d1
    // waits at the gate (holding the store's commit).
    d1.disappear();
    gated.arm(Gate::Flush);
    let data = Bytes::from(vec![0x3cu8; 4096]);
    let writing = {
        let (mirror, data) = (mirror.clone(), data.clone());
        tokio::spawn(async move { mirror.write(0, data, WriteFlags::default()).await })
    };
    gated.entered.notified().await;

    // The operator fails d1 (its commit waits behind the held one) and replaces it: r1
    // joins the fan-out while the flush to d1 is still out.
    let failing = {
        let mirror = mirror.clone();
        tokio::spawn(async move { mirror.control(Control::FailMember { index: 1 }).await })
    };
    until("d1 is faulty", || {
        mirror.member_states()[1] == MemberState::Faulty
    })
    .await;
    let r1 = member_disk(&group);
    let replacing = {
        let (mirror, r1) = (mirror.clone(), r1.clone());
        tokio::spawn(async move { mirror.control(replace(1, "r1", Arc::new(r1))).await })
    };
    until("r1 is in slot 1", || {
        mirror.member_states()[1] == MemberState::Resyncing { done: 0 }
    })
    .await;

    // d1's flush fails now, after r1 took its slot.
    gated.release.notify_one();
    writing.await.unwrap().expect("write: d0 took it");
    failing.await.unwrap().expect("fail d1");
    replacing.await.unwrap().expect("replace d1 with r1");
    mirror.wait_resync().await;
    assert_both_in_sync(
        &mirror,
        "a metadata error of the replaced disk d1 failed its replacement r1",
    );

    // r1 alone must hold the metadata: with d0 failed, a write that sets a new bit commits.
    fail_member(&mirror, 0)
        .await
        .expect("r1 is in sync, so d0 may be failed");
    mirror
        .write(DATA - 4096, data.clone(), WriteFlags::default())
        .await
        .expect("r1 takes the metadata commit");
    assert_eq!(&mirror.read(0, 4096).await.unwrap()[..], &data[..]);
    assert_eq!(
        &mirror.read(DATA - 4096, 4096).await.unwrap()[..],
        &data[..]
    );
}

/// A member being resynced is failed and replaced while the resync copies a region onto it.
/// The replacement starts at `resyncing 0` too, so the state alone cannot tell it from the
/// disk the region went to. Before the fix the copy's progress was credited to the
/// replacement: it skipped region 0, went in sync without it, and served zeros for data the
/// mirror had acknowledged.
#[tokio::test(flavor = "current_thread")]
async fn progress_of_a_replaced_resync_target_is_not_credited_to_its_replacement() {
    let (group, _, gated, mirror) = gated_pair(0).await;
    let data = Bytes::from(vec![0x77u8; 8192]);
    mirror
        .write(4096, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    fail_member(&mirror, 1).await.unwrap();

    // r1 replaces d1; the resync's first read of region 0 from d0 waits at the gate.
    gated.arm(Gate::DataRead);
    let r1 = member_disk(&group);
    mirror
        .control(replace(1, "r1", Arc::new(r1)))
        .await
        .unwrap();
    gated.entered.notified().await;

    // While region 0 is being copied onto r1, r1 is failed and r2 takes the slot.
    fail_and_replace(&mirror, "r2", &group).await;
    gated.release.notify_one();
    mirror.wait_resync().await;
    assert_both_in_sync(&mirror, "the resync did not bring both members in sync");

    // r2 alone serves the acknowledged data in region 0.
    fail_member(&mirror, 0).await.unwrap();
    assert!(
        mirror.read(4096, 8192).await.unwrap()[..] == data[..],
        "r2 went in sync without region 0"
    );
}

/// A quiesce (the path every online change takes) lets the region copy under way finish,
/// then holds the resync: no progress while quiesced, all of it after the resume.
#[tokio::test(flavor = "current_thread")]
async fn quiesce_pauses_a_resync_and_resume_continues_it() {
    let (group, _, gated, mirror) = gated_pair(0).await;
    let data = Bytes::from(vec![0x5au8; DATA as usize]);
    mirror
        .write(0, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    // The resync of a new member reads its first region from d0 and waits there.
    gated.arm(Gate::DataRead);
    let added = Arc::new(member_disk(&group));
    mirror
        .control(Control::AddMember(strata_core::Member {
            name: "d2".into(),
            device: added,
        }))
        .await
        .unwrap();
    gated.entered.notified().await;
    assert_eq!(mirror.stats().resynced_bytes, 0);

    let quiescing = {
        let mirror = mirror.clone();
        tokio::spawn(async move { mirror.control(Control::Quiesce).await })
    };
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !quiescing.is_finished(),
        "the quiesce must wait for the region copy under way"
    );
    gated.release.notify_one();
    quiescing.await.unwrap().expect("quiesce");
    // The copy under way finished; no other starts while quiesced.
    assert_eq!(mirror.stats().resynced_bytes, REGION);
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        mirror.stats().resynced_bytes,
        REGION,
        "progress while quiesced"
    );
    assert!(!mirror.resync_idle());

    mirror.control(Control::Resume).await.expect("resume");
    mirror.wait_resync().await;
    assert_eq!(mirror.stats().resynced_bytes, DATA);
    assert_eq!(mirror.member_states(), [MemberState::InSync; 3]);
    assert_eq!(&mirror.read(0, DATA as usize).await.unwrap()[..], &data[..]);

    // Stop ends the mirror's background work; I/O is still served.
    mirror.control(Control::Stop).await.expect("stop");
    assert_eq!(&mirror.read(0, 4096).await.unwrap()[..], &data[..4096]);
}
