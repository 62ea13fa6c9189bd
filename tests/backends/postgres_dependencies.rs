//! What the Postgres queues (the table, and pgmq with its feature) add to the dependencies
//! contract, through their `SharedQueue` face: parents that end on several nodes at once, a
//! parent that ends while its child is being parked, a parent the rescue gives up on; and,
//! on the table, a call from a node of an earlier version.

use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::{
    Capacity, Carried, DependsOn, FitQuery, LetterEnd, QueueError, ScheduledTask, Settlement,
    SharedDependencies, SharedQueue, TaskMetadata, TaskStatus,
};
use prometheus_parking_lot::infra::postgres::RetryPolicy;
use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, TaskId};

use crate::postgres_backends::database;
use crate::postgres_pools::fresh_name;

const LEASE: Duration = Duration::from_secs(60);

fn everything() -> FitQuery {
    FitQuery::within(Capacity::uniform(u32::MAX))
}

fn step(id: TaskId) -> ScheduledTask<u64> {
    let key = MailboxKey::new("planner").with_session(format!("step-{id}"));
    ScheduledTask::new(
        TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone()),
        id,
    )
}

fn key(id: TaskId) -> MailboxKey {
    MailboxKey::new("planner").with_session(format!("step-{id}"))
}

fn after(parents: impl IntoIterator<Item = TaskId>, run_anyway: bool) -> DependsOn {
    DependsOn {
        parents: parents.into_iter().collect(),
        run_anyway,
    }
}

/// A queue that keeps dependencies, as each case needs it.
trait Kept: SharedQueue<u64> + SharedDependencies<u64> + 'static {}
impl<Q: SharedQueue<u64> + SharedDependencies<u64> + 'static> Kept for Q {}

async fn open(retry: RetryPolicy) -> PostgresQueue<u64> {
    tokio::task::spawn_blocking(move || {
        PostgresQueue::<u64>::open(&database(), "pl_queue_jobs", &fresh_name("deps"))
            .expect("open the queue")
            .with_dependencies()
            .expect("keep dependencies")
            .with_retry(retry)
    })
    .await
    .expect("opening does not panic")
}

/// Runs `case` on a pgmq queue of its own that keeps dependencies, then drops its queues.
#[cfg(feature = "pgmq")]
async fn on_pgmq<F, Fut>(retry: RetryPolicy, case: F)
where
    F: FnOnce(Arc<prometheus_parking_lot::infra::queue::pgmq::PgmqQueue<u64>>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
    let queue = tokio::task::spawn_blocking(move || {
        PgmqQueue::<u64>::open(&database(), &fresh_name("deps"))
            .expect("open the queue")
            .with_dependencies()
            .with_retry(retry)
    })
    .await
    .expect("opening does not panic");
    let levels = queue.pgmq_queues();
    case(Arc::new(queue)).await;
    crate::postgres_backends::drop_pgmq_queues(&levels).await;
}

/// Parks tasks `ids` (entry = id) and claims them all as `node`.
async fn running(
    queue: &dyn SharedQueue<u64>,
    node: &str,
    ids: impl IntoIterator<Item = TaskId>,
    now: u64,
) -> Vec<prometheus_parking_lot::core::Lease<u64>> {
    let ids: Vec<TaskId> = ids.into_iter().collect();
    let parked = queue
        .enqueue_many(
            ids.iter()
                .map(|&id| (id, now, step(id), Carried::default()))
                .collect(),
        )
        .await;
    assert!(parked.iter().all(Result::is_ok), "{parked:?}");
    let leases = queue
        .claim_batch(node, &everything(), ids.len(), LEASE, now)
        .await
        .expect("claim");
    assert_eq!(leases.len(), ids.len());
    leases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_in_settled_by_two_nodes_at_once_releases_its_child_once_the_last_parent_ends() {
    fan_in_settled_by_two_nodes(Arc::new(open(RetryPolicy::default()).await)).await;
}

#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_pgmq_a_fan_in_settled_by_two_nodes_at_once_releases_its_child_once_the_last_parent_ends(
) {
    on_pgmq(RetryPolicy::default(), fan_in_settled_by_two_nodes).await;
}

