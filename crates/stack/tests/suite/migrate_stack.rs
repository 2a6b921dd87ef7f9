//! A `migrate` layer built from a configuration, as `strata serve` builds it: a local disk,
//! a remote one behind a `delay` and a third one. It formats on blank disks, serves, describes its
//! config, reopens with its data; `strata check` runs its invariants on child 0 and says
//! the other child holds no metadata; a configuration it cannot take is refused by field.

use bytes::Bytes;
use strata_core::{MetricsRegistry, TokioRuntime, WriteFlags};
use strata_stack::build::{self, StartOptions};
use strata_stack::config;

const CONFIG: &str = r#"
[[disk]]
name = "local"
path = "local.img"
size = "8MiB"
[[disk]]
name = "brick"
path = "brick.img"
size = "8MiB"
[[disk]]
name = "near"
path = "near.img"
size = "4MiB"

[[layer]]
name = "remote"
kind = "delay"
children = ["brick"]
read-latency = "50us"
write-latency = "50us"

[[layer]]
name = "mig"
kind = "migrate"
children = ["local", "remote", "near"]
chunk = "64KiB"
delta = "0"
candidate-probability = 1.0

[[export]]
name = "vol"
device = "mig"
"#;

async fn build(dir: &std::path::Path) -> build::Stack {
    let loaded = config::load(CONFIG, "migrate.toml", dir, Some(dir)).unwrap();
    build::build(
        &loaded,
        &StartOptions::default(),
        TokioRuntime::current(),
        &MetricsRegistry::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_migrate_layer_serves_from_a_config_reopens_and_passes_strata_check() {
    let dir = tempfile::tempdir().unwrap();
    let stack = build(dir.path()).await;
    assert!(stack.refused.is_empty(), "{:?}", stack.refused);
    let vol = stack.exports.lookup("vol").unwrap().device.clone();
    let data = Bytes::from(
        (0..(512u32 << 10))
            .map(|i| (i / 4096) as u8)
            .collect::<Vec<_>>(),
    );
    vol.write(0, data.clone(), WriteFlags::default())
        .await
        .unwrap();
    // Reads time every child, and with δ = 0 may move data toward the fastest (real time:
    // how much moves is not deterministic, so only the data is checked).
    for _ in 0..4 {
        assert_eq!(vol.read(0, data.len()).await.unwrap().freeze(), data);
    }
    vol.flush().await.unwrap();
    let node = stack.nodes.iter().find(|n| n.name == "mig").unwrap();
    let status = node.describe().await.unwrap();
    assert_eq!(status.kind, "migrate");
    let described = status.config.expect("a migrate layer describes its config");
    assert_eq!(described.get("delta").and_then(|v| v.as_str()), Some("0"));
    assert!(described.contains_key("metadata-size"), "{described:?}");
    assert!(
        status.detail.iter().any(|(k, _)| k == "child 1 response"),
        "{:?}",
        status.detail
    );
    for node in &stack.nodes {
        node.stop_background().await.unwrap();
    }
    drop(vol);
    drop(stack);

    let again = build(dir.path()).await;
    assert!(again.refused.is_empty(), "{:?}", again.refused);
    let vol = again.exports.lookup("vol").unwrap().device.clone();
    assert_eq!(vol.read(0, data.len()).await.unwrap().freeze(), data);
    for node in &again.nodes {
        node.stop_background().await.unwrap();
    }
    drop(vol);
    drop(again);

    let local = strata_stack::check::check(&dir.path().join("local.img"))
        .await
        .unwrap();
    assert_eq!(local.owner.as_deref(), Some("migrate"));
    assert!(local.errors.is_empty(), "{:?}", local.errors);
    let near = strata_stack::check::check(&dir.path().join("near.img"))
        .await
        .unwrap();
    assert!(near.errors.is_empty(), "{:?}", near.errors);
    let note = near.note.unwrap_or_default();
    assert!(
        note.contains("(migrate) keeps its metadata on its first child"),
        "{note}"
    );
}

fn refusal(text: &str, dir: &std::path::Path) -> String {
    match config::load(text, "migrate.toml", dir, None) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn a_migrate_option_it_does_not_know_or_cannot_take_is_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = CONFIG.replace("delta = \"0\"", "delta = \"0\"\ntokenz = 4");
    assert!(refusal(&unknown, dir.path()).contains("tokenz"));
    let bad = CONFIG.replace("delta = \"0\"", "delta = \"soon\"");
    assert!(refusal(&bad, dir.path()).contains("`delta`"));
    let bad = CONFIG.replace("delta = \"0\"", "policy = \"greedy\"");
    assert!(refusal(&bad, dir.path()).contains("greedy"));
    let bad = CONFIG.replace("chunk = \"64KiB\"", "chunk = \"1MiB\"");
    assert!(refusal(&bad, dir.path()).contains("`chunk`"));
    let one = CONFIG.replace(
        "children = [\"local\", \"remote\", \"near\"]",
        "children = [\"local\"]",
    );
    let error = refusal(&one, dir.path());
    assert!(error.contains("at least 2 children"), "{error}");
}
