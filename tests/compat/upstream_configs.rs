//! Configuration files written for the upstream crate (`prometheus-parking-lot-rs` 0.1.0)
//! load here, or are refused with the form to write instead.
//!
//! Upstream's files name a pool's backends by a bare string (`"queue": "in_memory"`,
//! `"mailbox": "postgres"`) and give a `"runtime": "native"`. A name alone is read as the
//! tagged mapping when its backend needs no settings; the others are refused with an error
//! that names the field and shows the mapping. The upstream paths `infra::InMemoryQueue` and
//! `infra::InMemoryMailbox` resolve too.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use prometheus_parking_lot::config::{
    MailboxSettings, QueueSettings, SchedulerConfig, StorageSettings,
};
use prometheus_parking_lot::core::{ScheduledTask, TaskExecutor, TaskMetadata};
use prometheus_parking_lot::infra::{InMemoryMailbox, InMemoryQueue};
use prometheus_parking_lot::util::ResourceCost;
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, TokioSpawner,
};

/// A scheduler configuration shaped like upstream's example `scheduler-config.json`: pools
/// with a capacity, a queue depth and a timeout, their backends named by a string, and a
/// runtime.
const UPSTREAM_SHAPED: &str = r#"{
  "pools": {
    "completions": {
      "max_units": 12,
      "max_queue_depth": 500,
      "default_timeout_secs": 30,
      "worker_threads": 2,
      "queue": "in_memory",
      "mailbox": "in_memory",
      "runtime": "native"
    },
    "embeddings": {
      "max_units": 4,
      "max_queue_depth": 50,
      "default_timeout_ms": 15000,
      "worker_threads": 1,
      "queue": "in_memory",
      "mailbox": "in_memory",
      "runtime": "tokio"
    }
  }
}"#;

#[derive(Clone)]
struct Shout;

