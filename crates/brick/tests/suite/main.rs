//! strata-brick: the brick's store against a model, and under the crash harness.

mod behaviour;
mod common;
mod connections;
mod crash;
// The coordination crate's etcd harness; this suite uses only part of it.
#[allow(dead_code)]
#[path = "../../../coord/tests/suite/etcd.rs"]
mod etcd;
mod observe;
mod replace;
mod rpc;
mod shared;
mod stack_locks;
mod store_versions;
mod versions;
