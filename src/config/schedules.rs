//! A pool's `schedules`: periodic tasks in a configuration file, read into
//! [`Schedule`]s (see `prometheus_parking_lot_actors::schedule`).
//!
//! ```json
//! "schedules": [
//!   {"name": "reindex", "cron": "0 2 * * *", "tz": "Europe/Paris", "missed": "run_once",
//!    "priority": "low", "cost": {"kind": "cpu", "units": 4}, "tenant": "ops",
//!    "payload": {"job": "reindex"}},
//!   {"name": "heartbeat", "every_secs": 30, "payload": "ping"}
//! ]
//! ```

use std::time::Duration;

use serde::Deserialize;

use crate::settings::error::ConfigError;
use crate::settings::quote;
use crate::util::serde::{MailboxKey, Priority, ResourceCost, ResourceKind};
use prometheus_parking_lot_actors::schedule::{
    Missed, Schedule, ScheduleError, Timing, MIN_PERIOD,
};

/// The longest period a schedule may have: a year.
const MAX_PERIOD_MS: u64 = 365 * 24 * 60 * 60 * 1_000;

/// One schedule of a pool: when it ticks (`cron` with `tz`, or `every_secs` / `every_ms`),
/// what each tick's task is (`priority`, `cost`, `tenant`, `payload`), and what missed ticks
/// become (`missed`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSettings {
    /// Its name, unique within the pool: 1 to 64 letters, digits, `_`, `-` or `.`.
    pub name: String,
    /// A cron expression: five fields (minute hour day-of-month month day-of-week) or six
    /// with seconds first. Exactly one of `cron`, `every_secs` and `every_ms`.
    #[serde(default)]
    pub cron: Option<String>,
    /// The IANA time zone `cron` is read in (`"Europe/Paris"`). Default `"UTC"`.
    #[serde(default)]
    pub tz: Option<String>,
    /// A fixed period, seconds; ticks at multiples of it since the Unix epoch.
    #[serde(default)]
    pub every_secs: Option<u64>,
    /// A fixed period, milliseconds (at least 100).
    #[serde(default)]
    pub every_ms: Option<u64>,
    /// What ticks missed while no node ran the schedule become: `"skip"` (the default) or
    /// `"run_once"` (one task for all of them, at once).
    #[serde(default)]
    pub missed: Option<Missed>,
    /// Each task's priority: `"low"`, `"normal"` (the default), `"high"` or `"critical"`.
    #[serde(default)]
    pub priority: Option<PriorityName>,
    /// Each task's cost, e.g. `{"kind": "cpu", "units": 4}`. Default one CPU unit.
    #[serde(default)]
    pub cost: Option<CostSettings>,
    /// The tenant each task runs for (its mailbox key). Default `"schedules"`.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Each task's payload, read as the pool's payload type. Default `null`.
    #[serde(default)]
    pub payload: serde_json::Value,
}

/// A priority as a configuration file names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriorityName {
    /// [`Priority::Low`].
    Low,
    /// [`Priority::Normal`].
    Normal,
    /// [`Priority::High`].
    High,
    /// [`Priority::Critical`].
    Critical,
}

impl From<PriorityName> for Priority {
    fn from(name: PriorityName) -> Self {
        match name {
            PriorityName::Low => Priority::Low,
            PriorityName::Normal => Priority::Normal,
            PriorityName::High => Priority::High,
            PriorityName::Critical => Priority::Critical,
        }
    }
}

/// A task's cost in a schedule: `units` of `kind` (`cpu`, `gpu_vram`, `io`, `mixed`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostSettings {
    /// The resource kind's name.
    pub kind: String,
    /// How many units.
    pub units: u32,
}

impl ScheduleSettings {
    /// The schedule these settings describe; the error names the field (`path` is the
    /// schedule's own, `pools.NAME.schedules[0]`) and what is allowed.
    pub fn schedule(&self, path: &str) -> Result<Schedule, ConfigError> {
        let timing = self.timing(path)?;
        let mut schedule = Schedule::new(self.name.clone(), timing).map_err(|_| {
            ConfigError::invalid(
                format!("{path}.name"),
                format!(
                    "{} is not a schedule name; use 1 to 64 letters, digits, '_', '-' or '.'",
                    quote::value(&self.name)
                ),
            )
        })?;
        schedule.missed = self.missed.unwrap_or_default();
        if let Some(priority) = self.priority {
            schedule.priority = priority.into();
        }
        if let Some(cost) = &self.cost {
            schedule.cost = cost.cost(&format!("{path}.cost"))?;
        }
        if let Some(tenant) = &self.tenant {
            if tenant.is_empty() {
                return Err(ConfigError::invalid(
                    format!("{path}.tenant"),
                    "is empty; name a tenant, or leave the field out for \"schedules\"",
                ));
            }
            schedule.mailbox = MailboxKey::new(tenant.as_str());
        }
        Ok(schedule)
    }

