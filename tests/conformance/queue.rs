//! The [`TaskQueue`] conformance suite: every behaviour the scheduler relies on, checked with
//! exact values, orders, counts and error variants.
//!
//! Each case takes an empty queue and tests one behaviour; [`run_all`] runs every case, each
//! against a fresh queue from the backend's factory. Backends that retry failed tasks must be
//! built with retries off for this suite: it expects `fail` to end a claim for good.

use std::future::Future;

use prometheus_parking_lot::core::scheduling::RankKey;
use prometheus_parking_lot::core::{
    Capacity, FitQuery, QueueCounts, QueueError, ScheduledTask, TaskMetadata, TaskQueue,
};
use prometheus_parking_lot::util::serde::{
    MailboxKey, Priority, ResourceCost, ResourceKind, TaskId,
};

use super::{Job, EPOCH_MS};

use Priority::{Critical, High, Low, Normal};
use ResourceKind::{Cpu, GpuVram, Io, Mixed};

/// Runs every case of the suite, each against a fresh queue from `fresh`, printing the case's
/// name first so a failure names it.
pub async fn run_all<F, Fut>(fresh: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Box<dyn TaskQueue<Job>>>,
{
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            let queue = fresh().await;
            eprintln!("queue conformance [{}]: {}", queue.backend(), stringify!($case));
            $case(&*queue).await;
        )*};
    }
    run!(
        claim_returns_the_parked_task_unchanged,
        duplicate_ids_are_refused,
        best_fit_claims_in_rank_order,
        best_fit_only_claims_kinds_with_free_units,
        best_fit_skips_ahead_to_a_smaller_task,
        best_fit_returns_none_when_nothing_fits,
        rank_bound_excludes_tasks_ranked_behind_it,
        complete_and_fail_end_a_claim_once,
        release_reparks_with_the_same_rank,
        remove_takes_a_parked_task_out,
        expire_removes_exactly_the_due_tasks,
        counts_follow_every_step,
        backend_is_named,
    );
}

// ---------------------------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------------------------

/// A task with a [`Job`] payload. `created` and `deadline` are milliseconds after
/// [`EPOCH_MS`]. The task is addressed to a mailbox so the round trip covers every field.
pub fn task(
    id: TaskId,
    priority: Priority,
    created: u64,
    kind: ResourceKind,
    units: u32,
    deadline: Option<u64>,
) -> ScheduledTask<Job> {
    let mailbox = MailboxKey::new("acme")
        .with_user("ada")
        .with_session(format!("session-{id}"));
    let mut meta = TaskMetadata::new(id, ResourceCost::new(kind, units))
        .with_priority(priority)
        .with_mailbox(mailbox);
    meta.created_at_ms = u128::from(at(created));
    meta.deadline_ms = deadline.map(|deadline| u128::from(at(deadline)));
    ScheduledTask::new(meta, Job::for_task(id))
}

/// A task costing `units` CPU units, without deadline.
fn cpu(id: TaskId, priority: Priority, created: u64, units: u32) -> ScheduledTask<Job> {
    task(id, priority, created, Cpu, units, None)
}

/// The absolute time `offset` milliseconds after [`EPOCH_MS`].
fn at(offset: u64) -> u64 {
    EPOCH_MS + offset
}

/// The rank the scheduler gives `task`.
fn rank(task: &ScheduledTask<Job>) -> RankKey {
    let created = u64::try_from(task.meta.created_at_ms).expect("test times fit u64");
    RankKey::new(task.meta.priority, created, task.meta.id)
}

/// Free units of one kind only.
fn only(kind: ResourceKind, units: u32) -> Capacity {
    Capacity::uniform(0).with(kind, units)
}

/// A fit query without rank bound.
fn within(free: Capacity) -> FitQuery {
    FitQuery {
        free,
        ranked_at_or_ahead_of: None,
    }
}

/// A fit query bounded to tasks ranked at or ahead of `bound`.
fn within_bound(free: Capacity, bound: &ScheduledTask<Job>) -> FitQuery {
    FitQuery {
        free,
        ranked_at_or_ahead_of: Some(rank(bound)),
    }
}

