//! Where results wait for their submitter: the [`Mailbox`] contract every storage backend
//! implements, the [`Notifier`] hook for terminal events ([`notify`]), and the
//! mailbox actor (`actor.rs`) that stores results off the scheduler, and the watch over the
//! results on their way there (`watch.rs`).
//!
//! Every operation takes a full [`MailboxKey`], tenant included, and backends match keys
//! exactly, so a key of one tenant can never read, list or remove another tenant's results.

pub mod actor;
pub mod notify;
pub(crate) mod watch;

pub use notify::{json_result, Notifier, ResultEncoder, TerminalEvent};

use crate::domain::FaultKind;
use std::sync::Arc;

use async_trait::async_trait;
use thiserror::Error;
use tokio::sync::Notify;

pub use crate::domain::status_of;
use crate::domain::{BackendFault, MailboxKey, TaskFailure, TaskId, TaskStatus};
use crate::queue::{Claim, Settlement};

/// A failure of a mailbox backend.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MailboxError {
    /// The backend itself failed: its fault says what kind of failure, in what words, and
    /// keeps the error underneath.
    #[error(transparent)]
    Backend(BackendFault),
}

/// A task's outcome as a mailbox stores it.
#[derive(Debug)]
pub struct Delivery<R> {
    /// The task it belongs to.
    pub task_id: TaskId,
    /// The result, or how the task ended without one.
    pub outcome: Result<R, TaskFailure>,
    /// When it was stored, milliseconds since the Unix epoch.
    pub stored_at_ms: u128,
}

/// A delivery whose run held a shared claim: stored only while the claim holds (see
/// [`Mailbox::store_fenced`]).
#[derive(Debug)]
pub struct FencedDelivery<R> {
    /// Where it goes.
    pub key: MailboxKey,
    /// What is stored.
    pub delivery: Delivery<R>,
    /// The claim its run held: the fencing token.
    pub claim: Claim,
    /// How the claim ends.
    pub settlement: Settlement,
}

impl<R> Delivery<R> {
    /// The terminal status this delivery stands for.
    pub fn status(&self) -> TaskStatus {
        status_of(&self.outcome)
    }
}

