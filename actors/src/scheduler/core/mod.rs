//! The pure parking-lot core: a state machine that decides which tasks run, park, expire or
//! are refused.
//!
//! It reads no clock, owns no thread or channel and does no I/O. The scheduler actor feeds it
//! events with the current time (`admit`, `complete`, `cancel`, `tick`) and carries out the
//! decisions it returns. Everything here can be tested, fuzzed and benchmarked without a
//! runtime. `PARKING_LOT.md` at the repository root explains the algorithm for readers; this
//! comment states it for maintainers.
//!
//! # Capacity
//!
//! A pool has, per [`ResourceKind`], a budget of units, plus `worker_slots`. A running task
//! holds `cost.units` of `cost.kind` and one worker slot; a running permit (rule 14) holds
//! units only. `used[kind] <= capacity[kind]` and
//! `busy_workers <= worker_slots` always hold; all sums are checked.
//!
//! # Rank
//!
//! Parked tasks are ordered by [`RankKey`]: priority (highest first), then (under the
//! deadline order, rule 20) the deadline, then `created_at_ms` (oldest first), then id.
//!
//! # Rules
//!
//! 1. **Admission.** A duplicate id is rejected; a cost above the pool's total capacity of its
//!    kind is rejected at once (it could never run); a deadline at or before `now` expires the
//!    task.
//! 2. **Fast path.** A newcomer starts at once when it fits and is not blocked by a
//!    reservation (rule 6). It never overtakes a parked task that could run, because of the
//!    saturation invariant below: after every event, no unblocked parked task fits.
//! 3. **Park.** Otherwise it parks, unless `max_queue_depth` tasks are parked already
//!    (`QueueFull`).
//! 4. **Unpark with skip-ahead.** When capacity frees (or a reservation lifts), the core
//!    repeatedly starts the best-ranked parked task that fits the free capacity, skipping
//!    larger tasks ahead of it, until nothing more fits.
//! 5. **Skips.** When a task starts while a better-ranked task stays parked, the *head* (the
//!    best-ranked parked task, which every such start overtakes) counts a skip.
//! 6. **Starvation guard.** A parked task becomes *starving* when it has been parked for
//!    `max_park_ms`, or when it counted `max_skips` skips. The best-ranked starving task is
//!    *the reservation*: no task ranked below it starts until it has started. Tasks ranked
//!    above it still start as usual.
//! 7. **Deadlines.** `tick` expires parked tasks whose deadline is at or before `now`;
//!    [`ParkingLot::next_wakeup`] says when the next tick has work to do.
//! 8. **Release.** `complete` releases a running task's capacity exactly once; a second
//!    `complete` is an error, not a second release.
//! 9. **Worker slots have identities.** A started task is given one idle worker slot (the
//!    most recently freed first: its thread's caches are warm), which [`ParkingLot::worker_of`]
//!    names; `complete` frees it. A slot whose thread is gone for good is *retired*
//!    ([`ParkingLot::retire_worker`]) and never handed out again. A slot whose task ended
//!    while its thread is still busy with work the task left on it (a task it spawned that
//!    blocks the thread) *rests* ([`ParkingLot::complete_resting`]): its task's units are
//!    free at once, but no task is given the slot until the driver reports it ready
//!    ([`ParkingLot::worker_ready`]), so a job never waits on a busy thread while another
//!    slot could take it.
//! 10. **Execution watchdog.** The driver may give a running task a time by which it must
//!     have finished ([`ParkingLot::watch`]); `tick` reports it *overdue* once, at that time.
//!     Its capacity and slot stay held until `complete`, because a thread blocked in
//!     synchronous code still holds the memory.
//! 11. **Headroom (the live guard).** The driver may cap a kind's free units with what the
//!     world outside the pool leaves it ([`ParkingLot::set_headroom`]: a GPU's sampled free
//!     memory less a reserve, when other processes share the card). The free units of that
//!     kind are then `min(capacity - used, headroom)`, so a task that fits the pool's budget
//!     but not the headroom parks until a new headroom lets it start. A sample is a
//!     snapshot, and tasks started after it have not shown up in it yet, so each start takes
//!     its cost off the headroom until the next sample replaces it. Without a headroom
//!     (the default) the rule is off and costs one comparison with `u32::MAX`.
//! 12. **Fair share** (when the limits set one, see `fair_share.rs`). Every ticket names a
//!     tenant. A tenant's running tasks never hold more than the cap of any kind: a task
//!     costing more than the cap is refused at admission, and one that would take its tenant
//!     past the cap does not fit, like one that does not fit the free units. Among parked
//!     tasks that fit, the order is priority, then the tenant's usage now (units of the
//!     task's kind, then running tasks), then how long ago the tenant last started a task,
//!     then rank. The reservation (rule 6) is the best starving task under that order whose
//!     tenant has room for it; it holds back the tasks behind it under that order. A starving
//!     task whose tenant has no room yet holds back only its own tenant's tasks ranked below
//!     it, so its tenant drains for it without stopping the other tenants. Rule 22 changes
//!     the order within a priority when the limits ask for it.
//! 13. **Backfill** (when the limits allow it, see `backfill.rs`). While the reservation
//!     waits, a task it holds back may still start if it fits now and either its execution
//!     timeout ends before the reservation's *shadow time* (the earliest time the
//!     reservation could start if every running task ended by its timeout) or it fits in
//!     what the reservation leaves spare at that time. Tasks without a timeout never
//!     backfill; without a bounded shadow time nothing does. Of the tasks that may, the
//!     highest priority starts first, and within a priority the one that uses the most of
//!     the free units (then rank).
//! 14. **Permits** (see `permits.rs`). A permit ([`ParkingLot::admit_permit`]) is a ticket
//!     whose run happens outside the pool (a batching engine holding KV-cache blocks). It is
//!     ranked by the rules above, but started it holds units and no worker slot, so it may
//!     start while every slot is busy: then the best parked permit that fits starts, ahead
//!     of better-ranked tasks waiting for a slot; with a slot idle, rank order holds across
//!     tasks and permits. Under a fair share with every slot busy, the fair-best task that
//!     fits starts only if it is a permit: if it needs a slot, nothing starts, and permits
//!     (a newcomer too) wait behind it. Backfill never starts a task that needs a slot when
//!     none is idle. A running ticket may grow at once if the units fit now and no
//!     reservation waits ([`ParkingLot::grow_now`]; under a fair share, not when the growth
//!     would let a parked task start), give units back ([`ParkingLot::shrink`]), or take a
//!     running child's units of its kind and tenant ([`ParkingLot::absorb`]: a ranked
//!     growth). [`ParkingLot::preemption_victims`] names, for a parked waiter, the running
//!     tickets of its kind and of a strictly lower priority to ask to yield: lowest
//!     priority first, newest start first within a priority, until their units cover what
//!     the waiter lacks (less the units already asked for), then trimmed of any whose units
//!     are not needed.
//! 15. **Budgets** (when the limits give a kind one, see `budget.rs`). The units of such a
//!     kind refill with time, as a token bucket (`units` every `per_ms`, at most `burst`,
//!     which is also the kind's capacity): a start *spends* its cost from the bucket and the
//!     task holds none of it, so its end gives nothing back ([`ParkingLot::give_back`]
//!     returns what a running task did not use). The free units of the kind are at most the
//!     whole units in the bucket, and none while a start cap (`max_starts`, a bucket of
//!     starts) has no start left; under a start cap a ticket of no units costs one. Every
//!     event brings the buckets to its `now`, and [`ParkingLot::next_wakeup`] names the
//!     instant the next refill lets a parked task start (a start coming back, or the level
//!     reaching the smallest parked cost above it), so nothing polls. All other rules apply
//!     unchanged; preemption frees nothing of such a kind, and backfill, which needs to know
//!     when units return, does not start tasks past a reservation of such a kind.
//!
//! 16. **Sleepers.** A ticket may be parked from a later time on
//!     ([`ParkingLot::park_until`]: a failed run's task waiting out its retry backoff, or a
//!     scheduled start, a task submitted not to start before an instant). Until
//!     then it is live (`Parked` to [`ParkingLot::state`], cancellable, counted among the
//!     parked) but in no index a decision reads; [`ParkingLot::next_wakeup`] names its time,
//!     and from then on it parks at its rank like any other (its `created_at_ms` is kept, so
//!     it keeps its place among equals). A sleeper that wakes with its deadline passed
//!     expires at that tick.
//! 17. **Reasons.** [`ParkingLot::why_waiting`] says why a parked ticket has not started:
//!     the first obstacle among sleeping (rule 16), too few free units (rule 11's headroom
//!     included), its kind's budget (rule 15), its tenant's share (rule 12), no idle
//!     worker slot, the reservation (rules 6, 12), and, when none holds, the order the
//!     rules keep (a count of the tickets ranked ahead). Each is read from the books the
//!     lot keeps anyway, in O(1) (the count, O(n), only in that last case).
//! 18. **Pause.** A paused lot ([`ParkingLot::pause`]) starts nothing: no newcomer, no
//!     parked ticket, no permit; admissions park, running tickets run on and end, deadlines
//!     expire, and [`ParkingLot::resume`] starts what fits in rank order. The saturation
//!     invariant holds from the resume on.
//! 19. **Lanes** (see `lanes.rs`). While nothing is parked or sleeping, no reservation
//!     holds and the lot is not paused, the free units of a kind without a fair share, a
//!     budget or a headroom may be *lent* to the permits' fast path
//!     ([`ParkingLot::lend`]), which hands them out on its callers' threads. Lent units
//!     count as used. The driver takes back what was not handed out before it feeds the lot
//!     any other event ([`ParkingLot::reclaim`]), so every decision sees the true free
//!     units; a fast-path holder becomes a running permit of its own when a decision must
//!     see it ([`ParkingLot::adopt`], [`ParkingLot::settle`]).
//! 20. **Deadline order** (when the limits ask for it, see `order.rs`). Within a priority,
//!     parked tickets rank by deadline, earliest first, those without one after every
//!     deadline, and by `created_at_ms` then id among equals; with the fifo order (the
//!     default) the deadline takes no part and the rank is exactly the one above. Every rule
//!     that reads the rank reads this one (skip-ahead, the reservation, backfill, the fair
//!     order's last key, reasons); the starvation guard still ages by time parked.
//! 21. **Shedding** (see `shedding.rs`). The parking lot is bounded by `max_queue_depth`
//!     tickets and, when the limits set `max_queued_units`, by that many parked units of
//!     each kind. A newcomer that must park past a bound takes the place of parked tickets of
//!     a strictly lower priority: of its own kind, lowest-ranked first, until its units fit;
//!     then, if the depth is still reached, the lowest-ranked of any kind. They are *shed*
//!     ([`Admit::ParkShedding`]: each ends refused, `QueueFull`), and what their leaving
//!     unblocks starts. When the tickets of lower priority cannot make room, nothing is shed
//!     and the newcomer is refused (`QueueFull`, `QueueUnitsFull`).
//! 22. **Fair share by use** (when the limits set `fair_by_use`, see `service.rs`; rule 12's
//!     book without a cap when they set no `fair_share`). Each tenant has a counter of
//!     weighted service: a start charges it the most its task can cost (declared units, or
//!     units times the execution timeout) divided by the tenant's weight, and the end
//!     settles the charge down to the real cost (the units the executor reported,
//!     [`ParkingLot::report_used`], or units times the time held), never below the lowest
//!     counter of the tenants with a parked task (the *floor*). A tenant that arrives with
//!     nothing parked is lifted to the floor. Counters decay with a half-life. Within a
//!     priority, the tenant with the lowest counter goes first, then rule 12's order.
//! 23. **Estimates** (see `estimate.rs`). The lot learns each cost class's run time as
//!     claims end, and says where a parked ticket stands: its place among the parked
//!     tickets of its kind and when it is expected to start, by a simulation of the rules
//!     above from the running claims' expected ends ([`ParkingLot::estimate_start`],
//!     [`ParkingLot::estimate_all`], and for a newcomer [`ParkingLot::estimate_admission`]).
//!     Asking changes nothing.
//! 24. **Dependencies** (see `dependencies.rs`). A ticket may be admitted *held* until
//!     tickets live in the lot (its parents) end ([`ParkingLot::admit_after`]). Held, it
//!     is live (`Parked` to [`ParkingLot::state`], cancellable, counted among the parked,
//!     expired at its deadline) but in no index a decision reads. The driver says how
//!     each parent ended ([`ParkingLot::parent_ended`]): when the last one succeeded, the
//!     ticket parks at its rank (past the bounds if need be, as a sleeper wakes) and what
//!     fits starts; when one did not, it leaves the lot for the driver to end `Cancelled`,
//!     unless it runs anyway. A parent's end costs O(1) per child waiting on it: a pending
//!     counter per child and a list of children per parent, never a scan.
//! 25. **Several kinds** (see `several.rs`, `multi_index.rs`). A ticket may need units of
//!     other kinds beside its cost ([`Ticket::also`]). It starts only when every kind fits
//!     (free units, headroom, a budget's bucket), holds them all and gives them all back on
//!     `complete`; the budgets it names are spent at one start or not at all. Skip-ahead,
//!     the reservation and preemption count every kind; such a ticket never backfills and
//!     nothing backfills past it when it is the reservation; reasons name the kind that
//!     blocks it. A lot with a fair share or `max_queued_units` refuses it
//!     ([`Rejection::SeveralKinds`]). Parked, it is in a multi-kind index keyed by its
//!     dominant kind, not in `by_cost`, and its extra costs are kept in `extras`.
//!
//! # Invariants (checked by [`ParkingLot::check_invariants`] in the property tests)
//!
//! - `0 <= used[kind] <= capacity[kind]` and it equals the sum of the units of the running
//!   claims of that kind, permits included, plus the units lent to its lane (rule 19); every running task but a permit holds a
//!   distinct worker slot (`busy_workers` counts them); the idle slots are exactly the slots
//!   neither held nor retired.
//! - A kind with a budget holds no units (`used` is 0); only its running tasks may give
//!   units back; over any span of `w` ms its starts spend at most `burst + units * w /
//!   per_ms` units (checked by the budget property tests).
//! - No task is both parked and running; every parked ticket is in exactly one cost index
//!   (`by_cost` for tasks, `permits_by_cost` for permits, or for a ticket of several kinds
//!   `several` and `several_permits`, each with every unit it needs, and its extra costs in
//!   `extras`); the other indexes hold exactly the parked tasks (the timeout index only
//!   those of one kind). `used[kind]` counts a running claim's extra costs of the kind too,
//!   unless the kind has a budget.
//! - Saturation: no parked task fits the free capacity (every kind it needs), unless the
//!   reservation ranks ahead of it, or the lot is paused.
//! - A held ticket (rule 24) is neither parked, sleeping nor running; its pending count is
//!   the number of live parents whose list names it.
//! - At most `max_queue_depth` tickets and `max_queued_units` units of any kind are parked
//!   (sleepers not counted), plus the tickets that came back past a bound (restored, or
//!   awake after their sleep: they were admitted once and are never lost); the shedding
//!   sums are the parked tickets' units and counts, and each cost index's worst is its
//!   lowest-ranked ticket.
//!
//! # Cost
//!
//! Parked tasks are indexed per kind by a [`CostIndex`], so "the best-ranked parked task that
//! fits" is a walk of 32 trie levels per kind in use, not a scan. Admission and each unpark
//! decision are O(log n) in parked tasks. A fair share adds a visit of each tenant with a
//! task parked or running, O(T) with a 32-step walk for the few that could win (see
//! `fair_share.rs`); a backfill decision, made only while a reservation waits, walks at most
//! 128 timeout classes per priority level and the running tasks (see `backfill.rs`).
//! Without a fair share the decision path is the one above plus one branch; permits add a
//! look at their own index (empty: four `is_empty` checks) and a branch per start and end.

