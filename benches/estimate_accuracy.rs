//! How right the core's estimate of a parked task's start is (rule 20), on the packing
//! study's workload (`packing_study.rs`: a 24 GB card, 8 workers, 1 to 20 GB tasks of four
//! priorities, run times with a heavy tail, timeouts 1.1 to 3 times the run time), driving
//! the real core on a virtual clock, so a run gives the same figures on every machine.
//!
//! Every task that parks is asked, the moment it parks, when it will start
//! (`ParkingLot::estimate_start`): the estimate a caller would get from `waiting`, and the
//! one `refuse_if_late` compares with a deadline. When it really starts, the error is
//! `|estimated - actual| / wait`, its wait being actual start less arrival. The tables give
//! the median and the 90th percentile of that error per priority, and how many tasks parked
//! and how many got no estimate, the median signed error (positive: the estimate came
//! late, the task started earlier than said); then the error of the tasks no later arrival
//! of a higher priority overtook (what is left is the error of the run times and of the
//! model).
//!
//! Three runs: the default pool (starvation guard and backfill) at the packing study's
//! overload (1.2 times the card's capacity, so the queue only grows) and below saturation
//! (0.9), and at 0.9 with backfill off. Under overload every task that arrives later with a
//! higher priority goes first, which no estimate taken at parking can know.
//!
//! Then what an estimate costs, in wall time, with 1,000 to 100,000 tasks parked.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench estimate_accuracy` runs 20,000
//! tasks per run (`ESTIMATE_TASKS` to change it); under `cargo test`, 1,000 as a smoke test.

#[path = "support/mod.rs"]
mod support;

#[path = "support/packing_workload.rs"]
mod packing_workload;

use std::collections::{BTreeSet, HashMap};

use packing_workload::{workload, Task};
use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
use prometheus_parking_lot::core::{PoolLimits, StarvationGuard};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::{Priority, ResourceCost};

const CARD_GB: u32 = 24;
const WORKERS: usize = 8;
const SEED: u64 = 0x5EED_2026;
const PRIORITIES: [Priority; 4] = [
    Priority::Critical,
    Priority::High,
    Priority::Normal,
    Priority::Low,
];

/// One run's setting.
struct Scenario {
    name: &'static str,
    load: f64,
    backfill: bool,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "overload 1.2, backfill",
        load: 1.2,
        backfill: true,
    },
    Scenario {
        name: "load 0.9, backfill",
        load: 0.9,
        backfill: true,
    },
    Scenario {
        name: "load 0.9, drain (no backfill)",
        load: 0.9,
        backfill: false,
    },
];

/// What a parked task was told and what happened.
struct Parked {
    priority: Priority,
    arrived_ms: u64,
    estimated_ms: Option<u64>,
    /// Whether a task of a higher priority arrived while it waited (and so went first,
    /// which no estimate taken at parking can foresee).
    overtaken: bool,
}

