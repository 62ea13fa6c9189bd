//! [`WorkerPool`]: dedicated worker threads behind a parking-lot scheduler, with an
//! in-memory queue and mailbox.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use prometheus_parking_lot_actors::engine::{PoolClient, ShutdownOnDrop};
use prometheus_parking_lot_actors::running::stream::ResultStream;
use prometheus_parking_lot_actors::scheduler::protocol::{ShutdownReport, SubmitOptions};

use crate::config::WorkerPoolConfig;
use crate::infra::mailbox::memory::InMemoryMailbox;
use crate::infra::queue::memory::InMemoryQueue;
use crate::runtime::tokio_spawner::TokioSpawner;
use crate::util::serde::MailboxKey;
use crate::TaskExecutor;
use prometheus_parking_lot_actors::domain::{PoolError, ScheduledTask, TaskMetadata};

/// The work a [`WorkerPool`] runs, one call per task, on a dedicated worker thread.
///
/// ```
/// use prometheus_parking_lot::core::{TaskMetadata, WorkerExecutor};
///
/// #[derive(Clone)]
/// struct Upper;
///
/// #[async_trait::async_trait]
/// impl WorkerExecutor<String, String> for Upper {
///     async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
///         payload.to_uppercase()
///     }
/// }
/// ```
#[async_trait]
pub trait WorkerExecutor<P, R>: Send + Sync + Clone + 'static {
    /// Runs one task. It runs inside the worker thread's own tokio runtime, which keeps
    /// running between tasks: work spawned here may outlive the call.
    async fn execute(&self, payload: P, meta: TaskMetadata) -> R;
}

/// Adapts a [`WorkerExecutor`] to the engine's executor trait.
struct Worker<E>(E);

#[async_trait]
impl<P, R, E> TaskExecutor<P, R> for Worker<E>
where
    P: Send + 'static,
    R: Send + 'static,
    E: WorkerExecutor<P, R>,
{
    async fn execute(&self, payload: P, meta: TaskMetadata) -> R {
        self.0.execute(payload, meta).await
    }
}

/// A pool of dedicated worker threads that runs tasks when their cost fits and parks them
/// otherwise.
///
/// Results wait in an in-memory mailbox under the key `submit` returns; they may be anything
/// `Send`, including channel receivers. Dropping the pool shuts it down in the background,
/// letting running tasks finish for `drain_on_drop`.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot::config::WorkerPoolConfig;
/// use prometheus_parking_lot::core::{TaskMetadata, WorkerExecutor, WorkerPool};
/// use prometheus_parking_lot::util::serde::ResourceCost;
///
/// #[derive(Clone)]
/// struct Double;
///
/// #[async_trait::async_trait]
/// impl WorkerExecutor<u64, u64> for Double {
///     async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
///         payload * 2
///     }
/// }
///
/// let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(2).with_max_units(8), Double)?;
/// let key = pool.submit(21, TaskMetadata::new(1, ResourceCost::cpu(1)))?;
/// assert_eq!(pool.retrieve(&key, Duration::from_secs(5))?, 42);
/// # Ok::<(), prometheus_parking_lot::core::PoolError>(())
/// ```
pub struct WorkerPool<P, R, E> {
    client: PoolClient<P, R>,
    stop_on_drop: ShutdownOnDrop,
    /// How long `shutdown()` and a drop let running tasks finish.
    drain: Duration,
    executor: PhantomData<fn() -> E>,
}

