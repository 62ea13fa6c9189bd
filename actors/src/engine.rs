//! Wiring: builds one pool's actors under a supervisor and gives callers a [`PoolClient`].
//!
//! ```text
//! SupervisorActor
//! ├── MailboxActor      stores results, runs the retention cleaner, notifies
//! ├── QueueActor        parks and claims tasks in the queue backend; sends a started
//! │                     parked task to the worker the scheduler chose
//! ├── SchedulerActor    the parking-lot core; sole writer of capacity; assigns each started
//! │                     task to an idle worker
//! └── WorkerActor × n   each owns thread parking-lot-worker-{pool}-{i}, which consumes
//!                       job channel i
//! ```
//!
//! Each worker has its own job channel, created here: the scheduler and queue actors hold the
//! senders, worker `i`'s successive threads share receiver `i` (see [`crate::worker`]).
//!
//! Every facade of the public crate (`WorkerPool`, `ResourcePool`, the config builders) is a
//! `PoolClient` over this tree; there is no second engine.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorCell, ActorRef, SpawnErr};

use crate::domain::{MailboxKey, PoolError, PoolLimits, ScheduledTask, TaskId};
use crate::executor::TaskExecutor;
use crate::mailbox::actor::{MailboxActor, MailboxMsg, MailboxState};
use crate::mailbox::{Delivery, Mailbox, Notifier};
use crate::queue::actor::{QueueActor, QueueMsg, QueueState};
use crate::queue::TaskQueue;
use crate::scheduler::actor::{
    SchedulerActor, SchedulerArgs, SchedulerMsg, ShutdownReport, SubmitOptions,
};
use crate::spawn::Spawn;
use crate::stats::{PoolCounters, PoolStats};
use crate::supervisor::{
    ChildSpec, Escalate, RestartPolicy, StartChild, SupervisorActor, SupervisorMsg,
};
use crate::worker::actor::WorkerActor;
use crate::worker::thread::WorkerThreadSpec;
use crate::worker::{job_channels, WorkerSettings};

/// How long `shutdown` waits for each actor to drain its messages after the task drain.
const ACTOR_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything needed to start one pool.
pub struct PoolSpec<P, R, E> {
    /// The pool's name: thread names, logs, anonymous mailbox keys.
    pub name: String,
    /// Capacity, queue depth and starvation guard. `worker_slots` is set from `workers.count`.
    pub limits: PoolLimits,
    /// The worker threads.
    pub workers: WorkerSettings,
    /// Execution timeout for tasks that do not set their own.
    pub default_timeout: Option<Duration>,
    /// How often workers may be restarted before the pool escalates.
    pub restart: RestartPolicy,
    /// The user's work.
    pub executor: E,
    /// Where parked tasks are stored.
    pub queue: Box<dyn TaskQueue<P>>,
    /// Where results are stored.
    pub mailbox: Arc<dyn Mailbox<R>>,
    /// Who hears of terminal events.
    pub notifiers: Vec<Arc<dyn Notifier>>,
    /// How long results are kept; `None` keeps them until taken.
    pub retention: Option<Duration>,
}

impl<P, R, E> PoolSpec<P, R, E> {
    fn validate(&mut self) -> Result<(), PoolError> {
        if self.name.trim().is_empty() {
            return Err(PoolError::InvalidConfig(
                "pool name is empty; give the pool a name".into(),
            ));
        }
        if self.workers.count == 0 {
            return Err(PoolError::InvalidConfig(
                "worker_threads is 0; a pool needs at least 1 worker thread".into(),
            ));
        }
        if self.workers.stack_size.is_some_and(|size| size < 64 * 1024) {
            return Err(PoolError::InvalidConfig(
                "thread_stack_size is below 64 KiB; use at least 65536 bytes".into(),
            ));
        }
        if self.default_timeout == Some(Duration::ZERO) {
            return Err(PoolError::InvalidConfig(
                "default timeout is 0; use a positive timeout, or none".into(),
            ));
        }
        self.limits.worker_slots = self.workers.count;
        self.limits.validate()
    }
}

/// A handle to one running pool: submit, retrieve, cancel, stats, shutdown.
pub struct PoolClient<P, R> {
    inner: Arc<ClientInner<P, R>>,
}

impl<P, R> Clone for PoolClient<P, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct ClientInner<P, R> {
    name: Arc<str>,
    scheduler: ActorRef<SchedulerMsg<P, R>>,
    mailbox: Arc<dyn Mailbox<R>>,
    counters: Arc<PoolCounters>,
    supervisor: ActorRef<SupervisorMsg>,
    owns_supervisor: bool,
    runtime: tokio::runtime::Handle,
}

