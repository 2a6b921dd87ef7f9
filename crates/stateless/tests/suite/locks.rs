//! Range locks through the stateless layers (`Control::Lock`): each layer sends a lock down
//! its own map of the range, in its children's order, and a lock refused below releases
//! what was taken. The devices under them record what they were asked.

use std::sync::{Arc, Mutex};

use strata_backend::MemoryDevice;
use strata_core::lock::{self, LockEvent, LockHolder, LockRecorder, LockRequest};
use strata_core::{BlockError, DeviceRef, Member, TokioRuntime};
use strata_stateless::concat::Concat;
use strata_stateless::crypt::Crypt;
use strata_stateless::slice::Slice;
use strata_stateless::stripe::Stripe;

type Log = Arc<Mutex<Vec<LockEvent>>>;

fn recorder(name: &str, size: u64, log: &Log, refuse: bool) -> DeviceRef {
    Arc::new(LockRecorder {
        name: name.into(),
        next: Arc::new(MemoryDevice::new(size)),
        log: log.clone(),
        refuse,
    })
}

/// A concat of `a` (8 KiB) and `b` (16 KiB); `b` refuses locks if `b_refuses`.
fn concat_of(log: &Log, b_refuses: bool) -> Concat {
    let members = vec![
        Member {
            name: "a".into(),
            device: recorder("a", 8192, log, false),
        },
        Member {
            name: "b".into(),
            device: recorder("b", 16384, log, b_refuses),
        },
    ];
    Concat::new("c".into(), members).unwrap()
}

fn request(holder: LockHolder, offset: u64, len: u64) -> LockRequest {
    LockRequest {
        holder,
        offset,
        len,
        exclusive: true,
    }
}

/// What was taken, as (device, range), in order.
fn taken(log: &Log) -> Vec<(String, std::ops::Range<u64>)> {
    let log = log.lock().unwrap();
    log.iter()
        .filter(|e| e.taken)
        .map(|e| (e.device.clone(), e.range.clone()))
        .collect()
}

fn released(log: &Log) -> Vec<(String, std::ops::Range<u64>)> {
    let log = log.lock().unwrap();
    log.iter()
        .filter(|e| !e.taken)
        .map(|e| (e.device.clone(), e.range.clone()))
        .collect()
}

#[tokio::test]
async fn a_slice_shifts_the_range_by_its_offset_and_refuses_one_past_its_end() {
    let log = Log::default();
    let slice = Slice::new(
        "s".into(),
        recorder("d", 1 << 20, &log, false),
        65536,
        Some(8192),
    )
    .unwrap();
    let holder = LockHolder::new();
    let held = lock::lock(&slice, request(holder, 4096, 4096))
        .await
        .unwrap();
    assert_eq!(taken(&log), vec![("d".to_string(), 69632..73728)]);
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .all(|e| e.holder == holder && e.exclusive));
    held.unlock().await.unwrap();
    assert_eq!(released(&log), vec![("d".to_string(), 69632..73728)]);
    let past = lock::lock(&slice, request(holder, 4096, 8192)).await;
    assert!(
        matches!(past, Err(BlockError::OutOfRange { .. })),
        "{past:?}"
    );
    assert_eq!(
        taken(&log).len(),
        1,
        "nothing locked below for a refused range"
    );
}

#[tokio::test]
async fn a_concat_cuts_the_range_at_its_children_and_an_unlock_releases_every_part() {
    let log = Log::default();
    let concat = concat_of(&log, false);
    let held = lock::lock(&concat, request(LockHolder::new(), 4096, 8192))
        .await
        .unwrap();
    assert_eq!(held.parts(), 2);
    assert_eq!(
        taken(&log),
        vec![("a".to_string(), 4096..8192), ("b".to_string(), 0..4096)]
    );
    held.unlock().await.unwrap();
    // Last taken, first released.
    assert_eq!(
        released(&log),
        vec![("b".to_string(), 0..4096), ("a".to_string(), 4096..8192)]
    );
}

#[tokio::test]
async fn a_stripe_locks_each_member_once_over_its_run() {
    let log = Log::default();
    let children = vec![
        recorder("m0", 1 << 20, &log, false),
        recorder("m1", 1 << 20, &log, false),
    ];
    let stripe = Stripe::new("st".into(), children, vec!["m0".into(), "m1".into()], 4096).unwrap();
    // Chunks 1..=4: 1 and 3 on m1 (its chunks 0 and 1), 2 and 4 on m0 (its chunks 1 and 2).
    let held = lock::lock(&stripe, request(LockHolder::new(), 4096, 4 * 4096))
        .await
        .unwrap();
    assert_eq!(
        taken(&log),
        vec![("m0".to_string(), 4096..12288), ("m1".to_string(), 0..8192)],
        "in member order, whatever member the range starts on"
    );
    held.unlock().await.unwrap();
    assert_eq!(released(&log).len(), 2);
}

#[tokio::test]
async fn crypt_locks_the_same_range_below() {
    let log = Log::default();
    let key: Vec<u8> = (0..64u8).collect();
    let crypt = Crypt::new(
        "c".into(),
        recorder("d", 1 << 20, &log, false),
        &key,
        4096,
        TokioRuntime::current(),
    )
    .unwrap();
    let held = lock::lock(&crypt, request(LockHolder::new(), 8192, 4096))
        .await
        .unwrap();
    assert_eq!(taken(&log), vec![("d".to_string(), 8192..12288)]);
    held.unlock().await.unwrap();
}

#[tokio::test]
async fn a_part_refused_below_releases_the_parts_already_taken() {
    let log = Log::default();
    let concat = concat_of(&log, true);
    let refused = lock::lock(&concat, request(LockHolder::new(), 4096, 8192)).await;
    assert!(
        matches!(&refused, Err(BlockError::InvalidArgument(why)) if why.contains("b refuses")),
        "{refused:?}"
    );
    assert_eq!(taken(&log), vec![("a".to_string(), 4096..8192)]);
    assert_eq!(released(&log), vec![("a".to_string(), 4096..8192)]);
}

#[tokio::test]
async fn a_device_that_holds_no_locks_refuses_them() {
    let plain = MemoryDevice::new(8192);
    let refused = lock::lock(&plain, request(LockHolder::new(), 0, 4096)).await;
    assert!(
        matches!(refused, Err(BlockError::Unsupported(_))),
        "{refused:?}"
    );
}
