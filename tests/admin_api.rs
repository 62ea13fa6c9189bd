//! The admin HTTP API (cargo feature `admin`), asked over real HTTP as the dashboard and the
//! command line ask it: reads that match the pool's own answers, validation, the bearer
//! token on every mutation, the event stream, and no payload anywhere.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::admin::{Admin, AdminServer, AdminSettings};
use prometheus_parking_lot::config::Secret;
use prometheus_parking_lot::core::{FairByUse, TenantWeights, UsageCharge};
use prometheus_parking_lot::core::{TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::{MailboxKey, Priority, ResourceCost, WorkerPoolConfig};
use serde_json::Value;

const TOKEN: &str = "test-token-123";
/// A payload that must never appear in an answer.
const PROMPT: &str = "SECRET-PROMPT-do-not-show";

/// Runs until the gate opens.
#[derive(Clone)]
struct Gated(Arc<AtomicBool>);

#[async_trait::async_trait]
impl WorkerExecutor<String, String> for Gated {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        while !self.0.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        payload
    }
}

/// The pool's execution timeout: what a run is expected to take before any has ended.
const TIMEOUT_MS: u64 = 600_000;

fn pool(gate: &Arc<AtomicBool>) -> WorkerPool<String, String, Gated> {
    WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_max_units(10)
            .with_timeout_ms(TIMEOUT_MS),
        Gated(gate.clone()),
    )
    .expect("the pool starts")
}

fn serve(pool: &WorkerPool<String, String, Gated>, token: Option<&str>) -> AdminServer {
    Admin::new(AdminSettings {
        bind: "127.0.0.1:0".parse().unwrap(),
        token: token.map(Secret::new),
        ..AdminSettings::default()
    })
    .with_pool("llm", pool.client().clone())
    .serve()
    .expect("the admin server starts")
}

