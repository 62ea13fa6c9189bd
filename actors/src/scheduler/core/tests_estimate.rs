//! Rule 23: the run times the lot learns, and its estimates of when parked tickets start,
//! against what the lot then does when every run takes exactly its expected time and
//! nothing else arrives.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::tests::{lot, lot_with, normal};
use super::*;
use crate::domain::{Budget, StarvationGuard};

fn with_timeout(mut ticket: Ticket, timeout_ms: u64) -> Ticket {
    ticket.timeout_ms = Some(timeout_ms);
    ticket
}

#[test]
fn run_times_are_learnt_per_class_and_capped_by_the_timeout() {
    let mut lot = lot();
    let small = ResourceCost::gpu_vram(2);
    assert_eq!(
        lot.expected_run_ms(small, None, false),
        None,
        "nothing seen"
    );
    assert_eq!(lot.expected_run_ms(small, Some(700), false), Some(700));
    lot.admit(normal(1, 2), 1_000);
    lot.complete(1, 1_400).unwrap();
    lot.admit(normal(2, 3), 2_000);
    lot.complete(2, 2_600).unwrap();
    assert_eq!(
        lot.expected_run_ms(small, None, false),
        Some(500),
        "2 and 3 units share a class: the mean of 400 and 600"
    );
    assert_eq!(lot.expected_run_ms(small, Some(450), false), Some(450));
    assert_eq!(
        lot.expected_run_ms(ResourceCost::gpu_vram(8), None, false),
        Some(500),
        "an unseen class takes its kind's mean"
    );
    assert_eq!(
        lot.expected_run_ms(ResourceCost::cpu(2), Some(9_000), false),
        Some(9_000),
        "another kind learns nothing from it"
    );
    assert_eq!(
        lot.expected_run_ms(small, None, true),
        None,
        "nor do permits"
    );
}

#[test]
fn a_timeout_is_scaled_by_the_share_of_it_the_class_uses() {
    let mut lot = lot();
    // Runs of 2-3 units use half their timeout.
    for (id, timeout, ran) in [(1, 10_000, 5_000), (2, 4_000, 2_000)] {
        lot.admit(with_timeout(normal(id, 2), timeout), 0);
        lot.complete(id, ran).unwrap();
    }
    let small = ResourceCost::gpu_vram(3);
    assert_eq!(lot.expected_run_ms(small, Some(8_000), false), Some(4_000));
    assert_eq!(
        lot.expected_run_ms(small, None, false),
        Some(3_500),
        "without a timeout, the mean run time"
    );
    assert_eq!(
        lot.expected_run_ms(ResourceCost::gpu_vram(9), Some(1_000), false),
        Some(500),
        "another size takes its kind's share"
    );
}

#[test]
fn a_class_mean_forgets_old_runs() {
    let mut lot = lot();
    for id in 0..16 {
        lot.admit(normal(id, 1), id * 10_000);
        lot.complete(id, id * 10_000 + 1_000).unwrap();
    }
    for id in 16..80 {
        lot.admit(normal(id, 1), id * 10_000);
        lot.complete(id, id * 10_000 + 5_000).unwrap();
    }
    let expected = lot
        .expected_run_ms(ResourceCost::gpu_vram(1), None, false)
        .unwrap();
    assert!(
        (4_900..=5_000).contains(&expected),
        "64 runs of 5 s after 16 of 1 s: {expected} ms"
    );
}

#[test]
fn position_counts_the_parked_tickets_of_its_kind_ahead() {
    let mut lot = lot();
    lot.admit(normal(1, 10), 0);
    let mut cpu_runs = with_timeout(normal(1_000, 0), 1_000);
    cpu_runs.cost = ResourceCost::cpu(10);
    lot.admit(cpu_runs, 0);
    lot.admit(normal(2, 4), 0);
    let mut cpu = normal(3, 20);
    cpu.cost = ResourceCost::cpu(5);
    lot.admit(cpu, 0);
    lot.admit(ticket_of(4, Priority::High, 6), 0);
    lot.admit(normal(5, 1), 0);
    let position = |id| lot.estimate_start(id, 0).unwrap().position;
    assert_eq!(position(4), 1, "high priority ranks first");
    assert_eq!(position(2), 2);
    assert_eq!(position(5), 3);
    assert_eq!(position(3), 1, "no cpu ticket parked ahead");
    assert_eq!(lot.estimate_start(1, 0), None, "running");
    assert_eq!(lot.estimate_start(99, 0), None, "unknown");
}

