//! One test per rule of the module docs.

use super::*;
use crate::domain::{Capacity, StarvationGuard};

pub(super) fn ticket(id: TaskId, priority: Priority, units: u32) -> Ticket {
    Ticket {
        id,
        priority,
        cost: ResourceCost::gpu_vram(units),
        created_at_ms: id,
        deadline_ms: None,
        tenant: 0,
        timeout_ms: None,
        also: Default::default(),
    }
}

pub(super) fn normal(id: TaskId, units: u32) -> Ticket {
    ticket(id, Priority::Normal, units)
}

/// 10 VRAM units, 8 workers, queue of 100, no starvation guard unless a test sets one.
pub(super) fn lot() -> ParkingLot {
    lot_with(
        PoolLimits::new(10, 8)
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard::disabled()),
    )
}

pub(super) fn lot_with(limits: PoolLimits) -> ParkingLot {
    ParkingLot::new(limits).expect("valid limits")
}

pub(super) fn admit_all(lot: &mut ParkingLot, tickets: &[Ticket]) -> Vec<Admit> {
    let admits = tickets.iter().map(|&t| lot.admit(t, 0)).collect();
    lot.check_invariants().expect("invariants");
    admits
}

#[test]
fn invalid_limits_are_refused_with_the_field_named() {
    let err = ParkingLot::new(PoolLimits::new(10, 0)).unwrap_err();
    assert!(err.to_string().contains("worker_slots"), "{err}");
    let err = ParkingLot::new(PoolLimits::new(0, 2)).unwrap_err();
    assert!(err.to_string().contains("capacity"), "{err}");
}

