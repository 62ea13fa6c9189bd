//! The engine's values as the queues store them, and back: entry ids, priorities and times as
//! SQL numbers, tasks as JSON rows to park ([`ParkRows`]), and tasks read back from a row.

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};
use std::time::Duration;

use sea_orm::QueryResult;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::rows::JsonRows;
use crate::core::{Carried, EntryId, QueueError, ScheduledTask, TaskMetadata, TraceParent};
use crate::util::serde::{MailboxKey, Priority};

/// How long a queue that keeps callers unique remembers a caller whose task completed, ms:
/// a resubmission racing with the end meets it (see
/// [`UniqueCallers::keep_callers_unique`](crate::core::UniqueCallers::keep_callers_unique)).
pub(crate) const REMEMBER_ENDED_MS: i64 = 60_000;

/// Now on the database's clock, ms since the Unix epoch (a SQL expression).
pub(crate) const DATABASE_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Entry ids are unsigned; the columns are signed. Flipping the top bit keeps their order.
pub(crate) fn entry_to_sql(entry: EntryId) -> i64 {
    (entry ^ (1 << 63)) as i64
}

/// The entry id an [`entry_to_sql`] value stands for.
pub(crate) fn entry_from_sql(entry: i64) -> EntryId {
    (entry as u64) ^ (1 << 63)
}

