//! Shutting a pool down: the drain, the actors' stop, the notifiers' flush; at once, or in
//! the background when a facade is dropped.

use std::sync::Mutex;
use std::time::Duration;

use ractor::rpc::CallResult;

use super::{deadline_after, PoolClient};
use crate::domain::PoolError;
use crate::scheduler::protocol::{SchedulerRequest, ShutdownReport};
use crate::supervisor::SupervisorMsg;

/// How long `shutdown` waits for each actor to drain its messages after the task drain.
const ACTOR_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

impl<P, R> PoolClient<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Stops admitting, lets running tasks finish for up to `drain` (`Duration::MAX`: for
    /// ever), then stops the pool's actors. Parked tasks of an in-memory queue end
    /// `Cancelled`; a durable queue keeps them. Running tasks still running at the deadline
    /// end `Cancelled`. Notifiers then get until the same deadline to deliver what they
    /// hold. Every caller, concurrent or later, waits for the same drain and gets the same
    /// report.
    pub async fn shutdown(&self, drain: Duration) -> Result<ShutdownReport, PoolError> {
        self.inner
            .shutdown
            .get_or_init(|| self.tear_down(drain))
            .await
            .clone()
    }

    async fn tear_down(&self, drain: Duration) -> Result<ShutdownReport, PoolError> {
        let board = self.inner.control.schedule_board();
        board.close();
        // A tick in flight (one statement on a shared queue) finishes and is counted first.
        let _ = tokio::time::timeout(ACTOR_DRAIN_TIMEOUT, board.idle()).await;
        let deadline = deadline_after(drain);
        let limit = drain.checked_add(ACTOR_DRAIN_TIMEOUT);
        let report = match self
            .inner
            .scheduler
            .call(
                |reply| SchedulerRequest::Shutdown { drain, reply }.into(),
                limit,
            )
            .await
        {
            Ok(CallResult::Success(report)) => report,
            _ => return Err(PoolError::Shutdown),
        };
        let children = match self
            .inner
            .supervisor
            .call(
                |reply| SupervisorMsg::ReleasePool {
                    pool: self.inner.control.shared_name(),
                    reply,
                },
                Some(ACTOR_DRAIN_TIMEOUT),
            )
            .await
        {
            Ok(CallResult::Success(children)) => children,
            _ => Vec::new(),
        };
        let _ = self
            .inner
            .scheduler
            .drain_and_wait(Some(ACTOR_DRAIN_TIMEOUT))
            .await;
        for child in &children {
            let _ = child.drain_and_wait(Some(ACTOR_DRAIN_TIMEOUT)).await;
        }
        // Every outcome is stored and every event handed over: what notifiers still hold
        // gets the rest of the drain time.
        for notifier in &self.inner.notifiers {
            notifier.flush(deadline).await;
        }
        if self.inner.owns_supervisor {
            let _ = self
                .inner
                .supervisor
                .stop_and_wait(None, Some(ACTOR_DRAIN_TIMEOUT))
                .await;
        }
        Ok(report)
    }

    /// A guard that starts `shutdown(drain)` in the background when dropped, unless disarmed
    /// first: how the facades shut a dropped pool down without waiting.
    pub fn shutdown_on_drop(&self, drain: Duration) -> ShutdownOnDrop {
        let client = self.clone();
        ShutdownOnDrop(Mutex::new(Some(Box::new(move || {
            std::thread::Builder::new()
                .name("parking-lot-shutdown".into())
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    if let Ok(runtime) = runtime {
                        let _ = runtime.block_on(client.shutdown(drain));
                    }
                })
                .map(drop)
                .unwrap_or_else(|error| {
                    tracing::error!(%error, "could not start the shutdown of a dropped pool")
                });
        }))))
    }
}

#[doc(hidden)]
/// Shuts a pool down in the background when dropped. See [`PoolClient::shutdown_on_drop`].
pub struct ShutdownOnDrop(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl ShutdownOnDrop {
    /// Drops the guard's action: the pool was shut down explicitly.
    pub fn disarm(&self) {
        if let Ok(mut action) = self.0.lock() {
            action.take();
        }
    }
}

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        let action = self.0.get_mut().ok().and_then(Option::take);
        if let Some(action) = action {
            action();
        }
    }
}
