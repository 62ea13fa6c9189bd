//! The maintenance duties of a node of a shared queue: small services with one job each, in
//! the manner of River's maintenance services (`job_rescuer`, `job_cleaner`, ...).
//!
//! | duty | its job | interval | `run_once` answers |
//! |---|---|---|---|
//! | [`LeaseRenewer`] | extends the leases this node holds, so that no node rescues a task still running here | a third of the lease | the leases it found lost |
//! | [`LeaseRescuer`] | ends the claims whose lease ran out (their node died or stalled): parked again, or dead on their last attempt | the node's poll | how many claims it ended |
//! | [`DeadLetterReader`] | takes the tasks the queue gave up on, so that their submitters hear how they ended | the node's poll | the letters |
//!
//! A duty knows nothing of the scheduler. It is given the queue, the time and (the renewer) the
//! leases held, and it answers with data; whoever drives it decides what the answer means (the
//! scheduler cancels the runs whose lease was lost and fails the dead letters' tasks in their
//! mailboxes). Each says when it is due again ([`LeaseRenewer::is_due`], ...) from the time
//! it last ran, so a driver with one timer can run all three.
//!
//! ```
//! use std::time::Duration;
//!
//! use prometheus_parking_lot_actors::queue::duties::{DeadLetterReader, LeaseRenewer, LeaseRescuer};
//!
//! let renewer = LeaseRenewer::new("gpu-node-1", Duration::from_secs(30));
//! assert_eq!(renewer.interval(), Duration::from_secs(10));
//! assert!(renewer.is_due(0, 10_000));
//! assert!(!renewer.is_due(10_000, 19_999));
//!
//! let rescuer = LeaseRescuer::new(Duration::from_millis(500));
//! assert!(rescuer.is_due(1_000, 1_500));
//! assert_eq!(DeadLetterReader::new(Duration::from_secs(1)).batch(), 256);
//! ```

use std::sync::Arc;
use std::time::Duration;

use super::shared_queue::{DeadLetter, QueueMaintenance, SharedQueue};
use super::{EntryId, QueueError};

/// Whether a duty of `interval` that last ran at `last_run_ms` is due at `now_ms` (0: it never
/// ran).
fn due(interval: Duration, last_run_ms: u64, now_ms: u64) -> bool {
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    now_ms.saturating_sub(last_run_ms) >= interval_ms
}

/// Extends the leases a node holds, every third of the lease: a lease renewed that often
/// survives two renewals that fail (a slow or briefly absent database) before it runs out.
#[derive(Debug, Clone)]
pub struct LeaseRenewer {
    node: Arc<str>,
    lease: Duration,
    interval: Duration,
}

impl LeaseRenewer {
    /// The renewer of `node`'s leases of `lease` each.
    pub fn new(node: impl Into<Arc<str>>, lease: Duration) -> Self {
        Self {
            node: node.into(),
            lease,
            interval: lease / 3,
        }
    }

    /// Renews every `interval` instead of every third of the lease.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// How often it renews.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether it is due at `now_ms`, having last run at `last_run_ms` (0: never).
    pub fn is_due(&self, last_run_ms: u64, now_ms: u64) -> bool {
        due(self.interval, last_run_ms, now_ms)
    }

    /// Renews each lease in `held` to `now_ms` plus the lease (one
    /// [`SharedQueue::renew_many`]), and returns those the queue says this node no longer
    /// holds (they ran out and another node rescued them, or were never held): their runs
    /// must stop, and their results must not be published. A renewal that fails otherwise
    /// (the database is away) is logged and not a loss: the leases still run, and the next
    /// round tries again.
    pub async fn run_once<P: Send + 'static>(
        &self,
        queue: &dyn SharedQueue<P>,
        held: &[EntryId],
        now_ms: u64,
    ) -> Vec<EntryId> {
        if held.is_empty() {
            return Vec::new();
        }
        match queue.renew_many(&self.node, held, self.lease, now_ms).await {
            Ok(lost) => lost,
            Err(error) => {
                tracing::warn!(node = %self.node, held = held.len(), %error, "shared queue lease renewal failed");
                Vec::new()
            }
        }
    }
}

/// Ends the claims whose lease ran out, whichever node held them, so that a task whose node
/// died runs again elsewhere (at-least-once).
#[derive(Debug, Clone)]
pub struct LeaseRescuer {
    interval: Duration,
}

impl LeaseRescuer {
    /// A rescuer that runs every `interval`.
    pub fn new(interval: Duration) -> Self {
        Self { interval }
    }

    /// How often it runs.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether it is due at `now_ms`, having last run at `last_run_ms` (0: never).
    pub fn is_due(&self, last_run_ms: u64, now_ms: u64) -> bool {
        due(self.interval, last_run_ms, now_ms)
    }

    /// Ends every claim whose lease ran out at or before `now_ms` (see
    /// [`QueueMaintenance::rescue_expired`]); returns how many it ended.
    pub async fn run_once(
        &self,
        queue: &dyn QueueMaintenance,
        now_ms: u64,
    ) -> Result<usize, QueueError> {
        queue.rescue_expired(now_ms).await
    }
}

/// Takes the tasks a queue gave up on by itself (every attempt lost its lease, or the stored
/// task could not be read), a batch at a time, each once.
#[derive(Debug, Clone)]
pub struct DeadLetterReader {
    interval: Duration,
    batch: usize,
}

impl DeadLetterReader {
    /// Letters one run takes at most, unless set otherwise; the next run takes the rest.
    pub const DEFAULT_BATCH: usize = 256;

    /// A reader that runs every `interval`, [`DEFAULT_BATCH`](Self::DEFAULT_BATCH) letters at
    /// a time.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            batch: Self::DEFAULT_BATCH,
        }
    }

    /// Takes at most `batch` letters a run.
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// How often it runs.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Letters one run takes at most.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Whether it is due at `now_ms`, having last run at `last_run_ms` (0: never).
    pub fn is_due(&self, last_run_ms: u64, now_ms: u64) -> bool {
        due(self.interval, last_run_ms, now_ms)
    }

    /// Takes up to a batch of letters no node has reported yet (see
    /// [`QueueMaintenance::take_dead_letters`]): the caller must report each, since the queue
    /// returns none of them again.
    pub async fn run_once(
        &self,
        queue: &dyn QueueMaintenance,
    ) -> Result<Vec<DeadLetter>, QueueError> {
        queue.take_dead_letters(self.batch).await
    }
}

#[cfg(test)]
mod tests {
    use super::due;
    use std::time::Duration;

    #[test]
    fn a_duty_is_due_once_its_interval_has_passed_since_it_last_ran() {
        let second = Duration::from_secs(1);
        assert!(due(second, 0, 1_000), "never ran");
        assert!(!due(second, 5_000, 5_999));
        assert!(due(second, 5_000, 6_000));
        assert!(!due(second, 5_000, 4_000), "a clock that stepped back");
        assert!(!due(Duration::MAX, 0, u64::MAX - 1));
    }
}
