//! Layers that keep no state of their own: address maps (slice, concat, stripe) and filters
//! (crypt, delay, hdd, fault, count). Each is one module that speaks
//! [`strata_core::BlockDevice`] above and owns its children below.

mod combined;
pub mod concat;
pub mod count;
pub mod crypt;
pub mod delay;
pub mod fault;
pub mod hdd;
pub mod slice;
pub mod stripe;
