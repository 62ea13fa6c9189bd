//! Rule 25: tickets of several kinds. A decode sequence needs KV-cache blocks (`gpu_vram`
//! here) and an engine slot (`cpu`); a provider call spends tokens (`io`) and a request
//! (`mixed`) from two budgets.

use std::time::Duration;

use super::tests::lot_with;
use super::*;
use crate::domain::{Budget, Capacity, FairShare, StarvationGuard};

const BLOCKS: ResourceKind = ResourceKind::GpuVram;
const SLOTS: ResourceKind = ResourceKind::Cpu;

/// A ticket of `blocks` KV-cache blocks and, if `slots > 0`, that many engine slots.
fn sequence(id: TaskId, priority: Priority, blocks: u32, slots: u32) -> Ticket {
    let cost = ResourceCost::gpu_vram(blocks);
    let also = match slots {
        0 => ExtraCosts::NONE,
        _ => ExtraCosts::new(cost, &[ResourceCost::cpu(slots)]).unwrap(),
    };
    Ticket {
        id,
        priority,
        cost,
        created_at_ms: id,
        deadline_ms: None,
        tenant: 0,
        timeout_ms: None,
        also,
    }
}

fn normal(id: TaskId, blocks: u32, slots: u32) -> Ticket {
    sequence(id, Priority::Normal, blocks, slots)
}

/// 100 KV-cache blocks, 2 engine slots, 8 worker slots.
fn engine() -> ParkingLot {
    lot_with(
        PoolLimits::new(0, 8)
            .with_capacity(Capacity::uniform(0).with(BLOCKS, 100).with(SLOTS, 2))
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard::disabled()),
    )
}

fn checked(lot: &ParkingLot) {
    lot.check_invariants().expect("invariants");
}

#[test]
fn a_ticket_starts_only_when_every_kind_fits_and_holds_them_all_until_it_ends() {
    let mut lot = engine();
    assert_eq!(lot.admit(normal(1, 10, 1), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 10, 1), 0), Admit::Start);
    assert_eq!((lot.used(BLOCKS), lot.used(SLOTS)), (20, 2));
    // Blocks are plenty, but both engine slots are held.
    assert_eq!(lot.admit(normal(3, 10, 1), 0), Admit::Park);
    assert_eq!(
        lot.why_waiting(3),
        Some(WaitReason::Units {
            kind: SLOTS,
            needed: 1,
            free: 0
        }),
        "the reason names the kind that blocks it, not the first"
    );
    checked(&lot);
    assert_eq!(lot.complete(1, 5).unwrap(), vec![3]);
    assert_eq!((lot.used(BLOCKS), lot.used(SLOTS)), (20, 2));
    lot.complete(2, 6).unwrap();
    lot.complete(3, 7).unwrap();
    assert_eq!((lot.used(BLOCKS), lot.used(SLOTS)), (0, 0));
    checked(&lot);
}

#[test]
fn skip_ahead_starts_the_best_ranked_ticket_that_fits_every_kind() {
    let mut lot = engine();
    assert_eq!(lot.admit(normal(1, 90, 1), 0), Admit::Start);
    // Blocks: 10 free. Slots: 1 free.
    assert_eq!(
        lot.admit(normal(2, 20, 1), 0),
        Admit::Park,
        "too many blocks"
    );
    assert_eq!(lot.admit(normal(3, 5, 2), 0), Admit::Park, "too many slots");
    assert_eq!(
        lot.admit(normal(4, 5, 1), 0),
        Admit::Start,
        "fits both: it starts ahead of the two that do not"
    );
    checked(&lot);
    // Task 1's end frees 90 blocks and a slot: 2 (ranked first) fits and starts; 3 needs
    // both slots and waits for 4 too.
    assert_eq!(lot.complete(1, 5).unwrap(), vec![2]);
    assert_eq!(lot.complete(4, 6).unwrap(), Vec::<TaskId>::new());
    assert_eq!(lot.complete(2, 7).unwrap(), vec![3]);
    checked(&lot);
}

#[test]
fn tickets_of_one_kind_and_of_several_keep_one_rank_order() {
    let mut lot = engine();
    assert_eq!(lot.admit(normal(1, 100, 1), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 30, 0), 0), Admit::Park);
    assert_eq!(lot.admit(normal(3, 30, 1), 0), Admit::Park);
    assert_eq!(
        lot.admit(sequence(4, Priority::High, 30, 1), 0),
        Admit::Park
    );
    assert_eq!(lot.admit(normal(5, 30, 0), 0), Admit::Park);
    // 100 blocks and a slot free: High first, then rank among equals, one kind or two.
    assert_eq!(lot.complete(1, 5).unwrap(), vec![4, 2, 3]);
    checked(&lot);
}

