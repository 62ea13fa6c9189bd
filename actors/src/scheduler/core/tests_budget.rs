//! Rule 15: budgets, kinds whose units refill with time. One test per part of the rule,
//! then property tests of the bound and of progress.

use proptest::prelude::*;

use super::tests::lot_with;
use super::*;
use crate::domain::{Budget, StarvationGuard};

const IO: ResourceKind = ResourceKind::Io;

/// An I/O ticket (the budgeted kind in these tests).
fn io(id: TaskId, priority: Priority, units: u32) -> Ticket {
    Ticket {
        id,
        priority,
        cost: ResourceCost::io(units),
        created_at_ms: id,
        deadline_ms: None,
        tenant: 0,
        timeout_ms: None,
        also: Default::default(),
    }
}

fn normal_io(id: TaskId, units: u32) -> Ticket {
    io(id, Priority::Normal, units)
}

/// 8 workers; I/O refills 10 units a second (one every 100 ms), burst 10.
fn budget_lot(budget: Budget) -> ParkingLot {
    lot_with(
        PoolLimits::new(10, 8)
            .with_max_queue_depth(1_000)
            .with_starvation(StarvationGuard::disabled())
            .with_budget(IO, budget),
    )
}

fn ten_a_second() -> Budget {
    Budget::new(10, std::time::Duration::from_secs(1))
}

