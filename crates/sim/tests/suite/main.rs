//! strata-sim's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-sim --test suite -- <module>::`.

mod alv;
mod clotho;
mod experiment;
mod hdd;
mod intervals;
mod models;
mod proximal;
mod results;
mod runtime;
mod workload;
