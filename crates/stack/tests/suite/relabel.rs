//! The usual repair of a mirror whose leg died: add a new leg. The change path relabels every
//! disk of the hierarchy after the mirror takes the leg; the dead disk's label can be neither
//! read nor written. It keeps its old label (its older generation marks it stale) and the
//! change succeeds. Before, the relabelling failed after the mirror had taken the leg, and
//! the change was reported failed (found by `strata sim explore`'s grow step).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use strata_core::{DeviceRef, MetricsRegistry, Runtime, TokioRuntime, WriteFlags};
use strata_crash::{sector_disk, CrashDisk, CrashGroup};
use strata_stack::config;
use strata_stack::hierarchy;
use strata_stack::reconfig::{Change, Reconfig, Site};

const MIB: u64 = 1 << 20;

const CONFIG: &str = r#"
[[disk]]
name = "d0"
path = "d0.img"
[[disk]]
name = "d1"
path = "d1.img"

[[layer]]
name = "m"
kind = "mirror"
children = ["d0", "d1"]

[[export]]
name = "vol"
device = "m"
"#;

/// The config in memory; new disks are crash disks of the test's group.
struct Memory {
    text: Mutex<String>,
    group: CrashGroup,
    made: Mutex<Vec<CrashDisk>>,
}

impl Site for Memory {
    fn read_config(&self, _: &Path) -> anyhow::Result<String> {
        Ok(self.text.lock().unwrap().clone())
    }

    fn write_config(&self, _: &Path, text: &str) -> anyhow::Result<()> {
        *self.text.lock().unwrap() = text.to_string();
        Ok(())
    }

    fn open_disk(
        &self,
        _: &str,
        _: &Path,
        size: u64,
        _: bool,
        _: &Arc<dyn Runtime>,
        _: &MetricsRegistry,
    ) -> anyhow::Result<DeviceRef> {
        let disk = self.group.disk(sector_disk(size));
        self.made.lock().unwrap().push(disk.clone());
        Ok(Arc::new(disk))
    }
}

/// The change path over `loaded` (whose config is `text`), recording into memory and making
/// new disks in `group`.
fn in_memory(
    mut loaded: config::Loaded,
    text: &str,
    group: &CrashGroup,
    dir: &Path,
) -> (Reconfig, Arc<Memory>) {
    let site = Arc::new(Memory {
        text: Mutex::new(text.to_string()),
        group: group.clone(),
        made: Mutex::new(Vec::new()),
    });
    loaded.source = Some(dir.join("test.toml"));
    let reconfig = Reconfig {
        loaded,
        runtime: TokioRuntime::current(),
        metrics: MetricsRegistry::default(),
        site: site.clone(),
    };
    (reconfig, site)
}

async fn generation(disk: &CrashDisk) -> u64 {
    let image = CrashGroup::new().disk_from(disk.durable_image());
    let label = hierarchy::read_label(&image).await.unwrap();
    label.expect("a label").generation
}

#[tokio::test]
async fn a_new_leg_for_a_mirror_whose_leg_died_is_added_and_the_dead_disk_keeps_its_label() {
    let dir = tempfile::tempdir().unwrap();
    let group = CrashGroup::new();
    let disks: Vec<CrashDisk> = (0..2).map(|_| group.disk(sector_disk(8 * MIB))).collect();
    let given: BTreeMap<String, DeviceRef> = (disks.iter().enumerate())
        .map(|(i, d)| (format!("d{i}"), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let (loaded, mut stack) = crate::start_given(CONFIG, dir.path(), given).await;
    let vol = stack.exports.lookup("vol").unwrap().device.clone();
    let data = Bytes::from(vec![0x6b; 64 << 10]);
    vol.write(0, data.clone(), WriteFlags { fua: true })
        .await
        .unwrap();
    let before = generation(&disks[0]).await;
    assert_eq!(generation(&disks[1]).await, before);

    disks[1].disappear();
    let (mut reconfig, site) = in_memory(loaded, CONFIG, &group, dir.path());
    let add = Change::AddMember {
        layer: "m".into(),
        path: "d2.img".into(),
        name: Some("d2".into()),
    };
    let summary = reconfig.apply(add, &mut stack.nodes).await.unwrap();
    assert!(
        summary.contains(&format!("generation {}", before + 1)),
        "{summary}"
    );
    assert!(site
        .text
        .lock()
        .unwrap()
        .contains("children = [\"d0\", \"d1\", \"d2\"]"));

    let new = site.made.lock().unwrap()[0].clone();
    assert_eq!(generation(&disks[0]).await, before + 1);
    assert_eq!(generation(&new).await, before + 1);
    assert_eq!(
        generation(&disks[1]).await,
        before,
        "the dead disk keeps the label it had"
    );
    assert_eq!(vol.read(0, 64 << 10).await.unwrap().freeze(), data);
}

/// A concat lays its children end to end by the sizes they have at each start: growing a
/// middle child would move the data of every child after it at the next start. The change
/// path refuses that before touching anything; growing the last child is allowed. (Found by
/// `strata sim explore`: a raid5 grown under a concat that had been given a new member read
/// the new member's data 6 MiB further on after a restart.)
#[tokio::test]
async fn only_a_concats_last_child_may_grow() {
    const SLICES: &str = r#"
[[disk]]
name = "d0"
path = "d0.img"
[[disk]]
name = "d1"
path = "d1.img"
[[layer]]
name = "s"
kind = "slice"
children = ["d0"]
length = "2MiB"
[[layer]]
name = "c"
kind = "concat"
children = ["s", "d1"]
[[export]]
name = "vol"
device = "c"
"#;
    for (text, allowed) in [
        (SLICES.to_string(), false),
        (SLICES.replace("[\"s\", \"d1\"]", "[\"d1\", \"s\"]"), true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let group = CrashGroup::new();
        let given: BTreeMap<String, DeviceRef> = (0..2)
            .map(|i| {
                let disk = group.disk(sector_disk(8 * MIB));
                (format!("d{i}"), Arc::new(disk) as DeviceRef)
            })
            .collect();
        let (loaded, mut stack) = crate::start_given(&text, dir.path(), given).await;
        let (mut reconfig, site) = in_memory(loaded, &text, &group, dir.path());
        let grow = Change::Grow {
            layer: "s".into(),
            size: 4 * MIB,
        };
        let result = reconfig.apply(grow, &mut stack.nodes).await;
        if allowed {
            result.unwrap();
            assert!(site.text.lock().unwrap().contains("length = 4194304"));
        } else {
            let error = result.unwrap_err();
            let refused = error.downcast_ref::<strata_stack::reconfig::Refused>();
            assert!(refused.is_some(), "{error:#}");
            assert!(
                format!("{error}").contains("concat c's children after s"),
                "{error}"
            );
            assert_eq!(*site.text.lock().unwrap(), text, "nothing was recorded");
        }
    }
}
