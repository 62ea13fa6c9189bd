//! What a webhook costs the pool it watches. The same config-built pool (in-memory queue and
//! mailbox, W worker threads, no-op tasks) runs a burst of N tasks (one client submits all,
//! then retrieves every key in order; throughput is N over the time from the first submit to
//! the last retrieve) three ways, in one process and one run, rounds interleaved:
//!
//! - *no notifier*: the baseline;
//! - *webhook, healthy endpoint*: an http notifier (signed, authorised) POSTs every result to
//!   a receiver on 127.0.0.1 that answers 204 at once; also reported: how many notifications
//!   arrived (a pool that outruns its endpoint by more than the outbox holds drops the
//!   oldest), how long after the burst the last one arrived, and notifications per second
//!   over the whole run;
//! - *webhook, hanging endpoint*: the receiver never answers, so deliveries hang and the
//!   outbox fills and drops its oldest notifications, the worst case for the pool.
//!
//! Then `notify` alone: nanoseconds per call (body encoding, delivery id, outbox push) on the
//! caller's thread, measured on a notifier whose endpoint hangs (so the outbox is full and
//! every call also drops one).
//!
//! The receiver runs in the same process and competes for the same cores: on a small machine
//! the healthy-endpoint ratio includes the receiver's own work.
//!
//! `cargo bench -p prometheus_parking_lot_benches --features webhook --bench webhook` runs N =
//! 20,000, W = 2, R = 3 (override with `WEBHOOK_TASKS`, `WEBHOOK_WORKERS`, `WEBHOOK_ROUNDS`). Under
//! `cargo test` (no `--bench` argument) it runs a few hundred tasks once as a smoke test.

#[path = "../tests/support/webhook_receiver.rs"]
mod webhook_receiver;

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::config::Secret;
use prometheus_parking_lot::core::TaskStatus;
use prometheus_parking_lot::core::{Notifier, TerminalEvent};
use prometheus_parking_lot::infra::notify::http::{HttpNotifier, HttpNotifierSettings};
use prometheus_parking_lot::*;
use tokio::runtime::Runtime;
use webhook_receiver::{Receiver, Reply};

const RETRIEVE_TIMEOUT: Duration = Duration::from_secs(60);

struct Scale {
    tasks: u64,
    workers: usize,
    rounds: usize,
    bench: bool,
}

impl Scale {
    fn from_args() -> Self {
        let bench = support::measured();
        let var = support::env_u64;
        Self {
            tasks: if bench {
                var("WEBHOOK_TASKS", 20_000)
            } else {
                300
            },
            workers: var("WEBHOOK_WORKERS", 2) as usize,
            rounds: if bench {
                var("WEBHOOK_ROUNDS", 3) as usize
            } else {
                1
            },
            bench,
        }
    }
}

#[derive(Clone)]
struct NoOp;

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for NoOp {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        payload.wrapping_mul(3)
    }
}

type Pool = ResourcePool<u64, u64, NoOp>;

/// A one-pool config; `notifier` is the JSON of `mailbox.notifier`, if any.
fn pool(scale: &Scale, notifier: Option<String>) -> Pool {
    let room = scale.tasks * scale.rounds as u64 + 1_000;
    let notifier = notifier.map_or(String::new(), |json| format!(r#", "notifier": {json}"#));
    let config = SchedulerConfig::from_json_str(&format!(
        r#"{{ "pools": {{ "bench": {{
            "worker_threads": {}, "max_units": 1000000, "max_queue_depth": {room},
            "mailbox": {{ "storage": {{ "type": "in_memory", "max_messages": {room} }}{notifier} }}
        }} }} }}"#,
        scale.workers
    ))
    .expect("a valid config");
    let mut built = build_pools_from_scheduler_config::<u64, u64, NoOp, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_| NoOp,
        TokioSpawner,
    )
    .expect("the pool builds");
    built.pools.remove("bench").expect("the pool")
}

fn notifier_json(url: &str) -> String {
    format!(
        r#"{{ "type": "http", "base_url": "{url}", "auth_header": "Bearer bench",
             "hmac_secret": "bench-key", "timeout_ms": 60000, "max_retries": 3 }}"#
    )
}

/// One burst; returns tasks per second.
async fn burst(pool: &Pool, first_id: u64, tasks: u64) -> f64 {
    let started = Instant::now();
    let mut keys = Vec::with_capacity(tasks as usize);
    for id in first_id..first_id + tasks {
        let meta = TaskMetadata::new(id, ResourceCost::cpu(1));
        keys.push(
            pool.submit(ScheduledTask::new(meta, id))
                .await
                .expect("admitted"),
        );
    }
    for (key, id) in keys.iter().zip(first_id..) {
        let result = pool
            .retrieve(key, RETRIEVE_TIMEOUT)
            .await
            .expect("a result");
        assert_eq!(result, id.wrapping_mul(3));
    }
    tasks as f64 / started.elapsed().as_secs_f64()
}

