//! The scheduler's shared-queue mode, in one process: pools as nodes of one
//! `InMemorySharedQueue`, with one mailbox between them. What a database backend adds (other
//! processes, real crashes) is tested with that backend; these cases prove the driver: tasks
//! that would park go to the shared queue, nodes claim them in rank order as they get room,
//! every task runs exactly once, cancel and deadlines reach shared tasks, and a lease its
//! holder stops renewing is rescued and run by another node.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_parking_lot::actors::{spawn_supervisor, start_pool, PoolSpec, WorkerSettings};
use prometheus_parking_lot::core::RestartPolicy;
use prometheus_parking_lot::core::{
    Capacity, FitQuery, PoolClient, PoolError, PoolLimits, QueueMaintenance, QueueOrder,
    ScheduledTask, SharedParking, SharedQueue, SubmitOptions, TaskMetadata,
};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::infra::queue::shared_memory::InMemorySharedQueue;
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, ResourceCost, TaskId};
use prometheus_parking_lot::TaskExecutor;

const WAIT: Duration = Duration::from_secs(10);

/// Sleeps `payload` milliseconds, records `(node, id)` and returns the id.
#[derive(Clone)]
struct Recorder {
    node: &'static str,
    runs: Arc<Mutex<Vec<(&'static str, TaskId)>>>,
}

#[async_trait::async_trait]
impl TaskExecutor<u64, TaskId> for Recorder {
    async fn execute(&self, payload: u64, meta: TaskMetadata) -> TaskId {
        self.runs.lock().unwrap().push((self.node, meta.id));
        tokio::time::sleep(Duration::from_millis(payload)).await;
        meta.id
    }
}

type Runs = Arc<Mutex<Vec<(&'static str, TaskId)>>>;

struct Cluster {
    queue: Arc<InMemorySharedQueue<u64>>,
    mailbox: Arc<InMemoryMailbox<TaskId>>,
    runs: Runs,
}

impl Cluster {
    fn new() -> Self {
        Self {
            queue: Arc::new(InMemorySharedQueue::new()),
            mailbox: Arc::new(InMemoryMailbox::new()),
            runs: Arc::default(),
        }
    }

    /// A node of one worker and one unit, polling every 10 ms.
    async fn node(&self, name: &'static str) -> PoolClient<u64, TaskId> {
        self.node_with(name, 1, 1, 0).await
    }

    /// A node of `workers` workers and `units` units that may claim `claim_ahead` tasks
    /// beyond what it starts at once, polling every 10 ms.
    async fn node_with(
        &self,
        name: &'static str,
        workers: usize,
        units: u32,
        claim_ahead: usize,
    ) -> PoolClient<u64, TaskId> {
        let limits = PoolLimits::new(units, workers);
        self.node_limited(name, limits, claim_ahead).await
    }

    /// A node under `limits`, that may claim `claim_ahead` tasks beyond what it starts at
    /// once, polling every 10 ms.
    async fn node_limited(
        &self,
        name: &'static str,
        limits: PoolLimits,
        claim_ahead: usize,
    ) -> PoolClient<u64, TaskId> {
        let workers = limits.worker_slots;
        let supervisor = spawn_supervisor().await.unwrap();
        let shared = SharedParking::new(self.queue.clone(), name)
            .with_lease(Duration::from_millis(300))
            .with_poll(Duration::from_millis(10))
            .with_claim_ahead(claim_ahead);
        let spec = PoolSpec {
            tenant_weights: Default::default(),
            name: name.into(),
            limits,
            workers: WorkerSettings {
                count: workers,
                stack_size: None,
                pin_to_cpus: false,
            },
            default_timeout: None,
            restart: RestartPolicy::default(),
            executor: Recorder {
                node: name,
                runs: self.runs.clone(),
            },
            queue: Box::new(InMemoryQueue::new()),
            mailbox: self.mailbox.clone(),
            notifiers: Vec::new(),
            result_encoder: None,
            subscribers: Vec::new(),
            retention: None,
            shared: Some(shared),
            durability: Default::default(),
            gpu: None,
            tracer: None,
        };
        start_pool(&supervisor, spec).await.unwrap()
    }

    fn runs(&self) -> Vec<(&'static str, TaskId)> {
        self.runs.lock().unwrap().clone()
    }

    async fn counts(&self) -> (usize, usize) {
        let counts = self.queue.counts().await.unwrap();
        (counts.parked, counts.claimed)
    }
}

fn now() -> u64 {
    u64::try_from(now_ms()).expect("the clock fits u64")
}

fn job(id: TaskId, sleep_ms: u64, priority: Priority) -> ScheduledTask<u64> {
    let meta = TaskMetadata::new(id, ResourceCost::cpu(1))
        .with_priority(priority)
        .with_mailbox(MailboxKey::new("acme").with_session(format!("s{id}")));
    ScheduledTask::new(meta, sleep_ms)
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..1_000 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_parked_on_one_node_runs_exactly_once_across_both() {
    let cluster = Cluster::new();
    let a = cluster.node("node-a").await;
    let b = cluster.node("node-b").await;
    let mut keys = Vec::new();
    for id in 1..=40 {
        keys.push(
            a.submit(job(id, 15, Priority::Normal), SubmitOptions::default())
                .await
                .unwrap(),
        );
    }
    for (id, key) in (1..=40).zip(&keys) {
        assert_eq!(a.retrieve(key, WAIT).await, Ok(id), "task {id}");
    }
    let runs = cluster.runs();
    let mut ids: Vec<TaskId> = runs.iter().map(|&(_, id)| id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (1..=40).collect::<Vec<_>>(),
        "each task ran exactly once"
    );
    let on_b = runs.iter().filter(|&&(node, _)| node == "node-b").count();
    assert!(on_b > 0, "node b took none of node a's parked work");
    assert!(on_b < 40, "node a ran none of its own work");
    eventually("every claim is settled", async || {
        cluster.counts().await == (0, 0)
    })
    .await;
    for node in [&a, &b] {
        let stats = node.stats();
        assert_eq!((stats.active_tasks, stats.queued_tasks), (0, 0));
        assert_eq!(stats.used_units, 0);
    }
    a.shutdown(WAIT).await.unwrap();
    b.shutdown(WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_claims_shared_work_in_rank_order() {
    let cluster = Cluster::new();
    let a = cluster.node("node-a").await;
    let first = a
        .submit(job(1, 500, Priority::Normal), SubmitOptions::default())
        .await
        .unwrap();
    eventually("task 1 runs", async || a.stats().active_tasks == 1).await;
    let order = [
        (2, Priority::Low),
        (3, Priority::Normal),
        (4, Priority::Critical),
        (5, Priority::High),
        (6, Priority::Critical),
    ];
    let mut keys = Vec::new();
    for (id, priority) in order {
        keys.push(
            a.submit(job(id, 0, priority), SubmitOptions::default())
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        cluster.counts().await,
        (5, 1),
        "all five wait in the shared queue; task 1, started at once, is stored as node a's \
         claim (the default durability, accepted)"
    );
    assert_eq!(a.retrieve(&first, WAIT).await, Ok(1));
    for key in &keys {
        a.retrieve(key, WAIT).await.unwrap();
    }
    let started: Vec<TaskId> = cluster.runs().iter().map(|&(_, id)| id).collect();
    assert_eq!(
        started,
        [1, 4, 6, 5, 3, 2],
        "priority first, then admission order"
    );
    a.shutdown(WAIT).await.unwrap();
}

/// `max_queued_units` on a shared queue bounds what the fleet parks: a task node b submits
/// sheds the worst-ranked parked task of a lower priority that node a parked, whose caller
/// hears `QueueFull`; one with nothing lower to shed is refused; the rest run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_bound_on_queued_units_sheds_one_nodes_task_for_anothers() {
    let cluster = Cluster::new();
    let limits = PoolLimits::new(1, 1).with_max_queued_units(Some(2));
    let a = cluster.node_limited("node-a", limits, 0).await;
    let b = cluster.node_limited("node-b", limits, 0).await;
    for (node, id) in [(&a, 1), (&b, 2)] {
        node.submit(job(id, 500, Priority::Normal), SubmitOptions::default())
            .await
            .unwrap();
    }
    eventually("both nodes are busy", async || {
        a.stats().active_tasks == 1 && b.stats().active_tasks == 1
    })
    .await;
    let mut keys = std::collections::HashMap::new();
    for id in [3, 4] {
        let key = a
            .submit(job(id, 0, Priority::Low), SubmitOptions::default())
            .await
            .unwrap();
        keys.insert(id, key);
    }
    assert_eq!(cluster.counts().await.0, 2, "two Low tasks fill the bound");
    let five = b
        .submit(job(5, 0, Priority::High), SubmitOptions::default())
        .await
        .expect("sheds task 4, the worst Low task");
    let six = b
        .submit(job(6, 0, Priority::Normal), SubmitOptions::default())
        .await
        .expect("sheds task 3");
    assert_eq!(
        b.submit(job(7, 0, Priority::Normal), SubmitOptions::default())
            .await,
        Err(PoolError::QueueFull),
        "nothing below Normal is left to shed"
    );
    for id in [3, 4] {
        assert_eq!(
            a.retrieve(&keys[&id], WAIT).await,
            Err(PoolError::QueueFull),
            "task {id} was shed"
        );
    }
    assert_eq!(b.retrieve(&five, WAIT).await, Ok(5));
    assert_eq!(b.retrieve(&six, WAIT).await, Ok(6));
    a.shutdown(WAIT).await.unwrap();
    b.shutdown(WAIT).await.unwrap();
    let ran: Vec<TaskId> = cluster.runs().iter().map(|&(_, id)| id).collect();
    assert!(
        ran.iter().all(|id| ![3, 4, 7].contains(id)),
        "shed and refused tasks never ran: {ran:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_a_task_parked_in_the_shared_queue() {
    let cluster = Cluster::new();
    let a = cluster.node("node-a").await;
    let b = cluster.node("node-b").await;
    for (node, id) in [(&a, 1), (&b, 2)] {
        node.submit(job(id, 1_000, Priority::Normal), SubmitOptions::default())
            .await
            .unwrap();
    }
    eventually("both nodes are busy", async || {
        a.stats().active_tasks == 1 && b.stats().active_tasks == 1
    })
    .await;
    let key = a
        .submit(job(3, 0, Priority::Normal), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(
        cluster.counts().await.0,
        1,
        "task 3 is parked in the shared queue"
    );

    let stranger = MailboxKey::new("mallory").with_session("s3");
    assert_eq!(
        b.cancel(&stranger, 3).await,
        Err(PoolError::TaskNotFound(3))
    );
    // Node b never saw task 3, but it can cancel it by its key and id.
    assert_eq!(b.cancel(&key, 3).await, Ok(()));
    assert_eq!(a.retrieve(&key, WAIT).await, Err(PoolError::Cancelled));
    assert_eq!(b.cancel(&key, 3).await, Err(PoolError::TaskNotFound(3)));
    assert_eq!(cluster.counts().await.0, 0);
    a.shutdown(WAIT).await.unwrap();
    b.shutdown(WAIT).await.unwrap();
    assert!(
        cluster.runs().iter().all(|&(_, id)| id != 3),
        "the cancelled task never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_task_past_its_deadline_ends_expired_when_claimed() {
    let cluster = Cluster::new();
    let a = cluster.node("node-a").await;
    a.submit(job(1, 200, Priority::Normal), SubmitOptions::default())
        .await
        .unwrap();
    eventually("task 1 runs", async || a.stats().active_tasks == 1).await;
    let mut late = job(2, 0, Priority::Critical);
    late.meta = late.meta.with_deadline_ms(now_ms() + 50);
    let key = a.submit(late, SubmitOptions::default()).await.unwrap();
    assert_eq!(a.retrieve(&key, WAIT).await, Err(PoolError::Expired));
    assert!(cluster.runs().iter().all(|&(_, id)| id != 2));
    eventually("nothing left in the shared queue", async || {
        cluster.counts().await == (0, 0)
    })
    .await;
    a.shutdown(WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_its_holder_stopped_renewing_is_rescued_and_run_elsewhere() {
    let cluster = Cluster::new();
    // A node that claims a task and then dies: it never renews or settles.
    let entry = 77;
    cluster
        .queue
        .enqueue(entry, now(), job(9, 0, Priority::Normal))
        .await
        .unwrap();
    let query = FitQuery::within(Capacity::uniform(1));
    let lease = cluster
        .queue
        .claim_best_fit("ghost", &query, Duration::from_millis(100), now())
        .await
        .unwrap()
        .expect("the ghost claims task 9");
    assert_eq!(lease.attempt, 1);

    let a = cluster.node("node-a").await;
    let key = MailboxKey::new("acme").with_session("s9");
    assert_eq!(
        a.retrieve(&key, WAIT).await,
        Ok(9),
        "node a ran the rescued task"
    );
    assert_eq!(cluster.runs(), [("node-a", 9)]);
    eventually("the rescued claim is settled", async || {
        cluster.counts().await == (0, 0)
    })
    .await;
    a.shutdown(WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_overflows_into_the_shared_queue_gets_every_key() {
    let cluster = Cluster::new();
    let a = cluster.node("node-a").await;
    let tasks = (1..=10).map(|id| job(id, 5, Priority::Normal)).collect();
    let answers = a.submit_batch(tasks, SubmitOptions::default()).await;
    assert_eq!(answers.len(), 10);
    for (id, answer) in (1..=10).zip(answers) {
        let key = answer.unwrap_or_else(|error| panic!("task {id} refused: {error}"));
        assert_eq!(a.retrieve(&key, WAIT).await, Ok(id));
    }
    a.shutdown(WAIT).await.unwrap();
}

/// With claim-ahead, a busy node holds claimed tasks waiting for its workers (more claimed
/// than it runs), never more than its workers plus the claim-ahead, never runs more than its
/// workers at once, and every task still runs exactly once. A producer (no workers) with the
/// same setting claims nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_claim_ahead_holds_tasks_for_its_workers_and_runs_each_once() {
    let cluster = Cluster::new();
    let producer = cluster.node_with("api", 0, 100, 4).await;
    let gpu = cluster.node_with("gpu", 2, 100, 4).await;
    let tasks = (1..=30).map(|id| job(id, 20, Priority::Normal)).collect();
    let keys: Vec<MailboxKey> = producer
        .submit_batch(tasks, SubmitOptions::default())
        .await
        .into_iter()
        .map(|answer| answer.expect("accepted"))
        .collect();
    // What the node holds: its running tasks and the claimed ones waiting for a worker. (The
    // queue's count of claimed rows also holds runs that ended and wait for their settle.)
    let (mut most_claimed, mut most_running) = (0, 0);
    loop {
        let stats = gpu.stats();
        let running = stats.active_tasks;
        most_claimed = most_claimed.max(running + stats.queued_tasks);
        most_running = most_running.max(running);
        if cluster.runs().len() == 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for (id, key) in (1..=30).zip(&keys) {
        assert_eq!(producer.retrieve(key, WAIT).await, Ok(id), "task {id}");
    }
    assert!(
        most_claimed > 2,
        "claim-ahead never held more than the 2 workers run ({most_claimed})"
    );
    assert!(
        most_claimed <= 2 + 4,
        "held {most_claimed} claims, more than 2 workers and 4 ahead"
    );
    assert!(most_running <= 2, "ran {most_running} at once on 2 workers");
    let runs = cluster.runs();
    assert!(
        runs.iter().all(|&(node, _)| node == "gpu"),
        "the producer ran a task"
    );
    let mut ids: Vec<TaskId> = runs.iter().map(|&(_, id)| id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (1..=30).collect::<Vec<_>>(),
        "each task ran exactly once"
    );
    eventually("every claim is settled", async || {
        cluster.counts().await == (0, 0)
    })
    .await;
    producer.shutdown(WAIT).await.unwrap();
    gpu.shutdown(WAIT).await.unwrap();
}

/// A node whose units bind before its workers do (2 units, 4 workers) claims ahead tasks
/// that wait for the units its runs hold, up to one whole capacity more: a run's end starts
/// the next at once, without a round trip to the queue. It never runs more than its units
/// allow, and each task runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_units_bind_claims_ahead_what_waits_for_them() {
    let cluster = Cluster::new();
    let producer = cluster.node_with("api", 0, 100, 4).await;
    let gpu = cluster.node_with("gpu", 4, 2, 8).await;
    let tasks = (1..=24).map(|id| job(id, 20, Priority::Normal)).collect();
    let keys: Vec<MailboxKey> = producer
        .submit_batch(tasks, SubmitOptions::default())
        .await
        .into_iter()
        .map(|answer| answer.expect("accepted"))
        .collect();
    let (mut most_held, mut most_running) = (0, 0);
    loop {
        let stats = gpu.stats();
        let running = stats.active_tasks;
        most_held = most_held.max(running + stats.queued_tasks);
        most_running = most_running.max(running);
        if cluster.runs().len() == 24 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for (id, key) in (1..=24).zip(&keys) {
        assert_eq!(producer.retrieve(key, WAIT).await, Ok(id), "task {id}");
    }
    assert!(
        most_held > 2,
        "the node never held a task waiting for its units ({most_held})"
    );
    assert!(
        most_held <= 2 + 2,
        "held {most_held} claims, more than its 2 units and one capacity ahead"
    );
    assert!(most_running <= 2, "ran {most_running} at once on 2 units");
    let mut ids: Vec<TaskId> = cluster.runs().iter().map(|&(_, id)| id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (1..=24).collect::<Vec<_>>(),
        "each task ran exactly once"
    );
    producer.shutdown(WAIT).await.unwrap();
    gpu.shutdown(WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unworkable_shared_settings_are_refused() {
    let supervisor = spawn_supervisor().await.unwrap();
    let queue: Arc<dyn SharedQueue<u64>> = Arc::new(InMemorySharedQueue::new());
    let limits = PoolLimits::new(1, 1);
    let cases = [
        (
            SharedParking::new(queue.clone(), " "),
            limits,
            "node name is empty",
        ),
        (
            SharedParking::new(queue.clone(), "n").with_lease(Duration::from_millis(5)),
            limits,
            "lease",
        ),
        (
            SharedParking::new(queue.clone(), "n").with_poll(Duration::ZERO),
            limits,
            "poll",
        ),
        (
            SharedParking::new(queue.clone(), "n")
                .with_lease(Duration::from_secs(3))
                .with_poll(Duration::from_secs(2)),
            limits,
            "at most a third of the lease",
        ),
        // The nodes claim in the queue's order, by admission within a priority: a pool that
        // asks for the deadline order (core rule 20) is refused rather than misordered.
        (
            SharedParking::new(queue.clone(), "n"),
            limits.with_order(QueueOrder::Deadline),
            "order is \"deadline\"",
        ),
    ];
    for (shared, limits, says) in cases {
        let spec = PoolSpec {
            tenant_weights: Default::default(),
            name: "refused".into(),
            limits,
            workers: WorkerSettings {
                count: 1,
                stack_size: None,
                pin_to_cpus: false,
            },
            default_timeout: None,
            restart: RestartPolicy::default(),
            executor: Recorder {
                node: "refused",
                runs: Arc::default(),
            },
            queue: Box::new(InMemoryQueue::new()),
            mailbox: Arc::new(InMemoryMailbox::new()),
            notifiers: Vec::new(),
            result_encoder: None,
            subscribers: Vec::new(),
            retention: None,
            shared: Some(shared),
            durability: Default::default(),
            gpu: None,
            tracer: None,
        };
        match start_pool(&supervisor, spec).await {
            Err(PoolError::InvalidConfig(text)) => assert!(text.contains(says), "{text}"),
            other => panic!(
                "expected InvalidConfig naming {says:?}, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}

/// A paused node claims nothing from the shared queue while the other runs everything; once
/// resumed it claims again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_claims_nothing_and_claims_again_once_resumed() {
    let cluster = Cluster::new();
    let a = cluster.node("node-a").await;
    let b = cluster.node("node-b").await;
    b.pause().await.expect("paused");
    let mut keys = Vec::new();
    for id in 1..=10 {
        let key = a
            .submit(job(id, 5, Priority::Normal), SubmitOptions::default())
            .await
            .unwrap();
        keys.push(key);
    }
    for (id, key) in (1..=10).zip(&keys) {
        assert_eq!(a.retrieve(key, WAIT).await, Ok(id), "task {id}");
    }
    assert!(
        cluster.runs().iter().all(|&(node, _)| node == "node-a"),
        "the paused node ran nothing: {:?}",
        cluster.runs()
    );
    b.resume().await.expect("resumed");
    a.pause().await.expect("paused");
    let key = a
        .submit(job(11, 5, Priority::Normal), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(a.retrieve(&key, WAIT).await, Ok(11));
    assert!(
        cluster.runs().contains(&("node-b", 11)),
        "the resumed node claimed it: {:?}",
        cluster.runs()
    );
    a.shutdown(WAIT).await.unwrap();
    b.shutdown(WAIT).await.unwrap();
}

/// Resuming a drained node ends its pause only: it still claims nothing from the shared
/// queue until it is undrained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_drained_node_does_not_make_it_claim() {
    let cluster = Cluster::new();
    let a = cluster.node("node-a").await;
    let b = cluster.node("node-b").await;
    a.pause().await.expect("paused");
    b.pause().await.expect("paused");
    b.drain().await.expect("drained");
    let key = a
        .submit(job(21, 5, Priority::Normal), SubmitOptions::default())
        .await
        .unwrap();
    b.resume().await.expect("resumed");
    // Give a wrongly claiming node time to claim and run the task.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        cluster.runs().is_empty(),
        "the drained node ran nothing: {:?}",
        cluster.runs()
    );
    b.undrain().await.expect("undrained");
    assert_eq!(a.retrieve(&key, WAIT).await, Ok(21));
    assert_eq!(cluster.runs(), vec![("node-b", 21)]);
    a.shutdown(WAIT).await.unwrap();
    b.shutdown(WAIT).await.unwrap();
}

/// A node of `queue` (4 workers, 4 CPU units) around the dependencies suite's `executor`.
async fn dependencies_node(
    queue: Arc<InMemorySharedQueue<u64>>,
    executor: crate::conformance::dependencies::Steps,
) -> crate::conformance::dependencies::Subject {
    let supervisor = spawn_supervisor().await.unwrap();
    let shared = SharedParking::new(queue, "deps")
        .with_lease(Duration::from_millis(300))
        .with_poll(Duration::from_millis(10));
    let spec = PoolSpec {
        tenant_weights: Default::default(),
        name: "deps".into(),
        limits: PoolLimits::new(4, 4),
        workers: WorkerSettings {
            count: 4,
            stack_size: None,
            pin_to_cpus: false,
        },
        default_timeout: None,
        restart: RestartPolicy::default(),
        executor,
        queue: Box::new(InMemoryQueue::new()),
        mailbox: Arc::new(InMemoryMailbox::new()),
        notifiers: Vec::new(),
        result_encoder: None,
        subscribers: Vec::new(),
        retention: None,
        shared: Some(shared),
        durability: Default::default(),
        gpu: None,
        tracer: None,
    };
    let client = start_pool(&supervisor, spec).await.unwrap();
    crate::conformance::dependencies::Subject {
        client,
        owner: Box::new(supervisor),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_shared_queue_keeps_the_dependencies_contract() {
    crate::conformance::dependencies::run_all(|steps| {
        dependencies_node(Arc::new(InMemorySharedQueue::new()), steps)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_shared_queue_is_refused_naming_the_queues_that_can() {
    let queue = Arc::new(InMemorySharedQueue::new());
    let node = dependencies_node(queue, crate::conformance::dependencies::plain_steps()).await;
    let pool = &node.client;
    // A stream cannot follow a task to another node: refused, naming the queues that can.
    let task = ScheduledTask::new(TaskMetadata::new(77, ResourceCost::cpu(1)), 1u64);
    let Err(refused) = pool
        .submit_streaming(task, SubmitOptions::default(), 4)
        .await
    else {
        panic!("a stream on a shared queue is refused");
    };
    let text = refused.to_string();
    assert!(
        matches!(refused, PoolError::InvalidConfig(_))
            && text.contains("streamed submissions need a local queue")
            && text.contains("in_memory, yaque"),
        "{text}"
    );
}
