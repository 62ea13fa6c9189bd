//! A task's cancellation flag: raised by the engine (a cancel, the watchdog, a dropped result
//! stream, the drain deadline), read by the task's executor through
//! [`running`](crate::running).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// A task's cancellation flag. Cheap to clone; every clone sees the same flag.
#[derive(Clone, Debug, Default)]
pub struct Cancellation(Arc<Flag>);

#[derive(Debug, Default)]
struct Flag {
    cancelled: AtomicBool,
    changed: Notify,
}

impl Cancellation {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Raises the flag (once; later calls do nothing) and wakes whoever awaits it.
    pub(crate) fn cancel(&self) {
        if !self.0.cancelled.swap(true, Ordering::AcqRel) {
            self.0.changed.notify_waiters();
        }
    }

    /// Whether the task was cancelled (by `cancel`, its timeout, a dropped stream or the
    /// shutdown's deadline).
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    /// Completes once the task is cancelled.
    pub async fn cancelled(&self) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            changed.await;
        }
    }
}
