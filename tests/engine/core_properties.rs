//! Property tests of the pure parking-lot core: random event sequences, invariants checked
//! after every event.

use std::collections::{BTreeSet, HashMap};

use prometheus_parking_lot::core::scheduling::{Admit, Cancel, ParkingLot, RankKey, Ticket};
use prometheus_parking_lot::core::{Capacity, PoolLimits, StarvationGuard, WakeState};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::{ExtraCosts, Priority, ResourceCost, ResourceKind};
use proptest::prelude::*;

const MAX_PARK_MS: u64 = 40;
const KINDS: [ResourceKind; 2] = [ResourceKind::GpuVram, ResourceKind::Cpu];

#[derive(Debug, Clone)]
enum Op {
    Admit {
        priority: Priority,
        kind: usize,
        units: u32,
        age: u64,
        deadline_in: Option<u64>,
        /// Units of the other kind it needs too (rule 25), if any.
        also: Option<u32>,
    },
    Complete(usize),
    Cancel(usize),
    Tick(u64),
    /// Give the `n`th running task a watchdog time `in_ms` from now.
    Watch(usize, u64),
    /// Retire worker slot `n` (modulo the slots).
    Retire(usize),
    /// A live-guard sample: cap free VRAM at this headroom (`None`: lift the cap).
    Headroom(Option<u32>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            (0..4usize, 0..2usize, 0..=12u32, 0..20u64),
            prop::option::weighted(0.3, 0..60u64),
            prop::option::weighted(0.35, 1..=6u32),
        )
            .prop_map(|((p, kind, units, age), deadline_in, also)| Op::Admit {
                priority: Priority::ALL[p], kind, units, age, deadline_in, also
            }),
        3 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (1..30u64).prop_map(Op::Tick),
        1 => (any::<usize>(), 0..40u64).prop_map(|(pick, in_ms)| Op::Watch(pick, in_ms)),
        1 => (0..8usize).prop_map(Op::Retire),
        1 => prop::option::weighted(0.8, 0..=14u32).prop_map(Op::Headroom),
    ]
}

/// How a task ended, as the test saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Completed,
    Expired,
    Rejected,
    Cancelled,
}

/// The test's own bookkeeping, independent of the core's.
struct Model {
    lot: ParkingLot,
    now: u64,
    next_id: TaskId,
    ranks: HashMap<TaskId, RankKey>,
    parked_at: HashMap<TaskId, u64>,
    running: BTreeSet<TaskId>,
    parked: BTreeSet<TaskId>,
    ends: HashMap<TaskId, Vec<End>>,
    admitted: u64,
    /// Watchdog times given, until reported overdue.
    watched: HashMap<TaskId, u64>,
    /// Tasks reported overdue.
    overdue: BTreeSet<TaskId>,
    /// Retired slots, and the task each held when retired (it keeps the slot until done).
    retired: HashMap<usize, Option<TaskId>>,
    /// Each task's cost, its extra costs (rule 25) included.
    costs: HashMap<TaskId, Vec<ResourceCost>>,
    /// The VRAM headroom left: the last sample less the VRAM tasks started since.
    headroom: Option<u32>,
}

impl Model {
    fn new(guard: StarvationGuard, slots: usize, depth: usize) -> Self {
        let capacity = Capacity::uniform(0).with(KINDS[0], 12).with(KINDS[1], 5);
        let limits = PoolLimits::new(1, slots)
            .with_capacity(capacity)
            .with_max_queue_depth(depth)
            .with_starvation(guard);
        Self {
            lot: ParkingLot::new(limits).unwrap(),
            now: 1_000,
            next_id: 1,
            ranks: HashMap::new(),
            parked_at: HashMap::new(),
            running: BTreeSet::new(),
            parked: BTreeSet::new(),
            ends: HashMap::new(),
            admitted: 0,
            watched: HashMap::new(),
            overdue: BTreeSet::new(),
            retired: HashMap::new(),
            costs: HashMap::new(),
            headroom: None,
        }
    }

    fn end(&mut self, id: TaskId, end: End) {
        self.ends.entry(id).or_default().push(end);
    }

    fn started(&mut self, ids: &[TaskId]) {
        for id in ids {
            assert!(self.parked.remove(id), "started task {id} was not parked");
            assert!(self.running.insert(*id), "task {id} started twice");
        }
    }

    fn starving(&self) -> Vec<TaskId> {
        self.parked
            .iter()
            .copied()
            .filter(|&id| self.lot.state(id) == Some(WakeState::Reserved))
            .collect()
    }

