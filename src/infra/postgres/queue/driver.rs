//! The Postgres queue's driver: its settings' rules, and how a node joins it (cargo feature
//! `postgres`). The pgmq queue's driver shares its limits and its way of joining.

#[cfg(feature = "postgres")]
use crate::core::SharedQueue;
use crate::core::{PoolError, QueueOrder};
use crate::infra::queue::driver::{Databases, QueueDriver, QueueRules, SharedPart};
use crate::settings::checks::{check_identifier, in_range, MAX_IDENTIFIER};
use crate::settings::error::ConfigError;
use crate::settings::quote;
#[cfg(feature = "postgres")]
use std::sync::Arc;

/// The `"type"` of the Postgres queue.
pub(crate) const TYPE: &str = "postgres";

/// The shortest lease a shared queue's claims may have (`queue.lease_ms`).
pub(crate) const MIN_LEASE_MS: u64 = 300;
/// The longest lease a shared queue's claims may have.
pub(crate) const MAX_LEASE_MS: u64 = 24 * 3_600 * 1_000;
/// The most claims a task of a shared queue may have (`queue.max_attempts`).
pub(crate) const MAX_ATTEMPTS: u32 = 1_000;
/// The most claimed tasks a node may hold waiting (`queue.claim_ahead`).
pub(crate) const MAX_CLAIM_AHEAD: u32 = 10_000;

/// The driver of `{"type": "postgres", ...}`.
pub(crate) struct PostgresDriver<'a> {
    /// The table.
    pub(crate) table: &'a str,
    /// The queue within the table; `None`: the pool's name.
    pub(crate) queue_name: Option<&'a str>,
    /// How long a node's claim lasts without renewal, ms.
    pub(crate) lease_ms: Option<u64>,
    /// Claims a task may have before a lost run dead-letters it.
    pub(crate) max_attempts: Option<u32>,
    /// Claimed tasks a node may hold waiting for a worker.
    pub(crate) claim_ahead: Option<u32>,
    /// Whether tasks may name parents (see `PostgresQueue::with_dependencies`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) dependencies: bool,
}

impl QueueRules for PostgresDriver<'_> {
    fn type_name(&self) -> &'static str {
        TYPE
    }

    fn feature(&self) -> Option<&'static str> {
        Some("postgres")
    }

    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if let Some(ahead) = self.claim_ahead {
            in_range(path, "claim_ahead", ahead, 0, MAX_CLAIM_AHEAD)?;
        }
        check_identifier(&format!("{path}.table"), self.table, MAX_IDENTIFIER)?;
        if let Some(lease) = self.lease_ms {
            in_range(path, "lease_ms", lease, MIN_LEASE_MS, MAX_LEASE_MS)?;
        }
        if let Some(attempts) = self.max_attempts {
            in_range(path, "max_attempts", attempts, 1, MAX_ATTEMPTS)?;
        }
        match self.queue_name {
            Some(queue_name) => {
                check_identifier(&format!("{path}.queue_name"), queue_name, MAX_IDENTIFIER)
            }
            None => Ok(()),
        }
    }

    fn describe(&self, pool: &str) -> String {
        format!(
            "Postgres queue {} in table {}",
            quote::name(self.queue_name.unwrap_or(pool)),
            quote::name(self.table)
        )
    }

    fn storage_key(&self, pool: &str) -> Option<(&'static str, String, String)> {
        let queue = self.queue_name.unwrap_or(pool);
        Some((TYPE, self.table.to_owned(), queue.to_owned()))
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

impl<P> QueueDriver<P> for PostgresDriver<'_>
where
    P: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    #[cfg(feature = "postgres")]
    fn open_shared(
        &self,
        pool: &str,
        order: QueueOrder,
        databases: &mut dyn Databases,
    ) -> Result<Option<SharedPart<P>>, PoolError> {
        let database = databases.database(pool, "queue.type")?;
        let queue = super::PostgresQueue::<P>::open_in_order(
            &database,
            self.table,
            self.queue_name.unwrap_or(pool),
            order,
        )
        .map_err(|error| in_pool(pool, "queue", error))?
        .with_retry(retry_policy(self.max_attempts))
        .with_pool(pool);
        let queue = if self.dependencies {
            queue
                .with_dependencies()
                .map_err(|error| in_pool(pool, "queue", error))?
        } else {
            queue
        };
        let fence = queue.fence();
        let parking = shared_parking(Arc::new(queue), pool, self.lease_ms)
            .with_claim_ahead(self.claim_ahead.unwrap_or(0) as usize);
        Ok(Some(SharedPart { parking, fence }))
    }

    /// Reached only in builds without the feature, after the builder refused the pool.
    #[cfg(not(feature = "postgres"))]
    fn open_shared(
        &self,
        pool: &str,
        _order: QueueOrder,
        _databases: &mut dyn Databases,
    ) -> Result<Option<SharedPart<P>>, PoolError> {
        Err(PoolError::Internal(format!(
            "pools.{pool}.queue: the postgres queue passed the availability check but cannot \
             be built"
        )))
    }
}

/// The retries of a shared queue: `max_attempts` claims (default 3), the default backoff.
#[cfg(feature = "postgres")]
pub(crate) fn retry_policy(max_attempts: Option<u32>) -> crate::infra::postgres::RetryPolicy {
    use crate::infra::postgres::RetryPolicy;
    RetryPolicy {
        max_attempts: max_attempts.unwrap_or(RetryPolicy::default().max_attempts),
        ..RetryPolicy::default()
    }
}

/// A node's parking on shared `queue`, leased for `lease_ms` (default 30 s).
#[cfg(feature = "postgres")]
pub(crate) fn shared_parking<P: Send + 'static>(
    queue: Arc<dyn SharedQueue<P>>,
    pool: &str,
    lease_ms: Option<u64>,
) -> prometheus_parking_lot_actors::scheduler::SharedParking<P> {
    use prometheus_parking_lot_actors::scheduler::SharedParking;
    let lease = std::time::Duration::from_millis(lease_ms.unwrap_or(30_000));
    // Claims follow NOTIFY at once; the poll is a safety net, the clock of lease renewals and
    // rescues, and when another node's scheduled start is found due (a node claims at the
    // instants it scheduled itself): 200 ms, as `SharedParking` has by default.
    let poll = (lease / 3).min(std::time::Duration::from_millis(200));
    SharedParking::new(queue, node_name(pool))
        .with_lease(lease)
        .with_poll(poll)
}

/// Says which pool and field an error of a backend belongs to.
#[cfg(feature = "postgres")]
pub(crate) fn in_pool(pool: &str, field: &str, error: PoolError) -> PoolError {
    match error {
        PoolError::InvalidConfig(text) => {
            PoolError::InvalidConfig(format!("pools.{pool}.{field}: {text}"))
        }
        PoolError::Internal(text) => PoolError::Internal(format!("pools.{pool}.{field}: {text}")),
        PoolError::Backend(mut error) => {
            if error.pool.is_empty() {
                error.pool = pool.to_owned();
            }
            PoolError::Backend(error)
        }
        other => other,
    }
}

/// This process's name in a shared queue's leases: host, process and pool, plus random bits
/// so two pools of one name on one host (a restarted process reusing a pid) never share one.
#[cfg(feature = "postgres")]
fn node_name(pool: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "node".into());
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    format!("{host}:{}:{pool}:{nonce:08x}", std::process::id())
}
