//! Validation of a [`SchedulerConfig`]: every rule, and the error that names the field.
//!
//! Each error says which field is wrong (a dotted path such as
//! `pools.llm_inference.queue.queue_name`), what was found, and what is allowed. The rules:
//!
//! | field | allowed |
//! |---|---|
//! | `pools` | at least one pool |
//! | pool names | 1–64 of `a-z A-Z 0-9 _ -` |
//! | `worker_threads` | 1 – 1,024 |
//! | `thread_stack_size` | 64 KiB – 1 GiB |
//! | `max_units` | 1 – 4,294,967,295, or `"auto"` |
//! | `max_queue_depth` | 1 – 100,000,000 |
//! | `default_timeout_secs` / `_ms` | one of them, 1 ms – 7 days |
//! | `starvation.max_park_ms` | 1 ms – 1 day |
//! | `starvation.max_skips` | 1 – 1,000,000 |
//! | `queue.path` (yaque) | not empty |
//! | `queue.stream` (yaque) | 1–64 of `a-z A-Z 0-9 _ -` |
//! | `queue.table`, `queue.queue_name`, `mailbox.storage.table` | SQL identifiers: a letter or `_`, then letters, digits or `_`; at most 63 (47 for pgmq queues, whose tables add a prefix) |
//! | `mailbox.retention_secs` | 1 s – 365 days |
//! | `mailbox.storage.max_messages` | 1 – 100,000,000 |
//! | `mailbox.notifier.base_url` | an `http://` or `https://` URL with a host |
//! | `mailbox.notifier.timeout_ms` | 1 ms – 5 min |
//! | `mailbox.notifier.max_retries` | 0 – 100 |
//! | across pools | no two pools share a yaque stream, a Postgres queue or a pgmq queue |
//!
//! Unknown fields, wrong types and unknown `type` values are reported while reading, with
//! the same field paths.

use std::collections::HashMap;
use std::fmt::Display;

use thiserror::Error;

use super::file::{
    MailboxSettings, MaxUnits, NotifierSettings, PoolSettings, QueueSettings, SchedulerConfig,
    StorageSettings,
};
use crate::core::PoolError;

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A field is wrong: `path` names it, `problem` says what is allowed.
    #[error("{path}: {problem}")]
    Invalid {
        /// The dotted path of the field, like `pools.llm.max_units`.
        path: String,
        /// What is wrong and what is allowed.
        problem: String,
    },
    /// The text is not valid JSON or YAML.
    #[error("not valid {format}: {reason}")]
    Syntax {
        /// `JSON` or `YAML`.
        format: &'static str,
        /// The parser's message, with its position.
        reason: String,
    },
    /// The file could not be read.
    #[error("cannot read {file}: {reason}")]
    Unreadable {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },
    /// The file's extension names no known format.
    #[error("{file}: unknown configuration format; use a .json, .yaml or .yml file")]
    UnknownFormat {
        /// The file.
        file: String,
    },
}

impl ConfigError {
    /// An error about one field.
    pub fn invalid(path: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.into(),
            problem: problem.into(),
        }
    }
}

impl From<ConfigError> for PoolError {
    fn from(error: ConfigError) -> Self {
        PoolError::InvalidConfig(error.to_string())
    }
}

const MAX_WORKERS: usize = 1_024;
const MIN_STACK: usize = 64 * 1024;
const MAX_STACK: usize = 1024 * 1024 * 1024;
const MAX_DEPTH: usize = 100_000_000;
const MAX_TIMEOUT_MS: u64 = 7 * 24 * 3_600 * 1_000;
const MAX_PARK_MS: u64 = 24 * 3_600 * 1_000;
const MAX_SKIPS: u32 = 1_000_000;
const MAX_RETENTION_SECS: u64 = 365 * 24 * 3_600;
const MAX_NOTIFY_TIMEOUT_MS: u64 = 5 * 60 * 1_000;
const MAX_RETRIES: u32 = 100;
const MAX_IDENTIFIER: usize = 63;
const MAX_PGMQ_QUEUE: usize = 47;

impl SchedulerConfig {
    /// Checks every rule of the module docs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.pools.is_empty() {
            return Err(ConfigError::invalid(
                "pools",
                "no pool is defined; define at least one",
            ));
        }
        for (name, pool) in &self.pools {
            let path = format!("pools.{name}");
            check_name(&path, "pool names", name)?;
            pool.validate(&path)?;
        }
        self.check_shared_queues()
    }

    /// Two pools on one queue would take each other's tasks.
    fn check_shared_queues(&self) -> Result<(), ConfigError> {
        let mut owners: HashMap<String, &str> = HashMap::new();
        for (name, pool) in &self.pools {
            let queue = match &pool.queue {
                QueueSettings::InMemory => continue,
                QueueSettings::Yaque { path, stream } => format!("yaque stream {stream} in {path}"),
                QueueSettings::Postgres { table, queue_name } => format!(
                    "Postgres queue {} in table {table}",
                    queue_name.as_deref().unwrap_or(name)
                ),
                QueueSettings::PostgresPgmq { queue_name } => format!("pgmq queue {queue_name}"),
            };
            if let Some(other) = owners.insert(queue.clone(), name) {
                return Err(ConfigError::invalid(
                    format!("pools.{name}.queue"),
                    format!("pool {other} uses the {queue} already; give each pool its own queue"),
                ));
            }
        }
        Ok(())
    }
}

