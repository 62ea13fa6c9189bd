//! The two public faces of the engine: [`WorkerPool`](worker_pool::WorkerPool) (the
//! inference-server API) and [`ResourcePool`](resource_pool::ResourcePool) (explicit
//! backends). Both are a [`PoolClient`] over the same actor tree; neither schedules anything
//! itself.

pub mod gate;
pub mod resource_pool;
pub mod worker_pool;

use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot_actors::engine::{
    start_gate_blocking, start_pool_blocking, PoolClient, PoolSpec,
};
use prometheus_parking_lot_actors::mailbox::{Notifier, ResultEncoder};
use prometheus_parking_lot_actors::observe::events::EventSubscriber;
use prometheus_parking_lot_actors::observe::trace::TaskTracer;
use prometheus_parking_lot_actors::scheduler::gpu_watch::GpuWatch;
use prometheus_parking_lot_actors::scheduler::protocol::ShutdownReport;
use prometheus_parking_lot_actors::scheduler::SharedParking;

use crate::config::WorkerPoolConfig;
use crate::TaskExecutor;
use prometheus_parking_lot_actors::domain::PoolError;
use prometheus_parking_lot_actors::mailbox::Mailbox;
use prometheus_parking_lot_actors::queue::TaskQueue;
use prometheus_parking_lot_actors::supervisor::spawn::Spawn;

/// What a pool stores into and reports to, beyond its settings.
pub(crate) struct Backends<P, R> {
    /// Where this node's parked (or, in shared mode, re-parked claimed) tasks wait.
    pub queue: Box<dyn TaskQueue<P>>,
    /// Where results wait.
    pub mailbox: Arc<dyn Mailbox<R>>,
    /// Who hears of terminal events once their result is stored.
    pub notifiers: Vec<Arc<dyn Notifier>>,
    /// How results become JSON for the notifiers (`None`: events carry no result).
    pub result_encoder: Option<ResultEncoder<R>>,
    /// A queue shared with other nodes, if any.
    pub shared: Option<SharedParking<P>>,
    /// The GPU the pool's VRAM units live on, if any.
    pub gpu: Option<GpuWatch>,
}

impl<P, R> Backends<P, R> {
    /// A queue and a mailbox, nothing else.
    pub fn local(queue: Box<dyn TaskQueue<P>>, mailbox: Arc<dyn Mailbox<R>>) -> Self {
        Self {
            queue,
            mailbox,
            notifiers: Vec::new(),
            result_encoder: None,
            shared: None,
            gpu: None,
        }
    }
}

/// The settings' view of the engine: built here, beside the pools that start from it, so
/// that the settings need not know the pools.
impl WorkerPoolConfig {
    /// The actor tree's [`PoolSpec`] of these settings, over a queue and a mailbox: what
    /// [`start_pool`](crate::actors::start_pool) takes, for callers that run the actor tree
    /// themselves. The pool's metrics are registered as for a [`WorkerPool`](crate::WorkerPool).
    ///
    /// ```
    /// use prometheus_parking_lot::config::WorkerPoolConfig;
    /// use prometheus_parking_lot::infra::{mailbox::InMemoryMailbox, queue::InMemoryQueue};
    /// # use prometheus_parking_lot::{TaskExecutor, TaskMetadata};
    /// # #[derive(Clone)]
    /// # struct Echo;
    /// # #[async_trait::async_trait]
    /// # impl TaskExecutor<String, String> for Echo {
    /// #     async fn execute(&self, payload: String, _meta: TaskMetadata) -> String { payload }
    /// # }
    ///
    /// let settings = WorkerPoolConfig::new().with_name("words").with_worker_count(2).with_max_units(8);
    /// let spec = settings.pool_spec(Echo, Box::new(InMemoryQueue::new()), Box::new(InMemoryMailbox::new()));
    /// assert_eq!(spec.name, "words");
    /// assert_eq!(spec.workers.count, 2);
    /// ```
    pub fn pool_spec<P, R, E>(
        &self,
        executor: E,
        queue: Box<dyn TaskQueue<P>>,
        mailbox: Box<dyn Mailbox<R>>,
    ) -> PoolSpec<P, R, E>
    where
        P: Send + 'static,
        R: Send + 'static,
        E: TaskExecutor<P, R> + 'static,
    {
        spec(self, executor, Backends::local(queue, mailbox.into()))
    }
}

/// Who hears the pool's events beyond its own counters: its metrics, with the `metrics`
/// feature.
fn subscribers(config: &WorkerPoolConfig) -> Vec<Arc<dyn EventSubscriber>> {
    #[cfg(feature = "metrics")]
    {
        let metrics = crate::metrics::PoolMetrics::register(&config.name, config.limits().capacity);
        vec![Arc::new(metrics)]
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = config;
        Vec::new()
    }
}

