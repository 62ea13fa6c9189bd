//! The configuration file's shape: every pool of a deployment, as JSON or YAML writes it.
//!
//! This file holds the types a file deserializes into; [`load`](super::load) reads and
//! checks a file, [`validate`](super::validate) holds the rules.
//!
//! ```
//! use prometheus_parking_lot::config::{QueueSettings, SchedulerConfig};
//!
//! let config = SchedulerConfig::from_yaml_str(
//!     "pools:\n  chat:\n    max_units: 24\n    worker_threads: 4\n    queue: { type: in_memory }\n",
//! )?;
//! assert_eq!(config.pools["chat"].queue, QueueSettings::InMemory);
//! let error = SchedulerConfig::from_json_str(r#"{"pools": {"chat": {"max_units": 0}}}"#).unwrap_err();
//! assert!(error.to_string().starts_with("pools.chat.max_units:"));
//! # Ok::<(), prometheus_parking_lot::config::ConfigError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer};

use super::gpu::GpuSettings;
use super::mailbox::MailboxSettings;
use super::pool::WorkerPoolConfig;
use super::schedules::ScheduleSettings;
use super::upstream_forms;
use crate::core::{
    Admission, Budget, Capacity, Durability, FairByUse, FairShare, OnDuplicate, OnGiveUp,
    QueueOrder, Retries, StartCap, StarvationGuard, TenantWeights, UsageCharge,
};
use crate::infra::queue::QueueSettings;
use crate::settings::error::ConfigError;
use crate::settings::secret::Secret;
use crate::util::serde::ResourceKind;
use prometheus_parking_lot_actors::domain::MAX_WEIGHT;

/// Every pool of a deployment, by name: what a configuration file holds.
///
/// Load one with [`from_path`](Self::from_path) (`.json`, `.yaml`, `.yml`),
/// [`from_json_str`](Self::from_json_str) or [`from_yaml_str`](Self::from_yaml_str); each
/// validates what it read, and its error names the field. Then
/// [`build_pools_from_scheduler_config`](crate::build_pools_from_scheduler_config) starts the
/// pools.
///
/// ```
/// use prometheus_parking_lot::config::{MaxUnits, SchedulerConfig};
///
/// let config = SchedulerConfig::from_yaml_str(
///     "pools:
///   chat:
///     max_units: 24
///     worker_threads: 4
///     starvation: { max_park_ms: 2000 }
///   batch:
///     max_units: 8
/// ",
/// )?;
/// assert_eq!(config.pools["chat"].max_units, MaxUnits::Units(24));
/// assert_eq!(config.pools.keys().collect::<Vec<_>>(), ["batch", "chat"]);
///
/// let typo = SchedulerConfig::from_yaml_str("pools:\n  chat:\n    max_unit: 24\n").unwrap_err();
/// assert_eq!(typo.to_string(), "pools.chat.max_unit: unknown field `max_unit`; did you mean `max_units`?");
/// # Ok::<(), prometheus_parking_lot::config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// The pools, by name.
    pub pools: BTreeMap<String, PoolSettings>,
    /// The database for the Postgres backends (`${DATABASE_URL}` style references allowed).
    #[serde(default)]
    pub database_url: Option<Secret>,
    /// The admin server (cargo feature `admin`): where it listens and the token its changes
    /// need. `BuiltPools::serve_admin` serves the built pools with it.
    #[serde(default)]
    pub admin: Option<AdminSection>,
    /// How the nodes of a shared Postgres queue report to their fleet (their heartbeat).
    #[serde(default)]
    pub fleet: Option<super::FleetSection>,
}

/// The configuration's `admin` section: `{"bind": "127.0.0.1:7480", "token":
/// "${ADMIN_TOKEN}"}`. Without `bind` the server listens on 127.0.0.1:7480; without a
/// token it serves reads only and refuses every change. It answers only requests addressed
/// to its own address, `localhost` and the names of `allowed_hosts`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// The address to listen on, `host:port` (port 0: a free one).
    #[serde(default)]
    pub bind: Option<String>,
    /// The bearer token of the endpoints that change a pool (a `${NAME}` reference keeps it
    /// out of the file).
    #[serde(default)]
    pub token: Option<Secret>,
    /// More names the server answers under, besides its address and `localhost`: `name`
    /// (any port) or `name:port`, such as a reverse proxy's `dash.example.com`.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Whether reads of pool data need the token on loopback too (off loopback they always
    /// do). Default `false`.
    #[serde(default)]
    pub read_token: bool,
}

