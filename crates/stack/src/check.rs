//! `strata check`: verify a device's metadata offline, and repair only what cannot lose
//! acknowledged data.
//!
//! Checks: both superblock copies, every block of the current checkpoint (crc32c, epoch,
//! position), every journal batch up to the first that does not belong (a torn batch is the
//! trace of an interrupted commit, reported but harmless), the state's own encoding, and the
//! owner's invariants (for a thin pool: every mapping inside the pool, marked allocated,
//! owned once; allocation counts agree; no live data in unmapped extents; for a stage,
//! `strata_stage::check_state`: one live block per physical block, the log and its reverse
//! table agreeing; for a migrate layer, `strata_migrate::check_state`: every written block
//! valid in exactly one place, no chunk slot used twice).
//!
//! Repair rewrites the metadata from what recovery reads: a fresh checkpoint and both
//! superblock copies. That drops only a torn, never-acknowledged batch and fixes a damaged
//! superblock copy. A damaged checkpoint or broken invariants are reported and left alone,
//! because any fix would have to guess. A device with nothing to repair is not written.
//!
//! A member of a mirror or raid5 is repaired only with every member of its layer on the
//! command line, all at one metadata generation and journal length, and then all of them are
//! rewritten: the
//! rewrite raises the generation, and raising one member's alone could make a stale member
//! look newest to its layer.

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
    /// No hierarchy label and no metadata superblock: not a Strata disk (not damage).
    pub not_strata: bool,
    /// Information that is not a finding: a disk whose layer keeps no metadata on its members
    /// (a stripe, a concat), an owner whose invariants check does not know.
    pub note: Option<String>,
    /// Findings a repair fixes (a damaged superblock copy, a torn journal tail).
    #[serde(skip)]
    needs_repair: bool,
    #[serde(skip)]
    label: Option<crate::hierarchy::Label>,
}

/// `strata check`'s exit status when a device is not a Strata disk (and none is damaged).
pub const NOT_STRATA_EXIT: u8 = 3;

/// Kinds that keep metadata on every member (at the start of each, after the label).
const METADATA_KINDS: [&str; 3] = [strata_thin::KIND.kind, "mirror", "raid5"];

/// Whether `member`, a child of a `kind` layer with these `children` (its members: a
/// raid5's journal device is not one, see [`parent_layer`]), starts with metadata after its
/// label: every member of the kinds above; a stage's fast child (its first), not its slow
/// one, which holds data only; a migrate layer's first child (the local disk), not the
/// others.
fn holds_metadata(kind: &str, children: &[String], member: &str) -> bool {
    let first = children.first().map(String::as_str) == Some(member);
    (METADATA_KINDS.contains(&kind) && children.iter().any(|c| c == member))
        || (kind == strata_stage::KIND.kind && first)
        || (kind == strata_migrate::KIND.kind && first)
}
/// What a disk whose layer keeps no metadata on it holds instead, for the report.
fn no_metadata_note(layer: &str, kind: &str, children: &[String]) -> String {
    if kind == strata_stage::KIND.kind {
        format!(
            "its layer {layer} (stage) keeps its metadata on its fast child, {}, not on this \
             slow child",
            children[0]
        )
    } else if kind == strata_migrate::KIND.kind {
        format!(
            "its layer {layer} (migrate) keeps its metadata on its first child, {}, not on \
             this one",
            children[0]
        )
    } else if kind == "raid5" {
        format!("it is the journal device of its layer {layer} (raid5): it holds journals only")
    } else {
        format!("its layer {layer} ({kind}) keeps no metadata on its members")
    }
}

/// Kinds whose members' metadata must agree: repairing one alone could promote it.
const MULTI_MEMBER_KINDS: [&str; 2] = ["mirror", "raid5"];

/// The layer a labelled disk is a child of, from the graph its label carries: (name, kind,
/// members: its children but a raid5's journal device, which holds the members' journals
/// and no metadata).
fn parent_layer(label: &crate::hierarchy::Label) -> Option<(String, String, Vec<String>)> {
    let doc: toml::Table = toml::from_str(&label.hierarchy).ok()?;
    let layers = doc.get("layer")?.as_array()?;
    layers.iter().find_map(|layer| {
        let children: Vec<String> = layer
            .get("children")?
            .as_array()?
            .iter()
            .filter_map(|c| c.as_str().map(str::to_string))
            .collect();
        if !children.contains(&label.member) {
            return None;
        }
        let journal = layer.get("journal-device").and_then(|j| j.as_str());
        let children = children
            .into_iter()
            .filter(|c| Some(c.as_str()) != journal)
            .collect();
        Some((
            layer.get("name")?.as_str()?.to_string(),
            layer.get("kind")?.as_str()?.to_string(),
            children,
        ))
    })
}

