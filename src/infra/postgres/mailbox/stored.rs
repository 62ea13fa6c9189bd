//! A delivery as a row of the mailbox's table, and back: its status word, its result or
//! error as JSON, and the JSON records a store is given.

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};

use sea_orm::QueryResult;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::core::{Claim, Delivery, MailboxError, PoolError, TaskFailure, TaskStatus};
use crate::infra::postgres::codec::entry_to_sql;
use crate::infra::postgres::rows::JsonRows;
use crate::util::serde::MailboxKey;

use super::waiters::key_hash;

/// The word stored in `status`.
pub(super) fn status_word(status: &TaskStatus) -> &'static str {
    match status {
        TaskStatus::Completed => "completed",
        TaskStatus::Failed(_) => "failed",
        TaskStatus::Expired => "expired",
        TaskStatus::TimedOut => "timed_out",
        TaskStatus::Cancelled => "cancelled",
        _ => "other",
    }
}

pub(super) fn column<T: sea_orm::TryGetable>(
    row: &QueryResult,
    name: &str,
) -> Result<T, MailboxError> {
    row.try_get::<T>("", name).map_err(|error| {
        MailboxError::Backend(BackendFault::plain(
            FaultKind::Corrupt,
            format!("postgres mailbox row, column {name}: {error}"),
        ))
    })
}

/// Reads a delivery back. A row whose result no longer deserialises (the result type changed
/// between versions, say) becomes a failure that says so, rather than an error that would
/// leave the row stuck: the caller learns what happened, and the row is gone.
pub(super) fn delivery_of<R: DeserializeOwned>(
    row: &QueryResult,
) -> Result<Delivery<R>, MailboxError> {
    let task_id: i64 = column(row, "task_id")?;
    let stored_at_ms: i64 = column(row, "created_at_ms")?;
    let payload: Option<String> = column(row, "payload")?;
    let error: Option<String> = column(row, "error")?;
    let outcome = match (payload, error) {
        (_, Some(error)) => Err(stored_failure(&error)),
        (Some(payload), None) => serde_json::from_str::<R>(&payload).map_err(|e| {
            TaskFailure::Failed(format!("the stored result does not deserialise: {e}"))
        }),
        (None, None) => Err(TaskFailure::Failed(
            "the stored row holds neither a result nor an error".into(),
        )),
    };
    Ok(Delivery {
        task_id: task_id as u64,
        outcome,
        stored_at_ms: u128::try_from(stored_at_ms).unwrap_or(0),
    })
}

/// How a task ended, read back from its row's `error` column. Rows stored before outcomes
/// had a type of their own hold a [`PoolError`]; those read as the outcome they stand for.
pub(super) fn stored_failure(error: &str) -> TaskFailure {
    serde_json::from_str::<TaskFailure>(error)
        .or_else(|_| serde_json::from_str::<PoolError>(error).map(TaskFailure::from))
        .unwrap_or_else(|e| {
            TaskFailure::Failed(format!("the stored error does not deserialise: {e}"))
        })
}

/// A delivery's result or error as JSON text, for the `payload` and `error` columns.
pub(super) type EncodedOutcome = (Option<String>, Option<String>);

/// Encodes a delivery's outcome.
pub(super) fn encoded<R: Serialize>(
    delivery: &Delivery<R>,
) -> Result<EncodedOutcome, MailboxError> {
    match &delivery.outcome {
        Ok(result) => Ok((
            Some(serde_json::to_string(result).map_err(|e| {
                MailboxError::Backend(BackendFault::plain(
                    FaultKind::Refused,
                    format!("the result does not serialise: {e}"),
                ))
            })?),
            None,
        )),
        Err(error) => Ok((
            None,
            Some(serde_json::to_string(error).map_err(|e| {
                MailboxError::Backend(BackendFault::plain(
                    FaultKind::Refused,
                    format!("the error does not serialise: {e}"),
                ))
            })?),
        )),
    }
}

/// The columns a store writes, and their types in the JSON records it is given.
pub(super) const STORED_COLUMNS: &str =
    "tenant, user_id, session_id, task_id, created_at_ms, status, payload, error";
pub(super) const STORED_RECORD: &str =
    "tenant TEXT, user_id TEXT, session_id TEXT, task_id BIGINT, \
     created_at_ms BIGINT, status TEXT, payload JSONB, error JSONB";

/// The JSON records of a store, one per delivery that could be encoded, in order (so the
/// rows' ids, the order `take` follows, are the deliveries' order), with an answer per
/// delivery so far and the key hashes to wake.
pub(super) struct Rows {
    pub(super) json: JsonRows,
    pub(super) answers: Vec<Result<(), MailboxError>>,
    /// The hash of each encoded delivery's key, in order.
    pub(super) hashes: Vec<u64>,
    /// The hash of each delivery's key, `None` where it could not be encoded.
    pub(super) hash_of: Vec<Option<u64>>,
}

impl Rows {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            json: JsonRows::new(),
            answers: Vec::with_capacity(capacity),
            hashes: Vec::with_capacity(capacity),
            hash_of: Vec::with_capacity(capacity),
        }
    }

    /// Adds the record of one delivery, with the entry of its `claim`, if any; `false` when
    /// it cannot be encoded (its answer says why).
    pub(super) fn add<R: Serialize>(
        &mut self,
        key: &MailboxKey,
        delivery: &Delivery<R>,
        claim: Option<Claim>,
    ) -> bool {
        let (payload, error) = match encoded(delivery) {
            Ok(encoded) => encoded,
            Err(error) => {
                self.answers.push(Err(error));
                self.hash_of.push(None);
                return false;
            }
        };
        let row = self.json.row();
        row.text("tenant", Some(&key.tenant.0))
            .text("user_id", key.user_id.as_deref())
            .text("session_id", key.session_id.as_deref())
            .int("task_id", delivery.task_id as i64)
            .int(
                "created_at_ms",
                i64::try_from(delivery.stored_at_ms).unwrap_or(i64::MAX),
            )
            .text("status", Some(status_word(&delivery.status())))
            .json("payload", payload.as_deref())
            .json("error", error.as_deref());
        if let Some(claim) = claim {
            row.int("entry", entry_to_sql(claim.entry));
        }
        let hash = key_hash(key);
        self.hashes.push(hash);
        self.hash_of.push(Some(hash));
        self.answers.push(Ok(()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_stored_outcome_reads_back_in_the_current_form_and_the_earlier_one() {
        let stored = |failure: &TaskFailure| serde_json::to_string(failure).unwrap();
        for failure in [
            TaskFailure::TimedOut,
            TaskFailure::Failed("boom".into()),
            TaskFailure::Lost(Box::new(PoolError::Shutdown)),
        ] {
            assert_eq!(stored_failure(&stored(&failure)), failure);
        }
        // Rows written before outcomes had a type of their own hold a `PoolError`.
        assert_eq!(stored_failure(r#""Expired""#), TaskFailure::Expired);
        assert_eq!(
            stored_failure(r#""QueueFull""#),
            TaskFailure::Lost(Box::new(PoolError::QueueFull))
        );
        let TaskFailure::Failed(text) = stored_failure("not json") else {
            panic!("an unreadable row is a failure that says so");
        };
        assert!(text.contains("does not deserialise"), "{text}");
    }
}
