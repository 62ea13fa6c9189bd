//! Scheduling: the pure parking-lot [`core`] that decides what starts, parks, expires or is
//! rejected, and the [`actor`] that feeds it events and carries out its decisions.

pub mod actor;
pub mod core;
