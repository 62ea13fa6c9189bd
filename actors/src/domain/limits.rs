//! What a pool may hand out: units per resource kind, worker slots, queue depth, the
//! starvation guard, the per-tenant fair share and backfill.

use serde::{Deserialize, Serialize};

use super::order::validate_max_queued_units;
use super::{
    Budget, Budgets, FairByUse, OnGiveUp, PoolError, QueueOrder, ResourceKind,
    DEFAULT_STREAM_IDLE_MS, MAX_STREAM_IDLE_MS,
};

/// Units available per resource kind. Each kind is a separate budget.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    units: [u32; ResourceKind::COUNT],
}

impl Capacity {
    /// The same number of units for every kind, which is what a pool configured with a single
    /// `max_units` gets.
    pub const fn uniform(units: u32) -> Self {
        Self {
            units: [units; ResourceKind::COUNT],
        }
    }

    /// The same capacity with `units` for `kind`.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{Capacity, ResourceKind};
    /// let capacity = Capacity::uniform(4).with(ResourceKind::GpuVram, 24_000);
    /// assert_eq!(capacity.get(ResourceKind::GpuVram), 24_000);
    /// assert_eq!(capacity.get(ResourceKind::Cpu), 4);
    /// ```
    pub const fn with(mut self, kind: ResourceKind, units: u32) -> Self {
        self.units[kind.index()] = units;
        self
    }

    /// Units of `kind`.
    pub const fn get(&self, kind: ResourceKind) -> u32 {
        self.units[kind.index()]
    }

    /// Whether every kind has zero units.
    pub fn is_empty(&self) -> bool {
        self.units.iter().all(|&units| units == 0)
    }
}

/// When a parked task counts as starving.
///
/// A starving task is *reserved*: nothing ranked below it starts until it has started, so the
/// pool drains for it. `PARKING_LOT.md` derives the waiting bound this gives.
///
/// ```
/// use prometheus_parking_lot_actors::domain::{PoolLimits, StarvationGuard};
///
/// let guard = StarvationGuard { max_park_ms: Some(2_000), max_skips: Some(64) };
/// let limits = PoolLimits::new(24, 8).with_starvation(guard);
/// assert_eq!(limits.starvation.max_skips, Some(64));
/// assert_eq!(StarvationGuard::default().max_park_ms, Some(30_000));
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct StarvationGuard {
    /// A task parked at least this long (milliseconds) is starving. `None` turns the age rule
    /// off.
    pub max_park_ms: Option<u64>,
    /// A task at the head of the parking lot that has been overtaken this many times by
    /// smaller, lower-ranked tasks is starving. `None` turns the skip rule off.
    pub max_skips: Option<u32>,
}

impl StarvationGuard {
    /// No starvation guard: pure skip-ahead packing.
    pub const fn disabled() -> Self {
        Self {
            max_park_ms: None,
            max_skips: None,
        }
    }
}

impl Default for StarvationGuard {
    /// Starving after 30 seconds parked or 256 skips at the head.
    fn default() -> Self {
        Self {
            max_park_ms: Some(30_000),
            max_skips: Some(256),
        }
    }
}

/// A cap on the units one tenant's running tasks may hold, per resource kind.
///
/// With a fair share, a tenant's running tasks never hold more than the cap of any kind, and
/// among parked tasks of one priority the tenant using least goes first. A task costing more
/// than the cap could never start, so admission refuses it. `PARKING_LOT.md` states the
/// waiting bound this gives the other tenants.
///
/// ```
/// use prometheus_parking_lot_actors::domain::FairShare;
/// assert_eq!(FairShare::MaxUnitsPerTenant(12).cap(24), 12);
/// assert_eq!(FairShare::MaxUnitsPerTenant(40).cap(24), 24);
/// assert_eq!(FairShare::MaxFraction(0.5).cap(24_000), 12_000);
/// assert_eq!(FairShare::MaxFraction(0.01).cap(24), 1); // never below one unit
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum FairShare {
    /// At most this many units of each kind per tenant (at least 1).
    MaxUnitsPerTenant(u32),
    /// At most this fraction of each kind's capacity per tenant, rounded down but at least
    /// one unit (greater than 0, at most 1).
    MaxFraction(f64),
}

