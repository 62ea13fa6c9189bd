//! Hostile and careless configurations, through the public API only: keys given twice,
//! secrets that look like references, secrets and garbage in error messages, too many
//! threads, absurd stacks, and the documents that blow up naive YAML readers. Every case
//! answers within a few seconds, with an error naming the field.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use prometheus_parking_lot::*;

/// Runs `check` on its own thread and fails the test if it takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, check: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, answer) = mpsc::channel();
    thread::spawn(move || {
        let _ = done.send(check());
    });
    answer
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("no answer within {limit:?}"))
}

const QUICK: Duration = Duration::from_secs(10);

fn json_error(text: &str) -> String {
    let text = text.to_owned();
    within(QUICK, move || SchedulerConfig::from_json_str(&text))
        .expect_err("refused")
        .to_string()
}

fn yaml_error(text: &str) -> String {
    let text = text.to_owned();
    within(QUICK, move || SchedulerConfig::from_yaml_str(&text))
        .expect_err("refused")
        .to_string()
}

fn build(config: &SchedulerConfig) -> Result<BuiltPools<String, String, Echo>, PoolError> {
    build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
        config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Echo,
        TokioSpawner,
    )
}

/// `build`, for a configuration that must be refused before any pool starts.
fn build_error(config: SchedulerConfig) -> PoolError {
    within(QUICK, move || build(&config).err()).expect("refused")
}

#[derive(Clone)]
struct Echo;

#[async_trait::async_trait]
impl TaskExecutor<String, String> for Echo {
    async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
        payload
    }
}

