//! strata-thin's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-thin --test suite -- <module>::`.

mod common;
mod compaction;
mod fuzz_records;
mod never_format;
mod thin_crash;
mod thin_faults;
mod thin_lifecycle;
mod thin_model;
mod thin_space;
mod versions_model;
mod versions_policy;
