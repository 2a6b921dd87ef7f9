//! strata-stateless's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-stateless --test suite -- <module>::`.

mod common;
mod concat;
mod config_roundtrip;
mod count;
mod crypt;
mod delay;
mod fault;
mod hdd;
mod locks;
mod stripe;
