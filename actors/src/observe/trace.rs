//! A task's place in a distributed trace: the W3C `traceparent` it carries from its submitter
//! to wherever it runs.
//!
//! A task submitted inside a trace (an HTTP request's, say) belongs to it: the spans of its
//! waits, claims, runs, delivery and webhook calls are children of the span its submission
//! made, on whichever node or process they happen. So the context travels with the task, as
//! a [`TraceParent`], through every queue that stores it and every notifier that reports its
//! end. The engine only carries it; making and exporting spans is the business of the
//! `otel` feature of the root crate, which also fills it in at submission.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::domain::{MailboxKey, PoolError, TaskMetadata};

/// A W3C trace context (`traceparent`): version `00`, a 16-byte trace id, the 8-byte id of
/// the parent span, and the trace flags, as `00-<32 hex>-<16 hex>-<2 hex>`.
///
/// ```
/// use prometheus_parking_lot_actors::observe::trace::TraceParent;
///
/// let parent: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
///     .parse()
///     .unwrap();
/// assert_eq!(parent.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(parent.span_id_hex(), "00f067aa0ba902b7");
/// assert!(parent.sampled());
/// assert_eq!(parent.to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
///
/// let error = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
///     .parse::<TraceParent>()
///     .unwrap_err();
/// assert!(error.to_string().contains("all zeros"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TraceParent {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

/// What is wrong with a `traceparent` text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("traceparent {given:?}: {problem}; expected 00-<32 lowercase hex trace id>-<16 lowercase hex span id>-<2 hex flags>, ids not all zeros")]
pub struct BadTraceParent {
    /// The text given (cut to 64 characters).
    pub given: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl TraceParent {
    /// The context of span `span_id` of trace `trace_id`; `None` if either id is all zeros
    /// (W3C's invalid ids).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        let valid = trace_id != [0; 16] && span_id != [0; 8];
        valid.then_some(Self {
            trace_id,
            span_id,
            flags: u8::from(sampled),
        })
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The parent span's id.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The parent span's id as 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// Whether the trace is sampled (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The trace flags byte.
    pub fn flags(&self) -> u8 {
        self.flags
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Reads `text` (lowercase hex) into `out`; `false` if it is not exactly that many digits.
fn unhex(text: &str, out: &mut [u8]) -> bool {
    let digits = text.as_bytes();
    if digits.len() != out.len() * 2 {
        return false;
    }
    let value = |digit: u8| match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    };
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        match (value(pair[0]), value(pair[1])) {
            (Some(high), Some(low)) => *byte = high << 4 | low,
            _ => return false,
        }
    }
    true
}

impl FromStr for TraceParent {
    type Err = BadTraceParent;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |problem| BadTraceParent {
            given: text.chars().take(64).collect(),
            problem,
        };
        let parts: Vec<&str> = text.trim().split('-').collect();
        let [version, trace, span, flags] = parts[..] else {
            return Err(bad("it has not four parts separated by '-'"));
        };
        if version != "00" {
            return Err(bad("only version 00 is known"));
        }
        let (mut trace_id, mut span_id, mut flag) = ([0u8; 16], [0u8; 8], [0u8; 1]);
        if !unhex(trace, &mut trace_id) {
            return Err(bad("the trace id is not 32 lowercase hex digits"));
        }
        if !unhex(span, &mut span_id) {
            return Err(bad("the span id is not 16 lowercase hex digits"));
        }
        if !unhex(flags, &mut flag) {
            return Err(bad("the flags are not 2 hex digits"));
        }
        let parent =
            Self::new(trace_id, span_id, false).ok_or_else(|| bad("an id is all zeros"))?;
        Ok(Self {
            flags: flag[0],
            ..parent
        })
    }
}

impl TryFrom<String> for TraceParent {
    type Error = BadTraceParent;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl From<TraceParent> for String {
    fn from(parent: TraceParent) -> Self {
        parent.to_string()
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.span_id_hex(),
            self.flags
        )
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

/// Makes the span of each submission, on the submitter's thread and in its context, so the
/// span's parent is whatever the submitter was doing. The `otel` feature of the root crate
/// implements it; a pool without one carries only the `traceparent` a submitter gave.
pub trait TaskTracer: Send + Sync {
    /// Starts the span of submitting `count` tasks (one, or a batch) to `pool`, the first of
    /// them `first`, as a child of `parent` when the submitter named one (else of the
    /// submitter's current context); `None` when it is not traced. Each task then carries
    /// the span's context.
    fn submitting(
        &self,
        pool: &str,
        first: &TaskMetadata,
        count: usize,
        parent: Option<TraceParent>,
    ) -> Option<Box<dyn SubmitSpan>>;
}

/// The span of one submission, open until its admission answer.
pub trait SubmitSpan: Send {
    /// The span's context: what the task carries to its waits, runs and delivery.
    fn context(&self) -> TraceParent;

    /// Ends the span with the admission answer (a batch's: its first refusal, if any).
    fn end(self: Box<Self>, answer: Result<&MailboxKey, &PoolError>);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let text = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        let parent: TraceParent = text.parse().unwrap();
        assert_eq!(parent.to_string(), text);
        assert!(!parent.sampled());
        let json = serde_json::to_string(&parent).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<TraceParent>(&json).unwrap(), parent);
    }

    #[test]
    fn bad_traceparents_are_refused_saying_what_is_wrong() {
        let cases = [
            ("", "four parts"),
            (
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "version 00",
            ),
            (
                "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
                "trace id",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
                "trace id",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333g-01",
                "span id",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
                "all zeros",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
                "flags",
            ),
        ];
        for (text, problem) in cases {
            let error = text.parse::<TraceParent>().unwrap_err().to_string();
            assert!(error.contains(problem), "{text:?}: {error}");
            assert!(error.contains("expected 00-"), "{error}");
        }
        assert!(serde_json::from_str::<TraceParent>("\"nope\"").is_err());
    }
}
