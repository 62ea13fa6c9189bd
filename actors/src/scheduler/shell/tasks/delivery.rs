//! How an ended task's outcome leaves the pool: to its stream or its mailbox (and its
//! webhook), with the shared claim it settles once stored, and what its end tells the
//! observers and the tasks that wait on it.

use super::*;

impl<P, R> Tasks<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Delivers an ended task's outcome (to its stream, or to the mailbox), then settles
    /// `settle` once it is stored.
    pub fn deliver(
        &mut self,
        mut record: Record<P>,
        outcome: Result<R, PoolError>,
        settle: Option<(Claim, Settlement)>,
        now: u64,
    ) {
        let status = status_of_run(&outcome);
        let step = TaskStep::Ended(status.clone());
        // The record ends here: its key moves out (built once, for an anonymous one).
        let key = std::mem::replace(&mut record.key, TaskKey::Anonymous([0, 0])).into_key();
        let stream = record.rare.as_mut().and_then(|rare| rare.stream.take());
        let held_back = settle.is_some() && stream.is_none();
        let later = ended_step(&self.observers, &record, &key, &step, held_back, now);
        self.note_end((record.entry, record.task_id), &key, &status, now);
        let (task_id, run) = (record.task_id, run_of(&record));
        self.send_outcome(stream, key, task_id, run, outcome, settle, later, now);
    }

    /// Delivers the outcome of a task the ledger does not hold (a shared queue's report),
    /// under its claim when it has one.
    #[allow(clippy::too_many_arguments)]
    pub fn deliver_report(
        &mut self,
        key: MailboxKey,
        task_id: TaskId,
        cost: crate::domain::ResourceCost,
        attempt: u32,
        outcome: Result<R, PoolError>,
        settle: Option<(Claim, Settlement)>,
        now: u64,
    ) {
        let status = status_of_run(&outcome);
        let later = match settle {
            Some(_) => Some(EndedLater {
                task_id,
                cost,
                status,
                since_ms: None,
                priority: None,
                trace: None,
                attempt: None,
            }),
            None => {
                let step = TaskStep::Ended(status);
                self.observers
                    .step(task_id, &key, cost, &step, now, Detail::NONE);
                None
            }
        };
        let run = RunOf {
            attempt,
            trace: None,
        };
        self.send_outcome(None, key, task_id, run, outcome, settle, later, now);
    }

    /// Asks for an outcome to go to `stream`, or to the mailbox under `key`.
    #[allow(clippy::too_many_arguments)]
    pub fn send_outcome(
        &mut self,
        stream: Option<StreamAttachment>,
        key: MailboxKey,
        task_id: TaskId,
        run: RunOf,
        outcome: Result<R, PoolError>,
        settle: Option<(Claim, Settlement)>,
        later: Option<EndedLater>,
        now: u64,
    ) {
        if let Some(stream) = stream {
            // A streamed outcome goes to its stream, behind the partials (nobody could
            // retrieve it from the mailbox).
            self.fx.push(Effect::EndStream { stream, outcome });
            if let Some((claim, settlement)) = settle {
                self.fx.shared(SharedCall::Settle { claim, settlement });
            }
            return;
        }
        if let (Some((claim, _)), Some(_)) = (&settle, &later) {
            self.publishing.insert(claim.entry);
        }
        let delivery = Delivery {
            task_id,
            outcome: outcome.map_err(TaskFailure::from),
            stored_at_ms: u128::from(now),
        };
        self.fx.push(Effect::Deliver(Outcome {
            key,
            delivery,
            run,
            settle,
            later,
        }));
    }

    /// Ledger task `record` (of `key`) ended `status`: remembered for the children named
    /// later, and queued for the held children waiting on it, if any (see
    /// `dependencies.rs`). A task without a named tenant can be nobody's parent.
    pub fn note_end(
        &mut self,
        (entry, task_id): (EntryId, TaskId),
        key: &MailboxKey,
        status: &TaskStatus,
        now: u64,
    ) {
        if key.is_anonymous() {
            return;
        }
        let tenant = self.tenant_key_of(key);
        self.dependencies.remember(tenant, task_id, status, now);
        if self.core.has_children(entry) {
            self.dependencies
                .parent_ended(entry, task_id, status.clone(), now);
        }
    }
}
