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
//!   (`by_cost` for tasks, `permits_by_cost` for permits); the other indexes hold exactly
//!   the parked tasks.
//! - Saturation: no parked task fits the free capacity, unless the reservation ranks ahead
//!   of it, or the lot is paused.
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

mod backfill;
mod budget;
mod cost_index;
mod decision;
mod dependencies;
mod estimate;
mod fair_share;
mod lanes;
mod order;
mod permits;
mod rank;
mod reasons;
mod running_ends;
mod service;
mod shedding;

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
pub use rank::RankKey;
pub use reasons::WaitReason;
use shedding::QueueBook;

use crate::domain::{
    PoolError, PoolLimits, Priority, ResourceCost, ResourceKind, TaskId, TaskMetadata, WakeState,
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
    run_times: estimate::RunTimes,
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
            run_times: estimate::RunTimes::default(),
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

    /// Units of `kind` held by running tasks.
    pub fn used(&self, kind: ResourceKind) -> u32 {
        self.used[kind.index()]
    }

    /// Units of `kind` a task may start with: those not held by anyone, at most the
    /// kind's headroom (rule 11), and for a kind with a budget, at most what its bucket
    /// holds (none while its starts are used up, rule 15).
    pub fn free(&self, kind: ResourceKind) -> u32 {
        let free = (self.limits.capacity.get(kind) - self.used[kind.index()])
            .min(self.headroom[kind.index()]);
        match self.budget(kind) {
            Some(budget) => free.min(budget.free()),
            None => free,
        }
    }

    /// The bucket of `kind`, when it has a budget (rule 15).
    fn budget(&self, kind: ResourceKind) -> Option<&budget::KindBudget> {
        self.budgets.as_ref()?.of(kind)
    }

    /// Whole units in the bucket of `kind` as of the latest event, or `None` for a kind
    /// without a budget (rule 15).
    pub fn budget_level(&self, kind: ResourceKind) -> Option<u32> {
        self.budget(kind).map(budget::KindBudget::level)
    }

    /// For parked task `id` of a kind with a budget: when its bucket will hold its units
    /// (and a start, under a start cap), if it does not now; `None` otherwise. Tasks ranked
    /// ahead of it may spend first, so this is the earliest it could start.
    pub fn budget_ready_at(&self, id: TaskId) -> Option<u64> {
        self.budgets.as_ref()?;
        let parked = self.parked.get(&id)?;
        let budget = self.budget(parked.kind)?;
        let at = budget.ready_at(parked.units);
        (at > self.clock).then_some(at)
    }

    /// When the best-ranked parked ticket of `kind` could start as far as the kind's budget
    /// goes, if the budget is what it waits for (rule 15).
    pub fn budget_waits_until(&self, kind: ResourceKind) -> Option<u64> {
        let best = [
            &self.by_cost[kind.index()],
            &self.permits_by_cost[kind.index()],
        ]
        .into_iter()
        .filter_map(CostIndex::best)
        .min()?;
        self.budget_ready_at(best.id())
    }

    /// The time of the latest event the lot was given.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Units running task `id` spent from its kind's budget and may still give back.
    pub fn spent_by(&self, id: TaskId) -> u32 {
        self.running
            .get(&id)
            .and_then(|claim| self.budget(claim.kind))
            .map_or(0, |budget| budget.spent_by(id))
    }

    /// Running task `id` gives back up to `units` of what it spent from its kind's budget
    /// (it used fewer than it declared: the tokens of a shorter reply), and what now fits
    /// starts (rule 15). Returns the started ids, in order; nothing for a kind without a
    /// budget.
    pub fn give_back(
        &mut self,
        id: TaskId,
        units: u32,
        now: u64,
    ) -> Result<Vec<TaskId>, UnknownTask> {
        let kind = self
            .running
            .get(&id)
            .ok_or(UnknownTask::NotRunning(id))?
            .kind;
        let mut started = Vec::new();
        let given = self
            .budgets
            .as_mut()
            .and_then(|budgets| budgets.of_mut(kind))
            .map_or(0, |budget| budget.give_back(id, units));
        if given > 0 {
            self.unpark(now, &mut started);
        }
        Ok(started)
    }

    /// The headroom of `kind` left after the starts since it was set, or `None` when it has
    /// none (rule 11).
    pub fn headroom(&self, kind: ResourceKind) -> Option<u32> {
        let headroom = self.headroom[kind.index()];
        (headroom != UNLIMITED).then_some(headroom)
    }

    /// Caps the free units of `kind` at `headroom` until the next call (rule 11); `None`
    /// lifts the cap. A larger headroom may let parked tasks start: returns their ids, in
    /// the order they started.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost, ResourceKind};
    /// use prometheus_parking_lot_actors::scheduler::core::{Admit, ParkingLot, Ticket};
    ///
    /// let mut lot = ParkingLot::new(PoolLimits::new(80, 4)).unwrap();
    /// let ticket = |id, units| Ticket {
    ///     id,
    ///     priority: Priority::Normal,
    ///     cost: ResourceCost::gpu_vram(units),
    ///     created_at_ms: id,
    ///     deadline_ms: None,
    ///     tenant: 0,
    ///     timeout_ms: None,
    /// };
    /// // Another process holds most of the card: 20 units are free outside the pool.
    /// assert!(lot.set_headroom(ResourceKind::GpuVram, Some(20), 0).is_empty());
    /// assert_eq!(lot.admit(ticket(1, 30), 0), Admit::Park); // fits 80, not 20
    /// // The other process exits: the next sample lets it start.
    /// assert_eq!(lot.set_headroom(ResourceKind::GpuVram, Some(70), 5), vec![1]);
    /// assert_eq!(lot.headroom(ResourceKind::GpuVram), Some(40)); // 70 less its 30
    /// ```
    pub fn set_headroom(
        &mut self,
        kind: ResourceKind,
        headroom: Option<u32>,
        now: u64,
    ) -> Vec<TaskId> {
        self.headroom[kind.index()] = headroom.map_or(UNLIMITED, |units| units.min(UNLIMITED - 1));
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        started
    }

    /// Units held by running tasks, summed over kinds.
    pub fn used_total(&self) -> u64 {
        self.used.iter().map(|&units| u64::from(units)).sum()
    }

    /// Worker slots held by running tasks (permits hold none).
    pub fn busy_workers(&self) -> usize {
        self.running.len() - self.running_permits
    }

    /// The worker slot a running task holds; `None` for a permit (rule 14).
    pub fn worker_of(&self, id: TaskId) -> Option<usize> {
        self.running
            .get(&id)
            .filter(|claim| claim.worker != NO_WORKER)
            .map(|claim| claim.worker as usize)
    }

    /// The running task holding worker slot `worker`, if any. O(running).
    pub fn task_on(&self, worker: usize) -> Option<TaskId> {
        self.running
            .iter()
            .find(|(_, claim)| claim.worker as usize == worker)
            .map(|(&id, _)| id)
    }

    /// Retires worker slot `worker`: its thread is gone for good, so it is never handed out
    /// again. A task running on it keeps its capacity until the driver `complete`s it.
    /// Returns that task, if any.
    pub fn retire_worker(&mut self, worker: usize) -> Option<TaskId> {
        let slot = self.retired.get_mut(worker)?;
        *slot = true;
        self.resting[worker] = false;
        self.idle_workers.retain(|&idle| idle as usize != worker);
        self.task_on(worker)
    }

    /// Worker slots not retired.
    pub fn live_workers(&self) -> usize {
        self.retired.iter().filter(|retired| !**retired).count()
    }

    /// Asks the watchdog to report running task `id` overdue from `at` on (see rule 10).
    /// Ignored for a task that is not running.
    pub fn watch(&mut self, id: TaskId, at: u64) {
        let Some(claim) = self.running.get_mut(&id) else {
            return;
        };
        if let Some(previous) = claim.overdue_at.replace(at) {
            self.by_overdue.remove(&(previous, id));
        }
        self.by_overdue.insert((at, id));
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

    /// The task the pool is draining for: the best-ranked starving task (under a fair share,
    /// the best starving task whose tenant has room for it), if any.
    pub fn reservation(&self) -> Option<TaskId> {
        self.reserved().map(|rank| rank.id())
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

    /// The earliest time at which [`tick`](Self::tick) has something to do (a deadline to
    /// expire or a task to age into starvation).
    pub fn next_wakeup(&self) -> Option<u64> {
        let deadline = self.by_deadline.first().map(|&(at, _)| at);
        let aging = self.limits.starvation.max_park_ms.and_then(|max_park_ms| {
            self.by_park_time
                .first()
                .map(|&(parked_at, _)| parked_at.saturating_add(max_park_ms))
        });
        let overdue = self.by_overdue.first().map(|&(at, _)| at);
        let sleeper = self.sleeping.first().map(|&(at, _)| at);
        let held = self.dependencies.next_deadline();
        [
            deadline,
            aging,
            overdue,
            self.budget_wakeup(),
            sleeper,
            held,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When a refill lets a parked task of a kind with a budget start that cannot now (rule
    /// 15): a start coming back, or the level reaching the smallest parked cost above it.
    /// A task that fits the level but waits anyway waits for something else (a slot, the
    /// reservation, its tenant's room), whose own event wakes it.
    fn budget_wakeup(&self) -> Option<u64> {
        let budgets = self.budgets.as_ref()?;
        budgets
            .kinds()
            .filter_map(|(kind, budget)| {
                let (tasks, permits) = (
                    &self.by_cost[kind.index()],
                    &self.permits_by_cost[kind.index()],
                );
                if tasks.is_empty() && permits.is_empty() {
                    return None;
                }
                let level = budget.level();
                let above = [tasks, permits]
                    .into_iter()
                    .filter_map(|index| index.smallest_above(level))
                    .min();
                budget.next_change(above)
            })
            .min()
    }

    /// Admits a task at time `now`: start it, park it, expire it or reject it.
    pub fn admit(&mut self, ticket: Ticket, now: u64) -> Admit {
        self.admit_ticket(ticket, false, true, now)
    }

    /// Under a start cap (rule 15) a start is never free: a ticket of no units of that kind
    /// costs one.
    fn at_least_a_unit(&self, mut ticket: Ticket) -> Ticket {
        let capped = self
            .budget(ticket.cost.kind)
            .is_some_and(budget::KindBudget::caps_starts);
        if capped && ticket.cost.units == 0 {
            ticket.cost.units = 1;
        }
        ticket
    }

    /// What [`admit`](Self::admit) would answer `ticket` at `now` whatever the room: a
    /// rejection (a duplicate id, more units than the pool has, more than a tenant's share)
    /// or an expiry; `None` when it would start or park it. Changes nothing: for a task
    /// that is to wait elsewhere (a shared queue's, for a fleet's budget) but must be
    /// refused as this pool would refuse it.
    pub fn screen(&self, ticket: &Ticket, now: u64) -> Option<Admit> {
        let ticket = self.at_least_a_unit(*ticket);
        let Ticket { id, cost, .. } = ticket;
        if self.is_live(id) {
            return Some(Admit::Reject(Rejection::DuplicateId(id)));
        }
        let capacity = self.limits.capacity.get(cost.kind);
        if cost.units > capacity {
            return Some(Admit::Reject(Rejection::InsufficientResources {
                kind: cost.kind,
                needed: cost.units,
                capacity,
            }));
        }
        if let Some(book) = &self.tenants {
            let max_per_tenant = book.cap(cost.kind);
            if cost.units > max_per_tenant {
                return Some(Admit::Reject(Rejection::AboveTenantShare {
                    kind: cost.kind,
                    needed: cost.units,
                    max_per_tenant,
                }));
            }
        }
        if ticket.deadline_ms.is_some_and(|deadline| deadline <= now) {
            return Some(Admit::Expire);
        }
        None
    }

    /// Admits a task, or a permit (`slotless`, rule 14); one that must park past a bound
    /// sheds tickets of lower priority if `sheds` (rule 21), else it is refused.
    fn admit_ticket(&mut self, ticket: Ticket, slotless: bool, sheds: bool, now: u64) -> Admit {
        if let Some(refused) = self.screen(&ticket, now) {
            return refused;
        }
        let ticket = self.at_least_a_unit(ticket);
        let Ticket { id, cost, .. } = ticket;
        self.clock = now;
        if let Some(book) = &mut self.tenants {
            book.arrive(ticket.tenant);
        }
        if let Some(budgets) = &mut self.budgets {
            budgets.refill(now);
        }
        self.promote_aged(now);
        let rank = self.rank_of(&ticket);
        let request = Request {
            id,
            cost,
            tenant: ticket.tenant,
            timeout_ms: ticket.timeout_ms.map_or(NO_TIMEOUT, saturate_timeout),
            priority: ticket.priority,
            slotless,
        };
        if !self.paused && self.may_start(&rank, &request, now) && self.claim(&request, now) {
            self.count_skip_of_head(&rank);
            // A start can let others start too. Under a fair share it changes its tenant's
            // keys: that can move the reservation, or (for a permit started while every
            // slot is busy) let a permit overtake a task that waits for a slot. With a
            // reservation, a newcomer that ranks ahead of it (a higher priority, or an
            // earlier deadline under the deadline order) delays the reserved ticket's start,
            // and tickets that end before the new time may backfill (rule 13).
            let fair_moves = self.tenants.is_some() && (!self.starving.is_empty() || slotless);
            let backfill_opens = !self.starving.is_empty() && self.limits.backfill;
            if !fair_moves && !backfill_opens {
                return Admit::Start;
            }
            let mut started = Vec::new();
            self.unpark(now, &mut started);
            return if started.is_empty() {
                Admit::Start
            } else {
                Admit::StartWith(started)
            };
        }
        self.park_or_shed(ticket, slotless, sheds, now)
    }

    /// Releases a running task's capacity (it finished, failed, panicked, timed out or was
    /// stopped) and starts what now fits, in rank order. Returns the started ids.
    pub fn complete(&mut self, id: TaskId, now: u64) -> Result<Vec<TaskId>, UnknownTask> {
        self.end_claim(id, false, now)
    }

    /// [`complete`](Self::complete) for a task whose worker thread is still busy with work
    /// the task left on it: its units are released now, its worker slot *rests* until
    /// [`worker_ready`](Self::worker_ready) (rule 9).
    pub fn complete_resting(&mut self, id: TaskId, now: u64) -> Result<Vec<TaskId>, UnknownTask> {
        self.end_claim(id, true, now)
    }

    /// Worker slot `worker`, resting, is ready for a task again; returns the tasks that
    /// start on the slots now idle, in order. Does nothing for a slot that does not rest.
    pub fn worker_ready(&mut self, worker: usize, now: u64) -> Vec<TaskId> {
        let mut started = Vec::new();
        let Some(resting) = self.resting.get_mut(worker) else {
            return started;
        };
        if !std::mem::take(resting) {
            return started;
        }
        if !self.retired[worker] {
            self.idle_workers.push(worker as u32);
        }
        self.unpark(now, &mut started);
        started
    }

    /// Rule 15: a kind with a budget holds no units; only running tasks of the kind have
    /// units to give back.
    fn check_budgets(&self) -> Result<(), String> {
        let Some(budgets) = &self.budgets else {
            return Ok(());
        };
        for (kind, budget) in budgets.kinds() {
            if self.used(kind) != 0 {
                return Err(format!(
                    "{kind:?} has a budget but holds {}",
                    self.used(kind)
                ));
            }
            if let Some(id) = budget
                .spenders()
                .find(|id| self.running.get(id).is_none_or(|claim| claim.kind != kind))
            {
                return Err(format!(
                    "task {id} may give {kind:?} units back but is not running"
                ));
            }
        }
        Ok(())
    }

    /// Releases running ticket `id`'s claim; its slot goes idle, or rests (`rest`).
    fn end_claim(&mut self, id: TaskId, rest: bool, now: u64) -> Result<Vec<TaskId>, UnknownTask> {
        let claim = self.end_claim_quietly(id, rest, now)?;
        let timeout = (claim.timeout_ms != NO_TIMEOUT).then_some(u64::from(claim.timeout_ms));
        self.run_times.observe(
            claim.kind,
            claim.declared,
            claim.worker == NO_WORKER,
            now.saturating_sub(claim.started_ms),
            timeout,
        );
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        Ok(started)
    }

    /// [`end_claim`](Self::end_claim), starting nothing; returns the claim it released.
    fn end_claim_quietly(
        &mut self,
        id: TaskId,
        rest: bool,
        now: u64,
    ) -> Result<Claim, UnknownTask> {
        let claim = self
            .running
            .remove(&id)
            .ok_or(UnknownTask::NotRunning(id))?;
        let kind = claim.kind.index();
        debug_assert!(self.used[kind] >= claim.units);
        self.used[kind] = self.used[kind].saturating_sub(claim.units);
        self.stop_watching(id, &claim);
        if let Some(book) = &mut self.tenants {
            book.release(claim.tenant, claim.kind, claim.units);
            book.settle(id, now);
        }
        if let Some(budget) = self.budgets.as_mut().and_then(|b| b.of_mut(claim.kind)) {
            budget.end(id);
        }
        self.free_worker_of(&claim, rest);
        Ok(claim)
    }

    /// Cancels a live task. A parked one is removed (and tasks it blocked may start); a
    /// running one keeps its capacity until the driver stopped it and called `complete`.
    pub fn cancel(&mut self, id: TaskId, now: u64) -> Result<Cancel, UnknownTask> {
        if self.running.contains_key(&id) {
            return Ok(Cancel::Running);
        }
        if let Some((until, _)) = self.sleepers.remove(&id) {
            self.sleeping.remove(&(until, id));
            return Ok(Cancel::Parked {
                started: Vec::new(),
            });
        }
        if self.cancel_held(id) {
            return Ok(Cancel::Parked {
                started: Vec::new(),
            });
        }
        if self.remove_parked(id).is_none() {
            return Err(UnknownTask::NotLive(id));
        }
        let mut started = Vec::new();
        self.unpark(now, &mut started);
        Ok(Cancel::Parked { started })
    }

    /// Advances time: expires parked tasks whose deadline is at or before `now`, reports
    /// running tasks that became overdue, ages parked tasks into starvation, and starts what
    /// an expired reservation unblocked.
    pub fn tick(&mut self, now: u64) -> Tick {
        let mut tick = Tick::default();
        while let Some(&(at, id)) = self.by_overdue.first() {
            if at > now {
                break;
            }
            self.by_overdue.pop_first();
            if let Some(claim) = self.running.get_mut(&id) {
                claim.overdue_at = None;
                tick.overdue.push(id);
            }
        }
        if !self.sleeping.is_empty() {
            // A sleeper whose deadline passed too wakes first, so that it expires here.
            self.wake_sleepers(now);
        }
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.remove_parked(id);
            tick.expired.push(id);
        }
        if self
            .dependencies
            .next_deadline()
            .is_some_and(|at| at <= now)
        {
            tick.expired.extend(self.dependencies.expire(now));
        }
        self.unpark(now, &mut tick.started);
        tick
    }

    /// Parks a task that a durable queue kept from an earlier run (`load_parked`), without
    /// the fast path and past `max_queue_depth` if need be: it is stored already and must not
    /// be lost. Call [`tick`](Self::tick) after the last one to start what fits.
    pub fn restore(&mut self, ticket: Ticket, now: u64) -> Result<(), Rejection> {
        let id = ticket.id;
        if self.is_live(id) {
            return Err(Rejection::DuplicateId(id));
        }
        self.park_returned(self.at_least_a_unit(ticket), now);
        Ok(())
    }

    /// Parks a task from `until_ms` on (rule 16): a failed run's task waiting out its
    /// backoff. Until then it is live (its state is `Parked`, it can be cancelled) but takes
    /// no part in any decision; from then on it is parked as by [`restore`](Self::restore),
    /// at its rank. Call [`tick`](Self::tick) at [`next_wakeup`](Self::next_wakeup).
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{PoolLimits, Priority, ResourceCost};
    /// use prometheus_parking_lot_actors::scheduler::core::{ParkingLot, Ticket};
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
    /// };
    /// lot.park_until(ticket, 500, 100).unwrap();
    /// assert_eq!(lot.next_wakeup(), Some(500));
    /// assert!(lot.tick(499).started.is_empty());
    /// assert_eq!(lot.tick(500).started, vec![1]);
    /// ```
    pub fn park_until(&mut self, ticket: Ticket, until_ms: u64, now: u64) -> Result<(), Rejection> {
        if until_ms <= now {
            return self.restore(ticket, now);
        }
        let id = ticket.id;
        if self.is_live(id) {
            return Err(Rejection::DuplicateId(id));
        }
        self.sleeping.insert((until_ms, id));
        self.sleepers
            .insert(id, (until_ms, self.at_least_a_unit(ticket)));
        Ok(())
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

    /// Whether the lot holds task `id`: parked, sleeping or running.
    fn is_live(&self, id: TaskId) -> bool {
        self.parked.contains_key(&id)
            || self.running.contains_key(&id)
            || (!self.sleepers.is_empty() && self.sleepers.contains_key(&id))
            || self.dependencies.holds(id)
    }

    /// Parks the sleepers whose time has come (rule 16).
    fn wake_sleepers(&mut self, now: u64) {
        while let Some(&(until, id)) = self.sleeping.first() {
            if until > now {
                break;
            }
            self.sleeping.pop_first();
            if let Some((_, ticket)) = self.sleepers.remove(&id) {
                self.park_returned(ticket, now);
            }
        }
    }

    /// Removes every parked task (for shutdown) and returns their ids, best-ranked first.
    pub fn take_parked(&mut self) -> Vec<TaskId> {
        let mut ranks: Vec<RankKey> = self
            .parked
            .iter()
            .map(|(&id, parked)| parked.rank(id))
            .collect();
        ranks.sort_unstable();
        let mut sleepers: Vec<TaskId> = self.sleeping.iter().map(|&(_, id)| id).collect();
        sleepers.extend(self.dependencies.take_all());
        self.sleeping.clear();
        self.sleepers.clear();
        self.parked.clear();
        self.by_cost = Default::default();
        self.permits_by_cost = Default::default();
        self.by_deadline.clear();
        self.by_park_time.clear();
        self.starving.clear();
        self.queue = QueueBook::default();
        if let Some(book) = &mut self.tenants {
            book.clear_parked();
        }
        if let Some(by_timeout) = &mut self.by_timeout {
            by_timeout.clear();
        }
        ranks
            .into_iter()
            .map(|rank| rank.id())
            .chain(sleepers)
            .collect()
    }

    /// Checks every invariant of the module docs. O(n): for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut held = [0u64; KINDS];
        for claim in self.running.values() {
            held[claim.kind.index()] += u64::from(claim.units);
        }
        for kind in ResourceKind::ALL {
            held[kind.index()] += u64::from(self.lent[kind.index()]);
        }
        for kind in ResourceKind::ALL {
            let (used, capacity) = (self.used(kind), self.limits.capacity.get(kind));
            if used > capacity || u64::from(used) != held[kind.index()] {
                return Err(format!(
                    "{kind:?}: used {used}, held by running tasks and lent {}, capacity {capacity}",
                    held[kind.index()]
                ));
            }
        }
        self.check_workers()?;
        if let Some(id) = self.parked.keys().find(|id| self.running.contains_key(id)) {
            return Err(format!("task {id} is both parked and running"));
        }
        let indexed: usize = self.by_cost.iter().map(CostIndex::len).sum();
        let permits: usize = self.permits_by_cost.iter().map(CostIndex::len).sum();
        let parked_permits = self.parked.values().filter(|p| p.slotless).count();
        if indexed + permits != self.parked.len() || permits != parked_permits {
            return Err(format!(
                "{indexed} tasks and {permits} permits indexed vs {} parked ({parked_permits} permits)",
                self.parked.len()
            ));
        }
        self.check_queue_bounds()?;
        if self
            .starving
            .iter()
            .any(|rank| !self.parked.contains_key(&rank.id()))
        {
            return Err("a starving task is not parked".into());
        }
        if let Some(book) = &self.tenants {
            let running = self
                .running
                .iter()
                .map(|(&id, claim)| (id, claim.tenant, claim.kind, claim.units));
            book.check(running, self.parked.len())?;
            self.check_fair_best_fit(book)?;
        }
        if let Some(by_timeout) = &self.by_timeout {
            let with_timeout = self
                .parked
                .values()
                .filter(|p| p.timeout().is_some())
                .count();
            if by_timeout.len() != with_timeout {
                return Err(format!(
                    "{} in the timeout index vs {with_timeout} parked with a timeout",
                    by_timeout.len()
                ));
            }
        }
        self.check_budgets()?;
        if self.sleeping.len() != self.sleepers.len()
            || self.sleeping.iter().any(|(until, id)| {
                self.sleepers.get(id).map(|&(at, _)| at) != Some(*until)
                    || self.parked.contains_key(id)
                    || self.running.contains_key(id)
            })
        {
            return Err(
                "a sleeper is not exactly once in the sleeping index, or is also parked or running"
                    .into(),
            );
        }
        self.dependencies.check(|id| {
            self.parked.contains_key(&id)
                || self.running.contains_key(&id)
                || self.sleepers.contains_key(&id)
        })?;
        if let Some(runnable) = self.best_fit(self.clock) {
            return Err(format!(
                "saturation broken: parked task {} fits and is not blocked",
                runnable.id()
            ));
        }
        Ok(())
    }

    /// The fair share's pruned search finds what a scan of every parked task finds.
    fn check_fair_best_fit(&self, book: &TenantBook) -> Result<(), String> {
        let free = ResourceKind::ALL.map(|kind| self.free(kind));
        let scanned = self
            .parked
            .iter()
            .filter_map(|(&id, parked)| {
                let (rank, tenant) = (parked.rank(id), book.tenant_of(id));
                let fits = parked.units <= free[parked.kind.index()]
                    && parked.units <= book.room(tenant, parked.kind)
                    && !book.starving_ahead_of(tenant, &rank);
                fits.then(|| book.key(tenant, parked.kind, rank))
            })
            .min();
        let ceiling = self
            .best_within(&self.by_cost, &free)
            .into_iter()
            .chain(self.best_within(&self.permits_by_cost, &free))
            .min()
            .map(|best| best.priority());
        let searched = ceiling.and_then(|ceiling| book.best_fit(&free, ceiling));
        if searched != scanned {
            return Err(format!(
                "fair best fit {searched:?}, a scan finds {scanned:?}"
            ));
        }
        Ok(())
    }

    /// Every slot is idle, held by exactly one running task, or retired (and idle never).
    fn check_workers(&self) -> Result<(), String> {
        let mut holders = vec![0u32; self.worker_slots as usize];
        let mut permits = 0;
        for claim in self.running.values() {
            match holders.get_mut(claim.worker as usize) {
                Some(count) => *count += 1,
                None if claim.worker == NO_WORKER => permits += 1,
                None => return Err(format!("worker {} does not exist", claim.worker)),
            }
        }
        if permits != self.running_permits {
            return Err(format!(
                "{permits} permits running vs {} counted",
                self.running_permits
            ));
        }
        for &idle in &self.idle_workers {
            holders[idle as usize] += 1;
            if self.retired[idle as usize] {
                return Err(format!("retired worker {idle} is idle"));
            }
        }
        for (worker, _) in self.resting.iter().enumerate().filter(|(_, rests)| **rests) {
            holders[worker] += 1;
            if self.retired[worker] {
                return Err(format!("retired worker {worker} rests"));
            }
        }
        for (worker, &count) in holders.iter().enumerate() {
            let expected = u32::from(!self.retired[worker]);
            if count > 1 || (count == 0 && expected == 1) {
                return Err(format!(
                    "worker {worker} is held {count} times (retired: {})",
                    self.retired[worker]
                ));
            }
        }
        Ok(())
    }

    /// Starts parked tasks in rank order, skipping those that do not fit, until nothing more
    /// fits or the reservation blocks the rest.
    fn unpark(&mut self, now: u64, started: &mut Vec<TaskId>) {
        self.clock = now;
        if !self.sleeping.is_empty() {
            self.wake_sleepers(now);
        }
        if let Some(budgets) = &mut self.budgets {
            budgets.refill(now);
        }
        self.promote_aged(now);
        while let Some(rank) = self.best_fit(now) {
            self.start_parked(rank, now);
            started.push(rank.id());
        }
    }

    /// The parked task to start next, if any: the best that fits the free capacity (and its
    /// tenant's room) and is not held back by the reservation; failing that, the best task
    /// the reservation holds back that may backfill.
    ///
    /// With every worker slot busy only permits (rule 14) may start: the best permit that
    /// fits, in rank order; under a fair share the fair-best task if it is a permit, and
    /// nothing if it needs a slot (a permit then waits behind it), unless the reservation
    /// ranks ahead of it: then a permit may backfill (rule 13).
    fn best_fit(&self, now: u64) -> Option<RankKey> {
        if self.paused {
            return None;
        }
        let slot_idle = !self.idle_workers.is_empty();
        let free = ResourceKind::ALL.map(|kind| self.free(kind));
        let permit = self.best_within(&self.permits_by_cost, &free);
        if !slot_idle && permit.is_none() {
            return None;
        }
        // Without an idle slot a task's rank still bounds the fair order's ceiling.
        let task = (slot_idle || self.tenants.is_some())
            .then(|| self.best_within(&self.by_cost, &free))
            .flatten();
        let best = permit.into_iter().chain(task).min()?;
        // Under a fair share, nothing fits if nothing fits the free units: the tenants need
        // not be asked (the common last decision of an unpark).
        let Some(book) = &self.tenants else {
            return match self.starving.first() {
                Some(reserved) if reserved.ranks_ahead_of(&best) => {
                    self.backfill_candidate(*reserved, best.priority(), now)
                }
                _ => Some(best),
            };
        };
        let ceiling = best.priority();
        let best = book.best_fit(&free, ceiling)?;
        match self.fair_reservation(book) {
            Some(reserved) if reserved < best => {
                self.backfill_candidate(reserved.rank(), ceiling, now)
            }
            _ if !slot_idle && !self.is_permit(best.rank()) => None,
            _ => Some(best.rank()),
        }
    }

    /// The best-ranked task of `indexes` that fits `free`.
    fn best_within(&self, indexes: &[CostIndex; KINDS], free: &[u32; KINDS]) -> Option<RankKey> {
        indexes
            .iter()
            .zip(free)
            .filter(|(index, _)| !index.is_empty())
            .filter_map(|(index, &free)| index.best_within(free))
            .min()
    }

    /// Whether parked task `rank` is a permit.
    fn is_permit(&self, rank: RankKey) -> bool {
        self.parked
            .get(&rank.id())
            .is_some_and(|parked| parked.slotless)
    }

    /// The reservation under a fair share (rule 12).
    fn fair_reservation(&self, book: &TenantBook) -> Option<rank::FairKey> {
        book.reservation(|rank| {
            self.parked
                .get(&rank.id())
                .map(|parked| (parked.kind, parked.units))
        })
    }

    /// The task the pool drains for (rule 6, under a fair share rule 12).
    fn reserved(&self) -> Option<RankKey> {
        match &self.tenants {
            None => self.starving.first().copied(),
            Some(book) => self.fair_reservation(book).map(|key| key.rank()),
        }
    }

    /// Whether a newcomer ranked `rank` asking for `request` may start now as far as the
    /// reservations go (rules 6, 12, 13).
    fn may_start(&self, rank: &RankKey, request: &Request, now: u64) -> bool {
        let Request {
            cost,
            tenant,
            timeout_ms,
            ..
        } = *request;
        let reserved = match &self.tenants {
            None => self
                .starving
                .first()
                .filter(|reserved| reserved.ranks_ahead_of(rank))
                .copied(),
            Some(book) => {
                if book.starving_ahead_of(tenant, rank) {
                    return false;
                }
                let key = book.key(tenant, cost.kind, *rank);
                if request.slotless && self.fair_best_waits_for_a_slot(book, key) {
                    return false;
                }
                self.fair_reservation(book)
                    .filter(|reserved| *reserved < key)
                    .map(|reserved| reserved.rank())
            }
        };
        let Some(reserved) = reserved else {
            return true;
        };
        if timeout_ms == NO_TIMEOUT {
            return false;
        }
        let Some(shadow) = self.shadow(reserved, now) else {
            return false;
        };
        now.saturating_add(u64::from(timeout_ms)) <= shadow.at
            || shadow.spares(cost, request.slotless)
    }

    /// Whether, with every worker slot busy, a parked task that fits ranks ahead of a
    /// newcomer permit keyed `key` under the fair order: the newcomer then waits in line
    /// behind it, as a parked permit would (rule 14). Not when the reservation ranks ahead
    /// of that task: the newcomer is then a backfill candidate (rule 13), judged as
    /// [`best_fit`](Self::best_fit) judges a parked permit.
    fn fair_best_waits_for_a_slot(&self, book: &TenantBook, key: rank::FairKey) -> bool {
        if !self.idle_workers.is_empty() {
            return false;
        }
        let free = ResourceKind::ALL.map(|kind| self.free(kind));
        let ceiling = self
            .best_within(&self.by_cost, &free)
            .into_iter()
            .chain(self.best_within(&self.permits_by_cost, &free))
            .min();
        let Some(best) = ceiling.and_then(|best| book.best_fit(&free, best.priority())) else {
            return false;
        };
        best < key
            && self
                .fair_reservation(book)
                .is_none_or(|reserved| reserved >= best)
    }

    /// The task held back by `reserved` to backfill (rule 13), if any may: it has a
    /// timeout, fits now, its tenant has room for it and no starving task of its own tenant
    /// ranks ahead of it; and either its timeout ends by the reservation's shadow time, or it
    /// fits in what the reservation leaves spare at that time. Among those, the highest
    /// priority first, then the one that uses the most of the free units, then rank.
    /// `ceiling` is the priority of the best-ranked parked task that fits the free units:
    /// no task of a higher priority fits, so those levels are not asked.
    fn backfill_candidate(
        &self,
        reserved: RankKey,
        ceiling: Priority,
        now: u64,
    ) -> Option<RankKey> {
        let by_timeout = self.by_timeout.as_ref()?;
        let shadow = self.shadow(reserved, now)?;
        let limit = shadow.at.checked_sub(now)?;
        let free = ResourceKind::ALL.map(|kind| self.free(kind));
        let slot_idle = !self.idle_workers.is_empty();
        let within_share = |candidate: RankKey, parked: &Parked| {
            (slot_idle || parked.slotless)
                && self.tenants.as_ref().is_none_or(|book| {
                    let tenant = book.tenant_of(candidate.id());
                    parked.units <= book.room(tenant, parked.kind)
                        && !book.starving_ahead_of(tenant, &candidate)
                })
        };
        let ends_in_time = |candidate: RankKey| {
            self.parked.get(&candidate.id()).is_some_and(|parked| {
                parked.timeout().is_some_and(|timeout| timeout <= limit)
                    && within_share(candidate, parked)
            })
        };
        // In the spare room, a task needs a spare slot unless it is a permit.
        let permits_parked = !self.permits_by_cost.iter().all(CostIndex::is_empty);
        let any_timeout = |candidate: RankKey| {
            self.parked.get(&candidate.id()).is_some_and(|parked| {
                (shadow.spare_slots > 0 || parked.slotless) && within_share(candidate, parked)
            })
        };
        let mut spare = free;
        spare[shadow.kind.index()] = spare[shadow.kind.index()].min(shadow.spare_units);
        let all_spare = shadow.spare_slots > 0 && spare == free;
        // Level by level from the reservation's down: a task of a level ranks ahead of
        // every task of a lower one, whatever its size.
        let top = reserved.priority().min(ceiling);
        for priority in Priority::ALL.into_iter().rev().filter(|&p| p <= top) {
            // When the spare room is all the free room, every task that fits may backfill
            // whatever its timeout: the first query would only repeat part of the second.
            let in_time = (!all_spare)
                .then(|| by_timeout.largest_within(priority, limit, &free, ends_in_time))
                .flatten();
            let in_spare_room = (shadow.spare_slots > 0 || permits_parked)
                .then(|| by_timeout.largest_within(priority, u64::MAX, &spare, any_timeout))
                .flatten();
            let found = [in_time, in_spare_room]
                .into_iter()
                .flatten()
                .min_by_key(|&(units, rank)| (std::cmp::Reverse(units), rank));
            if let Some((_, rank)) = found {
                return Some(rank);
            }
        }
        None
    }

    /// The reservation's shadow: the earliest time at which, if every running task ends by
    /// its timeout, its kind has its units free and a worker slot is idle, and what would be
    /// spare then beyond the reservation's needs. `None` when the running tasks with a
    /// timeout (and not yet past it) do not free enough, or when a headroom caps its kind
    /// (another process decides when that memory returns).
    fn shadow(&self, reserved: RankKey, now: u64) -> Option<Shadow> {
        let parked = self.parked.get(&reserved.id())?;
        let kind = parked.kind;
        if self.headroom[kind.index()] != UNLIMITED || self.budget(kind).is_some() {
            return None;
        }
        let mut free = self.limits.capacity.get(kind) - self.used[kind.index()];
        let mut idle = self.idle_workers.len();
        let slots = usize::from(!parked.slotless);
        let shadow_at = |at: u64, free: u32, idle: usize| Shadow {
            at,
            kind,
            spare_units: free - parked.units,
            spare_slots: idle - slots,
        };
        if free >= parked.units && idle >= slots {
            return Some(shadow_at(now, free, idle));
        }
        for &(ends_by, id) in self.by_end.range((now, 0)..) {
            let Some(claim) = self.running.get(&id) else {
                continue;
            };
            if claim.kind == kind {
                free += claim.units;
            }
            if self.retired.get(claim.worker as usize) == Some(&false) {
                idle += 1;
            }
            if free >= parked.units && idle >= slots {
                return Some(shadow_at(ends_by, free, idle));
            }
        }
        None
    }

    /// The best-ranked parked task of any kind, permits included.
    fn head(&self) -> Option<RankKey> {
        self.by_cost
            .iter()
            .chain(&self.permits_by_cost)
            .filter_map(CostIndex::best)
            .min()
    }

    /// Takes the request's cost and a worker slot (none for a permit) if both fit (and the
    /// tenant's share, under a fair share); returns whether it did.
    fn claim(&mut self, request: &Request, now: u64) -> bool {
        let Request {
            id,
            cost,
            tenant,
            timeout_ms,
            ..
        } = *request;
        if !request.slotless && self.idle_workers.is_empty() {
            return false;
        }
        let kind = cost.kind.index();
        // A kind with a budget spends its units at the start and holds none (rule 15).
        let budgeted = self.budget(cost.kind).is_some();
        let held = if budgeted { 0 } else { cost.units };
        let Some(used) = self.used[kind].checked_add(held) else {
            return false;
        };
        if used > self.limits.capacity.get(cost.kind) || cost.units > self.headroom[kind] {
            return false;
        }
        if budgeted && cost.units > self.free(cost.kind) {
            return false;
        }
        if let Some(book) = &self.tenants {
            if cost.units > book.room(tenant, cost.kind) {
                return false;
            }
        }
        let worker = if request.slotless {
            self.running_permits += 1;
            NO_WORKER
        } else {
            let Some(worker) = self.idle_workers.pop() else {
                return false;
            };
            worker
        };
        self.used[kind] = used;
        if self.headroom[kind] != UNLIMITED {
            self.headroom[kind] -= cost.units;
        }
        if let Some(budget) = self.budgets.as_mut().and_then(|b| b.of_mut(cost.kind)) {
            budget.start(id, cost.units);
        }
        self.starts += 1;
        if let Some(book) = &mut self.tenants {
            book.start(tenant, cost.kind, held, self.starts);
            let timeout = (timeout_ms != NO_TIMEOUT).then_some(u64::from(timeout_ms));
            book.charge(id, tenant, cost.units, timeout, now);
        }
        let ends_by = (timeout_ms != NO_TIMEOUT && self.by_timeout.is_some())
            .then(|| now.saturating_add(u64::from(timeout_ms)));
        if let Some(at) = ends_by {
            self.by_end.insert((at, id));
        }
        self.running.insert(
            id,
            Claim {
                kind: cost.kind,
                units: held,
                worker,
                tenant,
                priority: request.priority,
                started: self.starts,
                overdue_at: None,
                ends_by,
                started_ms: now,
                timeout_ms,
                declared: cost.units,
            },
        );
        true
    }

    /// Drops a task that left the running set from the watchdog's and backfill's indexes.
    fn stop_watching(&mut self, id: TaskId, claim: &Claim) {
        if let Some(at) = claim.overdue_at {
            self.by_overdue.remove(&(at, id));
        }
        if let Some(at) = claim.ends_by {
            self.by_end.remove(&(at, id));
        }
    }

    /// Gives the worker slot of a claim that ended back, unless it is retired or the claim
    /// is a permit's (which holds none).
    fn free_worker_of(&mut self, claim: &Claim, rest: bool) {
        let worker = claim.worker as usize;
        if claim.worker == NO_WORKER {
            self.running_permits -= 1;
        } else if self.retired[worker] {
            // Gone for good: never handed out again.
        } else if rest {
            self.resting[worker] = true;
        } else {
            self.idle_workers.push(claim.worker);
        }
    }

    /// The index that holds a parked task or permit of `kind`.
    fn index_mut(&mut self, kind: ResourceKind, slotless: bool) -> &mut CostIndex {
        if slotless {
            &mut self.permits_by_cost[kind.index()]
        } else {
            &mut self.by_cost[kind.index()]
        }
    }

    fn park(&mut self, ticket: Ticket, slotless: bool, now: u64) {
        let parked = Parked {
            created_at_ms: ticket.created_at_ms,
            deadline_ms: ticket.deadline_ms,
            parked_at_ms: now,
            units: ticket.cost.units,
            skips: 0,
            timeout_ms: ticket.timeout_ms.map_or(NO_TIMEOUT, saturate_timeout),
            priority: ticket.priority,
            kind: ticket.cost.kind,
            slotless,
            by_deadline: self.orders_by_deadline(),
        };
        let rank = parked.rank(ticket.id);
        self.queue.park(parked.kind, parked.units, rank);
        self.index_mut(parked.kind, slotless)
            .insert(parked.units, rank);
        if let Some(deadline) = parked.deadline_ms {
            self.by_deadline.insert((deadline, ticket.id));
        }
        if self.limits.starvation.max_park_ms.is_some() {
            self.by_park_time.insert((now, ticket.id));
        }
        if let Some(book) = &mut self.tenants {
            book.park(ticket.tenant, parked.kind, parked.units, rank);
        }
        if let (Some(by_timeout), Some(timeout)) = (&mut self.by_timeout, parked.timeout()) {
            by_timeout.insert(timeout as u32, parked.kind, parked.units, rank);
        }
        self.parked.insert(ticket.id, parked);
    }

    /// Removes a parked task from every index; returns its data and its tenant (0 without
    /// a fair share).
    fn remove_parked(&mut self, id: TaskId) -> Option<(Parked, TenantKey)> {
        let parked = self.parked.remove(&id)?;
        let rank = parked.rank(id);
        self.queue.unpark(parked.kind, parked.units, rank);
        self.index_mut(parked.kind, parked.slotless)
            .remove(parked.units, rank);
        if let Some(deadline) = parked.deadline_ms {
            self.by_deadline.remove(&(deadline, id));
        }
        self.by_park_time.remove(&(parked.parked_at_ms, id));
        self.starving.remove(&rank);
        let tenant = match &mut self.tenants {
            Some(book) => book.unpark(parked.kind, parked.units, rank),
            None => 0,
        };
        if let (Some(by_timeout), Some(timeout)) = (&mut self.by_timeout, parked.timeout()) {
            by_timeout.remove(timeout as u32, parked.kind, parked.units, rank);
        }
        Some((parked, tenant))
    }

    fn start_parked(&mut self, rank: RankKey, now: u64) {
        let Some((parked, tenant)) = self.remove_parked(rank.id()) else {
            return;
        };
        let request = Request {
            id: rank.id(),
            cost: ResourceCost::new(parked.kind, parked.units),
            tenant,
            timeout_ms: parked.timeout_ms,
            priority: parked.priority,
            slotless: parked.slotless,
        };
        let claimed = self.claim(&request, now);
        debug_assert!(claimed, "best_fit only returns tasks that fit");
        self.count_skip_of_head(&rank);
    }

    /// A task ranked `started` just started; if the head ranks ahead of it, the head was
    /// overtaken once more.
    fn count_skip_of_head(&mut self, started: &RankKey) {
        let Some(max_skips) = self.limits.starvation.max_skips else {
            return;
        };
        let Some(head) = self.head() else {
            return;
        };
        if !head.ranks_ahead_of(started) {
            return;
        }
        let Some(parked) = self.parked.get_mut(&head.id()) else {
            return;
        };
        parked.skips = parked.skips.saturating_add(1);
        if parked.skips >= max_skips {
            let parked_at = parked.parked_at_ms;
            self.mark_starving(head, parked_at);
        }
    }

    /// Moves every task parked for at least `max_park_ms` into the starving set.
    fn promote_aged(&mut self, now: u64) {
        let Some(max_park_ms) = self.limits.starvation.max_park_ms else {
            return;
        };
        while let Some(&(parked_at, id)) = self.by_park_time.first() {
            if parked_at.saturating_add(max_park_ms) > now {
                return;
            }
            self.by_park_time.pop_first();
            if let Some(parked) = self.parked.get(&id) {
                let rank = parked.rank(id);
                self.starving.insert(rank);
                if let Some(book) = &mut self.tenants {
                    book.mark_starving(rank);
                }
            }
        }
    }

    fn mark_starving(&mut self, rank: RankKey, parked_at: u64) {
        self.by_park_time.remove(&(parked_at, rank.id()));
        self.starving.insert(rank);
        if let Some(book) = &mut self.tenants {
            book.mark_starving(rank);
        }
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
mod tests_share;
#[cfg(test)]
mod tests_shedding;
#[cfg(test)]
mod tests_vtc;
