//! Retrieving: taking a result from the mailbox, at once, after a short spin, or after
//! waiting on the key's notification; from async code or a plain thread.
//!
//! Results are taken straight from the mailbox (before subscribing to it, so a result that
//! is already there costs no subscription). Blocking callers on plain threads wait on a
//! three-state [parker](crate::sync::parker), never on a hop through the pool's runtime.
//!
//! Where the pool can know that no result will come (its mailbox is in this process's
//! memory, no other node runs its tasks, and the retrieve names a key the pool made or a
//! task id), a retrieve that has found nothing for [`ASK_AFTER`] asks the scheduler, while
//! it waits on, whether a live task will store one; if none will, and nothing waits in the
//! mailbox, it says so at once (`NothingToRetrieve`) instead of waiting out its timeout. A retrieve whose wait runs
//! out tells the scheduler, which applies the pool's `OnGiveUp` rule to the task (see
//! `scheduler/shell/waiters.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::{deadline_after, PoolClient};
use crate::domain::{BackendError, MailboxKey, PoolError, TaskId};
use crate::mailbox::{Delivery, Mailbox, MailboxError};
use crate::scheduler::shell::waiters::{GaveUp, RetrievalNote};
use crate::sync::parker::block_on_until;

/// How long a retrieve waits for its result before it asks the scheduler whether one can
/// still come. The results of short tasks mostly come within it, and then cost the scheduler
/// no question (an inbox push, an allocation or two, perhaps a wake-up); for a key with
/// nothing to come, a millisecond is still "at once" beside any timeout a caller sets.
const ASK_AFTER: Duration = Duration::from_millis(1);

/// The pause before a retrieve asks again a mailbox it could not reach; each failure in a
/// row doubles it, up to [`RETRY_AT_MOST`].
const RETRY_FIRST: Duration = Duration::from_millis(25);

/// The longest pause between two tries of a mailbox that cannot be reached.
const RETRY_AT_MOST: Duration = Duration::from_secs(1);

/// A retrieve's memory of a mailbox it could not reach (a database restarting, say): while
/// its time lasts, a retrieve asks again after a pause instead of failing, and returns the
/// result once the mailbox answers. When its time runs out before the mailbox answers
/// again, the last failure is its answer: it says that the result is still stored and to
/// retrieve again.
#[derive(Default)]
struct Unreached {
    /// The last failure, while the mailbox has not answered since; the pause before the
    /// next try.
    state: std::sync::Mutex<(Option<PoolError>, Duration)>,
}

impl Unreached {
    /// A try failed with `error`, which a later try may not meet: returns how long to pause.
    fn failed(&self, error: PoolError) -> Duration {
        let mut state = self.lock();
        let pause = if state.0.is_some() {
            (state.1 * 2).min(RETRY_AT_MOST)
        } else {
            RETRY_FIRST
        };
        *state = (Some(error), pause);
        pause
    }

    /// The mailbox answered.
    fn answered(&self) {
        self.lock().0 = None;
    }

    /// Whether the last try failed.
    fn failing(&self) -> bool {
        self.lock().0.is_some()
    }

