//! Shared volumes across hosts, after Orchestra and RIBD (`../shared/papers/orchestra-ribd.md`):
//! many clients share a volume whose bricks are on many servers.
//!
//! Built so far, as pure state machines driven by the caller's clock and messages, so the
//! server, the simulator and the tests run the same code:
//! - [`locks`]: a server's block-range lock table with client leases and fencing (RIBD's SXM
//!   and SLM, §2.7);
//! - [`interval`]: consistency intervals' two-phase commit across bricks, and how a brick
//!   resolves an interval left in doubt (§2.5);
//! - [`client`]: a client's open intervals, one stream per thread: buffered writes read back
//!   inside the interval, unlocks deferred to the commit;
//! - [`rain`]: RAIN-10's placement and replica policy: writes to the bricks that are up,
//!   dirty regions for those away, only those copied back, reads from current copies.

pub mod client;
pub mod interval;
pub mod locks;
pub mod rain;
