//! Pool tasks preempted and run again.
//!
//! A permit's holder lets go when asked to yield; a pool task cannot hand back half a run.
//! Where the pool can copy payloads (`PoolClient::preempt_tasks`, for a `Clone` payload, in
//! memory mode), a task is preemptible too: when it starts, the shell keeps a copy of its
//! payload (the *spare*); when a waiter asks it to yield (the rule of `permits.rs`), its
//! cancellation flag is raised with the reason `Preempted`; when its executor returns, the
//! run's output is discarded and the task parks again, under its entry and so at its rank,
//! with the spare as its payload. It runs again when it is once more the best that fits.
//!
//! # Rules
//!
//! - A task is asked at most `max_per_task` times; from then on no spare is kept and it
//!   runs undisturbed. A streamed task is never asked (its partial results went out).
//! - It parks again without its deadline: it started in time, and a deadline is a time to
//!   start by.
//! - Only a run that was asked and has not ended otherwise (the watchdog, the drain
//!   deadline) parks again, and only while the pool is open: a stopping pool delivers what
//!   the run returned.
//! - Nothing is killed: an executor that ignores the flag finishes, and its task parks
//!   again all the same (its work is redone: at-least-once).

use super::ledger::Ledger;
use super::Shell;
use crate::domain::{PoolError, ScheduledTask};
use crate::observe::events::TaskStep;
use crate::queue::EntryId;
use crate::scheduler::shell::observe::Detail;
use crate::util::contain::drop_contained;

/// Whether the running task `entry` may be asked to yield: it keeps a spare, was not asked
/// yet, and its run is under way (not ended by the watchdog or the drain deadline).
pub(super) fn task_may_yield<P>(ledger: &Ledger<P>, entry: EntryId) -> bool {
    ledger.get(entry).is_some_and(|record| {
        let spare = record
            .rare()
            .is_some_and(|rare| rare.spare.is_some() && rare.asked_units.is_none());
        spare && record.run().is_some_and(|run| run.sent && !run.ended)
    })
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Keeps a copy of a starting task's payload when the pool preempts tasks and the task
    /// may still be asked.
    pub(super) fn keep_spare(&mut self, entry: EntryId, task: &ScheduledTask<P>) {
        let Some(copy) = self.rerun.get().copied() else {
            return;
        };
        let limits = self.tasks.core.limits();
        let (preemption, retries) = (limits.preemption, limits.retry.is_some());
        if (preemption.is_none() && !retries) || !self.storage.keeps_payloads_here() {
            return;
        }
        let Some(record) = self.tasks.ledger.get_mut(entry) else {
            return;
        };
        if record.stream().is_some() {
            // Its partial results went out already: a second run would send them again.
            return;
        }
        let rare = record.rare_mut();
        let may_be_asked = preemption.is_some_and(|p| rare.preemptions < p.max_per_task);
        if may_be_asked || retries {
            rare.spare = Some(Box::new(copy(&task.payload)));
        }
    }

    /// Asks the running task `entry`, holding `units`, to yield; returns whether it was.
    pub(super) fn ask_task(&mut self, entry: EntryId, units: u32, now: u64) -> bool {
        let Some(record) = self.tasks.ledger.get_mut(entry) else {
            return false;
        };
        let Some(run) = record.run_mut() else {
            return false;
        };
        run.cancellation.preempt();
        let rare = record.rare_mut();
        rare.asked_units = Some(units);
        rare.preemptions += 1;
        if let Some(record) = self.tasks.ledger.get(entry) {
            let key = record.key.key();
            let step = TaskStep::YieldAsked;
            let (id, cost) = (record.task_id, record.cost());
            self.tasks
                .observers
                .step(id, &key, cost, &step, now, Detail::NONE);
        }
        true
    }

    /// A run is over. If it was asked to yield (and may park again), its units are released,
    /// its output is discarded and the task parks again at its rank with its spare payload:
    /// returns `None`. Otherwise returns the outcome, for `finish` to deliver.
    pub(super) fn rerun_if_yielded(
        &mut self,
        entry: EntryId,
        outcome: Result<R, PoolError>,
        rests: bool,
        now: u64,
    ) -> Option<Result<R, PoolError>> {
        let Some(record) = self.tasks.ledger.get_mut(entry) else {
            return Some(outcome);
        };
        let ended = record.run().is_none_or(|run| run.ended);
        let kind = record.cost().kind;
        let Some(rare) = record.rare.as_deref_mut() else {
            return Some(outcome);
        };
        let Some(units) = rare.asked_units.take() else {
            // Not asked: the spare stays for a retry (`retry.rs`) and goes with the record.
            return Some(outcome);
        };
        self.permits.yielded(kind, units);
        let spare = rare
            .spare
            .take()
            .and_then(|spare| spare.downcast::<P>().ok());
        let Some(spare) = spare.filter(|_| !ended && self.lifecycle.is_open()) else {
            return Some(outcome);
        };
        drop_contained(outcome);
        record.keep_payload(*spare);
        let (id, cost, key) = (record.task_id, record.cost(), record.key.key().into_owned());
        let (meta, timeout, also) = (record.meta(), record.timeout(), record.also());
        let step = TaskStep::Yielded { units };
        self.tasks
            .observers
            .step(id, &key, cost, &step, now, Detail::NONE);
        let started = self.tasks.release_capacity(entry, rests, now);
        let mut ticket = self.tasks.ticket(entry, &meta, &key, timeout);
        // It started before its deadline: a deadline is a time to start by.
        ticket.deadline_ms = None;
        ticket.also = also;
        if self.tasks.core.restore(ticket, now).is_err() {
            tracing::error!(pool = %self.tasks.pool, entry, "bug: a preempted task is still held");
        }
        self.start_parked(started, now);
        self.tick(now);
        None
    }
}