/// One pool in a configuration file. Every field but the pool's name has a default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSettings {
    /// Dedicated worker threads. Default: the number of CPUs.
    #[serde(default)]
    pub worker_threads: Option<usize>,
    /// Stack size per worker thread, bytes. Default 2 MiB.
    #[serde(default)]
    pub thread_stack_size: Option<usize>,
    /// Units per resource kind, or `"auto"` to size a VRAM pool from the GPU. Default 1,024.
    #[serde(default)]
    pub max_units: MaxUnits,
    /// Parked tasks allowed before `QueueFull`. Default 1,024.
    #[serde(default)]
    pub max_queue_depth: Option<usize>,
    /// The most units of any one kind parked at once, beside `max_queue_depth`. At either
    /// bound a task of a higher priority takes the place of the lowest-ranked parked task of
    /// a lower priority (which ends refused, `QueueFull`). On a `postgres` queue it bounds
    /// what every node parks; `postgres_pgmq` refuses it. Default: no bound by units.
    #[serde(default)]
    pub max_queued_units: Option<u64>,
    /// The order of parked tasks within a priority: `"fifo"` (by admission, the default) or
    /// `"deadline"` (earliest deadline first, tasks without one last; not on `postgres_pgmq`,
    /// whose nodes claim by admission).
    #[serde(default)]
    pub order: Option<QueueOrder>,
    /// Default execution timeout, seconds (or use `default_timeout_ms`, not both).
    #[serde(default)]
    pub default_timeout_secs: Option<u64>,
    /// Default execution timeout, milliseconds.
    #[serde(default)]
    pub default_timeout_ms: Option<u64>,
    /// Pin worker `n` to CPU `n` (Linux).
    #[serde(default)]
    pub pin_to_cpus: bool,
    /// The starvation guard. Default: 30 s parked or 256 skips.
    #[serde(default)]
    pub starvation: Option<StarvationSettings>,
    /// A cap on one tenant's running units, and fair order among tenants. Default: none.
    #[serde(default)]
    pub fair_share: Option<FairShareSettings>,
    /// Whether tasks may start past a reserved task when their execution timeout ends before
    /// it could start. Default `true`.
    #[serde(default)]
    pub backfill: Option<bool>,
    /// Preemption of running permits of lower priority, e.g. `{"max_per_task": 3}`.
    /// Default: off.
    #[serde(default)]
    pub preemption: Option<PreemptionSettings>,
    /// Units of the kinds named, in place of `max_units` for those kinds, by kind name
    /// (`cpu`, `gpu_vram`, `io`, `mixed`): `{"cpu": 8}` beside `"max_units": 4096` gives
    /// 4,096 units of every kind but 8 of `cpu` (a decode engine's sequence slots beside
    /// its KV-cache blocks, for tasks of several kinds). Default: none.
    #[serde(default)]
    pub capacity: BTreeMap<String, u32>,
    /// Kinds whose units refill with time instead of when tasks end, by kind name (`cpu`,
    /// `gpu_vram`, `io`, `mixed`), e.g. `{"io": {"units": 90000, "per_secs": 60}}` for
    /// 90,000 tokens a minute. Default: none.
    #[serde(default)]
    pub budgets: BTreeMap<String, BudgetSettings>,
    /// What a submission that repeats a live task, or one whose result still waits, gets:
    /// `"refuse"` (the default: `DuplicateTask` or `ResultPending`) or `"attach"` (the
    /// original's mailbox key; nothing runs again).
    #[serde(default)]
    pub on_duplicate: Option<OnDuplicate>,
    /// Tries failed runs again, e.g. `{"max_attempts": 4, "backoff_ms": 500,
    /// "max_backoff_ms": 30000}`. Default: a failure is final.
    #[serde(default)]
    pub retry: Option<RetrySettings>,
    /// What a retrieve that gives up does to the task it waited for: `"keep"` (it carries
    /// on; a later retrieve gets its result) or `"abandon"` (a task under a key the pool made
    /// never starts, or its result is dropped). Default: `abandon` with the in-memory
    /// mailbox, `keep` with a durable one.
    #[serde(default)]
    pub on_give_up: Option<OnGiveUp>,
    /// How long a streamed task's full buffer may go unread before the task is cancelled
    /// and its units freed, ms. Default 300,000 (five minutes).
    #[serde(default)]
    pub stream_idle_ms: Option<u64>,
    /// Refusals at admission besides what can never run, e.g. `{"refuse_if_late": true}`:
    /// a submission expected to start after its deadline is refused at once
    /// (`WouldMissDeadline`). Default: off.
    #[serde(default)]
    pub admission: Option<AdmissionSettings>,
    /// Where parked tasks wait. Default: in memory. A backend without settings may be
    /// written by its name alone, as upstream's files do: `"in_memory"`, `"postgres"`.
    #[serde(default, deserialize_with = "upstream_forms::queue")]
    pub queue: QueueSettings,
    /// Where results wait. Default: in memory, kept an hour. A storage without settings may
    /// be written by its name alone, as upstream's files do: `"in_memory"`, `"postgres"`.
    #[serde(default, deserialize_with = "upstream_forms::mailbox")]
    pub mailbox: MailboxSettings,
    /// What a durable queue stores. Default `accepted`; only for durable queues.
    #[serde(default)]
    pub durability: Option<DurabilityMode>,
    /// With `"durability": "parked"`: how long a task waits in memory before it is written,
    /// ms. Default 0.
    #[serde(default)]
    pub spin_ms: Option<u64>,
    /// The GPU the pool's VRAM units (MiB) live on; implied by `"max_units": "auto"`.
    #[serde(default)]
    pub gpu: Option<GpuSettings>,
    /// Periodic tasks (see [`ScheduleSettings`]), e.g. `[{"name": "reindex", "cron":
    /// "0 2 * * *", "tz": "Europe/Paris", "payload": ...}]`. On a shared queue every node
    /// carries them and each tick runs once in the fleet. On a pool with `gpu.devices`
    /// the pool of the first device carries them. Default: none.
    #[serde(default)]
    pub schedules: Vec<ScheduleSettings>,
}

