//! A brick's Prometheus metrics (`strata brick serve --metrics`), labelled `brick`:
//! - its calls, counted and timed as the server answers them (`strata_brick_rpcs_total`,
//!   `strata_brick_rpc_errors_total`, `strata_brick_rpc_latency_seconds`, …);
//! - what its store holds, read at scrape time (units, versions, intervals in doubt, metadata
//!   commits, refusals, and the progress of a roll-back or deletion).
//!
//! The store's figures are not copied into counters as they change: the collector asks the
//! store ([`BrickStore::summary`]) when Prometheus asks, so they cannot drift from it.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Series;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use strata_core::latency_histogram;
use strata_core::metric_family::{family, Family, Kind, Labels};

use crate::store::{BrickStore, BrickSummary};

/// The calls of the brick service, as metrics name them. A decision is counted as the commit
/// or the abort it carries; `Decide` only when it carries neither (a bad request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcKind {
    Prepare,
    Commit,
    Abort,
    Decide,
    Status,
    InDoubt,
    Forget,
    FenceClient,
    WriteDirect,
    Read,
    Versions,
    SealVersion,
    DeleteVersion,
    Rollback,
    ReadVersion,
    Describe,
}

impl RpcKind {
    pub fn name(self) -> &'static str {
        match self {
            RpcKind::Prepare => "prepare",
            RpcKind::Commit => "commit",
            RpcKind::Abort => "abort",
            RpcKind::Decide => "decide",
            RpcKind::Status => "status",
            RpcKind::InDoubt => "in_doubt",
            RpcKind::Forget => "forget",
            RpcKind::FenceClient => "fence_client",
            RpcKind::WriteDirect => "write_direct",
            RpcKind::Read => "read",
            RpcKind::Versions => "versions",
            RpcKind::SealVersion => "seal_version",
            RpcKind::DeleteVersion => "delete_version",
            RpcKind::Rollback => "rollback",
            RpcKind::ReadVersion => "read_version",
            RpcKind::Describe => "describe",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    brick: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    brick: String,
    kind: String,
    /// The gRPC code the call was answered with, in snake case (`invalid_argument`, …).
    code: String,
}

/// The counters and histograms of one brick's calls. Cheap to make: a service made without
/// metrics (tests, examples) gets one registered nowhere.
#[derive(Clone, Debug)]
pub struct BrickMetrics {
    brick: String,
    rpcs: Series<KindLabels, Counter>,
    errors: Series<ErrorLabels, Counter>,
    latency: Series<KindLabels, Histogram>,
    bytes: Series<KindLabels, Counter>,
    decisions_refused: Series<KindLabels, Counter>,
    carried: Series<KindLabels, Counter>,
}

impl BrickMetrics {
    pub fn new(brick: &str) -> BrickMetrics {
        BrickMetrics {
            brick: brick.to_string(),
            rpcs: Series::default(),
            errors: Series::default(),
            latency: Series::new_with_constructor(latency_histogram),
            bytes: Series::default(),
            decisions_refused: Series::default(),
            carried: Series::default(),
        }
    }

    /// Registers the call families, and a collector of what `store` holds, under the
    /// `strata_brick` prefix.
    pub fn register(&self, registry: &mut Registry, store: Arc<BrickStore>) {
        let sub = registry.sub_registry_with_prefix("strata_brick");
        sub.register("rpcs", "Calls answered, by kind", self.rpcs.clone());
        sub.register(
            "rpc_errors",
            "Calls answered with an error, by kind and gRPC code",
            self.errors.clone(),
        );
        sub.register(
            "rpc_latency_seconds",
            "Time from a call's arrival to its answer",
            self.latency.clone(),
        );
        sub.register(
            "rpc_bytes",
            "Data bytes of prepares voted yes, and of reads and version reads answered",
            self.bytes.clone(),
        );
        sub.register(
            "decisions_refused",
            "Commits and aborts the brick's rules refused (accepted = false)",
            self.decisions_refused.clone(),
        );
        sub.register(
            "carried_commits",
            "Commits that came carried by a prepare, and were applied (accepted)",
            self.carried.clone(),
        );
        registry.register_collector(Box::new(StoreCollector {
            brick: self.brick.clone(),
            store,
        }));
    }

    fn labels(&self, kind: RpcKind) -> KindLabels {
        KindLabels {
            brick: self.brick.clone(),
            kind: kind.name().to_string(),
        }
    }

    /// A call answered after `latency`, with `error` when it failed.
    pub(crate) fn answered(&self, kind: RpcKind, latency: Duration, error: Option<tonic::Code>) {
        let labels = self.labels(kind);
        self.rpcs.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&labels)
            .observe(latency.as_secs_f64());
        if let Some(code) = error {
            let labels = ErrorLabels {
                brick: labels.brick,
                kind: labels.kind,
                code: code_name(code),
            };
            self.errors.get_or_create(&labels).inc();
        }
    }

    /// `bytes` of data a call took in or gave out.
    pub(crate) fn moved(&self, kind: RpcKind, bytes: u64) {
        self.bytes.get_or_create(&self.labels(kind)).inc_by(bytes);
    }

    /// `count` commits a prepare carried were applied.
    pub(crate) fn carried(&self, count: u64) {
        (self.carried.get_or_create(&self.labels(RpcKind::Commit))).inc_by(count);
    }

    pub(crate) fn decision_refused(&self, kind: RpcKind) {
        self.decisions_refused
            .get_or_create(&self.labels(kind))
            .inc();
    }
}

