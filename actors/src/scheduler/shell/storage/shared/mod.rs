//! The shared mode: a pool whose tasks park in a queue several nodes share (a database),
//! where any node may claim them. Everything a node does in that mode is in this folder:
//!
//! - `room.rs`: the mode's own state in the shell ([`SharedRoom`]): the leases this node
//!   holds, the claims and parks in flight, when to claim and renew next;
//! - `hooks.rs`: the mode's answers where storage modes differ (a task that would park
//!   goes to the queue; one that starts at once may be stored as this node's claim first);
//! - `mode.rs`: the shell's side: what it parks in the queue, how it admits what it claims,
//!   and what it does with each answer;
//! - `calls.rs`: the calls the shell asks of the queue ([`SharedCall`], effects like any
//!   other) and the reports their answers come back as ([`SharedReport`]);
//! - `io.rs` and `settle.rs`: the I/O side, which makes those calls in tasks of their own
//!   so a slow database never holds up the scheduler ([`SharedIo`]);
//! - `parking.rs`: a node's settings ([`SharedParking`]), as a pool is given them.
//!
//! The queue itself is a [`SharedQueue`](crate::queue::SharedQueue): a small required
//! contract, plus the capabilities a backend may have (dependencies, schedule ticks, fleet
//! budgets, fair share by use, unique callers), which the node asks for as it starts.

mod calls;
mod hooks;
mod io;
mod mode;
mod parking;
mod room;
mod settle;

#[cfg(test)]
pub(crate) use calls::Enqueued;
pub(crate) use calls::{EndedLater, SharedCall, SharedReport};
pub(crate) use hooks::Enqueue;
pub(crate) use io::SharedIo;
pub use parking::SharedParking;
pub(crate) use room::SharedRoom;
pub(crate) use settle::AfterSettle;
