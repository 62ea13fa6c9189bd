//! Property tests of the core's fair share and backfill (rules 12 and 13): random event
//! sequences against the pure `ParkingLot`, with the bounds `PARKING_LOT.md` states checked
//! on every event.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
use prometheus_parking_lot::core::{FairShare, PoolLimits, StarvationGuard, WakeState};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::{Priority, ResourceCost, ResourceKind};
use proptest::prelude::*;

const VRAM: ResourceKind = ResourceKind::GpuVram;
/// The pool's VRAM in every test here.
const CAPACITY: u32 = 12;

fn limits(slots: usize, guard: StarvationGuard, share: Option<FairShare>) -> PoolLimits {
    PoolLimits::new(CAPACITY, slots)
        .with_max_queue_depth(10_000)
        .with_starvation(guard)
        .with_fair_share(share)
}

fn guard() -> impl Strategy<Value = StarvationGuard> {
    prop_oneof![
        Just(StarvationGuard::disabled()),
        (5..40u64).prop_map(|ms| StarvationGuard {
            max_park_ms: Some(ms),
            max_skips: None
        }),
        (1..6u32, 5..40u64).prop_map(|(skips, ms)| StarvationGuard {
            max_park_ms: Some(ms),
            max_skips: Some(skips)
        }),
    ]
}

fn share() -> impl Strategy<Value = FairShare> {
    prop_oneof![
        (1..=CAPACITY).prop_map(FairShare::MaxUnitsPerTenant),
        (0.05..=1.0f64).prop_map(FairShare::MaxFraction),
    ]
}

// ---------------------------------------------------------------------------------------
// The cap is never exceeded
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Admit {
        tenant: u64,
        priority: Priority,
        units: u32,
        timeout: Option<u64>,
    },
    Complete(usize),
    Cancel(usize),
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..4u64, 0..4usize, 0..=CAPACITY, prop::option::weighted(0.7, 1..60u64))
            .prop_map(|(tenant, p, units, timeout)| Op::Admit {
                tenant, priority: Priority::ALL[p], units, timeout
            }),
        3 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (1..30u64).prop_map(Op::Tick),
    ]
}

/// What the test knows of each task, independent of the core.
struct Model {
    lot: ParkingLot,
    cap: u32,
    now: u64,
    next_id: TaskId,
    tickets: HashMap<TaskId, Ticket>,
    running: BTreeSet<TaskId>,
    parked: BTreeSet<TaskId>,
}

impl Model {
    fn start(&mut self, ids: &[TaskId]) {
        for id in ids {
            assert!(self.parked.remove(id), "started task {id} was not parked");
            assert!(self.running.insert(*id), "task {id} started twice");
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Admit {
                tenant,
                priority,
                units,
                timeout,
            } => {
                let id = self.next_id;
                self.next_id += 1;
                let ticket = Ticket {
                    id,
                    priority,
                    cost: ResourceCost::gpu_vram(units),
                    created_at_ms: self.now,
                    deadline_ms: None,
                    tenant,
                    timeout_ms: timeout,
                    also: Default::default(),
                };
                match self.lot.admit(ticket, self.now) {
                    Admit::Start => assert!(self.running.insert(id)),
                    Admit::StartWith(unblocked) => {
                        assert!(self.running.insert(id));
                        self.start(&unblocked);
                    }
                    Admit::Park => assert!(self.parked.insert(id)),
                    Admit::Reject(_) => assert!(units > self.cap, "task within the cap refused"),
                    Admit::Expire => panic!("no deadlines here"),
                    Admit::ParkShedding { .. } => panic!("a queue of 10,000 is never full here"),
                }
                self.tickets.insert(id, ticket);
            }
            Op::Complete(pick) => {
                if let Some(&id) = self.running.iter().nth(pick % self.running.len().max(1)) {
                    self.running.remove(&id);
                    let started = self.lot.complete(id, self.now).expect("running");
                    self.start(&started);
                }
            }
            Op::Cancel(pick) => {
                if let Some(&id) = self.parked.iter().nth(pick % self.parked.len().max(1)) {
                    self.parked.remove(&id);
                    match self.lot.cancel(id, self.now).expect("parked") {
                        prometheus_parking_lot::core::scheduling::Cancel::Parked { started } => {
                            self.start(&started)
                        }
                        other => panic!("parked task cancelled as {other:?}"),
                    }
                }
            }
            Op::Tick(delta) => {
                self.now += delta;
                let tick = self.lot.tick(self.now);
                self.start(&tick.started);
            }
        }
        self.check();
    }

