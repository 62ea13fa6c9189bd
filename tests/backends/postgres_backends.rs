//! The Postgres backends against the conformance suites, on the real server
//! (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`), plus what only they
//! do: tables created by many processes at once, rows that cannot be read, dead letters.
#![cfg(feature = "postgres")]

#[allow(dead_code)]
use crate::conformance;
use crate::postgres_pools;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use conformance::{mailbox, shared_queue, Job};
use postgres_pools::{build_embedded, fresh_name, work, Doubler, Work};
use prometheus_parking_lot::core::{
    Capacity, FitQuery, Mailbox, PoolError, QueueCounts, QueueMaintenance, ScheduledTask,
    SharedQueue, TaskMetadata,
};
use prometheus_parking_lot::infra::mailbox::postgres::PostgresMailbox;
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::infra::postgres::RetryPolicy;
use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, BuiltPools, QueueBuilderContext, SchedulerConfig,
    TokioSpawner,
};

/// The database every test uses; the tests fail (never skip) when it cannot be reached.
pub(crate) fn database() -> PgDatabase {
    static DATABASE: OnceLock<PgDatabase> = OnceLock::new();
    DATABASE
        .get_or_init(|| {
            let url = std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            PgDatabase::connect(&url).unwrap_or_else(|error| {
                panic!(
                    "the Postgres tests need a server at DATABASE_URL (or 127.0.0.1:5432, \
                     database test); run scripts/test.sh, which starts a local one: {error}"
                )
            })
        })
        .clone()
}

/// Retries off, as the shared-queue suite expects: a rescued task is claimable at once and
/// never dead-lettered.
const NO_RETRY_DELAY: RetryPolicy = RetryPolicy {
    max_attempts: u32::MAX,
    base: Duration::ZERO,
    max: Duration::ZERO,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_conforms() {
    let database = database();
    shared_queue::run_all(|| {
        let database = database.clone();
        async move {
            let queue = tokio::task::spawn_blocking(move || {
                PostgresQueue::<Job>::open(&database, "pl_queue_jobs", &fresh_name("conformance"))
                    .expect("open the queue")
                    .with_retry(NO_RETRY_DELAY)
            })
            .await
            .expect("opening does not panic");
            Box::new(queue) as Box<dyn SharedQueue<Job>>
        }
    })
    .await;
}

/// A Postgres table queue opened in the deadline order, against the deadline cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_in_the_deadline_order_conforms() {
    use prometheus_parking_lot::core::QueueOrder;
    let database = database();
    shared_queue::run_deadline_order(|| {
        let database = database.clone();
        async move {
            let queue = tokio::task::spawn_blocking(move || {
                PostgresQueue::<Job>::open_in_order(
                    &database,
                    "pl_queue_jobs",
                    &fresh_name("deadline"),
                    QueueOrder::Deadline,
                )
                .expect("open the queue")
                .with_retry(NO_RETRY_DELAY)
            })
            .await
            .expect("opening does not panic");
            Box::new(queue) as Box<dyn SharedQueue<Job>>
        }
    })
    .await;
}

/// The pgmq queue against the same suite, unchanged; every queue it made is dropped after.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgmq_queue_conforms() {
    use prometheus_parking_lot::core::QueueOrder;
    let queues = Arc::new(Mutex::new(Vec::new()));
    shared_queue::run_all(|| fresh_pgmq(&queues, "pgmq", QueueOrder::Fifo)).await;
    let queues = queues.lock().unwrap().clone();
    drop_pgmq_queues(&queues).await;
}

/// The pgmq queue opened in the deadline order against the deadline-order suite.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgmq_queue_in_the_deadline_order_conforms() {
    use prometheus_parking_lot::core::QueueOrder;
    let queues = Arc::new(Mutex::new(Vec::new()));
    shared_queue::run_deadline_order(|| fresh_pgmq(&queues, "pgdue", QueueOrder::Deadline)).await;
    let queues = queues.lock().unwrap().clone();
    drop_pgmq_queues(&queues).await;
}

/// A fresh pgmq queue named after `prefix`, claimed in `order`; its PGMQ queues are noted in
/// `made`, for the test to drop.
#[cfg(feature = "pgmq")]
async fn fresh_pgmq(
    made: &Arc<Mutex<Vec<String>>>,
    prefix: &str,
    order: prometheus_parking_lot::core::QueueOrder,
) -> Box<dyn SharedQueue<Job>> {
    use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
    let (database, name) = (database(), fresh_name(prefix));
    let queue = tokio::task::spawn_blocking(move || {
        PgmqQueue::<Job>::open_in_order(&database, &name, order)
            .expect("open the queue")
            .with_retry(NO_RETRY_DELAY)
    })
    .await
    .expect("opening does not panic");
    made.lock().unwrap().extend(queue.pgmq_queues());
    Box::new(queue)
}