/// `(status, body)` of a request.
async fn call(
    method: reqwest::Method,
    url: String,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, String) {
    let client = reqwest::Client::new();
    let mut request = client.request(method, url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a body"))
}

async fn get(server: &AdminServer, path: &str) -> (u16, Value) {
    let (status, body) = call(
        reqwest::Method::GET,
        format!("{}{path}", server.url()),
        None,
        None,
    )
    .await;
    assert!(!body.contains(PROMPT), "a payload in {path}: {body}");
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

async fn post(
    server: &AdminServer,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let (status, body) = call(
        reqwest::Method::POST,
        format!("{}{path}", server.url()),
        token,
        body,
    )
    .await;
    assert!(!body.contains(PROMPT), "a payload in {path}: {body}");
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_match_the_pool_and_bad_input_gets_a_clear_answer() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = pool(&gate);
    let server = serve(&pool, Some(TOKEN));
    let key = MailboxKey::new("acme").with_session("chat-1");
    let meta = |id, units, priority| {
        TaskMetadata::new(id, ResourceCost::gpu_vram(units))
            .with_mailbox(key.clone())
            .with_priority(priority)
    };
    pool.submit_async(PROMPT.to_string(), meta(1, 8, Priority::Normal))
        .await
        .expect("runs");
    pool.submit_async(PROMPT.to_string(), meta(2, 1, Priority::Low))
        .await
        .expect("parks");
    pool.submit_async(PROMPT.to_string(), meta(3, 6, Priority::High))
        .await
        .expect("parks");

    let (status, pools) = get(&server, "api/pools").await;
    assert_eq!(status, 200);
    let llm = &pools["pools"][0];
    let stats = pool.stats();
    assert_eq!(llm["name"], "llm");
    assert_eq!(llm["stats"]["worker_count"], stats.worker_count);
    assert_eq!(llm["stats"]["submitted_tasks"], stats.submitted_tasks);
    let vram = llm["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|kind| kind["kind"] == "gpu_vram")
        .expect("gpu_vram is listed");
    assert_eq!(
        (vram["total"].as_u64(), vram["used"].as_u64()),
        (Some(10), Some(8))
    );

    let (status, parked) = get(&server, "api/pools/llm/parked?limit=5").await;
    assert_eq!(status, 200);
    assert_eq!(parked["parked_total"], 2);
    assert_eq!(parked["parked"][0]["id"], 3, "high priority first");
    assert_eq!(parked["parked"][0]["reason"]["reason"], "units");
    assert_eq!(parked["parked"][0]["key"]["session_id"], "chat-1");
    assert_eq!(parked["parked"][1]["id"], 2);
    // Each in line for the VRAM, expected once task 1 (no run seen yet: its 10-minute
    // timeout) and then task 3 are done.
    assert_eq!(parked["parked"][0]["position"], 1);
    assert_eq!(parked["parked"][1]["position"], 2);
    let (Some(at), Some(first), Some(second)) = (
        parked["at_ms"].as_u64(),
        parked["parked"][0]["expected_start_ms"].as_u64(),
        parked["parked"][1]["expected_start_ms"].as_u64(),
    ) else {
        panic!("the view's time and both estimates: {parked}");
    };
    assert!(first > at && first <= at + TIMEOUT_MS, "{parked}");
    assert_eq!(second, first + TIMEOUT_MS, "{parked}");
    assert_eq!(
        (
            parked["parked"][0]["from_timeouts"].as_bool(),
            parked["parked"][1]["from_timeouts"].as_bool()
        ),
        (Some(true), Some(true)),
        "both estimates count the runs at their timeouts: {parked}"
    );

    let (status, running) = get(&server, "api/pools/llm/running").await;
    assert_eq!(
        (status, running["running"][0]["id"].as_u64()),
        (200, Some(1))
    );
    let (_, tenants) = get(&server, "api/pools/llm/tenants").await;
    assert_eq!(tenants["tenants"][0]["tenant"], "acme");
    assert_eq!(tenants["tenants"][0]["holds"]["gpu_vram"], 8);
    let (status, one) = get(&server, "api/pools/llm").await;
    assert_eq!((status, one["parked_total"].as_u64()), (200, Some(2)));

    for (path, expected) in [
        (
            "api/pools/llm/parked?limit=0",
            "limit is \"0\"; use a whole number from 1 to 1000",
        ),
        (
            "api/pools/llm/parked?limit=abc",
            "limit is \"abc\"; use a whole number from 1 to 1000",
        ),
        (
            "api/pools/llm/parked?limit=5000",
            "limit is \"5000\"; use a whole number from 1 to 1000",
        ),
        (
            "api/pools/llm/parked?page=2",
            "unknown parameter \"page\"; use offset and limit",
        ),
    ] {
        let (status, body) = get(&server, path).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some(expected)),
            "{path}"
        );
    }
    let (status, body) = get(&server, "api/pools/nope/parked").await;
    assert_eq!(status, 404);
    assert_eq!(
        body["error"],
        "no pool named \"nope\"; the pools are [\"llm\"]"
    );
    let (status, _) = get(&server, "api/nothing").await;
    assert_eq!(status, 404);

    let (status, page) = call(reqwest::Method::GET, server.url(), None, None).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("<html") || page.contains("<!doctype html"),
        "the dashboard"
    );
    let (status, charts) = call(
        reqwest::Method::GET,
        format!("{}assets/charts.js", server.url()),
        None,
        None,
    )
    .await;
    assert!(
        status == 200 && charts.contains("uPlot"),
        "the charting library is served"
    );
    gate.store(true, Ordering::Release);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutation_needs_the_token_and_does_what_it_says() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = pool(&gate);
    let server = serve(&pool, Some(TOKEN));
    let key = MailboxKey::new("acme");
    let meta = |id| TaskMetadata::new(id, ResourceCost::gpu_vram(1)).with_mailbox(key.clone());
    pool.submit_async(PROMPT.to_string(), meta(1))
        .await
        .expect("runs");
    pool.submit_async(PROMPT.to_string(), meta(2))
        .await
        .expect("parks");

    let (status, body) = post(&server, "api/pools/llm/pause", None, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            401,
            Some("this endpoint changes a pool: send `Authorization: Bearer <token>`")
        )
    );
    let (status, _) = post(&server, "api/pools/llm/pause", Some("wrong"), None).await;
    assert_eq!(status, 401);
    assert!(!pool.stats().paused, "nothing changed");

    let (status, body) = post(&server, "api/pools/llm/pause", Some(TOKEN), None).await;
    assert_eq!(
        (status, body["pool"]["paused"].as_bool()),
        (200, Some(true))
    );
    assert!(pool.stats().paused);
    let (status, _) = post(&server, "api/pools/llm/resume", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    assert!(!pool.stats().paused);

    // A body in the wrong shape is refused, though serde would read an array as the
    // fields in order.
    let (status, body) = post(
        &server,
        "api/pools/llm/cancel",
        Some(TOKEN),
        Some(serde_json::json!(["acme", null, null, 2])),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            400,
            Some(
                "a cancel takes {\"tenant\": .., \"user_id\": .., \"session_id\": .., \"id\": ..} \
                 (user_id and session_id optional): the body is an array, not a JSON object"
            )
        )
    );
    assert_eq!(pool.stats().cancelled_tasks, 0, "nothing was cancelled");
    let cancel = serde_json::json!({ "tenant": "acme", "id": 2 });
    let (status, _) = post(
        &server,
        "api/pools/llm/cancel",
        Some(TOKEN),
        Some(cancel.clone()),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = post(&server, "api/pools/llm/cancel", Some(TOKEN), Some(cancel)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("no live task with id 2"))
    );
    let (status, body) = post(
        &server,
        "api/pools/llm/cancel",
        Some(TOKEN),
        Some(serde_json::json!({ "id": 2 })),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("missing field `tenant`"),
        "{body}"
    );

    let (status, _) = post(&server, "api/pools/llm/drain", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    assert!(
        pool.submit_async(PROMPT.to_string(), meta(3))
            .await
            .is_err(),
        "drained"
    );
    let (status, _) = post(&server, "api/pools/llm/undrain", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    let (status, body) = post(&server, "api/pools/llm/explode", Some(TOKEN), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            404,
            Some("no action \"explode\"; use pause, resume, drain, undrain or cancel")
        )
    );
    gate.store(true, Ordering::Release);

    let tokenless = serve(&pool, None);
    let (status, body) = post(&tokenless, "api/pools/llm/pause", Some(TOKEN), None).await;
    assert_eq!(status, 403);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("started without a token"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_carries_task_steps_and_stats() {
    let gate = Arc::new(AtomicBool::new(true));
    let pool = pool(&gate);
    let server = serve(&pool, None);
    let response = reqwest::get(format!("{}api/events?pool=llm", server.url()))
        .await
        .expect("the stream opens");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut response = response;
    pool.submit_async(
        PROMPT.to_string(),
        TaskMetadata::new(7, ResourceCost::cpu(1)).with_mailbox(MailboxKey::new("acme")),
    )
    .await
    .expect("runs");
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(seen.contains("event: stats") && seen.contains("\"step\":\"ended\"")) {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .expect("the stream carries both kinds of event in time")
            .expect("a chunk")
            .expect("the stream goes on");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: task"));
    assert!(seen.contains("\"task_id\":7"));
    assert!(!seen.contains(PROMPT), "no payload in the stream");
    let (status, body) = get(&server, "api/pools/llm/history").await;
    assert_eq!(status, 200);
    let started: u64 = body["seconds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["started"].as_u64().unwrap())
        .sum();
    assert_eq!(started, 1, "{body}");
    // Stopping the server ends the open stream rather than waiting for it.
    let stopped = tokio::task::spawn_blocking(move || server.stop());
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("the server stops")
        .unwrap();
}

#[test]
fn an_address_in_use_is_refused_with_its_name() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let error = Admin::new(AdminSettings {
        bind: addr,
        token: None,
        ..AdminSettings::default()
    })
    .serve()
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("admin: cannot listen on {addr}")),
        "{error}"
    );
}

/// `parking-lot ARGS` against `server`, as it ran: its status and raw output bytes.
async fn cli_output(server: &AdminServer, args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_parking-lot"));
    command
        .args(args)
        .env("PARKING_LOT_URL", server.url())
        .env_remove("PARKING_LOT_TOKEN");
    tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("the command runs")
}

/// `parking-lot ARGS` against `server`: (exit success, stdout, stderr).
async fn cli(server: &AdminServer, args: &[&str]) -> (bool, String, String) {
    let output = cli_output(server, args).await;
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The command line reads a pool as the API serves it, in tables or in JSON, and changes it
/// only with the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_shows_and_controls_a_pool() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = pool(&gate);
    let server = serve(&pool, Some(TOKEN));
    let key = MailboxKey::new("acme").with_session("chat-1");
    let meta =
        |id, units| TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_mailbox(key.clone());
    pool.submit_async(PROMPT.to_string(), meta(1, 8))
        .await
        .expect("runs");
    pool.submit_async(PROMPT.to_string(), meta(2, 6))
        .await
        .expect("parks");

    let (ok, out, _) = cli(&server, &["tenants", "--pool", "llm"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("TENANT") && out.contains("acme") && !out.contains("WEIGHT"),
        "no fair share by use, no weight column: {out}"
    );

    let (ok, out, _) = cli(&server, &["status"]).await;
    assert!(ok);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("POOL") && lines[0].contains("PARKED"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("llm") && lines[1].contains("running"),
        "{out}"
    );
    let (ok, out, _) = cli(&server, &["--json", "status"]).await;
    let json: Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert!(ok);
    assert_eq!(json["pools"][0]["stats"]["active_tasks"], 1);
    // --pool, as every other command takes it: the one pool.
    let (ok, out, _) = cli(&server, &["status", "--pool", "llm"]).await;
    assert!(
        ok && out.lines().nth(1).is_some_and(|row| row.starts_with("llm")),
        "{out}"
    );
    let (ok, _, err) = cli(&server, &["status", "--pool", "nope"]).await;
    assert!(!ok && err.contains("no pool named \"nope\""), "{err}");

    let (ok, out, _) = cli(&server, &["parked", "--pool", "llm"]).await;
    assert!(ok);
    assert!(
        out.contains("acme//chat-1") && out.contains("needs 6 gpu_vram, 2 free"),
        "{out}"
    );
    assert!(out.ends_with("1 of 1 parked\n"), "{out}");
    assert!(
        out.lines()
            .next()
            .is_some_and(|header| header.ends_with("STARTS"))
            && out.contains("1st in line, within ~")
            && out.contains("(no run seen yet: each counted at its timeout)"),
        "{out}"
    );
    let (ok, out, _) = cli(&server, &["running", "--pool", "llm"]).await;
    assert!(
        ok && out.lines().nth(1).is_some_and(|row| row.starts_with('1')),
        "{out}"
    );
    assert!(!out.contains(PROMPT));

    let (ok, _, err) = cli(&server, &["pause", "--pool", "llm"]).await;
    assert!(!ok);
    assert!(
        err.contains("give the admin server's token with --token"),
        "{err}"
    );
    let (ok, _, err) = cli(&server, &["pause", "--pool", "llm", "--token", "wrong"]).await;
    assert!(!ok && err.contains("not this server's"), "{err}");
    assert!(!pool.stats().paused);
    let (ok, out, _) = cli(&server, &["pause", "--pool", "llm", "--token", TOKEN]).await;
    assert!(ok);
    assert_eq!(out, "pool llm is paused\n");
    assert!(pool.stats().paused);
    let (ok, out, _) = cli(&server, &["resume", "--pool", "llm", "--token", TOKEN]).await;
    assert_eq!((ok, out.as_str()), (true, "pool llm is running\n"));

    // The key without its session names no task: the error says what names one.
    let partial = [
        "cancel", "--pool", "llm", "--tenant", "acme", "2", "--token", TOKEN,
    ];
    let (ok, _, err) = cli(&server, &partial).await;
    assert!(
        !ok && err.contains("no live task with id 2") && err.contains("--key tenant/user/session"),
        "{err}"
    );
    let (ok, _, err) = cli(
        &server,
        &["cancel", "--pool", "llm", "--key", "a/b/c/d", "2"],
    )
    .await;
    assert!(!ok && err.contains("\"a/b/c/d\" is not a key"), "{err}");
    // The key as `parked` printed it.
    let cancel = [
        "cancel",
        "--pool",
        "llm",
        "--key",
        "acme//chat-1",
        "2",
        "--token",
        TOKEN,
    ];
    let (ok, out, _) = cli(&server, &cancel).await;
    assert_eq!((ok, out.as_str()), (true, "cancelled task 2 of acme\n"));
    let (ok, _, err) = cli(&server, &cancel).await;
    assert!(!ok && err.contains("no live task with id 2"), "{err}");

    let (ok, _, err) = cli(&server, &["parked", "--pool", "nope"]).await;
    assert!(!ok);
    assert!(
        err.contains("no pool named \"nope\"; the pools are [\"llm\"]"),
        "{err}"
    );
    let (ok, _, err) = cli(&server, &["parked", "--pool", "llm", "--limit", "0"]).await;
    assert!(
        !ok && err.contains("limit is \"0\"; use a whole number from 1 to 1000"),
        "{err}"
    );
    gate.store(true, Ordering::Release);
    server.stop();

    let closed = serve(&pool, None);
    let url = closed.url();
    closed.stop();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_parking-lot"));
    command.args(["status", "--url", &url]);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        err.contains(&format!(
            "no admin server answers at {}",
            url.trim_end_matches('/')
        )),
        "{err}"
    );
}

/// Fails (panics) while `fail` is set.
#[derive(Clone)]
struct Flaky(Arc<AtomicBool>);

#[async_trait::async_trait]
impl prometheus_parking_lot::TaskExecutor<String, String> for Flaky {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        if self.0.load(Ordering::Acquire) {
            panic!("the provider answered 500");
        }
        payload
    }
}

