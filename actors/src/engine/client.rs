//! [`PoolClient`]: submit, retrieve, cancel, stats and shutdown for one running pool.
//!
//! Submissions go through the scheduler's lock-free inbox, not one actor message each; the
//! admission answer comes back on a oneshot. Results are taken straight from the mailbox
//! (before subscribing to it, so a result that is already there costs no subscription).
//! Blocking callers on plain threads wait on a three-state [parker](crate::parker), never
//! on a hop through the pool's runtime.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{ActorRef, DerivedActorRef};
use tokio::sync::{oneshot, Notify, OnceCell};

use crate::budget::{SlotBudget, SlotGuard};
use crate::contain::drop_contained;
use crate::domain::{BackendError, MailboxKey, OnDuplicate, PoolError, ScheduledTask, TaskId};
use crate::events::{EventFeed, FeedEvent};
use crate::inspect::PoolView;
use crate::mailbox::{Delivery, Mailbox, MailboxError, Notifier};
use crate::parker::block_on_until;
use crate::permit::{Gate, PermitPort};
use crate::queue::{EntryId, KeptLetter, QueueError, SharedQueue};
use crate::scheduler::inbox::Inbox;
use crate::scheduler::protocol::{
    Extras, Reply, SchedulerMsg, SchedulerRequest, ShutdownReport, Submission, SubmitOptions,
};
use crate::scheduler::shell::Rerun;
use crate::spin::AdaptiveSpin;
use crate::stats::{PoolCounters, PoolStats};
use crate::stream::{ResultStream, StreamAttachment};
use crate::supervisor::SupervisorMsg;
use crate::worker::thread::is_worker_of;

