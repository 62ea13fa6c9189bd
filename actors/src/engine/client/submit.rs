//! Submitting: one task, a batch, a streamed task; from async code or a plain thread.
//!
//! Submissions go through the scheduler's lock-free inbox, not one actor message each; the
//! admission answer comes back on a oneshot, checked awake for a short while before the
//! submitter sleeps on it.

use tokio::sync::oneshot;

use super::PoolClient;
use crate::domain::{MailboxKey, OnDuplicate, PoolError, ScheduledTask, TaskId};
use crate::observe::trace::SubmitSpan;
use crate::running::stream::{ResultStream, StreamAttachment};
use crate::scheduler::protocol::{Extras, Reply, Submission, SubmitOptions};
use crate::sync::parker::block_on_until;
use crate::sync::slots::SlotGuard;
use crate::sync::spin::AdaptiveSpin;
use crate::util::contain::drop_contained;
use crate::worker::thread::is_worker_of;

/// How many times a submitter re-checks for its admission answer (yielding the CPU with
/// `sched_yield` between checks) before it sleeps on it, at most. A busy scheduler answers
/// within a few microseconds, well inside this window, and catching the answer awake spares
/// the submitter's thread a kernel wake-up per task (tens of microseconds on a virtual
/// machine). Bounded: at most this many yields, and at most
/// [`SPIN_TIME`](crate::sync::spin::SPIN_TIME) (see [`crate::sync::spin`]). The budget adapts
/// ([`AdaptiveSpin`]): where answers take a database round trip (a pool parking to a shared
/// queue), spins fail, and submitters soon sleep at once instead of burning the CPU the
/// database needs.
pub(super) const ANSWER_SPIN_ROUNDS: u32 = 64;

/// Ends a submission's span, if it has one, with its admission answer; returns the answer.
fn end_span(
    span: Option<Box<dyn SubmitSpan>>,
    answer: Result<MailboxKey, PoolError>,
) -> Result<MailboxKey, PoolError> {
    if let Some(span) = span {
        span.end(answer.as_ref());
    }
    answer
}

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

