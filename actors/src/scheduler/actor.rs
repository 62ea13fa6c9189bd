//! The scheduler actor of one pool: the only writer of its capacity, and the only one that
//! assigns tasks to worker threads.
//!
//! It hosts the pure [`ParkingLot`] and translates messages into core events and core
//! decisions into effects: a started task is given an idle worker and goes to that worker's
//! job channel (or, when it was parked, through the queue actor, which claims its payload
//! first and then sends it to the chosen worker); a parked task goes to the queue actor; every
//! terminal outcome goes to the mailbox actor, exactly once.
//!
//! Invariants:
//! - every admitted task is in `tasks` until its terminal outcome is delivered and its
//!   capacity released;
//! - at most one terminal outcome per task reaches the mailbox: once the execution watchdog or
//!   shutdown delivered one for a running task (`Running::ended`), the worker's late outcome
//!   only releases capacity;
//! - capacity is released (core `complete`) exactly once, when the worker thread reports the
//!   task finished, because until then its memory may still be in use;
//! - every running task holds exactly one worker, recorded in `Running::worker`, and a worker
//!   is idle exactly when no task holds it. A worker is freed when its thread reports
//!   `Finished` (a task ended early by the watchdog or shutdown keeps its worker until then,
//!   like its capacity: the thread is still busy) or when the job never reached it
//!   (`ClaimFailed`, a closed channel). Because the core's worker slots equal the number of
//!   workers and every running task holds one slot, an idle worker exists whenever the core
//!   starts a task; if none does, that is a bug, and the task fails instead of starting;
//! - a worker the supervisor reports lost (it will not be restarted) is retired: never idle
//!   again. A task waiting in its channel can never have started (the thread sent its last
//!   `Finished` before dying), so it is failed and its capacity released.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use super::core::{Admit, Cancel, ParkingLot, Ticket};
use crate::clock::now_ms;
use crate::domain::TaskStatus;
use crate::domain::{MailboxKey, PoolError, PoolLimits, ScheduledTask, TaskId, TenantId};
use crate::mailbox::actor::MailboxMsg;
use crate::mailbox::{status_of, Delivery};
use crate::queue::actor::QueueMsg;
use crate::stats::PoolCounters;
use crate::worker::{Job, JobSenders};

/// How long after a task's execution timeout the watchdog declares it `TimedOut` itself,
/// for executors that block their thread and so cannot be interrupted.
const WATCHDOG_GRACE_MS: u64 = 10;

/// Per-submission options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// Overrides the pool's default execution timeout for this task.
    pub timeout: Option<Duration>,
}

/// What a drain did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Parked tasks ended `Cancelled` (in-memory queue).
    pub cancelled_parked: usize,
    /// Parked tasks left in a durable queue for the next start.
    pub kept_parked: usize,
    /// Running tasks that finished within the drain deadline.
    pub finished_running: usize,
    /// Running tasks still running at the deadline: cancelled, reported `Cancelled`.
    pub abandoned_running: usize,
}

/// Messages the scheduler handles.
pub enum SchedulerMsg<P, R> {
    /// Admit a task; the reply carries its mailbox key or why it was refused.
    Submit {
        /// The task.
        task: ScheduledTask<P>,
        /// Its options.
        options: SubmitOptions,
        /// Where the admission answer goes.
        reply: RpcReplyPort<Result<MailboxKey, PoolError>>,
    },
    /// Cancel a live task (parked: removed at once; running: its future is dropped).
    Cancel {
        /// The task.
        id: TaskId,
        /// `Ok` once cancelled or signalled.
        reply: RpcReplyPort<Result<(), PoolError>>,
    },
    /// A worker thread finished a task (from the worker thread); the worker is idle again.
    Finished {
        /// The task.
        id: TaskId,
        /// The worker that ran it.
        worker: usize,
        /// What the executor produced, or how it ended without a result.
        outcome: Result<R, PoolError>,
    },
    /// The queue could not store a parked task (from the queue actor).
    ParkFailed {
        /// The task.
        id: TaskId,
    },
    /// The queue could not hand over a task chosen to start (from the queue actor); the worker
    /// chosen for it is idle again.
    ClaimFailed {
        /// The task.
        id: TaskId,
        /// Why.
        reason: String,
    },
    /// A worker failed and will not be restarted (from the supervisor): retire it, and fail the
    /// task waiting in its channel, if any (it can never have started).
    WorkerLost {
        /// The worker.
        worker: usize,
        /// Why it is gone.
        reason: String,
    },
    /// Time-driven work is due: deadlines, starvation aging, the execution watchdog.
    Tick,
    /// The supervisor gave up on the pool.
    Escalated {
        /// Why.
        reason: String,
    },
    /// Stop admitting, drain running tasks up to `drain`, end or keep parked tasks.
    Shutdown {
        /// How long running tasks may take to finish.
        drain: Duration,
        /// The report, once drained.
        reply: RpcReplyPort<ShutdownReport>,
    },
    /// The drain deadline passed.
    DrainDeadline,
}

