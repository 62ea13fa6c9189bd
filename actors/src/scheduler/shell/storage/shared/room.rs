//! The shared mode: this pool is one *node* of several that park to and claim from one queue
//! (a database table that API servers and GPU nodes share).
//!
//! The pool's own core still decides everything local: a new task that fits this node's free
//! capacity starts here at once. A task that would park goes to the shared queue instead,
//! where any node may claim it. Whenever this node has an idle worker, free capacity and
//! nothing parked here (after every finish, every poll, and every notice that work was
//! parked), it claims the best-ranked shared tasks that fit its free units, under leases it
//! renews while they run and settles when they end. A node that dies stops renewing; the
//! rescuer parks its expired claims again, so their tasks run again elsewhere: at-least-once.
//!
//! Rules that differ from the local modes, each because no node sees the whole queue:
//! - A claimed task that finds its capacity taken meanwhile (a local task started while the
//!   claim was in flight) parks in this node's ledger, still under its lease; the core's
//!   order then protects it like any parked task, and the node claims nothing more until it
//!   has started.
//! - A shared task's deadline is checked when a node claims it: past it, it ends `Expired`.
//! - Cancel reaches a shared task only while it is parked: the node that takes the cancel
//!   removes it by its key and id. Once claimed, it is the claiming node's to cancel.
//! - Task ids are unique per tenant among the tasks live on one node.
//! - Results go to the pool's mailbox: nodes that answer each other's callers share one.

use std::time::Duration;

use super::calls::{Enqueued, SharedCall};
use crate::domain::{
    Budgets, Capacity, Durability, MailboxKey, PoolError, ResourceCost, ResourceKind,
    ScheduledTask, TaskId,
};
use crate::observe::events::{Refusal, TaskStep};
use crate::queue::actor::fault_of;
use crate::queue::{DeadLetter, EntryId, FitQuery, LetterEnd, QueueError, StarvationRule};
use crate::scheduler::core::ParkingLot;
use crate::scheduler::shell::effects::{CancelReply, Effect};
use crate::scheduler::shell::ledger::Record;
use crate::scheduler::shell::observe::Detail;
use crate::scheduler::shell::tasks::Tasks;
use crate::util::contain::drop_contained;

/// The shared mode's state. See the module docs.
pub(crate) struct SharedRoom {
    /// The queue's backend name, for errors.
    backend: &'static str,
    /// Whether a task this node starts at once is stored as its claim before it runs
    /// (`Durability::Accepted`).
    records_starts: bool,
    /// How many claimed tasks may wait here beyond those that start at once.
    claim_ahead: usize,
    /// How long a claim is this node's without renewal, ms.
    lease_ms: u64,
    /// A claim is in flight: at most one at a time.
    claiming: bool,
    /// Work may have been parked while the claim in flight was being answered (a notice
    /// came meanwhile): claim again once it is, whatever it took.
    wake_pending: bool,
    /// When this node's leases were last renewed.
    renewed_at: u64,
    /// With budgets the queue keeps for the fleet: how long a bucket takes to refill an
    /// eighth of its burst (the quickest kind's), the wait before claiming again after a
    /// claim that found nothing while this node's own bucket is not full.
    refill_step_ms: Option<u64>,
    /// When to claim again after such a claim.
    reclaim_at: Option<u64>,
    /// The scheduled starts this node parked in the queue, soonest first (a few at most are
    /// kept: see [`MAX_KNOWN_INSTANTS`]): the node claims at each, rather than at its next
    /// poll, so a task it scheduled starts at its instant. Another node's scheduled tasks
    /// are found at the poll.
    known_instants: std::collections::BTreeSet<u64>,
    /// Whether the queue keeps dependencies between tasks
    /// ([`SharedQueue::dependencies`](crate::queue::SharedQueue::dependencies)).
    dependencies: bool,
}

/// The shortest wait between two claims that found a fleet's bucket short.
const MIN_REFILL_STEP_MS: u64 = 10;

/// How many scheduled starts a node remembers to claim at (the soonest): a node that
/// schedules more finds the later ones at its polls until the earlier ones are due.
const MAX_KNOWN_INSTANTS: usize = 1_024;

impl SharedRoom {
    /// The mode for a queue of `backend`, with the node's lease and claim-ahead.
    pub fn new(
        backend: &'static str,
        lease: Duration,
        claim_ahead: usize,
        durability: Durability,
    ) -> Self {
        Self {
            backend,
            records_starts: durability.writes_started_tasks(),
            claim_ahead,
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            claiming: false,
            wake_pending: false,
            renewed_at: 0,
            refill_step_ms: None,
            reclaim_at: None,
            known_instants: std::collections::BTreeSet::new(),
            dependencies: false,
        }
    }