/// One kind's budget in a pool's `budgets` section: `units` every `per_secs` (or `per_ms`),
/// at most `burst` at once (default `units`), and at most `max_starts` starts per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSettings {
    /// Units that come back every period.
    pub units: u32,
    /// The period, seconds (or `per_ms`, not both).
    #[serde(default)]
    pub per_secs: Option<u64>,
    /// The period, milliseconds.
    #[serde(default)]
    pub per_ms: Option<u64>,
    /// The most units at once, and the largest task of the kind. Default: `units`.
    #[serde(default)]
    pub burst: Option<u32>,
    /// A cap on starts of tasks of the kind, e.g. `{"count": 500, "per_secs": 60}`.
    #[serde(default)]
    pub max_starts: Option<StartCapSettings>,
}

/// A budget's `max_starts`: at most `count` starts every `per_secs` (or `per_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartCapSettings {
    /// Starts per period.
    pub count: u32,
    /// The period, seconds (or `per_ms`, not both).
    #[serde(default)]
    pub per_secs: Option<u64>,
    /// The period, milliseconds.
    #[serde(default)]
    pub per_ms: Option<u64>,
}

/// A period given as `per_secs` or `per_ms`, in ms; `None` for neither or both (validation
/// names which).
pub(crate) fn period_ms(per_secs: Option<u64>, per_ms: Option<u64>) -> Option<u64> {
    match (per_secs, per_ms) {
        (Some(secs), None) => Some(secs.saturating_mul(1_000)),
        (None, Some(ms)) => Some(ms),
        _ => None,
    }
}

impl BudgetSettings {
    /// The budget these settings describe, once validated.
    pub fn budget(&self) -> Option<Budget> {
        Some(Budget {
            units: self.units,
            per_ms: period_ms(self.per_secs, self.per_ms)?,
            burst: self.burst.unwrap_or(self.units),
            max_starts: match &self.max_starts {
                Some(cap) => Some(StartCap {
                    count: cap.count,
                    per_ms: period_ms(cap.per_secs, cap.per_ms)?,
                }),
                None => None,
            },
        })
    }
}

/// A pool's `retry` section: `max_attempts` runs in all, waiting `backoff_ms` after the
/// first failure, doubling up to `max_backoff_ms` (default 64 times `backoff_ms`, at most a
/// day).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Runs in all, the first included.
    pub max_attempts: u32,
    /// The wait after the first failed run, ms.
    pub backoff_ms: u64,
    /// The longest wait, ms.
    #[serde(default)]
    pub max_backoff_ms: Option<u64>,
}

impl RetrySettings {
    /// The retries these settings describe.
    pub fn retries(&self) -> Retries {
        let mut retries = Retries::new(self.max_attempts, Duration::from_millis(self.backoff_ms));
        if let Some(max) = self.max_backoff_ms {
            retries = retries.with_max_backoff(Duration::from_millis(max));
        }
        retries
    }
}

