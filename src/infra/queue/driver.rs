//! What a queue backend's driver is: [`QueueRules`] (the rules of its settings, with errors
//! that name the field, and what it is: shared between nodes, durable) and [`QueueDriver`]
//! (how it opens for a payload type). Each backend's folder holds its driver; the registry
//! (`registry.rs`) maps a pool's `"queue"` section to one.
//!
//! Adding a queue backend: its folder (under `infra/queue/`, or in `infra/postgres/` for one
//! on PostgreSQL: the queue, and a `driver.rs` implementing both traits), its variant of
//! `QueueSettings` and its `mod` line (`infra/queue/mod.rs`), its lines in the registry, and
//! its cargo feature.

use crate::core::{PoolError, QueueOrder, TaskQueue};
#[cfg(feature = "postgres")]
use crate::infra::postgres::PgDatabase;
use crate::infra::queue::memory::InMemoryQueue;
use crate::settings::error::ConfigError;
use prometheus_parking_lot_actors::scheduler::SharedParking;

/// What a queue backend's settings must hold, and what the backend is.
pub(crate) trait QueueRules {
    /// The `"type"` a configuration names the backend by.
    fn type_name(&self) -> &'static str;

    /// The cargo feature that builds the backend (`None`: every build has it).
    fn feature(&self) -> Option<&'static str>;

    /// Checks the settings of the queue at `path` (`pools.<name>.queue`); an error names
    /// the field.
    fn validate(&self, path: &str) -> Result<(), ConfigError>;

    /// The queue in words, for errors: `yaque stream s in ./q`.
    fn describe(&self, pool: &str) -> String;

    /// What names the queue's storage (no two pools may share it); `None` for a queue each
    /// pool owns by construction.
    fn storage_key(&self, pool: &str) -> Option<(&'static str, String, String)>;

    /// Whether many nodes share the queue (they claim tasks from it under leases).
    fn is_shared(&self) -> bool {
        false
    }

    /// Whether a pool ordered by deadline (`"order": "deadline"`) may park in the queue: a
    /// local queue is ranked by the pool's own core; a shared one must claim in that order
    /// itself.
    fn claims_by_deadline(&self) -> bool {
        !self.is_shared()
    }

    /// Whether the queue keeps `max_queued_units` (a local queue: the pool's own core; a
    /// shared one: for every node, in the statement that parks).
    fn bounds_queued_units(&self) -> bool {
        !self.is_shared()
    }

    /// Whether the queue keeps tasks across a restart.
    fn is_durable(&self) -> bool {
        true
    }
}

/// How a queue backend opens for payloads of type `P`.
pub(crate) trait QueueDriver<P: Send + 'static>: QueueRules {
    /// The queue a pool parks its tasks in on this node. A node of a shared queue keeps only
    /// claims it had to park again, in memory.
    fn open_local(&self, _pool: &str) -> Result<Box<dyn TaskQueue<P>>, PoolError> {
        Ok(Box::new(InMemoryQueue::new()))
    }

    /// The pool's part in the shared queue, if the backend is one, claiming a priority's
    /// tasks in `order` (the pool's).
    fn open_shared(
        &self,
        _pool: &str,
        _order: QueueOrder,
        _databases: &mut dyn Databases,
    ) -> Result<Option<SharedPart<P>>, PoolError> {
        Ok(None)
    }
}

/// Where drivers get a database: one connection for every pool that needs it.
pub(crate) trait Databases {
    /// The database of the pool `pool`; `field` is the field an error names.
    #[cfg(feature = "postgres")]
    fn database(&mut self, pool: &str, field: &str) -> Result<PgDatabase, PoolError>;
}

/// A pool's part in a shared queue, and the queue's fence for a mailbox in its database.
pub(crate) struct SharedPart<P> {
    /// This node's parking on the shared queue.
    pub(crate) parking: SharedParking<P>,
    /// Ends the queue's claims in the transaction of a Postgres mailbox that stores results.
    #[cfg(feature = "postgres")]
    pub(crate) fence: crate::infra::postgres::ClaimFence,
}
