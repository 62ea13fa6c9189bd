//! No secret in an error, a log line or `Debug` output, whatever road it takes.
//!
//! Credential-bearing values (a database URL with a password, a webhook URL with userinfo and
//! a query token, an auth header, an HMAC key) are fed through every path that can echo
//! them: configuration loading (a valid file, a refused field quoting what was written, a
//! value of the wrong type, a syntax error, `${VAR}` references), `Debug` of the settings
//! types, connecting to PostgreSQL (a URL the driver cannot parse, from a file and from the
//! environment, a refused connection) and the webhook notifier (its settings and its
//! failed deliveries). Each test asserts that no secret appears in the errors' `Display` and
//! `Debug`, in `Debug` output, or in anything the process logged through `tracing` at any
//! level (one subscriber for the whole binary captures every event, dependencies' included).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_parking_lot::config::NotifierSettings;
use prometheus_parking_lot::SchedulerConfig;

/// The secrets the tests feed in; none may come out.
const SECRETS: [&str; 5] = ["hunter2pg", "hookpw91", "tok4e8f", "authz77c1", "whsec5a0b"];

/// A webhook URL carrying a password and a query token.
const HOOK_URL: &str = "https://hook:hookpw91@hooks.example.com/services/T0?token=tok4e8f";

/// Everything the process logged, shared with the tests.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber once; returns what it has captured so far.
fn logs() -> String {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    let captured = CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        captured
    });
    let bytes = captured
        .0
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Fails naming the output and the secret if any secret is in `output`.
fn assert_clean(what: &str, output: &str) {
    for secret in SECRETS {
        assert!(
            !output.contains(secret),
            "{what} shows the secret {secret}: {output}"
        );
    }
}

