//! The one place that maps a pool's `"queue"` section ([`QueueSettings`]) to its backend's
//! driver (see `driver.rs` for what a driver is), and the list of queue types this build has.
//! A new backend adds its arm to [`queue_driver`] and its entry to [`QUEUE_TYPES`].

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::driver::{QueueDriver, QueueRules};
use super::{memory, yaque, QueueSettings};
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
            dependencies,
        } => Box::new(postgres::driver::PostgresDriver {
            table,
            queue_name: queue_name.as_deref(),
            lease_ms: *lease_ms,
            max_attempts: *max_attempts,
            claim_ahead: *claim_ahead,
            dependencies: *dependencies,
        }),
        QueueSettings::PostgresPgmq {
            queue_name,
            lease_ms,
            max_attempts,
            claim_ahead,
            dependencies,
        } => Box::new(pgmq::driver::PgmqDriver {
            queue_name,
            lease_ms: *lease_ms,
            max_attempts: *max_attempts,
            claim_ahead: *claim_ahead,
            dependencies: *dependencies,
        }),
    }
}

/// The rules of the backend `settings` name, which do not depend on the payload type.
pub(crate) fn queue_rules(settings: &QueueSettings) -> Box<dyn QueueRules + '_> {
    queue_driver::<()>(settings)
}
