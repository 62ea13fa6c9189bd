//! Scheduled starts on a queue that several nodes share, through pools: a task submitted with
//! a not-before instant on one node waits in the shared queue, where no node claims it
//! before its instant; then whichever node has room runs it, once. Cancel reaches it while
//! it sleeps, from any node, and so does `why_waiting` (`Sleeping` until its instant). The same cases run on every shared queue: the in-memory one,
//! the Postgres table and pgmq.

use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use prometheus_parking_lot::actors::{spawn_supervisor, start_pool, PoolSpec, WorkerSettings};
use prometheus_parking_lot::core::scheduling::WaitReason;
use prometheus_parking_lot::core::{
    Admission, Durability, PoolClient, PoolError, PoolLimits, QueueOrder, RestartPolicy,
    ScheduledTask, SharedParking, SharedQueue, SubmitOptions, TaskMetadata,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::infra::queue::shared_memory::InMemorySharedQueue;
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost, TaskId};
use prometheus_parking_lot::TaskExecutor;

const WAIT: Duration = Duration::from_secs(10);

/// Each run: the node, the task and when it started (ms since the epoch).
type Runs = Arc<Mutex<Vec<(&'static str, TaskId, u64)>>>;

/// Records its run, then sleeps `payload` milliseconds.
#[derive(Clone)]
struct Recorder {
    node: &'static str,
    runs: Runs,
}

#[async_trait::async_trait]
impl TaskExecutor<u64, TaskId> for Recorder {
    async fn execute(&self, payload: u64, meta: TaskMetadata) -> TaskId {
        self.runs.lock().unwrap().push((self.node, meta.id, now()));
        tokio::time::sleep(Duration::from_millis(payload)).await;
        meta.id
    }
}

fn now() -> u64 {
    u64::try_from(now_ms()).expect("the clock fits u64")
}

/// A node of one worker and one unit on `queue`, polling every 10 ms.
async fn node(
    queue: &Arc<dyn SharedQueue<u64>>,
    mailbox: &Arc<InMemoryMailbox<TaskId>>,
    name: &'static str,
    runs: &Runs,
) -> PoolClient<u64, TaskId> {
    node_with(queue, mailbox, name, runs, PoolLimits::new(1, 1))
        .await
        .unwrap()
}

/// [`node`] with `limits`.
async fn node_with(
    queue: &Arc<dyn SharedQueue<u64>>,
    mailbox: &Arc<InMemoryMailbox<TaskId>>,
    name: &'static str,
    runs: &Runs,
    limits: PoolLimits,
) -> Result<PoolClient<u64, TaskId>, PoolError> {
    let supervisor = spawn_supervisor().await.unwrap();
    let shared = SharedParking::new(queue.clone(), name)
        .with_lease(Duration::from_secs(5))
        .with_poll(Duration::from_millis(10));
    let spec = PoolSpec {
        tenant_weights: Default::default(),
        name: name.into(),
        limits,
        workers: WorkerSettings {
            count: 1,
            stack_size: None,
            pin_to_cpus: false,
        },
        default_timeout: None,
        restart: RestartPolicy::default(),
        executor: Recorder {
            node: name,
            runs: runs.clone(),
        },
        queue: Box::new(InMemoryQueue::new()),
        mailbox: mailbox.clone(),
        notifiers: Vec::new(),
        result_encoder: None,
        subscribers: Vec::new(),
        retention: None,
        shared: Some(shared),
        // A task that starts at once is not stored first: this test is about parked work.
        durability: Durability::Parked {
            spin: Duration::ZERO,
        },
        gpu: None,
        tracer: None,
    };
    start_pool(&supervisor, spec).await
}

fn key(id: TaskId) -> MailboxKey {
    MailboxKey::new("acme").with_session(format!("s{id}"))
}

fn job(id: TaskId, sleep_ms: u64) -> ScheduledTask<u64> {
    let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key(id));
    ScheduledTask::new(meta, sleep_ms)
}

fn not_before(at_ms: u64) -> SubmitOptions {
    SubmitOptions::default().with_not_before(UNIX_EPOCH + Duration::from_millis(at_ms))
}

