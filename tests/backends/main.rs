//! The backends under the engine: the conformance suites (`tests/conformance/`) run against
//! the in-memory, yaque and Postgres queues and mailboxes, what each backend adds beyond its
//! contract, the shared-queue mode in one process and its maintenance duties.
//!
//! One test binary for all these files, so that the crate is linked once for them; each file
//! is a module, so its tests are named `file::test` (`cargo test --test backends yaque::`).
//! A file for a backend behind a cargo feature is built with that feature.

#[path = "../conformance/mod.rs"]
mod conformance;
#[cfg(feature = "postgres")]
#[path = "../support/postgres_pools.rs"]
mod postgres_pools;

mod memory_backends;
#[cfg(feature = "postgres")]
mod postgres_backends;
#[cfg(feature = "postgres")]
mod postgres_dependencies;
#[cfg(feature = "postgres")]
mod postgres_fair_use;
#[cfg(feature = "postgres")]
mod postgres_outages;
#[cfg(feature = "postgres")]
mod postgres_schedules;
mod queue_duties;
mod scheduled_nodes;
mod shared_nodes;
#[cfg(feature = "yaque")]
mod yaque;
#[cfg(feature = "yaque")]
mod yaque_disk;
