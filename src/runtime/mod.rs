//! Runtimes that host a pool's actor tree.
//!
//! [`TokioSpawner`] is also here, beside its module, where code written for the upstream
//! crate imports it.

pub mod tokio_spawner;

pub use tokio_spawner::TokioSpawner;
