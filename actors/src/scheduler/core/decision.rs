//! What the core answers: decisions the driver carries out.

use thiserror::Error;

use crate::domain::{DependencyError, PoolError, ResourceKind, TaskId};

/// The answer to admitting a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Start it now; its capacity is held from this moment.
    Start,
    /// Start it now, and these parked tasks too, in this order. Only under a fair share:
    /// the newcomer's start changes its tenant's usage, and so which starving task the pool
    /// reserves for, which can let parked tasks that were held back start.
    StartWith(Vec<TaskId>),
    /// It waits in the parking lot.
    Park,
    /// It waits in the parking lot in the place of parked tasks of lower priority, which
    /// leave it refused (rule 21): each ends `Rejected` with `QueueFull`, never silently.
    /// Their leaving may unblock parked tasks, which start now.
    ParkShedding {
        /// The parked tasks shed, lowest-ranked first.
        shed: Vec<TaskId>,
        /// Parked tasks to start now, in this order.
        started: Vec<TaskId>,
    },
    /// Its deadline has passed already; it ends `Expired` without running.
    Expire,
    /// It is refused; it ends `Rejected`.
    Reject(Rejection),
}

impl Admit {
    /// Splits [`Admit::StartWith`] into [`Admit::Start`] and the parked tasks that start with
    /// it, and the started tasks of [`Admit::ParkShedding`] off it (which keeps its shed
    /// tasks); any other answer comes back with no tasks.
    pub fn split_started(self) -> (Admit, Vec<TaskId>) {
        match self {
            Admit::StartWith(started) => (Admit::Start, started),
            Admit::ParkShedding { shed, started } => (
                Admit::ParkShedding {
                    shed,
                    started: Vec::new(),
                },
                started,
            ),
            other => (other, Vec::new()),
        }
    }

    /// The answer taken apart: what happens to the newcomer, the parked tasks that start
    /// with it (see [`Admit::StartWith`]) and the parked tasks shed to make room for it (see
    /// [`Admit::ParkShedding`]), in a type that has no compound answer left to handle.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, AdmitParts, Newcomer};
    ///
    /// let parts = Admit::ParkShedding { shed: vec![7], started: vec![] }.newcomer();
    /// assert_eq!(parts, AdmitParts { newcomer: Newcomer::Park, started: vec![], shed: vec![7] });
    /// assert_eq!(Admit::StartWith(vec![3]).newcomer().started, vec![3]);
    /// ```
    pub fn newcomer(self) -> AdmitParts {
        let (newcomer, started, shed) = match self {
            Admit::Start => (Newcomer::Start, Vec::new(), Vec::new()),
            Admit::StartWith(started) => (Newcomer::Start, started, Vec::new()),
            Admit::Park => (Newcomer::Park, Vec::new(), Vec::new()),
            Admit::ParkShedding { shed, started } => (Newcomer::Park, started, shed),
            Admit::Expire => (Newcomer::Expire, Vec::new(), Vec::new()),
            Admit::Reject(rejection) => (Newcomer::Reject(rejection), Vec::new(), Vec::new()),
        };
        AdmitParts {
            newcomer,
            started,
            shed,
        }
    }
}

/// An [`Admit`] taken apart (see [`Admit::newcomer`]): the driver ends the shed tasks
/// refused, carries out the newcomer's answer and starts the started tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitParts {
    /// What happens to the newcomer itself.
    pub newcomer: Newcomer,
    /// Parked tasks that start now, in this order.
    pub started: Vec<TaskId>,
    /// Parked tasks shed to make room for the newcomer; each ends refused (`QueueFull`).
    pub shed: Vec<TaskId>,
}

/// What admission does with the newcomer itself (see [`Admit::newcomer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Newcomer {
    /// It starts now; its capacity is held from this moment.
    Start,
    /// It waits in the parking lot.
    Park,
    /// Its deadline has passed already.
    Expire,
    /// It is refused.
    Reject(Rejection),
}

