//! A brick made observable: its metrics move with the calls it answers and with what its store
//! holds, its prepares' refusals are counted by class, `Describe` says what `summary` says,
//! and a roll-back's or deletion's progress goes from nothing to all its entries.

use std::cell::Cell;
use std::sync::Arc;

use bytes::Bytes;
use prometheus_client::registry::Registry;
use strata_brick::metrics::BrickMetrics;
use strata_brick::rpc::{serve_service, BrickClient, BrickService};
use strata_brick::{BrickSettings, BrickStore, PrepareRefusal, StepKind, Vote};
use strata_cluster::interval::{Decision, IntervalId};
use strata_core::DeviceRef;
use strata_crash::CrashGroup;

use crate::common::*;

const UNIT: usize = 4096;
/// The staging region of `common::fresh`'s brick: what is left of the disk after alignment.
const STAGING: u64 = 768 << 10;

/// A registry holding `store`'s metrics, labelled brick "b0".
fn registry(store: &Arc<BrickStore>) -> (Registry, BrickMetrics) {
    let metrics = BrickMetrics::new("b0");
    let mut registry = Registry::default();
    metrics.register(&mut registry, store.clone());
    (registry, metrics)
}

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// The value of the series `name{labels}` (labels as the text shows them, after `brick`), or
/// `None` when the scrape has no such series.
fn value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let labels = if labels.is_empty() {
        "brick=\"b0\"".to_string()
    } else {
        format!("brick=\"b0\",{labels}")
    };
    let series = format!("{name}{{{labels}}} ");
    let line = text.lines().find(|line| line.starts_with(&series))?;
    line[series.len()..].split(' ').next()?.parse().ok()
}

fn must(text: &str, name: &str, labels: &str) -> f64 {
    value(text, name, labels).unwrap_or_else(|| panic!("no {name}{{{labels}}} in\n{text}"))
}

/// Each series `(name, labels, value)` is in the scrape with that value.
fn expect(text: &str, series: &[(&str, &str, u64)]) {
    for &(name, labels, expected) in series {
        assert_eq!(
            must(text, name, labels),
            expected as f64,
            "{name}{{{labels}}}"
        );
    }
}

async fn prepare(client: &BrickClient, id: IntervalId, writes: Vec<(u64, Bytes)>) -> Vote {
    client.prepare(id, vec![0], writes, &[]).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_brick_counts_its_calls_and_reports_its_store() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let store = Arc::new(store);
    let (registry, metrics) = registry(&store);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let service = BrickService::with_metrics(store.clone(), metrics);
    tokio::spawn(serve_service(service, listener, std::future::pending()));
    let client = BrickClient::new(&address, std::time::Duration::from_secs(2)).unwrap();

    let before = scrape(&registry);
    let units = (HOME + STAGING) / UNIT as u64;
    let staging = STAGING / UNIT as u64;
    let commits_before = must(&before, "strata_brick_meta_commits_total", "");
    assert_eq!(
        value(&before, "strata_brick_rpcs_total", "kind=\"prepare\""),
        None
    );
    expect(
        &before,
        &[
            ("strata_brick_intervals_in_doubt", "", 0),
            ("strata_brick_units", "", units),
            ("strata_brick_units_free", "", staging),
        ],
    );

    // A prepare voted yes: counted, timed, its bytes and its staged units shown, in doubt.
    let a = id(1, 1);
    let vote = prepare(&client, a, vec![(0, data(a, 0, 2 * UNIT))]).await;
    assert_eq!(vote, Vote::Yes);
    expect(
        &scrape(&registry),
        &[
            ("strata_brick_rpcs_total", "kind=\"prepare\"", 1),
            ("strata_brick_rpc_bytes_total", "kind=\"prepare\"", 8192),
            (
                "strata_brick_rpc_latency_seconds_count",
                "kind=\"prepare\"",
                1,
            ),
            ("strata_brick_intervals_in_doubt", "", 1),
            ("strata_brick_units_staged", "", 2),
            ("strata_brick_units_used", "", units - (staging - 2)),
        ],
    );

    // Another client's prepare over the same bytes is refused, counted by class, and moves
    // no bytes.
    let b = id(2, 1);
    let vote = prepare(&client, b, vec![(UNIT as u64, data(b, 0, UNIT))]).await;
    assert!(matches!(vote, Vote::No(_)), "{vote:?}");
    expect(
        &scrape(&registry),
        &[
            ("strata_brick_rpcs_total", "kind=\"prepare\"", 2),
            ("strata_brick_rpc_bytes_total", "kind=\"prepare\"", 8192),
            (
                "strata_brick_prepare_refusals_total",
                "reason=\"overlap\"",
                1,
            ),
            (
                "strata_brick_prepare_refusals_total",
                "reason=\"no_space\"",
                0,
            ),
        ],
    );

    // The commit: timed as a commit, nothing in doubt, the units mapped away from home.
    assert!(client.decide(a, Decision::Commit).await.unwrap());
    // A commit of an interval never prepared here: the rules refuse it.
    assert!(!client.decide(id(9, 9), Decision::Commit).await.unwrap());
    let text = scrape(&registry);
    expect(
        &text,
        &[
            ("strata_brick_rpcs_total", "kind=\"commit\"", 2),
            (
                "strata_brick_rpc_latency_seconds_count",
                "kind=\"commit\"",
                2,
            ),
            ("strata_brick_decisions_refused_total", "kind=\"commit\"", 1),
            ("strata_brick_intervals_in_doubt", "", 0),
            ("strata_brick_units_staged", "", 0),
            ("strata_brick_units_away", "", 2),
        ],
    );
    assert!(must(&text, "strata_brick_meta_commits_total", "") > commits_before);

    // Reads: bytes counted; a misaligned one answered with an error, counted by its code.
    assert_eq!(client.read(0, 8192).await.unwrap(), data(a, 0, 8192));
    assert!(client.read(1, 512).await.is_err());
    let text = scrape(&registry);
    expect(
        &text,
        &[
            ("strata_brick_rpcs_total", "kind=\"read\"", 2),
            ("strata_brick_rpc_bytes_total", "kind=\"read\"", 8192),
            (
                "strata_brick_rpc_errors_total",
                "kind=\"read\",code=\"invalid_argument\"",
                1,
            ),
        ],
    );
    let prepare_errors = "kind=\"prepare\",code=\"invalid_argument\"";
    assert_eq!(
        value(&text, "strata_brick_rpc_errors_total", prepare_errors),
        None
    );

    // Describe carries the store's summary whole.
    let described = client.describe().await.unwrap();
    assert_eq!(described, store.summary());
    assert_eq!(described.format, 3);
    assert_eq!(described.share_bytes, HOME);
    assert_eq!(described.units.away, 2);
    assert_eq!(described.step, None);
}

