//! Failed runs tried again (the pool's limits' `retry`).
//!
//! A run whose executor panicked, or that asked for it (`running::retry_later`), failed in a
//! way worth trying again. While the task has attempts left and the pool is open, the run's
//! output is discarded, its capacity released, and the task parks again under its entry (so
//! at its rank among equals) from the end of a backoff on (core rule 16, a *sleeper*): the
//! backoff doubles from `backoff_ms` up to `max_backoff_ms`, each wait drawn between half of
//! it and all of it. After its last attempt the task ends `Failed` with every run's reason.
//!
//! # Where the payload comes from
//!
//! - **In memory**, from a copy kept when the run started (the *spare* of `rerun.rs`): a
//!   pool whose payload is `Clone` opts in with `PoolClient::retry_tasks` (or
//!   `preempt_tasks`). Without a copy the failure is final, and its reason says why.
//! - **A durable local queue** (yaque) keeps the claimed task: the claim is handed back
//!   (`TaskQueue::release`), and the next start claims it again.
//! - **A shared queue** keeps the task and counts its claims: the claim is parked again in
//!   the queue from the end of the backoff (`SharedQueue::retry`), for any node, and this
//!   node forgets the task; the claim count is the attempt.
//!
//! A streamed task is never tried again (its partial results went out), nor a run that was
//! cancelled, timed out, or ended by the watchdog or the drain deadline. A retried task keeps
//! no deadline (it started in time; a deadline is a time to start by).

use super::Shell;
use crate::domain::{PoolError, Retries};
use crate::observe::events::TaskStep;
use crate::queue::EntryId;
use crate::scheduler::shell::observe::Detail;
use crate::util::contain::drop_contained;