async fn park_all(queue: &dyn TaskQueue<Job>, tasks: &[&ScheduledTask<Job>]) {
    for task in tasks {
        if let Err(error) = queue.park((*task).clone()).await {
            panic!("parking task {} failed: {error}", task.meta.id);
        }
    }
}

/// The id of the task `claim_best_fit` claims for `query`.
async fn best_fit(queue: &dyn TaskQueue<Job>, query: FitQuery) -> Option<TaskId> {
    let claimed = queue.claim_best_fit(&query).await.expect("claim_best_fit");
    claimed.map(|task| task.meta.id)
}

async fn assert_counts(queue: &dyn TaskQueue<Job>, parked: usize, claimed: usize, step: &str) {
    let counts = queue.counts().await.expect("counts");
    assert_eq!(
        counts,
        QueueCounts { parked, claimed },
        "counts after {step}"
    );
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

/// `claim(id)` returns the parked task as it was parked, once; unknown ids give `None`.
pub async fn claim_returns_the_parked_task_unchanged(queue: &dyn TaskQueue<Job>) {
    let parked = task(7, High, 10, GpuVram, 300, Some(60_000));
    park_all(queue, &[&parked]).await;
    assert_counts(queue, 1, 0, "park").await;

    let claimed = queue.claim(7).await.expect("claim");
    assert_eq!(
        claimed,
        Some(parked),
        "payload and metadata survive parking"
    );
    assert_counts(queue, 0, 1, "claim").await;

    assert_eq!(
        queue.claim(7).await.expect("claim again"),
        None,
        "claimed twice"
    );
    assert_eq!(
        queue.claim(8).await.expect("claim unknown"),
        None,
        "unknown id"
    );
    assert_counts(queue, 0, 1, "claims that found nothing").await;
}

/// Parking an id that is parked or claimed fails with `Duplicate` and changes nothing.
pub async fn duplicate_ids_are_refused(queue: &dyn TaskQueue<Job>) {
    let original = cpu(1, Normal, 0, 1);
    let impostor = task(1, Critical, 5, GpuVram, 9, Some(100));
    park_all(queue, &[&original]).await;

    for duplicate in [&original, &impostor] {
        let refused = queue.park(duplicate.clone()).await;
        assert_eq!(
            refused,
            Err(QueueError::Duplicate(1)),
            "parked id parked again"
        );
    }
    assert_counts(queue, 1, 0, "refused parks").await;
    assert_eq!(queue.claim(1).await.expect("claim"), Some(original.clone()));

    for duplicate in [&original, &impostor] {
        let refused = queue.park(duplicate.clone()).await;
        assert_eq!(
            refused,
            Err(QueueError::Duplicate(1)),
            "claimed id parked again"
        );
    }
    assert_counts(queue, 0, 1, "refused parks of a claimed id").await;
    let nothing = best_fit(queue, within(Capacity::uniform(u32::MAX))).await;
    assert_eq!(nothing, None, "a refused park must not park anything");
}

/// Claims with room for everything come back in rank order across kinds: priority first
/// (Critical first), then older `created_at_ms`, then smaller id.
pub async fn best_fit_claims_in_rank_order(queue: &dyn TaskQueue<Job>) {
    let tasks = [
        task(99, Low, 0, Cpu, 7, None),
        task(3, Normal, 900, GpuVram, 4_000, None),
        task(12, High, 100, Io, 2, None),
        task(2, Low, 0, Mixed, 1, None),
        task(40, Critical, 500, GpuVram, 16_000, None),
        task(5, Normal, 10, Cpu, 1, None),
        task(11, High, 100, Mixed, 3, None),
        task(30, High, 50, Cpu, 8, None),
    ];
    park_all(queue, &tasks.iter().collect::<Vec<_>>()).await;

    let mut claimed = Vec::new();
    while let Some(id) = best_fit(queue, within(Capacity::uniform(16_000))).await {
        claimed.push(id);
        assert!(claimed.len() <= tasks.len(), "claimed more than was parked");
    }
    assert_eq!(claimed, [40, 30, 11, 12, 5, 3, 2, 99]);
    assert_counts(queue, 0, tasks.len(), "claiming everything").await;
}

/// A task is claimed only against free units of its own kind; kinds with 0 free never come
/// back, however well ranked, and free units of other kinds do not help.
pub async fn best_fit_only_claims_kinds_with_free_units(queue: &dyn TaskQueue<Job>) {
    let gpu = task(1, Critical, 0, GpuVram, 1, None);
    let io = task(2, High, 0, Io, 1, None);
    let small_cpu = cpu(3, Low, 0, 4);
    let large_cpu = cpu(4, Normal, 0, 5);
    park_all(queue, &[&gpu, &io, &small_cpu, &large_cpu]).await;

    let cpu_and_mixed = only(Cpu, 4).with(Mixed, 100);
    assert_eq!(best_fit(queue, within(cpu_and_mixed)).await, Some(3));
    assert_eq!(best_fit(queue, within(cpu_and_mixed)).await, None);
    assert_eq!(best_fit(queue, within(only(Io, 1))).await, Some(2));
    assert_eq!(best_fit(queue, within(only(Cpu, 5))).await, Some(4));
    assert_eq!(best_fit(queue, within(Capacity::uniform(0))).await, None);
    assert_counts(queue, 1, 3, "claims by kind").await;
    assert_eq!(best_fit(queue, within(only(GpuVram, 1))).await, Some(1));
}

/// Skip-ahead: better-ranked tasks that do not fit are passed over for the best-ranked one
/// that does; a task costing exactly the free units fits.
pub async fn best_fit_skips_ahead_to_a_smaller_task(queue: &dyn TaskQueue<Job>) {
    let big = task(1, Critical, 0, GpuVram, 10, None);
    let medium = task(2, High, 0, GpuVram, 6, None);
    let small = task(3, Low, 0, GpuVram, 2, None);
    let smaller_but_younger = task(4, Low, 5, GpuVram, 1, None);
    park_all(queue, &[&big, &medium, &small, &smaller_but_younger]).await;

    let five = within(only(GpuVram, 5));
    assert_eq!(best_fit(queue, five).await, Some(3), "skips 1 and 2");
    assert_eq!(best_fit(queue, five).await, Some(4));
    assert_eq!(best_fit(queue, five).await, None);
    assert_eq!(best_fit(queue, within(only(GpuVram, 6))).await, Some(2));
    assert_eq!(best_fit(queue, within(only(GpuVram, 10))).await, Some(1));
    assert_counts(queue, 0, 4, "claiming everything").await;
}

/// `claim_best_fit` gives `None`, and claims nothing, when no parked task fits.
pub async fn best_fit_returns_none_when_nothing_fits(queue: &dyn TaskQueue<Job>) {
    let everything = within(Capacity::uniform(u32::MAX));
    assert_eq!(best_fit(queue, everything).await, None, "empty queue");

    park_all(queue, &[&cpu(1, High, 0, 3), &cpu(2, Low, 0, 4)]).await;
    assert_eq!(best_fit(queue, within(only(Cpu, 2))).await, None);
    assert_eq!(best_fit(queue, within(only(GpuVram, 100))).await, None);
    assert_counts(queue, 2, 0, "misses").await;
    assert_eq!(best_fit(queue, within(only(Cpu, 3))).await, Some(1));
}

/// With a rank bound, only tasks ranked at or ahead of the bound are claimed (the bound task
/// itself included), whichever part of the rank decides.
pub async fn rank_bound_excludes_tasks_ranked_behind_it(queue: &dyn TaskQueue<Job>) {
    let too_big = cpu(1, Critical, 0, 10);
    let bound = cpu(5, Normal, 200, 8);
    let behind_by_id = cpu(6, Normal, 200, 1);
    let behind_by_age = cpu(7, Normal, 300, 1);
    let behind_by_priority = cpu(8, Low, 0, 1);
    park_all(
        queue,
        &[
            &too_big,
            &bound,
            &behind_by_id,
            &behind_by_age,
            &behind_by_priority,
        ],
    )
    .await;

    let five = within_bound(only(Cpu, 5), &bound);
    assert_eq!(best_fit(queue, five).await, None, "only tasks behind fit");
    assert_counts(queue, 5, 0, "a bounded miss").await;

    let ahead_by_id = cpu(4, Normal, 200, 1);
    let ahead_by_age = cpu(3, Normal, 199, 1);
    let ahead_by_priority = cpu(2, High, 900, 1);
    for ahead in [&ahead_by_id, &ahead_by_age, &ahead_by_priority] {
        park_all(queue, &[ahead]).await;
        assert_eq!(best_fit(queue, five).await, Some(ahead.meta.id));
    }
    assert_eq!(best_fit(queue, five).await, None);

    let eight = within_bound(only(Cpu, 8), &bound);
    assert_eq!(
        best_fit(queue, eight).await,
        Some(5),
        "the bound task itself"
    );
    assert_eq!(best_fit(queue, eight).await, None);

    let at_six = within_bound(only(Cpu, 5), &behind_by_id);
    assert_eq!(best_fit(queue, at_six).await, Some(6));
    assert_eq!(best_fit(queue, within(only(Cpu, 5))).await, Some(7));
    assert_counts(queue, 2, 6, "bounded claims").await;
}

/// `complete` and `fail` end a claim exactly once; on anything not claimed they give
/// `NotClaimed` and leave parked tasks parked.
pub async fn complete_and_fail_end_a_claim_once(queue: &dyn TaskQueue<Job>) {
    park_all(queue, &[&cpu(1, Normal, 0, 1), &cpu(2, Normal, 1, 1)]).await;
    park_all(queue, &[&cpu(3, Normal, 2, 1)]).await;
    for id in [1, 2] {
        assert!(queue.claim(id).await.expect("claim").is_some());
    }
    assert_counts(queue, 1, 2, "two claims").await;

    assert_eq!(queue.complete(1).await, Ok(()));
    assert_counts(queue, 1, 1, "complete").await;
    assert_eq!(queue.complete(1).await, Err(QueueError::NotClaimed(1)));
    assert_eq!(queue.fail(1, "late").await, Err(QueueError::NotClaimed(1)));

    assert_eq!(queue.fail(2, "boom").await, Ok(()));
    assert_counts(queue, 1, 0, "fail").await;
    assert_eq!(queue.fail(2, "boom").await, Err(QueueError::NotClaimed(2)));
    assert_eq!(queue.complete(2).await, Err(QueueError::NotClaimed(2)));

    assert_eq!(queue.complete(3).await, Err(QueueError::NotClaimed(3)));
    assert_eq!(
        queue.fail(3, "parked").await,
        Err(QueueError::NotClaimed(3))
    );
    assert_eq!(queue.complete(404).await, Err(QueueError::NotClaimed(404)));
    assert_eq!(
        queue.fail(404, "unknown").await,
        Err(QueueError::NotClaimed(404))
    );
    assert_counts(queue, 1, 0, "refused completions").await;
    assert_eq!(best_fit(queue, within(only(Cpu, 1))).await, Some(3));
}

/// `release` parks a claimed task again with its original rank; anything not claimed gives
/// `NotClaimed`.
pub async fn release_reparks_with_the_same_rank(queue: &dyn TaskQueue<Job>) {
    let first = cpu(1, High, 10, 2);
    let second = cpu(2, High, 20, 2);
    let low = cpu(3, Normal, 0, 1);
    park_all(queue, &[&first, &second, &low]).await;
    let ten = within(only(Cpu, 10));

    let claimed = queue.claim_best_fit(&ten).await.expect("claim");
    assert_eq!(claimed.as_ref(), Some(&first));
    assert_counts(queue, 2, 1, "claim").await;
    assert_eq!(queue.release(first.clone()).await, Ok(()));
    assert_counts(queue, 3, 0, "release").await;

    let reclaimed = queue.claim_best_fit(&ten).await.expect("claim again");
    assert_eq!(reclaimed.as_ref(), Some(&first), "still ahead of task 2");
    assert_eq!(queue.release(first.clone()).await, Ok(()));
    assert_eq!(
        queue.release(first.clone()).await,
        Err(QueueError::NotClaimed(1)),
        "released twice"
    );
    assert_eq!(
        queue.release(low.clone()).await,
        Err(QueueError::NotClaimed(3))
    );
    let unknown = cpu(404, Normal, 0, 1);
    assert_eq!(
        queue.release(unknown).await,
        Err(QueueError::NotClaimed(404))
    );
    assert_counts(queue, 3, 0, "refused releases").await;
    assert_eq!(queue.claim(1).await.expect("claim by id"), Some(first));
}

/// `remove` takes a parked task out for good; it gives `None` for unknown and claimed ids.
pub async fn remove_takes_a_parked_task_out(queue: &dyn TaskQueue<Job>) {
    let gone = cpu(1, Critical, 0, 1);
    let kept = cpu(2, Low, 0, 1);
    park_all(queue, &[&gone, &kept]).await;

    assert_eq!(queue.remove(1).await.expect("remove"), Some(gone));
    assert_counts(queue, 1, 0, "remove").await;
    assert_eq!(queue.remove(1).await.expect("remove again"), None);
    assert_eq!(queue.remove(404).await.expect("remove unknown"), None);
    assert_eq!(queue.claim(1).await.expect("claim removed"), None);
    assert_eq!(best_fit(queue, within(only(Cpu, 1))).await, Some(2));

    assert_eq!(queue.remove(2).await.expect("remove claimed"), None);
    assert_counts(queue, 0, 1, "remove of a claimed task").await;
    assert_eq!(queue.complete(2).await, Ok(()), "still claimed");
}

/// `expire(now)` removes exactly the parked tasks due at or before `now`, earliest deadline
/// first; tasks without deadline, with later deadlines, or claimed stay.
pub async fn expire_removes_exactly_the_due_tasks(queue: &dyn TaskQueue<Job>) {
    let deadline = |id, deadline| task(id, Normal, 0, Cpu, 1, deadline);
    park_all(
        queue,
        &[
            &deadline(1, Some(500)),
            &deadline(2, Some(300)),
            &deadline(3, Some(1_000)),
            &deadline(4, None),
            &deadline(5, Some(501)),
            &deadline(6, Some(200)),
        ],
    )
    .await;
    assert!(queue.claim(6).await.expect("claim").is_some());

    assert_eq!(queue.expire(at(299)).await, Ok(vec![]));
    assert_eq!(
        queue.expire(at(500)).await,
        Ok(vec![2, 1]),
        "due at or before"
    );
    assert_counts(queue, 3, 1, "expire").await;
    assert_eq!(queue.expire(at(500)).await, Ok(vec![]), "expired once");
    assert_eq!(queue.claim(1).await.expect("claim expired"), None);

    assert_eq!(queue.expire(at(1_000_000)).await, Ok(vec![5, 3]));
    assert_counts(queue, 1, 1, "expiring the rest").await;
    assert_eq!(best_fit(queue, within(only(Cpu, 1))).await, Some(4));
    assert_eq!(
        queue.complete(6).await,
        Ok(()),
        "claimed tasks never expire"
    );
}

/// `counts` follows tasks through every operation.
pub async fn counts_follow_every_step(queue: &dyn TaskQueue<Job>) {
    assert_counts(queue, 0, 0, "nothing").await;
    let tasks = [
        task(1, Normal, 0, Cpu, 1, None),
        task(2, Normal, 1, Cpu, 1, None),
        task(3, Normal, 2, Cpu, 1, None),
        task(4, Normal, 3, Cpu, 1, Some(100)),
    ];
    park_all(queue, &tasks.iter().collect::<Vec<_>>()).await;
    assert_counts(queue, 4, 0, "four parks").await;
    let first = queue.claim(1).await.expect("claim").expect("parked");
    assert_counts(queue, 3, 1, "claim").await;
    assert_eq!(best_fit(queue, within(only(Cpu, 1))).await, Some(2));
    assert_counts(queue, 2, 2, "best fit").await;
    queue.complete(2).await.expect("complete");
    assert_counts(queue, 2, 1, "complete").await;
    queue.release(first).await.expect("release");
    assert_counts(queue, 3, 0, "release").await;
    queue.remove(3).await.expect("remove").expect("parked");
    assert_counts(queue, 2, 0, "remove").await;
    assert_eq!(queue.expire(at(100)).await, Ok(vec![4]));
    assert_counts(queue, 1, 0, "expire").await;
    assert!(queue.claim(1).await.expect("claim").is_some());
    assert_counts(queue, 0, 1, "claim after release").await;
    queue.fail(1, "boom").await.expect("fail");
    assert_counts(queue, 0, 0, "fail").await;
}

/// `backend` names the backend for logs.
pub async fn backend_is_named(queue: &dyn TaskQueue<Job>) {
    let name = queue.backend();
    assert!(!name.trim().is_empty(), "backend name {name:?}");
}