/// How long `shutdown` waits for each actor to drain its messages after the task drain.
const ACTOR_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times a submitter re-checks for its admission answer (yielding the CPU with
/// `sched_yield` between checks) before it sleeps on it, at most. A busy scheduler answers
/// within a few microseconds, well inside this window, and catching the answer awake spares
/// the submitter's thread a kernel wake-up per task (tens of microseconds on a virtual
/// machine). Bounded: at most this many yields, and at most
/// [`SPIN_TIME`](crate::spin::SPIN_TIME) (see [`crate::spin`]). The budget adapts
/// ([`AdaptiveSpin`]): where answers take a database round trip (a pool parking to a shared
/// queue), spins fail, and submitters soon sleep at once instead of burning the CPU the
/// database needs.
const ANSWER_SPIN_ROUNDS: u32 = 64;

/// The admission answer: checked at once, then for a while (see [`ANSWER_SPIN_ROUNDS`]),
/// then awaited. `None` when the scheduler dropped the question (it stopped).
async fn admission_answer<T>(spin: &AdaptiveSpin, mut answer: oneshot::Receiver<T>) -> Option<T> {
    let mut check = || match answer.try_recv() {
        Ok(value) => Some(Some(value)),
        Err(oneshot::error::TryRecvError::Closed) => Some(None),
        Err(oneshot::error::TryRecvError::Empty) => None,
    };
    if let Some(answered) = check().or_else(|| spin.spin(check)) {
        return answered;
    }
    answer.await.ok()
}

/// A handle to one running pool: submit, retrieve, cancel, stats, shutdown. Cheap to clone.
pub struct PoolClient<P, R> {
    inner: Arc<ClientInner<P, R>>,
}

impl<P, R> Clone for PoolClient<P, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// What a client is made of, as [`start_pool`](super::start_pool) wired it.
pub(crate) struct ClientParts<P, R> {
    pub name: Arc<str>,
    pub scheduler: ActorRef<SchedulerMsg<P>>,
    pub inbox: Arc<Inbox<P, R>>,
    pub mailbox: Arc<dyn Mailbox<R>>,
    pub notifiers: Vec<Arc<dyn Notifier>>,
    pub counters: Arc<PoolCounters>,
    pub supervisor: ActorRef<SupervisorMsg>,
    /// Whether shutdown stops the supervisor too (a pool started with its own).
    pub owns_supervisor: bool,
    /// The nested slots that submissions from the pool's own workers must take.
    pub nested: Arc<SlotBudget>,
    /// How the scheduler copies payloads to rerun preempted tasks (see `preempt_tasks`).
    pub rerun: Rerun<P>,
    /// What a submission whose result waits already gets (see [`OnDuplicate`]).
    pub on_duplicate: OnDuplicate,
    /// The pool's events, for whoever listens.
    pub feed: Arc<EventFeed>,
    /// The shared queue the pool is a node of, if any (for its dead letters).
    pub shared_queue: Option<Arc<dyn SharedQueue<P>>>,
}

struct ClientInner<P, R> {
    name: Arc<str>,
    scheduler: ActorRef<SchedulerMsg<P>>,
    inbox: Arc<Inbox<P, R>>,
    mailbox: Arc<dyn Mailbox<R>>,
    /// Flushed at shutdown, once the mailbox has handed them every event.
    notifiers: Vec<Arc<dyn Notifier>>,
    counters: Arc<PoolCounters>,
    supervisor: ActorRef<SupervisorMsg>,
    owns_supervisor: bool,
    /// The pool's events, for whoever listens.
    feed: Arc<EventFeed>,
    /// The shared queue the pool is a node of, if any.
    shared_queue: Option<Arc<dyn SharedQueue<P>>>,
    /// The one shutdown every caller waits for.
    shutdown: OnceCell<Result<ShutdownReport, PoolError>>,
    /// How long async retrieves re-check an inline mailbox before they sleep.
    result_spin: AdaptiveSpin,
    /// How long submitters re-check for their admission answer before they sleep.
    answer_spin: AdaptiveSpin,
    nested: Arc<SlotBudget>,
    rerun: Rerun<P>,
    on_duplicate: OnDuplicate,
}

/// Where a deadline is: `None` when `timeout` is too long to represent (wait for ever).
fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

impl<P, R> PoolClient<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    pub(crate) fn new(parts: ClientParts<P, R>) -> Self {
        let ClientParts {
            name,
            scheduler,
            inbox,
            mailbox,
            notifiers,
            counters,
            supervisor,
            owns_supervisor,
            nested,
            rerun,
            on_duplicate,
            feed,
            shared_queue,
        } = parts;
        Self {
            inner: Arc::new(ClientInner {
                name,
                scheduler,
                inbox,
                mailbox,
                notifiers,
                counters,
                supervisor,
                owns_supervisor,
                shutdown: OnceCell::new(),
                feed,
                shared_queue,
                result_spin: AdaptiveSpin::new(),
                answer_spin: AdaptiveSpin::with_max(ANSWER_SPIN_ROUNDS),
                nested,
                rerun,
                on_duplicate,
            }),
        }
    }

    /// A gate over this pool's capacity: its [`Permit`](crate::permit::Permit)s and its
    /// tasks share one budget and one order.
    pub fn gate(&self) -> Gate {
        let port: Arc<dyn PermitPort> = self.inner.inbox.clone();
        Gate::new(port, self.inner.counters.clone())
    }

    /// Lets the pool preempt its running tasks too, not only permits, when its limits turn
    /// preemption on (`PoolLimits::preemption`) and its queue is in memory: a task asked to
    /// yield sees [`running::is_preempted`](crate::running::is_preempted) (and its
    /// cancellation flag) raised; when its executor returns, what it returned is discarded
    /// and the task parks again at its rank and runs again later, at most `max_per_task`
    /// times. The pool keeps a clone of each running task's payload for this, which is why
    /// the payload must be `Clone`. Calling it again does nothing.
    pub fn preempt_tasks(&self)
    where
        P: Clone,
    {
        self.keep_payload_copies();
    }

    /// Has the scheduler keep a clone of each running task's payload, for the reruns of
    /// `preempt_tasks` and `retry_tasks` (one copy serves both).
    fn keep_payload_copies(&self)
    where
        P: Clone,
    {
        let _ = self.inner.rerun.set(<P as Clone>::clone);
    }

    /// Lets the pool run a failed task again in memory, when its limits retry failed runs
    /// (`PoolLimits::retry`): the pool keeps a clone of each running task's payload, to run
    /// it again after a backoff when the run panicked or asked for it
    /// ([`running::retry_later`](crate::running::retry_later)), hence `Clone`. A durable
    /// local queue (yaque) keeps the payload itself and needs no call. The same copy serves
    /// [`preempt_tasks`](Self::preempt_tasks); calling either again does nothing.
    pub fn retry_tasks(&self)
    where
        P: Clone,
    {
        self.keep_payload_copies();
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The scheduler actor, for callers that speak the actor protocol: it takes
    /// [`SchedulerRequest`]s only.
    pub fn scheduler(&self) -> DerivedActorRef<SchedulerRequest<P>> {
        self.inner.scheduler.get_derived()
    }

    /// The supervisor the pool runs under.
    pub fn supervisor(&self) -> &ActorRef<SupervisorMsg> {
        &self.inner.supervisor
    }

    /// Admits a task; returns the mailbox key its result will be stored under.
    pub async fn submit(
        &self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
    ) -> Result<MailboxKey, PoolError> {
        if let Err(refusal) = self.no_result_waits(std::slice::from_ref(&task)).await[0].clone() {
            return self.attach_or_refuse(task, refusal);
        }
        let answer = self.send_submission(task, options, None)?;
        admission_answer(&self.inner.answer_spin, answer)
            .await
            .unwrap_or(Err(PoolError::Shutdown))
    }

    /// The answer to a submission the stored-result check stopped: under
    /// [`OnDuplicate::Attach`] its own key (the earlier result waits there), else `refusal`.
    /// The task is not run either way.
    fn attach_or_refuse(
        &self,
        task: ScheduledTask<P>,
        refusal: PoolError,
    ) -> Result<MailboxKey, PoolError> {
        let attach = self.inner.on_duplicate == OnDuplicate::Attach
            && matches!(refusal, PoolError::ResultPending(_));
        let key = attach.then(|| task.meta.mailbox.clone()).flatten();
        drop_contained(task);
        key.ok_or(refusal)
    }

    /// For each task, `ResultPending` when an earlier task's result waits under its key and
    /// id in a mailbox that awaits (a database): the new task would be answered with it.
    /// One question to the mailbox for them all. An inline mailbox is asked by the
    /// scheduler, at admission; an anonymous key is new, so it holds nothing. A mailbox that
    /// cannot answer (its database is away or slow) lets the tasks go on: the queue then
    /// answers for the outage, with an error that names it.
    async fn no_result_waits(&self, tasks: &[ScheduledTask<P>]) -> Vec<Result<(), PoolError>> {
        let mailbox = self.inner.mailbox.as_ref();
        let mut answers = vec![Ok(()); tasks.len()];
        if mailbox.inline().is_some() {
            return answers;
        }
        let (asked, wanted): (Vec<usize>, Vec<(MailboxKey, TaskId)>) = tasks
            .iter()
            .enumerate()
            .filter_map(|(index, task)| {
                let key = task
                    .meta
                    .mailbox
                    .as_ref()
                    .filter(|key| !key.is_anonymous())?;
                Some((index, (key.clone(), task.meta.id)))
            })
            .unzip();
        if wanted.is_empty() {
            return answers;
        }
        match mailbox.holds(&wanted).await {
            Ok(held) => {
                for ((index, (_, id)), held) in asked.into_iter().zip(&wanted).zip(held) {
                    if held {
                        answers[index] = Err(PoolError::ResultPending(*id));
                    }
                }
            }
            Err(error) => {
                tracing::debug!(mailbox = mailbox.backend(), %error, "could not ask the mailbox for earlier results; the submission goes on");
            }
        }
        answers
    }

    /// Admits a task from a plain thread, blocking it until the answer (no runtime needed).
    pub fn submit_blocking(
        &self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
    ) -> Result<MailboxKey, PoolError> {
        let checked = block_on_until(self.no_result_waits(std::slice::from_ref(&task)), None);
        if let Some(Err(refusal)) = checked.map(|mut answers| answers.swap_remove(0)) {
            return self.attach_or_refuse(task, refusal);
        }
        let answer = self.send_submission(task, options, None)?;
        block_on_until(admission_answer(&self.inner.answer_spin, answer), None)
            .flatten()
            .unwrap_or(Err(PoolError::Shutdown))
    }

    /// Admits a task whose executor streams partial results (see [`crate::stream`]): the
    /// stream yields each partial, then the final value or the error that ended the task.
    /// `buffer` partials wait at most (back-pressure on the executor). Dropping the stream
    /// before its end cancels the task. Refused (`InvalidConfig`) on a pool whose queue is
    /// shared with other nodes.
    pub async fn submit_streaming(
        &self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
        buffer: usize,
    ) -> Result<ResultStream<R>, PoolError> {
        let (attachment, stream) = ResultStream::channel(buffer)?;
        let answer = self.send_submission(task, options, Some(attachment))?;
        admission_answer(&self.inner.answer_spin, answer)
            .await
            .unwrap_or(Err(PoolError::Shutdown))?;
        Ok(stream)
    }

    /// Like [`submit_streaming`](Self::submit_streaming), blocking a plain thread until the
    /// admission answer; read the stream with
    /// [`ResultStream::into_blocking_iter`](crate::stream::ResultStream::into_blocking_iter).
    pub fn submit_streaming_blocking(
        &self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
        buffer: usize,
    ) -> Result<ResultStream<R>, PoolError> {
        block_on_until(self.submit_streaming(task, options, buffer), None)
            .unwrap_or(Err(PoolError::Shutdown))
    }

    /// Hands one submission to the inbox; the receiver gets the admission answer. Refuses at
    /// once (`NestedBudgetExhausted`) a submission from one of the pool's own workers that
    /// finds no nested slot free (see [`crate::budget`]).
    fn send_submission(
        &self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
        stream: Option<StreamAttachment>,
    ) -> Result<oneshot::Receiver<Result<MailboxKey, PoolError>>, PoolError> {
        let slot = match self.nested_slot() {
            Ok(slot) => slot,
            Err(refusal) => {
                drop_contained(task);
                return Err(refusal);
            }
        };
        let extras =
            (stream.is_some() || slot.is_some()).then(|| Box::new(Extras { stream, slot }));
        let (reply, answer) = oneshot::channel();
        self.inner.inbox.submit(Submission::One {
            task,
            options,
            reply: Reply::Oneshot(reply),
            extras,
        });
        Ok(answer)
    }

    /// A nested slot when the caller is one of this pool's worker threads (`None` on any
    /// other thread); `NestedBudgetExhausted` when it is one and none is free.
    fn nested_slot(&self) -> Result<Option<SlotGuard>, PoolError> {
        let nested = &self.inner.nested;
        if !is_worker_of(nested) {
            return Ok(None);
        }
        nested
            .try_acquire()
            .map(Some)
            .ok_or(PoolError::NestedBudgetExhausted {
                slots: nested.capacity(),
            })
    }

    /// Admits many tasks at once, for bulk producers: one trip through the inbox, one answer
    /// per task, in order.
    pub async fn submit_batch(
        &self,
        tasks: Vec<ScheduledTask<P>>,
        options: SubmitOptions,
    ) -> Vec<Result<MailboxKey, PoolError>> {
        let checked = self.no_result_waits(&tasks).await;
        if checked.iter().any(Result::is_err) {
            // Those refused keep their place in the answers; the others go on together.
            let mut answers: Vec<Option<Result<MailboxKey, PoolError>>> = Vec::new();
            let mut going = Vec::with_capacity(tasks.len());
            for (task, checked) in tasks.into_iter().zip(checked) {
                match checked {
                    Ok(()) => {
                        going.push(task);
                        answers.push(None);
                    }
                    Err(refusal) => answers.push(Some(self.attach_or_refuse(task, refusal))),
                }
            }
            let mut admitted = Box::pin(self.submit_checked_batch(going, options))
                .await
                .into_iter();
            return answers
                .into_iter()
                .map(|answer| {
                    answer.unwrap_or_else(|| admitted.next().unwrap_or(Err(PoolError::Shutdown)))
                })
                .collect();
        }
        self.submit_checked_batch(tasks, options).await
    }

    /// [`submit_batch`](Self::submit_batch) of tasks no stored result stands in the way of.
    async fn submit_checked_batch(
        &self,
        tasks: Vec<ScheduledTask<P>>,
        options: SubmitOptions,
    ) -> Vec<Result<MailboxKey, PoolError>> {
        if is_worker_of(&self.inner.nested) {
            return self.submit_nested_batch(tasks, options).await;
        }
        let count = tasks.len();
        let (reply, answers) = oneshot::channel();
        self.inner.inbox.submit(Submission::Batch {
            tasks,
            options,
            reply,
            slots: Vec::new(),
        });
        admission_answer(&self.inner.answer_spin, answers)
            .await
            .unwrap_or_else(|| vec![Err(PoolError::Shutdown); count])
    }

    /// A batch from one of the pool's own workers: each task takes a nested slot, and those
    /// that find none are refused in their place.
    async fn submit_nested_batch(
        &self,
        tasks: Vec<ScheduledTask<P>>,
        options: SubmitOptions,
    ) -> Vec<Result<MailboxKey, PoolError>> {
        let count = tasks.len();
        let mut answers: Vec<Option<Result<MailboxKey, PoolError>>> = Vec::with_capacity(count);
        let (mut sent, mut slots) = (Vec::new(), Vec::new());
        for task in tasks {
            match self.nested_slot() {
                Ok(slot) => {
                    slots.extend(slot);
                    sent.push(task);
                    answers.push(None);
                }
                Err(refusal) => {
                    drop_contained(task);
                    answers.push(Some(Err(refusal)));
                }
            }
        }
        let admitted = if sent.is_empty() {
            Vec::new()
        } else {
            let sent_count = sent.len();
            let (reply, answer) = oneshot::channel();
            self.inner.inbox.submit(Submission::Batch {
                tasks: sent,
                options,
                reply,
                slots,
            });
            admission_answer(&self.inner.answer_spin, answer)
                .await
                .unwrap_or_else(|| vec![Err(PoolError::Shutdown); sent_count])
        };
        let mut admitted = admitted.into_iter();
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| admitted.next().unwrap_or(Err(PoolError::Shutdown)))
            })
            .collect()
    }

    /// Waits up to `timeout` for the oldest result under `key` and takes it.
    ///
    /// Cancel-safe: if the returned future is dropped, no result is lost; it stays stored for
    /// the next retrieve. A timeout (`PoolError::Timeout`) consumes nothing either. A task
    /// that ended without a result (panic, timeout, cancel, expiry, shutdown) gives the
    /// `PoolError` variant that says which. `Duration::MAX` waits for ever. Needs a tokio
    /// runtime with time enabled unless the result is there already.
    pub async fn retrieve(&self, key: &MailboxKey, timeout: Duration) -> Result<R, PoolError> {
        self.retrieve_where(key, None, timeout).await
    }

    /// Like [`retrieve`](Self::retrieve), for the result of task `task_id` under `key`, when
    /// several tasks share a key.
    pub async fn retrieve_task(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
        timeout: Duration,
    ) -> Result<R, PoolError> {
        self.retrieve_where(key, Some(task_id), timeout).await
    }

    async fn retrieve_where(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
        timeout: Duration,
    ) -> Result<R, PoolError> {
        if let Some(delivery) = self.try_take(key, task_id).await? {
            return delivery.outcome.map_err(PoolError::from);
        }
        if let Some(delivery) = self.spin_take(key, task_id)? {
            return delivery.outcome.map_err(PoolError::from);
        }
        let wait = self.wait_for(key, task_id);
        match tokio::time::Instant::now().checked_add(timeout) {
            Some(deadline) => tokio::time::timeout_at(deadline, wait)
                .await
                .unwrap_or(Err(PoolError::Timeout)),
            None => wait.await,
        }
    }

    /// Like [`retrieve`](Self::retrieve), blocking a plain thread (no runtime needed); use it
    /// from synchronous code or `spawn_blocking`. It keeps working after shutdown.
    pub fn retrieve_blocking(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
        timeout: Duration,
    ) -> Result<R, PoolError> {
        let deadline = deadline_after(timeout);
        block_on_until(self.wait_for(key, task_id), deadline).unwrap_or(Err(PoolError::Timeout))
    }

    /// Takes the oldest result under `key` without waiting: `ResultNotFound` if none.
    pub async fn try_retrieve(&self, key: &MailboxKey) -> Result<R, PoolError> {
        match self.try_take(key, None).await? {
            Some(delivery) => delivery.outcome.map_err(PoolError::from),
            None => Err(PoolError::ResultNotFound),
        }
    }

    /// Waits (without a time limit) until a matching result is stored, and takes it.
    async fn wait_for(&self, key: &MailboxKey, task_id: Option<TaskId>) -> Result<R, PoolError> {
        if let Some(delivery) = self.try_take(key, task_id).await? {
            return delivery.outcome.map_err(PoolError::from);
        }
        let watch = Watch::new(self.inner.mailbox.as_ref(), key);
        loop {
            let notified = watch.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(delivery) = self.try_take(key, task_id).await? {
                return delivery.outcome.map_err(PoolError::from);
            }
            notified.await;
        }
    }

    /// Re-checks an inline mailbox for a short, adaptive while (see [`AdaptiveSpin`]) before
    /// the caller subscribes and sleeps; `None` if nothing came, or if the mailbox is not
    /// inline.
    fn spin_take(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
    ) -> Result<Option<Delivery<R>>, PoolError> {
        let mailbox = self.inner.mailbox.as_ref();
        let Some(inline) = mailbox.inline() else {
            return Ok(None);
        };
        let found = self.inner.result_spin.spin(|| {
            match task_id {
                None => inline.take_now(key),
                Some(id) => inline.take_task_now(key, id),
            }
            .transpose()
        });
        found
            .transpose()
            .map_err(|error| self.mailbox_error(mailbox.backend(), error))
    }

    async fn try_take(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
    ) -> Result<Option<Delivery<R>>, PoolError> {
        let mailbox = self.inner.mailbox.as_ref();
        let taken = match (mailbox.inline(), task_id) {
            (Some(inline), None) => inline.take_now(key),
            (Some(inline), Some(id)) => inline.take_task_now(key, id),
            (None, None) => mailbox.take(key).await,
            (None, Some(id)) => mailbox.take_task(key, id).await,
        };
        taken.map_err(|error| self.mailbox_error(mailbox.backend(), error))
    }

    /// Cancels the live task `id` submitted under `key` (the key `submit` returned): a parked
    /// one ends at once; a running one has its future dropped (its capacity is released when
    /// its thread returns). Both end `Cancelled`. `TaskNotFound` unless such a task is live
    /// under exactly that key, so one tenant can never cancel, or probe, another's tasks.
    pub async fn cancel(&self, key: &MailboxKey, id: TaskId) -> Result<(), PoolError> {
        let key = key.clone();
        match self
            .inner
            .scheduler
            .call(
                |reply| SchedulerRequest::Cancel { key, id, reply }.into(),
                None,
            )
            .await
        {
            Ok(CallResult::Success(result)) => result,
            _ => Err(PoolError::Shutdown),
        }
    }

    /// Pauses the pool: from now on it starts nothing (no parked task, no newcomer, no
    /// permit), while it keeps admitting (tasks park, up to `max_queue_depth`) and its
    /// running tasks run on and end as usual; on a shared queue the node claims nothing.
    /// Returns once paused. [`resume`](Self::resume) ends it.
    pub async fn pause(&self) -> Result<(), PoolError> {
        self.set_paused(true).await
    }

    /// Ends a pause: what fits starts at once, in rank order.
    pub async fn resume(&self) -> Result<(), PoolError> {
        self.set_paused(false).await
    }

    async fn set_paused(&self, paused: bool) -> Result<(), PoolError> {
        match self
            .inner
            .scheduler
            .call(
                |reply| SchedulerRequest::Pause { paused, reply }.into(),
                None,
            )
            .await
        {
            Ok(CallResult::Success(())) => Ok(()),
            _ => Err(PoolError::Shutdown),
        }
    }

    /// Drains the pool: new submissions are refused (`PoolError::Draining`), the tasks it
    /// has (parked and running) run to their end, and on a shared queue the node claims
    /// nothing more, so its share of the work goes to the other nodes. Returns once set;
    /// [`undrain`](Self::undrain) takes work again.
    pub async fn drain(&self) -> Result<(), PoolError> {
        self.set_drained(true).await
    }

    /// Ends a drain, and a pause: the pool takes new work again and starts what fits.
    pub async fn undrain(&self) -> Result<(), PoolError> {
        self.set_drained(false).await
    }

    async fn set_drained(&self, drained: bool) -> Result<(), PoolError> {
        match self
            .inner
            .scheduler
            .call(
                |reply| SchedulerRequest::Drain { drained, reply }.into(),
                None,
            )
            .await
        {
            Ok(CallResult::Success(())) => Ok(()),
            _ => Err(PoolError::Shutdown),
        }
    }

    /// The pool's work now: its running tasks (and held permits), parked tasks `offset..
    /// offset + limit` in rank order (at most [`MAX_PAGE`](crate::inspect::MAX_PAGE)) each
    /// with the reason it waits, and its tenants. See [`crate::inspect`]. On a shared queue
    /// it shows this node's tasks (the queue's parked tasks are the queue's).
    ///
    /// ```
    /// # use prometheus_parking_lot_actors::engine::PoolClient;
    /// # async fn show(pool: &PoolClient<String, String>) -> Result<(), prometheus_parking_lot_actors::domain::PoolError> {
    /// let view = pool.inspect(0, 50).await?;
    /// for task in &view.parked {
    ///     println!("task {} of {} waits: {:?}", task.id, task.key.tenant.0, task.reason);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, offset: usize, limit: usize) -> Result<PoolView, PoolError> {
        match self
            .inner
            .scheduler
            .call(
                |reply| {
                    SchedulerRequest::Inspect {
                        offset,
                        limit,
                        reply,
                    }
                    .into()
                },
                None,
            )
            .await
        {
            Ok(CallResult::Success(view)) => Ok(view),
            _ => Err(PoolError::Shutdown),
        }
    }

    /// Why the live task `id` submitted under exactly `key` has not started: the first
    /// obstacle (too few free units, its kind's budget, its tenant's share, no idle worker,
    /// the reservation, a retry's backoff, or the order of the rules; see
    /// [`WaitReason`](crate::scheduler::core::WaitReason)); `None` once it runs;
    /// `TaskNotFound` when no live task of this node has this id under `key` (ended, or
    /// parked in a shared queue rather than on this node).
    pub async fn why_waiting(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<crate::scheduler::core::WaitReason>, PoolError> {
        let key = key.clone();
        match self
            .inner
            .scheduler
            .call(
                |reply| SchedulerRequest::WhyWaiting { key, id, reply }.into(),
                None,
            )
            .await
        {
            Ok(CallResult::Success(result)) => result,
            _ => Err(PoolError::Shutdown),
        }
    }

    /// The dead letters the pool's shared queue keeps, oldest first, `offset..offset +
    /// limit`: tasks the queue gave up on and runs that ended `Failed`, each with its reason
    /// (see [`QueueMaintenance::list_dead_letters`](crate::queue::QueueMaintenance::list_dead_letters)).
    /// `InvalidConfig` for a pool whose queue is its own: only a shared queue keeps them.
    pub async fn dead_letters(
        &self,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<KeptLetter>, PoolError> {
        let queue = self.dead_letter_queue()?;
        let listed = queue.maintenance().list_dead_letters(offset, limit).await;
        listed.map_err(|error| self.dead_letter_error("list dead letters", error))
    }

    /// Parks dead letter `entry` again for any node, its attempts afresh; `false` when the
    /// queue keeps no dead letter `entry`.
    pub async fn retry_dead_letter(&self, entry: EntryId) -> Result<bool, PoolError> {
        let queue = self.dead_letter_queue()?;
        let retried = queue.maintenance().retry_dead_letter(entry).await;
        retried.map_err(|error| self.dead_letter_error("retry a dead letter", error))
    }

    /// Deletes dead letter `entry`, or all of them with `None`; returns how many.
    pub async fn purge_dead_letters(&self, entry: Option<EntryId>) -> Result<usize, PoolError> {
        let queue = self.dead_letter_queue()?;
        let purged = queue.maintenance().purge_dead_letters(entry).await;
        purged.map_err(|error| self.dead_letter_error("purge dead letters", error))
    }

    fn dead_letter_queue(&self) -> Result<&Arc<dyn SharedQueue<P>>, PoolError> {
        self.inner.shared_queue.as_ref().ok_or_else(|| {
            PoolError::InvalidConfig(format!(
                "pool {:?} keeps no dead letters: its queue is its own; a shared queue \
                 (postgres, postgres_pgmq) keeps them",
                self.inner.name
            ))
        })
    }

    /// The error of `operation` on the dead letters of the pool's shared queue.
    fn dead_letter_error(&self, operation: &str, error: QueueError) -> PoolError {
        let backend = self
            .inner
            .shared_queue
            .as_ref()
            .map_or("shared", |queue| queue.backend());
        let queue = format!("{backend} queue");
        let fault = crate::queue::actor::fault_of(error);
        PoolError::from(BackendError::new(
            &*self.inner.name,
            queue,
            operation,
            fault,
        ))
    }

    /// The error of a mailbox of `backend` that could not hand over a result.
    fn mailbox_error(&self, backend: &str, error: MailboxError) -> PoolError {
        let MailboxError::Backend(fault) = error;
        let mailbox = format!("{backend} mailbox");
        PoolError::from(BackendError::new(
            &*self.inner.name,
            mailbox,
            "take a result",
            fault,
        ))
    }

    /// Listens to the pool's events from now on (see [`EventFeed`]): every step of every
    /// task, as it happens, without payloads or results. A listener that falls more than
    /// [`EventFeed::CAPACITY`] events behind misses the oldest.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<FeedEvent> {
        self.inner.feed.subscribe()
    }

    /// A snapshot of the pool's counters, read without a message round trip.
    pub fn stats(&self) -> PoolStats {
        self.inner.counters.snapshot()
    }

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
                    pool: self.inner.name.clone(),
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

/// A subscription to one mailbox key, dropped (and the backend told) when the wait ends.
struct Watch<'a, R: Send + 'static> {
    mailbox: &'a dyn Mailbox<R>,
    key: &'a MailboxKey,
    notify: Option<Arc<Notify>>,
}

impl<'a, R: Send + 'static> Watch<'a, R> {
    fn new(mailbox: &'a dyn Mailbox<R>, key: &'a MailboxKey) -> Self {
        let notify = Some(mailbox.subscribe(key));
        Self {
            mailbox,
            key,
            notify,
        }
    }

    fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("present until dropped")
    }
}

impl<R: Send + 'static> Drop for Watch<'_, R> {
    fn drop(&mut self) {
        drop(self.notify.take());
        self.mailbox.unsubscribe(self.key);
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
