//! Configuration to running pools: [`build_pools_from_scheduler_config`].
//!
//! Every pool of a [`SchedulerConfig`] becomes a [`ResourcePool`] on the one engine, with the
//! queue and mailbox backends its settings name. All pools' backends are checked before any
//! pool starts, so a bad pool leaves nothing half-built.

use std::collections::HashMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::{
    MaxUnits, NotifierSettings, PoolSettings, QueueSettings, SchedulerConfig, StorageSettings,
};
use crate::core::{Mailbox, PoolError, ResourcePool, Spawn, TaskExecutor, TaskQueue};
use crate::infra::mailbox::memory::InMemoryMailbox;
use crate::infra::queue::memory::InMemoryQueue;

/// What the backends of built pools may use beyond their own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueBuilderContext {
    /// Backends that need nothing from outside: in memory, embedded files.
    #[default]
    Embedded,
}

/// The pools a configuration describes, by name.
pub struct BuiltPools<P, R, E> {
    /// The running pools.
    pub pools: HashMap<String, ResourcePool<P, R, E>>,
}

/// Builds and starts every pool of `config`.
///
/// `config` is validated again but used as it is: its `${NAME}` references were replaced
/// once, when it was loaded (see [`SchedulerConfig::from_value`]).
///
/// `mailbox` overrides every pool's configured result storage with one shared mailbox (pass
/// `None` to use each pool's own). `executor_for` makes each pool's executor from its name.
/// Each pool's actor tree runs on `spawner`.
///
/// The config chooses backends at run time, and durable ones store payloads and results, so
/// both serialise (`Serialize + DeserializeOwned`). Pools of types that do not (results
/// holding channels, for example) are built in code with [`ResourcePool::new`] or
/// [`ResourcePool::with_settings`] and in-memory backends.
///
/// ```
/// use prometheus_parking_lot::*;
///
/// #[derive(Clone)]
/// struct Echo;
///
/// #[async_trait::async_trait]
/// impl TaskExecutor<String, String> for Echo {
///     async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
///         payload
///     }
/// }
///
/// let config = SchedulerConfig::from_json_str(
///     r#"{ "pools": { "chat": { "max_units": 8, "worker_threads": 2 } } }"#,
/// )?;
/// let built = build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
///     &config,
///     &QueueBuilderContext::Embedded,
///     None,
///     |_name| Echo,
///     TokioSpawner,
/// )?;
/// assert_eq!(built.pools["chat"].stats().worker_count, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn build_pools_from_scheduler_config<P, R, E, S>(
    config: &SchedulerConfig,
    context: &QueueBuilderContext,
    mailbox: Option<Arc<dyn Mailbox<R>>>,
    mut executor_for: impl FnMut(&str) -> E,
    spawner: S,
) -> Result<BuiltPools<P, R, E>, PoolError>
where
    P: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
    E: TaskExecutor<P, R> + 'static,
    S: Spawn,
{
    // The loaders replaced `${NAME}` references already; a value holding `${` now came from
    // the environment and is kept as it is. Validating again catches a config built in code.
    config.validate()?;
    for (name, pool) in &config.pools {
        check_available(name, pool, context, mailbox.is_some())?;
    }
    // Queues that open files are opened before any pool starts, for the same reason.
    let mut queues = HashMap::with_capacity(config.pools.len());
    for (name, pool) in &config.pools {
        queues.insert(name.as_str(), queue_for::<P>(name, &pool.queue)?);
    }
    let mut pools = HashMap::with_capacity(config.pools.len());
    for (name, pool) in &config.pools {
        let MaxUnits::Units(units) = pool.max_units else {
            return Err(unavailable(
                name,
                "max_units",
                "\"auto\" (GPU sizing)",
                "gpu",
            ));
        };
        let units = u32::try_from(units).map_err(|_| {
            PoolError::InvalidConfig(format!(
                "pools.{name}.max_units: {units} exceeds {}",
                u32::MAX
            ))
        })?;
        let settings = config
            .worker_pool_config(name, units)
            .ok_or_else(|| PoolError::Internal(format!("pool {name} vanished from its config")))?;
        let results = match &mailbox {
            Some(shared) => shared.clone(),
            None => in_memory_mailbox(&pool.mailbox.storage),
        };
        let built = ResourcePool::with_settings(
            settings,
            executor_for(name),
            queues
                .remove(name.as_str())
                .ok_or_else(|| PoolError::Internal(format!("pool {name} lost its queue")))?,
            results,
            &spawner,
        )?;
        pools.insert(name.clone(), built);
    }
    Ok(BuiltPools { pools })
}

