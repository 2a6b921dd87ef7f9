//! `strata check`: verify a device's metadata offline, and repair only what cannot lose
//! acknowledged data.
//!
//! Checks: both superblock copies, every block of the current checkpoint (crc32c, epoch,
//! position), every journal batch up to the first that does not belong (a torn batch is the
//! trace of an interrupted commit, reported but harmless), the state's own encoding, and the
//! owner's invariants (for a thin pool: every mapping inside the pool, marked allocated,
//! owned once; allocation counts agree; no live data in unmapped extents).
//!
//! Repair rewrites the metadata from what recovery reads: a fresh checkpoint and both
//! superblock copies. That drops only a torn, never-acknowledged batch and fixes a damaged
//! superblock copy. A damaged checkpoint or broken invariants are reported and left alone,
//! because any fix would have to guess.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use strata_backend::{FileDevice, FileOptions};
use strata_core::{DeviceRef, TokioRuntime};
use strata_meta::{JournalEnd, MetaStore, StoreOptions};

#[derive(Debug, Serialize)]
pub struct DeviceReport {
    pub path: PathBuf,
    /// The disk's hierarchy label, if it is under a layer.
    pub hierarchy: Option<String>,
    pub owner: Option<String>,
    pub generation: Option<u64>,
    pub checkpoint_bytes: u64,
    /// Byte offsets of the metadata region (its superblocks), the current checkpoint and
    /// the journal on the device.
    pub metadata_offset: u64,
    pub checkpoint_offset: u64,
    pub journal_offset: u64,
    pub batches: u64,
    pub transactions: u64,
    pub journal_end: Option<JournalEnd>,
    pub objects: usize,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    pub recovery_ms: f64,
    /// Problems that recovery handles by itself (a torn batch, a bad superblock copy).
    pub warnings: Vec<String>,
    /// Problems that need attention: the metadata is damaged.
    pub errors: Vec<String>,
    pub repaired: bool,
}

pub async fn check(path: &Path, repair: bool) -> anyhow::Result<DeviceReport> {
    let runtime = TokioRuntime::current();
    let mut options = FileOptions::new(path.to_path_buf());
    options.read_only = !repair;
    let device: DeviceRef = Arc::new(
        FileDevice::open(options, runtime)
            .with_context(|| format!("opening {}", path.display()))?,
    );
    let mut report = DeviceReport {
        path: path.to_path_buf(),
        hierarchy: None,
        owner: None,
        generation: None,
        checkpoint_bytes: 0,
        metadata_offset: 0,
        checkpoint_offset: 0,
        journal_offset: 0,
        batches: 0,
        transactions: 0,
        journal_end: None,
        objects: 0,
        used_bytes: 0,
        capacity_bytes: 0,
        recovery_ms: 0.0,
        warnings: Vec::new(),
        errors: Vec::new(),
        repaired: false,
    };
    // A disk under a layer starts with its hierarchy label; the layer's metadata follows it.
    let label = crate::hierarchy::read_label(device.as_ref()).await?;
    let offset = if let Some(label) = &label {
        report.hierarchy = Some(format!(
            "{} generation {} member {}",
            label.uuid, label.generation, label.member
        ));
        crate::hierarchy::LABEL_BYTES
    } else {
        0
    };
    let recovered = match strata_meta::recover(device.as_ref(), offset).await {
        Ok(recovered) => recovered,
        Err(error) => {
            report.errors.push(error.to_string());
            return Ok(report);
        }
    };
    let superblock = &recovered.superblock;
    report.owner = Some(superblock.owner.clone());
    report.generation = Some(superblock.generation);
    report.checkpoint_bytes = recovered.checkpoint_bytes;
    report.metadata_offset = offset;
    report.checkpoint_offset = superblock.layout.slot_offset(superblock.active_slot);
    report.journal_offset = superblock.layout.journal_offset(0);
    report.batches = recovered.batches_replayed;
    report.transactions = recovered.txns_replayed;
    report.journal_end = Some(recovered.journal_end.clone());
    report.objects = recovered.state.objects().count();
    report.used_bytes = recovered.state.encoded_bytes();
    report.capacity_bytes = superblock.layout.slot_capacity_bytes();
    report.recovery_ms = recovered.elapsed.as_secs_f64() * 1e3;
    for (copy, reason) in &recovered.superblock_faults {
        let copy = ["A", "B"][*copy as usize];
        report
            .warnings
            .push(format!("superblock copy {copy}: {reason}"));
    }
    // A batch replayed from its twin lost nothing, but a copy was damaged (or torn by a
    // crash): say so, never "clean".
    for fault in &recovered.journal_copy_faults {
        report.warnings.push(fault.clone());
    }
    if let JournalEnd::Torn(reason) = &recovered.journal_end {
        report.warnings.push(format!(
            "journal ends in a torn batch (an interrupted commit, never acknowledged): {reason}"
        ));
    }
    if report.used_bytes > report.capacity_bytes {
        report.errors.push(format!(
            "state of {} bytes exceeds its {}-byte slot",
            report.used_bytes, report.capacity_bytes
        ));
    }
    match superblock.owner.as_str() {
        "thin-pool" => report
            .errors
            .extend(strata_layers::thin::check_state(&recovered.state)),
        other => report
            .warnings
            .push(format!("no invariants known for owner {other:?}")),
    }
    if repair && report.errors.is_empty() && !report.warnings.is_empty() {
        let (store, _) =
            MetaStore::open(device.clone(), offset, StoreOptions::new("check")).await?;
        // Open wrote one checkpoint; a second rewrites the other superblock copy too.
        store.checkpoint_now().await?;
        report.repaired = true;
    }
    Ok(report)
}

pub fn render(report: &DeviceReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{}:", report.path.display());
    if let Some(hierarchy) = &report.hierarchy {
        let _ = writeln!(out, "  hierarchy {hierarchy}");
    }
    if let (Some(owner), Some(generation)) = (&report.owner, report.generation) {
        let _ = writeln!(out, "  owner {owner}, generation {generation}");
        let _ = writeln!(
            out,
            "  checkpoint {} bytes; journal {} batches, {} transactions, end {:?}",
            report.checkpoint_bytes, report.batches, report.transactions, report.journal_end
        );
        let _ = writeln!(
            out,
            "  {} objects, {} of {} bytes of metadata space; recovered in {:.1} ms",
            report.objects, report.used_bytes, report.capacity_bytes, report.recovery_ms
        );
    }
    for warning in &report.warnings {
        let _ = writeln!(out, "  warning: {warning}");
    }
    for error in &report.errors {
        let _ = writeln!(out, "  ERROR: {error}");
    }
    let verdict = match (
        report.errors.is_empty(),
        report.warnings.is_empty(),
        report.repaired,
    ) {
        (false, _, _) => "damaged: not repaired (a repair would have to guess)",
        (true, _, true) => "repaired",
        (true, true, _) => "clean",
        (true, false, false) => {
            "consistent; recovery will handle the warnings (or run with --repair)"
        }
    };
    let _ = writeln!(out, "  {verdict}");
    out
}
