//! The packing study: how well three policies pack a 24 GB card under a mixed VRAM workload,
//! against an offline upper bound on utilisation, and what it costs the tasks in waiting.
//!
//! A deterministic simulation on a virtual clock (fixed seed, no wall-clock reads), driving
//! the real pure core (`ParkingLot`) for two of the policies, so it runs in about a second
//! and reproduces exactly:
//!
//! - **strict FIFO**: arrival order; a head that does not fit blocks everyone behind it;
//! - **skip-ahead, drain**: the parking lot with the default starvation guard (30 s parked
//!   or 256 skips) and backfill off: a starving task makes the pool drain for it;
//! - **skip-ahead, backfill**: the same with backfill on, every task carrying its execution
//!   timeout (an overestimate of its run time, as users give one).
//!
//! Then a second, smaller study: one tenant floods the pool while four others submit
//! steadily, with and without a fair share.
//!
//! Besides utilisation and waits, the study charges every idle GB·s to what kept the card
//! from using it (nothing waits, every slot busy, no waiting task fits, a reservation holds
//! a fitting task back, or FIFO's blocked head), to show where a policy loses to the bound.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench packing_study` prints the tables (for
//! `BENCHMARKS.md`) and writes the plots to `benches/plots/` (SVG): utilisation over time and the
//! wait distributions per priority of the three policies.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use plotters::prelude::*;
use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
use prometheus_parking_lot::core::{FairShare, PoolLimits, StarvationGuard};
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::{Priority, ResourceCost};

/// The card.
#[path = "../examples/support/strict_fifo.rs"]
mod strict_fifo;
use strict_fifo::StrictFifo;

const CARD_GB: u32 = 24;
/// Worker slots: tasks running at once at most.
const WORKERS: usize = 8;
/// Tasks in the main study.
const TASKS: usize = 20_000;
/// Offered load: arrivals carry this many times the work the card can do.
const OVERLOAD: f64 = 1.2;
const SEED: u64 = 0x5EED_2026;
/// Tasks this large or larger are "the largest tasks".
const LARGE_GB: u32 = 16;
/// The priorities, highest first, as the tables list them.
const PRIORITIES: [Priority; 4] = [
    Priority::Critical,
    Priority::High,
    Priority::Normal,
    Priority::Low,
];

/// The workload, shared with the estimate's accuracy bench.
#[path = "support/packing_workload.rs"]
mod packing_workload;
use packing_workload::{run_time_ms, Rng, Task};

/// The main workload: Poisson arrivals at `OVERLOAD` times the card's capacity.
fn workload(tasks: usize, seed: u64) -> Vec<Task> {
    packing_workload::workload(tasks, seed, CARD_GB, OVERLOAD)
}

// ---------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------

/// Anything that decides which tasks start.
trait Policy {
    fn name(&self) -> &'static str;
    /// A task arrives; returns the tasks that start now.
    fn arrive(&mut self, task: &Task, now: u64) -> Vec<TaskId>;
    /// A running task ends; returns the tasks that start now.
    fn finish(&mut self, id: TaskId, now: u64) -> Vec<TaskId>;
    /// When the policy next has timed work to do (the core's aging).
    fn wakeup(&self) -> Option<u64>;
    fn tick(&mut self, now: u64) -> Vec<TaskId>;
    /// Whether a reservation holds tasks back now (the core's starvation guard).
    fn reserving(&self) -> bool {
        false
    }
}

/// The real core, with or without timeouts on its tickets.
struct Core {
    name: &'static str,
    lot: ParkingLot,
    with_timeouts: bool,
}

impl Core {
    fn new(name: &'static str, limits: PoolLimits, with_timeouts: bool) -> Self {
        Self {
            name,
            lot: ParkingLot::new(limits).expect("valid limits"),
            with_timeouts,
        }
    }
}