#[async_trait]
impl TaskExecutor<String, String> for Shout {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        payload.to_uppercase()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_shaped_config_loads_builds_and_runs_a_task() {
    let config = SchedulerConfig::from_json_str(UPSTREAM_SHAPED).unwrap();
    for pool in config.pools.values() {
        assert_eq!(pool.queue, QueueSettings::InMemory);
        assert_eq!(pool.mailbox, MailboxSettings::default());
    }
    let built = build_pools_from_scheduler_config::<String, String, Shout, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Shout,
        TokioSpawner,
    )
    .unwrap();
    let pool = &built.pools["completions"];
    let stats = pool.stats();
    assert_eq!((stats.worker_count, stats.total_units), (2, 12));
    let key = pool
        .submit(ScheduledTask {
            meta: TaskMetadata::new(1, ResourceCost::cpu(3)),
            payload: "hello".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        pool.retrieve(&key, Duration::from_secs(5)).await.unwrap(),
        "HELLO"
    );
}

#[test]
fn the_same_config_in_yaml_loads_the_same() {
    let yaml = "pools:
  completions: { max_units: 12, max_queue_depth: 500, default_timeout_secs: 30, worker_threads: 2, queue: in_memory, mailbox: in_memory, runtime: native }
  embeddings: { max_units: 4, max_queue_depth: 50, default_timeout_ms: 15000, worker_threads: 1, queue: in_memory, mailbox: in_memory, runtime: tokio }
";
    assert_eq!(
        SchedulerConfig::from_yaml_str(yaml).unwrap(),
        SchedulerConfig::from_json_str(UPSTREAM_SHAPED).unwrap()
    );
}

/// One pool `p` with these extra fields.
fn pool_with(fields: &str) -> String {
    format!(
        r#"{{"database_url": "postgres://app@db.internal/jobs", "pools": {{"p": {{"max_units": 4, {fields}}}}}}}"#
    )
}

#[test]
fn a_name_alone_reads_as_its_tagged_form_with_the_same_defaults() {
    let same = |short: &str, tagged: &str| {
        let short = SchedulerConfig::from_json_str(&pool_with(short)).unwrap();
        let tagged = SchedulerConfig::from_json_str(&pool_with(tagged)).unwrap();
        assert_eq!(short, tagged);
    };
    same(
        r#""queue": "in_memory""#,
        r#""queue": {"type": "in_memory"}"#,
    );
    same(r#""queue": "postgres""#, r#""queue": {"type": "postgres"}"#);
    same(
        r#""mailbox": "in_memory""#,
        r#""mailbox": {"storage": {"type": "in_memory"}}"#,
    );
    same(
        r#""mailbox": "postgres""#,
        r#""mailbox": {"storage": {"type": "postgres"}}"#,
    );
    same(r#""runtime": "native""#, r#""runtime": "tokio""#);
    same(r#""runtime": "native""#, r#""pin_to_cpus": false"#);

    // Upstream's own first pool, a Postgres queue and mailbox, as its file writes it.
    let upstream = SchedulerConfig::from_json_str(&pool_with(
        r#""max_queue_depth": 1000, "default_timeout_secs": 60, "queue": "postgres", "mailbox": "postgres", "runtime": "native""#,
    ))
    .unwrap();
    let pool = &upstream.pools["p"];
    assert!(
        matches!(&pool.queue, QueueSettings::Postgres { table, queue_name: None, .. } if table == "pl_queue_jobs")
    );
    assert!(
        matches!(&pool.mailbox.storage, StorageSettings::Postgres { table } if table == "pl_mailbox_messages")
    );
}

/// The error `fields` are refused with.
fn refusal(fields: &str) -> String {
    SchedulerConfig::from_json_str(&pool_with(fields))
        .unwrap_err()
        .to_string()
}

#[test]
fn a_backend_that_needs_settings_is_refused_with_the_mapping_to_write() {
    assert_eq!(
        refusal(r#""queue": "yaque""#),
        r#"pools.p.queue: "yaque" needs settings; write {"type": "yaque", "path": "...", "stream": "..."}"#
    );
    assert_eq!(
        refusal(r#""queue": "file""#),
        r#"pools.p.queue: "file" needs settings; write {"type": "yaque", "path": "...", "stream": "..."}"#
    );
    assert_eq!(
        refusal(r#""queue": "postgres_pgmq""#),
        r#"pools.p.queue: "postgres_pgmq" needs settings; write {"type": "postgres_pgmq", "queue_name": "..."}"#
    );
    assert_eq!(
        refusal(r#""mailbox": "file""#),
        r#"pools.p.mailbox: there is no file mailbox; write "in_memory", or {"storage": {"type": "postgres"}} to keep results across restarts"#
    );
}

#[test]
fn a_name_that_is_no_backend_gets_the_answer_an_unknown_type_gets() {
    assert_eq!(
        refusal(r#""queue": "in_memroy""#),
        "pools.p.queue: unknown value `in_memroy`; did you mean `in_memory`?"
    );
    assert_eq!(
        refusal(r#""queue": {"type": "in_memroy"}"#),
        "pools.p.queue.type: unknown value `in_memroy`; did you mean `in_memory`?"
    );
    assert_eq!(
        refusal(r#""queue": "redis""#),
        "pools.p.queue: unknown value `redis`; use one of `in_memory`, `yaque`, `postgres`, `postgres_pgmq`"
    );
    assert_eq!(
        refusal(r#""mailbox": "redis""#),
        "pools.p.mailbox: unknown value `redis`; use `in_memory` or `postgres`"
    );
    assert_eq!(
        refusal(r#""queue": "bad\u001b[2Jname""#),
        r"pools.p.queue: unknown value `bad\u{1b}[2Jname`; use one of `in_memory`, `yaque`, `postgres`, `postgres_pgmq`"
    );
}

#[test]
fn a_runtime_other_than_ours_is_refused_with_the_allowed_ones() {
    for other in ["web_worker", "cloud_worker"] {
        assert_eq!(
            refusal(&format!(r#""runtime": "{other}""#)),
            format!("pools.p.runtime: unknown value `{other}`; use `native` or `tokio`")
        );
    }
    assert_eq!(
        refusal(r#""runtime": "nativ""#),
        "pools.p.runtime: unknown value `nativ`; did you mean `native`?"
    );
    assert_eq!(
        refusal(r#""runtime": 3"#),
        "pools.p.runtime: invalid type: integer `3`, expected `native` or `tokio`"
    );
}

#[test]
fn other_shapes_are_refused_as_before() {
    assert_eq!(
        refusal(r#""queue": 3"#),
        "pools.p.queue: invalid type: integer `3`, expected a mapping with a `type`"
    );
    assert_eq!(
        refusal(r#""mailbox": true"#),
        "pools.p.mailbox: invalid type: boolean `true`, expected a mapping of settings ({ ... })"
    );
    assert_eq!(
        refusal(r#""queue": {"type": "yaque", "pth": "/tmp/q", "stream": "s"}"#),
        "pools.p.queue: unknown field `pth`; did you mean `path`?"
    );
    assert_eq!(
        refusal(r#""mailbox": {"storage": {"type": "postgres", "table": 3}}"#),
        "pools.p.mailbox.storage: invalid type: integer `3`, expected a string"
    );
}

/// Upstream code imports the in-memory backends one level up from their modules; they are the
/// same types as under `infra::queue` and `infra::mailbox`.
#[test]
fn the_upstream_paths_of_the_in_memory_backends_resolve() {
    let queue: InMemoryQueue<String> = InMemoryQueue::new();
    let mailbox: Arc<InMemoryMailbox<String>> = Arc::new(InMemoryMailbox::new());
    let _same_queue: prometheus_parking_lot::infra::queue::InMemoryQueue<String> = queue;
    let _same_mailbox: Arc<prometheus_parking_lot::infra::mailbox::InMemoryMailbox<String>> =
        mailbox;
}