/// Everything the scheduler starts with.
pub struct SchedulerArgs<P, R> {
    /// The pool's name.
    pub pool: Arc<str>,
    /// Its limits.
    pub limits: PoolLimits,
    /// Its default execution timeout.
    pub default_timeout: Option<Duration>,
    /// Every worker's job channel; there must be one per worker slot in `limits`.
    pub jobs: JobSenders<P>,
    /// The queue actor.
    pub queue: ActorRef<QueueMsg<P>>,
    /// Whether the queue keeps parked tasks across restarts.
    pub queue_durable: bool,
    /// The mailbox actor.
    pub mailbox: ActorRef<MailboxMsg<R>>,
    /// The pool's counters.
    pub counters: Arc<PoolCounters>,
}

/// The scheduler actor. See the module docs.
pub struct SchedulerActor<P, R>(PhantomData<fn() -> (P, R)>);

impl<P, R> Default for SchedulerActor<P, R> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// A live (admitted, not yet ended) task.
struct LiveTask {
    key: MailboxKey,
    timeout: Option<Duration>,
    from_queue: bool,
    run: Option<Running>,
}

/// A started task.
struct Running {
    /// The worker it was sent to, busy until the task's `Finished` arrives.
    worker: usize,
    cancel: Option<oneshot::Sender<()>>,
    watchdog_at: Option<u64>,
    /// A terminal outcome was delivered already (watchdog or shutdown).
    ended: bool,
}

/// How a running task's job ended, which says how its worker became idle again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobEnd {
    /// The job reached this worker, which ran it and reported `Finished`.
    Ran { worker: usize },
    /// The job never reached its worker (the claim failed, or the channel was closed).
    NotSent,
    /// The job sits in the channel of a worker that is gone for good: it never ran.
    Lost,
}

/// What a started task's job needs.
struct Start {
    worker: usize,
    timeout: Option<Duration>,
    cancel: oneshot::Receiver<()>,
}

impl Start {
    fn job<P>(self, task: ScheduledTask<P>) -> Job<P> {
        Job {
            task,
            timeout: self.timeout,
            cancel: self.cancel,
        }
    }
}

/// What [`SchedulerState::begin_run`] did.
enum Begun {
    /// The task runs on `Start::worker`: send it its job.
    Run(Start),
    /// The task is not live; nothing to do.
    NotLive,
    /// No worker was idle (a bug): the task was failed instead, and these parked tasks were
    /// started in the capacity it released.
    Failed { started: Vec<TaskId> },
}

/// The pool's workers: how to reach each one, and which are idle.
struct Workers<P> {
    senders: JobSenders<P>,
    /// Idle workers, the most recently freed last (it is the first reused: its caches are warm).
    idle: Vec<usize>,
    /// `is_idle[i]`: whether worker `i` is in `idle`; guards against freeing a worker twice.
    is_idle: Vec<bool>,
    /// `lost[i]`: worker `i` failed and will not be restarted; it is never handed work again.
    lost: Vec<bool>,
}

impl<P> Workers<P> {
    /// All workers idle, worker 0 first to be used.
    fn new(senders: JobSenders<P>) -> Self {
        let count = senders.len();
        Self {
            senders,
            idle: (0..count).rev().collect(),
            is_idle: vec![true; count],
            lost: vec![false; count],
        }
    }

    /// Takes an idle worker, if any.
    fn take_idle(&mut self) -> Option<usize> {
        let worker = self.idle.pop()?;
        self.is_idle[worker] = false;
        Some(worker)
    }