#[test]
fn a_cost_of_another_kind_beyond_the_pool_is_refused_naming_that_kind() {
    let mut lot = engine();
    assert_eq!(
        lot.admit(normal(1, 10, 3), 0),
        Admit::Reject(Rejection::InsufficientResources {
            kind: SLOTS,
            needed: 3,
            capacity: 2
        })
    );
    assert!(!lot.is_live(1));
    checked(&lot);
}

#[test]
fn a_pool_whose_rules_count_one_kind_refuses_a_ticket_of_several() {
    let limits =
        PoolLimits::new(0, 8).with_capacity(Capacity::uniform(0).with(BLOCKS, 100).with(SLOTS, 2));
    let mut fair = lot_with(limits.with_fair_share(Some(FairShare::MaxUnitsPerTenant(50))));
    let refused = fair.admit(normal(1, 10, 1), 0);
    assert_eq!(
        refused,
        Admit::Reject(Rejection::SeveralKinds {
            rule: "a fair share"
        })
    );
    let message = Rejection::SeveralKinds {
        rule: "a fair share",
    }
    .to_string();
    assert!(message.contains("give the task one cost"), "{message}");
    let mut bounded = lot_with(limits.with_max_queued_units(Some(500)));
    assert_eq!(
        bounded.admit(normal(1, 10, 1), 0),
        Admit::Reject(Rejection::SeveralKinds {
            rule: "max_queued_units"
        })
    );
    assert_eq!(bounded.admit(normal(2, 10, 0), 0), Admit::Start);
}

#[test]
fn budgets_of_two_kinds_are_spent_together_or_not_at_all() {
    // 1,000 tokens and 2 requests a second, each a budget.
    let (tokens, requests) = (ResourceKind::Io, ResourceKind::Mixed);
    let mut lot = lot_with(
        PoolLimits::new(0, 8)
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard::disabled())
            .with_budget(tokens, Budget::new(1_000, Duration::from_secs(1)))
            .with_budget(requests, Budget::new(2, Duration::from_secs(1))),
    );
    let call = |id, units| {
        let cost = ResourceCost::io(units);
        Ticket {
            also: ExtraCosts::new(cost, &[ResourceCost::mixed(1)]).unwrap(),
            ..Ticket::from(&crate::domain::TaskMetadata::new(id, cost))
        }
    };
    assert_eq!(lot.admit(call(1, 100), 0), Admit::Start);
    assert_eq!(lot.admit(call(2, 100), 0), Admit::Start);
    assert_eq!(
        (lot.budget_level(tokens), lot.budget_level(requests)),
        (Some(800), Some(0))
    );
    // Tokens are left, requests are not: nothing is spent, it waits.
    assert_eq!(lot.admit(call(3, 100), 0), Admit::Park);
    assert_eq!(lot.budget_level(tokens), Some(800));
    assert!(matches!(
        lot.why_waiting(3),
        Some(WaitReason::Budget { kind, .. }) if kind == requests
    ));
    // A request comes back after 500 ms: the lot wakes for it.
    assert_eq!(lot.next_wakeup(), Some(500));
    assert_eq!(lot.tick(500).started, vec![3]);
    // The tokens refilled to the burst (1,000) and task 3 spent 100 of them.
    assert_eq!(
        (lot.budget_level(tokens), lot.budget_level(requests)),
        (Some(900), Some(0))
    );
    checked(&lot);
    for id in [1, 2, 3] {
        lot.complete(id, 600).unwrap();
    }
    checked(&lot);
}

#[test]
fn a_cancelled_or_expired_ticket_of_several_kinds_leaves_every_index() {
    let mut lot = engine();
    assert_eq!(lot.admit(normal(1, 100, 2), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 10, 1), 0), Admit::Park);
    let expiring = Ticket {
        deadline_ms: Some(50),
        ..normal(3, 10, 1)
    };
    assert_eq!(lot.admit(expiring, 0), Admit::Park);
    assert_eq!(
        lot.cancel(2, 10).unwrap(),
        Cancel::Parked {
            started: Vec::new()
        }
    );
    assert_eq!(lot.tick(50).expired, vec![3]);
    assert_eq!(lot.parked_len(), 0);
    checked(&lot);
    assert!(lot.complete(1, 60).unwrap().is_empty());
    assert_eq!((lot.used(BLOCKS), lot.used(SLOTS)), (0, 0));
}

#[test]
fn a_starving_ticket_of_several_kinds_is_reserved_and_nothing_backfills_past_it() {
    let mut lot = lot_with(
        PoolLimits::new(0, 8)
            .with_capacity(Capacity::uniform(0).with(BLOCKS, 100).with(SLOTS, 2))
            .with_max_queue_depth(100)
            .with_starvation(StarvationGuard {
                max_park_ms: Some(100),
                max_skips: None,
            })
            .with_backfill(true),
    );
    let short = |ticket: Ticket| Ticket {
        timeout_ms: Some(10),
        ..ticket
    };
    assert_eq!(lot.admit(short(normal(1, 60, 1)), 0), Admit::Start);
    assert_eq!(lot.admit(normal(2, 60, 1), 0), Admit::Park);
    assert_eq!(lot.tick(100).started, Vec::<TaskId>::new());
    assert_eq!(lot.reservation(), Some(2));
    // A newcomer ranked below it fits (20 blocks, a slot) and ends long before task 1
    // does, but it is of several kinds: it does not backfill.
    assert_eq!(lot.admit(short(normal(3, 20, 1)), 100), Admit::Park);
    assert_eq!(
        lot.why_waiting(3),
        Some(WaitReason::Reserved { reserved: 2 })
    );
    checked(&lot);
    assert_eq!(lot.complete(1, 101).unwrap(), vec![2, 3]);
    checked(&lot);
}