/// Runs the workload through the core; returns, per parked task, its estimate and its real
/// start.
fn run(tasks: &[Task], backfill: bool) -> Vec<(Parked, u64)> {
    let limits = PoolLimits::new(CARD_GB, WORKERS)
        .with_max_queue_depth(usize::MAX)
        .with_starvation(StarvationGuard::default())
        .with_backfill(backfill);
    let mut lot = ParkingLot::new(limits).expect("valid limits");
    let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|task| (task.id, task)).collect();
    let mut parked: HashMap<TaskId, Parked> = HashMap::new();
    let mut measured = Vec::new();
    let mut ends: BTreeSet<(u64, TaskId)> = BTreeSet::new();
    let mut next_arrival = 0;
    let mut now = 0;
    loop {
        let arrival = tasks.get(next_arrival).map(|task| task.arrives_ms);
        let end = ends.first().map(|&(at, _)| at);
        let wake = lot.next_wakeup().map(|at| at.max(now));
        let Some(at) = [arrival, end, wake].into_iter().flatten().min() else {
            break;
        };
        now = at;
        let mut started = Vec::new();
        while let Some(&(at, id)) = ends.first() {
            if at > now {
                break;
            }
            ends.pop_first();
            started.extend(lot.complete(id, now).expect("a running task completes"));
        }
        while let Some(task) = tasks.get(next_arrival).filter(|t| t.arrives_ms <= now) {
            next_arrival += 1;
            for waiting in parked.values_mut() {
                waiting.overtaken |= waiting.priority < task.priority;
            }
            let ticket = Ticket {
                id: task.id,
                priority: task.priority,
                cost: ResourceCost::gpu_vram(task.gb),
                created_at_ms: task.arrives_ms,
                deadline_ms: None,
                tenant: 0,
                timeout_ms: Some(task.timeout_ms),
                also: Default::default(),
            };
            match lot.admit(ticket, now).split_started() {
                (Admit::Start, also) => {
                    started.push(task.id);
                    started.extend(also);
                }
                (Admit::Park, _) => {
                    let estimate = lot.estimate_start(task.id, now).expect("parked");
                    parked.insert(
                        task.id,
                        Parked {
                            priority: task.priority,
                            arrived_ms: task.arrives_ms,
                            estimated_ms: estimate.start_ms,
                            overtaken: false,
                        },
                    );
                }
                (other, _) => panic!("task {} answered {other:?}", task.id),
            }
        }
        started.extend(lot.tick(now).started);
        for id in started {
            ends.insert((now + by_id[&id].runs_ms, id));
            if let Some(waited) = parked.remove(&id) {
                measured.push((waited, now));
            }
        }
    }
    assert!(parked.is_empty(), "every task starts");
    measured
}

/// The `q` quantile of `values` (nearest rank); 0 for none.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn report(scenario: &Scenario, measured: &[(Parked, u64)]) {
    println!("\n### {}\n", scenario.name);
    println!("| priority | parked | no estimate | median error | p90 error | median bias | median wait (s) | not overtaken | their median error | their p90 error |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let groups = PRIORITIES
        .iter()
        .map(|&priority| (format!("{priority:?}"), Some(priority)))
        .chain([("all".to_owned(), None)]);
    for (name, priority) in groups {
        let of_priority: Vec<&(Parked, u64)> = measured
            .iter()
            .filter(|(parked, _)| priority.is_none_or(|p| parked.priority == p))
            .collect();
        let unknown = of_priority
            .iter()
            .filter(|(parked, _)| parked.estimated_ms.is_none())
            .count();
        let error = |(parked, started): &&(Parked, u64)| {
            let estimated = parked.estimated_ms?;
            let wait = started.checked_sub(parked.arrived_ms).filter(|&w| w > 0)?;
            Some(estimated.abs_diff(*started) as f64 / wait as f64)
        };
        let mut errors: Vec<f64> = of_priority.iter().filter_map(error).collect();
        // Signed: above 0 when estimates come late (the task started earlier than said).
        let mut biases: Vec<f64> = of_priority
            .iter()
            .filter_map(|(parked, started)| {
                let estimated = parked.estimated_ms? as f64;
                let wait = started.checked_sub(parked.arrived_ms).filter(|&w| w > 0)?;
                Some((estimated - *started as f64) / wait as f64)
            })
            .collect();
        let alone: Vec<&(Parked, u64)> = of_priority
            .iter()
            .copied()
            .filter(|(parked, _)| !parked.overtaken)
            .collect();
        let mut alone_errors: Vec<f64> = alone.iter().filter_map(error).collect();
        let mut waits: Vec<f64> = of_priority
            .iter()
            .map(|(parked, started)| (started - parked.arrived_ms) as f64 / 1_000.0)
            .collect();
        println!(
            "| {name} | {} | {unknown} | {:.0}% | {:.0}% | {:+.0}% | {:.1} | {} | {:.0}% | {:.0}% |",
            of_priority.len(),
            100.0 * quantile(&mut errors, 0.5),
            100.0 * quantile(&mut errors, 0.9),
            100.0 * quantile(&mut biases, 0.5),
            quantile(&mut waits, 0.5),
            alone.len(),
            100.0 * quantile(&mut alone_errors, 0.5),
            100.0 * quantile(&mut alone_errors, 0.9),
        );
    }
}

