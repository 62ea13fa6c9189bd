//! Why a task parked in a shared queue waits, worked out from what the database holds: the
//! live nodes and their state, the task's retry backoff, the fleet's budgets and the tenants'
//! counters. The first cause that holds is the reason (the order of [`reason_of`]).

use serde::Serialize;

use crate::util::serde::ResourceKind;

/// Why a parked task of the fleet waits. Serialised with a `code` naming the variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum ParkedReason {
    /// No node with workers serves the queue now: every one left, or none heartbeats.
    NoLiveNode,
    /// Every live node is paused or draining: nothing is claimed.
    PausedFleet {
        /// How many nodes are live.
        live_nodes: usize,
    },
    /// It depends on tasks that have not all ended yet (`SubmitOptions::depends_on`): no
    /// node claims it before they succeed.
    WaitsForParents {
        /// Parents not ended yet.
        pending: u64,
    },
    /// It was submitted to start no earlier than an instant (a scheduled start,
    /// `SubmitOptions::not_before_ms`) that has not come yet.
    Scheduled {
        /// When it becomes claimable, ms since the Unix epoch.
        not_before_ms: u128,
        /// How long that is from now, ms.
        in_ms: u64,
    },
    /// A run of it failed and it waits out its backoff before any node may claim it.
    RetryBackoff {
        /// When it becomes claimable, ms since the Unix epoch.
        not_before_ms: u128,
        /// How long that is from now, ms.
        in_ms: u64,
        /// Claims it had so far.
        attempts: u32,
        /// Why the last run failed, if it said.
        last_error: Option<String>,
    },
    /// It needs more units than any live node has of its kind.
    LargerThanAnyNode {
        /// Its kind.
        kind: &'static str,
        /// Its units.
        units: u64,
        /// The most units of that kind a live node has (0: none has the kind).
        largest: u64,
    },
    /// The fleet's budget of its kind holds fewer whole units than it needs.
    Budget {
        /// Its kind.
        kind: &'static str,
        /// Its units.
        units: u64,
        /// Whole units the budget holds now.
        level: u64,
        /// When the budget will hold its units, ms from now.
        refill_in_ms: u64,
    },
    /// Claims go to the tenant with the least weighted service first, and this task's
    /// tenant has had more than another tenant waiting.
    TenantShare {
        /// Its tenant.
        tenant: String,
        /// Its tenant's service counter.
        service: f64,
        /// The least-served tenant with a task waiting.
        ahead: String,
        /// That tenant's counter.
        ahead_service: f64,
    },
    /// It waits for units of its kind to free on a node: tasks ranked ahead of it go first.
    Capacity {
        /// Its kind.
        kind: &'static str,
        /// Its units.
        units: u64,
        /// Parked tasks ranked ahead of it.
        ahead: u64,
    },
}

impl ParkedReason {
    /// The reason in a sentence, for tables and pages.
    pub fn text(&self) -> String {
        match self {
            Self::NoLiveNode => "no live node with workers serves the queue".into(),
            Self::PausedFleet { live_nodes } => {
                format!("every live node ({live_nodes}) is paused or draining")
            }
            Self::WaitsForParents { pending } => {
                format!("waits for {pending} task(s) it depends on")
            }
            Self::Scheduled { in_ms, .. } => {
                format!("a scheduled start: claimable in {in_ms} ms")
            }
            Self::RetryBackoff {
                in_ms,
                attempts,
                last_error,
                ..
            } => {
                let error = last_error
                    .as_deref()
                    .map_or_else(String::new, |error| format!(": {error}"));
                format!("retry backoff after attempt {attempts}, claimable in {in_ms} ms{error}")
            }
            Self::LargerThanAnyNode {
                kind,
                units,
                largest,
            } => format!(
                "needs {units} {kind} units; the largest live node has {largest}"
            ),
            Self::Budget {
                kind,
                units,
                level,
                refill_in_ms,
            } => format!(
                "the fleet's {kind} budget holds {level} of the {units} units it needs; refilled in {refill_in_ms} ms"
            ),
            Self::TenantShare {
                tenant,
                service,
                ahead,
                ahead_service,
            } => format!(
                "tenant {tenant} has had {service:.1} units of service; {ahead}, with {ahead_service:.1}, is served first"
            ),
            Self::Capacity { kind, units, ahead } => {
                format!("waits for {units} free {kind} units on a node; {ahead} tasks rank ahead")
            }
        }
    }
}

