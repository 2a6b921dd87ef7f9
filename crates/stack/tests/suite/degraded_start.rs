//! An array whose member is a layer (a crypt over a disk) when that disk is gone: the member
//! layer is refused, and the array decides as if the member were missing. It starts degraded
//! with `--degraded` and serves what was written; without it, it is refused. Before, any
//! layer over a refused layer was refused, so one dead disk under a crypt took the whole
//! raid5 down (found by `strata sim explore`, docs/explore.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use strata_backend::MemoryDevice;
use strata_core::{DeviceRef, MetricsRegistry, TokioRuntime, WriteFlags};
use strata_stack::build::{self, Disks, StartOptions};
use strata_stack::config;

const MIB: u64 = 1 << 20;

const CONFIG: &str = r#"
[[disk]]
name = "d0"
path = "d0.img"
[[disk]]
name = "d1"
path = "d1.img"
[[disk]]
name = "d2"
path = "d2.img"

[[layer]]
name = "secret"
kind = "crypt"
children = ["d0"]
key-file = "keys/enc.key"

[[layer]]
name = "r5"
kind = "raid5"
children = ["secret", "d1", "d2"]
chunk = "16KiB"
journal = "1MiB"

[[export]]
name = "vol"
device = "r5"
"#;

async fn start(
    disks: &BTreeMap<String, DeviceRef>,
    dir: &std::path::Path,
    degraded: bool,
) -> anyhow::Result<build::Stack> {
    let loaded = config::load(CONFIG, "degraded.toml", dir, Some(dir)).unwrap();
    let options = StartOptions {
        degraded,
        ..StartOptions::default()
    };
    build::build_on(
        &loaded,
        &Disks::Given(disks.clone()),
        &options,
        TokioRuntime::current(),
        &MetricsRegistry::default(),
    )
    .await
}

#[tokio::test]
async fn a_raid5_whose_crypt_member_lost_its_disk_starts_degraded_only_when_told() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("keys")).unwrap();
    std::fs::write(
        dir.path().join("keys/enc.key"),
        (0..64).collect::<Vec<u8>>(),
    )
    .unwrap();
    let mut disks: BTreeMap<String, DeviceRef> = ["d0", "d1", "d2"]
        .into_iter()
        .map(|n| {
            (
                n.to_string(),
                Arc::new(MemoryDevice::new(8 * MIB)) as DeviceRef,
            )
        })
        .collect();
    let data = Bytes::from(vec![0x5a; 64 << 10]);
    {
        let stack = start(&disks, dir.path(), false).await.unwrap();
        let vol = stack.exports.lookup("vol").unwrap().device.clone();
        vol.write(0, data.clone(), WriteFlags { fua: true })
            .await
            .unwrap();
        vol.flush().await.unwrap();
        for node in &stack.nodes {
            node.stop_background().await.unwrap();
        }
    }
    disks.remove("d0");

    let refused = match start(&disks, dir.path(), false).await {
        Ok(stack) => stack
            .refused
            .iter()
            .map(|r| r.reason.clone())
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => format!("{e:#}"),
    };
    assert!(refused.contains("--degraded"), "{refused}");

    let stack = start(&disks, dir.path(), true).await.unwrap();
    let names: Vec<&str> = stack.refused.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["secret"],
        "only the crypt over the gone disk is refused"
    );
    let vol = stack
        .exports
        .lookup("vol")
        .expect("the raid5 serves")
        .device
        .clone();
    assert_eq!(vol.read(0, 64 << 10).await.unwrap().freeze(), data);
}
