//! What the scheduler actor hears: the public request protocol, and the crate-private events
//! and reports the rest of the engine sends it (each report type lives here, beside the
//! message that carries it, except the queue actor's, which lives with that actor).
//!
//! Callers that speak to the actor tree directly hold a
//! `DerivedActorRef<SchedulerRequest<P>>` (see `PoolClient::scheduler`) and can only send
//! requests: submit, shutdown, and the operator's [`ControlRequest`]s (cancel, pause, drain,
//! inspect, stats), which are handled beside the shell's control actions (`shell/control.rs`). The events that move capacity (a task
//! finished, a worker is gone, a claim failed) are variants of a private enum inside the
//! opaque [`SchedulerMsg`], so no caller can forge one and break "capacity is released
//! exactly once".

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ractor::RpcReplyPort;
use tokio::sync::oneshot;

use crate::domain::{
    ExtraCosts, MailboxKey, PoolError, ResourceCost, ResourceKind, ScheduledTask, TaskId,
};
use crate::observe::trace::TraceParent;
use crate::queue::actor::QueueReport;
use crate::running::stream::StreamAttachment;
use crate::sync::slots::SlotGuard;

pub use super::shell::control::ControlRequest;
use super::shell::storage::shared::SharedReport;

/// Per-submission options.
///
/// A scheduled start: `not_before_ms` holds a task back until an instant. It is admitted
/// at once (refused at once if it would be refused at all) and sleeps until then, as a
/// retried task sleeps out its backoff (core rule 16, `WaitReason::Sleeping`), then ranks
/// among the parked tasks as usual. An instant now or past is an ordinary submission; one
/// more than [`SubmitOptions::MAX_NOT_BEFORE_AHEAD`] ahead, or at or after the task's
/// deadline, is refused (`InvalidConfig`, naming the field).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use prometheus_parking_lot_actors::scheduler::protocol::SubmitOptions;
///
/// // Not before ten minutes from now.
/// let later = SubmitOptions::default().with_delay(Duration::from_secs(600));
/// assert!(later.not_before_ms.is_some());
///
/// // Not before an instant, with a timeout of its own.
/// let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_900_000_000_000);
/// let options = SubmitOptions {
///     timeout: Some(Duration::from_secs(30)),
///     ..SubmitOptions::default()
/// }
/// .with_not_before(at);
/// assert_eq!(options.not_before_ms, Some(1_900_000_000_000));
/// ```
///
/// Built with its methods (or as a struct literal with `..Default::default()`):
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot_actors::scheduler::protocol::SubmitOptions;
///
/// // A summary that runs once tasks 1, 2 and 3 of its tenant succeeded, for at most a minute.
/// let summary = SubmitOptions::default()
///     .with_timeout(Duration::from_secs(60))
///     .with_depends_on([1, 2, 3]);
/// assert_eq!(summary.depends_on, vec![1, 2, 3]);
/// assert!(!summary.run_if_parents_fail);
///
/// // A cleanup step: it runs once task 7 ended, however it ended.
/// let cleanup = SubmitOptions::default().with_depends_on([7]).run_if_parents_fail();
/// assert!(cleanup.run_if_parents_fail);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// Overrides the pool's default execution timeout for this task.
    pub timeout: Option<Duration>,
    /// The trace the submission belongs to (a W3C `traceparent`, from an incoming request's
    /// header, say): the task's spans are its children on every node. `None`: the
    /// submitter's current context, where the pool traces (the `otel` feature).
    pub trace: Option<TraceParent>,
    /// Do not start the task before this instant, in ms since the Unix epoch (a scheduled
    /// start; `None`: as soon as it can).
    pub not_before_ms: Option<u128>,
    /// Tasks (their ids, of the same tenant: the tenant of the task's mailbox key) this task
    /// waits for: it is admitted and held (`WaitReason::Dependencies`) until every one of
    /// them succeeded, then ranks by its own metadata. If one fails, is cancelled or
    /// expires, it ends `Cancelled` (its events say which parent, `TaskStep::ParentFailed`),
    /// unless [`run_if_parents_fail`](Self::run_if_parents_fail). Each must be live in the
    /// pool or have ended recently; an unknown id, another tenant's task, the task itself,
    /// or more than [`MAX_PARENTS`](crate::domain::MAX_PARENTS) ids are refused at submit
    /// (`PoolError::Dependency`). Kept by the in-memory queue, by the Postgres table queue
    /// with `"dependencies": true` and by the in-memory shared queue (across nodes: a
    /// parent may run on any node); a
    /// pool on another queue refuses the submission with `DependencyError::Unsupported`,
    /// which names the queues that keep them.
    pub depends_on: Vec<TaskId>,
    /// Runs the task once every parent ended, however they ended (a cleanup step), instead
    /// of cancelling it when one did not succeed.
    pub run_if_parents_fail: bool,
    /// What the task needs beside its metadata's `cost`, one cost per other kind (a provider
    /// call's requests beside its tokens, a decode sequence's engine slot beside its
    /// KV-cache blocks): it starts only when every kind fits, holds them all while it runs
    /// and gives them all back when it ends, however it ends. A kind named twice (here, or
    /// as the metadata's) is refused (`InvalidConfig`, naming it), as is a kind the pool has
    /// fewer units of (`InsufficientResources`). Kept by pools on the in-memory and yaque
    /// queues (yaque stores the costs, so a restart holds every kind again) without a fair
    /// share or `max_queued_units`; elsewhere the submission is refused, naming the queue or
    /// the rule.
    pub also: Vec<ResourceCost>,
}

