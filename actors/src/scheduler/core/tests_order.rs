//! Rule 20: the deadline order within a priority, and the fifo order left exactly as it was.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::tests::{lot_with, ticket};
use super::*;
use crate::domain::{FairShare, QueueOrder, StarvationGuard};

/// A Normal ticket of `units` VRAM with this deadline, created at its id.
fn due(id: TaskId, units: u32, deadline_ms: Option<u64>) -> Ticket {
    Ticket {
        deadline_ms,
        ..ticket(id, Priority::Normal, units)
    }
}

/// 10 VRAM units, 8 workers, no starvation guard, in `order`.
fn lot_in(order: QueueOrder) -> ParkingLot {
    lot_with(
        PoolLimits::new(10, 8)
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard::disabled())
            .with_order(order),
    )
}

#[test]
fn earliest_deadline_starts_first_then_no_deadline_then_admission_order() {
    let mut lot = lot_in(QueueOrder::Deadline);
    assert_eq!(lot.admit(due(1, 10, None), 0), Admit::Start);
    for (id, deadline) in [
        (2, None),
        (3, Some(900)),
        (4, Some(500)),
        (5, None),
        (6, Some(500)),
    ] {
        assert_eq!(lot.admit(due(id, 10, deadline), 0), Admit::Park);
    }
    lot.check_invariants().expect("invariants");
    let mut order = Vec::new();
    let mut running = 1;
    for now in 1..=5 {
        let started = lot.complete(running, now).unwrap();
        assert_eq!(started.len(), 1);
        running = started[0];
        order.push(running);
        lot.check_invariants().expect("invariants");
    }
    // 500 (admitted 4th, then 6th), 900, then the two without a deadline by admission.
    assert_eq!(order, vec![4, 6, 3, 2, 5]);
}

#[test]
fn the_fifo_order_ignores_deadlines_and_keeps_the_old_key() {
    let mut lot = lot_in(QueueOrder::Fifo);
    assert_eq!(lot.admit(due(1, 10, None), 0), Admit::Start);
    for (id, deadline) in [(2, None), (3, Some(900)), (4, Some(500))] {
        assert_eq!(lot.admit(due(id, 10, deadline), 0), Admit::Park);
        assert_eq!(lot.rank(id), Some(RankKey::new(Priority::Normal, id, id)));
    }
    assert_eq!(lot.complete(1, 1).unwrap(), vec![2]);
    assert_eq!(lot.complete(2, 2).unwrap(), vec![3]);
    assert_eq!(lot.complete(3, 3).unwrap(), vec![4]);
}

#[test]
fn priority_still_comes_before_the_deadline() {
    let mut lot = lot_in(QueueOrder::Deadline);
    assert_eq!(lot.admit(due(1, 10, None), 0), Admit::Start);
    assert_eq!(lot.admit(due(2, 10, Some(100)), 0), Admit::Park);
    let high = Ticket {
        priority: Priority::High,
        ..due(3, 10, None)
    };
    assert_eq!(lot.admit(high, 0), Admit::Park);
    assert_eq!(lot.complete(1, 1).unwrap(), vec![3]);
}

