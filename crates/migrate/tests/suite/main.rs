//! strata-migrate's integration tests, one module per subject, in one test binary. Run a
//! subject: `cargo test -p strata-migrate --test suite -- <module>::`.

mod common;
mod migrate_behaviour;
mod migrate_crash;
mod migrate_model;
mod migrate_start;