/// Spawns a supervisor on the current tokio runtime.
pub async fn spawn_supervisor() -> Result<ActorRef<SupervisorMsg>, PoolError> {
    Actor::spawn(None, SupervisorActor, ())
        .await
        .map(|(supervisor, _)| supervisor)
        .map_err(|error| PoolError::Internal(format!("could not start the supervisor: {error}")))
}

/// Starts a pool's actors under `supervisor` and returns its client.
///
/// Call it on the tokio runtime that should host the pool's actors.
pub async fn start_pool<P, R, E>(
    supervisor: &ActorRef<SupervisorMsg>,
    spec: PoolSpec<P, R, E>,
) -> Result<PoolClient<P, R>, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    start_pool_with(supervisor, spec, false).await
}

async fn start_pool_with<P, R, E>(
    supervisor: &ActorRef<SupervisorMsg>,
    mut spec: PoolSpec<P, R, E>,
    owns_supervisor: bool,
) -> Result<PoolClient<P, R>, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    spec.validate()?;
    let pool: Arc<str> = Arc::from(spec.name.as_str());
    let counters = Arc::new(PoolCounters::default());
    let (jobs, job_receivers) = job_channels(spec.workers.count);
    let scheduler_slot: Arc<OnceLock<ActorRef<SchedulerMsg<P, R>>>> = Arc::new(OnceLock::new());
    let escalate: Escalate = {
        let scheduler_slot = scheduler_slot.clone();
        Arc::new(move |reason| {
            if let Some(scheduler) = scheduler_slot.get() {
                let _ = scheduler.send_message(SchedulerMsg::Escalated { reason });
            }
        })
    };
    let child = |role: &str, start: StartChild, restartable: bool| ChildSpec {
        pool: pool.clone(),
        role: role.to_owned(),
        start,
        restartable,
        policy: spec.restart,
        restarts: Arc::new(Default::default()),
        escalate: escalate.clone(),
        lost: None,
    };

    let mailbox_state = MailboxState {
        pool: pool.clone(),
        mailbox: spec.mailbox.clone(),
        notifiers: spec.notifiers,
        retention: spec.retention,
    };
    let once = |role, start| supervise(supervisor, child(role, start, false));
    let mailbox: ActorRef<MailboxMsg<R>> = once(
        "mailbox",
        start_once(MailboxActor::<R>::default, mailbox_state),
    )
    .await?
    .into();

    let queue_durable = spec.queue.is_durable();
    let queue_state = QueueState {
        queue: spec.queue,
        jobs: jobs.clone(),
        scheduler: scheduler_slot.clone(),
    };
    let queue: ActorRef<QueueMsg<P>> = once(
        "queue",
        start_once(QueueActor::<P, R>::default, queue_state),
    )
    .await?
    .into();

    let scheduler_args = SchedulerArgs {
        pool: pool.clone(),
        limits: spec.limits,
        default_timeout: spec.default_timeout,
        jobs,
        queue,
        queue_durable,
        mailbox,
        counters: counters.clone(),
    };
    let scheduler: ActorRef<SchedulerMsg<P, R>> = once(
        "scheduler",
        start_once(SchedulerActor::<P, R>::default, scheduler_args),
    )
    .await?
    .into();
    let _ = scheduler_slot.set(scheduler.clone());

    let executor = Arc::new(spec.executor);
    for (index, jobs) in job_receivers.into_iter().enumerate() {
        let thread = WorkerThreadSpec {
            pool: pool.clone(),
            index,
            settings: spec.workers.clone(),
            jobs,
            executor: executor.clone(),
            scheduler: scheduler.clone(),
            counters: counters.clone(),
        };
        let start: StartChild = Arc::new(move |parent: ActorCell| {
            let thread = thread.clone();
            Box::pin(async move {
                Actor::spawn_linked(None, WorkerActor::<P, R, E>::default(), thread, parent)
                    .await
                    .map(|(worker, _)| worker.get_cell())
            })
        });
        let mut worker = child(&format!("worker-{index}"), start, true);
        worker.restarts = counters.worker_restarts.clone();
        let scheduler = scheduler.clone();
        worker.lost = Some(Arc::new(move |reason| {
            let _ = scheduler.send_message(SchedulerMsg::WorkerLost {
                worker: index,
                reason,
            });
        }));
        supervise(supervisor, worker).await?;
    }

    Ok(PoolClient {
        inner: Arc::new(ClientInner {
            name: pool,
            scheduler,
            mailbox: spec.mailbox,
            counters,
            supervisor: supervisor.clone(),
            owns_supervisor,
            runtime: tokio::runtime::Handle::current(),
        }),
    })
}