mod admission;
mod backfill;
mod budget;
mod capacity;
mod claims;
mod cost_index;
mod decision;
mod dependencies;
mod estimate;
mod fair_share;
mod invariants;
mod lanes;
mod multi_index;
mod order;
mod parking;
mod permits;
mod rank;
mod reasons;
mod run_times;
mod running_ends;
mod service;
mod several;
mod shedding;
mod simulation;
mod tick;
mod unpark;
mod workers;

use std::collections::BTreeSet;

use backfill::TimeoutIndex;
pub use budget::TokenBucket;
#[doc(hidden)]
pub use cost_index::CostIndex;
pub use decision::{
    AbsorbRefusal, Admit, AdmitParts, Cancel, Newcomer, Rejection, Tick, UnknownTask,
};
pub use dependencies::Released;
pub use estimate::{ordinal, StartEstimate};
use fair_share::TenantBook;
use multi_index::MultiIndex;
pub use rank::RankKey;
pub use reasons::WaitReason;
use shedding::QueueBook;

use crate::domain::{
    ExtraCosts, PoolError, PoolLimits, Priority, ResourceCost, ResourceKind, TaskId, TaskMetadata,
    WakeState,
};

const KINDS: usize = ResourceKind::COUNT;

/// The hash map of the core and the scheduler: foldhash is several times faster than SipHash
/// on integer keys and, seeded per map, still resists hash flooding.
#[doc(hidden)]
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Names a tenant to the core. The driver derives it from the task's mailbox tenant (all tasks
/// submitted without a mailbox share one); the core only compares keys.
pub type TenantKey = u64;