/// Drops PGMQ queues a test made, and forgets the entries of the pgmq queue whose dead-letter
/// queue is among them.
#[cfg(feature = "pgmq")]
pub(crate) async fn drop_pgmq_queues(queues: &[String]) {
    for queue in queues {
        let _ = one_row(format!("SELECT pgmq.drop_queue('{queue}')")).await;
        if let Some(name) = queue.strip_suffix("_dlq") {
            let _ = one_row(format!(
                "DELETE FROM pl_pgmq_entries WHERE queue_name = '{name}'"
            ))
            .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_mailbox_conforms() {
    let database = database();
    let tables = Arc::new(Mutex::new(Vec::new()));
    mailbox::run_all(|| {
        let (database, tables) = (database.clone(), Arc::clone(&tables));
        async move {
            let table = fresh_name("conformance_mailbox");
            tables.lock().unwrap().push(table.clone());
            let mailbox = tokio::task::spawn_blocking(move || {
                PostgresMailbox::<String>::open(&database, &table).expect("open the mailbox")
            })
            .await
            .expect("opening does not panic");
            Arc::new(mailbox) as Arc<dyn Mailbox<String>>
        }
    })
    .await;
    let tables = tables.lock().unwrap().clone();
    for table in tables {
        let _ = one_row(format!("DROP TABLE IF EXISTS {table}")).await;
    }
}

// -------------------------------------------------------------------------------------------
// Through pools built from a config
// -------------------------------------------------------------------------------------------

/// One pool on a fresh Postgres queue (and optionally a Postgres mailbox), built from config.
fn postgres_pool(
    context: &QueueBuilderContext,
    database_url: Option<&str>,
    queue: &str,
    mailbox: Option<&str>,
) -> BuiltPools<Work, u64, Doubler> {
    let storage = match mailbox {
        Some(table) => serde_json::json!({ "type": "postgres", "table": table }),
        None => serde_json::json!({ "type": "in_memory" }),
    };
    let mut config = serde_json::json!({ "pools": { "gpu": {
        "worker_threads": 1,
        "max_units": 1,
        "queue": { "type": "postgres", "queue_name": queue, "lease_ms": 3_000 },
        "mailbox": { "storage": storage }
    } } });
    if let Some(url) = database_url {
        config["database_url"] = url.into();
    }
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
    build_pools_from_scheduler_config::<Work, u64, Doubler, TokioSpawner>(
        &config,
        context,
        None,
        |_| Doubler,
        TokioSpawner,
    )
    .expect("the pool starts")
}

async fn one_row(sql: String) -> Option<sea_orm::QueryResult> {
    use sea_orm::ConnectionTrait;
    // A connection of this test's own: the shared handle's pool belongs to its runtime
    // thread, and a connection opened from a test's runtime dies with that runtime.
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let connection = sea_orm::Database::connect(url).await.expect("connect");
    let row = connection
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            sql,
        ))
        .await
        .expect("query");
    let _ = connection.close().await;
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_payload_cannot_be_read_is_dead_lettered_and_the_pool_runs_on() {
    let name = fresh_name("bad_rows");
    let context = QueueBuilderContext::Postgres(database());
    let built = {
        let (context, name) = (context.clone(), name.clone());
        tokio::task::spawn_blocking(move || postgres_pool(&context, None, &name, None))
            .await
            .unwrap()
    };
    let pool = &built.pools["gpu"];
    // Another producer (an older version, say) parks a payload this pool cannot read, ahead
    // of a good one.
    let (writer, good_writer) = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            (
                PostgresQueue::<serde_json::Value>::open(&database(), "pl_queue_jobs", &name)
                    .unwrap(),
                PostgresQueue::<Work>::open(&database(), "pl_queue_jobs", &name).unwrap(),
            )
        })
        .await
        .unwrap()
    };
    let key = MailboxKey::new("acme").with_session("bad-rows");
    let mut bad = work(1, 0, 0, &key).meta;
    bad.priority = Priority::Critical;
    writer
        .enqueue(
            1,
            1,
            ScheduledTask::new(bad, serde_json::json!("not a job")),
        )
        .await
        .unwrap();
    good_writer
        .enqueue(2, 2, work(2, 21, 0, &key))
        .await
        .unwrap();

    let result = pool.retrieve_task(&key, 2, Duration::from_secs(10)).await;
    assert_eq!(result, Ok(42), "the good job runs after the bad one");
    // The bad one's submitter learns why at the node's next poll.
    match pool.retrieve_task(&key, 1, Duration::from_secs(10)).await {
        Err(PoolError::Failed(reason)) => assert!(
            reason.contains("payload does not deserialise"),
            "the failure says why: {reason}"
        ),
        other => panic!("the dead-lettered task must end failed: {other:?}"),
    }
    let row = one_row(format!(
        "SELECT state, last_error FROM pl_queue_jobs WHERE queue_name = '{name}' AND task_id = 1"
    ))
    .await
    .expect("the bad row is kept");
    let state: String = row.try_get("", "state").unwrap();
    let error: String = row.try_get("", "last_error").unwrap();
    assert_eq!(state, "dead");
    assert!(
        error.contains("payload does not deserialise"),
        "the dead letter says why: {error}"
    );
    // The claim is settled just after the result is stored.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while good_writer.counts().await.unwrap() != QueueCounts::default() {
        assert!(
            std::time::Instant::now() < deadline,
            "something is left parked or claimed: {:?}",
            good_writer.counts().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP proxy to the database that can be cut (every connection dropped, new ones refused)
/// and restored.
struct Proxy {
    port: u16,
    up: Arc<std::sync::atomic::AtomicBool>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let (accepting, tracked) = (Arc::clone(&up), Arc::clone(&connections));
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !accepting.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let upstream = upstream.clone();
                let copy = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tracked.lock().unwrap().push(copy.abort_handle());
            }
        });
        Self {
            port,
            up,
            connections,
        }
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_goes_away_fails_submits_clearly_and_the_pool_recovers() {
    let proxy = Proxy::start("127.0.0.1:5432".into()).await;
    let url = format!("postgres://postgres@127.0.0.1:{}/test", proxy.port);
    let (name, table) = (fresh_name("outage"), fresh_name("outage_results"));
    let built = {
        let (url, name, table) = (url.clone(), name.clone(), table.clone());
        tokio::task::spawn_blocking(move || {
            postgres_pool(
                &QueueBuilderContext::Embedded,
                Some(&url),
                &name,
                Some(&table),
            )
        })
        .await
        .unwrap()
    };
    let pool = &built.pools["gpu"];
    let key = MailboxKey::new("acme").with_session("outage");
    // Task 1 holds the only unit for a while; task 2 parks in the table.
    pool.submit(work(1, 1, 1_500, &key)).await.unwrap();
    pool.submit(work(2, 2, 0, &key)).await.unwrap();

    proxy.cut();
    let refused = pool.submit(work(3, 3, 0, &key)).await;
    match refused {
        Err(PoolError::Backend(error)) => {
            let text = error.to_string();
            assert!(
                error.operation == "park a task" && text.contains("postgres"),
                "the error says what failed: {text}"
            );
            assert!(
                error.fault.kind.is_retryable(),
                "a database that is away is worth retrying: {text}"
            );
        }
        other => panic!("a submit while the database is away must fail: {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.restore();

    pool.submit(work(4, 4, 0, &key))
        .await
        .expect("submits work again");
    for (id, doubled) in [(1, 2), (2, 4), (4, 8)] {
        let result = pool.retrieve_task(&key, id, Duration::from_secs(30)).await;
        assert_eq!(result, Ok(doubled), "task {id}: nothing stored was lost");
    }
    let _ = one_row(format!("DROP TABLE IF EXISTS {table}")).await;
}

/// Two attempts, a backoff of one second doubling.
const TWO_ATTEMPTS: RetryPolicy = RetryPolicy {
    max_attempts: 2,
    base: Duration::from_millis(1_000),
    max: Duration::from_secs(60),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_runs_are_retried_after_a_backoff_then_dead_lettered_and_reported_once() {
    let name = fresh_name("retries");
    let queue = tokio::task::spawn_blocking(move || {
        PostgresQueue::<Job>::open(&database(), "pl_queue_jobs", &name)
            .unwrap()
            .with_retry(TWO_ATTEMPTS)
    })
    .await
    .unwrap();
    retried_then_dead_lettered(&queue).await;
}

/// The pgmq queue: `read_ct` past `max_attempts` sends the message to the dead-letter queue
/// with its reason, and a reported letter is archived there.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgmq_lost_runs_are_retried_after_a_backoff_then_dead_lettered_and_reported_once() {
    use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
    let name = fresh_name("pgmq_retries");
    let queue = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            PgmqQueue::<Job>::open(&database(), &name)
                .unwrap()
                .with_retry(TWO_ATTEMPTS)
        })
        .await
        .unwrap()
    };
    retried_then_dead_lettered(&queue).await;
    let count = |table: String| async move {
        let row = one_row(format!("SELECT count(*) AS n FROM pgmq.{table}"))
            .await
            .expect("a count");
        row.try_get::<i64>("", "n").unwrap()
    };
    assert_eq!(count(format!("q_{name}_norm")).await, 0, "left its level");
    assert_eq!(count(format!("q_{name}_dlq")).await, 0, "reported");
    assert_eq!(
        count(format!("a_{name}_dlq")).await,
        1,
        "kept in the archive"
    );
    let row = one_row(format!(
        "SELECT message->>'reason' AS reason, read_ct FROM pgmq.a_{name}_dlq"
    ))
    .await
    .unwrap();
    let reason: String = row.try_get("", "reason").unwrap();
    assert!(reason.ends_with("ran out (attempt 2)"), "{reason}");
    assert_eq!(row.try_get::<i32>("", "read_ct").unwrap(), 2);
    drop_pgmq_queues(&queue.pgmq_queues()).await;
}

