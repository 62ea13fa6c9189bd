//! The settings of one pool: the [`WorkerPoolConfig`] builder and the seed's [`PoolConfig`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::core::{
    Admission, Budget, Capacity, Durability, FairByUse, FairShare, OnDuplicate, OnGiveUp,
    PoolError, PoolLimits, Preemption, QueueOrder, Retries, StarvationGuard, TenantWeights,
};
use crate::util::serde::ResourceKind;
use prometheus_parking_lot_actors::supervisor::RestartPolicy;
use prometheus_parking_lot_actors::worker::{default_worker_count, WorkerSettings};

/// How long a dropped pool lets running tasks finish.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);

/// Settings of one pool, built by chaining `with_*` calls: the one settings type every face
/// takes ([`WorkerPool`](crate::WorkerPool), [`ResourcePool::with_settings`](crate::ResourcePool::with_settings),
/// [`CapacityGate`](crate::CapacityGate), and the actor tree through [`pool_spec`](Self::pool_spec)).
/// The seed's [`PoolConfig`] converts to it (`WorkerPoolConfig::try_from`), and so does a
/// configuration file's pool ([`SchedulerConfig::worker_pool_config`](crate::SchedulerConfig::worker_pool_config)).
///
/// ```
/// use prometheus_parking_lot::config::WorkerPoolConfig;
///
/// let config = WorkerPoolConfig::new()
///     .with_worker_count(4)
///     .with_max_units(16_384)
///     .with_max_queue_depth(1_000)
///     .with_timeout_ms(120_000)
///     .with_thread_stack_size(2 * 1024 * 1024);
/// assert_eq!(config.worker_slots, 4);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerPoolConfig {
    /// The pool's name (thread names, logs).
    pub name: String,
    /// What the pool may hand out and how it orders what waits: units per kind, worker
    /// slots (its worker threads), queue depth, the starvation guard, fair share, backfill,
    /// preemption, budgets, repeated submissions, retries. The engine reads exactly these
    /// ([`limits`](Self::limits)); the settings dereference to them, so `config.fair_share`
    /// reads `config.limits.fair_share`. Defaults: one worker per CPU, 1,024 units of every
    /// kind, 1,024 parked tasks, the default starvation guard, backfill on, the rest off.
    pub limits: PoolLimits,
    /// Default execution timeout. Default: none.
    pub timeout: Option<Duration>,
    /// Worker thread stack size in bytes. Default 2 MiB.
    pub thread_stack_size: usize,
    /// Pin worker `n` to CPU `n` (Linux). Default off.
    pub pin_to_cpus: bool,
    /// How often workers may be restarted before the pool gives up.
    pub restart: RestartPolicy,
    /// How long uncollected results are kept. Default one hour.
    pub retention: Option<Duration>,
    /// The in-memory mailbox's bound: results waiting to be collected plus tasks still live.
    /// A submission past it is refused with `PoolError::MailboxFull`; a stored result is
    /// never dropped to make room. Default 100,000.
    pub max_messages: usize,
    /// How long a dropped pool lets running tasks finish (`Duration::MAX`: for ever).
    pub drain_on_drop: Duration,
    /// What a durable queue stores (see [`Durability`]). Default: every accepted task.
    pub durability: Durability,
    /// The weights of named tenants under a fair share by use
    /// ([`with_fair_share_by_use`](Self::with_fair_share_by_use)). Default: none.
    pub tenant_weights: TenantWeights,
}

/// The limits are the settings' own: `config.backfill`, `config.fair_share`... read them.
impl std::ops::Deref for WorkerPoolConfig {
    type Target = PoolLimits;

    fn deref(&self) -> &PoolLimits {
        &self.limits
    }
}

impl std::ops::DerefMut for WorkerPoolConfig {
    fn deref_mut(&mut self) -> &mut PoolLimits {
        &mut self.limits
    }
}