/// A pool's `preemption` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreemptionSettings {
    /// How many times one task id may be asked to yield (at least 1).
    pub max_per_task: u32,
}

/// A pool's `admission` section (see [`Admission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSettings {
    /// Refuse a submission whose estimated start is after its deadline. Default `false`.
    #[serde(default)]
    pub refuse_if_late: bool,
}

/// The `durability` of a pool on a durable queue (see [`Durability`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DurabilityMode {
    /// Every accepted task is stored before `submit` returns.
    Accepted,
    /// Only parked tasks are stored (after `spin_ms` in memory).
    Parked,
}

/// A pool's capacity: a number of units, or `"auto"` (from the GPU's memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnits {
    /// This many units of every resource kind.
    Units(u64),
    /// Sized from the GPU.
    Auto,
}

impl Default for MaxUnits {
    fn default() -> Self {
        MaxUnits::Units(1_024)
    }
}

impl<'de> Deserialize<'de> for MaxUnits {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MaxUnitsVisitor;

        impl Visitor<'_> for MaxUnitsVisitor {
            type Value = MaxUnits;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of units or \"auto\"")
            }

            fn visit_u64<E: de::Error>(self, units: u64) -> Result<MaxUnits, E> {
                Ok(MaxUnits::Units(units))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<MaxUnits, E> {
                match text {
                    "auto" => Ok(MaxUnits::Auto),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
        }

        deserializer.deserialize_any(MaxUnitsVisitor)
    }
}

/// When a parked task is reserved against starvation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StarvationSettings {
    /// Parked this long (ms) means starving; omit to turn the age rule off.
    #[serde(default)]
    pub max_park_ms: Option<u64>,
    /// Overtaken this often at the head means starving; omit to turn the rule off.
    #[serde(default)]
    pub max_skips: Option<u32>,
}

/// A pool's per-tenant fair share: a cap (exactly one of `max_units_per_tenant` and
/// `max_fraction`), an order by use (`by_use`), or both.
///
/// `{"max_units_per_tenant": 12}` caps each tenant at 12 units of every kind;
/// `{"max_fraction": 0.5}` at half of each kind's units (rounded down, at least one).
/// `{"by_use": {"charge": "reported", "weights": {"acme": 3, "*": 1}, "half_life_ms":
/// 600000}}` orders the tenants by the weighted service they were charged, without a cap.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairShareSettings {
    /// The most units of each kind one tenant's running tasks may hold.
    #[serde(default)]
    pub max_units_per_tenant: Option<u32>,
    /// The most of each kind's units one tenant's running tasks may hold, as a fraction.
    #[serde(default)]
    pub max_fraction: Option<f64>,
    /// Orders tenants by the service they were charged instead of by what they hold now.
    #[serde(default)]
    pub by_use: Option<ByUseSettings>,
}

/// A fair share by use: within a priority the tenant with the lowest weighted service
/// counter goes first (`PARKING_LOT.md`, "Fair share by use").
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByUseSettings {
    /// What a task is charged: `held` (units times the milliseconds held, the default) or
    /// `reported` (the units its executor reports using, `running::report_used`, at most
    /// its cost).
    #[serde(default)]
    pub charge: UsageCharge,
    /// Tenant name to weight (a whole number, 1 to 1,000,000); `"*"` weighs every tenant
    /// not named (default 1). A tenant of weight 3 is served three times what one of
    /// weight 1 is while both wait.
    #[serde(default)]
    pub weights: BTreeMap<String, f64>,
    /// The counters halve every this many milliseconds (1 to a year); leave it out for
    /// counters that never decay.
    #[serde(default)]
    pub half_life_ms: Option<f64>,
}

impl ByUseSettings {
    /// The order and the named tenants' weights these settings ask for (once validated:
    /// numbers out of range are cut to it here); `"*"` is the order's default weight.
    ///
    /// ```
    /// use prometheus_parking_lot::config::ByUseSettings;
    /// use prometheus_parking_lot::core::{FairByUse, TenantWeights, UsageCharge};
    ///
    /// let settings: ByUseSettings = serde_json::from_str(
    ///     r#"{ "charge": "reported", "weights": { "acme": 3, "*": 2 }, "half_life_ms": 60000 }"#,
    /// )
    /// .unwrap();
    /// let (order, weights) = settings.order();
    /// assert_eq!(
    ///     order,
    ///     FairByUse::new(UsageCharge::Reported).with_half_life_ms(60_000).with_default_weight(2)
    /// );
    /// assert_eq!(weights, TenantWeights::default().with("acme", 3));
    /// ```
    pub fn order(&self) -> (FairByUse, TenantWeights) {
        let whole = |value: f64| value.clamp(1.0, f64::from(MAX_WEIGHT)) as u32;
        let mut order = FairByUse::new(self.charge);
        if let Some(half_life) = self.half_life_ms {
            order = order.with_half_life_ms(half_life.max(1.0) as u64);
        }
        let mut weights = TenantWeights::default();
        for (tenant, &weight) in &self.weights {
            if tenant == "*" {
                order = order.with_default_weight(whole(weight));
            } else {
                weights = weights.with(tenant.clone(), whole(weight));
            }
        }
        (order, weights)
    }
}

