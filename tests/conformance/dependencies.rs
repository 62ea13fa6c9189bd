//! The dependencies suite: what a pool promises for a task that names tasks it depends on
//! (`SubmitOptions::depends_on`), on every queue that supports them, through the public
//! face. A queue that does not support them must refuse such a submission naming the
//! queues that do ([`refused_where_unsupported`]).
//!
//! Each case takes a fresh pool from the backend's factory, built around the suite's
//! executor ([`Steps`]): a payload says whether the task returns at once, waits for the
//! suite's gate, or waits and then fails.

use std::future::Future;
use std::time::Duration;

use prometheus_parking_lot::core::{
    DependencyError, PoolClient, PoolError, ScheduledTask, SubmitOptions, TaskMetadata, TaskStatus,
    TaskStep,
};
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, TaskId};
use prometheus_parking_lot::{ResourcePool, TaskExecutor};
use tokio::sync::{broadcast, mpsc, watch};

/// A payload that waits for the gate, then returns 1.
pub const WAIT: u64 = u64::MAX - 1;
/// A payload that waits for the gate, then fails (panics).
pub const WAIT_THEN_FAIL: u64 = u64::MAX;

/// The suite's executor: reports each start, then does what the payload says (any other
/// payload is returned at once).
#[derive(Clone)]
pub struct Steps {
    started: mpsc::UnboundedSender<TaskId>,
    gate: watch::Receiver<bool>,
}

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Steps {
    async fn execute(&self, payload: u64, meta: TaskMetadata) -> u64 {
        let _ = self.started.send(meta.id);
        if payload == WAIT || payload == WAIT_THEN_FAIL {
            let mut gate = self.gate.clone();
            let _ = gate.wait_for(|open| *open).await;
        }
        if payload == WAIT_THEN_FAIL {
            panic!("step {} failed", meta.id);
        }
        if payload == WAIT {
            return 1;
        }
        payload
    }
}

/// A pool under test: its client, and whatever keeps it running (the pool itself, or the
/// supervisor and queue of a pool started from a spec), dropped after the case.
pub struct Subject {
    pub client: PoolClient<u64, u64>,
    pub owner: Box<dyn std::any::Any + Send>,
}

impl From<ResourcePool<u64, u64, Steps>> for Subject {
    fn from(pool: ResourcePool<u64, u64, Steps>) -> Self {
        Self {
            client: pool.client().clone(),
            owner: Box::new(pool),
        }
    }
}

/// A pool under test, its executor's reports and its gate.
pub struct Lab {
    pub pool: PoolClient<u64, u64>,
    _owner: Box<dyn std::any::Any + Send>,
    started: mpsc::UnboundedReceiver<TaskId>,
    gate: watch::Sender<bool>,
}

/// The tenant every case submits under (each task in a session of its own).
const TENANT: &str = "planner";

/// Task `id` of `tenant` with `payload`, one CPU unit, in a session of its own.
pub fn step(tenant: &str, id: TaskId, payload: u64) -> ScheduledTask<u64> {
    let key = MailboxKey::new(tenant).with_session(format!("step-{id}"));
    let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key);
    ScheduledTask::new(meta, payload)
}

/// Options naming `parents`.
pub fn after(parents: &[TaskId]) -> SubmitOptions {
    SubmitOptions::default().with_depends_on(parents.iter().copied())
}

impl Lab {
    async fn submit(&self, id: TaskId, payload: u64, options: SubmitOptions) -> MailboxKey {
        self.pool
            .submit(step(TENANT, id, payload), options)
            .await
            .unwrap_or_else(|error| panic!("task {id} admitted: {error}"))
    }

    async fn refusal(&self, task: ScheduledTask<u64>, options: SubmitOptions) -> DependencyError {
        match self.pool.submit(task, options).await {
            Err(PoolError::Dependency(refusal)) => *refusal,
            other => panic!("expected a dependency refusal, got {other:?}"),
        }
    }

    async fn outcome(&self, key: &MailboxKey) -> Result<u64, PoolError> {
        self.pool.retrieve(key, Duration::from_secs(10)).await
    }

    async fn next_start(&mut self) -> TaskId {
        tokio::time::timeout(Duration::from_secs(10), self.started.recv())
            .await
            .expect("a task starts within 10 s")
            .expect("executor alive")
    }

    fn open_gate(&self) {
        let _ = self.gate.send(true);
    }

    /// Starts reported so far, without waiting.
    fn starts_so_far(&mut self) -> Vec<TaskId> {
        let mut starts = Vec::new();
        while let Ok(id) = self.started.try_recv() {
            starts.push(id);
        }
        starts
    }
}

