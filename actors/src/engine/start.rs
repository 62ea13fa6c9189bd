//! Starting a pool: checking its spec, loading what a durable queue kept, and spawning its
//! actors under a supervisor.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorCell, ActorRef, SpawnErr};

use super::client::{ClientParts, PoolClient};
use crate::domain::{
    BackendError, Budgets, Durability, OnDuplicate, PoolError, PoolLimits, QueueOrder,
    TenantWeights,
};
use crate::mailbox::actor::{MailboxActor, MailboxMsg, MailboxState};
use crate::mailbox::notify::Notifiers;
use crate::mailbox::watch::ResultWatch;
use crate::mailbox::{Mailbox, Notifier, ResultEncoder};
use crate::observe::events::{EventFeed, EventSubscriber};
use crate::observe::stats::PoolCounters;
use crate::observe::trace::TaskTracer;
use crate::permit::lane::Lanes;
use crate::queue::actor::{fault_of, QueueActor, QueueMsg, QueueReports, QueueState};
use crate::queue::capabilities::lacking;
use crate::queue::{QueueError, StoredEntry, TaskQueue, QUEUED_UNITS_SUPPORTED};
use crate::scheduler::actor::{SchedulerActor, SchedulerStart};
use crate::scheduler::core::ParkingLot;
use crate::scheduler::driver::{Driver, Results};
use crate::scheduler::gpu_watch::GpuWatch;
use crate::scheduler::inbox::Inbox;
use crate::scheduler::protocol::{Internal, SchedulerMsg};
use crate::scheduler::shell::storage::shared::{SharedIo, SharedParking};
use crate::scheduler::shell::storage::{LocalRoom, MemoryRoom, SharedRoom, Storage};
use crate::scheduler::shell::{Rerun, ShellArgs};
use crate::supervisor::spawn::Spawn;
use crate::supervisor::{
    ChildSpec, Escalate, RestartPolicy, StartChild, SupervisorActor, SupervisorMsg,
};
use crate::sync::slots::SlotBudget;
use crate::worker::actor::WorkerActor;
use crate::worker::executor::TaskExecutor;
use crate::worker::thread::WorkerThreadSpec;
use crate::worker::{job_channels, WorkerSettings};

/// How long a synchronous constructor waits for the pool's runtime to bring the tree up.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything needed to start one pool.
pub struct PoolSpec<P, R, E> {
    /// The pool's name: thread names and logs.
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
    /// Where parked tasks are stored. A durable queue is driven through the queue actor;
    /// a queue that is not durable is not called at all (tasks parked in it before the pool
    /// starts are taken over): the scheduler keeps parked tasks in its own ledger, which
    /// costs far less memory per task than a second map of them.
    pub queue: Box<dyn TaskQueue<P>>,
    /// Where results are stored.
    pub mailbox: Arc<dyn Mailbox<R>>,
    /// Who hears of terminal events once their result is stored; the pool's shutdown
    /// flushes them up to its drain deadline.
    pub notifiers: Vec<Arc<dyn Notifier>>,
    /// How a completed task's result becomes the `result` of its [`TerminalEvent`]
    /// (`None`: events carry no result). Called only when the pool has notifiers.
    ///
    /// [`TerminalEvent`]: crate::mailbox::TerminalEvent
    pub result_encoder: Option<ResultEncoder<R>>,
    /// Who hears every event of every task (metrics, audit), on the scheduler's thread.
    pub subscribers: Vec<Arc<dyn EventSubscriber>>,
    /// How long results are kept; `None` keeps them until taken.
    pub retention: Option<Duration>,
    /// A queue this pool shares with other nodes, if any: tasks that would park here go
    /// there, and the pool claims from it whenever it has room (see
    /// [`SharedParking`]). `queue` is then not used.
    pub shared: Option<SharedParking<P>>,
    /// What a durable queue (local or shared) stores, and so what a crash costs.
    pub durability: Durability,
    /// The weights of named tenants under a fair share by use (`limits.fair_by_use`); the
    /// others weigh its `default_weight`. Empty without one.
    pub tenant_weights: TenantWeights,
    /// Who makes each submission's span and so puts its tasks in a trace (the root crate's
    /// `otel` feature); `None`: tasks carry only the `traceparent` a submitter gives.
    pub tracer: Option<Arc<dyn TaskTracer>>,
    /// The GPU the pool's `GpuVram` units (MiB) live on, if any: sampled for stats and,
    /// with its live guard on, for admission (see
    /// [`GpuWatch`]).
    pub gpu: Option<GpuWatch>,
}