/// A task whose every lease runs out is retried after the backoff, then dead-lettered and
/// reported once.
async fn retried_then_dead_lettered(queue: &dyn SharedQueue<Job>) {
    let key = MailboxKey::new("acme").with_user("ada");
    let task = ScheduledTask::new(
        TaskMetadata::new(7, ResourceCost::cpu(2)).with_mailbox(key.clone()),
        Job {
            name: "retry me".into(),
            inputs: vec![1],
        },
    );
    queue.enqueue(1, 1_000, task).await.unwrap();
    let lease = Duration::from_millis(500);
    let any = FitQuery::within(Capacity::uniform(4));

    let first = queue
        .claim_best_fit("ghost", &any, lease, 10_000)
        .await
        .unwrap();
    assert_eq!(first.map(|lease| lease.attempt), Some(1));
    assert_eq!(
        queue.maintenance().rescue_expired(10_500).await,
        Ok(1),
        "the lease ran out"
    );
    let early = queue
        .claim_best_fit("b", &any, lease, 11_499)
        .await
        .unwrap();
    assert!(early.is_none(), "retried only after the backoff of 1 s");
    let second = queue
        .claim_best_fit("b", &any, lease, 11_500)
        .await
        .unwrap();
    assert_eq!(second.map(|lease| lease.attempt), Some(2));

    assert_eq!(
        queue.maintenance().rescue_expired(12_000).await,
        Ok(1),
        "the last attempt ran out"
    );
    assert_eq!(
        queue.maintenance().counts().await.unwrap(),
        QueueCounts::default(),
        "dead, not parked"
    );
    let dead = queue.maintenance().take_dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (&dead[0].key, dead[0].task_id, dead[0].cost),
        (&key, 7, ResourceCost::cpu(2))
    );
    assert!(
        dead[0].reason.contains("ran out (attempt 2)"),
        "{}",
        dead[0].reason
    );
    assert!(
        queue
            .maintenance()
            .take_dead_letters(10)
            .await
            .unwrap()
            .is_empty(),
        "reported once"
    );
}

