//! Cost of a scheduling decision with a million parked tasks, and memory per parked task:
//! the parking-lot core beside a naive baseline (a rank-sorted `Vec` scanned linearly) in the
//! same run. Both make the same decisions; the run checks that they do.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench core_decisions` measures 1,000,000 parked
//! tasks of 1,000 distinct costs. A second table times the same decisions with a live-guard
//! headroom set (high enough never to bind, so the decisions are the same) beside a lot without
//! one. A third times them with a fair share (cap = the whole capacity, so only the fair order is
//! at work) for 1, 10 and 1,000 tenants beside the same lot without one, with the memory per parked
//! task of each. A fourth times lots whose tasks are a third each of one, two and three kinds
//! (core rule 25) beside a lot of one kind, after checking on a short run that the core decides as
//! a naive scan of every parked task's costs does. Under `cargo test` (no `--bench` argument) it
//! runs the same code on a small lot as a smoke test. `CORE_TABLES=several` runs the fourth
//! table alone, `CORE_TABLES=one` the other three (the builds before the fourth).

#[path = "support/mod.rs"]
mod support;

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, RankKey, Ticket};
use prometheus_parking_lot::core::{Capacity, FairShare, PoolLimits, StarvationGuard};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::{ExtraCosts, Priority, ResourceCost, ResourceKind};

#[global_allocator]
static ALLOCATOR: support::LiveBytes = support::LiveBytes;

fn live_bytes() -> isize {
    support::LiveBytes::now()
}

const CAPACITY: u32 = 1_000;
const DISTINCT_COSTS: u64 = 1_000;
const WORKERS: usize = 64;

/// The run's size: the real benchmark, or a smoke test under `cargo test`.
#[derive(Clone, Copy)]
struct Scale {
    parked: usize,
    admits: usize,
    completes: usize,
    naive_admits: usize,
    naive_completes: usize,
}

impl Scale {
    fn from_args() -> Self {
        if std::env::args().any(|arg| arg == "--bench") {
            Self {
                parked: 1_000_000,
                admits: 200_000,
                completes: 200_000,
                naive_admits: 300,
                naive_completes: 300,
            }
        } else {
            Self {
                parked: 20_000,
                admits: 2_000,
                completes: 2_000,
                naive_admits: 200,
                naive_completes: 200,
            }
        }
    }
}

/// A deterministic ticket stream (xorshift), so both schedulers see the same tasks.
struct Tickets {
    state: u64,
    next_id: TaskId,
    /// Tickets go round-robin to this many tenants (tenant 0 when 1).
    tenants: u64,
    /// Tickets of several kinds (see [`Mix`]).
    several: Mix,
}

/// Which tickets need other kinds beside their VRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// None: every ticket is of one kind.
    One,
    /// A third need 1-4 CPU units (an engine's sequence slots) beside their VRAM, a third
    /// those and one unit of `mixed` (a provider's request) too: one kind varies widely, the
    /// others are a few units, as in the workloads the rule is for.
    Slots,
    /// A third need 1-4 CPU units, a third those and 1-1,000 I/O units, independent of their
    /// 1-1,000 VRAM units: two kinds that vary widely and independently, the index's worst
    /// case.
    TwoWide,
}

impl Tickets {
    fn new() -> Self {
        Self {
            state: 0x2545_f491_4f6c_dd1d,
            next_id: 1,
            tenants: 1,
            several: Mix::One,
        }
    }