/// Result storage. See the module docs; the conformance suite in `tests/conformance/` checks
/// every backend against this contract.
#[async_trait]
pub trait Mailbox<R>: Send + Sync
where
    R: Send + 'static,
{
    /// A short name for logs and errors.
    fn backend(&self) -> &'static str;

    /// Stores a delivery under `key` and wakes whoever waits on that key.
    async fn store(&self, key: &MailboxKey, delivery: Delivery<R>) -> Result<(), MailboxError>;

    /// Stores several deliveries, in order, each under its key, and wakes their waiters:
    /// what [`store`](Self::store) does for each, one after another (the default). The
    /// mailbox actor hands a backend every delivery that arrived while its previous write was
    /// in flight, so a backend that can write them at once (a database: one statement, one
    /// commit) overrides this. One result per delivery, in order.
    async fn store_many(
        &self,
        deliveries: Vec<(MailboxKey, Delivery<R>)>,
    ) -> Vec<Result<(), MailboxError>> {
        let mut stored = Vec::with_capacity(deliveries.len());
        for (key, delivery) in deliveries {
            stored.push(self.store(&key, delivery).await);
        }
        stored
    }

    /// Whether this mailbox ends a shared queue's claims in the transaction that stores their
    /// results ([`store_fenced`](Self::store_fenced)): it lives in the queue's database and was
    /// linked to the queue. `false` (the default): a node settles a claim first and stores
    /// its result only once the settle succeeded (see `PARKING_LOT.md`, "Fencing").
    fn fences_claims(&self) -> bool {
        false
    }

    /// Stores the results of runs that held shared claims, each only while `node` still holds
    /// its claim, and ends the claim (with its settlement) in the same transaction. One
    /// answer per delivery, in order: `Ok(true)` stored and settled, `Ok(false)` the claim was
    /// lost (its lease ran out and the task was claimed again, or it was settled already), so
    /// nothing was stored; an error stores and settles nothing. Only called when
    /// [`fences_claims`](Self::fences_claims); the default refuses every delivery.
    async fn store_fenced(
        &self,
        node: &str,
        deliveries: Vec<FencedDelivery<R>>,
    ) -> Vec<Result<bool, MailboxError>> {
        let _ = node;
        let refused = MailboxError::Backend(BackendFault::plain(
            FaultKind::Other,
            format!(
                "the {} mailbox cannot settle a shared queue's claims",
                self.backend()
            ),
        ));
        deliveries.iter().map(|_| Err(refused.clone())).collect()
    }

    /// Removes and returns the oldest delivery under exactly `key`.
    async fn take(&self, key: &MailboxKey) -> Result<Option<Delivery<R>>, MailboxError>;

    /// Removes and returns the delivery of one task under exactly `key`.
    async fn take_task(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<Option<Delivery<R>>, MailboxError>;

    /// For each `(key, task id)`, whether a delivery of that task waits under exactly that
    /// key: a submission that reuses the id is refused while it does (`ResultPending`). The
    /// default asks [`list`](Self::list) per key; a database answers in one statement.
    async fn holds(&self, wanted: &[(MailboxKey, TaskId)]) -> Result<Vec<bool>, MailboxError> {
        let mut held = Vec::with_capacity(wanted.len());
        for (key, id) in wanted {
            held.push(self.list(key).await?.contains(id));
        }
        Ok(held)
    }

    /// The task ids waiting under exactly `key`, oldest first.
    async fn list(&self, key: &MailboxKey) -> Result<Vec<TaskId>, MailboxError>;

    /// Drops deliveries stored before `cutoff_ms` (retention); returns how many.
    async fn purge_stored_before(&self, cutoff_ms: u64) -> Result<usize, MailboxError>;

    /// How many deliveries are stored.
    async fn stored_count(&self) -> Result<usize, MailboxError>;

    /// A handle that is notified (`notify_waiters`) whenever a delivery is stored under
    /// `key`. Enable a `notified()` future before `take`, and no wake-up can be lost.
    fn subscribe(&self, key: &MailboxKey) -> Arc<Notify>;

    /// Called by a waiter on `key` that stopped waiting and dropped its handle: a backend
    /// that keeps a handle per key drops it once no waiter holds it any more, so waiting
    /// never leaves anything behind.
    fn unsubscribe(&self, key: &MailboxKey) {
        let _ = key;
    }

    /// The synchronous face of a backend that needs no I/O, which the scheduler and the
    /// pool's clients then call directly. `None` (the default) sends stores through the
    /// mailbox actor.
    fn inline(&self) -> Option<&dyn InlineMailbox<R>> {
        None
    }
}

/// The synchronous face of a [`Mailbox`] that needs no I/O.
///
/// A bounded inline mailbox never drops a stored result to make room: the scheduler refuses
/// a submission when results waiting plus tasks live would pass [`max_messages`]
/// (`PoolError::MailboxFull`), so every admitted task has room for its outcome.
///
/// [`max_messages`]: InlineMailbox::max_messages
pub trait InlineMailbox<R>: Send + Sync {
    /// See [`Mailbox::store`].
    fn store_now(&self, key: &MailboxKey, delivery: Delivery<R>) -> Result<(), MailboxError>;
    /// See [`Mailbox::take`].
    fn take_now(&self, key: &MailboxKey) -> Result<Option<Delivery<R>>, MailboxError>;
    /// See [`Mailbox::take_task`].
    fn take_task_now(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<Option<Delivery<R>>, MailboxError>;
    /// Whether a delivery of `task_id` waits under exactly `key` (see [`Mailbox::holds`]).
    /// The default says no, so a backend that keeps this face must answer it for the
    /// refusal of reused ids to hold.
    fn holds_now(&self, key: &MailboxKey, task_id: TaskId) -> bool {
        let _ = (key, task_id);
        false
    }
    /// How many deliveries are stored.
    fn stored_now(&self) -> usize;
    /// The bound on stored deliveries.
    fn max_messages(&self) -> usize;
}
