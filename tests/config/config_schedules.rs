//! A pool's `schedules` in a configuration file: what reads, every error with the field it
//! names, a payload the pool's type cannot read, and a built pool that runs its ticks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_parking_lot::schedule::Missed;
use prometheus_parking_lot::*;

fn one_pool(body: &str) -> String {
    format!(r#"{{ "pools": {{ "p": {body} }} }}"#)
}

fn schedules(list: &str) -> String {
    one_pool(&format!(r#"{{ "schedules": [{list}] }}"#))
}

#[test]
fn schedules_read_with_their_defaults() {
    let text = schedules(
        r#"{"name": "reindex", "cron": "0 2 * * *", "tz": "Europe/Paris", "missed": "run_once",
            "priority": "low", "cost": {"kind": "cpu", "units": 4}, "tenant": "ops",
            "payload": {"job": "reindex"}},
           {"name": "heartbeat", "every_secs": 30}"#,
    );
    let config = SchedulerConfig::from_json_str(&text).unwrap();
    let pool = &config.pools["p"];
    let reindex = pool.schedules[0].schedule("pools.p.schedules[0]").unwrap();
    assert_eq!(reindex.timing.expression(), "0 2 * * *");
    assert_eq!(reindex.timing.zone(), Some("Europe/Paris"));
    assert_eq!(reindex.missed, Missed::RunOnce);
    assert_eq!(reindex.priority, Priority::Low);
    assert_eq!(reindex.cost, ResourceCost::cpu(4));
    assert_eq!(reindex.mailbox, MailboxKey::new("ops"));
    assert_eq!(
        pool.schedules[0].payload,
        serde_json::json!({"job": "reindex"})
    );
    let heartbeat = pool.schedules[1].schedule("pools.p.schedules[1]").unwrap();
    assert_eq!(heartbeat.timing.zone(), None);
    assert_eq!(heartbeat.missed, Missed::Skip);
    assert_eq!(heartbeat.priority, Priority::Normal);
    assert_eq!(heartbeat.mailbox, MailboxKey::new("schedules"));
    assert_eq!(pool.schedules[1].payload, serde_json::Value::Null);
}

/// Every rule, with the error it gives (whose start is exact; the cron parser's own words
/// follow in parentheses).
#[test]
fn every_schedule_rule_names_the_field_and_what_is_allowed() {
    let cases: &[(&str, &str)] = &[
        (r#"{"name": "a", "cron": "61 * * * *"}"#, r#"pools.p.schedules[0].cron: "61 * * * *" is not a cron expression ("#),
        (r#"{"name": "a", "cron": "every night"}"#, r#"pools.p.schedules[0].cron: "every night" is not a cron expression ("#),
        (r#"{"name": "a", "cron": "0 2 * * *", "tz": "Mars/Olympus"}"#, r#"pools.p.schedules[0].tz: "Mars/Olympus" is not a known time zone; use an IANA name such as "Europe/Paris" or "UTC""#),
        (r#"{"name": "a", "every_secs": 5, "tz": "UTC"}"#, "pools.p.schedules[0].tz: applies to `cron` only;"),
        (r#"{"name": "a"}"#, "pools.p.schedules[0]: give exactly one of `cron` (with `tz`), `every_secs` and `every_ms`"),
        (r#"{"name": "a", "cron": "* * * * *", "every_ms": 500}"#, "pools.p.schedules[0]: give exactly one of"),
        (r#"{"name": "a", "every_ms": 10}"#, "pools.p.schedules[0].every_ms: is out of range; use 100 ms to 31536000000 ms (a year)"),
        (r#"{"name": "a", "every_secs": 0}"#, "pools.p.schedules[0].every_secs: is out of range; use 100 ms"),
        (r#"{"name": "two words", "every_secs": 5}"#, r#"pools.p.schedules[0].name: "two words" is not a schedule name; use 1 to 64 letters, digits, '_', '-' or '.'"#),
        (r#"{"name": "a", "every_secs": 5}, {"name": "a", "every_secs": 6}"#, r#"pools.p.schedules[1].name: "a" names an earlier schedule of the pool; give each its own name"#),
        (r#"{"name": "a", "every_secs": 5, "missed": "catch_up"}"#, "pools.p.schedules[0].missed: unknown value `catch_up`; use `skip` or `run_once`"),
        (r#"{"name": "a", "every_secs": 5, "priority": "urgent"}"#, "pools.p.schedules[0].priority: unknown value `urgent`; use one of `low`, `normal`, `high`, `critical`"),
        (r#"{"name": "a", "every_secs": 5, "cost": {"kind": "gpu", "units": 1}}"#, r#"pools.p.schedules[0].cost.kind: "gpu" is not a resource kind; use `cpu`, `gpu_vram`, `io` or `mixed`"#),
        (r#"{"name": "a", "every_secs": 5, "cost": {"kind": "cpu", "units": 0}}"#, "pools.p.schedules[0].cost.units: 0 is out of range; use 1 to 4294967295"),
        (r#"{"name": "a", "every_secs": 5, "tenant": ""}"#, "pools.p.schedules[0].tenant: is empty;"),
        (r#"{"name": "a", "every_secs": 5, "colour": "red"}"#, "pools.p.schedules[0].colour: unknown field `colour`"),
    ];
    for (list, expected) in cases {
        let text = schedules(list);
        let error = SchedulerConfig::from_json_str(&text)
            .expect_err(&text)
            .to_string();
        assert!(
            error.starts_with(expected),
            "for {list}:\n{error}\nshould start with\n{expected}"
        );
    }
}

/// Counts the ticks it runs, each payload checked.
#[derive(Clone, Default)]
struct Pings(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Pings {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        if payload == "ping" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        payload
    }
}

#[test]
fn a_payload_the_pools_type_cannot_read_is_refused_with_the_field_named() {
    let text = schedules(r#"{"name": "a", "every_secs": 5, "payload": {"not": "a string"}}"#);
    let config = SchedulerConfig::from_json_str(&text).unwrap();
    let error = build_pools_from_scheduler_config::<String, String, Pings, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_| Pings::default(),
        TokioSpawner,
    )
    .err()
    .expect("the build is refused");
    let PoolError::InvalidConfig(text) = error else {
        panic!("not a configuration error: {error:?}");
    };
    assert!(
        text.starts_with("pools.p.schedules[0].payload: does not read as the pool's payload type: invalid type: map"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_pool_runs_the_ticks_of_its_schedules() {
    let text = schedules(r#"{"name": "ping", "every_ms": 100, "payload": "ping"}"#);
    let config = SchedulerConfig::from_json_str(&text).unwrap();
    let pings = Pings::default();
    let built = build_pools_from_scheduler_config::<String, String, Pings, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_| pings.clone(),
        TokioSpawner,
    )
    .unwrap();
    let pool = &built.pools["p"];
    assert_eq!(pool.schedules()[0].name, "ping");
    for _ in 0..1_000 {
        if pings.0.load(Ordering::SeqCst) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        pings.0.load(Ordering::SeqCst) >= 3,
        "three ticks ran within 10 s"
    );
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();
}