impl FairShareSettings {
    /// The fair share these settings ask for; `None` unless exactly one field is given (the
    /// validation names the problem).
    pub fn fair_share(&self) -> Option<FairShare> {
        match (self.max_units_per_tenant, self.max_fraction) {
            (Some(units), None) => Some(FairShare::MaxUnitsPerTenant(units)),
            (None, Some(fraction)) => Some(FairShare::MaxFraction(fraction)),
            _ => None,
        }
    }
}

impl SchedulerConfig {
    /// The settings of pool `name` as a [`WorkerPoolConfig`], with the file's `max_units`:
    /// what to hand [`WorkerPool::new`](crate::WorkerPool::new) to build one pool of a file
    /// by hand. A pool the settings alone cannot describe is refused, naming the field:
    /// `max_units: "auto"` (its units come from the GPU: build it with
    /// [`build_pools_from_scheduler_config`](crate::build_pools_from_scheduler_config), or
    /// pass the units to [`worker_pool_config`](Self::worker_pool_config)), and
    /// `schedules` (a schedule's payload is read as the pool's payload type when the pool is
    /// built: build it from the file, or add each with `WorkerPool::add_schedule`).
    ///
    /// ```
    /// use prometheus_parking_lot::SchedulerConfig;
    ///
    /// let config = SchedulerConfig::from_json_str(
    ///     r#"{"pools": {"llm": {"max_units": 24}, "auto": {"max_units": "auto"}}}"#,
    /// ).unwrap();
    /// let settings = config.pool_settings("llm").unwrap();
    /// assert_eq!(settings.limits().capacity.get(prometheus_parking_lot::ResourceKind::GpuVram), 24);
    /// let auto = config.pool_settings("auto").unwrap_err();
    /// assert!(auto.to_string().starts_with("pools.auto.max_units:"), "{auto}");
    /// let missing = config.pool_settings("chat").unwrap_err();
    /// assert_eq!(missing.to_string(), "pools: no pool named \"chat\"; the pools are \"auto\", \"llm\"");
    /// ```
    pub fn pool_settings(&self, name: &str) -> Result<WorkerPoolConfig, ConfigError> {
        let quoted = crate::settings::quote::value(name);
        let Some(pool) = self.pools.get(name) else {
            let names: Vec<String> = self
                .pools
                .keys()
                .map(|name| crate::settings::quote::value(name))
                .collect();
            return Err(ConfigError::invalid(
                "pools",
                format!("no pool named {quoted}; the pools are {}", names.join(", ")),
            ));
        };
        let path = format!("pools.{}", crate::settings::quote::name(name));
        let MaxUnits::Units(units) = pool.max_units else {
            return Err(ConfigError::invalid(
                format!("{path}.max_units"),
                "\"auto\" takes its units from the GPU, which only building the pools from \
                 the file measures: use build_pools_from_scheduler_config, or \
                 worker_pool_config(name, units) with the units you measured",
            ));
        };
        if !pool.schedules.is_empty() {
            return Err(ConfigError::invalid(
                format!("{path}.schedules"),
                "a pool's schedules are added as the pool is built, their payloads read as \
                 its payload type: use build_pools_from_scheduler_config, or add each with \
                 WorkerPool::add_schedule once the pool is built from settings without them",
            ));
        }
        let units = u32::try_from(units).map_err(|_| {
            ConfigError::invalid(
                format!("{path}.max_units"),
                format!("{units} is too many units; use 1 to {}", u32::MAX),
            )
        })?;
        self.worker_pool_config(name, units).ok_or_else(|| {
            ConfigError::invalid(path, "the pool vanished while its settings were read")
        })
    }

