//! The spans the actor tree runs its handlers in.
//!
//! Every actor handles each message inside a DEBUG span named `actor` (its kind, its actor
//! id, and the pool or backend it serves), entered only while the handler is polled, so it
//! never covers another actor sharing the runtime thread. A task's own span (`task`, from
//! admission to the end of its run) is made by the scheduler. With no subscriber enabled at
//! DEBUG, the macro evaluates none of its fields.

/// The span one actor handles one message in.
pub(crate) fn actor(kind: &'static str, id: ractor::ActorId, serves: &str) -> tracing::Span {
    tracing::debug_span!("actor", kind, id = %id, serves)
}