/// Entries as a SQL array literal (`{1,2,3}`), for one `$entries::bigint[]` parameter.
pub(crate) fn entries_to_sql(entries: &[EntryId]) -> String {
    let listed: Vec<String> = entries
        .iter()
        .map(|&entry| entry_to_sql(entry).to_string())
        .collect();
    format!("{{{}}}", listed.join(","))
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

/// A count as a `BIGINT`, saturating.
pub(crate) fn count_to_sql(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Reads column `name` of a row of `backend`'s queue.
pub(crate) fn column<T: sea_orm::TryGetable>(
    backend: &str,
    row: &QueryResult,
    name: &str,
) -> Result<T, QueueError> {
    row.try_get::<T>("", name).map_err(|error| {
        QueueError::Backend(BackendFault::plain(
            FaultKind::Corrupt,
            format!("{backend} queue row, column {name}: {error}"),
        ))
    })
}

/// Reads a task back from its metadata and payload, both JSON text in the row's columns
/// `metadata` and `payload`; the error says which part could not be read.
pub(crate) fn task_of<P: DeserializeOwned>(row: &QueryResult) -> Result<ScheduledTask<P>, String> {
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

/// The trace of a claimed row, from its column `traceparent` (`NULL`: none). A text that is
/// no `traceparent` (written by hand, say) is dropped with a warning: the task runs all the
/// same, in a trace of its own.
pub(crate) fn trace_of(backend: &str, row: &QueryResult) -> Option<TraceParent> {
    let text = row.try_get::<Option<String>>("", "traceparent").ok()??;
    match text.parse() {
        Ok(trace) => Some(trace),
        Err(error) => {
            tracing::warn!(backend, %error, "a claimed task's stored trace is unreadable; it runs in a trace of its own");
            None
        }
    }
}

/// The record of one task in a [`ParkRows`] array, as `jsonb_to_recordset` reads it.
pub(crate) const PARK_RECORD: &str = "entry BIGINT, task_id BIGINT, tenant TEXT, user_id TEXT, \
     session_id TEXT, priority SMALLINT, kind SMALLINT, units BIGINT, created_at_ms BIGINT, \
     rank_time_ms BIGINT, deadline_ms BIGINT, metadata JSONB, payload JSONB, attach BOOLEAN, \
     not_before_ms BIGINT, traceparent TEXT";

/// Tasks to park, written as one JSON array of [`PARK_RECORD`]s: a park statement takes any
/// number of them in one `$rows` parameter, so its text is the same for any group and the
/// server prepares it once. Each task is encoded as it is pushed, before any await (payloads
/// need not be `Sync`).
pub(crate) struct ParkRows {
    backend: &'static str,
    rows: JsonRows,
    /// Whether the rows' callers are kept unique (`attach`).
    attach: bool,
}

impl ParkRows {
    /// No rows yet, for `backend`'s queue (named in errors).
    pub(crate) fn new(backend: &'static str) -> Self {
        Self {
            backend,
            rows: JsonRows::new(),
            attach: false,
        }
    }

    /// The same rows, marked as rows whose callers the queue keeps unique (see
    /// [`UniqueCallers::keep_callers_unique`](crate::core::UniqueCallers::keep_callers_unique)).
    pub(crate) fn attaching(mut self, attach: bool) -> Self {
        self.attach = attach;
        self
    }

    /// Adds `task` as entry `entry`, ranked at `rank_time_ms`; an error (and no row) when its
    /// metadata or payload does not serialise.
    pub(crate) fn push<P: Serialize>(
        &mut self,
        entry: EntryId,
        rank_time_ms: u64,
        task: &ScheduledTask<P>,
    ) -> Result<(), QueueError> {
        self.push_carrying(entry, rank_time_ms, task, Carried::default())
    }

    /// [`push`](Self::push), with what the task carries: the instant before which no node
    /// may claim it (a scheduled start) and its trace, each `NULL` without one.
    pub(crate) fn push_carrying<P: Serialize>(
        &mut self,
        entry: EntryId,
        rank_time_ms: u64,
        task: &ScheduledTask<P>,
        carried: Carried,
    ) -> Result<(), QueueError> {
        let encode = |what: &str, error: serde_json::Error| {
            QueueError::Backend(BackendFault::plain(
                FaultKind::Refused,
                format!(
                    "{} queue: the task's {what} does not serialise: {error}",
                    self.backend
                ),
            ))
        };
        let metadata = serde_json::to_string(&task.meta).map_err(|e| encode("metadata", e))?;
        let payload = serde_json::to_string(&task.payload).map_err(|e| encode("payload", e))?;
        let traceparent = carried.trace.map(|trace| trace.to_string());
        let meta = &task.meta;
        let key = meta.mailbox.clone().unwrap_or_else(|| MailboxKey::new(""));
        self.rows
            .row()
            .int("entry", entry_to_sql(entry))
            .int("task_id", meta.id as i64)
            .text("tenant", Some(&key.tenant.0))
            .text("user_id", key.user_id.as_deref())
            .text("session_id", key.session_id.as_deref())
            .int("priority", i64::from(priority_to_sql(meta.priority)))
            .int("kind", meta.cost.kind.index() as i64)
            .int("units", i64::from(meta.cost.units))
            .int("created_at_ms", millis(meta.created_at_ms))
            .int("rank_time_ms", millis_u64(rank_time_ms))
            .int_or_null("deadline_ms", meta.deadline_ms.map(millis))
            .json("metadata", Some(&metadata))
            .json("payload", Some(&payload))
            .json("attach", Some(if self.attach { "true" } else { "false" }))
            .int_or_null("not_before_ms", carried.not_before_ms.map(millis_u64))
            .text("traceparent", traceparent.as_deref());
        Ok(())
    }

    /// The array.
    pub(crate) fn finish(self) -> String {
        self.rows.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_their_order_as_sql_numbers() {
        let entries = [0, 1, 1 << 63, u64::MAX];
        let stored: Vec<i64> = entries.iter().map(|&entry| entry_to_sql(entry)).collect();
        assert!(
            stored.windows(2).all(|pair| pair[0] < pair[1]),
            "{stored:?}"
        );
        for entry in entries {
            assert_eq!(entry_from_sql(entry_to_sql(entry)), entry);
        }
        assert_eq!(
            entries_to_sql(&[0, u64::MAX]),
            format!("{{{},{}}}", i64::MIN, i64::MAX)
        );
    }
}