/// A start function for a child that is started once (not restartable): its arguments are
/// moved in on the first call; a second call reports that it cannot restart.
fn start_once<A>(make: fn() -> A, args: A::Arguments) -> StartChild
where
    A: Actor,
    A::Arguments: Send,
{
    let args = Arc::new(Mutex::new(Some(args)));
    Arc::new(move |parent: ActorCell| {
        let args = args.lock().ok().and_then(|mut slot| slot.take());
        Box::pin(async move {
            let args = args
                .ok_or_else(|| SpawnErr::StartupFailed("this actor cannot be restarted".into()))?;
            Actor::spawn_linked(None, make(), args, parent)
                .await
                .map(|(actor, _)| actor.get_cell())
        }) as Pin<Box<dyn Future<Output = _> + Send>>
    })
}

async fn supervise(
    supervisor: &ActorRef<SupervisorMsg>,
    spec: ChildSpec,
) -> Result<ActorCell, PoolError> {
    let role = spec.role.clone();
    match supervisor
        .call(|reply| SupervisorMsg::Spawn { spec, reply }, None)
        .await
    {
        Ok(CallResult::Success(Ok(cell))) => Ok(cell),
        Ok(CallResult::Success(Err(error))) => Err(PoolError::Internal(error)),
        _ => Err(PoolError::Internal(format!(
            "the supervisor is gone; could not start {role}"
        ))),
    }
}

impl<P, R> PoolClient<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The scheduler actor, for callers that speak the actor protocol directly.
    pub fn scheduler(&self) -> &ActorRef<SchedulerMsg<P, R>> {
        &self.inner.scheduler
    }

    /// The supervisor the pool runs under.
    pub fn supervisor(&self) -> &ActorRef<SupervisorMsg> {
        &self.inner.supervisor
    }

    /// Admits a task; returns the mailbox key its result will be stored under.
    pub async fn submit(
        &self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
    ) -> Result<MailboxKey, PoolError> {
        let answer = self
            .inner
            .scheduler
            .call(
                |reply| SchedulerMsg::Submit {
                    task,
                    options,
                    reply,
                },
                None,
            )
            .await;
        match answer {
            Ok(CallResult::Success(admitted)) => admitted,
            _ => Err(PoolError::Shutdown),
        }
    }

    /// Waits up to `timeout` for the oldest result under `key` and takes it.
    ///
    /// Cancel-safe: if the returned future is dropped, no result is lost; it stays stored for
    /// the next retrieve. A timeout (`PoolError::Timeout`) consumes nothing either. A task
    /// that ended without a result (panic, timeout, cancel, expiry, shutdown) gives the
    /// `PoolError` variant that says which. Needs a tokio runtime with time enabled.
    pub async fn retrieve(&self, key: &MailboxKey, timeout: Duration) -> Result<R, PoolError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let stored = self.inner.mailbox.subscribe(key);
        loop {
            let notified = stored.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(delivery) = self.try_take(key).await? {
                return delivery.outcome;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(PoolError::Timeout);
            }
        }
    }

    /// Takes the oldest result under `key` without waiting: `ResultNotFound` if none.
    pub async fn try_retrieve(&self, key: &MailboxKey) -> Result<R, PoolError> {
        match self.try_take(key).await? {
            Some(delivery) => delivery.outcome,
            None => Err(PoolError::ResultNotFound),
        }
    }

    async fn try_take(&self, key: &MailboxKey) -> Result<Option<Delivery<R>>, PoolError> {
        self.inner.mailbox.take(key).await.map_err(|error| {
            PoolError::Internal(format!("{} mailbox: {error}", self.inner.mailbox.backend()))
        })
    }

    /// Cancels a live task: a parked one ends at once; a running one has its future dropped
    /// (its capacity is released when its thread returns). Both end `Cancelled`.
    pub async fn cancel(&self, id: TaskId) -> Result<(), PoolError> {
        match self
            .inner
            .scheduler
            .call(|reply| SchedulerMsg::Cancel { id, reply }, None)
            .await
        {
            Ok(CallResult::Success(result)) => result,
            _ => Err(PoolError::Shutdown),
        }
    }

    /// Runs `work` on the pool's runtime and blocks the calling thread until it is done: the
    /// way synchronous callers use the async API. It never needs the caller's runtime, so it
    /// works from plain threads and from `spawn_blocking`; called on an async runtime thread
    /// it blocks that thread, so async code should await the async methods instead.
    pub fn block_on<T, F>(&self, work: F) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        self.inner.runtime.spawn(async move {
            let _ = done.send(work.await);
        });
        wait.recv().map_err(|_| PoolError::Shutdown)
    }

    /// A guard that starts `shutdown(drain)` on the pool's runtime when dropped, unless
    /// disarmed first: how the facades shut a dropped pool down without waiting.
    pub fn shutdown_on_drop(&self, drain: Duration) -> ShutdownOnDrop {
        let client = self.clone();
        let runtime = self.inner.runtime.clone();
        ShutdownOnDrop(Mutex::new(Some(Box::new(move || {
            runtime.spawn(async move {
                let _ = client.shutdown(drain).await;
            });
        }))))
    }

    /// A snapshot of the pool's counters, read without a message round trip.
    pub fn stats(&self) -> PoolStats {
        self.inner.counters.snapshot()
    }

    /// Stops admitting, lets running tasks finish for up to `drain`, then stops the pool's
    /// actors. Parked tasks of an in-memory queue end `Cancelled`; a durable queue keeps them.
    /// Running tasks still running at the deadline are cancelled and end `Cancelled`. Never
    /// waits much longer than `drain`.
    pub async fn shutdown(&self, drain: Duration) -> Result<ShutdownReport, PoolError> {
        let report = match self
            .inner
            .scheduler
            .call(
                |reply| SchedulerMsg::Shutdown { drain, reply },
                Some(drain + ACTOR_DRAIN_TIMEOUT),
            )
            .await
        {
            Ok(CallResult::Success(report)) => report,
            _ => return Err(PoolError::Shutdown),
        };
        let children = match self
            .inner
            .supervisor
            .call(
                |reply| SupervisorMsg::ReleasePool {
                    pool: self.inner.name.clone(),
                    reply,
                },
                Some(ACTOR_DRAIN_TIMEOUT),
            )
            .await
        {
            Ok(CallResult::Success(children)) => children,
            _ => Vec::new(),
        };
        let _ = self
            .inner
            .scheduler
            .drain_and_wait(Some(ACTOR_DRAIN_TIMEOUT))
            .await;
        for child in &children {
            let _ = child.drain_and_wait(Some(ACTOR_DRAIN_TIMEOUT)).await;
        }
        if self.inner.owns_supervisor {
            let _ = self
                .inner
                .supervisor
                .stop_and_wait(None, Some(ACTOR_DRAIN_TIMEOUT))
                .await;
        }
        Ok(report)
    }
}

