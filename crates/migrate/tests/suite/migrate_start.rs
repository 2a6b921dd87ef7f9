//! Format or open, never silently: the layer formats only a blank child 0 it may format,
//! opens its own metadata without formatting again, and refuses a damaged map, a missing or
//! reordered child and a changed chunk, naming why.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::layer::{LayerArgs, Options, StartPolicy};
use strata_core::{BlockDevice, ByteSize, DeviceRef, WriteFlags};
use strata_meta::TxnClass;
use strata_migrate::records::{Entry, Location};
use strata_migrate::{open_or_format, Migrate, MigrateConfig, MigrateDevice};

use crate::common::*;

const MAY: StartPolicy = StartPolicy {
    may_format: true,
    allow_degraded: false,
};

fn memory(size: u64) -> DeviceRef {
    Arc::new(MemoryDevice::new(size))
}

fn children() -> Vec<DeviceRef> {
    vec![memory(local_size(16)), memory(16 * CHUNK)]
}

async fn start(
    children: &[DeviceRef],
    config: &MigrateConfig,
    start: StartPolicy,
) -> strata_core::Result<Arc<Migrate>> {
    let clock = ManualClock::new();
    open_or_format(
        "mig",
        children.to_vec(),
        config,
        settings(config, &clock),
        start,
    )
    .await
}

async fn contents(device: &DeviceRef) -> Vec<u8> {
    device
        .read(0, device.geometry().size as usize)
        .await
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn a_blank_child_zero_is_formatted_only_when_allowed_and_a_reopen_never_formats() {
    let config = config("str", "mig", "0");
    let children = children();
    let error = start(&children, &config, StartPolicy::default())
        .await
        .err()
        .expect("a blank region without permission is refused");
    assert!(error.to_string().contains("--format"), "{error}");
    let layer = start(&children, &config, MAY).await.unwrap();
    // Chunks 0 and 1: one on each child.
    MigrateDevice(layer.clone())
        .write(
            0,
            Bytes::from(vec![5; 2 * CHUNK as usize]),
            WriteFlags { fua: true },
        )
        .await
        .unwrap();
    drop(layer);
    for _ in 0..2 {
        // Opened, not formatted again, whatever the policy: the data is there.
        let layer = start(&children, &config, MAY).await.unwrap();
        let data = MigrateDevice(layer.clone())
            .read(0, 2 * CHUNK as usize)
            .await
            .unwrap();
        assert!(data.iter().all(|&b| b == 5));
        assert_invariants(&layer);
    }
}

#[tokio::test]
async fn a_child_zero_holding_other_data_is_refused_even_when_formatting_is_allowed() {
    let config = config("str", "mig", "0");
    let children = children();
    children[0]
        .write(8192, Bytes::from(vec![1; 4096]), WriteFlags::default())
        .await
        .unwrap();
    let error = start(&children, &config, MAY).await.err().unwrap();
    assert_eq!(error.errno(), strata_core::errno::EIO, "{error}");
    assert!(error.to_string().contains("not blank"), "{error}");
}

#[tokio::test]
async fn damaged_metadata_is_refused_not_served_as_empty() {
    let config = config("str", "mig", "0");
    let children = children();
    drop(start(&children, &config, MAY).await.unwrap());
    children[0]
        .write(0, Bytes::from(vec![0xff; 8192]), WriteFlags::default())
        .await
        .unwrap();
    let error = start(&children, &config, MAY).await.err().unwrap();
    assert!(
        error.to_string().contains("refusing to open or format"),
        "{error}"
    );
}

/// A map that reads back well-formed but breaks the layer's invariant (a block valid in two
/// places) is refused at open, with the problem named.
#[tokio::test]
async fn an_inconsistent_map_is_refused_with_the_problem_named() {
    let config = config("str", "mig", "0");
    let children = children();
    let layer = start(&children, &config, MAY).await.unwrap();
    let store = layer.store().clone();
    let chunks = store.read(|state| state.id("chunks").unwrap());
    let twice = Entry {
        locations: [
            Some(Location {
                device: 0,
                slot: 0,
                valid: 0b11,
            }),
            Some(Location {
                device: 1,
                slot: 0,
                valid: 0b01,
            }),
        ],
    };
    store
        .transact(TxnClass::Normal, |_, txn| {
            txn.set(chunks, 0, &twice.encode());
            Ok(())
        })
        .unwrap();
    store.commit().await.unwrap();
    drop(store);
    drop(layer);
    let error = start(&children, &config, MAY).await.err().unwrap();
    let text = error.to_string();
    assert_eq!(error.errno(), strata_core::errno::EIO, "{text}");
    assert!(text.contains("valid in two places"), "{text}");
    assert!(text.contains("strata check"), "{text}");
}

#[tokio::test]
async fn a_missing_child_is_refused() {
    let config = config("str", "mig", "0");
    let mut children = vec![memory(local_size(8)), memory(8 * CHUNK), memory(8 * CHUNK)];
    drop(start(&children, &config, MAY).await.unwrap());
    children.pop();
    let error = start(&children, &config, MAY).await.err().unwrap();
    assert!(error.to_string().contains("a child is missing"), "{error}");
    // A child given smaller than the layer was formatted with.
    children.push(memory(4 * CHUNK));
    let error = start(&children, &config, MAY).await.err().unwrap();
    assert!(error.to_string().contains("child 2 has"), "{error}");
    // Through the registry: a member missing at assembly is named.
    let mut options = BTreeMap::new();
    options.insert(
        "delta".to_string(),
        strata_core::layer::OptionValue::Text("0".into()),
    );
    let args = LayerArgs {
        name: "mig".into(),
        children: vec![Some(children[0].clone()), None],
        child_names: vec!["local".into(), "brick".into()],
        options: Options::new(options, ".".into()),
        runtime: ManualClock::new(),
        start: MAY,
    };
    let error = (strata_migrate::KIND.build)(args).await.err().unwrap();
    assert!(error.to_string().contains("brick is missing"), "{error}");
}

#[tokio::test]
async fn reordered_children_are_refused_and_nothing_is_written() {
    let config = config("str", "mig", "0");
    let children = vec![memory(local_size(16)), memory(local_size(16))];
    drop(start(&children, &config, MAY).await.unwrap());
    let before = (contents(&children[0]).await, contents(&children[1]).await);
    let swapped = vec![children[1].clone(), children[0].clone()];
    let error = start(&swapped, &config, MAY).await.err().unwrap();
    assert!(error.to_string().contains("reordered"), "{error}");
    assert!(!error.to_string().contains("--format"), "{error}");
    assert_eq!(
        before,
        (contents(&children[0]).await, contents(&children[1]).await)
    );
}

#[tokio::test]
async fn the_chunk_fixed_at_creation_cannot_change_at_a_reopen() {
    let config = config("str", "mig", "0");
    let children = children();
    drop(start(&children, &config, MAY).await.unwrap());
    let mut other = config.clone();
    other.chunk = ByteSize(32 << 10);
    let error = start(&children, &other, MAY).await.err().unwrap();
    assert!(error.to_string().contains("field `chunk`"), "{error}");
    // Policy settings may change.
    let mut other = config.clone();
    other.policy = "nomig".to_string().try_into().unwrap();
    other.delta = "adaptive".into();
    start(&children, &other, MAY).await.unwrap();
}
