//! What the queue backends on PostgreSQL share: statements run with a named error, the
//! conversions between the engine's numbers and SQL columns, and a task encoded for storage.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr, QueryResult, Value};
use serde::Serialize;

use super::{backend_error, PgDatabase};
use crate::core::{EntryId, QueueError, ScheduledTask, TaskMetadata};
use crate::util::serde::Priority;

impl PgDatabase {
    /// Runs a statement that changes rows; returns how many it changed. `what` names the
    /// operation in the error.
    pub(crate) async fn execute_as(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<u64, QueueError> {
        self.run(move |db| async move { db.execute_raw(PgDatabase::statement(sql, values)).await })
            .await
            .map(|done| done.rows_affected())
            .map_err(db_error(what))
    }

    /// Runs a statement that returns at most one row.
    pub(crate) async fn query_one_as(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Option<QueryResult>, QueueError> {
        self.run(
            move |db| async move { db.query_one_raw(PgDatabase::statement(sql, values)).await },
        )
        .await
        .map_err(db_error(what))
    }

    /// Runs a statement that returns rows.
    pub(crate) async fn query_all_as(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Vec<QueryResult>, QueueError> {
        self.run(
            move |db| async move { db.query_all_raw(PgDatabase::statement(sql, values)).await },
        )
        .await
        .map_err(db_error(what))
    }
}

/// Entry ids are unsigned; the columns are signed. Flipping the top bit keeps their order.
pub(crate) fn entry_to_sql(entry: EntryId) -> i64 {
    (entry ^ (1 << 63)) as i64
}

/// The entry id an [`entry_to_sql`] value stands for.
pub(crate) fn entry_from_sql(entry: i64) -> EntryId {
    (entry as u64) ^ (1 << 63)
}

/// A priority as a small number, higher first.
pub(crate) fn priority_to_sql(priority: Priority) -> i16 {
    match priority {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
        Priority::Critical => 3,
    }
}

/// Milliseconds as a `BIGINT`, saturating.
pub(crate) fn millis(value: u128) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Milliseconds as a `BIGINT`, saturating.
pub(crate) fn millis_u64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A duration in milliseconds as a `BIGINT`, saturating.
pub(crate) fn duration_ms(value: Duration) -> i64 {
    i64::try_from(value.as_millis()).unwrap_or(i64::MAX)
}

/// Turns a database error into a queue error naming the operation.
pub(crate) fn db_error(what: &str) -> impl Fn(DbErr) -> QueueError + '_ {
    move |error| QueueError::Backend(backend_error(what, &error))
}

/// Reads column `name` of a row of `backend`'s queue.
pub(crate) fn column<T: sea_orm::TryGetable>(
    backend: &str,
    row: &QueryResult,
    name: &str,
) -> Result<T, QueueError> {
    row.try_get::<T>("", name).map_err(|error| {
        QueueError::Backend(format!("{backend} queue row, column {name}: {error}"))
    })
}

/// A task as a queue stores it, encoded before any await (payloads need not be `Sync`).
pub(crate) struct Encoded {
    /// The task's metadata.
    pub meta: TaskMetadata,
    /// The metadata as JSON text.
    pub metadata: String,
    /// The payload as JSON text.
    pub payload: String,
}

impl Encoded {
    /// Encodes `task` for `backend`'s queue.
    pub(crate) fn new<P: Serialize>(
        backend: &str,
        task: &ScheduledTask<P>,
    ) -> Result<Self, QueueError> {
        let encode = |what: &str, error: serde_json::Error| {
            QueueError::Backend(format!(
                "{backend} queue: the task's {what} does not serialise: {error}"
            ))
        };
        Ok(Self {
            meta: task.meta.clone(),
            metadata: serde_json::to_string(&task.meta).map_err(|e| encode("metadata", e))?,
            payload: serde_json::to_string(&task.payload).map_err(|e| encode("payload", e))?,
        })
    }
}

/// Reads a task back from its metadata and payload, both JSON text in the row's columns
/// `metadata` and `payload`.
pub(crate) fn task_of<P: serde::de::DeserializeOwned>(
    row: &QueryResult,
) -> Result<ScheduledTask<P>, String> {
    let text = |column: &str| {
        row.try_get::<String>("", column)
            .map_err(|error| format!("column {column}: {error}"))
    };
    let meta: TaskMetadata = serde_json::from_str(&text("metadata")?)
        .map_err(|error| format!("metadata does not deserialise: {error}"))?;
    let payload: P = serde_json::from_str(&text("payload")?)
        .map_err(|error| format!("payload does not deserialise: {error}"))?;
    Ok(ScheduledTask { meta, payload })
}