    fn timing(&self, path: &str) -> Result<Timing, ConfigError> {
        let given = [
            self.cron.is_some(),
            self.every_secs.is_some(),
            self.every_ms.is_some(),
        ];
        if given.iter().filter(|given| **given).count() != 1 {
            return Err(ConfigError::invalid(
                path.to_owned(),
                "give exactly one of `cron` (with `tz`), `every_secs` and `every_ms`",
            ));
        }
        if let Some(expression) = &self.cron {
            let zone = self.tz.as_deref().unwrap_or("UTC");
            return Timing::cron(expression, zone).map_err(|error| match error {
                ScheduleError::Zone { .. } => ConfigError::invalid(
                    format!("{path}.tz"),
                    format!(
                        "{} is not a known time zone; use an IANA name such as \
                         \"Europe/Paris\" or \"UTC\"",
                        quote::value(zone)
                    ),
                ),
                other => {
                    ConfigError::invalid(format!("{path}.cron"), cron_problem(expression, &other))
                }
            });
        }
        if self.tz.is_some() {
            return Err(ConfigError::invalid(
                format!("{path}.tz"),
                "applies to `cron` only; a period ticks at multiples of itself in UTC: remove \
                 the field",
            ));
        }
        // Exactly one of the two is given (checked above).
        let (field, period_ms) = match self.every_secs {
            Some(secs) => ("every_secs", secs.saturating_mul(1_000)),
            None => ("every_ms", self.every_ms.unwrap_or(0)),
        };
        let min_ms = u64::try_from(MIN_PERIOD.as_millis()).unwrap_or(u64::MAX);
        if !(min_ms..=MAX_PERIOD_MS).contains(&period_ms) {
            return Err(ConfigError::invalid(
                format!("{path}.{field}"),
                format!("is out of range; use {min_ms} ms to {MAX_PERIOD_MS} ms (a year)"),
            ));
        }
        Timing::every(Duration::from_millis(period_ms))
            .map_err(|error| ConfigError::invalid(format!("{path}.{field}"), error.to_string()))
    }
}

fn cron_problem(expression: &str, error: &ScheduleError) -> String {
    let reason = match error {
        ScheduleError::Cron { reason, .. } => reason.as_str(),
        _ => "unreadable",
    };
    format!(
        "{} is not a cron expression ({}); write five fields (minute hour day-of-month month \
         day-of-week, e.g. \"0 2 * * *\") or six with seconds first",
        quote::value(expression),
        quote::problem(reason)
    )
}

impl CostSettings {
    fn cost(&self, path: &str) -> Result<ResourceCost, ConfigError> {
        let Some(kind) = ResourceKind::from_name(&self.kind) else {
            return Err(ConfigError::invalid(
                format!("{path}.kind"),
                format!(
                    "{} is not a resource kind; use `cpu`, `gpu_vram`, `io` or `mixed`",
                    quote::value(&self.kind)
                ),
            ));
        };
        if self.units == 0 {
            return Err(ConfigError::invalid(
                format!("{path}.units"),
                format!("0 is out of range; use 1 to {}", u32::MAX),
            ));
        }
        Ok(ResourceCost {
            kind,
            units: self.units,
        })
    }
}

/// Checks a pool's schedules: each reads, and no name is given twice.
pub(crate) fn validate_schedules(
    path: &str,
    schedules: &[ScheduleSettings],
) -> Result<(), ConfigError> {
    for (index, settings) in schedules.iter().enumerate() {
        let at = format!("{path}.schedules[{index}]");
        settings.schedule(&at)?;
        if schedules[..index]
            .iter()
            .any(|earlier| earlier.name == settings.name)
        {
            return Err(ConfigError::invalid(
                format!("{at}.name"),
                format!(
                    "{} names an earlier schedule of the pool; give each its own name",
                    quote::value(&settings.name)
                ),
            ));
        }
    }
    Ok(())
}