/// What an estimate costs with `parked` tasks parked behind 8 running ones, in ms, the
/// median of 5: `estimate_all`; `estimate_many` of the first page of 50 (what `inspect`
/// pays); `estimate_admission` of a low-priority newcomer; and `misses_deadline` of the same
/// with a deadline 5 s away (what `refuse_if_late` pays for a submission that parks).
fn cost(parked: usize) -> [f64; 4] {
    let limits = PoolLimits::new(CARD_GB, WORKERS).with_max_queue_depth(usize::MAX);
    let mut lot = ParkingLot::new(limits).expect("valid limits");
    let tasks = workload(parked + WORKERS, SEED, CARD_GB, 1.2);
    for task in &tasks {
        let ticket = Ticket {
            id: task.id,
            priority: task.priority,
            cost: ResourceCost::gpu_vram(task.gb),
            created_at_ms: 0,
            deadline_ms: None,
            tenant: 0,
            timeout_ms: Some(task.timeout_ms),
            also: Default::default(),
        };
        lot.admit(ticket, 0);
    }
    let newcomer = Ticket {
        id: u64::MAX,
        priority: Priority::Low,
        cost: ResourceCost::gpu_vram(20),
        created_at_ms: 1,
        deadline_ms: None,
        tenant: 0,
        timeout_ms: Some(10_000),
        also: Default::default(),
    };
    let time = |run: &dyn Fn()| {
        let rounds: Vec<f64> = (0..5)
            .map(|_| {
                let started = std::time::Instant::now();
                run();
                started.elapsed().as_secs_f64() * 1_000.0
            })
            .collect();
        support::median(&rounds)
    };
    let (page, _) = lot.parked_page(0, 50);
    [
        time(&|| {
            std::hint::black_box(lot.estimate_all(1));
        }),
        time(&|| {
            std::hint::black_box(lot.estimate_many(&page, 1));
        }),
        time(&|| {
            std::hint::black_box(lot.estimate_admission(&newcomer, 1));
        }),
        time(&|| {
            std::hint::black_box(lot.misses_deadline(&newcomer, 5_001, 1));
        }),
    ]
}

fn main() {
    let tasks = if support::measured() {
        support::env_u64("ESTIMATE_TASKS", 20_000) as usize
    } else {
        1_000
    };
    println!(
        "## The start estimate's error, |estimated - actual| / wait, taken as each task parks\n"
    );
    println!(
        "{tasks} tasks per run, the packing study's workload (seed {SEED:#x}), a {CARD_GB} GB \
         card with {WORKERS} workers, the default starvation guard (30 s or 256 skips)."
    );
    for scenario in &SCENARIOS {
        let workload = workload(tasks, SEED, CARD_GB, scenario.load);
        let measured = run(&workload, scenario.backfill);
        report(scenario, &measured);
    }
    println!("\n### What an estimate costs (wall time, median of 5)\n");
    println!("| parked | estimate_all | estimate_many, first 50 (inspect) | estimate_admission, low priority | misses_deadline, 5 s (refuse_if_late) |");
    println!("|---|---|---|---|---|");
    let sizes: &[usize] = if support::measured() {
        &[1_000, 10_000, 100_000]
    } else {
        &[1_000]
    };
    for &parked in sizes {
        let [all, page, admission, deadline] = cost(parked);
        println!(
            "| {parked} | {all:.2} ms | {page:.2} ms | {admission:.2} ms | {deadline:.2} ms |"
        );
    }
}
