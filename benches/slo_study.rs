//! The SLO study: how many interactive requests start within their time-to-first-token
//! target when a card serving an LLM-like mix is overloaded, and what each policy pays for
//! it in utilisation, waits and fairness between tenants.
//!
//! A deterministic simulation on a virtual clock (fixed seed, no wall-clock reads) that
//! drives the real pure core (`ParkingLot`), like the packing study. One run compares:
//!
//! - **strict FIFO**: arrival order, the head blocks everyone behind it;
//! - **strict priority** (today's defaults): interactive requests at `High`, batch at
//!   `Normal`, admission order within a priority, deadlines that expire while parked;
//! - **vLLM-like priority**: a model of vLLM's `priority` scheduling policy: the waiting
//!   queue sorted by (priority, arrival), the head blocks when it does not fit, and a head
//!   that outranks running requests preempts the lowest-ranked of them, which go back to the
//!   queue and start over (recompute);
//! - **SLO-aware**: the same priorities with `"order": "deadline"`, `refuse_if_late`, a
//!   queue bounded by units, and the weighted fair share charged by use.
//!
//! It reports the SLO goodput (the share of deadline requests that start in time), the
//! utilisation while requests arrive, p99 waits per class, the weighted service gap between
//! backlogged tenants, and how far the core's start estimates were from the starts.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench slo_study` prints the tables for
//! `BENCHMARKS.md`; `cargo test` runs it small, as a smoke test.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
use prometheus_parking_lot::core::{
    Admission, FairByUse, FairShare, PoolLimits, QueueOrder, UsageCharge,
};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::{Priority, ResourceCost};

#[path = "../examples/support/strict_fifo.rs"]
mod strict_fifo;
use strict_fifo::StrictFifo;

/// KV-cache blocks on the card (in units of 1 GB-equivalent blocks).
const CARD_UNITS: u32 = 64;
/// Requests decoded at once at most (the engine's batch).
const WORKERS: usize = 24;
/// Offered load: arrivals carry this many times the work the card can do.
const OVERLOAD: f64 = 1.2;
const SEED: u64 = 0x510_2026;
/// The time-to-first-token targets of interactive requests (each draws one): a voice agent,
/// a chat turn, an IDE completion that may take longer.
const TTFT_MS: [u64; 3] = [1_000, 2_000, 4_000];

/// The policy the others are compared with: today's core with priorities by class and the
/// deadlines on the tickets.
const BASELINE: &str = "strict priority (today)";

/// What a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A chat turn: small, short, with a start deadline.
    Interactive,
    /// A batch job: larger, longer, no deadline.
    Batch,
}

impl Class {
    fn priority(self) -> Priority {
        match self {
            Class::Interactive => Priority::High,
            Class::Batch => Priority::Normal,
        }
    }
}

/// One tenant of the mix: its weight in the fair share and what it sends.
#[derive(Debug, Clone, Copy)]
struct Tenant {
    name: &'static str,
    weight: u32,
    /// Share of all requests.
    share: f64,
    /// Share of its requests that are interactive.
    interactive: f64,
    /// Largest request, in units (its requests are 1..=max_units).
    max_units: u32,
}

const TENANTS: [Tenant; 4] = [
    Tenant {
        name: "acme",
        weight: 3,
        share: 0.4,
        interactive: 0.99,
        max_units: 6,
    },
    Tenant {
        name: "globex",
        weight: 2,
        share: 0.3,
        interactive: 0.97,
        max_units: 8,
    },
    Tenant {
        name: "initech",
        weight: 1,
        share: 0.2,
        interactive: 0.95,
        max_units: 12,
    },
    Tenant {
        name: "hooli",
        weight: 1,
        share: 0.1,
        interactive: 0.9,
        max_units: 16,
    },
];

/// One request of the workload.
#[derive(Debug, Clone, Copy)]
struct Request {
    id: TaskId,
    arrives_ms: u64,
    units: u32,
    runs_ms: u64,
    /// The execution timeout the submitter gives: at least the run time.
    timeout_ms: u64,
    tenant: usize,
    class: Class,
    /// Its time-to-first-token target, for an interactive request.
    ttft_ms: Option<u64>,
}

impl Request {
    fn deadline_ms(&self) -> Option<u64> {
        self.ttft_ms.map(|ttft| self.arrives_ms + ttft)
    }
}

