//! A pool's `order` and `max_queued_units` from a configuration file (core rules 20 and 21),
//! through `build_pools_from_scheduler_config` to a running pool: tasks of one priority start
//! earliest deadline first, and a full queue sheds its lowest priority for a newcomer of a
//! higher one, the shed task's caller hearing `QueueFull`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_parking_lot::core::QueueOrder;
use prometheus_parking_lot::*;
use tokio::sync::Semaphore;

/// Runs a task once the gate lets it, and notes the order in which tasks ran.
#[derive(Clone)]
struct Recorder {
    gate: Arc<Semaphore>,
    ran: Arc<Mutex<Vec<u64>>>,
}

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Recorder {
    async fn execute(&self, payload: String, meta: TaskMetadata) -> String {
        self.gate.acquire().await.expect("gate open").forget();
        self.ran.lock().expect("ran").push(meta.id);
        payload
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < give_up,
            "waited too long for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ordered_pool_with_a_unit_bound_sheds_the_lowest_priority() {
    let text = r#"{ "pools": { "p": {
        "worker_threads": 1, "max_units": 4, "max_queue_depth": 3,
        "max_queued_units": 8, "order": "deadline"
    } } }"#;
    let config = SchedulerConfig::from_json_str(text).unwrap();
    let settings = config.worker_pool_config("p", 4).unwrap();
    assert_eq!(settings.limits().order, QueueOrder::Deadline);
    assert_eq!(settings.limits().max_queued_units, Some(8));
    let recorder = Recorder {
        gate: Arc::new(Semaphore::new(0)),
        ran: Arc::default(),
    };
    let built = build_pools_from_scheduler_config::<String, String, Recorder, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| recorder.clone(),
        TokioSpawner,
    )
    .unwrap();
    let pool = built.pools.get("p").expect("pool");
    let submit = |id, priority, units, deadline_in_ms: Option<u128>| {
        let mut meta = TaskMetadata::new(id, ResourceCost::gpu_vram(units))
            .with_priority(priority)
            .with_mailbox(MailboxKey::new(format!("caller{id}")));
        meta.deadline_ms = deadline_in_ms.map(|ms| now_ms() + ms);
        pool.submit(ScheduledTask {
            meta,
            payload: format!("task{id}"),
        })
    };
    // Task 1 takes the pool's 4 units; 2, 3 and 4 fill the queue: 3 tasks, 8 units.
    let first = submit(1, Priority::Normal, 4, None).await.unwrap();
    until("task 1 running", || pool.stats().used_units == 4).await;
    let low = submit(2, Priority::Low, 4, None).await.unwrap();
    let later = submit(3, Priority::Normal, 2, Some(600_000)).await.unwrap();
    let sooner = submit(4, Priority::Normal, 2, Some(300_000)).await.unwrap();
    until("three parked", || pool.stats().queued_tasks == 3).await;
    // A High task takes the Low task's place; the Low task's caller hears QueueFull.
    let high = submit(5, Priority::High, 2, None).await.unwrap();
    assert_eq!(
        pool.retrieve(&low, Duration::from_secs(10)).await,
        Err(PoolError::QueueFull)
    );
    assert_eq!(pool.stats().queued_tasks, 3);
    // A Normal task finds no lower priority to shed: it is refused itself.
    assert_eq!(
        submit(6, Priority::Normal, 1, None).await,
        Err(PoolError::QueueFull)
    );
    let stats = pool.stats();
    assert_eq!((stats.submitted_tasks, stats.rejected_tasks), (5, 2));
    // The gate opens: High first, then Normal by deadline, the sooner one first.
    recorder.gate.add_permits(8);
    for key in [&first, &high, &sooner, &later] {
        pool.retrieve(key, Duration::from_secs(10)).await.unwrap();
    }
    assert_eq!(*recorder.ran.lock().unwrap(), vec![1, 5, 4, 3]);
}

/// The deadline order on a Postgres table queue, from a configuration file: what waits in
/// the shared queue is claimed highest priority first, then earliest deadline, then the
/// tasks without one by admission.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ordered_postgres_queue_is_claimed_earliest_deadline_first() {
    use prometheus_parking_lot::infra::postgres::fleet::FleetQueue;
    let queue = format!("deadline_{}_{}", std::process::id(), now_ms());
    let fleet = FleetQueue::table("pl_queue_jobs", &queue).unwrap();
    claimed_earliest_deadline_first("postgres", &queue, fleet).await;
}