impl<P, R, E> PoolSpec<P, R, E> {
    /// Checks the spec and builds its core; `gate`: a pool that only grants permits, with no
    /// worker threads (`workers.count` is ignored).
    fn validate(&mut self, gate: bool) -> Result<ParkingLot, PoolError> {
        if gate {
            self.workers.count = 0;
        }
        if self.name.trim().is_empty() {
            return Err(PoolError::InvalidConfig(
                "pool name is empty; give the pool a name".into(),
            ));
        }
        if self.name.contains('\0') {
            return Err(PoolError::InvalidConfig(
                "pool name contains a NUL character; thread names cannot hold one".into(),
            ));
        }
        if self.workers.count == 0 && self.shared.is_none() && !gate {
            return Err(PoolError::InvalidConfig(
                "worker_threads is 0; a pool needs at least 1 worker thread (only a node of a \
                 shared queue, such as postgres, may run none: a producer-only node)"
                    .into(),
            ));
        }
        if let Some(size) = self.workers.stack_size {
            if !(WorkerSettings::MIN_STACK..=WorkerSettings::MAX_STACK).contains(&size) {
                return Err(PoolError::InvalidConfig(format!(
                    "thread_stack_size is {size} bytes; use {} to {} bytes",
                    WorkerSettings::MIN_STACK,
                    WorkerSettings::MAX_STACK
                )));
            }
        }
        if self.default_timeout == Some(Duration::ZERO) {
            return Err(PoolError::InvalidConfig(
                "default timeout is 0; use a positive timeout, or none".into(),
            ));
        }
        self.limits.worker_slots = self.workers.count;
        if let Some(shared) = &self.shared {
            shared.validate()?;
            if self.limits.admission.refuse_if_late {
                // A submission that cannot start parks in the shared queue, behind the whole
                // fleet's backlog: this node's estimate sees only its own claims.
                return Err(PoolError::InvalidConfig(
                    "refuse_if_late is on; a task that waits in a shared queue waits behind \
                     every node's backlog, which no node's start estimate sees: turn \
                     refuse_if_late off, or use a local queue (in_memory, yaque)"
                        .into(),
                ));
            }
            if let Durability::Parked { spin } = self.durability {
                if !spin.is_zero() {
                    return Err(PoolError::InvalidConfig(format!(
                        "spin_ms is {}; a shared queue parks a task at once (the spin applies \
                         to local durable queues): set spin_ms to 0 or remove it",
                        spin.as_millis()
                    )));
                }
            }
        }
        if let Some(gpu) = &self.gpu {
            gpu.validate()?;
        }
        self.tenant_weights.validate()?;
        if self.limits.fair_by_use.is_none() && !self.tenant_weights.is_empty() {
            return Err(PoolError::InvalidConfig(
                "fair_share.by_use.weights names tenants, but the pool orders tenants by use \
                 only with fair_share.by_use set: set it, or leave the weights out"
                    .into(),
            ));
        }
        if self.workers.count == 0 {
            return ParkingLot::without_workers(self.limits);
        }
        ParkingLot::new(self.limits)
    }
}

/// Gives a shared queue the pool's budgets, which it keeps for every node (see
/// [`SharedBudgets`](crate::queue::SharedBudgets)); a queue that cannot is a configuration
/// the pool refuses.
async fn share_budgets<P: Send + 'static>(
    parking: &SharedParking<P>,
    budgets: &Budgets,
    pool: &str,
) -> Result<(), PoolError> {
    if budgets.is_empty() {
        return Ok(());
    }
    let shared = match parking.queue.budgets() {
        Some(shared) => shared.share_budgets(budgets).await,
        None => Err(lacking(
            &*parking.queue,
            "keep budgets for the nodes that share it",
        )),
    };
    shared.map_err(|error| {
        queue_error(
            pool,
            parking.queue.backend(),
            "share the pool's budgets",
            error,
        )
    })
}

