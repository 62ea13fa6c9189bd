//! The span of one webhook attempt, and the `traceparent` header it sends, so a receiver that
//! traces continues the task's trace: with the `otel` feature the attempt is a span of its
//! own (a child of the task's `submit` span) and the header names it; without it the header
//! is the task's trace as its submitter gave it.

/// The W3C trace context header.
pub const TRACEPARENT_HEADER: &str = "traceparent";

#[cfg(feature = "otel")]
pub(super) use crate::otel::WebhookAttempt as AttemptSpan;

#[cfg(not(feature = "otel"))]
pub(super) use untraced::AttemptSpan;

#[cfg(not(feature = "otel"))]
mod untraced {
    use crate::core::TraceParent;

    /// An attempt of a task that carries `trace`, where the pool makes no span.
    pub(crate) struct AttemptSpan {
        trace: TraceParent,
    }

    impl AttemptSpan {
        /// Attempt `_number` of a notification of pool `_pool` for a task of `trace`.
        pub(crate) fn start(trace: &TraceParent, _pool: &str, _number: u32) -> Self {
            Self { trace: *trace }
        }

        /// The header's value: the task's trace.
        pub(crate) fn traceparent(&self) -> TraceParent {
            self.trace
        }

        /// Nothing to end.
        pub(crate) fn end(self, _status: Option<u16>, _failure: Option<&str>) {}
    }
}
