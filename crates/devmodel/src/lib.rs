//! Strata's device models: pure discrete-event state machines that are told the time and
//! answer when each request completes ([`model::DeviceModel`]), with no clock and no data.
//! The simulator (strata-sim) runs them in virtual time; the `hdd` layer of strata-stateless
//! runs one in real time in front of a real child. See `docs/simulator.md`.

pub mod hdd;
pub mod model;
pub mod net;