/// A node of a shared queue: its failed runs are dead letters an operator lists, retries
/// and purges, from the API and from the command line; a pool with a queue of its own says
/// it keeps none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_of_a_shared_queue_are_listed_retried_and_purged() {
    use prometheus_parking_lot::actors::{spawn_supervisor, start_pool, PoolSpec, WorkerSettings};
    use prometheus_parking_lot::core::{PoolLimits, ScheduledTask, SharedParking};
    use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
    use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
    use prometheus_parking_lot::infra::queue::shared_memory::InMemorySharedQueue;

    let fail = Arc::new(AtomicBool::new(true));
    let supervisor = spawn_supervisor().await.unwrap();
    let spec = PoolSpec {
        tenant_weights: Default::default(),
        name: "node".into(),
        limits: PoolLimits::new(4, 1),
        workers: WorkerSettings {
            count: 1,
            stack_size: None,
            pin_to_cpus: false,
        },
        default_timeout: None,
        restart: prometheus_parking_lot::core::RestartPolicy::default(),
        executor: Flaky(fail.clone()),
        queue: Box::new(InMemoryQueue::new()),
        mailbox: Arc::new(InMemoryMailbox::new()),
        notifiers: Vec::new(),
        result_encoder: None,
        subscribers: Vec::new(),
        retention: None,
        shared: Some(
            SharedParking::new(Arc::new(InMemorySharedQueue::<String>::new()), "node-1")
                .with_lease(Duration::from_millis(300))
                .with_poll(Duration::from_millis(10)),
        ),
        durability: Default::default(),
        gpu: None,
        tracer: None,
    };
    let client = start_pool(&supervisor, spec).await.unwrap();
    let server = Admin::new(AdminSettings {
        bind: "127.0.0.1:0".parse().unwrap(),
        token: Some(Secret::new(TOKEN)),
        ..AdminSettings::default()
    })
    .with_pool("node", client.clone())
    .serve()
    .unwrap();
    let key = MailboxKey::new("acme");
    let task = |id| {
        ScheduledTask::new(
            TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone()),
            PROMPT.to_string(),
        )
    };
    for id in [1, 2] {
        client
            .submit(task(id), Default::default())
            .await
            .expect("accepted");
        let failed = client
            .retrieve_task(&key, id, Duration::from_secs(10))
            .await;
        assert!(failed.is_err(), "task {id} fails");
    }

    let (status, body) = get(&server, "api/pools/node/dead-letters").await;
    assert_eq!(status, 200);
    let letters = body["dead_letters"].as_array().unwrap().clone();
    assert_eq!(letters.len(), 2, "{body}");
    assert_eq!(letters[0]["task_id"], 1);
    assert!(
        letters[0]["reason"]
            .as_str()
            .unwrap()
            .contains("the provider answered 500"),
        "{body}"
    );
    let first = letters[0]["entry"]
        .as_str()
        .expect("entries are strings")
        .to_owned();
    let second = letters[1]["entry"].as_str().unwrap().to_owned();

    let (ok, out, _) = cli(&server, &["dead-letters", "--pool", "node"]).await;
    assert!(
        ok && out.contains(&first) && out.contains("the provider answered 500"),
        "{out}"
    );

    let (status, _) = post(
        &server,
        &format!("api/pools/node/dead-letters/{first}/retry"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 401, "a retry needs the token");
    fail.store(false, Ordering::Release);
    let (ok, out, _) = cli(
        &server,
        &["retry", "--pool", "node", &first, "--token", TOKEN],
    )
    .await;
    assert_eq!(
        (ok, out),
        (true, format!("dead letter {first} parked again\n"))
    );
    let rerun = client.retrieve_task(&key, 1, Duration::from_secs(10)).await;
    assert_eq!(
        rerun,
        Ok(PROMPT.to_string()),
        "the retried task ran again, and succeeded"
    );
    let (status, body) = post(
        &server,
        &format!("api/pools/node/dead-letters/{first}/retry"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(
        (
            status,
            body["error"]
                .as_str()
                .map(|e| e.starts_with("no dead letter"))
        ),
        (404, Some(true))
    );
    let (status, body) = post(
        &server,
        "api/pools/node/dead-letters/abc/retry",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");

    let (ok, out, _) = cli(
        &server,
        &["purge", "--pool", "node", &second, "--token", TOKEN],
    )
    .await;
    assert_eq!((ok, out.as_str()), (true, "1 dead letters deleted\n"));
    let (_, body) = get(&server, "api/pools/node/dead-letters").await;
    assert_eq!(body["dead_letters"].as_array().map(Vec::len), Some(0));

    let gate = Arc::new(AtomicBool::new(true));
    let local = pool(&gate);
    let local_server = serve(&local, None);
    let (status, body) = get(&local_server, "api/pools/llm/dead-letters").await;
    assert_eq!((status, &body["kept"]), (200, &Value::Bool(false)));
    assert!(
        body["note"]
            .as_str()
            .unwrap()
            .contains("keeps no dead letters"),
        "{body}"
    );
}

/// A configuration's `admin` section serves the pools it built, with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_of_a_config_are_served_as_its_admin_section_says() {
    use prometheus_parking_lot::{
        build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner,
    };
    let config = SchedulerConfig::from_json_str(&format!(
        r#"{{ "pools": {{ "chat": {{ "worker_threads": 1, "max_units": 4 }},
                          "batch": {{ "worker_threads": 1, "max_units": 8 }} }},
             "admin": {{ "bind": "127.0.0.1:0", "token": "{TOKEN}" }} }}"#
    ))
    .expect("a valid config");
    let (built, server) = tokio::task::spawn_blocking(move || {
        let healthy = Arc::new(AtomicBool::new(false));
        let built = build_pools_from_scheduler_config::<String, String, Flaky, TokioSpawner>(
            &config,
            &QueueBuilderContext::Embedded,
            None,
            |_| Flaky(healthy.clone()),
            TokioSpawner,
        )
        .expect("the pools start");
        let server = built
            .serve_admin(&config)
            .expect("it serves")
            .expect("an admin section");
        (built, server)
    })
    .await
    .unwrap();
    let (status, pools) = get(&server, "api/pools").await;
    let names: Vec<&str> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!((status, names), (200, vec!["batch", "chat"]));
    let (status, _) = post(&server, "api/pools/chat/pause", None, None).await;
    assert_eq!(status, 401);
    let (status, _) = post(&server, "api/pools/chat/pause", Some(TOKEN), None).await;
    assert_eq!(status, 200);
    assert!(built.pools["chat"].stats().paused);
    assert!(!built.pools["batch"].stats().paused);
    drop(server);
    tokio::task::spawn_blocking(move || drop(built))
        .await
        .unwrap();
}

