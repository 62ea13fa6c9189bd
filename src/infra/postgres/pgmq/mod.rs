//! The queue on PGMQ that many nodes share (cargo feature `pgmq`): [`queue`] opens it,
//! `layout.rs` names where its tasks live, `statements.rs` writes its statements from the
//! pieces in `parts.rs`, `dependencies.rs` what lets a task wait for others, `bounded.rs` the
//! park that keeps `max_queued_units`, `install` puts PGMQ's API on a server that lacks the
//! extension, `driver` holds its settings' rules and how a node joins it, and `parked` reads
//! its parked tasks for the fleet view.

#[cfg(feature = "pgmq")]
mod bounded;
#[cfg(feature = "pgmq")]
mod dependencies;
pub(crate) mod driver;
#[cfg(feature = "pgmq")]
mod install;
#[cfg(feature = "pgmq")]
mod layout;
#[cfg(feature = "pgmq")]
pub(crate) mod parked;
#[cfg(feature = "pgmq")]
mod parts;
#[cfg(feature = "pgmq")]
pub mod queue;
#[cfg(feature = "pgmq")]
mod statements;

#[cfg(feature = "pgmq")]
pub use install::PgmqSource;
#[cfg(feature = "pgmq")]
pub use queue::{check_queue_name, PgmqLayout, PgmqQueue, MAX_QUEUE_NAME};
