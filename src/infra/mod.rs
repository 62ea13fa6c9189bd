//! Backends: where parked tasks and results are stored, and who hears of results.
//!
//! | folder | what it holds |
//! |---|---|
//! | `queue/` | the queue drivers' registry, the in-memory queues and the embedded durable one |
//! | `mailbox/` | the in-memory mailbox |
//! | `postgres/` | everything on PostgreSQL: its queues, its mailbox, and what they share |
//! | `notify/` | the http notifier (cargo feature `webhook`) |
//!
//! [`InMemoryQueue`] and [`InMemoryMailbox`] are also named here, one level up from their
//! modules: the paths code written for the upstream crate imports them by
//! (`infra::InMemoryQueue`, `infra::InMemoryMailbox`; see API.md section F).

pub mod mailbox;
#[cfg(feature = "webhook")]
pub mod notify;
pub mod postgres;
pub mod queue;

pub use mailbox::InMemoryMailbox;
pub use queue::InMemoryQueue;
