//! strata-nbd's integration tests, one module per subject, in one test binary. Run a subject:
//! `cargo test -p strata-nbd --test suite -- <module>::`.

mod client;
mod fake_server;
mod fuzz;
mod session;
mod tls;
