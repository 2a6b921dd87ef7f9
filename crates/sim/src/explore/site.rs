//! The explorer's [`Site`] for online changes: the config text in memory, and each new disk a
//! change asks for a blank crash disk of the running boot (named `d{i}`, so it takes the next
//! disk index), timed like the others. The change itself runs through the server's own path
//! (`Reconfig::apply`: validation, labels, the layer's order, relabelling).

use std::path::Path;
use std::sync::{Arc, Mutex};

use strata_core::{DeviceRef, MetricsRegistry, Runtime};
use strata_crash::{CrashDisk, CrashGroup};
use strata_stack::reconfig::Site;

use crate::explore::disks::{TimedDisk, Timing};

pub struct SimSite {
    text: Mutex<String>,
    group: CrashGroup,
    timing: Arc<Timing>,
    /// The disks opened, by disk index, in order.
    made: Mutex<Vec<(usize, CrashDisk)>>,
}

impl SimSite {
    pub fn new(text: String, group: CrashGroup, timing: Arc<Timing>) -> Self {
        SimSite {
            text: Mutex::new(text),
            group,
            timing,
            made: Mutex::new(Vec::new()),
        }
    }

    pub fn text(&self) -> String {
        self.text.lock().expect("config text").clone()
    }

    pub fn made(&self) -> Vec<(usize, CrashDisk)> {
        self.made.lock().expect("made disks").clone()
    }
}

impl Site for SimSite {
    fn read_config(&self, _source: &Path) -> anyhow::Result<String> {
        Ok(self.text())
    }

    fn write_config(&self, _source: &Path, text: &str) -> anyhow::Result<()> {
        *self.text.lock().expect("config text") = text.to_string();
        Ok(())
    }

    fn open_disk(
        &self,
        name: &str,
        _path: &Path,
        size: u64,
        _direct: bool,
        _runtime: &Arc<dyn Runtime>,
        _metrics: &MetricsRegistry,
    ) -> anyhow::Result<DeviceRef> {
        let index: usize = name
            .strip_prefix('d')
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("the explorer names new disks d<i>, not {name:?}"))?;
        let disk = self.group.disk(strata_crash::sector_disk(size));
        self.made
            .lock()
            .expect("made disks")
            .push((index, disk.clone()));
        Ok(Arc::new(TimedDisk::new(disk, index, self.timing.clone())))
    }
}
