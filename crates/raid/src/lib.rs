//! Redundant layers: mirror and RAID-5. Each keeps its membership and progress through
//! `strata_meta`, and recovers from any member that the rules of its `policy`/`assembly`
//! module allow.

pub mod mirror;
pub mod raid5;
pub mod refusal;