/// The same on a pgmq queue, whose levels are claimed, and listed, by deadline.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ordered_pgmq_queue_is_claimed_earliest_deadline_first() {
    use prometheus_parking_lot::infra::postgres::fleet::FleetQueue;
    use prometheus_parking_lot::infra::postgres::PgDatabase;
    use sea_orm::ConnectionTrait;
    let queue = format!("pgdue_{}_{}", std::process::id(), now_ms());
    claimed_earliest_deadline_first("postgres_pgmq", &queue, FleetQueue::pgmq(&queue)).await;
    let database = PgDatabase::connect(&database_url()).unwrap();
    for suffix in ["crit", "high", "norm", "low", "dlq"] {
        let drop = format!("SELECT pgmq.drop_queue('{queue}_{suffix}')");
        let _ = database.connection().execute_unprepared(&drop).await;
    }
    let forget = format!("DELETE FROM pl_pgmq_entries WHERE queue_name = '{queue}'");
    let _ = database.connection().execute_unprepared(&forget).await;
}

#[cfg(feature = "postgres")]
fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A pool on queue `queue` of type `queue_type`, built from a file with `"order":
/// "deadline"`: its parked tasks are listed (through `fleet`) and claimed highest priority
/// first, then earliest deadline, then the tasks without one by admission.
#[cfg(feature = "postgres")]
async fn claimed_earliest_deadline_first(
    queue_type: &str,
    queue: &str,
    fleet: prometheus_parking_lot::infra::postgres::fleet::FleetQueue,
) {
    use prometheus_parking_lot::infra::postgres::fleet::FleetView;
    use prometheus_parking_lot::infra::postgres::PgDatabase;
    let database_url = database_url();
    let text = serde_json::json!({
        "database_url": database_url,
        "pools": { "chat": {
            "worker_threads": 1, "max_units": 4, "order": "deadline",
            "queue": { "type": queue_type, "queue_name": queue, "lease_ms": 5_000 }
        } }
    })
    .to_string();
    let config = SchedulerConfig::from_json_str(&text).unwrap();
    let recorder = Recorder {
        gate: Arc::new(Semaphore::new(0)),
        ran: Arc::default(),
    };
    let built = tokio::task::block_in_place(|| {
        build_pools_from_scheduler_config::<String, String, Recorder, TokioSpawner>(
            &config,
            &QueueBuilderContext::Embedded,
            None,
            |_name| recorder.clone(),
            TokioSpawner,
        )
    })
    .unwrap();
    let pool = built.pools.get("chat").expect("pool");
    let submit = |id, priority, deadline_in_ms: Option<u128>| {
        let mut meta = TaskMetadata::new(id, ResourceCost::gpu_vram(4))
            .with_priority(priority)
            .with_mailbox(MailboxKey::new(format!("caller{id}")));
        meta.deadline_ms = deadline_in_ms.map(|ms| now_ms() + ms);
        pool.submit(ScheduledTask {
            meta,
            payload: format!("task{id}"),
        })
    };
    // Task 1 holds the node's 4 units; the rest park in the table, in this admission order.
    let mut keys = vec![submit(1, Priority::Normal, None).await.unwrap()];
    until("task 1 running", || pool.stats().used_units == 4).await;
    for (id, priority, deadline) in [
        (2, Priority::Normal, None),
        (3, Priority::Normal, Some(600_000)),
        (4, Priority::Normal, Some(300_000)),
        (5, Priority::Normal, Some(300_000)),
        (6, Priority::High, None),
    ] {
        keys.push(submit(id, priority, deadline).await.unwrap());
    }
    // The fleet view lists them, and counts their places, in the order they will be claimed.
    let view = FleetView::new(
        PgDatabase::connect(&database_url).unwrap(),
        fleet.in_order(QueueOrder::Deadline),
    );
    let page = view.parked(0, 10).await.unwrap();
    let listed: Vec<_> = page
        .parked
        .iter()
        .map(|t| (t.position, t.task_id))
        .collect();
    assert_eq!(listed, [(0, 6), (1, 4), (2, 5), (3, 3), (4, 2)]);
    let why = view
        .why_waiting(&MailboxKey::new("caller3"), 3)
        .await
        .unwrap();
    assert_eq!(
        why.map(|t| t.position),
        Some(3),
        "6, 4 and 5 are ahead of task 3"
    );
    recorder.gate.add_permits(keys.len());
    for key in &keys {
        pool.retrieve(key, Duration::from_secs(10)).await.unwrap();
    }
    assert_eq!(*recorder.ran.lock().unwrap(), vec![1, 6, 4, 5, 3, 2]);
}
