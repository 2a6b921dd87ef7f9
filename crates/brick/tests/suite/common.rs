use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_brick::{BrickOptions, BrickStore};
use strata_cluster::interval::IntervalId;
use strata_core::{
    async_trait, BlockDevice, Capabilities, DeviceRef, Geometry, Result, WriteFlags, ZeroFlags,
};
use strata_crash::rand::{RngExt, SeedableRng};
use strata_crash::{sector_disk, CrashGroup, CrashRng};

pub const META: u64 = 1 << 20;
pub const HOME: u64 = 256 << 10;
/// 1 MiB of metadata, 256 KiB of home, and 768 KiB of staging after alignment.
pub const DISK: u64 = 2 << 20;

pub fn geometry() -> Geometry {
    sector_disk(DISK)
}

pub fn options() -> BrickOptions {
    BrickOptions {
        meta_bytes: META,
        home_bytes: HOME,
        min_staging_bytes: 256 << 10,
    }
}

pub async fn fresh(group: &CrashGroup) -> (DeviceRef, BrickStore) {
    let device: DeviceRef = Arc::new(group.disk(geometry()));
    let store = BrickStore::format(device.clone(), &options(), false)
        .await
        .unwrap();
    (device, store)
}

pub fn id(client: u64, seq: u64) -> IntervalId {
    IntervalId { client, seq }
}

/// Data that names its interval, its write and its sector, so a wrong sector explains itself.
pub fn data(id: IntervalId, write: usize, len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len);
    for sector in 0..len / 512 {
        let tag = format!("c{} s{} w{} sector{} ", id.client, id.seq, write, sector);
        out.extend(tag.bytes().cycle().take(512));
    }
    Bytes::from(out)
}

/// A device that yields to the executor a few times before each operation, so requests run
/// under `join_all` interleave: the crash disk itself completes every operation at once, and
/// would run them one after the other. The number of yields comes from a seeded generator,
/// so a seed replays the same interleaving.
pub struct Yielding {
    inner: DeviceRef,
    yields: std::ops::RangeInclusive<u32>,
    rng: std::sync::Mutex<CrashRng>,
}

impl Yielding {
    pub fn new(inner: DeviceRef, yields: std::ops::RangeInclusive<u32>, seed: u64) -> Yielding {
        Yielding {
            inner,
            yields,
            rng: std::sync::Mutex::new(CrashRng::seed_from_u64(seed)),
        }
    }

    async fn pause(&self) {
        let count = self.rng.lock().unwrap().random_range(self.yields.clone());
        for _ in 0..count {
            tokio::task::yield_now().await;
        }
    }
}

#[async_trait]
impl BlockDevice for Yielding {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<BytesMut> {
        self.pause().await;
        self.inner.read(offset, len).await
    }

    async fn write(&self, offset: u64, data: Bytes, flags: WriteFlags) -> Result<()> {
        self.pause().await;
        self.inner.write(offset, data, flags).await
    }

    async fn flush(&self) -> Result<()> {
        self.pause().await;
        self.inner.flush().await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.pause().await;
        self.inner.discard(offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.pause().await;
        self.inner.write_zeroes(offset, len, flags).await
    }
}
