//! Validation of a [`SchedulerConfig`]: every rule, and the error that names the field.
//!
//! Each error says which field is wrong (a dotted path such as
//! `pools.llm_inference.queue.queue_name`), what was found, and what is allowed. The rules:
//!
//! | field | allowed |
//! |---|---|
//! | `pools` | at least one pool |
//! | `admin` | the cargo feature `admin` built in |
//! | `admin.bind` | `host:port` with an IP address (default 127.0.0.1:7480) |
//! | `admin.token` | not empty (leave it out to serve reads only) |
//! | `admin.allowed_hosts` | each a host name, an IPv4 address or a `[IPv6]` address, with an optional `:port` |
//! | `admin.read_token` | `true` only with a `token` |
//! | `fleet.heartbeat_ms` | 50 to 600,000 |
//! | pool names | 1–64 of `a-z A-Z 0-9 _ -` |
//! | `worker_threads` | 1 – 1,024; 0 on a shared queue (a producer-only node) |
//! | `worker_threads` of all pools together | at most 4,096 (a pool without the field counts the number of CPUs; a pool with `gpu.devices` counts once per device) |
//! | `thread_stack_size` | 64 KiB – 1 GiB |
//! | `max_units` | 1 – 4,294,967,295, or `"auto"` |
//! | `capacity` keys | `cpu`, `gpu_vram`, `io`, `mixed`; not `gpu_vram` on a pool with a `gpu` |
//! | `capacity.<kind>` | 1 – 4,294,967,295 |
//! | `max_queue_depth` | 1 – 100,000,000 |
//! | `max_queued_units` | 1 – 18,446,744,073,709,551,615; not with a postgres_pgmq queue |
//! | `admission.refuse_if_late` | only with a local queue (in_memory, yaque) |
//! | `order` | `fifo` or `deadline` (on every queue) |
//! | `default_timeout_secs` / `_ms` | one of them, 1 ms – 7 days |
//! | `starvation.max_park_ms` | 1 ms – 1 day |
//! | `starvation.max_skips` | 1 – 1,000,000 |
//! | `fair_share` | at most one of `max_units_per_tenant` and `max_fraction`, and `by_use`; at least one of the three |
//! | `fair_share.by_use.charge` | `held` or `reported` |
//! | `fair_share.by_use.weights.<tenant>` | a whole number, 1 – 1,000,000 (`"*"`: every tenant not named) |
//! | `fair_share.by_use.half_life_ms` | a whole number of ms, 1 – 31,536,000,000 (a year) |
//! | `fair_share.max_units_per_tenant` | 1 – `max_units` (any `u32` with `"auto"`) |
//! | `fair_share.max_fraction` | greater than 0, at most 1 |
//! | `retry.max_attempts` | 1 – 1,000 (runs in all, the first included) |
//! | `retry.backoff_ms` | 1 ms – 1 day |
//! | `retry.max_backoff_ms` | `backoff_ms` – 1 day (default 64 × `backoff_ms`, at most a day) |
//! | `on_duplicate` | `refuse` or `attach`; on a shared queue (postgres, postgres_pgmq) `attach` holds across nodes |
//! | `on_give_up` | `keep` or `abandon` (default: `abandon` with the in-memory mailbox, `keep` with a durable one) |
//! | `stream_idle_ms` | 1 ms – 1 day (default 300,000) |
//! | `budgets` keys | `cpu`, `gpu_vram`, `io`, `mixed`; not `gpu_vram` on a pool with a `gpu`; on a shared queue (postgres, postgres_pgmq) every node spends from one bucket per kind |
//! | `budgets.<kind>.units`, `.burst` | 1 – 4,294,967,295 (`burst` defaults to `units`) |
//! | `budgets.<kind>.per_secs` / `.per_ms` | exactly one of them, 1 ms – 1 day |
//! | `budgets.<kind>.max_starts.count` | 1 – 4,294,967,295, with exactly one of `per_secs` / `per_ms`, 1 ms – 1 day |
//! | `queue.path` (yaque) | not empty |
//! | `queue.stream` (yaque) | 1–64 of `a-z A-Z 0-9 _ -` |
//! | `queue.lease_ms` (postgres) | 300 ms – 1 day |
//! | `queue.max_attempts` (postgres) | 1 – 1,000 |
//! | `queue.claim_ahead` (postgres) | 0 – 10,000 |
//! | `queue.table`, `queue.queue_name`, `mailbox.storage.table` | SQL identifiers: a letter or `_`, then letters, digits or `_`; at most 63 (42 for pgmq queues: PGMQ allows 47 and the levels add `_crit`, `_high`, `_norm`, `_low`, `_dlq`) |
//! | `queue`, `mailbox` as a string (upstream's form) | `in_memory` or `postgres`; a backend with settings is written as a mapping |
//! | `runtime` | `native` or `tokio` (the same, and the default) |
//! | `durability` | `accepted` or `parked`, only with a durable queue |
//! | `spin_ms` | 0 – 60,000, only with `"durability": "parked"`, and 0 on a shared queue |
//! | `mailbox.retention_secs` | 1 s – 365 days |
//! | `mailbox.storage.max_messages` | 1 – 100,000,000 |
//! | `mailbox.notifier.base_url` | an `http://` or `https://` URL with a host, no spaces or control characters |
//! | `mailbox.notifier.auth_header` | visible ASCII characters, spaces and tabs (an HTTP header value) |
//! | `mailbox.notifier.timeout_ms` | 1 ms – 5 min |
//! | `mailbox.notifier.max_retries` | 0 – 100 |
//! | `gpu.device` | 0 – 255 |
//! | `gpu.devices` | 1 or more distinct indexes 0 – 255, not with `gpu.device`, only with the in_memory queue (each device's pool, `<pool>.gpu<N>`, owns its queue) |
//! | `gpu.reserve_fraction` | 0 – 0.9 |
//! | `gpu.sample_ms` | 1 ms – 60 s |
//! | `schedules[i].name` | 1–64 of `a-z A-Z 0-9 _ - .`, each once in the pool |
//! | `schedules[i]` | exactly one of `cron`, `every_secs`, `every_ms` |
//! | `schedules[i].cron` | five fields (minute hour day-of-month month day-of-week) or six with seconds first |
//! | `schedules[i].tz` | an IANA zone (`Europe/Paris`, `UTC`, the default); only with `cron` |
//! | `schedules[i].every_secs` / `.every_ms` | 100 ms – 1 year |
//! | `schedules[i].missed` | `skip` (default) or `run_once` |
//! | `schedules[i].priority` | `low`, `normal` (default), `high` or `critical` |
//! | `schedules[i].cost` | `{"kind": cpu/gpu_vram/io/mixed, "units": 1 – 4,294,967,295}` |
//! | `schedules[i].tenant` | not empty (default `schedules`) |
//! | `schedules[i].payload` | any JSON value the pool's payload type reads (checked when the pools are built) |
//! | across pools | no two pools share a yaque stream, a Postgres queue or a pgmq queue |
//!
//! Unknown fields, wrong types, unknown `type` values and keys given twice are reported while
//! reading, with the same field paths.
//!
//! Errors quote what the user wrote through [`quote`](super::quote): escaped, cut after 64
//! characters, and never a value read from the environment. The loaders validate the
//! configuration with its references replaced but quote it as written, so a bad
//! `base_url: "${WEBHOOK_URL}"` is shown as `"${WEBHOOK_URL}"`; secrets are never quoted.
//! Every message, a parser's included (which may quote a line of the file), has its
//! credentials masked ([`redact`](crate::util::redact)): `https://user:***@host/x?token=***`.

