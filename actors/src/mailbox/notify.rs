//! Telling the outside world that a task ended: the [`TerminalEvent`] notifiers receive, the
//! [`Notifier`] contract (webhooks, metrics, audit), and how a pool turns its results into
//! JSON for them ([`ResultEncoder`]).
//!
//! Invariants: a notifier hears of a task only after its outcome is stored, so a receiver
//! that reacts by retrieving finds the result; `notify` never blocks the caller (the
//! scheduler or the mailbox actor), and results are encoded only when a pool has a notifier.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use serde::Serialize;

use super::{status_of, Delivery};
use crate::domain::{MailboxKey, TaskId, TaskStatus};
use crate::observe::trace::TraceParent;

/// Turns a completed task's result into JSON for notifiers; `None` when it does not
/// serialise. Set by whoever knows the result type serialises (the config builder), so
/// pools of results that hold channels simply send no result.
pub type ResultEncoder<R> = fn(&R) -> Option<serde_json::Value>;

/// The [`ResultEncoder`] of a result type that implements `Serialize`: its JSON, or `None`
/// when serialisation fails (a map with non-string keys, a failing `Serialize` impl).
///
/// ```
/// use prometheus_parking_lot_actors::mailbox::{json_result, ResultEncoder};
/// let encode: ResultEncoder<Vec<u32>> = json_result::<Vec<u32>>;
/// assert_eq!(encode(&vec![1, 2]), Some(serde_json::json!([1, 2])));
/// ```
pub fn json_result<R: Serialize>(result: &R) -> Option<serde_json::Value> {
    serde_json::to_value(result).ok()
}

/// A task's terminal event, as notifiers receive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalEvent {
    /// The pool the task ran in.
    pub pool: Arc<str>,
    /// Where its result is stored: tenant, user and session.
    pub key: MailboxKey,
    /// The task.
    pub task_id: TaskId,
    /// How it ended; `Failed` and `Rejected` carry the reason.
    pub status: TaskStatus,
    /// When its outcome was stored, milliseconds since the Unix epoch.
    pub stored_at_ms: u128,
    /// Which run of the task this was: 1, or for a task claimed from a shared queue the
    /// number of times that queue has handed it out (a re-run after a lost lease is 2).
    pub attempt: u32,
    /// The result as JSON: only for a completed task of a pool that has a
    /// [`ResultEncoder`], and only when the result serialised.
    pub result: Option<serde_json::Value>,
    /// The trace the task belongs to, if it carries one: a webhook sends it as its
    /// `traceparent` header.
    pub trace: Option<TraceParent>,
}

/// Which run of a task an outcome comes from, and the trace the task belongs to: what its
/// [`TerminalEvent`] says beside the outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunOf {
    /// See [`TerminalEvent::attempt`].
    pub attempt: u32,
    /// See [`TerminalEvent::trace`] (boxed: most tasks carry none, and an outcome's
    /// messages stay small).
    pub trace: Option<Box<TraceParent>>,
}

/// Receives every terminal event after its result is stored (webhooks, metrics, audit).
///
/// `notify` is called by the scheduler (in-memory mailbox) or the mailbox actor: it must
/// return at once, handing the event to a queue of its own; it never blocks or awaits
/// network I/O there.
#[async_trait]
pub trait Notifier: Send + Sync {
    /// Takes note of one event.
    fn notify(&self, event: &TerminalEvent);

    /// Called when a pool using this notifier shuts down, after its last event was handed
    /// over: finish delivering what is pending, giving up at `deadline` (`None`: no
    /// deadline). The default has nothing pending.
    async fn flush(&self, deadline: Option<Instant>) {
        let _ = deadline;
    }
}

/// A pool's notifiers and the encoder for its results.
pub(crate) struct Notifiers<R> {
    /// Who hears of terminal events.
    listeners: Vec<Arc<dyn Notifier>>,
    /// How results become JSON for them, if they can.
    encoder: Option<ResultEncoder<R>>,
}

impl<R> Clone for Notifiers<R> {
    fn clone(&self) -> Self {
        Self {
            listeners: self.listeners.clone(),
            encoder: self.encoder,
        }
    }
}

impl<R> Notifiers<R> {
    pub fn new(listeners: Vec<Arc<dyn Notifier>>, encoder: Option<ResultEncoder<R>>) -> Self {
        Self { listeners, encoder }
    }

    /// None: the pool's results are stored and nobody is told.
    pub fn none() -> Self {
        Self::new(Vec::new(), None)
    }

    /// The event for `delivery`, built before it is stored (the result moves into the
    /// mailbox); `None`, at the cost of one branch, when nobody listens.
    pub fn event_for(
        &self,
        pool: &Arc<str>,
        key: &MailboxKey,
        delivery: &Delivery<R>,
        run: RunOf,
    ) -> Option<TerminalEvent> {
        if self.listeners.is_empty() {
            return None;
        }
        let result = match (&delivery.outcome, self.encoder) {
            // The encoder is the application's code: a panic in it costs the event its
            // result, not the results waiting with it in the mailbox actor.
            (Ok(result), Some(encode)) => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| encode(result)))
                    .unwrap_or_else(|_| {
                        tracing::error!(task_id = delivery.task_id, "the result encoder panicked");
                        None
                    })
            }
            _ => None,
        };
        Some(TerminalEvent {
            pool: pool.clone(),
            key: key.clone(),
            task_id: delivery.task_id,
            status: status_of(&delivery.outcome),
            stored_at_ms: delivery.stored_at_ms,
            attempt: run.attempt,
            result,
            trace: run.trace.map(|trace| *trace),
        })
    }

    /// Hands a stored delivery's event to every notifier. A notifier that panics is logged
    /// and the others still hear of the event (a notifier is the application's code; the
    /// mailbox actor holds other results while it runs).
    pub fn notify(&self, event: &TerminalEvent) {
        for listener in &self.listeners {
            let heard =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| listener.notify(event)));
            if heard.is_err() {
                tracing::error!(pool = %event.pool, task_id = event.task_id, "a notifier panicked");
            }
        }
    }
}