/// Waits until `expected` distinct notifications arrived, or none arrived for 2 s;
/// returns how many did.
fn wait_while_arriving(receiver: &Receiver, expected: usize) -> usize {
    let mut last = (receiver.counts().1, Instant::now());
    loop {
        let arrived = receiver.counts().1;
        if arrived >= expected {
            return arrived;
        }
        if arrived != last.0 {
            last = (arrived, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) {
            return arrived;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn notify_cost(runtime: &Runtime, calls: u64) -> f64 {
    let hanging = runtime.block_on(Receiver::start(Arc::new(|_, _| {
        Reply::status(204).after(Duration::from_secs(3_600))
    })));
    let notifier = HttpNotifier::new(
        HttpNotifierSettings::new(hanging.url())
            .with_auth_header(Secret::new("Bearer bench"))
            .with_hmac_secret(Secret::new("bench-key"))
            .with_timeout(Duration::from_secs(3_600))
            .with_outbox_capacity(1_000),
    )
    .expect("notifier");
    let event = |task_id| TerminalEvent {
        pool: Arc::from("bench"),
        key: MailboxKey::new("acme").with_user("ada").with_session("s1"),
        task_id,
        status: TaskStatus::Completed,
        stored_at_ms: 1_700_000_000_000,
        attempt: 1,
        result: Some(serde_json::json!({ "text": "a short answer of a few words" })),
        trace: None,
    };
    for id in 0..2_000 {
        notifier.notify(&event(id));
    }
    let started = Instant::now();
    for id in 0..calls {
        notifier.notify(&event(id));
    }
    let ns = started.elapsed().as_nanos() as f64 / calls as f64;
    assert!(notifier.stats().dropped >= calls, "the outbox stayed full");
    ns
}

fn main() {
    let scale = Scale::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    println!(
        "webhook: N = {} tasks per burst, W = {} worker threads, R = {} rounds, {} CPUs{}",
        scale.tasks,
        scale.workers,
        scale.rounds,
        std::thread::available_parallelism().map_or(0, usize::from),
        if scale.bench { "" } else { " (smoke test)" }
    );
    let healthy = runtime.block_on(Receiver::start(Arc::new(|_, _| Reply::status(204))));
    let hanging = runtime.block_on(Receiver::start(Arc::new(|_, _| {
        Reply::status(204).after(Duration::from_secs(3_600))
    })));
    let paths = [
        ("no notifier", pool(&scale, None)),
        (
            "webhook, healthy endpoint",
            pool(&scale, Some(notifier_json(&healthy.url()))),
        ),
        (
            "webhook, hanging endpoint",
            pool(&scale, Some(notifier_json(&hanging.url()))),
        ),
    ];
    let mut samples = vec![Vec::new(); paths.len()];
    let run_started = Instant::now();
    let mut last_healthy_burst_end = run_started;
    for round in 0..scale.rounds {
        for offset in 0..paths.len() {
            let index = (round + offset) % paths.len();
            let first_id = 1 + round as u64 * scale.tasks;
            let rate = runtime.block_on(burst(&paths[index].1, first_id, scale.tasks));
            samples[index].push(rate);
            if index == 1 {
                last_healthy_burst_end = Instant::now();
            }
        }
    }
    let expected = scale.tasks as usize * scale.rounds;
    let arrived = wait_while_arriving(&healthy, expected);
    let lag = last_healthy_burst_end.elapsed();
    let delivered_per_s = arrived as f64 / run_started.elapsed().as_secs_f64();
    let notify_ns = notify_cost(&runtime, if scale.bench { 200_000 } else { 2_000 });

    let baseline = support::median(&samples[0]);
    println!();
    println!("| path | best tasks/s | median tasks/s | vs no notifier |");
    println!("|---|---:|---:|---:|");
    for ((name, _), samples) in paths.iter().zip(&mut samples) {
        let best = samples.iter().copied().fold(0.0, f64::max);
        let median = support::median(samples);
        println!(
            "| {name} | {best:.0} | {median:.0} | {:.2}x |",
            median / baseline
        );
    }
    println!();
    let dropped = if arrived < expected {
        " (the others were dropped from the full outbox)"
    } else {
        ""
    };
    println!(
        "| healthy endpoint: {arrived} of {expected} notifications arrived{dropped}, the last \
         {:.0} ms after its last burst; {delivered_per_s:.0} notifications/s over the whole run |",
        lag.as_secs_f64() * 1_000.0
    );
    println!("| `notify` on the caller's thread, outbox full: {notify_ns:.0} ns per call |");
    for (_, pool) in &paths {
        runtime
            .block_on(pool.shutdown_with_drain(Duration::from_millis(100)))
            .expect("shutdown");
    }
}
