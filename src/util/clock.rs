//! The wall clock, read in one place.

pub use prometheus_parking_lot_actors::clock::now_ms;