/// A tenant no answer to a refused request may name.
const TENANT: &str = "rebound-tenant";

/// Serves a pool of 10 units with one task of [`TENANT`] running on 8 and one parked (it
/// needs 6), with `settings` (its address: a free port on 127.0.0.1).
async fn serve_parked(
    gate: &Arc<AtomicBool>,
    tenant: &str,
    settings: AdminSettings,
) -> (WorkerPool<String, String, Gated>, AdminServer) {
    let pool = pool(gate);
    let server = Admin::new(AdminSettings {
        bind: "127.0.0.1:0".parse().unwrap(),
        ..settings
    })
    .with_pool("llm", pool.client().clone())
    .serve()
    .expect("the admin server starts");
    let key = MailboxKey::new(tenant);
    let meta =
        |id, units| TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_mailbox(key.clone());
    pool.submit_async(PROMPT.to_string(), meta(1, 8))
        .await
        .expect("runs");
    pool.submit_async(PROMPT.to_string(), meta(2, 6))
        .await
        .expect("parks");
    (pool, server)
}

/// `(status, raw bytes)` of `request` (its head as written, the lines ended by CRLF, the
/// connection asked to close) sent to `server` over a plain socket. An event stream never
/// ends: what came within a second and a half is the answer.
fn raw(server: &AdminServer, request: &str) -> (u16, Vec<u8>) {
    let mut socket = std::net::TcpStream::connect(server.addr()).expect("it listens");
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("a timeout");
    let request = format!(
        "{}\r\nConnection: close\r\n\r\n",
        request.replace('\n', "\r\n")
    );
    socket.write_all(request.as_bytes()).expect("it reads");
    let mut answer = Vec::new();
    let mut chunk = [0; 4096];
    let until = std::time::Instant::now() + Duration::from_millis(1_500);
    while std::time::Instant::now() < until {
        match socket.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => answer.extend_from_slice(&chunk[..read]),
        }
    }
    let head = String::from_utf8_lossy(&answer);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer: {head}"));
    (status, answer)
}

/// Whether `bytes` hold `text`.
fn holds(bytes: &[u8], text: &str) -> bool {
    bytes
        .windows(text.len())
        .any(|window| window == text.as_bytes())
}

/// What a page whose name was rebound to 127.0.0.1 sends (DNS rebinding): its own name as
/// `Host`, or its own `Origin`. Neither reads a pool, nor changes one; the server's own
/// names still do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_or_origin_gets_no_pool_data() {
    let gate = Arc::new(AtomicBool::new(false));
    let settings = AdminSettings {
        token: Some(Secret::new(TOKEN)),
        ..AdminSettings::default()
    };
    let (pool, server) = serve_parked(&gate, TENANT, settings).await;
    let port = server.addr().port();
    let reads = [
        "/api/pools",
        "/api/pools/llm",
        "/api/pools/llm/parked",
        "/api/pools/llm/tenants",
        "/api/events",
        "/api/events?pool=llm",
    ];
    for path in reads {
        let (status, answer) = raw(
            &server,
            &format!("GET {path} HTTP/1.1\nHost: evil.example:{port}"),
        );
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(status, 421, "{path}: {text}");
        assert!(
            !holds(&answer, TENANT) && !holds(&answer, "\"llm\""),
            "{path}: {text}"
        );
        assert!(
            text.contains("evil.example") && text.contains("allowed_hosts"),
            "{path}: the refusal names the host and how to allow it: {text}"
        );
        let (status, answer) = raw(
            &server,
            &format!(
                "GET {path} HTTP/1.1\nHost: 127.0.0.1:{port}\nOrigin: http://evil.example:{port}"
            ),
        );
        assert_eq!(status, 403, "{path}: {}", String::from_utf8_lossy(&answer));
        assert!(
            !holds(&answer, TENANT) && !holds(&answer, "\"llm\""),
            "{path}"
        );
    }
    let (status, _) = raw(
        &server,
        &format!("GET / HTTP/1.1\nHost: evil.example:{port}"),
    );
    assert_eq!(status, 421, "the dashboard page too");

    let pause = |host: &str, origin: &str| {
        format!(
            "POST /api/pools/llm/pause HTTP/1.1\nHost: {host}\nOrigin: {origin}\n\
             Authorization: Bearer {TOKEN}\nContent-Length: 0"
        )
    };
    let served = format!("127.0.0.1:{port}");
    for origin in [format!("http://evil.example:{port}"), "null".into()] {
        let (status, answer) = raw(&server, &pause(&served, &origin));
        assert_eq!(
            status,
            403,
            "{origin}: {}",
            String::from_utf8_lossy(&answer)
        );
        assert!(holds(&answer, "allowed_hosts"));
    }
    let (status, _) = raw(&server, &pause("evil.example", &format!("http://{served}")));
    assert_eq!(status, 421);
    assert!(!pool.stats().paused, "a refused change changes nothing");

    for host in [
        served.clone(),
        format!("localhost:{port}"),
        "LOCALHOST".into(),
    ] {
        let (status, answer) = raw(
            &server,
            &format!("GET /api/pools/llm/parked HTTP/1.1\nHost: {host}"),
        );
        assert_eq!(status, 200, "{host}");
        assert!(holds(&answer, TENANT), "{host}");
    }
    let (status, answer) = raw(
        &server,
        &format!("GET /api/events?pool=llm HTTP/1.1\nHost: {served}"),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let (status, _) = raw(&server, &pause(&served, &format!("http://{served}")));
    assert_eq!(status, 200);
    assert!(pool.stats().paused);
    gate.store(true, Ordering::Release);
}

