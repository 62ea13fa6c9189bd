//! The parking lot's storage: the [`TaskQueue`] contract every backend implements, and the
//! [`QueueActor`](actor::QueueActor) that keeps its I/O off the scheduler.
//!
//! # The contract
//!
//! A queue is not a FIFO the scheduler pops. It *parks* tasks and answers "the best-ranked
//! parked task that fits this free capacity" ([`TaskQueue::claim_best_fit`]), so skip-ahead
//! survives durable and shared backends. A claimed task is leased to this node until it is
//! completed, failed or released. Backends whose tasks only this node parks (in memory, an
//! embedded file) may instead be told which task to claim ([`TaskQueue::claim`]), because the
//! scheduler's own index already knows the answer; a shared backend answers the fit query
//! itself, with one indexed query, because other nodes park and claim too.

pub mod actor;

use async_trait::async_trait;
use thiserror::Error;

use crate::domain::{Capacity, ScheduledTask, TaskId};
use crate::scheduler::core::RankKey;

/// A failure of a queue backend.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QueueError {
    /// A parked task with this id exists already.
    #[error("task {0} is parked already")]
    Duplicate(TaskId),
    /// The backend's own bound is reached.
    #[error("the queue holds its maximum of {0} tasks")]
    Full(usize),
    /// `complete`, `fail` or `release` of a task this node has not claimed.
    #[error("task {0} is not claimed by this node")]
    NotClaimed(TaskId),
    /// The backend itself failed (I/O, database, corrupt data); the text says how.
    #[error("queue backend error: {0}")]
    Backend(String),
}

/// What a claim may take: free units per kind, and optionally a rank bound (the starvation
/// guard's reservation: only tasks ranked at or ahead of it may be claimed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitQuery {
    /// Units free per resource kind.
    pub free: Capacity,
    /// Claim only tasks ranked at or ahead of this key.
    pub ranked_at_or_ahead_of: Option<RankKey>,
}

/// How many tasks a queue holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Waiting to be claimed.
    pub parked: usize,
    /// Claimed by this node and not yet completed, failed or released.
    pub claimed: usize,
}

/// Storage for parked tasks. See the module docs for the contract; the conformance suite in
/// `tests/conformance/` checks every backend against it.
#[async_trait]
pub trait TaskQueue<P>: Send + Sync
where
    P: Send + 'static,
{
    /// A short name for logs and errors (`in_memory`, `yaque`, `postgres`).
    fn backend(&self) -> &'static str;

    /// Whether parked tasks survive the process. Shutdown keeps a durable queue's tasks and
    /// cancels an in-memory queue's.
    fn is_durable(&self) -> bool;

    /// Parks a task. Once this returns `Ok`, the task is stored (durably, for a durable
    /// backend).
    async fn park(&self, task: ScheduledTask<P>) -> Result<(), QueueError>;

    /// Claims a specific parked task; `None` if it is not parked (claimed elsewhere, removed).
    async fn claim(&self, id: TaskId) -> Result<Option<ScheduledTask<P>>, QueueError>;

    /// Claims the best-ranked parked task that fits `query`, if any.
    async fn claim_best_fit(
        &self,
        query: &FitQuery,
    ) -> Result<Option<ScheduledTask<P>>, QueueError>;

    /// Ends a claim: the task completed (or ended for good some other way).
    async fn complete(&self, id: TaskId) -> Result<(), QueueError>;

    /// Ends a claim with a failure. Backends with retries may park the task again.
    async fn fail(&self, id: TaskId, reason: &str) -> Result<(), QueueError>;

    /// Gives a claimed task back: it is parked again with its original rank.
    async fn release(&self, task: ScheduledTask<P>) -> Result<(), QueueError>;

    /// Removes a parked task (cancelled, or its deadline passed); `None` if not parked.
    async fn remove(&self, id: TaskId) -> Result<Option<ScheduledTask<P>>, QueueError>;

    /// Removes every parked task whose deadline is at or before `now_ms`; returns their ids.
    async fn expire(&self, now_ms: u64) -> Result<Vec<TaskId>, QueueError>;

    /// How many tasks are parked and claimed.
    async fn counts(&self) -> Result<QueueCounts, QueueError>;
}
