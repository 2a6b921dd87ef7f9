//! Helpers shared by the thin pool's tests: the pool they format, with the commit timer off
//! so that only the test's own flushes commit.

#![allow(dead_code)] // Each test crate uses a different subset.

use std::sync::Arc;

use strata_core::{DeviceRef, TokioRuntime};
use strata_thin::{PoolOptions, PoolRuntime, ThinPool};

/// Pool settings with no commit timer and no versions-policy runner: commits happen at
/// flushes the test issues, and policies run when the test drives them.
pub fn settings() -> PoolRuntime {
    let mut settings = PoolRuntime::new(TokioRuntime::current());
    settings.commit_interval = None;
    settings.policy_interval = None;
    settings
}

/// Extents of `extent_size` after `metadata_size` bytes of metadata.
pub fn pool_options(extent_size: u64, metadata_size: u64) -> PoolOptions {
    PoolOptions {
        extent_size,
        metadata_size: Some(metadata_size),
        start_mid: false,
    }
}

/// Formats pool `pool` over `child` with [`settings`].
pub async fn format_pool(child: DeviceRef, extent_size: u64, metadata_size: u64) -> Arc<ThinPool> {
    let options = pool_options(extent_size, metadata_size);
    ThinPool::format("pool", child, &options, settings())
        .await
        .unwrap()
}
