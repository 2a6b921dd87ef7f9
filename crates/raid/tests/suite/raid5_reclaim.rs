//! raid5 journal reclaim: a journal past half full is reclaimed in the background (the
//! members flushed while the writes go on, then its tail moved), and only a journal that is
//! truly full makes writes wait, for the reclaim under way.

use std::sync::Arc;
use std::time::Duration;

use strata_core::{BlockDevice, WriteFlags};
use strata_raid::raid5::Raid5;

use strata_crash::testkit::Intercepted;
use strata_raid::raid5::META_BYTES;

use crate::common::{flushes_waiting, hold, HeldFlush};

const CHUNK: u64 = 4096;
/// 16 blocks a copy: one lane of 15, reclaimed from 8 on; a full-stripe intent takes 1.
const JOURNAL: u64 = 128 << 10;
const STRIPES: u64 = 256;

fn held_members(n: usize) -> Vec<Arc<Intercepted<HeldFlush>>> {
    let size = (META_BYTES + JOURNAL).div_ceil(CHUNK) * CHUNK + STRIPES * CHUNK;
    crate::common::held_members(n, size)
}

/// Full-stripe write `i` (8 KiB over 3 members), which must complete within a second.
async fn write_stripe(raid: &Raid5, i: u64) -> std::result::Result<(), String> {
    let stripe = 2 * CHUNK;
    let write = raid.write(
        i * stripe,
        vec![i as u8 + 1; stripe as usize].into(),
        WriteFlags::default(),
    );
    match tokio::time::timeout(Duration::from_secs(1), write).await {
        Ok(result) => result.map_err(|e| format!("write {i}: {e}")),
        Err(_) => Err(format!(
            "write {i} waited a second for the held member flush"
        )),
    }
}

/// With every member flush held, the writes that start a reclaim and the writes after it
/// complete (the journal's other half takes their records); only once the journal is truly
/// full does a write wait, for the reclaim under way (no second reclaim starts), and it
/// completes when the flush is let go. Every write reads back.
#[tokio::test]
async fn writes_go_on_while_a_reclaim_flushes_the_members() {
    let members = held_members(3);
    let raid = Arc::new(crate::common::fresh_raid5(&members, CHUNK, JOURNAL).await);
    hold(&members, true);
    // Each member's journal takes every third stripe's intent: the first reclaim starts by
    // write 24 (8 intents in a 15-block lane) and waits for the held flush.
    let mut written = 0;
    while flushes_waiting(&members) == 0 {
        assert!(written < 40, "no reclaim started");
        write_stripe(&raid, written).await.unwrap();
        written += 1;
        tokio::task::yield_now().await;
    }
    let started = written;
    // The rest of each lane (7 blocks) takes 7 more intents per member while it flushes.
    for i in started..started + 18 {
        write_stripe(&raid, i).await.unwrap();
        written += 1;
    }
    assert_eq!(raid.journal_reclaims(), 0);
    assert!(raid.journal_reclaiming());
    // Now a journal is truly full: the next writes wait for the reclaim under way.
    let waiting = {
        let raid = raid.clone();
        tokio::spawn(async move {
            for i in started + 18..started + 30 {
                let stripe = 2 * CHUNK;
                raid.write(
                    i * stripe,
                    vec![i as u8 + 1; stripe as usize].into(),
                    WriteFlags::default(),
                )
                .await
                .unwrap();
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "a full journal did not make the write wait"
    );
    assert_eq!(
        flushes_waiting(&members),
        3,
        "one reclaim's flush of each member, no second"
    );
    hold(&members, false);
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    written += 12;
    assert!(raid.journal_reclaims() >= 1);
    for i in 0..written {
        let stripe = 2 * CHUNK;
        let bytes = raid.read(i * stripe, stripe as usize).await.unwrap();
        assert!(bytes.iter().all(|&b| b == i as u8 + 1), "stripe {i}");
    }
}