/// How a failed run's task gets its payload back for the next run.
enum Payload<P> {
    /// The copy kept at its start.
    Spare(P),
    /// The durable local queue keeps it: hand the claim back.
    Queue,
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// A run is over. If it failed in a way worth trying again and attempts are left, its
    /// capacity is released, its output discarded and the task parks again after a backoff:
    /// returns `None`. Otherwise returns the outcome to deliver: a run that asked to be
    /// tried again ends `Failed` with its reason, and a task's last failure carries every
    /// run's reason.
    pub(super) fn retry_if_failed(
        &mut self,
        entry: EntryId,
        outcome: Result<R, PoolError>,
        rests: bool,
        now: u64,
    ) -> Option<Result<R, PoolError>> {
        let Some(record) = self.tasks.ledger.get_mut(entry) else {
            return Some(outcome);
        };
        let Some(run) = record.run() else {
            return Some(outcome);
        };
        let asked = run.cancellation.retry_reason();
        // Cancelled, timed out, drained or its lease lost: whatever the run asked, it ends.
        let stopped = run.ended || run.cancellation.is_cancelled();
        let from_queue = run.from_queue;
        let reason = match (&outcome, asked) {
            _ if stopped => return Some(outcome),
            (Ok(_) | Err(PoolError::Failed(_)), Some(reason)) => reason.to_owned(),
            (Err(PoolError::Failed(reason)), None) => reason.clone(),
            _ => return Some(outcome),
        };
        drop_contained(outcome);
        let Some(policy) = self.tasks.core.limits().retry else {
            return Some(Err(PoolError::Failed(reason)));
        };
        let streamed = record.stream().is_some();
        let lease = record.rare().and_then(|rare| rare.lease);
        if let (Some(claim), true) = (lease, self.storage.waits_in_fleet()) {
            return self.retry_shared(entry, claim, reason, policy, rests, now);
        }
        let rare = record.rare_mut();
        rare.failures.push(reason.clone());
        let failed = rare.failures.len() as u32;
        let spare = rare
            .spare
            .take()
            .and_then(|spare| spare.downcast::<P>().ok());
        let payload = match (from_queue, spare) {
            (true, _) if self.storage.releases_stored() => Some(Payload::Queue),
            (false, Some(spare)) => Some(Payload::Spare(*spare)),
            _ => None,
        };
        let payload = payload
            .filter(|_| failed < policy.max_attempts && !streamed && self.lifecycle.is_open());
        let Some(payload) = payload else {
            let no_copy = failed < policy.max_attempts
                && !from_queue
                && self.storage.keeps_payloads_here()
                && self.rerun.get().is_none();
            let failures = std::mem::take(&mut record.rare_mut().failures);
            return Some(Err(PoolError::Failed(final_reason(&failures, no_copy))));
        };
        let started = self.tasks.release_run(entry, rests, now);
        let Some(record) = self.tasks.ledger.get_mut(entry) else {
            return Some(Err(PoolError::Failed(reason)));
        };
        let key = record.key.key().into_owned();
        let (meta, timeout, also) = (record.meta(), record.timeout(), record.also());
        match payload {
            Payload::Spare(spare) => record.park_again(Some(spare)),
            Payload::Queue => {
                record.park_again(None);
                self.storage.release_stored(entry, &mut self.tasks.fx);
            }
        }
        let at_ms = now.saturating_add(policy.backoff_ms(failed, jitter()));
        let mut ticket = self.tasks.ticket(entry, &meta, &key, timeout);
        // It started in time: a deadline is a time to start by.
        ticket.deadline_ms = None;
        ticket.also = also;
        if self.tasks.core.park_until(ticket, at_ms, now).is_err() {
            tracing::error!(pool = %self.tasks.pool, entry, "bug: a failed run's task is still held");
        }
        let step = TaskStep::Retrying {
            attempt: failed + 1,
            at_ms: u128::from(at_ms),
            reason,
        };
        self.tasks.step(entry, step, now);
        self.start_parked(started, now);
        None
    }
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// [`retry_if_failed`](Self::retry_if_failed) for a task claimed from a shared queue:
    /// the queue keeps the task and counts its claims, so the claim is parked again there,
    /// for any node, from the end of the backoff, and this node forgets the task.
    fn retry_shared(
        &mut self,
        entry: EntryId,
        claim: crate::queue::Claim,
        reason: String,
        policy: Retries,
        rests: bool,
        now: u64,
    ) -> Option<Result<R, PoolError>> {
        let streamed = self
            .tasks
            .ledger
            .get(entry)
            .is_some_and(|record| record.stream().is_some());
        let failed = claim.attempt.max(1);
        if failed >= policy.max_attempts || streamed || !self.lifecycle.is_open() {
            let reason = match failed {
                1 => reason,
                runs => format!("{runs} runs failed; the last: {reason}"),
            };
            return Some(Err(PoolError::Failed(reason)));
        }
        let at_ms = now.saturating_add(policy.backoff_ms(failed, jitter()));
        let Some((record, started)) = self.tasks.release(entry, rests, now) else {
            return Some(Err(PoolError::Failed(reason)));
        };
        let (id, cost, key) = (record.task_id, record.cost(), record.key.key().into_owned());
        let step = TaskStep::Retrying {
            attempt: failed + 1,
            at_ms: u128::from(at_ms),
            reason: reason.clone(),
        };
        let detail = Detail::of(&record, &step);
        drop_contained(record);
        self.tasks
            .observers
            .step(id, &key, cost, &step, now, detail);
        self.tasks.fx.shared(
            crate::scheduler::shell::storage::shared::SharedCall::Retry {
                claim,
                at_ms,
                reason,
            },
        );
        self.start_parked(started, now);
        None
    }
}

/// A draw in `[0, 1)` for a backoff's jitter: 53 random bits.
fn jitter() -> f64 {
    (crate::util::random::random_u128() >> 75) as f64 / (1u64 << 53) as f64
}

/// The reason a task's last failed run ends with: the run's own when it ran once, else
/// every run's, numbered; and why it was not tried again when the pool keeps no copy.
fn final_reason(failures: &[String], no_copy: bool) -> String {
    let mut reason = match failures {
        [only] => only.clone(),
        all => {
            let each: Vec<String> = all
                .iter()
                .enumerate()
                .map(|(n, reason)| format!("run {}: {reason}", n + 1))
                .collect();
            format!("{} runs failed; {}", all.len(), each.join("; "))
        }
    };
    if no_copy {
        reason.push_str(
            " (not tried again: this pool keeps no copy of a payload to run it again; call \
             retry_tasks() on the pool, for a Clone payload, or use a durable queue)",
        );
    }
    reason
}