/// Refuses, before anything starts, a pool that names a backend this build does not have.
fn check_available(
    name: &str,
    pool: &PoolSettings,
    context: &QueueBuilderContext,
    mailbox_overridden: bool,
) -> Result<(), PoolError> {
    let QueueBuilderContext::Embedded = context;
    match &pool.queue {
        QueueSettings::InMemory => {}
        #[cfg(feature = "yaque")]
        QueueSettings::Yaque { .. } => {}
        #[cfg(not(feature = "yaque"))]
        QueueSettings::Yaque { .. } => {
            return Err(unavailable(name, "queue.type", "the yaque queue", "yaque"))
        }
        QueueSettings::Postgres { .. } => {
            return Err(unavailable(
                name,
                "queue.type",
                "the postgres queue",
                "postgres",
            ))
        }
        QueueSettings::PostgresPgmq { .. } => {
            return Err(unavailable(
                name,
                "queue.type",
                "the postgres_pgmq queue",
                "pgmq",
            ))
        }
    }
    if let (StorageSettings::Postgres { .. }, false) = (&pool.mailbox.storage, mailbox_overridden) {
        return Err(unavailable(
            name,
            "mailbox.storage.type",
            "the postgres mailbox",
            "postgres",
        ));
    }
    if let Some(NotifierSettings::Http { .. }) = &pool.mailbox.notifier {
        return Err(unavailable(
            name,
            "mailbox.notifier.type",
            "the http notifier",
            "webhook",
        ));
    }
    if pool.max_units == MaxUnits::Auto {
        return Err(unavailable(
            name,
            "max_units",
            "\"auto\" (GPU sizing)",
            "gpu",
        ));
    }
    Ok(())
}

fn unavailable(pool: &str, field: &str, what: &str, feature: &str) -> PoolError {
    PoolError::InvalidConfig(format!(
        "pools.{pool}.{field}: {what} is not available in this build of prometheus_parking_lot \
         (it needs the cargo feature `{feature}`); available here: {AVAILABLE}"
    ))
}

/// The backends this build has, for `unavailable`.
#[cfg(not(feature = "yaque"))]
const AVAILABLE: &str = "the in_memory queue and mailbox and a number for max_units";
#[cfg(feature = "yaque")]
const AVAILABLE: &str =
    "the in_memory and yaque queues, the in_memory mailbox and a number for max_units";

/// The queue a pool's settings name (`check_available` refused the ones this build lacks).
fn queue_for<P>(name: &str, settings: &QueueSettings) -> Result<Box<dyn TaskQueue<P>>, PoolError>
where
    P: Serialize + DeserializeOwned + Send + 'static,
{
    match settings {
        #[cfg(feature = "yaque")]
        QueueSettings::Yaque { path, stream } => {
            let queue = crate::infra::queue::yaque::YaqueQueue::open(path, stream)
                .map_err(|error| PoolError::Internal(format!("pools.{name}.queue: {error}")))?;
            Ok(Box::new(queue))
        }
        QueueSettings::InMemory => Ok(Box::new(InMemoryQueue::new())),
        _ => Err(PoolError::Internal(format!(
            "pools.{name}.queue: this build has no such queue"
        ))),
    }
}

fn in_memory_mailbox<R: Send + 'static>(storage: &StorageSettings) -> Arc<dyn Mailbox<R>> {
    let mailbox = InMemoryMailbox::new();
    match storage {
        StorageSettings::InMemory {
            max_messages: Some(max),
        } => Arc::new(mailbox.with_max_messages(*max)),
        _ => Arc::new(mailbox),
    }
}
