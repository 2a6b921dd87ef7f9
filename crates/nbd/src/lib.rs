//! An NBD server written from the protocol specification (NetworkBlockDevice/nbd,
//! doc/proto.md): fixed-newstyle handshake, structured replies, the `base:allocation`
//! metadata context, many requests in flight per connection with out-of-order replies.
//!
//! It also holds an NBD client (`client`), which makes a remote export a Strata device.
//!
//! We write our own because the existing Rust NBD crates serve one request at a time or
//! lack structured replies and block status.

pub mod client;
mod export;
mod handshake;
pub mod proto;
mod server;
pub mod tls;
mod transmission;
mod transport;

use std::time::Duration;

pub use export::{Export, Exports};
pub use handshake::{
    greet, haggle, negotiate, transmission_flags, HandshakeError, Negotiated, Outcome, TlsContext,
};
pub use server::{Listener, Server};
pub use transmission::{serve, SessionEnd};
pub use transport::{Halves, Transport};

/// Bounds on what one client may make the server hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest READ or WRITE payload accepted (advertised as the maximum block size).
    pub max_payload: u32,
    /// Requests one connection may have in flight.
    pub max_in_flight: u32,
    /// Payload bytes one connection may have buffered (requests and unsent replies).
    pub max_buffered_bytes: u64,
    /// Options one handshake may send before it must choose an export.
    pub max_options: u32,
    pub handshake_timeout: Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // The spec's portable maximum (2^25).
            max_payload: 32 << 20,
            max_in_flight: 256,
            max_buffered_bytes: 64 << 20,
            max_options: 256,
            handshake_timeout: Duration::from_secs(30),
            max_connections: 1024,
        }
    }
}