impl Policy for Core {
    fn name(&self) -> &'static str {
        self.name
    }

    fn arrive(&mut self, task: &Task, now: u64) -> Vec<TaskId> {
        let ticket = Ticket {
            id: task.id,
            priority: task.priority,
            cost: ResourceCost::gpu_vram(task.gb),
            created_at_ms: task.arrives_ms,
            deadline_ms: None,
            tenant: task.tenant,
            timeout_ms: self.with_timeouts.then_some(task.timeout_ms),
            also: Default::default(),
        };
        match self.lot.admit(ticket, now).split_started() {
            (Admit::Start, mut also) => {
                also.insert(0, task.id);
                also
            }
            (Admit::Park, _) => Vec::new(),
            (other, _) => panic!("task {} answered {other:?}", task.id),
        }
    }

    fn finish(&mut self, id: TaskId, now: u64) -> Vec<TaskId> {
        self.lot
            .complete(id, now)
            .expect("a running task completes")
    }

    fn wakeup(&self) -> Option<u64> {
        self.lot.next_wakeup()
    }

    fn tick(&mut self, now: u64) -> Vec<TaskId> {
        self.lot.tick(now).started
    }

    fn reserving(&self) -> bool {
        self.lot.reservation().is_some()
    }
}

impl Policy for StrictFifo {
    fn name(&self) -> &'static str {
        "strict FIFO"
    }

    fn arrive(&mut self, task: &Task, _now: u64) -> Vec<TaskId> {
        StrictFifo::arrive(self, task.id, task.gb)
    }

    fn finish(&mut self, id: TaskId, _now: u64) -> Vec<TaskId> {
        StrictFifo::finish(self, id)
    }

    fn wakeup(&self) -> Option<u64> {
        None
    }

    fn tick(&mut self, _now: u64) -> Vec<TaskId> {
        Vec::new()
    }
}

// ---------------------------------------------------------------------------------------
// The simulation
// ---------------------------------------------------------------------------------------

/// What one policy did with the workload.
struct Run {
    name: &'static str,
    /// Start time of each task, by index.
    starts: Vec<u64>,
    /// (time, GB in use from then on), one entry per event time.
    usage: Vec<(u64, u32)>,
    /// The last task's end.
    makespan_ms: u64,
    /// Why VRAM was idle, one entry per `usage` step.
    why_idle: Vec<Idle>,
}

/// Why the card had idle VRAM during a step (what a step's idle GB are charged to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idle {
    /// Nothing is parked: every arrived task runs.
    NothingWaits,
    /// Every worker slot is busy.
    SlotsBusy,
    /// Tasks wait, but none fits the idle VRAM.
    NoneFits,
    /// A parked task fits the idle VRAM, but a reservation holds it back (and the backfill
    /// rule did not let it start).
    Reserved,
    /// A parked task fits, and no reservation holds it back (strict FIFO's blocked head).
    Blocked,
}

const IDLE_CAUSES: [(Idle, &str); 5] = [
    (Idle::NothingWaits, "nothing waits"),
    (Idle::SlotsBusy, "all 8 slots busy"),
    (Idle::NoneFits, "no waiting task fits"),
    (Idle::Reserved, "held back by a reservation"),
    (Idle::Blocked, "blocked head (FIFO)"),
];

