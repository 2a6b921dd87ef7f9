//! The transaction channel beside NBD: the brick service (gRPC) and its client.

pub(crate) mod by_reference;
mod client;
mod codec;
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

/// HTTP/2 flow control and framing for both ends. hyper's defaults (a 1 MiB window per server
/// connection, 16 KiB frames) cut each 1 MiB prepare into 64 frames, and let one connection
/// carry at most 1 MiB at a time however many intervals are in flight on it.
pub(crate) const STREAM_WINDOW: u32 = 16 << 20;
pub(crate) const CONNECTION_WINDOW: u32 = 64 << 20;
pub(crate) const MAX_FRAME: u32 = 1 << 20;
