//! Strata's stack: the registry of every layer kind, and (as it moves out of the binary) the
//! hierarchy built from them.

pub mod registry;
