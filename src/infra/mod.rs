//! Backends: where parked tasks and results are stored, and who hears of results.

pub mod mailbox;
#[cfg(feature = "webhook")]
pub mod notify;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod queue;
