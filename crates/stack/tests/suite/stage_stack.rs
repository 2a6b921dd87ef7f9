//! A `stage` built from a configuration, as `strata serve` builds it: a mirror of two flash
//! disks as its fast child (what `docs/layers/stage.md` recommends) over a raid5 as its slow
//! child. It formats on blank disks, serves, describes its config, and reopens with its data
//! from the labels it wrote; a configuration it cannot take is refused by field.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::{BlockDevice, DeviceRef, MetricsRegistry, TokioRuntime, WriteFlags};
use strata_stack::build::{self, Disks, StartOptions};
use strata_stack::config;

const MIB: u64 = 1 << 20;

const CONFIG: &str = r#"
[[disk]]
name = "f0"
path = "f0.img"
size = "16MiB"
[[disk]]
name = "f1"
path = "f1.img"
size = "16MiB"
[[disk]]
name = "d0"
path = "d0.img"
size = "16MiB"
[[disk]]
name = "d1"
path = "d1.img"
size = "16MiB"
[[disk]]
name = "d2"
path = "d2.img"
size = "16MiB"

[[layer]]
name = "flash"
kind = "mirror"
children = ["f0", "f1"]

[[layer]]
name = "r5"
kind = "raid5"
children = ["d0", "d1", "d2"]

[[layer]]
name = "st"
kind = "stage"
children = ["flash", "r5"]
range = "64KiB"
extent = "256KiB"
threshold = "32KiB"
trigger = "density"

[[export]]
name = "vol"
device = "st"
"#;

async fn build(disks: &BTreeMap<String, DeviceRef>, dir: &std::path::Path) -> build::Stack {
    let loaded = config::load(CONFIG, "stage.toml", dir, Some(dir)).unwrap();
    build::build_on(
        &loaded,
        &Disks::Given(disks.clone()),
        &StartOptions::default(),
        TokioRuntime::current(),
        &MetricsRegistry::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_stage_over_a_mirror_and_a_raid5_serves_from_a_config_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let disks: BTreeMap<String, DeviceRef> =
        [("f0", 16), ("f1", 16), ("d0", 16), ("d1", 16), ("d2", 16)]
            .into_iter()
            .map(|(name, mib)| {
                (
                    name.to_string(),
                    Arc::new(MemoryDevice::new(mib * MIB)) as DeviceRef,
                )
            })
            .collect();
    let stack = build(&disks, dir.path()).await;
    assert!(stack.refused.is_empty(), "{:?}", stack.refused);
    let vol = stack.exports.lookup("vol").unwrap().device.clone();
    let small = Bytes::from(vec![7u8; 8192]);
    let large = Bytes::from(vec![9u8; 256 << 10]);
    vol.write(4096, small.clone(), WriteFlags::default())
        .await
        .unwrap();
    vol.write(1 << 20, large.clone(), WriteFlags { fua: true })
        .await
        .unwrap();
    vol.flush().await.unwrap();
    let node = stack.nodes.iter().find(|n| n.name == "st").unwrap();
    let status = node.describe().await.unwrap();
    assert_eq!(status.kind, "stage");
    let described = status.config.expect("a stage describes its config");
    assert_eq!(
        described.get("trigger").and_then(|v| v.as_str()),
        Some("density")
    );
    assert!(described.contains_key("metadata-size"), "{described:?}");
    for node in &stack.nodes {
        node.stop_background().await.unwrap();
    }
    drop(vol);
    drop(stack);

    let again = build(&disks, dir.path()).await;
    assert!(again.refused.is_empty(), "{:?}", again.refused);
    let vol = again.exports.lookup("vol").unwrap().device.clone();
    assert_eq!(vol.read(4096, 8192).await.unwrap().freeze(), small);
    assert_eq!(vol.read(1 << 20, 256 << 10).await.unwrap().freeze(), large);
    for node in &again.nodes {
        node.stop_background().await.unwrap();
    }
}

/// The loader's refusal of `text`, as its message.
fn refusal(text: &str, dir: &std::path::Path) -> String {
    match config::load(text, "stage.toml", dir, None) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn a_stage_option_it_does_not_know_or_cannot_take_is_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = CONFIG.replace(
        "trigger = \"density\"",
        "trigger = \"density\"\nthreshhold = 4096",
    );
    let error = refusal(&unknown, dir.path());
    assert!(error.to_string().contains("threshhold"), "{error}");
    let bad = CONFIG.replace("trigger = \"density\"", "trigger = \"sometimes\"");
    let error = refusal(&bad, dir.path());
    assert!(error.to_string().contains("sometimes"), "{error}");
    let bad = CONFIG.replace("range = \"64KiB\"", "range = \"96KiB\"");
    let error = refusal(&bad, dir.path());
    assert!(error.to_string().contains("`range`"), "{error}");
    let one_child = CONFIG.replace("children = [\"flash\", \"r5\"]", "children = [\"r5\"]");
    let error = refusal(&one_child, dir.path());
    assert!(error.to_string().contains("exactly 2 children"), "{error}");
}