#[tokio::test]
async fn prepares_refused_are_counted_by_class() {
    let group = CrashGroup::new();
    let (_, store) = fresh(&group).await;
    let count = |class: PrepareRefusal| {
        let counts = store.prepare_refusals();
        counts.iter().find(|(c, _)| *c == class).unwrap().1
    };
    let prepare = |id: IntervalId, tag: u64, len: usize| {
        let writes = vec![(0, data(id, 0, len))];
        store.prepare_tagged(id, vec![0], writes, &[], tag)
    };
    // Already decided: late.
    let a = id(1, 1);
    assert!(store.decide(a, Decision::Abort).await.unwrap());
    assert!(matches!(prepare(a, 0, 512).await.unwrap(), Vote::No(_)));
    // A fenced client.
    store.fence_client(2).await.unwrap();
    assert!(matches!(
        prepare(id(2, 1), 0, 512).await.unwrap(),
        Vote::No(_)
    ));
    // Tagged below a sealed version.
    store.seal_version(1).await.unwrap();
    assert!(matches!(
        prepare(id(3, 1), 0, 512).await.unwrap(),
        Vote::No(_)
    ));
    // No space: three undecided prepares of the whole share fill the 768 KiB of staging.
    for seq in 1..=3 {
        assert_eq!(
            prepare(id(4, seq), 1, HOME as usize).await.unwrap(),
            Vote::Yes
        );
    }
    assert!(matches!(
        prepare(id(4, 4), 1, HOME as usize).await.unwrap(),
        Vote::No(_)
    ));
    for (class, expected) in [
        (PrepareRefusal::Late, 1),
        (PrepareRefusal::Fenced, 1),
        (PrepareRefusal::Tag, 1),
        (PrepareRefusal::NoSpace, 1),
        (PrepareRefusal::Overlap, 0),
        (PrepareRefusal::Busy, 0),
    ] {
        assert_eq!(count(class), expected, "{}", class.name());
    }
    assert_eq!(store.summary().in_doubt, 3);
    assert_eq!(store.summary().units.free, 0);
}

/// A brick on a disk that yields before each operation, so that a poller runs between a
/// roll-back's transactions, moving `step_entries` entries each.
async fn yielding_brick(group: &CrashGroup, step_entries: usize) -> Arc<BrickStore> {
    let disk: DeviceRef = Arc::new(group.disk(geometry()));
    let device: DeviceRef = Arc::new(Yielding::new(disk, 1..=2, 7));
    let settings = BrickSettings {
        step_entries,
        ..Default::default()
    };
    let store = BrickStore::format_with(device, &options(), false, &settings)
        .await
        .unwrap();
    Arc::new(store)
}