#[test]
fn skip_ahead_passes_an_early_deadline_that_does_not_fit() {
    let mut lot = lot_in(QueueOrder::Deadline);
    assert_eq!(lot.admit(due(1, 6, None), 0), Admit::Start);
    assert_eq!(lot.admit(due(2, 7, Some(100)), 0), Admit::Park); // 6 + 7 > 10
    assert_eq!(lot.admit(due(3, 4, Some(900)), 0), Admit::Start); // 4 fits, is not blocked
    assert_eq!(lot.admit(due(4, 3, Some(50)), 0), Admit::Park);
    // 4 free units: task 2 (deadline 100) does not fit them, task 4 (deadline 50) does.
    assert_eq!(lot.complete(3, 1).unwrap(), vec![4]);
    assert_eq!(lot.complete(1, 2).unwrap(), vec![2]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn the_starvation_guard_ages_by_time_parked_not_by_deadline() {
    let guard = StarvationGuard {
        max_park_ms: Some(100),
        max_skips: None,
    };
    let mut lot = lot_with(
        PoolLimits::new(10, 8)
            .with_starvation(guard)
            .with_order(QueueOrder::Deadline),
    );
    assert_eq!(lot.admit(due(1, 6, None), 0), Admit::Start);
    // A large task without a deadline parks first and ranks last among Normal tasks.
    assert_eq!(lot.admit(due(2, 10, None), 0), Admit::Park);
    assert_eq!(lot.admit(due(3, 5, Some(10_000)), 50), Admit::Park);
    // At 100 task 2 has waited 100 ms: it is the reservation, though task 3 outranks it.
    assert!(lot.tick(100).started.is_empty());
    assert_eq!(lot.reservation(), Some(2));
    assert_eq!(lot.state(3), Some(WakeState::Parked));
    // Task 3 ranks ahead of the reservation, so it may still start when units free up.
    assert_eq!(lot.complete(1, 120).unwrap(), vec![3]);
    assert_eq!(lot.complete(3, 130).unwrap(), vec![2]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_fair_share_ranks_by_tenant_first_then_by_deadline() {
    let mut lot = lot_with(
        PoolLimits::new(10, 8)
            .with_starvation(StarvationGuard::disabled())
            .with_fair_share(Some(FairShare::MaxUnitsPerTenant(10)))
            .with_order(QueueOrder::Deadline),
    );
    let of = |tenant, id, deadline| Ticket {
        tenant,
        ..due(id, 5, deadline)
    };
    assert_eq!(lot.admit(of(1, 1, None), 0), Admit::Start);
    assert_eq!(lot.admit(of(1, 2, None), 0), Admit::Start);
    // Tenant 1 holds 10; tenant 2 holds nothing, so its task goes first whatever the
    // deadlines; among tenant 1's own, the earlier deadline.
    assert_eq!(lot.admit(of(1, 3, Some(900)), 0), Admit::Park);
    assert_eq!(lot.admit(of(1, 4, Some(100)), 0), Admit::Park);
    assert_eq!(lot.admit(of(2, 5, Some(5_000)), 0), Admit::Park);
    assert_eq!(lot.complete(1, 1).unwrap(), vec![5]);
    assert_eq!(lot.complete(2, 2).unwrap(), vec![4]);
    assert_eq!(lot.complete(5, 3).unwrap(), vec![3]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_sleeper_keeps_its_deadline_rank_when_it_wakes() {
    let mut lot = lot_in(QueueOrder::Deadline);
    assert_eq!(lot.admit(due(1, 10, None), 0), Admit::Start);
    assert_eq!(lot.admit(due(2, 10, Some(9_000)), 0), Admit::Park);
    lot.park_until(due(3, 10, Some(5_000)), 50, 0).unwrap();
    assert!(lot.tick(50).started.is_empty());
    assert_eq!(lot.complete(1, 60).unwrap(), vec![3]);
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        priority: usize,
        units: u32,
        deadline_in: Option<u64>,
        timeout_ms: Option<u64>,
    },
    Complete(usize),
    Cancel(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (
            0..3usize,
            1..=10u32,
            prop::option::weighted(0.7, 1..400u64),
            prop::option::weighted(0.3, 1..200u64),
        )
            .prop_map(|(priority, units, deadline_in, timeout_ms)| Op::Admit {
                priority,
                units,
                deadline_in,
                timeout_ms,
            }),
        3 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (1..60u64).prop_map(Op::Advance),
    ]
}

/// What the lot answered an event: the newcomer's answer (if any) and the ids started.
type Answer = (Option<Admit>, Vec<TaskId>);

/// Runs `ops` on `lot`, checking the invariants (and with `check_order`, the order among
/// the tickets that start) after each event, and returns every answer.
fn run(lot: &mut ParkingLot, ops: &[Op], check_order: bool) -> Result<Vec<Answer>, TestCaseError> {
    let mut now = 1_000u64;
    let mut next_id = 1;
    let mut running: Vec<TaskId> = Vec::new();
    // Ordered: a cancellation picks among the parked by position, the same in every run.
    let mut tickets: BTreeMap<TaskId, Ticket> = BTreeMap::new();
    let mut answers = Vec::new();
    for op in ops {
        let parked_before: Vec<TaskId> = tickets
            .keys()
            .copied()
            .filter(|&id| lot.state(id).is_some_and(|s| s != WakeState::Running))
            .collect();
        let (admit, started) = match *op {
            Op::Admit {
                priority,
                units,
                deadline_in,
                timeout_ms,
            } => {
                let id = next_id;
                next_id += 1;
                let ticket = Ticket {
                    deadline_ms: deadline_in.map(|d| now + d),
                    timeout_ms,
                    created_at_ms: now,
                    ..super::tests::ticket(id, Priority::ALL[priority], units)
                };
                tickets.insert(id, ticket);
                let admit = lot.admit(ticket, now);
                if admit == Admit::Start {
                    running.push(id);
                }
                (Some(admit), Vec::new())
            }
            Op::Complete(pick) if !running.is_empty() => {
                let id = running.remove(pick % running.len());
                (None, lot.complete(id, now).expect("running"))
            }
            Op::Cancel(pick) if !parked_before.is_empty() => {
                let id = parked_before[pick % parked_before.len()];
                match lot.cancel(id, now).expect("parked") {
                    Cancel::Parked { started } => (None, started),
                    Cancel::Running => (None, Vec::new()),
                }
            }
            Op::Advance(ms) => {
                now += ms;
                (None, lot.tick(now).started)
            }
            _ => (None, Vec::new()),
        };
        running.extend(&started);
        let mut began = started.clone();
        if admit == Some(Admit::Start) {
            began.push(next_id - 1);
        }
        if let Err(broken) = lot.check_invariants() {
            return Err(TestCaseError::fail(format!("after {op:?}: {broken}")));
        }
        if check_order {
            check_same_priority_order(lot, &tickets, &began)?;
        }
        answers.push((admit, started));
    }
    Ok(answers)
}

/// No ticket left parked outranks (same priority, kind, and at most the units) a ticket
/// that started in this event: the started one took a place the better one would have fit.
fn check_same_priority_order(
    lot: &ParkingLot,
    tickets: &BTreeMap<TaskId, Ticket>,
    started: &[TaskId],
) -> Result<(), TestCaseError> {
    let ordered_by_deadline = lot.limits().order == QueueOrder::Deadline;
    let key = |ticket: &Ticket| {
        let due = ticket.deadline_ms.filter(|_| ordered_by_deadline);
        RankKey::by_deadline(ticket.priority, due, ticket.created_at_ms, ticket.id)
    };
    for id in started {
        let began = &tickets[id];
        for (waiting, ticket) in tickets.iter() {
            let Some(rank) = lot.rank(*waiting) else {
                continue;
            };
            prop_assert_eq!(rank, key(ticket), "the rank is the order's key");
            let outranks = ticket.priority == began.priority
                && ticket.cost.units <= began.cost.units
                && key(ticket).ranks_ahead_of(&key(began));
            prop_assert!(
                !outranks,
                "task {} started while task {} stays parked: {:?} vs {:?}",
                id,
                waiting,
                began,
                ticket
            );
        }
    }
    Ok(())
}

/// `ops` with every deadline replaced by `deadline` (far beyond any `now` the ops reach).
fn with_one_deadline(ops: &[Op], deadline: Option<u64>) -> Vec<Op> {
    ops.iter()
        .map(|op| match *op {
            Op::Admit {
                priority,
                units,
                timeout_ms,
                ..
            } => Op::Admit {
                priority,
                units,
                deadline_in: deadline,
                timeout_ms,
            },
            ref other => other.clone(),
        })
        .collect()
}

proptest! {
    /// Without a starvation guard or a fair share every start is the best-ranked ticket
    /// that fits, so among tickets of one priority the order's key decides: the deadline
    /// under the deadline order, admission under fifo.
    #[test]
    fn within_a_priority_starts_follow_the_order(
        deadline_order in any::<bool>(),
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let order = if deadline_order { QueueOrder::Deadline } else { QueueOrder::Fifo };
        let mut lot = lot_with(
            PoolLimits::new(10, 3)
                .with_starvation(StarvationGuard::disabled())
                .with_backfill(false)
                .with_order(order),
        );
        run(&mut lot, &ops, true)?;
    }

    /// The deadline order changes nothing where deadlines cannot tell tickets apart (none
    /// has one, or all have the same), with every other rule on: it is the fifo order then.
    #[test]
    fn without_distinct_deadlines_the_deadline_order_is_fifo(
        ops in prop::collection::vec(op(), 1..100),
        same_deadline in any::<bool>(),
        fair in any::<bool>(),
    ) {
        let ops = with_one_deadline(&ops, same_deadline.then_some(1_000_000));
        let limits = PoolLimits::new(10, 3)
            .with_max_queue_depth(12)
            .with_starvation(StarvationGuard { max_park_ms: Some(80), max_skips: Some(4) })
            .with_fair_share(fair.then_some(FairShare::MaxUnitsPerTenant(7)));
        let mut fifo = lot_with(limits);
        let mut by_deadline = lot_with(limits.with_order(QueueOrder::Deadline));
        let fifo_answers = run(&mut fifo, &ops, false)?;
        let deadline_answers = run(&mut by_deadline, &ops, false)?;
        prop_assert_eq!(fifo_answers, deadline_answers);
    }

    /// With every rule on (starvation guard, backfill, fair share, bounded queue), the
    /// deadline order keeps every invariant of the core.
    #[test]
    fn the_deadline_order_keeps_every_invariant(
        ops in prop::collection::vec(op(), 1..120),
        fair in any::<bool>(),
    ) {
        let mut lot = lot_with(
            PoolLimits::new(10, 3)
                .with_max_queue_depth(10)
                .with_starvation(StarvationGuard { max_park_ms: Some(60), max_skips: Some(3) })
                .with_fair_share(fair.then_some(FairShare::MaxUnitsPerTenant(6)))
                .with_order(QueueOrder::Deadline),
        );
        run(&mut lot, &ops, false)?;
    }
}