#[test]
fn a_sleeper_and_a_held_child_keep_their_costs_of_every_kind() {
    let mut lot = engine();
    assert_eq!(lot.admit(normal(1, 10, 2), 0), Admit::Start);
    lot.park_until(normal(2, 10, 1), 100, 0).unwrap();
    assert_eq!(
        lot.admit_after(normal(3, 10, 1), &[1], false, 0),
        Admit::Park
    );
    assert!(lot.tick(100).started.is_empty(), "no slot free for task 2");
    assert_eq!(
        lot.why_waiting(2),
        Some(WaitReason::Units {
            kind: SLOTS,
            needed: 1,
            free: 0
        })
    );
    assert_eq!(lot.complete(1, 101).unwrap(), vec![2]);
    let released = lot.parent_ended(1, true, 101);
    assert_eq!((released.started, released.cancelled), (vec![3], vec![]));
    assert_eq!((lot.used(BLOCKS), lot.used(SLOTS)), (20, 2));
    checked(&lot);
}

#[test]
fn preemption_asks_for_enough_of_every_kind_the_waiter_lacks() {
    let mut lot = engine();
    // Two low-priority permits: one holds blocks, the other both slots.
    assert_eq!(
        lot.admit_permit(sequence(1, Priority::Low, 90, 0), 0),
        Admit::Start
    );
    let slots_holder = Ticket {
        cost: ResourceCost::cpu(2),
        ..sequence(2, Priority::Low, 0, 0)
    };
    assert_eq!(lot.admit_permit(slots_holder, 0), Admit::Start);
    assert_eq!(
        lot.admit_permit(sequence(3, Priority::High, 50, 1), 0),
        Admit::Park
    );
    let mut victims = lot.preemption_victims(3, 0, |_| true).unwrap();
    victims.sort_unstable();
    assert_eq!(
        victims,
        vec![1, 2],
        "blocks from one, a slot from the other"
    );
    // Only the slots' holder is allowed to yield: the blocks cannot be covered.
    assert_eq!(lot.preemption_victims(3, 0, |id| id == 2), None);
    checked(&lot);
}

/// A stored ticket is restored only where the pool would admit it now: one of several kinds
/// into a pool that counts one kind per ticket, or one asking for more of a kind than the
/// pool has, is refused by each way back in (plain, at an instant, behind a parent), and
/// nothing of it stays in the lot.
#[test]
fn a_stored_ticket_the_pool_would_refuse_now_is_refused_on_every_way_back_in() {
    let bounded = || {
        lot_with(
            PoolLimits::new(0, 8)
                .with_capacity(Capacity::uniform(0).with(BLOCKS, 100).with(SLOTS, 2))
                .with_max_queued_units(Some(1_000))
                .with_starvation(StarvationGuard::disabled()),
        )
    };
    let several = Rejection::SeveralKinds {
        rule: "max_queued_units",
    };
    let mut lot = bounded();
    assert_eq!(lot.restore(normal(1, 10, 1), 0), Err(several.clone()));
    assert_eq!(
        lot.park_until(normal(2, 10, 1), 50, 0),
        Err(several.clone())
    );
    lot.restore(normal(3, 10, 0), 0).unwrap();
    assert_eq!(
        lot.restore_after(normal(4, 10, 1), &[3], false, 0),
        Err(several)
    );
    for id in [1, 2, 4] {
        assert!(!lot.is_live(id), "ticket {id} is not in the lot");
    }
    // 3 was restored; it starts, and the refused ones never do.
    assert_eq!(lot.tick(60).started, vec![3]);
    checked(&lot);

    let mut lot = engine();
    assert_eq!(
        lot.restore(normal(5, 10, 3), 0),
        Err(Rejection::InsufficientResources {
            kind: SLOTS,
            needed: 3,
            capacity: 2,
        })
    );
    assert_eq!(
        lot.restore(normal(6, 101, 1), 0),
        Err(Rejection::InsufficientResources {
            kind: BLOCKS,
            needed: 101,
            capacity: 100,
        })
    );
    // One past its deadline is restored, and its tick expires it.
    let mut late = normal(7, 10, 1);
    late.deadline_ms = Some(5);
    lot.restore(late, 10).unwrap();
    assert_eq!(lot.tick(10).expired, vec![7]);
    checked(&lot);
}
