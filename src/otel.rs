//! OpenTelemetry traces of every task (the `otel` feature): one trace from the submitter's
//! call to the result, across nodes.
//!
//! A pool built with this feature reports to the process's global tracer provider
//! (`opentelemetry::global::set_tracer_provider`); with none installed it makes no span and
//! its tasks carry no trace, so the feature costs a branch per step. The spans of a task:
//!
//! ```text
//! (the submitter's span: an HTTP request's, or the context given as a traceparent)
//! └── submit          pool, task id, tenant, priority, cost; ends with the admission answer
//!     ├── wait        from parking to start: why it waited (as `why_waiting` names it),
//!     │               the budget's refill time when it waited for one
//!     ├── claim       a shared queue's claim: the node, the attempt
//!     ├── run         attempt, outcome; a failed run that is retried says why
//!     ├── wait        the retry's backoff ("sleeping"), then the wait for capacity
//!     ├── run         attempt 2
//!     ├── deliver     from the end to the result stored in the mailbox
//!     └── webhook     each HTTP attempt: status code, attempt
//! ```
//!
//! The submitter's context is, in this order: the `traceparent` given in
//! [`SubmitOptions::trace`](crate::core::SubmitOptions), the current OpenTelemetry context,
//! the current `tracing` span (through `tracing-opentelemetry`). A task stores the `submit`
//! span's context with itself (the Postgres row, the yaque entry), so a node that claims it,
//! or a pool that resumes it after a restart, adds its spans to the same trace. Times are the
//! scheduler's own (when it parked, started, ended a task), so a wait is a span although no
//! code runs during it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceState,
};
use opentelemetry::{global, Context, KeyValue};
use prometheus_parking_lot_actors::mailbox::{Notifier, TerminalEvent};
use prometheus_parking_lot_actors::observe::events::{EventSubscriber, TaskEvent, TaskStep};
use prometheus_parking_lot_actors::observe::trace::{SubmitSpan, TaskTracer, TraceParent};
use prometheus_parking_lot_actors::util::clock::engine_ms;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::core::{PoolError, TaskMetadata, TaskStatus};
use crate::util::serde::{MailboxKey, TaskId};

/// The instrumentation scope's name spans are reported under.
pub const SCOPE: &str = "prometheus_parking_lot";

/// A pool's tracing: makes each submission's span ([`TaskTracer`]), the spans of each
/// task's steps from the scheduler's events ([`EventSubscriber`]) and the span of each
/// delivery ([`Notifier`]). One per pool; built by the pool's constructors.
pub(crate) struct PoolTracing {
    pool: Arc<str>,
    /// This node's name in a shared queue's claims, if the pool is a node of one.
    node: Option<String>,
    /// The open wait or run of each traced task this node holds.
    open: Mutex<HashMap<(TraceParent, TaskId), Open>>,
}

/// What is open of a task: the wait it parked for, or the run it started.
#[derive(Debug, Clone, Copy)]
enum Open {
    Wait {
        since_ms: u64,
        reason: Option<&'static str>,
        /// When the budget it waits for will hold its units, if it waits for one.
        budget_ready_ms: Option<u64>,
        attempt: u32,
    },
    Run {
        since_ms: u64,
        attempt: u32,
    },
}

