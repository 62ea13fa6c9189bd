//! The shell's side of the shared-queue mode: what it parks there, how it admits what it
//! claims, and what it does with the queue's answers (claims, starts stored as claims,
//! parks, removals, dead letters, lost leases, polls). The mode's own state (leases,
//! claims in flight, when to claim) is [`SharedRoom`](super::SharedRoom) (`room.rs`); the calls themselves are
//! made by the I/O side (`io.rs`).

use super::calls::{SharedCall, SharedReport};
use crate::domain::{MailboxKey, OnDuplicate, PoolError, ResourceKind};
use crate::mailbox::actor::Stored;
use crate::observe::events::TaskStep;
use crate::queue::actor::fault_of;
use crate::queue::{Claim, EntryId, Lease, QueueError, Settlement};
use crate::scheduler::core::Cancel;
use crate::scheduler::shell::admission::{Admission, Origin};
use crate::scheduler::shell::observe::Detail;
use crate::scheduler::shell::{Record, Shell};
use crate::util::contain::drop_contained;

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Admits a task claimed from the shared queue, as its lease's holder.
    fn run_leased(&mut self, lease: Lease<P>, now: u64) {
        let Lease {
            entry: shared_entry,
            mut task,
            attempt,
            trace,
            ..
        } = lease;
        if !self.lifecycle.is_open() {
            // Stopping: a claim answered after the stop goes back to the queue at once, for
            // another node, rather than waiting out its lease.
            drop_contained(task);
            self.hand_back(vec![Claim::new(shared_entry, attempt)], now);
            return;
        }
        let key = task
            .meta
            .mailbox
            .take()
            .unwrap_or_else(MailboxKey::anonymous);
        let timeout = self.tasks.default_timeout;
        let origin = Origin::Leased {
            shared_entry,
            attempt,
            trace,
        };
        self.admit(
            Admission {
                task,
                key,
                timeout,
                // The shared queue held it back until it was due.
                not_before_ms: None,
                origin,
                // Claimed from the fleet's queue: its submitter's waits are another node's.
                minted: false,
                parents: Default::default(),
            },
            now,
        );
    }

    /// Whether a task of `kind` from `origin` skips this node's core and waits in the shared
    /// queue whatever room this node has: a submission of a kind with a budget, which the
    /// queue keeps for every node, so only a claim may spend from it; and any submission of
    /// a pool that attaches repeated submissions, whose callers the queue keeps unique
    /// across nodes.
    pub(in crate::scheduler::shell) fn parks_for_the_fleet(
        &self,
        origin: &Origin,
        kind: ResourceKind,
    ) -> bool {
        let limits = self.tasks.core.limits();
        matches!(origin, Origin::Submitted { .. })
            && self.storage.waits_in_fleet()
            && (limits.budgets.get(kind).is_some() || limits.on_duplicate == OnDuplicate::Attach)
    }

    /// What a shared-queue call answered, or a poll.
    pub fn shared_report(&mut self, report: SharedReport<P>, now: u64) {
        let Some(room) = self.storage.shared() else {
            return;
        };
        match report {
            SharedReport::Poll => {
                room.renew_if_due(&mut self.tasks, now);
                self.claim_if_open(now);
            }
            SharedReport::Wake => {
                room.woken();
                self.claim_if_open(now);
            }
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
            SharedReport::Lost(entries) => self.lost(entries, now),
            SharedReport::Published {
                key,
                claim,
                later,
                stored,
            } => {
                self.tasks.publishing.remove(&claim.entry);
                let step = match stored {
                    Stored::Yes => TaskStep::Ended(later.status),
                    Stored::ClaimLost | Stored::Failed => TaskStep::LeaseLost,
                };
                let detail = Detail {
                    since_ms: later.since_ms,
                    priority: later.priority,
                    trace: later.trace,
                    attempt: later.attempt,
                    wait_reason: None,
                };
                self.tasks
                    .observers
                    .step(later.task_id, &key, later.cost, &step, now, detail);
                // Its claim-ahead room is free again.
                self.claim_if_open(now);
            }
        }
    }

    fn claimed(&mut self, claimed: Result<Vec<Lease<P>>, QueueError>, now: u64) {
        let woken = self
            .storage
            .shared()
            .is_some_and(|room| room.claim_answered());
        match claimed {
            Ok(leases) if leases.is_empty() => {
                if woken {
                    self.claim_if_open(now);
                } else if let Some(room) = self.storage.shared() {
                    room.found_nothing(&self.tasks.core, now);
                }
            }
            Ok(leases) => {
                for lease in leases {
                    self.run_leased(lease, now);
                }
                self.claim_if_open(now);
            }
            Err(error) => {
                self.tasks.observers.queue_error();
                tracing::warn!(pool = %self.tasks.pool, %error, "shared queue claim failed; retrying at the next poll");
            }
        }
        // A stop that waited for this answer may go on.
        self.stop_if_drained();
    }

    /// Claims a renewal found lost (their leases ran out, and another node may have claimed
    /// their tasks): nothing of this node's runs of them may be published. A run still going
    /// is stopped at once (its executor sees `running::is_lease_lost`) and its outcome will
    /// be dropped; a claimed task still waiting here is forgotten.
    fn lost(&mut self, entries: Vec<EntryId>, now: u64) {
        for lost in entries {
            self.tasks.publishing.remove(&lost);
            let held = self.tasks.ledger.iter().find_map(|record| {
                let claim = record.lease().filter(|claim| claim.entry == lost)?;
                Some((record.entry, record.task_id, claim.attempt))
            });
            let Some((entry, task_id, attempt)) = held else {
                continue;
            };
            tracing::warn!(pool = %self.tasks.pool, task_id, entry = lost, attempt, "a shared claim was lost (its lease ran out); this node's run of it is stopped and publishes nothing");
            self.tasks.step(entry, TaskStep::LeaseLost, now);
            match self.tasks.core.cancel(entry, now) {
                Ok(Cancel::Parked { started }) => {
                    if let Some(mut record) = self.tasks.ledger.remove(entry) {
                        drop_contained(record.take_payload());
                        record.release_nested_slot();
                    }
                    self.start_parked(started, now);
                }
                Ok(Cancel::Running) => {
                    let Some(record) = self.tasks.ledger.get_mut(entry) else {
                        continue;
                    };
                    record.rare_mut().lease = None;
                    if let Some(run) = record.run_mut() {
                        run.ended = true;
                        run.cancellation.lose_lease();
                    }
                }
                Err(_) => {}
            }
        }
    }

    /// A task started at once was stored as this node's claim, or could not be.
    fn recorded(&mut self, entry: EntryId, result: Result<Lease<P>, QueueError>, now: u64) {
        if let Some(rare) = self
            .tasks
            .ledger
            .get_mut(entry)
            .and_then(|record| record.rare.as_mut())
        {
            rare.recording = false;
        }
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
                let error =
                    self.tasks
                        .backend_error(backend, "store a started task", fault_of(error));
                if let Some(record) = self.tasks.ledger.get_mut(entry) {
                    // Its submitter hears the error; nothing goes to the mailbox.
                    record.rare_mut().lease = None;
                    if let Some(run) = record.run_mut() {
                        run.ended = true;
                    }
                }
                if let Some(reply) = reply {
                    self.tasks.end_unstored(entry, reply, error.clone(), now);
                }
                self.finish(entry, Err(error), now);
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
                let claim = lease.claim();
                drop_contained(lease.task);
                self.tasks.fx.shared(SharedCall::Settle {
                    claim,
                    settlement: Settlement::Ended(crate::domain::TaskStatus::Cancelled),
                });
            }
        }
    }

    /// Claims from the shared queue if the pool takes work (open: not draining, stopping or
    /// escalated) and this node has room ([`SharedRoom::claim_if_room`]).
    pub(in crate::scheduler::shell) fn claim_if_open(&mut self, now: u64) {
        if !self.lifecycle.takes_work() {
            return;
        }
        if let Some(room) = self.storage.shared() {
            room.claim_if_room(&mut self.tasks, now);
        }
    }
}