/// What the core needs to know about a task to schedule it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The task's id, unique among live tasks.
    pub id: TaskId,
    /// Its priority.
    pub priority: Priority,
    /// What it holds while it runs.
    pub cost: ResourceCost,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Deadline to start by, milliseconds since the Unix epoch.
    pub deadline_ms: Option<u64>,
    /// The tenant whose share the task counts against (rule 12).
    pub tenant: TenantKey,
    /// Its execution timeout in milliseconds, if it has one: it ends, and releases what it
    /// holds, at most this long after it starts (rule 13).
    pub timeout_ms: Option<u64>,
    /// What it holds beside `cost`, for a task of several kinds (rule 25); none by default.
    pub also: ExtraCosts,
}

impl From<&TaskMetadata> for Ticket {
    /// Millisecond times past `u64::MAX` (half a billion years) are clamped. The ticket has
    /// tenant 0 and no timeout: the metadata carries neither.
    fn from(meta: &TaskMetadata) -> Self {
        Self {
            id: meta.id,
            priority: meta.priority,
            cost: meta.cost,
            created_at_ms: clamp_ms(meta.created_at_ms),
            deadline_ms: meta.deadline_ms.map(clamp_ms),
            tenant: 0,
            timeout_ms: None,
            also: ExtraCosts::NONE,
        }
    }
}

