//! Rule 14: capacity permits (no worker slot; grow, shrink, absorb; preemption victims).

use proptest::prelude::*;

use super::tests::{normal, ticket};
use super::tests_share::of;
use super::*;
use crate::domain::{FairShare, StarvationGuard};

/// 10 VRAM units, `workers` slots, queue of 100, no starvation guard.
fn lot(workers: usize) -> ParkingLot {
    ParkingLot::new(
        PoolLimits::new(10, workers)
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard::disabled()),
    )
    .expect("valid limits")
}

fn checked(lot: &ParkingLot) {
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_parked_ticket_keeps_its_size_with_the_permit_flag() {
    assert_eq!(std::mem::size_of::<Parked>(), 48);
}

#[test]
fn permits_start_while_every_slot_is_busy_and_hold_no_slot() {
    let mut lot = lot(1);
    assert_eq!(lot.admit(normal(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 1), 0), Admit::Park);
    assert_eq!(lot.admit_permit(normal(3, 4), 0), Admit::Start);
    assert_eq!(lot.busy_workers(), 1);
    assert_eq!(lot.running_len(), 2);
    assert_eq!(lot.worker_of(3), None);
    assert_eq!(lot.worker_of(1), Some(0));
    assert_eq!(lot.used(ResourceKind::GpuVram), 6);
    checked(&lot);
    // The permit's end frees units, not a slot: task 2 still waits for one.
    assert_eq!(lot.complete(3, 1).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.complete(1, 2).unwrap(), vec![2]);
    checked(&lot);
}

#[test]
fn a_lot_without_workers_grants_permits() {
    let mut lot = ParkingLot::without_workers(PoolLimits::new(10, 4)).unwrap();
    assert_eq!(lot.admit(normal(1, 2), 0), Admit::Park);
    assert_eq!(lot.admit_permit(normal(2, 6), 0), Admit::Start);
    assert_eq!(lot.admit_permit(normal(3, 6), 0), Admit::Park);
    checked(&lot);
    assert_eq!(lot.complete(2, 1).unwrap(), vec![3]);
    assert_eq!(lot.busy_workers(), 0);
    checked(&lot);
}

#[test]
fn a_parked_permit_overtakes_tasks_waiting_for_a_slot_but_not_while_slots_are_idle() {
    let mut lot = lot(1);
    assert_eq!(lot.admit(normal(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(ticket(2, Priority::High, 2), 0), Admit::Park);
    assert_eq!(lot.admit_permit(normal(3, 2), 0), Admit::Park);
    // 1 ends: its slot and units are back; the better-ranked task 2 goes first, then the
    // permit, which needs no slot.
    assert_eq!(lot.complete(1, 1).unwrap(), vec![2, 3]);
    checked(&lot);

    let mut lot = lot_with_two_busy_slots();
    // Both slots are busy: the permit overtakes the better-ranked task 12.
    assert_eq!(lot.admit(ticket(12, Priority::High, 2), 0), Admit::Park);
    assert_eq!(lot.admit_permit(normal(13, 2), 0), Admit::Park);
    assert_eq!(lot.shrink(10, 4, 1).unwrap(), vec![13]);
    assert_eq!(lot.state(12), Some(WakeState::Parked));
    checked(&lot);
}

/// Two slots, both held by tasks 10 (8 units) and 11 (2 units).
fn lot_with_two_busy_slots() -> ParkingLot {
    let mut lot = lot(2);
    assert_eq!(lot.admit(normal(10, 8), 0), Admit::Start);
    assert_eq!(lot.admit(normal(11, 2), 0), Admit::Start);
    lot
}

#[test]
fn with_a_slot_idle_rank_order_holds_across_tasks_and_permits() {
    let mut lot = lot(4);
    assert_eq!(lot.admit(normal(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit_permit(normal(2, 6), 0), Admit::Park);
    assert_eq!(lot.admit(ticket(3, Priority::High, 6), 0), Admit::Park);
    assert_eq!(lot.admit_permit(normal(4, 4), 0), Admit::Park);
    // 10 free: the High task first, then the best permit that fits what is left.
    assert_eq!(lot.complete(1, 1).unwrap(), vec![3, 4]);
    checked(&lot);
}

#[test]
fn grow_now_takes_units_only_when_they_fit_now() {
    let mut lot = lot(2);
    assert_eq!(lot.admit_permit(normal(1, 4), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 3), 0), Admit::Start);
    assert_eq!(lot.grow_now(1, 4), Ok(false)); // 3 free
    assert_eq!(lot.grow_now(1, 3), Ok(true));
    assert_eq!(lot.units_of(1), Some(7));
    assert_eq!(lot.used(ResourceKind::GpuVram), 10);
    assert_eq!(lot.grow_now(9, 1), Err(UnknownTask::NotRunning(9)));
    assert_eq!(lot.parked_len(), 0);
    checked(&lot);
}

#[test]
fn grow_now_respects_the_headroom_and_takes_from_it() {
    let mut lot = lot(2);
    assert_eq!(lot.admit_permit(normal(1, 2), 0), Admit::Start);
    lot.set_headroom(ResourceKind::GpuVram, Some(3), 0);
    assert_eq!(lot.grow_now(1, 4), Ok(false));
    assert_eq!(lot.grow_now(1, 2), Ok(true));
    assert_eq!(lot.headroom(ResourceKind::GpuVram), Some(1));
    checked(&lot);
}

#[test]
fn grow_now_waits_while_a_reservation_does() {
    let mut lot = ParkingLot::new(
        PoolLimits::new(10, 4)
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard {
                max_park_ms: Some(10),
                max_skips: None,
            }),
    )
    .unwrap();
    assert_eq!(lot.admit_permit(normal(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 6), 0), Admit::Start);
    assert_eq!(lot.admit(normal(3, 4), 0), Admit::Park);
    assert_eq!(lot.grow_now(1, 1), Ok(true));
    lot.tick(20); // task 3 starves: the pool drains for it
    assert_eq!(lot.reservation(), Some(3));
    assert_eq!(lot.grow_now(1, 1), Ok(false));
    checked(&lot);
}

#[test]
fn grow_now_respects_the_tenant_share() {
    let mut lot = fair_lot(4);
    assert_eq!(lot.admit_permit(of(1, 1, 4), 0), Admit::Start);
    assert_eq!(lot.grow_now(1, 3), Ok(false)); // the cap is 6
    assert_eq!(lot.grow_now(1, 2), Ok(true));
    assert_eq!(lot.tenant_used(1, ResourceKind::GpuVram), 6);
    checked(&lot);
}

#[test]
fn shrink_gives_units_back_and_starts_parked_tasks_in_rank_order() {
    let mut lot = lot(4);
    assert_eq!(lot.admit_permit(normal(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 3), 0), Admit::Park);
    assert_eq!(lot.admit(ticket(3, Priority::High, 4), 0), Admit::Park);
    assert_eq!(lot.admit(normal(4, 2), 0), Admit::Park);
    assert_eq!(lot.shrink(1, 6, 1).unwrap(), vec![3, 4]);
    assert_eq!(lot.units_of(1), Some(4));
    // Keeping nothing, it still runs.
    assert_eq!(lot.shrink(1, 100, 2).unwrap(), vec![2]);
    assert_eq!(lot.units_of(1), Some(0));
    assert_eq!(lot.state(1), Some(WakeState::Running));
    assert_eq!(lot.shrink(9, 1, 2), Err(UnknownTask::NotRunning(9)));
    checked(&lot);
}

#[test]
fn absorb_moves_the_units_and_keeps_the_books_exact() {
    let mut lot = fair_lot(2);
    assert_eq!(lot.admit_permit(of(1, 1, 2), 0), Admit::Start);
    assert_eq!(lot.admit_permit(of(1, 2, 3), 0), Admit::Start);
    assert_eq!(lot.absorb(2, 1, 1), Ok(vec![]));
    assert_eq!(lot.units_of(1), Some(5));
    assert_eq!(lot.state(2), None);
    assert_eq!(lot.used(ResourceKind::GpuVram), 5);
    assert_eq!(lot.tenant_used(1, ResourceKind::GpuVram), 5);
    checked(&lot);
    assert!(lot.complete(1, 2).unwrap().is_empty());
    assert_eq!(lot.used(ResourceKind::GpuVram), 0);
    checked(&lot);
}

#[test]
fn absorbing_a_child_with_a_slot_frees_the_slot() {
    let mut lot = lot(1);
    assert_eq!(lot.admit_permit(normal(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 2), 0), Admit::Start);
    assert_eq!(lot.admit(normal(3, 1), 0), Admit::Park);
    assert_eq!(lot.absorb(2, 1, 1), Ok(vec![3]));
    assert_eq!(lot.units_of(1), Some(4));
    assert_eq!(lot.worker_of(3), Some(0));
    checked(&lot);
}

#[test]
fn absorb_refuses_other_kinds_other_tenants_itself_and_non_running_tasks() {
    let mut lot = lot(4);
    let cpu = Ticket {
        cost: ResourceCost::new(ResourceKind::Cpu, 1),
        ..normal(2, 1)
    };
    assert_eq!(lot.admit_permit(normal(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit_permit(cpu, 0), Admit::Start);
    assert_eq!(lot.admit_permit(of(7, 3, 1), 0), Admit::Start);
    let refused = |reason| {
        Err(UnknownTask::CannotAbsorb {
            child: 2,
            parent: 1,
            reason,
        })
    };
    assert_eq!(
        lot.absorb(2, 1, 0),
        refused(AbsorbRefusal::OtherKind {
            child: ResourceKind::Cpu,
            parent: ResourceKind::GpuVram
        })
    );
    assert!(matches!(
        lot.absorb(3, 1, 0),
        Err(UnknownTask::CannotAbsorb {
            reason: AbsorbRefusal::OtherTenant {
                child: 7,
                parent: 0
            },
            ..
        })
    ));
    assert!(matches!(
        lot.absorb(1, 1, 0),
        Err(UnknownTask::CannotAbsorb {
            reason: AbsorbRefusal::SameTask,
            ..
        })
    ));
    assert_eq!(lot.absorb(9, 1, 0), Err(UnknownTask::NotRunning(9)));
    assert_eq!(lot.absorb(1, 9, 0), Err(UnknownTask::NotRunning(9)));
    assert_eq!(lot.used(ResourceKind::GpuVram), 3);
    checked(&lot);
}

/// A lot whose running tickets 1..=4 hold `units` at `priority`, started in id order, and
/// a parked waiter 9 of `waiter` priority needing `need` units.
fn preemption_lot(running: &[(Priority, u32)], waiter: Priority, need: u32) -> ParkingLot {
    let mut lot = ParkingLot::new(
        PoolLimits::new(20, 8)
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard::disabled()),
    )
    .unwrap();
    for (id, &(priority, units)) in (1..).zip(running) {
        assert_eq!(
            lot.admit_permit(ticket(id, priority, units), 0),
            Admit::Start
        );
    }
    assert_eq!(lot.admit(ticket(9, waiter, need), 0), Admit::Park);
    lot
}

#[test]
fn victims_are_lowest_priority_first_and_newest_first_within_a_priority() {
    use Priority::{High, Low, Normal};
    let lot = preemption_lot(&[(Low, 5), (Low, 5), (Normal, 5), (Low, 5)], High, 10);
    // Free 0; need 10: the newest Low (4), then the next newest Low (2).
    assert_eq!(lot.preemption_victims(9, 0, |_| true), Some(vec![4, 2]));
    // Task 4 may not yield: 2 and 1.
    assert_eq!(lot.preemption_victims(9, 0, |id| id != 4), Some(vec![2, 1]));
    // Only one Low may yield: the Normal one is next.
    assert_eq!(
        lot.preemption_victims(9, 0, |id| id == 1 || id == 3),
        Some(vec![1, 3])
    );
}

#[test]
fn victims_not_needed_to_cover_are_dropped_from_the_last_taken_back() {
    use Priority::{High, Low};
    // Free 0; need 8. Taken in order: 3 (2 units), 2 (2 units), 1 (8 units) covers 12;
    // then 2 and 3 are not needed: 1 alone covers 8.
    let lot = preemption_lot(&[(Low, 8), (Low, 2), (Low, 2), (High, 8)], High, 8);
    assert_eq!(lot.preemption_victims(9, 0, |_| true), Some(vec![1]));
}

#[test]
fn pending_units_reduce_the_need() {
    use Priority::{High, Low};
    let lot = preemption_lot(&[(Low, 5), (Low, 5), (Low, 10)], High, 10);
    assert_eq!(lot.preemption_victims(9, 5, |_| true), Some(vec![3]));
    assert_eq!(lot.preemption_victims(9, 10, |_| true), Some(vec![]));
    assert_eq!(lot.preemption_victims(9, 99, |_| true), Some(vec![]));
}

#[test]
fn no_victims_when_they_cannot_cover_or_the_waiter_is_not_parked() {
    use Priority::{High, Normal};
    // Only strictly lower priorities yield: the Normal ones hold 10 and are not enough,
    // the High one does not count.
    let lot = preemption_lot(&[(Normal, 5), (Normal, 5), (High, 10)], High, 12);
    assert_eq!(lot.preemption_victims(9, 0, |_| true), None);
    assert_eq!(lot.preemption_victims(9, 2, |_| true), Some(vec![2, 1]));
    let lot = preemption_lot(&[(Normal, 5), (Normal, 5), (Normal, 10)], Normal, 12);
    assert_eq!(lot.preemption_victims(9, 0, |_| true), None);
    assert_eq!(lot.preemption_victims(1, 0, |_| true), None); // running, not parked
    assert_eq!(lot.preemption_victims(42, 0, |_| true), None);
}

#[test]
fn holders_count_running_tickets_holding_units_of_a_kind() {
    let mut lot = lot(4);
    assert_eq!(lot.admit_permit(normal(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 3), 0), Admit::Start);
    assert_eq!(lot.holders(ResourceKind::GpuVram), 2);
    lot.shrink(1, 2, 0).unwrap();
    assert_eq!(lot.holders(ResourceKind::GpuVram), 1);
    assert_eq!(lot.holders(ResourceKind::Cpu), 0);
}

/// 10 VRAM units, `workers` slots, at most 6 units per tenant.
fn fair_lot(workers: usize) -> ParkingLot {
    ParkingLot::new(
        PoolLimits::new(10, workers)
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard::disabled())
            .with_fair_share(Some(FairShare::MaxUnitsPerTenant(6))),
    )
    .unwrap()
}

#[test]
fn under_a_fair_share_a_permit_waits_behind_a_fair_best_task_that_needs_a_slot() {
    let mut lot = fair_lot(1);
    assert_eq!(lot.admit(of(1, 1, 6), 0), Admit::Start); // the one slot
    assert_eq!(lot.admit(of(2, 2, 2), 0), Admit::Park); // no slot
                                                        // Tenant 3 uses nothing, like tenant 2, but its permit ranks after task 2.
    assert_eq!(lot.admit_permit(of(3, 3, 2), 0), Admit::Park);
    // The fair-best is task 2 (same usage, ranked ahead), which needs a slot: the permit
    // waits behind it.
    // The slot frees: task 2 starts, then the permit.
    assert_eq!(lot.complete(1, 1).unwrap(), vec![2, 3]);
    checked(&lot);
}

#[test]
fn under_a_fair_share_a_fair_best_permit_starts_while_every_slot_is_busy() {
    let mut lot = fair_lot(1);
    assert_eq!(lot.admit(of(1, 1, 5), 0), Admit::Start); // the one slot
    assert_eq!(lot.admit(of(1, 2, 1), 0), Admit::Park); // no slot
                                                        // Tenant 2 uses less than tenant 1: its permit is fair-best and starts.
    assert_eq!(lot.admit_permit(of(2, 3, 1), 0), Admit::Start);
    assert_eq!(lot.admit_permit(of(2, 4, 5), 0), Admit::Park); // 4 free
    checked(&lot);
    // 5 free; tenant 2 (1 unit) still uses less than tenant 1 (4): permit 4 overtakes
    // task 2, which waits for a slot.
    assert_eq!(lot.shrink(1, 1, 1).unwrap(), vec![4]);
    assert_eq!(lot.state(2), Some(WakeState::Parked));
    checked(&lot);
}

#[test]
fn under_a_fair_share_a_newcomer_permit_may_backfill_past_a_task_that_waits_for_a_slot() {
    // The one slot and 8 of the 10 units are held, all of them until 100 ms at most.
    let mut lot = ParkingLot::new(limits(1, true)).unwrap();
    let slot_holder = Ticket {
        timeout_ms: Some(100),
        ..of(0, 1, 4)
    };
    assert_eq!(lot.admit(slot_holder, 0), Admit::Start);
    let holder = Ticket {
        timeout_ms: Some(100),
        ..of(1, 2, 4)
    };
    assert_eq!(lot.admit_permit(holder, 0), Admit::Start);
    // Task 3 needs more than is free; task 4 fits but waits for the slot. Both starve, and
    // task 3, of the higher priority, is the reservation the pool drains for.
    let reserved = Ticket {
        priority: Priority::High,
        ..of(2, 3, 4)
    };
    assert_eq!(lot.admit(reserved, 0), Admit::Park);
    assert_eq!(lot.admit(of(3, 4, 1), 0), Admit::Park);
    lot.tick(15);
    assert_eq!(lot.reserved().map(|rank| rank.id()), Some(3));
    // A permit that ends before the reservation could start backfills (rule 13), although
    // task 4 ranks ahead of it and waits for a slot: as the same permit would, parked.
    let backfill = Ticket {
        priority: Priority::Low,
        timeout_ms: Some(50),
        ..of(4, 5, 1)
    };
    assert_eq!(lot.admit_permit(backfill, 15), Admit::Start);
    assert_eq!(
        lot.state(4),
        Some(WakeState::Reserved),
        "starving, still parked"
    );
    checked(&lot);
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        permit: bool,
        priority: usize,
        tenant: u64,
        units: u32,
        timeout: Option<u64>,
    },
    Complete(usize),
    Cancel(usize),
    Grow(usize, u32),
    Shrink(usize, u32),
    Absorb(usize, usize),
    Tick(u64),
    Headroom(Option<u32>),
    /// Rule 19: the driver opens the lane with what the lot allows.
    Lend,
    /// A caller takes units from the open lane (a fast-path permit).
    FastTake(u32),
    /// The `pick`th fast-path holder gives its units back: to the lane while it is open,
    /// else to the lot.
    FastGive(usize),
    /// The `pick`th fast-path holder is taken over: a running ticket of its own.
    Adopt(usize, usize),
    /// A taken-over holder borrows `units` more from the open lane, then settles them.
    Settle(usize, u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (any::<bool>(), 0..4usize, 0..3u64, 0..=8u32, prop::option::of(1..40u64)).prop_map(
            |(permit, priority, tenant, units, timeout)| Op::Admit { permit, priority, tenant, units, timeout }
        ),
        3 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => (any::<usize>(), 0..5u32).prop_map(|(pick, units)| Op::Grow(pick, units)),
        2 => (any::<usize>(), 0..5u32).prop_map(|(pick, units)| Op::Shrink(pick, units)),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::Absorb(a, b)),
        1 => (1..20u64).prop_map(Op::Tick),
        1 => prop::option::weighted(0.7, 0..=12u32).prop_map(Op::Headroom),
        2 => Just(Op::Lend),
        3 => (0..=4u32).prop_map(Op::FastTake),
        2 => any::<usize>().prop_map(Op::FastGive),
        1 => (any::<usize>(), 0..4usize).prop_map(|(pick, priority)| Op::Adopt(pick, priority)),
        1 => (any::<usize>(), 1..3u32).prop_map(|(pick, units)| Op::Settle(pick, units)),
    ]
}

/// The `pick`th running task, if any run (ordered by id for determinism).
fn pick_running(running: &[TaskId], pick: usize) -> Option<TaskId> {
    (!running.is_empty()).then(|| running[pick % running.len()])
}

fn run(lot: &mut ParkingLot, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut now = 0;
    let mut next_id = 1;
    let mut live: Vec<TaskId> = Vec::new();
    // The lane (rule 19) as the driver and the fast path keep it: the units it holds while
    // open, and what each fast-path holder borrowed.
    let vram = ResourceKind::GpuVram;
    let mut lane: Option<u32> = None;
    let mut borrowed: Vec<u32> = Vec::new();
    for op in ops {
        let lane_op = matches!(
            op,
            Op::Lend | Op::FastTake(_) | Op::FastGive(_) | Op::Adopt(..) | Op::Settle(..)
        );
        if !lane_op {
            // The driver closes the lane before it feeds the lot any other event.
            if let Some(units) = lane.take() {
                lot.reclaim(vram, units, now);
            }
        }
        let mut running: Vec<TaskId> = live
            .iter()
            .copied()
            .filter(|&id| lot.state(id) == Some(WakeState::Running))
            .collect();
        running.sort_unstable();
        match *op {
            Op::Admit {
                permit,
                priority,
                tenant,
                units,
                timeout,
            } => {
                let ticket = Ticket {
                    id: next_id,
                    priority: Priority::ALL[priority],
                    cost: ResourceCost::gpu_vram(units),
                    created_at_ms: now,
                    deadline_ms: None,
                    tenant,
                    timeout_ms: timeout,
                    also: Default::default(),
                };
                live.push(next_id);
                next_id += 1;
                let _ = if permit {
                    lot.admit_permit(ticket, now)
                } else {
                    lot.admit(ticket, now)
                };
            }
            Op::Complete(pick) => {
                if let Some(id) = pick_running(&running, pick) {
                    lot.complete(id, now).expect("running");
                }
            }
            Op::Cancel(pick) => {
                if !live.is_empty() {
                    let _ = lot.cancel(live[pick % live.len()], now);
                }
            }
            Op::Grow(pick, units) => {
                if let Some(id) = pick_running(&running, pick) {
                    let before = lot.used(ResourceKind::GpuVram);
                    let grew = lot.grow_now(id, units).expect("running");
                    let after = if grew { before + units } else { before };
                    prop_assert_eq!(lot.used(ResourceKind::GpuVram), after);
                }
            }
            Op::Shrink(pick, units) => {
                if let Some(id) = pick_running(&running, pick) {
                    lot.shrink(id, units, now).expect("running");
                }
            }
            Op::Absorb(a, b) => {
                if let (Some(child), Some(parent)) =
                    (pick_running(&running, a), pick_running(&running, b))
                {
                    let held = lot.units_of(child).unwrap() + lot.units_of(parent).unwrap();
                    if lot.absorb(child, parent, now).is_ok() {
                        prop_assert_eq!(lot.units_of(parent), Some(held));
                        prop_assert_eq!(lot.state(child), None);
                    }
                }
            }
            Op::Tick(by) => {
                now += by;
                lot.tick(now);
            }
            Op::Headroom(headroom) => {
                lot.set_headroom(ResourceKind::GpuVram, headroom, now);
            }
            Op::Lend => {
                if lane.is_none() {
                    let room = lot.lane_room(vram);
                    if lot.parked_len() > 0 || lot.is_paused() || fair_share(lot) {
                        prop_assert_eq!(room, 0, "a lane may open only while nothing waits");
                    }
                    if room > 0 {
                        lane = Some(lot.lend(vram, room));
                    }
                }
            }
            Op::FastTake(units) => {
                if let Some(available) = lane.as_mut().filter(|available| **available >= units) {
                    *available -= units;
                    borrowed.push(units);
                }
            }
            Op::FastGive(pick) => {
                if !borrowed.is_empty() {
                    let units = borrowed.swap_remove(pick % borrowed.len());
                    match lane.as_mut() {
                        Some(available) => *available += units,
                        None => {
                            lot.reclaim(vram, units, now);
                        }
                    }
                }
            }
            Op::Adopt(pick, priority) => {
                if !borrowed.is_empty() {
                    let units = borrowed.swap_remove(pick % borrowed.len());
                    let ticket = Ticket {
                        id: next_id,
                        priority: Priority::ALL[priority],
                        cost: ResourceCost::gpu_vram(units),
                        created_at_ms: now,
                        deadline_ms: None,
                        tenant: 0,
                        timeout_ms: None,
                        also: Default::default(),
                    };
                    prop_assert_eq!(lot.adopt(ticket, now), Ok(()));
                    prop_assert_eq!(lot.units_of(next_id), Some(units));
                    live.push(next_id);
                    next_id += 1;
                }
            }
            Op::Settle(pick, units) => {
                let available = lane.unwrap_or(0);
                if let (Some(id), true) = (pick_running(&running, pick), available >= units) {
                    let held = lot.units_of(id).unwrap();
                    if lot
                        .claim_of(id)
                        .is_some_and(|(cost, _, _)| cost.kind == vram)
                    {
                        lane = Some(available - units);
                        prop_assert_eq!(lot.settle(id, units), Ok(()));
                        prop_assert_eq!(lot.units_of(id), Some(held + units));
                    }
                }
            }
        }
        let outstanding = lane.unwrap_or(0) + borrowed.iter().sum::<u32>();
        prop_assert_eq!(
            lot.lent(vram),
            outstanding,
            "lent units: in the lane or borrowed"
        );
        live.retain(|&id| lot.state(id).is_some());
        prop_assert!(lot.used(ResourceKind::GpuVram) <= 10);
        if let Err(broken) = lot.check_invariants() {
            return Err(TestCaseError::fail(format!("after {op:?}: {broken}")));
        }
    }
    Ok(())
}

/// Whether the lot shares its units fairly between tenants (rule 12).
fn fair_share(lot: &ParkingLot) -> bool {
    lot.limits().fair_share.is_some()
}

fn limits(workers: usize, fair: bool) -> PoolLimits {
    PoolLimits::new(10, workers.max(1))
        .with_max_queue_depth(16)
        .with_starvation(StarvationGuard {
            max_park_ms: Some(15),
            max_skips: Some(3),
        })
        .with_fair_share(fair.then_some(FairShare::MaxUnitsPerTenant(6)))
}

proptest! {
    #[test]
    fn random_mixes_of_tasks_and_permits_keep_every_invariant(
        workers in 0..4usize,
        fair in any::<bool>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let limits = limits(workers, fair);
        let mut lot = if workers == 0 {
            ParkingLot::without_workers(limits).unwrap()
        } else {
            ParkingLot::new(limits).unwrap()
        };
        run(&mut lot, &ops)?;
    }
}