fn simulate(policy: &mut dyn Policy, tasks: &[Task]) -> Run {
    let index: HashMap<TaskId, usize> = tasks.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
    let mut starts = vec![u64::MAX; tasks.len()];
    let mut ends: BTreeSet<(u64, TaskId)> = BTreeSet::new();
    let mut usage = vec![(0, 0)];
    let mut why_idle = vec![Idle::NothingWaits];
    // GB -> number of arrived tasks of that size not started yet.
    let mut waiting: std::collections::BTreeMap<u32, usize> = Default::default();
    let mut running = 0usize;
    let mut used = 0u32;
    let mut next_arrival = 0;
    let mut now = 0;
    loop {
        let arrival = tasks.get(next_arrival).map(|t| t.arrives_ms);
        let end = ends.first().map(|&(at, _)| at);
        let wake = policy.wakeup().map(|at| at.max(now));
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
            used -= tasks[index[&id]].gb;
            running -= 1;
            started.extend(policy.finish(id, now));
        }
        while let Some(task) = tasks.get(next_arrival).filter(|t| t.arrives_ms <= now) {
            next_arrival += 1;
            *waiting.entry(task.gb).or_default() += 1;
            started.extend(policy.arrive(task, now));
        }
        if policy.wakeup().is_some_and(|at| at <= now) {
            started.extend(policy.tick(now));
        }
        for id in started {
            let task = &tasks[index[&id]];
            assert_eq!(starts[index[&id]], u64::MAX, "task {id} started twice");
            starts[index[&id]] = now;
            used += task.gb;
            running += 1;
            assert!(used <= CARD_GB, "{} overcommitted the card", policy.name());
            ends.insert((now + task.runs_ms, id));
            let count = waiting.get_mut(&task.gb).expect("a waiting task starts");
            *count -= 1;
            if *count == 0 {
                waiting.remove(&task.gb);
            }
        }
        usage.push((now, used));
        let smallest = waiting.keys().next().copied();
        why_idle.push(match smallest {
            None => Idle::NothingWaits,
            Some(_) if running == WORKERS => Idle::SlotsBusy,
            Some(gb) if gb > CARD_GB - used => Idle::NoneFits,
            Some(_) if policy.reserving() => Idle::Reserved,
            Some(_) => Idle::Blocked,
        });
    }
    assert!(
        starts.iter().all(|&s| s != u64::MAX),
        "{}: a task never started",
        policy.name()
    );
    Run {
        name: policy.name(),
        starts,
        usage,
        makespan_ms: now,
        why_idle,
    }
}

/// GB·ms of work in the workload.
fn work(tasks: &[Task]) -> f64 {
    tasks
        .iter()
        .map(|t| f64::from(t.gb) * t.runs_ms as f64)
        .sum()
}

/// An upper bound on the utilisation any schedule could reach, even one that knew every
/// arrival and run time in advance: the work over the capacity times a lower bound on the
/// makespan. No schedule ends before (a) the card has done all the work at full use,
/// (b) the worker slots have run every task, (c) the latest arrival plus its run, and
/// (d) the tasks above half the card have run one after another (no two fit together), with
/// only what fits beside each (`paired_bound_ms`).
fn offline_bound(tasks: &[Task]) -> (f64, u64) {
    let work = work(tasks);
    let full_card = (work / f64::from(CARD_GB)).ceil() as u64;
    let slots = tasks.iter().map(|t| t.runs_ms).sum::<u64>() / WORKERS as u64;
    let last = tasks
        .iter()
        .map(|t| t.arrives_ms + t.runs_ms)
        .max()
        .unwrap_or(0);
    let paired = paired_bound_ms(tasks.iter().map(|t| (t.gb, t.runs_ms)));
    let makespan = full_card.max(slots).max(last).max(paired);
    (work / (f64::from(CARD_GB) * makespan as f64), makespan)
}