/// SplitMix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [low, high].
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// The mix: tenants by share; interactive turns of 1-6 s, batch jobs of 5-20 s; arrivals
/// Poisson at `OVERLOAD`, in bursts (a third of the time at twice the mean rate).
fn workload(requests: usize, seed: u64) -> Vec<Request> {
    let mut rng = Rng(seed);
    let mut drafts: Vec<Request> = (0..requests)
        .map(|index| {
            let pick = rng.unit();
            let mut tenant = 0;
            let mut cumulative = 0.0;
            for (candidate, spec) in TENANTS.iter().enumerate() {
                cumulative += spec.share;
                tenant = candidate;
                if pick < cumulative {
                    break;
                }
            }
            let spec = TENANTS[tenant];
            let class = if rng.unit() < spec.interactive {
                Class::Interactive
            } else {
                Class::Batch
            };
            let (units, runs_ms) = match class {
                Class::Interactive => (
                    rng.between(1, u64::from(spec.max_units / 2).max(1)) as u32,
                    rng.between(1_000, 6_000),
                ),
                Class::Batch => (
                    rng.between(
                        u64::from(spec.max_units / 2).max(1),
                        u64::from(spec.max_units),
                    ) as u32,
                    rng.between(5_000, 20_000),
                ),
            };
            // The submitter's bound: 1.2 to 2 times the run, whole seconds.
            let factor = 1.2 + 0.8 * rng.unit();
            let timeout_ms = ((runs_ms as f64 * factor / 1_000.0).ceil() as u64).max(1) * 1_000;
            let ttft_ms = (class == Class::Interactive)
                .then(|| TTFT_MS[rng.between(0, TTFT_MS.len() as u64 - 1) as usize]);
            Request {
                id: index as TaskId + 1,
                arrives_ms: 0,
                units,
                runs_ms,
                timeout_ms,
                tenant,
                class,
                ttft_ms,
            }
        })
        .collect();
    let work: f64 = drafts
        .iter()
        .map(|r| f64::from(r.units) * r.runs_ms as f64)
        .sum();
    let mean_gap_ms = work / f64::from(CARD_UNITS) / OVERLOAD / requests as f64;
    // Bursts: 20 s at twice the rate, then 40 s at half of it; the mean stays the same.
    let mut now = 0.0f64;
    for request in &mut drafts {
        let in_burst = (now as u64 / 1_000) % 60 < 20;
        let gap = if in_burst {
            mean_gap_ms / 2.0
        } else {
            mean_gap_ms * 2.0
        };
        now += -gap * (1.0 - rng.unit()).ln();
        request.arrives_ms = now as u64;
    }
    drafts
}

// ---------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------

/// What a policy says about a request that arrives.
#[derive(Debug, Default)]
struct Arrival {
    /// Requests that start now (the newcomer among them when it starts).
    started: Vec<TaskId>,
    /// Requests that end without running now: the newcomer refused, or parked ones it
    /// displaced.
    dropped: Vec<TaskId>,
}

/// Anything that decides which requests start.
trait Policy {
    fn name(&self) -> &'static str;
    fn arrive(&mut self, request: &Request, now: u64) -> Arrival;
    /// A running request ends; returns the requests that start now.
    fn finish(&mut self, id: TaskId, now: u64) -> Vec<TaskId>;
    /// When the policy next has timed work to do.
    fn wakeup(&self) -> Option<u64>;
    /// Timed work: (started, expired).
    fn tick(&mut self, now: u64) -> (Vec<TaskId>, Vec<TaskId>);
    /// Running requests it stopped to make room (they start over later).
    fn take_preempted(&mut self) -> Vec<TaskId> {
        Vec::new()
    }
    /// Each tenant's weighted service counter, under a fair share by use.
    fn counters(&self) -> Option<[f64; TENANTS.len()]> {
        None
    }
    /// Its estimate of when a parked request starts, if it makes one.
    fn estimate(&self, _id: TaskId, _now: u64) -> Option<u64> {
        None
    }
}

impl Policy for StrictFifo {
    fn name(&self) -> &'static str {
        "strict FIFO"
    }

    fn arrive(&mut self, request: &Request, _now: u64) -> Arrival {
        Arrival {
            started: StrictFifo::arrive(self, request.id, request.units),
            dropped: Vec::new(),
        }
    }

    fn finish(&mut self, id: TaskId, _now: u64) -> Vec<TaskId> {
        StrictFifo::finish(self, id)
    }

    fn wakeup(&self) -> Option<u64> {
        None
    }

    fn tick(&mut self, _now: u64) -> (Vec<TaskId>, Vec<TaskId>) {
        (Vec::new(), Vec::new())
    }
}

