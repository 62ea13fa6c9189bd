//! Runtimes that host a pool's actor tree.

pub mod tokio_spawner;
