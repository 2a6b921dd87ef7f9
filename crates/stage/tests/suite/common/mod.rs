//! Helpers shared by the stage's tests: a small stage (64 KiB ranges, 256 KiB extents, 32 KiB
//! threshold) whose destages run inline, so that a test (and a power cut) sees every step.

#![allow(dead_code)] // Each test crate uses a different subset.

use std::sync::Arc;

use strata_core::{ByteSize, DeviceRef, TokioRuntime};
use strata_stage::{Settings, Stage, StageConfig};

pub const METADATA: u64 = 1 << 20;
pub const BLOCK: u64 = 4096;

/// A stage config for tests: small ranges and extents, a 32 KiB threshold, 1 MiB of
/// metadata, the given trigger.
pub fn config(trigger: &str) -> StageConfig {
    let mut config = StageConfig {
        threshold: ByteSize(32 << 10),
        extent: ByteSize(256 << 10),
        range: ByteSize(64 << 10),
        window: 4,
        metadata_size: Some(ByteSize(METADATA)),
        ..StageConfig::default()
    };
    config.trigger = match trigger {
        "full" => strata_stage::trigger::TriggerKind::Full,
        "watermark" => strata_stage::trigger::TriggerKind::Watermark,
        "density" => strata_stage::trigger::TriggerKind::Density,
        other => panic!("no trigger {other}"),
    };
    config
}

/// Inline destages, no background task.
pub fn settings(config: &StageConfig) -> Settings {
    Settings::from_config(config, TokioRuntime::current())
}

/// A fast child with `slots` log slots after the metadata region.
pub fn fast_size(slots: u64) -> u64 {
    METADATA + slots * BLOCK
}

pub async fn format(fast: DeviceRef, slow: DeviceRef, config: &StageConfig) -> Arc<Stage> {
    Stage::format("st", fast, slow, config, settings(config))
        .await
        .unwrap()
}

pub async fn reopen(fast: DeviceRef, slow: DeviceRef, config: &StageConfig) -> Arc<Stage> {
    let stage = Stage::open("st", fast, slow, settings(config))
        .await
        .unwrap();
    let problems = stage.store().read(strata_stage::check_state);
    assert!(
        problems.is_empty(),
        "invariants broken after reopen: {problems:?}"
    );
    stage
}

/// A block of `byte` repeated, tagged with its block number so a misplaced block shows.
pub fn block_data(block: u64, byte: u8) -> Vec<u8> {
    let mut data = vec![byte; BLOCK as usize];
    data[..8].copy_from_slice(&block.to_le_bytes());
    data
}

/// The value of a named counter.
pub fn counter(stage: &Stage, name: &str) -> u64 {
    stage
        .counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no counter {name:?}"))
        .1
}
