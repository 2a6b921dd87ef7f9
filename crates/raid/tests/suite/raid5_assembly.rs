//! Issue 12 for raid5: damaged metadata is never created over; a member recorded failed is
//! excluded whatever its own copy says; members missing need `allow_degraded`; two members
//! recording each other failed are a split brain and refused.

use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::layer::StartPolicy;
use strata_core::{BlockDevice, DeviceRef, Health, TokioRuntime, WriteFlags};
use strata_raid::raid5::{MemberState, Raid5, Settings, META_BYTES};

use crate::common;
use common::{fail_member, refused, DEGRADED, RESTART};

const CHUNK: u64 = 4096;
const JOURNAL: u64 = 64 << 10;
const MEMBER: u64 = META_BYTES + JOURNAL + 24 * CHUNK;

fn disks(n: usize) -> Vec<DeviceRef> {
    (0..n)
        .map(|_| Arc::new(MemoryDevice::new(MEMBER)) as DeviceRef)
        .collect()
}

async fn open(children: &[Option<&DeviceRef>], start: StartPolicy) -> strata_core::Result<Raid5> {
    let settings = Settings {
        chunk: Some(CHUNK),
        journal: Some(JOURNAL),
        start,
        ..Settings::default()
    };
    let children = children.iter().map(|c| c.cloned()).collect();
    Raid5::open("r5".into(), children, settings, TokioRuntime::current()).await
}

fn all(disks: &[DeviceRef]) -> Vec<Option<&DeviceRef>> {
    disks.iter().map(Some).collect()
}

async fn images(disks: &[DeviceRef]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for d in disks {
        out.push(d.read(0, MEMBER as usize).await.unwrap().to_vec());
    }
    out
}

async fn write(raid: &Raid5, byte: u8) {
    raid.write(0, Bytes::from(vec![byte; 16384]), WriteFlags::default())
        .await
        .unwrap();
    raid.flush().await.unwrap();
}

/// Three members of an array created fresh, holding `byte` in its first 16 KiB, closed.
async fn written_array(byte: u8) -> Vec<DeviceRef> {
    let d = disks(3);
    let raid = open(&all(&d), StartPolicy::FRESH).await.unwrap();
    write(&raid, byte).await;
    d
}

#[tokio::test]
async fn damaged_metadata_on_every_member_is_refused_not_created_over() {
    let d = written_array(5).await;
    // Both superblock copies of every member destroyed; the rest of the metadata survives.
    for disk in &d {
        disk.write(0, Bytes::from(vec![0xa5u8; 8192]), WriteFlags::default())
            .await
            .unwrap();
    }
    let before = images(&d).await;
    refused(
        open(&all(&d), StartPolicy::FRESH).await,
        &["damaged", "strata check"],
    );
    assert!(
        images(&d).await == before,
        "a refused open wrote to a member"
    );
}

#[tokio::test]
async fn blank_members_are_created_only_when_the_policy_allows() {
    let d = disks(3);
    refused(open(&all(&d), RESTART).await, &["strata serve --format"]);
    assert!(images(&d).await.iter().all(|i| i.iter().all(|&b| b == 0)));
    refused(
        open(&[Some(&d[0]), Some(&d[1]), None], StartPolicy::FRESH).await,
        &["missing"],
    );
    let raid = open(&all(&d), StartPolicy::FRESH).await.unwrap();
    write(&raid, 1).await;
}

/// Array of three; member 2 failed by the operator; writes go on. Returns the disks.
async fn failed_member_2() -> Vec<DeviceRef> {
    let d = disks(3);
    let raid = open(&all(&d), StartPolicy::FRESH).await.unwrap();
    write(&raid, 1).await;
    fail_member(&raid, 2).await.unwrap();
    write(&raid, 2).await;
    drop(raid);
    d
}

#[tokio::test]
async fn a_member_recorded_failed_stays_excluded() {
    let d = failed_member_2().await;
    let raid = open(&all(&d), RESTART).await.unwrap();
    assert_eq!(
        raid.member_states(),
        vec![
            MemberState::Active,
            MemberState::Active,
            MemberState::Failed
        ]
    );
    assert_eq!(
        raid.read(0, 16384).await.unwrap().to_vec(),
        vec![2u8; 16384]
    );
}

#[tokio::test]
async fn a_missing_working_member_needs_the_degraded_flag() {
    let d = written_array(3).await;
    let before = images(&d).await;
    refused(
        open(&[Some(&d[0]), None, Some(&d[2])], RESTART).await,
        &["member 1", "--degraded"],
    );
    assert!(
        images(&d).await == before,
        "a refused open wrote to a member"
    );
    let raid = open(&[Some(&d[0]), None, Some(&d[2])], DEGRADED)
        .await
        .unwrap();
    assert_eq!(raid.health(), Health::Degraded);
    assert_eq!(
        raid.read(0, 16384).await.unwrap().to_vec(),
        vec![3u8; 16384]
    );
}

#[tokio::test]
async fn a_start_that_would_leave_two_members_out_is_refused_and_writes_nothing() {
    let d = failed_member_2().await;
    // Member 0 missing and member 2 recorded failed: two members out. Starting would record
    // member 0 failed too and fail the array for good; refused, even with --degraded.
    let before = images(&d).await;
    refused(
        open(&[None, Some(&d[1]), Some(&d[2])], DEGRADED).await,
        &["member 0", "member 2"],
    );
    assert!(
        images(&d).await == before,
        "a refused open wrote to a member"
    );
    let raid = open(&all(&d), RESTART).await.unwrap();
    assert_eq!(raid.member_states()[2], MemberState::Failed);
    assert_eq!(
        raid.read(0, 16384).await.unwrap().to_vec(),
        vec![2u8; 16384]
    );
}
