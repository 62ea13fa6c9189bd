//! The permits' fast path from the outside: it is taken only while nobody waits, it never
//! lets a newcomer take units a waiter was owed, its holders are counted at once, and racing
//! it against the scheduler's path from many threads loses no unit and releases none twice.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use prometheus_parking_lot::{
    CapacityGate, PoolError, Priority, ResourceCost, ResourceKind, TaskMetadata, WorkerPoolConfig,
};

const WAIT: Duration = Duration::from_secs(10);

fn gate(units: u32) -> Arc<CapacityGate> {
    Arc::new(
        CapacityGate::new(
            WorkerPoolConfig::new()
                .with_max_units(units)
                .with_max_queue_depth(10_000),
        )
        .unwrap(),
    )
}

fn meta(id: u64, units: u32, priority: Priority) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_priority(priority)
}

fn used(gate: &CapacityGate) -> u64 {
    gate.stats().used_by_kind[ResourceKind::GpuVram.index()]
}

/// Waits (at most `WAIT`) until `done` holds.
fn until(what: &str, gate: &CapacityGate, done: impl Fn(&CapacityGate) -> bool) {
    let began = Instant::now();
    while !done(gate) {
        assert!(began.elapsed() < WAIT, "{what}: {:?}", gate.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_permit_on_an_idle_gate_is_counted_at_once() {
    let gate = gate(8);
    // One permit through whichever path is open, and back: from then on the gate is idle
    // and its lane open.
    drop(
        gate.acquire_blocking(meta(0, 8, Priority::Normal), WAIT)
            .unwrap(),
    );
    until("the gate is idle", &gate, |gate| {
        gate.stats().active_tasks == 0 && used(gate) == 0
    });
    let mut permits = Vec::new();
    for id in 1..=3 {
        permits.push(gate.try_acquire(meta(id, 2, Priority::Normal)).unwrap());
    }
    // No scheduler round trip: the counters know at once.
    let stats = gate.stats();
    assert_eq!((stats.active_tasks, used(&gate)), (3, 6), "{stats:?}");
    permits[0].try_grow(2).unwrap();
    assert_eq!(permits[0].units(), 4);
    assert_eq!(used(&gate), 8);
    assert_eq!(
        gate.try_acquire(meta(9, 1, Priority::Critical))
            .unwrap_err(),
        PoolError::WouldWait
    );
    permits[0].shrink(3);
    assert_eq!(permits[0].units(), 1);
    permits.clear();
    until("nothing held", &gate, |gate| {
        used(gate) == 0 && gate.stats().active_tasks == 0
    });
    // Every unit came back: the whole gate can be taken again.
    let all = gate.try_acquire(meta(10, 8, Priority::Low)).unwrap();
    assert_eq!(all.units(), 8);
}

/// While a waiter waits, units given back go to it, not to a newcomer that asks at the same
/// moment: a newcomer hammering `try_acquire` from another thread never gets a unit the
/// waiter was owed.
#[test]
fn a_newcomer_never_takes_the_units_a_waiter_is_owed() {
    for round in 0..20u64 {
        let gate = gate(4);
        let holder = gate
            .acquire_blocking(meta(1, 4, Priority::High), WAIT)
            .unwrap();
        let granted = Arc::new(AtomicBool::new(false));
        let waiter = std::thread::spawn({
            let (gate, granted) = (gate.clone(), granted.clone());
            move || {
                let permit = gate
                    .acquire_blocking(meta(2, 4, Priority::Low), WAIT)
                    .unwrap();
                granted.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                drop(permit);
            }
        });
        until("the waiter parks", &gate, |gate| {
            gate.stats().queued_tasks == 1
        });
        let stop = Arc::new(AtomicBool::new(false));
        let barged = Arc::new(AtomicU64::new(0));
        let newcomer = std::thread::spawn({
            let (gate, stop, barged, granted) =
                (gate.clone(), stop.clone(), barged.clone(), granted.clone());
            move || {
                let mut id = 1_000;
                while !stop.load(Ordering::SeqCst) {
                    id += 1;
                    if let Ok(permit) = gate.try_acquire(meta(id, 1, Priority::Critical)) {
                        if !granted.load(Ordering::SeqCst) {
                            barged.fetch_add(1, Ordering::SeqCst);
                        }
                        drop(permit);
                    }
                }
            }
        });
        std::thread::sleep(Duration::from_millis(round % 3));
        drop(holder);
        waiter.join().unwrap();
        stop.store(true, Ordering::SeqCst);
        newcomer.join().unwrap();
        assert_eq!(
            barged.load(Ordering::SeqCst),
            0,
            "round {round}: a newcomer took units the waiter was owed"
        );
        until("nothing held", &gate, |gate| used(gate) == 0);
    }
}

/// A fast-path holder counts for the deadlock rule and is asked to yield like any other.
#[test]
fn fast_path_holders_are_seen_by_the_deadlock_rule_and_preemption() {
    let gate = Arc::new(
        CapacityGate::new(WorkerPoolConfig::new().with_max_units(4).with_preemption(3)).unwrap(),
    );
    until("the gate is idle", &gate, |gate| {
        gate.stats().active_tasks == 0
    });
    let low = gate.try_acquire(meta(1, 2, Priority::Low)).unwrap();
    let normal = gate.try_acquire(meta(2, 2, Priority::Normal)).unwrap();
    // `low` waits to grow; `normal` holds without growing: no deadlock yet.
    let mut growing = low.grow_pending(1);
    until("the grow parks", &gate, |gate| {
        gate.stats().queued_tasks == 1
    });
    assert!(growing.check().is_pending());
    // Now every other holder waits to grow: refused at once.
    let mut refused = normal.grow_pending(1);
    let began = Instant::now();
    let outcome = loop {
        if let Poll::Ready(outcome) = refused.check() {
            break outcome;
        }
        assert!(began.elapsed() < WAIT, "the second grow was never answered");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        outcome.unwrap_err(),
        PoolError::WouldDeadlock {
            kind: ResourceKind::GpuVram
        }
    );
    drop(growing);
    until("the grow is withdrawn", &gate, |gate| {
        gate.stats().queued_tasks == 0
    });
    // A critical request that does not fit asks the low-priority fast-path holder to yield.
    let critical = std::thread::spawn({
        let gate = gate.clone();
        move || gate.acquire_blocking(meta(3, 2, Priority::Critical), WAIT)
    });
    let began = Instant::now();
    while !low.is_preempted() {
        assert!(
            began.elapsed() < WAIT,
            "the fast-path holder was never asked"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!normal.is_preempted(), "only the lowest priority is asked");
    drop(low);
    let granted = critical.join().unwrap().unwrap();
    assert_eq!(granted.units(), 2);
}

/// Threads acquire, grow, shrink and drop at random, on both paths at once (the lane opens
/// and closes as waiters come and go); at the end every unit is back and the books agree.
#[test]
fn racing_both_paths_loses_no_unit_and_releases_none_twice() {
    const UNITS: u32 = 16;
    let gate = gate(UNITS);
    let threads: Vec<_> = (0..4u64)
        .map(|thread| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (thread + 1);
                let mut next = move |below: u64| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state % below
                };
                let mut held = Vec::new();
                for step in 0..3_000u64 {
                    let id = thread * 1_000_000 + step;
                    let priority =
                        [Priority::Low, Priority::Normal, Priority::High][next(3) as usize];
                    match next(6) {
                        0 | 1 => {
                            if let Ok(permit) =
                                gate.try_acquire(meta(id, 1 + next(4) as u32, priority))
                            {
                                held.push(permit);
                            }
                        }
                        2 => {
                            let wait = Duration::from_micros(200);
                            if let Ok(permit) =
                                gate.acquire_blocking(meta(id, 1 + next(3) as u32, priority), wait)
                            {
                                held.push(permit);
                            }
                        }
                        3 if !held.is_empty() => {
                            let at = next(held.len() as u64) as usize;
                            let _ = held[at].try_grow(1 + next(2) as u32);
                        }
                        4 if !held.is_empty() => {
                            let at = next(held.len() as u64) as usize;
                            held[at].shrink(1);
                        }
                        _ if !held.is_empty() => {
                            let at = next(held.len() as u64) as usize;
                            drop(held.swap_remove(at));
                        }
                        _ => {}
                    }
                    let holding: u32 = held.iter().map(|permit| permit.units()).sum();
                    assert!(
                        holding <= UNITS,
                        "thread {thread} holds {holding} of {UNITS}"
                    );
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    until("every unit back", &gate, |gate| {
        used(gate) == 0 && gate.stats().active_tasks == 0 && gate.stats().queued_tasks == 0
    });
    let all = gate
        .acquire_blocking(meta(u64::MAX, UNITS, Priority::Low), WAIT)
        .unwrap();
    assert_eq!(all.units(), UNITS);
}