/// Names listed in `allowed_hosts` are answered, in code and in a configuration; a listed
/// name that is not one is refused before anything serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_hosts_are_answered_and_others_still_refused() {
    let gate = Arc::new(AtomicBool::new(false));
    let settings = AdminSettings::default().with_allowed_hosts(["Dash.Example.com"]);
    let (_pool, server) = serve_parked(&gate, TENANT, settings).await;
    let port = server.addr().port();
    for host in [
        "dash.example.com".to_owned(),
        format!("dash.example.com:{port}"),
    ] {
        let (status, answer) = raw(
            &server,
            &format!("GET /api/pools/llm/parked HTTP/1.1\nHost: {host}"),
        );
        assert_eq!(status, 200, "{host}");
        assert!(holds(&answer, TENANT));
    }
    let (status, answer) = raw(
        &server,
        &format!("GET /api/pools HTTP/1.1\nHost: evil.example:{port}"),
    );
    assert_eq!(status, 421);
    assert!(!holds(&answer, "\"llm\""));
    gate.store(true, Ordering::Release);

    let error = Admin::new(AdminSettings::default().with_allowed_hosts(["http://x.example/"]))
        .serve()
        .expect_err("not a host name");
    assert!(error.to_string().contains("http://x.example/"), "{error}");

    use prometheus_parking_lot::SchedulerConfig;
    let config = |hosts: &str| {
        SchedulerConfig::from_json_str(&format!(
            r#"{{ "pools": {{ "chat": {{ "worker_threads": 1, "max_units": 4 }} }},
                 "admin": {{ "bind": "127.0.0.1:0", "allowed_hosts": {hosts} }} }}"#
        ))
    };
    let section = config(r#"["dash.example.com", "10.0.0.5:7480", "[::1]:7480"]"#)
        .expect("valid names")
        .admin
        .expect("an admin section");
    assert_eq!(section.allowed_hosts.len(), 3);
    assert!(!section.read_token);
    for (hosts, problem) in [
        (r#"[""]"#, "is empty"),
        (r#"["ok.example", "a b"]"#, "is not a host name"),
        (r#"["http://dash.example.com"]"#, "scheme"),
        (r#"["dash.example.com:99999"]"#, "port"),
    ] {
        let error = config(hosts).expect_err(hosts).to_string();
        assert!(error.contains("admin.allowed_hosts["), "{hosts}: {error}");
        assert!(error.contains(problem), "{hosts}: {error}");
    }
}

/// With `read_token`, reads of pool data need the token on loopback too (the event stream
/// takes it in its address, as a browser's EventSource can send it); the page does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_token_makes_reads_need_the_token() {
    let gate = Arc::new(AtomicBool::new(false));
    let settings = AdminSettings {
        token: Some(Secret::new(TOKEN)),
        ..AdminSettings::default()
    }
    .with_read_token(true);
    let (_pool, server) = serve_parked(&gate, TENANT, settings).await;
    let host = format!("Host: {}", server.addr());
    for path in [
        "/api/pools",
        "/api/pools/llm/parked",
        "/api/events?pool=llm",
    ] {
        let (status, answer) = raw(&server, &format!("GET {path} HTTP/1.1\n{host}"));
        assert_eq!(status, 401, "{path}: {}", String::from_utf8_lossy(&answer));
        assert!(
            !holds(&answer, TENANT) && !holds(&answer, "\"llm\""),
            "{path}"
        );
        let (status, _) = raw(
            &server,
            &format!("GET {path} HTTP/1.1\n{host}\nAuthorization: Bearer wrong-token"),
        );
        assert_eq!(status, 401, "{path}");
        let (status, _) = raw(
            &server,
            &format!("GET {path} HTTP/1.1\n{host}\nAuthorization: Bearer {TOKEN}"),
        );
        assert_eq!(status, 200, "{path}");
    }
    let (status, answer) = raw(
        &server,
        &format!("GET /api/pools/llm/tenants HTTP/1.1\n{host}\nAuthorization: Bearer {TOKEN}"),
    );
    assert_eq!(status, 200);
    assert!(holds(&answer, TENANT));
    let (status, _) = raw(
        &server,
        &format!("GET /api/events?pool=llm&token={TOKEN} HTTP/1.1\n{host}"),
    );
    assert_eq!(
        status, 200,
        "the event stream takes the token in its address"
    );
    let (status, _) = raw(
        &server,
        &format!("GET /api/events?pool=llm&token=wrong HTTP/1.1\n{host}"),
    );
    assert_eq!(status, 401);
    let (status, _) = raw(
        &server,
        &format!("GET /api/pools?token={TOKEN} HTTP/1.1\n{host}"),
    );
    assert_eq!(status, 401, "only the event stream takes it in its address");
    let (status, answer) = raw(&server, &format!("GET / HTTP/1.1\n{host}"));
    assert_eq!(status, 200, "the page itself needs no token");
    assert!(holds(&answer, "<html"));
    let (ok, out, _) = cli(&server, &["--token", TOKEN, "tenants", "--pool", "llm"]).await;
    assert!(
        ok && out.contains(TENANT),
        "the command line reads with its token: {out}"
    );
    gate.store(true, Ordering::Release);
}

/// A tenant made of terminal escapes (tenants come from API callers) reaches the
/// operator's terminal escaped: no ESC or BEL byte in what `parked` and `tenants` print.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_prints_callers_text_escaped() {
    let gate = Arc::new(AtomicBool::new(false));
    let tenant = "esc\x1b[2J\x1b]0;pwned\x07tenant";
    let (_pool, server) = serve_parked(&gate, tenant, AdminSettings::default()).await;
    let escaped = r"esc\u{1b}[2J\u{1b}]0;pwned\u{7}tenant";
    for command in ["parked", "tenants", "running"] {
        let output = cli_output(&server, &[command, "--pool", "llm"]).await;
        let shown = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{command}: {shown}");
        assert!(
            !output.stdout.contains(&0x1b) && !output.stdout.contains(&0x07),
            "{command} printed raw control bytes: {shown:?}"
        );
        assert!(holds(&output.stdout, escaped), "{command}: {shown}");
        let output = cli_output(&server, &["--json", command, "--pool", "llm"]).await;
        assert!(!output.stdout.contains(&0x1b) && !output.stdout.contains(&0x07));
        let json: Value = serde_json::from_slice(&output.stdout).expect("--json prints JSON");
        assert!(json.to_string().contains("pwned"), "{json}");
    }
    let output = cli_output(&server, &["parked", "--pool", "no\x1b[2Jsuch"]).await;
    assert!(!output.status.success());
    assert!(
        !output.stderr.contains(&0x1b),
        "an error echoing a name is escaped too"
    );
    gate.store(true, Ordering::Release);
}

/// Under a fair share by use, the API and the command line show each tenant's weight and
/// weighted service (a start charges the tenant its units times the timeout over its
/// weight, until the run ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_show_their_weight_and_service_under_a_fair_share_by_use() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(1)
            .with_max_units(10)
            .with_timeout_ms(1_000)
            .with_fair_share_by_use(
                FairByUse::new(UsageCharge::Held),
                TenantWeights::default().with("acme", 4),
            ),
        Gated(gate.clone()),
    )
    .expect("the pool starts");
    let server = serve(&pool, Some(TOKEN));
    let meta = |id, tenant: &str| {
        TaskMetadata::new(id, ResourceCost::gpu_vram(8)).with_mailbox(MailboxKey::new(tenant))
    };
    pool.submit_async(PROMPT.to_string(), meta(1, "acme"))
        .await
        .expect("runs");
    pool.submit_async(PROMPT.to_string(), meta(2, "globex"))
        .await
        .expect("parks");
    let (status, tenants) = get(&server, "api/pools/llm/tenants").await;
    assert_eq!(status, 200);
    let row = |name: &str| {
        tenants["tenants"]
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["tenant"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("{name}'s row: {tenants}"))
    };
    // 8 units for up to 1,000 ms, over weight 4.
    assert_eq!(row("acme")["weight"], 4);
    assert_eq!(row("acme")["service"].as_f64(), Some(2_000.0), "{tenants}");
    assert_eq!(row("globex")["weight"], 1);
    let (ok, out, _) = cli(&server, &["tenants", "--pool", "llm"]).await;
    assert!(ok, "{out}");
    let acme = out
        .lines()
        .find(|line| line.starts_with("acme"))
        .unwrap_or_else(|| panic!("acme's line: {out}"));
    assert!(
        out.lines()
            .next()
            .is_some_and(|head| head.contains("WEIGHT") && head.contains("SERVICE")),
        "{out}"
    );
    assert!(acme.contains(" 4 ") && acme.contains("2000"), "{out}");
    gate.store(true, Ordering::Release);
}

