//! Rule 17: the reason a parked ticket gives, against an explanation worked out from scratch
//! (sums over the running claims, scans of the slots), on random schedules.

use proptest::prelude::*;

use super::tests::lot_with;
use super::*;
use crate::domain::{Budget, FairShare, StarvationGuard};

#[derive(Debug, Clone)]
enum Op {
    Admit {
        tenant: u64,
        io: bool,
        units: u32,
        priority: usize,
        permit: bool,
    },
    Sleep {
        tenant: u64,
        units: u32,
        for_ms: u64,
    },
    Complete {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
    Headroom {
        units: Option<u32>,
    },
    Pause,
    Resume,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..3u64, any::<bool>(), 0..12u32, 0..4usize, prop::bool::weighted(0.2)).prop_map(
            |(tenant, io, units, priority, permit)| Op::Admit { tenant, io, units, priority, permit }
        ),
        1 => (0..3u64, 0..10u32, 1..500u64).prop_map(|(tenant, units, for_ms)| Op::Sleep { tenant, units, for_ms }),
        3 => (0..16usize).prop_map(|pick| Op::Complete { pick }),
        2 => (1..300u64).prop_map(|ms| Op::Advance { ms }),
        1 => proptest::option::of(0..10u32).prop_map(|units| Op::Headroom { units }),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
    ]
}

/// The explanation from scratch, in the rule's order.
fn explained(lot: &ParkingLot, id: TaskId) -> Option<WaitReason> {
    if let Some(&(until_ms, _)) = lot.sleepers.get(&id) {
        return Some(WaitReason::Sleeping {
            until_ms: u128::from(until_ms),
        });
    }
    let parked = lot.parked.get(&id)?;
    if lot.paused {
        return Some(WaitReason::Paused);
    }
    let (kind, needed) = (parked.kind, parked.units);
    let held: u32 = lot
        .running
        .values()
        .filter(|claim| claim.kind == kind)
        .map(|claim| claim.units)
        .sum();
    let free = (lot.limits.capacity.get(kind) - held).min(lot.headroom[kind.index()]);
    if needed > free {
        return Some(WaitReason::Units { kind, needed, free });
    }
    if let Some(budget) = lot.budget(kind) {
        if needed > budget.free() {
            return Some(WaitReason::Budget {
                kind,
                needed,
                level: budget.level(),
                ready_at_ms: u128::from(budget.ready_at(needed)),
            });
        }
    }
    if let Some(book) = &lot.tenants {
        let tenant = book.tenant_of(id);
        let used: u32 = lot
            .running
            .values()
            .filter(|claim| claim.kind == kind && claim.tenant == tenant)
            .map(|claim| claim.units)
            .sum();
        let room = book.cap(kind).saturating_sub(used);
        if needed > room {
            return Some(WaitReason::TenantShare { kind, needed, room });
        }
    }
    let busy = lot
        .running
        .values()
        .filter(|claim| claim.worker != NO_WORKER)
        .count();
    let idle = (0..lot.worker_slots as usize)
        .filter(|&slot| !lot.retired[slot] && !lot.resting[slot])
        .filter(|&slot| {
            lot.running
                .values()
                .all(|claim| claim.worker as usize != slot)
        })
        .count();
    if !parked.slotless && idle == 0 {
        return Some(WaitReason::Worker { busy });
    }
    let rank = parked.rank(id);
    let held_back = match &lot.tenants {
        None => lot
            .starving
            .iter()
            .min()
            .filter(|reserved| reserved.id() != id && reserved.ranks_ahead_of(&rank))
            .map(|reserved| reserved.id()),
        // The fair order's reservation is the fair-share module's to compute.
        Some(_) => lot.holding_back(id, rank),
    };
    if let Some(reserved) = held_back {
        return Some(WaitReason::Reserved { reserved });
    }
    let ahead = lot
        .parked
        .iter()
        .filter(|(&other, other_parked)| other_parked.rank(other) < rank)
        .count();
    Some(WaitReason::Behind { ahead })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_parked_ticket_gives_the_reason_worked_out_from_scratch(
        workers in 1..4usize,
        fair in any::<bool>(),
        budget in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let mut limits = PoolLimits::new(10, workers)
            .with_max_queue_depth(1_000)
            .with_starvation(StarvationGuard { max_park_ms: Some(400), max_skips: Some(3) })
            .with_fair_share(fair.then_some(FairShare::MaxUnitsPerTenant(6)));
        if budget {
            limits = limits.with_budget(
                ResourceKind::Io,
                Budget::new(10, std::time::Duration::from_millis(500)),
            );
        }
        let mut lot = lot_with(limits);
        let mut now = 0;
        for (n, step) in ops.iter().enumerate() {
            let id = n as TaskId + 1;
            let ticket = |tenant, io: bool, units, priority: usize| Ticket {
                id,
                priority: Priority::ALL[priority],
                cost: if io { ResourceCost::io(units) } else { ResourceCost::gpu_vram(units) },
                created_at_ms: now,
                deadline_ms: None,
                tenant,
                timeout_ms: None,
                also: Default::default(),
            };
            match *step {
                Op::Admit { tenant, io, units, priority, permit } => {
                    let ticket = ticket(tenant, io, units, priority);
                    let _ = if permit { lot.admit_permit(ticket, now) } else { lot.admit(ticket, now) };
                }
                Op::Sleep { tenant, units, for_ms } => {
                    let _ = lot.park_until(ticket(tenant, false, units, 1), now + for_ms, now);
                }
                Op::Complete { pick } => {
                    let mut running: Vec<TaskId> = lot.running.keys().copied().collect();
                    running.sort_unstable();
                    if let Some(&id) = running.get(pick % running.len().max(1)) {
                        lot.complete(id, now).expect("running");
                    }
                }
                Op::Advance { ms } => {
                    now += ms;
                    lot.tick(now);
                }
                Op::Headroom { units } => {
                    lot.set_headroom(ResourceKind::GpuVram, units, now);
                }
                Op::Pause => lot.pause(),
                Op::Resume => {
                    lot.resume(now);
                }
            }
            lot.check_invariants().map_err(TestCaseError::fail)?;
            let mut waiting: Vec<TaskId> = lot.parked.keys().chain(lot.sleepers.keys()).copied().collect();
            waiting.sort_unstable();
            for id in waiting {
                let reason = lot.why_waiting(id);
                prop_assert_eq!(&reason, &explained(&lot, id), "ticket {} after {:?}", id, step);
                if !fair {
                    // Saturation: without a fair share, a ticket that meets no obstacle
                    // and no reservation would have started.
                    prop_assert!(
                        !matches!(reason, Some(WaitReason::Behind { .. })),
                        "ticket {} waits for nothing: {:?}", id, reason
                    );
                }
            }
            for id in lot.running.keys() {
                prop_assert_eq!(lot.why_waiting(*id), None);
            }
        }
    }
}

