//! An operator's control actions on the pool's tasks: cancel one, pause, drain. Each is an
//! event like any other: it asks the core, then appends the effects that carry it out.

use super::{Record, Shell, Storage};
use crate::domain::{MailboxKey, PoolError, TaskId};
use crate::queue::EntryId;
use crate::scheduler::core::Cancel;
use crate::scheduler::shell::effects::{CancelReply, Effect, SharedCall};

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Cancels the live task `id` of exactly `key`, here or parked in the shared queue.
    pub fn cancel(&mut self, key: MailboxKey, id: TaskId, reply: CancelReply, now: u64) {
        let answer = match self.tasks.entry_of(&key, id) {
            Some(entry) => self.cancel_local(entry, id, now),
            None if self.storage.is_shared() => {
                self.tasks
                    .fx
                    .shared(SharedCall::RemoveTask { key, id, reply });
                return;
            }
            None => Err(PoolError::TaskNotFound(id)),
        };
        self.tasks.fx.push(Effect::AnswerCancel { reply, answer });
    }

    /// Cancels live task `entry` of this node: a parked one ends `Cancelled` at once, a
    /// running one is asked to stop through its flag.
    fn cancel_local(&mut self, entry: EntryId, id: TaskId, now: u64) -> Result<(), PoolError> {
        match self.tasks.core.cancel(entry, now) {
            Ok(Cancel::Parked { started }) => {
                self.end_parked(entry, PoolError::Cancelled, now);
                self.start_parked(started, now);
                Ok(())
            }
            Ok(Cancel::Running) => {
                if let Some(run) = self.tasks.ledger.get_mut(entry).and_then(Record::run_mut) {
                    run.cancellation.cancel();
                }
                Ok(())
            }
            Err(_) => Err(PoolError::TaskNotFound(id)),
        }
    }

    /// Pauses the pool (`true`: nothing starts, admissions park) or resumes it, starting
    /// what fits (core rule 18).
    pub fn pause(&mut self, paused: bool, now: u64) {
        self.tasks.observers.counters.set_paused(paused);
        if paused {
            self.tasks.core.pause();
            return;
        }
        let started = self.tasks.core.resume(now);
        self.start_parked(started, now);
        if let Storage::Shared(room) = &mut self.storage {
            room.claim_if_room(&mut self.tasks, now);
        }
    }

    /// An operator drains the pool (`drained`: new work is refused, admitted work runs) or
    /// opens it again, which also ends a pause.
    pub fn drain(&mut self, drained: bool, now: u64) {
        self.lifecycle.close(drained);
        self.tasks
            .observers
            .counters
            .set_draining(self.lifecycle.is_closed());
        if !drained {
            self.pause(false, now);
        }
    }
}