// ------------------------------------------------------- what an operator saw (issue 41)

/// `n` tasks without a mailbox: each gets a tenant of its own (`anonymous-` and 32 hex
/// digits).
async fn submit_anonymous(pool: &WorkerPool<String, String, Gated>, ids: std::ops::Range<u64>) {
    for id in ids {
        pool.submit_async(
            PROMPT.to_string(),
            TaskMetadata::new(id, ResourceCost::gpu_vram(1)),
        )
        .await
        .expect("parks");
    }
}

/// Tasks without a mailbox are one row of the tenants, `anonymous (N tasks)`, in the API
/// and on the command line, not a row each; and the tenants come in pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_tenants_are_one_row_and_tenants_come_in_pages() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = pool(&gate);
    let server = serve(&pool, Some(TOKEN));
    pool.submit_async(
        PROMPT.to_string(),
        TaskMetadata::new(1, ResourceCost::gpu_vram(8)).with_mailbox(MailboxKey::new("acme")),
    )
    .await
    .expect("runs");
    submit_anonymous(&pool, 2..7).await;
    // A tenant named so by its caller is a tenant like any other.
    pool.submit_async(
        PROMPT.to_string(),
        TaskMetadata::new(7, ResourceCost::gpu_vram(1))
            .with_mailbox(MailboxKey::new("anonymous-team")),
    )
    .await
    .expect("parks");

    let (status, body) = get(&server, "api/pools/llm/tenants").await;
    assert_eq!(status, 200);
    let rows = body["tenants"].as_array().expect("rows").clone();
    let names: Vec<&str> = rows
        .iter()
        .filter_map(|row| row["tenant"].as_str())
        .collect();
    assert_eq!(names, ["acme", "anonymous-team", "anonymous"], "{body}");
    assert_eq!(
        (
            &rows[2]["anonymous_tenants"],
            &rows[2]["parked"],
            &rows[2]["running"]
        ),
        (&Value::from(5), &Value::from(5), &Value::from(0)),
        "{body}"
    );
    assert!(rows[0].get("anonymous_tenants").is_none(), "{body}");
    assert!(rows[1].get("anonymous_tenants").is_none(), "{body}");
    assert_eq!(body["tenants_total"], 3);
    let (_, one) = get(&server, "api/pools/llm").await;
    assert_eq!(one["tenants"].as_array().map(Vec::len), Some(3), "{one}");

    let (_, page) = get(&server, "api/pools/llm/tenants?offset=2&limit=1").await;
    assert_eq!(
        (
            page["tenants"].as_array().map(Vec::len),
            &page["tenants"][0]["tenant"],
            &page["tenants_total"]
        ),
        (Some(1), &Value::from("anonymous"), &Value::from(3)),
        "{page}"
    );
    let (status, body) = get(&server, "api/pools/llm/tenants?limit=0").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            400,
            Some("limit is \"0\"; use a whole number from 1 to 1000")
        )
    );

    let (ok, out, _) = cli(&server, &["tenants", "--pool", "llm"]).await;
    assert!(ok, "{out}");
    assert_eq!(out.lines().count(), 4, "a header and three rows: {out}");
    assert!(
        out.contains("anonymous (5 tasks)")
            && out.matches("anonymous-").count() == 1
            && out.contains("anonymous-team"),
        "{out}"
    );
    let (ok, out, _) = cli(&server, &["tenants", "--pool", "llm", "--limit", "1"]).await;
    assert!(ok && out.ends_with("1–1 of 3 tenants\n"), "{out}");
    assert!(out.contains("acme") && !out.contains("anonymous"), "{out}");
    gate.store(true, Ordering::Release);
}

/// The sum of what `tasks` hold of `kind`.
fn units_of(tasks: &Value, kind: &str) -> u64 {
    tasks
        .as_array()
        .into_iter()
        .flatten()
        .filter(|task| task["cost"]["kind"].as_str().map(str::to_lowercase) == Some(kind.into()))
        .filter_map(|task| task["cost"]["units"].as_u64())
        .sum()
}

