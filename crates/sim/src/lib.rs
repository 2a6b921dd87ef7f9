//! Strata's deterministic simulator: Strata's own layer code runs in virtual time over modelled
//! disks, flash and network links, from a seed, so that the papers' tables can be reproduced
//! and policies compared on identical input. See `docs/simulator.md`.

pub mod alv;
pub mod birthday;
pub mod clotho;
pub mod disk;
pub mod driver;
pub mod executor;
pub mod experiment;
pub mod explore;
pub mod intervals;
pub mod migration;
pub mod models;
pub mod net;
pub mod proximal;
pub mod results;
pub mod ribd;
pub mod ssd;
pub mod stack;
pub mod validate;
pub mod workload;

pub use strata_devmodel::{hdd, model};