impl Default for WorkerPoolConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerPoolConfig {
    /// Defaults: one worker per CPU, 1,024 units, queue depth 1,024, no timeout.
    pub fn new() -> Self {
        Self {
            name: "pool".into(),
            limits: PoolLimits::new(1_024, default_worker_count()),
            timeout: None,
            thread_stack_size: 2 * 1024 * 1024,
            pin_to_cpus: false,
            restart: RestartPolicy::default(),
            retention: Some(Duration::from_secs(3_600)),
            max_messages: crate::infra::mailbox::memory::DEFAULT_MAX_MESSAGES,
            drain_on_drop: DEFAULT_DRAIN,
            durability: Durability::Accepted,
            tenant_weights: TenantWeights::default(),
        }
    }

    /// The pool's name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Worker threads.
    pub fn with_worker_count(mut self, worker_count: usize) -> Self {
        self.limits.worker_slots = worker_count;
        self
    }

    /// Units of every resource kind.
    pub fn with_max_units(self, max_units: u32) -> Self {
        self.with_capacity(Capacity::uniform(max_units))
    }

    /// Units per resource kind.
    pub fn with_capacity(mut self, capacity: Capacity) -> Self {
        // A budget's kind keeps its burst as its capacity, whichever was set first.
        let budgets = self.limits.budgets;
        self.limits = self.limits.with_capacity(capacity);
        for (kind, budget) in budgets.iter() {
            self.limits = self.limits.with_budget(kind, *budget);
        }
        self
    }

    /// Parked tasks allowed.
    pub fn with_max_queue_depth(mut self, max_queue_depth: usize) -> Self {
        self.limits = self.limits.with_max_queue_depth(max_queue_depth);
        self
    }

    /// The order of parked tasks within a priority: by admission ([`QueueOrder::Fifo`], the
    /// default) or earliest deadline first ([`QueueOrder::Deadline`]; tasks without a
    /// deadline after those with one). On a shared queue the queue itself claims in the order
    /// (`PostgresQueue::open_in_order`, `PgmqQueue::open_in_order`), and a pool on a queue
    /// claiming in another order is refused at start.
    ///
    /// ```
    /// use prometheus_parking_lot::core::QueueOrder;
    /// use prometheus_parking_lot::WorkerPoolConfig;
    ///
    /// let config = WorkerPoolConfig::new().with_order(QueueOrder::Deadline);
    /// assert_eq!(config.limits().order, QueueOrder::Deadline);
    /// ```
    pub fn with_order(mut self, order: QueueOrder) -> Self {
        self.limits = self.limits.with_order(order);
        self
    }

    /// The most units of any one kind that may be parked at once, beside
    /// [`with_max_queue_depth`](Self::with_max_queue_depth) (`None`: no bound by units). At
    /// either bound a task that must park takes the place of parked tasks of a lower
    /// priority, which end refused (`QueueFull`); failing that, it is refused itself. On a
    /// shared queue it bounds what every node parks, kept by the queue; the pgmq queue keeps
    /// no such bound, and a pool on it with one is refused at start.
    ///
    /// ```
    /// use prometheus_parking_lot::WorkerPoolConfig;
    ///
    /// // A GPU pool of 24 GiB whose waiting requests may not ask for more than 96 GiB.
    /// let config = WorkerPoolConfig::new()
    ///     .with_max_units(24_576)
    ///     .with_max_queued_units(Some(98_304));
    /// assert_eq!(config.limits().max_queued_units, Some(98_304));
    /// ```
    pub fn with_max_queued_units(mut self, max_queued_units: Option<u64>) -> Self {
        self.limits = self.limits.with_max_queued_units(max_queued_units);
        self
    }

    /// Default execution timeout in milliseconds.
    pub fn with_timeout_ms(mut self, timeout_ms: u64) -> Self {
        self.timeout = Some(Duration::from_millis(timeout_ms));
        self
    }

    /// Worker thread stack size in bytes.
    pub fn with_thread_stack_size(mut self, thread_stack_size: usize) -> Self {
        self.thread_stack_size = thread_stack_size;
        self
    }

