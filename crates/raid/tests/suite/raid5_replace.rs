//! A raid5 member replaced while I/O goes on (found by `strata sim explore`, seed 11 run
//! 1591: a replacement failed during its rebuild, and the next start was refused because the
//! replacement's copy of the metadata recorded its own slot failed):
//! - between the replacement's install and the durable record of it, the new member is
//!   rebuilding but not yet recorded so; a degraded write in that window took it for a
//!   failure not yet recorded and failed it, ending a healthy rebuild;
//! - a request in flight on the old disk that fails after the replacement was charged to
//!   the slot, so to the replacement; and a rebuild that ended after its member had been
//!   failed made it active again (a failed member served as in sync).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata_backend::MemoryDevice;
use strata_core::{
    async_trait, BlockDevice, Control, DeviceRef, Health, Member, Result, WriteFlags,
};
use strata_crash::testkit::{Intercepted, Interceptor, Request};
use strata_raid::raid5::META_BYTES;

use crate::common::{settle_health, Gate};

/// Holds writes to the metadata region after the first (the install's copy of it) at its
/// gate.
#[derive(Default)]
struct HeldRecord {
    gate: Gate,
    seen: AtomicU64,
}

#[async_trait]
impl Interceptor for HeldRecord {
    async fn before(&self, request: Request) -> Result<()> {
        let Request::Write { offset, .. } = request else {
            return Ok(());
        };
        if offset < META_BYTES && self.seen.fetch_add(1, Ordering::AcqRel) > 0 {
            self.gate.pass().await;
        }
        Ok(())
    }
}

const CHUNK: u64 = 4096;
const JOURNAL: u64 = 128 << 10;
const STRIPES: u64 = 64;

#[tokio::test]
async fn a_write_while_a_replacement_is_installed_does_not_fail_it() {
    let size = (META_BYTES + JOURNAL).div_ceil(CHUNK) * CHUNK + STRIPES * CHUNK;
    let members: Vec<Arc<MemoryDevice>> =
        (0..3).map(|_| Arc::new(MemoryDevice::new(size))).collect();
    let raid = Arc::new(crate::common::fresh_raid5(&members, CHUNK, JOURNAL).await);
    let first = bytes::Bytes::from(vec![0x11; (2 * CHUNK) as usize]);
    raid.write(0, first.clone(), WriteFlags { fua: true })
        .await
        .unwrap();
    raid.control(Control::FailMember { index: 1 })
        .await
        .unwrap();

    // The install's durable record of the replacement is held on the replacement.
    let fresh = Intercepted::new(Arc::new(MemoryDevice::new(size)), HeldRecord::default());
    fresh.gate.hold(true);
    let replacing = {
        let raid = raid.clone();
        let member = Member {
            name: "spare".into(),
            device: fresh.clone() as DeviceRef,
        };
        tokio::spawn(async move {
            raid.control(Control::ReplaceMember { index: 1, member })
                .await
        })
    };
    while fresh.gate.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    // A partial write in the window: degraded, as the record (member 1 failed) allows.
    let second = bytes::Bytes::from(vec![0x22; CHUNK as usize]);
    let at = 8 * CHUNK;
    let write = raid.write(at, second.clone(), WriteFlags::default());
    tokio::time::timeout(Duration::from_secs(2), write)
        .await
        .expect("the write waited for the held record")
        .unwrap();
    fresh.gate.hold(false);
    replacing.await.unwrap().unwrap();

    assert_eq!(
        settle_health(&raid).await,
        Health::Ok,
        "the replacement was failed: the rebuild did not finish"
    );
    assert_eq!(raid.read(0, first.len()).await.unwrap().freeze(), first);
    assert_eq!(raid.read(at, second.len()).await.unwrap().freeze(), second);
}

/// Holds reads while its gate is held, then fails them (a disk that died with a read in
/// flight).
#[derive(Default)]
struct DiesWithReadInFlight {
    gate: Gate,
}

#[async_trait]
impl Interceptor for DiesWithReadInFlight {
    async fn before(&self, request: Request) -> Result<()> {
        if !matches!(request, Request::Read { .. }) || !self.gate.is_held() {
            return Ok(());
        }
        self.gate.pass().await;
        Err(strata_core::BlockError::io(
            "the disk died",
            std::io::Error::from_raw_os_error(5),
        ))
    }
}

/// A read in flight on a member's old disk fails only after the member was failed and
/// replaced: that failure is the old disk's, not the replacement's, which rebuilds on.
#[tokio::test]
async fn a_late_failure_of_a_replaced_disk_is_not_charged_to_its_replacement() {
    let size = (META_BYTES + JOURNAL).div_ceil(CHUNK) * CHUNK + STRIPES * CHUNK;
    let members: Vec<_> = (0..3)
        .map(|_| {
            Intercepted::new(
                Arc::new(MemoryDevice::new(size)),
                DiesWithReadInFlight::default(),
            )
        })
        .collect();
    let dying = members[1].clone();
    let raid = Arc::new(crate::common::fresh_raid5(&members, CHUNK, JOURNAL).await);
    let data = bytes::Bytes::from(vec![0x33; (2 * CHUNK) as usize]);
    raid.write(0, data.clone(), WriteFlags { fua: true })
        .await
        .unwrap();

    dying.gate.hold(true);
    let reading = {
        let raid = raid.clone();
        tokio::spawn(async move { raid.read(0, (2 * CHUNK) as usize).await })
    };
    while dying.gate.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    raid.control(Control::FailMember { index: 1 })
        .await
        .unwrap();
    let member = Member {
        name: "spare".into(),
        device: Arc::new(MemoryDevice::new(size)),
    };
    raid.control(Control::ReplaceMember { index: 1, member })
        .await
        .unwrap();
    dying.gate.hold(false);
    let read = reading.await.unwrap().expect("the read is served degraded");
    assert_eq!(read.freeze(), data);

    assert_eq!(
        settle_health(&raid).await,
        Health::Ok,
        "the replacement was failed for its old disk's error"
    );
    assert_eq!(raid.read(0, data.len()).await.unwrap().freeze(), data);
}