impl<P, R> PoolClient<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Admits a task; returns the mailbox key its result will be stored under.
    pub async fn submit(
        &self,
        task: ScheduledTask<P>,
        mut options: SubmitOptions,
    ) -> Result<MailboxKey, PoolError> {
        let span = self.trace_submission(&task, 1, &mut options);
        let answer = async {
            let (mark, checked) = self.no_result_waits(std::slice::from_ref(&task)).await;
            if let Some(Err(refusal)) = checked.into_iter().next() {
                return self.attach_or_refuse(task, refusal);
            }
            let answer = self.send_submission(task, options, None, mark)?;
            admission_answer(&self.inner.answer_spin, answer)
                .await
                .unwrap_or(Err(PoolError::Shutdown))
        };
        end_span(span, answer.await)
    }

    /// The span of a submission of `count` tasks, the first of them `first`, where the pool
    /// traces: the tasks then carry its context in `options`. A submission from inside a
    /// running task, without a trace of its own, joins that task's.
    fn trace_submission(
        &self,
        first: &ScheduledTask<P>,
        count: usize,
        options: &mut SubmitOptions,
    ) -> Option<Box<dyn SubmitSpan>> {
        if options.trace.is_none() {
            options.trace = crate::running::current_trace();
        }
        let tracer = self.inner.tracer.as_ref()?;
        let span = tracer.submitting(self.name(), &first.meta, count, options.trace)?;
        options.trace = Some(span.context());
        Some(span)
    }

    /// Admits a schedule's tick (`schedules.rs`), without the stored-result check: a tick's
    /// task id is new by construction. Its future is `Send` for any `P: Send`, so the
    /// periodic enqueuer runs on the pool's runtime.
    pub(super) async fn submit_tick(
        &self,
        task: ScheduledTask<P>,
    ) -> Result<MailboxKey, PoolError> {
        let answer = self.send_submission(task, SubmitOptions::default(), None, None)?;
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
    ///
    /// Also the watch's mark, read before the question: the scheduler refuses a task whose
    /// earlier result was still on its way to the database then (see `mailbox/watch.rs`).
    async fn no_result_waits(
        &self,
        tasks: &[ScheduledTask<P>],
    ) -> (Option<u64>, Vec<Result<(), PoolError>>) {
        let mark = self.inner.results_watch.as_ref().map(|watch| watch.mark());
        (mark, self.ask_mailbox(tasks).await)
    }

    /// The mailbox's answers for [`no_result_waits`](Self::no_result_waits).
    async fn ask_mailbox(&self, tasks: &[ScheduledTask<P>]) -> Vec<Result<(), PoolError>> {
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
        mut options: SubmitOptions,
    ) -> Result<MailboxKey, PoolError> {
        let span = self.trace_submission(&task, 1, &mut options);
        let answer = || {
            let checked = block_on_until(self.no_result_waits(std::slice::from_ref(&task)), None);
            let (mark, checked) = checked.unwrap_or_default();
            if let Some(Err(refusal)) = checked.into_iter().next() {
                return self.attach_or_refuse(task, refusal);
            }
            let answer = self.send_submission(task, options, None, mark)?;
            block_on_until(admission_answer(&self.inner.answer_spin, answer), None)
                .flatten()
                .unwrap_or(Err(PoolError::Shutdown))
        };
        end_span(span, answer())
    }

    /// Admits a task whose executor streams partial results (see [`crate::running::stream`]): the
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
        let mut options = options;
        let span = self.trace_submission(&task, 1, &mut options);
        let answer = async {
            let answer = self.send_submission(task, options, Some(attachment), None)?;
            admission_answer(&self.inner.answer_spin, answer)
                .await
                .unwrap_or(Err(PoolError::Shutdown))
        };
        end_span(span, answer.await)?;
        Ok(stream)
    }

    /// Like [`submit_streaming`](Self::submit_streaming), blocking a plain thread until the
    /// admission answer; read the stream with
    /// [`ResultStream::into_blocking_iter`](crate::running::stream::ResultStream::into_blocking_iter).
    pub fn submit_streaming_blocking(
        &self,
        task: ScheduledTask<P>,
        options: SubmitOptions,
        buffer: usize,
    ) -> Result<ResultStream<R>, PoolError> {
        block_on_until(self.submit_streaming(task, options, buffer), None)
            .unwrap_or(Err(PoolError::Shutdown))
    }

    /// Hands one submission to the inbox, with the watch's `results_mark` if the mailbox was
    /// asked; the receiver gets the admission answer. Refuses at once
    /// (`NestedBudgetExhausted`) a submission from one of the pool's own workers that finds
    /// no nested slot free (see [`crate::sync::slots`]).
    fn send_submission(
        &self,
        mut task: ScheduledTask<P>,
        options: SubmitOptions,
        stream: Option<StreamAttachment>,
        results_mark: Option<u64>,
    ) -> Result<oneshot::Receiver<Result<MailboxKey, PoolError>>, PoolError> {
        let slot = match self.nested_slot() {
            Ok(slot) => slot,
            Err(refusal) => {
                drop_contained(task);
                return Err(refusal);
            }
        };
        if slot.is_some() {
            crate::running::inherit(&mut task.meta);
        }
        let extras = (stream.is_some() || slot.is_some() || results_mark.is_some()).then(|| {
            Box::new(Extras {
                stream,
                slot,
                results_mark,
                ..Extras::default()
            })
        });
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
        mut options: SubmitOptions,
    ) -> Vec<Result<MailboxKey, PoolError>> {
        let span = match tasks.first() {
            Some(first) => self.trace_submission(first, tasks.len(), &mut options),
            None => None,
        };
        let answers = self.submit_batch_in_span(tasks, options).await;
        if let Some(span) = span {
            let first_refusal = answers.iter().find(|answer| answer.is_err());
            span.end(first_refusal.unwrap_or(&answers[0]).as_ref());
        }
        answers
    }

    /// [`submit_batch`](Self::submit_batch) once its span (if any) is open.
    async fn submit_batch_in_span(
        &self,
        tasks: Vec<ScheduledTask<P>>,
        options: SubmitOptions,
    ) -> Vec<Result<MailboxKey, PoolError>> {
        let (mark, checked) = self.no_result_waits(&tasks).await;
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
            let mut admitted = Box::pin(self.submit_checked_batch(going, options, mark))
                .await
                .into_iter();
            return answers
                .into_iter()
                .map(|answer| {
                    answer.unwrap_or_else(|| admitted.next().unwrap_or(Err(PoolError::Shutdown)))
                })
                .collect();
        }
        self.submit_checked_batch(tasks, options, mark).await
    }

    /// [`submit_batch`](Self::submit_batch) of tasks no stored result stands in the way of.
    async fn submit_checked_batch(
        &self,
        tasks: Vec<ScheduledTask<P>>,
        options: SubmitOptions,
        results_mark: Option<u64>,
    ) -> Vec<Result<MailboxKey, PoolError>> {
        if is_worker_of(&self.inner.nested) {
            return self.submit_nested_batch(tasks, options, results_mark).await;
        }
        let count = tasks.len();
        let (reply, answers) = oneshot::channel();
        self.inner.inbox.submit(Submission::Batch {
            tasks,
            options,
            reply,
            slots: Vec::new(),
            results_mark,
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
        results_mark: Option<u64>,
    ) -> Vec<Result<MailboxKey, PoolError>> {
        let count = tasks.len();
        let mut answers: Vec<Option<Result<MailboxKey, PoolError>>> = Vec::with_capacity(count);
        let (mut sent, mut slots) = (Vec::new(), Vec::new());
        for mut task in tasks {
            match self.nested_slot() {
                Ok(slot) => {
                    crate::running::inherit(&mut task.meta);
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
                results_mark,
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
}