fn ticket_of(id: TaskId, priority: Priority, units: u32) -> Ticket {
    super::tests::ticket(id, priority, units)
}

#[test]
fn nothing_is_estimated_while_paused_or_behind_a_run_of_unknown_length() {
    let mut lot = lot();
    lot.admit(normal(1, 8), 0); // no timeout, nothing seen: its end is unknown
    lot.admit(with_timeout(normal(2, 6), 1_000), 0);
    lot.admit(with_timeout(normal(3, 2), 1_000), 0); // runs
    assert_eq!(lot.estimate_start(2, 0).unwrap().start_ms, None);
    let newcomer = with_timeout(normal(4, 2), 1_000);
    assert_eq!(
        lot.estimate_admission(&newcomer, 0).start_ms,
        Some(1_000),
        "2 units come back when task 3 ends"
    );
    lot.pause();
    assert_eq!(lot.estimate_admission(&newcomer, 0).start_ms, None);
}

#[test]
fn a_newcomer_the_lot_would_refuse_has_no_estimate() {
    let mut lot = lot_with(
        PoolLimits::new(10, 8)
            .with_max_queue_depth(1)
            .with_starvation(StarvationGuard::disabled()),
    );
    lot.admit(with_timeout(normal(1, 10), 1_000), 0);
    lot.admit(with_timeout(normal(2, 10), 1_000), 0);
    let third = with_timeout(normal(3, 10), 1_000);
    assert_eq!(
        lot.estimate_admission(&third, 0).start_ms,
        None,
        "the queue is full"
    );
    assert_eq!(
        lot.misses_deadline(&third, 500, 0),
        None,
        "admission refuses it as QueueFull, not as late"
    );
    assert_eq!(
        lot.admit(third, 0),
        Admit::Reject(Rejection::QueueFull { max_queue_depth: 1 })
    );
}

#[test]
fn a_late_run_is_expected_to_end_now() {
    let mut lot = lot();
    lot.admit(with_timeout(normal(1, 8), 1_000), 0);
    lot.admit(with_timeout(normal(2, 8), 5_000), 0);
    // Task 1's timeout passed (the watchdog has not ended it yet).
    assert_eq!(lot.estimate_start(2, 3_000).unwrap().start_ms, Some(3_000));
}

#[test]
fn a_run_that_has_gone_on_is_expected_to_run_as_long_as_the_runs_that_went_as_far() {
    let mut lot = lot();
    // Runs of 8 units: the first sets the class's mean (4 s); the next ran half and one and
    // a half times what was expected of them (2 s of 4 s, 4.5 s of 3 s). The mean: 3.5 s.
    for (id, from, to) in [(1, 0, 4_000), (2, 4_000, 6_000), (3, 6_000, 10_500)] {
        lot.admit(normal(id, 8), from);
        lot.complete(id, to).unwrap();
    }
    lot.admit(normal(4, 8), 20_000);
    lot.admit(normal(5, 8), 20_000);
    assert_eq!(
        lot.estimate_start(5, 20_000).unwrap().start_ms,
        Some(23_500),
        "a run that just started: its expected run time"
    );
    assert_eq!(
        lot.estimate_start(5, 23_000).unwrap().start_ms,
        Some(25_250),
        "at 6 tenths of its expected run time it is one of the long runs: 1.5 times it"
    );
    assert_eq!(
        lot.estimate_start(5, 26_000).unwrap().start_ms,
        Some(32_000),
        "past every run seen: late, it runs as long again as it has"
    );
}