/// Both faces of an error, and of every error in its source chain.
fn assert_error_clean(what: &str, error: &(dyn std::error::Error + 'static)) {
    assert_clean(&format!("{what} (Display)"), &error.to_string());
    assert_clean(&format!("{what} (Debug)"), &format!("{error:?}"));
    let mut source = error.source();
    while let Some(cause) = source {
        assert_clean(&format!("{what} (a source's Display)"), &cause.to_string());
        assert_clean(&format!("{what} (a source's Debug)"), &format!("{cause:?}"));
        source = cause.source();
    }
}

fn pool_with_notifier(notifier: &str) -> String {
    format!(
        r#"{{ "pools": {{ "p": {{ "mailbox": {{ "notifier": {{ "type": "http", {notifier} }} }} }} }} }}"#
    )
}

#[test]
fn configuration_errors_and_debug_show_no_secret() {
    logs();
    // A valid file full of credentials: its Debug shows none.
    let text = format!(
        r#"{{ "database_url": "postgres://u:hunter2pg@db:5432/app",
             "pools": {{ "p": {{ "mailbox": {{ "notifier": {{ "type": "http",
               "base_url": "{HOOK_URL}", "auth_header": "Bearer authz77c1",
               "hmac_secret": "whsec5a0b" }} }} }} }} }}"#
    );
    let config = SchedulerConfig::from_json_str(&text).expect("valid");
    assert_clean("a loaded configuration's Debug", &format!("{config:?}"));
    let notifier = config.pools["p"]
        .mailbox
        .notifier
        .as_ref()
        .expect("notifier");
    assert_clean("the notifier settings' Debug", &format!("{notifier:?}"));
    let NotifierSettings::Http { base_url, .. } = notifier;
    assert_eq!(base_url, HOOK_URL, "the value itself is kept");

    // The same through environment variables: nothing read from the environment shows.
    std::env::set_var("PL_REDACT_HOOK_URL", HOOK_URL);
    std::env::set_var("PL_REDACT_AUTH", "Bearer authz77c1");
    let config = SchedulerConfig::from_json_str(&pool_with_notifier(
        r#""base_url": "${PL_REDACT_HOOK_URL}", "auth_header": "${PL_REDACT_AUTH}""#,
    ))
    .expect("valid");
    assert_clean(
        "a configuration from the environment",
        &format!("{config:?}"),
    );

    let refused = [
        // A URL refused by validation (a space in it) is quoted: without its credentials.
        pool_with_notifier(
            r#""base_url": "https://hook:hookpw91@hooks.example.com/x y?token=tok4e8f""#,
        ),
        // A credential in a field of another type is quoted by the parser.
        pool_with_notifier(r#""base_url": "https://h/x", "timeout_ms": "Bearer authz77c1""#),
        r#"{ "database_url": 5, "pools": { "p": { "queue": { "type": "postgres", "table": "postgres://u:hunter2pg@db/app" } } } }"#
            .to_owned(),
        r#"{ "pools": { "p": { "max_units": "postgres://u:hunter2pg@db/app?password=hunter2pg" } } }"#
            .to_owned(),
        // A syntax error next to a URL.
        r#"{ "database_url": "postgres://u:hunter2pg@db/app" "pools": {} }"#.to_owned(),
    ];
    for text in &refused {
        let error = SchedulerConfig::from_json_str(text).expect_err("refused");
        assert_error_clean(&format!("the error for {text}"), &error);
    }
    let yaml = "database_url: postgres://u:hunter2pg@db/app\npools: [\n  p: { max_units: 3\n";
    let error = SchedulerConfig::from_yaml_str(yaml).expect_err("not YAML");
    assert_error_clean("a YAML syntax error", &error);
    let yaml = "pools:\n  p:\n    max_units: \"postgres://u:hunter2pg@db/app\"\n";
    let error = SchedulerConfig::from_yaml_str(yaml).expect_err("wrong type");
    assert_error_clean("a YAML value of the wrong type", &error);

    assert_clean("the logs", &logs());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use prometheus_parking_lot::infra::postgres::PgDatabase;
    use prometheus_parking_lot::{
        build_pools_from_scheduler_config, QueueBuilderContext, TaskExecutor, TokioSpawner,
    };

    #[derive(Clone)]
    struct Echo;

    #[async_trait::async_trait]
    impl TaskExecutor<u64, u64> for Echo {
        async fn execute(&self, payload: u64, _meta: prometheus_parking_lot::TaskMetadata) -> u64 {
            payload
        }
    }

    fn build(config: &SchedulerConfig) -> prometheus_parking_lot::PoolError {
        match build_pools_from_scheduler_config::<u64, u64, Echo, TokioSpawner>(
            config,
            &QueueBuilderContext::Embedded,
            None,
            |_| Echo,
            TokioSpawner,
        ) {
            Ok(_) => panic!("pools built on a database that cannot be reached"),
            Err(error) => error,
        }
    }

    #[test]
    fn connecting_shows_no_password() {
        logs();
        // The driver quotes a connection string it cannot parse (port out of range).
        for url in [
            "postgres://u:hunter2pg@127.0.0.1:99999/test",
            "postgres://u:hunter2pg@127.0.0.1:99999/test?password=hunter2pg",
            "postgres://u@127.0.0.1:5432/test?sslmode=bogus&password=hunter2pg",
        ] {
            let error = PgDatabase::connect(url).expect_err("refused");
            assert_error_clean(&format!("connecting to {url}"), &error);
        }
        // URLs that lost their `://` (a typo in a file or an environment variable): the
        // driver cannot parse them and quotes them.
        let malformed = [
            "postgres//u:hunter2pg@127.0.0.1:5544/test",
            "postgres:/u:hunter2pg@127.0.0.1:5544/test",
            "u:hunter2pg@127.0.0.1/test",
            "postgres:u:hunter2pg@127.0.0.1/test",
        ];
        for url in malformed {
            let error = PgDatabase::connect(url).expect_err("refused");
            assert_error_clean(&format!("connecting to {url}"), &error);
            let written = format!(
                r#"{{ "database_url": "{url}", "pools": {{ "p": {{ "queue": {{ "type": "postgres" }} }} }} }}"#
            );
            match SchedulerConfig::from_json_str(&written) {
                Ok(config) => assert_error_clean(&format!("building from {url}"), &build(&config)),
                Err(error) => assert_error_clean(&format!("loading {url}"), &error),
            }
        }
        // A server that refuses the connection.
        let error = PgDatabase::connect("postgres://u:hunter2pg@127.0.0.1:1/test")
            .expect_err("nothing listens on port 1");
        assert_error_clean("a refused connection", &error);
        assert!(
            matches!(error, prometheus_parking_lot::PoolError::Backend(_)),
            "a server that cannot be reached is the backend's failure: {error:?}"
        );
        // The same, met while building pools from a configuration.
        let unreachable = r#"{ "database_url": "postgres://u:hunter2pg@127.0.0.1:1/test",
                               "pools": { "p": { "queue": { "type": "postgres" } } } }"#;
        let config = SchedulerConfig::from_json_str(unreachable).expect("valid");
        let error = build(&config);
        assert!(error.is_retryable(), "{error:?}");
        assert_error_clean("building on an unreachable database", &error);

        // From a configuration, written in the file and read from the environment.
        let pool = r#""pools": { "p": { "queue": { "type": "postgres" }, "mailbox": { "storage": { "type": "postgres" } } } }"#;
        let written = format!(
            r#"{{ "database_url": "postgres://u:hunter2pg@127.0.0.1:99999/test", {pool} }}"#
        );
        let config = SchedulerConfig::from_json_str(&written).expect("valid");
        assert_error_clean("building from a written database_url", &build(&config));
        std::env::set_var(
            "PL_REDACT_DATABASE_URL",
            "postgres://u:hunter2pg@127.0.0.1:99999/test",
        );
        let from_env = format!(r#"{{ "database_url": "${{PL_REDACT_DATABASE_URL}}", {pool} }}"#);
        let config = SchedulerConfig::from_json_str(&from_env).expect("valid");
        let error = build(&config);
        assert_error_clean("building from ${DATABASE_URL}", &error);
        assert!(
            error.to_string().contains("database_url"),
            "the error still names the field: {error}"
        );

        assert_clean("the logs", &logs());
    }

    /// Whether `text` names a C source file (`postinit.c`), as a server's error location does.
    fn names_a_c_file(text: &str) -> bool {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_')))
            .any(|word| word.len() > 2 && word.ends_with(".c"))
    }

    /// A server's error reads as what is wrong (its message and SQLSTATE), never as where in
    /// PostgreSQL's own code it was raised (the driver appends `at line 334`, and keeps the
    /// file and routine). The server trusts local connections, so a wrong password is let in:
    /// a database that does not exist is refused in the same place of the server's code.
    #[test]
    fn a_server_s_error_reads_as_words_not_its_source_lines() {
        let base = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let (server, _) = base.rsplit_once('/').expect("a URL with a database");
        let url = format!("{server}/no_such_db_xyz");
        let connected = PgDatabase::connect(&url).expect_err("no such database");
        let config = SchedulerConfig::from_json_str(&format!(
            r#"{{ "database_url": "{url}", "pools": {{ "p": {{ "queue": {{ "type": "postgres" }} }} }} }}"#
        ))
        .expect("valid");
        let built = build(&config);
        for (what, error) in [("connecting", &connected), ("building", &built)] {
            let mut faces = vec![error.to_string(), format!("{error:?}")];
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                faces.push(cause.to_string());
                faces.push(format!("{cause:?}"));
                source = cause.source();
            }
            for face in &faces {
                assert!(!face.contains("at line"), "{what}: {face}");
                assert!(!names_a_c_file(face), "{what}: {face}");
                assert!(!face.contains("InitPostgres"), "{what}: {face}");
            }
            let text = &faces[0];
            assert!(
                text.contains("no_such_db_xyz") && text.contains("does not exist"),
                "{what}: the error still says what is wrong: {text}"
            );
            assert!(text.contains("3D000"), "{what}: and its SQLSTATE: {text}");
            let prometheus_parking_lot::PoolError::Backend(backend) = error else {
                panic!("{what}: the server's refusal is a backend error, not {error:?}");
            };
            assert_eq!(
                backend.fault.kind,
                prometheus_parking_lot::core::FaultKind::Refused,
                "{what}: retrying will not create the database"
            );
        }
    }
}