/// The error of `operation` on `pool`'s queue of `backend`, which failed with `error`.
fn queue_error(pool: &str, backend: &str, operation: &str, error: QueueError) -> PoolError {
    let queue = format!("{backend} queue");
    PoolError::from(BackendError::new(pool, queue, operation, fault_of(error)))
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
    start_pool_with(supervisor, spec, Ownership::Shared).await
}

/// Who owns the supervisor a pool is started under, and what the pool is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ownership {
    /// The caller's supervisor.
    Shared,
    /// The pool's own: its shutdown stops it.
    Own,
    /// The pool's own, for a pool that only grants permits (no worker threads).
    OwnGate,
}

/// Refuses a shared queue that claims in another order than the pool's: the nodes claim
/// from the queue in its own order, which it keeps in its index, and a node's core only sees
/// what it claimed, so it could not rank the rest in an order of its own.
fn claims_in_order<P: Send + 'static>(
    parking: &SharedParking<P>,
    order: QueueOrder,
) -> Result<(), PoolError> {
    let claims_in = parking.queue.order();
    if order == claims_in {
        return Ok(());
    }
    Err(PoolError::InvalidConfig(format!(
        "order is \"{}\" but the {} queue claims in the \"{}\" order; open the shared queue \
         in the pool's order (a Postgres table queue claims in either: \
         PostgresQueue::open_in_order), or give the pool the queue's order",
        order.name(),
        parking.queue.backend(),
        claims_in.name()
    )))
}