    /// The cap holds for every tenant, in the test's own books and the core's.
    fn check(&self) {
        self.lot.check_invariants().expect("core invariants");
        let mut held: BTreeMap<u64, u32> = BTreeMap::new();
        for id in &self.running {
            let ticket = &self.tickets[id];
            *held.entry(ticket.tenant).or_default() += ticket.cost.units;
        }
        for (tenant, units) in held {
            assert!(
                units <= self.cap,
                "tenant {tenant} holds {units} > cap {}",
                self.cap
            );
            assert_eq!(self.lot.tenant_used(tenant, VRAM), units);
        }
        assert_eq!(self.lot.running_len(), self.running.len());
        assert_eq!(self.lot.parked_len(), self.parked.len());
    }
}

// ---------------------------------------------------------------------------------------
// A flooding tenant cannot delay another tenant's task beyond the bound
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum FloodOp {
    /// The flooder (tenant 1) submits a task of at most the probe's priority.
    Flood {
        low: bool,
        units: u32,
    },
    /// A running task ends.
    Complete(usize),
    Tick(u64),
    /// The light tenant (tenant 2) submits its probe, if it has nothing live.
    Probe {
        units: u32,
    },
}

fn flood_op() -> impl Strategy<Value = FloodOp> {
    prop_oneof![
        6 => (any::<bool>(), 0..=CAPACITY).prop_map(|(low, units)| FloodOp::Flood { low, units }),
        3 => any::<usize>().prop_map(FloodOp::Complete),
        1 => (1..30u64).prop_map(FloodOp::Tick),
        2 => (0..=CAPACITY).prop_map(|units| FloodOp::Probe { units }),
    ]
}

