//! One test per rule of the module docs: rules 12 (fair share) and 13 (backfill).

use super::tests::{lot_with, normal, ticket};
use super::*;
use crate::domain::{Capacity, FairShare, StarvationGuard};

// ---------------------------------------------------------------------------------------
// Rule 12: fair share
// ---------------------------------------------------------------------------------------

pub(super) fn of(tenant: TenantKey, id: TaskId, units: u32) -> Ticket {
    Ticket {
        tenant,
        ..normal(id, units)
    }
}

/// 10 VRAM units, 8 workers, at most 6 units per tenant, no starvation guard.
fn fair_lot() -> ParkingLot {
    lot_with(
        PoolLimits::new(10, 8)
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard::disabled())
            .with_fair_share(Some(FairShare::MaxUnitsPerTenant(6))),
    )
}

#[test]
fn a_tenant_never_holds_more_than_its_cap_even_with_room_left() {
    let mut lot = fair_lot();
    assert_eq!(lot.admit(of(1, 1, 4), 0), Admit::Start);
    assert_eq!(lot.admit(of(1, 2, 2), 0), Admit::Start);
    // 4 units are free, but tenant 1 holds its 6 already.
    assert_eq!(lot.admit(of(1, 3, 1), 0), Admit::Park);
    assert_eq!(lot.tenant_used(1, ResourceKind::GpuVram), 6);
    // Another tenant takes the room.
    assert_eq!(lot.admit(of(2, 4, 3), 0), Admit::Start);
    lot.check_invariants().expect("invariants");
    // Tenant 1's 2 units come back: its parked task may start again.
    assert_eq!(lot.complete(2, 1).unwrap(), vec![3]);
    assert_eq!(lot.tenant_used(1, ResourceKind::GpuVram), 5);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_cost_above_the_tenant_cap_is_rejected_naming_the_cap() {
    let mut lot = fair_lot();
    let rejection = Rejection::AboveTenantShare {
        kind: ResourceKind::GpuVram,
        needed: 7,
        max_per_tenant: 6,
    };
    assert_eq!(lot.admit(of(1, 1, 7), 0), Admit::Reject(rejection.clone()));
    assert!(rejection.to_string().contains("at most 6"), "{rejection}");
    assert_eq!(
        PoolError::from(rejection),
        PoolError::InsufficientResources {
            needed: 7,
            available: 6,
            kind: ResourceKind::GpuVram
        }
    );
    assert_eq!(lot.parked_len(), 0);
}

#[test]
fn within_a_priority_the_tenant_using_least_goes_first() {
    let mut lot = fair_lot();
    // Tenant 1 floods: it holds 6 (its cap) and parks more, older than anyone else's.
    assert_eq!(lot.admit(of(1, 1, 3), 0), Admit::Start);
    assert_eq!(lot.admit(of(1, 2, 3), 0), Admit::Start);
    for id in 3..8 {
        assert_eq!(lot.admit(of(1, id, 2), 0), Admit::Park);
    }
    // Tenant 2 holds 2 and parks; tenant 3 holds 2 and parks a task younger than all.
    assert_eq!(lot.admit(of(2, 8, 2), 0), Admit::Start);
    assert_eq!(lot.admit(of(3, 9, 2), 0), Admit::Start);
    assert_eq!(lot.admit(of(2, 10, 2), 0), Admit::Park);
    assert_eq!(lot.admit(of(3, 11, 1), 0), Admit::Park);
    lot.check_invariants().expect("invariants");
    // Tenant 2 finishes: it uses 0, so its task goes first although tenant 1's are older;
    // then tenant 3 (using 2) fits the last unit; tenant 1 is at its cap.
    assert_eq!(lot.complete(8, 1).unwrap(), vec![10]);
    assert_eq!(lot.complete(9, 2).unwrap(), vec![11]);
    // Tenant 1 frees 3: now it uses least of those with parked tasks that fit.
    assert_eq!(lot.complete(1, 3).unwrap(), vec![3]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn equal_usage_goes_to_the_tenant_that_started_least_recently() {
    let mut lot = lot_with(
        PoolLimits::new(10, 1)
            .with_starvation(StarvationGuard::disabled())
            .with_fair_share(Some(FairShare::MaxUnitsPerTenant(10))),
    );
    assert_eq!(lot.admit(of(1, 1, 1), 0), Admit::Start);
    assert_eq!(lot.admit(of(1, 2, 1), 0), Admit::Park);
    assert_eq!(lot.admit(of(1, 3, 1), 0), Admit::Park);
    assert_eq!(lot.admit(of(2, 4, 1), 0), Admit::Park);
    // One worker: tenant 1's run ends, both tenants use nothing; tenant 2 never started.
    assert_eq!(lot.complete(1, 1).unwrap(), vec![4]);
    assert_eq!(lot.complete(4, 2).unwrap(), vec![2]);
    assert_eq!(lot.complete(2, 3).unwrap(), vec![3]);
}

#[test]
fn a_fraction_cap_is_taken_per_kind() {
    let capacity = Capacity::uniform(0)
        .with(ResourceKind::GpuVram, 24)
        .with(ResourceKind::Cpu, 4);
    let mut lot = lot_with(
        PoolLimits::new(1, 8)
            .with_capacity(capacity)
            .with_fair_share(Some(FairShare::MaxFraction(0.5))),
    );
    assert_eq!(lot.tenant_cap(ResourceKind::GpuVram), 12);
    assert_eq!(lot.tenant_cap(ResourceKind::Cpu), 2);
    let cpu = |id, units| Ticket {
        tenant: 5,
        cost: ResourceCost::cpu(units),
        ..normal(id, 0)
    };
    assert_eq!(lot.admit(cpu(1, 2), 0), Admit::Start);
    assert_eq!(lot.admit(cpu(2, 1), 0), Admit::Park);
    assert_eq!(
        lot.admit(of(5, 3, 12), 0),
        Admit::Start,
        "kinds are separate caps"
    );
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_starving_task_without_room_drains_its_own_tenant_not_the_pool() {
    let mut lot = lot_with(
        PoolLimits::new(10, 8)
            .with_starvation(StarvationGuard {
                max_park_ms: Some(10),
                max_skips: None,
            })
            .with_fair_share(Some(FairShare::MaxUnitsPerTenant(6))),
    );
    assert_eq!(lot.admit(of(1, 1, 4), 0), Admit::Start);
    assert_eq!(lot.admit(of(1, 2, 5), 0), Admit::Park); // 4 + 5 > 6
    lot.tick(20);
    assert_eq!(lot.state(2), Some(WakeState::Reserved));
    // Task 2 cannot start until tenant 1 frees room, so it reserves nothing for the pool:
    // tenant 2 still starts; tenant 1's own smaller task waits behind task 2.
    assert_eq!(lot.reservation(), None);
    assert_eq!(lot.admit(of(2, 3, 2), 20), Admit::Start);
    assert_eq!(lot.admit(of(1, 4, 1), 20), Admit::Park);
    lot.check_invariants().expect("invariants");
    assert_eq!(lot.complete(1, 30).unwrap(), vec![2, 4]);
    lot.check_invariants().expect("invariants");
}

// ---------------------------------------------------------------------------------------
// Rule 13: backfill
// ---------------------------------------------------------------------------------------

fn timed(id: TaskId, units: u32, timeout_ms: Option<u64>) -> Ticket {
    Ticket {
        timeout_ms,
        ..normal(id, units)
    }
}

/// 10 units, 4 workers; a task parked 10 ms is starving.
fn draining_lot(backfill: bool) -> ParkingLot {
    lot_with(
        PoolLimits::new(10, 4)
            .with_starvation(StarvationGuard {
                max_park_ms: Some(10),
                max_skips: None,
            })
            .with_backfill(backfill),
    )
}

#[test]
fn backfill_starts_tasks_that_end_before_the_reserved_task_could_start() {
    let mut lot = draining_lot(true);
    // Running: 6 units until t = 100, 2 units until t = 50.
    assert_eq!(lot.admit(timed(1, 6, Some(100)), 0), Admit::Start);
    assert_eq!(lot.admit(timed(2, 2, Some(50)), 0), Admit::Start);
    // Task 3 needs all 10: it can start once task 1 ends (t = 100), with nothing spare.
    assert_eq!(lot.admit(timed(3, 10, Some(10)), 0), Admit::Park);
    lot.tick(10);
    assert_eq!(lot.reservation(), Some(3));
    // 2 units free now. A task ending by t = 100 may start; one ending later may not, nor
    // one without a timeout.
    assert_eq!(lot.admit(timed(4, 2, Some(90)), 10), Admit::Start);
    assert_eq!(lot.complete(4, 40).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.admit(timed(5, 2, Some(61)), 40), Admit::Park);
    assert_eq!(lot.admit(timed(6, 1, None), 40), Admit::Park);
    assert_eq!(lot.admit(timed(7, 1, Some(60)), 40), Admit::Start);
    lot.check_invariants().expect("invariants");
    // Task 2 ends at 50: 3 free; parked task 5 (ends 111 if started now) still may not.
    assert_eq!(lot.complete(2, 50).unwrap(), Vec::<TaskId>::new());
    // Task 7 and then task 1 end: the reservation starts, then the rest behind it.
    assert_eq!(lot.complete(7, 60).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.complete(1, 100).unwrap(), vec![3]);
    assert_eq!(lot.complete(3, 110).unwrap(), vec![5, 6]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn backfill_also_starts_long_tasks_in_what_the_reservation_leaves_spare() {
    let mut lot = draining_lot(true);
    assert_eq!(lot.admit(timed(1, 6, Some(100)), 0), Admit::Start);
    // Task 3 needs 8: at t = 100 all 10 are free, 2 more than it needs.
    assert_eq!(lot.admit(timed(3, 8, Some(10)), 0), Admit::Park);
    lot.tick(10);
    assert_eq!(lot.reservation(), Some(3));
    // A long task fits the 2 spare units: it may run past t = 100.
    assert_eq!(lot.admit(timed(4, 2, Some(500)), 10), Admit::Start);
    // Now nothing is spare: a second long one waits, one ending by t = 100 still starts.
    assert_eq!(lot.admit(timed(5, 2, Some(500)), 10), Admit::Park);
    assert_eq!(lot.admit(timed(6, 2, Some(80)), 10), Admit::Start);
    lot.check_invariants().expect("invariants");
    assert_eq!(lot.complete(6, 90).unwrap(), Vec::<TaskId>::new());
    // The reservation starts when task 1 ends, as it would have without any backfill.
    assert_eq!(lot.complete(1, 100).unwrap(), vec![3]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn without_backfill_the_pool_drains() {
    let mut lot = draining_lot(false);
    assert_eq!(lot.admit(timed(1, 6, Some(100)), 0), Admit::Start);
    assert_eq!(lot.admit(timed(3, 8, Some(10)), 0), Admit::Park);
    lot.tick(10);
    assert_eq!(lot.admit(timed(4, 2, Some(5)), 10), Admit::Park);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_running_task_without_a_timeout_leaves_no_shadow_time_and_nothing_backfills() {
    let mut lot = draining_lot(true);
    assert_eq!(lot.admit(timed(1, 6, None), 0), Admit::Start);
    assert_eq!(lot.admit(timed(3, 8, None), 0), Admit::Park);
    lot.tick(10);
    assert_eq!(lot.reservation(), Some(3));
    assert_eq!(lot.admit(timed(4, 2, Some(1)), 10), Admit::Park);
    lot.check_invariants().expect("invariants");
}

#[test]
fn parked_tasks_backfill_on_a_completion_when_they_end_in_time() {
    let mut lot = draining_lot(true);
    assert_eq!(lot.admit(timed(1, 6, Some(100)), 0), Admit::Start);
    assert_eq!(lot.admit(timed(2, 4, Some(20)), 0), Admit::Start);
    assert_eq!(lot.admit(timed(3, 8, None), 0), Admit::Park);
    assert_eq!(lot.admit(timed(4, 3, Some(50)), 0), Admit::Park);
    assert_eq!(lot.admit(timed(5, 3, Some(95)), 0), Admit::Park);
    lot.tick(10);
    assert_eq!(lot.reservation(), Some(3));
    // Task 2 ends at 20: 4 free. Task 4 ends by 70 <= 100: it backfills; task 5 would end
    // at 115 > 100 and waits.
    assert_eq!(lot.complete(2, 20).unwrap(), vec![4]);
    lot.check_invariants().expect("invariants");
    assert_eq!(lot.complete(1, 100).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.complete(4, 60).unwrap(), vec![3]);
}

#[test]
fn of_the_tasks_that_may_backfill_the_largest_that_fits_goes_first() {
    let mut lot = draining_lot(true);
    assert_eq!(lot.admit(timed(1, 6, Some(100)), 0), Admit::Start);
    assert_eq!(lot.admit(timed(2, 4, Some(20)), 0), Admit::Start);
    assert_eq!(lot.admit(timed(3, 8, None), 0), Admit::Park);
    // Both end by t = 100 if started at t = 20; task 4 ranks ahead, task 5 is larger.
    assert_eq!(lot.admit(timed(4, 2, Some(50)), 0), Admit::Park);
    assert_eq!(lot.admit(timed(5, 4, Some(50)), 0), Admit::Park);
    lot.tick(10);
    assert_eq!(lot.reservation(), Some(3));
    // 4 units free: task 5 fills them; task 4 would have left 2 idle with task 5 parked.
    assert_eq!(lot.complete(2, 20).unwrap(), vec![5]);
    lot.check_invariants().expect("invariants");
    assert_eq!(lot.complete(5, 60).unwrap(), vec![4]);
    // The reservation still starts when task 1 ends.
    assert_eq!(lot.complete(4, 70).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.complete(1, 100).unwrap(), vec![3]);
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_higher_priority_backfill_goes_before_a_larger_lower_priority_one() {
    let mut lot = draining_lot(true);
    let with = |id, priority, units, timeout_ms| Ticket {
        timeout_ms,
        ..ticket(id, priority, units)
    };
    assert_eq!(lot.admit(timed(1, 6, Some(100)), 0), Admit::Start);
    assert_eq!(lot.admit(timed(2, 4, Some(20)), 0), Admit::Start);
    assert_eq!(lot.admit(with(3, Priority::High, 8, None), 0), Admit::Park);
    assert_eq!(
        lot.admit(with(4, Priority::Low, 4, Some(50)), 0),
        Admit::Park
    );
    assert_eq!(
        lot.admit(with(5, Priority::Normal, 2, Some(50)), 0),
        Admit::Park
    );
    lot.tick(10);
    assert_eq!(lot.reservation(), Some(3));
    // The normal task starts first although the low one would fill the 4 free units.
    assert_eq!(lot.complete(2, 20).unwrap(), vec![5]);
    lot.check_invariants().expect("invariants");
}