/// Builds the engine spec from the public settings and starts the pool on `spawner`.
fn start<P, R, E>(
    config: &WorkerPoolConfig,
    executor: E,
    backends: Backends<P, R>,
    spawner: &dyn Spawn,
) -> Result<PoolClient<P, R>, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    start_pool_blocking(spawner, spec(config, executor, backends))
}

/// Starts a pool that only grants capacity permits: no worker threads, nothing to run.
pub(crate) fn start_gate(config: &WorkerPoolConfig) -> Result<PoolClient<(), ()>, PoolError> {
    use crate::infra::mailbox::memory::InMemoryMailbox;
    use crate::infra::queue::memory::InMemoryQueue;

    /// A gate's pool runs nothing: its permits are held outside it.
    struct Nothing;

    #[async_trait::async_trait]
    impl TaskExecutor<(), ()> for Nothing {
        async fn execute(&self, (): (), _: prometheus_parking_lot_actors::domain::TaskMetadata) {}
    }

    let backends = Backends::local(
        Box::new(InMemoryQueue::new()),
        Arc::new(InMemoryMailbox::new()),
    );
    let spawner = crate::runtime::tokio_spawner::TokioSpawner;
    start_gate_blocking(&spawner, spec(config, Nothing, backends))
}

/// The engine spec of the public settings.
pub(crate) fn spec<P, R, E>(
    config: &WorkerPoolConfig,
    executor: E,
    backends: Backends<P, R>,
) -> PoolSpec<P, R, E>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    let Backends {
        queue,
        mailbox,
        mut notifiers,
        result_encoder,
        shared,
        gpu,
    } = backends;
    let mut subscribers = subscribers(config);
    let tracing = tracing_of(config, shared.as_ref().map(|shared| shared.node.clone()));
    subscribers.extend(tracing.subscriber);
    notifiers.extend(tracing.notifier);
    PoolSpec {
        name: config.name.clone(),
        limits: config.limits(),
        workers: config.worker_settings(),
        default_timeout: config.timeout,
        restart: config.restart,
        executor,
        queue,
        mailbox,
        notifiers,
        result_encoder,
        subscribers,
        retention: config.retention,
        shared,
        durability: config.durability,
        gpu,
        tenant_weights: config.tenant_weights.clone(),
        tracer: tracing.tracer,
    }
}

/// Who traces a pool's tasks: makes each submission's span, hears its tasks' steps and
/// their deliveries. Nobody, without the `otel` feature.
#[derive(Default)]
struct Tracing {
    tracer: Option<Arc<dyn TaskTracer>>,
    subscriber: Option<Arc<dyn EventSubscriber>>,
    notifier: Option<Arc<dyn Notifier>>,
}

/// The pool's traces, with the `otel` feature (see [`crate::otel`]); `node`: its name in a
/// shared queue's claims, if it is a node of one.
#[cfg(feature = "otel")]
fn tracing_of(config: &WorkerPoolConfig, node: Option<String>) -> Tracing {
    let tracing = crate::otel::PoolTracing::new(&config.name, node);
    Tracing {
        tracer: Some(tracing.clone()),
        subscriber: Some(tracing.clone()),
        notifier: Some(tracing),
    }
}

/// Without the `otel` feature a pool makes no span: its tasks carry the `traceparent` their
/// submitters give, and nothing more.
#[cfg(not(feature = "otel"))]
fn tracing_of(_: &WorkerPoolConfig, _: Option<String>) -> Tracing {
    Tracing::default()
}

/// Shuts the pool down (see [`PoolClient::shutdown`]) and blocks the calling thread until it
/// has stopped.
///
/// The drain runs on a thread of its own with its own runtime, so the caller may be a plain
/// thread or a task of any tokio runtime, a current-thread one included: the pool's actors
/// and workers run on their own threads, and nothing the drain waits for needs the caller's
/// runtime to make progress.
fn shut_down_blocking<P, R>(
    client: &PoolClient<P, R>,
    drain: Duration,
) -> Result<ShutdownReport, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
{
    let client = client.clone();
    let drainer = std::thread::Builder::new()
        .name("parking-lot-shutdown".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| {
                    PoolError::Internal(format!("could not build the shutdown runtime: {error}"))
                })?;
            runtime.block_on(client.shutdown(drain))
        })
        .map_err(|error| {
            PoolError::Internal(format!("could not start the shutdown thread: {error}"))
        })?;
    drainer
        .join()
        .unwrap_or_else(|_| Err(PoolError::Internal("the shutdown thread panicked".into())))
}
