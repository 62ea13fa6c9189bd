//! Scheduling: the pure parking-lot [`core`] that decides what starts, parks, expires or is
//! rejected.

pub mod core;