async fn start_pool_with<P, R, E>(
    supervisor: &ActorRef<SupervisorMsg>,
    mut spec: PoolSpec<P, R, E>,
    ownership: Ownership,
) -> Result<PoolClient<P, R>, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    let core = spec.validate(ownership == Ownership::OwnGate)?;
    if let Some(parking) = &spec.shared {
        claims_in_order(parking, core.limits().order)?;
        share_budgets(parking, &core.limits().budgets, &spec.name).await?;
        if let Some(order) = core.limits().fair_by_use {
            match parking.queue.fair_share() {
                Some(fair_share) => {
                    let timeout_ms = spec
                        .default_timeout
                        .map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
                    let shared = fair_share
                        .share_fair_by_use(order, &spec.tenant_weights, timeout_ms)
                        .await;
                    shared.map_err(|error| {
                        let operation = "share the tenant counters of its fair share by use";
                        queue_error(&spec.name, parking.queue.backend(), operation, error)
                    })?;
                }
                None => {
                    tracing::info!(pool = %spec.name, backend = parking.queue.backend(), "the shared queue claims in rank order: the fair share by use orders this node's own tasks only");
                }
            }
        }
        if let Some(units) = core.limits().max_queued_units {
            // What waits is in the shared queue: the queue keeps the bound for every node.
            let Some(queued) = parking.queue.queued_units() else {
                return Err(PoolError::InvalidConfig(format!(
                    "max_queued_units is {units}; the {} queue keeps no bound on the units \
                     parked for every node: leave max_queued_units out, or use a queue that \
                     keeps one: {QUEUED_UNITS_SUPPORTED}",
                    parking.queue.backend()
                )));
            };
            let operation = "bound the units parked for every node (max_queued_units)";
            queued.bound_queued_units(units).await.map_err(|error| {
                queue_error(&spec.name, parking.queue.backend(), operation, error)
            })?;
        }
        if core.limits().on_duplicate == OnDuplicate::Attach {
            let operation = "keep callers unique across nodes (the pool attaches repeated \
                             submissions)";
            let kept = match parking.queue.unique_callers() {
                Some(callers) => callers.keep_callers_unique().await,
                None => Err(lacking(
                    &*parking.queue,
                    "keep callers unique across the nodes that share it",
                )),
            };
            kept.map_err(|error| {
                queue_error(&spec.name, parking.queue.backend(), operation, error)
            })?;
        }
    }
    let owns_supervisor = ownership != Ownership::Shared;
    let pool: Arc<str> = Arc::from(spec.name.as_str());
    let counters = Arc::new(PoolCounters::default());
    let lanes = Arc::new(Lanes::new());
    counters.attach_lanes(lanes.clone());
    let inbox = Arc::new(Inbox::<P, R>::new(lanes.clone()));
    let nested = SlotBudget::new(spec.workers.count.saturating_sub(1));
    let (jobs, job_receivers) = job_channels(spec.workers.count);
    let scheduler_slot: Arc<OnceLock<ActorRef<SchedulerMsg<P>>>> = Arc::new(OnceLock::new());
    let escalate: Escalate = {
        let scheduler_slot = scheduler_slot.clone();
        Arc::new(move |reason| {
            if let Some(scheduler) = scheduler_slot.get() {
                let _ = scheduler.send_message(SchedulerMsg(Internal::Escalated { reason }));
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
    let once = |role, start| supervise(supervisor, child(role, start, false));

    let inline_results = spec.mailbox.inline().is_some();
    let notifiers = || Notifiers::new(spec.notifiers.clone(), spec.result_encoder);
    let mailbox_state = MailboxState {
        pool: pool.clone(),
        mailbox: spec.mailbox.clone(),
        notifiers: if inline_results {
            Notifiers::none()
        } else {
            notifiers()
        },
        retention: spec.retention,
        counters: counters.clone(),
    };
    let mailbox_actor: ActorRef<MailboxMsg<R>> = once(
        "mailbox",
        start_once(MailboxActor::<R>::default, mailbox_state),
    )
    .await?
    .into();
    let results_watch = (!inline_results).then(ResultWatch::new);
    let results = match &results_watch {
        None => Results::Inline {
            mailbox: spec.mailbox.clone(),
            notifiers: notifiers(),
        },
        Some(watch) => Results::Actor {
            actor: mailbox_actor,
            fences: spec.mailbox.fences_claims(),
            watch: watch.clone(),
        },
    };

    let shared_queue = spec.shared.as_ref().map(|parking| parking.queue.clone());
    let (storage, shared, stored, queue) = match spec.shared.take() {
        Some(parking) => {
            // The shared queue keeps what is parked; the local queue is not used.
            let room = SharedRoom::new(
                parking.queue.backend(),
                parking.lease,
                parking.claim_ahead,
                spec.durability,
            )
            .with_fleet_budgets(&core.limits().budgets)
            .with_dependencies(parking.queue.dependencies().is_some());
            (
                Box::new(room) as Storage<P, R>,
                Some(
                    SharedIo::new(&parking)
                        .attaching(core.limits().on_duplicate == OnDuplicate::Attach),
                ),
                Vec::new(),
                None,
            )
        }
        None if spec.queue.is_durable() => {
            let stored = load_parked(&spec.name, &*spec.queue).await?;
            let reports: QueueReports<P> = {
                let scheduler_slot = scheduler_slot.clone();
                Arc::new(move |report| match scheduler_slot.get() {
                    Some(scheduler) => {
                        let _ = scheduler.send_message(SchedulerMsg(Internal::Queue(report)));
                    }
                    None => tracing::error!("the queue actor has no scheduler to report to"),
                })
            };
            let releases = spec.queue.releases_claims();
            let dependencies = spec.queue.keeps_dependencies();
            let several_kinds = spec.queue.keeps_several_kinds();
            let queue_state = QueueState {
                queue: spec.queue,
                reports,
            };
            let queue: ActorRef<QueueMsg<P>> =
                once("queue", start_once(QueueActor::<P>::default, queue_state))
                    .await?
                    .into();
            let stored = stored.into_iter().map(|entry| (entry, None)).collect();
            let room = LocalRoom::new(spec.durability)
                .with_releases(releases)
                .with_dependencies(dependencies)
                .with_several_kinds(several_kinds);
            (Box::new(room) as Storage<P, R>, None, stored, Some(queue))
        }
        None => {
            // In memory: the scheduler's ledger keeps parked tasks itself. Tasks parked in
            // the queue before the pool started move into it.
            let stored = take_parked(&spec.name, &*spec.queue).await?;
            (Box::new(MemoryRoom) as Storage<P, R>, None, stored, None)
        }
    };

    let rerun: Rerun<P> = Arc::default();
    let on_duplicate = core.limits().on_duplicate;
    let feed = Arc::new(EventFeed::new());
    let mut subscribers = spec.subscribers;
    subscribers.push(feed.clone());
    let shell = ShellArgs {
        pool: pool.clone(),
        core,
        default_timeout: spec.default_timeout,
        storage,
        counters: counters.clone(),
        subscribers,
        mailbox: spec.mailbox.clone(),
        results_watch: results_watch.clone(),
        gpu_sampled: false,
        rerun: rerun.clone(),
        lanes,
        tenant_weights: spec.tenant_weights,
    };
    let driver = Driver {
        pool: pool.clone(),
        jobs,
        queue,
        shared,
        results,
        gpu: None,
        spare: Vec::new(),
    };
    let start = SchedulerStart {
        shell,
        driver,
        inbox: inbox.clone(),
        stored,
        gpu: spec.gpu,
        counters: counters.clone(),
        scheduler_slot: scheduler_slot.clone(),
    };
    let scheduler: ActorRef<SchedulerMsg<P>> = once(
        "scheduler",
        start_once(SchedulerActor::<P, R>::default, start),
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
            reports: inbox.clone(),
            counters: counters.clone(),
            nested: nested.clone(),
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
            let lost = Internal::WorkerLost {
                worker: index,
                reason,
            };
            let _ = scheduler.send_message(SchedulerMsg(lost));
        }));
        supervise(supervisor, worker).await?;
    }

    let client = PoolClient::new(ClientParts {
        name: pool,
        scheduler,
        inbox,
        mailbox: spec.mailbox,
        results_watch,
        notifiers: spec.notifiers,
        counters,
        supervisor: supervisor.clone(),
        owns_supervisor,
        nested,
        rerun,
        on_duplicate,
        feed,
        shared_queue,
        tracer: spec.tracer,
    });
    let enqueuer = crate::schedule::enqueuer::run(
        client.downgrade(),
        client.control().schedule_board().clone(),
    );
    tokio::spawn(enqueuer);
    Ok(client)
}

