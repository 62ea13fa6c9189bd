//! Backends: where parked tasks and results are stored.

pub mod mailbox;
pub mod queue;
#[cfg(feature = "postgres")]
pub mod postgres;
