//! Backends: where parked tasks and results are stored.

pub mod mailbox;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod queue;