const FLOODER: u64 = 1;
const LIGHT: u64 = 2;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random tenants, priorities, costs, timeouts, starvation guards and caps: no tenant's
    /// running units ever pass the cap, and every core invariant holds after every event.
    #[test]
    fn the_cap_is_never_exceeded(
        guard in guard(),
        share in share(),
        backfill in any::<bool>(),
        slots in 1..6usize,
        ops in prop::collection::vec(op(), 1..250),
    ) {
        let limits = limits(slots, guard, Some(share)).with_backfill(backfill);
        let mut model = Model {
            lot: ParkingLot::new(limits).unwrap(),
            cap: share.cap(CAPACITY),
            now: 1_000,
            next_id: 1,
            tickets: HashMap::new(),
            running: BTreeSet::new(),
            parked: BTreeSet::new(),
        };
        for op in &ops {
            model.apply(op);
        }
        while let Some(&id) = model.running.first() {
            model.running.remove(&id);
            let started = model.lot.complete(id, model.now).unwrap();
            model.start(&started);
            model.check();
        }
        prop_assert_eq!(model.lot.parked_len(), 0, "everything parked ran in the end");
    }

    /// The bound of `PARKING_LOT.md`: a task of a tenant with nothing else live, costing at
    /// most the capacity less the cap, of a priority at least the flooder's, starts at
    /// admission when a worker slot is idle, and otherwise by the second completion after
    /// it (whatever the flooder parked before it, however old).
    #[test]
    fn a_flooding_tenant_delays_another_by_at_most_two_completions(
        guard in guard(),
        cap in 1..CAPACITY,
        slots in 1..5usize,
        ops in prop::collection::vec(flood_op(), 1..300),
    ) {
        let share = FairShare::MaxUnitsPerTenant(cap);
        let mut lot = ParkingLot::new(limits(slots, guard, Some(share))).unwrap();
        let mut now = 1_000;
        let mut next_id = 1;
        let mut running: Vec<TaskId> = Vec::new();
        // The probe waiting, and how many completions it has seen parked.
        let mut probe: Option<(TaskId, u32)> = None;
        let mut probe_running: Option<TaskId> = None;
        for op in &ops {
            let mut started = Vec::new();
            let mut completed = false;
            match *op {
                FloodOp::Flood { low, units } => {
                    let id = next_id;
                    next_id += 1;
                    let priority = if low { Priority::Low } else { Priority::Normal };
                    let ticket = ticket(id, FLOODER, priority, units.min(cap), now);
                    if let (Admit::Start, unblocked) = lot.admit(ticket, now).split_started() {
                        started.push(id);
                        started.extend(unblocked);
                    }
                }
                FloodOp::Complete(pick) => {
                    if !running.is_empty() {
                        let id = running.remove(pick % running.len());
                        started = lot.complete(id, now).unwrap();
                        if probe_running == Some(id) {
                            probe_running = None;
                        }
                        completed = true;
                    }
                }
                FloodOp::Tick(delta) => {
                    now += delta;
                    started = lot.tick(now).started;
                }
                FloodOp::Probe { units } => {
                    if probe.is_none() && probe_running.is_none() {
                        let id = next_id;
                        next_id += 1;
                        let units = units.min(CAPACITY - cap).min(cap);
                        let slot_idle = lot.busy_workers() < slots;
                        let admit = lot.admit(ticket(id, LIGHT, Priority::Normal, units, now), now);
                        match admit.split_started() {
                            (Admit::Start, unblocked) => {
                                probe_running = Some(id);
                                started.push(id);
                                started.extend(unblocked);
                            }
                            (Admit::Park, _) => {
                                prop_assert!(!slot_idle, "probe parked with a worker slot idle");
                                probe = Some((id, 0));
                            }
                            (other, _) => prop_assert!(false, "probe answered {:?}", other),
                        }
                    }
                }
            }
            running.extend(&started);
            if let Some((id, seen)) = probe {
                if started.contains(&id) {
                    probe = None;
                    probe_running = Some(id);
                } else if completed {
                    prop_assert!(seen < 1, "probe {} still parked after two completions", id);
                    probe = Some((id, seen + 1));
                }
            }
            for tenant in [FLOODER, LIGHT] {
                prop_assert!(lot.tenant_used(tenant, VRAM) <= cap);
            }
            lot.check_invariants().map_err(TestCaseError::fail)?;
        }
    }

    /// Backfill keeps the reservation's bound: with one priority (so no task ranked ahead of
    /// a reserved task arrives after it) and every run ending by its timeout, a task that
    /// becomes the reservation starts no later than the last end time (start plus timeout)
    /// of the tasks running when it did: the bound without backfill.
    #[test]
    fn backfill_never_delays_the_reservation_past_its_drain_bound(
        max_park_ms in 5..40u64,
        slots in 1..5usize,
        arrivals in prop::collection::vec((0..20u64, 1..=CAPACITY, 1..80u64, 0..=100u64), 1..120),
    ) {
        let guard = StarvationGuard { max_park_ms: Some(max_park_ms), max_skips: None };
        let mut lot = ParkingLot::new(limits(slots, guard, None)).unwrap();
        // (end time, id) of running tasks; each ends at a fraction of its timeout.
        let mut ends: BTreeSet<(u64, TaskId)> = BTreeSet::new();
        let mut end_bound: HashMap<TaskId, u64> = HashMap::new();
        let mut pending: HashMap<TaskId, (u64, u64)> = HashMap::new(); // id -> (timeout, run)
        let mut reservation: Option<(TaskId, u64)> = None; // id, bound
        let mut now = 0u64;
        let mut arrivals = arrivals.into_iter().enumerate();
        let mut next_arrival = arrivals.next();
        loop {
            let arrival_at = next_arrival.as_ref().map(|(_, (gap, ..))| now + gap);
            let end_at = ends.first().map(|&(at, _)| at);
            let wake_at = lot.next_wakeup();
            let Some(at) = [arrival_at, end_at, wake_at].into_iter().flatten().min() else {
                break;
            };
            now = now.max(at);
            let mut started = Vec::new();
            if end_at == Some(now) {
                let (_, id) = ends.pop_first().unwrap();
                started.extend(lot.complete(id, now).unwrap());
            } else if arrival_at == Some(now) {
                let (index, (_, units, timeout, percent)) = next_arrival.take().unwrap();
                next_arrival = arrivals.next();
                let id = index as TaskId + 1;
                let ticket = Ticket {
                    timeout_ms: Some(timeout),
                    ..ticket(id, 0, Priority::Normal, units, now)
                };
                pending.insert(id, (timeout, timeout * percent / 100));
                if lot.admit(ticket, now) == Admit::Start {
                    started.push(id);
                }
            } else {
                started.extend(lot.tick(now).started);
            }
            for id in started {
                let (timeout, run) = pending.remove(&id).unwrap();
                ends.insert((now + run, id));
                end_bound.insert(id, now + timeout);
            }
            if let Some((id, bound)) = reservation {
                if lot.state(id) == Some(WakeState::Running) {
                    prop_assert!(now <= bound, "reserved task {} started at {} after its bound {}", id, now, bound);
                    reservation = None;
                } else {
                    prop_assert!(now <= bound, "reserved task {} still waits at {} past its bound {}", id, now, bound);
                }
            }
            if reservation.is_none() {
                if let Some(id) = lot.reservation() {
                    let bound = ends.iter().map(|&(_, id)| end_bound[&id]).max().unwrap_or(now);
                    reservation = Some((id, bound));
                }
            }
            lot.check_invariants().map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(lot.parked_len(), 0);
    }
}

fn ticket(id: TaskId, tenant: u64, priority: Priority, units: u32, now: u64) -> Ticket {
    Ticket {
        id,
        priority,
        cost: ResourceCost::gpu_vram(units),
        created_at_ms: now,
        deadline_ms: None,
        tenant,
        timeout_ms: None,
        also: Default::default(),
    }
}
