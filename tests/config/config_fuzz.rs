//! Hostile input into the configuration loaders: arbitrary bytes, arbitrary JSON values and
//! valid files with one field replaced by anything. The loaders never panic and always answer
//! `Ok` (a configuration that validates) or an error that names a field path.

use prometheus_parking_lot::config::ConfigError;
use prometheus_parking_lot::SchedulerConfig;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Field names the loaders know, so generated documents reach deep into the structure.
const KEYS: &[&str] = &[
    "pools",
    "p",
    "worker_threads",
    "thread_stack_size",
    "max_units",
    "max_queue_depth",
    "max_queued_units",
    "order",
    "default_timeout_secs",
    "default_timeout_ms",
    "pin_to_cpus",
    "starvation",
    "max_park_ms",
    "max_skips",
    "queue",
    "type",
    "path",
    "stream",
    "table",
    "queue_name",
    "mailbox",
    "storage",
    "notifier",
    "base_url",
    "auth_header",
    "retention_secs",
    "max_messages",
    "database_url",
    "timeout_ms",
    "max_retries",
    "hmac_secret",
    "x",
];

const WORDS: &[&str] = &[
    "in_memory",
    "yaque",
    "postgres",
    "postgres_pgmq",
    "fifo",
    "deadline",
    "http",
    "auto",
    "${HOME}",
    "${",
    "${NOPE_X}",
    "https://h/x",
    "jobs; drop table x",
    "",
    "p",
    "-1",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e20f64..1e20).prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
        "[a-z_ ]{0,12}".prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|entries| {
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

fn valid_pool() -> Value {
    json!({
        "worker_threads": 2, "max_units": 24, "max_queue_depth": 100, "default_timeout_ms": 1000,
        "starvation": { "max_park_ms": 1000, "max_skips": 8 },
        "queue": { "type": "postgres", "table": "pl_queue_jobs", "queue_name": "q" },
        "mailbox": { "storage": { "type": "in_memory" }, "retention_secs": 60,
                     "notifier": { "type": "http", "base_url": "https://h/x", "max_retries": 3 } }
    })
}

/// `Ok` must validate; an error must name a field, or be a syntax error.
fn assert_well_behaved(result: Result<SchedulerConfig, ConfigError>) {
    match result {
        Ok(config) => assert_eq!(config.validate(), Ok(())),
        Err(ConfigError::Invalid { path, problem }) => {
            assert!(!path.trim().is_empty(), "no field named ({problem})");
            assert!(!problem.is_empty());
        }
        Err(ConfigError::Syntax { reason, .. }) => assert!(!reason.is_empty()),
        Err(other) => panic!("unexpected error from an in-memory document: {other}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        assert_well_behaved(SchedulerConfig::from_json_str(&text));
        assert_well_behaved(SchedulerConfig::from_yaml_str(&text));
    }

    #[test]
    fn arbitrary_json_values_never_panic(document in value()) {
        let text = document.to_string();
        assert_well_behaved(SchedulerConfig::from_value(document));
        assert_well_behaved(SchedulerConfig::from_json_str(&text));
    }

    #[test]
    fn a_valid_pool_with_one_field_replaced_is_answered_at_that_field(
        field in prop::sample::select(&KEYS[2..]),
        replacement in value(),
    ) {
        let mut pool = valid_pool();
        pool.as_object_mut().expect("object").insert(field.to_owned(), replacement);
        let result = SchedulerConfig::from_value(json!({ "pools": { "p": pool } }));
        if let Err(ConfigError::Invalid { path, .. }) = &result {
            prop_assert!(path.starts_with("pools.p"), "{path}");
        }
        assert_well_behaved(result);
    }
}
