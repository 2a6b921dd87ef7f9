//! The registry: every layer kind the configuration can name. Adding a layer is one module in
//! its family's crate and one line in [`KINDS`].

pub use strata_core::layer::*;

/// Every layer kind, in the order `strata` lists them.
pub static KINDS: &[&LayerKind] = &[
    &strata_stateless::slice::KIND,
    &strata_stateless::concat::KIND,
    &strata_stateless::count::KIND,
    &strata_stateless::crypt::KIND,
    &strata_stateless::delay::KIND,
    &strata_stateless::hdd::KIND,
    &strata_stateless::fault::KIND,
    &strata_stateless::stripe::KIND,
    &strata_raid::mirror::KIND,
    &strata_raid::raid5::KIND,
    &strata_thin::KIND,
    &strata_stage::KIND,
    &strata_migrate::KIND,
];

pub fn find(kind: &str) -> Option<&'static LayerKind> {
    KINDS.iter().copied().find(|k| k.kind == kind)
}

/// The names of the kinds, for error messages ("known: …").
pub fn kind_names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.kind).collect()
}