/// A pgmq pool built from a config (`database_url`, `lease_ms`, `max_attempts`) runs what it
/// is given by priority level, and archives each message once its task is done.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pgmq_pool_built_from_config_runs_tasks_and_archives_them() {
    let name = fresh_name("pgmq_pool");
    let config = serde_json::json!({
        "database_url": std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        "pools": { "gpu": {
            "worker_threads": 1,
            "max_units": 1,
            "queue": { "type": "postgres_pgmq", "queue_name": name, "lease_ms": 3_000,
                       "max_attempts": 2 },
            "mailbox": { "storage": { "type": "in_memory" } }
        } }
    });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
    let built = build_embedded(config).await;
    let pool = &built.pools["gpu"];
    let key = MailboxKey::new("acme").with_session("pgmq");
    // The first runs at once; the other two park, one per level, and run after it.
    for (id, priority) in [
        (1, Priority::Normal),
        (2, Priority::Low),
        (3, Priority::High),
    ] {
        let mut task = work(id, id * 10, 100, &key);
        task.meta.priority = priority;
        pool.submit(task).await.expect("accepted");
    }
    for id in [1, 2, 3] {
        let result = pool.retrieve_task(&key, id, Duration::from_secs(20)).await;
        assert_eq!(result, Ok(id * 20), "task {id}");
    }
    // A run's settle may still be on its way when its result is retrieved: wait for it.
    let counts = || async {
        let archived = one_row(format!(
            "SELECT (SELECT count(*) FROM pgmq.a_{name}_norm) AS norm, \
                    (SELECT count(*) FROM pgmq.a_{name}_low) AS low, \
                    (SELECT count(*) FROM pgmq.a_{name}_high) AS high, \
                    (SELECT count(*) FROM pgmq.q_{name}_norm) + (SELECT count(*) FROM pgmq.q_{name}_low) \
                      + (SELECT count(*) FROM pgmq.q_{name}_high) AS queued"
        ))
        .await
        .unwrap();
        let count = |column: &str| archived.try_get::<i64>("", column).unwrap();
        (count("norm"), count("low"), count("high"), count("queued"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = counts().await;
    while seen != (1, 1, 1, 0) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = counts().await;
    }
    assert_eq!(seen, (1, 1, 1, 0), "every message archived in its level");
    drop(built);
    let queues: Vec<String> = ["crit", "high", "norm", "low", "dlq"]
        .iter()
        .map(|suffix| format!("{name}_{suffix}"))
        .collect();
    drop_pgmq_queues(&queues).await;
}

/// The shipped `config/cloud_pgmq.json` builds a pgmq pool that runs what it is given.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_pgmq_config_builds_a_working_pool() {
    if std::env::var("DATABASE_URL").is_err() {
        std::env::set_var("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test");
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/cloud_pgmq.json");
    let config = SchedulerConfig::from_path(path).expect("the shipped file loads");
    let built = build_embedded(config).await;
    let pool = &built.pools["llm_inference"];
    let key = MailboxKey::new("acme").with_session(fresh_name("shipped"));
    pool.submit(work(1, 21, 0, &key)).await.expect("accepted");
    let result = pool.retrieve_task(&key, 1, Duration::from_secs(20)).await;
    assert_eq!(result, Ok(42));
}

/// A pgmq message whose payload this node cannot read goes to the dead-letter queue with the
/// reason when claimed, and the claim goes on to the next message.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pgmq_message_that_cannot_be_read_is_dead_lettered_and_the_claim_goes_on() {
    use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
    let name = fresh_name("pgmq_bad");
    let (writer, queue) = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            (
                PgmqQueue::<serde_json::Value>::open(&database(), &name).unwrap(),
                PgmqQueue::<Work>::open(&database(), &name).unwrap(),
            )
        })
        .await
        .unwrap()
    };
    let key = MailboxKey::new("acme").with_session("bad-messages");
    let mut bad = work(1, 0, 0, &key).meta;
    bad.priority = Priority::Critical;
    let not_a_job = ScheduledTask::new(bad, serde_json::json!("not a job"));
    writer.enqueue(1, 1, not_a_job).await.unwrap();
    queue.enqueue(2, 2, work(2, 21, 0, &key)).await.unwrap();

    let any = FitQuery::within(Capacity::uniform(4));
    let lease = Duration::from_secs(30);
    let claimed = queue.claim_best_fit("n", &any, lease, 10).await.unwrap();
    assert_eq!(
        claimed.map(|lease| (lease.entry, lease.task.payload)),
        Some((2, Work { n: 21, ms: 0 })),
        "the readable message, past the bad one"
    );
    assert_eq!(
        queue.counts().await.unwrap(),
        QueueCounts {
            parked: 0,
            claimed: 1
        }
    );
    let dead = queue.take_dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((&dead[0].key, dead[0].task_id), (&key, 1));
    assert!(
        dead[0].reason.contains("payload does not deserialise"),
        "{}",
        dead[0].reason
    );
    let done = prometheus_parking_lot::core::Settlement::Done;
    let claim = prometheus_parking_lot::core::Claim::new(2, 1);
    assert_eq!(queue.settle("n", claim, done).await, Ok(()));
    let archived = one_row(format!(
        "SELECT (SELECT count(*) FROM pgmq.a_{name}_dlq) AS dead, \
                (SELECT count(*) FROM pgmq.a_{name}_norm) AS done"
    ))
    .await
    .unwrap();
    assert_eq!(archived.try_get::<i64>("", "dead").unwrap(), 1);
    assert_eq!(archived.try_get::<i64>("", "done").unwrap(), 1);
    drop_pgmq_queues(&queue.pgmq_queues()).await;
}