    fn random(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn next(&mut self) -> Ticket {
        let id = self.next_id;
        self.next_id += 1;
        let cost = ResourceCost::gpu_vram(1 + (self.random() % DISTINCT_COSTS) as u32);
        let also = match self.several {
            Mix::One => ExtraCosts::NONE,
            mix => {
                let cpu = ResourceCost::cpu(1 + (self.random() % 4) as u32);
                let third = match mix {
                    Mix::TwoWide => ResourceCost::io(1 + (self.random() % DISTINCT_COSTS) as u32),
                    _ => ResourceCost::mixed(1),
                };
                let costs = match self.random() % 3 {
                    0 => &[][..],
                    1 => &[cpu][..],
                    _ => &[cpu, third][..],
                };
                ExtraCosts::new(cost, costs).expect("other kinds")
            }
        };
        Ticket {
            id,
            priority: Priority::ALL[(self.random() % 4) as usize],
            cost,
            created_at_ms: id,
            deadline_ms: None,
            tenant: id % self.tenants,
            timeout_ms: None,
            also,
        }
    }
}

/// The baseline: parked tasks in a `Vec` sorted by rank; unpark scans it from the front for
/// the first task that fits. Same rules as the core with the starvation guard off.
struct NaiveLot {
    parked: Vec<(RankKey, u32)>,
    running: HashMap<TaskId, u32>,
    used: u32,
}

impl NaiveLot {
    fn with_parked(mut parked: Vec<(RankKey, u32)>) -> Self {
        parked.sort_unstable_by_key(|&(rank, _)| rank);
        Self {
            parked,
            running: HashMap::new(),
            used: 0,
        }
    }

    fn fits(&self, units: u32) -> bool {
        self.running.len() < WORKERS && self.used + units <= CAPACITY
    }

    fn start(&mut self, id: TaskId, units: u32) {
        self.used += units;
        self.running.insert(id, units);
    }

    fn admit(&mut self, ticket: Ticket) -> Admit {
        if self.fits(ticket.cost.units) {
            self.start(ticket.id, ticket.cost.units);
            return Admit::Start;
        }
        let rank = RankKey::new(ticket.priority, ticket.created_at_ms, ticket.id);
        let at = self.parked.partition_point(|&(other, _)| other < rank);
        self.parked.insert(at, (rank, ticket.cost.units));
        Admit::Park
    }

