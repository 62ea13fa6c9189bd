//! The fair share by use: tenants ordered by the service they were charged, weighted and
//! decayed, instead of by what they hold at this moment (`PARKING_LOT.md`, "Fair share by
//! use").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::PoolError;

/// The largest weight a tenant may have: weights are ratios, and a million to one is far
/// past any share a pool would want to tell apart.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// What a tenant is charged for a task it ran.
///
/// ```
/// use prometheus_parking_lot_actors::domain::UsageCharge;
///
/// let charge: UsageCharge = serde_json::from_str(r#""reported""#).unwrap();
/// assert_eq!(charge, UsageCharge::Reported);
/// assert_eq!(UsageCharge::default(), UsageCharge::Held);
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum UsageCharge {
    /// Units times the milliseconds the task held them. A task with an execution timeout
    /// is charged its units times its timeout when it starts, and what it did not hold is
    /// given back when it ends; a task without one is charged only when it ends.
    #[default]
    Held,
    /// The units the task's executor reports it used (`running::report_used`), at most
    /// its declared cost. Its cost is charged when it starts, and what it did not use is
    /// given back when it ends; a task that reports nothing is charged its cost.
    Reported,
}

/// Orders the tenants of a fair share by the weighted service they were charged (the
/// Virtual Token Counter of Sheng et al., "Fairness in Serving LLMs"): within a priority,
/// the tenant with the lowest counter goes first. A counter grows by a task's charge
/// divided by its tenant's weight, and halves every `half_life_ms` when set. A tenant that
/// starts waiting after idling is lifted to the lowest counter of the waiting tenants, so
/// idling banks no credit.
///
/// The weights of named tenants live beside the limits, in [`TenantWeights`] (names are not
/// `Copy`); `default_weight` is the weight of every other tenant.
///
/// ```
/// use prometheus_parking_lot_actors::domain::{FairByUse, PoolLimits, UsageCharge};
///
/// let order = FairByUse::new(UsageCharge::Reported).with_half_life_ms(60_000);
/// let limits = PoolLimits::new(24, 4).with_fair_by_use(Some(order));
/// assert!(limits.validate().is_ok());
/// assert!(PoolLimits::new(24, 4)
///     .with_fair_by_use(Some(order.with_half_life_ms(0)))
///     .validate()
///     .is_err());
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairByUse {
    /// What a task is charged.
    pub charge: UsageCharge,
    /// The counters halve every this many milliseconds; `None`: they never decay.
    #[serde(default)]
    pub half_life_ms: Option<u64>,
    /// The weight of a tenant that [`TenantWeights`] does not name (1 to [`MAX_WEIGHT`]).
    #[serde(default = "default_weight")]
    pub default_weight: u32,
}

fn default_weight() -> u32 {
    1
}

impl FairByUse {
    /// Charging `charge`, no decay, every tenant of weight 1.
    pub const fn new(charge: UsageCharge) -> Self {
        Self {
            charge,
            half_life_ms: None,
            default_weight: 1,
        }
    }

    /// The same order with counters that halve every `half_life_ms`.
    pub const fn with_half_life_ms(mut self, half_life_ms: u64) -> Self {
        self.half_life_ms = Some(half_life_ms);
        self
    }

    /// The same order with another weight for the tenants [`TenantWeights`] does not name.
    pub const fn with_default_weight(mut self, weight: u32) -> Self {
        self.default_weight = weight;
        self
    }

    /// Checks the numbers, naming the field and what is allowed.
    pub fn validate(&self) -> Result<(), PoolError> {
        check_weight("*", self.default_weight)?;
        if self.half_life_ms == Some(0) {
            return Err(PoolError::InvalidConfig(
                "fair_share.by_use.half_life_ms is 0; use at least 1 ms, or leave it out for \
                 counters that never decay"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Checks one tenant's weight, naming the tenant.
fn check_weight(tenant: &str, weight: u32) -> Result<(), PoolError> {
    if (1..=MAX_WEIGHT).contains(&weight) {
        return Ok(());
    }
    // The path and words of a configuration file's error for the same weight, so that
    // code and file name a weight alike.
    Err(PoolError::InvalidConfig(format!(
        "fair_share.by_use.weights.{}: {weight} is not allowed; use a whole number from 1 to \
         {MAX_WEIGHT} (a tenant of weight 3 is served three times what one of weight 1 is)",
        tenant.escape_debug()
    )))
}

/// The weights of named tenants under a [`FairByUse`] order: a tenant of weight 3 is served
/// three times what a tenant of weight 1 is while both wait. A tenant not named here has
/// the order's `default_weight`.
///
/// ```
/// use prometheus_parking_lot_actors::domain::TenantWeights;
///
/// let weights = TenantWeights::default().with("acme", 3).with("globex", 1);
/// assert_eq!(weights.get("acme"), Some(3));
/// assert_eq!(weights.get("initech"), None);
/// assert!(weights.validate().is_ok());
/// assert!(TenantWeights::default().with("acme", 0).validate().is_err());
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(transparent)]
pub struct TenantWeights(BTreeMap<String, u32>);

impl TenantWeights {
    /// The same weights with `tenant` weighing `weight`.
    pub fn with(mut self, tenant: impl Into<String>, weight: u32) -> Self {
        self.0.insert(tenant.into(), weight);
        self
    }

    /// The weight of `tenant`, if it is named.
    pub fn get(&self, tenant: &str) -> Option<u32> {
        self.0.get(tenant).copied()
    }

    /// Every named tenant with its weight.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u32)> {
        self.0
            .iter()
            .map(|(tenant, &weight)| (tenant.as_str(), weight))
    }

    /// Whether no tenant is named.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks every weight, naming the first tenant whose weight is out of range.
    pub fn validate(&self) -> Result<(), PoolError> {
        self.iter()
            .try_for_each(|(tenant, weight)| check_weight(tenant, weight))
    }
}
