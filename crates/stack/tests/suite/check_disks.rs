//! `strata check` on a disk whose layer keeps no metadata on it: a thin pool over a slice at
//! offset 0 puts the pool's own superblock right after the disk's label, where a metadata
//! layer's would be. The check must not take it for the disk's metadata (it reported the
//! disk damaged: found by `strata sim explore` running the check on every start's disks).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use strata_core::{DeviceRef, WriteFlags};
use strata_crash::{sector_disk, CrashGroup};
use strata_stack::check;

const CONFIG: &str = r#"
[[disk]]
name = "d0"
path = "d0.img"
[[layer]]
name = "s"
kind = "slice"
children = ["d0"]
[[layer]]
name = "pool"
kind = "thin-pool"
children = ["s"]
volumes = [{ name = "v", size = "4MiB" }]
[[export]]
name = "vol"
device = "pool/v"
"#;

#[tokio::test]
async fn a_disk_under_a_slice_holds_data_only_and_is_not_reported_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let disk = CrashGroup::new().disk(sector_disk(16 << 20));
    let given = BTreeMap::from([("d0".to_string(), Arc::new(disk.clone()) as DeviceRef)]);
    let (_, stack) = crate::start_given(CONFIG, dir.path(), given).await;
    let vol = stack.exports.lookup("vol").unwrap().device.clone();
    vol.write(0, Bytes::from(vec![3; 65536]), WriteFlags { fua: true })
        .await
        .unwrap();
    for node in &stack.nodes {
        node.stop_background().await.unwrap();
    }
    let report = check::check_device(Path::new("d0"), Arc::new(disk))
        .await
        .unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let note = report.note.unwrap_or_default();
    assert!(note.contains("layer s (slice) keeps no metadata"), "{note}");
}

/// A raid5's journal device holds every member's journal and no metadata store: `strata
/// check` reported it damaged ("no metadata superblock after the hierarchy label").
#[tokio::test]
async fn a_raid5_journal_device_holds_journals_and_is_not_reported_damaged() {
    const RAID5: &str = r#"
[[disk]]
name = "d0"
path = "d0.img"
[[disk]]
name = "d1"
path = "d1.img"
[[disk]]
name = "d2"
path = "d2.img"
[[disk]]
name = "nv"
path = "nv.img"
[[layer]]
name = "r"
kind = "raid5"
children = ["d0", "d1", "d2", "nv"]
journal-device = "nv"
journal = "1MiB"
[[export]]
name = "vol"
device = "r"
"#;
    let dir = tempfile::tempdir().unwrap();
    let group = CrashGroup::new();
    let disks: BTreeMap<String, strata_crash::CrashDisk> = ["d0", "d1", "d2", "nv"]
        .into_iter()
        .map(|n| (n.to_string(), group.disk(sector_disk(16 << 20))))
        .collect();
    let given = (disks.iter())
        .map(|(n, d)| (n.clone(), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let (_, stack) = crate::start_given(RAID5, dir.path(), given).await;
    let vol = stack.exports.lookup("vol").unwrap().device.clone();
    vol.write(0, Bytes::from(vec![5; 65536]), WriteFlags { fua: true })
        .await
        .unwrap();
    for node in &stack.nodes {
        node.stop_background().await.unwrap();
    }
    for (name, disk) in &disks {
        let report = check::check_device(Path::new(name), Arc::new(disk.clone()))
            .await
            .unwrap();
        assert!(report.errors.is_empty(), "{name}: {:?}", report.errors);
        if name == "nv" {
            let note = report.note.unwrap_or_default();
            assert!(note.contains("journal device of its layer r"), "{note}");
        } else {
            assert_eq!(report.owner.as_deref(), Some("raid5"), "{name}");
        }
    }
}