impl PoolSettings {
    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        if let Some(workers) = self.worker_threads {
            in_range(path, "worker_threads", workers, 1, MAX_WORKERS)?;
        }
        if let Some(stack) = self.thread_stack_size {
            in_range(path, "thread_stack_size", stack, MIN_STACK, MAX_STACK)?;
        }
        if let MaxUnits::Units(units) = self.max_units {
            if units == 0 || units > u64::from(u32::MAX) {
                return Err(ConfigError::invalid(
                    format!("{path}.max_units"),
                    format!(
                        "{units} is out of range; use 1 to {} units, or \"auto\"",
                        u32::MAX
                    ),
                ));
            }
        }
        if let Some(depth) = self.max_queue_depth {
            in_range(path, "max_queue_depth", depth, 1, MAX_DEPTH)?;
        }
        self.validate_timeout(path)?;
        if let Some(starvation) = &self.starvation {
            if let Some(park) = starvation.max_park_ms {
                in_range(path, "starvation.max_park_ms", park, 1, MAX_PARK_MS)?;
            }
            if let Some(skips) = starvation.max_skips {
                in_range(path, "starvation.max_skips", skips, 1, MAX_SKIPS)?;
            }
        }
        validate_queue(&format!("{path}.queue"), &self.queue)?;
        validate_mailbox(&format!("{path}.mailbox"), &self.mailbox)
    }

    fn validate_timeout(&self, path: &str) -> Result<(), ConfigError> {
        match (self.default_timeout_secs, self.default_timeout_ms) {
            (Some(_), Some(_)) => Err(ConfigError::invalid(
                format!("{path}.default_timeout_ms"),
                "default_timeout_secs is set too; set only one of the two",
            )),
            (Some(secs), None) => in_range(
                path,
                "default_timeout_secs",
                secs,
                1,
                MAX_TIMEOUT_MS / 1_000,
            ),
            (None, Some(ms)) => in_range(path, "default_timeout_ms", ms, 1, MAX_TIMEOUT_MS),
            (None, None) => Ok(()),
        }
    }
}

fn validate_queue(path: &str, queue: &QueueSettings) -> Result<(), ConfigError> {
    match queue {
        QueueSettings::InMemory => Ok(()),
        QueueSettings::Yaque { path: dir, stream } => {
            if dir.trim().is_empty() {
                return Err(ConfigError::invalid(
                    format!("{path}.path"),
                    "is empty; give the directory of the queue files",
                ));
            }
            check_name(&format!("{path}.stream"), "stream names", stream)
        }
        QueueSettings::Postgres { table, queue_name } => {
            check_identifier(&format!("{path}.table"), table, MAX_IDENTIFIER)?;
            match queue_name {
                Some(queue_name) => {
                    check_identifier(&format!("{path}.queue_name"), queue_name, MAX_IDENTIFIER)
                }
                None => Ok(()),
            }
        }
        QueueSettings::PostgresPgmq { queue_name } => {
            check_identifier(&format!("{path}.queue_name"), queue_name, MAX_PGMQ_QUEUE)
        }
    }
}

fn validate_mailbox(path: &str, mailbox: &MailboxSettings) -> Result<(), ConfigError> {
    if let Some(retention) = mailbox.retention_secs {
        in_range(path, "retention_secs", retention, 1, MAX_RETENTION_SECS)?;
    }
    match &mailbox.storage {
        StorageSettings::InMemory {
            max_messages: Some(max),
        } => {
            in_range(path, "storage.max_messages", *max, 1, MAX_DEPTH)?;
        }
        StorageSettings::InMemory { max_messages: None } => {}
        StorageSettings::Postgres { table } => {
            check_identifier(&format!("{path}.storage.table"), table, MAX_IDENTIFIER)?;
        }
    }
    let Some(NotifierSettings::Http {
        base_url,
        timeout_ms,
        max_retries,
        ..
    }) = &mailbox.notifier
    else {
        return Ok(());
    };
    check_url(&format!("{path}.notifier.base_url"), base_url)?;
    if let Some(timeout) = timeout_ms {
        in_range(
            path,
            "notifier.timeout_ms",
            *timeout,
            1,
            MAX_NOTIFY_TIMEOUT_MS,
        )?;
    }
    if let Some(retries) = max_retries {
        in_range(path, "notifier.max_retries", *retries, 0, MAX_RETRIES)?;
    }
    Ok(())
}

fn in_range<T: PartialOrd + Display>(
    path: &str,
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::invalid(
            format!("{path}.{field}"),
            format!("{value} is out of range; use {min} to {max}"),
        ));
    }
    Ok(())
}

/// Names that end up in thread names and file names.
fn check_name(path: &str, what: &str, name: &str) -> Result<(), ConfigError> {
    let valid = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if valid {
        return Ok(());
    }
    Err(ConfigError::invalid(
        path,
        format!("{name:?} is not allowed; {what} are 1 to 64 of the characters a-z A-Z 0-9 _ -"),
    ))
}

/// Table and queue names go into SQL: only plain identifiers, never quoted text.
fn check_identifier(path: &str, name: &str, max_len: usize) -> Result<(), ConfigError> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= max_len;
    if valid {
        return Ok(());
    }
    Err(ConfigError::invalid(
        path,
        format!(
            "{name:?} is not a safe SQL identifier; use a letter or '_' followed by letters, digits or '_', at most {max_len} characters"
        ),
    ))
}

fn check_url(path: &str, url: &str) -> Result<(), ConfigError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let host = rest.map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
    match host {
        Some(host) if !host.is_empty() && !host.contains(char::is_whitespace) => Ok(()),
        _ => Err(ConfigError::invalid(
            path,
            format!("{url:?} is not a URL; use http://host/path or https://host/path"),
        )),
    }
}
