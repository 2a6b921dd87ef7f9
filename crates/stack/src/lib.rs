//! Strata's stack: the registry of every layer kind and the hierarchy built from them — the
//! configuration and its checks, building in graph order, the labels on the disks and
//! assembly from them, and the online changes. `strata serve` and `strata sim` both build
//! through it; the binary keeps only its transports (CLI, NBD listeners, admin socket,
//! metrics endpoint).
//!
//! Modules, one job each, lower ones never importing higher ones:
//! `registry` (kinds) → `graph` (`[[layer]]` tables and the DAG checks) → `config` (the whole
//! file, with located errors) → `hierarchy` (labels, assembly) → `build` (devices in graph
//! order) → `plan` (plan → apply → roll back) → `reconfig` / `volumes` (online changes, as plans) → `control` (the running stack) →
//! `call` (a layer's own verbs) → `spares` (growth from spare disks). `check` verifies metadata offline.

pub mod build;
pub mod call;
pub mod check;
pub mod config;
pub mod control;
pub mod graph;
pub mod hierarchy;
pub mod plan;
pub mod reconfig;
pub mod registry;
pub mod spares;
pub mod volumes;
