//! The fleet view of a pgmq queue (`"type": "postgres_pgmq"`), through a node's admin API and
//! command line, against a real Postgres: a worker node and a producer-only node of one
//! process, built from config files as users build them.
//!
//! The worker holds all its units with one task, so what the producer submits stays parked
//! in the queue's PGMQ levels; the view lists those tasks across the levels in rank order
//! (priority, then admission), paged, each with its reason read from the messages: a retry's
//! backoff (with the run's error), a scheduled start, larger than any node, waiting for units
//! behind the tasks ranked ahead, a paused fleet. `why` finds one of them with its place;
//! cancelling one from the worker's admin (a node that did not submit it) takes it out, and
//! its submitter hears `Cancelled`; the worker's node shows the task it holds as its claim.

#[path = "support/admin_client.rs"]
mod admin_client;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use admin_client::eventually;
use prometheus_parking_lot::core::{PoolError, ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::util::serde::{MailboxKey, Priority, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, running, QueueBuilderContext, SchedulerConfig, TaskExecutor,
    TokioSpawner,
};
use serde_json::{json, Value};

/// The admin token of the worker node.
const TOKEN: &str = "fleet-pgmq-token";
/// The task that holds the worker's four units until released.
const BLOCKER: u64 = 1;
/// The task whose first run asks to be retried (after a backoff of an hour).
const FLAKY: u64 = 2;

/// Set when the blocker may end.
static RELEASED: AtomicBool = AtomicBool::new(false);
/// The flaky task's runs so far.
static FLAKY_RUNS: AtomicU32 = AtomicU32::new(0);

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Pool `work` on the pgmq queue `queue`, results in table `mailbox`, a 200 ms heartbeat; a
/// retry waits an hour; with an admin server on a free port when `admin`.
fn config(
    queue: &str,
    mailbox: &str,
    workers: usize,
    capacity: u32,
    admin: bool,
) -> SchedulerConfig {
    let mut text = json!({
        "database_url": database_url(),
        "fleet": { "heartbeat_ms": 200 },
        "pools": {
            "work": {
                "worker_threads": workers,
                "max_units": capacity,
                "retry": { "max_attempts": 3, "backoff_ms": 3_600_000 },
                "queue": { "type": "postgres_pgmq", "queue_name": queue, "lease_ms": 5_000,
                           "dependencies": true },
                "mailbox": { "storage": { "type": "postgres", "table": mailbox } }
            }
        }
    });
    if admin {
        text["admin"] = json!({ "bind": "127.0.0.1:0", "token": TOKEN });
    }
    SchedulerConfig::from_json_str(&text.to_string()).expect("the fleet config is valid")
}

/// The blocker waits for [`RELEASED`]; the flaky task's first run asks for a retry; the
/// rest end at once.
#[derive(Clone)]
struct Jobs;

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Jobs {
    async fn execute(&self, _: u64, meta: TaskMetadata) -> u64 {
        match meta.id {
            BLOCKER => {
                while !RELEASED.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            FLAKY if FLAKY_RUNS.fetch_add(1, Ordering::SeqCst) == 0 => {
                running::retry_later("the model server answered 503");
            }
            _ => {}
        }
        meta.id
    }
}

/// An admin server's answer, with the test's token: its status and JSON.
fn call(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    admin_client::call_with(TOKEN, method, url, body)
}

fn get(admin: &str, path: &str) -> Value {
    let (status, body) = call(reqwest::Method::GET, &format!("{admin}{path}"), None);
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// The ids of a page's tasks, in its order.
fn ids(page: &Value) -> Vec<u64> {
    page["parked"]
        .as_array()
        .expect("a page of parked tasks")
        .iter()
        .map(|task| task["task_id"].as_u64().unwrap())
        .collect()
}

/// The page's task `id`.
fn task(page: &Value, id: u64) -> &Value {
    page["parked"]
        .as_array()
        .unwrap()
        .iter()
        .find(|task| task["task_id"] == id)
        .unwrap_or_else(|| panic!("task {id} in {page}"))
}

/// Drops the test's mailbox table and PGMQ queues and forgets its nodes and entries when
/// dropped, so a failed test leaves nothing behind either (made before the pools, it is
/// dropped after them).
struct CleanUp {
    queue: String,
    mailbox: String,
}

impl Drop for CleanUp {
    fn drop(&mut self) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(clean_up(&self.queue, &self.mailbox));
    }
}

async fn clean_up(queue: &str, mailbox: &str) {
    use sea_orm::ConnectionTrait;
    let Ok(connection) = sea_orm::Database::connect(database_url()).await else {
        return;
    };
    let mut statements = vec![
        format!("DROP TABLE IF EXISTS {mailbox}"),
        format!("DELETE FROM pl_pgmq_entries WHERE queue_name = '{queue}'"),
        format!("DELETE FROM pl_fleet_nodes WHERE queue_key LIKE 'postgres_pgmq % {queue}'"),
    ];
    for suffix in ["crit", "high", "norm", "low", "dlq"] {
        statements.push(format!("SELECT pgmq.drop_queue('{queue}_{suffix}')"));
    }
    for sql in statements {
        let _ = connection.execute_unprepared(&sql).await;
    }
    let _ = connection.close().await;
}

#[test]
fn a_pgmq_fleet_lists_explains_and_cancels_its_parked_tasks() {
    let stamp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1_000_000_000;
    let queue = format!("fleet_pgmq_{}_{stamp}", std::process::id());
    let mailbox = format!("{queue}_results");
    let _clean_up = CleanUp {
        queue: queue.clone(),
        mailbox: mailbox.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let worker_config = config(&queue, &mailbox, 1, 4, true);
    let worker = build_pools_from_scheduler_config::<u64, u64, Jobs, TokioSpawner>(
        &worker_config,
        &QueueBuilderContext::Embedded,
        None,
        |_| Jobs,
        TokioSpawner,
    )
    .expect("the worker node starts");
    let server = worker
        .serve_admin(&worker_config)
        .expect("the admin server starts")
        .expect("the config has an admin section");
    let admin = server.url().trim_end_matches('/').to_owned();
    let built = build_pools_from_scheduler_config::<u64, u64, Jobs, TokioSpawner>(
        &config(&queue, &mailbox, 0, 64, false),
        &QueueBuilderContext::Embedded,
        None,
        |_| Jobs,
        TokioSpawner,
    )
    .expect("the producer starts");
    let producer = &built.pools["work"];
    let key = MailboxKey::new("fleet").with_session(queue.clone());
    let submit = |id: u64, priority: Priority, units: u32, options: SubmitOptions| {
        let meta = TaskMetadata::new(id, ResourceCost::cpu(units))
            .with_priority(priority)
            .with_mailbox(key.clone());
        runtime
            .block_on(producer.submit_with(ScheduledTask::new(meta, 0), options))
            .expect("the producer submits");
        // Admissions a few ms apart: their rank order is their submission order.
        std::thread::sleep(Duration::from_millis(5));
    };
    let parked_page = |query: &str| get(&admin, &format!("/api/fleet/work/parked{query}"));

    // The flaky task runs once on the worker and goes back to the queue for an hour.
    submit(FLAKY, Priority::Normal, 1, SubmitOptions::default());
    eventually(
        "the flaky task to wait out its backoff in the queue",
        || {
            let page = parked_page("");
            (page["parked_total"] == 1).then_some(())
        },
    );
    // The blocker takes the worker's four units: what comes next stays parked.
    submit(BLOCKER, Priority::Critical, 4, SubmitOptions::default());
    let worker_node = eventually("the worker to hold the blocker", || {
        let fleet = get(&admin, "/api/fleet/work");
        fleet["nodes"]
            .as_array()?
            .iter()
            .find(|node| node["workers"] == 1 && node["running"] == 1)
            .cloned()
    });
    assert_eq!(worker_node["claims"], 1, "the held message: {worker_node}");
    assert_eq!(worker_node["health"], "live", "{worker_node}");

    let in_an_hour = SubmitOptions::default().with_delay(Duration::from_secs(3_600));
    submit(10, Priority::Low, 1, SubmitOptions::default());
    submit(11, Priority::Critical, 1, SubmitOptions::default());
    submit(12, Priority::High, 2, SubmitOptions::default());
    submit(13, Priority::Normal, 1, SubmitOptions::default());
    submit(14, Priority::Normal, 16, SubmitOptions::default());
    submit(15, Priority::Normal, 1, in_an_hour);
    // A child of the blocker waits in its level until the blocker ends.
    let after_blocker = SubmitOptions::default().with_depends_on([BLOCKER]);
    submit(16, Priority::Normal, 1, after_blocker);

    // Every parked task, across the levels, in rank order, each with its reason.
    let page = eventually("the eight parked tasks", || {
        let page = parked_page("");
        (page["parked_total"] == 8).then_some(page)
    });
    assert_eq!(ids(&page), [11, 12, FLAKY, 13, 14, 15, 16, 10], "{page}");
    let positions: Vec<u64> = page["parked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, [0, 1, 2, 3, 4, 5, 6, 7]);
    let reason = |id: u64| task(&page, id)["reason"].clone();
    assert_eq!(
        reason(11),
        json!({ "code": "capacity", "kind": "cpu", "units": 1, "ahead": 0 })
    );
    assert_eq!(
        reason(12),
        json!({ "code": "capacity", "kind": "cpu", "units": 2, "ahead": 1 })
    );
    let backoff = reason(FLAKY);
    assert_eq!(backoff["code"], "retry_backoff", "{page}");
    assert_eq!(backoff["attempts"], 1, "{backoff}");
    assert_eq!(
        backoff["last_error"], "the model server answered 503",
        "{backoff}"
    );
    // The hour's backoff, drawn between half of it and all of it.
    let in_ms = backoff["in_ms"].as_u64().unwrap();
    assert!(in_ms > 1_700_000 && in_ms <= 3_600_000, "{backoff}");
    assert_eq!(
        reason(14),
        json!({ "code": "larger_than_any_node", "kind": "cpu", "units": 16, "largest": 4 })
    );
    let scheduled = reason(15);
    assert_eq!(scheduled["code"], "scheduled", "{scheduled}");
    assert!(
        scheduled["in_ms"].as_u64().unwrap() > 3_500_000,
        "{scheduled}"
    );
    assert_eq!(
        reason(16),
        json!({ "code": "waits_for_parents", "pending": 1 })
    );
    assert_eq!(reason(10)["ahead"], 7);
    assert_eq!(task(&page, 12)["priority"], 2);
    assert_eq!(task(&page, 14)["units"], 16);
    assert_eq!(task(&page, 11)["key"]["session_id"], queue.as_str());

    // Paged: from the third task, three of them.
    let middle = parked_page("?offset=2&limit=3");
    assert_eq!(ids(&middle), [FLAKY, 13, 14], "{middle}");
    assert_eq!(middle["parked_total"], 8);
    assert_eq!(middle["parked"][0]["position"], 2, "{middle}");

    // One task, asked of the worker, which did not submit it: its place and reason.
    let why = get(
        &admin,
        &format!("/api/fleet/work/why?tenant=fleet&session_id={queue}&id=14"),
    );
    assert_eq!(why["task"]["position"], 4, "{why}");
    assert_eq!(
        why["task"]["reason"]["code"], "larger_than_any_node",
        "{why}"
    );
    let why_low = get(
        &admin,
        &format!("/api/fleet/work/why?tenant=fleet&session_id={queue}&id=10"),
    );
    assert_eq!(why_low["task"]["position"], 7, "{why_low}");
    let why_child = get(
        &admin,
        &format!("/api/fleet/work/why?tenant=fleet&session_id={queue}&id=16"),
    );
    assert_eq!(
        why_child["task"]["reason"]["code"], "waits_for_parents",
        "{why_child}"
    );
    let (status, answer) = call(
        reqwest::Method::GET,
        &format!("{admin}/api/fleet/work/why?tenant=fleet&id=14"),
        None,
    );
    assert_eq!(status, 404, "another key is another task: {answer}");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_parking-lot"))
        .args(["--url", &admin, "--token", TOKEN])
        .args(["fleet", "parked", "--pool", "work"])
        .output()
        .expect("run parking-lot");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{printed}");
    assert!(printed.contains("1-8 of 8 parked"), "{printed}");
    assert!(
        printed.contains("needs 16 cpu units; the largest live node has 4"),
        "{printed}"
    );

    // Every node paused: the reason says so.
    let (status, answer) = call(
        reqwest::Method::POST,
        &format!("{admin}/api/fleet/work/pause"),
        Some(json!({ "all": true })),
    );
    assert_eq!(status, 200, "{answer}");
    eventually("the reason to say the fleet is paused", || {
        let page = parked_page("?limit=1");
        (page["parked"][0]["reason"]["code"] == "paused_fleet").then_some(())
    });
    let (status, _) = call(
        reqwest::Method::POST,
        &format!("{admin}/api/fleet/work/resume"),
        Some(json!({ "all": true })),
    );
    assert_eq!(status, 200);
    eventually("the fleet resumed", || {
        let page = parked_page("?limit=1");
        (page["parked"][0]["reason"]["code"] == "capacity").then_some(())
    });

    // Cancelled from the worker's admin: gone from the queue, and its submitter hears it.
    let (status, answer) = call(
        reqwest::Method::POST,
        &format!("{admin}/api/fleet/work/cancel"),
        Some(json!({ "tenant": "fleet", "session_id": queue, "id": 13 })),
    );
    assert_eq!(status, 200, "{answer}");
    let outcome = runtime.block_on(producer.retrieve_task(&key, 13, Duration::from_secs(30)));
    assert_eq!(outcome, Err(PoolError::Cancelled));
    let after = parked_page("");
    assert_eq!(ids(&after), [11, 12, FLAKY, 14, 15, 16, 10], "{after}");
    assert_eq!(after["parked_total"], 7);

    // Released, the worker runs what fits and is due: 11, 12 and 10, and 16 once the
    // blocker, its parent, succeeded.
    RELEASED.store(true, Ordering::SeqCst);
    for id in [BLOCKER, 11, 12, 10, 16] {
        let outcome = runtime.block_on(producer.retrieve_task(&key, id, Duration::from_secs(30)));
        assert_eq!(outcome, Ok(id));
    }
    let left = parked_page("");
    assert_eq!(ids(&left), [FLAKY, 14, 15], "{left}");
}