    /// The same mode for a pool whose `budgets` the queue keeps for every node: a claim that
    /// finds nothing while this node's own bucket of a kind is below its burst (so the
    /// fleet's, which is at most as full, may be what stopped it) is made again once an
    /// eighth of the burst has come back, not at the next poll.
    pub fn with_fleet_budgets(mut self, budgets: &Budgets) -> Self {
        self.refill_step_ms = budgets
            .iter()
            .map(|(_, budget)| {
                let eighth = u64::from(budget.burst.div_ceil(8));
                (budget.per_ms.saturating_mul(eighth) / u64::from(budget.units.max(1)))
                    .max(MIN_REFILL_STEP_MS)
            })
            .min();
        self
    }

    /// A claim found nothing: with fleet budgets, claim again soon if this node's own
    /// bucket of some kind is below its burst (see [`with_fleet_budgets`](Self::with_fleet_budgets)).
    pub fn found_nothing(&mut self, core: &ParkingLot, now: u64) {
        let Some(step) = self.refill_step_ms else {
            return;
        };
        let short = core.limits().budgets.iter().any(|(kind, budget)| {
            core.budget_level(kind)
                .is_some_and(|level| level < budget.burst)
        });
        if short {
            self.reclaim_at = Some(now.saturating_add(step));
        }
    }

    /// When to claim next on a timer of the node's own, if at all: after a claim that found
    /// a fleet's bucket short, or at the soonest scheduled start it parked.
    pub fn reclaim_due(&self) -> Option<u64> {
        let instant = self.known_instants.first().copied();
        match (self.reclaim_at, instant) {
            (Some(at), Some(instant)) => Some(at.min(instant)),
            (at, instant) => at.or(instant),
        }
    }

    /// Whether that time has come; if so it is cleared.
    pub fn take_reclaim(&mut self, now: u64) -> bool {
        let mut due = false;
        if self.reclaim_at.is_some_and(|at| at <= now) {
            self.reclaim_at = None;
            due = true;
        }
        while self.known_instants.first().is_some_and(|&at| at <= now) {
            self.known_instants.pop_first();
            due = true;
        }
        if due && self.claiming {
            // The claim in flight may have been made before the instant: claim again once
            // it is answered, as after a notice.
            self.wake_pending = true;
        }
        due
    }

    /// This node parked a task in the queue that no node may claim before `until_ms`: it
    /// claims then.
    pub fn scheduled(&mut self, until_ms: u64) {
        self.known_instants.insert(until_ms);
        if self.known_instants.len() > MAX_KNOWN_INSTANTS {
            self.known_instants.pop_last();
        }
    }

    /// The queue's backend name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The same mode, on a queue that keeps dependencies when `keeps` is set.
    pub fn with_dependencies(mut self, keeps: bool) -> Self {
        self.dependencies = keeps;
        self
    }

    /// Whether the queue keeps dependencies: a submission that names parents parks there,
    /// held until they succeed.
    pub fn keeps_dependencies(&self) -> bool {
        self.dependencies
    }

    /// Whether a task this node starts at once is stored before it runs.
    pub fn records_starts(&self) -> bool {
        self.records_starts
    }

    /// The shared queue's entry id of a task admitted here: unique across nodes and, within
    /// one node and millisecond, increasing in admission order: `sequence` (the admission's
    /// count within its millisecond) in the high 16 bits, 48 random bits below.
    pub fn entry_for(sequence: u16) -> EntryId {
        const RANDOM_BITS: u32 = 48;
        let random = (crate::util::random::random_u128() as u64) & ((1 << RANDOM_BITS) - 1);
        (u64::from(sequence) << RANDOM_BITS) | random
    }

    /// Whether the leases held are due for renewal (a third of the lease has passed since
    /// the last); if so, the renewal is counted as made now.
    pub fn renewal_due(&mut self, now: u64) -> bool {
        if now.saturating_sub(self.renewed_at) < self.lease_ms / 3 {
            return false;
        }
        self.renewed_at = now;
        true
    }

    /// Asks to renew the leases this node holds, when a third of the lease has passed.
    pub fn renew_if_due<P: Send + 'static, R: Send + 'static>(
        &mut self,
        tasks: &mut Tasks<P, R>,
        now: u64,
    ) {
        if !self.renewal_due(now) {
            return;
        }
        // Running or waiting here, or finished with the outcome still on its way out; not
        // one the queue is still storing.
        let held = tasks
            .ledger
            .iter()
            .filter_map(Record::renewable_lease)
            .map(|claim| claim.entry)
            .chain(tasks.publishing.iter().copied())
            .collect();
        tasks.fx.shared(SharedCall::Renew { held, now });
    }

