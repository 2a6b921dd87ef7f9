//! strata-coord against real etcd servers (Debian's etcd-server), started per test.

mod catalog;
mod claims;
mod etcd;
mod quorum;
mod session;
mod stale;
mod versions;
mod wants;