    /// Makes a busy worker idle again. Freeing an idle or unknown worker is a bug: logged and
    /// ignored, so a worker is never handed two jobs at once.
    fn release(&mut self, pool: &str, worker: usize) {
        if self.lost.get(worker) == Some(&true) {
            return;
        }
        match self.is_idle.get_mut(worker) {
            Some(idle @ false) => {
                *idle = true;
                self.idle.push(worker);
            }
            Some(true) => tracing::error!(pool, worker, "bug: a worker was freed twice"),
            None => tracing::error!(pool, worker, "bug: freed a worker that does not exist"),
        }
    }

    /// Retires a worker that will not come back.
    fn retire(&mut self, worker: usize) {
        if let Some(lost) = self.lost.get_mut(worker) {
            *lost = true;
            self.idle.retain(|&idle| idle != worker);
            self.is_idle[worker] = false;
        }
    }

    /// Sends a job to a worker's channel; `false` if the channel is closed (the pool stops).
    fn send(&self, worker: usize, job: Job<P>) -> bool {
        self.senders
            .get(worker)
            .is_some_and(|sender| sender.send(job).is_ok())
    }
}

enum Mode {
    Open,
    Escalated(String),
    Draining {
        reply: Option<RpcReplyPort<ShutdownReport>>,
        report: ShutdownReport,
    },
    Stopped,
}

/// The scheduler's state.
pub struct SchedulerState<P, R> {
    pool: Arc<str>,
    core: ParkingLot,
    workers: Workers<P>,
    queue: ActorRef<QueueMsg<P>>,
    queue_durable: bool,
    mailbox: ActorRef<MailboxMsg<R>>,
    default_timeout: Option<Duration>,
    tasks: HashMap<TaskId, LiveTask>,
    watchdog: BTreeSet<(u64, TaskId)>,
    counters: Arc<PoolCounters>,
    armed_tick: Option<u64>,
    mode: Mode,
    /// The tenant of every anonymous mailbox key (`anonymous.{pool}`), formatted once.
    anonymous_tenant: TenantId,
    anonymous_keys: u64,
}

impl<P, R> Actor for SchedulerActor<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    type Msg = SchedulerMsg<P, R>;
    type State = SchedulerState<P, R>;
    type Arguments = SchedulerArgs<P, R>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if args.jobs.len() != args.limits.worker_slots {
            return Err(format!(
                "{} job channels for {} worker slots; they must be equal",
                args.jobs.len(),
                args.limits.worker_slots
            )
            .into());
        }
        let core = ParkingLot::new(args.limits)?;
        let total_units = crate::domain::ResourceKind::ALL
            .iter()
            .map(|&kind| u64::from(args.limits.capacity.get(kind)))
            .max()
            .unwrap_or(0);
        args.counters
            .total_units
            .store(total_units, std::sync::atomic::Ordering::Relaxed);
        args.counters.worker_count.store(
            args.limits.worker_slots,
            std::sync::atomic::Ordering::Relaxed,
        );
        let anonymous_tenant = TenantId(format!("anonymous.{}", args.pool));
        Ok(SchedulerState {
            pool: args.pool,
            core,
            workers: Workers::new(args.jobs),
            queue: args.queue,
            queue_durable: args.queue_durable,
            mailbox: args.mailbox,
            default_timeout: args.default_timeout,
            tasks: HashMap::new(),
            watchdog: BTreeSet::new(),
            counters: args.counters,
            armed_tick: None,
            mode: Mode::Open,
            anonymous_tenant,
            anonymous_keys: 0,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let now = now();
        match message {
            SchedulerMsg::Submit {
                task,
                options,
                reply,
            } => state.submit(task, options, reply, now),
            SchedulerMsg::Cancel { id, reply } => {
                let _ = reply.send(state.cancel(id, now));
            }
            SchedulerMsg::Finished {
                id,
                worker,
                outcome,
            } => state.finished(id, outcome, JobEnd::Ran { worker }, now),
            SchedulerMsg::ClaimFailed { id, reason } => {
                state.finished(id, Err(PoolError::Failed(reason)), JobEnd::NotSent, now)
            }
            SchedulerMsg::ParkFailed { id } => state.park_failed(id, now),
            SchedulerMsg::Tick => {
                state.armed_tick = None;
                state.tick(now);
            }
            SchedulerMsg::Escalated { reason } => state.escalated(reason, now),
            SchedulerMsg::WorkerLost { worker, reason } => state.worker_lost(worker, reason, now),
            SchedulerMsg::Shutdown { drain, reply } => state.shutdown(&myself, drain, reply),
            SchedulerMsg::DrainDeadline => state.drain_deadline(),
        }
        state.publish();
        state.arm_timer(&myself, now);
        Ok(())
    }
}

