//! What a running task can see of its own run: whether it was cancelled, and where its
//! partial results go when its submitter streams them.
//!
//! `TaskExecutor::execute` gets only the payload and the metadata, so the worker thread
//! publishes the rest for the duration of the run, in a thread-local the functions here read:
//!
//! - [`is_cancelled`] / [`cancellation`]: set by `cancel(task_id)`, the execution timeout
//!   (the watchdog), a dropped result stream, the shutdown's drain deadline, a preemption
//!   ([`is_preempted`]) and a lost shared claim ([`is_lease_lost`]). An async
//!   executor is stopped at its next `.await` anyway (its future is dropped); an executor
//!   that blocks its thread (a token loop in sync code) checks the flag between steps.
//! - [`return_units`]: a task of a kind with a budget (units that refill with time) gives
//!   back what it declared and did not use.
//! - [`report_used`]: what the task really used of its cost, for a fair share that charges
//!   tenants by reported use.
//! - [`retry_later`]: a run that failed in a way worth trying again says so.
//! - [`partials`]: the sink of a task submitted with `submit_streaming`; `None` for tasks
//!   submitted otherwise, so one executor can serve both.
//!
//! The context belongs to the worker thread while it runs the task. Work the executor hands
//! elsewhere (a `tokio::spawn`, another thread) does not see it: take the [`Cancellation`]
//! or the [`Partials`] handle first and move it there.
//!
//! ```
//! use async_trait::async_trait;
//! use prometheus_parking_lot_actors::domain::TaskMetadata;
//! use prometheus_parking_lot_actors::worker::executor::TaskExecutor;
//! use prometheus_parking_lot_actors::running;
//!
//! /// Generates tokens in blocking code, stopping as soon as nobody wants them any more.
//! struct Generate;
//!
//! #[async_trait]
//! impl TaskExecutor<u32, String> for Generate {
//!     async fn execute(&self, tokens: u32, _meta: TaskMetadata) -> String {
//!         let partials = running::partials::<String>();
//!         let mut text = String::new();
//!         for n in 0..tokens {
//!             if running::is_cancelled() {
//!                 break;
//!             }
//!             let token = format!("t{n} ");
//!             if let Some(partials) = &partials {
//!                 if partials.send_blocking(token.clone()).is_err() {
//!                     break; // the client went away
//!                 }
//!             }
//!             text.push_str(&token);
//!         }
//!         text
//!     }
//! }
//! ```

pub(crate) mod cancellation;
pub mod stream;

use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

pub use cancellation::Cancellation;
use stream::Partials;

use crate::domain::{MailboxKey, Priority, TaskMetadata, TenantId};
use crate::observe::trace::TraceParent;

/// The context of the task a worker thread runs: its flag, its stream if it has one, and
/// what the tasks it submits inherit from it.
#[derive(Clone)]
pub(crate) struct RunContext {
    pub cancellation: Cancellation,
    /// The task's `StreamShared<R>`, type-erased (jobs are generic over the payload only).
    pub stream: Option<Arc<dyn Any + Send + Sync>>,
    /// What a child submitted from inside the task inherits (see [`inherit`]).
    pub lineage: Lineage,
}

/// What a task passes to the children it submits from inside its executor (nested work,
/// recognized by the submitting thread being one of the pool's own workers): its priority,
/// as the least theirs may be, and its tenant, for a child submitted without a mailbox key.
/// Its trace goes to any task submitted from inside it, to this pool or another (see
/// [`current_trace`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct Lineage {
    /// The task's priority.
    pub priority: Priority,
    /// The tenant of the task's mailbox key, when it named one (an anonymous key's tenant
    /// is the task's own).
    pub tenant: Option<TenantId>,
    /// The trace the task belongs to, if any.
    pub trace: Option<TraceParent>,
}

