//! The queue in a PostgreSQL table that many nodes share (cargo feature `postgres`):
//! [`table`] opens it and writes its statements, `driver` holds its settings' rules and
//! how a node joins it.

#[cfg(feature = "postgres")]
pub(crate) mod bounded;
#[cfg(feature = "postgres")]
pub(crate) mod dependencies;
pub(crate) mod driver;
#[cfg(all(test, feature = "postgres"))]
mod plans;
#[cfg(feature = "postgres")]
pub mod table;

#[cfg(feature = "postgres")]
pub use table::{PostgresQueue, TableLayout};
