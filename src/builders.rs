//! Configuration to running pools: [`build_pools_from_scheduler_config`].
//!
//! Every pool of a [`SchedulerConfig`] becomes a [`ResourcePool`] on the one engine, with the
//! queue and mailbox backends its settings name. All pools' backends are checked before any
//! pool starts, so a bad pool leaves nothing half-built.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use prometheus_parking_lot_actors::mailbox::json_result;

use crate::config::{
    MailboxSettings, MaxUnits, NotifierSettings, PoolSettings, SchedulerConfig, StorageSettings,
};
use crate::core::{Mailbox, Notifier, PoolError, Spawn};
use crate::gpu::plan::{plan, GpuSource};
use crate::gpu::GpuProbe;
use crate::infra::mailbox::memory::InMemoryMailbox;
#[cfg(feature = "postgres")]
use crate::infra::postgres::queue::driver::in_pool;
#[cfg(feature = "postgres")]
use crate::infra::postgres::PgDatabase;
use crate::infra::queue::driver::{Databases, SharedPart};
use crate::infra::queue::memory::InMemoryQueue;
use crate::infra::queue::registry::{is_built, queue_driver, queue_rules, QUEUE_TYPES};
use crate::pool::Backends;
use crate::settings::error::ConfigError;
use crate::settings::quote;
use crate::{ResourcePool, TaskExecutor};

/// What the backends of built pools may use beyond their own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueBuilderContext {
    /// Backends bring what they need: in memory, embedded files, and the Postgres backends
    /// connect to the configuration's `database_url`.
    #[default]
    Embedded,
    /// The Postgres backends use this database handle (an application's own connection,
    /// through [`PgDatabase::from_connection`]) instead of connecting themselves.
    #[cfg(feature = "postgres")]
    Postgres(PgDatabase),
}

/// The pools a configuration describes, by name.
pub struct BuiltPools<P, R, E> {
    /// The running pools.
    pub pools: HashMap<String, ResourcePool<P, R, E>>,
    /// The places in their fleets of the pools on a shared Postgres queue; dropped after the
    /// pools, so that each node marks itself gone as it stops (without `admin`, held for that
    /// drop only).
    #[cfg(feature = "postgres")]
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    fleet: crate::infra::postgres::fleet::Seats,
}