/// The real core with the given limits.
struct Core {
    name: &'static str,
    lot: ParkingLot,
    /// Whether its tickets carry their deadlines (the core then expires a parked request at
    /// its deadline); without, a late request still runs, as in a server that sets none.
    deadlines: bool,
    /// Whether every request gets one priority (`Normal`), as from a gateway that passes
    /// deadlines on but no classes.
    one_priority: bool,
}

impl Core {
    fn new(name: &'static str, limits: PoolLimits) -> Self {
        Self {
            name,
            lot: ParkingLot::new(limits).expect("valid limits"),
            deadlines: true,
            one_priority: false,
        }
    }

    fn with_one_priority(mut self) -> Self {
        self.one_priority = true;
        self
    }

    fn without_deadlines(mut self) -> Self {
        self.deadlines = false;
        self
    }

    fn ticket(&self, request: &Request) -> Ticket {
        Ticket {
            id: request.id,
            priority: if self.one_priority {
                Priority::Normal
            } else {
                request.class.priority()
            },
            cost: ResourceCost::gpu_vram(request.units),
            created_at_ms: request.arrives_ms,
            deadline_ms: request.deadline_ms().filter(|_| self.deadlines),
            tenant: request.tenant as u64 + 1,
            timeout_ms: Some(request.timeout_ms),
            also: Default::default(),
        }
    }
}

impl Policy for Core {
    fn name(&self) -> &'static str {
        self.name
    }

    fn arrive(&mut self, request: &Request, now: u64) -> Arrival {
        let mut arrival = Arrival::default();
        let ticket = self.ticket(request);
        // The shell's admission check under `refuse_if_late` (shell/admission.rs).
        if self.lot.limits().admission.refuse_if_late {
            if let Some(deadline) = ticket.deadline_ms {
                if self.lot.misses_deadline(&ticket, deadline, now).is_some() {
                    arrival.dropped.push(request.id);
                    return arrival;
                }
            }
        }
        match self.lot.admit(ticket, now).split_started() {
            (Admit::Start, also) => {
                arrival.started.push(request.id);
                arrival.started.extend(also);
            }
            (Admit::Park, _) => {}
            (Admit::ParkShedding { shed, .. }, started) => {
                arrival.dropped.extend(shed);
                arrival.started.extend(started);
            }
            (Admit::Expire | Admit::Reject(_), _) => arrival.dropped.push(request.id),
            (other, _) => panic!("request {} answered {other:?}", request.id),
        }
        arrival
    }

    fn finish(&mut self, id: TaskId, now: u64) -> Vec<TaskId> {
        self.lot.complete(id, now).expect("a running request ends")
    }

    fn wakeup(&self) -> Option<u64> {
        self.lot.next_wakeup()
    }

    fn tick(&mut self, now: u64) -> (Vec<TaskId>, Vec<TaskId>) {
        let tick = self.lot.tick(now);
        (tick.started, tick.expired)
    }

    fn estimate(&self, id: TaskId, now: u64) -> Option<u64> {
        self.lot.estimate_start(id, now)?.start_ms
    }

    fn counters(&self) -> Option<[f64; TENANTS.len()]> {
        self.lot.limits().fair_by_use?;
        let mut counters = [0.0; TENANTS.len()];
        for (tenant, counter) in counters.iter_mut().enumerate() {
            *counter = self.lot.tenant_service(tenant as u64 + 1)?;
        }
        Some(counters)
    }
}

/// A model of vLLM's `priority` policy: the waiting queue in (priority, arrival) order; the
/// head starts when it fits, else nothing behind it starts; a head that does not fit
/// preempts running requests of lower priority, latest arrival first, while that makes
/// room, and they wait again with their original rank.
struct VllmPriority {
    requests: HashMap<TaskId, Request>,
    waiting: BTreeSet<(std::cmp::Reverse<Priority>, u64, TaskId)>,
    running: BTreeSet<(Priority, std::cmp::Reverse<u64>, TaskId)>,
    used: u32,
    preempted: Vec<TaskId>,
}

impl VllmPriority {
    fn new() -> Self {
        Self {
            requests: HashMap::new(),
            waiting: BTreeSet::new(),
            running: BTreeSet::new(),
            used: 0,
            preempted: Vec::new(),
        }
    }

    fn key(request: &Request) -> (std::cmp::Reverse<Priority>, u64, TaskId) {
        (
            std::cmp::Reverse(request.class.priority()),
            request.arrives_ms,
            request.id,
        )
    }