/// A lower bound on the time to run `work` (each task's GB and ms) on the card, knowing every
/// run time: the tasks above half the card run one after another, and beside one of `s` GB
/// only tasks of at most `CARD_GB - s` GB fit, in at most that room. So the smaller tasks'
/// work that can run beside the large ones is at most a flow from their sizes into that room
/// (with nested size limits, filling the tightest room first from the sizes that fit it is
/// a maximum flow), and the rest of their work needs the card without a large task.
fn paired_bound_ms(work: impl IntoIterator<Item = (u32, u64)>) -> u64 {
    let half = CARD_GB / 2;
    // GB·ms of the small tasks per size, and ms of the large tasks per size.
    let mut small = vec![0.0f64; half as usize + 1];
    let mut large_ms = vec![0u64; CARD_GB as usize + 1];
    for (gb, ms) in work {
        if gb > half {
            large_ms[gb as usize] += ms;
        } else {
            small[gb as usize] += f64::from(gb) * ms as f64;
        }
    }
    for gb in (half + 1..=CARD_GB).rev() {
        let mut room = f64::from(CARD_GB - gb) * large_ms[gb as usize] as f64;
        for size in (1..=(CARD_GB - gb).min(half)).rev() {
            let take = room.min(small[size as usize]);
            small[size as usize] -= take;
            room -= take;
        }
    }
    let unpaired: f64 = small.iter().sum();
    large_ms.iter().sum::<u64>() + (unpaired / f64::from(CARD_GB)).ceil() as u64
}

/// What is left at `at`: the tasks not started yet, how many of them are above half the card,
/// and two lower bounds on the time any schedule still needs from that state (knowing every
/// run time): the work left (the unstarted tasks' and the rest of the running ones') at full
/// use of the card, and `paired_bound_ms` of the same work. In ms.
fn backlog_at(run: &Run, tasks: &[Task], at: u64) -> (usize, usize, u64, u64) {
    let (mut waiting, mut large) = (0, 0);
    let mut left = Vec::new();
    for (task, &start) in tasks.iter().zip(&run.starts) {
        let end = start + task.runs_ms;
        if end <= at {
            continue;
        }
        left.push((task.gb, end - start.max(at)));
        if start >= at {
            waiting += 1;
            large += usize::from(2 * task.gb > CARD_GB);
        }
    }
    let work: f64 = left.iter().map(|&(gb, ms)| f64::from(gb) * ms as f64).sum();
    let full_card = (work / f64::from(CARD_GB)).ceil() as u64;
    (waiting, large, full_card, paired_bound_ms(left))
}

/// Idle VRAM over `[from, to)` charged to each cause, as shares of the card's capacity over
/// that span (they add up to one minus the utilisation).
fn idle_breakdown(run: &Run, from: u64, to: u64) -> Vec<f64> {
    let mut idle = vec![0.0; IDLE_CAUSES.len()];
    for (pair, why) in run.usage.windows(2).zip(&run.why_idle) {
        let ((start, gb), (end, _)) = (pair[0], pair[1]);
        let (start, end) = (start.max(from), end.min(to));
        if end > start {
            let cause = IDLE_CAUSES
                .iter()
                .position(|(c, _)| c == why)
                .expect("a cause");
            idle[cause] += f64::from(CARD_GB - gb) * (end - start) as f64;
        }
    }
    let capacity = f64::from(CARD_GB) * (to - from) as f64;
    idle.into_iter().map(|gb_ms| gb_ms / capacity).collect()
}

/// Mean utilisation over `[from, to)` ms.
fn utilisation_between(run: &Run, from: u64, to: u64) -> f64 {
    let mut area = 0.0;
    for pair in run.usage.windows(2) {
        let ((start, gb), (end, _)) = (pair[0], pair[1]);
        let (start, end) = (start.max(from), end.min(to));
        if end > start {
            area += f64::from(gb) * (end - start) as f64;
        }
    }
    area / (f64::from(CARD_GB) * (to - from) as f64)
}

fn utilisation(run: &Run, tasks: &[Task]) -> f64 {
    work(tasks) / (f64::from(CARD_GB) * run.makespan_ms as f64)
}

/// The `q`-quantile (nearest rank) of sorted values.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn waits_where(run: &Run, tasks: &[Task], keep: impl Fn(&Task) -> bool) -> Vec<u64> {
    let mut waits: Vec<u64> = tasks
        .iter()
        .zip(&run.starts)
        .filter(|(task, _)| keep(task))
        .map(|(task, &start)| start - task.arrives_ms)
        .collect();
    waits.sort_unstable();
    waits
}