/// What the fleet holds that a parked task may wait on.
#[derive(Debug, Clone, Default)]
pub(crate) struct FleetState {
    /// The database's clock, ms since the Unix epoch.
    pub now_ms: u64,
    /// Nodes with workers, heartbeating and not gone.
    pub live_nodes: usize,
    /// Of those, the ones that claim (neither paused nor draining).
    pub claiming_nodes: usize,
    /// The most units per kind among the live nodes.
    pub largest: [u64; ResourceKind::COUNT],
    /// Whole units each kind's budget holds now, and its refill (units per ms, scaled as the
    /// bucket keeps them: `(level, units, per_ms)`), where a kind has one.
    pub budgets: [Option<(u64, u64, u64)>; ResourceKind::COUNT],
    /// The least-served tenant with a parked task, and its counter, where the counters are
    /// kept.
    pub least_served: Option<(String, f64)>,
}

/// A parked task, as far as its reason goes.
#[derive(Debug, Clone)]
pub(crate) struct WaitingTask<'a> {
    pub kind: ResourceKind,
    pub units: u64,
    pub tenant: &'a str,
    pub service: Option<f64>,
    pub not_before_ms: u64,
    pub attempts: u32,
    pub last_error: Option<&'a str>,
    pub ahead: u64,
    /// Parents it still waits for (0: none).
    pub pending_parents: u64,
}

/// Why `task` waits in `fleet`.
pub(crate) fn reason_of(task: &WaitingTask<'_>, fleet: &FleetState) -> ParkedReason {
    if fleet.live_nodes == 0 {
        return ParkedReason::NoLiveNode;
    }
    if fleet.claiming_nodes == 0 {
        return ParkedReason::PausedFleet {
            live_nodes: fleet.live_nodes,
        };
    }
    if task.pending_parents > 0 {
        return ParkedReason::WaitsForParents {
            pending: task.pending_parents,
        };
    }
    if task.not_before_ms > fleet.now_ms && task.attempts == 0 {
        return ParkedReason::Scheduled {
            not_before_ms: u128::from(task.not_before_ms),
            in_ms: task.not_before_ms - fleet.now_ms,
        };
    }
    if task.not_before_ms > fleet.now_ms {
        return ParkedReason::RetryBackoff {
            not_before_ms: u128::from(task.not_before_ms),
            in_ms: task.not_before_ms - fleet.now_ms,
            attempts: task.attempts,
            last_error: task.last_error.map(str::to_owned),
        };
    }
    let kind = task.kind;
    let largest = fleet.largest[kind.index()];
    if task.units > largest {
        return ParkedReason::LargerThanAnyNode {
            kind: kind.name(),
            units: task.units,
            largest,
        };
    }
    if let Some((level, units_per_ms, per_ms)) = fleet.budgets[kind.index()] {
        if level < task.units {
            return ParkedReason::Budget {
                kind: kind.name(),
                units: task.units,
                level,
                refill_in_ms: refill_ms(level, task.units, units_per_ms, per_ms),
            };
        }
    }
    if let (Some(service), Some((ahead, ahead_service))) = (task.service, &fleet.least_served) {
        if ahead != task.tenant && service > *ahead_service {
            return ParkedReason::TenantShare {
                tenant: task.tenant.to_owned(),
                service,
                ahead: ahead.clone(),
                ahead_service: *ahead_service,
            };
        }
    }
    ParkedReason::Capacity {
        kind: kind.name(),
        units: task.units,
        ahead: task.ahead,
    }
}