/// One snapshot gives the counters, the capacity in use and the lists of one instant: read
/// again and again while tasks start and end, its counters always count what its lists
/// hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_shows_counters_and_lists_of_one_instant() {
    // Closed until a read has seen tasks running; then they start and end all the time.
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(3)
            .with_max_units(24)
            .with_timeout_ms(TIMEOUT_MS),
        Gated(gate.clone()),
    )
    .expect("the pool starts");
    let server = serve(&pool, Some(TOKEN));
    let submitter = {
        let client = pool.client().clone();
        tokio::spawn(async move {
            for id in 1..=400u64 {
                let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(1 + (id % 8) as u32))
                    .with_mailbox(MailboxKey::new(format!("tenant-{}", id % 3)));
                let task = prometheus_parking_lot::core::ScheduledTask::new(meta, id.to_string());
                if client.submit(task, Default::default()).await.is_err() {
                    return;
                }
                if id % 16 == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        })
    };
    let mut busy_reads = 0;
    let mut reads = 0;
    while reads < 60 || !submitter.is_finished() {
        reads += 1;
        let (status, snapshot) = get(&server, "api/pools/llm/snapshot?limit=1000").await;
        assert_eq!(status, 200, "{snapshot}");
        let stats = &snapshot["pool"]["stats"];
        let running = snapshot["running"].as_array().expect("running").len();
        assert_eq!(stats["active_tasks"], running, "{snapshot}");
        assert_eq!(
            stats["queued_tasks"], snapshot["parked"]["parked_total"],
            "{snapshot}"
        );
        let vram = snapshot["pool"]["kinds"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|kind| kind["kind"] == "gpu_vram")
            .map_or(0, |kind| kind["used"].as_u64().unwrap_or(0));
        assert_eq!(
            vram,
            units_of(&snapshot["running"], "gpuvram"),
            "{snapshot}"
        );
        let tenants = &snapshot["tenants"]["tenants"];
        let running_by_tenants: u64 = tenants
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|tenant| tenant["running"].as_u64())
            .sum();
        assert_eq!(running_by_tenants, running as u64, "{snapshot}");
        assert!(snapshot["refusals"].is_array() && snapshot["at_ms"].is_u64());
        if running > 0 {
            busy_reads += 1;
            gate.store(true, Ordering::Release);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    submitter.await.unwrap();
    assert!(busy_reads > 0, "some reads saw tasks running");
    let (status, body) = get(&server, "api/pools/llm/snapshot?offset=x").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            400,
            Some("offset is \"x\"; use a whole number from 0 to 9223372036854775807")
        )
    );
}

/// Capacity is shown for the kinds configured, and where one number sets every kind
/// (`max_units`) for the kinds tasks use only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_is_shown_for_the_kinds_configured_or_used() {
    let gate = Arc::new(AtomicBool::new(false));
    let uniform = pool(&gate);
    let server = serve(&uniform, None);
    let kinds = |body: &Value| -> Vec<String> {
        body["pools"][0]["kinds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|kind| kind["kind"].as_str().map(str::to_owned))
            .collect()
    };
    let (_, body) = get(&server, "api/pools").await;
    assert_eq!(kinds(&body), Vec::<String>::new(), "none used yet: {body}");
    assert_eq!(body["pools"][0]["units_per_kind"], 10, "{body}");
    uniform
        .submit_async(
            PROMPT.to_string(),
            TaskMetadata::new(1, ResourceCost::gpu_vram(4)),
        )
        .await
        .expect("runs");
    let (_, body) = get(&server, "api/pools").await;
    assert_eq!(kinds(&body), ["gpu_vram"], "{body}");
    gate.store(true, Ordering::Release);
    // Once the task has ended, the kind it used keeps its bar (at 0).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while uniform.stats().active_tasks > 0 {
        assert!(std::time::Instant::now() < deadline, "the task ends");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (_, body) = get(&server, "api/pools").await;
    assert_eq!(kinds(&body), ["gpu_vram"], "{body}");

    let explicit = WorkerPool::new(
        WorkerPoolConfig::new().with_worker_count(1).with_capacity(
            prometheus_parking_lot::core::Capacity::default()
                .with(prometheus_parking_lot::ResourceKind::Cpu, 4),
        ),
        Gated(gate.clone()),
    )
    .expect("the pool starts");
    let server = serve(&explicit, None);
    let (_, body) = get(&server, "api/pools").await;
    assert_eq!(kinds(&body), ["cpu"], "{body}");
    assert!(body["pools"][0].get("units_per_kind").is_none(), "{body}");
}

/// Empty lists read alike on the command line: a sentence, not a bare header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_lists_say_so_on_the_command_line() {
    let gate = Arc::new(AtomicBool::new(true));
    let pool = pool(&gate);
    let server = serve(&pool, None);
    for (command, said) in [
        ("running", "no running tasks\n"),
        ("tenants", "no tenants with live tasks\n"),
        ("parked", "no parked tasks\n"),
    ] {
        let (ok, out, err) = cli(&server, &[command, "--pool", "llm"]).await;
        assert_eq!((ok, out.as_str()), (true, said), "{command}: {err}");
    }
}

/// `parking-lot ARGS` with `PARKING_LOT_URL` set to `url` (or unset): (exit success,
/// stdout, stderr).
async fn cli_at(args: &[&str], url: Option<&str>) -> (bool, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_parking-lot"));
    command.args(args).env_remove("PARKING_LOT_URL");
    if let Some(url) = url {
        command.env("PARKING_LOT_URL", url);
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("the command runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `--url` (or PARKING_LOT_URL) without a scheme is taken as http://; a scheme the server
/// does not speak, or what is no address, is refused saying what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_without_a_scheme_reaches_the_server() {
    let gate = Arc::new(AtomicBool::new(true));
    let pool = pool(&gate);
    let server = serve(&pool, None);
    let bare = server.addr().to_string();
    let (ok, out, err) = cli_at(&["status", "--url", &bare], None).await;
    assert!(
        ok && out.lines().nth(1).is_some_and(|row| row.starts_with("llm")),
        "{out}{err}"
    );
    let (ok, out, err) = cli_at(&["status"], Some(&format!("{bare}/"))).await;
    assert!(ok && out.contains("llm"), "PARKING_LOT_URL: {out}{err}");
    let (ok, _, err) = cli_at(&["status", "--url", &format!("ftp://{bare}")], None).await;
    assert!(
        !ok && err.contains("has the scheme ftp; the admin server speaks http:// or https://"),
        "{err}"
    );
    let (ok, _, err) = cli_at(&["status", "--url", "127.0.0.1:notaport"], None).await;
    assert!(
        !ok && err.contains("--url \"127.0.0.1:notaport\" is not an address"),
        "{err}"
    );
}

/// A pool whose queue is its own has no dead letters: listing them says so plainly (an
/// empty list and a note), not as a configuration error; changing them is a 409 that says
/// the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_dead_letters_says_so_plainly() {
    let gate = Arc::new(AtomicBool::new(true));
    let pool = pool(&gate);
    let server = serve(&pool, Some(TOKEN));
    let (status, body) = get(&server, "api/pools/llm/dead-letters").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["dead_letters"], Value::Array(Vec::new()));
    assert_eq!(body["kept"], false);
    let note = body["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("pool \"llm\" keeps no dead letters: its queue is its own"),
        "{body}"
    );
    let (ok, out, err) = cli(&server, &["dead-letters", "--pool", "llm"]).await;
    assert_eq!(
        (ok, out.as_str()),
        (true, format!("{note}\n").as_str()),
        "{err}"
    );
    assert!(!out.contains("invalid configuration"));
    let (ok, _, err) = cli(
        &server,
        &["purge", "--pool", "llm", "--all", "--token", TOKEN],
    )
    .await;
    assert!(!ok && err.contains(note), "{err}");
    assert!(!err.contains("invalid configuration"), "{err}");
}