/// Node a takes task 1 (long) and two scheduled tasks; while they sleep, node a stays busy,
/// so node b runs the one due, after its instant; the other is cancelled from node b while
/// it sleeps and never runs. Every task runs at most once.
async fn a_scheduled_start_runs_once_after_its_instant_on_any_node(
    queue: Arc<dyn SharedQueue<u64>>,
) {
    let (mailbox, runs): (_, Runs) = (Arc::new(InMemoryMailbox::new()), Runs::default());
    let a = node(&queue, &mailbox, "node-a", &runs).await;
    let b = node(&queue, &mailbox, "node-b", &runs).await;
    let busy = a.submit(job(1, 3_000), SubmitOptions::default()).await;
    busy.expect("task 1 runs on node a");
    let at_ms = now() + 500;
    let due = a
        .submit(job(2, 0), not_before(at_ms))
        .await
        .expect("admitted");
    let cancelled = a
        .submit(job(3, 0), not_before(at_ms))
        .await
        .expect("admitted");
    let parked = queue.maintenance().counts().await.expect("counts").parked;
    assert_eq!(parked, 2, "both sleep in the shared queue");
    let sleeping = Ok(Some(WaitReason::Sleeping {
        until_ms: u128::from(at_ms),
    }));
    for node in [&a, &b] {
        assert_eq!(
            node.why_waiting(&key(2), 2).await,
            sleeping,
            "{}",
            node.name()
        );
        assert_eq!(
            node.why_waiting(&key(3), 2).await,
            Err(PoolError::TaskNotFound(2)),
            "another session's task 2"
        );
        assert_eq!(
            node.why_waiting(&key(4), 4).await,
            Err(PoolError::TaskNotFound(4))
        );
    }
    assert_eq!(
        a.why_waiting(&key(1), 1).await,
        Ok(None),
        "task 1 runs on a"
    );
    assert_eq!(b.cancel(&cancelled, 3).await, Ok(()));
    assert_eq!(
        a.retrieve(&cancelled, WAIT).await,
        Err(PoolError::Cancelled)
    );
    assert_eq!(
        a.why_waiting(&key(3), 3).await,
        Err(PoolError::TaskNotFound(3)),
        "cancelled, it sleeps no more"
    );
    assert_eq!(b.retrieve(&due, WAIT).await, Ok(2));
    let runs_now = runs.lock().unwrap().clone();
    let of_2: Vec<_> = runs_now.iter().filter(|run| run.1 == 2).collect();
    assert_eq!(of_2.len(), 1, "task 2 ran once: {runs_now:?}");
    let (node_of_2, _, started) = *of_2[0];
    assert_eq!(node_of_2, "node-b", "node a was busy: {runs_now:?}");
    assert!(started >= at_ms, "started {} ms early", at_ms - started);
    assert!(
        runs_now.iter().all(|run| run.1 != 3),
        "the cancelled one never ran"
    );
    a.shutdown(WAIT).await.unwrap();
    b.shutdown(WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_in_memory_shared_queue() {
    a_scheduled_start_runs_once_after_its_instant_on_any_node(Arc::new(InMemorySharedQueue::new()))
        .await;
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use crate::postgres_pools::{fresh_name, server_url};
    use prometheus_parking_lot::infra::postgres::PgDatabase;

    fn database() -> PgDatabase {
        PgDatabase::connect(&server_url()).expect("the Postgres tests need a server")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_the_postgres_table() {
        use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
        let database = database();
        let queue = tokio::task::spawn_blocking(move || {
            PostgresQueue::<u64>::open(&database, "pl_queue_jobs", &fresh_name("scheduled"))
                .expect("open the queue")
        })
        .await
        .expect("opening does not panic");
        a_scheduled_start_runs_once_after_its_instant_on_any_node(Arc::new(queue)).await;
    }

    #[cfg(feature = "pgmq")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_pgmq() {
        use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
        let database = database();
        let queue = tokio::task::spawn_blocking(move || {
            PgmqQueue::<u64>::open(&database, &fresh_name("scheduled")).expect("open the queue")
        })
        .await
        .expect("opening does not panic");
        let made = queue.pgmq_queues();
        a_scheduled_start_runs_once_after_its_instant_on_any_node(Arc::new(queue)).await;
        crate::postgres_backends::drop_pgmq_queues(&made).await;
    }
}

/// A pool ordered by deadline starts only on a shared queue that claims in that order: the
/// nodes claim in the queue's order, which no node's core could change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ordered_pool_needs_a_queue_claiming_by_deadline() {
    let mailbox = Arc::new(InMemoryMailbox::new());
    let runs = Runs::default();
    let fifo: Arc<dyn SharedQueue<u64>> = Arc::new(InMemorySharedQueue::new());
    let by_deadline_limits = PoolLimits::new(1, 1).with_order(QueueOrder::Deadline);
    let refused = node_with(&fifo, &mailbox, "a", &runs, by_deadline_limits).await;
    assert_eq!(
        refused.err(),
        Some(PoolError::InvalidConfig(
            "order is \"deadline\" but the in_memory_shared queue claims in the \"fifo\" order; \
             open the shared queue in the pool's order (a Postgres table queue claims in \
             either: PostgresQueue::open_in_order), or give the pool the queue's order"
                .into()
        ))
    );
    let by_deadline: Arc<dyn SharedQueue<u64>> =
        Arc::new(InMemorySharedQueue::new().with_order(QueueOrder::Deadline));
    let pool = node_with(&by_deadline, &mailbox, "b", &runs, by_deadline_limits).await;
    assert!(pool.is_ok(), "the queue claims in the pool's order");
}

/// A pool on a shared queue does not refuse late submissions: what it cannot start waits
/// behind the fleet's backlog, which its estimate does not see. It says so at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_queue_pool_refuses_to_refuse_late_work_blind() {
    let mailbox = Arc::new(InMemoryMailbox::new());
    let queue: Arc<dyn SharedQueue<u64>> = Arc::new(InMemorySharedQueue::new());
    let limits = PoolLimits::new(1, 1).with_admission(Admission {
        refuse_if_late: true,
    });
    let refused = node_with(&queue, &mailbox, "a", &Runs::default(), limits).await;
    assert_eq!(
        refused.err(),
        Some(PoolError::InvalidConfig(
            "refuse_if_late is on; a task that waits in a shared queue waits behind every \
             node's backlog, which no node's start estimate sees: turn refuse_if_late off, \
             or use a local queue (in_memory, yaque)"
                .into()
        ))
    );
}