    fn apply(&mut self, op: &Op) {
        let starving_before = self.starving();
        let mut started = Vec::new();
        match *op {
            Op::Admit {
                priority,
                kind,
                units,
                age,
                deadline_in,
                also,
            } => {
                let id = self.next_id;
                self.next_id += 1;
                self.admitted += 1;
                let ticket = Ticket {
                    id,
                    priority,
                    cost: ResourceCost::new(KINDS[kind], units),
                    created_at_ms: self.now - age,
                    deadline_ms: deadline_in.map(|d| self.now + d - 10),
                    tenant: 0,
                    timeout_ms: None,
                    also: Default::default(),
                };
                let extra: Vec<ResourceCost> = also
                    .map(|units| ResourceCost::new(KINDS[1 - kind], units))
                    .into_iter()
                    .collect();
                let ticket = Ticket {
                    also: ExtraCosts::new(ticket.cost, &extra).expect("another kind"),
                    ..ticket
                };
                self.ranks
                    .insert(id, RankKey::new(priority, ticket.created_at_ms, id));
                self.costs
                    .insert(id, [ticket.cost].into_iter().chain(extra).collect());
                match self.lot.admit(ticket, self.now) {
                    Admit::Start => started.push(id),
                    Admit::Park => {
                        self.parked.insert(id);
                        self.parked_at.insert(id, self.now);
                    }
                    Admit::Expire => self.end(id, End::Expired),
                    Admit::Reject(_) => self.end(id, End::Rejected),
                    Admit::StartWith(_) => panic!("StartWith without a fair share"),
                    Admit::ParkShedding {
                        shed,
                        started: also,
                    } => {
                        // Core rule 21: only parked tasks of a lower priority make room, and
                        // each ends once, refused.
                        for gone in shed {
                            assert!(self.parked.remove(&gone), "shed task {gone} was not parked");
                            assert!(
                                self.ranks[&gone].priority() < priority,
                                "task {gone} shed for a newcomer of no higher priority"
                            );
                            self.end(gone, End::Rejected);
                        }
                        self.parked.insert(id);
                        self.parked_at.insert(id, self.now);
                        started = also;
                        self.started(&started);
                    }
                }
                if started.first() == Some(&id) {
                    assert!(self.running.insert(id));
                }
            }
            Op::Complete(pick) => {
                if let Some(&id) = self.running.iter().nth(pick % self.running.len().max(1)) {
                    started = self
                        .lot
                        .complete(id, self.now)
                        .expect("running task completes");
                    assert!(
                        self.lot.complete(id, self.now).is_err(),
                        "second release refused"
                    );
                    self.running.remove(&id);
                    self.end(id, End::Completed);
                    self.started(&started);
                }
            }
            Op::Cancel(pick) => {
                let live: Vec<TaskId> = self.parked.iter().chain(&self.running).copied().collect();
                if let Some(&id) = live.get(pick % live.len().max(1)) {
                    match self.lot.cancel(id, self.now).expect("live task cancels") {
                        Cancel::Parked {
                            started: now_started,
                        } => {
                            self.parked.remove(&id);
                            self.end(id, End::Cancelled);
                            started = now_started;
                            self.started(&started);
                        }
                        Cancel::Running => assert!(self.running.contains(&id)),
                    }
                }
            }
            Op::Tick(delta) => {
                self.now += delta;
                let tick = self.lot.tick(self.now);
                for id in &tick.expired {
                    assert!(self.parked.remove(id), "expired task {id} was not parked");
                    self.end(*id, End::Expired);
                }
                for id in &tick.overdue {
                    let at = self.watched.remove(id).expect("overdue task was watched");
                    assert!(at <= self.now, "task {id} overdue before its time");
                    assert!(
                        self.running.contains(id),
                        "overdue task {id} is not running"
                    );
                    assert!(self.overdue.insert(*id), "task {id} reported overdue twice");
                }
                started = tick.started;
                self.started(&started);
            }
            Op::Watch(pick, in_ms) => {
                if let Some(&id) = self.running.iter().nth(pick % self.running.len().max(1)) {
                    self.lot.watch(id, self.now + in_ms);
                    self.watched.insert(id, self.now + in_ms);
                    self.overdue.remove(&id);
                }
            }
            Op::Retire(worker) => {
                let worker = worker % self.lot.limits().worker_slots;
                if !self.retired.contains_key(&worker) {
                    let holder = self.lot.retire_worker(worker);
                    assert_eq!(holder, self.lot.task_on(worker));
                    self.retired.insert(worker, holder);
                }
            }
            Op::Headroom(headroom) => {
                self.headroom = headroom;
                started = self
                    .lot
                    .set_headroom(ResourceKind::GpuVram, headroom, self.now);
                self.started(&started);
            }
        }
        self.charge_headroom(&started);
        if let Op::Complete(_) | Op::Cancel(_) = op {
            self.watched.retain(|id, _| self.running.contains(id));
        }
        self.check(&starving_before, &started);
        self.check_workers();
    }

    /// Live guard: every VRAM task that started fitted the headroom left, and took its cost
    /// off it.
    fn charge_headroom(&mut self, started: &[TaskId]) {
        for id in started {
            let vram = vram_of(&self.costs[id]);
            let Some(left) = self.headroom.as_mut() else {
                continue;
            };
            assert!(
                vram <= *left,
                "task {id} of {vram} units started with {left} units of headroom"
            );
            *left -= vram;
        }
        assert_eq!(self.lot.headroom(ResourceKind::GpuVram), self.headroom);
    }