/// Runs every case, each against a fresh pool from `fresh`, which builds one (at least 4
/// workers, 4 CPU units) around the executor it is given.
pub async fn run_all<F, Fut>(fresh: F)
where
    F: Fn(Steps) -> Fut,
    Fut: Future,
    Fut::Output: Into<Subject>,
{
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            eprintln!("dependencies conformance: {}", stringify!($case));
            $case(lab(&fresh).await).await;
        )*};
    }
    run!(
        a_child_is_held_until_every_parent_succeeded,
        a_parent_that_succeeded_already_counts_as_done,
        a_failed_parent_cancels_its_child_and_the_childs_children,
        a_child_that_runs_anyway_runs_after_a_failed_parent,
        a_cancelled_parent_cancels_its_child,
        a_held_child_expires_at_its_deadline_while_its_parent_runs,
        a_scheduled_child_starts_at_its_instant_after_its_parent,
        a_scheduled_child_past_its_instant_still_waits_for_its_parent,
        an_unknown_parent_is_refused,
        a_parent_of_another_tenant_is_refused,
        a_task_naming_itself_is_refused,
        a_parent_that_failed_already_is_refused_unless_the_child_runs_anyway,
    );
}

async fn lab<F, Fut>(fresh: &F) -> Lab
where
    F: Fn(Steps) -> Fut,
    Fut: Future,
    Fut::Output: Into<Subject>,
{
    let (started_tx, started) = mpsc::unbounded_channel();
    let (gate, gate_rx) = watch::channel(false);
    let subject: Subject = fresh(Steps {
        started: started_tx,
        gate: gate_rx,
    })
    .await
    .into();
    Lab {
        pool: subject.client,
        _owner: subject.owner,
        started,
        gate,
    }
}

/// An executor for a pool that only runs plain payloads (it returns each at once): what
/// [`refused_where_unsupported`] needs.
pub fn plain_steps() -> Steps {
    let (started, _) = mpsc::unbounded_channel();
    let (_, gate) = watch::channel(true);
    Steps { started, gate }
}

/// Asserts that `pool` (on a queue that does not support dependencies, built around
/// [`plain_steps`]) refuses a submission with dependencies, naming `queue` and the queues
/// that support them, and still takes the same task without them. (The one queue such a pool
/// can be built on, the table queue without `"dependencies": true`, is behind the
/// `postgres` feature.)
#[cfg(feature = "postgres")]
pub async fn refused_where_unsupported(pool: &PoolClient<u64, u64>, queue: &str) {
    let submit = |id, options| pool.submit(step(TENANT, id, id * 10), options);
    let outcome =
        |key: MailboxKey| async move { pool.retrieve(&key, Duration::from_secs(10)).await };
    let parent = submit(1, SubmitOptions::default()).await.expect("admitted");
    assert_eq!(outcome(parent).await, Ok(10));
    match submit(2, after(&[1])).await {
        Err(PoolError::Dependency(refusal)) => match *refusal {
            DependencyError::Unsupported {
                queue: named,
                supported,
            } => {
                assert!(named.contains(queue), "{named}");
                for queue in [
                    "memory",
                    "yaque",
                    "postgres",
                    "postgres_pgmq",
                    "in_memory_shared",
                ] {
                    assert!(supported.contains(queue), "{queue} in {supported}");
                }
            }
            other => panic!("expected Unsupported, got {other:?}"),
        },
        other => panic!("expected a dependency refusal, got {other:?}"),
    }
    let child = submit(2, SubmitOptions::default()).await.expect("admitted");
    assert_eq!(outcome(child).await, Ok(20));
}

async fn a_child_is_held_until_every_parent_succeeded(mut lab: Lab) {
    let mut events = lab.pool.events();
    lab.submit(1, WAIT, SubmitOptions::default()).await;
    lab.submit(2, WAIT, SubmitOptions::default()).await;
    let child = lab.submit(3, 30, after(&[1, 2])).await;
    // Its events say it is held, and for how many parents, wherever it is held.
    let held = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(event) if event.task_id == 3 => {
                    if let TaskStep::WaitsForParents { pending } = event.step {
                        return pending;
                    }
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("the feed closed"),
            }
        }
    })
    .await
    .expect("a WaitsForParents event for the child");
    assert_eq!(held, 2);
    let mut parents = [lab.next_start().await, lab.next_start().await];
    parents.sort_unstable();
    assert_eq!(parents, [1, 2]);
    let held = lab.pool.why_waiting(&child, 3).await.expect("live");
    let dependencies =
        prometheus_parking_lot::core::scheduling::WaitReason::Dependencies { pending: 2 };
    assert_eq!(held, Some(dependencies.clone()));
    let wait = lab.pool.waiting(&child, 3).await.expect("live");
    assert_eq!(wait.map(|wait| wait.reason), Some(dependencies));
    assert!(
        lab.starts_so_far().is_empty(),
        "the child waits although room is free"
    );
    lab.open_gate();
    assert_eq!(lab.next_start().await, 3);
    assert_eq!(lab.outcome(&child).await, Ok(30));
}

