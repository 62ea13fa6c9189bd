//! What a newcomer meets first, answered in the words of what they wrote: a misspelt field
//! in a configuration file, a wrong type, a yaque directory that cannot be used.

use std::path::PathBuf;

use prometheus_parking_lot::SchedulerConfig;

/// A file of its own under the system's temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, contents: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("pl-first-contact-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).expect("temporary file written");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_misspelt_field_in_a_file_suggests_the_likely_one() {
    let file = TempFile::new(
        "typo.yaml",
        "pools:\n  chat:\n    max_units: 24\n    worker_thread: 4\n",
    );
    let error = SchedulerConfig::from_path(&file.0).unwrap_err();
    assert_eq!(
        error.to_string(),
        "pools.chat.worker_thread: unknown field `worker_thread`; did you mean `worker_threads`?"
    );
}

#[test]
fn a_wrong_type_is_named_in_the_configs_words() {
    let file = TempFile::new(
        "type.json",
        r#"{ "pools": { "chat": { "max_queue_depth": "lots" } } }"#,
    );
    let error = SchedulerConfig::from_path(&file.0).unwrap_err().to_string();
    assert_eq!(
        error,
        "pools.chat.max_queue_depth: invalid type: string \"lots\", expected a whole number (0 or more)"
    );
    assert!(!error.contains("usize"), "{error}");
}

/// A yaque `path` that names a file, not a directory: the error names the field and says
/// what to give instead.
#[cfg(feature = "yaque")]
#[test]
fn a_yaque_path_that_cannot_be_opened_names_the_field_with_advice() {
    use prometheus_parking_lot::{
        build_pools_from_scheduler_config, PoolError, QueueBuilderContext, TaskExecutor,
        TaskMetadata, TokioSpawner,
    };

    #[derive(Clone)]
    struct Echo;

    #[async_trait::async_trait]
    impl TaskExecutor<String, String> for Echo {
        async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
            payload
        }
    }

    let not_a_directory = TempFile::new("queue-file", "");
    let config = SchedulerConfig::from_json_str(&format!(
        r#"{{ "pools": {{ "desktop": {{ "queue": {{ "type": "yaque", "path": {:?}, "stream": "llm" }} }} }} }}"#,
        not_a_directory.0.display().to_string()
    ))
    .expect("a valid configuration");
    let error = build_pools_from_scheduler_config::<String, String, Echo, TokioSpawner>(
        &config,
        &QueueBuilderContext::Embedded,
        None,
        |_name| Echo,
        TokioSpawner,
    )
    .err()
    .expect("the queue cannot be opened");
    let PoolError::InvalidConfig(text) = error else {
        panic!("not a configuration error: {error:?}");
    };
    assert!(
        text.starts_with("pools.desktop.queue.path: could not open the yaque stream llm in "),
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