    /// Pin workers to CPUs.
    pub fn with_cpu_pinning(mut self, pin_to_cpus: bool) -> Self {
        self.pin_to_cpus = pin_to_cpus;
        self
    }

    /// The starvation guard.
    pub fn with_starvation(mut self, starvation: StarvationGuard) -> Self {
        self.limits = self.limits.with_starvation(starvation);
        self
    }

    /// A per-tenant fair share: one tenant's running tasks hold at most the cap of each
    /// kind, and within a priority the tenant using least goes first. A task costing more
    /// than the cap is refused (`PoolError::InsufficientResources`). Tenants are the tasks'
    /// mailbox tenants; tasks submitted without a mailbox all count as one tenant.
    ///
    /// ```
    /// use prometheus_parking_lot::config::WorkerPoolConfig;
    /// use prometheus_parking_lot::core::FairShare;
    ///
    /// let config = WorkerPoolConfig::new()
    ///     .with_max_units(24_000)
    ///     .with_fair_share(FairShare::MaxFraction(0.5));
    /// assert_eq!(config.limits().fair_share, Some(FairShare::MaxFraction(0.5)));
    /// ```
    pub fn with_fair_share(mut self, fair_share: FairShare) -> Self {
        self.limits = self.limits.with_fair_share(Some(fair_share));
        self
    }

    /// A fair share by use: within a priority, the tenant with the lowest weighted service
    /// counter goes first (what its tasks were charged, divided by its weight, decayed with
    /// the order's half-life), instead of the tenant holding least now. `weights` names
    /// tenants whose weight is not the order's `default_weight`. With
    /// [`with_fair_share`](Self::with_fair_share) too, tenants are also capped; without it,
    /// they are only ordered. Weights outside 1 to 1,000,000
    /// are refused when the pool is built, naming the tenant. `PARKING_LOT.md` ("Fair share
    /// by use") derives the bound on how far two waiting tenants' counters drift apart.
    ///
    /// ```
    /// use prometheus_parking_lot::config::WorkerPoolConfig;
    /// use prometheus_parking_lot::core::{FairByUse, TenantWeights, UsageCharge};
    ///
    /// let order = FairByUse::new(UsageCharge::Reported).with_half_life_ms(600_000);
    /// let config = WorkerPoolConfig::new()
    ///     .with_fair_share_by_use(order, TenantWeights::default().with("acme", 3));
    /// assert_eq!(config.fair_by_use, Some(order));
    /// assert_eq!(config.tenant_weights.get("acme"), Some(3));
    /// ```
    pub fn with_fair_share_by_use(mut self, order: FairByUse, weights: TenantWeights) -> Self {
        self.limits = self.limits.with_fair_by_use(Some(order));
        self.tenant_weights = weights;
        self
    }

    /// Preemption on, asking one task id to yield at most `max_per_task` times (see
    /// [`Preemption`]); 0 is refused when the pool or gate is built.
    ///
    /// ```
    /// use prometheus_parking_lot::config::WorkerPoolConfig;
    ///
    /// let config = WorkerPoolConfig::new().with_preemption(3);
    /// assert_eq!(config.preemption.map(|p| p.max_per_task), Some(3));
    /// ```
    pub fn with_preemption(mut self, max_per_task: u32) -> Self {
        self.limits = self
            .limits
            .with_preemption(Some(Preemption::new(max_per_task)));
        self
    }

