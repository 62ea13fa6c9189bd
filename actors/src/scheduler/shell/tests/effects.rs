//! The model's side of the shell's effects: each carried out as the driver and the backends
//! would, against the model's queues, mailbox and workers.

use super::*;

impl World {
    /// Carries out one effect.
    pub(super) fn effect(&mut self, effect: Effect<u32, u32>) -> Result<(), TestCaseError> {
        match effect {
            Effect::Answer { reply, answer } => reply.send(answer),
            Effect::AnswerCancel { .. } | Effect::AnswerShutdown { .. } | Effect::WakeGpu => {}
            Effect::Run { worker, job } => {
                let key = job
                    .task
                    .meta
                    .mailbox
                    .clone()
                    .expect("a job carries its key");
                prop_assert!(
                    self.running.iter().all(|&(busy, ..)| busy != worker),
                    "worker {worker} got a second job"
                );
                prop_assert!(
                    !self.resting.contains(&worker),
                    "worker {worker} got a job while its thread is still busy"
                );
                self.entry_of
                    .insert((key.clone(), job.task.meta.id), job.entry);
                self.running
                    .push((worker, job.entry, key, job.task.meta.id));
            }
            Effect::Queue(call) => {
                self.order_rule(&call)?;
                self.queue_calls.push_back(call);
            }
            Effect::Shared(SharedCall::Settle { claim, .. }) => {
                prop_assert!(
                    !self.shared_lost.contains(&claim.entry),
                    "a lost claim {} was settled",
                    claim.entry
                );
                self.shared_held.retain(|&held| held != claim.entry);
                self.shared_claimed.remove(&claim.entry);
            }
            Effect::Shared(SharedCall::Renew { held, .. }) => {
                // A renewal that names an entry the queue does not hold as this node's
                // claim (its insert still on its way) finds no claim: the node would give
                // up a run that is its own.
                for entry in &held {
                    prop_assert!(
                        self.shared_held.contains(entry) || self.shared_lost.contains(entry),
                        "renewed entry {entry} before the queue stored it as this node's claim"
                    );
                }
            }
            Effect::Shared(call) => self.shared_calls.push(call),
            Effect::Deliver(outcome) => {
                let id = outcome.delivery.task_id;
                let task = (outcome.key.clone(), id);
                *self.delivered.entry(task.clone()).or_default() += 1;
                if let Some(&entry) = self.entry_of.get(&task) {
                    let still_running = self.running.iter().any(|run| run.1 == entry);
                    if self.given_back.contains(&task) {
                        // Ended elsewhere (or given up by the queue) while this node's
                        // stopped run winds down: that run publishes nothing.
                    } else if still_running {
                        prop_assert!(
                            matches!(
                                outcome.delivery.outcome,
                                Err(TaskFailure::TimedOut | TaskFailure::Cancelled)
                            ),
                            "task {id} delivered {:?} while its run goes on",
                            outcome.delivery.outcome
                        );
                    } else {
                        prop_assert!(
                            self.shell.tasks.core.worker_of(entry).is_none(),
                            "task {id} delivered before its capacity was released"
                        );
                    }
                }
                if let Some((claim, _)) = outcome.settle {
                    prop_assert!(
                        !self.shared_lost.contains(&claim.entry),
                        "task {id} was published under its lost claim {}",
                        claim.entry
                    );
                    self.shared_held.retain(|&held| held != claim.entry);
                    self.shared_claimed.remove(&claim.entry);
                }
                prop_assert_eq!(
                    outcome.settle.is_some(),
                    outcome.later.is_some(),
                    "an outcome under a claim holds its Ended step back, and only such a one"
                );
                if let (Some(later), Some((claim, _))) = (outcome.later, outcome.settle) {
                    let stored = crate::mailbox::actor::Stored::Yes;
                    let key = outcome.key;
                    let report = SharedReport::Published {
                        key,
                        claim,
                        later,
                        stored,
                    };
                    self.shell.shared_report(report, self.now);
                }
            }
            Effect::EndStream { .. } => prop_assert!(false, "no task here streams"),
            Effect::Permit(effect) => {
                if let Some(undo) = effect.carry_out() {
                    self.shell.permit(undo, self.now);
                }
            }
        }
        Ok(())
    }
}