/// Shuts a pool down in the background when dropped. See [`PoolClient::shutdown_on_drop`].
pub struct ShutdownOnDrop(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl ShutdownOnDrop {
    /// Drops the guard's action: the pool was shut down explicitly.
    pub fn disarm(&self) {
        if let Ok(mut action) = self.0.lock() {
            action.take();
        }
    }
}

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        let action = self.0.get_mut().ok().and_then(Option::take);
        if let Some(action) = action {
            action();
        }
    }
}

/// Starts a pool with its own supervisor on `spawner`'s runtime and waits until it is up.
///
/// For synchronous constructors (`WorkerPool::new`). The returned client shuts its
/// supervisor down with the pool. The spawner's runtime stays alive until the supervisor
/// has stopped.
pub fn start_pool_blocking<P, R, E>(
    spawner: &dyn Spawn,
    spec: PoolSpec<P, R, E>,
) -> Result<PoolClient<P, R>, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    let (started, wait) = std::sync::mpsc::sync_channel(1);
    spawner.spawn(Box::pin(async move {
        let supervisor = match Actor::spawn(None, SupervisorActor, ()).await {
            Ok(supervisor) => supervisor,
            Err(error) => {
                let _ = started.send(Err(PoolError::Internal(format!(
                    "could not start the supervisor: {error}"
                ))));
                return;
            }
        };
        let (supervisor, running) = supervisor;
        let client = start_pool_with(&supervisor, spec, true).await;
        if client.is_err() {
            supervisor.stop(None);
        }
        let _ = started.send(client);
        let _ = running.await;
    }))?;
    wait.recv_timeout(Duration::from_secs(30)).map_err(|_| {
        PoolError::Internal(
            "the pool's actor runtime did not start within 30 s; is the spawner polling its futures?"
                .into(),
        )
    })?
}
