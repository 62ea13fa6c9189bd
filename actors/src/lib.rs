//! The engine of `prometheus_parking_lot`.
//!
//! - [`domain`]: the vocabulary shared by every layer (task ids, priorities, costs, mailbox
//!   keys, metadata, statuses, limits and errors);
//! - [`scheduler::core`]: the pure parking-lot state machine, fed events with the current
//!   time, answering with decisions; no threads, clocks, channels or I/O;
//! - the actor tree built on `ractor`: [`supervisor`], [`scheduler::actor`], the queue and
//!   mailbox actors, and the worker actors, wired by [`engine`];
//! - the backend contracts [`queue::TaskQueue`] (local), [`queue::SharedQueue`] (several
//!   nodes) and [`mailbox::Mailbox`], and the user's [`worker::executor::TaskExecutor`];
//! - [`running`]: what a running task sees of its own run (its cancellation, its stream);
//! - [`permit`]: capacity permits for engines that run their own loop;
//! - [`schedule`]: periodic tasks, and the service that enqueues their ticks;
//! - [`observe`]: the scheduler's event stream and the pool's counters;
//! - [`sync`]: the waiting primitives (the parker, bounded spins, the nested-work slots);
//! - [`util`]: the wall clock, random numbers, panic-safe drops.
//!
//! Users normally depend on `prometheus_parking_lot`, which re-exports these names at the
//! paths existing code imports and adds the facades and the backends.

pub mod domain;
pub mod engine;
pub mod mailbox;
pub mod observe;
pub mod permit;
pub mod queue;
pub mod running;
pub mod schedule;
pub mod scheduler;
pub mod supervisor;
pub mod sync;
pub mod util;
pub mod worker;
