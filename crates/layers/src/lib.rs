//! Strata's layers. Each is one module that speaks [`strata_core::BlockDevice`] above and
//! owns its children below; layers that keep state keep it through `strata_meta`. The
//! registry lists every kind the configuration can name.

pub mod blank;
pub mod concat;
pub mod crypt;
pub mod delay;
pub mod fault;
pub mod mirror;
pub mod raid5;
pub mod registry;
pub mod slice;
pub mod stripe;
pub mod thin;