#[test]
fn a_key_given_twice_in_json_is_refused_at_its_path() {
    assert_eq!(
        json_error(r#"{"pools":{"p":{"max_units":1,"max_units":2}}}"#),
        "pools.p.max_units: duplicate key `max_units` at line 1 column 41"
    );
    assert_eq!(
        json_error(r#"{"pools":{"p":{"max_units":1},"p":{"max_units":2}}}"#),
        "pools.p: duplicate key `p` at line 1 column 34"
    );
    assert!(
        json_error(r#"{"pools":{"p":{"queue":{"type":"in_memory","type":"postgres_pgmq"}}}}"#)
            .starts_with("pools.p.queue.type: duplicate key `type`")
    );
    assert!(json_error(r#"{"pools":{"p":{}},"pools":{"q":{}}}"#)
        .starts_with("pools: duplicate key `pools`"));
    // The YAML loader refuses the same documents.
    assert!(
        yaml_error("pools:\n  p:\n    max_units: 1\n    max_units: 2\n")
            .contains("duplicate mapping key: max_units")
    );
    assert!(yaml_error("pools:\n  p: {}\n  p: {}\n").contains("duplicate mapping key: p"));
}

#[test]
fn json_without_duplicates_still_loads_and_reports_syntax_as_before() {
    let config = SchedulerConfig::from_json_str(
        r#"{"pools":{"a":{"max_units":1,"queue":{"type":"in_memory"}},"b":{"max_units":2}}}"#,
    )
    .unwrap();
    assert_eq!(config.pools.len(), 2);
    assert!(json_error(r#"{"pools":{"p":{}}} x"#)
        .starts_with("not valid JSON: trailing characters at line 1 column 20"));
    assert!(json_error(r#"{"pools":{"p":{"#).starts_with("not valid JSON: EOF while parsing"));
    assert!(json_error(&"[".repeat(100_000)).contains("recursion limit exceeded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_from_the_environment_is_taken_as_it_is() {
    std::env::set_var(
        "PL_HARDEN_DB_URL",
        "postgres://app:p${PL_HARDEN_SURELY_UNSET}@db/app",
    );
    std::env::set_var("PL_HARDEN_OUTER", "${PL_HARDEN_INNER}");
    std::env::set_var("PL_HARDEN_INNER", "resolved twice");
    std::env::set_var("PL_HARDEN_HALF", "p${");
    let config = SchedulerConfig::from_json_str(
        r#"{ "database_url": "${PL_HARDEN_DB_URL}",
             "pools": { "p": { "max_units": 4, "worker_threads": 1 } } }"#,
    )
    .unwrap();
    let url = config.database_url.as_ref().expect("set").expose();
    assert_eq!(url, "postgres://app:p${PL_HARDEN_SURELY_UNSET}@db/app");

    let loaded = config.clone();
    let built = tokio::time::timeout(QUICK, tokio::task::spawn_blocking(move || build(&loaded)))
        .await
        .expect("in time")
        .expect("no panic")
        .expect("the builder does not look for references in loaded values");
    assert_eq!(built.pools["p"].stats().worker_count, 1);
    drop(built);

    for (reference, expected) in [
        ("${PL_HARDEN_OUTER}", "${PL_HARDEN_INNER}"),
        ("${PL_HARDEN_HALF}", "p${"),
    ] {
        let config = SchedulerConfig::from_json_str(&format!(
            r#"{{ "database_url": "{reference}", "pools": {{ "p": {{ "worker_threads": 1 }} }} }}"#
        ))
        .unwrap();
        assert_eq!(config.database_url.expect("set").expose(), expected);
    }
}

#[test]
fn errors_quote_the_file_as_written_never_a_secret() {
    std::env::set_var("PL_HARDEN_WEBHOOK", "s3cr3t-webhook-token");
    std::env::set_var("PL_HARDEN_HOOK_HOST", "h/s3cr3t path");
    std::env::set_var("PL_HARDEN_AUTH", "Bearer s3cr3t\r\nX-Injected: 1");
    std::env::set_var("PL_HARDEN_AUTH_OK", "Bearer s3cr3t");
    let notifier = |fields: &str| {
        format!(
            r#"{{ "pools": {{ "p": {{ "mailbox": {{ "notifier": {{ "type": "http", {fields} }} }} }} }} }}"#
        )
    };
    let cases = [
        (
            notifier(r#""base_url": "${PL_HARDEN_WEBHOOK}""#),
            r#"pools.p.mailbox.notifier.base_url: "${PL_HARDEN_WEBHOOK}" is not a URL; use http://host/path or https://host/path"#,
        ),
        (
            notifier(r#""base_url": "https://${PL_HARDEN_HOOK_HOST}""#),
            r#"pools.p.mailbox.notifier.base_url: "https://${PL_HARDEN_HOOK_HOST}" is not a URL; use http://host/path or https://host/path"#,
        ),
        (
            notifier(r#""base_url": "https://h/x", "auth_header": "${PL_HARDEN_AUTH}""#),
            "pools.p.mailbox.notifier.auth_header: is not a valid HTTP header value; use visible \
             ASCII characters, spaces and tabs (the value is secret and not shown)",
        ),
    ];
    for (text, expected) in cases {
        let error = json_error(&text);
        assert_eq!(error, expected);
        assert!(!error.contains("s3cr3t"), "{error}");
    }
    let config = SchedulerConfig::from_json_str(&notifier(
        r#""base_url": "https://h/x", "auth_header": "${PL_HARDEN_AUTH_OK}""#,
    ))
    .unwrap();
    assert!(!format!("{config:?}").contains("s3cr3t"));
}

#[test]
fn quoted_input_is_escaped_and_cut() {
    let long = "x".repeat(100);
    let cut = format!("\"{}\"…", "x".repeat(64));
    let cases = [
        (
            r#"{ "pools": { "a\nb": {} } }"#.to_owned(),
            r#"pools.a\nb: "a\nb" is not allowed; pool names are 1 to 64 of the characters a-z A-Z 0-9 _ -"#.to_owned(),
        ),
        (
            format!(r#"{{ "pools": {{ "{long}": {{}} }} }}"#),
            format!("pools.{}…: {cut} is not allowed; pool names are 1 to 64 of the characters a-z A-Z 0-9 _ -", "x".repeat(64)),
        ),
        (
            format!(r#"{{ "pools": {{ "p": {{ "queue": {{ "type": "postgres", "table": "{long}" }} }} }} }}"#),
            format!("pools.p.queue.table: {cut} is not a safe SQL identifier; use a letter or '_' followed by letters, digits or '_', at most 63 characters"),
        ),
        (
            r#"{ "pools": { "p": { "queue": { "type": "postgres", "table": "t\u001b[2J" } } } }"#.to_owned(),
            r#"pools.p.queue.table: "t\u{1b}[2J" is not a safe SQL identifier; use a letter or '_' followed by letters, digits or '_', at most 63 characters"#.to_owned(),
        ),
        (
            format!(r#"{{ "pools": {{ "p": {{ "queue": {{ "type": "yaque", "path": "./q", "stream": "{long}" }} }} }} }}"#),
            format!("pools.p.queue.stream: {cut} is not allowed; stream names are 1 to 64 of the characters a-z A-Z 0-9 _ -"),
        ),
        (
            format!(r#"{{ "pools": {{ "p": {{ "mailbox": {{ "notifier": {{ "type": "http", "base_url": "ftp://{long}" }} }} }} }} }}"#),
            format!("pools.p.mailbox.notifier.base_url: \"ftp://{}\"… is not a URL; use http://host/path or https://host/path", "x".repeat(58)),
        ),
        (
            r#"{ "pools": { "p": { "mailbox": { "notifier": { "type": "http", "base_url": "https://h/\r\nX: 1" } } } } }"#.to_owned(),
            r#"pools.p.mailbox.notifier.base_url: "https://h/\r\nX: 1" is not a URL; use http://host/path or https://host/path"#.to_owned(),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(json_error(&text), expected, "for {text}");
    }
    // Unknown keys and values are quoted by serde; the message is still escaped and bounded.
    let huge = "k\u{7}".repeat(50_000);
    for text in [
        format!(r#"{{ "pools": {{ "p": {{ "{huge}": 1 }} }} }}"#),
        format!(r#"{{ "pools": {{ "p": {{ "queue": {{ "type": "{huge}" }} }} }} }}"#),
        format!(r#"{{ "pools": {{ "p": {{ "max_units": "{huge}" }} }} }}"#),
        format!(r#"{{ "pools": {{ "p": {{ "{huge}": 1, "{huge}": 2 }} }} }}"#),
    ] {
        let text = text.replace('\u{7}', "\\u0007");
        let error = json_error(&text);
        assert!(error.starts_with("pools.p"), "{error}");
        assert!(error.chars().count() < 1_000, "{} characters", error.len());
        assert!(!error.contains(char::is_control), "{error}");
    }
}

#[test]
fn worker_threads_are_capped_across_pools() {
    let pools = |count: usize, threads: usize| {
        let body: Vec<String> = (0..count)
            .map(|n| format!(r#""p{n}": {{ "worker_threads": {threads} }}"#))
            .collect();
        format!(r#"{{ "pools": {{ {} }} }}"#, body.join(", "))
    };
    assert_eq!(
        json_error(&pools(5, 1_000)),
        "pools: 5000 worker threads in total across pools; at most 4096 are allowed"
    );
    assert_eq!(
        json_error(&pools(4_097, 1)),
        "pools: 4097 worker threads in total across pools; at most 4096 are allowed"
    );
    let mut config = SchedulerConfig::from_json_str(&pools(4, 1_024)).expect("4096 are allowed");
    let extra = config.pools["p0"].clone();
    config.pools.insert("p4".into(), extra);
    assert_eq!(
        build_error(config),
        PoolError::InvalidConfig(
            "pools: 5120 worker threads in total across pools; at most 4096 are allowed".into()
        )
    );
}

#[test]
fn a_nul_in_a_pool_name_and_an_absurd_stack_are_config_errors() {
    let nul = r#"pools.a\0b: "a\0b" is not allowed; pool names are 1 to 64 of the characters a-z A-Z 0-9 _ -"#;
    assert_eq!(json_error(r#"{ "pools": { "a\u0000b": {} } }"#), nul);
    assert_eq!(yaml_error("pools:\n  \"a\\0b\": {}\n"), nul);

    let stack = "pools.p.thread_stack_size: 1099511627776 is out of range; use 65536 to 1073741824";
    assert_eq!(
        json_error(r#"{ "pools": { "p": { "thread_stack_size": 1099511627776 } } }"#),
        stack
    );
    let mut config =
        SchedulerConfig::from_json_str(r#"{ "pools": { "p": { "worker_threads": 1 } } }"#).unwrap();
    config.pools.get_mut("p").expect("p").thread_stack_size = Some(1 << 40);
    assert_eq!(
        build_error(config.clone()),
        PoolError::InvalidConfig(stack.into())
    );
    config.pools.get_mut("p").expect("p").thread_stack_size = None;
    config
        .pools
        .insert("a\0b".into(), config.pools["p"].clone());
    assert_eq!(build_error(config), PoolError::InvalidConfig(nul.into()));
}

#[test]
fn shared_queue_numbers_out_of_range_name_their_field() {
    let queue = |settings: &str| format!(r#"{{ "pools": {{ "p": {{ "queue": {settings} }} }} }}"#);
    let cases = [
        (
            r#"{ "type": "postgres", "claim_ahead": 10001 }"#,
            "pools.p.queue.claim_ahead: 10001 is out of range; use 0 to 10000",
        ),
        (
            r#"{ "type": "postgres_pgmq", "queue_name": "q", "claim_ahead": 20000 }"#,
            "pools.p.queue.claim_ahead: 20000 is out of range; use 0 to 10000",
        ),
        (
            r#"{ "type": "postgres", "max_attempts": 0 }"#,
            "pools.p.queue.max_attempts: 0 is out of range; use 1 to 1000",
        ),
        (
            r#"{ "type": "postgres", "lease_ms": 10 }"#,
            "pools.p.queue.lease_ms: 10 is out of range; use 300 to 86400000",
        ),
    ];
    for (settings, error) in cases {
        assert_eq!(json_error(&queue(settings)), error, "{settings}");
    }
    let fine = queue(r#"{ "type": "postgres", "claim_ahead": 10000 }"#);
    SchedulerConfig::from_json_str(&fine).expect("10,000 ahead is allowed");
}

#[test]
fn alias_bombs_and_deep_nesting_are_answered_quickly() {
    let mut bomb = String::from(
        "a: &a [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n",
    );
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for pair in names.windows(2) {
        let (previous, next) = (pair[0], pair[1]);
        let row = vec![format!("*{previous}"); 9].join(", ");
        bomb.push_str(&format!("{next}: &{next} [{row}]\n"));
    }
    bomb.push_str("pools:\n  p: {}\n");
    let error = yaml_error(&bomb);
    assert!(
        error.starts_with("not valid YAML:") && error.contains("budget breached"),
        "{error}"
    );

    let deep = format!("pools: {}{}", "[".repeat(100_000), "]".repeat(100_000));
    let error = yaml_error(&deep);
    assert!(
        error.starts_with("not valid YAML:") && error.contains("recursion limit exceeded"),
        "{error}"
    );
}

#[test]
fn unknown_fields_are_named_in_both_formats() {
    let expected = "pools.p.max_unit: unknown field `max_unit`; did you mean `max_units`?";
    assert_eq!(
        json_error(r#"{ "pools": { "p": { "max_unit": 3 } } }"#),
        expected
    );
    assert_eq!(yaml_error("pools:\n  p:\n    max_unit: 3\n"), expected);
    assert_eq!(
        yaml_error("pools:\n  p:\n    mailbox:\n      notifier: { type: http, base_url: \"https://h\", tiemout_ms: 5 }\n"),
        "pools.p.mailbox.notifier: unknown field `tiemout_ms`; did you mean `timeout_ms`?"
    );
}
