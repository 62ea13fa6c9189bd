//! How the configuration and the pool builder reach a queue backend: its driver.
//!
//! A pool's `"queue"` section ([`QueueSettings`]) names one backend. Each backend's folder
//! holds its driver: [`QueueRules`] (the rules of its settings, with errors that name the
//! field, and what it is: shared between nodes, durable) and [`QueueDriver`] (how it opens
//! for a payload type). [`queue_driver`] is the one place that maps a `"type"` to its driver;
//! [`QUEUE_TYPES`] lists the types and whether this build has them.
//!
//! Adding a queue backend: its folder (here, or in `infra/postgres/` for one on PostgreSQL:
//! the queue, and a `driver.rs` implementing both traits), its variant of [`QueueSettings`],
//! its line in [`queue_driver`] and [`QUEUE_TYPES`], and its cargo feature.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{ConfigError, QueueSettings};
use crate::core::{PoolError, TaskQueue};
#[cfg(feature = "postgres")]
use crate::infra::postgres::PgDatabase;
use crate::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot_actors::scheduler::shared_io::SharedParking;

use super::{memory, yaque};
use crate::infra::postgres::{pgmq, queue as postgres};

/// Every queue `"type"` a configuration may name, and whether this build has it, in the
/// order errors list them.
pub(crate) const QUEUE_TYPES: [(&str, bool); 4] = [
    (memory::driver::TYPE, true),
    (yaque::driver::TYPE, cfg!(feature = "yaque")),
    (postgres::driver::TYPE, cfg!(feature = "postgres")),
    (pgmq::driver::TYPE, cfg!(feature = "pgmq")),
];

/// Whether this build has the queue `"type"` `type_name`.
pub(crate) fn is_built(type_name: &str) -> bool {
    QUEUE_TYPES
        .iter()
        .any(|&(queue, built)| queue == type_name && built)
}

/// The driver of the backend `settings` name.
pub(crate) fn queue_driver<P>(settings: &QueueSettings) -> Box<dyn QueueDriver<P> + '_>
where
    P: Serialize + DeserializeOwned + Send + 'static,
{
    match settings {
        QueueSettings::InMemory => Box::new(memory::driver::MemoryDriver),
        QueueSettings::Yaque { path, stream } => {
            Box::new(yaque::driver::YaqueDriver { path, stream })
        }
        QueueSettings::Postgres {
            table,
            queue_name,
            lease_ms,
            max_attempts,
            claim_ahead,
        } => Box::new(postgres::driver::PostgresDriver {
            table,
            queue_name: queue_name.as_deref(),
            lease_ms: *lease_ms,
            max_attempts: *max_attempts,
            claim_ahead: *claim_ahead,
        }),
        QueueSettings::PostgresPgmq {
            queue_name,
            lease_ms,
            max_attempts,
            claim_ahead,
        } => Box::new(pgmq::driver::PgmqDriver {
            queue_name,
            lease_ms: *lease_ms,
            max_attempts: *max_attempts,
            claim_ahead: *claim_ahead,
        }),
    }
}

/// The rules of the backend `settings` name, which do not depend on the payload type.
pub(crate) fn queue_rules(settings: &QueueSettings) -> Box<dyn QueueRules + '_> {
    queue_driver::<()>(settings)
}

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

    /// The pool's part in the shared queue, if the backend is one.
    fn open_shared(
        &self,
        _pool: &str,
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