#[test]
fn the_first_of_several_uncertain_ends_is_expected_before_the_first_of_their_means() {
    let mut lot = lot();
    // Runs of 5 units ran half and one and a half times what was expected of them.
    for (id, from, to) in [(1, 0, 4_000), (2, 4_000, 6_000), (3, 6_000, 10_500)] {
        lot.admit(normal(id, 5), from);
        lot.complete(id, to).unwrap();
    }
    // Two run, each expected to end at 23,500: at 21,750 or 25,250, even chances.
    lot.admit(normal(4, 5), 20_000);
    lot.admit(normal(5, 5), 20_000);
    lot.admit(normal(6, 5), 20_000);
    // The first of the two ends is expected 1,750 + 3,500 / 4 ms on.
    assert_eq!(
        lot.estimate_start(6, 20_000).unwrap().start_ms,
        Some(22_625)
    );
}

#[test]
fn the_expected_order_of_ends_is_that_of_their_order_statistics() {
    use super::running_ends::expected_order;
    let certain = vec![(3_000, 1, 1.0), (2_000, 0, 1.0), (2_000, 2, 1.0)];
    assert_eq!(
        expected_order(certain, 3, 1_000),
        vec![2_000, 2_000, 3_000],
        "ends without a spread come at their instants"
    );
    // Each at 21,750 or 25,250, even chances: the first end is expected after
    // 1,750 + 3,500 / 4 ms and the second after 1,750 + 3,500 * 3 / 4.
    let even = |claim| [(21_750, claim, 0.5), (25_250, claim, 0.5)];
    let order = expected_order([even(0), even(1)].concat(), 2, 20_000);
    assert_eq!(order, vec![22_625, 24_375]);
    let one = expected_order(even(0).to_vec(), 1, 20_000);
    assert_eq!(one, vec![23_500], "one claim ends at its mean");
}

#[test]
fn the_reservation_is_waited_for_and_ageing_is_foreseen() {
    let limits = PoolLimits::new(10, 8)
        .with_max_queue_depth(100)
        .with_backfill(false)
        .with_starvation(StarvationGuard {
            max_park_ms: Some(1_500),
            max_skips: None,
        });
    let mut lot = lot_with(limits);
    let run = |id, units, ms| with_timeout(normal(id, units), ms);
    lot.admit(run(1, 6, 2_000), 0); // runs to 2,000
    lot.admit(run(2, 4, 1_000), 0); // runs to 1,000
    lot.admit(run(3, 10, 1_000), 0); // parks; starving at 1,500
    lot.admit(run(4, 4, 3_000), 0); // parks
                                    // At 1,000 task 4 takes the 4 units task 2 gives back (skip-ahead) and runs to 4,000;
                                    // task 3 ages at 1,500 and waits for all 10 units: 4,000.
    assert_eq!(lot.estimate_start(4, 0).unwrap().start_ms, Some(1_000));
    assert_eq!(lot.estimate_start(3, 0).unwrap().start_ms, Some(4_000));
    // At 1,600 task 3 is reserved and task 2 is late (expected to end now): its units go
    // to nobody, since task 4 ranks below the reservation. Task 1 ends at 2,000, task 3
    // runs to 3,000, then task 4 and a 4-unit newcomer start together.
    lot.tick(1_600);
    assert_eq!(lot.reservation(), Some(3));
    let newcomer = run(5, 4, 100);
    assert_eq!(lot.estimate_start(3, 1_600).unwrap().start_ms, Some(2_000));
    assert_eq!(
        lot.estimate_admission(&newcomer, 1_600).start_ms,
        Some(3_000)
    );
}

