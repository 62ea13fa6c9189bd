//! The http notifier against a real HTTP server on 127.0.0.1 (`support/webhook_receiver.rs`):
//! every terminal status is posted, signed and authorised, from a config-built pool and from
//! a node of a shared queue; retries after 5xx answers and timeouts reuse the `delivery_id`;
//! an endpoint that is down for a while gets every notification once it is back; a hanging
//! endpoint blocks neither its pool nor another; shutdown flushes the outbox up to the drain
//! deadline; and no secret reaches the captured logs.

#![cfg(feature = "webhook")]

#[path = "support/webhook_receiver.rs"]
mod webhook_receiver;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use prometheus_parking_lot::actors::{spawn_supervisor, start_pool, PoolSpec, WorkerSettings};
use prometheus_parking_lot::config::Secret;
use prometheus_parking_lot::core::{
    json_result, Notifier, PoolClient, PoolLimits, SharedParking, SharedQueue, SubmitOptions,
    TerminalEvent,
};
use prometheus_parking_lot::core::{RestartPolicy, TaskStatus, TraceParent};
use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
use prometheus_parking_lot::infra::notify::http::{HttpNotifier, HttpNotifierSettings};
use prometheus_parking_lot::infra::queue::memory::InMemoryQueue;
use prometheus_parking_lot::infra::queue::shared_memory::InMemorySharedQueue;
use prometheus_parking_lot::util::TaskId;
use prometheus_parking_lot::*;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{json, Value};
use sha2::Sha256;
use webhook_receiver::{distinct_deliveries, Receiver, Reply, Request};

/// How long anything may take before a test fails.
const WAIT: Duration = Duration::from_secs(10);
/// The secrets every test uses, so the log test covers them all.
const AUTH: &str = "Bearer tok-5ecret-AUTH";
const HMAC_KEY: &str = "hmac-5ecret-KEY";
const SECRET_MARKS: [&str; 2] = ["tok-5ecret-AUTH", "hmac-5ecret-KEY"];

// ---------------------------------------------------------------------------------------
// The executor: a payload says what the task does
// ---------------------------------------------------------------------------------------

/// A result that serialises, except when its text is `unserialisable`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Answer {
    text: String,
}

impl Serialize for Answer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.text == "unserialisable" {
            return Err(serde::ser::Error::custom(
                "this answer refuses to serialise",
            ));
        }
        let mut fields = BTreeMap::new();
        fields.insert("text", &self.text);
        fields.serialize(serializer)
    }
}

/// `panic` panics, `sleep:<ms>` sleeps, `unserialisable` returns an answer that does not
/// serialise, anything else is answered.
#[derive(Clone)]
struct Model;

#[async_trait::async_trait]
impl TaskExecutor<String, Answer> for Model {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> Answer {
        if payload == "panic" {
            panic!("the model fell over");
        }
        if let Some(ms) = payload.strip_prefix("sleep:") {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
        }
        if payload == "unserialisable" {
            return Answer {
                text: payload.clone(),
            };
        }
        Answer {
            text: format!("answer to {payload}"),
        }
    }
}

fn key(session: &str) -> MailboxKey {
    MailboxKey::new("acme")
        .with_user("ada")
        .with_session(session)
}

fn task(id: TaskId, payload: &str) -> ScheduledTask<String> {
    let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key(&format!("s{id}")));
    ScheduledTask::new(meta, payload.to_owned())
}

fn now_ms() -> u64 {
    u64::try_from(prometheus_parking_lot::util::clock::now_ms()).unwrap()
}

// ---------------------------------------------------------------------------------------
// Pools and notifiers
// ---------------------------------------------------------------------------------------

/// A config whose pools each POST to one URL, signed and authorised.
fn config(pools: &[(&str, &str, usize)]) -> SchedulerConfig {
    let pools: Vec<String> = pools
        .iter()
        .map(|(name, url, workers)| {
            format!(
                r#""{name}": {{
                    "worker_threads": {workers}, "max_units": 4, "default_timeout_ms": 10000,
                    "mailbox": {{ "notifier": {{
                        "type": "http", "base_url": "{url}", "auth_header": "{AUTH}",
                        "hmac_secret": "{HMAC_KEY}", "timeout_ms": 2000, "max_retries": 3
                    }} }}
                }}"#
            )
        })
        .collect();
    SchedulerConfig::from_json_str(&format!(r#"{{ "pools": {{ {} }} }}"#, pools.join(",")))
        .expect("a valid config")
}

fn build(config: &SchedulerConfig) -> BuiltPools<String, Answer, Model> {
    build_pools_from_scheduler_config::<String, Answer, Model, TokioSpawner>(
        config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Model,
        TokioSpawner,
    )
    .expect("pools build")
}

/// Settings for a receiver, with retries quick enough for a test.
fn settings(receiver: &Receiver) -> HttpNotifierSettings {
    HttpNotifierSettings::new(receiver.url())
        .with_name("test")
        .with_auth_header(Secret::new(AUTH))
        .with_hmac_secret(Secret::new(HMAC_KEY))
        .with_timeout(Duration::from_secs(2))
        .with_max_retries(5)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(50))
}

