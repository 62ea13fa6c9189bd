//! The queue on PGMQ that many nodes share (cargo feature `pgmq`): [`queue`] writes its
//! statements, `driver` holds its settings' rules and how a node joins it.

pub(crate) mod driver;
#[cfg(feature = "pgmq")]
pub mod queue;

#[cfg(feature = "pgmq")]
pub use queue::{check_queue_name, PgmqLayout, PgmqQueue, MAX_QUEUE_NAME};