    /// Tasks the queue gave up on: their submitters get a failure.
    pub fn dead<P: Send + 'static, R: Send + 'static>(
        &self,
        tasks: &mut Tasks<P, R>,
        letters: Vec<DeadLetter>,
        now: u64,
    ) {
        for letter in letters {
            let (task_id, reason) = (letter.task_id, &letter.reason);
            let outcome = match letter.end {
                LetterEnd::Cancelled { parent } => {
                    tracing::debug!(pool = %tasks.pool, task_id, %reason, "a task it depends on did not succeed: cancelled");
                    if let Some((parent, status)) = parent {
                        let step = TaskStep::ParentFailed { parent, status };
                        let (key, cost) = (&letter.key, letter.cost);
                        tasks
                            .observers
                            .step(task_id, key, cost, &step, now, Detail::NONE);
                    }
                    Err(PoolError::Cancelled)
                }
                LetterEnd::Expired => {
                    tracing::debug!(pool = %tasks.pool, task_id, %reason, "its deadline passed while it waited for its parents: expired");
                    Err(PoolError::Expired)
                }
                LetterEnd::Shed => {
                    tracing::debug!(pool = %tasks.pool, task_id, %reason, "shed from the shared queue for a task of higher priority");
                    Err(PoolError::QueueFull)
                }
                LetterEnd::GivenUp => {
                    tracing::warn!(pool = %tasks.pool, task_id, %reason, "the shared queue gave up on a task");
                    Err(PoolError::Failed(letter.reason))
                }
            };
            // The attempt that gave up is not known here; the first is reported.
            tasks.deliver_report(
                letter.key,
                letter.task_id,
                letter.cost,
                1,
                outcome,
                None,
                now,
            );
        }
    }

    /// Claims from the shared queue if this node has room (see [`claim_wanted`](Self::claim_wanted)).
    pub fn claim_if_room<P: Send + 'static, R: Send + 'static>(
        &mut self,
        tasks: &mut Tasks<P, R>,
        now: u64,
    ) {
        if tasks.core.is_paused() {
            return;
        }
        let parked = tasks
            .ledger
            .iter()
            .filter(|record| record.is_parked())
            .map(Record::cost);
        let publishing = tasks.publishing.len();
        if let Some((query, max)) = self.claim_wanted(&tasks.core, parked, publishing, now) {
            tasks.fx.shared(SharedCall::Claim { query, max, now });
        }
    }

    /// A task handed to the shared queue is stored (its submitter hears it is accepted), or
    /// could not be (its submitter hears why).
    pub fn enqueued<P: Send + 'static, R: Send + 'static>(
        &self,
        tasks: &mut Tasks<P, R>,
        enqueued: Enqueued,
        now: u64,
    ) {
        let Enqueued {
            task_id,
            key,
            cost,
            reply,
            result,
            attached,
        } = enqueued;
        if let Some(original) = attached {
            // Its caller's task is live in the queue: not run again.
            tasks.fx.answer(reply, Ok(original));
            return;
        }
        match result {
            Ok(waits_for) => {
                let observers = &tasks.observers;
                observers.step(task_id, &key, cost, &TaskStep::Admitted, now, Detail::NONE);
                observers.step(task_id, &key, cost, &TaskStep::Parked, now, Detail::NONE);
                if let Some(pending) = waits_for.filter(|&pending| pending > 0) {
                    let held = TaskStep::WaitsForParents { pending };
                    observers.step(task_id, &key, cost, &held, now, Detail::NONE);
                }
                tasks.fx.answer(reply, Ok(key));
            }
            Err(refused @ (QueueError::Dependency(_) | QueueError::UnitsFull { .. })) => {
                // The queue refused its parents, or its bound on parked units is reached: a
                // refusal of the submission, not a fault.
                let error = match refused {
                    QueueError::Dependency(refusal) => PoolError::Dependency(refusal),
                    full => {
                        tracing::debug!(pool = %tasks.pool, task_id, %full, "refused: the shared queue is full");
                        PoolError::QueueFull
                    }
                };
                let refused = TaskStep::Refused(Refusal::of(&error));
                tasks
                    .observers
                    .step(task_id, &key, cost, &refused, now, Detail::NONE);
                tasks.fx.answer(reply, Err(error));
            }
            Err(error) => {
                tasks.observers.queue_error();
                let refused = TaskStep::Refused(Refusal::QueueError);
                tasks
                    .observers
                    .step(task_id, &key, cost, &refused, now, Detail::NONE);
                let error = tasks.backend_error(self.backend, "park a task", fault_of(error));
                tasks.fx.answer(reply, Err(error));
            }
        }
    }