/// Gives a child submitted from inside the running task of this thread what it inherits
/// from that task: at least its priority (a child may be raised, never lowered below its
/// parent), and, when the child has no mailbox key, a key of the parent's tenant in a
/// session of its own (so it counts against the same fair share and may name its
/// siblings as dependencies). Does nothing outside a run.
pub(crate) fn inherit(meta: &mut TaskMetadata) {
    with_current(|context| {
        let lineage = &context.lineage;
        meta.priority = meta.priority.max(lineage.priority);
        if let (None, Some(tenant)) = (&meta.mailbox, &lineage.tenant) {
            let session = format!("nested-{:032x}", crate::util::random::random_u128());
            meta.mailbox = Some(MailboxKey::new(tenant.clone()).with_session(session));
        }
    });
}

thread_local! {
    static CURRENT: RefCell<Option<RunContext>> = const { RefCell::new(None) };
}

/// Publishes `context` as this thread's running task until the returned guard drops.
pub(crate) fn enter(context: RunContext) -> Entered {
    let previous = CURRENT.with(|current| current.replace(Some(context)));
    Entered { previous }
}

/// Restores the previous context (normally none) when the run is over.
pub(crate) struct Entered {
    previous: Option<RunContext>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|current| *current.borrow_mut() = previous);
    }
}

fn with_current<T>(read: impl FnOnce(&RunContext) -> T) -> Option<T> {
    CURRENT.with(|current| current.borrow().as_ref().map(read))
}

/// The trace of the task this worker thread is running, if it carries one: a task submitted
/// from inside it without a trace of its own joins it. `None` outside a run.
pub fn current_trace() -> Option<TraceParent> {
    with_current(|context| context.lineage.trace).flatten()
}

/// The cancellation flag of the task this worker thread is running; `None` outside a run.
pub fn cancellation() -> Option<Cancellation> {
    with_current(|context| context.cancellation.clone())
}

/// Whether the task this worker thread is running was cancelled; `false` outside a run.
pub fn is_cancelled() -> bool {
    with_current(|context| context.cancellation.is_cancelled()).unwrap_or(false)
}

/// Whether the task this worker thread is running was asked to yield to a waiter of higher
/// priority (its pool preempts tasks: `WorkerPool::preempt_tasks`); `false` outside a run.
/// The flag of [`is_cancelled`] is raised too. Return soon: the task is parked again at its
/// rank and runs again later, and what this run returns is discarded.
pub fn is_preempted() -> bool {
    with_current(|context| context.cancellation.is_preempted()).unwrap_or(false)
}

/// Whether the task this worker thread is running lost its shared claim: this node's lease
/// on it ran out (the node stalled, or lost the database for longer than the lease) and
/// another node may be running it now. The flag of [`is_cancelled`] is raised too. Stop and
/// return: nothing this run returns or stores through the pool is published, so it cannot
/// race the other node's result. `false` outside a run and for tasks not claimed from a
/// shared queue.
pub fn is_lease_lost() -> bool {
    with_current(|context| context.cancellation.is_lease_lost()).unwrap_or(false)
}

/// Tells the pool that the task this worker thread is running used `units` fewer of its
/// cost than it declared, for a cost of a kind with a budget (units that refill with time,
/// such as a provider's tokens per minute): the task spent its whole cost when it started,
/// and these go back to the bucket when the run ends, so other tasks may start sooner. An
/// LLM call declares its prompt plus its largest reply, and returns what the reply did not
/// use. Calls add up; the pool gives back at most what the task spent. Returns `false`
/// outside a run. For a kind without a budget the units come back at the end anyway, and
/// this changes nothing.
///
/// ```
/// use async_trait::async_trait;
/// use prometheus_parking_lot_actors::domain::TaskMetadata;
/// use prometheus_parking_lot_actors::worker::executor::TaskExecutor;
/// use prometheus_parking_lot_actors::running;
///
/// /// Calls a model with a quota on tokens; the cost declared the most it may use.
/// struct Complete;
///
/// #[async_trait]
/// impl TaskExecutor<String, String> for Complete {
///     async fn execute(&self, prompt: String, meta: TaskMetadata) -> String {
///         let reply = format!("echo: {prompt}"); // the provider's answer
///         let used = (prompt.len() + reply.len()) as u32;
///         running::return_units(meta.cost.units.saturating_sub(used));
///         reply
///     }
/// }
/// ```
pub fn return_units(units: u32) -> bool {
    with_current(|context| context.cancellation.return_units(units)).is_some()
}