#[test]
fn a_sleeper_is_live_but_takes_no_part_until_its_time() {
    let mut lot = lot();
    lot.park_until(normal(1, 4), 100, 0).unwrap();
    assert_eq!(lot.state(1), Some(WakeState::Parked));
    assert_eq!(lot.parked_len(), 1);
    assert!(matches!(
        lot.admit(normal(1, 1), 0),
        Admit::Reject(Rejection::DuplicateId(1))
    ));
    // A newcomer takes what the sleeper would have: the sleeper is in no decision.
    assert_eq!(lot.admit(normal(2, 10), 0), Admit::Start);
    assert_eq!(lot.next_wakeup(), Some(100));
    lot.check_invariants().expect("invariants");
    assert!(
        lot.tick(100).started.is_empty(),
        "awake, parked, nothing free"
    );
    assert_eq!(lot.complete(2, 150).unwrap(), vec![1]);
    // Another sleeper, cancelled while it sleeps; one left at shutdown is handed back.
    lot.park_until(normal(3, 1), 500, 150).unwrap();
    assert_eq!(
        lot.cancel(3, 200).unwrap(),
        Cancel::Parked { started: vec![] }
    );
    assert_eq!(lot.state(3), None);
    assert_eq!(lot.next_wakeup(), None);
    lot.park_until(normal(4, 1), 500, 200).unwrap();
    assert_eq!(lot.take_parked(), vec![4]);
    assert_eq!(lot.parked_len(), 0);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_sleeper_whose_deadline_passed_while_it_slept_expires_at_the_tick_that_wakes_it() {
    // The pool is free: were the sleeper woken without its deadline checked, it would start.
    let mut lot = lot();
    let late = Ticket {
        deadline_ms: Some(150),
        ..normal(1, 4)
    };
    lot.park_until(late, 100, 0).unwrap();
    let on_time = Ticket {
        deadline_ms: Some(300),
        ..normal(2, 4)
    };
    lot.park_until(on_time, 100, 0).unwrap();
    // The tick comes late, after the first deadline.
    let tick = lot.tick(200);
    assert_eq!(tick.expired, vec![1]);
    assert_eq!(tick.started, vec![2]);
    assert_eq!(lot.state(1), None);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_task_that_fits_starts_at_once() {
    let mut lot = lot();
    assert_eq!(lot.admit(normal(1, 4), 0), Admit::Start);
    assert_eq!(lot.used(ResourceKind::GpuVram), 4);
    assert_eq!(lot.busy_workers(), 1);
    assert_eq!(lot.state(1), Some(WakeState::Running));
}

#[test]
fn a_cost_above_total_capacity_is_rejected_not_parked() {
    let mut lot = lot();
    assert_eq!(
        lot.admit(normal(1, 11), 0),
        Admit::Reject(Rejection::InsufficientResources {
            kind: ResourceKind::GpuVram,
            needed: 11,
            capacity: 10
        })
    );
    assert_eq!(lot.parked_len(), 0);
    let err: PoolError = Rejection::InsufficientResources {
        kind: ResourceKind::GpuVram,
        needed: 11,
        capacity: 10,
    }
    .into();
    assert_eq!(
        err,
        PoolError::InsufficientResources {
            needed: 11,
            available: 10,
            kind: ResourceKind::GpuVram,
        }
    );
}

#[test]
fn each_kind_is_its_own_budget() {
    let capacity = Capacity::uniform(0)
        .with(ResourceKind::GpuVram, 10)
        .with(ResourceKind::Cpu, 2);
    let mut lot = lot_with(PoolLimits::new(1, 8).with_capacity(capacity));
    assert_eq!(lot.admit(normal(1, 10), 0), Admit::Start);
    let cpu = Ticket {
        cost: ResourceCost::cpu(2),
        ..normal(2, 0)
    };
    assert_eq!(
        lot.admit(cpu, 0),
        Admit::Start,
        "VRAM being full does not block CPU"
    );
    let io = Ticket {
        cost: ResourceCost::io(1),
        ..normal(3, 0)
    };
    assert!(matches!(
        lot.admit(io, 0),
        Admit::Reject(Rejection::InsufficientResources { .. })
    ));
}

#[test]
fn worker_slots_are_part_of_the_capacity_vector() {
    let mut lot = lot_with(PoolLimits::new(100, 2).with_starvation(StarvationGuard::disabled()));
    assert_eq!(
        admit_all(&mut lot, &[normal(1, 1), normal(2, 1), normal(3, 1)]),
        vec![Admit::Start, Admit::Start, Admit::Park]
    );
    assert_eq!(lot.complete(1, 1).unwrap(), vec![3]);
}

#[test]
fn duplicate_live_ids_are_rejected() {
    let mut lot = lot();
    lot.admit(normal(1, 10), 0);
    assert_eq!(
        lot.admit(normal(1, 1), 0),
        Admit::Reject(Rejection::DuplicateId(1))
    );
    lot.admit(normal(2, 5), 0);
    assert_eq!(
        lot.admit(normal(2, 1), 0),
        Admit::Reject(Rejection::DuplicateId(2))
    );
}

#[test]
fn queue_full_at_max_queue_depth() {
    let mut lot = lot_with(PoolLimits::new(10, 8).with_max_queue_depth(2));
    assert_eq!(
        admit_all(
            &mut lot,
            &[normal(1, 10), normal(2, 1), normal(3, 1), normal(4, 1)]
        ),
        vec![
            Admit::Start,
            Admit::Park,
            Admit::Park,
            Admit::Reject(Rejection::QueueFull { max_queue_depth: 2 })
        ]
    );
}

#[test]
fn a_task_that_fits_starts_even_when_the_queue_is_full() {
    let mut lot = lot_with(PoolLimits::new(10, 8).with_max_queue_depth(0));
    assert_eq!(lot.admit(normal(1, 9), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 1), 0), Admit::Start);
    assert!(matches!(
        lot.admit(normal(3, 1), 0),
        Admit::Reject(Rejection::QueueFull { .. })
    ));
}

#[test]
fn a_deadline_already_past_expires_on_arrival() {
    let mut lot = lot();
    let late = Ticket {
        deadline_ms: Some(100),
        tenant: 0,
        timeout_ms: None,
        ..normal(1, 1)
    };
    assert_eq!(lot.admit(late, 100), Admit::Expire);
    assert_eq!(lot.state(1), None);
    let on_time = Ticket {
        deadline_ms: Some(101),
        tenant: 0,
        timeout_ms: None,
        ..normal(2, 1)
    };
    assert_eq!(lot.admit(on_time, 100), Admit::Start);
}

#[test]
fn unpark_follows_priority_then_age_then_id() {
    let mut lot = lot();
    lot.admit(normal(1, 10), 0);
    let tickets = [
        Ticket {
            created_at_ms: 5,
            ..ticket(10, Priority::Low, 1)
        },
        Ticket {
            created_at_ms: 5,
            ..ticket(11, Priority::High, 1)
        },
        Ticket {
            created_at_ms: 3,
            ..ticket(12, Priority::Normal, 1)
        },
        Ticket {
            created_at_ms: 2,
            ..ticket(13, Priority::Normal, 1)
        },
        Ticket {
            created_at_ms: 2,
            ..ticket(14, Priority::Normal, 1)
        },
        Ticket {
            created_at_ms: 9,
            ..ticket(15, Priority::Critical, 1)
        },
    ];
    for t in tickets {
        assert_eq!(lot.admit(t, 0), Admit::Park);
    }
    let order = lot.complete(1, 1).unwrap();
    assert_eq!(order, vec![15, 11, 13, 14, 12, 10]);
}

#[test]
fn skip_ahead_starts_smaller_tasks_behind_a_large_one_until_nothing_fits() {
    let mut lot = lot();
    lot.admit(normal(1, 10), 0);
    admit_all(
        &mut lot,
        &[
            ticket(2, Priority::High, 8),
            normal(3, 3),
            normal(4, 4),
            normal(5, 2),
            normal(6, 1),
        ],
    );
    lot.admit(normal(7, 10), 0);
    // 10 free: 8 (high) first, then 2 more units: task 5 (2) fits; 3 and 4 do not.
    assert_eq!(lot.complete(1, 1).unwrap(), vec![2, 5]);
    assert_eq!(lot.free(ResourceKind::GpuVram), 0);
    // 8 free: 3 + 4 + 1 fit; 7 (10) does not.
    assert_eq!(lot.complete(2, 2).unwrap(), vec![3, 4, 6]);
    lot.check_invariants().unwrap();
}

#[test]
fn the_fast_path_never_overtakes_a_parked_task_that_could_run() {
    let mut lot = lot();
    lot.admit(normal(1, 6), 0);
    lot.admit(normal(2, 6), 0); // parked
                                // Task 1 completes: 2 starts before any newcomer can claim the freed units.
    assert_eq!(lot.complete(1, 1).unwrap(), vec![2]);
    assert_eq!(lot.admit(normal(3, 6), 1), Admit::Park);
}

#[test]
fn the_fast_path_may_overtake_a_parked_task_that_does_not_fit() {
    let mut lot = lot();
    lot.admit(normal(1, 6), 0);
    assert_eq!(lot.admit(ticket(2, Priority::High, 6), 0), Admit::Park);
    assert_eq!(lot.admit(normal(3, 4), 0), Admit::Start);
}

#[test]
fn skips_at_the_head_reserve_it_and_drain_the_pool() {
    let guard = StarvationGuard {
        max_park_ms: None,
        max_skips: Some(2),
    };
    let mut lot = lot_with(PoolLimits::new(10, 8).with_starvation(guard));
    lot.admit(normal(1, 5), 0);
    lot.admit(normal(2, 5), 0);
    assert_eq!(lot.admit(normal(3, 10), 0), Admit::Park); // the big one, head of the line
    lot.admit(normal(4, 5), 0);
    lot.admit(normal(5, 5), 0);
    assert_eq!(lot.complete(1, 1).unwrap(), vec![4]); // skip 1
    assert_eq!(lot.state(3), Some(WakeState::Parked));
    assert_eq!(lot.complete(2, 2).unwrap(), vec![5]); // skip 2: now reserved
    assert_eq!(lot.state(3), Some(WakeState::Reserved));
    assert_eq!(lot.reservation(), Some(3));
    // Small tasks ranked below the reservation no longer start, even though they fit.
    assert_eq!(lot.complete(4, 3).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.admit(normal(6, 1), 3), Admit::Park);
    lot.check_invariants().unwrap();
    // A task ranked above the reservation still starts.
    assert_eq!(lot.admit(ticket(7, Priority::High, 1), 3), Admit::Start);
    lot.complete(7, 4).unwrap();
    // Once drained, the reserved task starts, then the rest resumes.
    assert_eq!(lot.complete(5, 4).unwrap(), vec![3]);
    assert_eq!(lot.reservation(), None);
    assert_eq!(lot.complete(3, 5).unwrap(), vec![6]);
}

#[test]
fn age_reserves_a_task_parked_too_long() {
    let guard = StarvationGuard {
        max_park_ms: Some(100),
        max_skips: None,
    };
    let mut lot = lot_with(PoolLimits::new(10, 8).with_starvation(guard));
    lot.admit(normal(1, 6), 0);
    lot.admit(normal(2, 10), 0); // parked at 0
    assert_eq!(lot.next_wakeup(), Some(100));
    assert_eq!(
        lot.admit(normal(3, 2), 99),
        Admit::Start,
        "not starving yet"
    );
    lot.tick(100);
    assert_eq!(lot.state(2), Some(WakeState::Reserved));
    assert_eq!(lot.admit(normal(4, 1), 100), Admit::Park);
    assert_eq!(lot.complete(1, 101).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.complete(3, 102).unwrap(), vec![2]);
}

#[test]
fn a_cancelled_reservation_unblocks_the_tasks_behind_it() {
    let guard = StarvationGuard {
        max_park_ms: Some(10),
        max_skips: None,
    };
    let mut lot = lot_with(PoolLimits::new(10, 8).with_starvation(guard));
    lot.admit(normal(1, 6), 0);
    lot.admit(normal(2, 10), 0);
    lot.tick(10);
    assert_eq!(lot.admit(normal(3, 2), 10), Admit::Park);
    assert_eq!(
        lot.cancel(2, 11).unwrap(),
        Cancel::Parked { started: vec![3] }
    );
}

#[test]
fn tick_expires_parked_tasks_at_their_deadline() {
    let mut lot = lot();
    lot.admit(normal(1, 10), 0);
    lot.admit(
        Ticket {
            deadline_ms: Some(50),
            tenant: 0,
            timeout_ms: None,
            ..normal(2, 1)
        },
        0,
    );
    lot.admit(
        Ticket {
            deadline_ms: Some(20),
            tenant: 0,
            timeout_ms: None,
            ..normal(3, 1)
        },
        0,
    );
    lot.admit(normal(4, 1), 0);
    assert_eq!(lot.next_wakeup(), Some(20));
    assert_eq!(lot.tick(19), Tick::default());
    assert_eq!(
        lot.tick(50),
        Tick {
            expired: vec![3, 2],
            started: vec![],
            overdue: vec![],
        }
    );
    assert_eq!(lot.parked_len(), 1);
    assert_eq!(lot.next_wakeup(), None);
}

#[test]
fn release_happens_exactly_once() {
    let mut lot = lot();
    lot.admit(normal(1, 4), 0);
    assert_eq!(lot.complete(1, 1).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.complete(1, 2), Err(UnknownTask::NotRunning(1)));
    assert_eq!(lot.used(ResourceKind::GpuVram), 0);
    assert_eq!(lot.busy_workers(), 0);
}

#[test]
fn cancel_of_a_running_task_keeps_its_units_until_it_returns() {
    let mut lot = lot();
    lot.admit(normal(1, 10), 0);
    lot.admit(normal(2, 10), 0);
    assert_eq!(lot.cancel(1, 1), Ok(Cancel::Running));
    assert_eq!(lot.used(ResourceKind::GpuVram), 10);
    assert_eq!(lot.complete(1, 2).unwrap(), vec![2]);
    assert_eq!(lot.cancel(99, 2), Err(UnknownTask::NotLive(99)));
}

#[test]
fn checked_arithmetic_at_the_edges_of_u32() {
    let mut lot = lot_with(PoolLimits::new(u32::MAX, 8));
    assert_eq!(lot.admit(normal(1, u32::MAX), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 1), 0), Admit::Park);
    assert_eq!(
        lot.admit(normal(3, 0), 0),
        Admit::Start,
        "a zero cost needs only a worker"
    );
    assert_eq!(lot.complete(1, 1).unwrap(), vec![2]);
    lot.check_invariants().unwrap();
}

