//! The wall clock, read in one place.

pub use prometheus_parking_lot_actors::util::clock::now_ms;
