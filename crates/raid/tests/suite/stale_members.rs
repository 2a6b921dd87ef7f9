//! Issue 12, case 1: a member that another member records as failed never wins, in any order
//! of disks; starting with members missing needs `allow_degraded`; a split brain (two copies
//! recording each other failed) is refused instead of serving either side silently.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, DeviceRef, WriteFlags};
use strata_raid::mirror::{MemberState, Mirror, MirrorOptions};

use crate::common;
use common::{fail_member, mirror_options, open_mirror, refused, replace, DEGRADED, RESTART};

const META: u64 = 128 << 10;
const SIZE: u64 = META + (1 << 20);

fn options(start: StartPolicy) -> MirrorOptions {
    MirrorOptions {
        start,
        ..mirror_options(META, 64 << 10, Duration::from_millis(2))
    }
}

fn disk() -> DeviceRef {
    Arc::new(MemoryDevice::new(SIZE))
}

/// Opens a mirror over slots `d0`, `d1`, … with the devices given (None = missing).
async fn open(children: &[Option<&DeviceRef>], start: StartPolicy) -> strata_core::Result<Mirror> {
    open_mirror(
        children.iter().map(|c| c.cloned()).collect(),
        options(start),
    )
    .await
}

async fn write(mirror: &Mirror, offset: u64, byte: u8) {
    mirror
        .write(offset, Bytes::from(vec![byte; 8192]), WriteFlags::default())
        .await
        .unwrap();
    mirror.flush().await.unwrap();
}

async fn read(mirror: &Mirror, offset: u64) -> Vec<u8> {
    mirror.read(offset, 8192).await.unwrap().to_vec()
}

/// Mirror of a and b; b failed by the operator; a keeps receiving writes. Returns (a, b).
async fn failed_b() -> (DeviceRef, DeviceRef) {
    let (a, b) = (disk(), disk());
    let mirror = open(&[Some(&a), Some(&b)], StartPolicy::FRESH)
        .await
        .unwrap();
    write(&mirror, 0, 1).await;
    fail_member(&mirror, 1).await.unwrap();
    write(&mirror, 0, 2).await;
    drop(mirror);
    (a, b)
}

#[tokio::test]
async fn a_failed_member_never_wins_in_either_order() {
    let (a, b) = failed_b().await;
    let mirror = open(&[Some(&a), Some(&b)], RESTART).await.unwrap();
    assert_eq!(
        mirror.member_states(),
        vec![MemberState::InSync, MemberState::Faulty]
    );
    assert_eq!(read(&mirror, 0).await, vec![2; 8192]);
    drop(mirror);
    // The same disks configured in swapped slots: a's copy records its own (new) slot as
    // faulty, which cannot happen in place, so the open is refused instead of serving b.
    let before = b.read(0, META as usize).await.unwrap();
    refused(open(&[Some(&b), Some(&a)], RESTART).await, &["reordered"]);
    assert_eq!(b.read(0, META as usize).await.unwrap(), before);
    // Assembled in the original order again, after b alone was refused: still a's data.
    assert!(open(&[None, Some(&b)], RESTART).await.is_err());
    let mirror = open(&[Some(&a), Some(&b)], RESTART).await.unwrap();
    assert_eq!(
        mirror.member_states(),
        vec![MemberState::InSync, MemberState::Faulty]
    );
    assert_eq!(read(&mirror, 0).await, vec![2; 8192]);
}