/// Checks every device, then repairs (if asked) only what needs it, under the member rules
/// above. Refuses the whole repair, writing nothing, when a rule is broken.
pub async fn check_all(paths: &[PathBuf], repair: bool) -> anyhow::Result<Vec<DeviceReport>> {
    let mut reports = Vec::new();
    for path in paths {
        reports.push(check(path).await?);
    }
    if !repair {
        return Ok(reports);
    }
    // Which devices to rewrite: decided for all before writing any.
    let mut rewrite = vec![false; reports.len()];
    for (i, report) in reports.iter().enumerate() {
        let parent = report
            .label
            .as_ref()
            .and_then(|l| parent_layer(l).map(|p| (l, p)));
        let Some((label, (layer, kind, members))) = parent else {
            rewrite[i] |= report.needs_repair && report.errors.is_empty();
            continue;
        };
        // A raid5's journal device is no member: it holds no metadata to agree with theirs.
        if !MULTI_MEMBER_KINDS.contains(&kind.as_str()) || !members.contains(&label.member) {
            rewrite[i] |= report.needs_repair && report.errors.is_empty();
            continue;
        }
        let siblings: Vec<usize> = reports
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.label
                    .as_ref()
                    .is_some_and(|l| l.uuid == label.uuid && members.contains(&l.member))
            })
            .map(|(j, _)| j)
            .collect();
        let given: Vec<&str> = siblings
            .iter()
            .filter_map(|&j| reports[j].label.as_ref().map(|l| l.member.as_str()))
            .collect();
        let absent: Vec<&str> = members
            .iter()
            .map(String::as_str)
            .filter(|m| !given.contains(m))
            .collect();
        if !absent.is_empty() {
            anyhow::bail!(
                "{} is member {} of {kind} {layer}: --repair of one member alone could make a \
                 stale member win. Give every member of {layer} on the command line (missing \
                 here: {}); nothing was written. For a lost or stale member, serve with \
                 --degraded and use `strata replace`",
                report.path.display(),
                label.member,
                absent.join(", ")
            );
        }
        let any_needs = siblings.iter().any(|&j| reports[j].needs_repair);
        if !any_needs {
            continue;
        }
        // Where each member's metadata got to: the checkpoint's generation and the journal
        // replayed after it. Members that took the same updates agree on both; a member that
        // missed some (failed, then the others went on) is behind on one of them.
        let progress = |r: &DeviceReport| r.generation.map(|g| (g, r.batches, r.transactions));
        let generations: Vec<String> = siblings
            .iter()
            .map(|&j| {
                let member = reports[j].label.as_ref().map_or("?", |l| l.member.as_str());
                match progress(&reports[j]) {
                    Some((g, _, t)) => format!("{member} at generation {g} + {t} transactions"),
                    None => format!("{member} unreadable"),
                }
            })
            .collect();
        let first = progress(&reports[siblings[0]]);
        let agree = siblings
            .iter()
            .all(|&j| first.is_some() && progress(&reports[j]) == first);
        let clean = siblings.iter().all(|&j| reports[j].errors.is_empty());
        if !agree || !clean {
            anyhow::bail!(
                "the members of {kind} {layer} do not agree ({}): a member is damaged or behind, \
                 and repairing would have to choose which wins. Nothing was written; serve with \
                 --degraded and use `strata replace` for the stale or damaged member",
                generations.join(", ")
            );
        }
        for &j in &siblings {
            rewrite[j] = true;
        }
    }
    for (report, rewrite) in reports.iter_mut().zip(rewrite) {
        if rewrite {
            rewrite_metadata(&report.path, report.metadata_offset).await?;
            report.repaired = true;
        }
    }
    Ok(reports)
}

