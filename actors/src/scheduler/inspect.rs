//! What an operator sees of a pool's work at one instant: its running tasks, a page of its
//! parked tasks in rank order with the reason each waits, its place in line and when it is
//! expected to start, and its tenants
//! ([`PoolControl::inspect`](crate::engine::PoolControl::inspect)); and one task's wait
//! ([`PoolControl::waiting`](crate::engine::PoolControl::waiting)).
//!
//! A [`PoolSnapshot`] is a view and the pool's counters read together
//! ([`PoolControl::snapshot`](crate::engine::PoolControl::snapshot)), so that a page showing
//! both shows one instant.
//!
//! A view names tasks by their caller's key and id and says what they cost; it never holds a
//! payload or a result (they carry users' prompts).

use serde::Serialize;

use crate::domain::{MailboxKey, Priority, ResourceCost, TaskId, TenantId};
use crate::observe::stats::PoolStats;
use crate::scheduler::core::{StartEstimate, WaitReason};
use crate::util::clock::engine_ms;

/// The most parked tasks one view lists.
pub const MAX_PAGE: usize = 1_000;

/// A pool's work at one instant. See the module docs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolView {
    /// Whether the pool is paused (it admits, and starts nothing).
    pub paused: bool,
    /// Whether the pool is draining (it refuses new work and runs what it has).
    pub draining: bool,
    /// The running tasks (and held permits), longest-running first.
    pub running: Vec<TaskView>,
    /// The page of parked tasks asked for, best-ranked first, each with its reason; the
    /// sleeping ones (a retry's backoff, a scheduled start) after them, each `Sleeping`
    /// until its time.
    pub parked: Vec<TaskView>,
    /// How many tasks are parked on this node in all (a shared queue's are the queue's).
    pub parked_total: usize,
    /// The page's first index in rank order.
    pub offset: usize,
    /// Each tenant with live tasks here, by name.
    pub tenants: Vec<TenantView>,
}

/// A pool's view and counters at one instant: the gauges of `stats` (running, parked, units
/// held per kind) count exactly the tasks `view` lists, since the scheduler reads both
/// between two of its steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolSnapshot {
    /// The pool's counters and gauges.
    pub stats: PoolStats,
    /// Its work.
    pub view: PoolView,
}

/// A live task, as a view shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskView {
    /// The caller's id.
    pub id: TaskId,
    /// The key it was submitted under (where its outcome goes).
    pub key: MailboxKey,
    /// What it costs.
    pub cost: ResourceCost,
    /// What it costs beside `cost`, one cost per other kind it needs (core rule 25): empty
    /// for a task of one kind.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<ResourceCost>,
    /// Its priority.
    pub priority: Priority,
    /// Whether it is a permit (units without a worker slot) rather than a task.
    pub permit: bool,
    /// When it was admitted (parked) or started (running), ms since the Unix epoch.
    pub since_ms: u128,
    /// Which run this is (1 for the first; more after retries and lost leases).
    pub attempt: u32,
    /// Why it waits (parked tasks; `None` for running ones).
    pub reason: Option<WaitReason>,
    /// Its place among the parked tasks of its kind, 1 for the first (parked tasks; `None`
    /// for running ones). See [`StartEstimate`].
    pub position: Option<usize>,
    /// When it is expected to start, ms since the Unix epoch (parked tasks whose start the
    /// pool can estimate; see [`StartEstimate`] and `PARKING_LOT.md`, "When will it start").
    pub expected_start_ms: Option<u128>,
    /// `true` when `expected_start_ms` counts every run at its execution timeout, the pool
    /// having seen no run of the task's kind yet: a latest start, not an expectation (see
    /// [`StartEstimate::from_timeouts`](crate::scheduler::core::StartEstimate::from_timeouts)).
    pub from_timeouts: bool,
}

/// Why one parked task waits, its place in line and when it is expected to start, as of
/// `at_ms`.
///
/// ```
/// use prometheus_parking_lot_actors::scheduler::core::WaitReason;
/// use prometheus_parking_lot_actors::scheduler::inspect::WaitView;
///
/// let view = WaitView {
///     reason: WaitReason::Worker { busy: 4 },
///     position: 3,
///     expected_start_ms: Some(14_200),
///     from_timeouts: false,
///     at_ms: 10_000,
/// };
/// assert_eq!(view.in_words(), "3rd in line, expected in ~4.2 s");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaitView {
    /// The first obstacle (core rule 17).
    pub reason: WaitReason,
    /// Its place among the parked tasks of its kind, 1 for the first; 0 for a task held
    /// out of line (waiting for its parents, or sleeping in a shared queue until its
    /// instant).
    pub position: usize,
    /// When it is expected to start, ms since the Unix epoch; `None` when the pool cannot
    /// say (paused, or what it needs is held by a run of unknown length).
    pub expected_start_ms: Option<u128>,
    /// `true` when `expected_start_ms` counts every run at its execution timeout (no run of
    /// the task's kind seen yet): a latest start, not an expectation.
    pub from_timeouts: bool,
    /// When the view was taken, ms since the Unix epoch.
    pub at_ms: u128,
}

impl WaitView {
    /// "3rd in line, expected in ~4.2 s".
    pub fn in_words(&self) -> String {
        let estimate = StartEstimate {
            position: self.position,
            start_ms: self.expected_start_ms.map(engine_ms),
            from_timeouts: self.from_timeouts,
        };
        estimate.in_words(engine_ms(self.at_ms))
    }
}

/// A tenant's live work on a pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantView {
    /// The tenant.
    pub tenant: TenantId,
    /// Its running tasks.
    pub running: usize,
    /// Its parked tasks.
    pub parked: usize,
    /// Units its running tasks hold, per kind (by [`ResourceKind::index`](crate::domain::ResourceKind::index)).
    pub holds: [u32; crate::domain::ResourceKind::COUNT],
    /// Its weighted service counter under a fair share by use (what its tasks were
    /// charged, each divided by its weight, decayed to now; see
    /// `ParkingLot::tenant_service`); `None` under any other setting.
    pub service: Option<f64>,
    /// Its weight under a fair share by use; `None` under any other setting.
    pub weight: Option<u32>,
    /// How many anonymous tenants the row gathers: a task submitted without a mailbox gets
    /// a tenant of its own (`anonymous-` and 32 hex digits), and a view shows them all as
    /// one row, [`TenantView::ANONYMOUS`], after the named tenants. 0 for a named tenant.
    pub anonymous_tenants: usize,
}

impl TenantView {
    /// The name of the row that gathers the anonymous tenants.
    pub const ANONYMOUS: &'static str = "anonymous";

    /// The row of the anonymous tenants, with no work yet. Each of them is a tenant of its
    /// own under a fair share, so the row has no one service or weight.
    pub(crate) fn anonymous() -> Self {
        Self {
            tenant: TenantId::from(Self::ANONYMOUS),
            running: 0,
            parked: 0,
            holds: [0; crate::domain::ResourceKind::COUNT],
            service: None,
            weight: None,
            anonymous_tenants: 0,
        }
    }
}