    fn complete(&mut self, id: TaskId) -> Vec<TaskId> {
        let units = self.running.remove(&id).expect("running");
        self.used -= units;
        let mut started = Vec::new();
        while let Some(at) = self.parked.iter().position(|&(_, units)| self.fits(units)) {
            let (rank, units) = self.parked.remove(at);
            self.start(rank.id(), units);
            started.push(rank.id());
        }
        started
    }
}

/// One scheduler under test, driven through the same steps.
trait Scheduler {
    fn admit(&mut self, ticket: Ticket, now: u64) -> Admit;
    fn complete(&mut self, id: TaskId, now: u64) -> Vec<TaskId>;
}

impl Scheduler for ParkingLot {
    fn admit(&mut self, ticket: Ticket, now: u64) -> Admit {
        ParkingLot::admit(self, ticket, now)
    }
    fn complete(&mut self, id: TaskId, now: u64) -> Vec<TaskId> {
        ParkingLot::complete(self, id, now).expect("running")
    }
}

impl Scheduler for NaiveLot {
    fn admit(&mut self, ticket: Ticket, _now: u64) -> Admit {
        NaiveLot::admit(self, ticket)
    }
    fn complete(&mut self, id: TaskId, _now: u64) -> Vec<TaskId> {
        NaiveLot::complete(self, id)
    }
}

/// What one scheduler did and how long it took.
#[derive(Debug, Default)]
struct Run {
    admit_ns: f64,
    unpark_ns: f64,
    starts: Vec<TaskId>,
}

/// Times `admits` admissions into the full lot, then `completes` completions, each of which
/// unparks what fits (the freed task is replaced by a fresh admission, untimed, so the lot
/// stays at its size). An unpark decision is one started task or the final "nothing fits".
fn drive(
    scheduler: &mut impl Scheduler,
    tickets: &mut Tickets,
    running: &mut VecDeque<TaskId>,
    admits: usize,
    completes: usize,
) -> Run {
    let mut run = Run::default();
    let batch: Vec<Ticket> = (0..admits).map(|_| tickets.next()).collect();
    let start = Instant::now();
    for ticket in batch {
        if scheduler.admit(ticket, 0) == Admit::Start {
            running.push_back(ticket.id);
        }
    }
    run.admit_ns = start.elapsed().as_nanos() as f64 / admits as f64;

    let mut decisions = 0usize;
    let mut unpark_time = 0u128;
    for now in 0..completes as u64 {
        let Some(id) = running.pop_front() else { break };
        let start = Instant::now();
        let started = scheduler.complete(id, now);
        unpark_time += start.elapsed().as_nanos();
        decisions += started.len() + 1;
        running.extend(&started);
        run.starts.extend(started);
        if scheduler.admit(tickets.next(), now) == Admit::Start {
            running.push_back(tickets.next_id - 1);
        }
    }
    run.unpark_ns = unpark_time as f64 / decisions.max(1) as f64;
    run
}

fn main() {
    let scale = Scale::from_args();
    if std::env::var("CORE_TABLES").as_deref() == Ok("several") {
        let limits = PoolLimits::new(CAPACITY, WORKERS)
            .with_max_queue_depth(usize::MAX)
            .with_starvation(StarvationGuard::disabled());
        several_kinds_table(&scale, limits);
        return;
    }
    println!(
        "core_decisions: {} parked tasks, {DISTINCT_COSTS} distinct costs, capacity {CAPACITY}, {WORKERS} workers",
        scale.parked
    );

    // The parking-lot core.
    let limits = PoolLimits::new(CAPACITY, WORKERS)
        .with_max_queue_depth(usize::MAX)
        .with_starvation(StarvationGuard::disabled());
    let mut tickets = Tickets::new();
    let blocker = Ticket {
        cost: ResourceCost::gpu_vram(CAPACITY),
        ..tickets.next()
    };
    let fill: Vec<Ticket> = (0..scale.parked).map(|_| tickets.next()).collect();
    let before = live_bytes();
    let mut lot = ParkingLot::new(limits).expect("limits");
    assert_eq!(lot.admit(blocker, 0), Admit::Start);
    for &ticket in &fill {
        assert_eq!(lot.admit(ticket, 0), Admit::Park);
    }
    let lot_bytes = (live_bytes() - before) as f64;
    let core_bytes_per_task = lot_bytes / scale.parked as f64;

    // The naive baseline, filled with the same tasks (sorted once, not inserted one by one).
    let before = live_bytes();
    let mut naive = NaiveLot::with_parked(
        fill.iter()
            .map(|t| {
                (
                    RankKey::new(t.priority, t.created_at_ms, t.id),
                    t.cost.units,
                )
            })
            .collect(),
    );
    naive.start(blocker.id, CAPACITY);
    let naive_bytes_per_task = (live_bytes() - before) as f64 / scale.parked as f64;
    drop(fill);

    // Same steps on both; the naive one only for as long as it takes reasonable time.
    let mut naive_tickets = Tickets {
        state: tickets.state,
        next_id: tickets.next_id,
        tenants: 1,
        several: Mix::One,
    };
    let mut naive_running = VecDeque::from([blocker.id]);
    let naive_run = drive(
        &mut naive,
        &mut naive_tickets,
        &mut naive_running,
        scale.naive_admits,
        scale.naive_completes,
    );
    let mut lot_running = VecDeque::from([blocker.id]);
    let check = drive(
        &mut lot,
        &mut tickets,
        &mut lot_running,
        scale.naive_admits,
        scale.naive_completes,
    );
    assert_eq!(
        check.starts, naive_run.starts,
        "core and baseline must make the same decisions"
    );
    let core_run = drive(
        &mut lot,
        &mut tickets,
        &mut lot_running,
        scale.admits,
        scale.completes,
    );
    lot.check_invariants().expect("invariants after the run");

    println!("| measure | parking-lot core | naive sorted Vec | ratio (naive / core) |");
    println!("|---|---:|---:|---:|");
    row(
        "admit (park) decision, ns",
        core_run.admit_ns,
        naive_run.admit_ns,
    );
    row(
        "unpark decision, ns",
        core_run.unpark_ns,
        naive_run.unpark_ns,
    );
    row(
        "memory per parked task, bytes",
        core_bytes_per_task,
        naive_bytes_per_task,
    );
    println!(
        "decisions checked identical on {} starts; core: {} starts over {} completions",
        naive_run.starts.len(),
        core_run.starts.len(),
        scale.completes
    );
    drop(lot);
    live_guard_table(&scale, limits);
    fair_share_table(&scale, limits);
    if std::env::var("CORE_TABLES").as_deref() != Ok("one") {
        several_kinds_table(&scale, limits);
    }
}

/// CPU units of a lot of several kinds: 64 slots' worth, so that the CPU costs bind too.
const SEVERAL_CPU: u32 = 64;

/// The naive baseline for tasks of several kinds: every parked task's costs by kind, in a
/// `Vec` sorted by rank, scanned from the front for the first that fits every kind.
struct NaiveSeveral {
    parked: Vec<(RankKey, [u32; ResourceKind::COUNT])>,
    running: HashMap<TaskId, [u32; ResourceKind::COUNT]>,
    free: [u32; ResourceKind::COUNT],
}

impl NaiveSeveral {
    fn demand(ticket: &Ticket) -> [u32; ResourceKind::COUNT] {
        ticket.also.with_first(ticket.cost)
    }