fn seconds(ms: u64) -> String {
    format!("{:.1}", ms as f64 / 1_000.0)
}

// ---------------------------------------------------------------------------------------
// Plots
// ---------------------------------------------------------------------------------------

const COLOURS: [RGBColor; 3] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
];

/// Mean utilisation per time bin, from a run's usage steps.
fn binned_utilisation(run: &Run, bins: usize, horizon_ms: u64) -> Vec<(f64, f64)> {
    let width = (horizon_ms as f64 / bins as f64).max(1.0);
    let mut area = vec![0.0f64; bins];
    for pair in run.usage.windows(2) {
        let ((from, gb), (to, _)) = (pair[0], pair[1]);
        let (mut at, to) = (from as f64, to as f64);
        while at < to {
            let bin = ((at / width) as usize).min(bins - 1);
            let bin_end = ((bin + 1) as f64 * width).min(to).max(at + f64::EPSILON);
            let until = if bin == bins - 1 { to } else { bin_end };
            area[bin] += f64::from(gb) * (until - at);
            at = until;
        }
    }
    area.iter()
        .enumerate()
        .map(|(bin, gb_ms)| {
            let hours = (bin as f64 + 0.5) * width / 3_600_000.0;
            (hours, 100.0 * gb_ms / (f64::from(CARD_GB) * width))
        })
        .collect()
}

