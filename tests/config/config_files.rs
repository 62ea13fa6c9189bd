//! Configuration files: the seed's shapes parse as written, the shipped files load, every
//! validation rule answers with an error naming the field, secrets stay out of `Debug`, and
//! a loaded configuration builds running pools.

use std::time::Duration;

use prometheus_parking_lot::config::{MaxUnits, NotifierSettings, QueueSettings, StorageSettings};
use prometheus_parking_lot::core::{
    FairByUse, FairShare, OnGiveUp, TenantWeights, UsageCharge, DEFAULT_STREAM_IDLE_MS,
};
use prometheus_parking_lot::*;

// Every test that reads the list is about a feature this build lacks.
#[cfg(not(all(feature = "pgmq", feature = "yaque", feature = "webhook")))]
#[path = "../support/features.rs"]
mod features;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).expect("fixture")
}

fn shipped(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(name)
}

/// A one-pool document around a pool body.
fn one_pool(body: &str) -> String {
    format!(r#"{{ "pools": {{ "p": {body} }} }}"#)
}

#[test]
fn the_seed_readme_configuration_parses_as_written() {
    let config = SchedulerConfig::from_json_str(&fixture("seed_readme_pools.json")).unwrap();
    let tauri = &config.pools["tauri_local_llm"];
    assert_eq!(tauri.max_units, MaxUnits::Units(8));
    assert_eq!(
        tauri.queue,
        QueueSettings::Yaque {
            path: "./data/queues".into(),
            stream: "tauri_llm".into()
        }
    );
    let cloud = &config.pools["llm_inference"];
    assert_eq!(
        cloud.queue,
        QueueSettings::PostgresPgmq {
            queue_name: "llm_inference".into(),
            lease_ms: None,
            max_attempts: None,
            claim_ahead: None,
            dependencies: false,
        }
    );
    assert_eq!(
        cloud.mailbox.storage,
        StorageSettings::Postgres {
            table: "pl_mailbox_messages".into()
        }
    );
    assert_eq!(cloud.timeout(), Some(Duration::from_secs(60)));
    let Some(NotifierSettings::Http {
        base_url,
        auth_header,
        ..
    }) = &cloud.mailbox.notifier
    else {
        panic!("http notifier expected");
    };
    assert_eq!(base_url, "https://prometheus-gw.example.com/hooks/mailbox");
    assert_eq!(
        auth_header.as_ref().map(|s| s.expose()),
        Some("Bearer YOUR_TOKEN")
    );
}

#[test]
fn the_seed_deployment_snippets_parse_as_written() {
    for name in [
        "seed_local_snippet.json",
        "seed_tauri_snippet.json",
        "seed_cloud_snippet.json",
    ] {
        let config = SchedulerConfig::from_json_str(&one_pool(&fixture(name)));
        assert!(config.is_ok(), "{name}: {config:?}");
    }
    let config = SchedulerConfig::from_json_str(&fixture("candle_vllm_pools.json")).unwrap();
    let pool = &config.pools["default"];
    assert_eq!(
        (pool.worker_threads, pool.default_timeout_ms),
        (Some(4), Some(120_000))
    );
    assert_eq!(pool.mailbox.retention_secs, Some(3_600));
}

#[test]
fn the_shipped_files_load() {
    let local = SchedulerConfig::from_path(shipped("local.json")).unwrap();
    assert_eq!(local.pools["local_llm"].max_units, MaxUnits::Units(24));
    let quota = SchedulerConfig::from_path(shipped("quota.json")).unwrap();
    let budget = quota.pools["chat_api"].budgets["io"]
        .budget()
        .expect("a budget");
    assert_eq!(
        (budget.units, budget.per_ms, budget.burst),
        (90_000, 60_000, 45_000)
    );
    assert_eq!(
        budget.max_starts.map(|cap| (cap.count, cap.per_ms)),
        Some((500, 60_000))
    );
    let several = SchedulerConfig::from_path(shipped("several_kinds.json")).unwrap();
    let decode = several.pool_settings("decode").unwrap();
    let capacity = decode.limits().capacity;
    assert_eq!(
        (
            capacity.get(ResourceKind::GpuVram),
            capacity.get(ResourceKind::Cpu)
        ),
        (4_096, 8),
        "KV-cache blocks beside sequence slots"
    );
    let provider = &several.pools["provider"].budgets;
    assert_eq!(
        provider.keys().collect::<Vec<_>>(),
        ["io", "mixed"],
        "tokens beside requests"
    );
    let desktop = SchedulerConfig::from_path(shipped("desktop.yaml")).unwrap();
    assert!(matches!(
        desktop.pools["desktop_llm"].queue,
        QueueSettings::Yaque { .. }
    ));

    std::env::set_var("PL_WEBHOOK_TOKEN", "s3cr3t-token");
    std::env::set_var("WEBHOOK_URL", "https://hooks.internal.test/task-complete");
    std::env::set_var("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test");
    let cloud = SchedulerConfig::from_path(shipped("cloud.json")).unwrap();
    let Some(NotifierSettings::Http {
        auth_header: Some(header),
        ..
    }) = &cloud.pools["llm_inference"].mailbox.notifier
    else {
        panic!("http notifier expected");
    };
    assert_eq!(header.expose(), "Bearer s3cr3t-token");
    let shown = format!("{cloud:?}");
    assert!(
        !shown.contains("s3cr3t-token") && !shown.contains("postgres://"),
        "secrets leaked: {shown}"
    );
    assert!(shown.contains("Secret(***)"));
}

#[test]
fn a_missing_environment_variable_is_named() {
    let text = one_pool(
        r#"{ "mailbox": { "notifier": { "type": "http", "base_url": "https://h/x", "auth_header": "Bearer ${PL_TEST_SURELY_UNSET}" } } }"#,
    );
    let error = SchedulerConfig::from_json_str(&text)
        .unwrap_err()
        .to_string();
    assert_eq!(error, "pools.p.mailbox.notifier.auth_header: environment variable PL_TEST_SURELY_UNSET is not set");
}

#[test]
fn formats_are_chosen_by_extension_and_unreadable_files_named() {
    let error = SchedulerConfig::from_path("settings.toml").unwrap_err();
    assert_eq!(
        error.to_string(),
        "settings.toml: unknown configuration format; use a .json, .yaml or .yml file"
    );
    let error = SchedulerConfig::from_path("/nonexistent/pools.yaml").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cannot read /nonexistent/pools.yaml:"),
        "{error}"
    );
    let yaml = SchedulerConfig::from_yaml_str("pools:\n  p:\n    max_units: auto\n").unwrap();
    assert_eq!(yaml.pools["p"].max_units, MaxUnits::Auto);
    let gpu = yaml.pools["p"].gpu_settings().expect("auto implies a GPU");
    assert_eq!(
        (gpu.device_indexes(), gpu.reserve(), gpu.live_guard),
        (vec![0], 0.1, false)
    );
}