fn now() -> u64 {
    super::core::clamp_ms(now_ms())
}

impl<P, R> SchedulerState<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    fn submit(
        &mut self,
        mut task: ScheduledTask<P>,
        options: SubmitOptions,
        reply: RpcReplyPort<Result<MailboxKey, PoolError>>,
        now: u64,
    ) {
        if let Some(refusal) = self.refusal() {
            PoolCounters::bump(&self.counters.rejected);
            let _ = reply.send(Err(refusal));
            return;
        }
        let id = task.meta.id;
        let key = match task.meta.mailbox.clone() {
            Some(key) => key,
            None => self.anonymous_key(id),
        };
        task.meta.mailbox = Some(key.clone());
        let live = LiveTask {
            key: key.clone(),
            timeout: options.timeout.or(self.default_timeout),
            from_queue: false,
            run: None,
        };
        match self.core.admit(Ticket::from(&task.meta), now) {
            Admit::Start => {
                PoolCounters::bump(&self.counters.submitted);
                self.tasks.insert(id, live);
                self.dispatch(task, now);
                let _ = reply.send(Ok(key));
            }
            Admit::Park => {
                PoolCounters::bump(&self.counters.submitted);
                self.tasks.insert(
                    id,
                    LiveTask {
                        from_queue: true,
                        ..live
                    },
                );
                self.send_to_queue(QueueMsg::Park {
                    task: Box::new(task),
                    key,
                    reply,
                });
            }
            Admit::Expire => {
                PoolCounters::bump(&self.counters.expired);
                let _ = reply.send(Err(PoolError::Expired));
            }
            Admit::Reject(rejection) => {
                PoolCounters::bump(&self.counters.rejected);
                let _ = reply.send(Err(rejection.into()));
            }
        }
    }

    /// Why submissions are refused now, if they are.
    fn refusal(&self) -> Option<PoolError> {
        match &self.mode {
            Mode::Open => None,
            Mode::Escalated(reason) => Some(PoolError::Internal(reason.clone())),
            Mode::Draining { .. } | Mode::Stopped => Some(PoolError::Shutdown),
        }
    }

    fn anonymous_key(&mut self, id: TaskId) -> MailboxKey {
        self.anonymous_keys += 1;
        MailboxKey {
            tenant: self.anonymous_tenant.clone(),
            user_id: None,
            session_id: Some(format!("{id}.{}", self.anonymous_keys)),
        }
    }

    /// Marks a task running on an idle worker. See [`Begun`].
    fn begin_run(&mut self, id: TaskId, now: u64) -> Begun {
        let Some(worker) = self.workers.take_idle() else {
            return Begun::Failed {
                started: self.fail_for_lack_of_a_worker(id, now),
            };
        };
        let Some(live) = self.tasks.get_mut(&id) else {
            self.workers.release(&self.pool, worker);
            return Begun::NotLive;
        };
        let (cancel, cancelled) = oneshot::channel();
        let watchdog_at = live.timeout.map(|timeout| {
            let limit = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            now.saturating_add(limit).saturating_add(WATCHDOG_GRACE_MS)
        });
        if let Some(at) = watchdog_at {
            self.watchdog.insert((at, id));
        }
        live.run = Some(Running {
            worker,
            cancel: Some(cancel),
            watchdog_at,
            ended: false,
        });
        Begun::Run(Start {
            worker,
            timeout: live.timeout,
            cancel: cancelled,
        })
    }

    /// Ends a task the core started although no worker is idle: an accounting bug. Releases
    /// its capacity and fails it rather than panicking; returns the parked tasks the release
    /// started.
    fn fail_for_lack_of_a_worker(&mut self, id: TaskId, now: u64) -> Vec<TaskId> {
        tracing::error!(
            pool = %self.pool,
            id,
            "bug: the core started a task but no worker thread is idle; failing the task"
        );
        if self.tasks.get(&id).is_some_and(|live| live.from_queue) {
            self.send_to_queue(QueueMsg::Remove { id });
        }
        let outcome = Err(PoolError::Failed(
            "internal error: no idle worker thread for a started task".into(),
        ));
        self.end_task(id, outcome, JobEnd::NotSent, now)
    }

    /// Starts a task whose payload the scheduler holds (fast path).
    fn dispatch(&mut self, task: ScheduledTask<P>, now: u64) {
        let id = task.meta.id;
        match self.begin_run(id, now) {
            Begun::Run(start) => {
                let worker = start.worker;
                if !self.workers.send(worker, start.job(task)) {
                    self.finished(id, Err(PoolError::Shutdown), JobEnd::NotSent, now);
                }
            }
            Begun::NotLive => {}
            Begun::Failed { started } => self.start_parked(started, now),
        }
    }

    /// Starts parked tasks the core chose, in order: the queue actor claims each payload and
    /// sends it to the worker chosen here.
    fn start_parked(&mut self, started: Vec<TaskId>, now: u64) {
        let mut pending = VecDeque::from(started);
        while let Some(id) = pending.pop_front() {
            match self.begin_run(id, now) {
                Begun::Run(Start {
                    worker,
                    timeout,
                    cancel,
                }) => self.send_to_queue(QueueMsg::ClaimAndRun {
                    id,
                    worker,
                    timeout,
                    cancel,
                }),
                Begun::NotLive => {}
                Begun::Failed { started } => pending.extend(started),
            }
        }
    }

    /// A running task ended: release it, start what its capacity frees.
    fn finished(&mut self, id: TaskId, outcome: Result<R, PoolError>, end: JobEnd, now: u64) {
        let started = self.end_task(id, outcome, end, now);
        self.start_parked(started, now);
        self.finish_drain_if_idle();
    }

    /// Frees a running task's worker and capacity, settles it with the queue and delivers its
    /// outcome unless one was delivered already. Returns the parked tasks the core started in
    /// the freed capacity, for the caller to start.
    fn end_task(
        &mut self,
        id: TaskId,
        outcome: Result<R, PoolError>,
        end: JobEnd,
        now: u64,
    ) -> Vec<TaskId> {
        if let JobEnd::Ran { worker } = end {
            self.workers.release(&self.pool, worker);
        }
        let Some(live) = self.tasks.remove(&id) else {
            tracing::warn!(pool = %self.pool, id, "finish of a task the scheduler does not hold");
            return Vec::new();
        };
        let started = match self.core.complete(id, now) {
            Ok(started) => started,
            Err(error) => {
                tracing::error!(pool = %self.pool, %error, "capacity release refused");
                Vec::new()
            }
        };
        let run = live.run;
        if let Some(run) = &run {
            if let Some(at) = run.watchdog_at {
                self.watchdog.remove(&(at, id));
            }
            match end {
                JobEnd::Ran { worker } => debug_assert_eq!(worker, run.worker),
                JobEnd::NotSent => self.workers.release(&self.pool, run.worker),
                JobEnd::Lost => {}
            }
        }
        let claimed = matches!(end, JobEnd::Ran { .. } | JobEnd::Lost);
        if live.from_queue && claimed {
            let message = match &outcome {
                Ok(_) => QueueMsg::Complete { id },
                Err(error) => QueueMsg::Fail {
                    id,
                    reason: error.to_string(),
                },
            };
            self.send_to_queue(message);
        }
        if !run.is_some_and(|run| run.ended) {
            self.deliver(live.key, id, outcome, now);
        }
        if let Mode::Draining { report, .. } = &mut self.mode {
            report.finished_running += 1;
        }
        started
    }

    fn cancel(&mut self, id: TaskId, now: u64) -> Result<(), PoolError> {
        match self.core.cancel(id, now) {
            Ok(Cancel::Parked { started }) => {
                if let Some(live) = self.tasks.remove(&id) {
                    self.send_to_queue(QueueMsg::Remove { id });
                    self.deliver(live.key, id, Err(PoolError::Cancelled), now);
                }
                self.start_parked(started, now);
                Ok(())
            }
            Ok(Cancel::Running) => {
                let signal = self
                    .tasks
                    .get_mut(&id)
                    .and_then(|live| live.run.as_mut())
                    .and_then(|run| run.cancel.take());
                if let Some(signal) = signal {
                    let _ = signal.send(());
                }
                Ok(())
            }
            Err(_) => Err(PoolError::TaskNotFound(id)),
        }
    }

    fn park_failed(&mut self, id: TaskId, now: u64) {
        if let Ok(Cancel::Parked { started }) = self.core.cancel(id, now) {
            self.tasks.remove(&id);
            self.counters
                .submitted
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            PoolCounters::bump(&self.counters.rejected);
            self.start_parked(started, now);
        }
    }

    fn tick(&mut self, now: u64) {
        let tick = self.core.tick(now);
        for id in tick.expired {
            if let Some(live) = self.tasks.remove(&id) {
                self.send_to_queue(QueueMsg::Remove { id });
                self.deliver(live.key, id, Err(PoolError::Expired), now);
            }
        }
        self.start_parked(tick.started, now);
        while let Some(&(at, id)) = self.watchdog.first() {
            if at > now {
                break;
            }
            self.watchdog.pop_first();
            self.end_running(id, PoolError::TimedOut, now);
        }
    }

    /// Delivers a terminal outcome for a running task before its thread returns, and asks
    /// the thread to drop its future. Its capacity stays held until the thread reports back.
    fn end_running(&mut self, id: TaskId, outcome: PoolError, now: u64) -> bool {
        let Some(live) = self.tasks.get_mut(&id) else {
            return false;
        };
        let Some(run) = live.run.as_mut().filter(|run| !run.ended) else {
            return false;
        };
        run.ended = true;
        if let Some(signal) = run.cancel.take() {
            let _ = signal.send(());
        }
        let key = live.key.clone();
        self.deliver(key, id, Err(outcome), now);
        true
    }

    fn worker_lost(&mut self, worker: usize, reason: String, now: u64) {
        self.workers.retire(worker);
        let stranded = self.tasks.iter().find_map(|(&id, live)| {
            live.run
                .as_ref()
                .is_some_and(|run| run.worker == worker)
                .then_some(id)
        });
        if let Some(id) = stranded {
            let outcome = Err(PoolError::Failed(format!("its worker is gone: {reason}")));
            let started = self.end_task(id, outcome, JobEnd::Lost, now);
            self.start_parked(started, now);
        }
        self.finish_drain_if_idle();
    }

    fn escalated(&mut self, reason: String, now: u64) {
        if matches!(self.mode, Mode::Open) {
            self.mode = Mode::Escalated(reason.clone());
        }
        for id in self.core.take_parked() {
            if let Some(live) = self.tasks.remove(&id) {
                self.send_to_queue(QueueMsg::Remove { id });
                self.deliver(live.key, id, Err(PoolError::Failed(reason.clone())), now);
            }
        }
    }

    fn shutdown(
        &mut self,
        myself: &ActorRef<SchedulerMsg<P, R>>,
        drain: Duration,
        reply: RpcReplyPort<ShutdownReport>,
    ) {
        if matches!(self.mode, Mode::Draining { .. } | Mode::Stopped) {
            let _ = reply.send(ShutdownReport::default());
            return;
        }
        let now = now();
        let mut report = ShutdownReport::default();
        for id in self.core.take_parked() {
            let Some(live) = self.tasks.remove(&id) else {
                continue;
            };
            if self.queue_durable {
                report.kept_parked += 1;
            } else {
                report.cancelled_parked += 1;
                self.send_to_queue(QueueMsg::Remove { id });
                self.deliver(live.key, id, Err(PoolError::Cancelled), now);
            }
        }
        self.mode = Mode::Draining {
            reply: Some(reply),
            report,
        };
        myself.send_after(drain, || SchedulerMsg::DrainDeadline);
        self.finish_drain_if_idle();
    }

    fn drain_deadline(&mut self) {
        let now = now();
        let running: Vec<TaskId> = self.tasks.keys().copied().collect();
        let mut abandoned = 0;
        for id in running {
            if self.end_running(id, PoolError::Cancelled, now) {
                abandoned += 1;
            }
        }
        if let Mode::Draining { report, .. } = &mut self.mode {
            report.abandoned_running += abandoned;
        }
        self.finish_drain(true);
    }

    fn finish_drain_if_idle(&mut self) {
        if self.core.running_len() == 0 {
            self.finish_drain(false);
        }
    }

    fn finish_drain(&mut self, deadline_passed: bool) {
        let Mode::Draining { reply, report } = &mut self.mode else {
            return;
        };
        if let Some(reply) = reply.take() {
            let _ = reply.send(*report);
        }
        if deadline_passed || self.core.running_len() == 0 {
            self.mode = Mode::Stopped;
        }
    }

    fn deliver(
        &mut self,
        key: MailboxKey,
        task_id: TaskId,
        outcome: Result<R, PoolError>,
        now: u64,
    ) {
        let counter = match status_of(&outcome) {
            TaskStatus::Completed => &self.counters.completed,
            TaskStatus::Expired => &self.counters.expired,
            TaskStatus::TimedOut => &self.counters.timed_out,
            TaskStatus::Cancelled => &self.counters.cancelled,
            _ => &self.counters.failed,
        };
        PoolCounters::bump(counter);
        let delivery = Delivery {
            task_id,
            outcome,
            stored_at_ms: now,
        };
        if let Err(error) = self
            .mailbox
            .send_message(MailboxMsg::Deliver { key, delivery })
        {
            tracing::error!(pool = %self.pool, task_id, %error, "mailbox actor is gone; outcome dropped");
        }
    }

    fn send_to_queue(&self, message: QueueMsg<P>) {
        if self.queue.send_message(message).is_err() {
            tracing::error!(pool = %self.pool, "queue actor is gone");
        }
    }

    fn publish(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.counters.active.store(self.core.running_len(), Relaxed);
        self.counters.queued.store(self.core.parked_len(), Relaxed);
        self.counters
            .used_units
            .store(self.core.used_total(), Relaxed);
    }

    /// Makes sure a `Tick` arrives by the next time-driven event.
    fn arm_timer(&mut self, myself: &ActorRef<SchedulerMsg<P, R>>, now: u64) {
        let watchdog = self.watchdog.first().map(|&(at, _)| at);
        let next = match (self.core.next_wakeup(), watchdog) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(at) => at,
                None => return,
            },
        };
        if self.armed_tick.is_some_and(|armed| armed <= next) {
            return;
        }
        self.armed_tick = Some(next);
        let delay = Duration::from_millis(next.saturating_sub(now));
        myself.send_after(delay, || SchedulerMsg::Tick);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::job_channels;

    fn workers(count: usize) -> Workers<()> {
        Workers::new(job_channels::<()>(count).0)
    }

    #[test]
    fn every_worker_starts_idle_and_is_handed_out_once() {
        let mut workers = workers(3);
        let taken: Vec<usize> = std::iter::from_fn(|| workers.take_idle()).collect();
        assert_eq!(taken, vec![0, 1, 2]);
        assert_eq!(workers.take_idle(), None);
    }

    #[test]
    fn the_most_recently_freed_worker_is_reused_first() {
        let mut workers = workers(3);
        let (a, b) = (workers.take_idle().unwrap(), workers.take_idle().unwrap());
        workers.release("pool", a);
        workers.release("pool", b);
        assert_eq!(workers.take_idle(), Some(b));
        assert_eq!(workers.take_idle(), Some(a));
    }

    #[test]
    fn freeing_an_idle_or_unknown_worker_changes_nothing() {
        let mut workers = workers(2);
        let busy = workers.take_idle().unwrap();
        workers.release("pool", busy);
        workers.release("pool", busy);
        workers.release("pool", 7);
        let taken: Vec<usize> = std::iter::from_fn(|| workers.take_idle()).collect();
        assert_eq!(taken, vec![0, 1]);
    }

    #[test]
    fn a_retired_worker_is_never_handed_out_again() {
        let mut workers = workers(3);
        let busy = workers.take_idle().unwrap();
        workers.retire(busy);
        workers.release("pool", busy);
        workers.retire(2);
        let taken: Vec<usize> = std::iter::from_fn(|| workers.take_idle()).collect();
        assert_eq!(taken, vec![1]);
    }

    #[test]
    fn a_job_for_a_closed_or_unknown_channel_is_not_sent() {
        let (senders, receivers) = job_channels::<()>(1);
        let workers = Workers::new(senders);
        let job = |id| {
            let (_cancel, cancelled) = oneshot::channel();
            Job {
                task: ScheduledTask::new(
                    crate::domain::TaskMetadata::new(id, crate::domain::ResourceCost::cpu(1)),
                    (),
                ),
                timeout: None,
                cancel: cancelled,
            }
        };
        assert!(!workers.send(1, job(1)));
        assert!(workers.send(0, job(2)));
        drop(receivers);
        assert!(!workers.send(0, job(3)));
    }
}