/// The page carries its first snapshot (the pool `?pool=` names, its lists and history),
/// so it shows the pool as it loads; a caller's text in it cannot end its script element;
/// where reads need the token, the page carries none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_carries_its_first_snapshot() {
    let gate = Arc::new(AtomicBool::new(false));
    let pool = pool(&gate);
    let server = serve(&pool, Some(TOKEN));
    let odd = "</script><script>alert(1)</script>";
    pool.submit_async(
        PROMPT.to_string(),
        TaskMetadata::new(1, ResourceCost::gpu_vram(4)).with_mailbox(MailboxKey::new(odd)),
    )
    .await
    .expect("runs");
    let (status, page) = call(
        reqwest::Method::GET,
        format!("{}?pool=llm", server.url()),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(!page.contains(PROMPT) && !page.contains(odd), "escaped");
    let start = r#"<script id="first-snapshot" type="application/json">"#;
    let embedded = page
        .split_once(start)
        .and_then(|(_, rest)| rest.split_once("</script>"))
        .map(|(json, _)| json)
        .expect("the snapshot's element");
    let first: Value = serde_json::from_str(embedded).expect("JSON");
    assert_eq!(first["pool"], "llm");
    assert_eq!(first["pools"][0]["name"], "llm");
    assert_eq!(first["snapshot"]["running"][0]["id"], 1, "{first}");
    assert_eq!(first["snapshot"]["running"][0]["key"]["tenant"], odd);
    assert!(first["history"]["seconds"].is_array(), "{first}");

    let settings = AdminSettings {
        token: Some(Secret::new(TOKEN)),
        ..AdminSettings::default()
    }
    .with_read_token(true);
    let (_pool, guarded) = serve_parked(&gate, TENANT, settings).await;
    let (status, page) = call(reqwest::Method::GET, guarded.url(), None, None).await;
    assert_eq!(status, 200);
    assert!(
        page.contains(&format!("{start}null</script>")),
        "no data without the token"
    );
    assert!(!page.contains(TENANT));
    gate.store(true, Ordering::Release);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_listed_and_paused_over_the_api_and_the_command_line() {
    use prometheus_parking_lot::schedule::{Schedule, Timing};

    let gate = Arc::new(AtomicBool::new(true));
    let pool = pool(&gate);
    let nightly = Schedule::new(
        "reindex",
        Timing::cron("0 2 * * *", "Europe/Paris").unwrap(),
    )
    .unwrap();
    pool.add_schedule(nightly, |_| "reindex".to_string())
        .unwrap();
    let server = serve(&pool, Some(TOKEN));

    let (status, body) = get(&server, "api/pools/llm/schedules").await;
    assert_eq!(status, 200, "{body}");
    let listed = &body["schedules"][0];
    assert_eq!(listed["name"], "reindex");
    assert_eq!(listed["expression"], "0 2 * * *");
    assert_eq!(listed["zone"], "Europe/Paris");
    assert_eq!(listed["missed"], "skip");
    assert_eq!(listed["paused"], false);

    let pause = "api/pools/llm/schedules/reindex/pause";
    let (status, _) = post(&server, pause, None, None).await;
    assert_eq!(status, 401, "a pause needs the token");
    assert!(!pool.schedules()[0].paused);
    let (status, body) = post(&server, pause, Some(TOKEN), None).await;
    assert_eq!((status, &body["paused"]), (200, &Value::Bool(true)));
    assert!(pool.schedules()[0].paused);
    let (status, body) = post(
        &server,
        "api/pools/llm/schedules/nope/pause",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no schedule named \"nope\""),
        "{body}"
    );
    let (status, body) = post(
        &server,
        "api/pools/llm/schedules/reindex/skip",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("use pause or resume"),
        "{body}"
    );

    let (ok, out, _) = cli(&server, &["schedules", "--pool", "llm"]).await;
    assert!(ok);
    assert!(out.starts_with("NAME"), "{out}");
    assert!(
        out.contains("reindex") && out.contains("Europe/Paris") && out.contains("paused"),
        "{out}"
    );
    let resume = [
        "schedule", "resume", "--pool", "llm", "reindex", "--token", TOKEN,
    ];
    let (ok, out, _) = cli(&server, &resume).await;
    assert_eq!((ok, out.as_str()), (true, "schedule reindex resumed\n"));
    assert!(!pool.schedules()[0].paused);
    assert!(pool.schedules()[0].next_tick_ms.is_some());
    pool.shutdown();
}

/// A task of several kinds (core rule 25) shows every kind it holds: in the API's JSON (its
/// `also`), and in the command line's listings of parked and running tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_and_the_command_line_show_every_kind_a_task_holds() {
    use prometheus_parking_lot::core::SubmitOptions;

    let gate = Arc::new(AtomicBool::new(false));
    let pool = pool(&gate);
    let server = serve(&pool, None);
    let key = MailboxKey::new("acme").with_session("seq");
    let meta =
        |id, units| TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_mailbox(key.clone());
    let slots = |units| SubmitOptions::default().with_also(ResourceCost::cpu(units));
    pool.submit_with(PROMPT.to_string(), meta(1, 8), slots(3))
        .await
        .expect("runs");
    pool.submit_with(PROMPT.to_string(), meta(2, 2), slots(4))
        .await
        .expect("parks: the only worker is busy");

    let (status, parked) = get(&server, "api/pools/llm/parked?limit=5").await;
    assert_eq!(status, 200, "{parked}");
    assert_eq!(parked["parked"][0]["id"], 2);
    assert_eq!(
        parked["parked"][0]["also"],
        serde_json::json!([{ "kind": "Cpu", "units": 4 }]),
        "{parked}"
    );
    let (status, running) = get(&server, "api/pools/llm/running").await;
    assert_eq!(status, 200, "{running}");
    assert_eq!(running["running"][0]["also"][0]["units"], 3, "{running}");

    let (ok, out, _) = cli(&server, &["parked", "--pool", "llm"]).await;
    assert!(ok && out.contains("2 gpu_vram + 4 cpu"), "{out}");
    let (ok, out, _) = cli(&server, &["running", "--pool", "llm"]).await;
    assert!(ok && out.contains("8 gpu_vram + 3 cpu"), "{out}");
    gate.store(true, Ordering::Release);
}