#[test]
fn a_start_spends_units_that_the_end_of_the_task_does_not_give_back() {
    let mut lot = budget_lot(ten_a_second());
    assert_eq!(lot.admit(normal_io(1, 6), 0), Admit::Start);
    assert_eq!(lot.budget_level(IO), Some(4));
    assert_eq!(
        lot.used(IO),
        0,
        "a budgeted kind holds nothing while it runs"
    );
    assert_eq!(lot.admit(normal_io(2, 6), 0), Admit::Park);
    assert_eq!(
        lot.complete(1, 10).unwrap(),
        Vec::<TaskId>::new(),
        "ending gives nothing back"
    );
    assert_eq!(lot.budget_level(IO), Some(4));
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_parked_task_starts_at_the_instant_its_units_have_refilled() {
    let mut lot = budget_lot(ten_a_second());
    assert_eq!(lot.admit(normal_io(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(normal_io(2, 3), 0), Admit::Park);
    assert_eq!(lot.next_wakeup(), Some(300), "three units: 300 ms");
    assert_eq!(lot.budget_ready_at(2), Some(300));
    assert_eq!(lot.tick(299).started, Vec::<TaskId>::new());
    assert_eq!(lot.tick(300).started, vec![2]);
    assert_eq!(lot.next_wakeup(), None, "nothing waits");
    lot.check_invariants().expect("invariants");
}

#[test]
fn skip_ahead_and_priorities_hold_within_a_budget() {
    let mut lot = budget_lot(ten_a_second());
    assert_eq!(lot.admit(normal_io(1, 8), 0), Admit::Start);
    // 2 left: the low-priority 5 and the high-priority 4 both wait, the 1 starts.
    assert_eq!(lot.admit(io(2, Priority::Low, 5), 0), Admit::Park);
    assert_eq!(lot.admit(io(3, Priority::High, 4), 0), Admit::Park);
    assert_eq!(lot.admit(normal_io(4, 1), 0), Admit::Start);
    // The smallest cost above the level (1) is 4: 300 ms.
    assert_eq!(lot.next_wakeup(), Some(300));
    assert_eq!(lot.tick(300).started, vec![3], "the higher priority first");
    assert_eq!(lot.next_wakeup(), Some(800), "5 units from 0");
    assert_eq!(lot.tick(800).started, vec![2]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_task_larger_than_the_burst_is_refused_at_once() {
    let mut lot = budget_lot(ten_a_second());
    assert!(matches!(
        lot.admit(normal_io(1, 11), 0),
        Admit::Reject(Rejection::InsufficientResources {
            needed: 11,
            capacity: 10,
            ..
        })
    ));
}

#[test]
fn given_back_units_let_the_next_task_start_at_once() {
    let mut lot = budget_lot(ten_a_second());
    assert_eq!(lot.admit(normal_io(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(normal_io(2, 4), 0), Admit::Park);
    assert_eq!(lot.spent_by(1), 10);
    // Task 1 used 3 of its 10: 7 come back, and task 2 starts.
    assert_eq!(lot.give_back(1, 7, 10).unwrap(), vec![2]);
    assert_eq!(lot.budget_level(IO), Some(3));
    assert_eq!(lot.give_back(1, 7, 10).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.budget_level(IO), Some(6), "the 3 it still had spent");
    assert_eq!(lot.spent_by(1), 0);
    assert_eq!(lot.give_back(1, 7, 10).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.budget_level(IO), Some(6), "only what it spent");
    assert!(lot.give_back(99, 1, 10).is_err(), "not running");
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_start_cap_limits_starts_whatever_their_units() {
    let budget = ten_a_second().with_max_starts(2, std::time::Duration::from_secs(1));
    let mut lot = budget_lot(budget);
    assert_eq!(lot.admit(normal_io(1, 1), 0), Admit::Start);
    assert_eq!(lot.admit(normal_io(2, 0), 0), Admit::Start);
    assert_eq!(
        lot.budget_level(IO),
        Some(8),
        "a start of no units costs one"
    );
    assert_eq!(lot.admit(normal_io(3, 1), 0), Admit::Park);
    assert_eq!(lot.next_wakeup(), Some(500), "one start every 500 ms");
    assert_eq!(lot.tick(500).started, vec![3]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn the_starvation_guard_keeps_small_tasks_from_starving_a_large_one() {
    // Enough workers that only the budget is scarce.
    let mut lot = lot_with(
        PoolLimits::new(10, 100)
            .with_starvation(StarvationGuard {
                max_park_ms: Some(1_000),
                max_skips: None,
            })
            .with_budget(IO, ten_a_second()),
    );
    let mut now = 0;
    assert_eq!(lot.admit(normal_io(1, 10), now), Admit::Start);
    assert_eq!(lot.admit(normal_io(2, 10), now), Admit::Park);
    // A stream of 1-unit tasks, one every 100 ms, would take every unit as it refills.
    let mut started_big_at = None;
    for id in 3..60 {
        now += 100;
        let started = lot.tick(now).started;
        if started.contains(&2) {
            started_big_at = Some(now);
            break;
        }
        let _ = lot.admit(normal_io(id, 1), now);
        lot.check_invariants().expect("invariants");
    }
    // Parked at 0, reserved at 1,000 with the unit refilled since the last small start;
    // from then on nothing below it spends, and it has its 10 units 900 ms later.
    assert_eq!(started_big_at, Some(1_900));
}

#[test]
fn kinds_without_a_budget_are_unchanged() {
    let mut lot = budget_lot(ten_a_second());
    let vram = |id, units| Ticket {
        cost: ResourceCost::gpu_vram(units),
        ..normal_io(id, 0)
    };
    assert_eq!(lot.admit(vram(1, 10), 0), Admit::Start);
    assert_eq!(lot.used(ResourceKind::GpuVram), 10);
    assert_eq!(lot.complete(1, 5).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.used(ResourceKind::GpuVram), 0);
    assert_eq!(lot.budget_level(ResourceKind::GpuVram), None);
}

// ---------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Admit { units: u32, priority: Priority },
    Complete { pick: usize },
    Advance { ms: u64 },
}

fn op(burst: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..=burst, 0..4usize).prop_map(|(units, p)| Op::Admit {
            units,
            priority: Priority::ALL[p],
        }),
        2 => (0..64usize).prop_map(|pick| Op::Complete { pick }),
        3 => (0..400u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn budgets() -> impl Strategy<Value = Budget> {
    (
        1..40u32,
        1..2_000u64,
        1..40u32,
        proptest::option::of((1..5u32, 1..2_000u64)),
    )
        .prop_map(|(units, per_ms, burst, starts)| Budget {
            units,
            per_ms,
            burst,
            max_starts: starts.map(|(count, per_ms)| crate::domain::StartCap { count, per_ms }),
        })
}

/// Runs `ops` on a lot with `budget` and `workers` workers; returns each start's time and
/// units, and the lot.
fn run(budget: Budget, workers: usize, ops: &[Op]) -> (Vec<(u64, u32)>, ParkingLot) {
    let mut lot = lot_with(
        PoolLimits::new(10, workers)
            .with_max_queue_depth(10_000)
            .with_starvation(StarvationGuard {
                max_park_ms: Some(3_000),
                max_skips: Some(8),
            })
            .with_budget(IO, budget),
    );
    let mut starts = Vec::new();
    let mut now = 0;
    let record = |lot: &ParkingLot, ids: &[TaskId], now: u64, starts: &mut Vec<(u64, u32)>| {
        for &id in ids {
            assert_eq!(lot.state(id), Some(WakeState::Running));
            starts.push((now, lot.spent_by(id)));
        }
    };
    for (n, step) in ops.iter().enumerate() {
        let id = n as TaskId + 1;
        match *step {
            Op::Admit { units, priority } => match lot.admit(io(id, priority, units), now) {
                Admit::Start => record(&lot, &[id], now, &mut starts),
                Admit::StartWith(more) => {
                    record(&lot, &[id], now, &mut starts);
                    record(&lot, &more, now, &mut starts);
                }
                _ => {}
            },
            Op::Complete { pick } => {
                let mut running: Vec<TaskId> = lot.running.keys().copied().collect();
                running.sort_unstable();
                if let Some(&id) = running.get(pick % running.len().max(1)) {
                    let started = lot.complete(id, now).expect("running");
                    record(&lot, &started, now, &mut starts);
                }
            }
            Op::Advance { ms } => {
                now += ms;
                let started = lot.tick(now).started;
                record(&lot, &started, now, &mut starts);
            }
        }
        if let Err(broken) = lot.check_invariants() {
            panic!("after {step:?}: {broken}");
        }
    }
    (starts, lot)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Over any span from one start to another, the starts spend at most the burst plus
    /// the refill of the span: `spent * per_ms <= burst * per_ms + units * span`.
    #[test]
    fn no_window_spends_more_than_the_burst_and_its_refill(
        budget in budgets(),
        workers in 1..6usize,
        ops in proptest::collection::vec(op(40), 1..120),
    ) {
        let burst = budget.burst;
        let (starts, _) = run(Budget { burst, ..budget }, workers, &ops);
        for (i, &(from, _)) in starts.iter().enumerate() {
            let mut spent = 0u128;
            for &(at, units) in &starts[i..] {
                spent += u128::from(units);
                let allowed = u128::from(burst) * u128::from(budget.per_ms)
                    + u128::from(budget.units) * u128::from(at - from);
                prop_assert!(
                    spent * u128::from(budget.per_ms) <= allowed,
                    "{spent} units spent from {from} to {at} ms; budget {budget:?}"
                );
            }
            if let Some(cap) = budget.max_starts {
                let mut count = 0u128;
                for &(at, _) in &starts[i..] {
                    count += 1;
                    let allowed = u128::from(cap.count) * u128::from(cap.per_ms)
                        + u128::from(cap.count) * u128::from(at - from);
                    prop_assert!(count * u128::from(cap.per_ms) <= allowed, "{count} starts");
                }
            }
        }
    }

    /// Every task that fits the burst starts in the end: with every running task ended
    /// and time moved to each wake-up the lot asks for, nothing stays parked.
    #[test]
    fn every_task_within_the_burst_starts_eventually(
        budget in budgets(),
        workers in 1..6usize,
        ops in proptest::collection::vec(op(40), 1..120),
    ) {
        let (_, mut lot) = run(budget, workers, &ops);
        let mut now = lot.clock;
        for _ in 0..100_000 {
            let running: Vec<TaskId> = lot.running.keys().copied().collect();
            for id in running {
                lot.complete(id, now).expect("running");
            }
            if lot.parked_len() == 0 {
                break;
            }
            let next = lot.next_wakeup();
            prop_assert!(
                next.is_some() || !lot.running.is_empty(),
                "{} parked, nothing running, and no wake-up: they would wait for ever",
                lot.parked_len()
            );
            if let Some(at) = next {
                prop_assert!(at > now || !lot.tick(now).started.is_empty(), "a wake-up in the past that starts nothing");
                now = now.max(at);
                lot.tick(now);
            }
            lot.check_invariants().map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(lot.parked_len(), 0);
    }
}