/// Rewrites the metadata at `offset` from what recovery reads: a new checkpoint and both
/// superblock copies.
async fn rewrite_metadata(path: &Path, offset: u64) -> anyhow::Result<()> {
    let device: DeviceRef = Arc::new(
        FileDevice::open(
            FileOptions::new(path.to_path_buf()),
            TokioRuntime::current(),
        )
        .with_context(|| format!("opening {} to repair it", path.display()))?,
    );
    let (store, _) = MetaStore::open(device, offset, StoreOptions::new("check")).await?;
    // Open wrote one checkpoint; a second rewrites the other superblock copy too.
    store.checkpoint_now().await?;
    Ok(())
}

/// Checks one device, read-only.
pub async fn check(path: &Path) -> anyhow::Result<DeviceReport> {
    let runtime = TokioRuntime::current();
    let mut options = FileOptions::new(path.to_path_buf());
    options.read_only = true;
    let device: DeviceRef = Arc::new(
        FileDevice::open(options, runtime)
            .with_context(|| format!("opening {}", path.display()))?,
    );
    check_device(path, device).await
}

/// Checks `device`, read-only, reported under `path` (what [`check`] does once the file is
/// open; the simulator's explorer checks its disk images with it).
pub async fn check_device(path: &Path, device: DeviceRef) -> anyhow::Result<DeviceReport> {
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
        not_strata: false,
        note: None,
        needs_repair: false,
        label: None,
    };
    // A disk under a layer starts with its hierarchy label; the layer's metadata follows it.
    let copies = crate::hierarchy::read_label_copies(device.as_ref()).await?;
    let label = copies.label;
    if label.is_some() && !copies.intact {
        report.warnings.push(
            "one copy of the hierarchy label is damaged or behind the other; the next \
             `strata serve` rewrites both"
                .into(),
        );
    }
    let offset = if let Some(label) = &label {
        report.hierarchy = Some(format!(
            "{} generation {} member {}",
            label.uuid, label.generation, label.member
        ));
        crate::hierarchy::LABEL_BYTES
    } else {
        0
    };
    report.label = label.clone();
    let parent = label.as_ref().and_then(parent_layer);
    // A disk whose layer keeps no metadata on it holds data only after its label (a slice,
    // a crypt, a stripe over it; a thin pool above those): data that looks like metadata
    // there (a pool's superblock over a slice at offset 0) is not this disk's to check.
    if let (Some(label), Some((layer, kind, children))) = (&label, &parent) {
        if !holds_metadata(kind, children, &label.member) {
            report.note = Some(no_metadata_note(layer, kind, children));
            return Ok(report);
        }
    }
    let recovered = match strata_meta::recover(device.as_ref(), offset).await {
        Ok(recovered) => recovered,
        Err(strata_meta::RecoveryError::NoSuperblock { a, b })
            if a.starts_with("unknown magic") && b.starts_with("unknown magic") =>
        {
            match &label {
                None => report.not_strata = true,
                Some(_) => report.errors.push(format!(
                    "no metadata superblock after the hierarchy label (copy A: {a}; copy B: {b})"
                )),
            }
            return Ok(report);
        }
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
        owner if owner == strata_thin::KIND.kind => report
            .errors
            .extend(strata_thin::check_state(&recovered.state)),
        owner if owner == strata_stage::KIND.kind => report
            .errors
            .extend(strata_stage::check_state(&recovered.state)),
        owner if owner == strata_migrate::KIND.kind => report
            .errors
            .extend(strata_migrate::check_state(&recovered.state)),
        // Not a warning: nothing is wrong, and a warning would read as something to repair.
        other => {
            report.note = Some(format!(
                "structure checked; no invariants known for owner {other:?}"
            ))
        }
    }
    // The findings a repair is for.
    report.needs_repair = !recovered.superblock_faults.is_empty()
        || matches!(recovered.journal_end, JournalEnd::Torn(_));
    Ok(report)
}

pub fn render(report: &DeviceReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{}:", report.path.display());
    if report.not_strata {
        let _ = writeln!(
            out,
            "  not a Strata disk: no hierarchy label and no metadata superblock"
        );
        return out;
    }
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
    if let Some(note) = &report.note {
        let _ = writeln!(out, "  {note}");
    }
    let verdict = match (
        report.errors.is_empty(),
        report.needs_repair,
        report.repaired,
    ) {
        (false, _, _) => "damaged: not repaired (a repair would have to guess)",
        (true, _, true) => "repaired",
        (true, false, _) => "clean",
        (true, true, false) => {
            "consistent; recovery will handle the warnings (or run with --repair)"
        }
    };
    let _ = writeln!(out, "  {verdict}");
    out
}