impl PoolTracing {
    /// The tracing of pool `pool`, a node named `node` of a shared queue if it is one.
    pub(crate) fn new(pool: &str, node: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            pool: pool.into(),
            node,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A span `name` of `trace`, from `start_ms` to `end_ms` (ms since the epoch), with
    /// `attributes` and, if it failed, an error `status`.
    fn record(
        &self,
        trace: &TraceParent,
        name: &'static str,
        (start_ms, end_ms): (u64, u64),
        attributes: Vec<KeyValue>,
        error: Option<String>,
    ) {
        let tracer = global::tracer(SCOPE);
        let mut all = vec![KeyValue::new("pool", self.pool.to_string())];
        all.extend(attributes);
        let mut span = SpanBuilder::from_name(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(at(start_ms))
            .with_attributes(all)
            .start_with_context(&tracer, &remote_parent(trace));
        if let Some(error) = error {
            span.set_status(Status::error(error));
        }
        span.end_with_timestamp(at(end_ms.max(start_ms)));
    }

    /// Ends what is open of task `id` at `at_ms`: its wait, or its run with `outcome`.
    fn close(&self, trace: &TraceParent, open: Open, at_ms: u64, outcome: Outcome<'_>) {
        match open {
            Open::Wait {
                since_ms,
                reason,
                budget_ready_ms,
                attempt,
            } => {
                let mut attributes = vec![KeyValue::new("attempt", i64::from(attempt))];
                attributes.extend(reason.map(|reason| KeyValue::new("wait.reason", reason)));
                attributes.extend(
                    budget_ready_ms.map(|ms| KeyValue::new("budget.ready_at_ms", ms as i64)),
                );
                if let Outcome::Ended(status) = outcome {
                    attributes.push(KeyValue::new("outcome", status_name(status)));
                }
                self.record(trace, "wait", (since_ms, at_ms), attributes, None);
            }
            Open::Run { since_ms, attempt } => {
                let mut attributes = vec![KeyValue::new("attempt", i64::from(attempt))];
                let error = match outcome {
                    Outcome::Ended(status) => {
                        attributes.push(KeyValue::new("outcome", status_name(status)));
                        (!matches!(status, TaskStatus::Completed))
                            .then(|| status_name(status).into())
                    }
                    Outcome::Retried(reason) => {
                        attributes.push(KeyValue::new("outcome", "retried"));
                        attributes.push(KeyValue::new("retry.reason", reason.to_owned()));
                        Some(format!("retried: {reason}"))
                    }
                    Outcome::LeaseLost => {
                        attributes.push(KeyValue::new("outcome", "lease_lost"));
                        Some("the claim's lease ran out".into())
                    }
                    Outcome::Started => None,
                };
                self.record(trace, "run", (since_ms, at_ms), attributes, error);
            }
        }
    }

    fn opened(&self) -> std::sync::MutexGuard<'_, HashMap<(TraceParent, TaskId), Open>> {
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How what is open of a task ends.
#[derive(Clone, Copy)]
enum Outcome<'a> {
    /// It started (a wait ends).
    Started,
    /// It ended in this state.
    Ended(&'a TaskStatus),
    /// Its run failed and is retried, for this reason.
    Retried(&'a str),
    /// Its claim was lost.
    LeaseLost,
}

impl EventSubscriber for PoolTracing {
    fn on_event(&self, event: &TaskEvent<'_>) {
        let Some(trace) = event.trace else {
            return;
        };
        let key = (*trace, event.task_id);
        let attempt = event.attempt.unwrap_or(1);
        let mut open = self.opened();
        let event_ms = engine_ms(event.at_ms);
        match event.step {
            TaskStep::Parked => {
                let wait = Open::Wait {
                    since_ms: event_ms,
                    reason: event.wait_reason,
                    budget_ready_ms: None,
                    attempt,
                };
                open.insert(key, wait);
            }
            TaskStep::WaitsForBudget { until_ms } => {
                if let Some(Open::Wait {
                    budget_ready_ms, ..
                }) = open.get_mut(&key)
                {
                    *budget_ready_ms = Some(engine_ms(*until_ms));
                }
            }
            TaskStep::WaitsForParents { .. } => {
                if let Some(Open::Wait { reason, .. }) = open.get_mut(&key) {
                    *reason = Some("dependencies");
                }
            }
            TaskStep::Claimed => {
                let mut attributes = vec![KeyValue::new("attempt", i64::from(attempt))];
                attributes.extend(self.node.clone().map(|node| KeyValue::new("node", node)));
                self.record(trace, "claim", (event_ms, event_ms), attributes, None);
            }
            TaskStep::Started => {
                if let Some(wait) = open.remove(&key) {
                    self.close(trace, wait, event_ms, Outcome::Started);
                }
                let run = Open::Run {
                    since_ms: event_ms,
                    attempt,
                };
                open.insert(key, run);
            }
            TaskStep::Retrying {
                attempt: next,
                at_ms,
                reason,
            } => {
                if let Some(run) = open.remove(&key) {
                    self.close(trace, run, event_ms, Outcome::Retried(reason));
                }
                // The backoff is the next wait's first part: it sleeps until `at_ms`.
                let _ = at_ms;
                let backoff = Open::Wait {
                    since_ms: event_ms,
                    reason: Some("sleeping"),
                    budget_ready_ms: None,
                    attempt: *next,
                };
                open.insert(key, backoff);
            }
            TaskStep::Ended(status) => {
                if let Some(last) = open.remove(&key) {
                    self.close(trace, last, event_ms, Outcome::Ended(status));
                }
            }
            TaskStep::LeaseLost => {
                if let Some(last) = open.remove(&key) {
                    self.close(trace, last, event_ms, Outcome::LeaseLost);
                }
            }
            TaskStep::Admitted
            | TaskStep::ParentFailed { .. }
            | TaskStep::Refused(_)
            | TaskStep::YieldAsked
            | TaskStep::Yielded { .. } => {}
        }
    }

    fn wants_wait_reasons(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl Notifier for PoolTracing {
    /// The `deliver` span: from the task's end to its result stored.
    fn notify(&self, event: &TerminalEvent) {
        let Some(trace) = &event.trace else {
            return;
        };
        let attributes = vec![
            KeyValue::new("attempt", i64::from(event.attempt)),
            KeyValue::new("outcome", status_name(&event.status)),
        ];
        self.record(
            trace,
            "deliver",
            (engine_ms(event.stored_at_ms), now_ms()),
            attributes,
            None,
        );
    }
}

impl TaskTracer for PoolTracing {
    fn submitting(
        &self,
        pool: &str,
        first: &TaskMetadata,
        count: usize,
        parent: Option<TraceParent>,
    ) -> Option<Box<dyn SubmitSpan>> {
        let parent = match parent {
            Some(parent) => remote_parent(&parent),
            None => submitter_context(),
        };
        let tenant = first
            .mailbox
            .as_ref()
            .map_or_else(|| "anonymous".to_owned(), |key| key.tenant.to_string());
        let attributes = vec![
            KeyValue::new("pool", pool.to_owned()),
            KeyValue::new("task.id", first.id as i64),
            KeyValue::new("task.count", count as i64),
            KeyValue::new("tenant", tenant),
            KeyValue::new("priority", format!("{:?}", first.priority)),
            KeyValue::new("cost.kind", first.cost.kind.name()),
            KeyValue::new("cost.units", i64::from(first.cost.units)),
        ];
        let span = SpanBuilder::from_name("submit")
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes)
            .start_with_context(&global::tracer(SCOPE), &parent);
        let context = trace_parent(span.span_context())?;
        Some(Box::new(Submission { span, context }))
    }
}

/// The span of one webhook attempt of a task's notification (see `infra::notify`).
#[cfg(feature = "webhook")]
pub(crate) struct WebhookAttempt {
    span: global::BoxedSpan,
    /// The span's context, or the task's where no tracer provider records it.
    context: TraceParent,
}

#[cfg(feature = "webhook")]
impl WebhookAttempt {
    /// Starts attempt `number` of a notification of pool `pool` for a task of `trace`.
    pub(crate) fn start(trace: &TraceParent, pool: &str, number: u32) -> Self {
        let attributes = vec![
            KeyValue::new("pool", pool.to_owned()),
            KeyValue::new("attempt", i64::from(number)),
        ];
        let span = SpanBuilder::from_name("webhook")
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&global::tracer(SCOPE), &remote_parent(trace));
        let context = trace_parent(span.span_context()).unwrap_or(*trace);
        Self { span, context }
    }

    /// What the attempt sends as its `traceparent` header.
    pub(crate) fn traceparent(&self) -> TraceParent {
        self.context
    }

    /// Ends the attempt: the endpoint's `status`, if it answered, and why it failed, if it
    /// did.
    pub(crate) fn end(mut self, status: Option<u16>, failure: Option<&str>) {
        if let Some(status) = status {
            let status = KeyValue::new("http.response.status_code", i64::from(status));
            self.span.set_attribute(status);
        }
        if let Some(failure) = failure {
            self.span.set_status(Status::error(failure.to_owned()));
        }
        self.span.end();
    }
}

/// An open `submit` span.
struct Submission {
    span: global::BoxedSpan,
    context: TraceParent,
}

impl SubmitSpan for Submission {
    fn context(&self) -> TraceParent {
        self.context
    }

    fn end(mut self: Box<Self>, answer: Result<&MailboxKey, &PoolError>) {
        self.span
            .set_attribute(KeyValue::new("admitted", answer.is_ok()));
        if let Err(error) = answer {
            self.span.set_status(Status::error(error.to_string()));
        }
        self.span.end();
    }
}

/// The submitter's context: the current OpenTelemetry context when it holds a span, else
/// the current `tracing` span's (through `tracing-opentelemetry`, when the application
/// installed its layer).
fn submitter_context() -> Context {
    let current = Context::current();
    if current.span().span_context().is_valid() {
        return current;
    }
    tracing::Span::current().context()
}

/// A context whose span is `trace`'s, as if received from another process.
fn remote_parent(trace: &TraceParent) -> Context {
    let span = SpanContext::new(
        opentelemetry::TraceId::from_bytes(trace.trace_id()),
        opentelemetry::SpanId::from_bytes(trace.span_id()),
        TraceFlags::new(trace.flags()),
        true,
        TraceState::default(),
    );
    Context::new().with_remote_span_context(span)
}

/// The traceparent of `span`; `None` if it is not valid (no tracer provider is installed).
pub(crate) fn trace_parent(span: &SpanContext) -> Option<TraceParent> {
    if !span.is_valid() {
        return None;
    }
    TraceParent::new(
        span.trace_id().to_bytes(),
        span.span_id().to_bytes(),
        span.is_sampled(),
    )
}

/// The time `ms` after the epoch.
fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// A terminal status's name, as spans say it.
fn status_name(status: &TaskStatus) -> &'static str {
    match status {
        TaskStatus::Completed => "completed",
        TaskStatus::Failed(_) => "failed",
        TaskStatus::Cancelled => "cancelled",
        TaskStatus::Expired => "expired",
        TaskStatus::TimedOut => "timed_out",
        TaskStatus::Rejected(_) => "rejected",
        TaskStatus::Parked => "parked",
        TaskStatus::Running => "running",
    }
}