impl<P, R, E> BuiltPools<P, R, E>
where
    P: Send + 'static,
    R: Send + 'static,
    E: crate::TaskExecutor<P, R> + 'static,
{
    /// Stops every pool, one after another, and returns once they have stopped: each stops
    /// admitting, lets its running tasks finish for up to `drain` and stops its actors (see
    /// [`PoolClient::shutdown`](crate::core::PoolClient::shutdown)); a node of a shared queue
    /// hands back the claims it held waiting and settles what ended. Then each node leaves
    /// its fleet (its row says it is gone). Answers the first pool's error, if any.
    ///
    /// Dropping the pools instead starts the same stop in the background and returns at
    /// once, so a dropped node may still renew and settle its claims for a moment: a
    /// process about to exit, or code that goes on to change the queue's tables, stops the
    /// pools with this first.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use prometheus_parking_lot::{build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner};
    /// # #[derive(Clone)] struct Model;
    /// # #[async_trait::async_trait]
    /// # impl prometheus_parking_lot::TaskExecutor<String, String> for Model {
    /// #     async fn execute(&self, p: String, _: prometheus_parking_lot::core::TaskMetadata) -> String { p }
    /// # }
    /// # async fn run(config: SchedulerConfig) -> Result<(), prometheus_parking_lot::PoolError> {
    /// let built = build_pools_from_scheduler_config::<String, String, Model, TokioSpawner>(
    ///     &config, &QueueBuilderContext::Embedded, None, |_| Model, TokioSpawner,
    /// )?;
    /// // ... serve ...
    /// built.shutdown(Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(self, drain: Duration) -> Result<(), PoolError> {
        let mut first_error = None;
        for pool in self.pools.values() {
            if let Err(error) = pool.client().shutdown(drain).await {
                first_error.get_or_insert(error);
            }
        }
        // The pools have stopped; the fleet seats go after them, marking each node gone.
        drop(self);
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(feature = "admin")]
impl<P, R, E> BuiltPools<P, R, E>
where
    P: Send + 'static,
    R: Send + 'static,
    E: crate::TaskExecutor<P, R> + 'static,
{
    /// Serves these pools on the admin server `config`'s `admin` section describes (see
    /// [`crate::admin`]); `None` when it has none.
    ///
    /// ```no_run
    /// # use prometheus_parking_lot::{build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner};
    /// # #[derive(Clone)] struct Model;
    /// # #[async_trait::async_trait]
    /// # impl prometheus_parking_lot::TaskExecutor<String, String> for Model {
    /// #     async fn execute(&self, p: String, _m: prometheus_parking_lot::core::TaskMetadata) -> String { p }
    /// # }
    /// let config = SchedulerConfig::from_path("config/local.json")?;
    /// let built = build_pools_from_scheduler_config::<String, String, Model, TokioSpawner>(
    ///     &config, &QueueBuilderContext::Embedded, None, |_| Model, TokioSpawner,
    /// )?;
    /// if let Some(server) = built.serve_admin(&config)? {
    ///     println!("dashboard: {}", server.url());
    /// }
    /// # Ok::<(), prometheus_parking_lot::PoolError>(())
    /// ```
    pub fn serve_admin(
        &self,
        config: &SchedulerConfig,
    ) -> Result<Option<crate::admin::AdminServer>, PoolError> {
        use crate::admin::{Admin, AdminSettings};
        let Some(section) = &config.admin else {
            return Ok(None);
        };
        let mut settings = AdminSettings {
            token: section.token.clone(),
            allowed_hosts: section.allowed_hosts.clone(),
            read_token: section.read_token,
            ..AdminSettings::default()
        };
        if let Some(bind) = &section.bind {
            settings.bind = bind.parse().map_err(|_| {
                PoolError::InvalidConfig(format!(
                    "admin.bind: {bind:?} is not an address; use host:port such as 127.0.0.1:7480"
                ))
            })?;
        }
        let admin = self
            .pools
            .iter()
            .fold(Admin::new(settings), |admin, (name, pool)| {
                admin.with_pool(name.clone(), pool.client().clone())
            });
        #[cfg(feature = "postgres")]
        let admin = self.fleet.views().fold(admin, |admin, (name, view)| {
            admin.with_fleet(name.clone(), view.clone())
        });
        admin.serve().map(Some)
    }
}

/// Builds and starts every pool of `config`.
///
/// `config` is validated again but used as it is: its `${NAME}` references were replaced
/// once, when it was loaded (see [`SchedulerConfig::from_value`]).
///
/// `mailbox` overrides every pool's configured result storage with one shared mailbox (pass
/// `None` to use each pool's own). `executor_for` makes each pool's executor from its name
/// (for a pool per GPU, `<pool>.gpu<N>`). Each pool's actor tree runs on `spawner`.
///
/// Pools that use a GPU (`"max_units": "auto"` or a `gpu` section) are sized through NVML
/// (cargo feature `gpu`), loaded only when such a pool exists; see
/// [`build_pools_with_gpu_probe`] to answer with another probe.
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
    executor_for: impl FnMut(&str) -> E,
    spawner: S,
) -> Result<BuiltPools<P, R, E>, PoolError>
where
    P: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
    E: TaskExecutor<P, R> + 'static,
    S: Spawn,
{
    build_pools(
        config,
        context,
        mailbox,
        executor_for,
        spawner,
        &GpuSource::nvml(),
    )
}