    fn fits(&self, demand: &[u32; ResourceKind::COUNT]) -> bool {
        self.running.len() < WORKERS
            && demand
                .iter()
                .zip(&self.free)
                .all(|(need, free)| need <= free)
    }

    fn start(&mut self, id: TaskId, demand: [u32; ResourceKind::COUNT]) {
        for (free, need) in self.free.iter_mut().zip(demand) {
            *free -= need;
        }
        self.running.insert(id, demand);
    }
}

impl Scheduler for NaiveSeveral {
    fn admit(&mut self, ticket: Ticket, _now: u64) -> Admit {
        let demand = Self::demand(&ticket);
        if self.fits(&demand) {
            self.start(ticket.id, demand);
            return Admit::Start;
        }
        let rank = RankKey::new(ticket.priority, ticket.created_at_ms, ticket.id);
        let at = self.parked.partition_point(|&(other, _)| other < rank);
        self.parked.insert(at, (rank, demand));
        Admit::Park
    }

    fn complete(&mut self, id: TaskId, _now: u64) -> Vec<TaskId> {
        let demand = self.running.remove(&id).expect("running");
        for (free, held) in self.free.iter_mut().zip(demand) {
            *free += held;
        }
        let mut started = Vec::new();
        while let Some(at) = self.parked.iter().position(|(_, demand)| self.fits(demand)) {
            let (rank, demand) = self.parked.remove(at);
            self.start(rank.id(), demand);
            started.push(rank.id());
        }
        started
    }
}

/// What tasks of several kinds cost a decision and a parked task: lots whose tasks are a
/// third each of one kind (VRAM), two and three (see [`Mix`]), beside the same lot with
/// tasks of one kind, interleaved over rounds (best of each); first a short run of each
/// mixed lot beside [`NaiveSeveral`], which must decide the same.
fn several_kinds_table(scale: &Scale, limits: PoolLimits) {
    const ROUNDS: usize = 3;
    let limits =
        limits.with_capacity(Capacity::uniform(CAPACITY).with(ResourceKind::Cpu, SEVERAL_CPU));
    let small = Scale {
        parked: scale.parked.min(20_000),
        ..*scale
    };
    for mix in [Mix::Slots, Mix::TwoWide] {
        same_decisions_as_a_scan(&small, limits, mix);
    }

    let mixes = [
        ("one kind", Mix::One),
        (
            "a third each of one, two and three kinds: VRAM, slots, a request",
            Mix::Slots,
        ),
        (
            "the same, the third kind varying as widely as VRAM",
            Mix::TwoWide,
        ),
    ];
    let mut runs: Vec<Vec<(Run, f64)>> = mixes.iter().map(|_| Vec::new()).collect();
    for _ in 0..ROUNDS {
        for ((_, mix), runs) in mixes.iter().zip(&mut runs) {
            runs.push(measured_mix(scale, limits, *mix));
        }
    }
    let best = |runs: &[(Run, f64)], time: fn(&Run) -> f64| {
        runs.iter()
            .map(|(run, _)| time(run))
            .fold(f64::INFINITY, f64::min)
    };
    let (one_admit, one_unpark) = (
        best(&runs[0], |r| r.admit_ns),
        best(&runs[0], |r| r.unpark_ns),
    );
    println!();
    println!("| lot (best of {ROUNDS}) | admit (park) decision, ns | unpark decision, ns | ratio to one kind (admit / unpark) | memory per parked task, bytes |");
    println!("|---|---:|---:|---:|---:|");
    for ((name, _), runs) in mixes.iter().zip(&runs) {
        let (admit, unpark) = (best(runs, |r| r.admit_ns), best(runs, |r| r.unpark_ns));
        println!(
            "| {name} | {admit:.1} | {unpark:.1} | {:.2}x / {:.2}x | {:.0} |",
            admit / one_admit,
            unpark / one_unpark,
            runs[0].1
        );
    }
}

/// A short run of a lot of `mix` beside [`NaiveSeveral`]: the same tasks start in the same
/// order.
fn same_decisions_as_a_scan(small: &Scale, limits: PoolLimits, mix: Mix) {
    let (mut lot, mut tickets, mut running) = filled(small, limits, mix);
    let mut naive = NaiveSeveral {
        parked: Vec::new(),
        running: HashMap::new(),
        free: [CAPACITY; ResourceKind::COUNT],
    };
    naive.free[ResourceKind::Cpu.index()] = SEVERAL_CPU;
    let mut again = Tickets::new();
    again.several = mix;
    for _ in 0..=small.parked {
        let ticket = again.next();
        let ticket = match ticket.id {
            1 => blocker(ticket),
            _ => ticket,
        };
        naive.admit(ticket, 0);
    }
    let mut naive_running = running.clone();
    let naive_run = drive(&mut naive, &mut again, &mut naive_running, 300, 300);
    let core_run = drive(&mut lot, &mut tickets, &mut running, 300, 300);
    assert_eq!(
        core_run.starts, naive_run.starts,
        "{mix:?}: core and baseline must make the same decisions"
    );
    lot.check_invariants()
        .expect("invariants after the mixed run");
}

/// The ticket that holds the whole VRAM, so that every other task parks.
fn blocker(ticket: Ticket) -> Ticket {
    Ticket {
        cost: ResourceCost::gpu_vram(CAPACITY),
        also: ExtraCosts::NONE,
        ..ticket
    }
}

/// A fresh lot with the blocker running and `scale.parked` tasks parked (of several kinds
/// when `several`), its ticket stream and its running tasks.
fn filled(
    scale: &Scale,
    limits: PoolLimits,
    several: Mix,
) -> (ParkingLot, Tickets, VecDeque<TaskId>) {
    let mut tickets = Tickets::new();
    tickets.several = several;
    let blocker = blocker(tickets.next());
    let mut lot = ParkingLot::new(limits).expect("limits");
    assert_eq!(lot.admit(blocker, 0), Admit::Start);
    for _ in 0..scale.parked {
        assert_eq!(lot.admit(tickets.next(), 0), Admit::Park);
    }
    (lot, tickets, VecDeque::from([blocker.id]))
}

/// The timed steps on a lot [`filled`] with tasks of one kind or of several, and the lot's
/// memory per parked task in bytes.
fn measured_mix(scale: &Scale, limits: PoolLimits, several: Mix) -> (Run, f64) {
    let before = live_bytes();
    let (mut lot, mut tickets, mut running) = filled(scale, limits, several);
    let bytes_per_task = (live_bytes() - before) as f64 / scale.parked as f64;
    let run = drive(
        &mut lot,
        &mut tickets,
        &mut running,
        scale.admits,
        scale.completes,
    );
    (run, bytes_per_task)
}

/// What the fair share costs a decision and a parked task: the core's timed steps on fresh
/// lots with the same tasks, without a fair share and with one (cap = the whole capacity)
/// for 1, 10 and 1,000 tenants, interleaved over rounds (best of each).
fn fair_share_table(scale: &Scale, limits: PoolLimits) {
    const ROUNDS: usize = 3;
    let fair = limits.with_fair_share(Some(FairShare::MaxUnitsPerTenant(CAPACITY)));
    let variants: [(&str, PoolLimits, u64); 4] = [
        ("no fair share", limits, 1),
        ("fair share, 1 tenant", fair, 1),
        ("fair share, 10 tenants", fair, 10),
        ("fair share, 1,000 tenants", fair, 1_000),
    ];
    let mut runs: Vec<Vec<(Run, f64)>> = variants.iter().map(|_| Vec::new()).collect();
    for _ in 0..ROUNDS {
        for ((_, limits, tenants), runs) in variants.iter().zip(&mut runs) {
            runs.push(core_measured(scale, *limits, None, *tenants));
        }
    }
    assert_eq!(
        runs[0][0].0.starts, runs[1][0].0.starts,
        "with one tenant the fair order is the rank order"
    );
    let best = |runs: &[(Run, f64)], time: fn(&Run) -> f64| {
        runs.iter()
            .map(|(run, _)| time(run))
            .fold(f64::INFINITY, f64::min)
    };
    let (base_admit, base_unpark) = (
        best(&runs[0], |run| run.admit_ns),
        best(&runs[0], |run| run.unpark_ns),
    );
    println!();
    println!("| lot (best of {ROUNDS}) | admit (park) decision, ns | unpark decision, ns | ratio to no fair share (admit / unpark) | memory per parked task, bytes |");
    println!("|---|---:|---:|---:|---:|");
    for ((name, ..), runs) in variants.iter().zip(&runs) {
        let (admit, unpark) = (
            best(runs, |run| run.admit_ns),
            best(runs, |run| run.unpark_ns),
        );
        println!(
            "| {name} | {admit:.1} | {unpark:.1} | {:.2}x / {:.2}x | {:.0} |",
            admit / base_admit,
            unpark / base_unpark,
            runs[0].1
        );
    }
}

/// What the live guard's bookkeeping costs a decision: the core's timed steps on fresh lots
/// with the same tasks, without a headroom and with one that never binds, interleaved over
/// rounds (best of each).
fn live_guard_table(scale: &Scale, limits: PoolLimits) {
    const ROUNDS: usize = 3;
    let (mut plain, mut guarded) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        plain.push(core_again(scale, limits, None));
        guarded.push(core_again(scale, limits, Some(u32::MAX - 1)));
    }
    assert_eq!(
        plain[0].starts, guarded[0].starts,
        "a headroom that never binds changes no decision"
    );
    let best =
        |runs: &[Run], time: fn(&Run) -> f64| runs.iter().map(time).fold(f64::INFINITY, f64::min);
    println!();
    println!("| measure (best of {ROUNDS}) | no headroom | headroom set, never binding | ratio (headroom / none) |");
    println!("|---|---:|---:|---:|");
    for (name, time) in [
        (
            "admit (park) decision, ns",
            (|run: &Run| run.admit_ns) as fn(&Run) -> f64,
        ),
        ("unpark decision, ns", |run: &Run| run.unpark_ns),
    ] {
        let (none, set) = (best(&plain, time), best(&guarded, time));
        println!("| {name} | {none:.1} | {set:.1} | {:.2}x |", set / none);
    }
}

