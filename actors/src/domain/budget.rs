//! Renewable capacity: a resource kind whose units time gives back, not the end of a task.
//!
//! A provider's quota (tokens per minute, requests per minute) is not held while a request
//! runs and returned when it ends: it is spent when the request is sent and refills with
//! time. A [`Budget`] makes one resource kind of a pool behave so (rule 15 of the core).

use serde::{Deserialize, Serialize};

use super::{PoolError, ResourceKind};

/// The longest refill period: a day.
pub const MAX_PERIOD_MS: u64 = 86_400_000;

/// A token bucket for one resource kind: `units` come back every `per_ms` milliseconds,
/// evenly (one unit every `per_ms / units` ms), up to `burst` units at once. A task of the
/// kind spends its cost's units when it starts; they do not come back when it ends (it may
/// give back what it did not use, see `running::return_units`). A task that does not fit
/// what is left parks in rank order and starts as soon as the bucket holds its units. On a
/// shared queue the bucket is the fleet's: every node's claims spend from one (see
/// [`SharedBudgets::share_budgets`](crate::queue::SharedBudgets::share_budgets)).
///
/// **The bound.** Over any span of `w` ms the tasks of the kind start with at most
/// `burst + units * w / per_ms` units, so at most `burst + units` in any window of
/// `per_ms`. To stay under a provider's "N per minute" in every window, give a burst below
/// N (the bucket starts full): `Budget::per_minute(90_000).with_burst(45_000)` never spends
/// more than 135,000 in a minute and 90,000 a minute on average.
///
/// `max_starts` adds a bucket of starts, for a cap on requests per interval; under it every
/// task of the kind costs at least one unit.
///
/// ```
/// use std::time::Duration;
/// use prometheus_parking_lot_actors::domain::Budget;
///
/// // 90,000 tokens a minute, at most 500 requests a minute.
/// let quota = Budget::per_minute(90_000).with_max_starts(500, Duration::from_secs(60));
/// assert_eq!(quota.burst, 90_000);
/// assert_eq!(quota.per_ms, 60_000);
/// assert!(quota.validate(prometheus_parking_lot_actors::domain::ResourceKind::Io).is_ok());
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Units that come back every `per_ms` (at least 1).
    pub units: u32,
    /// The refill period, ms (1 ms to a day).
    pub per_ms: u64,
    /// The most units the bucket holds, and so the largest task of the kind (at least 1).
    /// The bucket starts full.
    pub burst: u32,
    /// A cap on how many tasks of the kind start per interval; `None`: no cap.
    #[serde(default)]
    pub max_starts: Option<StartCap>,
}

/// At most `count` starts every `per_ms` milliseconds (a bucket of `count` starts).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartCap {
    /// Starts that come back every `per_ms` (at least 1); also the most at once.
    pub count: u32,
    /// The period, ms (1 ms to a day).
    pub per_ms: u64,
}

impl Budget {
    /// `units` every `per`, with a burst of `units`.
    pub fn new(units: u32, per: std::time::Duration) -> Self {
        Self {
            units,
            per_ms: u64::try_from(per.as_millis()).unwrap_or(u64::MAX),
            burst: units,
            max_starts: None,
        }
    }

    /// `units` a minute, with a burst of `units`.
    pub fn per_minute(units: u32) -> Self {
        Self::new(units, std::time::Duration::from_secs(60))
    }

    /// The same budget with at most `burst` units at once.
    pub fn with_burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }

    /// The same budget with at most `count` starts every `per`.
    pub fn with_max_starts(mut self, count: u32, per: std::time::Duration) -> Self {
        self.max_starts = Some(StartCap {
            count,
            per_ms: u64::try_from(per.as_millis()).unwrap_or(u64::MAX),
        });
        self
    }

    /// Checks the numbers, naming the kind's budget in the error.
    pub fn validate(&self, kind: ResourceKind) -> Result<(), PoolError> {
        let name = format!("budgets.{}", kind.name());
        let period = |field: &str, per_ms: u64| {
            if (1..=MAX_PERIOD_MS).contains(&per_ms) {
                Ok(())
            } else {
                Err(PoolError::InvalidConfig(format!(
                    "{name}.{field} is {per_ms} ms; use 1 ms to 1 day ({MAX_PERIOD_MS} ms)"
                )))
            }
        };
        if self.units == 0 || self.burst == 0 {
            return Err(PoolError::InvalidConfig(format!(
                "{name}: units is {} and burst is {}; both need at least 1 (leave the budget \
                 out for a kind that does not refill)",
                self.units, self.burst
            )));
        }
        period("per_ms", self.per_ms)?;
        if let Some(cap) = &self.max_starts {
            if cap.count == 0 {
                return Err(PoolError::InvalidConfig(format!(
                    "{name}.max_starts.count is 0; use at least 1, or leave max_starts out"
                )));
            }
            period("max_starts.per_ms", cap.per_ms)?;
        }
        Ok(())
    }
}

/// The budget of each resource kind that has one.
///
/// ```
/// use prometheus_parking_lot_actors::domain::{Budget, Budgets, ResourceKind};
/// let budgets = Budgets::none().with(ResourceKind::Io, Budget::per_minute(600));
/// assert_eq!(budgets.get(ResourceKind::Io).map(|b| b.units), Some(600));
/// assert!(budgets.get(ResourceKind::Cpu).is_none());
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budgets {
    by_kind: [Option<Budget>; ResourceKind::COUNT],
}

impl Budgets {
    /// No kind has a budget: every kind's units come back when its tasks end.
    pub const fn none() -> Self {
        Self {
            by_kind: [None; ResourceKind::COUNT],
        }
    }

    /// The same budgets with `budget` for `kind`.
    pub fn with(mut self, kind: ResourceKind, budget: Budget) -> Self {
        self.by_kind[kind.index()] = Some(budget);
        self
    }

    /// The budget of `kind`, if it has one.
    pub fn get(&self, kind: ResourceKind) -> Option<&Budget> {
        self.by_kind[kind.index()].as_ref()
    }

    /// Whether no kind has a budget.
    pub fn is_empty(&self) -> bool {
        self.by_kind.iter().all(Option::is_none)
    }

    /// Each kind with a budget, and its budget.
    pub fn iter(&self) -> impl Iterator<Item = (ResourceKind, &Budget)> {
        ResourceKind::ALL
            .into_iter()
            .zip(&self.by_kind)
            .filter_map(|(kind, budget)| Some((kind, budget.as_ref()?)))
    }

    /// Checks every budget: units, burst, period and start cap within their ranges.
    pub fn validate(&self) -> Result<(), PoolError> {
        self.iter()
            .try_for_each(|(kind, budget)| budget.validate(kind))
    }
}