/// Why admission refused a task.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Rejection {
    /// The task costs more than the pool's total capacity of its kind, so it could never run.
    #[error("the task needs {needed} units of {kind} but the pool has {capacity} in total")]
    InsufficientResources {
        /// The kind asked for.
        kind: ResourceKind,
        /// Units asked for.
        needed: u32,
        /// The pool's total units of that kind.
        capacity: u32,
    },
    /// The task costs more than one tenant may hold under the pool's fair share, so it could
    /// never run.
    #[error("the task needs {needed} units of {kind} but the pool's fair share lets one tenant hold at most {max_per_tenant}")]
    AboveTenantShare {
        /// The kind asked for.
        kind: ResourceKind,
        /// Units asked for.
        needed: u32,
        /// The fair share's cap per tenant of that kind.
        max_per_tenant: u32,
    },
    /// The parking lot is full, and no parked task of lower priority could make room.
    #[error("the parking lot holds its maximum of {max_queue_depth} tasks")]
    QueueFull {
        /// The configured bound.
        max_queue_depth: usize,
    },
    /// The parked units of the task's kind would pass `max_queued_units`, and parked tasks
    /// of lower priority could not make room (rule 21).
    #[error(
        "the parking lot holds {queued} units of {kind}; the task's {needed} would pass \
         its max_queued_units of {max_queued_units}"
    )]
    QueueUnitsFull {
        /// The task's kind.
        kind: ResourceKind,
        /// Units of that kind parked now.
        queued: u64,
        /// Units the task asks for.
        needed: u32,
        /// The configured bound.
        max_queued_units: u64,
    },
    /// The task needs several kinds (rule 25), and the pool keeps a rule that counts one
    /// kind per task.
    #[error(
        "the task needs several kinds of resource, and this pool's {rule} counts one kind \
         per task: give the task one cost, or run it on a pool without {rule}"
    )]
    SeveralKinds {
        /// The pool's rule: `a fair share` or `max_queued_units`.
        rule: &'static str,
    },
    /// A live task (parked or running) has this id already.
    #[error("a live task with id {0} exists already")]
    DuplicateId(TaskId),
    /// A ticket to hold until its parents end (rule 24) named one that is not live in the
    /// lot, or itself.
    #[error("parent {0} is not a live task of this pool")]
    UnknownParent(TaskId),
}

impl From<Rejection> for PoolError {
    fn from(rejection: Rejection) -> Self {
        match rejection {
            Rejection::InsufficientResources {
                kind,
                needed,
                capacity,
            } => PoolError::InsufficientResources {
                needed: needed as usize,
                available: capacity as usize,
                kind,
            },
            Rejection::AboveTenantShare {
                kind,
                needed,
                max_per_tenant,
            } => PoolError::InsufficientResources {
                needed: needed as usize,
                available: max_per_tenant as usize,
                kind,
            },
            Rejection::QueueFull { .. } | Rejection::QueueUnitsFull { .. } => PoolError::QueueFull,
            Rejection::DuplicateId(id) => PoolError::DuplicateTask(id),
            several @ Rejection::SeveralKinds { .. } => {
                PoolError::InvalidConfig(several.to_string())
            }
            Rejection::UnknownParent(parent) => {
                PoolError::Dependency(Box::new(DependencyError::UnknownParent { parent }))
            }
        }
    }
}

/// The answer to cancelling a live task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancel {
    /// It was parked and is gone; it ends `Cancelled`. Removing it may have lifted a
    /// reservation, so `started` lists tasks that start now.
    Parked {
        /// Tasks to start now.
        started: Vec<TaskId>,
    },
    /// It is running: the driver must stop it, then call `complete` to release its capacity
    /// (the core keeps it accounted until then, because its memory is still in use).
    Running,
}

/// What happened at a timer tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tick {
    /// Parked tasks whose deadline passed; each ends `Expired`.
    pub expired: Vec<TaskId>,
    /// Tasks to start now (an expired reservation may unblock others).
    pub started: Vec<TaskId>,
    /// Running tasks past the time [`ParkingLot::watch`](super::ParkingLot::watch) gave them;
    /// each is reported once. They keep their capacity until `complete`.
    pub overdue: Vec<TaskId>,
}

/// A call that names a task the core does not hold in the needed state.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UnknownTask {
    /// `complete` of a task that is not running (never started, or released already).
    #[error("task {0} is not running; capacity is released exactly once per start")]
    NotRunning(TaskId),
    /// `cancel` of a task that is neither parked nor running.
    #[error("task {0} is neither parked nor running")]
    NotLive(TaskId),
    /// `absorb` of two running tasks that cannot become one (rule 14).
    #[error("task {child} cannot be absorbed into task {parent}: {reason}")]
    CannotAbsorb {
        /// The task whose units were to move.
        child: TaskId,
        /// The task that was to take them.
        parent: TaskId,
        /// What differs between them.
        reason: AbsorbRefusal,
    },
    /// `adopt` of an id that is parked or running already (rule 19).
    #[error("task {0} is live already; a fast-path holder is adopted under a fresh id")]
    AlreadyLive(TaskId),
    /// `adopt` or `settle` of more units than the lanes lent (rule 19).
    #[error("task {0} takes over more units than the fast path was lent")]
    NotLent(TaskId),
}

/// Why two running tasks cannot become one: units move only within one kind and one tenant,
/// so the pool's and the tenants' books stay exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum AbsorbRefusal {
    /// Child and parent are the same task.
    #[error("a task cannot absorb itself")]
    SameTask,
    /// They hold different kinds.
    #[error("the child holds {child:?}, the parent {parent:?}")]
    OtherKind {
        /// The child's kind.
        child: ResourceKind,
        /// The parent's kind.
        parent: ResourceKind,
    },
    /// They count against different tenants.
    #[error("the child counts against tenant {child}, the parent against tenant {parent}")]
    OtherTenant {
        /// The child's tenant.
        child: u64,
        /// The parent's tenant.
        parent: u64,
    },
}