fn plot_utilisation(runs: &[Run], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let horizon = runs.iter().map(|r| r.makespan_ms).max().unwrap_or(1);
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Card utilisation over time (24 GB, 10-minute bins)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..horizon as f64 / 3_600_000.0, 0.0..105.0)?;
    chart
        .configure_mesh()
        .x_desc("virtual time (hours)")
        .y_desc("VRAM in use (%)")
        .draw()?;
    let bins = (horizon / 600_000).max(1) as usize;
    for (run, colour) in runs.iter().zip(COLOURS) {
        chart
            .draw_series(LineSeries::new(
                binned_utilisation(run, bins, horizon),
                colour.stroke_width(2),
            ))?
            .label(run.name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Empirical CDFs of the wait per priority, one panel per priority, log time axis.
fn plot_waits(runs: &[Run], tasks: &[Task], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(36);
    title.titled(
        "Wait before start, per priority: share of tasks that waited at most x seconds",
        ("sans-serif", 20),
    )?;
    let panels = body.split_evenly((2, 2));
    for (panel, priority) in panels.iter().zip(PRIORITIES) {
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{priority:?}"), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d((0.1f64..100_000.0).log_scale(), 0.0..100.0)?;
        chart
            .configure_mesh()
            .x_desc("wait (s, log)")
            .y_desc("tasks (%)")
            .draw()?;
        for (run, colour) in runs.iter().zip(COLOURS) {
            let waits = waits_where(run, tasks, |t| t.priority == priority);
            // 500 quantiles draw the same curve as every task would, in a small file.
            let points = (1..=500).map(|step| {
                let share = f64::from(step) / 500.0;
                let wait = quantile(&waits, share) as f64 / 1_000.0;
                (wait.max(0.1), 100.0 * share)
            });
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
                .label(run.name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The fair-share study
// ---------------------------------------------------------------------------------------

/// Tenant 1 submits a burst of 4,000 mid-sized tasks at once; tenants 2–5 submit 500 tasks
/// each, spread over the same time. All normal priority.
fn flood_workload(seed: u64) -> Vec<Task> {
    let mut rng = Rng(seed);
    let mut tasks = Vec::new();
    for _ in 0..4_000 {
        let runs_ms = run_time_ms(&mut rng);
        tasks.push((0, 1, 4 + rng.below(5) as u32, runs_ms));
    }
    let horizon = 4_000.0 * 6.0 * 3_000.0 / f64::from(CARD_GB);
    for tenant in 2..=5 {
        for _ in 0..500 {
            let at = (rng.unit() * horizon) as u64;
            let runs_ms = run_time_ms(&mut rng);
            tasks.push((at, tenant, 1 + rng.below(6) as u32, runs_ms));
        }
    }
    tasks.sort_by_key(|&(at, tenant, ..)| (at, tenant));
    tasks
        .into_iter()
        .enumerate()
        .map(|(index, (arrives_ms, tenant, gb, runs_ms))| Task {
            id: index as TaskId + 1,
            arrives_ms,
            gb,
            priority: Priority::Normal,
            runs_ms,
            timeout_ms: runs_ms,
            tenant,
        })
        .collect()
}

fn flood_study() {
    let tasks = flood_workload(SEED ^ 0xF100D);
    let base = PoolLimits::new(CARD_GB, WORKERS).with_max_queue_depth(usize::MAX);
    let mut policies = [
        Core::new("no fair share", base, false),
        Core::new(
            "fair order only (cap = the card)",
            base.with_fair_share(Some(FairShare::MaxUnitsPerTenant(CARD_GB))),
            false,
        ),
        Core::new(
            "fair share, 12 GB per tenant",
            base.with_fair_share(Some(FairShare::MaxUnitsPerTenant(12))),
            false,
        ),
    ];
    println!("\n## One tenant floods (4,000 tasks at t = 0), four others submit 500 each\n");
    println!("| policy | utilisation | flooder max wait (s) | others p50 wait (s) | others p99 wait (s) | others max wait (s) |");
    println!("|---|---|---|---|---|---|");
    for policy in &mut policies {
        let run = simulate(policy, &tasks);
        let flooder = waits_where(&run, &tasks, |t| t.tenant == 1);
        let others = waits_where(&run, &tasks, |t| t.tenant != 1);
        println!(
            "| {} | {:.1}% | {} | {} | {} | {} |",
            run.name,
            100.0 * utilisation(&run, &tasks),
            seconds(quantile(&flooder, 1.0)),
            seconds(quantile(&others, 0.5)),
            seconds(quantile(&others, 0.99)),
            seconds(quantile(&others, 1.0)),
        );
    }
}

// ---------------------------------------------------------------------------------------

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tasks = workload(TASKS, SEED);
    let drain = PoolLimits::new(CARD_GB, WORKERS)
        .with_max_queue_depth(usize::MAX)
        .with_starvation(StarvationGuard::default())
        .with_backfill(false);
    let mut fifo = StrictFifo::new(CARD_GB, WORKERS);
    let mut skip_drain = Core::new("skip-ahead, drain", drain, false);
    let mut skip_backfill = Core::new("skip-ahead, backfill", drain.with_backfill(true), true);
    let runs = [
        simulate(&mut fifo, &tasks),
        simulate(&mut skip_drain, &tasks),
        simulate(&mut skip_backfill, &tasks),
    ];
    let (bound, shortest_ms) = offline_bound(&tasks);
    println!(
        "# Packing study: {TASKS} tasks, 1–20 GB on a {CARD_GB} GB card, {WORKERS} workers, \
         arrivals at {OVERLOAD}x capacity, Pareto(1.5) run times, seed {SEED:#x}\n"
    );
    println!(
        "Offline upper bound on utilisation: {:.1}% (no schedule ends before {} s).\n",
        100.0 * bound,
        seconds(shortest_ms)
    );
    let last_arrival = tasks.last().map_or(0, |t| t.arrives_ms);
    println!("| policy | utilisation | of the bound | while arrivals last | after the last arrival | throughput (tasks/s) | makespan (s) | largest (>= {LARGE_GB} GB) p99 wait (s) | largest max wait (s) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for run in &runs {
        let util = utilisation(run, &tasks);
        let large = waits_where(run, &tasks, |t| t.gb >= LARGE_GB);
        println!(
            "| {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.3} | {} | {} | {} |",
            run.name,
            100.0 * util,
            100.0 * util / bound,
            100.0 * utilisation_between(run, 0, last_arrival),
            100.0 * utilisation_between(run, last_arrival, run.makespan_ms),
            TASKS as f64 / (run.makespan_ms as f64 / 1_000.0),
            seconds(run.makespan_ms),
            seconds(quantile(&large, 0.99)),
            seconds(quantile(&large, 1.0)),
        );
    }
    println!(
        "\nWhere the idle VRAM goes: idle GB·s charged to what held the card back, as % of \
         the card's capacity over the span (whole run / while arrivals last / after):\n"
    );
    let causes: Vec<&str> = IDLE_CAUSES.iter().map(|(_, name)| *name).collect();
    println!("| policy | {} |", causes.join(" | "));
    println!("|---|{}", "---|".repeat(causes.len()));
    for run in &runs {
        let spans = [
            idle_breakdown(run, 0, run.makespan_ms),
            idle_breakdown(run, 0, last_arrival),
            idle_breakdown(run, last_arrival, run.makespan_ms),
        ];
        let cells: Vec<String> = (0..causes.len())
            .map(|cause| {
                let shares: Vec<String> = spans
                    .iter()
                    .map(|span| format!("{:.1}", 100.0 * span[cause]))
                    .collect();
                shares.join(" / ")
            })
            .collect();
        println!("| {} | {} |", run.name, cells.join(" | "));
    }
    println!(
        "\nWhat is left at the last arrival, and the tail it takes against the shortest tail \
         any schedule could reach from there (the work left at full use; the tasks above half \
         the card one after another), seconds:\n"
    );
    println!("| policy | tasks waiting | of them above 12 GB | tail | work left at full use | with what fits beside the large ones | tail over its bound |");
    println!("|---|---|---|---|---|---|---|");
    for run in &runs {
        let (waiting, large, full_card, paired) = backlog_at(run, &tasks, last_arrival);
        let tail = run.makespan_ms - last_arrival;
        println!(
            "| {} | {waiting} | {large} | {} | {} | {} | {:.2} |",
            run.name,
            seconds(tail),
            seconds(full_card),
            seconds(paired),
            tail as f64 / full_card.max(paired) as f64,
        );
    }
    println!("\nThe largest tasks' maximum wait per priority, seconds:\n");
    println!("| policy | critical | high | normal | low |");
    println!("|---|---|---|---|---|");
    for run in &runs {
        let cells: Vec<String> = PRIORITIES
            .into_iter()
            .map(|priority| {
                let waits =
                    waits_where(run, &tasks, |t| t.gb >= LARGE_GB && t.priority == priority);
                seconds(quantile(&waits, 1.0))
            })
            .collect();
        println!("| {} | {} |", run.name, cells.join(" | "));
    }
    println!("\nWait before start per priority, seconds (p50 / p99 / max):\n");
    println!("| policy | critical | high | normal | low |");
    println!("|---|---|---|---|---|");
    for run in &runs {
        let cells: Vec<String> = PRIORITIES
            .into_iter()
            .map(|priority| {
                let waits = waits_where(run, &tasks, |t| t.priority == priority);
                format!(
                    "{} / {} / {}",
                    seconds(quantile(&waits, 0.5)),
                    seconds(quantile(&waits, 0.99)),
                    seconds(quantile(&waits, 1.0))
                )
            })
            .collect();
        println!("| {} | {} |", run.name, cells.join(" | "));
    }
    flood_study();
    let plots = Path::new(env!("CARGO_MANIFEST_DIR")).join("plots");
    std::fs::create_dir_all(&plots)?;
    plot_utilisation(&runs, &plots.join("packing_utilisation.svg"))?;
    plot_waits(&runs, &tasks, &plots.join("packing_waits.svg"))?;
    println!("\nPlots: benches/plots/packing_utilisation.svg, benches/plots/packing_waits.svg");
    Ok(())
}