#[cfg(feature = "webhook")]
mod webhook {
    use super::*;
    use prometheus_parking_lot::config::Secret;
    use prometheus_parking_lot::core::{Notifier, TaskStatus, TerminalEvent};
    use prometheus_parking_lot::infra::notify::http::{HttpNotifier, HttpNotifierSettings};
    use prometheus_parking_lot::MailboxKey;
    use std::time::Duration;

    fn settings(url: &str) -> HttpNotifierSettings {
        HttpNotifierSettings::new(url)
            .with_name("redaction")
            .with_auth_header(Secret::new("Bearer authz77c1"))
            .with_hmac_secret(Secret::new("whsec5a0b"))
            .with_timeout(Duration::from_millis(500))
            .with_max_retries(2)
            .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_webhook_notifier_shows_no_secret() {
        logs();
        assert_clean("the settings' Debug", &format!("{:?}", settings(HOOK_URL)));

        // Nothing listens on port 1: every attempt fails and is logged, then given up.
        let url = "http://hook:hookpw91@127.0.0.1:1/services/T0?token=tok4e8f";
        let notifier = HttpNotifier::new(settings(url)).expect("starts");
        assert_clean("the notifier's Debug", &format!("{notifier:?}"));
        notifier.notify(&TerminalEvent {
            pool: Arc::from("redaction"),
            key: MailboxKey::new("acme"),
            task_id: 1,
            status: TaskStatus::Completed,
            stored_at_ms: 1_700_000_000_000,
            attempt: 1,
            result: None,
            trace: None,
        });
        notifier.flush(None).await;
        assert_eq!(notifier.stats().abandoned, 1, "every attempt failed");
        let logs = logs();
        assert!(
            logs.contains("webhook: notification not delivered"),
            "the failures were logged: {logs}"
        );
        assert_clean("the logs", &logs);

        let error = HttpNotifier::new(
            settings(url).with_auth_header(Secret::new("Bearer authz77c1\r\nX-Injected: hookpw91")),
        )
        .expect_err("a header with a line break is refused");
        assert_error_clean("a refused auth header", &error);
    }
}
