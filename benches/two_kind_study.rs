//! The two-kind packing study: a decode engine's KV-cache blocks **and** its sequence slots,
//! scheduled three ways on one simulated engine (1,000 blocks, 8 sequence slots, 32 worker
//! threads, then 10), under the same overload of requests:
//!
//! - **vector admission** (ours, core rule 25): each request declares its blocks and, beside
//!   them, one slot (`SubmitOptions::with_also`); it starts when both fit and holds both;
//! - **blocks, then a semaphore**: what users write today. The request declares its blocks
//!   only; once started it takes one of 8 slots from a second semaphore (FIFO), waiting for
//!   one while it holds its blocks and its worker thread (hold-and-wait);
//! - **blocks only**: the slots are not enforced at all (the engine is trusted to cope):
//!   every start past the 8th sequence running is an over-commit.
//!
//! A deterministic simulation on a virtual clock (fixed seed), driving the real pure core
//! (`ParkingLot`) in every variant. It reports each kind's utilisation (units held by a
//! sequence that is decoding, over the capacity), the work done per simulated minute, the
//! over-commits, and the worker and block time spent holding without decoding.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench two_kind_study` prints the table for
//! BENCHMARKS.md; under `cargo test` it runs a shorter workload as a smoke test.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
use prometheus_parking_lot::core::{Capacity, PoolLimits, StarvationGuard};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::{ExtraCosts, Priority, ResourceCost, ResourceKind};

const BLOCKS: u32 = 1_000;
const SLOTS: u32 = 8;
/// Worker threads of the two engines studied: plenty, and few beside the slots.
const WORKERS: [usize; 2] = [32, 10];
const SEED: u64 = 0x2C0D_E2026;
/// Offered load: arrivals carry this many times the work the slots can do.
const OVERLOAD: f64 = 1.3;
/// Mean decode time of a request, ms.
const MEAN_RUN_MS: f64 = 800.0;

/// xorshift64*: deterministic and good enough for a workload.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// One request: when it arrives, the blocks it needs and how long it decodes.
#[derive(Debug, Clone, Copy)]
struct Request {
    id: TaskId,
    at_ms: u64,
    blocks: u32,
    run_ms: u64,
    priority: Priority,
}

/// The workload: Poisson arrivals at `OVERLOAD` times what 8 slots serve, blocks 20-250
/// (prompt and reply), decode time exponential around `MEAN_RUN_MS`.
fn workload(requests: usize) -> Vec<Request> {
    let mut rng = Rng(SEED);
    let rate_per_ms = OVERLOAD * f64::from(SLOTS) / MEAN_RUN_MS;
    let mut at = 0.0;
    (1..=requests as u64)
        .map(|id| {
            at += rng.exp(1.0 / rate_per_ms);
            Request {
                id,
                at_ms: at as u64,
                blocks: 20 + (rng.next() % 231) as u32,
                run_ms: rng.exp(MEAN_RUN_MS).max(1.0) as u64,
                priority: Priority::ALL[(rng.next() % 4) as usize],
            }
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Vector,
    Semaphore,
    BlocksOnly,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Vector => "vector admission (blocks and a slot)",
            Policy::Semaphore => "blocks, then a slot semaphore",
            Policy::BlocksOnly => "blocks only (slots not enforced)",
        }
    }
}

/// What one policy did.
#[derive(Debug, Default)]
struct Outcome {
    completed: usize,
    end_ms: u64,
    /// Block·ms held by decoding sequences.
    decoding_block_ms: f64,
    /// Slot·ms held by decoding sequences (at most 8 at a time counted: the engine's own).
    decoding_slot_ms: f64,
    /// Block·ms and worker·ms held by started requests waiting for a slot.
    idle_block_ms: f64,
    idle_worker_ms: f64,
    /// Starts that took the decoding sequences past 8.
    over_commits: usize,
    /// The most sequences decoding at once.
    most_decoding: u32,
    /// Mean wait from arrival to the start of decoding, ms.
    mean_wait_ms: f64,
}

/// The simulation's state between events.
struct Engine {
    policy: Policy,
    lot: ParkingLot,
    requests: HashMap<TaskId, Request>,
    /// Started, waiting for a slot (the semaphore policy): id and since when.
    slot_queue: VecDeque<(TaskId, u64)>,
    free_slots: u32,
    decoding: u32,
    decoding_blocks: u32,
    idle_blocks: u32,
    idle_workers: u32,
    ends: BinaryHeap<Reverse<(u64, TaskId)>>,
    last_ms: u64,
    outcome: Outcome,
    waits_ms: f64,
}

impl Engine {
    fn new(policy: Policy, workers: usize) -> Self {
        let capacity = match policy {
            Policy::Vector => Capacity::uniform(BLOCKS).with(ResourceKind::Cpu, SLOTS),
            _ => Capacity::uniform(BLOCKS),
        };
        let limits = PoolLimits::new(BLOCKS, workers)
            .with_capacity(capacity)
            .with_max_queue_depth(usize::MAX)
            .with_starvation(StarvationGuard::default());
        Self {
            policy,
            lot: ParkingLot::new(limits).expect("limits"),
            requests: HashMap::new(),
            slot_queue: VecDeque::new(),
            free_slots: SLOTS,
            decoding: 0,
            decoding_blocks: 0,
            idle_blocks: 0,
            idle_workers: 0,
            ends: BinaryHeap::new(),
            last_ms: 0,
            outcome: Outcome::default(),
            waits_ms: 0.0,
        }
    }

