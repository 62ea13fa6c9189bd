//! Rule 21: a full parking lot sheds its lowest priority first, within `max_queue_depth`
//! and `max_queued_units`.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::tests::{lot_with, ticket};
use super::*;
use crate::domain::{FairShare, QueueOrder, StarvationGuard};

/// 10 VRAM and 10 CPU units, one worker, no starvation guard, these bounds.
fn bounded(depth: usize, max_queued_units: Option<u64>) -> ParkingLot {
    let capacity = crate::domain::Capacity::uniform(10);
    lot_with(
        PoolLimits::new(10, 1)
            .with_capacity(capacity)
            .with_max_queue_depth(depth)
            .with_max_queued_units(max_queued_units)
            .with_starvation(StarvationGuard::disabled()),
    )
}

fn low(id: TaskId, units: u32) -> Ticket {
    ticket(id, Priority::Low, units)
}

fn normal(id: TaskId, units: u32) -> Ticket {
    ticket(id, Priority::Normal, units)
}

fn high(id: TaskId, units: u32) -> Ticket {
    ticket(id, Priority::High, units)
}

fn cpu(ticket: Ticket) -> Ticket {
    Ticket {
        cost: ResourceCost::cpu(ticket.cost.units),
        ..ticket
    }
}

#[test]
fn at_the_depth_a_higher_priority_takes_the_lowest_ranked_place() {
    let mut lot = bounded(2, None);
    assert_eq!(lot.admit(low(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(low(2, 1), 0), Admit::Park);
    assert_eq!(lot.admit(normal(3, 1), 0), Admit::Park);
    assert_eq!(
        lot.admit(high(4, 1), 0),
        Admit::ParkShedding {
            shed: vec![2],
            started: vec![]
        }
    );
    assert_eq!(lot.state(2), None);
    lot.check_invariants().expect("invariants");
    // An equal priority sheds nothing: the Normal newcomer is refused, not task 3.
    let full = Admit::Reject(Rejection::QueueFull { max_queue_depth: 2 });
    assert_eq!(lot.admit(normal(5, 1), 0), full);
    assert_eq!(lot.admit(low(6, 1), 0), full);
    assert_eq!(lot.state(3), Some(WakeState::Parked));
    // The worker frees: the best-ranked starts, as ever.
    assert_eq!(lot.complete(1, 1).unwrap(), vec![4]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn at_the_unit_bound_tickets_of_the_kind_are_shed_until_the_units_fit() {
    let mut lot = bounded(100, Some(10));
    assert_eq!(lot.admit(normal(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(low(2, 4), 0), Admit::Park);
    assert_eq!(lot.admit(cpu(low(3, 9)), 0), Admit::Park); // another kind, its own bound
    assert_eq!(lot.admit(low(4, 4), 0), Admit::Park);
    assert_eq!(lot.admit(normal(5, 2), 0), Admit::Park);
    assert_eq!(lot.queue.units(ResourceKind::GpuVram), 10);
    // 5 more VRAM units: the Low VRAM tickets go, lowest-ranked (the youngest) first; the
    // Low CPU ticket frees none of the units short, and stays.
    assert_eq!(
        lot.admit(high(6, 5), 0),
        Admit::ParkShedding {
            shed: vec![4, 2],
            started: vec![]
        }
    );
    assert_eq!(lot.queue.units(ResourceKind::GpuVram), 7);
    assert_eq!(lot.state(3), Some(WakeState::Parked));
    lot.check_invariants().expect("invariants");
}

#[test]
fn nothing_is_shed_when_the_lower_priorities_cannot_make_room() {
    let mut lot = bounded(100, Some(10));
    assert_eq!(lot.admit(normal(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 6), 0), Admit::Park);
    assert_eq!(lot.admit(low(3, 2), 0), Admit::Park);
    // 3 units short, 2 of a lower priority: Task 3 keeps its place.
    assert_eq!(
        lot.admit(normal(4, 5), 0),
        Admit::Reject(Rejection::QueueUnitsFull {
            kind: ResourceKind::GpuVram,
            queued: 8,
            needed: 5,
            max_queued_units: 10
        })
    );
    assert_eq!(lot.state(3), Some(WakeState::Parked));
    lot.check_invariants().expect("invariants");
    // More than the bound itself can never park, whatever it could shed.
    let mut lot = bounded(100, Some(4));
    assert_eq!(lot.admit(normal(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(low(2, 1), 0), Admit::Park);
    let refused = lot.admit(high(3, 5), 0);
    assert!(
        matches!(
            refused,
            Admit::Reject(Rejection::QueueUnitsFull { needed: 5, .. })
        ),
        "{refused:?}"
    );
    assert_eq!(lot.state(2), Some(WakeState::Parked));
    assert_eq!(
        PoolError::from(Rejection::QueueFull { max_queue_depth: 1 }),
        PoolError::QueueFull
    );
    let units_full = Rejection::QueueUnitsFull {
        kind: ResourceKind::GpuVram,
        queued: 8,
        needed: 5,
        max_queued_units: 10,
    };
    assert!(
        units_full.to_string().contains("max_queued_units of 10"),
        "{units_full}"
    );
    assert_eq!(PoolError::from(units_full), PoolError::QueueFull);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_newcomer_that_fits_starts_whatever_the_queue_holds() {
    let mut lot = lot_with(
        PoolLimits::new(10, 2)
            .with_max_queue_depth(1)
            .with_max_queued_units(Some(4))
            .with_starvation(StarvationGuard::disabled()),
    );
    assert_eq!(lot.admit(normal(1, 8), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 4), 0), Admit::Park);
    assert_eq!(lot.admit(low(3, 2), 0), Admit::Start);
    lot.check_invariants().expect("invariants");
}

#[test]
fn shedding_the_reservation_starts_what_it_held_back() {
    let guard = StarvationGuard {
        max_park_ms: Some(10),
        max_skips: None,
    };
    let mut lot = lot_with(
        PoolLimits::new(10, 4)
            .with_max_queued_units(Some(10))
            .with_starvation(guard),
    );
    assert_eq!(lot.admit(normal(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 10), 0), Admit::Park);
    assert!(lot.tick(10).started.is_empty());
    assert_eq!(lot.reservation(), Some(2));
    // A Low CPU ticket fits the free CPU but ranks below the reservation: it waits.
    assert_eq!(lot.admit(cpu(low(3, 1)), 10), Admit::Park);
    // A High VRAM newcomer needs the VRAM queue's room: the reservation is shed, and the
    // CPU ticket it held back starts.
    assert_eq!(
        lot.admit(high(4, 5), 11),
        Admit::ParkShedding {
            shed: vec![2],
            started: vec![3]
        }
    );
    assert_eq!(lot.reservation(), None);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_newcomer_that_will_not_wait_sheds_nothing() {
    let mut lot = bounded(1, None);
    assert_eq!(lot.admit(low(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(low(2, 1), 0), Admit::Park);
    assert_eq!(
        lot.admit_without_shedding(high(3, 1), true, 0),
        Admit::Reject(Rejection::QueueFull { max_queue_depth: 1 })
    );
    assert_eq!(lot.state(2), Some(WakeState::Parked));
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_ticket_that_comes_back_parks_past_the_bounds_and_newcomers_shed_it_back_within() {
    let mut lot = bounded(2, Some(6));
    assert_eq!(lot.admit(normal(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(low(2, 3), 0), Admit::Park);
    assert_eq!(lot.admit(low(3, 3), 0), Admit::Park);
    // A retried run comes back after its backoff, and a restored one: both park, past
    // both bounds, and are never lost.
    lot.park_until(normal(4, 4), 10, 0).unwrap();
    assert!(lot.tick(10).started.is_empty());
    lot.restore(low(5, 1), 10).unwrap();
    assert_eq!(lot.parked_len(), 4);
    assert_eq!(lot.queue.units(ResourceKind::GpuVram), 11);
    lot.check_invariants().expect("invariants");
    // A High newcomer sheds until the queue is within both bounds again: 3 tickets to get
    // to a depth of 2, by then 7 of the 8 units over (11 + 2 - 6) are gone too.
    assert_eq!(
        lot.admit(high(6, 2), 11),
        Admit::ParkShedding {
            shed: vec![5, 3, 2],
            started: vec![]
        }
    );
    assert_eq!(lot.parked_len(), 2);
    assert_eq!(lot.queue.units(ResourceKind::GpuVram), 6);
    lot.check_invariants().expect("invariants");
}

#[test]
fn shedding_a_tenants_last_parked_ticket_keeps_its_newcomer_behind_the_reservation() {
    let guard = StarvationGuard {
        max_park_ms: Some(10),
        max_skips: None,
    };
    let mut lot = lot_with(
        PoolLimits::new(10, 4)
            .with_capacity(crate::domain::Capacity::uniform(10))
            .with_max_queue_depth(2)
            .with_starvation(guard)
            .with_fair_share(Some(FairShare::MaxUnitsPerTenant(7))),
    );
    let of = |tenant, ticket: Ticket| Ticket { tenant, ..ticket };
    assert_eq!(lot.admit(of(1, cpu(normal(1, 6))), 0), Admit::Start);
    // Tenant 0's High CPU ticket waits for the CPU; tenant 0 started last before tenant 2.
    assert_eq!(lot.admit(of(0, cpu(high(2, 5))), 0), Admit::Park);
    assert_eq!(lot.admit(of(0, low(3, 1)), 0), Admit::Start);
    assert_eq!(lot.admit(of(2, low(4, 1)), 0), Admit::Start);
    assert!(lot.complete(3, 0).unwrap().is_empty());
    assert!(lot.tick(10).started.is_empty());
    assert_eq!(lot.reservation(), Some(2));
    // Tenant 2's Low ticket waits behind the reservation; its tenant then runs nothing, so
    // this ticket is all that keeps the book's record of tenant 2's last start.
    assert_eq!(lot.admit(of(2, low(5, 1)), 10), Admit::Park);
    assert!(lot.complete(4, 10).unwrap().is_empty());
    // A High newcomer of tenant 2 fits the VRAM but ranks behind the reservation (its
    // tenant started more recently). The depth is reached: it sheds task 5, its tenant's
    // last parked ticket, and must keep its place behind the reservation: had the book
    // forgotten tenant 2 first, the newcomer would rank ahead of the reservation and start,
    // a ticket shed for a place it did not need.
    assert_eq!(
        lot.admit(of(2, high(6, 1)), 10),
        Admit::ParkShedding {
            shed: vec![5],
            started: vec![]
        }
    );
    assert_eq!(lot.state(6), Some(WakeState::Parked));
    assert_eq!(lot.reservation(), Some(2));
    lot.check_invariants().expect("invariants");
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        priority: usize,
        cpu: bool,
        units: u32,
        deadline_in: Option<u64>,
        permit: bool,
        tenant: u64,
    },
    Complete(usize),
    Cancel(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            0..4usize,
            any::<bool>(),
            0..=9u32,
            prop::option::weighted(0.4, 1..200u64),
            prop::bool::weighted(0.2),
            0..3u64,
        )
            .prop_map(|(priority, cpu, units, deadline_in, permit, tenant)| Op::Admit {
                priority,
                cpu,
                units,
                deadline_in,
                permit,
                tenant,
            }),
        3 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (1..50u64).prop_map(Op::Advance),
    ]
}

/// How a ticket ended, as the test saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Completed,
    Expired,
    Cancelled,
    Rejected,
    Shed,
    Drained,
}

/// The test's own books: each ticket, where it is, how it ended.
#[derive(Default)]
struct Model {
    tickets: BTreeMap<TaskId, Ticket>,
    parked: BTreeSet<TaskId>,
    running: BTreeSet<TaskId>,
    ends: BTreeMap<TaskId, Vec<End>>,
}

impl Model {
    fn end(&mut self, id: TaskId, end: End) {
        self.ends.entry(id).or_default().push(end);
    }

    fn start(&mut self, started: &[TaskId]) -> Result<(), TestCaseError> {
        for id in started {
            prop_assert!(self.parked.remove(id), "started task {} was not parked", id);
            prop_assert!(self.running.insert(*id));
        }
        Ok(())
    }

    fn parked_units(&self, kind: ResourceKind, below: Option<Priority>) -> u64 {
        self.parked
            .iter()
            .map(|id| &self.tickets[id])
            .filter(|t| t.cost.kind == kind && below.is_none_or(|p| t.priority < p))
            .map(|t| u64::from(t.cost.units))
            .sum()
    }

    fn parked_below(&self, priority: Priority) -> usize {
        self.parked
            .iter()
            .filter(|id| self.tickets[id].priority < priority)
            .count()
    }
}

/// Checks an admission's answer against the model as it was before the admission.
fn check_admit(
    lot: &ParkingLot,
    model: &mut Model,
    ranks_before: &BTreeMap<TaskId, RankKey>,
    newcomer: Ticket,
    answer: Admit,
) -> Result<(), TestCaseError> {
    let limits = *lot.limits();
    let (id, kind, needed) = (newcomer.id, newcomer.cost.kind, newcomer.cost.units);
    let bound = limits.max_queued_units.unwrap_or(u64::MAX);
    let units_over = (model.parked_units(kind, None) + u64::from(needed)).saturating_sub(bound);
    let depth_over = (model.parked.len() + 1).saturating_sub(limits.max_queue_depth);
    match answer {
        Admit::Start => prop_assert!(model.running.insert(id)),
        Admit::StartWith(also) => {
            prop_assert!(model.running.insert(id));
            model.start(&also)?;
        }
        Admit::Park => {
            prop_assert_eq!((units_over, depth_over), (0, 0), "parked past a bound");
            model.parked.insert(id);
        }
        Admit::ParkShedding { shed, started } => {
            prop_assert!(!shed.is_empty());
            prop_assert!(units_over > 0 || depth_over > 0, "shed with room left");
            for gone in &shed {
                prop_assert!(
                    model.parked.remove(gone),
                    "shed task {} was not parked",
                    gone
                );
                prop_assert!(
                    model.tickets[gone].priority < newcomer.priority,
                    "task {} shed for a newcomer of no higher priority",
                    gone
                );
                prop_assert_eq!(lot.state(*gone), None);
                model.end(*gone, End::Shed);
            }
            // Lowest-ranked first: a ticket of the newcomer's kind shed for its units ranks
            // below every ticket of that kind and a lower priority kept; any other shed
            // ticket (shed for the depth) ranks below every ticket of a lower priority kept.
            for gone in &shed {
                let gone_rank = ranks_before[gone];
                let gone_kind = model.tickets[gone].cost.kind;
                for kept in &model.parked {
                    let ticket = &model.tickets[kept];
                    let compared = ticket.priority < newcomer.priority
                        && (units_over == 0 || gone_kind != kind || ticket.cost.kind == kind);
                    prop_assert!(
                        !compared || ranks_before[kept].ranks_ahead_of(&gone_rank),
                        "task {} shed while lower-ranked task {} stays",
                        gone,
                        kept
                    );
                }
            }
            // Shedding frees only places in the queue, never what held the newcomer back.
            prop_assert!(
                !started.contains(&id),
                "task {} started after shedding {:?} for a place it did not need",
                id,
                shed
            );
            model.parked.insert(id);
            model.start(&started)?;
        }
        Admit::Expire => model.end(id, End::Expired),
        Admit::Reject(Rejection::QueueFull { .. } | Rejection::QueueUnitsFull { .. }) => {
            let could_make_room = u64::from(needed) <= bound
                && model.parked_units(kind, Some(newcomer.priority)) >= units_over
                && model.parked_below(newcomer.priority) >= depth_over;
            prop_assert!(
                !could_make_room,
                "task {} refused though the lower priorities could make room",
                id
            );
            model.end(id, End::Rejected);
        }
        Admit::Reject(_) => model.end(id, End::Rejected),
    }
    Ok(())
}

fn run(lot: &mut ParkingLot, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    let mut now = 1_000;
    for (n, op) in ops.iter().enumerate() {
        let ranks_before: BTreeMap<TaskId, RankKey> = model
            .parked
            .iter()
            .filter_map(|&id| Some((id, lot.rank(id)?)))
            .collect();
        match *op {
            Op::Admit {
                priority,
                cpu,
                units,
                deadline_in,
                permit,
                tenant,
            } => {
                let id = n as TaskId + 1;
                let kind = if cpu {
                    ResourceKind::Cpu
                } else {
                    ResourceKind::GpuVram
                };
                let ticket = Ticket {
                    cost: ResourceCost::new(kind, units),
                    deadline_ms: deadline_in.map(|d| now + d),
                    created_at_ms: now,
                    tenant,
                    ..ticket(id, Priority::ALL[priority], units)
                };
                model.tickets.insert(id, ticket);
                let answer = if permit {
                    lot.admit_permit(ticket, now)
                } else {
                    lot.admit(ticket, now)
                };
                check_admit(lot, &mut model, &ranks_before, ticket, answer)?;
            }
            Op::Complete(pick) if !model.running.is_empty() => {
                let id = *model
                    .running
                    .iter()
                    .nth(pick % model.running.len())
                    .unwrap();
                model.running.remove(&id);
                model.end(id, End::Completed);
                let started = lot.complete(id, now).expect("running");
                model.start(&started)?;
            }
            Op::Cancel(pick) if !model.parked.is_empty() => {
                let id = *model.parked.iter().nth(pick % model.parked.len()).unwrap();
                model.parked.remove(&id);
                model.end(id, End::Cancelled);
                let Ok(Cancel::Parked { started }) = lot.cancel(id, now) else {
                    return Err(TestCaseError::fail(format!(
                        "parked task {id} not cancelled"
                    )));
                };
                model.start(&started)?;
            }
            Op::Advance(ms) => {
                now += ms;
                let tick = lot.tick(now);
                for id in &tick.expired {
                    prop_assert!(
                        model.parked.remove(id),
                        "expired task {} was not parked",
                        id
                    );
                    model.end(*id, End::Expired);
                }
                model.start(&tick.started)?;
            }
            _ => {}
        }
        if let Err(broken) = lot.check_invariants() {
            return Err(TestCaseError::fail(format!("after {op:?}: {broken}")));
        }
        let limits = lot.limits();
        prop_assert_eq!(lot.parked_len(), model.parked.len());
        prop_assert!(model.parked.len() <= limits.max_queue_depth);
        for kind in [ResourceKind::GpuVram, ResourceKind::Cpu] {
            prop_assert!(
                model.parked_units(kind, None) <= limits.max_queued_units.unwrap_or(u64::MAX)
            );
        }
    }
    // The end: what is parked is handed back, what runs completes; then every ticket ended
    // exactly once, a shed one included.
    for id in lot.take_parked() {
        prop_assert!(model.parked.remove(&id));
        model.end(id, End::Drained);
    }
    for id in std::mem::take(&mut model.running) {
        lot.complete(id, now).expect("running");
        model.end(id, End::Completed);
    }
    for id in model.tickets.keys() {
        let ends = model.ends.get(id).map_or(&[][..], Vec::as_slice);
        prop_assert_eq!(ends.len(), 1, "task {} ended {:?}", id, ends);
    }
    Ok(())
}

proptest! {
    /// Random admissions (tasks and permits, two kinds, four priorities), completions,
    /// cancellations and expiries under both bounds, with the starvation guard, backfill,
    /// and a fair share or not, in either order: the bounds hold after every event, only
    /// strictly lower priorities are shed (lowest-ranked first, and only when needed), a
    /// refusal happens only when the lower priorities could not make room, and every
    /// ticket ends exactly once.
    #[test]
    fn shedding_keeps_the_bounds_and_ends_every_ticket_once(
        depth in 1..7usize,
        max_queued_units in prop::option::of(1..16u64),
        fair in any::<bool>(),
        deadline_order in any::<bool>(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let capacity = crate::domain::Capacity::uniform(0)
            .with(ResourceKind::GpuVram, 10)
            .with(ResourceKind::Cpu, 6);
        let order = if deadline_order { QueueOrder::Deadline } else { QueueOrder::Fifo };
        let mut lot = lot_with(
            PoolLimits::new(10, 2)
                .with_capacity(capacity)
                .with_max_queue_depth(depth)
                .with_max_queued_units(max_queued_units)
                .with_starvation(StarvationGuard { max_park_ms: Some(40), max_skips: Some(3) })
                .with_fair_share(fair.then_some(FairShare::MaxUnitsPerTenant(7)))
                .with_order(order),
        );
        run(&mut lot, &ops)?;
    }
}