async fn fan_in_settled_by_two_nodes<Q: Kept>(queue: Arc<Q>) {
    let now = 1_000;
    let mut leases = running(queue.as_ref(), "node-a", 1..=100, now).await;
    let on_b = leases.split_off(50);
    // Node b takes over the second half (as if it claimed them itself).
    for lease in &on_b {
        queue
            .release_many("node-a", vec![lease.claim()], now)
            .await
            .pop()
            .expect("an answer")
            .expect("released");
    }
    let on_b = queue
        .claim_batch("node-b", &everything(), 50, LEASE, now)
        .await
        .expect("claim on b");
    assert_eq!(on_b.len(), 50);
    queue
        .enqueue_waiting(
            101,
            now,
            step(101),
            Carried::default(),
            &after(1..=100, false),
        )
        .await
        .expect("the child waits");
    assert_eq!(queue.waiting_parents(&key(101), 101).await, Ok(Some(100)));
    let (last, first_99) = {
        let mut all: Vec<(&str, _)> = leases
            .iter()
            .map(|lease| ("node-a", lease.claim()))
            .collect();
        all.extend(on_b.iter().map(|lease| ("node-b", lease.claim())));
        let last = all.pop().expect("a parent");
        (last, all)
    };
    let settles = first_99.into_iter().map(|(node, claim)| {
        let queue = queue.clone();
        tokio::spawn(async move { queue.settle(node, claim, Settlement::Done).await })
    });
    for settled in futures_util::future::join_all(settles).await {
        settled.expect("no panic").expect("settled");
    }
    assert_eq!(queue.waiting_parents(&key(101), 101).await, Ok(Some(1)));
    let early = queue
        .claim_best_fit("node-a", &everything(), LEASE, now + 10)
        .await
        .expect("claim");
    assert_eq!(
        early.map(|lease| lease.entry),
        None,
        "the child waits for one parent"
    );
    queue
        .settle(last.0, last.1, Settlement::Done)
        .await
        .expect("the last parent settled");
    assert_eq!(queue.waiting_parents(&key(101), 101).await, Ok(None));
    let child = queue
        .claim_best_fit("node-a", &everything(), LEASE, now + 10)
        .await
        .expect("claim");
    assert_eq!(child.map(|lease| lease.entry), Some(101));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_parked_while_its_parent_settles_is_never_left_waiting() {
    parked_while_its_parent_settles(Arc::new(open(RetryPolicy::default()).await)).await;
}

#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_pgmq_a_child_parked_while_its_parent_settles_is_never_left_waiting() {
    on_pgmq(RetryPolicy::default(), parked_while_its_parent_settles).await;
}

async fn parked_while_its_parent_settles<Q: Kept>(queue: Arc<Q>) {
    for round in 0..40_u64 {
        let (parent, child) = (1_000 + 2 * round, 1_001 + 2 * round);
        let lease = running(queue.as_ref(), "node-a", [parent], 1_000)
            .await
            .remove(0);
        let settle = {
            let queue = queue.clone();
            tokio::spawn(async move {
                queue
                    .settle("node-a", lease.claim(), Settlement::Done)
                    .await
            })
        };
        let park = {
            let queue = queue.clone();
            tokio::spawn(async move {
                queue
                    .enqueue_waiting(
                        child,
                        1_000,
                        step(child),
                        Carried::default(),
                        &after([parent], false),
                    )
                    .await
            })
        };
        settle.await.expect("no panic").expect("settled");
        park.await.expect("no panic").expect("parked");
        let claimed = queue
            .claim_best_fit("node-b", &everything(), LEASE, 2_000)
            .await
            .expect("claim");
        assert_eq!(
            claimed.map(|lease| lease.entry),
            Some(child),
            "round {round}: the child is claimable once its parent ended, whichever came first"
        );
    }
}

/// One attempt, no backoff.
fn one_attempt() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 1,
        base: Duration::ZERO,
        max: Duration::ZERO,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_the_rescue_gives_up_on_cancels_its_descendants_and_releases_a_cleanup() {
    rescue_gives_up_on_a_parent(Arc::new(open(one_attempt()).await)).await;
}

#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_pgmq_a_parent_the_rescue_gives_up_on_cancels_its_descendants_and_releases_a_cleanup() {
    on_pgmq(one_attempt(), rescue_gives_up_on_a_parent).await;
}