#[test]
fn budgets_are_waited_for_by_their_refills() {
    // 10 io units a second, burst 10.
    let limits = PoolLimits::new(10, 8)
        .with_max_queue_depth(100)
        .with_budget(
            ResourceKind::Io,
            Budget::new(10, std::time::Duration::from_secs(1)),
        );
    let mut lot = lot_with(limits);
    let io = |id, units| {
        let mut ticket = with_timeout(normal(id, units), 100);
        ticket.cost = ResourceCost::new(ResourceKind::Io, units);
        ticket
    };
    assert_eq!(lot.admit(io(1, 10), 0), Admit::Start);
    assert_eq!(lot.admit(io(2, 5), 0), Admit::Park);
    assert_eq!(lot.admit(io(3, 5), 0), Admit::Park);
    assert_eq!(lot.estimate_start(2, 0).unwrap().start_ms, Some(500));
    assert_eq!(lot.estimate_start(3, 0).unwrap().start_ms, Some(1_000));
    assert_eq!(lot.next_wakeup(), Some(500));
    lot.complete(1, 100).unwrap();
    assert_eq!(lot.tick(500).started, vec![2]);
    assert_eq!(lot.tick(1_000).started, vec![3]);
}

#[test]
fn sleepers_are_estimated_from_their_wake_up() {
    let mut lot = lot();
    lot.admit(with_timeout(normal(1, 8), 2_000), 0);
    lot.park_until(with_timeout(normal(2, 6), 100), 500, 0)
        .unwrap();
    assert_eq!(lot.estimate_start(2, 0).unwrap().start_ms, Some(2_000));
    lot.admit(with_timeout(normal(3, 9), 100), 0);
    let all: BTreeMap<TaskId, StartEstimate> = lot.estimate_all(0).into_iter().collect();
    // Task 3 waits for task 1's units and task 2, awake at 500 and ranked ahead, first.
    assert_eq!(all[&2].start_ms, Some(2_000));
    assert_eq!(all[&3].start_ms, Some(2_100));
}

/// A random schedule for the exactness property.
#[derive(Debug, Clone)]
struct Workload {
    workers: usize,
    max_park_ms: Option<u64>,
    max_skips: Option<u32>,
    backfill: bool,
    /// A fair share (its order: the cap is the whole capacity) among three tenants.
    fair: bool,
    /// The deadline order (rule 20), every ticket with a deadline far past every start.
    by_deadline: bool,
    /// (priority, gpu units or cpu units when `cpu`, cpu) admitted at the first instant.
    first: Vec<(usize, u32, bool)>,
    /// The same, admitted `gap_ms` later, when the estimates are taken.
    second: Vec<(usize, u32, bool)>,
    gap_ms: u64,
}

fn workload() -> impl Strategy<Value = Workload> {
    let task = (0..4usize, 1..=16u32, prop::bool::weighted(0.3));
    (
        (
            1..5usize,
            proptest::option::of(100..3_000u64),
            proptest::option::of(1..6u32),
        ),
        (any::<bool>(), any::<bool>(), any::<bool>()),
        prop::collection::vec(task.clone(), 0..12),
        prop::collection::vec(task, 1..25),
        0..2_000u64,
    )
        .prop_map(
            |(
                (workers, max_park_ms, max_skips),
                (backfill, fair, by_deadline),
                first,
                second,
                gap_ms,
            )| {
                Workload {
                    workers,
                    max_park_ms,
                    max_skips,
                    backfill,
                    fair,
                    by_deadline,
                    first,
                    second,
                    gap_ms,
                }
            },
        )
}

/// The run time of every ticket of a class: distinct per class and kind.
fn run_ms(cost: ResourceCost) -> u64 {
    100 * (estimate_class(cost.units) as u64 + 1) + 37 * cost.kind.index() as u64
}

fn estimate_class(units: u32) -> u32 {
    u32::BITS - units.leading_zeros()
}

fn cost_of(units: u32, cpu: bool) -> ResourceCost {
    if cpu {
        ResourceCost::cpu(units.min(8))
    } else {
        ResourceCost::gpu_vram(units)
    }
}

