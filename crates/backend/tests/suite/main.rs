//! strata-backend's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-backend --test suite -- <module>::`.

mod blank;
mod common;
mod file_device;
mod model;
