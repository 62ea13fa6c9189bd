//! The scheduler's event stream: what happened to each task, and when.
//!
//! The scheduler publishes one event per step of a task's life, with the time of the core's
//! decision: admitted (or claimed from a shared queue; then started or parked), started,
//! ended. After each batch of
//! events it also publishes a [`PoolReading`]: the gauges its core holds (running, parked,
//! units in use) and the failure counts no event carries. Subscribers (the pool's counters,
//! metrics, audit logs) hear every event and every reading on the scheduler's thread, in
//! order, so a subscriber must return at once: count, or hand the event to a queue of its
//! own. Results and their notifiers are the mailbox's business
//! ([`Notifier`](crate::mailbox::Notifier)): an `Ended` event may arrive before the result is
//! retrievable.

use crate::domain::{
    Budget, MailboxKey, PoolError, Priority, ResourceCost, ResourceKind, TaskId, TaskStatus,
};
use crate::observe::trace::TraceParent;

/// One step of a task's life. It serialises with its name in `step` and its fields, if
/// any, in `detail`: `{"step": "ended", "detail": "Completed"}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "step", content = "detail", rename_all = "snake_case")]
pub enum TaskStep {
    /// A submission to this pool accepted by admission; a `Started` or `Parked` follows at
    /// the same time (for a task handed to a shared queue, `Parked` there). Once per
    /// submission: a task this node claims from a shared queue, or resumes from a durable
    /// one, was admitted where it was submitted, and steps [`Claimed`](Self::Claimed) or
    /// nothing here instead.
    Admitted,
    /// Taken from a shared queue by this node under a lease (submitted here or on another
    /// node, whose `Admitted` counted it); a `Started` or `Parked` follows at the same time.
    /// A task claimed again after its lease ran out steps it again.
    Claimed,
    /// Waiting in the parking lot.
    Parked,
    /// Running on a worker thread; its cost is held from now until it ends.
    Started,
    /// Ended in this state: exactly one per task, on the node that ended it (the one that
    /// ran it; for a task that ended parked in a shared queue, the one that removed it or
    /// heard the queue give up on it). Where the task was admitted or claimed, it comes
    /// after that step. A submission already past its deadline ends `Expired` at once,
    /// without being admitted.
    Ended(TaskStatus),
    /// Refused at admission, for this reason (never admitted, so no `Ended` follows).
    Refused(Refusal),
    /// A held capacity permit was asked to yield to a waiter of higher priority.
    YieldAsked,
    /// A permit asked to yield was dropped, giving back `units`.
    Yielded {
        /// The units it held when it was dropped.
        units: u32,
    },
    /// A task this node claimed from a shared queue lost its claim (its lease ran out and
    /// another node may run it): its run here was stopped, or its outcome was refused by the
    /// claim's fence, so nothing of this run was published. Another node's run ends it; no
    /// `Ended` follows here.
    LeaseLost,
    /// Parked (just after `Parked`) because its kind's budget holds too few units now (or no
    /// start, under a start cap): units of that kind refill with time. Tasks ranked ahead
    /// of it may spend first, so it starts at `until_ms` at the earliest.
    WaitsForBudget {
        /// When the budget will hold its units, by the core's clock (ms since the epoch).
        until_ms: u128,
    },
    /// Parked (just after `Parked`) held until `pending` tasks it depends on end
    /// (`SubmitOptions::depends_on`): it takes no part in any decision until then.
    WaitsForParents {
        /// Its parents still live.
        pending: u32,
    },
    /// A task it depends on, `parent` (its id), ended `status` without succeeding, so it
    /// will not run: an `Ended(Cancelled)` follows at once.
    ParentFailed {
        /// The parent's id.
        parent: TaskId,
        /// How the parent ended.
        status: TaskStatus,
    },
    /// A run failed in a way worth trying again (its executor panicked, or asked with
    /// `running::retry_later`) and the pool retries failed runs: its output was discarded
    /// and the task parks again from `at_ms` on, for run number `attempt`. No `Ended`
    /// follows for this run.
    Retrying {
        /// The number of the next run (2 for the first retry).
        attempt: u32,
        /// When it parks again, by the core's clock (ms since the epoch).
        at_ms: u128,
        /// Why the run failed.
        reason: String,
    },
}

