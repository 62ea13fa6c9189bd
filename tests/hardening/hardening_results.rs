//! Reliability sweep (issue 7), results: nothing is lost silently at the mailbox bound or at
//! shutdown, retention is counted, waiting leaves nothing behind, and one task's result can
//! be picked among several under a shared key.
//!
//! Every case is bounded in time: a regression fails instead of hanging.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::core::{PoolError, ScheduledTask, TaskMetadata};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, TaskId};
use prometheus_parking_lot::{ResourcePool, TaskExecutor, TokioSpawner};
use support::{eventually, gpu, on_plain_thread, settings, Job, LabPool};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_mailbox_refuses_new_tasks_and_never_evicts_a_result() {
    let lab = LabPool::new(settings("bound", 2, 8).with_max_messages(100));
    let mut accepted = Vec::new();
    let mut refused = 0;
    for id in 0..150 {
        match lab
            .pool
            .submit_async(Job::Quick, gpu(id, Priority::Normal, 1))
            .await
        {
            Ok(key) => accepted.push((id, key)),
            Err(PoolError::MailboxFull {
                stored,
                live,
                max_messages,
            }) => {
                assert_eq!(max_messages, 100);
                assert_eq!(stored + live, 100, "refused exactly at the bound");
                refused += 1;
            }
            Err(other) => panic!("task {id}: unexpected refusal {other:?}"),
        }
    }
    assert_eq!((accepted.len(), refused), (100, 50));
    assert!(
        accepted.iter().map(|(id, _)| *id).eq(0..100),
        "the first 100 were taken, the rest refused"
    );
    eventually("all accepted tasks done", || {
        lab.pool.stats().completed_tasks == 100
    })
    .await;
    assert_eq!(lab.pool.stats().rejected_tasks, 50);

    // Collecting ten makes room for exactly ten more.
    for (id, key) in accepted.drain(..10) {
        assert_eq!(lab.pool.retrieve_async(&key, WAIT).await, Ok(id));
    }
    for id in 1_000..1_010 {
        let key = lab
            .pool
            .submit_async(Job::Quick, gpu(id, Priority::Normal, 1))
            .await
            .expect("room was made");
        accepted.push((id, key));
    }
    assert!(matches!(
        lab.pool
            .submit_async(Job::Quick, gpu(2_000, Priority::Normal, 1))
            .await,
        Err(PoolError::MailboxFull { .. })
    ));
    // Nothing was evicted: every accepted task's result is there.
    for (id, key) in &accepted {
        assert_eq!(lab.pool.retrieve_async(key, WAIT).await, Ok(*id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_every_parked_in_memory_task_its_cancelled_outcome() {
    const PARKED: TaskId = 2_000;
    let mut lab = LabPool::new(settings("cancel-all", 1, 4).with_max_queue_depth(5_000));
    let running = lab
        .pool
        .submit_async(
            Job::Sleep(Duration::from_millis(200)),
            gpu(0, Priority::Normal, 4),
        )
        .await
        .unwrap();
    assert_eq!(lab.next_start().await, 0);
    let tasks = (1..=PARKED).map(|id| (Job::Quick, gpu(id, Priority::Normal, 1)));
    let parked: Vec<MailboxKey> = lab
        .pool
        .submit_batch(tasks)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    let report = tokio::time::timeout(WAIT, lab.pool.shutdown_with_drain(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.cancelled_parked, PARKED as usize);
    assert_eq!(report.finished_running, 1);
    assert_eq!(lab.pool.retrieve_async(&running, WAIT).await, Ok(0));
    for key in &parked {
        assert_eq!(
            lab.pool.retrieve_async(key, WAIT).await,
            Err(PoolError::Cancelled)
        );
    }
    assert_eq!(lab.pool.stats().cancelled_tasks, PARKED);
    let mut started_after = Vec::new();
    while let Ok((id, _)) = lab.started.try_recv() {
        started_after.push(id);
    }
    assert!(
        started_after.is_empty(),
        "parked tasks ran: {started_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_dropped_by_retention_are_counted() {
    let config = settings("retention-count", 2, 8).with_retention(Some(Duration::from_secs(1)));
    let lab = LabPool::new(config);
    let mut forgotten = Vec::new();
    for id in 1..=3 {
        forgotten.push(
            lab.pool
                .submit_async(Job::Quick, gpu(id, Priority::Normal, 1))
                .await
                .unwrap(),
        );
    }
    eventually("tasks done", || lab.pool.stats().completed_tasks == 3).await;
    assert_eq!(lab.pool.stats().expired_results, 0);
    eventually("three results expired", || {
        lab.pool.stats().expired_results == 3
    })
    .await;
    for key in &forgotten {
        assert_eq!(
            lab.pool.client().try_retrieve(key).await,
            Err(PoolError::ResultNotFound)
        );
    }
}

/// Returns the payload.
#[derive(Clone)]
struct Echo;

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Echo {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        payload
    }
}

/// The echo pool the watcher tests drive.
type EchoPool = Arc<ResourcePool<u64, u64, Echo>>;

/// A pool over a mailbox the test can inspect.
fn watched_pool(name: &str) -> (Arc<InMemoryMailbox<u64>>, EchoPool) {
    let mailbox = Arc::new(InMemoryMailbox::<u64>::new());
    // Room for all 2,000 tasks of the served-waits test at once: their submissions may all
    // arrive before the first task runs, and a refusal there would say nothing of watchers.
    let pool = ResourcePool::with_settings(
        settings(name, 2, 4).with_max_queue_depth(4_000),
        Echo,
        Box::new(InMemoryQueue::new()),
        mailbox.clone(),
        &TokioSpawner,
    )
    .unwrap();
    (mailbox, Arc::new(pool))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_time_out_or_are_dropped_leave_no_watcher_behind() {
    let (mailbox, pool) = watched_pool("watchers");

    // 20,000 waits on distinct keys, all timing out.
    let mut waits = tokio::task::JoinSet::new();
    for n in 0..20_000 {
        let pool = pool.clone();
        waits.spawn(async move {
            let key = MailboxKey::new(format!("tenant-{n}"));
            pool.retrieve(&key, Duration::from_millis(1)).await
        });
    }
    while let Some(outcome) = tokio::time::timeout(WAIT, waits.join_next())
        .await
        .expect("20,000 timed waits end within 10 s")
    {
        assert_eq!(outcome.unwrap(), Err(PoolError::Timeout));
    }
    assert_eq!(mailbox.watched_keys(), 0, "timed-out waits left watchers");

    // A wait in progress is counted; dropping it mid-wait removes it.
    let key = MailboxKey::new("dropped");
    tokio::select! {
        _ = pool.retrieve(&key, WAIT) => panic!("nothing was stored"),
        _ = async {
            eventually("one watcher", || mailbox.watched_keys() == 1).await;
        } => {}
    }
    assert_eq!(mailbox.watched_keys(), 0, "a dropped wait left its watcher");

    // Blocking waits that time out.
    let blocking = pool.clone();
    let timed_out = on_plain_thread(move || {
        (0..50)
            .map(|n| {
                let key = MailboxKey::new(format!("blocking-{n}"));
                blocking
                    .client()
                    .retrieve_blocking(&key, None, Duration::from_millis(1))
            })
            .filter(|outcome| *outcome == Err(PoolError::Timeout))
            .count()
    })
    .await;
    assert_eq!(timed_out, 50);
    assert_eq!(mailbox.watched_keys(), 0, "blocking waits left watchers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_get_their_result_leave_no_watcher_behind() {
    let (mailbox, pool) = watched_pool("served-watchers");
    let mut waits = tokio::task::JoinSet::new();
    for id in 0..2_000u64 {
        let pool = pool.clone();
        waits.spawn(async move {
            let key = MailboxKey::new(format!("served-{id}"));
            let task = ScheduledTask::new(
                TaskMetadata {
                    mailbox: Some(key.clone()),
                    ..gpu(id, Priority::Normal, 1)
                },
                id,
            );
            // The wait subscribes before the result is stored.
            let (outcome, submitted) = tokio::join!(pool.retrieve(&key, WAIT), pool.submit(task));
            submitted.unwrap();
            assert_eq!(outcome, Ok(id));
        });
    }
    while let Some(done) = tokio::time::timeout(WAIT, waits.join_next())
        .await
        .expect("2,000 served waits end within 10 s")
    {
        done.unwrap();
    }
    assert_eq!(
        mailbox.watched_keys(),
        0,
        "waits that were woken by their result left watcher entries behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieve_task_takes_one_tasks_result_among_several_on_a_key() {
    let mut lab = LabPool::new(settings("shared-key", 2, 8));
    let shared = MailboxKey::new("acme").with_user("ada").with_session("s1");
    let on_shared = |id: TaskId| TaskMetadata {
        mailbox: Some(shared.clone()),
        ..gpu(id, Priority::Normal, 1)
    };
    for id in 1..=3 {
        let key = lab
            .pool
            .submit_async(Job::Quick, on_shared(id))
            .await
            .unwrap();
        assert_eq!(key, shared);
    }
    eventually("three stored", || lab.pool.stats().completed_tasks == 3).await;
    assert_eq!(
        lab.pool.retrieve_task(&shared, 2, WAIT).await,
        Ok(2),
        "the one asked for"
    );
    assert_eq!(
        lab.pool.retrieve_task(&shared, 2, WAIT).await,
        Err(PoolError::NothingToRetrieve { task: Some(2) }),
        "taken once: a second retrieve is told at once that nothing will come"
    );

    // A wait for task 4 is not satisfied by task 5 finishing first under the same key.
    let gated = lab.gated(4);
    lab.pool.submit_async(gated, on_shared(4)).await.unwrap();
    let waiting_for_4 = {
        let client = lab.pool.client().clone();
        let shared = shared.clone();
        tokio::spawn(async move { client.retrieve_task(&shared, 4, WAIT).await })
    };
    lab.pool
        .submit_async(Job::Quick, on_shared(5))
        .await
        .unwrap();
    assert_eq!(lab.pool.retrieve_task(&shared, 5, WAIT).await, Ok(5));
    assert!(!waiting_for_4.is_finished());
    lab.open(4);
    assert_eq!(
        tokio::time::timeout(WAIT, waiting_for_4)
            .await
            .unwrap()
            .unwrap(),
        Ok(4)
    );

    // What is left: tasks 1 and 3, oldest first.
    let mut rest = vec![
        lab.pool.retrieve_async(&shared, WAIT).await.unwrap(),
        lab.pool.retrieve_async(&shared, WAIT).await.unwrap(),
    ];
    rest.sort_unstable();
    assert_eq!(rest, vec![1, 3]);
    assert_eq!(
        lab.pool.client().try_retrieve(&shared).await,
        Err(PoolError::ResultNotFound)
    );
}

/// A mailbox that stores on its own time, slowly, as a database under load does: a result
/// is stored 300 ms after its task ended.
struct SlowMailbox(InMemoryMailbox<u64>);

#[async_trait::async_trait]
impl prometheus_parking_lot::core::Mailbox<u64> for SlowMailbox {
    fn backend(&self) -> &'static str {
        "slow"
    }

    async fn store(
        &self,
        key: &MailboxKey,
        delivery: prometheus_parking_lot::core::Delivery<u64>,
    ) -> Result<(), prometheus_parking_lot::core::MailboxError> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.0.store(key, delivery).await
    }

    async fn take(
        &self,
        key: &MailboxKey,
    ) -> Result<
        Option<prometheus_parking_lot::core::Delivery<u64>>,
        prometheus_parking_lot::core::MailboxError,
    > {
        self.0.take(key).await
    }

    async fn take_task(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<
        Option<prometheus_parking_lot::core::Delivery<u64>>,
        prometheus_parking_lot::core::MailboxError,
    > {
        self.0.take_task(key, task_id).await
    }

    async fn list(
        &self,
        key: &MailboxKey,
    ) -> Result<Vec<TaskId>, prometheus_parking_lot::core::MailboxError> {
        self.0.list(key).await
    }

    async fn purge_stored_before(
        &self,
        cutoff_ms: u64,
    ) -> Result<usize, prometheus_parking_lot::core::MailboxError> {
        self.0.purge_stored_before(cutoff_ms).await
    }

    async fn stored_count(&self) -> Result<usize, prometheus_parking_lot::core::MailboxError> {
        self.0.stored_count().await
    }

    fn subscribe(&self, key: &MailboxKey) -> Arc<tokio::sync::Notify> {
        self.0.subscribe(key)
    }
}

/// With `Attach`, a resubmission between the original's end and its result's store (here
/// 300 ms) finds neither the live task nor the stored result; it gets the original's key all
/// the same, and nothing runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubmission_before_the_result_is_stored_attaches_and_runs_nothing() {
    let pool = on_plain_thread(|| {
        ResourcePool::with_settings(
            prometheus_parking_lot::WorkerPoolConfig::new()
                .with_worker_count(1)
                .with_max_units(4)
                .with_attach_duplicates(true),
            Echo,
            Box::new(InMemoryQueue::new()),
            Arc::new(SlowMailbox(InMemoryMailbox::new())),
            &TokioSpawner,
        )
        .expect("the pool starts")
    })
    .await;
    let key = MailboxKey::new("acme").with_session("s");
    let task = |payload| {
        ScheduledTask::new(
            TaskMetadata::new(5, prometheus_parking_lot::ResourceCost::cpu(1))
                .with_mailbox(key.clone()),
            payload,
        )
    };
    pool.submit(task(10)).await.expect("the original");
    eventually("the original ends", || pool.stats().completed_tasks == 1).await;
    let again = pool.submit(task(99)).await;
    assert_eq!(again, Ok(key.clone()), "attached to the original");
    let result = pool.retrieve_task(&key, 5, Duration::from_secs(10)).await;
    assert_eq!(result, Ok(10), "the original's result");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stats = pool.stats();
    assert_eq!(
        (stats.submitted_tasks, stats.completed_tasks),
        (1, 1),
        "nothing ran again"
    );
}
