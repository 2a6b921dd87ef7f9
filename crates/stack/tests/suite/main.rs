//! strata-stack's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-stack --test suite -- <module>::`.

mod degraded_start;
mod documented_layers;
mod media_damage;
mod migrate_stack;
mod relabel;
mod round_trip;
mod stage_stack;