/// Why admission refused a task, in a few stable categories (a metrics label; the
/// submitter's [`PoolError`] carries the details).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The parking lot is at its `max_queue_depth`.
    QueueFull,
    /// The task costs more than the pool has in total of its kind.
    TooLarge,
    /// Stored results plus live tasks reached the mailbox's bound.
    MailboxFull,
    /// A live task of the same tenant has the same id.
    Duplicate,
    /// The pool is shutting down, drained by an operator, or stopped accepting work after
    /// its workers failed.
    Shutdown,
    /// The queue backend could not store the task.
    QueueError,
    /// The task was expected to start after its deadline (`refuse_if_late`).
    Late,
    /// Any other error.
    Other,
}

impl Refusal {
    /// Every refusal, in declaration order.
    pub const ALL: [Refusal; 8] = [
        Refusal::QueueFull,
        Refusal::TooLarge,
        Refusal::MailboxFull,
        Refusal::Duplicate,
        Refusal::Shutdown,
        Refusal::QueueError,
        Refusal::Late,
        Refusal::Other,
    ];

    /// The category of the error a submitter was refused with.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::PoolError;
    /// use prometheus_parking_lot_actors::observe::events::Refusal;
    /// assert_eq!(Refusal::of(&PoolError::QueueFull), Refusal::QueueFull);
    /// assert_eq!(Refusal::of(&PoolError::DuplicateTask(7)).label(), "duplicate");
    /// ```
    pub fn of(error: &PoolError) -> Self {
        match error {
            PoolError::QueueFull => Refusal::QueueFull,
            PoolError::InsufficientResources { .. } => Refusal::TooLarge,
            PoolError::MailboxFull { .. } => Refusal::MailboxFull,
            PoolError::DuplicateTask(_) | PoolError::ResultPending(_) => Refusal::Duplicate,
            PoolError::Shutdown | PoolError::Draining | PoolError::Internal(_) => Refusal::Shutdown,
            PoolError::Backend(_) => Refusal::QueueError,
            PoolError::WouldMissDeadline(_) => Refusal::Late,
            _ => Refusal::Other,
        }
    }

    /// A short snake_case name: `queue_full`, `too_large`, `mailbox_full`, `duplicate`,
    /// `shutdown`, `queue_error`, `late`, `other`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue_full",
            Refusal::TooLarge => "too_large",
            Refusal::MailboxFull => "mailbox_full",
            Refusal::Duplicate => "duplicate",
            Refusal::Shutdown => "shutdown",
            Refusal::QueueError => "queue_error",
            Refusal::Late => "late",
            Refusal::Other => "other",
        }
    }

    /// Its position in [`Refusal::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// An event of one task.
#[derive(Debug, Clone, Copy)]
pub struct TaskEvent<'a> {
    /// The caller's id of the task.
    pub task_id: TaskId,
    /// The mailbox its result goes to.
    pub key: &'a MailboxKey,
    /// What it costs.
    pub cost: ResourceCost,
    /// What happened.
    pub step: &'a TaskStep,
    /// When, in milliseconds since the Unix epoch (the `now` of the core's decision).
    pub at_ms: u128,
    /// The start of the interval this step closes, by the core's clock: for `Started`, when
    /// the task was admitted (so `at_ms - since_ms` is its wait); for `Ended`, when it
    /// started, if it ran (its run time). `None` for other steps and for a task that ended
    /// without running.
    pub since_ms: Option<u128>,
    /// Its priority, on every step of a task the scheduler holds; `None` on steps reported
    /// from outside it (a refusal or an end reported by a shared queue's backend).
    pub priority: Option<Priority>,
    /// The trace the task belongs to, if it carries one.
    pub trace: Option<&'a TraceParent>,
    /// Which run of the task the step belongs to, on steps of a task the scheduler holds: 1
    /// for the first, one more for each retry of a failed run or each claim of a shared
    /// queue's task after its lease ran out.
    pub attempt: Option<u32>,
    /// On a `Parked` step, why the task waits, by name (as [`WaitReason::name`] gives it),
    /// when a subscriber asked for reasons ([`EventSubscriber::wants_wait_reasons`]).
    ///
    /// [`WaitReason::name`]: crate::scheduler::core::WaitReason::name
    pub wait_reason: Option<&'static str>,
}

