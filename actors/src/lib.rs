//! The engine of `prometheus_parking_lot`.
//!
//! This crate holds everything the public crate builds on:
//!
//! - [`domain`]: the vocabulary shared by every layer (task ids, priorities, costs, mailbox
//!   keys, metadata, statuses, limits and errors);
//! - [`scheduler::core`]: the pure parking-lot state machine. It is fed events together with
//!   the current time and answers with decisions; it owns no threads, clocks, channels or I/O;
//! - [`clock`]: the one place that reads the wall clock.
//!
//! Users normally depend on `prometheus_parking_lot`, which re-exports these names at the
//! paths existing code imports.

pub mod clock;
pub mod domain;
pub mod scheduler;