/// Milliseconds until a bucket holding `level` whole units, refilled by `units` units every
/// `per_ms` ms, holds `needed`.
fn refill_ms(level: u64, needed: u64, units: u64, per_ms: u64) -> u64 {
    if units == 0 {
        return u64::MAX;
    }
    let missing = needed.saturating_sub(level).saturating_mul(per_ms);
    missing.div_ceil(units)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(units: u64) -> WaitingTask<'static> {
        WaitingTask {
            kind: ResourceKind::Cpu,
            units,
            tenant: "acme",
            service: None,
            not_before_ms: 0,
            attempts: 0,
            last_error: None,
            ahead: 2,
            pending_parents: 0,
        }
    }

    fn fleet() -> FleetState {
        let mut fleet = FleetState {
            now_ms: 10_000,
            live_nodes: 2,
            claiming_nodes: 2,
            ..FleetState::default()
        };
        fleet.largest[ResourceKind::Cpu.index()] = 8;
        fleet
    }

    #[test]
    fn the_first_cause_that_holds_is_the_reason() {
        assert_eq!(
            reason_of(&task(1), &FleetState::default()),
            ParkedReason::NoLiveNode
        );
        let paused = FleetState {
            claiming_nodes: 0,
            ..fleet()
        };
        assert_eq!(
            reason_of(&task(1), &paused),
            ParkedReason::PausedFleet { live_nodes: 2 }
        );
        let backing_off = WaitingTask {
            not_before_ms: 12_500,
            attempts: 1,
            ..task(1)
        };
        assert!(matches!(
            reason_of(&backing_off, &fleet()),
            ParkedReason::RetryBackoff {
                in_ms: 2_500,
                attempts: 1,
                ..
            }
        ));
        // A child waiting for its parents: its instant is never, and the parents say why.
        let child = WaitingTask {
            not_before_ms: u64::MAX >> 1,
            pending_parents: 3,
            ..task(1)
        };
        assert_eq!(
            reason_of(&child, &fleet()),
            ParkedReason::WaitsForParents { pending: 3 }
        );
        let scheduled = WaitingTask {
            not_before_ms: 11_000,
            ..task(1)
        };
        assert_eq!(
            reason_of(&scheduled, &fleet()),
            ParkedReason::Scheduled {
                not_before_ms: 11_000,
                in_ms: 1_000
            }
        );
        assert_eq!(
            reason_of(&task(9), &fleet()),
            ParkedReason::LargerThanAnyNode {
                kind: "cpu",
                units: 9,
                largest: 8
            }
        );
        assert_eq!(
            reason_of(&task(3), &fleet()),
            ParkedReason::Capacity {
                kind: "cpu",
                units: 3,
                ahead: 2
            }
        );
    }

    #[test]
    fn a_budget_that_holds_too_little_says_when_it_will_hold_enough() {
        let mut fleet = fleet();
        // 2 whole units now; 10 units every 1000 ms: 4 more units take 400 ms.
        fleet.budgets[ResourceKind::Cpu.index()] = Some((2, 10, 1_000));
        assert_eq!(
            reason_of(&task(6), &fleet),
            ParkedReason::Budget {
                kind: "cpu",
                units: 6,
                level: 2,
                refill_in_ms: 400
            }
        );
        assert!(matches!(
            reason_of(&task(2), &fleet),
            ParkedReason::Capacity { .. }
        ));
    }

    #[test]
    fn a_tenant_served_more_than_a_waiting_one_waits_for_it() {
        let mut fleet = fleet();
        fleet.least_served = Some(("globex".into(), 3.0));
        let served = WaitingTask {
            service: Some(10.0),
            ..task(1)
        };
        assert!(matches!(
            reason_of(&served, &fleet),
            ParkedReason::TenantShare { ref ahead, .. } if ahead == "globex"
        ));
        let least = WaitingTask {
            tenant: "globex",
            service: Some(3.0),
            ..task(1)
        };
        assert!(matches!(
            reason_of(&least, &fleet),
            ParkedReason::Capacity { .. }
        ));
    }
}