    /// Every running task holds a distinct slot; a retired slot holds at most the task it
    /// held when it was retired; no watched task is past its time after a tick.
    fn check_workers(&self) {
        let mut held = BTreeSet::new();
        for &id in &self.running {
            let worker = self.lot.worker_of(id).expect("a running task holds a slot");
            assert!(held.insert(worker), "slot {worker} held twice");
            if let Some(holder) = self.retired.get(&worker) {
                assert_eq!(*holder, Some(id), "retired slot {worker} handed out again");
            }
        }
        let live_slots = self.lot.limits().worker_slots - self.retired.len();
        assert_eq!(self.lot.live_workers(), live_slots);
    }

    fn check(&self, starving_before: &[TaskId], started: &[TaskId]) {
        self.lot.check_invariants().expect("core invariants");
        let limits = self.lot.limits();
        for kind in ResourceKind::ALL {
            assert!(
                self.lot.used(kind) <= limits.capacity.get(kind),
                "{kind:?} over capacity"
            );
        }
        assert!(self.lot.busy_workers() <= limits.worker_slots);
        assert_eq!(self.lot.running_len(), self.running.len());
        assert_eq!(self.lot.parked_len(), self.parked.len());
        for id in &self.running {
            assert_eq!(self.lot.state(*id), Some(WakeState::Running));
        }
        for id in &self.parked {
            assert!(matches!(
                self.lot.state(*id),
                Some(WakeState::Parked | WakeState::Reserved)
            ));
            assert!(
                !self.running.contains(id),
                "task {id} both parked and running"
            );
            // Age bound: parked MAX_PARK_MS or longer means reserved.
            if self.now - self.parked_at[id] >= MAX_PARK_MS
                && limits.starvation.max_park_ms.is_some()
            {
                assert_eq!(
                    self.lot.state(*id),
                    Some(WakeState::Reserved),
                    "task {id} aged"
                );
            }
        }
        for (id, ends) in &self.ends {
            assert_eq!(ends.len(), 1, "task {id} ended {ends:?}");
        }
        // While a task is starving, only tasks ranked ahead of it start.
        // (A reserved task that expired or was cancelled in this event no longer blocks; one
        // that started blocks only the starts listed before it.)
        for reserved in starving_before {
            let blocked_starts = match started.iter().position(|id| id == reserved) {
                Some(at) => &started[..at],
                None if self.parked.contains(reserved) => started,
                None => &[],
            };
            for id in blocked_starts {
                assert!(
                    self.ranks[id].ranks_ahead_of(&self.ranks[reserved]),
                    "task {id} started ranked below reserved task {reserved}"
                );
            }
        }
        // The drain bound: a starving task cannot outlast the tasks running ahead of it
        // (while any slot is left to run it: a pool whose slots are all retired escalates),
        // unless the world outside the pool holds the memory the reservation needs (the live
        // guard): then it, and every starving task behind it, waits for the next sample.
        if self.running.is_empty() && self.lot.live_workers() > 0 {
            if let Some(id) = self.lot.reservation() {
                let vram = vram_of(&self.costs[&id]);
                let held_outside = self.headroom.is_some_and(|headroom| vram > headroom);
                assert!(held_outside, "pool idle while reserved task {id} waits");
            }
        }
    }

    /// Ends everything still live and checks each admitted task ended exactly once.
    fn finish(mut self) {
        let started = self.lot.set_headroom(ResourceKind::GpuVram, None, self.now);
        self.started(&started);
        while let Some(&id) = self.running.first() {
            let started = self.lot.complete(id, self.now).unwrap();
            self.running.remove(&id);
            self.end(id, End::Completed);
            self.started(&started);
        }
        for id in self.lot.take_parked() {
            assert!(self.parked.remove(&id));
            self.end(id, End::Cancelled);
        }
        assert!(self.parked.is_empty());
        assert_eq!(self.lot.used_total(), 0);
        assert_eq!(self.lot.busy_workers(), 0);
        assert_eq!(
            self.ends.len() as u64,
            self.admitted,
            "every admitted task ended"
        );
        assert!(self.ends.values().all(|ends| ends.len() == 1));
    }
}

/// The VRAM units among `costs`.
fn vram_of(costs: &[ResourceCost]) -> u32 {
    costs
        .iter()
        .filter(|cost| cost.kind == ResourceKind::GpuVram)
        .map(|cost| cost.units)
        .sum()
}

fn guard() -> impl Strategy<Value = StarvationGuard> {
    prop_oneof![
        Just(StarvationGuard::disabled()),
        Just(StarvationGuard {
            max_park_ms: Some(MAX_PARK_MS),
            max_skips: None
        }),
        (1..6u32).prop_map(|skips| StarvationGuard {
            max_park_ms: None,
            max_skips: Some(skips)
        }),
        (1..6u32).prop_map(|skips| StarvationGuard {
            max_park_ms: Some(MAX_PARK_MS),
            max_skips: Some(skips)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_event(
        guard in guard(),
        slots in 1..5usize,
        depth in 0..12usize,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut model = Model::new(guard, slots, depth);
        for op in &ops {
            model.apply(op);
        }
        model.finish();
    }
}
