//! The [`SharedQueue`] conformance suite: the shared contract, every behaviour the nodes of a
//! shared parking lot rely on, checked with exact values, orders, counts and error variants.
//!
//! A shared queue picks the task itself: the best-ranked parked task that fits a node's free
//! capacity, within an optional rank bound, under a lease. So the suite checks ranking,
//! fitting and the rank bound as well as leases: only the holder renews and settles, a
//! renewal moves the expiry, an expired lease is rescued and claimed again by another node.
//!
//! Each case takes an empty queue and tests one behaviour; [`run_all`] runs every case, each
//! against a fresh queue from the backend's factory. Two nodes are two node names on one
//! queue. Time is passed explicitly (`now_ms`), so no case sleeps and every case is
//! deterministic. Backends that retry failed tasks must be built with retries off for this
//! suite: it expects `Settlement::Failed` to end a claim for good.

use std::future::Future;
use std::time::Duration;

use prometheus_parking_lot::core::{
    Budget, Budgets, Capacity, Carried, Claim, EntryId, FitQuery, Lease, LetterEnd, QueueCounts,
    QueueError, RankBound, ScheduledTask, Settlement, SharedQueue, StartCap, StarvationRule,
    SHED_FOR_HIGHER_PRIORITY,
};
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, ResourceKind};

use super::queue::{at, cpu, task};
use super::{Job, EPOCH_MS};

use Priority::{Critical, High, Low, Normal};
use ResourceKind::{Cpu, GpuVram, Io, Mixed};

/// The first node of the suite.
const NODE_A: &str = "node-a";
/// The second node, on the same queue.
const NODE_B: &str = "node-b";
/// The lease every claim of the suite asks for.
const LEASE: Duration = Duration::from_secs(30);
/// [`LEASE`] in milliseconds.
const LEASE_MS: u64 = 30_000;

/// Runs each case against a fresh queue from `fresh`, printing the suite's and the case's
/// name first so a failure names it.
macro_rules! run_cases {
    ($fresh:ident, $suite:literal; $($case:ident),* $(,)?) => {$(
        let queue = $fresh().await;
        eprintln!("{} [{}]: {}", $suite, queue.backend(), stringify!($case));
        $case(&*queue).await;
    )*};
}

