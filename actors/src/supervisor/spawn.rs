//! Where a pool's actor tree runs.

use std::future::Future;
use std::pin::Pin;

use crate::domain::PoolError;

/// A future the engine hands to a [`Spawn`].
pub type BoxTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs the futures that host a pool's actors.
///
/// A pool's whole actor tree runs inside the one future it spawns, which ends when the pool
/// has shut down. The future must be polled on a tokio runtime with time enabled, on a thread
/// other than the one that builds the pool (building waits for the tree to be up). The public
/// crate's `TokioSpawner` runs it on a dedicated single-threaded runtime, which keeps
/// scheduling isolated from a busy application runtime.
pub trait Spawn: Send + Sync {
    /// Starts `task` in the background, or says why it cannot.
    fn spawn(&self, task: BoxTask) -> Result<(), PoolError>;
}
