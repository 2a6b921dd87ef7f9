//! Strata's storage backends: the leaves of every device tree.
//!
//! - [`FileDevice`] stores data in a regular file or on a raw block device. It is what
//!   deployments run on.
//! - [`MemoryDevice`] keeps data in RAM. It is what tests and benchmarks run on: instant to
//!   create, sparse, and with the same semantics (holes, zeroing, block status) as a file.

mod file;
mod memory;

pub use file::{FileDevice, FileOptions};
pub use memory::MemoryDevice;
