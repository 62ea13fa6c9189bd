//! The retrieves that wait on the pool's tasks: whether a result a retrieve asks for can
//! still come, and what a retrieve that gave up does to its task (the pool's
//! [`OnGiveUp`] rule).
//!
//! A retrieve names a key, and sometimes a task id. The shell can find the task it means
//! when the key is one the pool made (one task per key: `Ledger::entry_of_minted`) or when
//! the id is given (`Tasks::entry_of`); for a key the caller named without an id it cannot,
//! as any number of tasks may still be submitted under it, and the client does not ask.
//!
//! Questions come through the inbox, drained after finishes (see `drain_inbox`): a finish
//! pushed before a question is handled first, and an in-memory mailbox stores its outcome
//! while the finish is handled, so "no live task" here means that whatever its task left is
//! in the mailbox already.

use tokio::sync::oneshot;

use super::{Record, Shell};
use crate::domain::{MailboxKey, OnGiveUp, TaskId, TaskStatus};
use crate::observe::events::TaskStep;
use crate::queue::EntryId;
use crate::scheduler::core::Cancel;

/// A retrieve's question to the scheduler, through the inbox.
pub(crate) enum RetrievalNote {
    /// Can a result still come under `key` (for `task`)? `true` while a live task of this
    /// pool will store one there.
    Ask {
        key: MailboxKey,
        task: Option<TaskId>,
        answer: oneshot::Sender<bool>,
    },
    /// The retrieve's wait ran out: apply the pool's [`OnGiveUp`] rule to its task.
    GaveUp {
        key: MailboxKey,
        task: Option<TaskId>,
        answer: oneshot::Sender<GaveUp>,
    },
}

/// What became of the task of a retrieve that gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GaveUp {
    /// It carries on: a later retrieve can get its result.
    Kept,
    /// It was abandoned: it will store nothing.
    Abandoned,
    /// No live task of this pool stores under that key (and id): it ended, or never was.
    NotLive,
}

impl GaveUp {
    /// How a log line names it.
    pub fn describe(self) -> &'static str {
        match self {
            GaveUp::Kept => "the task carries on; a later retrieve can still take its result",
            GaveUp::Abandoned => {
                "the task was abandoned (on_give_up: abandon, a key the pool made): it stores nothing"
            }
            GaveUp::NotLive => "no live task stores under this key",
        }
    }
}

impl RetrievalNote {
    /// Answers the question against the pool's state at `now`. (The answer is the only I/O,
    /// a oneshot that never blocks; a retrieve that stopped listening is not an error.)
    pub(crate) fn answer_with<P, R>(self, shell: &mut Shell<P, R>, now: u64)
    where
        P: Send + 'static,
        R: Send + 'static,
    {
        match self {
            RetrievalNote::Ask { key, task, answer } => {
                let _ = answer.send(shell.result_may_come(&key, task));
            }
            RetrievalNote::GaveUp { key, task, answer } => {
                let _ = answer.send(shell.gave_up(&key, task, now));
            }
        }
    }
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// The live task a retrieve of `key` (and `task`) waits for, if the shell can tell.
    fn waited_for(&self, key: &MailboxKey, task: Option<TaskId>) -> Option<EntryId> {
        match task {
            Some(id) => self.tasks.entry_of(key, id),
            None => self.tasks.ledger.entry_of_minted(key),
        }
    }

    /// Whether a live task of this pool will still store a result under `key` (and
    /// `task`). Not one whose run has ended already: its outcome went out (the watchdog's,
    /// the drain deadline's: it is in the mailbox), or it was abandoned and stores nothing;
    /// its run only winds down.
    fn result_may_come(&self, key: &MailboxKey, task: Option<TaskId>) -> bool {
        self.waited_for(key, task)
            .and_then(|entry| self.tasks.ledger.get(entry))
            .is_some_and(|record| !record.run().is_some_and(|run| run.ended))
    }

    /// The rule this pool follows: its setting, else what fits its mailbox.
    fn on_give_up(&self) -> OnGiveUp {
        let chosen = self.tasks.core.limits().on_give_up;
        OnGiveUp::for_mailbox(chosen, self.mailbox.inline().is_some())
    }

    /// A retrieve of `key` (and `task`) gave up: abandons its task where the rule says so
    /// and the task is one only that retrieve could collect (see [`OnGiveUp`]).
    pub fn gave_up(&mut self, key: &MailboxKey, task: Option<TaskId>, now: u64) -> GaveUp {
        let Some(entry) = self.waited_for(key, task) else {
            return GaveUp::NotLive;
        };
        let Some(record) = self.tasks.ledger.get(entry) else {
            return GaveUp::NotLive;
        };
        if record.run().is_some_and(|run| run.ended) {
            // Its outcome went out already (the watchdog's, the drain deadline's): it is in
            // the mailbox, and the run only winds down.
            return GaveUp::NotLive;
        }
        let abandons = self.on_give_up() == OnGiveUp::Abandon;
        if !abandons || !only_its_waiter_collects(record) {
            return GaveUp::Kept;
        }
        match self.tasks.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => {
                let stored_in_queue = self.tasks.end_abandoned(entry, now);
                self.forget_stored(entry, stored_in_queue);
                self.start_parked(started, now);
            }
            Ok(Cancel::Running) => self.abandon_running(entry, now),
            Err(_) => return GaveUp::NotLive,
        }
        GaveUp::Abandoned
    }

    /// Abandons a running task: its flag is raised and its outcome is told now, so that
    /// what its worker reports later only releases its capacity and is dropped (a channel
    /// inside it closes).
    fn abandon_running(&mut self, entry: EntryId, now: u64) {
        let tasks = &mut self.tasks;
        let Some(record) = tasks.ledger.get_mut(entry) else {
            return;
        };
        let Some(run) = record.run_mut().filter(|run| !run.ended) else {
            return;
        };
        run.ended = true;
        run.cancellation.cancel();
        let step = TaskStep::Ended(TaskStatus::Cancelled);
        tasks.observers.record_step(record, &step, now);
        let (task_id, key) = (record.task_id, record.key.key().into_owned());
        tasks.note_end((entry, task_id), &key, &TaskStatus::Cancelled, now);
        tracing::debug!(pool = %tasks.pool, task_id, "abandoned a running task: the retrieve waiting for it gave up");
    }
}

/// Whether only the retrieve that gave up could have collected `record`'s outcome: its key
/// is the pool's own, its outcome would go to the mailbox (not to a stream, whose reader
/// is its waiter), and no other node or pending submitter has a part in it.
fn only_its_waiter_collects<P>(record: &Record<P>) -> bool {
    let rare = record.rare();
    record.minted_key
        && record.stream().is_none()
        && record.lease().is_none()
        && rare.is_none_or(|rare| rare.reply.is_none())
}