/// The fenced store, against both queue layouts: a result goes in only under the claim that
/// still holds its task, in the transaction that ends the claim. A claim that ran out and
/// was taken again (here by the same node, the hardest case) stores nothing and ends
/// nothing; the fresh claim stores its result and ends its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_store_publishes_only_under_the_claim_that_holds() {
    let database = database();
    let name = fresh_name("fence");
    let (queue, results) = {
        let (database, name) = (database.clone(), name.clone());
        tokio::task::spawn_blocking(move || {
            let queue = PostgresQueue::<Job>::open(&database, "pl_queue_jobs", &name)
                .unwrap()
                .with_retry(NO_RETRY_DELAY);
            let results = PostgresMailbox::<String>::open(&database, &format!("{name}_results"))
                .unwrap()
                .settling_claims_of(queue.fence())
                .unwrap();
            (queue, results)
        })
        .await
        .unwrap()
    };
    fenced_store_rules(&queue, &results, &name).await;
}

/// [`a_fenced_store_publishes_only_under_the_claim_that_holds`] on PGMQ.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_store_on_pgmq_publishes_only_under_the_claim_that_holds() {
    use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
    let database = database();
    let name = fresh_name("pgfence");
    let (queue, results) = {
        let (database, name) = (database.clone(), name.clone());
        tokio::task::spawn_blocking(move || {
            let queue = PgmqQueue::<Job>::open(&database, &name)
                .unwrap()
                .with_retry(NO_RETRY_DELAY);
            let results = PostgresMailbox::<String>::open(&database, &format!("{name}_results"))
                .unwrap()
                .settling_claims_of(queue.fence())
                .unwrap();
            (queue, results)
        })
        .await
        .unwrap()
    };
    fenced_store_rules(&queue, &results, &name).await;
    let queues = queue.pgmq_queues();
    drop_pgmq_queues(&queues).await;
}

async fn fenced_store_rules(
    queue: &dyn SharedQueue<Job>,
    results: &PostgresMailbox<String>,
    name: &str,
) {
    use prometheus_parking_lot::core::{Delivery, FencedDelivery, Settlement};
    let key = MailboxKey::new("acme").with_session(name);
    let meta = TaskMetadata::new(7, ResourceCost::cpu(1)).with_mailbox(key.clone());
    queue
        .enqueue(1, 1, ScheduledTask::new(meta, Job::for_task(7)))
        .await
        .unwrap();
    let any = FitQuery::within(Capacity::uniform(4));
    let lease = Duration::from_millis(100);
    let stale = queue.claim_best_fit("a", &any, lease, 10).await.unwrap();
    let stale = stale.expect("claimed").claim();
    assert_eq!(queue.maintenance().rescue_expired(10_000).await, Ok(1));
    let fresh = queue
        .claim_best_fit("a", &any, lease, 10_001)
        .await
        .unwrap();
    let fresh = fresh.expect("claimed again").claim();
    assert_eq!(fresh.attempt, 2);

    let fenced = |claim, text: &str| FencedDelivery {
        key: key.clone(),
        delivery: Delivery {
            task_id: 7,
            outcome: Ok(text.to_owned()),
            stored_at_ms: 20_000,
        },
        claim,
        settlement: Settlement::Done,
    };
    assert!(results.fences_claims());
    let late = results
        .store_fenced("a", vec![fenced(stale, "stale")])
        .await;
    assert_eq!(late, vec![Ok(false)], "the stale claim publishes nothing");
    assert_eq!(results.list(&key).await, Ok(vec![]));
    let counts = queue.maintenance().counts().await.unwrap();
    assert_eq!(
        counts,
        QueueCounts {
            parked: 0,
            claimed: 1
        },
        "the fresh claim stands"
    );

    let stored = results
        .store_fenced("b", vec![fenced(fresh, "wrong node")])
        .await;
    assert_eq!(
        stored,
        vec![Ok(false)],
        "another node's store under it neither"
    );
    let stored = results
        .store_fenced("a", vec![fenced(fresh, "fresh")])
        .await;
    assert_eq!(stored, vec![Ok(true)]);
    let counts = queue.maintenance().counts().await.unwrap();
    assert_eq!(counts, QueueCounts::default(), "settled with the store");
    let taken = results.take_task(&key, 7).await.unwrap().expect("stored");
    assert_eq!(taken.outcome, Ok("fresh".to_owned()));
    assert_eq!(results.list(&key).await, Ok(vec![]), "one record");
}