    /// The answer of a retrieve whose time ran out: the last failure, if the mailbox has
    /// not answered since, else `Timeout`.
    fn out_of_time(&self) -> PoolError {
        self.lock().0.take().unwrap_or(PoolError::Timeout)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<PoolError>, Duration)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Sleeps `pause`: on the runtime when there is one, else on this plain thread (a blocking
/// retrieve polls its wait there).
async fn sleep(pause: Duration) {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::time::sleep(pause).await;
    } else {
        std::thread::sleep(pause);
    }
}

impl<P, R> PoolClient<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Waits up to `timeout` for the oldest result under `key` and takes it.
    ///
    /// Cancel-safe: if the returned future is dropped, no result is lost; it stays stored for
    /// the next retrieve, and its task carries on. A timeout (`PoolError::Timeout`) consumes
    /// nothing either; it tells the pool that this waiter gave up, and a pool that abandons
    /// such tasks (`OnGiveUp::Abandon`, the default with an in-memory mailbox) abandons the
    /// task when the pool made its key: it never starts, or its result is dropped. A task
    /// that ended without a result (panic, timeout, cancel, expiry, shutdown) gives the
    /// `PoolError` variant that says which. Where the pool can tell that no result will come
    /// under `key` (see the module docs) the answer is `NothingToRetrieve`, at once.
    /// `Duration::MAX` waits for ever. Needs a tokio runtime with time enabled unless the
    /// result is there already.
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
        let unreached = Unreached::default();
        let outcome = self.take_within(key, task_id, timeout, &unreached).await;
        self.after_give_up(key, task_id, timeout, outcome).await
    }

    async fn take_within(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
        timeout: Duration,
        unreached: &Unreached,
    ) -> Result<R, PoolError> {
        match self.try_take(key, task_id).await {
            Ok(Some(delivery)) => return delivery.outcome.map_err(PoolError::from),
            Ok(None) => {}
            // Asked again, after a pause, in the wait below.
            Err(error) if error.is_retryable() => drop(unreached.failed(error)),
            Err(error) => return Err(error),
        }
        if let Some(delivery) = self.spin_take(key, task_id)? {
            return delivery.outcome.map_err(PoolError::from);
        }
        let wait = async {
            if self.can_tell(key, task_id) {
                let early =
                    tokio::time::timeout(ASK_AFTER, self.wait_for(key, task_id, unreached)).await;
                if let Ok(outcome) = early {
                    return outcome;
                }
            }
            self.wait_or_nothing(key, task_id, unreached).await
        };
        match tokio::time::Instant::now().checked_add(timeout) {
            Some(deadline) => tokio::time::timeout_at(deadline, wait)
                .await
                .unwrap_or_else(|_| Err(unreached.out_of_time())),
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
        let unreached = Unreached::default();
        let early = self
            .can_tell(key, task_id)
            .then(|| {
                let ask_at = deadline_after(ASK_AFTER);
                let until = deadline.map_or(ask_at, |deadline| ask_at.map(|at| at.min(deadline)));
                block_on_until(self.wait_for(key, task_id, &unreached), until)
            })
            .flatten();
        let outcome = match early {
            Some(outcome) => outcome,
            None if deadline.is_some_and(|deadline| Instant::now() >= deadline) => {
                Err(unreached.out_of_time())
            }
            None => block_on_until(self.wait_or_nothing(key, task_id, &unreached), deadline)
                .unwrap_or_else(|| Err(unreached.out_of_time())),
        };
        block_on_until(self.after_give_up(key, task_id, timeout, outcome), None)
            .unwrap_or(Err(PoolError::Timeout))
    }

    /// Takes the oldest result under `key` without waiting: `ResultNotFound` if none.
    pub async fn try_retrieve(&self, key: &MailboxKey) -> Result<R, PoolError> {
        match self.try_take(key, None).await? {
            Some(delivery) => delivery.outcome.map_err(PoolError::from),
            None => Err(PoolError::ResultNotFound),
        }
    }

    /// Waits (without a time limit) until a matching result is stored, and takes it; or,
    /// where the pool can tell (see the module docs), ends with `NothingToRetrieve` as soon
    /// as the scheduler says no live task will store one.
    async fn wait_or_nothing(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
        unreached: &Unreached,
    ) -> Result<R, PoolError> {
        let wait = self.wait_for(key, task_id, unreached);
        let Some(asked) = self.ask_if_awaited(key, task_id) else {
            return wait.await;
        };
        tokio::pin!(wait);
        tokio::select! {
            biased;
            outcome = &mut wait => outcome,
            live = asked => match live {
                Ok(false) => self.last_take(key, task_id).await,
                // Live, or the scheduler stopped and cannot tell: wait as before.
                _ => wait.await,
            },
        }
    }

    /// Asks the scheduler whether a live task will store a result under `key` (for
    /// `task_id`), where it can tell; `None` where it cannot.
    fn ask_if_awaited(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
    ) -> Option<oneshot::Receiver<bool>> {
        if !self.can_tell(key, task_id) {
            return None;
        }
        let (answer, asked) = oneshot::channel();
        self.inner.inbox.ask(RetrievalNote::Ask {
            key: key.clone(),
            task: task_id,
            answer,
        });
        Some(asked)
    }

    /// Whether the scheduler can find the task a retrieve of `key` (and `task_id`) means,
    /// and knows every result stored under it.
    fn can_tell(&self, key: &MailboxKey, task_id: Option<TaskId>) -> bool {
        self.inner.knows_its_keys && (task_id.is_some() || key.is_anonymous())
    }

    /// What waits under `key` once the scheduler said no live task will store anything
    /// there: the result, if it came meanwhile, else `NothingToRetrieve`.
    async fn last_take(&self, key: &MailboxKey, task_id: Option<TaskId>) -> Result<R, PoolError> {
        match self.try_take(key, task_id).await? {
            Some(delivery) => delivery.outcome.map_err(PoolError::from),
            None => Err(PoolError::NothingToRetrieve { task: task_id }),
        }
    }

    /// Waits (without a time limit) until a matching result is stored, and takes it. A
    /// mailbox it cannot reach is asked again after a pause (see [`Unreached`]): a
    /// notification sent while it was away may be lost, so it does not wait for one.
    async fn wait_for(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
        unreached: &Unreached,
    ) -> Result<R, PoolError> {
        if unreached.failing() {
            if let Some(delivery) = self.take_riding(key, task_id, unreached).await? {
                return delivery.outcome.map_err(PoolError::from);
            }
        } else if let Some(delivery) = self.try_take(key, task_id).await? {
            return delivery.outcome.map_err(PoolError::from);
        }
        let watch = Watch::new(self.inner.mailbox.as_ref(), key);
        loop {
            let notified = watch.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(delivery) = self.take_riding(key, task_id, unreached).await? {
                return delivery.outcome.map_err(PoolError::from);
            }
            if !unreached.failing() {
                notified.await;
            }
        }
    }

    /// [`try_take`](Self::try_take), where a failure that may pass (the mailbox cannot be
    /// reached) is remembered in `unreached` and reads as nothing found, after its pause.
    async fn take_riding(
        &self,
        key: &MailboxKey,
        task_id: Option<TaskId>,
        unreached: &Unreached,
    ) -> Result<Option<Delivery<R>>, PoolError> {
        match self.try_take(key, task_id).await {
            Ok(found) => {
                unreached.answered();
                Ok(found)
            }
            Err(error) if error.is_retryable() => {
                let pause = unreached.failed(error);
                tracing::debug!(
                    pool = self.name(),
                    ?pause,
                    "a retrieve could not reach the mailbox; asking again"
                );
                sleep(pause).await;
                Ok(None)
            }
            Err(error) => Err(error),
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
        if let (Ok(Some(delivery)), Some(watch)) = (&taken, &self.inner.results_watch) {
            // Taken: a submission of the same id does not wait for it any more.
            watch.taken(key, delivery.task_id);
        }
        taken.map_err(|error| self.mailbox_error(mailbox.backend(), error))
    }

    /// Passes a retrieve's outcome through; one that gave up (`Timeout`) first tells the
    /// scheduler, which applies the pool's `OnGiveUp` rule to the task, and is logged (at
    /// debug level: `PoolError::Timeout` carries nothing, as code matches it as a bare
    /// variant) with its key and task, how long it waited, what the pool was doing then and
    /// what became of the task. When the scheduler says no live task stores under the key,
    /// a result that came meanwhile is returned after all, or, where the pool knows its
    /// keys, `NothingToRetrieve`.
    async fn after_give_up(
        &self,
        key: &MailboxKey,
        task: Option<TaskId>,
        waited: Duration,
        outcome: Result<R, PoolError>,
    ) -> Result<R, PoolError> {
        if outcome.as_ref().err() != Some(&PoolError::Timeout) {
            return outcome;
        }
        let became = self.tell_gave_up(key, task).await;
        let stats = self.stats();
        tracing::debug!(
            pool = self.name(),
            tenant = %key.tenant,
            user = key.user_id.as_deref(),
            session = key.session_id.as_deref(),
            task,
            waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            running = stats.active_tasks,
            parked = stats.queued_tasks,
            then = became.map_or("the pool could not say what became of the task", GaveUp::describe),
            "a retrieve gave up before a result came"
        );
        match became {
            Some(GaveUp::NotLive) if self.can_tell(key, task) => self.last_take(key, task).await,
            _ => outcome,
        }
    }

    /// Tells the scheduler that a retrieve of `key` (and `task`) gave up, and what it did
    /// about it; `None` once the scheduler has stopped. A key the caller named, without an
    /// id, names no one task, and its tasks are always kept: nobody is told.
    async fn tell_gave_up(&self, key: &MailboxKey, task: Option<TaskId>) -> Option<GaveUp> {
        if task.is_none() && !key.is_anonymous() {
            return Some(GaveUp::Kept);
        }
        let (answer, told) = oneshot::channel();
        self.inner.inbox.ask(RetrievalNote::GaveUp {
            key: key.clone(),
            task,
            answer,
        });
        told.await.ok()
    }

    /// The error of a mailbox of `backend` that could not hand over a result.
    fn mailbox_error(&self, backend: &str, error: MailboxError) -> PoolError {
        let MailboxError::Backend(fault) = error;
        let mailbox = format!("{backend} mailbox");
        PoolError::from(BackendError::new(
            self.name(),
            mailbox,
            "take a result",
            fault,
        ))
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