#[test]
fn take_parked_empties_the_lot_in_rank_order() {
    let mut lot = lot();
    lot.admit(normal(1, 10), 0);
    lot.admit(normal(2, 1), 0);
    lot.admit(ticket(3, Priority::High, 1), 0);
    assert_eq!(lot.take_parked(), vec![3, 2]);
    assert_eq!(lot.parked_len(), 0);
    lot.check_invariants().unwrap();
    assert_eq!(lot.complete(1, 1).unwrap(), Vec::<TaskId>::new());
}

#[test]
fn times_past_u64_are_clamped_not_wrapped() {
    let meta = TaskMetadata {
        deadline_ms: Some(u128::MAX),
        created_at_ms: u128::from(u64::MAX) + 5,
        ..TaskMetadata::new(1, ResourceCost::cpu(1))
    };
    let ticket = Ticket::from(&meta);
    assert_eq!(ticket.created_at_ms, u64::MAX);
    assert_eq!(ticket.deadline_ms, Some(u64::MAX));
}

#[test]
fn a_lot_without_workers_parks_every_task_it_admits() {
    let mut lot = ParkingLot::without_workers(PoolLimits::new(10, 0)).unwrap();
    assert_eq!(lot.live_workers(), 0);
    assert_eq!(lot.admit(normal(1, 1), 0), Admit::Park);
    assert_eq!(
        lot.admit(normal(2, 11), 0),
        Admit::Reject(Rejection::InsufficientResources {
            kind: ResourceKind::GpuVram,
            needed: 11,
            capacity: 10,
        })
    );
    assert_eq!(lot.parked_len(), 1);
    assert_eq!(lot.used(ResourceKind::GpuVram), 0);
}

