//! [`ResourcePool`]: the pool with explicit queue, mailbox and runtime backends.

use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot_actors::engine::{PoolClient, ShutdownOnDrop};
use prometheus_parking_lot_actors::running::stream::ResultStream;
use prometheus_parking_lot_actors::scheduler::protocol::{ShutdownReport, SubmitOptions};

use crate::config::{PoolConfig, WorkerPoolConfig};
use crate::util::serde::MailboxKey;
use crate::TaskExecutor;
use prometheus_parking_lot_actors::domain::{PoolError, ScheduledTask};
use prometheus_parking_lot_actors::mailbox::Mailbox;
use prometheus_parking_lot_actors::queue::TaskQueue;
use prometheus_parking_lot_actors::supervisor::spawn::Spawn;

/// A pool of dedicated worker threads over the queue, mailbox and runtime you choose.
///
/// The same engine as [`WorkerPool`](crate::WorkerPool); this face takes whole
/// [`ScheduledTask`]s and explicit backends.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot::config::PoolConfig;
/// use prometheus_parking_lot::core::{ScheduledTask, TaskMetadata};
/// use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
/// use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
/// use prometheus_parking_lot::runtime::tokio_spawner::TokioSpawner;
/// use prometheus_parking_lot::util::serde::ResourceCost;
/// use prometheus_parking_lot::{ResourcePool, TaskExecutor};
///
/// #[derive(Clone)]
/// struct Len;
///
/// #[async_trait::async_trait]
/// impl TaskExecutor<String, usize> for Len {
///     async fn execute(&self, payload: String, _meta: TaskMetadata) -> usize {
///         payload.len()
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), prometheus_parking_lot::PoolError> {
/// let config = PoolConfig { worker_threads: 2, max_units: 8, ..PoolConfig::default() };
/// let pool = ResourcePool::new(
///     config,
///     Len,
///     Box::new(InMemoryQueue::new()),
///     Box::new(InMemoryMailbox::new()),
///     Box::new(TokioSpawner::new()),
/// )?;
/// let meta = TaskMetadata::new(7, ResourceCost::cpu(1));
/// let key = pool.submit(ScheduledTask { meta, payload: "hello".to_string() }).await?;
/// assert_eq!(pool.retrieve(&key, Duration::from_secs(5)).await?, 5);
/// # Ok(())
/// # }
/// ```
///
/// Its methods at work: tasks under one shared key, a timeout of a task's own, a cancel, a
/// retrieve that gives up (and takes nothing) and ones that take, the counters, the shutdown.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot::core::SubmitOptions;
/// use prometheus_parking_lot::infra::{mailbox::InMemoryMailbox, queue::InMemoryQueue};
/// use prometheus_parking_lot::config::PoolConfig;
/// use prometheus_parking_lot::{
///     MailboxKey, PoolError, ResourceCost, ResourcePool, ScheduledTask, TaskExecutor,
///     TaskMetadata, TokioSpawner,
/// };
///
/// /// Sleeps for the payload's milliseconds, then returns them.
/// #[derive(Clone)]
/// struct Sleep;
///
/// #[async_trait::async_trait]
/// impl TaskExecutor<u64, u64> for Sleep {
///     async fn execute(&self, ms: u64, _meta: TaskMetadata) -> u64 {
///         tokio::time::sleep(Duration::from_millis(ms)).await;
///         ms
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), PoolError> {
/// let pool = ResourcePool::new(
///     PoolConfig { worker_threads: 2, max_units: 4, ..PoolConfig::default() },
///     Sleep,
///     Box::new(InMemoryQueue::new()),
///     Box::new(InMemoryMailbox::new()),
///     Box::new(TokioSpawner::new()),
/// )?;
/// let inbox = MailboxKey::new("acme").with_user("ada");
/// let task = |id, ms| {
///     let meta = TaskMetadata::new(id, ResourceCost::cpu(2)).with_mailbox(inbox.clone());
///     ScheduledTask::new(meta, ms)
/// };
///
/// pool.submit(task(1, 1_000)).await?;
/// // A timeout of its own: this task ends `TimedOut` instead of sleeping 10 s.
/// let short = SubmitOptions {
///     timeout: Some(Duration::from_millis(200)),
///     ..SubmitOptions::default()
/// };
/// pool.submit_with(task(2, 10_000), short).await?;
/// // The two hold all 4 units: the third waits for them, and is cancelled.
/// pool.submit(task(3, 10_000)).await?;
/// pool.cancel(&inbox, 3).await?;
///
/// // A retrieve that gives up takes nothing: the result stays for the next one.
/// let early = pool.retrieve_task(&inbox, 1, Duration::from_millis(1)).await;
/// assert_eq!(early, Err(PoolError::Timeout));
/// assert_eq!(pool.retrieve_task(&inbox, 1, Duration::from_secs(5)).await, Ok(1_000));
/// assert_eq!(pool.retrieve_task(&inbox, 2, Duration::from_secs(5)).await, Err(PoolError::TimedOut));
/// assert_eq!(pool.retrieve_task(&inbox, 3, Duration::from_secs(5)).await, Err(PoolError::Cancelled));
///
/// assert_eq!(pool.stats().worker_count, 2);
/// let report = pool.shutdown_with_drain(Duration::from_secs(5)).await?;
/// assert_eq!(report.abandoned_running, 0);
/// # Ok(())
/// # }
/// ```
pub struct ResourcePool<P, R, E> {
    client: PoolClient<P, R>,
    stop_on_drop: ShutdownOnDrop,
    _executor: std::marker::PhantomData<fn() -> E>,
}

impl<P, R, E> ResourcePool<P, R, E>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    /// Starts a pool over these backends.
    pub fn new(
        config: PoolConfig,
        executor: E,
        queue: Box<dyn TaskQueue<P>>,
        mailbox: Box<dyn Mailbox<R>>,
        spawner: Box<dyn Spawn>,
    ) -> Result<Self, PoolError> {
        Self::with_settings(
            WorkerPoolConfig::try_from(config)?,
            executor,
            queue,
            mailbox.into(),
            spawner.as_ref(),
        )
    }

    /// Starts a pool from the full settings builder, [`WorkerPoolConfig`]. The mailbox is
    /// an `Arc` here so the caller can keep a handle on it (to read it, or to share it with
    /// another pool), and the spawner is only borrowed: the pool needs it to start and
    /// holds nothing of it after (see [`submit_blocking`](Self::submit_blocking) for an
    /// example).
    pub fn with_settings(
        settings: WorkerPoolConfig,
        executor: E,
        queue: Box<dyn TaskQueue<P>>,
        mailbox: Arc<dyn Mailbox<R>>,
        spawner: &dyn Spawn,
    ) -> Result<Self, PoolError> {
        Self::with_backends(
            settings,
            executor,
            super::Backends::local(queue, mailbox),
            spawner,
        )
    }

    /// Starts a pool over a full set of backends (notifiers, a shared queue).
    pub(crate) fn with_backends(
        settings: WorkerPoolConfig,
        executor: E,
        backends: super::Backends<P, R>,
        spawner: &dyn Spawn,
    ) -> Result<Self, PoolError> {
        let client = super::start(&settings, executor, backends, spawner)?;
        Ok(Self {
            stop_on_drop: client.shutdown_on_drop(settings.drain_on_drop),
            client,
            _executor: std::marker::PhantomData,
        })
    }

    /// Submits a task; returns the key its result will be stored under: the task's
    /// `mailbox`, or a fresh key of its own. It starts at once when its cost fits the free
    /// units and a worker is free, and is parked otherwise; it is refused (`QueueFull`,
    /// `InsufficientResources`, `DuplicateTask`, `Shutdown`...) only when it could not be
    /// parked either.
    pub async fn submit(&self, task: ScheduledTask<P>) -> Result<MailboxKey, PoolError> {
        self.client.submit(task, SubmitOptions::default()).await
    }

    /// Submits a task from synchronous code: blocks the calling thread (no runtime needed)
    /// until it is admitted or refused, with the same answers as [`submit`](Self::submit).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use prometheus_parking_lot::infra::{mailbox::InMemoryMailbox, queue::InMemoryQueue};
    /// use prometheus_parking_lot::{ResourceCost, ResourcePool, ScheduledTask, TaskMetadata, TokioSpawner, WorkerPoolConfig};
    /// # use prometheus_parking_lot::TaskExecutor;
    /// # #[derive(Clone)]
    /// # struct Len;
    /// # #[async_trait::async_trait]
    /// # impl TaskExecutor<String, usize> for Len {
    /// #     async fn execute(&self, payload: String, _meta: TaskMetadata) -> usize { payload.len() }
    /// # }
    ///
    /// let pool = ResourcePool::with_settings(
    ///     WorkerPoolConfig::new().with_worker_count(1).with_max_units(4),
    ///     Len,
    ///     Box::new(InMemoryQueue::new()),
    ///     Arc::new(InMemoryMailbox::new()),
    ///     &TokioSpawner,
    /// )?;
    /// let task = ScheduledTask::new(TaskMetadata::new(1, ResourceCost::cpu(1)), "four".to_string());
    /// let key = pool.submit_blocking(task)?;
    /// assert_eq!(pool.retrieve_blocking(&key, Duration::from_secs(5))?, 4);
    /// # Ok::<(), prometheus_parking_lot::PoolError>(())
    /// ```
    pub fn submit_blocking(&self, task: ScheduledTask<P>) -> Result<MailboxKey, PoolError> {
        self.client.submit_blocking(task, SubmitOptions::default())
    }

    /// Submits a task with per-task options: an execution timeout of its own (see the
    /// type's second example), or a scheduled start (`SubmitOptions::with_delay`,
    /// `with_not_before`: admitted now, it sleeps until then).
    pub async fn submit_with(
        &self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
    ) -> Result<MailboxKey, PoolError> {
        self.client.submit(task, options).await
    }

    /// Submits a task whose executor streams partial results; see
    /// [`WorkerPool::submit_streaming`](crate::WorkerPool::submit_streaming).
    pub async fn submit_streaming(
        &self,
        task: ScheduledTask<P>,
        buffer: usize,
    ) -> Result<ResultStream<R>, PoolError> {
        self.client
            .submit_streaming(task, SubmitOptions::default(), buffer)
            .await
    }

    /// Like [`retrieve`](PoolClient::retrieve), blocking the calling thread (no runtime needed);
    /// use it from synchronous code or `spawn_blocking`.
    pub fn retrieve_blocking(&self, key: &MailboxKey, timeout: Duration) -> Result<R, PoolError> {
        self.client.retrieve_blocking(key, None, timeout)
    }

    /// Shuts the pool down: stops admitting, lets running tasks finish for up to `drain`
    /// (`Duration::MAX`: for ever), cancels the rest, and reports what it did. Parked tasks of
    /// an in-memory queue end `Cancelled`; a durable queue keeps them for the next start.
    /// Every caller, concurrent or later, gets the same report. The same call as
    /// [`WorkerPool::shutdown_with_drain`](crate::WorkerPool::shutdown_with_drain).
    pub async fn shutdown_with_drain(&self, drain: Duration) -> Result<ShutdownReport, PoolError> {
        self.stop_on_drop.disarm();
        self.client.shutdown(drain).await
    }

    /// A gate over this pool's capacity: its permits and the pool's tasks share one budget
    /// and one order (see [`CapacityGate`](super::gate::CapacityGate)). Permits take units, not
    /// worker threads.
    pub fn gate(&self) -> super::gate::CapacityGate {
        super::gate::CapacityGate::of_pool(&self.client)
    }

    /// The engine client, for the actor-level API. The pool also dereferences to it.
    pub fn client(&self) -> &PoolClient<P, R> {
        &self.client
    }
}

/// Every operation the pool does not shape for the seed's API is its client's (and its
/// client's [`PoolControl`](prometheus_parking_lot_actors::engine::PoolControl)'s): `pool.retrieve(..)`,
/// `pool.retrieve_task(..)`, `pool.cancel(..)`, `pool.stats()`, `pool.pause()`,
/// `pool.why_waiting(..)`, `pool.events()`, `pool.inspect(..)`, `pool.preempt_tasks()`...
impl<P, R, E> std::ops::Deref for ResourcePool<P, R, E> {
    type Target = PoolClient<P, R>;

    fn deref(&self) -> &PoolClient<P, R> {
        &self.client
    }
}