/// A result is answered only to the submission that produced it: while an earlier task's
/// result waits under a key, a new task of the same id under that key is refused
/// (`ResultPending`), alone or in a batch, and never receives it; another key, or the same
/// id once the result is taken, is accepted and gets its own result. Through the config
/// path, with the mailbox that awaits (Postgres) and the inline one (memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_task_never_receives_an_earlier_tasks_result() {
    for storage in ["postgres", "in_memory"] {
        let table = fresh_name("pending");
        let storage_settings = match storage {
            "postgres" => serde_json::json!({ "type": "postgres", "table": table }),
            _ => serde_json::json!({ "type": "in_memory" }),
        };
        let config = serde_json::json!({
            "database_url": postgres_pools::server_url(),
            "pools": { "gpu": {
                "worker_threads": 1,
                "max_units": 4,
                "queue": { "type": "in_memory" },
                "mailbox": { "storage": storage_settings }
            } }
        });
        let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
        let built = postgres_pools::build_embedded(config).await;
        let pool = &built.pools["gpu"];
        let key = MailboxKey::new("acme").with_session(&table);
        let other = MailboxKey::new("acme").with_session(format!("{table}-other"));
        pool.submit(work(5, 10, 0, &key))
            .await
            .expect("the first task");
        let wait = Duration::from_secs(10);
        let deadline = std::time::Instant::now() + wait;
        while pool.stats().completed_tasks < 1 {
            assert!(std::time::Instant::now() < deadline, "{storage}: it ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let again = pool.submit(work(5, 20, 0, &key)).await;
        assert_eq!(again, Err(PoolError::ResultPending(5)), "{storage}: alone");
        let batch = pool
            .client()
            .submit_batch(
                vec![work(6, 60, 0, &key), work(5, 30, 0, &key)],
                Default::default(),
            )
            .await;
        assert_eq!(
            batch,
            vec![Ok(key.clone()), Err(PoolError::ResultPending(5))],
            "{storage}: in a batch, only the reused id"
        );
        assert_eq!(pool.submit(work(5, 40, 0, &other)).await, Ok(other.clone()));
        assert!(PoolError::ResultPending(5)
            .to_string()
            .contains("retrieve it"));

        assert_eq!(pool.retrieve_task(&other, 5, wait).await, Ok(80));
        assert_eq!(pool.retrieve_task(&key, 6, wait).await, Ok(120));
        assert_eq!(
            pool.retrieve_task(&key, 5, wait).await,
            Ok(20),
            "the first result"
        );
        pool.submit(work(5, 50, 0, &key))
            .await
            .expect("taken: the id is free again");
        assert_eq!(
            pool.retrieve_task(&key, 5, wait).await,
            Ok(100),
            "its own result"
        );
        pool.shutdown_with_drain(Duration::from_secs(5)).await.ok();
        if storage == "postgres" {
            let _ = one_row(format!("DROP TABLE IF EXISTS {table}")).await;
        }
    }
}

/// With `"on_duplicate": "attach"`, a repeated submission runs nothing again: while the
/// original is live it gets the original's key (even when it names another key of the same
/// tenant), and while its result waits it gets its own key, where that result is. Through the
/// config path, with the mailbox that awaits (Postgres, asked by the client) and the inline
/// one (asked by the scheduler).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_attach_a_repeated_submission_gets_the_original_and_nothing_runs_again() {
    for storage in ["postgres", "in_memory"] {
        let table = fresh_name("attach");
        let storage_settings = match storage {
            "postgres" => serde_json::json!({ "type": "postgres", "table": table }),
            _ => serde_json::json!({ "type": "in_memory" }),
        };
        let config = serde_json::json!({
            "database_url": postgres_pools::server_url(),
            "pools": { "gpu": {
                "worker_threads": 1,
                "max_units": 4,
                "on_duplicate": "attach",
                "queue": { "type": "in_memory" },
                "mailbox": { "storage": storage_settings }
            } }
        });
        let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
        let built = postgres_pools::build_embedded(config).await;
        let pool = &built.pools["gpu"];
        let key = MailboxKey::new("acme").with_session(&table);
        let other = MailboxKey::new("acme").with_session(format!("{table}-other"));
        pool.submit(work(5, 10, 300, &key))
            .await
            .expect("the original");
        // Live: the same id, whatever key it names, attaches to the original.
        assert_eq!(
            pool.submit(work(5, 99, 0, &key)).await,
            Ok(key.clone()),
            "{storage}"
        );
        assert_eq!(
            pool.submit(work(5, 98, 0, &other)).await,
            Ok(key.clone()),
            "{storage}"
        );
        let wait = Duration::from_secs(10);
        let deadline = std::time::Instant::now() + wait;
        while pool.stats().completed_tasks < 1 {
            assert!(std::time::Instant::now() < deadline, "{storage}: it ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Ended, its result waiting: alone and in a batch, the caller gets the key back.
        assert_eq!(
            pool.submit(work(5, 97, 0, &key)).await,
            Ok(key.clone()),
            "{storage}"
        );
        let batch = pool
            .client()
            .submit_batch(
                vec![work(6, 60, 0, &key), work(5, 96, 0, &key)],
                Default::default(),
            )
            .await;
        assert_eq!(batch, vec![Ok(key.clone()), Ok(key.clone())], "{storage}");
        assert_eq!(
            pool.retrieve_task(&key, 5, wait).await,
            Ok(20),
            "{storage}: the original's"
        );
        assert_eq!(
            pool.retrieve_task(&key, 6, wait).await,
            Ok(120),
            "{storage}"
        );
        let stats = pool.stats();
        assert_eq!(
            (stats.submitted_tasks, stats.completed_tasks),
            (2, 2),
            "{storage}: tasks 5 and 6 ran once each"
        );
        drop(built);
    }
}

/// A pool of `queue_type` (a shared queue in Postgres) built from a config around the
/// dependencies suite's executor `steps` (4 workers, 4 CPU units), its queue keeping
/// dependencies.
async fn dependencies_pool(
    queue_type: &str,
    name: &str,
    steps: conformance::dependencies::Steps,
) -> BuiltPools<u64, u64, conformance::dependencies::Steps> {
    dependencies_pool_with(queue_type, name, steps, true).await
}

/// [`dependencies_pool`], keeping dependencies as `dependencies` says.
async fn dependencies_pool_with(
    queue_type: &str,
    name: &str,
    steps: conformance::dependencies::Steps,
    dependencies: bool,
) -> BuiltPools<u64, u64, conformance::dependencies::Steps> {
    let queue = serde_json::json!({ "type": queue_type, "queue_name": name, "lease_ms": 3_000,
                                    "dependencies": dependencies });
    let config = serde_json::json!({
        "database_url": postgres_pools::server_url(),
        "pools": { "deps": {
            "worker_threads": 4,
            "max_units": 4,
            "queue": queue,
            "mailbox": { "storage": { "type": "in_memory" } }
        } }
    });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
    tokio::task::spawn_blocking(move || {
        build_pools_from_scheduler_config::<
            u64,
            u64,
            conformance::dependencies::Steps,
            TokioSpawner,
        >(
            &config,
            &QueueBuilderContext::Embedded,
            None,
            |_| steps.clone(),
            TokioSpawner,
        )
        .expect("the pool starts")
    })
    .await
    .expect("building does not panic")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_keeps_the_dependencies_contract() {
    conformance::dependencies::run_all(|steps| async move {
        let mut built = dependencies_pool("postgres", &fresh_name("deps"), steps).await;
        built.pools.remove("deps").expect("the pool deps")
    })
    .await;
}

/// The dependencies suite's refusal on `pool`, a pool of `queue` without dependencies, and
/// a refusal whose words name `setting`.
async fn refuses_parents_naming(
    pool: &prometheus_parking_lot::core::PoolClient<u64, u64>,
    queue: &str,
    setting: &str,
) {
    conformance::dependencies::refused_where_unsupported(pool, queue).await;
    let refused = pool
        .submit(
            conformance::dependencies::step("planner", 50, 1),
            conformance::dependencies::after(&[1]),
        )
        .await;
    assert!(
        matches!(&refused, Err(PoolError::Dependency(refusal)) if refusal.to_string().contains(setting)),
        "{refused:?}"
    );
}

/// A table queue without `"dependencies": true` pays nothing for them: a task that names
/// parents is refused, naming the setting, and a run that ends leaves no row behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_queue_without_dependencies_refuses_parents_and_keeps_no_ended_row() {
    use sea_orm::ConnectionTrait;
    let name = fresh_name("nodeps");
    let steps = conformance::dependencies::plain_steps();
    let built = dependencies_pool_with("postgres", &name, steps, false).await;
    let pool = built.pools["deps"].client();
    refuses_parents_naming(pool, "postgres", "\"dependencies\": true").await;
    // The two runs' settles follow their results by a moment.
    let count = format!("SELECT count(*) AS n FROM pl_queue_jobs WHERE queue_name = '{name}'");
    let mut left = i64::MAX;
    for _ in 0..100 {
        let row = database()
            .connection()
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                count.clone(),
            ))
            .await
            .expect("count")
            .expect("a row");
        left = row.try_get("", "n").expect("n");
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "every ended task's row is gone");
    drop(built);
}