/// [`build_pools_from_scheduler_config`] with GPU questions answered by `probe` instead of
/// NVML: a [`FakeGpu`](crate::gpu::FakeGpu) in tests and demos, or a probe of your own.
///
/// ```
/// use std::sync::Arc;
/// use prometheus_parking_lot::gpu::FakeGpu;
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
///     r#"{ "pools": { "llm": { "max_units": "auto", "worker_threads": 2,
///                              "gpu": { "devices": [0, 1], "reserve_fraction": 0.25 } } } }"#,
/// )?;
/// let gpus = FakeGpu::new().with_device("NVIDIA L4", 24_000).with_device("NVIDIA L4", 24_000);
/// let built = build_pools_with_gpu_probe::<String, String, Echo, TokioSpawner>(
///     &config,
///     &QueueBuilderContext::Embedded,
///     None,
///     |_name| Echo,
///     TokioSpawner,
///     Arc::new(gpus),
/// )?;
/// let stats = built.pools["llm.gpu1"].stats();
/// assert_eq!(stats.total_units, 18_000); // MiB: 24,000 less a quarter
/// assert_eq!(stats.gpu.expect("a GPU pool").name, "NVIDIA L4");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn build_pools_with_gpu_probe<P, R, E, S>(
    config: &SchedulerConfig,
    context: &QueueBuilderContext,
    mailbox: Option<Arc<dyn Mailbox<R>>>,
    executor_for: impl FnMut(&str) -> E,
    spawner: S,
    probe: Arc<dyn GpuProbe>,
) -> Result<BuiltPools<P, R, E>, PoolError>
where
    P: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
    E: TaskExecutor<P, R> + 'static,
    S: Spawn,
{
    build_pools(
        config,
        context,
        mailbox,
        executor_for,
        spawner,
        &GpuSource::Given(probe),
    )
}

fn build_pools<P, R, E, S>(
    config: &SchedulerConfig,
    context: &QueueBuilderContext,
    mailbox: Option<Arc<dyn Mailbox<R>>>,
    mut executor_for: impl FnMut(&str) -> E,
    spawner: S,
    gpus: &GpuSource,
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
        check_available(name, pool, context, mailbox.is_some(), gpus)?;
    }
    let mut notifiers = HashMap::with_capacity(config.pools.len());
    for (name, pool) in &config.pools {
        notifiers.insert(name.as_str(), notifiers_for(name, &pool.mailbox)?);
    }
    let mut planned = Vec::with_capacity(config.pools.len());
    for (name, pool) in &config.pools {
        planned.push((name, pool, plan(name, pool, gpus)?));
    }
    // Queues that open files are opened before any pool starts, for the same reason.
    let mut queues = HashMap::with_capacity(config.pools.len());
    for (name, pool) in &config.pools {
        queues.insert(
            name.as_str(),
            queue_driver::<P>(&pool.queue).open_local(name)?,
        );
    }
    let mut sources = Sources::new(config, context);
    let mut pools = HashMap::with_capacity(planned.len());
    #[cfg(feature = "postgres")]
    let mut fleet =
        crate::infra::postgres::fleet::Seats::new(crate::infra::postgres::fleet::FleetSettings {
            heartbeat: config.fleet.clone().unwrap_or_default().heartbeat(),
        });
    // A pool with one instance per GPU has its schedules on the first instance only.
    let mut carried_schedules = std::collections::HashSet::new();
    for (name, pool, instances) in planned {
        for instance in instances {
            let settings = config
                .worker_pool_config(name, instance.units)
                .ok_or_else(|| {
                    PoolError::Internal(format!("pool {name} vanished from its config"))
                })?
                .with_name(&instance.name);
            let order = settings.limits().order;
            let shared = queue_driver::<P>(&pool.queue).open_shared(name, order, &mut sources)?;
            #[cfg(feature = "postgres")]
            let node = shared.as_ref().map(|shared| shared.parking.node.clone());
            let results = match &mailbox {
                Some(given) => given.clone(),
                None => sources.mailbox(name, &pool.mailbox.storage, shared.as_ref())?,
            };
            // One pool per GPU is allowed only on the in-memory queue: each gets its own.
            let local = queues
                .remove(name.as_str())
                .unwrap_or_else(|| Box::new(InMemoryQueue::new()));
            let mut backends = Backends {
                gpu: instance.gpu,
                notifiers: notifiers.get(name.as_str()).cloned().unwrap_or_default(),
                result_encoder: Some(json_result::<R>),
                ..Backends::local(local, results)
            };
            backends.shared = shared.map(|shared| shared.parking);
            let built = ResourcePool::with_backends(
                settings,
                executor_for(&instance.name),
                backends,
                &spawner,
            )?;
            if !carried_schedules.contains(name.as_str()) {
                carried_schedules.insert(name.as_str());
                add_schedules(name, pool, &built)?;
            }
            #[cfg(feature = "postgres")]
            if let (Some(node), Some(fleet_queue)) = (
                node,
                crate::infra::postgres::fleet::fleet_queue(name, &pool.queue, order)?,
            ) {
                fleet.join(
                    &instance.name,
                    fleet_queue,
                    &node,
                    sources.database(name, "queue")?,
                    built.client().clone().into(),
                )?;
            }
            pools.insert(instance.name, built);
        }
    }
    Ok(BuiltPools {
        pools,
        #[cfg(feature = "postgres")]
        fleet,
    })
}