async fn rescue_gives_up_on_a_parent<Q: Kept>(queue: Arc<Q>) {
    let lease = running(queue.as_ref(), "lost-node", [1], 1_000)
        .await
        .remove(0);
    let waiting = [
        (2, after([1], false)),
        (3, after([2], false)),
        (4, after([1], true)),
    ];
    for (id, depends_on) in waiting {
        queue
            .enqueue_waiting(id, 1_000, step(id), Carried::default(), &depends_on)
            .await
            .expect("waits");
    }
    assert_eq!(
        queue
            .maintenance()
            .rescue_expired(lease.expires_at_ms + 1)
            .await,
        Ok(1),
        "the parent's last attempt lost its lease: dead-lettered"
    );
    let mut letters = queue
        .maintenance()
        .take_dead_letters(10)
        .await
        .expect("letters");
    letters.sort_by_key(|letter| letter.task_id);
    let told: Vec<(TaskId, LetterEnd)> = letters
        .iter()
        .map(|letter| (letter.task_id, letter.end.clone()))
        .collect();
    let gave_up = TaskStatus::Failed(
        "the shared queue gave up on the task: its every attempt lost its lease".into(),
    );
    assert_eq!(
        told,
        vec![
            (1, LetterEnd::GivenUp),
            (
                2,
                LetterEnd::Cancelled {
                    parent: Some((1, gave_up))
                }
            ),
            (
                3,
                LetterEnd::Cancelled {
                    parent: Some((2, TaskStatus::Cancelled))
                }
            )
        ],
        "each cancelled child names its parent and how it ended"
    );
    assert!(
        letters[1]
            .reason
            .contains("task 1 it depends on was dead-lettered"),
        "{}",
        letters[1].reason
    );
    assert!(
        letters[2]
            .reason
            .contains("task 2 it depends on was cancelled"),
        "{}",
        letters[2].reason
    );
    assert_eq!(
        queue
            .maintenance()
            .take_dead_letters(10)
            .await
            .map(|l| l.len()),
        Ok(0),
        "each is delivered once"
    );
    let cleanup = queue
        .claim_best_fit("node-b", &everything(), LEASE, 2_000)
        .await
        .expect("claim");
    assert_eq!(
        cleanup.map(|lease| lease.entry),
        Some(4),
        "the cleanup runs anyway"
    );
    // A child named after the parent's end is refused: the dead letter says how it ended.
    match queue
        .enqueue_waiting(5, 1_000, step(5), Carried::default(), &after([1], false))
        .await
    {
        Err(QueueError::Dependency(refusal)) => assert!(
            matches!(
                *refusal,
                prometheus_parking_lot::core::DependencyError::ParentEnded { parent: 1, .. }
            ),
            "{refusal:?}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A node of an earlier version calls `<table>_ended` with five arguments (no parent status).
/// On a table a later version made, that call still exists and cancels the waiting children,
/// round by round: the child names its parent in words only (`Cancelled { parent: None }`),
/// and the grandchild the child it depended on, cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_nodes_call_without_a_status_still_cancels_the_children() {
    use sea_orm::ConnectionTrait;
    let name = fresh_name("deps_v1");
    let queue = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            PostgresQueue::<u64>::open(&database(), "pl_queue_jobs", &name)
                .expect("open the queue")
                .with_dependencies()
                .expect("keep dependencies")
        })
        .await
        .expect("opening does not panic")
    };
    running(&queue, "node-a", [1], 1_000).await;
    for (id, parent) in [(2, 1), (3, 2)] {
        queue
            .enqueue_waiting(
                id,
                1_000,
                step(id),
                Carried::default(),
                &after([parent], false),
            )
            .await
            .expect("waits");
    }
    let old_call = format!(
        "SELECT pl_queue_jobs_ended('{name}', ARRAY(SELECT id FROM pl_queue_jobs \
           WHERE queue_name = '{name}' AND task_id = 1), ARRAY[1::bigint], false, \
           'failed: an old node') AS woken"
    );
    let woken: i64 = database()
        .connection()
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            old_call,
        ))
        .await
        .expect("the five-argument function exists")
        .expect("a row")
        .try_get("", "woken")
        .expect("woken");
    assert_eq!(woken, 0, "nothing released: both children are cancelled");
    let mut letters = queue
        .maintenance()
        .take_dead_letters(10)
        .await
        .expect("letters");
    letters.sort_by_key(|letter| letter.task_id);
    let told: Vec<(TaskId, LetterEnd, bool)> = letters
        .iter()
        .map(|letter| {
            let words = letter.reason.contains("it depends on");
            (letter.task_id, letter.end.clone(), words)
        })
        .collect();
    assert_eq!(
        told,
        vec![
            (2, LetterEnd::Cancelled { parent: None }, true),
            (
                3,
                LetterEnd::Cancelled {
                    parent: Some((2, TaskStatus::Cancelled))
                },
                true
            ),
        ]
    );
}
