//! The JSON body of one webhook notification.

use serde::Serialize;

use crate::core::{TaskStatus, TerminalEvent};

/// What a receiver gets for one terminal event. Field order is the wire order.
#[derive(Serialize)]
struct WebhookBody<'a> {
    delivery_id: &'a str,
    pool: &'a str,
    task_id: u64,
    tenant: &'a str,
    user_id: Option<&'a str>,
    session_id: Option<&'a str>,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    stored_at_ms: u128,
    attempt: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a serde_json::Value>,
}

/// The body for `event`, as the bytes every attempt sends (and signs).
pub(crate) fn encode(event: &TerminalEvent, delivery_id: &str) -> serde_json::Result<Vec<u8>> {
    let (status, error) = status_and_error(&event.status);
    serde_json::to_vec(&WebhookBody {
        delivery_id,
        pool: &event.pool,
        task_id: event.task_id,
        tenant: &event.key.tenant.0,
        user_id: event.key.user_id.as_deref(),
        session_id: event.key.session_id.as_deref(),
        status,
        error,
        stored_at_ms: event.stored_at_ms,
        attempt: event.attempt,
        result: event.result.as_ref(),
    })
}

/// The wire name of a terminal status, and the reason of a failure or rejection.
fn status_and_error(status: &TaskStatus) -> (&'static str, Option<&str>) {
    match status {
        TaskStatus::Completed => ("completed", None),
        TaskStatus::Failed(reason) => ("failed", Some(reason)),
        TaskStatus::Expired => ("expired", None),
        TaskStatus::TimedOut => ("timed_out", None),
        TaskStatus::Cancelled => ("cancelled", None),
        TaskStatus::Rejected(reason) => ("rejected", Some(reason)),
        // Not terminal: never stored, so never notified; named plainly all the same.
        TaskStatus::Parked => ("parked", None),
        TaskStatus::Running => ("running", None),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value};

    use super::*;
    use crate::util::serde::MailboxKey;

    fn event(status: TaskStatus, result: Option<Value>) -> TerminalEvent {
        TerminalEvent {
            pool: Arc::from("chat"),
            key: MailboxKey::new("acme").with_user("ada"),
            task_id: 7,
            status,
            stored_at_ms: 1_700_000_000_000,
            attempt: 1,
            result,
            trace: None,
        }
    }

    fn decoded(event: &TerminalEvent) -> Value {
        serde_json::from_slice(&encode(event, "d1").unwrap()).unwrap()
    }

    #[test]
    fn a_completed_task_sends_its_result_and_no_error() {
        let body = decoded(&event(TaskStatus::Completed, Some(json!({"text": "hi"}))));
        assert_eq!(
            body,
            json!({
                "delivery_id": "d1", "pool": "chat", "task_id": 7, "tenant": "acme",
                "user_id": "ada", "session_id": null, "status": "completed",
                "stored_at_ms": 1_700_000_000_000u64, "attempt": 1, "result": {"text": "hi"}
            })
        );
    }

    #[test]
    fn failures_and_rejections_carry_their_reason_and_no_result() {
        let failed = decoded(&event(TaskStatus::Failed("boom".into()), None));
        assert_eq!(
            (&failed["status"], &failed["error"]),
            (&json!("failed"), &json!("boom"))
        );
        assert!(failed.get("result").is_none());
        let rejected = decoded(&event(TaskStatus::Rejected("queue full".into()), None));
        assert_eq!(
            (&rejected["status"], &rejected["error"]),
            (&json!("rejected"), &json!("queue full"))
        );
    }

    #[test]
    fn every_terminal_status_has_its_wire_name() {
        for (status, name) in [
            (TaskStatus::Completed, "completed"),
            (TaskStatus::Failed("x".into()), "failed"),
            (TaskStatus::Expired, "expired"),
            (TaskStatus::TimedOut, "timed_out"),
            (TaskStatus::Cancelled, "cancelled"),
            (TaskStatus::Rejected("x".into()), "rejected"),
        ] {
            let body = decoded(&event(status, None));
            assert_eq!(body["status"], name);
            assert_eq!(
                body.get("error").is_some(),
                matches!(name, "failed" | "rejected")
            );
        }
    }
}