/// Gives pool `name` the schedules of its settings, each payload read as `P`; the error
/// names the schedule's field.
fn add_schedules<P, R, E>(
    name: &str,
    pool: &PoolSettings,
    built: &ResourcePool<P, R, E>,
) -> Result<(), PoolError>
where
    P: Serialize + DeserializeOwned + Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    for (index, settings) in pool.schedules.iter().enumerate() {
        let path = format!("pools.{}.schedules[{index}]", quote::name(name));
        let schedule = settings.schedule(&path)?;
        if let Err(error) = serde_json::from_value::<P>(settings.payload.clone()) {
            return Err(ConfigError::invalid(
                format!("{path}.payload"),
                format!("does not read as the pool's payload type: {error}"),
            )
            .into());
        }
        built.add_schedule_json(schedule, settings.payload.clone())?;
    }
    Ok(())
}

/// Refuses, before anything starts, a pool that names a backend this build does not have.
fn check_available(
    name: &str,
    pool: &PoolSettings,
    context: &QueueBuilderContext,
    mailbox_overridden: bool,
    gpus: &GpuSource,
) -> Result<(), PoolError> {
    let _ = context;
    let queue = queue_rules(&pool.queue);
    if let (Some(feature), false) = (queue.feature(), is_built(queue.type_name())) {
        let what = format!("the {} queue", queue.type_name());
        return Err(unavailable(name, "queue.type", &what, feature));
    }
    if let (StorageSettings::Postgres { .. }, false, false) = (
        &pool.mailbox.storage,
        mailbox_overridden,
        cfg!(feature = "postgres"),
    ) {
        return Err(unavailable(
            name,
            "mailbox.storage.type",
            "the postgres mailbox",
            "postgres",
        ));
    }
    #[cfg(not(feature = "webhook"))]
    if let Some(NotifierSettings::Http { .. }) = &pool.mailbox.notifier {
        return Err(unavailable(
            name,
            "mailbox.notifier.type",
            "the http notifier",
            "webhook",
        ));
    }
    if pool.gpu_settings().is_some() && !gpus.available() {
        return Err(match pool.max_units {
            MaxUnits::Auto => unavailable(name, "max_units", "\"auto\" (GPU sizing)", "gpu"),
            MaxUnits::Units(_) => unavailable(name, "gpu", "GPU sizing", "gpu"),
        });
    }
    Ok(())
}

fn unavailable(pool: &str, field: &str, what: &str, feature: &str) -> PoolError {
    PoolError::InvalidConfig(format!(
        "pools.{pool}.{field}: {what} is not available in this build of prometheus_parking_lot \
         (it needs the cargo feature `{feature}`); available here: {}",
        available()
    ))
}