    /// Refusals at admission (see [`Admission`]): with `refuse_if_late`, a submission
    /// whose estimated start is after its deadline is refused at once with
    /// [`PoolError::WouldMissDeadline`].
    ///
    /// ```
    /// use prometheus_parking_lot::config::WorkerPoolConfig;
    /// use prometheus_parking_lot::core::Admission;
    ///
    /// let config = WorkerPoolConfig::new().with_admission(Admission { refuse_if_late: true });
    /// assert!(config.limits().admission.refuse_if_late);
    /// ```
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.limits = self.limits.with_admission(admission);
        self
    }

    /// Backfill on or off (see [`PoolLimits::backfill`]).
    pub fn with_backfill(mut self, backfill: bool) -> Self {
        self.limits = self.limits.with_backfill(backfill);
        self
    }

    /// The worker restart policy.
    pub fn with_restart_policy(mut self, restart: RestartPolicy) -> Self {
        self.restart = restart;
        self
    }

    /// How long uncollected results are kept (`None`: until taken).
    pub fn with_retention(mut self, retention: Option<Duration>) -> Self {
        self.retention = retention;
        self
    }

    /// The in-memory mailbox's bound (see [`max_messages`](Self::max_messages)).
    pub fn with_max_messages(mut self, max_messages: usize) -> Self {
        self.max_messages = max_messages;
        self
    }

    /// Makes `kind` a budget: its units refill with time (`budget.units` every
    /// `budget.per_ms`, at most `budget.burst` at once, which becomes the kind's capacity),
    /// are spent when a task starts and do not come back when it ends. For provider quotas
    /// such as tokens per minute; see [`Budget`].
    ///
    /// ```
    /// use prometheus_parking_lot::core::Budget;
    /// use prometheus_parking_lot::{ResourceKind, WorkerPoolConfig};
    ///
    /// let config = WorkerPoolConfig::new()
    ///     .with_budget(ResourceKind::Io, Budget::per_minute(90_000));
    /// assert_eq!(config.limits().capacity.get(ResourceKind::Io), 90_000);
    /// ```
    pub fn with_budget(mut self, kind: ResourceKind, budget: Budget) -> Self {
        self.limits = self.limits.with_budget(kind, budget);
        self
    }

    /// Makes repeated submissions safe (`true`): a submission whose (tenant, task id) is
    /// live, or whose result still waits under the same key, is not run again and is
    /// answered with the original's mailbox key, where the caller retrieves its result. By
    /// default (`false`) they are refused with `DuplicateTask` or `ResultPending`. See
    /// [`OnDuplicate`].
    ///
    /// ```
    /// use prometheus_parking_lot::core::OnDuplicate;
    /// use prometheus_parking_lot::WorkerPoolConfig;
    ///
    /// let config = WorkerPoolConfig::new().with_attach_duplicates(true);
    /// assert_eq!(config.limits().on_duplicate, OnDuplicate::Attach);
    /// ```
    pub fn with_attach_duplicates(mut self, attach: bool) -> Self {
        self.limits = self.limits.with_on_duplicate(if attach {
            OnDuplicate::Attach
        } else {
            OnDuplicate::Refuse
        });
        self
    }

    /// What a retrieve that gives up (`PoolError::Timeout`) does to the task it waited for:
    /// [`OnGiveUp::Keep`] (it carries on and its result waits for a later retrieve) or
    /// [`OnGiveUp::Abandon`] (a task under a key the pool made never starts, or its result
    /// is dropped so a channel inside it closes). `None`, the default, is what fits the
    /// mailbox: abandon with the in-memory one, keep with a durable one.
    ///
    /// ```
    /// use prometheus_parking_lot::core::OnGiveUp;
    /// use prometheus_parking_lot::WorkerPoolConfig;
    ///
    /// let config = WorkerPoolConfig::new().with_on_give_up(Some(OnGiveUp::Keep));
    /// assert_eq!(config.limits().on_give_up, Some(OnGiveUp::Keep));
    /// assert_eq!(WorkerPoolConfig::new().on_give_up, None);
    /// ```
    pub fn with_on_give_up(mut self, on_give_up: Option<OnGiveUp>) -> Self {
        self.limits = self.limits.with_on_give_up(on_give_up);
        self
    }

    /// How long a streamed task's full buffer may go unread before the task is cancelled
    /// and its units freed (default five minutes; 1 ms to a day). See
    /// [`PoolLimits::stream_idle_ms`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use prometheus_parking_lot::WorkerPoolConfig;
    ///
    /// let config = WorkerPoolConfig::new().with_stream_idle(Duration::from_secs(20));
    /// assert_eq!(config.stream_idle_ms, 20_000);
    /// ```
    pub fn with_stream_idle(mut self, idle: Duration) -> Self {
        self.limits = self.limits.with_stream_idle(idle);
        self
    }

    /// Tries failed runs again: a run whose executor panicked, or that asked with
    /// `running::retry_later` (a provider's 429 or 503), parks again after a backoff, up to
    /// `retries.max_attempts` runs in all; see [`Retries`]. A pool on the in-memory queue
    /// also needs `retry_tasks()` (it keeps a copy of each payload, so `P: Clone`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use prometheus_parking_lot::core::Retries;
    /// use prometheus_parking_lot::WorkerPoolConfig;
    ///
    /// let config = WorkerPoolConfig::new().with_retry(Retries::new(3, Duration::from_millis(500)));
    /// assert_eq!(config.limits().retry.map(|r| r.max_attempts), Some(3));
    /// ```
    pub fn with_retry(mut self, retries: Retries) -> Self {
        self.limits = self.limits.with_retry(Some(retries));
        self
    }

    /// What a durable queue stores.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The parking-lot limits these settings describe: [`limits`](Self::limits), as the
    /// engine takes them.
    pub fn limits(&self) -> PoolLimits {
        self.limits
    }

    /// The worker thread settings these settings describe.
    pub fn worker_settings(&self) -> WorkerSettings {
        WorkerSettings {
            count: self.limits.worker_slots,
            stack_size: Some(self.thread_stack_size),
            pin_to_cpus: self.pin_to_cpus,
        }
    }
}

