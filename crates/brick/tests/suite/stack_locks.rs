//! Range locks through a stack over a shared volume (`Control::Lock`): each host serves a
//! slice of the volume; workers lock through the slice, write and flush on their own
//! connection view (as an NBD client with a lock session does), and unlock. The slice
//! shifts every lock by its offset, so a lock at the slice's start lands across a lock
//! segment boundary of the volume.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_core::lock::{self, LockHolder, LockRequest};
use strata_core::{BlockDevice, Control, ControlReply, DeviceRef, WriteFlags};
use strata_stateless::slice::Slice;

use crate::shared::*;

/// Where the slice starts on the volume: half a segment in.
const SHIFT: u64 = SEGMENT / 2;

fn slice_of(volume: &Arc<strata_brick::SharedVolume>) -> Arc<Slice> {
    let volume: DeviceRef = volume.clone();
    Arc::new(Slice::new("part".into(), volume, SHIFT, Some(3 * SEGMENT)).unwrap())
}

async fn connection(volume: &strata_brick::SharedVolume) -> DeviceRef {
    match volume.control(Control::Connection).await.unwrap() {
        ControlReply::Device(view) => view,
        _ => panic!("a shared volume gives each connection a view"),
    }
}

fn exclusive(holder: LockHolder, offset: u64, len: u64) -> LockRequest {
    LockRequest {
        holder,
        offset,
        len,
        exclusive: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_on_two_hosts_lock_through_a_slice_and_lose_no_increment() {
    let cluster = cluster().await;
    let hosts = [host(&cluster, "h1").await, host(&cluster, "h2").await];
    // In the slice: one counter whose lock (1 KiB from it) straddles the volume's segments
    // 0 and 1, one inside segment 1, one further on.
    let counters = [SEGMENT / 2 - 512, SEGMENT, 2 * SEGMENT + 4096];
    const ROUNDS: u64 = 5;
    let mut workers = Vec::new();
    for (h, volume) in hosts.iter().enumerate() {
        for w in 0..2 {
            let volume = volume.clone();
            workers.push(tokio::spawn(async move {
                let slice = slice_of(&volume);
                // Each worker is its own NBD connection and its own lock holder.
                let view = connection(&volume).await;
                let holder = LockHolder::new();
                for round in 0..ROUNDS {
                    for c in 0..counters.len() {
                        let at = counters[(c + h + 2 * w) % counters.len()];
                        let held = lock::lock(slice.as_ref(), exclusive(holder, at, 1024))
                            .await
                            .unwrap();
                        let old = view.read(SHIFT + at, 512).await.unwrap();
                        let count = u64::from_le_bytes(old[..8].try_into().unwrap());
                        let mut next = (count + 1).to_le_bytes().to_vec();
                        next.extend(format!(" h{h} w{w} r{round}").bytes());
                        next.resize(512, 0);
                        view.write(SHIFT + at, Bytes::from(next), WriteFlags::default())
                            .await
                            .unwrap();
                        view.flush().await.unwrap();
                        held.unlock().await.unwrap();
                    }
                }
            }));
        }
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let total = 2 * 2 * ROUNDS;
    for &at in &counters {
        for (h, volume) in hosts.iter().enumerate() {
            let held = slice_of(volume).read(at, 512).await.unwrap();
            let count = u64::from_le_bytes(held[..8].try_into().unwrap());
            assert_eq!(
                count,
                total,
                "counter at {at} of the slice as host h{} reads it",
                h + 1
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_waits_for_another_through_the_stack_and_shares_with_itself() {
    let cluster = cluster().await;
    let volume = host(&cluster, "h1").await;
    let slice = slice_of(&volume);
    let (first, second) = (LockHolder::new(), LockHolder::new());
    let held = lock::lock(slice.as_ref(), exclusive(first, 0, 4096))
        .await
        .unwrap();
    assert_eq!(
        held.describe(),
        vec![format!("volume v: [{SHIFT}, {}) exclusive", SHIFT + 4096)],
        "the slice's offset is added on the way down"
    );
    // The same holder may lock over its own lock.
    let again = lock::lock(slice.as_ref(), exclusive(first, 2048, 4096))
        .await
        .unwrap();
    // Another holder waits until both are released.
    let waiter = {
        let slice = slice.clone();
        tokio::spawn(async move { lock::lock(slice.as_ref(), exclusive(second, 1024, 512)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "a conflicting holder was not made to wait"
    );
    again.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "granted while the first holder still held its range"
    );
    held.unlock().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is granted once the range is free")
        .unwrap()
        .unwrap();
    // A lock past the slice's end is refused by the slice, before the volume sees it.
    let past = lock::lock(slice.as_ref(), exclusive(second, 3 * SEGMENT - 512, 1024)).await;
    assert!(
        matches!(past, Err(strata_core::BlockError::OutOfRange { .. })),
        "{past:?}"
    );
    granted.unlock().await.unwrap();
    // Holders that are done leave the host's lock table.
    assert_eq!(volume.lock_sessions(), 0);
}
