//! strata-raid's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-raid --test suite -- <module>::`.

mod common;
mod config_roundtrip;
mod mirror;
mod mirror_crash;
mod mirror_races;
mod raid5;
mod raid5_assembly;
mod raid5_bench;
mod raid5_crash;
mod raid5_grow;
mod raid5_reclaim;
mod raid5_replace;
mod stale_members;