/// `after(parents)` that must not start before `at_ms` either.
fn after_and_not_before(parents: &[TaskId], at_ms: u128) -> SubmitOptions {
    let at_ms = u64::try_from(at_ms).expect("ms since the epoch fit 64 bits");
    after(parents).with_not_before(std::time::UNIX_EPOCH + Duration::from_millis(at_ms))
}

async fn a_scheduled_child_starts_at_its_instant_after_its_parent(mut lab: Lab) {
    use prometheus_parking_lot::util::clock::now_ms;
    let at_ms = now_ms() + 800;
    lab.submit(1, WAIT, SubmitOptions::default()).await;
    let child = lab.submit(2, 20, after_and_not_before(&[1], at_ms)).await;
    assert_eq!(lab.next_start().await, 1);
    // The parent succeeds at once, long before the child's instant.
    lab.open_gate();
    assert_eq!(lab.next_start().await, 2);
    let started_ms = now_ms();
    assert!(
        started_ms >= at_ms,
        "the child started {} ms before its instant",
        at_ms - started_ms
    );
    assert_eq!(lab.outcome(&child).await, Ok(20));
}

async fn a_scheduled_child_past_its_instant_still_waits_for_its_parent(mut lab: Lab) {
    use prometheus_parking_lot::util::clock::now_ms;
    lab.submit(1, WAIT, SubmitOptions::default()).await;
    let child = lab
        .submit(2, 20, after_and_not_before(&[1], now_ms() + 100))
        .await;
    assert_eq!(lab.next_start().await, 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        lab.starts_so_far().is_empty(),
        "the child's instant passed, but its parent still runs"
    );
    lab.open_gate();
    assert_eq!(lab.next_start().await, 2);
    assert_eq!(lab.outcome(&child).await, Ok(20));
}

async fn a_parent_that_succeeded_already_counts_as_done(mut lab: Lab) {
    let parent = lab.submit(1, 10, SubmitOptions::default()).await;
    assert_eq!(lab.outcome(&parent).await, Ok(10));
    assert_eq!(lab.next_start().await, 1);
    let child = lab.submit(2, 20, after(&[1])).await;
    assert_eq!(lab.outcome(&child).await, Ok(20));
}

async fn a_failed_parent_cancels_its_child_and_the_childs_children(mut lab: Lab) {
    let mut events = lab.pool.events();
    let parent = lab
        .submit(1, WAIT_THEN_FAIL, SubmitOptions::default())
        .await;
    lab.submit(2, WAIT, SubmitOptions::default()).await;
    let child = lab.submit(3, 30, after(&[1, 2])).await;
    let grandchild = lab.submit(4, 40, after(&[3])).await;
    lab.next_start().await;
    lab.next_start().await;
    lab.open_gate();
    assert!(matches!(
        lab.outcome(&parent).await,
        Err(PoolError::Failed(_))
    ));
    assert_eq!(lab.outcome(&child).await, Err(PoolError::Cancelled));
    assert_eq!(lab.outcome(&grandchild).await, Err(PoolError::Cancelled));
    assert!(lab.starts_so_far().is_empty(), "neither ran");
    // A shared queue keeps the failed parent as a dead letter for an operator, but not the
    // children it cancelled: they were told, and there is nothing to retry.
    if lab.pool.keeps_dead_letters() {
        let kept: Vec<TaskId> = lab
            .pool
            .dead_letters(0, 100)
            .await
            .expect("the dead letters")
            .iter()
            .map(|letter| letter.task_id)
            .collect();
        assert!(
            !kept.contains(&3) && !kept.contains(&4),
            "the cancelled children are kept as dead letters: {kept:?}"
        );
    }
    // Each says which parent ended how, then that it ended cancelled, wherever it was held.
    let mut ends: Vec<(TaskId, TaskStep)> = Vec::new();
    while let Ok(event) = events.try_recv() {
        if matches!(event.task_id, 3 | 4)
            && matches!(
                event.step,
                TaskStep::ParentFailed { .. } | TaskStep::Ended(_)
            )
        {
            ends.push((event.task_id, event.step));
        }
    }
    ends.sort_by_key(|(task, _)| *task);
    assert!(
        matches!(
            &ends[..],
            [
                (
                    3,
                    TaskStep::ParentFailed {
                        parent: 1,
                        status: TaskStatus::Failed(_)
                    }
                ),
                (3, TaskStep::Ended(TaskStatus::Cancelled)),
                (
                    4,
                    TaskStep::ParentFailed {
                        parent: 3,
                        status: TaskStatus::Cancelled
                    }
                ),
                (4, TaskStep::Ended(TaskStatus::Cancelled)),
            ]
        ),
        "{ends:?}"
    );
}

