//! Strata's layers. Each is one module that speaks [`strata_core::BlockDevice`] above and
//! owns its children below; layers that keep state keep it through `strata_meta`.

pub mod thin;