use std::collections::HashMap;

use super::file::{
    ByUseSettings, DurabilityMode, FairShareSettings, MaxUnits, PoolSettings, SchedulerConfig,
};
use super::mailbox::{MailboxSettings, NotifierSettings, StorageSettings};
use super::schedules::validate_schedules;
use crate::infra::queue::registry::queue_rules;
use crate::settings::checks::{check_identifier, check_name, in_range, MAX_IDENTIFIER};
use crate::settings::error::ConfigError;
use crate::settings::quote;
use crate::settings::secret::Secret;
use crate::util::serde::ResourceKind;
use prometheus_parking_lot_actors::domain::{QueueOrder, MAX_PERIOD_MS, MAX_STREAM_IDLE_MS};
use prometheus_parking_lot_actors::worker::default_worker_count;

const MAX_WORKERS: usize = 1_024;
/// Worker threads of all pools of one configuration together: four pools at the per-pool
/// maximum. Every worker is an OS thread with its own stack (2 MiB by default, so 8 GiB of
/// address space at this cap), and a few thousand threads is where common hosts' limits
/// (`ulimit -u`, `kernel.threads-max` in small containers) start refusing to spawn more;
/// a config past it is a typo, not a deployment.
const MAX_TOTAL_WORKERS: usize = 4_096;
const MIN_STACK: usize = 64 * 1024;
const MAX_STACK: usize = 1024 * 1024 * 1024;
const MAX_DEPTH: usize = 100_000_000;
const MAX_TIMEOUT_MS: u64 = 7 * 24 * 3_600 * 1_000;
const MAX_PARK_MS: u64 = 24 * 3_600 * 1_000;
const MAX_SKIPS: u32 = 1_000_000;
const MAX_RETENTION_SECS: u64 = 365 * 24 * 3_600;
const MAX_NOTIFY_TIMEOUT_MS: u64 = 5 * 60 * 1_000;
const MAX_RETRIES: u32 = 100;
const MAX_SPIN_MS: u64 = 60_000;