    fn schedule(&mut self) -> Vec<TaskId> {
        let mut started = Vec::new();
        while let Some(&(std::cmp::Reverse(priority), arrives_ms, id)) = self.waiting.first() {
            let units = self.requests[&id].units;
            while self.used + units > CARD_UNITS || self.running.len() == WORKERS {
                let Some(&(victim_priority, _, victim)) = self.running.first() else {
                    break;
                };
                if victim_priority >= priority {
                    break;
                }
                self.running.pop_first();
                let request = self.requests[&victim];
                self.used -= request.units;
                self.waiting.insert(Self::key(&request));
                self.preempted.push(victim);
            }
            if self.used + units > CARD_UNITS || self.running.len() == WORKERS {
                break;
            }
            self.waiting.pop_first();
            self.used += units;
            self.running
                .insert((priority, std::cmp::Reverse(arrives_ms), id));
            started.push(id);
        }
        started
    }
}

impl Policy for VllmPriority {
    fn name(&self) -> &'static str {
        "vLLM-like priority"
    }

    fn arrive(&mut self, request: &Request, _now: u64) -> Arrival {
        self.requests.insert(request.id, *request);
        self.waiting.insert(Self::key(request));
        Arrival {
            started: self.schedule(),
            dropped: Vec::new(),
        }
    }

    fn finish(&mut self, id: TaskId, _now: u64) -> Vec<TaskId> {
        let request = self.requests[&id];
        let removed = self.running.remove(&(
            request.class.priority(),
            std::cmp::Reverse(request.arrives_ms),
            id,
        ));
        assert!(removed, "request {id} was running");
        self.used -= request.units;
        self.schedule()
    }

    fn wakeup(&self) -> Option<u64> {
        None
    }

    fn tick(&mut self, _now: u64) -> (Vec<TaskId>, Vec<TaskId>) {
        (Vec::new(), Vec::new())
    }

    fn take_preempted(&mut self) -> Vec<TaskId> {
        std::mem::take(&mut self.preempted)
    }
}

// ---------------------------------------------------------------------------------------
// The simulation
// ---------------------------------------------------------------------------------------

/// How one request fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// It started (the last time, after any preemption) at this instant.
    Started(u64),
    /// It ended without running (refused, expired or displaced) at this instant.
    Dropped(u64),
}

/// What one policy did with the workload.
struct Run {
    name: &'static str,
    fates: Vec<Fate>,
    /// The first start of each request (a preempted one starts more than once).
    first_starts: Vec<Option<u64>>,
    /// (time, units in use from then on), one entry per event time.
    usage: Vec<(u64, u32)>,
    /// Each tenant's units·ms held and whether it had requests waiting, sampled each second.
    service: Vec<(u64, [f64; TENANTS.len()], [bool; TENANTS.len()])>,
    /// The fair share's counters at the same instants, under a fair share by use.
    counters: Vec<Option<[f64; TENANTS.len()]>>,
    /// (estimated start, actual start, arrival, class) of the requests that parked.
    estimates: Vec<(u64, u64, u64, Class)>,
    preemptions: usize,
}

