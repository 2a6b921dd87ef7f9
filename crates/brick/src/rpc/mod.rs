//! The transaction channel beside NBD: the brick service (gRPC) and its client.

mod client;
mod server;
mod wire;

/// The code `tonic` generates from `proto/brick.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("strata.brick.v1");
}

pub use client::{BrickClient, RpcError};
pub use server::{serve, serve_service, serve_with_faults, BrickService, ServerFaults};

/// The largest message either side accepts: an interval's writes to one brick travel in one
/// prepare, so this bounds the bytes an interval may write to one brick.
pub const MAX_MESSAGE: usize = 64 << 20;
