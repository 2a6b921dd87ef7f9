//! strata-meta's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-meta --test suite -- <module>::`.

mod crash;
mod faults;
mod media_damage;
mod replica;
mod store;