/// What the scheduler publishes after each batch of events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolReading {
    /// Tasks running now.
    pub running: usize,
    /// Tasks parked now.
    pub parked: usize,
    /// Units held by running tasks, per kind (indexed by [`ResourceKind::index`]).
    pub used_by_kind: [u64; ResourceKind::COUNT],
    /// Worker threads restarted after a panic, since the pool started.
    pub worker_restarts: u64,
    /// Queue backend calls that failed (park, claim, settle, remove), since the pool started.
    pub queue_errors: u64,
    /// The budget of each kind that has one (indexed by [`ResourceKind::index`]).
    pub budgets: [Option<BudgetReading>; ResourceKind::COUNT],
    /// Whether the pool is paused (it starts nothing until resumed).
    pub paused: bool,
}

/// A budget's reading: its shape, its level, and when the task that waits for it first
/// could start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetReading {
    /// The budget as configured.
    pub budget: Budget,
    /// Whole units in the bucket now.
    pub level: u32,
    /// When the best-ranked task parked on the budget could start as far as the budget
    /// goes, if it waits for it (ms since the epoch, by the core's clock).
    pub ready_at_ms: Option<u128>,
    /// The same as a wait from the reading's time, ms.
    pub ready_in_ms: Option<u64>,
}

/// Hears every event of a pool's tasks. See the module docs for the rules.
pub trait EventSubscriber: Send + Sync {
    /// Takes note of one event. Must return at once.
    fn on_event(&self, event: &TaskEvent<'_>);

    /// Takes note of the pool's reading, published after each batch of events. Must return
    /// at once. The default ignores it.
    fn on_reading(&self, reading: &PoolReading) {
        let _ = reading;
    }

    /// Whether `Parked` events should say why the task waits ([`TaskEvent::wait_reason`]):
    /// asked once, when the pool starts. The default does not (it costs a look at the
    /// scheduler's state for every task that parks).
    fn wants_wait_reasons(&self) -> bool {
        false
    }
}

/// An event as an [`EventFeed`] hands it out: owned and serialisable. Like every event it
/// holds no payload and no result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FeedEvent {
    /// The caller's id of the task.
    pub task_id: TaskId,
    /// The mailbox its result goes to.
    pub key: MailboxKey,
    /// What it costs.
    pub cost: ResourceCost,
    /// What happened.
    pub step: TaskStep,
    /// When, ms since the Unix epoch.
    pub at_ms: u128,
    /// The start of the interval this step closes (see [`TaskEvent::since_ms`]).
    pub since_ms: Option<u128>,
    /// Its priority, where known.
    pub priority: Option<Priority>,
}

/// A pool's events for whoever listens at the moment (an admin server's live view, a test):
/// every pool has one ([`PoolControl::events`](crate::engine::PoolControl::events)). While
/// nobody listens an event costs one atomic read; a listener that falls more than the
/// feed's capacity behind misses the oldest (it is told how many).
pub struct EventFeed {
    sender: tokio::sync::broadcast::Sender<FeedEvent>,
}

impl EventFeed {
    /// Events a listener may fall behind before it misses some.
    pub const CAPACITY: usize = 4_096;

    /// A feed nobody listens to yet.
    pub fn new() -> Self {
        Self {
            sender: tokio::sync::broadcast::Sender::new(Self::CAPACITY),
        }
    }

    /// A new listener: it hears every event from now on.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<FeedEvent> {
        self.sender.subscribe()
    }
}

impl Default for EventFeed {
    fn default() -> Self {
        Self::new()
    }
}

impl EventSubscriber for EventFeed {
    fn on_event(&self, event: &TaskEvent<'_>) {
        if self.sender.receiver_count() == 0 {
            return;
        }
        let _ = self.sender.send(FeedEvent {
            task_id: event.task_id,
            key: event.key.clone(),
            cost: event.cost,
            step: event.step.clone(),
            at_ms: event.at_ms,
            since_ms: event.since_ms,
            priority: event.priority,
        });
    }
}
