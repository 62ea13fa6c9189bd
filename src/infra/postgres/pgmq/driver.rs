//! The pgmq queue's driver: its settings' rules, and how a node joins it (cargo feature
//! `pgmq`). Its limits and its way of joining are the Postgres queue's.

use crate::core::PoolError;
use crate::infra::postgres::queue::driver::{
    MAX_ATTEMPTS, MAX_CLAIM_AHEAD, MAX_LEASE_MS, MIN_LEASE_MS,
};
use crate::infra::queue::driver::{Databases, QueueDriver, QueueRules, SharedPart};
use crate::settings::checks::{check_identifier, in_range};
use crate::settings::error::ConfigError;
use crate::settings::quote;

/// The `"type"` of the pgmq queue.
pub(crate) const TYPE: &str = "postgres_pgmq";

/// PGMQ allows 47 characters; the priority levels add a suffix of up to 5 (`_crit`).
const MAX_PGMQ_QUEUE: usize = 42;

/// The driver of `{"type": "postgres_pgmq", ...}`.
pub(crate) struct PgmqDriver<'a> {
    /// The queue name prefix.
    pub(crate) queue_name: &'a str,
    /// How long a node's claim lasts without renewal, ms.
    pub(crate) lease_ms: Option<u64>,
    /// The `read_ct` at which a lost run dead-letters the message.
    pub(crate) max_attempts: Option<u32>,
    /// Claimed tasks a node may hold waiting for a worker.
    pub(crate) claim_ahead: Option<u32>,
    /// Whether tasks may name parents (see `PgmqQueue::with_dependencies`); read where the
    /// queue opens, in builds with the feature.
    #[cfg_attr(not(feature = "pgmq"), allow(dead_code))]
    pub(crate) dependencies: bool,
}

impl QueueRules for PgmqDriver<'_> {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    fn feature(&self) -> Option<&'static str> {
        Some("pgmq")
    }

    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if let Some(ahead) = self.claim_ahead {
            in_range(path, "claim_ahead", ahead, 0, MAX_CLAIM_AHEAD)?;
        }
        if let Some(lease) = self.lease_ms {
            in_range(path, "lease_ms", lease, MIN_LEASE_MS, MAX_LEASE_MS)?;
        }
        if let Some(attempts) = self.max_attempts {
            in_range(path, "max_attempts", attempts, 1, MAX_ATTEMPTS)?;
        }
        check_identifier(
            &format!("{path}.queue_name"),
            self.queue_name,
            MAX_PGMQ_QUEUE,
        )
    }

    fn describe(&self, _pool: &str) -> String {
        format!("pgmq queue {}", quote::name(self.queue_name))
    }

    fn storage_key(&self, _pool: &str) -> Option<(&'static str, String, String)> {
        Some((TYPE, self.queue_name.to_owned(), String::new()))
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn claims_by_deadline(&self) -> bool {
        true
    }

    fn bounds_queued_units(&self) -> bool {
        true
    }
}

impl<P> QueueDriver<P> for PgmqDriver<'_>
where
    P: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    #[cfg(feature = "pgmq")]
    fn open_shared(
        &self,
        pool: &str,
        order: crate::core::QueueOrder,
        databases: &mut dyn Databases,
    ) -> Result<Option<SharedPart<P>>, PoolError> {
        use crate::infra::postgres::queue::driver::{in_pool, retry_policy, shared_parking};

        let database = databases.database(pool, "queue.type")?;
        let mut queue = super::PgmqQueue::<P>::open_in_order(&database, self.queue_name, order)
            .map_err(|error| in_pool(pool, "queue", error))?
            .with_retry(retry_policy(self.max_attempts))
            .with_pool(pool);
        if self.dependencies {
            queue = queue.with_dependencies();
        }
        let fence = queue.fence();
        let parking = shared_parking(std::sync::Arc::new(queue), pool, self.lease_ms)
            .with_claim_ahead(self.claim_ahead.unwrap_or(0) as usize);
        Ok(Some(SharedPart { parking, fence }))
    }

    /// Reached only in builds without the feature, after the builder refused the pool.
    #[cfg(not(feature = "pgmq"))]
    fn open_shared(
        &self,
        pool: &str,
        _order: crate::core::QueueOrder,
        _databases: &mut dyn Databases,
    ) -> Result<Option<SharedPart<P>>, PoolError> {
        Err(PoolError::Internal(format!(
            "pools.{pool}.queue: the postgres_pgmq queue passed the availability check but \
             cannot be built"
        )))
    }
}