/// The core's timed steps on a fresh lot: the blocker, `scale.parked` parked tasks, then
/// the timed admits and completes, with `headroom` set on VRAM first.
fn core_again(scale: &Scale, limits: PoolLimits, headroom: Option<u32>) -> Run {
    core_measured(scale, limits, headroom, 1).0
}

/// [`core_again`] with the tickets spread over `tenants`, also returning the lot's memory
/// per parked task in bytes.
fn core_measured(
    scale: &Scale,
    limits: PoolLimits,
    headroom: Option<u32>,
    tenants: u64,
) -> (Run, f64) {
    let mut tickets = Tickets::new();
    tickets.tenants = tenants;
    let blocker = Ticket {
        cost: ResourceCost::gpu_vram(CAPACITY),
        ..tickets.next()
    };
    let before = live_bytes();
    let mut lot = ParkingLot::new(limits).expect("limits");
    lot.set_headroom(ResourceKind::GpuVram, headroom, 0);
    assert_eq!(lot.admit(blocker, 0), Admit::Start);
    for _ in 0..scale.parked {
        assert_eq!(lot.admit(tickets.next(), 0), Admit::Park);
    }
    let bytes_per_task = (live_bytes() - before) as f64 / scale.parked as f64;
    let mut running = VecDeque::from([blocker.id]);
    let run = drive(
        &mut lot,
        &mut tickets,
        &mut running,
        scale.admits,
        scale.completes,
    );
    (run, bytes_per_task)
}

fn row(name: &str, core: f64, naive: f64) {
    println!("| {name} | {core:.1} | {naive:.1} | {:.2}x |", naive / core);
}
