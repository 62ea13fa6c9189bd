//! The engine of `prometheus_parking_lot`.
//!
//! - [`domain`]: the vocabulary shared by every layer (task ids, priorities, costs, mailbox
//!   keys, metadata, statuses, limits and errors);
//! - [`scheduler::core`]: the pure parking-lot state machine, fed events with the current
//!   time, answering with decisions; no threads, clocks, channels or I/O;
//! - the actor tree built on `ractor`: [`supervisor`], [`scheduler::actor`], the queue and
//!   mailbox actors, and the worker actors, wired by [`engine`];
//! - the backend contracts [`queue::TaskQueue`] (local), [`queue::SharedQueue`] (several
//!   nodes) and [`mailbox::Mailbox`], and the user's [`executor::TaskExecutor`];
//! - [`events`]: the scheduler's event stream, which [`stats`] subscribes to;
//! - [`parker`]: the three-state parker blocking callers wait on;
//! - [`clock`]: the one place that reads the wall clock.
//!
//! Users normally depend on `prometheus_parking_lot`, which re-exports these names at the
//! paths existing code imports and adds the facades and the backends.

pub mod budget;
pub(crate) mod cancellation;
pub mod clock;
#[doc(hidden)]
pub mod contain;
pub mod domain;
pub mod engine;
pub mod events;
pub mod executor;
pub mod inspect;
pub mod mailbox;
pub mod parker;
pub mod permit;
pub mod queue;
#[doc(hidden)]
pub mod random;
pub mod running;
pub mod scheduler;
pub(crate) mod spans;
pub mod spawn;
pub(crate) mod spin;
pub mod stats;
pub mod stream;
pub mod supervisor;
pub mod worker;
