use std::sync::Arc;

use bytes::Bytes;
use strata_brick::{BrickOptions, BrickStore};
use strata_cluster::interval::IntervalId;
use strata_core::{DeviceRef, Geometry};
use strata_crash::{sector_disk, CrashGroup};

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
