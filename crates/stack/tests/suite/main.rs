//! strata-stack's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-stack --test suite -- <module>::`.

mod check_disks;
mod degraded_start;
mod documented_layers;
mod media_damage;
mod migrate_stack;
mod relabel;
mod round_trip;
mod stage_stack;

/// `text` loaded (from `dir`) and built on `disks` with the default start options.
async fn start_given(
    text: &str,
    dir: &std::path::Path,
    disks: std::collections::BTreeMap<String, strata_core::DeviceRef>,
) -> (strata_stack::config::Loaded, strata_stack::build::Stack) {
    let loaded = strata_stack::config::load(text, "test.toml", dir, Some(dir)).unwrap();
    let stack = strata_stack::build::build_on(
        &loaded,
        &strata_stack::build::Disks::Given(disks),
        &strata_stack::build::StartOptions::default(),
        strata_core::TokioRuntime::current(),
        &strata_core::MetricsRegistry::default(),
    )
    .await
    .unwrap();
    (loaded, stack)
}
