//! Configuration to running pools: [`build_pools_from_scheduler_config`].
//!
//! Every pool of a [`SchedulerConfig`] becomes a [`ResourcePool`] on the one engine, with the
//! queue and mailbox backends its settings name. All pools' backends are checked before any
//! pool starts, so a bad pool leaves nothing half-built.

use std::collections::HashMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use prometheus_parking_lot_actors::mailbox::json_result;

use crate::config::{
    MailboxSettings, MaxUnits, NotifierSettings, PoolSettings, QueueSettings, SchedulerConfig,
    StorageSettings,
};
use crate::core::{Mailbox, Notifier, PoolError, ResourcePool, Spawn, TaskExecutor, TaskQueue};
use crate::infra::mailbox::memory::InMemoryMailbox;
use crate::infra::queue::memory::InMemoryQueue;
use crate::pool::Backends;

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
    let mut notifiers = HashMap::with_capacity(config.pools.len());
    for (name, pool) in &config.pools {
        notifiers.insert(name.as_str(), notifiers_for(name, &pool.mailbox)?);
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
        let backends = Backends {
            notifiers: notifiers.remove(name.as_str()).unwrap_or_default(),
            result_encoder: Some(json_result::<R>),
            ..Backends::local(in_memory_queue(), results)
        };
        let built = ResourcePool::with_backends(settings, executor_for(name), backends, &spawner)?;
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
         (it needs the cargo feature `{feature}`); available here: the in_memory queue and mailbox \
         and a number for max_units"
    ))
}

/// The notifiers a pool's `mailbox.notifier` names (started, so a bad one fails the build
/// before any pool starts).
fn notifiers_for(
    pool: &str,
    mailbox: &MailboxSettings,
) -> Result<Vec<Arc<dyn Notifier>>, PoolError> {
    let Some(settings) = &mailbox.notifier else {
        return Ok(Vec::new());
    };
    http_notifier(pool, settings).map(|notifier| vec![notifier])
}

#[cfg(feature = "webhook")]
fn http_notifier(pool: &str, settings: &NotifierSettings) -> Result<Arc<dyn Notifier>, PoolError> {
    use crate::infra::notify::http::{HttpNotifier, HttpNotifierSettings};
    let notifier =
        HttpNotifier::new(HttpNotifierSettings::from_config(pool, settings)).map_err(|error| {
            match error {
                PoolError::InvalidConfig(problem) => {
                    PoolError::InvalidConfig(format!("pools.{pool}.mailbox.notifier: {problem}"))
                }
                other => other,
            }
        })?;
    Ok(Arc::new(notifier))
}

#[cfg(not(feature = "webhook"))]
fn http_notifier(pool: &str, _settings: &NotifierSettings) -> Result<Arc<dyn Notifier>, PoolError> {
    Err(unavailable(
        pool,
        "mailbox.notifier.type",
        "the http notifier",
        "webhook",
    ))
}

fn in_memory_queue<P: Send + 'static>() -> Box<dyn TaskQueue<P>> {
    Box::new(InMemoryQueue::new())
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