/// `InvalidArgument` → `invalid_argument`.
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for c in format!("{code:?}").chars() {
        if c.is_ascii_uppercase() && !name.is_empty() {
            name.push('_');
        }
        name.push(c.to_ascii_lowercase());
    }
    name
}

/// What the store holds, read at each scrape.
struct StoreCollector {
    brick: String,
    store: Arc<BrickStore>,
}

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCollector")
            .field("brick", &self.brick)
            .finish()
    }
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let summary = self.store.summary();
        let meta = self.store.metadata_counters();
        let brick = || vec![("brick", self.brick.clone())];
        let one = |value: f64| vec![(brick(), value)];
        let refusals = (self.store.prepare_refusals().into_iter())
            .map(|(class, n)| {
                let mut labels = brick();
                labels.push(("reason", class.name().to_string()));
                (labels, n as f64)
            })
            .collect();
        let held = (summary.versions.iter())
            .map(|v| {
                let mut labels = brick();
                labels.push(("version", v.number.to_string()));
                (labels, v.held_bytes as f64)
            })
            .collect();
        let units = summary.units;
        use Kind::{Counter, Gauge};
        #[rustfmt::skip]
        let families: [Family; 21] = [
            ("strata_brick_format", "The brick format on the device", Gauge, one(f64::from(summary.format))),
            ("strata_brick_disk_failed", "1 once the brick's disk failed: the brick answers nothing until restarted or replaced", Gauge, one(f64::from(u8::from(self.store.disk_failure().is_some())))),
            ("strata_brick_share_bytes", "The share of the volume the brick holds (its home region)", Gauge, one(summary.share_bytes as f64)),
            ("strata_brick_units", "4 KiB units of the data region (home and staging)", Gauge, one(units.total as f64)),
            ("strata_brick_units_free", "Units free for prepares", Gauge, one(units.free as f64)),
            ("strata_brick_units_used", "Units not free: current data, staged data, old data versions keep", Gauge, one(units.used() as f64)),
            ("strata_brick_units_kept", "Units of old data kept by versions", Gauge, one(units.kept as f64)),
            ("strata_brick_units_staged", "Units of prepared, undecided intervals", Gauge, one(units.staged as f64)),
            ("strata_brick_units_away", "Units of the share whose data lives away from home", Gauge, one(units.away as f64)),
            ("strata_brick_intervals_in_doubt", "Intervals prepared here and not decided", Gauge, one(summary.in_doubt as f64)),
            ("strata_brick_versions", "Versions kept", Gauge, one(summary.versions.len() as f64)),
            ("strata_brick_version_held_bytes", "Old data each version alone keeps", Gauge, held),
            ("strata_brick_version_newest", "The newest version number ever created here", Gauge, one(summary.newest_version as f64)),
            ("strata_brick_version_sealed", "The newest version sealed here", Gauge, one(summary.sealed_version as f64)),
            ("strata_brick_meta_transactions", "Metadata transactions applied", Counter, one(meta.txns as f64)),
            ("strata_brick_meta_commits", "Metadata commits made durable (each shared by the transactions of its group)", Counter, one(meta.commits as f64)),
            ("strata_brick_meta_commit_seconds", "Time spent in metadata commits", Counter, one(meta.commit_seconds_total)),
            ("strata_brick_meta_journal_blocks", "4 KiB blocks of metadata journal batches written (each batch counted once, however many copies)", Counter, one(meta.journal_blocks as f64)),
            ("strata_brick_meta_checkpoints", "Checkpoints of the whole metadata state, written when the journal fills", Counter, one(meta.checkpoints as f64)),
            ("strata_brick_meta_checkpoint_bytes", "Bytes of metadata checkpoints written", Counter, one(meta.checkpoint_bytes as f64)),
            ("strata_brick_prepare_refusals", "Prepares voted no, by class of reason", Counter, refusals),
        ];
        let steps = step_families(&self.brick, &summary);
        for (name, help, kind, values) in families.into_iter().chain(steps) {
            family(&mut encoder, name, help, kind, &values)?;
        }
        Ok(())
    }
}

/// The latest roll-back or deletion's progress, labelled with its kind and version: no series
/// until one has run since the brick was opened.
fn step_families(brick: &str, summary: &BrickSummary) -> [Family; 3] {
    let series = |value: &dyn Fn(&crate::StepProgress) -> u64| -> Vec<(Labels, f64)> {
        (summary.step.iter())
            .map(|step| {
                let labels = vec![
                    ("brick", brick.to_string()),
                    ("step", step.kind.name().to_string()),
                    ("version", step.version.to_string()),
                ];
                (labels, value(step) as f64)
            })
            .collect()
    };
    [
        (
            "strata_brick_step_entries_done",
            "Entries of versions' tables the roll-back or deletion has moved",
            Kind::Gauge,
            series(&|s| s.done_entries),
        ),
        (
            "strata_brick_step_entries",
            "Entries the roll-back or deletion moves in all",
            Kind::Gauge,
            series(&|s| s.total_entries),
        ),
        (
            "strata_brick_step_running",
            "1 while the roll-back or deletion runs, 0 once it has ended",
            Kind::Gauge,
            series(&|s| u64::from(s.running)),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_become_snake_case_labels() {
        assert_eq!(code_name(tonic::Code::InvalidArgument), "invalid_argument");
        assert_eq!(code_name(tonic::Code::OutOfRange), "out_of_range");
        assert_eq!(code_name(tonic::Code::Internal), "internal");
    }
}