/// Runs `requests` through `policy`; with `estimates`, asks it when each request that parks
/// will start, to compare with when it does.
fn simulate(policy: &mut dyn Policy, requests: &[Request], estimates_wanted: bool) -> Run {
    let index: HashMap<TaskId, usize> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id, i))
        .collect();
    let mut fates: Vec<Option<Fate>> = vec![None; requests.len()];
    let mut first_starts = vec![None; requests.len()];
    let mut running_since: BTreeMap<TaskId, u64> = BTreeMap::new();
    let mut ends: BTreeSet<(u64, TaskId)> = BTreeSet::new();
    let mut usage = vec![(0, 0)];
    let mut used = 0u32;
    let mut held = [0.0f64; TENANTS.len()];
    let mut waiting = [0usize; TENANTS.len()];
    let mut service = Vec::new();
    let mut counters = Vec::new();
    let mut next_sample = 0u64;
    let mut estimates_made: HashMap<TaskId, u64> = HashMap::new();
    let mut estimates = Vec::new();
    let mut preemptions = 0;
    let mut next_arrival = 0;
    let mut now = 0;
    loop {
        let arrival = requests.get(next_arrival).map(|r| r.arrives_ms);
        let end = ends.first().map(|&(at, _)| at);
        let wake = policy.wakeup().map(|at| at.max(now));
        let Some(at) = [arrival, end, wake].into_iter().flatten().min() else {
            break;
        };
        // Service is sampled on whole seconds, before the events of `at`.
        while next_sample <= at {
            let mut sample = held;
            for (&id, &since) in &running_since {
                let request = &requests[index[&id]];
                sample[request.tenant] +=
                    f64::from(request.units) * next_sample.saturating_sub(since) as f64;
            }
            service.push((next_sample, sample, waiting.map(|count| count > 0)));
            counters.push(policy.counters());
            next_sample += 1_000;
        }
        now = at;
        let mut started = Vec::new();
        let mut dropped = Vec::new();
        while let Some(&(at, id)) = ends.first() {
            if at > now {
                break;
            }
            ends.pop_first();
            let request = &requests[index[&id]];
            let since = running_since.remove(&id).expect("an ending request runs");
            held[request.tenant] += f64::from(request.units) * (now - since) as f64;
            used -= request.units;
            started.extend(policy.finish(id, now));
        }
        let mut arrived = Vec::new();
        while let Some(request) = requests.get(next_arrival).filter(|r| r.arrives_ms <= now) {
            next_arrival += 1;
            waiting[request.tenant] += 1;
            let outcome = policy.arrive(request, now);
            started.extend(outcome.started);
            dropped.extend(outcome.dropped);
            arrived.push(request.id);
        }
        if policy.wakeup().is_some_and(|at| at <= now) {
            let (more, expired) = policy.tick(now);
            started.extend(more);
            dropped.extend(expired);
        }
        for id in policy.take_preempted() {
            // Started and stopped within this instant: it never ran.
            if let Some(position) = started.iter().position(|&other| other == id) {
                started.remove(position);
                continue;
            }
            let request = &requests[index[&id]];
            let since = running_since.remove(&id).expect("a preempted request runs");
            held[request.tenant] += f64::from(request.units) * (now - since) as f64;
            used -= request.units;
            ends.remove(&(since + request.runs_ms, id));
            fates[index[&id]] = None;
            waiting[request.tenant] += 1;
            preemptions += 1;
        }
        for id in dropped {
            let slot = index[&id];
            assert!(fates[slot].is_none(), "request {id} ended twice");
            fates[slot] = Some(Fate::Dropped(now));
            waiting[requests[slot].tenant] -= 1;
        }
        for id in started {
            let slot = index[&id];
            let request = &requests[slot];
            assert!(fates[slot].is_none(), "request {id} started twice");
            fates[slot] = Some(Fate::Started(now));
            first_starts[slot].get_or_insert(now);
            waiting[request.tenant] -= 1;
            used += request.units;
            assert!(
                used <= CARD_UNITS,
                "{} overcommitted the card",
                policy.name()
            );
            running_since.insert(id, now);
            ends.insert((now + request.runs_ms, id));
            if let Some(estimate) = estimates_made.remove(&id) {
                estimates.push((estimate, now, request.arrives_ms, request.class));
            }
        }
        for id in arrived.into_iter().filter(|_| estimates_wanted) {
            if fates[index[&id]].is_none() {
                if let Some(estimate) = policy.estimate(id, now) {
                    estimates_made.insert(id, estimate);
                }
            }
        }
        usage.push((now, used));
    }
    let fates = fates
        .into_iter()
        .enumerate()
        .map(|(slot, fate)| {
            fate.unwrap_or_else(|| panic!("{}: request {} has no end", policy.name(), slot + 1))
        })
        .collect();
    Run {
        name: policy.name(),
        fates,
        first_starts,
        usage,
        service,
        counters,
        estimates,
        preemptions,
    }
}

// ---------------------------------------------------------------------------------------
// Measures
// ---------------------------------------------------------------------------------------

/// The share of interactive requests that started by their deadline. A preempted request
/// counts by its first start: its first token was out by then.
fn goodput(run: &Run, requests: &[Request]) -> f64 {
    let (mut in_time, mut total) = (0usize, 0usize);
    for (request, first_start) in requests.iter().zip(&run.first_starts) {
        let Some(deadline) = request.deadline_ms() else {
            continue;
        };
        total += 1;
        if first_start.is_some_and(|at| at <= deadline) {
            in_time += 1;
        }
    }
    in_time as f64 / total.max(1) as f64
}

/// Units·ms used over the card's units·ms from the first arrival to the last.
fn utilisation(run: &Run, requests: &[Request]) -> f64 {
    let to = requests.last().map_or(0, |r| r.arrives_ms);
    let mut area = 0.0;
    for pair in run.usage.windows(2) {
        let (at, units) = pair[0];
        let next = pair[1].0.min(to);
        if at >= to {
            break;
        }
        area += f64::from(units) * (next - at) as f64;
    }
    area / (f64::from(CARD_UNITS) * to.max(1) as f64)
}

fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn waits(run: &Run, requests: &[Request], class: Class) -> Vec<u64> {
    let mut waits: Vec<u64> = requests
        .iter()
        .zip(&run.fates)
        .filter(|(request, _)| request.class == class)
        .filter_map(|(request, fate)| match fate {
            Fate::Started(at) => Some(at - request.arrives_ms),
            Fate::Dropped(_) => None,
        })
        .collect();
    waits.sort_unstable();
    waits
}

fn dropped(run: &Run, requests: &[Request], class: Class) -> usize {
    requests
        .iter()
        .zip(&run.fates)
        .filter(|(request, fate)| request.class == class && matches!(fate, Fate::Dropped(_)))
        .count()
}

/// The largest gap in weighted service (units·ms held over weight) between two tenants
/// that were both backlogged through a whole window, over every window of `window_ms`,
/// in multiples of the largest request's cost (its units times its run).
fn service_gap(run: &Run, requests: &[Request], window_ms: u64) -> f64 {
    let largest = requests
        .iter()
        .map(|r| f64::from(r.units) * r.runs_ms as f64)
        .fold(0.0, f64::max);
    let step = (window_ms / 1_000) as usize;
    let mut worst = 0.0f64;
    for (from, to) in run.service.iter().zip(run.service.iter().skip(step)) {
        let mut lowest = f64::INFINITY;
        let mut highest = f64::NEG_INFINITY;
        let mut backlogged = 0;
        for (tenant, spec) in TENANTS.iter().enumerate() {
            // Backlogged at both ends of the window (sampled each second in between).
            if !(from.2[tenant] && to.2[tenant]) {
                continue;
            }
            backlogged += 1;
            let weighted = (to.1[tenant] - from.1[tenant]) / f64::from(spec.weight);
            lowest = lowest.min(weighted);
            highest = highest.max(weighted);
        }
        if backlogged >= 2 {
            worst = worst.max(highest - lowest);
        }
    }
    worst / largest
}

/// Median and p90 of |estimated - actual| / wait over the parked requests that started.
fn estimate_error(run: &Run, class: Option<Class>) -> Option<(f64, f64)> {
    let mut errors: Vec<f64> = run
        .estimates
        .iter()
        .filter(|&&(_, _, _, c)| class.is_none_or(|wanted| wanted == c))
        .filter(|&&(_, actual, arrived, _)| actual > arrived)
        .map(|&(estimate, actual, arrived, _)| {
            estimate.abs_diff(actual) as f64 / (actual - arrived) as f64
        })
        .collect();
    if errors.is_empty() {
        return None;
    }
    errors.sort_by(f64::total_cmp);
    let at = |q: f64| errors[((errors.len() - 1) as f64 * q).round() as usize];
    Some((at(0.5), at(0.9)))
}

/// How long the client of an interactive request that missed its target waited to learn
/// it (median): until its refusal, its expiry, or its deadline passing while it waited.
fn miss_known_after(run: &Run, requests: &[Request]) -> Option<u64> {
    let mut waits: Vec<u64> = requests
        .iter()
        .zip(run.fates.iter().zip(&run.first_starts))
        .filter_map(|(request, (fate, first_start))| {
            let deadline = request.deadline_ms()?;
            match (fate, first_start) {
                (_, Some(at)) if *at <= deadline => None,
                (Fate::Dropped(at), _) => Some(at.min(&deadline) - request.arrives_ms),
                _ => Some(deadline - request.arrives_ms),
            }
        })
        .collect();
    waits.sort_unstable();
    (!waits.is_empty()).then(|| quantile(&waits, 0.5))
}

fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1_000.0)
}

fn main() {
    let measured = support::measured();
    let count = if measured { 40_000 } else { 2_000 };
    let requests = workload(count, SEED);
    let limits = PoolLimits::new(CARD_UNITS, WORKERS).with_max_queue_depth(count);
    let mut policies: Vec<Box<dyn Policy>> = vec![
        Box::new(StrictFifo::new(CARD_UNITS, WORKERS)),
        Box::new(Core::new("strict priority, no deadlines", limits).without_deadlines()),
        Box::new(Core::new(BASELINE, limits)),
        Box::new(VllmPriority::new()),
    ];
    policies.extend(slo_policies(&limits));
    let runs: Vec<Run> = policies
        .iter_mut()
        .map(|policy| simulate(policy.as_mut(), &requests, true))
        .collect();
    report(&runs, &requests);
    fairness_study(if measured { 2_000 } else { 200 });
}

