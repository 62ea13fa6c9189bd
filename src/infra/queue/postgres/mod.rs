//! The queue in a PostgreSQL table that many nodes share (cargo feature `postgres`):
//! [`queue`] writes its statements, `driver` holds its settings' rules and how a node
//! joins it.

pub(crate) mod driver;
#[cfg(feature = "postgres")]
pub mod queue;

#[cfg(feature = "postgres")]
pub use queue::{PostgresQueue, TableLayout};