/// Tells the pool that the task this worker thread is running used `units` of its cost:
/// the tokens its reply really made, out of the most its cost declared. Under a fair share
/// that charges tenants by reported use (`fair_share.by_use` with `"charge": "reported"`),
/// the task's tenant is charged its declared cost when it starts, and the sum of its reports
/// (at most the declared cost) when it ends, so a tenant whose replies are short is served
/// more often. Calls add up; a task that reports nothing stays charged its declared cost.
/// Under any other setting this changes nothing. Returns `false` outside a run.
///
/// ```
/// use async_trait::async_trait;
/// use prometheus_parking_lot_actors::domain::TaskMetadata;
/// use prometheus_parking_lot_actors::worker::executor::TaskExecutor;
/// use prometheus_parking_lot_actors::running;
///
/// /// Generates at most `meta.cost.units` tokens, and says how many it made.
/// struct Generate;
///
/// #[async_trait]
/// impl TaskExecutor<String, String> for Generate {
///     async fn execute(&self, prompt: String, _meta: TaskMetadata) -> String {
///         let reply: Vec<&str> = prompt.split_whitespace().collect(); // the model's tokens
///         running::report_used(reply.len() as u64);
///         reply.join(" ")
///     }
/// }
/// ```
pub fn report_used(units: u64) -> bool {
    with_current(|context| context.cancellation.report_used(units)).is_some()
}

/// Tells the pool that the task this worker thread is running failed in a way worth trying
/// again (a provider's 429 or 503, a connection reset), and why. When the pool retries
/// failed runs (its limits' `retry`), whatever this run returns is discarded and the task
/// parks again after a backoff, to run again; after its last attempt it ends `Failed`
/// with every run's reason. Without retries, the run ends `Failed` with `reason` (its
/// result discarded all the same). A second call in the same run keeps the first reason.
/// Returns `false` outside a run.
///
/// ```
/// use async_trait::async_trait;
/// use prometheus_parking_lot_actors::domain::TaskMetadata;
/// use prometheus_parking_lot_actors::worker::executor::TaskExecutor;
/// use prometheus_parking_lot_actors::running;
///
/// struct Call;
///
/// #[async_trait]
/// impl TaskExecutor<String, String> for Call {
///     async fn execute(&self, prompt: String, _meta: TaskMetadata) -> String {
///         let status = 429; // what the provider answered
///         if status == 429 {
///             running::retry_later("the provider answered 429 Too Many Requests");
///             return String::new();
///         }
///         prompt
///     }
/// }
/// ```
pub fn retry_later(reason: impl Into<String>) -> bool {
    let reason = reason.into();
    with_current(|context| context.cancellation.retry_later(reason)).is_some()
}

/// The partial-result sink of the task this worker thread is running, when its submitter
/// streams results of type `R` (`submit_streaming`); `None` otherwise (not streamed, another
/// item type, or outside a run).
pub fn partials<R: Send + 'static>() -> Option<Partials<R>> {
    with_current(|context| context.stream.clone())
        .flatten()
        .and_then(Partials::from_erased)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_is_visible_only_while_entered() {
        assert!(cancellation().is_none());
        assert!(!is_cancelled());
        let flag = Cancellation::new();
        {
            let _entered = enter(RunContext {
                cancellation: flag.clone(),
                stream: None,
                lineage: Lineage::default(),
            });
            assert!(!is_cancelled());
            flag.cancel();
            assert!(is_cancelled());
            assert!(partials::<String>().is_none(), "not a streamed task");
        }
        assert!(cancellation().is_none());
        assert!(!is_cancelled());
    }

    #[tokio::test]
    async fn cancelled_completes_once_the_flag_is_raised() {
        let flag = Cancellation::new();
        let waiter = tokio::spawn({
            let flag = flag.clone();
            async move { flag.cancelled().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        flag.cancel();
        flag.cancel();
        waiter.await.expect("woken");
        flag.cancelled().await; // already raised: returns at once
    }
}
