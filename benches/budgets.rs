//! A quota (core rule 15) under load: how much of the budget the core spends while work
//! waits, how long each priority waits, whether any window spends more than the bound, and
//! what a budget adds to a scheduling decision, beside the same run without one.
//!
//! The pure core runs on a simulated clock, so the figures of a run are the same on every
//! machine but the CPU times. Tasks arrive at random (exponential gaps) with costs drawn
//! log-uniformly from 1 to 400 units and priorities low 40%, normal 40%, high 15%, critical
//! 5%; each runs 50 to 2,000 ms on one of 256 workers (workers are never what a task waits
//! for). The offered load is 1.25 times the budget, so work always waits.
//!
//! - **With the budget**: I/O has a budget of U units a second (burst U). The utilisation is
//!   the units spent over the units offered by the refill, from the first second on (the
//!   full bucket of the start would count twice otherwise). Every window of one second is
//!   checked against the bound, burst plus one second of refill (2U), and the largest one
//!   is reported beside U.
//! - **Baseline**: the same arrivals with I/O a plain capacity of U units held while a task
//!   runs (what a pool without budgets offers), for the CPU per decision. Its waits differ
//!   (it releases at completion) and are not compared.
//!
//! CPU per decision is the wall time of every core call (admit, complete, tick) over their
//! number, median of R rounds, the two runs alternating.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench budgets` simulates S = 3,600 s at U =
//! 1,000 units a second, R = 3 (override with `BUDGET_SECONDS`, `BUDGET_UNITS`, `BUDGET_ROUNDS`).
//! Under `cargo test` it simulates 60 s once as a smoke test.

#[path = "support/mod.rs"]
mod support;

use std::time::Instant;

use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
use prometheus_parking_lot::core::{Budget, PoolLimits, StarvationGuard};
use prometheus_parking_lot::{Priority, ResourceCost, ResourceKind};

const WORKERS: usize = 256;
const MOST_UNITS: f64 = 400.0;
const LOAD: f64 = 1.25;

struct Scale {
    seconds: u64,
    units: u32,
    rounds: usize,
}

impl Scale {
    fn from_args() -> Self {
        if support::measured() {
            Self {
                seconds: support::env_u64("BUDGET_SECONDS", 3_600),
                units: support::env_u64("BUDGET_UNITS", 1_000) as u32,
                rounds: support::env_u64("BUDGET_ROUNDS", 3) as usize,
            }
        } else {
            Self {
                seconds: 60,
                units: 1_000,
                rounds: 1,
            }
        }
    }
}

/// A small xorshift generator: the same arrivals for both runs of a round.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy)]
struct Arrival {
    at_ms: u64,
    units: u32,
    priority: Priority,
    run_ms: u64,
}

fn arrivals(scale: &Scale, seed: u64) -> Vec<Arrival> {
    let mut rng = Rng(seed | 1);
    // The mean of a log-uniform cost on [1, MOST]: (MOST - 1) / ln(MOST).
    let mean_cost = (MOST_UNITS - 1.0) / MOST_UNITS.ln();
    let per_ms = f64::from(scale.units) * LOAD / mean_cost / 1_000.0;
    let mut at = 0.0;
    let mut all = Vec::new();
    while at < (scale.seconds * 1_000) as f64 {
        at += -rng.unit().max(1e-12).ln() / per_ms;
        let units = MOST_UNITS.powf(rng.unit()).round().clamp(1.0, MOST_UNITS) as u32;
        let priority = match rng.next() % 100 {
            0..40 => Priority::Low,
            40..80 => Priority::Normal,
            80..95 => Priority::High,
            _ => Priority::Critical,
        };
        all.push(Arrival {
            at_ms: at as u64,
            units,
            priority,
            run_ms: 50 + rng.next() % 1_951,
        });
    }
    all
}

struct Outcome {
    decisions: u64,
    cpu_ns: u128,
    /// (start ms, units) of every start.
    starts: Vec<(u64, u32)>,
    /// Waits by priority, ms.
    waits: [Vec<u64>; 4],
}