/// Every rule, with the exact error it gives.
#[test]
fn every_validation_rule_names_the_field_and_what_is_allowed() {
    let cases: &[(&str, &str)] = &[
        (r#"{ "pools": {} }"#, "pools: no pool is defined; define at least one"),
        (r#"{ "pools": { "": {} } }"#, r#"pools.: "" is not allowed; pool names are 1 to 64 of the characters a-z A-Z 0-9 _ -"#),
        (r#"{ "pools": { "a b": {} } }"#, r#"pools.a b: "a b" is not allowed; pool names are 1 to 64 of the characters a-z A-Z 0-9 _ -"#),
        (r#"{ "pools": { "p": { "max_unit": 3 } } }"#, "pools.p.max_unit: unknown field `max_unit`; did you mean `max_units`?"),
        (r#"{ "pools": { "p": { "maxUnits": 3 } } }"#, "pools.p.maxUnits: unknown field `maxUnits`; did you mean `max_units`?"),
        (r#"{ "pools": { "p": { "colour": 3 } } }"#, "pools.p.colour: unknown field `colour`; use one of `worker_threads`, `thread_stack_size`, `max_units`, `max_queue_depth`, `max_queued_units`, `order`, `default_timeout_secs`, `default_timeout_ms`, `pin_to_cpus`, `starvation`, `fair_share`, `backfill`, `preemption`, `capacity`, `budgets`, `on_duplicate`, `retry`, `on_give_up`, `stream_idle_ms`, `admission`, `queue`, `mailbox`, `durability`, `spin_ms`, `gpu`, `schedules`"),
        (r#"{ "pool": {} }"#, "pool: unknown field `pool`; did you mean `pools`?"),
        (&one_pool(r#"{ "worker_threads": 0 }"#), "pools.p.worker_threads: 0 is allowed only on a shared queue (postgres, postgres_pgmq), for a producer-only node; use 1 to 1024"),
        (&one_pool(r#"{ "worker_threads": 100000 }"#), "pools.p.worker_threads: 100000 is out of range; use 0 to 1024"),
        (&one_pool(r#"{ "thread_stack_size": 1024 }"#), "pools.p.thread_stack_size: 1024 is out of range; use 65536 to 1073741824"),
        (&one_pool(r#"{ "max_units": 0 }"#), r#"pools.p.max_units: 0 is out of range; use 1 to 4294967295 units, or "auto""#),
        (&one_pool(r#"{ "max_units": 5000000000 }"#), r#"pools.p.max_units: 5000000000 is out of range; use 1 to 4294967295 units, or "auto""#),
        (&one_pool(r#"{ "max_units": "lots" }"#), r#"pools.p.max_units: invalid value: string "lots", expected a whole number of units or "auto""#),
        (&one_pool(r#"{ "max_units": -3 }"#), r#"pools.p.max_units: invalid type: integer `-3`, expected a whole number of units or "auto""#),
        (&one_pool(r#"{ "worker_threads": "four" }"#), r#"pools.p.worker_threads: invalid type: string "four", expected a whole number (0 or more)"#),
        (&one_pool(r#"{ "worker_threads": 1.5 }"#), "pools.p.worker_threads: invalid type: number `1.5`, expected a whole number (0 or more)"),
        (&one_pool(r#"{ "starvation": 3 }"#), "pools.p.starvation: invalid type: integer `3`, expected a mapping of settings ({ ... })"),
        (&one_pool(r#"{ "max_queue_depth": 0 }"#), "pools.p.max_queue_depth: 0 is out of range; use 1 to 100000000"),
        (&one_pool(r#"{ "capacity": { "slots": 8 } }"#), r#"pools.p.capacity.slots: "slots" is not a resource kind; use `cpu`, `gpu_vram`, `io` or `mixed`"#),
        (&one_pool(r#"{ "capacity": { "cpu": 0 } }"#), "pools.p.capacity.cpu: 0 is out of range; use 1 to 4294967295 units"),
        (&one_pool(r#"{ "capacity": { "cpu": 5000000000 } }"#), "pools.p.capacity.cpu: invalid value: integer `5000000000`, expected a whole number from 0 to 4294967295"),
        (&one_pool(r#"{ "capacity": { "gpu_vram": 8 }, "gpu": { "device": 0 } }"#), r#"pools.p.capacity.gpu_vram: the pool's gpu_vram units are sized from its GPU ("gpu"); name the other kinds here"#),
        (&one_pool(r#"{ "budgets": { "tokens": { "units": 10, "per_secs": 60 } } }"#), r#"pools.p.budgets.tokens: "tokens" is not a resource kind; use `cpu`, `gpu_vram`, `io` or `mixed`"#),
        (&one_pool(r#"{ "budgets": { "io": { "units": 0, "per_secs": 60 } } }"#), "pools.p.budgets.io.units: 0 is out of range; use 1 to 4294967295"),
        (&one_pool(r#"{ "budgets": { "io": { "units": 10 } } }"#), "pools.p.budgets.io: needs its period: per_secs (1 to 86400) or per_ms (1 to 86400000)"),
        (&one_pool(r#"{ "budgets": { "io": { "units": 10, "per_secs": 1, "per_ms": 5 } } }"#), "pools.p.budgets.io: has both per_secs and per_ms; give the period once"),
        (&one_pool(r#"{ "budgets": { "io": { "units": 10, "per_secs": 100000 } } }"#), "pools.p.budgets.io.per_secs: 100000 is out of range; use 1 to 86400"),
        (&one_pool(r#"{ "budgets": { "io": { "units": 10, "per_secs": 1, "burst": 0 } } }"#), "pools.p.budgets.io.burst: 0 is out of range; use 1 to 4294967295"),
        (&one_pool(r#"{ "budgets": { "io": { "units": 10, "per_secs": 1, "max_starts": { "count": 0, "per_secs": 1 } } } }"#), "pools.p.budgets.io.max_starts.count: 0 is out of range; use 1 to 4294967295"),
        (&one_pool(r#"{ "budgets": { "io": { "units": 10, "per_secs": 1, "max_starts": { "count": 2 } } } }"#), "pools.p.budgets.io.max_starts: needs its period: per_secs (1 to 86400) or per_ms (1 to 86400000)"),
        (&one_pool(r#"{ "budgets": { "io": { "units": 10, "per_min": 1 } } }"#), "pools.p.budgets.io.per_min: unknown field `per_min`; did you mean `per_ms`?"),
        (&one_pool(r#"{ "max_units": "auto", "budgets": { "gpu_vram": { "units": 10, "per_secs": 1 } } }"#), "pools.p.budgets.gpu_vram: the pool's gpu_vram units are the GPU's memory, which comes back when tasks end; a budget refills with time: give the budget to another kind (io, mixed)"),
        (&one_pool(r#"{ "retry": { "max_attempts": 0, "backoff_ms": 100 } }"#), "pools.p.retry.max_attempts: 0 is out of range; use 1 to 1000"),
        (&one_pool(r#"{ "retry": { "max_attempts": 3, "backoff_ms": 100, "max_backoff_ms": 50 } }"#), "pools.p.retry.max_backoff_ms: 50 is out of range; use 100 to 86400000"),
        (&one_pool(r#"{ "retry": { "max_attempts": 3 } }"#), "pools.p.retry: missing field `backoff_ms`"),
        (&one_pool(r#"{ "on_duplicate": "merge" }"#), "pools.p.on_duplicate: unknown value `merge`; use `refuse` or `attach`"),
        (&one_pool(r#"{ "order": "edf" }"#), "pools.p.order: unknown value `edf`; use `fifo` or `deadline`"),
        (&one_pool(r#"{ "admission": { "refuse_if_late": true }, "queue": { "type": "postgres" } }"#), "pools.p.admission.refuse_if_late: applies to a local queue (in_memory, yaque): a task that waits in a shared queue waits behind every node's backlog, which no node's estimate sees; remove it, or set it to false"),
        (&one_pool(r#"{ "max_queued_units": 0 }"#), "pools.p.max_queued_units: 0 is out of range; use 1 to 18446744073709551615"),
        (&one_pool(r#"{ "on_give_up": "drop" }"#), "pools.p.on_give_up: unknown value `drop`; use `keep` or `abandon`"),
        (&one_pool(r#"{ "stream_idle_ms": 0 }"#), "pools.p.stream_idle_ms: 0 is out of range; use 1 to 86400000"),
        (&one_pool(r#"{ "stream_idle_ms": 90000000 }"#), "pools.p.stream_idle_ms: 90000000 is out of range; use 1 to 86400000"),
        (&one_pool(r#"{ "default_timeout_secs": 5, "default_timeout_ms": 5000 }"#), "pools.p.default_timeout_ms: default_timeout_secs is set too; set only one of the two"),
        (&one_pool(r#"{ "default_timeout_ms": 0 }"#), "pools.p.default_timeout_ms: 0 is out of range; use 1 to 604800000"),
        (&one_pool(r#"{ "default_timeout_secs": 999999999 }"#), "pools.p.default_timeout_secs: 999999999 is out of range; use 1 to 604800"),
        (&one_pool(r#"{ "starvation": { "max_skips": 0 } }"#), "pools.p.starvation.max_skips: 0 is out of range; use 1 to 1000000"),
        (&one_pool(r#"{ "preemption": { "max_per_task": 0 } }"#), "pools.p.preemption.max_per_task: 0 is out of range; use 1 to 4294967295"),
        (&one_pool(r#"{ "starvation": { "max_park_ms": 0 } }"#), "pools.p.starvation.max_park_ms: 0 is out of range; use 1 to 86400000"),
        (&one_pool(r#"{ "fair_share": {} }"#), "pools.p.fair_share: give exactly one of max_units_per_tenant (units of each kind per tenant) and max_fraction (a share of each kind's units, greater than 0 and at most 1), or by_use alone (tenants ordered by the service they were charged, uncapped)"),
        (&one_pool(r#"{ "fair_share": { "max_units_per_tenant": 4, "max_fraction": 0.5 } }"#), "pools.p.fair_share: give exactly one of max_units_per_tenant (units of each kind per tenant) and max_fraction (a share of each kind's units, greater than 0 and at most 1), or by_use alone (tenants ordered by the service they were charged, uncapped)"),
        (&one_pool(r#"{ "fair_share": { "max_units_per_tenant": 0 } }"#), "pools.p.fair_share.max_units_per_tenant: 0 is out of range; use 1 to 1024 (the pool's max_units: a larger cap would cap nothing)"),
        (&one_pool(r#"{ "max_units": 24, "fair_share": { "max_units_per_tenant": 25 } }"#), "pools.p.fair_share.max_units_per_tenant: 25 is out of range; use 1 to 24 (the pool's max_units: a larger cap would cap nothing)"),
        (&one_pool(r#"{ "fair_share": { "max_fraction": 0 } }"#), "pools.p.fair_share.max_fraction: 0 is out of range; use a number greater than 0 and at most 1"),
        (&one_pool(r#"{ "fair_share": { "max_fraction": 1.5 } }"#), "pools.p.fair_share.max_fraction: 1.5 is out of range; use a number greater than 0 and at most 1"),
        (&one_pool(r#"{ "fair_share": { "max_units": 3 } }"#), "pools.p.fair_share.max_units: unknown field `max_units`; use one of `max_units_per_tenant`, `max_fraction`, `by_use`"),
        (&one_pool(r#"{ "fair_share": { "by_use": { "weights": { "acme": 0 } } } }"#), "pools.p.fair_share.by_use.weights.acme: 0 is not allowed; use a whole number from 1 to 1000000 (a tenant of weight 3 is served three times what one of weight 1 is)"),
        (&one_pool(r#"{ "fair_share": { "by_use": { "weights": { "*": -2 } } } }"#), "pools.p.fair_share.by_use.weights.*: -2 is not allowed; use a whole number from 1 to 1000000 (a tenant of weight 3 is served three times what one of weight 1 is)"),
        (&one_pool(r#"{ "fair_share": { "by_use": { "weights": { "acme": 2.5 } } } }"#), "pools.p.fair_share.by_use.weights.acme: 2.5 is not allowed; use a whole number from 1 to 1000000 (a tenant of weight 3 is served three times what one of weight 1 is)"),
        (&one_pool(r#"{ "fair_share": { "by_use": { "half_life_ms": 0 } } }"#), "pools.p.fair_share.by_use.half_life_ms: 0 is not allowed; use a whole number of milliseconds from 1 to 31536000000 (a year), or leave it out for counters that never decay"),
        (&one_pool(r#"{ "fair_share": { "by_use": { "half_life_ms": -5 } } }"#), "pools.p.fair_share.by_use.half_life_ms: -5 is not allowed; use a whole number of milliseconds from 1 to 31536000000 (a year), or leave it out for counters that never decay"),
        (&one_pool(r#"{ "fair_share": { "by_use": { "charge": "tokens" } } }"#), "pools.p.fair_share.by_use.charge: unknown value `tokens`; use `held` or `reported`"),
        (&one_pool(r#"{ "fair_share": { "by_use": { "weight": { "acme": 2 } } } }"#), "pools.p.fair_share.by_use.weight: unknown field `weight`; did you mean `weights`?"),
        (&one_pool(r#"{ "admission": { "refuse_if_late": "yes" } }"#), r#"pools.p.admission.refuse_if_late: invalid type: string "yes", expected a boolean"#),
        (&one_pool(r#"{ "admission": { "refuse_late": true } }"#), "pools.p.admission.refuse_late: unknown field `refuse_late`; did you mean `refuse_if_late`?"),
        (&one_pool(r#"{ "admission": true }"#), "pools.p.admission: invalid type: boolean `true`, expected a mapping of settings ({ ... })"),
        (&one_pool(r#"{ "backfill": "on" }"#), r#"pools.p.backfill: invalid type: string "on", expected a boolean"#),
        (&one_pool(r#"{ "queue": { "type": "redis" } }"#), "pools.p.queue.type: unknown value `redis`; use one of `in_memory`, `yaque`, `postgres`, `postgres_pgmq`"),
        (&one_pool(r#"{ "queue": { "type": "yaqe" } }"#), "pools.p.queue.type: unknown value `yaqe`; did you mean `yaque`?"),
        (&one_pool(r#"{ "queue": { "type": "yaque", "path": " ", "stream": "s" } }"#), "pools.p.queue.path: is empty; give the directory of the queue files"),
        (&one_pool(r#"{ "queue": { "type": "yaque", "path": "./q", "stream": "../etc" } }"#), r#"pools.p.queue.stream: "../etc" is not allowed; stream names are 1 to 64 of the characters a-z A-Z 0-9 _ -"#),
        (&one_pool(r#"{ "queue": { "type": "postgres", "table": "jobs; DROP TABLE users" } }"#), r#"pools.p.queue.table: "jobs; DROP TABLE users" is not a safe SQL identifier; use a letter or '_' followed by letters, digits or '_', at most 63 characters"#),
        (&one_pool(r#"{ "queue": { "type": "postgres", "queue_name": "1st" } }"#), r#"pools.p.queue.queue_name: "1st" is not a safe SQL identifier; use a letter or '_' followed by letters, digits or '_', at most 63 characters"#),
        (&one_pool(r#"{ "queue": { "type": "postgres_pgmq", "queue_name": "a_name_that_is_far_too_long_for_a_pgmq_queue_name" } }"#), r#"pools.p.queue.queue_name: "a_name_that_is_far_too_long_for_a_pgmq_queue_name" is not a safe SQL identifier; use a letter or '_' followed by letters, digits or '_', at most 42 characters"#),
        (&one_pool(r#"{ "queue": { "type": "postgres_pgmq" } }"#), "pools.p.queue: missing field `queue_name`"),
        (&one_pool(r#"{ "mailbox": { "storage": { "type": "postgres", "table": "x\"y" } } }"#), r#"pools.p.mailbox.storage.table: "x\"y" is not a safe SQL identifier; use a letter or '_' followed by letters, digits or '_', at most 63 characters"#),
        (&one_pool(r#"{ "mailbox": { "storage": { "type": "in_memory", "max_messages": 0 } } }"#), "pools.p.mailbox.storage.max_messages: 0 is out of range; use 1 to 100000000"),
        (&one_pool(r#"{ "mailbox": { "retention_secs": 0 } }"#), "pools.p.mailbox.retention_secs: 0 is out of range; use 1 to 31536000"),
        (&one_pool(r#"{ "mailbox": { "notifier": { "type": "http", "base_url": "ftp://x" } } }"#), r#"pools.p.mailbox.notifier.base_url: "ftp://x" is not a URL; use http://host/path or https://host/path"#),
        (&one_pool(r#"{ "mailbox": { "notifier": { "type": "http", "base_url": "https://h", "timeout_ms": 0 } } }"#), "pools.p.mailbox.notifier.timeout_ms: 0 is out of range; use 1 to 300000"),
        (&one_pool(r#"{ "mailbox": { "notifier": { "type": "http", "base_url": "https://h", "max_retries": 1000 } } }"#), "pools.p.mailbox.notifier.max_retries: 1000 is out of range; use 0 to 100"),
        (&one_pool(r#"{ "mailbox": { "notifier": { "type": "http", "base_url": "https://h", "auth_header": "${bad name}" } } }"#), "pools.p.mailbox.notifier.auth_header: `${bad name}` is not a valid environment variable reference; names are letters, digits and '_'"),
        (&one_pool(r#"{ "durability": "parked" }"#), "pools.p.durability: applies to durable queues only (yaque, postgres, postgres_pgmq); the in_memory queue keeps nothing across a restart: remove the field or choose a durable queue"),
        (&one_pool(r#"{ "durability": "sometimes", "queue": { "type": "yaque", "path": "./q", "stream": "s" } }"#), "pools.p.durability: unknown value `sometimes`; use `accepted` or `parked`"),
        (&one_pool(r#"{ "spin_ms": 5, "queue": { "type": "yaque", "path": "./q", "stream": "s" } }"#), r#"pools.p.spin_ms: applies only with "durability": "parked"; set that, or remove spin_ms"#),
        (&one_pool(r#"{ "durability": "parked", "spin_ms": 5, "queue": { "type": "postgres" } }"#), "pools.p.spin_ms: applies to the yaque queue only; a shared queue (postgres) parks a task at once, where other nodes can claim it: set 0 or remove spin_ms"),
        (&one_pool(r#"{ "durability": "parked", "spin_ms": 600000, "queue": { "type": "yaque", "path": "./q", "stream": "s" } }"#), "pools.p.spin_ms: 600000 is out of range; use 0 to 60000"),
        (r#"{ "pools": { "a": { "queue": { "type": "postgres_pgmq", "queue_name": "q" } }, "b": { "queue": { "type": "postgres_pgmq", "queue_name": "q" } } } }"#, "pools.b.queue: pool a uses the pgmq queue q already; give each pool its own queue"),
        (r#"{ "pools": { "a": { "queue": { "type": "yaque", "path": "./q", "stream": "s" } }, "b": { "queue": { "type": "yaque", "path": "./q", "stream": "s" } } } }"#, "pools.b.queue: pool a uses the yaque stream s in ./q already; give each pool its own queue"),
        (&one_pool(r#"{ "gpu": { "devcie": 1 } }"#), "pools.p.gpu.devcie: unknown field `devcie`; did you mean `device`?"),
        (&one_pool(r#"{ "gpu": { "device": 300 } }"#), "pools.p.gpu.device: 300 is out of range; use 0 to 255"),
        (&one_pool(r#"{ "gpu": { "device": -1 } }"#), "pools.p.gpu.device: invalid value: integer `-1`, expected a whole number from 0 to 4294967295"),
        (&one_pool(r#"{ "gpu": { "device": 0, "devices": [1] } }"#), "pools.p.gpu.devices: gpu.device is set too; set one of the two (device: this pool on one GPU; devices: one pool per GPU)"),
        (&one_pool(r#"{ "gpu": { "devices": [] } }"#), "pools.p.gpu.devices: is empty; list at least one device index"),
        (&one_pool(r#"{ "gpu": { "devices": [0, 1, 0] } }"#), "pools.p.gpu.devices: device 0 is listed twice; list each device once"),
        (&one_pool(r#"{ "gpu": { "devices": [0, 256] } }"#), "pools.p.gpu.devices[1]: 256 is out of range; use 0 to 255"),
        (&one_pool(r#"{ "gpu": { "devices": [0, 1] }, "queue": { "type": "yaque", "path": "./q", "stream": "s" } }"#), r#"pools.p.gpu.devices: one pool per device needs the in_memory queue: each pool owns its queue, and this one names a single durable queue; define one pool per device instead, each with "gpu": {"device": N} and its own queue"#),
        (&one_pool(r#"{ "gpu": { "reserve_fraction": 0.95 } }"#), "pools.p.gpu.reserve_fraction: 0.95 is out of range; use 0 to 0.9"),
        (&one_pool(r#"{ "gpu": { "reserve_fraction": -0.1 } }"#), "pools.p.gpu.reserve_fraction: -0.1 is out of range; use 0 to 0.9"),
        (&one_pool(r#"{ "gpu": { "sample_ms": 0 } }"#), "pools.p.gpu.sample_ms: 0 is out of range; use 1 to 60000"),
        (&one_pool(r#"{ "gpu": { "live_guard": "yes" } }"#), r#"pools.p.gpu.live_guard: invalid type: string "yes", expected a boolean"#),
        (&one_pool(r#"{ "worker_threads": 1024, "gpu": { "devices": [0, 1, 2, 3, 4] } }"#), "pools: 5120 worker threads in total across pools; at most 4096 are allowed"),
    ];
    for (text, expected) in cases {
        let error = SchedulerConfig::from_json_str(text)
            .expect_err(text)
            .to_string();
        assert_eq!(&error, expected, "for {text}");
    }
}

#[test]
fn pool_settings_take_the_files_units_and_refuse_what_they_cannot_carry() {
    // The file's max_units, not an argument that silently wins.
    let config = SchedulerConfig::from_json_str(&one_pool(r#"{ "max_units": 6 }"#)).unwrap();
    let settings = config.pool_settings("p").unwrap();
    assert_eq!(settings.limits().capacity.get(ResourceKind::Cpu), 6);
    assert_eq!(settings.limits().capacity.get(ResourceKind::GpuVram), 6);
    // Schedules are added as a pool is built from the file: settings alone refuse them,
    // naming the field and the way that carries them.
    let scheduled = one_pool(
        r#"{ "max_units": 6, "schedules": [
             { "name": "nightly", "cron": "0 2 * * *", "payload": "reindex" } ] }"#,
    );
    let config = SchedulerConfig::from_json_str(&scheduled).unwrap();
    let refused = config.pool_settings("p").unwrap_err().to_string();
    assert!(refused.starts_with("pools.p.schedules: "), "{refused}");
    assert!(
        refused.contains("build_pools_from_scheduler_config"),
        "{refused}"
    );
    assert!(refused.contains("WorkerPool::add_schedule"), "{refused}");
    // worker_pool_config is the explicit override: the units given, no schedules.
    let overridden = config.worker_pool_config("p", 24).unwrap();
    assert_eq!(overridden.limits().capacity.get(ResourceKind::Cpu), 24);
}

#[test]
fn a_fair_share_by_use_reads_as_its_order_and_weights() {
    let text = one_pool(
        r#"{ "max_units": 24, "fair_share": { "max_fraction": 0.5, "by_use": {
             "charge": "reported", "weights": { "acme": 3, "*": 2 }, "half_life_ms": 600000 } } }"#,
    );
    let config = SchedulerConfig::from_json_str(&text).unwrap();
    let settings = config.worker_pool_config("p", 24).unwrap();
    let order = FairByUse::new(UsageCharge::Reported)
        .with_half_life_ms(600_000)
        .with_default_weight(2);
    assert_eq!(settings.fair_by_use, Some(order));
    assert_eq!(settings.fair_share, Some(FairShare::MaxFraction(0.5)));
    assert_eq!(
        settings.tenant_weights,
        TenantWeights::default().with("acme", 3)
    );
    // Alone, by_use orders without a cap; the charge defaults to the units held.
    let text = one_pool(r#"{ "fair_share": { "by_use": {} } }"#);
    let settings = SchedulerConfig::from_json_str(&text)
        .unwrap()
        .worker_pool_config("p", 24)
        .unwrap();
    assert_eq!(
        settings.fair_by_use,
        Some(FairByUse::new(UsageCharge::Held))
    );
    assert_eq!(settings.fair_share, None);
}

#[test]
fn syntax_errors_say_which_format_and_where() {
    let error = SchedulerConfig::from_json_str("{ \"pools\": ")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("not valid JSON: EOF while parsing"),
        "{error}"
    );
    let error = SchedulerConfig::from_yaml_str("pools: [1, 2\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("not valid YAML:") && error.contains("line 1"),
        "{error}"
    );
}

#[derive(Clone)]
struct Echo;

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Echo {
    async fn execute(&self, payload: String, meta: TaskMetadata) -> String {
        format!("{}:{payload}", meta.id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_configuration_builds_running_pools() {
    let config = SchedulerConfig::from_path(shipped("local.json")).unwrap();
    let built = build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Echo,
        TokioSpawner,
    )
    .unwrap();
    let pool = built.pools.get("local_llm").expect("pool");
    let stats = pool.stats();
    assert_eq!((stats.worker_count, stats.total_units), (8, 24));
    let meta = TaskMetadata::new(3, ResourceCost::gpu_vram(4)).with_priority(Priority::High);
    let key = pool
        .submit(ScheduledTask {
            meta,
            payload: "hi".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        pool.retrieve(&key, Duration::from_secs(5)).await.unwrap(),
        "3:hi"
    );
    let too_big = TaskMetadata::new(4, ResourceCost::gpu_vram(25));
    assert_eq!(
        pool.submit(ScheduledTask {
            meta: too_big,
            payload: "x".into()
        })
        .await,
        Err(PoolError::InsufficientResources {
            needed: 25,
            available: 24,
            kind: ResourceKind::GpuVram,
        })
    );
}

/// The configuration error that building `config`'s pools is refused with.
fn build_refusal(config: &SchedulerConfig) -> String {
    let error = build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
        config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Echo,
        TokioSpawner,
    )
    .err()
    .expect("the build is refused");
    let PoolError::InvalidConfig(text) = error else {
        panic!("not a configuration error: {error:?}");
    };
    text
}

#[test]
fn a_backend_missing_from_this_build_is_named_with_its_feature() {
    let config = SchedulerConfig::from_json_str(&fixture("seed_readme_pools.json")).unwrap();
    let text = build_refusal(&config);
    // With every backend the seed names built, the pgmq queue needs a database the seed does
    // not name. Otherwise the first backend this build lacks is refused, naming its feature.
    #[cfg(all(feature = "pgmq", feature = "webhook", feature = "yaque"))]
    assert!(
        text.starts_with("pools.llm_inference.")
            && text.contains(": a postgres backend needs a database; set database_url"),
        "{text}"
    );
    #[cfg(not(all(feature = "pgmq", feature = "webhook", feature = "yaque")))]
    {
        let needed = text
            .split_once("is not available in this build of prometheus_parking_lot (it needs the cargo feature `")
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(feature, _)| feature)
            .unwrap_or_else(|| panic!("no missing feature named in {text:?}"));
        assert!(!features::built_with(needed), "{needed} is built: {text}");
        features::assert_lists_what_this_build_has(&text);
    }
}

#[cfg(not(feature = "yaque"))]
#[test]
fn without_the_yaque_feature_a_yaque_pool_is_refused_with_the_feature_named() {
    let config =
        SchedulerConfig::from_json_str(&one_pool(&fixture("seed_tauri_snippet.json"))).unwrap();
    let text = build_refusal(&config);
    assert!(
        text.starts_with(
            "pools.p.queue.type: the yaque queue is not available in this build of \
             prometheus_parking_lot (it needs the cargo feature `yaque`); available here: "
        ),
        "{text}"
    );
    features::assert_lists_what_this_build_has(&text);
}

/// A yaque `path` that names a file, not a directory: the error names the field and says
/// what to give instead.
#[cfg(feature = "yaque")]
#[test]
fn a_yaque_path_that_cannot_be_opened_names_the_field_with_advice() {
    let not_a_directory =
        std::env::temp_dir().join(format!("pl-config-queue-file-{}", std::process::id()));
    std::fs::write(&not_a_directory, "").expect("file written");
    let config = SchedulerConfig::from_json_str(&one_pool(&format!(
        r#"{{ "queue": {{ "type": "yaque", "path": {:?}, "stream": "llm" }} }}"#,
        not_a_directory.display().to_string()
    )))
    .expect("a valid configuration");
    let text = build_refusal(&config);
    let _ = std::fs::remove_file(&not_a_directory);
    assert!(
        text.starts_with("pools.p.queue.path: could not open the yaque stream llm in "),
        "{text}"
    );
    assert!(
        text.ends_with(
            "; give a directory this process can create and write, in which no other running \
             process has this stream open"
        ),
        "{text}"
    );
}

/// Without the `webhook` feature a pool naming the http notifier is refused before anything
/// starts (with it, tests/webhook.rs builds such pools).
#[cfg(not(feature = "webhook"))]
#[test]
fn the_http_notifier_needs_the_webhook_feature() {
    let config = SchedulerConfig::from_json_str(&one_pool(
        r#"{ "mailbox": { "notifier": { "type": "http", "base_url": "https://h/x" } } }"#,
    ))
    .unwrap();
    let text = build_refusal(&config);
    assert!(
        text.starts_with(
            "pools.p.mailbox.notifier.type: the http notifier is not available in this build of \
             prometheus_parking_lot (it needs the cargo feature `webhook`); available here: "
        ),
        "{text}"
    );
    features::assert_lists_what_this_build_has(&text);
}

/// Holds every task until the test lets it finish.
#[derive(Clone)]
struct Gate(std::sync::Arc<tokio::sync::Semaphore>);

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Gate {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        self.0.acquire().await.expect("gate open").forget();
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

#[test]
fn the_give_up_rule_and_the_stream_idle_bound_come_from_the_file_or_their_defaults() {
    let config = SchedulerConfig::from_json_str(&one_pool(
        r#"{ "on_give_up": "keep", "stream_idle_ms": 1500 }"#,
    ))
    .unwrap();
    let settings = config.worker_pool_config("p", 24).unwrap();
    assert_eq!(settings.on_give_up, Some(OnGiveUp::Keep));
    assert_eq!(settings.stream_idle_ms, 1_500);
    let config =
        SchedulerConfig::from_json_str(&one_pool(r#"{ "on_give_up": "abandon" }"#)).unwrap();
    assert_eq!(
        config.worker_pool_config("p", 24).unwrap().on_give_up,
        Some(OnGiveUp::Abandon)
    );
    // Unset: the mailbox decides when the pool starts; five minutes for streams.
    let config = SchedulerConfig::from_json_str(&one_pool("{}")).unwrap();
    let settings = config.worker_pool_config("p", 24).unwrap();
    assert_eq!(settings.on_give_up, None);
    assert_eq!(settings.stream_idle_ms, DEFAULT_STREAM_IDLE_MS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_share_from_the_config_caps_each_tenant() {
    let text = one_pool(
        r#"{ "worker_threads": 4, "max_units": 24, "backfill": false,
             "fair_share": { "max_units_per_tenant": 8 } }"#,
    );
    let config = SchedulerConfig::from_json_str(&text).unwrap();
    let settings = config.worker_pool_config("p", 24).unwrap();
    assert_eq!(settings.fair_share, Some(FairShare::MaxUnitsPerTenant(8)));
    assert!(!settings.backfill);
    let gate = Gate(std::sync::Arc::new(tokio::sync::Semaphore::new(0)));
    let built = build_pools_from_scheduler_config::<String, String, Gate, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| gate.clone(),
        TokioSpawner,
    )
    .unwrap();
    let pool = built.pools.get("p").expect("pool");
    let submit = |id, tenant: &str, units| {
        let meta = TaskMetadata::new(id, ResourceCost::gpu_vram(units))
            .with_mailbox(MailboxKey::new(tenant));
        pool.submit(ScheduledTask {
            meta,
            payload: format!("{tenant}{id}"),
        })
    };
    // Tenant a: two tasks of 4 reach its cap of 8; its third parks with 16 units free.
    let mut keys = Vec::new();
    for id in 1..=3 {
        keys.push(submit(id, "a", 4).await.unwrap());
    }
    until("a at its cap, its third parked", || {
        let stats = pool.stats();
        (stats.used_units, stats.queued_tasks) == (8, 1)
    })
    .await;
    // Tenant b is not held back by a's parked task.
    keys.push(submit(4, "b", 6).await.unwrap());
    until("b running", || pool.stats().used_units == 14).await;
    assert_eq!(pool.stats().queued_tasks, 1);
    // A task above the cap could never run: refused, naming the cap.
    assert_eq!(
        submit(5, "a", 9).await,
        Err(PoolError::InsufficientResources {
            needed: 9,
            available: 8,
            kind: ResourceKind::GpuVram,
        })
    );
    // Let everything finish: a's parked task runs once a's units come back.
    gate.0.add_permits(4);
    for key in &keys {
        pool.retrieve(key, Duration::from_secs(10)).await.unwrap();
    }
    until("every unit back", || pool.stats().used_units == 0).await;
    // Tasks without a mailbox all count as one tenant: the second waits for the first.
    let anonymous = |id| ScheduledTask {
        meta: TaskMetadata::new(id, ResourceCost::gpu_vram(8)),
        payload: format!("anonymous{id}"),
    };
    let first = pool.submit(anonymous(6)).await.unwrap();
    let second = pool.submit(anonymous(7)).await.unwrap();
    until("one anonymous task running, the other parked", || {
        let stats = pool.stats();
        (stats.used_units, stats.queued_tasks) == (8, 1)
    })
    .await;
    gate.0.add_permits(2);
    for key in [&first, &second] {
        pool.retrieve(key, Duration::from_secs(10)).await.unwrap();
    }
}

/// The `admin` section: refused with the feature's name in a build without it, validated in
/// one with it (an address, a token that is not empty), its token a secret.
#[test]
fn the_admin_section_is_checked() {
    let with_admin = |admin: &str| format!(r#"{{ "pools": {{ "p": {{}} }}, "admin": {admin} }}"#);
    let loaded = SchedulerConfig::from_json_str(&with_admin(r#"{ "bind": "127.0.0.1:0" }"#));
    if !cfg!(feature = "admin") {
        let error = loaded.unwrap_err().to_string();
        assert_eq!(
            error,
            "admin: the admin server needs the cargo feature `admin`; build with it, or remove the section"
        );
        return;
    }
    let config = loaded.expect("a valid admin section");
    assert_eq!(config.admin.unwrap().bind.as_deref(), Some("127.0.0.1:0"));
    for (admin, expected) in [
        (r#"{ "bind": "localhost:80" }"#, "admin.bind: \"localhost:80\" is not an address; use host:port with an IP address, such as 127.0.0.1:7480 (port 0 picks a free one)"),
        (r#"{ "token": " " }"#, "admin.token: the token is empty; give one (a ${NAME} reference keeps it out of the file), or leave the field out to serve reads only"),
        (r#"{ "read_token": true }"#, "admin.read_token: reads cannot need a token the server does not have; give admin.token too, or leave read_token out"),
        (r#"{ "port": 1 }"#, "admin.port: unknown field `port`; use one of `bind`, `token`, `allowed_hosts`, `read_token`"),
    ] {
        let error = SchedulerConfig::from_json_str(&with_admin(admin)).unwrap_err().to_string();
        assert_eq!(error, expected, "{admin}");
    }
    let config = SchedulerConfig::from_json_str(&with_admin(r#"{ "token": "hunter2" }"#)).unwrap();
    assert!(
        !format!("{config:?}").contains("hunter2"),
        "the token is a secret"
    );
}
