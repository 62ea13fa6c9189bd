//! The scheduler actor of one pool: the only writer of its capacity.
//!
//! It hosts the pure [`ParkingLot`] and translates messages into core events and core
//! decisions into effects: a started task goes to the worker threads' job channel (or, when
//! it was parked, through the queue actor, which claims its payload first); a parked task goes
//! to the queue actor; every terminal outcome goes to the mailbox actor, exactly once.
//!
//! Invariants:
//! - every admitted task is in `tasks` until its terminal outcome is delivered and its
//!   capacity released;
//! - at most one terminal outcome per task reaches the mailbox: once the execution watchdog or
//!   shutdown delivered one for a running task (`Running::ended`), the worker's late outcome
//!   only releases capacity;
//! - capacity is released (core `complete`) exactly once, when the worker thread reports the
//!   task finished, because until then its memory may still be in use.

use std::collections::{BTreeSet, HashMap};
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
use crate::worker::Job;

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
    /// A worker thread finished a task (from the worker thread).
    Finished {
        /// The task.
        id: TaskId,
        /// What the executor produced, or how it ended without a result.
        outcome: Result<R, PoolError>,
    },
    /// The queue could not store a parked task (from the queue actor).
    ParkFailed {
        /// The task.
        id: TaskId,
    },
    /// The queue could not hand over a task chosen to start (from the queue actor).
    ClaimFailed {
        /// The task.
        id: TaskId,
        /// Why.
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
    /// The worker threads' job channel.
    pub jobs: flume::Sender<Job<P>>,
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
    cancel: Option<oneshot::Sender<()>>,
    watchdog_at: Option<u64>,
    /// A terminal outcome was delivered already (watchdog or shutdown).
    ended: bool,
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
    jobs: flume::Sender<Job<P>>,
    queue: ActorRef<QueueMsg<P>>,
    queue_durable: bool,
    mailbox: ActorRef<MailboxMsg<R>>,
    default_timeout: Option<Duration>,
    tasks: HashMap<TaskId, LiveTask>,
    watchdog: BTreeSet<(u64, TaskId)>,
    counters: Arc<PoolCounters>,
    armed_tick: Option<u64>,
    mode: Mode,
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
        Ok(SchedulerState {
            pool: args.pool,
            core,
            jobs: args.jobs,
            queue: args.queue,
            queue_durable: args.queue_durable,
            mailbox: args.mailbox,
            default_timeout: args.default_timeout,
            tasks: HashMap::new(),
            watchdog: BTreeSet::new(),
            counters: args.counters,
            armed_tick: None,
            mode: Mode::Open,
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
            SchedulerMsg::Finished { id, outcome } => state.finished(id, outcome, true, now),
            SchedulerMsg::ClaimFailed { id, reason } => {
                state.finished(id, Err(PoolError::Failed(reason)), false, now)
            }
            SchedulerMsg::ParkFailed { id } => state.park_failed(id, now),
            SchedulerMsg::Tick => {
                state.armed_tick = None;
                state.tick(now);
            }
            SchedulerMsg::Escalated { reason } => state.escalated(reason, now),
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
            tenant: TenantId(format!("anonymous.{}", self.pool)),
            user_id: None,
            session_id: Some(format!("{id}.{}", self.anonymous_keys)),
        }
    }

    /// Marks a task running; returns what its job needs.
    fn begin_run(
        &mut self,
        id: TaskId,
        now: u64,
    ) -> Option<(Option<Duration>, oneshot::Receiver<()>)> {
        let live = self.tasks.get_mut(&id)?;
        let (cancel, cancelled) = oneshot::channel();
        let watchdog_at = live.timeout.map(|timeout| {
            let limit = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            now.saturating_add(limit).saturating_add(WATCHDOG_GRACE_MS)
        });
        if let Some(at) = watchdog_at {
            self.watchdog.insert((at, id));
        }
        live.run = Some(Running {
            cancel: Some(cancel),
            watchdog_at,
            ended: false,
        });
        Some((live.timeout, cancelled))
    }

    /// Starts a task whose payload the scheduler holds (fast path).
    fn dispatch(&mut self, task: ScheduledTask<P>, now: u64) {
        let id = task.meta.id;
        let Some((timeout, cancel)) = self.begin_run(id, now) else {
            return;
        };
        let job = Job {
            task,
            timeout,
            cancel,
        };
        if self.jobs.send(job).is_err() {
            self.finished(id, Err(PoolError::Shutdown), false, now);
        }
    }

    /// Starts a parked task: the queue actor claims its payload and hands it to the workers.
    fn start_parked(&mut self, id: TaskId, now: u64) {
        if let Some((timeout, cancel)) = self.begin_run(id, now) {
            self.send_to_queue(QueueMsg::ClaimAndRun {
                id,
                timeout,
                cancel,
            });
        }
    }

    fn finished(&mut self, id: TaskId, outcome: Result<R, PoolError>, claimed: bool, now: u64) {
        let Some(live) = self.tasks.remove(&id) else {
            tracing::warn!(pool = %self.pool, id, "finish of a task the scheduler does not hold");
            return;
        };
        let started = match self.core.complete(id, now) {
            Ok(started) => started,
            Err(error) => {
                tracing::error!(pool = %self.pool, %error, "capacity release refused");
                Vec::new()
            }
        };
        let run = live.run;
        if let Some(at) = run.as_ref().and_then(|run| run.watchdog_at) {
            self.watchdog.remove(&(at, id));
        }
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
        for id in started {
            self.start_parked(id, now);
        }
        self.finish_drain_if_idle();
    }

    fn cancel(&mut self, id: TaskId, now: u64) -> Result<(), PoolError> {
        match self.core.cancel(id, now) {
            Ok(Cancel::Parked { started }) => {
                if let Some(live) = self.tasks.remove(&id) {
                    self.send_to_queue(QueueMsg::Remove { id });
                    self.deliver(live.key, id, Err(PoolError::Cancelled), now);
                }
                for id in started {
                    self.start_parked(id, now);
                }
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
            for id in started {
                self.start_parked(id, now);
            }
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
        for id in tick.started {
            self.start_parked(id, now);
        }
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
