//! A task's cancellation flag: raised by the engine (a cancel, the watchdog, a dropped result
//! stream, the drain deadline), read by the task's executor through
//! [`running`](crate::running).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// A task's cancellation flag. Cheap to clone; every clone sees the same flag.
#[derive(Clone, Debug, Default)]
pub struct Cancellation(Arc<Flag>);

#[derive(Debug, Default)]
struct Flag {
    cancelled: AtomicBool,
    /// Why: set (before the flag) when the run was asked to yield to a waiter of higher
    /// priority, so the task is parked again and rerun rather than ended.
    preempted: AtomicBool,
    /// Why: set (before the flag) when the run's shared claim was lost, so another node may
    /// run the task and nothing this run produces is published.
    lease_lost: AtomicBool,
    /// Units of a budgeted kind the run spent at its start and did not use (see
    /// [`running::return_units`](crate::running::return_units)).
    unused_units: AtomicU32,
    /// Units the run reported using, plus one (0: it reported nothing; see
    /// [`running::report_used`](crate::running::report_used)).
    used_units: AtomicU64,
    /// Why the run asked to be tried again (see
    /// [`running::retry_later`](crate::running::retry_later)), if it did: read at every
    /// run's end, so a lock-free cell (the first reason given is kept).
    retry: std::sync::OnceLock<String>,
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

    /// Raises the flag because a waiter of higher priority needs the run's units: the task
    /// will be parked again at its rank and rerun, so whatever the run returns is discarded.
    pub(crate) fn preempt(&self) {
        self.0.preempted.store(true, Ordering::Release);
        self.cancel();
    }

    /// Raises the flag because the run's shared claim was lost (its lease ran out and another
    /// node may run the task): whatever the run returns is discarded.
    pub(crate) fn lose_lease(&self) {
        self.0.lease_lost.store(true, Ordering::Release);
        self.cancel();
    }

    /// Whether the flag was raised because the run's shared claim was lost (see
    /// [`running::is_lease_lost`]).
    ///
    /// [`running::is_lease_lost`]: crate::running::is_lease_lost
    pub fn is_lease_lost(&self) -> bool {
        self.0.lease_lost.load(Ordering::Acquire)
    }

    /// Records that the run did not use `units` of what it spent from its kind's budget;
    /// they go back to the bucket when the run ends. Calls add up.
    pub(crate) fn return_units(&self, units: u32) {
        let _ = self
            .0
            .unused_units
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |had| {
                Some(had.saturating_add(units))
            });
    }

    /// Records that the run used `units` (more) of its cost. Calls add up.
    pub(crate) fn report_used(&self, units: u64) {
        let _ = self
            .0
            .used_units
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |had| {
                Some(had.max(1).saturating_add(units))
            });
    }

    /// Units the run reported using, if it reported any (see
    /// [`report_used`](Self::report_used)).
    pub(crate) fn used_units(&self) -> Option<u64> {
        self.0.used_units.load(Ordering::Acquire).checked_sub(1)
    }

    /// Records that the run failed in a way worth trying again, and why (the first call's
    /// reason is kept).
    pub(crate) fn retry_later(&self, reason: String) {
        let _ = self.0.retry.set(reason);
    }

    /// Why the run asked to be tried again, if it did.
    pub(crate) fn retry_reason(&self) -> Option<&str> {
        self.0.retry.get().map(String::as_str)
    }

    /// Units the run said it did not use (see [`return_units`](Self::return_units)).
    pub(crate) fn unused_units(&self) -> u32 {
        self.0.unused_units.load(Ordering::Acquire)
    }

    /// Whether the flag was raised to preempt the run (see [`running::is_preempted`]).
    ///
    /// [`running::is_preempted`]: crate::running::is_preempted
    pub fn is_preempted(&self) -> bool {
        self.0.preempted.load(Ordering::Acquire)
    }

    /// Whether the task was cancelled (by `cancel`, its timeout, a dropped stream, the
    /// shutdown's deadline, a preemption, or a lost shared claim).
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