impl SubmitOptions {
    /// These options with one more cost of another kind (see [`also`](Self::also)).
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::ResourceCost;
    /// use prometheus_parking_lot_actors::scheduler::protocol::SubmitOptions;
    ///
    /// // A provider call: its metadata's cost is its tokens; it spends a request too.
    /// let options = SubmitOptions::default().with_also(ResourceCost::mixed(1));
    /// assert_eq!(options.also, vec![ResourceCost::mixed(1)]);
    /// ```
    pub fn with_also(mut self, cost: ResourceCost) -> Self {
        self.also.push(cost);
        self
    }

    /// These options with the task in the trace `parent` (see [`trace`](Self::trace)).
    ///
    /// ```
    /// use prometheus_parking_lot_actors::scheduler::protocol::SubmitOptions;
    ///
    /// let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// let options = SubmitOptions::default().with_traceparent(header.parse().unwrap());
    /// assert_eq!(options.trace.unwrap().to_string(), header);
    /// ```
    pub fn with_traceparent(mut self, parent: TraceParent) -> Self {
        self.trace = Some(parent);
        self
    }

    /// How far ahead a scheduled start may be: one year and a day. A `not_before_ms` later
    /// than this from the submission is refused, as a mistake (seconds for milliseconds, a
    /// wrong epoch) is likelier than a task meant to wait longer.
    pub const MAX_NOT_BEFORE_AHEAD: Duration = Duration::from_secs(366 * 24 * 3600);

    /// The task does not start before `instant` (see [`not_before_ms`](Self::not_before_ms));
    /// an instant before the Unix epoch means as soon as it can.
    pub fn with_not_before(mut self, instant: SystemTime) -> Self {
        let since_epoch = instant.duration_since(UNIX_EPOCH).unwrap_or_default();
        self.not_before_ms = Some(since_epoch.as_millis());
        self
    }