/// Every tenant backlogged from the start with batch work of its own sizes (1 to its
/// `max_units`, 1-10 s), `per_tenant` requests each, arriving within the first second.
fn backlog_workload(per_tenant: usize, seed: u64) -> Vec<Request> {
    let mut rng = Rng(seed);
    let mut requests: Vec<Request> = (0..per_tenant * TENANTS.len())
        .map(|index| {
            let tenant = index % TENANTS.len();
            let units = rng.between(1, u64::from(TENANTS[tenant].max_units)) as u32;
            let runs_ms = rng.between(1_000, 10_000);
            let timeout_ms = (runs_ms * 3 / 2).div_ceil(1_000) * 1_000;
            Request {
                id: index as TaskId + 1,
                arrives_ms: (index as u64 * 1_000) / (per_tenant * TENANTS.len()) as u64,
                units,
                runs_ms,
                timeout_ms,
                tenant,
                class: Class::Batch,
                ttft_ms: None,
            }
        })
        .collect();
    requests.sort_by_key(|r| (r.arrives_ms, r.id));
    requests
}

/// The fairness study: with every tenant backlogged, how the service (units·ms held) splits
/// between tenants of weights 3, 2, 1, 1, under no fair share, today's order by what a
/// tenant holds now, and the weighted order by use. The gap is the largest difference of
/// weighted service (service over weight) between two tenants while all are backlogged, in
/// multiples of the largest weighted charge (units times timeout over weight, the bound
/// PARKING_LOT.md derives for the counters).
fn fairness_study(per_tenant: usize) {
    let requests = backlog_workload(per_tenant, SEED ^ 0xFA1E);
    let limits = PoolLimits::new(CARD_UNITS, WORKERS).with_max_queue_depth(requests.len());
    let by_use = |charge| {
        let mut core = Core::new(
            match charge {
                UsageCharge::Held => "weighted, by units x time held",
                UsageCharge::Reported => "weighted, by units reported",
            },
            limits.with_fair_by_use(Some(FairByUse::new(charge))),
        );
        for (tenant, spec) in TENANTS.iter().enumerate() {
            core.lot
                .set_tenant_weight(tenant as u64 + 1, spec.weight)
                .expect("a valid weight");
        }
        core
    };
    let mut policies: Vec<Box<dyn Policy>> = vec![
        Box::new(Core::new("no fair share", limits)),
        Box::new(Core::new(
            "by what a tenant holds now (today)",
            limits.with_fair_share(Some(FairShare::MaxFraction(1.0))),
        )),
        Box::new(by_use(UsageCharge::Held)),
        Box::new(by_use(UsageCharge::Reported)),
    ];
    let largest_weighted = |charge: fn(&Request) -> f64| {
        requests
            .iter()
            .map(|r| charge(r) / f64::from(TENANTS[r.tenant].weight))
            .fold(0.0, f64::max)
    };
    let held = largest_weighted(|r| f64::from(r.units) * r.timeout_ms as f64);
    let reported = largest_weighted(|r| f64::from(r.units));
    // The counters' bound is one largest charge of the order's own kind.
    let largest_charge = |name: &str| {
        if name.contains("reported") {
            reported
        } else {
            held
        }
    };
    println!();
    println!(
        "Fairness: {} tenants backlogged ({} requests each), weights {:?}, largest requests {:?} \
         units",
        TENANTS.len(),
        per_tenant,
        TENANTS.map(|t| t.weight),
        TENANTS.map(|t| t.max_units)
    );
    println!();
    let names = TENANTS.map(|t| t.name).join(" | ");
    println!(
        "| order | {names} | weighted service gap / largest weighted charge | counter gap (/ its \
         largest charge) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let weight_sum: u32 = TENANTS.iter().map(|t| t.weight).sum();
    for policy in &mut policies {
        let run = simulate(policy.as_mut(), &requests, false);
        // While every tenant is backlogged.
        let all_waiting = |sample: &&(u64, [f64; 4], [bool; 4])| sample.2.iter().all(|&w| w);
        let first = run
            .service
            .iter()
            .position(|sample| all_waiting(&sample))
            .unwrap_or(0);
        let backlogged: Vec<_> = run.service[first..]
            .iter()
            .take_while(all_waiting)
            .collect();
        let counter_gap = run.counters[first..first + backlogged.len()]
            .iter()
            .flatten()
            .map(|counters| {
                counters.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    - counters.iter().copied().fold(f64::INFINITY, f64::min)
            })
            .reduce(f64::max);
        let Some(&&(_, last, _)) = backlogged.last() else {
            continue;
        };
        let total: f64 = last.iter().sum();
        let gap = backlogged
            .iter()
            .map(|(_, service, _)| {
                let weighted: Vec<f64> = service
                    .iter()
                    .zip(&TENANTS)
                    .map(|(units_ms, spec)| units_ms / f64::from(spec.weight))
                    .collect();
                weighted.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    - weighted.iter().copied().fold(f64::INFINITY, f64::min)
            })
            .fold(0.0, f64::max);
        let shares: Vec<String> = last
            .iter()
            .zip(&TENANTS)
            .map(|(units_ms, spec)| {
                format!(
                    "{:.1}% (weight: {:.1}%)",
                    units_ms / total * 100.0,
                    f64::from(spec.weight) / f64::from(weight_sum) * 100.0
                )
            })
            .collect();
        println!(
            "| {} | {} | {:.2} | {} |",
            run.name,
            shares.join(" | "),
            gap / held,
            counter_gap.map_or("-".to_owned(), |gap| format!(
                "{gap:.0} ({:.2})",
                gap / largest_charge(run.name)
            )),
        );
    }
}

/// The SLO-aware policies, one rule added at a time: the deadline order (rule 20), then
/// the refusal of late submissions (rule 23's estimate), then the weighted fair share by use
/// (rule 22) with a queue bounded by units (rule 21).
fn slo_policies(limits: &PoolLimits) -> Vec<Box<dyn Policy>> {
    let deadline = (*limits).with_order(QueueOrder::Deadline);
    let refusing = deadline.with_admission(Admission {
        refuse_if_late: true,
    });
    let fair = refusing
        .with_fair_by_use(Some(
            FairByUse::new(UsageCharge::Held).with_half_life_ms(60_000),
        ))
        .with_max_queued_units(Some(u64::from(CARD_UNITS) * 64));
    let mut weighted = Core::new("SLO-aware: + weighted fair share by use", fair);
    for (tenant, spec) in TENANTS.iter().enumerate() {
        weighted
            .lot
            .set_tenant_weight(tenant as u64 + 1, spec.weight)
            .expect("a valid weight");
    }
    vec![
        Box::new(Core::new("one priority, fifo", *limits).with_one_priority()),
        Box::new(Core::new("one priority, deadline order", deadline).with_one_priority()),
        Box::new(Core::new("deadline order", deadline)),
        Box::new(Core::new("deadline order + refuse if late", refusing)),
        Box::new(weighted),
    ]
}

fn report(runs: &[Run], requests: &[Request]) {
    let interactive = requests
        .iter()
        .filter(|r| r.class == Class::Interactive)
        .count();
    println!(
        "{} requests ({} interactive with TTFT targets of {:?} ms), {} tenants, {:.1}x \
         overload, {CARD_UNITS} units, {WORKERS} slots",
        requests.len(),
        interactive,
        TTFT_MS,
        TENANTS.len(),
        OVERLOAD
    );
    let baseline = runs
        .iter()
        .find(|run| run.name == BASELINE)
        .map(|run| (goodput(run, requests), utilisation(run, requests)))
        .expect("the strict priority run");
    println!();
    println!(
        "| policy | SLO goodput | vs strict priority | utilisation | p99 wait, interactive | \
         p99 wait, batch | interactive refused or expired | a miss is known after | preemptions \
         | service gap (60 s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for run in runs {
        let good = goodput(run, requests);
        let used = utilisation(run, requests);
        println!(
            "| {} | {:.1}% | {:.2}x | {:.1}% ({:+.1} pts) | {} | {} | {} | {} | {} | {:.2} |",
            run.name,
            good * 100.0,
            good / baseline.0,
            used * 100.0,
            (used - baseline.1) * 100.0,
            seconds(quantile(&waits(run, requests, Class::Interactive), 0.99)),
            seconds(quantile(&waits(run, requests, Class::Batch), 0.99)),
            dropped(run, requests, Class::Interactive),
            miss_known_after(run, requests).map_or("-".to_owned(), seconds),
            run.preemptions,
            service_gap(run, requests, 60_000),
        );
    }
    for run in runs {
        let Some((median, p90)) = estimate_error(run, None) else {
            continue;
        };
        println!();
        println!(
            "Start estimates of {} (|estimated - actual| / wait):",
            run.name
        );
        println!("| class | parked requests | median | p90 |");
        println!("|---|---|---|---|");
        for class in [Class::Interactive, Class::Batch] {
            if let Some((median, p90)) = estimate_error(run, Some(class)) {
                let parked = run.estimates.iter().filter(|e| e.3 == class).count();
                println!(
                    "| {class:?} | {parked} | {:.0}% | {:.0}% |",
                    median * 100.0,
                    p90 * 100.0
                );
            }
        }
        println!(
            "| all | {} | {:.0}% | {:.0}% |",
            run.estimates.len(),
            median * 100.0,
            p90 * 100.0
        );
    }
}
