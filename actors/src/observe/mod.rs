//! What the outside sees of a pool while it runs: the scheduler's event stream, the
//! counters and gauges read without a message round trip, and the tracing spans the actors
//! handle their messages in.
//!
//! - [`events`]: one event per step of a task's life, and a reading of the core's gauges
//!   after each batch, heard by every subscriber;
//! - [`stats`]: the pool's counters, kept by subscribing to [`events`];
//! - `spans`: the span each actor handles a message in;
//! - [`trace`]: a task's W3C trace context, carried from its submitter to wherever it runs.
//!
//! An operator's view of one instant (running and parked tasks with the reason each waits)
//! is the scheduler's answer to a request: [`scheduler::inspect`](crate::scheduler::inspect).

pub mod events;
pub(crate) mod spans;
pub mod stats;
pub mod trace;
