//! `PoolStats::submitted_tasks` counts each submission once, on every backend (issue #40): a
//! pool given N tasks reads N submitted once all ended, its outcomes add up to N, and no
//! reading on the way shows more outcomes than submissions. Tasks claimed from a shared
//! queue count in the outcomes of the node that ran them, and in the submissions of the node
//! they were submitted to only.

#[path = "support/postgres_pools.rs"]
mod postgres_pools;

use std::time::{Duration, Instant};

use postgres_pools::{build_embedded, work};
use prometheus_parking_lot::core::PoolStats;
use prometheus_parking_lot::util::serde::{MailboxKey, Priority};
use prometheus_parking_lot::{PoolError, SchedulerConfig};

/// Tasks each test submits: many more than run at once, so most park first.
const TASKS: u64 = 30;

/// The tasks that ended, in any state.
fn outcomes(stats: &PoolStats) -> u64 {
    stats.completed_tasks
        + stats.failed_tasks
        + stats.timed_out_tasks
        + stats.expired_tasks
        + stats.cancelled_tasks
        + stats.rejected_tasks
}

/// A config of one pool `gpu` (two workers, two units) with `queue`.
fn config(queue: serde_json::Value) -> SchedulerConfig {
    let config = serde_json::json!({
        "database_url": postgres_pools::server_url(),
        "pools": { "gpu": {
            "worker_threads": 2,
            "max_units": 2,
            "max_queue_depth": 1_000,
            "queue": queue,
            "mailbox": { "storage": { "type": "in_memory" } }
        } }
    });
    SchedulerConfig::from_json_str(&config.to_string()).expect("valid config")
}