/// A pgmq queue without `"dependencies": true` refuses a task that names parents, naming
/// the setting, and takes the same task without them.
#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pgmq_queue_without_dependencies_refuses_parents() {
    let name = fresh_name("nodeps");
    let steps = conformance::dependencies::plain_steps();
    let built = dependencies_pool_with("postgres_pgmq", &name, steps, false).await;
    let pool = built.pools["deps"].client();
    let setting = "postgres_pgmq (the pgmq queue with \"dependencies\": true)";
    refuses_parents_naming(pool, "pgmq", setting).await;
    drop(built);
    let queues = ["crit", "high", "norm", "low", "dlq"].map(|suffix| format!("{name}_{suffix}"));
    drop_pgmq_queues(&queues).await;
}

#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgmq_queue_keeps_the_dependencies_contract() {
    let names = std::sync::Mutex::new(Vec::new());
    conformance::dependencies::run_all(|steps| {
        let name = fresh_name("deps");
        names.lock().expect("names").push(name.clone());
        async move {
            let mut built = dependencies_pool("postgres_pgmq", &name, steps).await;
            built.pools.remove("deps").expect("the pool deps")
        }
    })
    .await;
    let queues: Vec<String> = names
        .into_inner()
        .expect("names")
        .iter()
        .flat_map(|name| {
            ["crit", "high", "norm", "low", "dlq"].map(|suffix| format!("{name}_{suffix}"))
        })
        .collect();
    drop_pgmq_queues(&queues).await;
}

