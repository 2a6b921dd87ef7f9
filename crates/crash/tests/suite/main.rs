//! strata-crash's integration tests, one module per subject, in one test binary: one
//! link instead of one per file, and one harness that runs every test of the crate in
//! parallel. Run a subject: `cargo test -p strata-crash --test suite -- <module>::`.

mod damage;
mod disk;
mod model;
mod scenario;
