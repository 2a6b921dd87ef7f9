//! strata-brick: the brick's store against a model, and under the crash harness.

mod behaviour;
mod common;
mod crash;
mod rpc;