/// The backends this build has, for `unavailable`: queues, mailboxes, notifiers, capacity.
fn available() -> String {
    let queues: Vec<&str> = QUEUE_TYPES
        .into_iter()
        .filter_map(|(queue, built)| built.then_some(queue))
        .collect();
    let mailboxes: Vec<&str> = [
        Some("in_memory"),
        cfg!(feature = "postgres").then_some("postgres"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut text = format!(
        "the {} queue{}, the {} mailbox{}",
        queues.join(", "),
        if queues.len() > 1 { "s" } else { "" },
        mailboxes.join(" and "),
        if mailboxes.len() > 1 { "es" } else { "" },
    );
    if cfg!(feature = "webhook") {
        text.push_str(", the http notifier");
    }
    text.push_str(if cfg!(feature = "gpu") {
        " and a number or \"auto\" for max_units"
    } else {
        " and a number for max_units"
    });
    text
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
    let NotifierSettings::Http {
        base_url,
        auth_header,
        hmac_secret,
        timeout_ms,
        max_retries,
    } = settings;
    let mut http = HttpNotifierSettings::new(base_url.clone()).with_name(pool);
    if let Some(header) = auth_header {
        http = http.with_auth_header(header.clone());
    }
    if let Some(key) = hmac_secret {
        http = http.with_hmac_secret(key.clone());
    }
    if let Some(timeout_ms) = timeout_ms {
        http = http.with_timeout(Duration::from_millis(*timeout_ms));
    }
    if let Some(max_retries) = max_retries {
        http = http.with_max_retries(*max_retries);
    }
    let notifier = HttpNotifier::new(http).map_err(|error| match error {
        PoolError::InvalidConfig(problem) => {
            PoolError::InvalidConfig(format!("pools.{pool}.mailbox.notifier: {problem}"))
        }
        other => other,
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

/// Where built pools' backends come from: the database, connected once for every pool that
/// needs it.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
struct Sources<'a> {
    config: &'a SchedulerConfig,
    #[cfg(feature = "postgres")]
    database: Option<PgDatabase>,
}

impl<'a> Sources<'a> {
    fn new(config: &'a SchedulerConfig, context: &'a QueueBuilderContext) -> Self {
        #[cfg(not(feature = "postgres"))]
        let QueueBuilderContext::Embedded = context;
        Self {
            config,
            #[cfg(feature = "postgres")]
            database: match context {
                QueueBuilderContext::Postgres(database) => Some(database.clone()),
                QueueBuilderContext::Embedded => None,
            },
        }
    }

    /// The mailbox `storage` describes. A Postgres mailbox of a pool on a shared Postgres
    /// queue ends the queue's claims in the transaction that stores their results (it lives
    /// in the same database): see `PostgresMailbox::settling_claims_of`.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    fn mailbox<P, R>(
        &mut self,
        pool: &str,
        storage: &StorageSettings,
        shared: Option<&SharedPart<P>>,
    ) -> Result<Arc<dyn Mailbox<R>>, PoolError>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
    {
        match storage {
            StorageSettings::InMemory { max_messages } => {
                let mailbox = InMemoryMailbox::new();
                Ok(match max_messages {
                    Some(max) => Arc::new(mailbox.with_max_messages(*max)),
                    None => Arc::new(mailbox),
                })
            }
            #[cfg(feature = "postgres")]
            StorageSettings::Postgres { table } => {
                let database = self.database(pool, "mailbox.storage.type")?;
                let mut mailbox =
                    crate::infra::postgres::mailbox::PostgresMailbox::open(&database, table)
                        .map_err(|error| in_pool(pool, "mailbox.storage", error))?;
                if let Some(fence) = shared.map(|shared| shared.fence.clone()) {
                    mailbox = mailbox
                        .settling_claims_of(fence)
                        .map_err(|error| in_pool(pool, "mailbox.storage", error))?;
                }
                Ok(Arc::new(mailbox))
            }
            #[cfg(not(feature = "postgres"))]
            StorageSettings::Postgres { .. } => Err(unavailable(
                pool,
                "mailbox.storage.type",
                "the postgres mailbox",
                "postgres",
            )),
        }
    }
}

impl Databases for Sources<'_> {
    /// The database: the context's, or one connection to `database_url` for every pool.
    #[cfg(feature = "postgres")]
    fn database(&mut self, pool: &str, field: &str) -> Result<PgDatabase, PoolError> {
        if let Some(database) = &self.database {
            return Ok(database.clone());
        }
        let Some(url) = &self.config.database_url else {
            return Err(PoolError::InvalidConfig(format!(
                "pools.{pool}.{field}: a postgres backend needs a database; set database_url \
                 (for example \"${{DATABASE_URL}}\") at the top of the configuration, or pass \
                 QueueBuilderContext::Postgres"
            )));
        };
        // A server that cannot be reached is the pool's backend failing, as it is later.
        let database = PgDatabase::connect(url.expose()).map_err(|error| match error {
            PoolError::Backend(mut backend) => {
                backend.pool = pool.to_owned();
                PoolError::Backend(backend)
            }
            other => other,
        })?;
        self.database = Some(database.clone());
        Ok(database)
    }
}