async fn a_child_that_runs_anyway_runs_after_a_failed_parent(mut lab: Lab) {
    let parent = lab
        .submit(1, WAIT_THEN_FAIL, SubmitOptions::default())
        .await;
    let cleanup = lab.submit(2, 20, after(&[1]).run_if_parents_fail()).await;
    assert_eq!(lab.next_start().await, 1);
    lab.open_gate();
    assert!(matches!(
        lab.outcome(&parent).await,
        Err(PoolError::Failed(_))
    ));
    assert_eq!(lab.next_start().await, 2);
    assert_eq!(lab.outcome(&cleanup).await, Ok(20));
}

async fn a_cancelled_parent_cancels_its_child(mut lab: Lab) {
    let parent = lab.submit(1, WAIT, SubmitOptions::default()).await;
    let child = lab.submit(2, 20, after(&[1])).await;
    assert_eq!(lab.next_start().await, 1);
    lab.pool.cancel(&parent, 1).await.expect("cancelled");
    assert_eq!(lab.outcome(&child).await, Err(PoolError::Cancelled));
    assert_eq!(lab.outcome(&parent).await, Err(PoolError::Cancelled));
    assert!(lab.starts_so_far().is_empty(), "the child never ran");
}

async fn a_held_child_expires_at_its_deadline_while_its_parent_runs(mut lab: Lab) {
    let parent = lab.submit(1, WAIT, SubmitOptions::default()).await;
    assert_eq!(lab.next_start().await, 1);
    let mut late = step(TENANT, 2, 20);
    late.meta.deadline_ms = Some(prometheus_parking_lot::util::clock::now_ms() + 300);
    let child = lab
        .pool
        .submit(late, after(&[1]))
        .await
        .expect("the child is admitted");
    let grandchild = lab.submit(3, 30, after(&[2])).await;
    // The parent still runs (the gate is shut): the child ends at its deadline, not when
    // the parent ends, and its own child with it.
    assert_eq!(lab.outcome(&child).await, Err(PoolError::Expired));
    assert_eq!(lab.outcome(&grandchild).await, Err(PoolError::Cancelled));
    lab.open_gate();
    assert_eq!(lab.outcome(&parent).await, Ok(1));
    assert!(lab.starts_so_far().is_empty(), "neither ran");
}

async fn an_unknown_parent_is_refused(lab: Lab) {
    lab.submit(1, WAIT, SubmitOptions::default()).await;
    let refusal = lab.refusal(step(TENANT, 2, 20), after(&[1, 99])).await;
    assert_eq!(refusal, DependencyError::UnknownParent { parent: 99 });
    assert!(refusal.to_string().contains("99"), "{refusal}");
    lab.open_gate();
}

async fn a_parent_of_another_tenant_is_refused(lab: Lab) {
    lab.submit(1, WAIT, SubmitOptions::default()).await;
    let refusal = lab.refusal(step("someone-else", 2, 20), after(&[1])).await;
    assert_eq!(refusal, DependencyError::OtherTenant { parent: 1 });
    lab.open_gate();
}

async fn a_task_naming_itself_is_refused(lab: Lab) {
    lab.submit(1, WAIT, SubmitOptions::default()).await;
    let refusal = lab.refusal(step(TENANT, 2, 20), after(&[1, 2])).await;
    assert_eq!(refusal, DependencyError::Cycle { task: 2 });
    lab.open_gate();
}

async fn a_parent_that_failed_already_is_refused_unless_the_child_runs_anyway(lab: Lab) {
    lab.open_gate();
    let parent = lab
        .submit(1, WAIT_THEN_FAIL, SubmitOptions::default())
        .await;
    assert!(matches!(
        lab.outcome(&parent).await,
        Err(PoolError::Failed(_))
    ));
    let refusal = lab.refusal(step(TENANT, 2, 20), after(&[1])).await;
    assert!(
        matches!(refusal, DependencyError::ParentEnded { parent: 1, .. }),
        "{refusal:?}"
    );
    let cleanup = lab.submit(2, 20, after(&[1]).run_if_parents_fail()).await;
    assert_eq!(lab.outcome(&cleanup).await, Ok(20));
}
