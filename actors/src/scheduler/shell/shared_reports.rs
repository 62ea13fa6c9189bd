//! What the shared queue answers: the shell's side of the shared mode's calls (claims,
//! starts stored as claims, parks, removals, dead letters, lost leases, polls). The mode's
//! own state lives in `storage/shared.rs`.

use super::{Record, Shell, Storage};
use crate::contain::drop_contained;
use crate::domain::PoolError;
use crate::queue::{EntryId, Lease, QueueError, Settlement};
use crate::scheduler::protocol::SharedReport;
use crate::scheduler::shell::effects::SharedCall;

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// What a shared-queue call answered, or a poll.
    pub fn shared_report(&mut self, report: SharedReport<P>, now: u64) {
        let Storage::Shared(room) = &mut self.storage else {
            return;
        };
        match report {
            SharedReport::Poll => {
                room.renew_if_due(&mut self.tasks, now);
                self.claim_if_room(now);
            }
            SharedReport::Wake => self.claim_if_room(now),
            SharedReport::Enqueued(group) => {
                for enqueued in group {
                    room.enqueued(&mut self.tasks, enqueued, now);
                }
            }
            SharedReport::Claimed(claimed) => self.claimed(claimed, now),
            SharedReport::Removed {
                key,
                id,
                reply,
                result,
            } => room.removed(&mut self.tasks, (key, id, reply), result, now),
            SharedReport::Recorded { entry, result } => self.recorded(entry, result, now),
            SharedReport::Dead(letters) => room.dead(&mut self.tasks, letters, now),
            SharedReport::Lost(entries) => room.lost(&self.tasks, entries),
        }
    }

    fn claimed(&mut self, claimed: Result<Vec<Lease<P>>, QueueError>, now: u64) {
        if let Some(room) = self.storage.shared() {
            room.claim_answered();
        }
        match claimed {
            Ok(leases) if leases.is_empty() => {}
            Ok(leases) => {
                for lease in leases {
                    self.run_leased(lease, now);
                }
                self.claim_if_room(now);
            }
            Err(error) => {
                self.tasks.observers.queue_error();
                tracing::warn!(pool = %self.tasks.pool, %error, "shared queue claim failed; retrying at the next poll");
            }
        }
    }

    /// A task started at once was stored as this node's claim, or could not be.
    fn recorded(&mut self, entry: EntryId, result: Result<Lease<P>, QueueError>, now: u64) {
        let reply = self
            .tasks
            .ledger
            .get_mut(entry)
            .and_then(Record::take_reply);
        let lease = match result {
            Ok(lease) => lease,
            Err(error) => {
                self.tasks.observers.queue_error();
                let backend = self.storage.backend();
                let text = format!("could not store the task: {backend} queue: {error}");
                if let Some(record) = self.tasks.ledger.get_mut(entry) {
                    // Its submitter hears the error; nothing goes to the mailbox.
                    record.rare_mut().lease = None;
                    if let Some(run) = record.run_mut() {
                        run.ended = true;
                    }
                }
                self.finish(entry, Err(PoolError::Internal(text.clone())), now);
                if let Some(reply) = reply {
                    self.tasks.fx.answer(reply, Err(PoolError::Internal(text)));
                }
                return;
            }
        };
        if let (Some(reply), Some(record)) = (reply, self.tasks.ledger.get(entry)) {
            self.tasks
                .fx
                .answer(reply, Ok(record.key.key().into_owned()));
        }
        let ended = self
            .tasks
            .ledger
            .get(entry)
            .map(|record| record.run().is_none_or(|run| run.ended));
        match ended {
            Some(false) => self.send_job(entry, lease.task, now),
            // Cancelled (or timed out) while it was being stored: its outcome is delivered
            // and no worker will report it, so it ends here (which releases its capacity
            // and settles its claim).
            Some(true) => {
                drop_contained(lease.task);
                self.finish(entry, Err(PoolError::Cancelled), now);
            }
            None => {
                drop_contained(lease.task);
                self.tasks.fx.shared(SharedCall::Settle {
                    entry: lease.entry,
                    settlement: Settlement::Done,
                });
            }
        }
    }

    /// Claims from the shared queue if this node has room (see [`SharedRoom::claim_wanted`]).
    pub(super) fn claim_if_room(&mut self, now: u64) {
        if !self.lifecycle.is_open() {
            return;
        }
        if let Storage::Shared(room) = &mut self.storage {
            room.claim_if_room(&mut self.tasks, now);
        }
    }
}