    /// The settings of one pool as a [`WorkerPoolConfig`], with a capacity of `max_units`
    /// of every kind *in place of the file's `max_units`* (for a pool whose `"auto"` units
    /// the caller measured). `None` when the file has no pool `name`. It carries no
    /// `schedules`: see [`pool_settings`](Self::pool_settings), which takes the file's
    /// `max_units` and refuses what the settings cannot carry, naming the field.
    pub fn worker_pool_config(&self, name: &str, max_units: u32) -> Option<WorkerPoolConfig> {
        let pool = self.pools.get(name)?;
        let capacity = pool
            .capacity
            .iter()
            .filter_map(|(kind, &units)| Some((ResourceKind::from_name(kind)?, units)))
            .fold(Capacity::uniform(max_units), |capacity, (kind, units)| {
                capacity.with(kind, units)
            });
        let mut settings = WorkerPoolConfig::new()
            .with_name(name)
            .with_capacity(capacity)
            .with_cpu_pinning(pool.pin_to_cpus)
            .with_retention(Some(Duration::from_secs(
                pool.mailbox.retention_secs.unwrap_or(3_600),
            )));
        if let Some(workers) = pool.worker_threads {
            settings = settings.with_worker_count(workers);
        }
        if let Some(stack) = pool.thread_stack_size {
            settings = settings.with_thread_stack_size(stack);
        }
        if let Some(depth) = pool.max_queue_depth {
            settings = settings.with_max_queue_depth(depth);
        }
        if let Some(units) = pool.max_queued_units {
            settings = settings.with_max_queued_units(Some(units));
        }
        if let Some(order) = pool.order {
            settings = settings.with_order(order);
        }
        if let Some(timeout) = pool.timeout() {
            settings.timeout = Some(timeout);
        }
        settings = settings.with_durability(pool.durability_setting());
        if let Some(starvation) = pool.starvation {
            settings = settings.with_starvation(StarvationGuard {
                max_park_ms: starvation.max_park_ms,
                max_skips: starvation.max_skips,
            });
        }
        if let Some(fair_share) = pool
            .fair_share
            .as_ref()
            .and_then(FairShareSettings::fair_share)
        {
            settings = settings.with_fair_share(fair_share);
        }
        if let Some(by_use) = pool.fair_share.as_ref().and_then(|f| f.by_use.as_ref()) {
            let (order, weights) = by_use.order();
            settings = settings.with_fair_share_by_use(order, weights);
        }
        if let Some(backfill) = pool.backfill {
            settings = settings.with_backfill(backfill);
        }
        if let Some(preemption) = pool.preemption {
            settings = settings.with_preemption(preemption.max_per_task);
        }
        if let Some(retry) = &pool.retry {
            settings = settings.with_retry(retry.retries());
        }
        if let Some(on_duplicate) = pool.on_duplicate {
            settings.limits.on_duplicate = on_duplicate;
        }
        settings.limits.on_give_up = pool.on_give_up;
        if let Some(idle_ms) = pool.stream_idle_ms {
            settings.limits.stream_idle_ms = idle_ms;
        }
        if let Some(admission) = pool.admission {
            settings = settings.with_admission(Admission {
                refuse_if_late: admission.refuse_if_late,
            });
        }
        for (name, budget) in &pool.budgets {
            if let (Some(kind), Some(budget)) = (ResourceKind::from_name(name), budget.budget()) {
                settings = settings.with_budget(kind, budget);
            }
        }
        Some(settings)
    }
}

impl PoolSettings {
    /// The pool's GPU settings: its `gpu` section, or the defaults when `max_units` is
    /// `"auto"` without one; `None` for a pool that uses no GPU.
    pub fn gpu_settings(&self) -> Option<GpuSettings> {
        match (&self.gpu, self.max_units) {
            (Some(gpu), _) => Some(gpu.clone()),
            (None, MaxUnits::Auto) => Some(GpuSettings::default()),
            (None, MaxUnits::Units(_)) => None,
        }
    }

    /// The durability these settings ask for.
    pub fn durability_setting(&self) -> Durability {
        match self.durability {
            Some(DurabilityMode::Parked) => Durability::Parked {
                spin: Duration::from_millis(self.spin_ms.unwrap_or(0)),
            },
            Some(DurabilityMode::Accepted) | None => Durability::Accepted,
        }
    }

    /// The default execution timeout, from whichever of the two fields is set.
    pub fn timeout(&self) -> Option<Duration> {
        self.default_timeout_ms
            .map(Duration::from_millis)
            .or(self.default_timeout_secs.map(Duration::from_secs))
    }
}
