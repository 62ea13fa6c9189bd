//! Wiring: builds one pool's actors under a supervisor ([`start`]) and gives callers a
//! [`PoolClient`] ([`client`]).
//!
//! ```text
//! SupervisorActor
//! ├── MailboxActor      the retention cleaner; stores results for a mailbox that awaits
//! ├── QueueActor        only for a queue backend that awaits: parks and claims off-thread
//! ├── SchedulerActor    the parking-lot core; sole writer of capacity; drains the inbox
//! └── WorkerActor × n   each owns thread parking-lot-worker-{pool}-{i}, which consumes
//!                       job channel i and reports finished runs to the inbox
//! ```
//!
//! Every facade of the public crate (`WorkerPool`, `ResourcePool`, the config builders) is a
//! `PoolClient` over this tree; there is no second engine.

pub mod client;
pub mod control;
pub mod start;

pub use client::{PoolClient, ShutdownOnDrop};
pub use control::PoolControl;
pub use start::{spawn_supervisor, start_gate_blocking, start_pool, start_pool_blocking, PoolSpec};