    /// The task does not start before `delay` has passed from now (read from the system
    /// clock here, as [`with_not_before`](Self::with_not_before) of now plus `delay`).
    pub fn with_delay(mut self, delay: Duration) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.not_before_ms = Some(now.as_millis().saturating_add(delay.as_millis()));
        self
    }

    /// The instant before which a task admitted at `now` (ms since the epoch) with a
    /// deadline `deadline_ms` must not start: `None` for an ordinary submission (no
    /// `not_before_ms`, or one at or before `now`), else the instant, or why it is refused.
    pub(crate) fn sleeps_until(
        &self,
        deadline_ms: Option<u128>,
        now: u64,
    ) -> Result<Option<u64>, PoolError> {
        let Some(not_before_ms) = self.not_before_ms.filter(|&at| at > u128::from(now)) else {
            return Ok(None);
        };
        let horizon = u128::from(now) + Self::MAX_NOT_BEFORE_AHEAD.as_millis();
        if not_before_ms > horizon {
            return Err(PoolError::InvalidConfig(format!(
                "SubmitOptions::not_before_ms {not_before_ms} is {} ms ahead of now ({now} ms \
                 since the Unix epoch); a scheduled start may be at most {} ms (366 days) \
                 ahead, in milliseconds since the Unix epoch",
                not_before_ms - u128::from(now),
                Self::MAX_NOT_BEFORE_AHEAD.as_millis()
            )));
        }
        if let Some(deadline_ms) = deadline_ms.filter(|&deadline| deadline <= not_before_ms) {
            return Err(PoolError::InvalidConfig(format!(
                "SubmitOptions::not_before_ms {not_before_ms} is not before the task's \
                 deadline_ms {deadline_ms}: it could never start in time; a scheduled start \
                 must be before the deadline (or drop the deadline)"
            )));
        }
        // Within the horizon, so it fits in 64 bits.
        Ok(Some(u64::try_from(not_before_ms).unwrap_or(u64::MAX)))
    }

    /// These options with an execution timeout of `timeout` for the task.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// These options with the task depending on `parents` (see
    /// [`depends_on`](Self::depends_on)), added to any named already.
    pub fn with_depends_on(mut self, parents: impl IntoIterator<Item = TaskId>) -> Self {
        self.depends_on.extend(parents);
        self
    }

    /// These options with the task running once its parents ended, however they ended (see
    /// [`run_if_parents_fail`](Self::run_if_parents_fail)).
    pub fn run_if_parents_fail(mut self) -> Self {
        self.run_if_parents_fail = true;
        self
    }
}

/// What a drain did. Every caller of `shutdown` gets the same report.
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

/// The scheduler's public protocol: requests only.
pub enum SchedulerRequest<P> {
    /// Admit a task; the reply carries its mailbox key or why it was refused.
    Submit {
        /// The task.
        task: ScheduledTask<P>,
        /// Its options.
        options: SubmitOptions,
        /// Where the admission answer goes.
        reply: RpcReplyPort<Result<MailboxKey, PoolError>>,
    },
    /// Admit a task whose executor streams partial results into `stream` (made with
    /// `ResultStream::channel`, whose other half the caller reads); its final outcome ends
    /// the stream instead of going to the mailbox. Refused (`InvalidConfig`) on a pool whose
    /// queue is shared with other nodes, or when the stream's item type is not the pool's.
    SubmitStreaming {
        /// The task.
        task: ScheduledTask<P>,
        /// Its options.
        options: SubmitOptions,
        /// Where its partials and outcome go.
        stream: StreamAttachment,
        /// Where the admission answer goes.
        reply: RpcReplyPort<Result<MailboxKey, PoolError>>,
    },
    /// Stop admitting, drain running tasks up to `drain`, end or keep parked tasks.
    Shutdown {
        /// How long running tasks may take to finish (`Duration::MAX`: for ever).
        drain: Duration,
        /// The report, once drained.
        reply: RpcReplyPort<ShutdownReport>,
    },
    /// An operator's request about the pool's work: cancel, pause, drain, inspect, why a
    /// task waits, the counters (see [`ControlRequest`]).
    Control(ControlRequest),
}

/// The scheduler actor's message: a [`SchedulerRequest`], or an event only the engine can
/// make (opaque outside the crate).
pub struct SchedulerMsg<P>(pub(crate) Internal<P>);

/// Every message the scheduler handles.
pub(crate) enum Internal<P> {
    /// A public request.
    Request(SchedulerRequest<P>),
    /// The inbox has work (see [`super::inbox`]).
    Drain,
    /// Time-driven work is due: deadlines, starvation aging, the execution watchdog.
    Tick,
    /// The supervisor gave up on the pool.
    Escalated { reason: String },
    /// A worker failed and will not be restarted: retire its slot, fail its task.
    WorkerLost { worker: usize, reason: String },
    /// The drain deadline passed.
    DrainDeadline,
    /// The queue actor answered.
    Queue(QueueReport<P>),
    /// A shared-queue call answered, or its poll interval passed.
    Shared(SharedReport<P>),
    /// The GPU sampler's latest headroom for the live guard.
    Headroom(Headroom),
}

/// A headroom for the core's live guard: at most `units` of `kind` may be used now (`None`:
/// no cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Headroom {
    pub kind: ResourceKind,
    pub units: Option<u32>,
}

impl<P> From<SchedulerRequest<P>> for SchedulerMsg<P> {
    fn from(request: SchedulerRequest<P>) -> Self {
        SchedulerMsg(Internal::Request(request))
    }
}

