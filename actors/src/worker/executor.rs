//! The user's work: what a worker thread runs for each task.

use async_trait::async_trait;

use crate::domain::TaskMetadata;

/// Runs a task's payload and produces its result.
///
/// Each call runs on one of the pool's dedicated worker threads, inside that thread's own
/// current-thread tokio runtime, never on the caller's runtime. The runtime keeps running
/// between tasks, so `execute` may `tokio::spawn` work that outlives it (a token producer
/// feeding a channel it returns, say).
///
/// ```
/// use async_trait::async_trait;
/// use prometheus_parking_lot_actors::domain::TaskMetadata;
/// use prometheus_parking_lot_actors::worker::executor::TaskExecutor;
///
/// #[derive(Clone)]
/// struct Echo;
///
/// #[async_trait]
/// impl TaskExecutor<String, String> for Echo {
///     async fn execute(&self, payload: String, _meta: TaskMetadata) -> String {
///         payload
///     }
/// }
/// ```
#[async_trait]
pub trait TaskExecutor<P, R>: Send + Sync
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Runs one task. A panic here fails the task (`Failed` with the panic message) and
    /// restarts the worker thread; it never leaks the task's capacity.
    async fn execute(&self, payload: P, meta: TaskMetadata) -> R;
}