#[test]
fn each_reason_names_its_obstacle() {
    let mut lot = lot_with(
        PoolLimits::new(10, 2)
            .with_starvation(StarvationGuard::disabled())
            .with_fair_share(Some(FairShare::MaxUnitsPerTenant(6)))
            .with_budget(
                ResourceKind::Io,
                Budget::new(6, std::time::Duration::from_secs(1)),
            ),
    );
    let vram = |id, tenant, units| Ticket {
        id,
        priority: Priority::Normal,
        cost: ResourceCost::gpu_vram(units),
        created_at_ms: id,
        deadline_ms: None,
        tenant,
        timeout_ms: None,
        also: Default::default(),
    };
    let io = |id, units| Ticket {
        cost: ResourceCost::io(units),
        ..vram(id, 9, 0)
    };
    assert_eq!(lot.admit(vram(1, 1, 6), 0), Admit::Start);
    assert_eq!(lot.admit(vram(2, 1, 1), 0), Admit::Park);
    assert_eq!(
        lot.why_waiting(2),
        Some(WaitReason::TenantShare {
            kind: ResourceKind::GpuVram,
            needed: 1,
            room: 0
        })
    );
    assert_eq!(lot.admit(vram(3, 2, 5), 0), Admit::Park);
    assert_eq!(
        lot.why_waiting(3),
        Some(WaitReason::Units {
            kind: ResourceKind::GpuVram,
            needed: 5,
            free: 4
        })
    );
    assert_eq!(lot.admit(io(4, 6), 0), Admit::Start);
    assert_eq!(lot.admit(io(5, 3), 0), Admit::Park);
    assert_eq!(
        lot.why_waiting(5),
        Some(WaitReason::Budget {
            kind: ResourceKind::Io,
            needed: 3,
            level: 0,
            ready_at_ms: 500
        })
    );
    // Task 4's slot frees at 600, when the bucket holds 3.6 units: task 5 starts, and both
    // slots are busy again (tasks 1 and 5).
    assert_eq!(lot.complete(4, 600).unwrap(), vec![5]);
    assert_eq!(lot.admit(io(6, 0), 600), Admit::Park);
    assert_eq!(lot.why_waiting(6), Some(WaitReason::Worker { busy: 2 }));
    lot.park_until(vram(7, 2, 1), 900, 600).unwrap();
    assert_eq!(
        lot.why_waiting(7),
        Some(WaitReason::Sleeping { until_ms: 900 })
    );
}