/// Runs every case of the suite, each against a fresh queue from `fresh`.
pub async fn run_all<F, Fut>(fresh: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Box<dyn SharedQueue<Job>>>,
{
    run_cases!(
        fresh,
        "shared queue conformance";
        claim_returns_the_task_under_a_lease,
        duplicate_entries_are_refused,
        best_fit_claims_in_rank_order,
        best_fit_only_claims_kinds_with_free_units,
        best_fit_skips_ahead_to_a_smaller_task,
        best_fit_returns_none_when_nothing_fits,
        rank_bound_excludes_tasks_ranked_behind_it,
        an_aged_task_that_does_not_fit_bounds_the_claim,
        a_task_stored_as_claimed_is_its_nodes_until_its_lease_runs_out,
        a_task_stored_as_claimed_keeps_its_trace_for_its_rescuer,
        a_batch_claim_takes_the_best_tasks_that_fit_together,
        a_batch_claim_takes_no_more_than_the_sequential_claims_would,
        only_the_holder_renews_or_settles,
        renew_extends_the_lease,
        a_group_renewal_extends_the_nodes_leases_and_names_the_ones_it_lost,
        an_expired_lease_is_the_holders_until_rescued,
        an_expired_lease_is_rescued_and_claimed_by_another_node,
        rescue_parks_exactly_the_expired_leases_at_their_rank,
        remove_takes_only_parked_entries,
        remove_task_matches_the_exact_key_and_id,
        counts_follow_every_step,
        a_group_park_refuses_only_the_duplicates,
        a_group_settle_ends_only_the_nodes_claims,
        a_claim_taken_again_fences_out_the_old_one,
        a_release_hands_claims_back_at_once_without_an_attempt,
        a_retried_claim_is_claimable_again_from_its_time_on_as_its_next_attempt,
        a_scheduled_start_is_claimed_by_no_node_before_its_instant,
        a_scheduled_start_ranks_as_usual_once_due,
        a_scheduled_start_is_removed_while_it_sleeps,
        a_scheduled_start_is_refused_as_a_duplicate_entry,
        a_scheduled_start_reserves_nothing_while_it_sleeps_and_ages_from_its_instant,
        a_sleeping_task_says_until_when_it_sleeps,
        a_retried_task_sleeps_out_its_backoff,
        a_parked_trace_comes_back_with_every_claim,
        a_traced_scheduled_start_keeps_both_in_a_group_park,
        shared_budgets_cap_what_every_nodes_claims_take_together,
        a_shared_start_cap_caps_how_many_tasks_claims_take,
        callers_kept_unique_have_one_live_task_each,
        callers_are_not_checked_unless_asked,
        dead_letters_are_kept_listed_retried_and_purged,
        a_schedules_tick_is_parked_once,
        a_bounded_queue_sheds_lower_priorities_and_refuses_the_rest,
        parks_at_once_keep_the_bound_and_account_for_every_task,
        backend_is_named,
    );
}

/// Runs the cases of a queue that claims in the deadline order
/// ([`QueueOrder::Deadline`](prometheus_parking_lot::core::QueueOrder)), each against a
/// fresh queue from `fresh` opened in that order: within a priority the earliest deadline
/// first, tasks without one last, admission among equals; the rank bound, the reserved task
/// and batch claims in that order.
pub async fn run_deadline_order<F, Fut>(fresh: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Box<dyn SharedQueue<Job>>>,
{
    run_cases!(
        fresh,
        "shared queue conformance, deadline order";
        the_earliest_deadline_is_claimed_first_and_none_last,
        a_batch_claim_takes_the_earliest_deadlines_that_fit_together,
        a_rank_bound_admits_by_deadline,
        an_aged_task_reserves_by_deadline,
    );
}

// ---------------------------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------------------------

/// The first claim of `entry`.
fn first_claim(entry: EntryId) -> Claim {
    Claim::new(entry, 1)
}

/// Free units of one kind only.
fn only(kind: ResourceKind, units: u32) -> Capacity {
    Capacity::uniform(0).with(kind, units)
}

/// A fit query without rank bound.
fn within(free: Capacity) -> FitQuery {
    FitQuery::within(free)
}

/// A fit query bounded to tasks ranked at or ahead of `bound`.
fn within_bound(free: Capacity, bound: RankBound) -> FitQuery {
    FitQuery {
        bound: Some(bound),
        ..FitQuery::within(free)
    }
}

/// The rank bound of priority `priority`, admission time `time` ms after the epoch of the
/// suite, and entry `entry`.
fn bound(priority: Priority, time: u64, entry: EntryId) -> RankBound {
    RankBound {
        priority,
        deadline_ms: None,
        rank_time_ms: at(time),
        entry,
    }
}

/// What a scheduled start carries: its instant, `time` ms after the epoch of the suite.
fn not_before(time: u64) -> Carried {
    Carried {
        not_before_ms: Some(at(time)),
        trace: None,
        also: Default::default(),
    }
}

/// What a traced task carries: the trace of [`super::queue::a_trace`].
fn traced() -> Carried {
    Carried {
        not_before_ms: None,
        trace: Some(super::queue::a_trace()),
        also: Default::default(),
    }
}

/// The admission time the suite ranks `task` by: its creation time.
fn rank_time(task: &ScheduledTask<Job>) -> u64 {
    u64::try_from(task.meta.created_at_ms).expect("test times fit u64")
}

/// Enqueues every `(entry, task)`, ranked by the task's creation time, failing the case if
/// one is refused.
async fn enqueue_all(queue: &dyn SharedQueue<Job>, entries: &[(EntryId, &ScheduledTask<Job>)]) {
    for &(entry, task) in entries {
        let enqueued = queue.enqueue(entry, rank_time(task), task.clone()).await;
        if let Err(error) = enqueued {
            panic!(
                "enqueueing entry {entry} (task {}) failed: {error}",
                task.meta.id
            );
        }
    }
}

/// What `node` claims for `query` at `now` (ms after the epoch of the suite).
async fn claim(
    queue: &dyn SharedQueue<Job>,
    node: &str,
    query: FitQuery,
    now: u64,
) -> Option<Lease<Job>> {
    let claimed = queue.claim_best_fit(node, &query, LEASE, at(now)).await;
    claimed.expect("claim_best_fit")
}

/// The entry node A claims for `query` at the epoch of the suite.
async fn best_fit(queue: &dyn SharedQueue<Job>, query: FitQuery) -> Option<EntryId> {
    let claimed = claim(queue, NODE_A, query, 0).await;
    claimed.map(|lease| lease.entry)
}

/// How many leases a rescue at `now` (ms after the epoch of the suite) parks again.
async fn rescue(queue: &dyn SharedQueue<Job>, now: u64) -> usize {
    queue
        .maintenance()
        .rescue_expired(at(now))
        .await
        .expect("rescue_expired")
}

async fn assert_counts(queue: &dyn SharedQueue<Job>, parked: usize, claimed: usize, step: &str) {
    let counts = queue.maintenance().counts().await.expect("counts");
    assert_eq!(
        counts,
        QueueCounts { parked, claimed },
        "counts after {step}"
    );
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

/// A claim returns the task as it was enqueued (every metadata field and the payload), its
/// entry, attempt 1 and a lease running out `lease` after `now`.
pub async fn claim_returns_the_task_under_a_lease(queue: &dyn SharedQueue<Job>) {
    let parked = task(7, High, 10, GpuVram, 300, Some(60_000));
    enqueue_all(queue, &[(1_001, &parked)]).await;
    assert_counts(queue, 1, 0, "enqueue").await;

    let leased = claim(queue, NODE_A, within(only(GpuVram, 300)), 1_000).await;
    let expected = Lease {
        entry: 1_001,
        task: parked,
        attempt: 1,
        expires_at_ms: at(1_000 + LEASE_MS),
        trace: None,
    };
    assert_eq!(leased, Some(expected));
    assert_counts(queue, 0, 1, "claim").await;
}

/// Enqueueing an entry id that is parked or claimed fails with `Duplicate(entry)` and changes
/// nothing, whatever task it carries.
pub async fn duplicate_entries_are_refused(queue: &dyn SharedQueue<Job>) {
    let original = cpu(1, Normal, 0, 1);
    let impostor = task(2, Critical, 5, GpuVram, 9, Some(100));
    enqueue_all(queue, &[(40, &original)]).await;

    for duplicate in [&original, &impostor] {
        let refused = queue.enqueue(40, at(0), duplicate.clone()).await;
        assert_eq!(refused, Err(QueueError::Duplicate(40)), "parked entry");
    }
    assert_counts(queue, 1, 0, "refused enqueues").await;
    let everything = within(Capacity::uniform(u32::MAX));
    assert_eq!(best_fit(queue, everything).await, Some(40));

    for duplicate in [&original, &impostor] {
        let refused = queue.enqueue(40, at(0), duplicate.clone()).await;
        assert_eq!(refused, Err(QueueError::Duplicate(40)), "claimed entry");
    }
    assert_counts(queue, 0, 1, "refused enqueues of a claimed entry").await;
    assert_eq!(
        best_fit(queue, everything).await,
        None,
        "a refused enqueue must not park anything"
    );
}

/// A schedule's tick is parked by the first `enqueue_tick` only: the same tick again (under
/// another entry, as another node would), or an earlier one, parks nothing, also once the
/// tick's task was claimed and settled; each schedule has ticks of its own; the latest tick
/// parked is read back.
pub async fn a_schedules_tick_is_parked_once(queue: &dyn SharedQueue<Job>) {
    let ticks = queue
        .schedule_ticks()
        .expect("the queue parks a schedule's ticks once");
    assert_eq!(ticks.latest_tick("nightly").await, Ok(None));
    let tick = |id| cpu(id, Low, 0, 1);
    let first = ticks
        .enqueue_tick("nightly", at(60_000), 501, tick(1))
        .await;
    assert_eq!(first, Ok(true), "the first node parks the tick");
    let again = ticks
        .enqueue_tick("nightly", at(60_000), 502, tick(1))
        .await;
    assert_eq!(again, Ok(false), "a second node parks nothing");
    let earlier = ticks.enqueue_tick("nightly", at(0), 503, tick(2)).await;
    assert_eq!(earlier, Ok(false), "a tick before the latest parks nothing");
    let other = ticks.enqueue_tick("hourly", at(60_000), 504, tick(3)).await;
    assert_eq!(other, Ok(true), "another schedule's tick is its own");
    assert_counts(queue, 2, 0, "two ticks parked").await;
    assert_eq!(ticks.latest_tick("nightly").await, Ok(Some(at(60_000))));

    let everything = within(Capacity::uniform(u32::MAX));
    for _ in 0..2 {
        let leased = claim(queue, NODE_A, everything, 60_000)
            .await
            .expect("a tick");
        let settled = queue.settle(NODE_A, leased.claim(), Settlement::Done).await;
        assert_eq!(settled, Ok(()));
    }
    let late = ticks
        .enqueue_tick("nightly", at(60_000), 505, tick(1))
        .await;
    assert_eq!(late, Ok(false), "a tick whose task ended parks nothing");
    let next = ticks
        .enqueue_tick("nightly", at(120_000), 506, tick(4))
        .await;
    assert_eq!(next, Ok(true));
    assert_counts(queue, 1, 0, "the next tick parked").await;
    assert_eq!(ticks.latest_tick("nightly").await, Ok(Some(at(120_000))));
}

/// Claims with room for everything come back in rank order across kinds: priority first
/// (Critical first), then smaller `rank_time_ms`, then smaller entry id. The rank time is the
/// one passed to `enqueue`, not the task's creation time, and task ids play no part.
pub async fn best_fit_claims_in_rank_order(queue: &dyn SharedQueue<Job>) {
    let parked = [
        (99, 0, Low, Cpu, 7),
        (3, 900, Normal, GpuVram, 4_000),
        (12, 100, High, Io, 2),
        (2, 0, Low, Mixed, 1),
        (40, 500, Critical, GpuVram, 16_000),
        (5, 10, Normal, Cpu, 1),
        (11, 100, High, Mixed, 3),
        (30, 50, High, Cpu, 8),
    ];
    for (entry, rank_time, priority, kind, units) in parked {
        let created_against_rank = 10_000 - rank_time;
        let task = task(
            1_000 - entry,
            priority,
            created_against_rank,
            kind,
            units,
            None,
        );
        let enqueued = queue.enqueue(entry, at(rank_time), task).await;
        assert_eq!(enqueued, Ok(()), "enqueue {entry}");
    }

    let mut claimed = Vec::new();
    while let Some(entry) = best_fit(queue, within(Capacity::uniform(16_000))).await {
        claimed.push(entry);
        assert!(
            claimed.len() <= parked.len(),
            "claimed more than was parked"
        );
    }
    assert_eq!(claimed, [40, 30, 11, 12, 5, 3, 2, 99]);
    assert_counts(queue, 0, parked.len(), "claiming everything").await;
}

/// The node's starvation rule: the best-ranked task parked long enough that the node could
/// run on its whole capacity is reserved. While it does not fit the free units, only tasks
/// ranked at or ahead of it are claimed (the node drains for it); once it fits, it is
/// claimed. Tasks not yet aged, or too big for the node, reserve nothing.
pub async fn an_aged_task_that_does_not_fit_bounds_the_claim(queue: &dyn SharedQueue<Job>) {
    let big_old = cpu(1, Normal, 0, 8);
    let small_new = cpu(2, Normal, 100, 1);
    let urgent = cpu(3, High, 200, 1);
    let too_big = cpu(4, Critical, 0, 50);
    enqueue_all(
        queue,
        &[(1, &big_old), (2, &small_new), (3, &urgent), (4, &too_big)],
    )
    .await;
    let rule = |aged_at: u64, free: u32| FitQuery {
        starvation: Some(StarvationRule {
            capacity: only(Cpu, 8),
            parked_before_ms: at(aged_at),
        }),
        ..within(only(Cpu, free))
    };

    // Nothing has aged at 0 - 1: the small task skips ahead as usual.
    let young = queue
        .claim_best_fit(NODE_A, &rule(0, 4), LEASE, at(0))
        .await;
    assert_eq!(
        young.expect("claim").map(|lease| lease.entry),
        Some(3),
        "urgent first"
    );
    let skip = queue
        .claim_best_fit(NODE_A, &rule(0, 4), LEASE, at(0))
        .await;
    assert_eq!(
        skip.expect("claim").map(|lease| lease.entry),
        None,
        "task 1 aged at 0 reserves"
    );
    assert_counts(queue, 3, 1, "a reserved claim").await;

    let unaged = FitQuery {
        starvation: Some(StarvationRule {
            capacity: only(Cpu, 8),
            parked_before_ms: at(0) - 1,
        }),
        ..within(only(Cpu, 4))
    };
    let small = queue.claim_best_fit(NODE_A, &unaged, LEASE, at(0)).await;
    assert_eq!(
        small.expect("claim").map(|lease| lease.entry),
        Some(2),
        "no task aged yet"
    );

    let fits_now = queue
        .claim_best_fit(NODE_B, &rule(0, 8), LEASE, at(0))
        .await;
    assert_eq!(
        fits_now.expect("claim").map(|lease| lease.entry),
        Some(1),
        "it fits: claimed"
    );
    assert_counts(queue, 1, 3, "the reserved task claimed").await;
}

/// `enqueue_claimed` stores a task its node starts at once: it comes back as attempt 1 under
/// the node's lease, no other node can claim it, only its node renews and settles it, an
/// entry id stored already is refused, and when the lease runs out it is rescued and claimed
/// elsewhere as attempt 2.
pub async fn a_task_stored_as_claimed_is_its_nodes_until_its_lease_runs_out(
    queue: &dyn SharedQueue<Job>,
) {
    let started = cpu(1, High, 0, 2);
    let lease = queue
        .enqueue_claimed(
            NODE_A,
            1,
            rank_time(&started),
            started.clone(),
            None,
            LEASE,
            at(0),
        )
        .await
        .expect("enqueue_claimed");
    let expected = Lease {
        entry: 1,
        task: started.clone(),
        attempt: 1,
        expires_at_ms: at(LEASE_MS),
        trace: None,
    };
    assert_eq!(lease, expected);
    assert_counts(queue, 0, 1, "a task stored as claimed").await;
    assert_eq!(
        best_fit(queue, within(only(Cpu, 8))).await,
        None,
        "not parked"
    );
    let again = queue
        .enqueue_claimed(
            NODE_B,
            1,
            rank_time(&started),
            started.clone(),
            None,
            LEASE,
            at(0),
        )
        .await;
    assert_eq!(
        again.map(|lease| lease.entry),
        Err(QueueError::Duplicate(1))
    );
    assert_eq!(
        queue.settle(NODE_B, first_claim(1), Settlement::Done).await,
        Err(QueueError::NotClaimed(1))
    );
    assert_eq!(queue.renew(NODE_A, 1, LEASE, at(1_000)).await, Ok(()));

    assert_eq!(rescue(queue, 1_000 + LEASE_MS).await, 1, "its node died");
    let rescued = claim(queue, NODE_B, within(only(Cpu, 8)), 40_000).await;
    assert_eq!(
        rescued.map(|lease| (lease.entry, lease.attempt, lease.task)),
        Some((1, 2, started))
    );
    assert_eq!(
        queue.settle(NODE_B, first_claim(1), Settlement::Done).await,
        Err(QueueError::NotClaimed(1)),
        "the first claim is over"
    );
    assert_eq!(
        queue
            .settle(NODE_B, Claim::new(1, 2), Settlement::Done)
            .await,
        Ok(())
    );
    assert_counts(queue, 0, 0, "settled").await;
}

/// A task stored as its node's claim with a trace (`enqueue_claimed`) keeps it: its own
/// lease has it, and so has the claim of the node that rescues it after its node died.
pub async fn a_task_stored_as_claimed_keeps_its_trace_for_its_rescuer(
    queue: &dyn SharedQueue<Job>,
) {
    let started = cpu(1, High, 0, 2);
    let trace = traced().trace;
    let lease = queue
        .enqueue_claimed(
            NODE_A,
            1,
            rank_time(&started),
            started.clone(),
            trace,
            LEASE,
            at(0),
        )
        .await
        .expect("enqueue_claimed");
    assert_eq!(lease.trace, trace, "its own lease");
    assert_eq!(rescue(queue, LEASE_MS).await, 1, "its node died");
    let rescued = claim(queue, NODE_B, within(only(Cpu, 8)), 40_000).await;
    assert_eq!(
        rescued.map(|lease| (lease.entry, lease.attempt, lease.trace)),
        Some((1, 2, trace)),
        "the rescuer's claim"
    );
}

/// A batch claim with room for all takes the `max` best-ranked tasks, best first, each under
/// its own lease of the batch's expiry; the rest stay parked.
pub async fn a_batch_claim_takes_the_best_tasks_that_fit_together(queue: &dyn SharedQueue<Job>) {
    let tasks = [
        cpu(1, Normal, 0, 1),
        cpu(2, Critical, 5, 1),
        cpu(3, High, 1, 1),
        cpu(4, Low, 0, 1),
    ];
    enqueue_all(
        queue,
        &[
            (1, &tasks[0]),
            (2, &tasks[1]),
            (3, &tasks[2]),
            (4, &tasks[3]),
        ],
    )
    .await;

    let leases = queue
        .claim_batch(NODE_A, &within(only(Cpu, 10)), 3, LEASE, at(0))
        .await
        .expect("claim_batch");
    let taken: Vec<_> = leases
        .iter()
        .map(|lease| (lease.entry, lease.attempt))
        .collect();
    assert_eq!(taken, [(2, 1), (3, 1), (1, 1)]);
    assert!(leases
        .iter()
        .all(|lease| lease.expires_at_ms == at(LEASE_MS)));
    assert_eq!(leases[0].task, tasks[1], "the task comes back as enqueued");
    assert_counts(queue, 1, 3, "a batch claim").await;
    let none = queue
        .claim_batch(NODE_B, &within(only(Cpu, 10)), 0, LEASE, at(0))
        .await
        .expect("claim_batch of none");
    assert!(none.is_empty(), "max 0 claims nothing");
}

/// A batch never takes more than the free units hold together, nor a task the same number of
/// one-by-one claims would not have taken; it always takes the best task that fits alone.
pub async fn a_batch_claim_takes_no_more_than_the_sequential_claims_would(
    queue: &dyn SharedQueue<Job>,
) {
    // One by one, 5 free cpu units take 1 (2 units), skip 2 (4 > 3 left), take 3 and 4.
    let tasks = [
        cpu(1, Critical, 0, 2),
        cpu(2, High, 0, 4),
        cpu(3, Normal, 0, 1),
        cpu(4, Normal, 1, 2),
        task(5, Critical, 0, GpuVram, 1, None),
    ];
    let entries: Vec<_> = (1..).zip(&tasks).collect();
    enqueue_all(queue, &entries).await;

    let leases = queue
        .claim_batch(NODE_A, &within(only(Cpu, 5)), 3, LEASE, at(0))
        .await
        .expect("claim_batch");
    let taken: Vec<EntryId> = leases.iter().map(|lease| lease.entry).collect();
    assert_eq!(
        taken.first(),
        Some(&1),
        "the best task that fits alone comes first"
    );
    assert!(
        taken.iter().all(|entry| [1, 3, 4].contains(entry)),
        "only tasks the one-by-one claims take: {taken:?}"
    );
    let units: u32 = leases.iter().map(|lease| lease.task.meta.cost.units).sum();
    assert!(units <= 5, "{units} units claimed of 5 free");
    assert_counts(queue, 5 - taken.len(), taken.len(), "a bounded batch claim").await;
}

/// A task is claimed only against free units of its own kind; kinds with 0 free never come
/// back, however well ranked, and free units of other kinds do not help.
pub async fn best_fit_only_claims_kinds_with_free_units(queue: &dyn SharedQueue<Job>) {
    let gpu = task(1, Critical, 0, GpuVram, 1, None);
    let io = task(2, High, 0, Io, 1, None);
    let small_cpu = cpu(3, Low, 0, 4);
    let large_cpu = cpu(4, Normal, 0, 5);
    enqueue_all(
        queue,
        &[(11, &gpu), (12, &io), (13, &small_cpu), (14, &large_cpu)],
    )
    .await;

    let cpu_and_mixed = only(Cpu, 4).with(Mixed, 100);
    assert_eq!(best_fit(queue, within(cpu_and_mixed)).await, Some(13));
    assert_eq!(best_fit(queue, within(cpu_and_mixed)).await, None);
    assert_eq!(best_fit(queue, within(only(Io, 1))).await, Some(12));
    assert_eq!(best_fit(queue, within(only(Cpu, 5))).await, Some(14));
    assert_eq!(best_fit(queue, within(Capacity::uniform(0))).await, None);
    assert_counts(queue, 1, 3, "claims by kind").await;
    assert_eq!(best_fit(queue, within(only(GpuVram, 1))).await, Some(11));
}

/// Skip-ahead: better-ranked tasks that do not fit are passed over for the best-ranked one
/// that does; a task costing exactly the free units fits.
pub async fn best_fit_skips_ahead_to_a_smaller_task(queue: &dyn SharedQueue<Job>) {
    let big = task(1, Critical, 0, GpuVram, 10, None);
    let medium = task(2, High, 0, GpuVram, 6, None);
    let small = task(3, Low, 0, GpuVram, 2, None);
    let smaller_but_younger = task(4, Low, 5, GpuVram, 1, None);
    enqueue_all(
        queue,
        &[
            (1, &big),
            (2, &medium),
            (3, &small),
            (4, &smaller_but_younger),
        ],
    )
    .await;

    let five = within(only(GpuVram, 5));
    assert_eq!(best_fit(queue, five).await, Some(3), "skips 1 and 2");
    assert_eq!(best_fit(queue, five).await, Some(4));
    assert_eq!(best_fit(queue, five).await, None);
    assert_eq!(best_fit(queue, within(only(GpuVram, 6))).await, Some(2));
    assert_eq!(best_fit(queue, within(only(GpuVram, 10))).await, Some(1));
    assert_counts(queue, 0, 4, "claiming everything").await;
}

/// `claim_best_fit` gives `None`, and claims nothing, when no parked task fits.
pub async fn best_fit_returns_none_when_nothing_fits(queue: &dyn SharedQueue<Job>) {
    let everything = within(Capacity::uniform(u32::MAX));
    assert_eq!(best_fit(queue, everything).await, None, "empty queue");

    enqueue_all(queue, &[(1, &cpu(1, High, 0, 3)), (2, &cpu(2, Low, 0, 4))]).await;
    assert_eq!(best_fit(queue, within(only(Cpu, 2))).await, None);
    assert_eq!(best_fit(queue, within(only(GpuVram, 100))).await, None);
    assert_eq!(best_fit(queue, within(Capacity::uniform(0))).await, None);
    assert_counts(queue, 2, 0, "misses").await;
    assert_eq!(best_fit(queue, within(only(Cpu, 3))).await, Some(1));
}

/// With a rank bound, only tasks ranked at or ahead of the bound are claimed (a task of
/// exactly the bound's rank included), whichever part of the rank decides.
pub async fn rank_bound_excludes_tasks_ranked_behind_it(queue: &dyn SharedQueue<Job>) {
    let too_big = cpu(1, Critical, 0, 10);
    let reserved = cpu(5, Normal, 200, 8);
    let behind_by_entry = cpu(6, Normal, 200, 1);
    let behind_by_time = cpu(7, Normal, 300, 1);
    let behind_by_priority = cpu(8, Low, 0, 1);
    enqueue_all(
        queue,
        &[
            (1, &too_big),
            (5, &reserved),
            (6, &behind_by_entry),
            (7, &behind_by_time),
            (8, &behind_by_priority),
        ],
    )
    .await;

    let reserved_rank = bound(Normal, 200, 5);
    let five = within_bound(only(Cpu, 5), reserved_rank);
    assert_eq!(best_fit(queue, five).await, None, "only tasks behind fit");
    assert_counts(queue, 5, 0, "a bounded miss").await;

    let ahead_by_entry = cpu(4, Normal, 200, 1);
    let ahead_by_time = cpu(3, Normal, 199, 1);
    let ahead_by_priority = cpu(2, High, 900, 1);
    for ahead in [&ahead_by_entry, &ahead_by_time, &ahead_by_priority] {
        let entry = ahead.meta.id;
        enqueue_all(queue, &[(entry, ahead)]).await;
        assert_eq!(best_fit(queue, five).await, Some(entry));
    }
    assert_eq!(best_fit(queue, five).await, None);

    let eight = within_bound(only(Cpu, 8), reserved_rank);
    assert_eq!(
        best_fit(queue, eight).await,
        Some(5),
        "the bound's own rank"
    );
    assert_eq!(best_fit(queue, eight).await, None);

    let at_six = within_bound(only(Cpu, 5), bound(Normal, 200, 6));
    assert_eq!(best_fit(queue, at_six).await, Some(6));
    let before_seven = within_bound(only(Cpu, 5), bound(Normal, 299, 999));
    assert_eq!(
        best_fit(queue, before_seven).await,
        None,
        "a bound of no parked entry: 7 is behind it by time, 8 by priority"
    );
    assert_eq!(best_fit(queue, within(only(Cpu, 5))).await, Some(7));
    assert_counts(queue, 2, 6, "bounded claims").await;
}

/// Only the node holding a lease renews or settles it; anyone else, and anything parked,
/// settled or unknown, gets `NotClaimed(entry)`, and nothing changes.
pub async fn only_the_holder_renews_or_settles(queue: &dyn SharedQueue<Job>) {
    enqueue_all(queue, &[(1, &cpu(1, High, 0, 1)), (2, &cpu(2, Low, 0, 1))]).await;
    let leased = claim(queue, NODE_A, within(only(Cpu, 1)), 0).await;
    assert_eq!(leased.map(|lease| lease.entry), Some(1));

    let not_claimed = Err(QueueError::NotClaimed(1));
    assert_eq!(queue.renew(NODE_B, 1, LEASE, at(10)).await, not_claimed);
    for settlement in [Settlement::Done, Settlement::Failed("stolen".into())] {
        assert_eq!(
            queue.settle(NODE_B, first_claim(1), settlement).await,
            not_claimed
        );
    }
    assert_counts(queue, 1, 1, "refusals to another node").await;

    assert_eq!(queue.renew(NODE_A, 1, LEASE, at(10)).await, Ok(()));
    let failed = Settlement::Failed("boom".into());
    assert_eq!(queue.settle(NODE_A, first_claim(1), failed).await, Ok(()));
    assert_counts(queue, 1, 0, "settled by the holder").await;
    assert_eq!(
        queue.settle(NODE_A, first_claim(1), Settlement::Done).await,
        not_claimed
    );
    assert_eq!(queue.renew(NODE_A, 1, LEASE, at(20)).await, not_claimed);

    for entry in [2, 404] {
        let not_claimed = Err(QueueError::NotClaimed(entry));
        let renewed = queue.renew(NODE_A, entry, LEASE, at(20)).await;
        assert_eq!(renewed, not_claimed, "renew of entry {entry}");
        let settled = queue
            .settle(NODE_A, first_claim(entry), Settlement::Done)
            .await;
        assert_eq!(settled, not_claimed, "settle of entry {entry}");
    }
    assert_counts(queue, 1, 0, "refusals of unclaimed entries").await;

    let leased = claim(queue, NODE_B, within(only(Cpu, 1)), 30).await;
    assert_eq!(leased.map(|lease| lease.entry), Some(2));
    assert_eq!(
        queue.settle(NODE_B, first_claim(2), Settlement::Done).await,
        Ok(())
    );
    assert_counts(queue, 0, 0, "everything settled").await;
}

/// `enqueue_many` parks a group as `enqueue` parks each: one answer per task, in order; an
/// entry stored already, or given twice in the group, is refused with `Duplicate` (once per
/// extra copy) and the rest of the group is parked, at its own rank.
pub async fn a_group_park_refuses_only_the_duplicates(queue: &dyn SharedQueue<Job>) {
    enqueue_all(queue, &[(7, &cpu(7, Normal, 0, 1))]).await;
    let group = vec![
        (1, at(5), cpu(1, Low, 5, 1), Carried::default()),
        (7, at(5), cpu(70, Critical, 5, 1), Carried::default()),
        (2, at(6), cpu(2, High, 6, 1), Carried::default()),
        (2, at(6), cpu(20, Critical, 6, 1), Carried::default()),
        (3, at(7), cpu(3, Normal, 7, 1), Carried::default()),
    ];
    let parked = queue.enqueue_many(group).await;
    assert_eq!(
        parked,
        vec![
            Ok(()),
            Err(QueueError::Duplicate(7)),
            Ok(()),
            Err(QueueError::Duplicate(2)),
            Ok(()),
        ]
    );
    assert_counts(queue, 4, 0, "a group park with duplicates").await;
    assert_eq!(queue.enqueue_many(Vec::new()).await, Vec::new());

    // Rank order: High 2, then Normal 7 (older) and 3, then Low 1; the refused copies
    // (Critical) are nowhere.
    let leases = queue
        .claim_batch(NODE_A, &within(only(Cpu, 10)), 10, LEASE, at(10))
        .await
        .expect("claim");
    let claimed: Vec<(EntryId, u64)> = leases
        .iter()
        .map(|lease| (lease.entry, lease.task.meta.id))
        .collect();
    assert_eq!(claimed, vec![(2, 2), (7, 7), (3, 3), (1, 1)]);
}

/// `settle_many` ends each claim as `settle` would: one answer per claim, in order; a claim
/// this node does not hold (another node's, unknown, settled already) is `NotClaimed` and
/// does not stop the others.
pub async fn a_group_settle_ends_only_the_nodes_claims(queue: &dyn SharedQueue<Job>) {
    enqueue_all(
        queue,
        &[
            (1, &cpu(1, Normal, 0, 1)),
            (2, &cpu(2, Normal, 1, 1)),
            (3, &cpu(3, Normal, 2, 1)),
            (4, &cpu(4, Normal, 3, 1)),
        ],
    )
    .await;
    let mine = queue
        .claim_batch(NODE_A, &within(only(Cpu, 3)), 3, LEASE, at(10))
        .await
        .expect("claim");
    assert_eq!(mine.len(), 3);
    let theirs = claim(queue, NODE_B, within(only(Cpu, 1)), 10).await;
    assert_eq!(theirs.map(|lease| lease.entry), Some(4));

    let settled = queue
        .settle_many(
            NODE_A,
            vec![
                (first_claim(1), Settlement::Done),
                (first_claim(4), Settlement::Done),
                (first_claim(2), Settlement::Failed("boom".into())),
                (first_claim(404), Settlement::Done),
                (first_claim(3), Settlement::Done),
                (first_claim(1), Settlement::Done),
            ],
        )
        .await;
    assert_eq!(
        settled,
        vec![
            Ok(()),
            Err(QueueError::NotClaimed(4)),
            Ok(()),
            Err(QueueError::NotClaimed(404)),
            Ok(()),
            Err(QueueError::NotClaimed(1)),
        ]
    );
    assert_counts(queue, 0, 1, "node B's claim is left").await;
    assert_eq!(
        queue.settle(NODE_B, first_claim(4), Settlement::Done).await,
        Ok(())
    );
    assert_counts(queue, 0, 0, "everything settled").await;
}

/// A claim is its fencing token: once its lease ran out and the entry was claimed again,
/// even by the same node, the old claim settles nothing (`NotClaimed`), in a group or alone,
/// and the new claim is untouched by the attempt.
pub async fn a_claim_taken_again_fences_out_the_old_one(queue: &dyn SharedQueue<Job>) {
    enqueue_all(queue, &[(1, &cpu(1, Normal, 0, 1))]).await;
    let stale = claim(queue, NODE_A, within(only(Cpu, 1)), 0).await;
    assert_eq!(stale.as_ref().map(Lease::claim), Some(first_claim(1)));
    assert_eq!(
        rescue(queue, LEASE_MS).await,
        1,
        "node a stalled past its lease"
    );
    let fresh = claim(queue, NODE_A, within(only(Cpu, 1)), LEASE_MS + 1).await;
    let fresh = fresh.expect("claimed again").claim();
    assert_eq!(fresh, Claim::new(1, 2));

    let not_claimed = Err(QueueError::NotClaimed(1));
    for settlement in [Settlement::Done, Settlement::Failed("late".into())] {
        let late = queue
            .settle(NODE_A, first_claim(1), settlement.clone())
            .await;
        assert_eq!(late, not_claimed, "the stale claim's {settlement:?}");
        let group = queue
            .settle_many(NODE_A, vec![(first_claim(1), settlement)])
            .await;
        assert_eq!(group, vec![not_claimed.clone()]);
    }
    let released = queue
        .release_many(NODE_A, vec![first_claim(1)], at(0))
        .await;
    assert_eq!(released, vec![not_claimed.clone()], "nor is it released");
    assert_counts(queue, 0, 1, "the fresh claim stands").await;
    assert_eq!(queue.settle(NODE_A, fresh, Settlement::Done).await, Ok(()));
    assert_counts(queue, 0, 0, "settled under the fresh claim").await;
}

/// `release_many` hands a node's claims back: each entry is parked again at its rank, any
/// node may claim it at once (no lease to wait for, no backoff), and the claim that was
/// handed back does not count as an attempt. A claim the node does not hold is `NotClaimed`
/// and does not stop the others.
/// A failed run's claim parked again with `retry` is claimable by any node from its time
/// on, at its rank, and its next claim is its second attempt; only the holder of that very
/// claim can retry it.
pub async fn a_retried_claim_is_claimable_again_from_its_time_on_as_its_next_attempt(
    queue: &dyn SharedQueue<Job>,
) {
    let (flaky, other) = (cpu(1, High, 0, 1), cpu(2, Low, 5, 1));
    enqueue_all(queue, &[(1, &flaky), (2, &other)]).await;
    let lease = claim(queue, NODE_A, within(only(Cpu, 1)), 10)
        .await
        .expect("claimed");
    assert_eq!(lease.claim(), first_claim(1));
    assert_eq!(
        queue
            .retry(NODE_B, first_claim(1), at(500), "not yours".into())
            .await,
        Err(QueueError::NotClaimed(1)),
        "another node's claim"
    );
    assert_eq!(
        queue
            .retry(
                NODE_A,
                first_claim(1),
                at(500),
                "503 Service Unavailable".into()
            )
            .await,
        Ok(())
    );
    assert_eq!(
        queue
            .retry(NODE_A, first_claim(1), at(500), "again".into())
            .await,
        Err(QueueError::NotClaimed(1)),
        "retried already"
    );
    assert_counts(queue, 2, 0, "parked again").await;
    // Before its time only the other task can be claimed, whatever the rank.
    let early = claim(queue, NODE_B, within(only(Cpu, 2)), 499).await;
    assert_eq!(early.map(|lease| lease.entry), Some(2));
    assert_eq!(claim(queue, NODE_B, within(only(Cpu, 2)), 499).await, None);
    let again = claim(queue, NODE_B, within(only(Cpu, 2)), 500).await;
    assert_eq!(
        again,
        Some(Lease {
            entry: 1,
            task: flaky,
            attempt: 2,
            expires_at_ms: at(500 + LEASE_MS),
            trace: None,
        }),
        "at its time, its second attempt"
    );
}

pub async fn a_release_hands_claims_back_at_once_without_an_attempt(queue: &dyn SharedQueue<Job>) {
    let (high, low) = (cpu(1, High, 0, 1), cpu(2, Low, 0, 1));
    enqueue_all(queue, &[(1, &high), (2, &low), (3, &cpu(3, Normal, 0, 1))]).await;
    let mine = queue
        .claim_batch(NODE_A, &within(only(Cpu, 2)), 2, LEASE, at(10))
        .await
        .expect("claim");
    let claims: Vec<Claim> = mine.iter().map(Lease::claim).collect();
    assert_eq!(claims, [first_claim(1), first_claim(3)]);
    let theirs = claim(queue, NODE_B, within(only(Cpu, 1)), 10).await;
    assert_eq!(theirs.map(|lease| lease.entry), Some(2));

    let released = queue
        .release_many(
            NODE_A,
            vec![first_claim(3), first_claim(2), first_claim(1)],
            at(20),
        )
        .await;
    assert_eq!(
        released,
        vec![Ok(()), Err(QueueError::NotClaimed(2)), Ok(())],
        "node b's claim is not node a's to hand back"
    );
    assert_counts(queue, 2, 1, "handed back").await;

    let taken = claim(queue, NODE_B, within(only(Cpu, 1)), 20).await;
    let expected = Lease {
        entry: 1,
        task: high,
        attempt: 1,
        expires_at_ms: at(20 + LEASE_MS),
        trace: None,
    };
    assert_eq!(
        taken,
        Some(expected),
        "at once, at its rank, still its first attempt"
    );
    let next = claim(queue, NODE_B, within(only(Cpu, 1)), 20).await;
    assert_eq!(next.map(|lease| (lease.entry, lease.attempt)), Some((3, 1)));
    assert_counts(queue, 0, 3, "everything claimed again").await;
}

/// `renew` moves the expiry to `now + lease`: a rescue at the old expiry leaves the claim
/// alone, a rescue at the new one parks it again.
pub async fn renew_extends_the_lease(queue: &dyn SharedQueue<Job>) {
    enqueue_all(queue, &[(1, &cpu(1, Normal, 0, 1))]).await;
    let leased = claim(queue, NODE_A, within(only(Cpu, 1)), 0).await;
    let first_expiry = leased.expect("claimed").expires_at_ms;
    assert_eq!(first_expiry, at(LEASE_MS));

    assert_eq!(queue.renew(NODE_A, 1, LEASE, at(20_000)).await, Ok(()));
    assert_eq!(rescue(queue, LEASE_MS).await, 0, "at the old expiry");
    assert_eq!(rescue(queue, 20_000 + LEASE_MS - 1).await, 0);
    assert_counts(queue, 0, 1, "rescues before the new expiry").await;
    assert_eq!(
        rescue(queue, 20_000 + LEASE_MS).await,
        1,
        "at the new expiry"
    );
    assert_counts(queue, 1, 0, "rescue at the new expiry").await;
}

/// `renew_many` extends every lease the node holds in one call and names, in the order
/// given, the entries it does not hold: one another node holds, one rescued, one never
/// parked. A lease it renewed outlives its old expiry; another node's is left alone.
pub async fn a_group_renewal_extends_the_nodes_leases_and_names_the_ones_it_lost(
    queue: &dyn SharedQueue<Job>,
) {
    let tasks: Vec<(EntryId, ScheduledTask<Job>)> = (1..=4)
        .map(|entry| (entry, cpu(entry, Normal, 0, 1)))
        .collect();
    let refs: Vec<(EntryId, &ScheduledTask<Job>)> =
        tasks.iter().map(|(entry, task)| (*entry, task)).collect();
    enqueue_all(queue, &refs).await;
    for node in [NODE_A, NODE_A, NODE_A, NODE_B] {
        assert!(claim(queue, node, within(only(Cpu, 1)), 0).await.is_some());
    }
    // Entries 1-3 are A's, 4 is B's. A's entry 3 runs out and is rescued before A renews.
    assert_eq!(
        queue.renew(NODE_A, 1, LEASE, at(LEASE_MS / 2)).await,
        Ok(())
    );
    assert_eq!(
        queue.renew(NODE_A, 2, LEASE, at(LEASE_MS / 2)).await,
        Ok(())
    );
    assert_eq!(
        queue.renew(NODE_B, 4, LEASE, at(LEASE_MS / 2)).await,
        Ok(())
    );
    assert_eq!(rescue(queue, LEASE_MS).await, 1, "entry 3 ran out");

    let renewed_at = LEASE_MS + 1;
    let lost = queue
        .renew_many(NODE_A, &[4, 1, 3, 2, 99], LEASE, at(renewed_at))
        .await;
    assert_eq!(
        lost,
        Ok(vec![4, 3, 99]),
        "B's, the rescued one, the unknown one"
    );
    assert_eq!(
        rescue(queue, LEASE_MS / 2 + LEASE_MS).await,
        1,
        "B's lease ran out at its own expiry; A's two were extended"
    );
    assert_eq!(rescue(queue, renewed_at + LEASE_MS - 1).await, 0);
    assert_eq!(
        rescue(queue, renewed_at + LEASE_MS).await,
        2,
        "A's two run out at the renewal's expiry"
    );
    assert_eq!(
        queue.renew_many(NODE_A, &[], LEASE, at(renewed_at)).await,
        Ok(vec![]),
        "nothing to renew"
    );
}

/// A lease that ran out but was not rescued yet is still its holder's: it renews and
/// settles.
pub async fn an_expired_lease_is_the_holders_until_rescued(queue: &dyn SharedQueue<Job>) {
    enqueue_all(
        queue,
        &[(1, &cpu(1, Normal, 0, 1)), (2, &cpu(2, Normal, 1, 1))],
    )
    .await;
    for _ in 0..2 {
        let leased = claim(queue, NODE_A, within(only(Cpu, 1)), 0).await;
        assert!(leased.is_some());
    }

    let late = 2 * LEASE_MS;
    assert_eq!(queue.renew(NODE_A, 1, LEASE, at(late)).await, Ok(()));
    assert_eq!(
        queue.settle(NODE_A, first_claim(2), Settlement::Done).await,
        Ok(())
    );
    assert_eq!(rescue(queue, late).await, 0, "renewed until late + lease");
    assert_counts(queue, 0, 1, "a late renew and settle").await;
}

/// A rescue parks an expired lease again; the old holder loses it (`NotClaimed` on renew and
/// settle), and another node claims it as attempt 2 under a lease of its own.
pub async fn an_expired_lease_is_rescued_and_claimed_by_another_node(queue: &dyn SharedQueue<Job>) {
    let lost = cpu(1, High, 0, 1);
    enqueue_all(queue, &[(1, &lost), (2, &cpu(2, Normal, 0, 1))]).await;
    let leased = claim(queue, NODE_A, within(only(Cpu, 1)), 0).await;
    assert_eq!(
        leased.map(|lease| (lease.entry, lease.attempt)),
        Some((1, 1))
    );

    assert_eq!(rescue(queue, LEASE_MS - 1).await, 0, "not expired yet");
    assert_counts(queue, 1, 1, "an early rescue").await;
    assert_eq!(rescue(queue, LEASE_MS).await, 1, "expired at its expiry");
    assert_counts(queue, 2, 0, "rescue").await;
    let not_claimed = Err(QueueError::NotClaimed(1));
    assert_eq!(
        queue.renew(NODE_A, 1, LEASE, at(LEASE_MS + 1)).await,
        not_claimed
    );

    let reclaimed = claim(queue, NODE_B, within(only(Cpu, 1)), 31_000).await;
    let expected = Lease {
        entry: 1,
        task: lost,
        attempt: 2,
        expires_at_ms: at(31_000 + LEASE_MS),
        trace: None,
    };
    assert_eq!(reclaimed, Some(expected), "rescued with its rank and task");
    assert_eq!(
        queue.settle(NODE_A, first_claim(1), Settlement::Done).await,
        not_claimed
    );
    assert_eq!(rescue(queue, 31_000).await, 0, "node b's lease is fresh");
    let second = Claim::new(1, 2);
    assert_eq!(queue.settle(NODE_B, second, Settlement::Done).await, Ok(()));
    assert_counts(queue, 1, 0, "settled by node b").await;
}

/// A rescue parks again exactly the leases that ran out at or before `now`, of every node,
/// each at the rank it was enqueued with; its claim count goes up only when it is claimed
/// again.
pub async fn rescue_parks_exactly_the_expired_leases_at_their_rank(queue: &dyn SharedQueue<Job>) {
    let first = cpu(1, Critical, 0, 1);
    let second = cpu(2, High, 0, 1);
    let third = cpu(3, Normal, 0, 1);
    let waiting = cpu(4, Normal, 5, 1);
    enqueue_all(queue, &[(1, &first), (2, &second), (3, &third)]).await;
    let one = within(only(Cpu, 1));
    for (node, now) in [(NODE_B, 0), (NODE_A, 10_000), (NODE_B, 20_000)] {
        assert!(claim(queue, node, one, now).await.is_some());
    }
    enqueue_all(queue, &[(4, &waiting)]).await;

    assert_eq!(rescue(queue, 10_000 + LEASE_MS).await, 2, "entries 1 and 2");
    assert_counts(queue, 3, 1, "rescue").await;
    assert_eq!(rescue(queue, 10_000 + LEASE_MS).await, 0, "rescued once");

    let mut reclaimed = Vec::new();
    while let Some(lease) = claim(queue, NODE_A, one, 50_000).await {
        reclaimed.push((lease.entry, lease.attempt));
    }
    assert_eq!(reclaimed, [(1, 2), (2, 2), (4, 1)]);
    assert_eq!(
        queue.settle(NODE_B, first_claim(3), Settlement::Done).await,
        Ok(())
    );
    assert_counts(queue, 0, 3, "reclaiming everything").await;
}

/// `remove` takes a parked entry out for good and returns its task; a claimed entry stays
/// claimed (`None`), and unknown entries give `None`.
pub async fn remove_takes_only_parked_entries(queue: &dyn SharedQueue<Job>) {
    let gone = task(1, Critical, 0, Mixed, 5, Some(1_000));
    let running = cpu(2, Low, 0, 1);
    enqueue_all(queue, &[(1, &gone), (2, &running)]).await;

    assert_eq!(queue.remove(1).await, Ok(Some(gone)));
    assert_counts(queue, 1, 0, "remove").await;
    assert_eq!(queue.remove(1).await, Ok(None), "removed twice");
    assert_eq!(queue.remove(404).await, Ok(None), "unknown entry");
    let everything = within(Capacity::uniform(u32::MAX));
    assert_eq!(best_fit(queue, everything).await, Some(2), "1 is gone");

    assert_eq!(queue.remove(2).await, Ok(None), "claimed entry");
    assert_counts(queue, 0, 1, "remove of a claimed entry").await;
    assert_eq!(
        queue.settle(NODE_A, first_claim(2), Settlement::Done).await,
        Ok(()),
        "still claimed"
    );
}

/// `remove_task` finds a parked task by its exact mailbox key and id (a cancel taken by any
/// node): another tenant, another user of the same tenant or another id finds nothing, and a
/// claimed task is not removed.
pub async fn remove_task_matches_the_exact_key_and_id(queue: &dyn SharedQueue<Job>) {
    let alice = MailboxKey::new("alice").with_user("u1");
    let owned = |id, created, key: &MailboxKey| {
        let mut task = cpu(id, Normal, created, 1);
        task.meta.mailbox = Some(key.clone());
        task
    };
    let (claimed, first, second) = (
        owned(9, 0, &alice),
        owned(7, 1, &alice),
        owned(8, 2, &alice),
    );
    enqueue_all(queue, &[(1, &claimed), (2, &first), (3, &second)]).await;
    let lease = claim(queue, NODE_A, within(only(Cpu, 1)), 0).await;
    assert_eq!(lease.map(|lease| lease.entry), Some(1), "task 9 is claimed");

    for (key, id) in [
        (MailboxKey::new("mallory").with_user("u1"), 7),
        (MailboxKey::new("alice"), 7),
        (MailboxKey::new("alice").with_user("u2"), 7),
        (alice.clone(), 70),
        (alice.clone(), 9),
    ] {
        assert_eq!(
            queue.remove_task(&key, id).await,
            Ok(None),
            "{key:?} {id} matched"
        );
    }
    assert_counts(queue, 2, 1, "nothing removed").await;
    assert_eq!(queue.remove_task(&alice, 7).await, Ok(Some(first)));
    assert_eq!(
        queue.remove_task(&alice, 7).await,
        Ok(None),
        "removed twice"
    );
    assert_counts(queue, 1, 1, "task 7 removed").await;
    let everything = within(Capacity::uniform(u32::MAX));
    assert_eq!(
        best_fit(queue, everything).await,
        Some(3),
        "task 8 is still parked"
    );
}

/// `counts` follows entries through every operation, of every node, refused ones included.
pub async fn counts_follow_every_step(queue: &dyn SharedQueue<Job>) {
    assert_counts(queue, 0, 0, "nothing").await;
    enqueue_all(
        queue,
        &[
            (1, &cpu(1, Critical, 0, 1)),
            (2, &cpu(2, High, 0, 1)),
            (3, &cpu(3, Normal, 0, 1)),
            (4, &cpu(4, Low, 0, 1)),
        ],
    )
    .await;
    assert_counts(queue, 4, 0, "four enqueues").await;
    let refused = queue.enqueue(4, at(0), cpu(5, Low, 0, 1)).await;
    assert_eq!(refused, Err(QueueError::Duplicate(4)));
    assert_counts(queue, 4, 0, "a refused enqueue").await;

    let one = within(only(Cpu, 1));
    assert!(claim(queue, NODE_A, one, 0).await.is_some());
    assert_counts(queue, 3, 1, "node a's claim").await;
    assert!(claim(queue, NODE_B, one, 0).await.is_some());
    assert_counts(queue, 2, 2, "node b's claim").await;
    assert!(claim(queue, NODE_A, within(only(Cpu, 0)), 0)
        .await
        .is_none());
    assert_counts(queue, 2, 2, "a claim that found nothing").await;
    queue.renew(NODE_A, 1, LEASE, at(1)).await.expect("renew");
    assert_counts(queue, 2, 2, "renew").await;
    queue
        .settle(NODE_B, first_claim(2), Settlement::Done)
        .await
        .expect("settle");
    assert_counts(queue, 2, 1, "settle").await;
    let refused = queue.settle(NODE_B, first_claim(1), Settlement::Done).await;
    assert_eq!(refused, Err(QueueError::NotClaimed(1)));
    assert_counts(queue, 2, 1, "a refused settle").await;
    queue.remove(4).await.expect("remove").expect("parked");
    assert_counts(queue, 1, 1, "remove").await;
    assert_eq!(rescue(queue, 1 + LEASE_MS).await, 1);
    assert_counts(queue, 2, 0, "rescue").await;
    let failed = Settlement::Failed("boom".into());
    let again = claim(queue, NODE_B, one, LEASE_MS + 2).await;
    assert_eq!(again.as_ref().map(Lease::claim), Some(Claim::new(1, 2)));
    queue
        .settle(NODE_B, Claim::new(1, 2), failed)
        .await
        .expect("settle");
    assert_counts(queue, 1, 0, "settled Failed").await;
}
/// A budget that barely refills while a case runs: 1 unit a day, `burst` at once.
fn daily(burst: u32) -> Budget {
    Budget {
        units: 1,
        per_ms: 86_400_000,
        burst,
        max_starts: None,
    }
}

/// Claims by two nodes spend from one bucket: together they take no more units of the kind
/// than it holds, whatever free units each has; units given back are claimable by either;
/// a kind without a budget is not limited; sharing the same budgets again keeps the level.
pub async fn shared_budgets_cap_what_every_nodes_claims_take_together(
    queue: &dyn SharedQueue<Job>,
) {
    let fleet = queue
        .budgets()
        .expect("the queue keeps budgets for every node");
    let budgets = Budgets::none().with(Io, daily(10));
    fleet.share_budgets(&budgets).await.expect("share budgets");
    let tasks: Vec<_> = (1..=5)
        .map(|id| task(id, Normal, id, Io, 4, None))
        .collect();
    let small = cpu(6, Normal, 6, 1);
    let mut entries: Vec<_> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (i as EntryId + 1, t))
        .collect();
    entries.push((6, &small));
    enqueue_all(queue, &entries).await;

    let plenty = Capacity::uniform(0).with(Io, 100);
    let taken =
        |leases: Vec<Lease<Job>>| leases.iter().map(|lease| lease.entry).collect::<Vec<_>>();
    let a = queue
        .claim_batch(NODE_A, &within(plenty), 10, LEASE, at(0))
        .await
        .expect("claim");
    assert_eq!(
        taken(a),
        [1, 2],
        "8 of the 10 units: a third task of 4 does not fit"
    );
    let b = queue
        .claim_batch(NODE_B, &within(plenty), 10, LEASE, at(0))
        .await
        .expect("claim");
    assert!(
        b.is_empty(),
        "2 units are left for every node: node b takes {:?}",
        taken(b)
    );

    fleet.give_back_budget(Io, 4).await.expect("give back");
    let b = claim(queue, NODE_B, within(plenty), 0)
        .await
        .map(|lease| lease.entry);
    assert_eq!(
        b,
        Some(3),
        "the 4 units given back let one more task go, to any node"
    );

    let cpu_only = claim(queue, NODE_B, within(only(Cpu, 1)), 0).await;
    assert_eq!(
        cpu_only.map(|lease| lease.entry),
        Some(6),
        "cpu has no budget"
    );

    fleet
        .share_budgets(&budgets)
        .await
        .expect("share the same budgets again");
    let a = claim(queue, NODE_A, within(plenty), 0).await;
    assert_eq!(
        a.map(|lease| lease.entry),
        None,
        "sharing again does not refill the bucket"
    );
    assert_counts(queue, 2, 4, "the claims within the budget").await;
}

/// Under a shared start cap, claims take no more tasks than it has starts, however few
/// units they cost.
pub async fn a_shared_start_cap_caps_how_many_tasks_claims_take(queue: &dyn SharedQueue<Job>) {
    let fleet = queue
        .budgets()
        .expect("the queue keeps budgets for every node");
    let capped = Budget {
        max_starts: Some(StartCap {
            count: 2,
            per_ms: 86_400_000,
        }),
        ..daily(100)
    };
    fleet
        .share_budgets(&Budgets::none().with(Io, capped))
        .await
        .expect("share budgets");
    let tasks: Vec<_> = (1..=3)
        .map(|id| task(id, Normal, id, Io, 1, None))
        .collect();
    enqueue_all(queue, &[(1, &tasks[0]), (2, &tasks[1]), (3, &tasks[2])]).await;

    let plenty = Capacity::uniform(0).with(Io, 100);
    let a = queue
        .claim_batch(NODE_A, &within(plenty), 10, LEASE, at(0))
        .await
        .expect("claim");
    assert_eq!(a.len(), 2, "two starts");
    let b = claim(queue, NODE_B, within(plenty), 0).await;
    assert!(b.is_none(), "no start is left for node b");
    assert_counts(queue, 1, 2, "the capped claims").await;
}
/// `task`, submitted under `key`.
fn under(mut task: ScheduledTask<Job>, key: &MailboxKey) -> ScheduledTask<Job> {
    task.meta.mailbox = Some(key.clone());
    task
}

/// Once callers are kept unique, a caller (tenant, task id) has at most one live task,
/// parked or claimed, whichever node parks it: a second is refused as a duplicate, and the
/// live one's key is found; another tenant's task of the same id is not that caller; once
/// the live task is settled, the caller may park again.
pub async fn callers_kept_unique_have_one_live_task_each(queue: &dyn SharedQueue<Job>) {
    let callers = queue
        .unique_callers()
        .expect("the queue keeps callers unique");
    callers
        .keep_callers_unique()
        .await
        .expect("keep callers unique");
    let first = MailboxKey::new("acme").with_session("first");
    let again = MailboxKey::new("acme").with_session("again");
    let other = MailboxKey::new("globex");
    let original = under(cpu(7, Normal, 0, 1), &first);
    enqueue_all(queue, &[(1, &original)]).await;

    let repeated = queue
        .enqueue(2, at(1), under(cpu(7, Normal, 1, 1), &again))
        .await;
    assert_eq!(
        repeated,
        Err(QueueError::Duplicate(2)),
        "the caller has a live task"
    );
    let found = callers
        .live_task_key(&first.tenant, 7)
        .await
        .expect("look up");
    assert_eq!(found, Some(first.clone()), "the original's key");
    assert_eq!(
        callers
            .live_task_key(&first.tenant, 8)
            .await
            .expect("look up"),
        None
    );
    let elsewhere = queue
        .enqueue(3, at(2), under(cpu(7, Normal, 2, 1), &other))
        .await;
    assert_eq!(
        elsewhere,
        Ok(()),
        "another tenant's task 7 is another caller"
    );

    let lease = claim(queue, NODE_A, within(only(Cpu, 1)), 3)
        .await
        .expect("claim");
    assert_eq!(lease.entry, 1);
    let while_claimed = queue
        .enqueue(4, at(4), under(cpu(7, Normal, 4, 1), &again))
        .await;
    assert_eq!(
        while_claimed,
        Err(QueueError::Duplicate(4)),
        "a claimed task is live"
    );
    let found = callers
        .live_task_key(&first.tenant, 7)
        .await
        .expect("look up");
    assert_eq!(found, Some(first.clone()));

    queue
        .settle(NODE_A, lease.claim(), Settlement::Done)
        .await
        .expect("settle");
    // Completed: remembered for a minute, so a resubmission racing with the end meets it.
    let just_after = queue
        .enqueue(5, at(5), under(cpu(7, Normal, 5, 1), &again))
        .await;
    assert_eq!(
        just_after,
        Err(QueueError::Duplicate(5)),
        "completed a moment ago"
    );
    let found = callers
        .live_task_key(&first.tenant, 7)
        .await
        .expect("look up");
    assert_eq!(found, Some(first.clone()));
    assert_counts(
        queue,
        1,
        0,
        "a completed task is neither parked nor claimed",
    )
    .await;
    // A rescue long after forgets it: the caller may park again.
    rescue(queue, 4_000_000_000_000 - EPOCH_MS).await;
    assert_eq!(
        callers
            .live_task_key(&first.tenant, 7)
            .await
            .expect("look up"),
        None
    );
    let later = queue
        .enqueue(6, at(6), under(cpu(7, Normal, 6, 1), &again))
        .await;
    assert_eq!(
        later,
        Ok(()),
        "the caller's task is forgotten: it may park again"
    );
    assert_counts(queue, 2, 0, "the unique callers").await;
}

/// A queue not told to keep callers unique stores two tasks of one caller.
pub async fn callers_are_not_checked_unless_asked(queue: &dyn SharedQueue<Job>) {
    let key = MailboxKey::new("acme");
    let first = under(cpu(7, Normal, 0, 1), &key);
    let second = under(cpu(7, Normal, 1, 1), &key);
    enqueue_all(queue, &[(1, &first), (2, &second)]).await;
    assert_counts(queue, 2, 0, "two tasks of one caller").await;
}
/// A failed run's task is kept as a dead letter with its reason, listed oldest first a page
/// at a time; a retry parks it again (claimable, its attempts afresh) and a purge deletes
/// one or all.
pub async fn dead_letters_are_kept_listed_retried_and_purged(queue: &dyn SharedQueue<Job>) {
    let key = MailboxKey::new("acme").with_session("s");
    let tasks: Vec<_> = (1..=3)
        .map(|id| under(cpu(id, Normal, id, 1), &key))
        .collect();
    enqueue_all(queue, &[(1, &tasks[0]), (2, &tasks[1]), (3, &tasks[2])]).await;
    let leases = queue
        .claim_batch(NODE_A, &within(only(Cpu, 2)), 2, LEASE, at(10))
        .await
        .expect("claim");
    assert_eq!(
        leases.iter().map(|lease| lease.entry).collect::<Vec<_>>(),
        [1, 2]
    );
    for lease in &leases {
        let reason = format!("boom {}", lease.entry);
        queue
            .settle(NODE_A, lease.claim(), Settlement::Failed(reason))
            .await
            .expect("settle");
    }
    let maintenance = queue.maintenance();
    let kept = maintenance.list_dead_letters(0, 10).await.expect("list");
    let listed: Vec<_> = kept
        .iter()
        .map(|letter| {
            (
                letter.entry,
                letter.task_id,
                letter.attempts,
                letter.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(listed, [(1, 1, 1, "boom 1"), (2, 2, 1, "boom 2")]);
    assert_eq!(
        (kept[0].key.clone(), kept[0].cost),
        (key.clone(), tasks[0].meta.cost)
    );
    let page = maintenance.list_dead_letters(1, 10).await.expect("list");
    assert_eq!(
        page.iter().map(|letter| letter.entry).collect::<Vec<_>>(),
        [2]
    );

    assert_eq!(maintenance.retry_dead_letter(1).await, Ok(true));
    assert_eq!(
        maintenance.retry_dead_letter(1).await,
        Ok(false),
        "no longer dead"
    );
    assert_eq!(maintenance.retry_dead_letter(99).await, Ok(false));
    assert_counts(queue, 2, 0, "a retried dead letter is parked").await;
    let again = claim(queue, NODE_B, within(only(Cpu, 1)), 20)
        .await
        .expect("claim");
    assert_eq!(
        (again.entry, again.attempt),
        (1, 1),
        "its attempts start afresh"
    );
    assert_eq!(again.task, tasks[0]);

    assert_eq!(maintenance.purge_dead_letters(Some(2)).await, Ok(1));
    assert_eq!(maintenance.purge_dead_letters(Some(2)).await, Ok(0));
    assert!(maintenance
        .list_dead_letters(0, 10)
        .await
        .expect("list")
        .is_empty());
    queue
        .settle(
            NODE_B,
            again.claim(),
            Settlement::Failed("boom again".into()),
        )
        .await
        .expect("settle");
    assert_eq!(
        maintenance.purge_dead_letters(None).await,
        Ok(1),
        "purge all"
    );
    assert!(maintenance
        .list_dead_letters(0, 10)
        .await
        .expect("list")
        .is_empty());
}

/// A queue bounded to `max_queued_units` keeps the units parked of each kind within it for
/// every node, as rule 21 keeps a node's: a newcomer past it sheds the worst-ranked tasks
/// of its kind of a strictly lower priority, as many as make room, each a dead letter that
/// ends `Shed`; where they could not make room (or it alone is above the bound) it is
/// refused `UnitsFull` and nothing is shed. A scheduled start still asleep and another
/// kind's units do not count; a group park decides task by task, in order. A queue without
/// the capability (pgmq) is refused by the node at start instead (`tests/config/`).
pub async fn a_bounded_queue_sheds_lower_priorities_and_refuses_the_rest(
    queue: &dyn SharedQueue<Job>,
) {
    let Some(bounded) = queue.queued_units() else {
        eprintln!(
            "  skipped: the {} queue keeps no bound on its units",
            queue.backend()
        );
        return;
    };
    bounded.bound_queued_units(10).await.expect("bound");
    let park = |entry: EntryId, task: ScheduledTask<Job>| async move {
        let rank_time_ms = rank_time(&task);
        queue.enqueue(entry, rank_time_ms, task).await
    };
    park(1, cpu(1, Low, 1, 4)).await.expect("park 1");
    park(2, cpu(2, Normal, 2, 4)).await.expect("park 2");
    let vram = task(10, Low, 3, GpuVram, 10, None);
    park(10, vram)
        .await
        .expect("another kind has its own 10 units");
    park(3, cpu(3, Normal, 4, 4))
        .await
        .expect("12 > 10 units: the Low task 1 is shed for it");
    let full = QueueError::UnitsFull {
        kind: Cpu,
        needed: 4,
        max_queued_units: 10,
    };
    assert_eq!(
        park(4, cpu(4, Normal, 5, 4)).await,
        Err(full),
        "nothing of a lower priority is left to shed"
    );
    park(5, cpu(5, Low, 6, 1)).await.expect("9 units fit");
    park(6, cpu(6, High, 7, 3))
        .await
        .expect("sheds Low task 5, then the worst Normal one, task 3");
    assert_eq!(
        park(7, cpu(7, Critical, 8, 11)).await,
        Err(QueueError::UnitsFull {
            kind: Cpu,
            needed: 11,
            max_queued_units: 10
        }),
        "above the bound alone: refused, nothing shed"
    );
    let asleep = Carried {
        not_before_ms: Some(u64::MAX / 4),
        trace: None,
        also: Default::default(),
    };
    let sleeper = cpu(8, Low, 9, 3);
    queue
        .enqueue_carrying(8, rank_time(&sleeper), sleeper, asleep)
        .await
        .expect("a scheduled start parks whatever the bound");
    park(9, cpu(9, Low, 10, 3))
        .await
        .expect("7 + 3 units: the sleeping task does not count");
    assert_eq!(
        park(2, cpu(2, Normal, 2, 4)).await,
        Err(QueueError::Duplicate(2))
    );
    let group = vec![
        (11, at(11), cpu(11, Normal, 11, 1), Carried::default()),
        (12, at(12), cpu(12, Critical, 12, 2), Carried::default()),
    ];
    assert_eq!(
        queue.enqueue_many(group).await,
        [Ok(()), Ok(())],
        "task 11 sheds Low task 9; then task 12 fits the 10 units"
    );

    let letters = queue
        .maintenance()
        .take_dead_letters(10)
        .await
        .expect("dead letters");
    let mut shed: Vec<_> = letters
        .iter()
        .map(|letter| (letter.task_id, letter.end.clone(), letter.reason.as_str()))
        .collect();
    shed.sort_by_key(|(id, _, _)| *id);
    let why = SHED_FOR_HIGHER_PRIORITY;
    assert_eq!(
        shed,
        [1, 3, 5, 9].map(|id| (id, LetterEnd::Shed, why)),
        "the shed tasks, each told once"
    );
    let leases = queue
        .claim_batch(NODE_A, &within(only(Cpu, 100)), 10, LEASE, at(20))
        .await
        .expect("claim");
    assert_eq!(
        leases.iter().map(|lease| lease.entry).collect::<Vec<_>>(),
        [12, 6, 2, 11],
        "what is left, in rank order"
    );
    let vram = claim(queue, NODE_B, within(only(GpuVram, 10)), 20).await;
    assert_eq!(vram.map(|lease| lease.entry), Some(10));
}

/// Eight callers parking at once (on a database, each park its own transaction on a
/// connection of its own) never take a bounded queue past its bound, and every task ends
/// exactly one way: parked, shed (a dead letter ending `Shed`) or refused `UnitsFull`.
pub async fn parks_at_once_keep_the_bound_and_account_for_every_task(queue: &dyn SharedQueue<Job>) {
    const BOUND: u64 = 40;
    const CALLERS: u64 = 8;
    const EACH: u64 = 20;
    let Some(bounded) = queue.queued_units() else {
        eprintln!(
            "  skipped: the {} queue keeps no bound on its units",
            queue.backend()
        );
        return;
    };
    bounded.bound_queued_units(BOUND).await.expect("bound");
    let priorities = [Low, Normal, High, Critical];
    let caller = |caller: u64| async move {
        let mut refused = Vec::new();
        for step in 0..EACH {
            let id = caller * 100 + step + 1;
            // A spread of priorities and costs (1 to 5 units) that no caller shares.
            let mix = id.wrapping_mul(2_654_435_761) >> 7;
            let priority = priorities[usize::try_from(mix % 4).expect("small")];
            let units = 1 + u32::try_from(mix % 5).expect("small");
            let task = cpu(id, priority, id, units);
            match queue.enqueue(id, rank_time(&task), task).await {
                Ok(()) => {}
                Err(QueueError::UnitsFull { .. }) => refused.push(id),
                Err(other) => panic!("task {id}: {other:?}"),
            }
        }
        refused
    };
    let refused: Vec<u64> = futures_util::future::join_all((0..CALLERS).map(caller))
        .await
        .into_iter()
        .flatten()
        .collect();
    let letters = queue
        .maintenance()
        .take_dead_letters(1_000)
        .await
        .expect("dead letters");
    assert!(
        letters.iter().all(|letter| letter.end == LetterEnd::Shed),
        "only shed tasks are dead letters: {letters:?}"
    );
    let left = queue
        .claim_batch(NODE_A, &within(only(Cpu, 10_000)), 1_000, LEASE, at(10_000))
        .await
        .expect("claim what is parked");
    let parked_units: u64 = left
        .iter()
        .map(|lease| u64::from(lease.task.meta.cost.units))
        .sum();
    assert!(
        parked_units <= BOUND,
        "{parked_units} units parked past the bound of {BOUND}"
    );
    let mut ended: Vec<u64> = left
        .iter()
        .map(|lease| lease.task.meta.id)
        .chain(letters.iter().map(|letter| letter.task_id))
        .chain(refused.iter().copied())
        .collect();
    ended.sort_unstable();
    let all: Vec<u64> = (0..CALLERS)
        .flat_map(|caller| (1..=EACH).map(move |step| caller * 100 + step))
        .collect();
    assert_eq!(ended, all, "every task parked, shed or refused, once");
    assert!(
        !letters.is_empty() && !refused.is_empty(),
        "the bound was met"
    );
}

/// `backend` names the backend for logs.
pub async fn backend_is_named(queue: &dyn SharedQueue<Job>) {
    let name = queue.backend();
    assert!(!name.trim().is_empty(), "backend name {name:?}");
}

/// A scheduled start ([`SharedQueue::enqueue_carrying`] with an instant) is parked and counted at once,
/// but no node claims it before its instant, whatever its rank; from then on it is claimed
/// unchanged, as its first attempt.
pub async fn a_scheduled_start_is_claimed_by_no_node_before_its_instant(
    queue: &dyn SharedQueue<Job>,
) {
    let later = cpu(1, Critical, 0, 1);
    queue
        .enqueue_carrying(1, rank_time(&later), later.clone(), not_before(10_000))
        .await
        .expect("enqueue_carrying");
    assert_counts(queue, 1, 0, "a scheduled start").await;
    assert_eq!(claim(queue, NODE_A, within(only(Cpu, 4)), 0).await, None);
    assert_eq!(
        claim(queue, NODE_B, within(only(Cpu, 4)), 9_999).await,
        None
    );
    let due = claim(queue, NODE_B, within(only(Cpu, 4)), 10_000).await;
    assert_eq!(
        due,
        Some(Lease {
            entry: 1,
            task: later,
            attempt: 1,
            expires_at_ms: at(10_000 + LEASE_MS),
            trace: None,
        }),
        "claimed at its instant, as its first attempt"
    );
}

/// Once due, a scheduled start ranks by its priority and admission time like any parked
/// task: a High one due now goes before an older Low one, and after an older High one.
pub async fn a_scheduled_start_ranks_as_usual_once_due(queue: &dyn SharedQueue<Job>) {
    let (old_high, low, woken) = (cpu(1, High, 0, 1), cpu(2, Low, 1, 1), cpu(3, High, 2, 1));
    enqueue_all(queue, &[(1, &old_high), (2, &low)]).await;
    queue
        .enqueue_carrying(3, rank_time(&woken), woken, not_before(1_000))
        .await
        .expect("enqueue_carrying");
    let mut order = Vec::new();
    while let Some(lease) = claim(queue, NODE_A, within(only(Cpu, 1)), 1_000).await {
        order.push(lease.entry);
    }
    assert_eq!(order, vec![1, 3, 2]);
}

/// A sleeping scheduled start can be removed (cancelled) before its instant, and no node
/// claims it after.
pub async fn a_scheduled_start_is_removed_while_it_sleeps(queue: &dyn SharedQueue<Job>) {
    let later = cpu(1, Normal, 0, 1);
    queue
        .enqueue_carrying(1, rank_time(&later), later.clone(), not_before(10_000))
        .await
        .expect("enqueue_carrying");
    assert_eq!(queue.remove(1).await, Ok(Some(later)));
    assert_eq!(
        claim(queue, NODE_A, within(only(Cpu, 4)), 20_000).await,
        None
    );
    assert_counts(queue, 0, 0, "removed").await;
}

/// An entry stored already is refused, scheduled or not, and the first stays as it was.
pub async fn a_scheduled_start_is_refused_as_a_duplicate_entry(queue: &dyn SharedQueue<Job>) {
    let (first, second) = (cpu(1, Normal, 0, 1), cpu(2, High, 0, 1));
    enqueue_all(queue, &[(1, &first)]).await;
    assert_eq!(
        queue
            .enqueue_carrying(1, rank_time(&second), second, not_before(10_000))
            .await,
        Err(QueueError::Duplicate(1))
    );
    let lease = claim(queue, NODE_A, within(only(Cpu, 4)), 0).await;
    assert_eq!(lease.map(|lease| lease.task), Some(first));
}

/// The starvation rule ages a scheduled start from its instant, not from its admission: while
/// it sleeps it reserves nothing (smaller tasks skip ahead of it as usual), and once awake it
/// reserves only after it has waited as long as any task must.
pub async fn a_scheduled_start_reserves_nothing_while_it_sleeps_and_ages_from_its_instant(
    queue: &dyn SharedQueue<Job>,
) {
    let big = cpu(1, Normal, 0, 8);
    queue
        .enqueue_carrying(1, rank_time(&big), big, not_before(1_000))
        .await
        .expect("enqueue_carrying");
    let (second, third, fourth) = (
        cpu(2, Normal, 100, 1),
        cpu(3, Normal, 200, 1),
        cpu(4, Normal, 300, 1),
    );
    enqueue_all(queue, &[(2, &second), (3, &third), (4, &fourth)]).await;
    let rule = |aged_at: u64, free: u32| FitQuery {
        starvation: Some(StarvationRule {
            capacity: only(Cpu, 8),
            parked_before_ms: at(aged_at),
        }),
        ..within(only(Cpu, free))
    };
    let claimed = |query: FitQuery, now: u64| async move {
        let lease = queue.claim_best_fit(NODE_A, &query, LEASE, at(now)).await;
        lease.expect("claim").map(|lease| lease.entry)
    };
    assert_eq!(
        claimed(rule(400, 4), 500).await,
        Some(2),
        "asleep, it reserves nothing"
    );
    assert_eq!(
        claimed(rule(500, 4), 1_000).await,
        Some(3),
        "awake, not aged yet"
    );
    assert_eq!(
        claimed(rule(1_000, 4), 1_000).await,
        None,
        "aged from its instant, it reserves"
    );
    assert_eq!(
        claimed(rule(1_000, 8), 1_000).await,
        Some(1),
        "it fits: claimed"
    );
}

/// A task that sleeps in the queue (a scheduled start) answers, asked by its exact key and
/// id from any node, the instant it sleeps until, up to that instant; a due task, another
/// key or id, and the task once cancelled (by key and id, while it sleeps) answer nothing.
pub async fn a_sleeping_task_says_until_when_it_sleeps(queue: &dyn SharedQueue<Job>) {
    let alice = MailboxKey::new("alice").with_user("u1");
    let (sleeper, due) = (
        under(cpu(7, Normal, 0, 1), &alice),
        under(cpu(8, Normal, 1, 1), &alice),
    );
    queue
        .enqueue_carrying(1, rank_time(&sleeper), sleeper.clone(), not_before(10_000))
        .await
        .expect("enqueue_carrying");
    enqueue_all(queue, &[(2, &due)]).await;
    for now in [0, 9_999] {
        assert_eq!(
            queue.sleeping_until(&alice, 7, at(now)).await,
            Ok(Some(at(10_000))),
            "asked at {now}"
        );
    }
    assert_eq!(
        queue.sleeping_until(&alice, 7, at(10_000)).await,
        Ok(None),
        "due at its instant"
    );
    for (key, id) in [
        (alice.clone(), 8),
        (alice.clone(), 70),
        (MailboxKey::new("alice"), 7),
        (MailboxKey::new("alice").with_user("u2"), 7),
        (MailboxKey::new("mallory").with_user("u1"), 7),
    ] {
        assert_eq!(
            queue.sleeping_until(&key, id, at(0)).await,
            Ok(None),
            "{key:?} {id}"
        );
    }
    assert_eq!(queue.remove_task(&alice, 7).await, Ok(Some(sleeper)));
    assert_eq!(queue.sleeping_until(&alice, 7, at(0)).await, Ok(None));
    assert_eq!(
        claim(queue, NODE_A, within(only(Cpu, 4)), 20_000)
            .await
            .map(|lease| lease.entry),
        Some(2),
        "only the due task is left"
    );
}

/// A claim retried after a failed run sleeps out its backoff in the queue: it says until when
/// under its key and id, no node claims it before then, and it is claimed at its instant.
pub async fn a_retried_task_sleeps_out_its_backoff(queue: &dyn SharedQueue<Job>) {
    let alice = MailboxKey::new("alice");
    let task = under(cpu(7, Normal, 0, 1), &alice);
    enqueue_all(queue, &[(1, &task)]).await;
    let lease = claim(queue, NODE_A, within(only(Cpu, 1)), 0).await;
    let lease = lease.expect("claimed");
    queue
        .retry(NODE_A, lease.claim(), at(5_000), "flaky".into())
        .await
        .expect("retry");
    assert_eq!(
        queue.sleeping_until(&alice, 7, at(100)).await,
        Ok(Some(at(5_000)))
    );
    assert_eq!(
        claim(queue, NODE_B, within(only(Cpu, 1)), 4_999).await,
        None
    );
    let woken = claim(queue, NODE_B, within(only(Cpu, 1)), 5_000).await;
    assert_eq!(
        woken.map(|lease| (lease.entry, lease.attempt)),
        Some((1, 2))
    );
    assert_eq!(queue.sleeping_until(&alice, 7, at(100)).await, Ok(None));
}

/// A task parked with a trace ([`SharedQueue::enqueue_carrying`]) hands it to every claim
/// of it, by any node: its first (in a batch, beside a task parked without one, which hands
/// none), the one after a retry, the one after a hand-back and the one after its lease ran
/// out and it was rescued.
pub async fn a_parked_trace_comes_back_with_every_claim(queue: &dyn SharedQueue<Job>) {
    let (task_traced, plain) = (cpu(1, High, 0, 1), cpu(2, Normal, 0, 1));
    queue
        .enqueue_carrying(1, rank_time(&task_traced), task_traced.clone(), traced())
        .await
        .expect("enqueue_carrying");
    enqueue_all(queue, &[(2, &plain)]).await;
    let trace = traced().trace;

    let first = queue
        .claim_batch(NODE_A, &within(only(Cpu, 2)), 2, LEASE, at(0))
        .await
        .expect("claim_batch");
    let seen: Vec<_> = first
        .iter()
        .map(|lease| (lease.entry, lease.trace))
        .collect();
    assert_eq!(seen, vec![(1, trace), (2, None)], "the first claims");
    assert_eq!(first[0].task, task_traced, "the task as parked");
    queue
        .settle(NODE_A, first_claim(2), Settlement::Done)
        .await
        .expect("settle the plain task");

    queue
        .retry(NODE_A, first_claim(1), at(500), "again".into())
        .await
        .expect("retry");
    let retried = claim(queue, NODE_B, within(only(Cpu, 1)), 500).await;
    let retried = retried.expect("claimed after its retry");
    assert_eq!(
        (retried.attempt, retried.trace),
        (2, trace),
        "after a retry"
    );

    let released = queue
        .release_many(NODE_B, vec![retried.claim()], at(600))
        .await;
    assert_eq!(released, vec![Ok(())]);
    let handed_back = claim(queue, NODE_A, within(only(Cpu, 1)), 600).await;
    let handed_back = handed_back.expect("claimed after its hand-back");
    assert_eq!(handed_back.trace, trace, "after a hand-back");

    assert_eq!(rescue(queue, 600 + LEASE_MS).await, 1, "its lease ran out");
    let rescued = claim(queue, NODE_B, within(only(Cpu, 1)), 100_000).await;
    let rescued = rescued.expect("claimed after its rescue");
    assert_eq!((rescued.entry, rescued.trace), (1, trace), "after a rescue");
}

/// A group park ([`SharedQueue::enqueue_many`]) keeps what each task carries: a traced
/// scheduled start is claimed by no node before its instant and then with its trace, beside
/// a plain task and a traced one claimable at once.
pub async fn a_traced_scheduled_start_keeps_both_in_a_group_park(queue: &dyn SharedQueue<Job>) {
    let both = Carried {
        not_before_ms: Some(at(5_000)),
        ..traced()
    };
    let group = vec![
        (1, at(0), cpu(1, Critical, 0, 1), both),
        (2, at(1), cpu(2, Normal, 1, 1), Carried::default()),
        (3, at(2), cpu(3, Normal, 2, 1), traced()),
    ];
    let parked = queue.enqueue_many(group).await;
    assert_eq!(parked, vec![Ok(()), Ok(()), Ok(())]);
    assert_counts(queue, 3, 0, "a group park").await;

    let now = queue
        .claim_batch(NODE_A, &within(only(Cpu, 4)), 4, LEASE, at(0))
        .await
        .expect("claim_batch");
    let seen: Vec<_> = now.iter().map(|lease| (lease.entry, lease.trace)).collect();
    let trace = traced().trace;
    assert_eq!(seen, vec![(2, None), (3, trace)], "before the instant");
    let due = claim(queue, NODE_B, within(only(Cpu, 4)), 5_000).await;
    let due = due.map(|lease| (lease.entry, lease.attempt, lease.trace));
    assert_eq!(due, Some((1, 1, trace)), "at its instant, with its trace");
}

// ---------------------------------------------------------------------------------------------
// Cases of the deadline order
// ---------------------------------------------------------------------------------------------

/// A deadline-ordered queue's tasks of one priority come earliest deadline first, those
/// without one after, by admission among equal deadlines; priority still comes first, and
/// a task that does not fit is skipped as usual.
pub async fn the_earliest_deadline_is_claimed_first_and_none_last(queue: &dyn SharedQueue<Job>) {
    assert_eq!(
        queue.order(),
        prometheus_parking_lot::core::QueueOrder::Deadline
    );
    let tasks = [
        task(1, Normal, 0, Cpu, 1, None),
        task(2, Normal, 1, Cpu, 1, Some(900)),
        task(3, Normal, 2, Cpu, 1, Some(500)),
        task(4, High, 3, Cpu, 1, Some(5_000)),
        task(5, Normal, 4, Cpu, 1, Some(500)),
        task(6, Normal, 5, Cpu, 9, Some(100)),
        task(7, Low, 6, Cpu, 1, Some(1)),
    ];
    let entries: Vec<_> = tasks.iter().map(|task| (task.meta.id, task)).collect();
    enqueue_all(queue, &entries).await;

    let mut claimed = Vec::new();
    while let Some(entry) = best_fit(queue, within(only(Cpu, 4))).await {
        claimed.push(entry);
        assert!(claimed.len() <= tasks.len(), "claimed more than was parked");
    }
    assert_eq!(claimed, [4, 3, 5, 2, 1, 7], "task 6 (9 units) never fits 4");
    assert_counts(queue, 1, 6, "claiming all that fits").await;
    let big = best_fit(queue, within(only(Cpu, 9))).await;
    assert_eq!(big, Some(6));
}

/// A batch claim takes the rank-order prefix that fits together, in the deadline order.
pub async fn a_batch_claim_takes_the_earliest_deadlines_that_fit_together(
    queue: &dyn SharedQueue<Job>,
) {
    let tasks = [
        task(1, Normal, 0, Cpu, 2, Some(300)),
        task(2, Normal, 1, Cpu, 1, Some(100)),
        task(3, Normal, 2, Cpu, 1, None),
        task(4, Normal, 3, Cpu, 1, Some(200)),
    ];
    let entries: Vec<_> = tasks.iter().map(|task| (task.meta.id, task)).collect();
    enqueue_all(queue, &entries).await;

    let leases = queue
        .claim_batch(NODE_A, &within(only(Cpu, 4)), 3, LEASE, at(0))
        .await
        .expect("claim_batch");
    let taken: Vec<_> = leases.iter().map(|lease| lease.entry).collect();
    assert_eq!(
        taken,
        [2, 4, 1],
        "due at 100, 200, 300; the one without a deadline waits"
    );
    assert_counts(queue, 1, 3, "a batch claim").await;
}

/// A rank bound carries a deadline: a task due sooner is ahead of it however late it was
/// admitted, one due later is behind it however early.
pub async fn a_rank_bound_admits_by_deadline(queue: &dyn SharedQueue<Job>) {
    let early_due_later = task(1, Normal, 0, Cpu, 1, Some(800));
    let late_due_sooner = task(2, Normal, 50, Cpu, 1, Some(400));
    enqueue_all(queue, &[(1, &early_due_later), (2, &late_due_sooner)]).await;
    let bound = RankBound {
        priority: Normal,
        deadline_ms: Some(at(500)),
        rank_time_ms: at(10),
        entry: 9,
    };

    let first = best_fit(queue, within_bound(only(Cpu, 4), bound)).await;
    assert_eq!(first, Some(2), "due at 400: ahead of the bound due at 500");
    let second = best_fit(queue, within_bound(only(Cpu, 4), bound)).await;
    assert_eq!(
        second, None,
        "due at 800: behind the bound, though admitted first"
    );
    let unbounded = best_fit(queue, within(only(Cpu, 4))).await;
    assert_eq!(unbounded, Some(1));
}

/// The starvation guard reserves the oldest aged task, the one that waited longest, under
/// the deadline order too: while it does not fit, only tasks due before it are claimed.
pub async fn an_aged_task_reserves_by_deadline(queue: &dyn SharedQueue<Job>) {
    let big_due_soon = task(1, Normal, 10, Cpu, 8, Some(300));
    let big_oldest = task(2, Normal, 0, Cpu, 8, Some(600));
    let small_due_sooner = task(3, Normal, 100, Cpu, 1, Some(500));
    let small_due_later = task(4, Normal, 100, Cpu, 1, Some(900));
    enqueue_all(
        queue,
        &[
            (1, &big_due_soon),
            (2, &big_oldest),
            (3, &small_due_sooner),
            (4, &small_due_later),
        ],
    )
    .await;
    let aged = |free: u32| FitQuery {
        starvation: Some(StarvationRule {
            capacity: only(Cpu, 8),
            parked_before_ms: at(50),
        }),
        ..within(only(Cpu, free))
    };

    let ahead = best_fit(queue, aged(4)).await;
    assert_eq!(
        ahead,
        Some(3),
        "due at 500: ahead of the reserved task 2 (due at 600)"
    );
    let held = best_fit(queue, aged(4)).await;
    assert_eq!(
        held, None,
        "task 2 (the oldest aged) reserves; task 4 is behind it"
    );
    let fits = best_fit(queue, aged(8)).await;
    assert_eq!(
        fits,
        Some(1),
        "the reservation fits: the earliest deadline that fits goes"
    );
}