    pub fn removed<P: Send + 'static, R: Send + 'static>(
        &self,
        tasks: &mut Tasks<P, R>,
        (key, id, reply): (MailboxKey, TaskId, CancelReply),
        result: Result<Option<ScheduledTask<P>>, QueueError>,
        now: u64,
    ) {
        let answer = match result {
            Ok(Some(task)) => {
                let cost = task.meta.cost;
                drop_contained(task);
                tasks.deliver_report(key, id, cost, 1, Err(PoolError::Cancelled), None, now);
                Ok(())
            }
            Ok(None) => Err(PoolError::TaskNotFound(id)),
            Err(error) => {
                tasks.observers.queue_error();
                Err(tasks.backend_error(self.backend, "cancel a task", fault_of(error)))
            }
        };
        tasks.fx.push(Effect::AnswerCancel { reply, answer });
    }

    /// A notice that work may have been parked. If a claim is in flight, it may have looked
    /// before that work was there: the node claims again once it is answered.
    pub fn woken(&mut self) {
        if self.claiming {
            self.wake_pending = true;
        }
    }

    /// Whether a claim is in flight: a stopping node waits for its answer, to hand back
    /// what it took.
    pub fn is_claiming(&self) -> bool {
        self.claiming
    }

    /// A claim answered: the next may go. Returns whether a notice came while it was in
    /// flight (see [`woken`](Self::woken)).
    pub fn claim_answered(&mut self) -> bool {
        self.claiming = false;
        std::mem::take(&mut self.wake_pending)
    }

    /// What this node should claim now, if anything: `(query, at most)`; marks the claim in
    /// flight. `parked` are the costs of the claimed tasks waiting here; `publishing`, how
    /// many claimed runs have ended and wait for their outcome to be stored.
    ///
    /// It claims when it could start a task now (an idle worker, free capacity, nothing
    /// claimed waiting here), or, with claim-ahead, when at most half the claimed tasks it may
    /// hold wait here: at most the idle workers plus the free claim-ahead room, within the
    /// free units less what the waiting tasks need. A node without workers (a producer) runs
    /// nothing, so it claims nothing. With claim-ahead, a busy node waits until half its
    /// waiting room is free and then fills it in one claim, rather than claiming a task or
    /// two after every finish.
    ///
    /// Runs whose outcome is still on its way to the mailbox take room from the claim-ahead
    /// too: a node whose results are stored more slowly than its workers run would otherwise
    /// claim ahead without end (thousands of claims held, each renewed, none started soon).
    pub fn claim_wanted(
        &mut self,
        core: &ParkingLot,
        parked: impl Iterator<Item = ResourceCost>,
        publishing: usize,
        now: u64,
    ) -> Option<(FitQuery, usize)> {
        let waiting = core.parked_len();
        let workers = core.live_workers();
        let idle = workers - core.busy_workers();
        let ahead = self.claim_ahead.saturating_sub(publishing);
        let room = (idle + ahead).saturating_sub(waiting);
        if self.claiming
            || workers == 0
            || room == 0
            || (waiting > 0 && ahead == 0)
            || (idle == 0 && waiting > ahead / 2)
        {
            return None;
        }
        let limits = core.limits();
        // With claim-ahead, a claim also takes tasks to wait here for the units the running
        // tasks hold: the free units plus up to one whole capacity, never more than the
        // capacity at once, less what the claims already waiting need. A worker that ends a
        // run then finds the next task here without a round trip to the queue, also on a
        // node whose units bind before its workers do. Without claim-ahead, only what fits
        // the free units now.
        let reach = if self.claim_ahead > 0 {
            limits.capacity
        } else {
            Capacity::uniform(0)
        };
        let mut within =
            ResourceKind::ALL
                .into_iter()
                .fold(Capacity::uniform(0), |within, kind| {
                    let whole = limits.capacity.get(kind);
                    let units = core.free(kind).saturating_add(reach.get(kind)).min(whole);
                    within.with(kind, units)
                });
        if waiting > 0 {
            for cost in parked {
                let left = within.get(cost.kind).saturating_sub(cost.units);
                within = within.with(cost.kind, left);
            }
        }
        if within.is_empty() {
            return None;
        }
        // A busy node claims ahead again once half a capacity of some kind is free to wait
        // for, in one claim, rather than a task or two after every finish.
        let half_free = ResourceKind::ALL.into_iter().any(|kind| {
            let whole = limits.capacity.get(kind);
            whole > 0 && within.get(kind) >= whole.div_ceil(2)
        });
        if idle == 0 && !half_free {
            return None;
        }
        let starvation = limits.starvation.max_park_ms.map(|age| StarvationRule {
            capacity: limits.capacity,
            parked_before_ms: now.saturating_sub(age),
        });
        self.claiming = true;
        Some((
            FitQuery {
                starvation,
                ..FitQuery::within(within)
            },
            room,
        ))
    }
}