fn run(scale: &Scale, arrivals: &[Arrival], budget: bool) -> Outcome {
    let mut limits = PoolLimits::new(scale.units, WORKERS)
        .with_max_queue_depth(10_000_000)
        .with_starvation(StarvationGuard::default());
    if budget {
        limits = limits.with_budget(
            ResourceKind::Io,
            Budget::new(scale.units, std::time::Duration::from_secs(1)),
        );
    }
    let mut lot = ParkingLot::new(limits).expect("valid limits");
    let mut outcome = Outcome {
        decisions: 0,
        cpu_ns: 0,
        starts: Vec::new(),
        waits: Default::default(),
    };
    // Running tasks by end time.
    let mut ends: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64)>> = Default::default();
    let started =
        |id: u64, now: u64, outcome: &mut Outcome, ends: &mut std::collections::BinaryHeap<_>| {
            let arrival = arrivals[id as usize];
            outcome.starts.push((now, arrival.units));
            outcome.waits[arrival.priority as usize].push(now - arrival.at_ms);
            ends.push(std::cmp::Reverse((now + arrival.run_ms, id)));
        };
    let horizon = scale.seconds * 1_000;
    let mut next = 0;
    loop {
        let arrival_at = arrivals.get(next).map(|a| a.at_ms);
        let end_at = ends.peek().map(|e| e.0 .0);
        let wake_at = lot.next_wakeup();
        let Some(now) = [arrival_at, end_at, wake_at].into_iter().flatten().min() else {
            break;
        };
        if now > horizon {
            break;
        }
        let clock = Instant::now();
        let mut begun = Vec::new();
        if arrival_at == Some(now) {
            let arrival = arrivals[next];
            let ticket = Ticket {
                id: next as u64,
                priority: arrival.priority,
                cost: ResourceCost::io(arrival.units),
                created_at_ms: arrival.at_ms,
                deadline_ms: None,
                tenant: 0,
                timeout_ms: None,
                also: Default::default(),
            };
            match lot.admit(ticket, now) {
                Admit::Start => begun.push(next as u64),
                Admit::StartWith(more) => {
                    begun.push(next as u64);
                    begun.extend(more);
                }
                _ => {}
            }
            next += 1;
        } else if end_at == Some(now) {
            let std::cmp::Reverse((_, id)) = ends.pop().expect("an end");
            begun.extend(lot.complete(id, now).expect("running"));
        } else {
            begun.extend(lot.tick(now).started);
        }
        outcome.cpu_ns += clock.elapsed().as_nanos();
        outcome.decisions += 1;
        for id in begun {
            started(id, now, &mut outcome, &mut ends);
        }
    }
    outcome
}

fn p99(values: &mut [u64]) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    values[(values.len() * 99 / 100).min(values.len() - 1)]
}

fn main() {
    let scale = Scale::from_args();
    let mut utilisation = Vec::new();
    let mut ns_budget = Vec::new();
    let mut ns_plain = Vec::new();
    let mut worst_window = 0u64;
    let mut waits: [Vec<u64>; 4] = Default::default();
    for round in 0..scale.rounds {
        let arrivals = arrivals(&scale, 0x9e37_79b9_7f4a_7c15 ^ round as u64);
        let (with, plain) = if round % 2 == 0 {
            let with = run(&scale, &arrivals, true);
            (with, run(&scale, &arrivals, false))
        } else {
            let plain = run(&scale, &arrivals, false);
            (run(&scale, &arrivals, true), plain)
        };
        ns_budget.push(with.cpu_ns as f64 / with.decisions as f64);
        ns_plain.push(plain.cpu_ns as f64 / plain.decisions as f64);
        // Units spent per whole second, from the first second on.
        let seconds = scale.seconds as usize;
        let mut per_second = vec![0u64; seconds + 1];
        for &(at, units) in &with.starts {
            per_second[(at / 1_000) as usize] += u64::from(units);
        }
        let spent: u64 = per_second[1..seconds].iter().sum();
        let offered = u64::from(scale.units) * (seconds as u64 - 1);
        utilisation.push(spent as f64 / offered as f64);
        // Sliding one-second windows from each start.
        let mut from = 0;
        let mut in_window = 0u64;
        for &(at, units) in &with.starts {
            in_window += u64::from(units);
            while with.starts[from].0 + 1_000 <= at {
                in_window -= u64::from(with.starts[from].1);
                from += 1;
            }
            worst_window = worst_window.max(in_window);
        }
        for (all, mut these) in waits.iter_mut().zip(with.waits) {
            all.append(&mut these);
        }
    }
    let bound = 2 * u64::from(scale.units);
    println!(
        "budget {} units/s (burst {}), {} s simulated, load {LOAD}x, {} rounds",
        scale.units, scale.units, scale.seconds, scale.rounds
    );
    println!(
        "  utilisation (spent / refilled, from second 1): median {:.2}% (target at least 98%)",
        support::median(&utilisation) * 100.0
    );
    println!(
        "  busiest 1 s window: {worst_window} units (budget {} a second; the bound, burst + refill, {bound}): {}",
        scale.units,
        if worst_window <= bound { "within the bound" } else { "OVER THE BOUND" }
    );
    for (priority, waits) in Priority::ALL.iter().zip(waits.iter_mut()) {
        println!("  p99 wait {priority:?}: {} ms", p99(waits));
    }
    let (with, plain) = (support::median(&ns_budget), support::median(&ns_plain));
    println!(
        "  CPU per decision: with the budget {with:.0} ns, plain capacity {plain:.0} ns ({:.2}x)",
        with / plain
    );
    assert!(worst_window <= bound, "a window spent more than the bound");
}