async fn commit(store: &BrickStore, id: IntervalId, tag: u64, offset: usize, units: usize) {
    let writes = vec![(offset as u64, data(id, 0, units * UNIT))];
    let vote = store.prepare_tagged(id, vec![0], writes, &[], tag).await;
    assert_eq!(vote.unwrap(), Vote::Yes);
    assert!(store.decide(id, Decision::Commit).await.unwrap());
}

/// Runs `step` while scraping the step gauges between its transactions: the `(done, total,
/// running)` seen, in order, and the scrape once it has ended.
async fn watch_step(
    registry: &Registry,
    labels: &str,
    step: impl std::future::Future<Output = ()>,
) -> (Vec<(f64, f64, f64)>, String) {
    let ended = Cell::new(false);
    let step = async {
        step.await;
        ended.set(true);
    };
    let watch = async {
        let mut seen = Vec::new();
        while !ended.get() {
            let text = scrape(registry);
            if let Some(done) = value(&text, "strata_brick_step_entries_done", labels) {
                let total = must(&text, "strata_brick_step_entries", labels);
                let running = must(&text, "strata_brick_step_running", labels);
                seen.push((done, total, running));
            }
            tokio::task::yield_now().await;
        }
        seen
    };
    let ((), seen) = tokio::join!(step, watch);
    (seen, scrape(registry))
}

/// The step's gauges say it ended with all `total` entries done.
fn assert_ended(text: &str, labels: &str, total: u64) {
    let gauges = [
        ("strata_brick_step_entries_done", labels, total),
        ("strata_brick_step_entries", labels, total),
        ("strata_brick_step_running", labels, 0),
    ];
    expect(text, &gauges);
}

#[tokio::test]
async fn a_roll_back_in_steps_shows_its_progress_from_nothing_to_all() {
    let group = CrashGroup::new();
    let store = yielding_brick(&group, 2).await;
    let (registry, _) = registry(&store);
    // Version 1 keeps 6 units (a's), version 2 keeps 4 (b's): 10 entries to put back.
    commit(&store, id(1, 1), 0, 0, 6).await;
    store.seal_version(1).await.unwrap();
    commit(&store, id(1, 2), 1, 0, 6).await;
    store.seal_version(2).await.unwrap();
    commit(&store, id(1, 3), 2, 0, 4).await;
    let kept: u64 = store.summary().versions.iter().map(|v| v.held_bytes).sum();
    assert_eq!(kept, 10 * UNIT as u64);
    let labels = "step=\"rollback\",version=\"1\"";
    assert_eq!(
        value(&scrape(&registry), "strata_brick_step_entries_done", labels),
        None
    );

    let (seen, after) = watch_step(&registry, labels, async {
        store.rollback(1, 2).await.unwrap();
    })
    .await;

    let running: Vec<&(f64, f64, f64)> = seen.iter().filter(|s| s.2 == 1.0).collect();
    assert!(running.iter().all(|s| s.1 == 10.0), "{seen:?}");
    let mut done: Vec<f64> = running.iter().map(|s| s.0).collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    done.dedup();
    // Two entries per transaction, each counted once durable; the last transaction moves
    // none (it ends the step), so all ten are seen done while it still runs.
    assert_eq!(done, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "{seen:?}");
    assert_ended(&after, labels, 10);
    let step = store.summary().step.unwrap();
    assert_eq!(step.kind, StepKind::Rollback);
    assert_eq!((step.done_entries, step.total_entries), (10, 10));
    assert_eq!(store.summary().units.kept, 0);
}

#[tokio::test]
async fn a_deletion_in_steps_counts_every_entry_it_folds_or_frees() {
    let group = CrashGroup::new();
    let store = yielding_brick(&group, 3).await;
    let (registry, _) = registry(&store);
    commit(&store, id(1, 1), 0, 0, 7).await;
    store.seal_version(1).await.unwrap();
    commit(&store, id(1, 2), 1, 0, 7).await;
    assert_eq!(store.summary().units.kept, 7);
    let labels = "step=\"delete\",version=\"1\"";
    let (seen, after) = watch_step(&registry, labels, async {
        assert!(store.delete_version(1).await.unwrap());
    })
    .await;
    let mut done: Vec<f64> = (seen.iter()).filter(|s| s.2 == 1.0).map(|s| s.0).collect();
    done.dedup();
    assert_eq!(done, vec![0.0, 3.0, 6.0], "{seen:?}");
    assert_ended(&after, labels, 7);
    assert_eq!(store.summary().units.kept, 0);
    assert!(store.summary().versions.is_empty());
}
