//! [`TokioSpawner`]: a dedicated single-threaded tokio runtime per pool.

use prometheus_parking_lot_actors::supervisor::spawn::{BoxTask, Spawn};

use crate::core::PoolError;

/// Runs each spawned future on its own thread (`parking-lot-runtime`) with its own
/// current-thread tokio runtime, for as long as the future runs.
///
/// A pool spawns one future that hosts its whole actor tree and ends when the pool has shut
/// down, so each pool gets an isolated scheduling thread: a busy or blocked application
/// runtime cannot delay it, and building a pool works from synchronous code, from inside an
/// async runtime, and from `spawn_blocking` alike.
///
/// ```
/// use prometheus_parking_lot::runtime::tokio_spawner::TokioSpawner;
/// use prometheus_parking_lot::core::Spawn;
///
/// let (done, finished) = std::sync::mpsc::channel();
/// TokioSpawner::new()
///     .spawn(Box::pin(async move {
///         tokio::time::sleep(std::time::Duration::from_millis(1)).await;
///         done.send(()).unwrap();
///     }))
///     .unwrap();
/// finished.recv().unwrap();
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokioSpawner;

impl TokioSpawner {
    /// The spawner (it holds no state; each spawn makes its own runtime).
    pub fn new() -> Self {
        TokioSpawner
    }
}

impl Spawn for TokioSpawner {
    fn spawn(&self, task: BoxTask) -> Result<(), PoolError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| {
                PoolError::Internal(format!("could not build a tokio runtime: {error}"))
            })?;
        std::thread::Builder::new()
            .name("parking-lot-runtime".into())
            .spawn(move || runtime.block_on(task))
            .map(drop)
            .map_err(|error| {
                PoolError::Internal(format!("could not start the runtime thread: {error}"))
            })
    }
}