    /// Integrates what was held from the last event to `now`.
    fn advance(&mut self, now: u64) {
        let span = (now - self.last_ms) as f64;
        self.outcome.decoding_block_ms += span * f64::from(self.decoding_blocks);
        self.outcome.decoding_slot_ms += span * f64::from(self.decoding.min(SLOTS));
        self.outcome.idle_block_ms += span * f64::from(self.idle_blocks);
        self.outcome.idle_worker_ms += span * f64::from(self.idle_workers);
        self.last_ms = now;
    }

    fn ticket(&self, request: &Request) -> Ticket {
        let cost = ResourceCost::gpu_vram(request.blocks);
        let also = match self.policy {
            Policy::Vector => ExtraCosts::new(cost, &[ResourceCost::cpu(1)]).expect("a slot"),
            _ => ExtraCosts::NONE,
        };
        Ticket {
            id: request.id,
            priority: request.priority,
            cost,
            created_at_ms: request.at_ms,
            deadline_ms: None,
            tenant: 0,
            timeout_ms: None,
            also,
        }
    }

    fn arrive(&mut self, request: Request) {
        self.advance(request.at_ms);
        self.requests.insert(request.id, request);
        match self.lot.admit(self.ticket(&request), request.at_ms) {
            Admit::Start => self.started(request.id, request.at_ms),
            Admit::Park => {}
            other => panic!("request {}: {other:?}", request.id),
        }
    }

    /// The lot started `id` at `now`: it decodes, or (semaphore) waits for a slot.
    fn started(&mut self, id: TaskId, now: u64) {
        let blocks = self.requests[&id].blocks;
        if self.policy == Policy::Semaphore && self.free_slots == 0 {
            self.slot_queue.push_back((id, now));
            self.idle_blocks += blocks;
            self.idle_workers += 1;
            return;
        }
        if self.policy == Policy::Semaphore {
            self.free_slots -= 1;
        }
        self.decode(id, now);
    }

    fn decode(&mut self, id: TaskId, now: u64) {
        let request = self.requests[&id];
        self.decoding += 1;
        if self.decoding > SLOTS {
            self.outcome.over_commits += 1;
        }
        self.outcome.most_decoding = self.outcome.most_decoding.max(self.decoding);
        self.decoding_blocks += request.blocks;
        self.waits_ms += (now - request.at_ms) as f64;
        self.ends.push(Reverse((now + request.run_ms, id)));
    }

    fn end(&mut self, id: TaskId, now: u64) {
        self.advance(now);
        let request = self.requests.remove(&id).expect("decoding");
        self.decoding -= 1;
        self.decoding_blocks -= request.blocks;
        self.outcome.completed += 1;
        self.outcome.end_ms = now;
        if self.policy == Policy::Semaphore {
            // The slot goes to the first started request waiting for one.
            match self.slot_queue.pop_front() {
                Some((next, _)) => {
                    self.idle_blocks -= self.requests[&next].blocks;
                    self.idle_workers -= 1;
                    self.decode(next, now);
                }
                None => self.free_slots += 1,
            }
        }
        let started = self.lot.complete(id, now).expect("running");
        for id in started {
            self.started(id, now);
        }
    }
}

fn simulate(policy: Policy, workers: usize, requests: &[Request]) -> Outcome {
    let mut engine = Engine::new(policy, workers);
    let mut arrivals = requests.iter().peekable();
    loop {
        let next_end = engine.ends.peek().map(|Reverse((at, _))| *at);
        match (arrivals.peek(), next_end) {
            (Some(request), Some(at)) if request.at_ms <= at => {
                engine.arrive(**request);
                arrivals.next();
            }
            (Some(request), None) => {
                engine.arrive(**request);
                arrivals.next();
            }
            (_, Some(_)) => {
                let Reverse((at, id)) = engine.ends.pop().expect("an end");
                engine.end(id, at);
            }
            (None, None) => break,
        }
    }
    assert_eq!(
        engine.outcome.completed,
        requests.len(),
        "every request ran"
    );
    engine
        .lot
        .check_invariants()
        .expect("the lot's invariants at the end");
    let mut outcome = engine.outcome;
    outcome.mean_wait_ms = engine.waits_ms / requests.len() as f64;
    outcome
}

fn main() {
    let requests = match std::env::args().any(|arg| arg == "--bench") {
        true => 20_000,
        false => 2_000,
    };
    let workload = workload(requests);
    println!(
        "two_kind_study: {requests} requests, {BLOCKS} KV blocks, {SLOTS} sequence slots, \
         offered load {OVERLOAD}x the slots"
    );
    println!();
    println!("| workers | policy | block utilisation | slot utilisation | requests per minute | over-commits | most decoding at once | worker·s holding, not decoding | block·s holding, not decoding | mean wait, s |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (workers, policy) in WORKERS.into_iter().flat_map(|workers| {
        [Policy::Vector, Policy::Semaphore, Policy::BlocksOnly].map(|policy| (workers, policy))
    }) {
        let outcome = simulate(policy, workers, &workload);
        let span = outcome.end_ms as f64;
        println!(
            "| {workers} | {} | {:.1}% | {:.1}% | {:.0} | {} | {} | {:.0} | {:.0} | {:.1} |",
            policy.name(),
            100.0 * outcome.decoding_block_ms / (span * f64::from(BLOCKS)),
            100.0 * outcome.decoding_slot_ms / (span * f64::from(SLOTS)),
            outcome.completed as f64 / (span / 60_000.0),
            outcome.over_commits,
            outcome.most_decoding,
            outcome.idle_worker_ms / 1_000.0,
            outcome.idle_block_ms / 1_000.0,
            outcome.mean_wait_ms / 1_000.0,
        );
        if policy == Policy::Vector {
            assert_eq!(
                outcome.over_commits, 0,
                "vector admission never over-commits"
            );
            assert_eq!(outcome.idle_worker_ms, 0.0, "nor holds without decoding");
        }
    }
}