impl<P> TryFrom<SchedulerMsg<P>> for SchedulerRequest<P> {
    type Error = ();

    fn try_from(message: SchedulerMsg<P>) -> Result<Self, ()> {
        match message.0 {
            Internal::Request(request) => Ok(request),
            _ => Err(()),
        }
    }
}

/// Where an admission answer goes.
pub(crate) enum Reply {
    /// A `PoolClient` awaiting (or blocking on) a oneshot.
    Oneshot(oneshot::Sender<Result<MailboxKey, PoolError>>),
    /// An actor-protocol caller.
    Port(RpcReplyPort<Result<MailboxKey, PoolError>>),
}

impl Reply {
    pub fn send(self, answer: Result<MailboxKey, PoolError>) {
        match self {
            Reply::Oneshot(sender) => {
                let _ = sender.send(answer);
            }
            Reply::Port(port) => {
                let _ = port.send(answer);
            }
        }
    }
}

/// What a few submissions carry beyond the task (boxed, so the rest carry one null pointer).
#[derive(Default)]
pub(crate) struct Extras {
    /// A streamed task's buffer: its outcome goes there.
    pub stream: Option<StreamAttachment>,
    /// The nested slot of a task submitted from one of the pool's own workers, held until
    /// the task's worker is free again (see [`crate::sync::slots`]).
    pub slot: Option<SlotGuard>,
    /// The trace the task belongs to (see [`SubmitOptions::trace`]).
    pub trace: Option<TraceParent>,
    /// The mark the client read before it asked a mailbox that awaits whether a result
    /// waits (see `mailbox/watch.rs`); `None` when it asked nothing.
    pub results_mark: Option<u64>,
    /// What the task needs beside its first cost (see [`SubmitOptions::also`]).
    pub also: ExtraCosts,
}

impl Extras {
    /// `extras` with the task in trace `trace`, if it has one, once admission read them:
    /// without the [mark](Self::results_mark), and `None` when nothing else is left.
    pub fn with_trace(
        extras: Option<Box<Extras>>,
        trace: Option<TraceParent>,
    ) -> Option<Box<Extras>> {
        Self::with_trace_and_costs(extras, trace, ExtraCosts::NONE)
    }

    /// [`with_trace`](Self::with_trace), with the costs `also` the task needs beside its
    /// first.
    pub fn with_trace_and_costs(
        extras: Option<Box<Extras>>,
        trace: Option<TraceParent>,
        also: ExtraCosts,
    ) -> Option<Box<Extras>> {
        let mut extras = match (extras, trace, also.is_empty()) {
            (None, None, true) => return None,
            (extras, ..) => extras.unwrap_or_default(),
        };
        extras.results_mark = None;
        if trace.is_some() {
            extras.trace = trace;
        }
        extras.also = also;
        let kept = extras.stream.is_some()
            || extras.slot.is_some()
            || extras.trace.is_some()
            || !also.is_empty();
        kept.then_some(extras)
    }
}

/// A submission through the inbox.
pub(crate) enum Submission<P> {
    /// One task with its own answer.
    One {
        task: ScheduledTask<P>,
        options: SubmitOptions,
        reply: Reply,
        extras: Option<Box<Extras>>,
    },
    /// Many tasks, answered together, in order.
    Batch {
        tasks: Vec<ScheduledTask<P>>,
        options: SubmitOptions,
        reply: oneshot::Sender<Vec<Result<MailboxKey, PoolError>>>,
        /// The nested slots of a batch from one of the pool's own workers, one per task in
        /// order (empty otherwise).
        slots: Vec<SlotGuard>,
        /// See [`Extras::results_mark`].
        results_mark: Option<u64>,
    },
}

impl<P> Submission<P> {
    /// Answers the submission with `error` without admitting anything.
    pub fn refuse(self, error: PoolError) {
        match self {
            Submission::One { task, reply, .. } => {
                reply.send(Err(error));
                crate::util::contain::drop_contained(task);
            }
            Submission::Batch { tasks, reply, .. } => {
                let answers = tasks.iter().map(|_| Err(error.clone())).collect();
                let _ = reply.send(answers);
                for task in tasks {
                    crate::util::contain::drop_contained(task);
                }
            }
        }
    }
}