// `validate` refuses a fraction that is not a finite number in (0, 1], so no limits that a
// pool accepts hold a NaN and equality is an equivalence.
impl Eq for FairShare {}

impl FairShare {
    /// The most units of a kind with `capacity` units that one tenant may hold.
    pub fn cap(&self, capacity: u32) -> u32 {
        match *self {
            FairShare::MaxUnitsPerTenant(units) => units.min(capacity),
            FairShare::MaxFraction(fraction) => {
                let share = (f64::from(capacity) * fraction).floor() as u32;
                share.clamp(1.min(capacity), capacity)
            }
        }
    }

    fn validate(&self) -> Result<(), PoolError> {
        match *self {
            FairShare::MaxUnitsPerTenant(0) => Err(PoolError::InvalidConfig(
                "fair_share.max_units_per_tenant is 0; use at least 1".into(),
            )),
            FairShare::MaxFraction(fraction) if !(fraction > 0.0 && fraction <= 1.0) => {
                Err(PoolError::InvalidConfig(format!(
                    "fair_share.max_fraction is {fraction}; use a number greater than 0 and at most 1"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// The limits of one pool.
///
/// A running task holds its cost's units of one kind and one worker slot; it may start only
/// when both fit.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Units per resource kind.
    pub capacity: Capacity,
    /// How many tasks may run at once (the pool's worker threads).
    pub worker_slots: usize,
    /// How many tasks may be parked at once; admission past it is `QueueFull`.
    pub max_queue_depth: usize,
    /// When a parked task is reserved against starvation.
    pub starvation: StarvationGuard,
    /// A cap on one tenant's running units per kind; `None`: no cap, no fair ordering.
    #[serde(default)]
    pub fair_share: Option<FairShare>,
    /// Orders tenants by the weighted service they were charged instead of by what they
    /// hold now (see [`FairByUse`]); `None`: by what they hold. Without a `fair_share` it
    /// orders tenants without capping them.
    #[serde(default)]
    pub fair_by_use: Option<FairByUse>,
    /// While a reserved task waits for capacity, let a lower-ranked task start if its
    /// execution timeout ends before the reserved task can start (EASY backfilling).
    /// Default on: it only starts tasks that cannot delay the reservation (see
    /// `PARKING_LOT.md`), and tasks without a timeout never backfill.
    #[serde(default = "backfill_default")]
    pub backfill: bool,
    /// Whether a waiter may ask running permits of lower priority to give way (see
    /// [`Preemption`]); `None`: never.
    #[serde(default)]
    pub preemption: Option<Preemption>,
    /// The kinds whose units refill with time instead of when tasks end (rule 15): spent at
    /// a start, given back by the clock. Default: none.
    #[serde(default)]
    pub budgets: Budgets,
    /// What a submission whose task is live already, or whose result still waits, gets:
    /// refused (the default) or the original's mailbox key (see [`OnDuplicate`]).
    #[serde(default)]
    pub on_duplicate: OnDuplicate,
    /// Whether a run that failed in a way worth trying again (its executor panicked, or
    /// asked with `running::retry_later`) runs again after a backoff (see [`Retries`]);
    /// `None`: a failure is final.
    #[serde(default)]
    pub retry: Option<Retries>,
    /// The order of parked tasks within a priority (core rule 20): by admission (the
    /// default) or earliest deadline first (see [`QueueOrder`]).
    #[serde(default)]
    pub order: QueueOrder,
    /// The most units of any one kind that may be parked at once (core rule 21), beside
    /// `max_queue_depth`; `None`: no bound by units. At either bound a newcomer that must
    /// park takes the place of parked tasks of lower priority, lowest-ranked first, which
    /// end refused (`QueueFull`); failing that it is refused itself. On a shared queue the
    /// queue keeps it for every node ([`QueuedUnits`](crate::queue::QueuedUnits)); a queue
    /// that cannot refuses the pool at start.
    #[serde(default)]
    pub max_queued_units: Option<u64>,
    /// What a retrieve that gives up does to the task it waited for (see [`OnGiveUp`]);
    /// `None`: what fits the pool's mailbox (abandon in memory, keep when durable).
    #[serde(default)]
    pub on_give_up: Option<OnGiveUp>,
    /// How long a streamed task (`submit_streaming`) may wait on a reader who takes nothing,
    /// ms: once its buffer is full the executor's send waits; if nothing is read for this
    /// long, the task is cancelled (the send fails with `StreamClosed`, the cancellation
    /// flag is raised) and its units come back as soon as its executor returns. A reader that
    /// comes back later still gets the partials that waited, then `Cancelled`. 1 ms to a day;
    /// default five minutes ([`DEFAULT_STREAM_IDLE_MS`]).
    #[serde(default = "stream_idle_default")]
    pub stream_idle_ms: u64,
    /// What admission refuses besides what can never run (see [`Admission`]). Default:
    /// nothing more.
    #[serde(default)]
    pub admission: Admission,
}

/// Opt-in refusals at admission, decided on the pool's estimate of when a task would start
/// (the core's rule 23, `PARKING_LOT.md`, "When will it start").
///
/// With `refuse_if_late`, a submission with a deadline whose estimated start is after that
/// deadline is refused at once with [`PoolError::WouldMissDeadline`], which carries the
/// estimate, instead of parking only to expire later: its caller can retry elsewhere,
/// degrade, or tell its user now. A task whose start cannot be estimated (the pool is
/// paused, or what it needs is held by a run of unknown length) is admitted as before.
///
/// ```
/// use prometheus_parking_lot_actors::domain::{Admission, PoolLimits};
///
/// let limits = PoolLimits::new(24, 4).with_admission(Admission { refuse_if_late: true });
/// assert!(limits.admission.refuse_if_late);
/// assert!(!PoolLimits::new(24, 4).admission.refuse_if_late, "off by default");
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admission {
    /// Refuse a submission whose estimated start is after its deadline.
    #[serde(default)]
    pub refuse_if_late: bool,
}

/// Runs of a task that failed, tried again: a run whose executor panicked, or that asked
/// for it (`running::retry_later`, say on a provider's 429 or 503), parks again after a
/// backoff and runs again, up to `max_attempts` runs in all. The backoff doubles from
/// `backoff_ms` up to `max_backoff_ms`, and each wait is drawn between half of it and all
/// of it (jitter), so tasks that failed together do not come back together. After the last
/// run the task ends `Failed` with every run's reason.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot_actors::domain::Retries;
///
/// let retries = Retries::new(4, Duration::from_millis(200)).with_max_backoff(Duration::from_secs(1));
/// // After the first failure: 100-200 ms; the second: 200-400; the third: 400-800.
/// assert_eq!(retries.backoff_ms(1, 0.0), 100);
/// assert_eq!(retries.backoff_ms(3, 0.999_999), 799);
/// assert_eq!(retries.backoff_ms(9, 0.0), 500); // at most max_backoff_ms
/// assert!(retries.validate().is_ok());
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retries {
    /// Runs in all, the first included (at least 1; 1 means no retry).
    pub max_attempts: u32,
    /// The wait after the first failed run, ms (before jitter).
    pub backoff_ms: u64,
    /// The longest wait, ms (before jitter).
    pub max_backoff_ms: u64,
}

/// The longest backoff: a day.
const MAX_BACKOFF_MS: u64 = 86_400_000;

impl Retries {
    /// `max_attempts` runs in all, waiting `backoff` after the first failure (doubling,
    /// at most 64 times `backoff` or a day).
    pub fn new(max_attempts: u32, backoff: std::time::Duration) -> Self {
        let backoff_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX);
        Self {
            max_attempts,
            backoff_ms,
            max_backoff_ms: backoff_ms.saturating_mul(64).min(MAX_BACKOFF_MS),
        }
    }

    /// The same retries with another longest wait.
    pub fn with_max_backoff(mut self, max_backoff: std::time::Duration) -> Self {
        self.max_backoff_ms = u64::try_from(max_backoff.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// The wait after `failed` failed runs (1 for the first), with `draw` in `[0, 1)`
    /// placing it between half the doubled backoff and all of it.
    pub fn backoff_ms(&self, failed: u32, draw: f64) -> u64 {
        let doubled = self
            .backoff_ms
            .saturating_mul(1u64 << failed.saturating_sub(1).min(62))
            .min(self.max_backoff_ms);
        let half = doubled / 2;
        half + ((doubled - half) as f64 * draw.clamp(0.0, 1.0)) as u64
    }

    /// Checks the numbers.
    pub fn validate(&self) -> Result<(), PoolError> {
        if self.max_attempts == 0 {
            return Err(PoolError::InvalidConfig(
                "retry.max_attempts is 0; use at least 1 (the first run counts)".into(),
            ));
        }
        if self.backoff_ms > self.max_backoff_ms || self.max_backoff_ms > MAX_BACKOFF_MS {
            return Err(PoolError::InvalidConfig(format!(
                "retry: backoff_ms is {} and max_backoff_ms {}; use backoff_ms at most \
                 max_backoff_ms, and at most a day ({MAX_BACKOFF_MS} ms)",
                self.backoff_ms, self.max_backoff_ms
            )));
        }
        Ok(())
    }
}

/// What a pool answers a submission that repeats a task it has: one whose (tenant, task id)
/// is live, or whose result waits under the same key and id. A caller whose request timed
/// out submits it again; with `Attach` that is safe. On a shared queue `Attach` holds across
/// the nodes: the queue keeps callers unique (see
/// [`UniqueCallers::keep_callers_unique`](crate::queue::UniqueCallers::keep_callers_unique)).
///
/// ```
/// use prometheus_parking_lot_actors::domain::{OnDuplicate, PoolLimits};
/// let limits = PoolLimits::new(8, 2).with_on_duplicate(OnDuplicate::Attach);
/// assert_eq!(limits.on_duplicate, OnDuplicate::Attach);
/// assert_eq!(PoolLimits::new(8, 2).on_duplicate, OnDuplicate::Refuse);
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnDuplicate {
    /// Refused: `DuplicateTask` for a live task, `ResultPending` for a waiting result.
    #[default]
    Refuse,
    /// Not run again: the submission is answered with the original's mailbox key, under
    /// which its result is (or will be) retrieved. Its payload is dropped.
    Attach,
}

/// Opt-in preemption: when a waiter cannot fit but would if holders of strictly lower
/// priority gave way, the scheduler asks the fewest such holders (lowest priority first,
/// most recently started first within a priority) to yield: capacity permits, and the
/// running tasks of a pool that can run them again (`PoolClient::preempt_tasks`). Nothing
/// is killed: a holder hears it and decides when to let go.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preemption {
    /// How many times one task id may be asked to yield; after that it runs undisturbed.
    /// At least 1.
    pub max_per_task: u32,
}

impl Preemption {
    /// Preemption with this bound per task id.
    pub fn new(max_per_task: u32) -> Self {
        Self { max_per_task }
    }

    /// Checks the bound, naming what is allowed.
    pub fn validate(&self) -> Result<(), PoolError> {
        if self.max_per_task == 0 {
            return Err(PoolError::InvalidConfig(
                "preemption.max_per_task is 0; use at least 1, or leave preemption out to turn it off".into(),
            ));
        }
        Ok(())
    }
}

fn backfill_default() -> bool {
    true
}

fn stream_idle_default() -> u64 {
    DEFAULT_STREAM_IDLE_MS
}

impl PoolLimits {
    /// `max_units` of every kind, `worker_slots` workers, a queue of 1,024, the default
    /// starvation guard with backfill, and no fair share.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::PoolLimits;
    /// let limits = PoolLimits::new(16_384, 4).with_max_queue_depth(100);
    /// assert!(limits.validate().is_ok());
    /// assert!(PoolLimits::new(0, 4).validate().is_err());
    /// ```
    pub fn new(max_units: u32, worker_slots: usize) -> Self {
        Self {
            capacity: Capacity::uniform(max_units),
            worker_slots,
            max_queue_depth: 1_024,
            starvation: StarvationGuard::default(),
            fair_share: None,
            fair_by_use: None,
            backfill: true,
            preemption: None,
            budgets: Budgets::none(),
            on_duplicate: OnDuplicate::Refuse,
            retry: None,
            order: QueueOrder::Fifo,
            max_queued_units: None,
            on_give_up: None,
            stream_idle_ms: DEFAULT_STREAM_IDLE_MS,
            admission: Admission::default(),
        }
    }

    /// The same limits with another capacity.
    pub fn with_capacity(mut self, capacity: Capacity) -> Self {
        self.capacity = capacity;
        self
    }

    /// The same limits with another queue depth.
    pub fn with_max_queue_depth(mut self, max_queue_depth: usize) -> Self {
        self.max_queue_depth = max_queue_depth;
        self
    }

    /// The same limits with another starvation guard.
    pub fn with_starvation(mut self, starvation: StarvationGuard) -> Self {
        self.starvation = starvation;
        self
    }

    /// The same limits with a per-tenant fair share (`None`: off).
    pub fn with_fair_share(mut self, fair_share: Option<FairShare>) -> Self {
        self.fair_share = fair_share;
        self
    }

    /// The same limits with tenants ordered by the service they were charged (`None`: by
    /// what they hold now).
    pub fn with_fair_by_use(mut self, fair_by_use: Option<FairByUse>) -> Self {
        self.fair_by_use = fair_by_use;
        self
    }

    /// The same limits with preemption on (`Some`) or off.
    pub fn with_preemption(mut self, preemption: Option<Preemption>) -> Self {
        self.preemption = preemption;
        self
    }

    /// The same limits with `budget` for `kind`: its units refill with time (see
    /// [`Budget`]). The kind's capacity becomes the budget's burst.
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::{Budget, PoolLimits, ResourceKind};
    /// let limits = PoolLimits::new(8, 4).with_budget(ResourceKind::Io, Budget::per_minute(600));
    /// assert_eq!(limits.capacity.get(ResourceKind::Io), 600);
    /// assert!(limits.validate().is_ok());
    /// ```
    pub fn with_budget(mut self, kind: ResourceKind, budget: Budget) -> Self {
        self.budgets = self.budgets.with(kind, budget);
        self.capacity = self.capacity.with(kind, budget.burst);
        self
    }

    /// The same limits with another answer to a repeated submission (see [`OnDuplicate`]).
    pub fn with_on_duplicate(mut self, on_duplicate: OnDuplicate) -> Self {
        self.on_duplicate = on_duplicate;
        self
    }

    /// The same limits with another rule for a retrieve that gives up (`None`: what fits
    /// the mailbox; see [`OnGiveUp`]).
    pub fn with_on_give_up(mut self, on_give_up: Option<OnGiveUp>) -> Self {
        self.on_give_up = on_give_up;
        self
    }

    /// The same limits with another bound on how long a full stream may go unread (see
    /// [`stream_idle_ms`](Self::stream_idle_ms)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use prometheus_parking_lot_actors::domain::PoolLimits;
    /// let limits = PoolLimits::new(8, 2).with_stream_idle(Duration::from_secs(30));
    /// assert_eq!(limits.stream_idle_ms, 30_000);
    /// assert!(limits.validate().is_ok());
    /// assert!(limits.with_stream_idle(Duration::ZERO).validate().is_err());
    /// ```
    pub fn with_stream_idle(mut self, idle: std::time::Duration) -> Self {
        self.stream_idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// The same limits with retries of failed runs (`None`: a failure is final).
    pub fn with_retry(mut self, retry: Option<Retries>) -> Self {
        self.retry = retry;
        self
    }

    /// The same limits with another order of parked tasks within a priority (core rule 20).
    pub fn with_order(mut self, order: QueueOrder) -> Self {
        self.order = order;
        self
    }

    /// The same limits with a bound on the parked units of each kind (`None`: no bound by
    /// units; core rule 21).
    ///
    /// ```
    /// use prometheus_parking_lot_actors::domain::PoolLimits;
    /// let limits = PoolLimits::new(24_000, 4).with_max_queued_units(Some(96_000));
    /// assert!(limits.validate().is_ok());
    /// let error = limits.with_max_queued_units(Some(0)).validate().unwrap_err();
    /// assert!(error.to_string().contains("max_queued_units"), "{error}");
    /// ```
    pub fn with_max_queued_units(mut self, max_queued_units: Option<u64>) -> Self {
        self.max_queued_units = max_queued_units;
        self
    }

    /// The same limits with other admission refusals (see [`Admission`]).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// The same limits with backfill on or off.
    pub fn with_backfill(mut self, backfill: bool) -> Self {
        self.backfill = backfill;
        self
    }

    /// Checks that the limits describe a pool that can run something.
    pub fn validate(&self) -> Result<(), PoolError> {
        if self.worker_slots == 0 {
            return Err(PoolError::InvalidConfig(
                "worker_slots is 0; a pool needs at least 1 worker".into(),
            ));
        }
        if u32::try_from(self.worker_slots).is_err() {
            return Err(PoolError::InvalidConfig(format!(
                "worker_slots is {}; at most {} are allowed",
                self.worker_slots,
                u32::MAX
            )));
        }
        if self.capacity.is_empty() {
            return Err(PoolError::InvalidConfig(
                "capacity is 0 for every resource kind; give at least one kind units".into(),
            ));
        }
        if self.starvation.max_skips == Some(0) {
            return Err(PoolError::InvalidConfig(
                "starvation.max_skips is 0; use at least 1, or None to turn the rule off".into(),
            ));
        }
        if let Some(fair_share) = &self.fair_share {
            fair_share.validate()?;
        }
        if let Some(fair_by_use) = &self.fair_by_use {
            fair_by_use.validate()?;
        }
        if let Some(preemption) = &self.preemption {
            preemption.validate()?;
        }
        self.budgets.validate()?;
        validate_max_queued_units(self.max_queued_units)?;
        if let Some(retry) = &self.retry {
            retry.validate()?;
        }
        if self.stream_idle_ms == 0 || self.stream_idle_ms > MAX_STREAM_IDLE_MS {
            return Err(PoolError::InvalidConfig(format!(
                "stream_idle_ms is {}; use 1 to {MAX_STREAM_IDLE_MS} (a day), or leave it out \
                 for the default of {DEFAULT_STREAM_IDLE_MS}",
                self.stream_idle_ms
            )));
        }
        for (kind, budget) in self.budgets.iter() {
            if self.capacity.get(kind) != budget.burst {
                return Err(PoolError::InvalidConfig(format!(
                    "budgets.{name}: the capacity of {name} is {}, but a kind with a budget \
                     has its burst ({}) as capacity; set it with with_budget",
                    self.capacity.get(kind),
                    budget.burst,
                    name = kind.name()
                )));
            }
        }
        Ok(())
    }
}
