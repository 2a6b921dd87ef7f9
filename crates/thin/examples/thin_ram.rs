//! Memory a thin pool keeps per allocated extent, measured.
//!
//! Maps N extents through the real write path (one 4 KiB write into each extent of one
//! volume, metadata committed every 65,536 writes as a timer would), then reports:
//! - the process's resident memory growth (VmRSS) divided by N, which includes allocator
//!   slack and the buffers commits leave behind;
//! - the in-memory structures by their page counts (map table pages, `allocated` and `live`
//!   bitmap pages), which is what the pool holds for good.
//!
//! The pool sits on a null device (writes dropped, reads zeros) so that no data buffer or
//! page cache counts: a pool only ever reads its metadata back when it is opened.
//!
//! Run: `cargo run --release -p strata-thin --example thin_ram -- [extents] [extent-size-KiB]`
//! (defaults: 1048576 extents of 512 KiB, a 512 GiB pool).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use strata_core::{
    async_trait, BlockDevice, Capabilities, Control, ControlReply, Geometry, NodeStatus, Result,
    TokioRuntime, WriteFlags, ZeroFlags,
};
use strata_meta::{PAGE_OVERHEAD, TABLE_PAGE_ENTRIES};
use strata_thin::{PoolOptions, PoolRuntime, ThinPool};

/// Drops writes and reads zeros.
struct NullDevice {
    size: u64,
}

#[async_trait]
impl BlockDevice for NullDevice {
    fn geometry(&self) -> Geometry {
        Geometry::byte_addressable(self.size)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            block_status: false,
            ..Capabilities::ALL
        }
    }

    async fn read(&self, _offset: u64, len: usize) -> Result<BytesMut> {
        Ok(BytesMut::zeroed(len))
    }

    async fn write(&self, _offset: u64, _data: Bytes, _flags: WriteFlags) -> Result<()> {
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        Ok(())
    }

    async fn write_zeroes(&self, _offset: u64, _len: u64, _flags: ZeroFlags) -> Result<()> {
        Ok(())
    }

    async fn control(&self, request: Control) -> Result<ControlReply> {
        match request {
            Control::Describe => Ok(ControlReply::Describe(NodeStatus::new(
                "null", "null", self.size,
            ))),
            _ => Err(strata_core::BlockError::Unsupported("control")),
        }
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn main() {
    let mut args = std::env::args().skip(1);
    let extents: u64 = args.next().map_or(1 << 20, |a| a.parse().expect("extents"));
    let extent_kib: u64 = args.next().map_or(512, |a| a.parse().expect("extent KiB"));
    let extent_size = extent_kib << 10;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let metadata = (extents * 860).next_multiple_of(1 << 20);
        let size = metadata.next_multiple_of(extent_size) + extents * extent_size;
        let child = Arc::new(NullDevice { size });
        let mut settings = PoolRuntime::new(TokioRuntime::current());
        settings.commit_interval = None;
        let options = PoolOptions {
            extent_size,
            metadata_size: Some(metadata),
            start_mid: false,
        };
        let pool = ThinPool::format("pool", child, &options, settings)
            .await
            .unwrap();
        assert_eq!(pool.extents(), extents);
        let volume = pool
            .create_volume("v", extents * extent_size)
            .await
            .unwrap();
        let data = Bytes::from(vec![0x5a; 4096]);
        let before = rss_bytes();
        let started = std::time::Instant::now();
        for extent in 0..extents {
            volume
                .write(extent * extent_size, data.clone(), WriteFlags::default())
                .await
                .unwrap();
            if extent % 65_536 == 65_535 {
                pool.store().commit().await.unwrap();
            }
        }
        pool.store().commit().await.unwrap();
        let elapsed = started.elapsed();
        let after = rss_bytes();
        assert_eq!(pool.allocated_extents(), extents);
        let (table_pages, allocated_pages, live_pages, bitmaps) = pool.store().read(|state| {
            let ids = |name: &str| state.id(name).unwrap();
            let allocated = state.bitmap(ids("allocated")).unwrap();
            let live = state.bitmap(ids("live")).unwrap();
            (
                state.table(ids("map.1")).unwrap().pages(),
                allocated.pages(),
                live.pages(),
                allocated.memory_bytes() + live.memory_bytes(),
            )
        });
        let table = table_pages * (TABLE_PAGE_ENTRIES * 4 + PAGE_OVERHEAD);
        let per = |bytes: u64| bytes as f64 / extents as f64;
        println!(
            "{extents} extents of {extent_kib} KiB mapped in {:.2?} ({:.2} µs each)",
            elapsed,
            elapsed.as_secs_f64() * 1e6 / extents as f64
        );
        println!(
            "resident growth: {} bytes = {:.1} bytes per extent",
            after.saturating_sub(before),
            per(after.saturating_sub(before))
        );
        println!(
            "structures: map {table_pages} pages ({:.1} B/extent), allocated {allocated_pages} + live {live_pages} bitmap pages ({:.1} B/extent): {:.1} bytes per extent",
            per(table),
            per(bitmaps),
            per(table + bitmaps)
        );
        println!(
            "checkpoint size: {} bytes ({:.1} per extent)",
            pool.store().space().used_bytes,
            per(pool.store().space().used_bytes)
        );
    });
}