/// The parked tasks a durable queue kept, to be indexed again.
async fn load_parked<P: Send + 'static>(
    pool: &str,
    queue: &dyn TaskQueue<P>,
) -> Result<Vec<StoredEntry>, PoolError> {
    let loaded = queue.load_parked().await;
    loaded.map_err(|error| queue_error(pool, queue.backend(), "load its parked tasks", error))
}

/// Takes every task parked in a queue that keeps nothing the process does not, with its
/// payload, for the scheduler's ledger to keep.
async fn take_parked<P: Send + 'static>(
    pool: &str,
    queue: &dyn TaskQueue<P>,
) -> Result<Vec<(StoredEntry, Option<P>)>, PoolError> {
    let mut taken = Vec::new();
    for stored in load_parked(pool, queue).await? {
        let removed = queue.remove(stored.entry).await;
        let removed = removed
            .map_err(|error| queue_error(pool, queue.backend(), "take a parked task", error))?;
        if let Some(task) = removed {
            taken.push((stored, Some(task.payload)));
        }
    }
    Ok(taken)
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

#[doc(hidden)]
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
    start_blocking(spawner, spec, Ownership::Own)
}

#[doc(hidden)]
/// [`start_pool_blocking`] for a pool that only grants capacity permits
/// ([`PoolClient::gate`]): it starts no worker threads (`spec.workers.count` is ignored)
/// and its executor is never called.
pub fn start_gate_blocking<P, R, E>(
    spawner: &dyn Spawn,
    spec: PoolSpec<P, R, E>,
) -> Result<PoolClient<P, R>, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    start_blocking(spawner, spec, Ownership::OwnGate)
}

fn start_blocking<P, R, E>(
    spawner: &dyn Spawn,
    spec: PoolSpec<P, R, E>,
    ownership: Ownership,
) -> Result<PoolClient<P, R>, PoolError>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    let (started, wait) = std::sync::mpsc::sync_channel(1);
    spawner.spawn(Box::pin(async move {
        let (supervisor, running) = match Actor::spawn(None, SupervisorActor, ()).await {
            Ok(supervisor) => supervisor,
            Err(error) => {
                let _ = started.send(Err(PoolError::Internal(format!(
                    "could not start the supervisor: {error}"
                ))));
                return;
            }
        };
        let client = start_pool_with(&supervisor, spec, ownership).await;
        if client.is_err() {
            supervisor.stop(None);
        }
        let _ = started.send(client);
        let _ = running.await;
    }))?;
    wait.recv_timeout(STARTUP_TIMEOUT).map_err(|_| {
        PoolError::Internal(
            "the pool's actor runtime did not start within 30 s; is the spawner polling its futures?"
                .into(),
        )
    })?
}