#[tokio::test]
async fn a_stale_member_alone_needs_the_degraded_flag_and_then_is_a_split_brain() {
    let (a, b) = failed_b().await;
    let before = b.read(0, META as usize).await.unwrap();
    refused(open(&[None, Some(&b)], RESTART).await, &["d0", "degraded"]);
    // The refused open wrote nothing on b.
    assert_eq!(b.read(0, META as usize).await.unwrap(), before);
    // With the flag it comes up, degraded, on b's (old) data: the operator asked for it.
    let mirror = open(&[None, Some(&b)], DEGRADED).await.unwrap();
    assert_eq!(
        mirror.member_states(),
        vec![MemberState::Faulty, MemberState::InSync]
    );
    assert_eq!(read(&mirror, 0).await, vec![1; 8192]);
    write(&mirror, 8192, 3).await;
    drop(mirror);
    // a and b now each record the other failed: neither is served, in either order (swapped,
    // each copy records its own new slot as faulty: refused as reordered).
    for (order, why) in [([&a, &b], "split brain"), ([&b, &a], "reordered")] {
        let before: Vec<_> = [
            order[0].read(0, META as usize).await.unwrap(),
            order[1].read(0, META as usize).await.unwrap(),
        ]
        .to_vec();
        let error = open(&[Some(order[0]), Some(order[1])], DEGRADED)
            .await
            .err()
            .expect("split brain refused");
        let message = error.to_string();
        assert!(
            message.contains(why)
                && message.contains("d0")
                && (why == "reordered"
                    || message.contains("d1") && message.contains("strata replace")),
            "{message}"
        );
        assert_eq!(order[0].read(0, META as usize).await.unwrap(), before[0]);
        assert_eq!(order[1].read(0, META as usize).await.unwrap(), before[1]);
    }
}

#[tokio::test]
async fn a_missing_in_sync_member_needs_the_degraded_flag() {
    let (a, b) = (disk(), disk());
    let mirror = open(&[Some(&a), Some(&b)], StartPolicy::FRESH)
        .await
        .unwrap();
    write(&mirror, 0, 7).await;
    drop(mirror);
    refused(
        open(&[Some(&a), None], RESTART).await,
        &["d1", "--degraded"],
    );
    let mirror = open(&[Some(&a), None], DEGRADED).await.unwrap();
    assert_eq!(
        mirror.member_states(),
        vec![MemberState::InSync, MemberState::Faulty]
    );
    assert_eq!(read(&mirror, 0).await, vec![7; 8192]);
    drop(mirror);
    // b comes back: a records it failed, so it stays faulty (it needs `strata replace`).
    let mirror = open(&[Some(&a), Some(&b)], RESTART).await.unwrap();
    assert_eq!(
        mirror.member_states(),
        vec![MemberState::InSync, MemberState::Faulty]
    );
}

#[tokio::test]
async fn blank_members_are_formatted_only_when_the_policy_allows() {
    let (a, b) = (disk(), disk());
    refused(
        open(&[Some(&a), Some(&b)], RESTART).await,
        &["strata serve --format"],
    );
    assert_eq!(
        a.read(0, META as usize).await.unwrap(),
        vec![0; META as usize]
    );
    let mirror = open(&[Some(&a), Some(&b)], StartPolicy::FRESH)
        .await
        .unwrap();
    write(&mirror, 0, 9).await;
}

#[tokio::test]
async fn a_replaced_disk_configured_again_is_resynced_not_trusted() {
    let (a, b, c) = (disk(), disk(), disk());
    let mirror = open(&[Some(&a), Some(&b)], StartPolicy::FRESH)
        .await
        .unwrap();
    write(&mirror, 0, 1).await;
    // b is replaced by c (b's copy stops at this point), c resyncs to in sync, writes go on.
    mirror.control(replace(1, "c", c.clone())).await.unwrap();
    mirror.wait_resync().await;
    assert_eq!(
        mirror.member_states(),
        vec![MemberState::InSync, MemberState::InSync]
    );
    write(&mirror, 0, 2).await;
    drop(mirror);
    // The old disk b is configured in slot 1 again. a's record calls slot 1 in sync, but b's
    // copy is generations behind what any crash can explain: it missed writes.
    let mirror = open(&[Some(&a), Some(&b)], RESTART).await.unwrap();
    assert_ne!(mirror.member_states()[1], MemberState::InSync);
    for _ in 0..4 {
        // Reads rotate over readable members: none may return b's old bytes.
        assert_eq!(read(&mirror, 0).await, vec![2; 8192]);
    }
    mirror.wait_resync().await;
    assert_eq!(b.read(META, 8192).await.unwrap().to_vec(), vec![2; 8192]);
}