/// A pool's settings in the shape configuration files and the seed API use: what
/// [`ResourcePool::new`](crate::ResourcePool::new) takes. It converts into the full
/// [`WorkerPoolConfig`].
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot::config::{PoolConfig, WorkerPoolConfig};
///
/// let config = PoolConfig { worker_threads: 4, max_units: 24, default_timeout_ms: 60_000, ..PoolConfig::default() };
/// let settings = WorkerPoolConfig::try_from(config)?;
/// assert_eq!(settings.worker_slots, 4);
/// assert_eq!(settings.timeout, Some(Duration::from_secs(60)));
/// # Ok::<(), prometheus_parking_lot::PoolError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    /// Dedicated worker threads. Default: the number of CPUs.
    pub worker_threads: usize,
    /// Stack size per worker thread in bytes. Default 2 MiB.
    pub thread_stack_size: usize,
    /// Resource units (GPU blocks, MiB of VRAM...) per resource kind.
    pub max_units: usize,
    /// Parked tasks allowed before `QueueFull`.
    pub max_queue_depth: usize,
    /// Default execution timeout in milliseconds; 0 means none.
    pub default_timeout_ms: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            worker_threads: default_worker_count(),
            thread_stack_size: 2 * 1024 * 1024,
            max_units: 1_024,
            max_queue_depth: 1_024,
            default_timeout_ms: 0,
        }
    }
}

impl TryFrom<PoolConfig> for WorkerPoolConfig {
    type Error = PoolError;

    fn try_from(config: PoolConfig) -> Result<Self, PoolError> {
        let max_units = u32::try_from(config.max_units).map_err(|_| {
            PoolError::InvalidConfig(format!(
                "max_units is {}; at most {} are allowed",
                config.max_units,
                u32::MAX
            ))
        })?;
        let mut settings = WorkerPoolConfig::new()
            .with_worker_count(config.worker_threads)
            .with_max_units(max_units)
            .with_max_queue_depth(config.max_queue_depth)
            .with_thread_stack_size(config.thread_stack_size);
        if config.default_timeout_ms > 0 {
            settings = settings.with_timeout_ms(config.default_timeout_ms);
        }
        Ok(settings)
    }
}