/// Submits [`TASKS`] tasks to the pool `gpu` that `config` builds, waits until all ended
/// (checking every reading on the way) and checks the counts, a while later too.
async fn each_submission_counts_once(config: SchedulerConfig, label: &str) {
    let built = build_embedded(config).await;
    let pool = &built.pools["gpu"];
    let key = MailboxKey::new("acme").with_session(postgres_pools::fresh_name(label));
    for id in 1..=TASKS {
        pool.submit(work(id, id, 5, &key))
            .await
            .unwrap_or_else(|error| panic!("{label}: task {id} accepted: {error}"));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = pool.stats();
        assert!(
            outcomes(&stats) <= stats.submitted_tasks && stats.submitted_tasks <= TASKS,
            "{label}: a reading with {} outcomes of {} submitted, after {TASKS} submissions: \
             {stats:?}",
            outcomes(&stats),
            stats.submitted_tasks,
        );
        if outcomes(&stats) == TASKS {
            break;
        }
        assert!(Instant::now() < deadline, "{label}: all ended: {stats:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Whatever was still on its way (settles, late steps) has arrived by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = pool.stats();
    assert_eq!(
        stats.submitted_tasks, TASKS,
        "{label}: submitted: {stats:?}"
    );
    assert_eq!(
        stats.completed_tasks, TASKS,
        "{label}: completed: {stats:?}"
    );
    assert_eq!(outcomes(&stats), TASKS, "{label}: outcomes: {stats:?}");
    for id in 1..=TASKS {
        let result = pool.retrieve_task(&key, id, Duration::from_secs(10)).await;
        assert_eq!(result, Ok(id * 2), "{label}: task {id}");
    }
    pool.shutdown_with_drain(Duration::from_secs(5)).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_each_submission_counts_once() {
    let queue = serde_json::json!({ "type": "in_memory" });
    each_submission_counts_once(config(queue), "in_memory").await;
}

/// A reader that reads the counters over and over while tasks are submitted and end as
/// fast as they can never sees an outcome before its submission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_no_reading_shows_an_outcome_before_its_submission() {
    const QUICK_TASKS: u64 = 3_000;
    let queue = serde_json::json!({ "type": "in_memory" });
    let built = build_embedded(config(queue)).await;
    let pool = &built.pools["gpu"];
    let key = MailboxKey::new("acme").with_session("quick");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (pool, done) = (pool.client().clone(), done.clone());
        std::thread::spawn(move || {
            let mut readings = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let stats = pool.stats();
                assert!(
                    outcomes(&stats) <= stats.submitted_tasks,
                    "reading {readings}: {} outcomes of {} submitted: {stats:?}",
                    outcomes(&stats),
                    stats.submitted_tasks
                );
                readings += 1;
            }
            readings
        })
    };
    // Two submitters, each waiting for its task's result before the next: tasks end as
    // fast as they come, so a reading often falls between a submission and its outcome.
    let submitters: Vec<_> = (0..2)
        .map(|first| {
            let client = pool.client().clone();
            let key = key.clone();
            tokio::spawn(async move {
                for id in (1 + first..=QUICK_TASKS).step_by(2) {
                    client
                        .submit(work(id, id, 0, &key), Default::default())
                        .await
                        .expect("accepted");
                    let result = client
                        .retrieve_task(&key, id, Duration::from_secs(10))
                        .await;
                    assert_eq!(result, Ok(id * 2));
                }
            })
        })
        .collect();
    for submitter in submitters {
        submitter.await.expect("every task ran");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let readings = reader.join().expect("no reading showed an outcome first");
    assert!(readings > 0);
    let stats = pool.stats();
    assert_eq!(stats.submitted_tasks, QUICK_TASKS, "{stats:?}");
    assert_eq!(outcomes(&stats), QUICK_TASKS, "{stats:?}");
    pool.shutdown_with_drain(Duration::from_secs(5)).await.ok();
}

#[cfg(feature = "yaque")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaque_each_submission_counts_once() {
    let dir = std::env::temp_dir().join(postgres_pools::fresh_name("pl-counters-yaque"));
    let queue = serde_json::json!({
        "type": "yaque", "path": dir.to_string_lossy(), "stream": "counters"
    });
    each_submission_counts_once(config(queue), "yaque").await;
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_each_submission_counts_once() {
    let table = postgres_pools::fresh_name("counters");
    let queue = serde_json::json!({ "type": "postgres", "table": table });
    each_submission_counts_once(config(queue), "postgres").await;
    drop_table(&table).await;
}

#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgmq_each_submission_counts_once() {
    let name = postgres_pools::fresh_name("counters");
    let queue = serde_json::json!({ "type": "postgres_pgmq", "queue_name": name });
    each_submission_counts_once(config(queue), "pgmq").await;
    for level in ["crit", "high", "norm", "low", "dlq"] {
        run_sql(format!("SELECT pgmq.drop_queue('{name}_{level}')")).await;
    }
    run_sql(format!(
        "DELETE FROM pl_pgmq_entries WHERE queue_name = '{name}'"
    ))
    .await;
}