fn notifier(settings: HttpNotifierSettings) -> Arc<HttpNotifier> {
    Arc::new(HttpNotifier::new(settings).expect("notifier starts"))
}

/// A pool of one worker over in-memory backends, telling `notifier`, on the actor API.
async fn pool_with(notifier: Arc<HttpNotifier>) -> PoolClient<String, Answer> {
    let supervisor = spawn_supervisor().await.unwrap();
    let spec = PoolSpec {
        tenant_weights: Default::default(),
        name: "coded".into(),
        limits: PoolLimits::new(4, 1),
        workers: WorkerSettings {
            count: 1,
            stack_size: None,
            pin_to_cpus: false,
        },
        default_timeout: None,
        restart: RestartPolicy::default(),
        executor: Model,
        queue: Box::new(InMemoryQueue::new()),
        mailbox: Arc::new(InMemoryMailbox::new()),
        notifiers: vec![notifier],
        result_encoder: Some(json_result::<Answer>),
        subscribers: Vec::new(),
        retention: None,
        shared: None,
        durability: Default::default(),
        gpu: None,
        tracer: None,
    };
    start_pool(&supervisor, spec).await.unwrap()
}

/// A terminal event as a pool would send it.
fn event(task_id: TaskId) -> TerminalEvent {
    TerminalEvent {
        pool: Arc::from("direct"),
        key: key(&format!("s{task_id}")),
        task_id,
        status: TaskStatus::Completed,
        stored_at_ms: u128::from(now_ms()),
        attempt: 1,
        result: Some(json!({ "text": format!("answer {task_id}") })),
        trace: None,
    }
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {WAIT:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------------------
// What the receiver checks
// ---------------------------------------------------------------------------------------

/// Recomputes the signature the way a receiver does (here with the RustCrypto crates
/// directly, not the notifier's code) and checks its timestamp is recent.
fn signature_verifies(request: &Request, secret: &str) -> bool {
    let Some(header) = request.header("x-parking-lot-signature") else {
        return false;
    };
    let Some((t, code)) = header
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
    else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(&request.body);
    let expected: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let t: u64 = t.parse().unwrap_or(0);
    code == expected && request.received_at_ms.abs_diff(t) < 60_000
}

/// Every request is a signed, authorised JSON POST to the hook's path.
fn assert_well_formed(requests: &[Request]) {
    for request in requests {
        assert_eq!(
            (request.method.as_str(), request.path.as_str()),
            ("POST", "/hooks/done")
        );
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(request.header("authorization"), Some(AUTH));
        assert!(signature_verifies(request, HMAC_KEY), "{request:?}");
        assert!(!signature_verifies(request, "another secret"));
    }
}

/// The bodies by task id (the last one received for each).
fn bodies_by_task(requests: &[Request]) -> HashMap<u64, Value> {
    requests
        .iter()
        .map(|request| {
            let body = request.json();
            (body["task_id"].as_u64().unwrap(), body)
        })
        .collect()
}

/// How many times each delivery id arrived, and whether its bodies were identical.
fn attempts_by_delivery(requests: &[Request]) -> HashMap<String, (usize, bool)> {
    let mut seen: HashMap<String, (usize, Vec<u8>, bool)> = HashMap::new();
    for request in requests {
        let entry = seen
            .entry(request.delivery_id())
            .or_insert((0, request.body.clone(), true));
        entry.0 += 1;
        entry.2 &= entry.1 == request.body;
    }
    seen.into_iter()
        .map(|(id, (count, _, same))| (id, (count, same)))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Captured logs
// ---------------------------------------------------------------------------------------

#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything logged by every test of this file, at every level, from the first call on.
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Capture(buffer.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        buffer
    })
    .clone()
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_pool_posts_every_terminal_status_signed_and_authorised() {
    logs();
    let receiver = Receiver::ok().await;
    let built = build(&config(&[("chat", &receiver.url(), 1)]));
    let pool = &built.pools["chat"];
    let client = pool.client();
    let started = now_ms();
    let run = |id, payload: &str| client.submit(task(id, payload), SubmitOptions::default());

    run(1, "hello").await.unwrap();
    let first = receiver.wait_for_deliveries(1, WAIT).await;
    assert_eq!(first[0].json()["task_id"], 1);
    // Notified after it was stored: the result is there for whoever reacts.
    assert_eq!(
        client.try_retrieve(&key("s1")).await.unwrap().text,
        "answer to hello"
    );
    run(2, "unserialisable").await.unwrap();
    run(3, "panic").await.unwrap();
    let short = SubmitOptions {
        timeout: Some(Duration::from_millis(300)),
        ..SubmitOptions::default()
    };
    client.submit(task(4, "sleep:5000"), short).await.unwrap();
    receiver.wait_for_deliveries(4, WAIT).await;
    // While task 5 holds the only worker, 6 parks and expires, 7 parks and is cancelled.
    run(5, "sleep:1500").await.unwrap();
    let soon = prometheus_parking_lot::util::clock::now_ms() + 100;
    let mut expiring = task(6, "late");
    expiring.meta = expiring.meta.with_deadline_ms(soon);
    client
        .submit(expiring, SubmitOptions::default())
        .await
        .unwrap();
    run(7, "never").await.unwrap();
    client.cancel(&key("s7"), 7).await.unwrap();

    let requests = receiver.wait_for_deliveries(7, WAIT).await;
    assert_eq!(requests.len(), 7, "one POST each, nothing retried");
    assert_well_formed(&requests);
    let bodies = bodies_by_task(&requests);
    let expected = [
        (1, "completed", Some(json!({ "text": "answer to hello" }))),
        (2, "completed", None),
        (3, "failed", None),
        (4, "timed_out", None),
        (
            5,
            "completed",
            Some(json!({ "text": "answer to sleep:1500" })),
        ),
        (6, "expired", None),
        (7, "cancelled", None),
    ];
    for (id, status, result) in expected {
        let body = &bodies[&id];
        assert_eq!(body["status"], status, "task {id}: {body}");
        assert_eq!(body.get("result"), result.as_ref(), "task {id}: {body}");
        assert_eq!(
            (&body["pool"], &body["tenant"], &body["user_id"]),
            (&json!("chat"), &json!("acme"), &json!("ada"))
        );
        assert_eq!(body["session_id"], format!("s{id}"));
        assert_eq!(body["attempt"], 1);
        let stored_at = body["stored_at_ms"].as_u64().unwrap();
        assert!(
            (started..=now_ms()).contains(&stored_at),
            "task {id}: {body}"
        );
        assert_eq!(body.get("error").is_some(), status == "failed", "task {id}");
    }
    assert!(bodies[&3]["error"]
        .as_str()
        .unwrap()
        .contains("the model fell over"));
    let ids: std::collections::HashSet<_> = requests.iter().map(Request::delivery_id).collect();
    assert_eq!(ids.len(), 7, "a delivery id per notification");
    // The notifications took nothing from the mailbox.
    for id in [2, 5] {
        assert!(client.try_retrieve(&key(&format!("s{id}"))).await.is_ok());
    }
    pool.shutdown_with_drain(Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_queue_node_posts_a_rejected_task_and_a_coded_pool_sends_no_result() {
    logs();
    let receiver = Receiver::ok().await;
    let notifier = notifier(settings(&receiver));
    let queue = Arc::new(InMemorySharedQueue::<String>::new());
    let supervisor = spawn_supervisor().await.unwrap();
    let shared = SharedParking::new(queue.clone(), "node-a").with_poll(Duration::from_millis(10));
    let spec = PoolSpec {
        tenant_weights: Default::default(),
        name: "node-a".into(),
        limits: PoolLimits::new(2, 2),
        workers: WorkerSettings {
            count: 2,
            stack_size: None,
            pin_to_cpus: false,
        },
        default_timeout: None,
        restart: RestartPolicy::default(),
        executor: Model,
        queue: Box::new(InMemoryQueue::new()),
        mailbox: Arc::new(InMemoryMailbox::new()),
        notifiers: vec![notifier.clone()],
        result_encoder: None,
        subscribers: Vec::new(),
        retention: None,
        shared: Some(shared),
        durability: Default::default(),
        gpu: None,
        tracer: None,
    };
    let node = start_pool(&supervisor, spec).await.unwrap();
    node.submit(task(7, "sleep:400"), SubmitOptions::default())
        .await
        .unwrap();
    // Another node parked a task with the same tenant and id: this node claims it and must
    // refuse it, since task 7 of acme is live here.
    queue.enqueue(1, now_ms(), task(7, "again")).await.unwrap();

    let requests = receiver.wait_for_deliveries(2, WAIT).await;
    assert_well_formed(&requests);
    let statuses: Vec<Value> = requests
        .iter()
        .map(|r| r.json()["status"].clone())
        .collect();
    assert_eq!(statuses, [json!("rejected"), json!("completed")]);
    let rejected = requests[0].json();
    assert_eq!(
        (
            &rejected["task_id"],
            &rejected["attempt"],
            &rejected["pool"]
        ),
        (&json!(7), &json!(1), &json!("node-a"))
    );
    assert!(rejected["error"]
        .as_str()
        .unwrap()
        .contains("a live task with id 7 exists already"));
    assert!(
        requests[1].json().get("result").is_none(),
        "a pool without a result encoder sends no result"
    );
    eventually("both counted", || notifier.stats().delivered == 2).await;
    node.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_500_are_retried_with_the_same_delivery_id_and_body() {
    logs();
    let receiver = Receiver::start(Arc::new(|_, earlier| {
        Reply::status(if earlier < 2 { 500 } else { 204 })
    }))
    .await;
    let notifier = notifier(settings(&receiver));
    for id in 1..=3 {
        notifier.notify(&event(id));
    }
    let requests = receiver
        .wait_until(WAIT, "three attempts each", |requests| requests.len() >= 9)
        .await;
    eventually("all delivered", || notifier.stats().delivered == 3).await;
    assert_well_formed(&requests);
    let attempts = attempts_by_delivery(&requests);
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    assert!(
        attempts.values().all(|&(count, same)| count == 3 && same),
        "{attempts:?}"
    );
    let stats = notifier.stats();
    assert_eq!(
        (
            stats.delivered,
            stats.retries,
            stats.abandoned,
            stats.pending
        ),
        (3, 6, 0, 0)
    );
}

/// A task's trace goes with each attempt as its W3C `traceparent` header: the task's own
/// (without the `otel` feature), or the attempt's span in the task's trace (with it); a task
/// without a trace sends none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_sends_the_tasks_trace_as_its_traceparent() {
    logs();
    let receiver = Receiver::start(Arc::new(|_, earlier| {
        Reply::status(if earlier < 1 { 500 } else { 204 })
    }))
    .await;
    let notifier = notifier(settings(&receiver));
    let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let trace: TraceParent = header.parse().unwrap();
    notifier.notify(&TerminalEvent {
        trace: Some(trace),
        ..event(1)
    });
    notifier.notify(&event(2));
    let requests = receiver
        .wait_until(WAIT, "two attempts each", |requests| requests.len() >= 4)
        .await;
    let sent: Vec<(u64, Option<&str>)> = requests
        .iter()
        .map(|request| {
            (
                request.json()["task_id"].as_u64().unwrap(),
                request.header("traceparent"),
            )
        })
        .collect();
    let traced: Vec<TraceParent> = sent
        .iter()
        .filter(|(task, _)| *task == 1)
        .map(|(_, header)| header.expect("a traceparent").parse().expect("a valid one"))
        .collect();
    assert_eq!(traced.len(), 2, "{sent:?}");
    for attempt in &traced {
        assert_eq!(
            attempt.trace_id(),
            trace.trace_id(),
            "the task's trace: {sent:?}"
        );
        #[cfg(not(feature = "otel"))]
        assert_eq!(*attempt, trace, "the task's own context");
    }
    assert!(
        sent.iter()
            .all(|(task, header)| *task == 1 || header.is_none()),
        "an untraced task sends none: {sent:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stop_at_max_retries_and_at_a_final_answer() {
    logs();
    let failing = Receiver::start(Arc::new(|_, _| Reply::status(503))).await;
    let exhausted = notifier(settings(&failing).with_max_retries(2));
    exhausted.notify(&event(1));
    eventually("given up", || exhausted.stats().abandoned == 1).await;
    assert_eq!(
        failing.requests().len(),
        3,
        "the first attempt and 2 retries"
    );

    let refusing = Receiver::start(Arc::new(|_, _| Reply::status(401))).await;
    let refused = notifier(settings(&refusing));
    refused.notify(&event(2));
    eventually("given up", || refused.stats().abandoned == 1).await;
    assert_eq!(refusing.requests().len(), 1, "a 4xx answer is final");
    assert_eq!(refused.stats().retries, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_times_out_then_gets_every_notification() {
    logs();
    let receiver = Receiver::start(Arc::new(|_, earlier| {
        let reply = Reply::status(200);
        if earlier == 0 {
            reply.after(Duration::from_secs(3))
        } else {
            reply
        }
    }))
    .await;
    let notifier = notifier(settings(&receiver).with_timeout(Duration::from_millis(500)));
    for id in 1..=3 {
        notifier.notify(&event(id));
    }
    eventually("all delivered", || notifier.stats().delivered == 3).await;
    let requests = receiver.requests();
    let attempts = attempts_by_delivery(&requests);
    assert_eq!(attempts.len(), 3);
    // The receiver saw each twice (the first attempt timed out after it arrived): the same
    // delivery id and body let it de-duplicate.
    assert!(
        attempts.values().all(|&(count, same)| count == 2 && same),
        "{attempts:?}"
    );
    assert_eq!(notifier.stats().retries, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_down_for_a_while_gets_every_notification_once_it_is_back() {
    logs();
    let mut receiver = Receiver::ok().await;
    let notifier = notifier(settings(&receiver).with_max_retries(100));
    let pool = pool_with(notifier.clone()).await;
    receiver.stop();
    for id in 1..=5 {
        pool.submit(task(id, "hi"), SubmitOptions::default())
            .await
            .unwrap();
    }
    // Results are stored and retrievable while the endpoint is down.
    for id in 1..=5 {
        let answer = pool.retrieve(&key(&format!("s{id}")), WAIT).await.unwrap();
        assert_eq!(answer.text, "answer to hi");
    }
    eventually("retrying", || notifier.stats().retries >= 5).await;
    assert_eq!(notifier.stats().delivered, 0);
    receiver.restart().await;

    let requests = receiver.wait_for_deliveries(5, WAIT).await;
    eventually("all delivered", || notifier.stats().delivered == 5).await;
    assert_well_formed(&requests);
    let tasks: std::collections::BTreeSet<u64> = bodies_by_task(&requests).into_keys().collect();
    assert_eq!(tasks, (1..=5).collect());
    let stats = notifier.stats();
    assert_eq!((stats.abandoned, stats.dropped, stats.pending), (0, 0, 0));
    pool.shutdown(Duration::from_secs(1)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_endpoint_blocks_neither_its_pool_nor_another_pool() {
    logs();
    let hanging = Receiver::start(Arc::new(|_, _| {
        Reply::status(200).after(Duration::from_secs(60))
    }))
    .await;
    let healthy = Receiver::ok().await;
    let built = build(&config(&[
        ("stuck", &hanging.url(), 2),
        ("fine", &healthy.url(), 2),
    ]));
    let (stuck, fine) = (&built.pools["stuck"], &built.pools["fine"]);
    for id in 1..=50 {
        let key = stuck.submit(task(id, "hi")).await.unwrap();
        assert_eq!(
            stuck.retrieve(&key, WAIT).await.unwrap().text,
            "answer to hi"
        );
    }
    for id in 1..=5 {
        fine.submit(task(id, "hi")).await.unwrap();
    }
    healthy.wait_for_deliveries(5, WAIT).await;
    assert!(
        distinct_deliveries(&hanging.requests()) <= HttpNotifierSettings::DEFAULT_MAX_IN_FLIGHT,
        "no more deliveries under way than slots"
    );
    let stopping = async {
        stuck
            .shutdown_with_drain(Duration::from_millis(200))
            .await
            .unwrap();
        fine.shutdown_with_drain(Duration::from_millis(200))
            .await
            .unwrap();
    };
    tokio::time::timeout(WAIT, stopping)
        .await
        .expect("shutdown gives up on the hanging endpoint at its drain deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_delivers_what_the_outbox_holds_before_it_returns() {
    logs();
    let receiver = Receiver::start(Arc::new(|_, _| {
        Reply::status(200).after(Duration::from_millis(500))
    }))
    .await;
    let built = build(&config(&[("chat", &receiver.url(), 2)]));
    let pool = &built.pools["chat"];
    for id in 1..=24 {
        let key = pool.submit(task(id, "hi")).await.unwrap();
        pool.retrieve(&key, WAIT).await.unwrap();
    }
    let before = distinct_deliveries(&receiver.requests());
    assert!(
        before < 24,
        "the outbox still held notifications ({before} arrived)"
    );
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
    let after = receiver.requests();
    assert_eq!(
        distinct_deliveries(&after),
        24,
        "flushed before shutdown returned"
    );
    assert_eq!(bodies_by_task(&after).len(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_flushing_at_the_drain_deadline() {
    logs();
    let hanging = Receiver::start(Arc::new(|_, _| {
        Reply::status(200).after(Duration::from_secs(60))
    }))
    .await;
    let notifier = notifier(settings(&hanging).with_timeout(Duration::from_secs(30)));
    let pool = pool_with(notifier.clone()).await;
    for id in 1..=3 {
        let key = pool
            .submit(task(id, "hi"), SubmitOptions::default())
            .await
            .unwrap();
        pool.retrieve(&key, WAIT).await.unwrap();
    }
    tokio::time::timeout(WAIT, pool.shutdown(Duration::from_millis(300)))
        .await
        .expect("shutdown returns at its drain deadline")
        .unwrap();
    let stats = notifier.stats();
    assert_eq!((stats.delivered, stats.pending), (0, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_outbox_drops_its_oldest_notifications_never_a_result() {
    logs();
    let receiver = Receiver::start(Arc::new(|request, _| {
        let first = request.json()["task_id"] == 1;
        Reply::status(200).after(if first {
            Duration::from_millis(500)
        } else {
            Duration::ZERO
        })
    }))
    .await;
    let notifier = notifier(
        settings(&receiver)
            .with_outbox_capacity(2)
            .with_max_in_flight(1),
    );
    notifier.notify(&event(1));
    receiver.wait_for_deliveries(1, WAIT).await;
    for id in 2..=10 {
        notifier.notify(&event(id));
    }
    assert_eq!(notifier.stats().dropped, 7, "9 pushed, 2 kept");
    eventually("the rest delivered", || notifier.stats().delivered == 3).await;
    let tasks: std::collections::BTreeSet<u64> =
        bodies_by_task(&receiver.requests()).into_keys().collect();
    assert_eq!(
        tasks,
        [1, 9, 10].into(),
        "the newest notifications were kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_logs_debug_output_or_errors() {
    let logs = logs();
    // Every path that logs: a final refusal, retries into a closed port, a full outbox, a
    // drain deadline passed, a notifier dropped with work pending.
    let refusing = Receiver::start(Arc::new(|_, _| Reply::status(403))).await;
    let refused = notifier(settings(&refusing));
    refused.notify(&event(1));
    let mut closed = Receiver::ok().await;
    closed.stop();
    let unreachable = notifier(settings(&closed).with_max_retries(2));
    unreachable.notify(&event(2));
    let hanging = Receiver::start(Arc::new(|_, _| {
        Reply::status(200).after(Duration::from_secs(60))
    }))
    .await;
    let stuck = notifier(
        settings(&hanging)
            .with_outbox_capacity(1)
            .with_max_in_flight(1),
    );
    for id in 3..=6 {
        stuck.notify(&event(id));
    }
    stuck
        .flush(Some(std::time::Instant::now() + Duration::from_millis(100)))
        .await;
    eventually("refused and unreachable given up", || {
        refused.stats().abandoned == 1 && unreachable.stats().abandoned == 1
    })
    .await;
    assert!(stuck.stats().dropped > 0);
    let debug = format!("{stuck:?} {:?}", settings(&hanging));
    drop(stuck);
    let config = config(&[("chat", &hanging.url(), 1)]);
    let bad = HttpNotifier::new(
        settings(&hanging).with_auth_header(Secret::new("Bearer tok-5ecret-AUTH\r\nX: 1")),
    )
    .unwrap_err()
    .to_string();
    eventually("the drop is logged", || {
        String::from_utf8_lossy(&logs.lock().unwrap()).contains("notifier was dropped")
    })
    .await;

    let logged = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    for expected in [
        "answered 403 Forbidden",
        "giving up",
        "outbox full",
        "drain deadline passed",
        "notifier was dropped",
    ] {
        assert!(
            logged.contains(expected),
            "no {expected:?} in the logs:\n{logged}"
        );
    }
    for text in [&logged, &debug, &format!("{config:?}"), &bad] {
        for mark in SECRET_MARKS {
            assert!(!text.contains(mark), "a secret leaked: {text}");
        }
    }
}