/// `BuiltPools::shutdown` returns once its nodes have stopped: two nodes of a Postgres table
/// queue (a producer and a worker holding claims ahead) are stopped mid-run, and at once
/// after the queue's table is dropped under a short lock timeout, which a node still
/// renewing or settling its claims would hold up. Every task submitted before the stop
/// either ran or is still parked in the table for another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_of_built_pools_returns_once_the_nodes_have_stopped() {
    use sea_orm::ConnectionTrait;
    let (queue, table) = (fresh_name("stop"), fresh_name("pl_stop_jobs"));
    let node = |workers: usize| {
        let config = serde_json::json!({
            "database_url": postgres_pools::server_url(),
            "pools": { "gpu": {
                "worker_threads": workers,
                "max_units": 4,
                "queue": { "type": "postgres", "table": table, "queue_name": queue,
                           "claim_ahead": 8 },
                "mailbox": { "storage": { "type": "in_memory" } }
            } }
        });
        SchedulerConfig::from_json_str(&config.to_string()).expect("valid config")
    };
    let producer = build_embedded(node(0)).await;
    let worker = build_embedded(node(2)).await;
    let key = MailboxKey::new("acme").with_session(fresh_name("stop"));
    for id in 1..=40 {
        producer.pools["gpu"]
            .submit(work(id, id, 50, &key))
            .await
            .expect("accepted");
    }
    // The worker runs some of them (2 at a time, 50 ms each) before it is stopped.
    let started = std::time::Instant::now();
    while worker.pools["gpu"].stats().completed_tasks < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the worker runs nothing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopped = tokio::time::timeout(Duration::from_secs(20), async {
        worker.shutdown(Duration::from_secs(5)).await?;
        producer.shutdown(Duration::from_secs(5)).await
    })
    .await;
    assert_eq!(stopped.expect("the stop returns in time"), Ok(()));
    let admin = database();
    let left = admin
        .connection()
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT count(*) FILTER (WHERE state = 'claimed') AS claimed, \
                        count(*) FILTER (WHERE state = 'parked') AS parked FROM {table}"
            ),
        ))
        .await
        .expect("count")
        .expect("a row");
    let claimed: i64 = left.try_get("", "claimed").expect("claimed");
    let parked: i64 = left.try_get("", "parked").expect("parked");
    assert_eq!(
        claimed, 0,
        "a stopped node handed back or settled every claim"
    );
    assert!(
        parked < 40,
        "the worker ran some of the tasks before it stopped ({parked} left)"
    );
    admin
        .connection()
        .execute_unprepared(&format!(
            "SET lock_timeout = '2s'; DROP TABLE {table} CASCADE; RESET lock_timeout"
        ))
        .await
        .expect("nothing of the stopped nodes holds the table");
}

/// A pool built from a config on a queue of `queue_type` with `max_queued_units` keeps it
/// for the fleet, in the database: a task of higher priority sheds the worst-ranked parked task of a
/// lower one, whose caller hears `QueueFull` (through the node that reads the dead letter);
/// one with nothing of a lower priority to shed is refused `QueueFull` at its submit.
async fn bounded_pool_sheds_and_refuses_for_the_fleet(queue_type: &str) -> String {
    let name = fresh_name("bounded");
    let config = serde_json::json!({
        "database_url": std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        "pools": { "gpu": {
            "worker_threads": 1,
            "max_units": 1,
            "max_queued_units": 2,
            "queue": { "type": queue_type, "queue_name": name, "lease_ms": 3_000 },
            "mailbox": { "storage": { "type": "in_memory" } }
        } }
    });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
    let built = build_embedded(config).await;
    let pool = &built.pools["gpu"];
    let key = MailboxKey::new("acme").with_session("bounded");
    let submit = |id: u64, ms: u64, priority: Priority| {
        let mut task = work(id, id, ms, &key);
        task.meta.priority = priority;
        pool.submit(task)
    };
    submit(1, 600, Priority::Normal)
        .await
        .expect("runs at once");
    submit(2, 0, Priority::Low).await.expect("parks: 1 unit");
    submit(3, 0, Priority::Low).await.expect("parks: 2 units");
    submit(4, 0, Priority::High)
        .await
        .expect("sheds task 3, the worst Low one");
    assert_eq!(
        submit(5, 0, Priority::Low).await,
        Err(PoolError::QueueFull),
        "nothing below Low to shed"
    );
    let wait = Duration::from_secs(20);
    assert_eq!(
        pool.retrieve_task(&key, 3, wait).await,
        Err(PoolError::QueueFull),
        "the shed task's caller hears it"
    );
    for id in [1, 2, 4] {
        assert_eq!(
            pool.retrieve_task(&key, id, wait).await,
            Ok(id * 2),
            "task {id}"
        );
    }
    drop(built);
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_bounding_its_queued_units_on_the_table_sheds_and_refuses_for_the_fleet() {
    bounded_pool_sheds_and_refuses_for_the_fleet("postgres").await;
}

#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_bounding_its_queued_units_on_pgmq_sheds_and_refuses_for_the_fleet() {
    let name = bounded_pool_sheds_and_refuses_for_the_fleet("postgres_pgmq").await;
    let queues = ["crit", "high", "norm", "low", "dlq"].map(|suffix| format!("{name}_{suffix}"));
    drop_pgmq_queues(&queues).await;
}
