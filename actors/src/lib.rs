//! The engine of `prometheus_parking_lot`.
//!
//! - [`domain`]: the vocabulary shared by every layer (task ids, priorities, costs, mailbox
//!   keys, metadata, statuses, limits and errors);
//! - [`scheduler::core`]: the pure parking-lot state machine, fed events with the current
//!   time, answering with decisions; no threads, clocks, channels or I/O;
//! - the actor tree built on `ractor`: [`supervisor`], [`scheduler::actor`],
//!   [`queue::actor`], [`mailbox::actor`], [`worker::actor`], wired by [`engine`];
//! - the backend contracts [`queue::TaskQueue`] and [`mailbox::Mailbox`], and the user's
//!   [`executor::TaskExecutor`];
//! - [`clock`]: the one place that reads the wall clock.
//!
//! Users normally depend on `prometheus_parking_lot`, which re-exports these names at the
//! paths existing code imports and adds the facades and the backends.

pub mod clock;
pub mod domain;
pub mod engine;
pub mod executor;
pub mod mailbox;
pub mod queue;
pub mod scheduler;
pub mod spawn;
pub mod stats;
pub mod supervisor;
pub mod worker;
