//! Where an admitted task goes once the core has answered: it starts at once (handed to a
//! worker, stored first as running or as this node's claim where the durability asks for
//! it), parks (in the ledger, the local durable queue, or the shared queue for any node),
//! sleeps until its scheduled start, or waits for its parents.

use super::admission::{end_unadmitted, starts_in_time, Admission, Origin};
use super::storage::shared::{Enqueue, SharedRoom};
use super::storage::{Parking, Starting};
use super::Shell;
use crate::domain::{OnDuplicate, PoolError};
use crate::observe::events::TaskStep;
use crate::queue::{Carried, EntryId, HeldBy};
use crate::scheduler::core::{Admit, AdmitParts, Newcomer, Rejection, Ticket};
use crate::scheduler::protocol::Extras;
use crate::util::contain::drop_contained;

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Asks the core, then carries out its answer for the newcomer and for the parked tasks
    /// that start with it.
    /// A task whose caller (tenant, id) is live here already is refused (`DuplicateTask`).
    pub(super) fn admit(&mut self, admission: Admission<P>, now: u64) {
        let id = admission.task.meta.id;
        if let Some(original) = self.tasks.ledger.entry_of_caller(&admission.key.tenant, id) {
            if self.tasks.core.limits().on_duplicate == OnDuplicate::Attach {
                if let Origin::Submitted { reply, .. } = admission.origin {
                    // Not run again: the caller gets the live original's key.
                    let key = self
                        .tasks
                        .ledger
                        .get(original)
                        .map(|record| record.key.key().into_owned());
                    self.tasks
                        .fx
                        .answer(reply, Ok(key.unwrap_or(admission.key)));
                    drop_contained(admission.task);
                    return;
                }
            }
            end_unadmitted(
                &mut self.tasks,
                admission,
                PoolError::DuplicateTask(id),
                now,
            );
            return;
        }
        let entry = self.tasks.ledger.next_entry(now);
        let mut ticket = self.tasks.ticket(
            entry,
            &admission.task.meta,
            &admission.key,
            admission.timeout,
        );
        if let Origin::Submitted {
            extras: Some(extras),
            ..
        } = &admission.origin
        {
            ticket.also = extras.also;
        }
        if admission.parents.in_queue.is_some() {
            self.admit_waiting(entry, ticket, admission, now);
            return;
        }
        // A scheduled start that waits for parents here is held first (below), and sleeps
        // once they release it, if its instant is still ahead.
        let held_here = !admission.parents.entries.is_empty();
        if let Some(until_ms) = admission.not_before_ms.filter(|_| !held_here) {
            self.admit_sleeping(entry, ticket, admission, until_ms, now);
            return;
        }
        if self.parks_for_the_fleet(&admission.origin, ticket.cost.kind) {
            // Refused as the core would refuse it, else parked for the fleet's claims.
            match self.screen(&ticket, now) {
                None => self.enqueue_for_fleet(entry, admission),
                Some(refused) => end_unadmitted(&mut self.tasks, admission, refused, now),
            }
            return;
        }
        if let Origin::Submitted { .. } = admission.origin {
            // A claimed task was accepted by the fleet already: only submitters are refused.
            if let Err(late) = starts_in_time(&self.tasks.core, &ticket, now) {
                end_unadmitted(&mut self.tasks, admission, late, now);
                return;
            }
        }
        let minted = admission.minted;
        // On a shared queue nothing is shed (rule 21): a submission waits in the shared
        // queue, not here, and what this node parks it claimed from there; ending one for
        // another would end it for the whole fleet.
        let held = held_here;
        let answer = if held {
            let parents = &admission.parents;
            let run_anyway = parents.run_anyway;
            self.tasks
                .core
                .admit_after(ticket, &parents.entries, run_anyway, now)
        } else if self.storage.waits_in_fleet() {
            self.tasks.core.admit_without_shedding(ticket, false, now)
        } else {
            self.tasks.core.admit(ticket, now)
        };
        let AdmitParts {
            newcomer,
            started: unblocked,
            shed,
        } = answer.newcomer();
        self.end_shed(shed, now);
        match newcomer {
            Newcomer::Start => self.start_admitted(entry, admission, now),
            Newcomer::Park if held => {
                if let Some(until_ms) = admission.not_before_ms {
                    self.tasks.core.hold_until(entry, until_ms);
                }
                self.park_admitted(entry, admission, now);
                // Where the park waits for its store, the store's answer says it.
                let pending = self.tasks.core.pending_parents(entry);
                if let Some(pending) = pending.filter(|_| !self.storage.holds_until_stored(entry)) {
                    self.tasks
                        .step(entry, TaskStep::WaitsForParents { pending }, now);
                }
            }
            Newcomer::Park => {
                let kind = ticket.cost.kind;
                self.park_admitted(entry, admission, now);
                self.preempt_for(entry, kind, now);
            }
            Newcomer::Expire => end_unadmitted(&mut self.tasks, admission, PoolError::Expired, now),
            Newcomer::Reject(rejection) => {
                end_unadmitted(&mut self.tasks, admission, rejection.into(), now)
            }
        }
        if minted {
            self.tasks.ledger.mark_minted(entry);
        }
        self.start_parked(unblocked, now);
    }

    /// A newcomer that waits for parents in a shared queue that keeps dependencies:
    /// refused or expired now as the core would refuse or expire it, else parked in the
    /// queue with its parents (and its scheduled start, if any), where no node claims it
    /// before they succeed; the queue refuses parents it does not know.
    fn admit_waiting(&mut self, entry: EntryId, ticket: Ticket, admission: Admission<P>, now: u64) {
        match self.screen(&ticket, now) {
            Some(refused) => end_unadmitted(&mut self.tasks, admission, refused, now),
            None => self.enqueue_for_fleet(entry, admission),
        }
    }

    /// How the core would refuse or expire `ticket` now, if it would.
    fn screen(&self, ticket: &Ticket, now: u64) -> Option<PoolError> {
        match self.tasks.core.screen(ticket, now)? {
            Admit::Reject(rejection) => Some(rejection.into()),
            _ => Some(PoolError::Expired),
        }
    }

    /// Parks a submission in the fleet's queue with what its admission carries: its
    /// scheduled start (no node claims it before), its trace, and the parents it waits for
    /// there. Only submissions come here: a claimed task is in the queue already.
    fn enqueue_for_fleet(&mut self, entry: EntryId, admission: Admission<P>) {
        let Admission {
            task,
            key,
            origin,
            not_before_ms,
            parents,
            ..
        } = admission;
        if let Origin::Submitted { reply, extras } = origin {
            if let (Some(until_ms), Some(room)) = (not_before_ms, self.storage.shared()) {
                room.scheduled(until_ms);
            }
            let carried = Carried {
                not_before_ms,
                trace: extras.and_then(|extras| extras.trace),
                also: Default::default(),
            };
            let enqueue = Enqueue {
                entry,
                task,
                key,
                reply,
                carried,
                depends_on: parents.in_queue,
            };
            SharedRoom::enqueue(&mut self.tasks, enqueue);
        }
    }

    /// A newcomer that must not start before `until_ms` (a scheduled start): refused or
    /// expired now as the core would refuse or expire it, else it sleeps until then (core
    /// rule 16), here or, on a shared queue, in the queue, where no node claims it before.
    /// Its sleep counts against `max_queue_depth`, so scheduled work is bounded like parked
    /// work.
    fn admit_sleeping(
        &mut self,
        entry: EntryId,
        ticket: Ticket,
        admission: Admission<P>,
        until_ms: u64,
        now: u64,
    ) {
        if let Some(refused) = self.screen(&ticket, now) {
            end_unadmitted(&mut self.tasks, admission, refused, now);
            return;
        }
        if self.storage.waits_in_fleet() {
            // Its instant is the admission's own `not_before_ms`.
            self.enqueue_for_fleet(entry, admission);
            return;
        }
        let max_queue_depth = self.tasks.core.limits().max_queue_depth;
        if self.tasks.core.parked_len() >= max_queue_depth {
            let full = Rejection::QueueFull { max_queue_depth };
            end_unadmitted(&mut self.tasks, admission, full.into(), now);
            return;
        }
        if self.tasks.core.park_until(ticket, until_ms, now).is_err() {
            let id = admission.task.meta.id;
            end_unadmitted(
                &mut self.tasks,
                admission,
                PoolError::DuplicateTask(id),
                now,
            );
            return;
        }
        let minted = admission.minted;
        self.park_admitted(entry, admission, now);
        if minted {
            self.tasks.ledger.mark_minted(entry);
        }
    }

    /// A newcomer that starts at once: a submission as the storage mode begins it (sent to
    /// a worker now, or once it is stored), a claimed task at once.
    fn start_admitted(&mut self, entry: EntryId, admission: Admission<P>, now: u64) {
        let Admission {
            mut task,
            key,
            timeout,
            origin,
            ..
        } = admission;
        match origin {
            Origin::Submitted { reply, extras } => {
                let starting = Starting {
                    entry,
                    task,
                    key,
                    timeout,
                    reply,
                    extras,
                };
                if let Some(task) = self.storage.start(&mut self.tasks, starting, now) {
                    self.send_job(entry, task, now);
                }
            }
            Origin::Leased {
                shared_entry,
                attempt,
                trace,
            } => {
                // Claimed here: it goes on in the trace it was parked in.
                let traced = Extras::with_trace(None, trace);
                self.tasks.track(entry, &task.meta, &key, timeout, traced);
                self.tasks.set_claim(entry, shared_entry, attempt);
                self.tasks.step(entry, TaskStep::Claimed, now);
                self.tasks.begin_run(entry, false, now);
                task.meta.mailbox = Some(key);
                self.send_job(entry, task, now);
            }
        }
    }

    /// A newcomer that waits: a submission as the storage mode keeps it (in the ledger, a
    /// durable queue, or the fleet's queue), a claimed task here under its lease.
    fn park_admitted(&mut self, entry: EntryId, admission: Admission<P>, now: u64) {
        let Admission {
            task,
            key,
            timeout,
            not_before_ms,
            origin,
            parents,
            ..
        } = admission;
        match origin {
            Origin::Submitted { reply, extras } => {
                let held = (!parents.entries.is_empty()).then(|| {
                    Box::new(HeldBy {
                        parents: parents.entries.into_iter().zip(parents.ids).collect(),
                        run_anyway: parents.run_anyway,
                    })
                });
                let parking = Parking {
                    entry,
                    task,
                    key,
                    timeout,
                    not_before_ms,
                    reply,
                    extras,
                    held,
                };
                let started = self.storage.park(&mut self.tasks, parking, now);
                self.start_parked(started, now);
            }
            Origin::Leased {
                shared_entry,
                attempt,
                trace,
            } => {
                // Its capacity was taken while the claim was in flight: it parks here, under
                // its lease, where the core's order protects it.
                let traced = Extras::with_trace(None, trace);
                self.tasks.track(entry, &task.meta, &key, timeout, traced);
                self.tasks.set_claim(entry, shared_entry, attempt);
                let arrived = (None, TaskStep::Claimed);
                self.tasks
                    .keep_parked(entry, task.payload, arrived, key, now);
            }
        }
    }
}