/// A parked task's timeout when it has none.
const NO_TIMEOUT: u32 = u32::MAX;

/// A timeout in ms as a parked task keeps it: below `NO_TIMEOUT` (49 days at most).
fn saturate_timeout(timeout_ms: u64) -> u32 {
    u32::try_from(timeout_ms)
        .unwrap_or(NO_TIMEOUT)
        .min(NO_TIMEOUT - 1)
}

/// Converts an API time (`u128` milliseconds) to the core's `u64`, saturating.
pub(crate) fn clamp_ms(ms: u128) -> u64 {
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A parked task's scheduling data. Kept small: the benchmark holds a million of these.
#[derive(Debug, Clone, Copy)]
struct Parked {
    created_at_ms: u64,
    deadline_ms: Option<u64>,
    parked_at_ms: u64,
    units: u32,
    skips: u32,
    /// Execution timeout in ms (see `saturate_timeout`), or `NO_TIMEOUT`.
    timeout_ms: u32,
    priority: Priority,
    kind: ResourceKind,
    /// A capacity permit (rule 14): started, it holds units but no worker slot.
    slotless: bool,
    /// It ranks by its deadline (rule 20).
    by_deadline: bool,
}

impl Parked {
    fn rank(&self, id: TaskId) -> RankKey {
        RankKey::by_deadline(self.priority, self.due(), self.created_at_ms, id)
    }

    fn timeout(&self) -> Option<u64> {
        (self.timeout_ms != NO_TIMEOUT).then_some(u64::from(self.timeout_ms))
    }
}

/// When a reservation could start at the latest (rule 13), and what it leaves spare then.
#[derive(Debug, Clone, Copy)]
struct Shadow {
    /// The shadow time.
    at: u64,
    /// The reservation's kind.
    kind: ResourceKind,
    /// Units of that kind free at the shadow time beyond the reservation's cost.
    spare_units: u32,
    /// Worker slots idle at the shadow time beyond the reservation's (a permit needs none).
    spare_slots: usize,
}

impl Shadow {
    /// Whether a task costing `cost`, however long it runs, leaves the reservation what it
    /// needs at the shadow time.
    /// A `slotless` task (a permit, rule 14) needs no spare slot.
    fn spares(&self, cost: ResourceCost, slotless: bool) -> bool {
        (slotless || self.spare_slots > 0)
            && (cost.kind != self.kind || cost.units <= self.spare_units)
    }
}

/// The headroom of a kind that has none: its free units are its budget's.
const UNLIMITED: u32 = u32::MAX;

/// The worker slot of a claim that holds none (a permit, rule 14).
const NO_WORKER: u32 = u32::MAX;

/// What a start asks for: the ticket's data a claim needs.
#[derive(Debug, Clone, Copy)]
struct Request {
    id: TaskId,
    cost: ResourceCost,
    tenant: TenantKey,
    /// Execution timeout in ms (see `saturate_timeout`), or `NO_TIMEOUT`.
    timeout_ms: u32,
    priority: Priority,
    /// A permit: it takes no worker slot.
    slotless: bool,
    /// What it needs beside `cost` (rule 25).
    also: ExtraCosts,
}

/// What a running task holds.
#[derive(Debug, Clone, Copy)]
struct Claim {
    kind: ResourceKind,
    units: u32,
    /// Its worker slot, or `NO_WORKER` for a permit.
    worker: u32,
    tenant: TenantKey,
    /// Its ticket's priority: preemption takes lower priorities first (rule 14).
    priority: Priority,
    /// The pool's start counter when it started: preemption takes the newest first.
    started: u64,
    /// When the watchdog reports it overdue; `None` once reported, or when unwatched.
    overdue_at: Option<u64>,
    /// Its start plus its execution timeout, when it has one (rule 13).
    ends_by: Option<u64>,
    /// When it started, by the lot's clock: its run time is learnt when it ends (rule 23).
    started_ms: u64,
    /// Execution timeout in ms (see `saturate_timeout`), or `NO_TIMEOUT` (rule 23).
    timeout_ms: u32,
    /// The units it declared (a kind with a budget holds none of them): its cost class.
    declared: u32,
    /// What it declared beside `kind` (rule 25): it holds these units of each other kind,
    /// but none of a kind with a budget, which it spent (see `held_by`).
    also: ExtraCosts,
}

/// The parking-lot state machine of one pool. See the module docs for the rules.
///
/// ```
/// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
/// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket};
///
/// let mut lot = ParkingLot::new(PoolLimits::new(10, 4)).unwrap();
/// let ticket = |id, units| Ticket {
///     id,
///     priority: Priority::Normal,
///     cost: ResourceCost::gpu_vram(units),
///     created_at_ms: id,
///     deadline_ms: None,
///     tenant: 0,
///     timeout_ms: None,
///     also: Default::default(),
/// };
/// assert_eq!(lot.admit(ticket(1, 8), 0), Admit::Start);
/// assert_eq!(lot.admit(ticket(2, 6), 0), Admit::Park); // 8 + 6 > 10
/// assert_eq!(lot.admit(ticket(3, 2), 0), Admit::Start); // skip-ahead: 2 still fits
/// assert_eq!(lot.complete(1, 5).unwrap(), vec![2]); // 8 freed: task 2 starts
/// ```
#[derive(Debug, Clone)]
pub struct ParkingLot {
    limits: PoolLimits,
    worker_slots: u32,
    used: [u32; KINDS],
    /// Units lent to the permits' fast path (rule 19), counted in `used`.
    lent: [u32; KINDS],
    /// Free units the world outside the pool leaves per kind (rule 11); `UNLIMITED` when
    /// the kind has no headroom set.
    headroom: [u32; KINDS],
    /// Idle worker slots; the most recently freed last, so it is reused first.
    idle_workers: Vec<u32>,
    /// `retired[w]`: slot `w`'s thread is gone for good; it is never handed out again.
    retired: Vec<bool>,
    /// `resting[w]`: slot `w`'s task ended, but its thread is still busy with work the task
    /// left on it (rule 9); the slot takes no task until [`ParkingLot::worker_ready`].
    resting: Vec<bool>,
    parked: FastMap<TaskId, Parked>,
    /// Parked tasks that need a worker slot, per kind.
    by_cost: [CostIndex; KINDS],
    /// Parked permits (rule 14), per kind: they can start while every slot is busy.
    permits_by_cost: [CostIndex; KINDS],
    /// Parked tasks of several kinds (rule 25), in no `by_cost` index.
    several: MultiIndex,
    /// Parked permits of several kinds (rule 25), in no `permits_by_cost` index.
    several_permits: MultiIndex,
    /// What each parked ticket of several kinds needs beside its first cost (rule 25).
    extras: FastMap<TaskId, ExtraCosts>,
    by_deadline: BTreeSet<(u64, TaskId)>,
    by_park_time: BTreeSet<(u64, TaskId)>,
    starving: BTreeSet<RankKey>,
    running: FastMap<TaskId, Claim>,
    /// Running permits: `running.len()` less this is the number of busy worker slots.
    running_permits: usize,
    by_overdue: BTreeSet<(u64, TaskId)>,
    /// Per-tenant shares, when the limits set a fair share (rule 12).
    tenants: Option<TenantBook>,
    /// Parked tasks with a timeout, when backfill is on (rule 13).
    by_timeout: Option<TimeoutIndex>,
    /// Running tasks with a timeout by the time they end, when backfill is on.
    by_end: BTreeSet<(u64, TaskId)>,
    /// The buckets of the kinds whose units refill with time (rule 15); `None` when no
    /// kind has one.
    budgets: Option<Box<budget::Budgets>>,
    /// Tickets parked from a later time on (rule 16), by that time: in no other index.
    sleeping: BTreeSet<(u64, TaskId)>,
    sleepers: FastMap<TaskId, (u64, Ticket)>,
    /// Tickets held until their parents end (rule 24), and who waits for whom.
    dependencies: dependencies::Dependencies,
    /// Paused (rule 18): nothing starts; admissions park.
    paused: bool,
    /// The parked tickets' units and counts by kind and priority, for the bounds (rule 21).
    queue: QueueBook,
    /// The run times seen per cost class, for the estimates of rule 23.
    run_times: run_times::RunTimes,
    /// Starts so far: orders tenants by when they last started a task.
    starts: u64,
    /// The time of the latest event: backfill decisions depend on it, and
    /// [`check_invariants`](Self::check_invariants) takes none of its own.
    clock: u64,
}

impl ParkingLot {
    /// An empty parking lot with these limits, or `InvalidConfig` naming what is wrong.
    pub fn new(limits: PoolLimits) -> Result<Self, PoolError> {
        limits.validate()?;
        let worker_slots = u32::try_from(limits.worker_slots)
            .map_err(|_| PoolError::InvalidConfig("worker_slots exceeds u32::MAX".into()))?;
        Ok(Self {
            limits,
            worker_slots,
            used: [0; KINDS],
            lent: [0; KINDS],
            headroom: [UNLIMITED; KINDS],
            idle_workers: (0..worker_slots).rev().collect(),
            retired: vec![false; limits.worker_slots],
            resting: vec![false; limits.worker_slots],
            parked: FastMap::default(),
            by_cost: Default::default(),
            permits_by_cost: Default::default(),
            several: MultiIndex::default(),
            several_permits: MultiIndex::default(),
            extras: FastMap::default(),
            by_deadline: BTreeSet::new(),
            by_park_time: BTreeSet::new(),
            starving: BTreeSet::new(),
            running: FastMap::default(),
            running_permits: 0,
            by_overdue: BTreeSet::new(),
            tenants: fair_share::book_for(&limits),
            by_timeout: limits.backfill.then(TimeoutIndex::default),
            by_end: BTreeSet::new(),
            budgets: budget::Budgets::new(&limits.budgets),
            sleeping: BTreeSet::new(),
            sleepers: FastMap::default(),
            dependencies: dependencies::Dependencies::default(),
            paused: false,
            queue: QueueBook::default(),
            run_times: run_times::RunTimes::default(),
            starts: 0,
            clock: 0,
        })
    }

    /// A lot with no worker slots, for a producer-only node of a shared queue: it starts
    /// nothing, so every admitted task parks (and the node hands it to the shared queue).
    /// `limits.worker_slots` is ignored; the rest is checked as by [`ParkingLot::new`].
    pub fn without_workers(mut limits: PoolLimits) -> Result<Self, PoolError> {
        limits.worker_slots = 1;
        let mut lot = Self::new(limits)?;
        lot.limits.worker_slots = 0;
        lot.worker_slots = 0;
        lot.idle_workers.clear();
        lot.retired.clear();
        lot.resting.clear();
        Ok(lot)
    }

    /// The limits this lot enforces.
    pub fn limits(&self) -> &PoolLimits {
        &self.limits
    }

    /// The time of the latest event the lot was given.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Number of parked tasks.
    pub fn parked_len(&self) -> usize {
        self.parked.len() + self.sleepers.len() + self.dependencies.len()
    }

    /// Number of running tasks, permits included.
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// Where a live task stands, or `None` for a task the lot does not hold.
    pub fn state(&self, id: TaskId) -> Option<WakeState> {
        if self.running.contains_key(&id) {
            return Some(WakeState::Running);
        }
        if self.sleepers.contains_key(&id) || self.dependencies.holds(id) {
            return Some(WakeState::Parked);
        }
        let parked = self.parked.get(&id)?;
        if self.starving.contains(&parked.rank(id)) {
            Some(WakeState::Reserved)
        } else {
            Some(WakeState::Parked)
        }
    }

    /// Units of `kind` that `tenant`'s running tasks hold (0 without a fair share, which
    /// keeps no per-tenant books).
    pub fn tenant_used(&self, tenant: TenantKey, kind: ResourceKind) -> u32 {
        self.tenants
            .as_ref()
            .map_or(0, |book| book.used(tenant, kind))
    }

    /// The most units of `kind` one tenant may hold: the fair share's cap, or the kind's
    /// capacity without one.
    pub fn tenant_cap(&self, kind: ResourceKind) -> u32 {
        self.tenants
            .as_ref()
            .map_or(self.limits.capacity.get(kind), |book| book.cap(kind))
    }

    /// Pauses the lot (rule 18): from now on nothing starts, neither a newcomer nor a parked
    /// ticket; admissions park (up to `max_queue_depth`), running tickets run on and end as
    /// usual, and deadlines still expire. Pausing a paused lot does nothing.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket, WaitReason};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(10, 2)).unwrap();
    /// let ticket = Ticket {
    ///     id: 1,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(4),
    ///     created_at_ms: 0,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    ///     also: Default::default(),
    /// };
    /// lot.pause();
    /// assert_eq!(lot.admit(ticket, 0), Admit::Park);
    /// assert_eq!(lot.why_waiting(1), Some(WaitReason::Paused));
    /// assert_eq!(lot.resume(5), vec![1]);
    /// ```
    pub fn pause(&mut self) {
        self.paused = true;
    }

    /// Ends a pause (rule 18) and starts what fits, in rank order; returns the started ids.
    pub fn resume(&mut self, now: u64) -> Vec<TaskId> {
        self.paused = false;
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        started
    }

    /// Whether the lot is paused (rule 18).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Whether the lot holds task `id`: parked, sleeping, held or running.
    pub fn is_live(&self, id: TaskId) -> bool {
        self.parked.contains_key(&id)
            || self.running.contains_key(&id)
            || (!self.sleepers.is_empty() && self.sleepers.contains_key(&id))
            || self.dependencies.holds(id)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_budget;
#[cfg(test)]
mod tests_dependencies;
#[cfg(test)]
mod tests_estimate;
#[cfg(test)]
mod tests_order;
#[cfg(test)]
mod tests_permits;
#[cfg(test)]
mod tests_reasons;
#[cfg(test)]
mod tests_several;
#[cfg(test)]
mod tests_share;
#[cfg(test)]
mod tests_shedding;
#[cfg(test)]
mod tests_vtc;