#[test]
fn a_headroom_below_the_free_budget_parks_a_task_that_fits_the_budget() {
    let mut lot = lot();
    assert!(lot
        .set_headroom(ResourceKind::GpuVram, Some(3), 0)
        .is_empty());
    assert_eq!(lot.free(ResourceKind::GpuVram), 3);
    assert_eq!(lot.admit(normal(1, 4), 0), Admit::Park);
    assert_eq!(
        lot.admit(normal(2, 2), 0),
        Admit::Start,
        "skip-ahead within the headroom"
    );
    assert_eq!(
        lot.admit(normal(3, 2), 0),
        Admit::Park,
        "1 unit of headroom left"
    );
    lot.check_invariants().expect("invariants");
    // The outside world frees memory: the headroom grows and both start, in rank order.
    assert_eq!(
        lot.set_headroom(ResourceKind::GpuVram, Some(8), 5),
        vec![1, 3]
    );
    assert_eq!(lot.used(ResourceKind::GpuVram), 8);
    assert_eq!(lot.headroom(ResourceKind::GpuVram), Some(2));
    lot.check_invariants().expect("invariants");
}

#[test]
fn each_start_takes_its_cost_off_the_headroom_until_the_next_sample() {
    let mut lot = lot();
    lot.set_headroom(ResourceKind::GpuVram, Some(6), 0);
    assert_eq!(lot.admit(normal(1, 4), 0), Admit::Start);
    assert_eq!(lot.headroom(ResourceKind::GpuVram), Some(2));
    // The budget has 6 units free, the sample only 2 left.
    assert_eq!(lot.admit(normal(2, 3), 0), Admit::Park);
    // Completing task 1 frees budget, not headroom: the sample still says 2.
    assert_eq!(lot.complete(1, 1).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.state(2), Some(WakeState::Parked));
    // A new sample replaces the headroom: task 2 starts.
    assert_eq!(lot.set_headroom(ResourceKind::GpuVram, Some(6), 2), vec![2]);
    assert_eq!(lot.headroom(ResourceKind::GpuVram), Some(3));
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_headroom_never_raises_free_units_above_the_budget_and_none_lifts_it() {
    let mut lot = lot();
    assert_eq!(lot.admit(normal(1, 7), 0), Admit::Start);
    lot.set_headroom(ResourceKind::GpuVram, Some(1_000), 0);
    assert_eq!(lot.free(ResourceKind::GpuVram), 3);
    assert_eq!(lot.admit(normal(2, 4), 0), Admit::Park);
    lot.set_headroom(ResourceKind::GpuVram, Some(0), 0);
    assert_eq!(lot.admit(normal(3, 1), 0), Admit::Park);
    assert_eq!(
        lot.headroom(ResourceKind::Cpu),
        None,
        "other kinds keep no headroom"
    );
    assert_eq!(lot.set_headroom(ResourceKind::GpuVram, None, 1), vec![3]);
    assert_eq!(lot.headroom(ResourceKind::GpuVram), None);
    assert_eq!(lot.free(ResourceKind::GpuVram), 2);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_cost_above_the_budget_is_still_rejected_under_a_headroom() {
    let mut lot = lot();
    lot.set_headroom(ResourceKind::GpuVram, Some(2), 0);
    assert!(matches!(
        lot.admit(normal(1, 11), 0),
        Admit::Reject(Rejection::InsufficientResources { .. })
    ));
}

#[test]
fn a_resting_slot_takes_no_task_until_it_is_ready() {
    let mut lot = lot_with(PoolLimits::new(10, 2).with_starvation(StarvationGuard::disabled()));
    assert_eq!(lot.admit(normal(1, 1), 0), Admit::Start);
    let rested = lot.worker_of(1).expect("task 1 runs");
    // Its thread still runs work task 1 left on it: its units are free, its slot rests.
    assert!(lot.complete_resting(1, 1).unwrap().is_empty());
    assert_eq!(lot.used(ResourceKind::GpuVram), 0);
    assert_eq!(lot.admit(normal(2, 1), 2), Admit::Start);
    assert_ne!(lot.worker_of(2), Some(rested), "the other slot takes it");
    assert_eq!(lot.admit(normal(3, 1), 3), Admit::Park, "no idle slot");
    lot.check_invariants().expect("invariants");
    assert_eq!(lot.worker_ready(rested, 4), vec![3]);
    assert_eq!(lot.worker_of(3), Some(rested));
    assert!(
        lot.worker_ready(rested, 5).is_empty(),
        "a slot that does not rest"
    );
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_retired_resting_slot_is_never_handed_out() {
    let mut lot = lot_with(PoolLimits::new(10, 1).with_starvation(StarvationGuard::disabled()));
    assert_eq!(lot.admit(normal(1, 1), 0), Admit::Start);
    lot.complete_resting(1, 1).unwrap();
    assert_eq!(lot.retire_worker(0), None);
    assert!(lot.worker_ready(0, 2).is_empty());
    assert_eq!(lot.admit(normal(2, 1), 3), Admit::Park);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_refusal_names_the_kind_as_files_and_the_command_line_write_it() {
    let mut lot = lot_with(PoolLimits::new(4, 1));
    let Admit::Reject(rejection) = lot.admit(normal(1, 8), 0) else {
        panic!("8 units of a pool of 4 are refused");
    };
    let text = crate::domain::PoolError::from(rejection).to_string();
    assert!(text.contains("8 units of gpu_vram"), "{text}");
}