impl<P, R, E> WorkerPool<P, R, E>
where
    P: Send + 'static,
    R: Send + 'static,
    E: WorkerExecutor<P, R>,
{
    /// Starts the pool: its worker threads, its scheduler and its actor runtime.
    pub fn new(config: WorkerPoolConfig, executor: E) -> Result<Self, PoolError> {
        let client = super::start(
            &config,
            Worker(executor),
            super::Backends::local(
                Box::new(InMemoryQueue::new()),
                Arc::new(InMemoryMailbox::new().with_max_messages(config.max_messages)),
            ),
            &TokioSpawner,
        )?;
        Ok(Self {
            stop_on_drop: client.shutdown_on_drop(config.drain_on_drop),
            client,
            drain: config.drain_on_drop,
            executor: PhantomData,
        })
    }

    /// Submits a task; returns the key its result will be stored under (the metadata's
    /// mailbox, or a fresh unique key). It starts at once when its cost fits the free units
    /// and a worker is free, and is parked otherwise; it is refused (`QueueFull`,
    /// `InsufficientResources`, `DuplicateTask`, `Shutdown`...) only when it could not be
    /// parked either.
    pub async fn submit_async(
        &self,
        payload: P,
        meta: TaskMetadata,
    ) -> Result<MailboxKey, PoolError> {
        self.submit_with(payload, meta, SubmitOptions::default())
            .await
    }

    /// Submits a task with per-task options: an execution timeout of its own, or a
    /// scheduled start (`SubmitOptions::with_delay`, `with_not_before`: admitted now, it
    /// sleeps until then; see `PARKING_LOT.md`, "Scheduled starts").
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use prometheus_parking_lot::{PoolError, ResourceCost, TaskMetadata, WorkerPool, WorkerPoolConfig};
    /// # use prometheus_parking_lot::core::WorkerExecutor;
    /// use prometheus_parking_lot::core::SubmitOptions;
    /// # #[derive(Clone)]
    /// # struct Sleep;
    /// # #[async_trait::async_trait]
    /// # impl WorkerExecutor<u64, u64> for Sleep {
    /// #     async fn execute(&self, ms: u64, _meta: TaskMetadata) -> u64 {
    /// #         tokio::time::sleep(Duration::from_millis(ms)).await;
    /// #         ms
    /// #     }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), PoolError> {
    /// # let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(1), Sleep)?;
    ///
    /// let options = SubmitOptions {
    ///     timeout: Some(Duration::from_millis(50)),
    ///     ..SubmitOptions::default()
    /// };
    /// let key = pool.submit_with(60_000, TaskMetadata::new(1, ResourceCost::cpu(1)), options).await?;
    /// assert_eq!(pool.retrieve_async(&key, Duration::from_secs(5)).await, Err(PoolError::TimedOut));
    ///
    /// // Not before 20 ms from now: it sleeps until then, then runs.
    /// let later = SubmitOptions::default().with_delay(Duration::from_millis(20));
    /// let key = pool.submit_with(0, TaskMetadata::new(2, ResourceCost::cpu(1)), later).await?;
    /// assert_eq!(pool.retrieve_async(&key, Duration::from_secs(5)).await, Ok(0));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn submit_with(
        &self,
        payload: P,
        meta: TaskMetadata,
        options: SubmitOptions,
    ) -> Result<MailboxKey, PoolError> {
        self.client
            .submit(ScheduledTask { meta, payload }, options)
            .await
    }

    /// Submits many tasks at once: one trip to the scheduler for the whole batch, one
    /// answer per task, in order. For bulk producers; `submit_async` answers each task alone.
    pub async fn submit_batch(
        &self,
        tasks: impl IntoIterator<Item = (P, TaskMetadata)>,
    ) -> Vec<Result<MailboxKey, PoolError>> {
        let tasks = tasks
            .into_iter()
            .map(|(payload, meta)| ScheduledTask { meta, payload })
            .collect();
        self.client
            .submit_batch(tasks, SubmitOptions::default())
            .await
    }

    /// Submits a task whose executor streams partial results (tokens, say): the stream
    /// yields each partial the executor sends through
    /// [`running::partials`](crate::running::partials), then the final value or the error
    /// that ended the task. At most `buffer` partials wait unread; then the executor's sends
    /// wait (back-pressure). The task holds its capacity until its executor returns;
    /// dropping the stream before its end cancels it and frees its capacity. See
    /// [`crate::stream`].
    pub async fn submit_streaming(
        &self,
        payload: P,
        meta: TaskMetadata,
        buffer: usize,
    ) -> Result<ResultStream<R>, PoolError> {
        self.client
            .submit_streaming(
                ScheduledTask { meta, payload },
                SubmitOptions::default(),
                buffer,
            )
            .await
    }

    /// Like [`submit_streaming`](Self::submit_streaming), from synchronous code: blocks until
    /// the task is admitted; read the stream with
    /// [`ResultStream::into_blocking_iter`].
    pub fn submit_streaming_blocking(
        &self,
        payload: P,
        meta: TaskMetadata,
        buffer: usize,
    ) -> Result<ResultStream<R>, PoolError> {
        self.client.submit_streaming_blocking(
            ScheduledTask { meta, payload },
            SubmitOptions::default(),
            buffer,
        )
    }

    /// Submits a task from synchronous code: blocks the calling thread (no runtime needed)
    /// until it is admitted or refused.
    pub fn submit(&self, payload: P, meta: TaskMetadata) -> Result<MailboxKey, PoolError> {
        self.client
            .submit_blocking(ScheduledTask { meta, payload }, SubmitOptions::default())
    }

    /// Waits up to `timeout` (`Duration::MAX`: for ever) for the result under `key` and takes
    /// it, blocking the calling thread; use it from synchronous code or `spawn_blocking`. It
    /// needs no runtime and keeps working after shutdown, like `retrieve_async`.
    ///
    /// The result is removed from the mailbox: the next retrieve of the key gets the next
    /// result or waits. A task that ended without a result gives the error that says how
    /// (`Failed`, `TimedOut`, `Cancelled`, `Expired`). A retrieve that gives up returns
    /// `Timeout` and takes nothing. Unless the pool keeps such tasks
    /// ([`with_on_give_up`](WorkerPoolConfig::with_on_give_up)), a task submitted without a
    /// mailbox key is then abandoned, as nobody else can collect its result: parked, it never
    /// starts; running, its result is dropped (a channel in it closes). A task under a key you
    /// named carries on, and a later retrieve gets its result. A key that will never get a
    /// result (one the pool never gave out, a result taken already) is `NothingToRetrieve`,
    /// at once.
    pub fn retrieve(&self, key: &MailboxKey, timeout: Duration) -> Result<R, PoolError> {
        self.client.retrieve_blocking(key, None, timeout)
    }

    /// [`submit`](Self::submit) by the crate's naming rule (`…_blocking` blocks): the same
    /// call, for code that reads the same on every pool face.
    pub fn submit_blocking(&self, payload: P, meta: TaskMetadata) -> Result<MailboxKey, PoolError> {
        self.submit(payload, meta)
    }

    /// [`retrieve`](Self::retrieve) by the crate's naming rule (`…_blocking` blocks): the
    /// same call.
    pub fn retrieve_blocking(&self, key: &MailboxKey, timeout: Duration) -> Result<R, PoolError> {
        self.retrieve(key, timeout)
    }

    /// Waits up to `timeout` for the result under `key` and takes it, as
    /// [`retrieve`](Self::retrieve) does, with the same answer to a timeout. Cancel-safe:
    /// dropping the future loses no result and abandons nothing. It ties up no thread while
    /// waiting.
    pub async fn retrieve_async(
        &self,
        key: &MailboxKey,
        timeout: Duration,
    ) -> Result<R, PoolError> {
        self.client.retrieve(key, timeout).await
    }

    /// Shuts the pool down and blocks the calling thread until it has stopped: admission
    /// closes at once (later submits fail with [`PoolError::Shutdown`], which code written
    /// for the upstream crate matches as `PoolError::PoolShutdown`), running tasks get the
    /// pool's `drain_on_drop` (30 s by default) to finish, then the rest end `Cancelled`, as
    /// do parked ones. Stored results stay retrievable.
    ///
    /// Safe from a plain thread and at the end of a `#[tokio::test]` body (a current-thread
    /// runtime): the drain runs on a thread of its own. Calling it again, or after
    /// [`shutdown_with_drain`](Self::shutdown_with_drain), does nothing more. Do not call it
    /// from the pool's own executor: the drain would wait for the very task that waits for it,
    /// until `drain_on_drop` ends it.
    ///
    /// ```
    /// use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
    /// use prometheus_parking_lot::{ResourceCost, WorkerPoolConfig};
    ///
    /// #[derive(Clone)]
    /// struct Echo;
    ///
    /// #[async_trait::async_trait]
    /// impl WorkerExecutor<u32, u32> for Echo {
    ///     async fn execute(&self, payload: u32, _meta: TaskMetadata) -> u32 {
    ///         payload
    ///     }
    /// }
    ///
    /// let pool = WorkerPool::new(WorkerPoolConfig::new().with_worker_count(1), Echo)?;
    /// pool.shutdown();
    /// let refused = pool.submit(1, TaskMetadata::new(1, ResourceCost::cpu(1)));
    /// assert!(matches!(refused, Err(PoolError::PoolShutdown)));
    /// pool.shutdown(); // harmless
    /// # Ok::<(), PoolError>(())
    /// ```
    pub fn shutdown(&self) {
        self.stop_on_drop.disarm();
        if let Err(error) = super::shut_down_blocking(&self.client, self.drain) {
            tracing::error!(pool = self.client.name(), %error, "the pool's shutdown failed");
        }
    }

    /// Shuts the pool down and waits for it asynchronously: stops admitting, lets running
    /// tasks finish for up to `drain` (`Duration::MAX`: for ever), cancels the rest, and
    /// reports what it did. Every caller, concurrent or later, gets the same report.
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

/// Every operation the pool does not shape for the inference-server API is its client's
/// (and its client's [`PoolControl`](prometheus_parking_lot_actors::engine::PoolControl)'s): `pool.cancel(..)`,
/// `pool.retrieve_task(..)`, `pool.stats()`, `pool.pause()`, `pool.why_waiting(..)`,
/// `pool.events()`, `pool.inspect(..)`, `pool.preempt_tasks()`...
impl<P, R, E> std::ops::Deref for WorkerPool<P, R, E> {
    type Target = PoolClient<P, R>;

    fn deref(&self) -> &PoolClient<P, R> {
        &self.client
    }
}