/// Two nodes on one Postgres queue: the node tasks were submitted to counts them as
/// submitted; the node that claimed and ran some counts them in its outcomes only.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_claimed_by_another_node_counts_in_its_outcomes_not_its_submissions() {
    let table = postgres_pools::fresh_name("counters_nodes");
    let queue = serde_json::json!({ "type": "postgres", "table": table, "queue_name": "gpu" });
    let submitter = build_embedded(config(queue.clone())).await;
    let runner = build_embedded(config(queue)).await;
    let (submitter, runner) = (&submitter.pools["gpu"], &runner.pools["gpu"]);
    let key = MailboxKey::new("acme").with_session(&table);
    for id in 1..=TASKS {
        submitter
            .submit(work(id, id, 20, &key))
            .await
            .expect("accepted");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mine, theirs) = loop {
        let (mine, theirs) = (submitter.stats(), runner.stats());
        assert!(
            outcomes(&mine) + outcomes(&theirs) <= TASKS,
            "{mine:?} {theirs:?}"
        );
        if outcomes(&mine) + outcomes(&theirs) == TASKS {
            break (mine, theirs);
        }
        assert!(Instant::now() < deadline, "all ended: {mine:?} {theirs:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(mine.submitted_tasks, TASKS, "the submitter's: {mine:?}");
    assert_eq!(theirs.submitted_tasks, 0, "the runner's: {theirs:?}");
    assert!(
        outcomes(&theirs) > 0,
        "the runner claimed some (each node runs two at a time): {theirs:?}"
    );
    submitter
        .shutdown_with_drain(Duration::from_secs(5))
        .await
        .ok();
    runner
        .shutdown_with_drain(Duration::from_secs(5))
        .await
        .ok();
    drop_table(&table).await;
}

/// A full queue sheds its lowest priority (core rule 21): a shed task was submitted and ends
/// once, `Rejected`; a newcomer refused at the bound was never submitted. Submissions still
/// equal the admitted tasks' outcomes, on a queue in memory and on a durable one.
async fn shed_tasks_count_once(queue: serde_json::Value, label: &str) {
    let mut config = config(queue);
    let pool_settings = config.pools.get_mut("gpu").expect("pool gpu");
    pool_settings.max_queue_depth = Some(3);
    pool_settings.max_queued_units = Some(3);
    let built = build_embedded(config).await;
    let pool = &built.pools["gpu"];
    let key = MailboxKey::new("acme").with_session(postgres_pools::fresh_name(label));
    let submit = |id, priority, ms| {
        let mut task = work(id, id, ms, &key);
        task.meta.priority = priority;
        pool.submit(task)
    };
    // Two Low tasks hold both units long enough for the rest to meet a full queue.
    for id in 1..=2 {
        submit(id, Priority::Low, 2_000).await.expect("accepted");
    }
    for id in 3..=5 {
        submit(id, Priority::Low, 0).await.expect("parked");
    }
    let refused = submit(6, Priority::Low, 0).await;
    assert_eq!(
        refused,
        Err(PoolError::QueueFull),
        "{label}: nothing lower to shed"
    );
    for id in 7..=9 {
        submit(id, Priority::High, 0)
            .await
            .expect("parked in a Low task's place");
    }
    assert_eq!(
        submit(10, Priority::High, 0).await,
        Err(PoolError::QueueFull),
        "{label}: no Low task is left to shed"
    );
    for id in 3..=5 {
        let shed = pool.retrieve_task(&key, id, Duration::from_secs(10)).await;
        assert_eq!(
            shed,
            Err(PoolError::QueueFull),
            "{label}: task {id} was shed"
        );
    }
    for id in [1, 2, 7, 8, 9] {
        let ran = pool.retrieve_task(&key, id, Duration::from_secs(10)).await;
        assert_eq!(ran, Ok(id * 2), "{label}: task {id}");
    }
    let stats = pool.stats();
    assert_eq!(stats.submitted_tasks, 8, "{label}: {stats:?}");
    assert_eq!(stats.completed_tasks, 5, "{label}: {stats:?}");
    // Three shed after their admission, two refused at it.
    assert_eq!(stats.rejected_tasks, 5, "{label}: {stats:?}");
    assert_eq!(
        outcomes(&stats) - 2,
        stats.submitted_tasks,
        "{label}: {stats:?}"
    );
    pool.shutdown_with_drain(Duration::from_secs(5)).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_shed_tasks_count_once() {
    let queue = serde_json::json!({ "type": "in_memory" });
    shed_tasks_count_once(queue, "in_memory").await;
}

#[cfg(feature = "yaque")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaque_shed_tasks_count_once() {
    let dir = std::env::temp_dir().join(postgres_pools::fresh_name("pl-shed-yaque"));
    let queue = serde_json::json!({
        "type": "yaque", "path": dir.to_string_lossy(), "stream": "shed"
    });
    shed_tasks_count_once(queue, "yaque").await;
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "postgres")]
async fn drop_table(table: &str) {
    run_sql(format!("DROP TABLE IF EXISTS {table}")).await;
}

/// Runs `sql` on a connection of its own (the pools' belong to their runtime).
#[cfg(feature = "postgres")]
async fn run_sql(sql: String) {
    use sea_orm::ConnectionTrait;
    let connection = sea_orm::Database::connect(postgres_pools::server_url())
        .await
        .expect("connect");
    let _ = connection
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            sql,
        ))
        .await;
    let _ = connection.close().await;
}
