//! strata-stage's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-stage --test suite -- <module>::`.

mod common;
mod stage_behaviour;
mod stage_crash;
mod stage_model;
mod stage_start;