impl SchedulerConfig {
    /// Checks every rule of the module docs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_quoting(self)
    }

    /// Checks every rule on this configuration, quoting `written` in errors: the same
    /// configuration before its `${NAME}` references were replaced.
    pub(super) fn validate_quoting(&self, written: &SchedulerConfig) -> Result<(), ConfigError> {
        if self.pools.is_empty() {
            return Err(ConfigError::invalid(
                "pools",
                "no pool is defined; define at least one",
            ));
        }
        for (name, pool) in &self.pools {
            let path = format!("pools.{}", quote::name(name));
            check_name(&path, "pool names", name)?;
            pool.validate(&path, written.pools.get(name).unwrap_or(pool))?;
        }
        self.check_total_workers()?;
        self.check_admin()?;
        if let Some(fleet) = &self.fleet {
            fleet.check()?;
        }
        self.check_shared_queues(written)
    }

    /// The admin section: a feature that is built, an address, a token that is not empty.
    fn check_admin(&self) -> Result<(), ConfigError> {
        let Some(admin) = &self.admin else {
            return Ok(());
        };
        if !cfg!(feature = "admin") {
            return Err(ConfigError::invalid(
                "admin",
                "the admin server needs the cargo feature `admin`; build with it, or remove \
                 the section",
            ));
        }
        if let Some(bind) = &admin.bind {
            if bind.parse::<std::net::SocketAddr>().is_err() {
                return Err(ConfigError::invalid(
                    "admin.bind",
                    format!(
                        "\"{}\" is not an address; use host:port with an IP address, such as \
                         127.0.0.1:7480 (port 0 picks a free one)",
                        quote::name(bind)
                    ),
                ));
            }
        }
        if admin
            .token
            .as_ref()
            .is_some_and(|token| token.expose().trim().is_empty())
        {
            return Err(ConfigError::invalid(
                "admin.token",
                "the token is empty; give one (a ${NAME} reference keeps it out of the file), \
                 or leave the field out to serve reads only",
            ));
        }
        if admin.read_token && admin.token.is_none() {
            return Err(ConfigError::invalid(
                "admin.read_token",
                "reads cannot need a token the server does not have; give admin.token too, \
                 or leave read_token out",
            ));
        }
        for (index, host) in admin.allowed_hosts.iter().enumerate() {
            if let Some(problem) = host_problem(host) {
                return Err(ConfigError::invalid(
                    format!("admin.allowed_hosts[{index}]"),
                    format!(
                        "{} {problem}; write a name as a browser's Host header has it: \
                         dash.example.com, dash.example.com:7480, 10.0.0.5:7480 or [::1]:7480",
                        quote::value(host)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The pools together may not ask for more threads than a host can start.
    fn check_total_workers(&self) -> Result<(), ConfigError> {
        let total: usize = self
            .pools
            .values()
            .map(|pool| {
                let per_pool = pool.worker_threads.unwrap_or_else(default_worker_count);
                per_pool * pool.gpu.as_ref().map_or(1, |gpu| gpu.pool_count())
            })
            .sum();
        if total <= MAX_TOTAL_WORKERS {
            return Ok(());
        }
        Err(ConfigError::invalid(
            "pools",
            format!(
                "{total} worker threads in total across pools; at most {MAX_TOTAL_WORKERS} are allowed"
            ),
        ))
    }

    /// Two pools on one queue would take each other's tasks.
    fn check_shared_queues(&self, written: &SchedulerConfig) -> Result<(), ConfigError> {
        let mut owners: HashMap<(&str, String, String), &str> = HashMap::new();
        for (name, pool) in &self.pools {
            let Some(key) = queue_rules(&pool.queue).storage_key(name) else {
                continue;
            };
            if let Some(other) = owners.insert(key, name) {
                let queue =
                    queue_rules(&written.pools.get(name).unwrap_or(pool).queue).describe(name);
                return Err(ConfigError::invalid(
                    format!("pools.{}.queue", quote::name(name)),
                    format!(
                        "pool {} uses the {queue} already; give each pool its own queue",
                        quote::name(other)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What is wrong with `entry` as a name of `admin.allowed_hosts`, if anything: it must be
/// what a `Host` header holds, a host and an optional port, with no scheme, path or space.
pub(crate) fn host_problem(entry: &str) -> Option<&'static str> {
    if entry.is_empty() {
        return Some("is empty");
    }
    if entry.contains("://") {
        return Some("holds a scheme");
    }
    let port = match entry.strip_prefix('[') {
        Some(bracketed) => {
            let Some((address, rest)) = bracketed.split_once(']') else {
                return Some("opens a [ it does not close");
            };
            if address.parse::<std::net::Ipv6Addr>().is_err() {
                return Some("holds no IPv6 address between [ and ]");
            }
            if !rest.is_empty() && !rest.starts_with(':') {
                return Some("has text after its ]");
            }
            rest.strip_prefix(':')
        }
        None => {
            let (host, port) = match entry.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (entry, None),
            };
            let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
            if host.is_empty() || !host.chars().all(name_char) {
                return Some("is not a host name (letters, digits, - and . only)");
            }
            port
        }
    };
    if port.is_some_and(|port| port.parse::<u16>().is_err()) {
        return Some("has a port that is not a number from 0 to 65535");
    }
    None
}

impl PoolSettings {
    /// Checks this pool; `written` is the same pool before `${NAME}` replacement.
    fn validate(&self, path: &str, written: &PoolSettings) -> Result<(), ConfigError> {
        if let Some(workers) = self.worker_threads {
            let shared = queue_rules(&self.queue).is_shared();
            if workers == 0 && !shared {
                return Err(ConfigError::invalid(
                    format!("{path}.worker_threads"),
                    format!(
                        "0 is allowed only on a shared queue (postgres, postgres_pgmq), for a \
                         producer-only node; use 1 to {MAX_WORKERS}"
                    ),
                ));
            }
            in_range(path, "worker_threads", workers, 0, MAX_WORKERS)?;
        }
        if let Some(stack) = self.thread_stack_size {
            in_range(path, "thread_stack_size", stack, MIN_STACK, MAX_STACK)?;
        }
        if let MaxUnits::Units(units) = self.max_units {
            if units == 0 || units > u64::from(u32::MAX) {
                return Err(ConfigError::invalid(
                    format!("{path}.max_units"),
                    format!(
                        "{units} is out of range; use 1 to {} units, or \"auto\"",
                        u32::MAX
                    ),
                ));
            }
        }
        if let Some(depth) = self.max_queue_depth {
            in_range(path, "max_queue_depth", depth, 1, MAX_DEPTH)?;
        }
        self.validate_capacity(&format!("{path}.capacity"))?;
        if let Some(units) = self.max_queued_units {
            in_range(path, "max_queued_units", units, 1, u64::MAX)?;
            let queue = queue_rules(&self.queue);
            if !queue.bounds_queued_units() {
                return Err(ConfigError::invalid(
                    format!("{path}.max_queued_units"),
                    format!(
                        "the {} queue keeps no bound on the units parked for every node; \
                         remove the field, or use a queue that keeps one (in_memory, yaque, \
                         postgres)",
                        queue.type_name()
                    ),
                ));
            }
        }
        if self
            .admission
            .is_some_and(|admission| admission.refuse_if_late)
            && queue_rules(&self.queue).is_shared()
        {
            return Err(ConfigError::invalid(
                format!("{path}.admission.refuse_if_late"),
                "applies to a local queue (in_memory, yaque): a task that waits in a shared \
                 queue waits behind every node's backlog, which no node's estimate sees; \
                 remove it, or set it to false"
                    .to_string(),
            ));
        }
        if self.order == Some(QueueOrder::Deadline)
            && !queue_rules(&self.queue).claims_by_deadline()
        {
            return Err(ConfigError::invalid(
                format!("{path}.order"),
                format!(
                    "`deadline` needs a queue that ranks by deadline (in_memory, yaque, \
                     postgres, postgres_pgmq): the nodes of a {} queue claim by priority, then admission; \
                     use `fifo` here",
                    queue_rules(&self.queue).type_name()
                ),
            ));
        }
        self.validate_timeout(path)?;
        if let Some(starvation) = &self.starvation {
            if let Some(park) = starvation.max_park_ms {
                in_range(path, "starvation.max_park_ms", park, 1, MAX_PARK_MS)?;
            }
            if let Some(skips) = starvation.max_skips {
                in_range(path, "starvation.max_skips", skips, 1, MAX_SKIPS)?;
            }
        }
        if let Some(preemption) = &self.preemption {
            in_range(
                path,
                "preemption.max_per_task",
                preemption.max_per_task,
                1,
                u32::MAX,
            )?;
        }
        if let Some(fair_share) = &self.fair_share {
            validate_fair_share(&format!("{path}.fair_share"), fair_share, self.max_units)?;
        }
        self.validate_budgets(&format!("{path}.budgets"))?;
        if let Some(retry) = &self.retry {
            let at = format!("{path}.retry");
            in_range(&at, "max_attempts", retry.max_attempts, 1, 1_000)?;
            in_range(&at, "backoff_ms", retry.backoff_ms, 1, MAX_PERIOD_MS)?;
            if let Some(max) = retry.max_backoff_ms {
                in_range(&at, "max_backoff_ms", max, retry.backoff_ms, MAX_PERIOD_MS)?;
            }
        }
        if let Some(idle_ms) = self.stream_idle_ms {
            in_range(path, "stream_idle_ms", idle_ms, 1, MAX_STREAM_IDLE_MS)?;
        }
        queue_rules(&self.queue).validate(&format!("{path}.queue"))?;
        if let Some(gpu) = &self.gpu {
            gpu.validate(path, &self.queue)?;
        }
        self.validate_durability(path)?;
        validate_schedules(path, &self.schedules)?;
        validate_mailbox(&format!("{path}.mailbox"), &self.mailbox, &written.mailbox)
    }

    fn validate_capacity(&self, path: &str) -> Result<(), ConfigError> {
        for (name, &units) in &self.capacity {
            let at = format!("{path}.{}", quote::name(name));
            let Some(kind) = ResourceKind::from_name(name) else {
                return Err(ConfigError::invalid(
                    at,
                    format!(
                        "\"{}\" is not a resource kind; use `cpu`, `gpu_vram`, `io` or `mixed`",
                        quote::name(name)
                    ),
                ));
            };
            if kind == ResourceKind::GpuVram && self.gpu_settings().is_some() {
                return Err(ConfigError::invalid(
                    at,
                    "the pool's gpu_vram units are sized from its GPU (\"gpu\"); name the \
                     other kinds here"
                        .to_owned(),
                ));
            }
            if units == 0 {
                return Err(ConfigError::invalid(
                    at,
                    format!("0 is out of range; use 1 to {} units", u32::MAX),
                ));
            }
        }
        Ok(())
    }

    fn validate_budgets(&self, path: &str) -> Result<(), ConfigError> {
        let kinds = "`cpu`, `gpu_vram`, `io` or `mixed`";
        for (name, budget) in &self.budgets {
            let at = format!("{path}.{name}");
            let Some(kind) = ResourceKind::from_name(name) else {
                return Err(ConfigError::invalid(
                    at,
                    format!(
                        "\"{}\" is not a resource kind; use {kinds}",
                        quote::name(name)
                    ),
                ));
            };
            if kind == ResourceKind::GpuVram && self.gpu_settings().is_some() {
                return Err(ConfigError::invalid(
                    at,
                    "the pool's gpu_vram units are the GPU's memory, which comes back when tasks \
                     end; a budget refills with time: give the budget to another kind (io, \
                     mixed)"
                        .to_owned(),
                ));
            }
            in_range(&at, "units", budget.units, 1, u32::MAX)?;
            if let Some(burst) = budget.burst {
                in_range(&at, "burst", burst, 1, u32::MAX)?;
            }
            validate_period(&at, budget.per_secs, budget.per_ms)?;
            if let Some(cap) = &budget.max_starts {
                let at = format!("{at}.max_starts");
                in_range(&at, "count", cap.count, 1, u32::MAX)?;
                validate_period(&at, cap.per_secs, cap.per_ms)?;
            }
        }
        Ok(())
    }

    fn validate_durability(&self, path: &str) -> Result<(), ConfigError> {
        if self.durability.is_some() && !queue_rules(&self.queue).is_durable() {
            return Err(ConfigError::invalid(
                format!("{path}.durability"),
                "applies to durable queues only (yaque, postgres, postgres_pgmq); the \
                 in_memory queue keeps nothing across a restart: remove the field or choose a \
                 durable queue",
            ));
        }
        if let Some(spin) = self.spin_ms {
            if self.durability != Some(DurabilityMode::Parked) {
                return Err(ConfigError::invalid(
                    format!("{path}.spin_ms"),
                    "applies only with \"durability\": \"parked\"; set that, or remove spin_ms",
                ));
            }
            in_range(path, "spin_ms", spin, 0, MAX_SPIN_MS)?;
            let shared = queue_rules(&self.queue).is_shared();
            if spin > 0 && shared {
                return Err(ConfigError::invalid(
                    format!("{path}.spin_ms"),
                    "applies to the yaque queue only; a shared queue (postgres) parks a task \
                     at once, where other nodes can claim it: set 0 or remove spin_ms",
                ));
            }
        }
        Ok(())
    }

    fn validate_timeout(&self, path: &str) -> Result<(), ConfigError> {
        match (self.default_timeout_secs, self.default_timeout_ms) {
            (Some(_), Some(_)) => Err(ConfigError::invalid(
                format!("{path}.default_timeout_ms"),
                "default_timeout_secs is set too; set only one of the two",
            )),
            (Some(secs), None) => in_range(
                path,
                "default_timeout_secs",
                secs,
                1,
                MAX_TIMEOUT_MS / 1_000,
            ),
            (None, Some(ms)) => in_range(path, "default_timeout_ms", ms, 1, MAX_TIMEOUT_MS),
            (None, None) => Ok(()),
        }
    }
}

fn validate_mailbox(
    path: &str,
    mailbox: &MailboxSettings,
    written: &MailboxSettings,
) -> Result<(), ConfigError> {
    if let Some(retention) = mailbox.retention_secs {
        in_range(path, "retention_secs", retention, 1, MAX_RETENTION_SECS)?;
    }
    match &mailbox.storage {
        StorageSettings::InMemory {
            max_messages: Some(max),
        } => {
            in_range(path, "storage.max_messages", *max, 1, MAX_DEPTH)?;
        }
        StorageSettings::InMemory { max_messages: None } => {}
        StorageSettings::Postgres { table } => {
            check_identifier(&format!("{path}.storage.table"), table, MAX_IDENTIFIER)?;
        }
    }
    let Some(NotifierSettings::Http {
        base_url,
        auth_header,
        timeout_ms,
        max_retries,
        ..
    }) = &mailbox.notifier
    else {
        return Ok(());
    };
    let written_url = match &written.notifier {
        Some(NotifierSettings::Http { base_url, .. }) => base_url,
        None => base_url,
    };
    check_url(&format!("{path}.notifier.base_url"), base_url, written_url)?;
    if let Some(header) = auth_header {
        check_header_value(&format!("{path}.notifier.auth_header"), header)?;
    }
    if let Some(timeout) = timeout_ms {
        in_range(
            path,
            "notifier.timeout_ms",
            *timeout,
            1,
            MAX_NOTIFY_TIMEOUT_MS,
        )?;
    }
    if let Some(retries) = max_retries {
        in_range(path, "notifier.max_retries", *retries, 0, MAX_RETRIES)?;
    }
    Ok(())
}

/// Exactly one of `per_secs` and `per_ms`, for a period of 1 ms to a day.
fn validate_period(path: &str, secs: Option<u64>, ms: Option<u64>) -> Result<(), ConfigError> {
    match (secs, ms) {
        (Some(secs), None) => in_range(path, "per_secs", secs, 1, MAX_PERIOD_MS / 1_000),
        (None, Some(ms)) => in_range(path, "per_ms", ms, 1, MAX_PERIOD_MS),
        (Some(_), Some(_)) => Err(ConfigError::invalid(
            path.to_owned(),
            "has both per_secs and per_ms; give the period once".to_owned(),
        )),
        (None, None) => Err(ConfigError::invalid(
            path.to_owned(),
            "needs its period: per_secs (1 to 86400) or per_ms (1 to 86400000)".to_owned(),
        )),
    }
}

fn validate_fair_share(
    path: &str,
    fair_share: &FairShareSettings,
    max_units: MaxUnits,
) -> Result<(), ConfigError> {
    if let Some(by_use) = &fair_share.by_use {
        validate_by_use(&format!("{path}.by_use"), by_use)?;
    }
    match (fair_share.max_units_per_tenant, fair_share.max_fraction) {
        (None, None) if fair_share.by_use.is_some() => Ok(()),
        (Some(units), None) => {
            let most = match max_units {
                MaxUnits::Units(units) => units.min(u64::from(u32::MAX)),
                MaxUnits::Auto => u64::from(u32::MAX),
            };
            if units == 0 || u64::from(units) > most {
                return Err(ConfigError::invalid(
                    format!("{path}.max_units_per_tenant"),
                    format!(
                        "{units} is out of range; use 1 to {most} (the pool's max_units: a \
                         larger cap would cap nothing)"
                    ),
                ));
            }
            Ok(())
        }
        (None, Some(fraction)) => {
            if fraction > 0.0 && fraction <= 1.0 {
                return Ok(());
            }
            Err(ConfigError::invalid(
                format!("{path}.max_fraction"),
                format!("{fraction} is out of range; use a number greater than 0 and at most 1"),
            ))
        }
        _ => Err(ConfigError::invalid(
            path,
            "give exactly one of max_units_per_tenant (units of each kind per tenant) and \
             max_fraction (a share of each kind's units, greater than 0 and at most 1), or \
             by_use alone (tenants ordered by the service they were charged, uncapped)",
        )),
    }
}

/// The longest half-life of a fair share by use: a year, in ms.
const MAX_HALF_LIFE_MS: f64 = 31_536_000_000.0;

fn validate_by_use(path: &str, by_use: &ByUseSettings) -> Result<(), ConfigError> {
    for (tenant, &weight) in &by_use.weights {
        let most = f64::from(prometheus_parking_lot_actors::domain::MAX_WEIGHT);
        if !(weight.fract() == 0.0 && (1.0..=most).contains(&weight)) {
            return Err(ConfigError::invalid(
                format!("{path}.weights.{}", quote::name(tenant)),
                format!(
                    "{weight} is not allowed; use a whole number from 1 to {most} (a tenant \
                     of weight 3 is served three times what one of weight 1 is)"
                ),
            ));
        }
    }
    if let Some(half_life) = by_use.half_life_ms {
        if !(half_life.fract() == 0.0 && (1.0..=MAX_HALF_LIFE_MS).contains(&half_life)) {
            return Err(ConfigError::invalid(
                format!("{path}.half_life_ms"),
                format!(
                    "{half_life} is not allowed; use a whole number of milliseconds from 1 to \
                     {MAX_HALF_LIFE_MS} (a year), or leave it out for counters that never decay"
                ),
            ));
        }
    }
    Ok(())
}

/// `url` is checked; `written` (the field before `${NAME}` replacement) is what an error shows.
fn check_url(path: &str, url: &str, written: &str) -> Result<(), ConfigError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let host = rest.map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
    let plain = !url.contains(|c: char| c.is_whitespace() || c.is_control());
    if plain && host.is_some_and(|host| !host.is_empty()) {
        return Ok(());
    }
    Err(ConfigError::invalid(
        path,
        format!(
            "{} is not a URL; use http://host/path or https://host/path",
            quote::value(written)
        ),
    ))
}

/// The header goes on the wire as is: a line break in it would start a header of its own.
/// The value is a secret, so the error describes it without quoting it.
fn check_header_value(path: &str, header: &Secret) -> Result<(), ConfigError> {
    let valid = header
        .expose()
        .chars()
        .all(|c| c == '\t' || (c.is_ascii() && !c.is_ascii_control()));
    if valid {
        return Ok(());
    }
    Err(ConfigError::invalid(
        path,
        "is not a valid HTTP header value; use visible ASCII characters, spaces and tabs (the value is secret and not shown)",
    ))
}
