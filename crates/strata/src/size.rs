//! Byte sizes: defined in strata-core so that layers parse their options the same way.

pub use strata_core::ByteSize;
