//! Shared volumes across hosts, after Orchestra and RIBD (`../shared/papers/orchestra-ribd.md`):
//! many clients share a volume whose bricks are on many servers.
//!
//! Built so far: [`locks`], a server's block-range lock manager with client leases and
//! fencing (RIBD's SXM and SLM, §2.7), as a pure state machine driven by the caller's clock, so
//! the server, the simulator and the tests run the same code.

pub mod locks;