/// Drives `lot` until nothing runs or waits: every claim ends at its start plus its run
/// time, claims ending at one instant in the order of their ids, and `tick` runs at each
/// wake-up. Returns each ticket's start.
fn drive(
    lot: &mut ParkingLot,
    running: &mut BTreeSet<(u64, TaskId)>,
    costs: &BTreeMap<TaskId, ResourceCost>,
    from: u64,
    until: Option<u64>,
) -> BTreeMap<TaskId, u64> {
    let mut starts = BTreeMap::new();
    let mut now = from;
    loop {
        let end = running.first().map(|&(at, _)| at);
        let Some(at) = [end, lot.next_wakeup().map(|at| at.max(now))]
            .into_iter()
            .flatten()
            .min()
        else {
            return starts;
        };
        if until.is_some_and(|until| at > until) {
            return starts;
        }
        now = at;
        let mut started = Vec::new();
        while let Some(&(at, id)) = running.first() {
            if at > now {
                break;
            }
            running.pop_first();
            started.extend(lot.complete(id, now).unwrap());
        }
        started.extend(lot.tick(now).started);
        for id in started {
            starts.insert(id, now);
            running.insert((now + run_ms(costs[&id]), id));
        }
        lot.check_invariants().unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With every run taking its class's learnt time and nothing arriving after the
    /// estimates, every ticket starts exactly when estimated: the simulation follows the
    /// rules the lot follows (skip-ahead, worker slots, the reservation, ageing and skips,
    /// backfill on timeouts twice the run times, the fair order).
    #[test]
    fn estimates_are_exact_when_run_times_are(work in workload()) {
        let limits = PoolLimits::new(16, work.workers)
            .with_capacity(crate::domain::Capacity::uniform(8).with(ResourceKind::GpuVram, 16))
            .with_max_queue_depth(1_000)
            .with_backfill(work.backfill)
            .with_fair_share(work.fair.then_some(crate::domain::FairShare::MaxUnitsPerTenant(16)))
            .with_order(if work.by_deadline { crate::domain::QueueOrder::Deadline } else { crate::domain::QueueOrder::Fifo })
            .with_starvation(StarvationGuard { max_park_ms: work.max_park_ms, max_skips: work.max_skips });
        let mut lot = lot_with(limits);
        // Teach the lot every class's run time.
        let mut now = 0;
        let mut id = 0;
        for units in [1, 2, 4, 8, 16] {
            for cpu in [false, true] {
                let cost = cost_of(units, cpu);
                let mut ticket = normal(id, 0);
                ticket.cost = cost;
                prop_assert_eq!(lot.admit(ticket, now), Admit::Start);
                now += run_ms(cost);
                lot.complete(id, now).unwrap();
                id += 1;
            }
        }
        let mut costs = BTreeMap::new();
        let mut running = BTreeSet::new();
        // Deadlines far past every start, in an order of their own (by id, scrambled), so
        // that under the deadline order they rank the tickets and expire none.
        let by_deadline = work.by_deadline;
        let ticket = |id: TaskId, priority: usize, cost: ResourceCost, at: u64| Ticket {
            cost,
            created_at_ms: at,
            deadline_ms: by_deadline.then_some(100_000_000 + (id * 7_919) % 1_000),
            tenant: id % 3,
            timeout_ms: Some(2 * run_ms(cost)),
            ..ticket_of(id, Priority::ALL[priority], 0)
        };
        // What an admission started: the newcomer, and under a fair share maybe others.
        let admitted = |answer: Newcomer, also: Vec<TaskId>, id: TaskId| {
            (answer == Newcomer::Start).then_some(id).into_iter().chain(also)
        };
        for &(priority, units, cpu) in &work.first {
            let cost = cost_of(units, cpu);
            costs.insert(id, cost);
            let AdmitParts {
                newcomer: answer,
                started: also,
                ..
            } = lot.admit(ticket(id, priority, cost, now), now).newcomer();
            for started in admitted(answer, also, id) {
                running.insert((now + run_ms(costs[&started]), started));
            }
            id += 1;
        }
        let second_at = now + work.gap_ms;
        drive(&mut lot, &mut running, &costs, now, Some(second_at));
        // The newcomers' estimates before each is admitted, then everyone's after.
        let mut before = BTreeMap::new();
        for &(priority, units, cpu) in &work.second {
            let cost = cost_of(units, cpu);
            let ticket = ticket(id, priority, cost, second_at);
            let estimate = lot.estimate_admission(&ticket, second_at).start_ms;
            before.insert(id, estimate);
            // The refusal's bounded question agrees: late exactly when the estimate is
            // after the deadline, and then no later than the estimate.
            let deadline = second_at + work.gap_ms;
            match (lot.misses_deadline(&ticket, deadline, second_at), estimate) {
                (None, Some(at)) => prop_assert!(at <= deadline, "{} late at {}", id, at),
                (Some(late), Some(at)) => prop_assert!(deadline < late && late <= at),
                (late, None) => prop_assert_eq!(late, None),
            }
            let AdmitParts {
                newcomer: answer,
                started: also,
                ..
            } = lot.admit(ticket, second_at).newcomer();
            costs.insert(id, cost);
            for started in admitted(answer.clone(), also, id) {
                running.insert((second_at + run_ms(costs[&started]), started));
            }
            // What the newcomer would have met is what it meets.
            let after = match answer {
                Newcomer::Start => Some(second_at),
                _ => lot.estimate_start(id, second_at).and_then(|e| e.start_ms),
            };
            prop_assert_eq!(before[&id], after, "newcomer {}", id);
            id += 1;
        }
        let estimates = lot.estimate_all(second_at);
        for &(id, estimate) in &estimates {
            prop_assert_eq!(Some(estimate), lot.estimate_start(id, second_at));
        }
        // A page of them, as `inspect` asks: the same answers.
        let page: Vec<TaskId> = estimates.iter().step_by(2).map(|&(id, _)| id).collect();
        let expected: Vec<(TaskId, StartEstimate)> = estimates.iter().step_by(2).copied().collect();
        prop_assert_eq!(lot.estimate_many(&page, second_at), expected);
        let starts = drive(&mut lot, &mut running, &costs, second_at, None);
        for (id, estimate) in estimates {
            prop_assert_eq!(estimate.start_ms, starts.get(&id).copied(), "task {}", id);
        }
    }

    /// The order statistics of the ends come in order, lie among the instants, and add up
    /// to the ends' own expected instants (the sum of the k-th ends is the sum of the ends):
    /// exactly (but rounding) up to 16 claims, about past them, where the normal law of the
    /// count stands in for the exact one.
    #[test]
    fn the_expected_order_of_ends_adds_up(
        claims in prop::collection::vec(
            prop::collection::vec((0..60_000u64, 1..100u32), 1..32),
            1..40,
        ),
    ) {
        let now = 1_000;
        let mut chances = Vec::new();
        let mut means = 0.0;
        for (index, ends) in claims.iter().enumerate() {
            let total: f64 = ends.iter().map(|&(_, weight)| f64::from(weight)).sum();
            for &(at, weight) in ends {
                let chance = f64::from(weight) / total;
                chances.push((now + at, index, chance));
                means += (now + at) as f64 * chance;
            }
        }
        let first = chances.iter().map(|&(at, ..)| at).min().unwrap();
        let last = chances.iter().map(|&(at, ..)| at).max().unwrap();
        let order = super::running_ends::expected_order(chances, claims.len(), now);
        prop_assert!(order.windows(2).all(|pair| pair[0] <= pair[1]), "{:?}", order);
        prop_assert!(order.iter().all(|&at| first <= at && at <= last), "{:?}", order);
        let sum: f64 = order.iter().map(|&at| at as f64).sum();
        let m = claims.len() as f64;
        let within = if claims.len() <= 16 { m } else { 0.05 * (last - first) as f64 * m };
        prop_assert!((sum - means).abs() <= within, "{} vs {}", sum, means);
    }
}
