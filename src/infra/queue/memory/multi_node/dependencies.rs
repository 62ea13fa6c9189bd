//! Dependencies between the tasks of the in-memory shared queue: a child parked with
//! [`SharedDependencies::enqueue_waiting`] waits in the queue until every parent (a task of
//! its tenant in this queue, by task id) has succeeded, on whichever node each ran. The
//! same contract as the Postgres table queue's (`infra/postgres/queue/dependencies.rs`),
//! under the queue's one lock instead of a transaction.
//!
//! # Where they live
//!
//! - A waiting child is in `waiting`, with how many parents it still waits for, whether it
//!   runs anyway and its own scheduled start; no claim sees it. A cancel removes it as it
//!   removes a parked task.
//! - `children` lists, per parent entry, the children waiting on it.
//! - `outcomes` remembers how the latest [`REMEMBERED_OUTCOMES`] tasks of the queue ended
//!   (succeeded, or the status they ended with), so that a child named after its parent
//!   ended finds it.
//!
//! # When a parent ends
//!
//! Every path that ends a task (a settle, a lease that runs out on its last attempt, a
//! cancel) calls [`Lot::ended`] under the same lock. A parent that succeeded takes one from
//! each child's count, and a child whose count reaches 0 parks (or rests until its own
//! scheduled start). One that did not ends its waiting children `Cancelled` (a dead letter
//! with `cancelled`, which the dead-letter reader of any node delivers to the submitter),
//! and theirs in turn, except those that run anyway, which count the parent as done.
//!
//! # Deadlines
//!
//! A waiting child whose deadline passes ends `Expired` at the next rescue
//! ([`Lot::expire_held`]), a dead letter that tells its submitter so, and its own waiting
//! children end `Cancelled`.

use std::collections::VecDeque;

use async_trait::async_trait;

use super::{InMemorySharedQueue, Lot, Parked};
use crate::core::{
    parent_ended_words, Carried, DeadLetter, DependsOn, EntryId, LetterEnd, QueueError,
    ScheduledTask, SharedDependencies, TaskStatus, HELD_PAST_DEADLINE,
};
use crate::util::serde::{MailboxKey, TaskId, TenantId};
use prometheus_parking_lot_actors::domain::DependencyError;
use prometheus_parking_lot_actors::scheduler::core::FastMap;

/// How many ended tasks the queue remembers for children named later: the latest ones.
pub(super) const REMEMBERED_OUTCOMES: usize = 10_000;

/// A child waiting for its parents.
pub(super) struct Waiting<P> {
    parked: Parked<P>,
    /// Parents not ended yet.
    pending: u32,
    /// Whether it runs when a parent does not succeed.
    runs_anyway: bool,
    /// Its own scheduled start, if it has one.
    not_before_ms: Option<u64>,
}

/// The queue's dependency books (see the module docs).
pub(super) struct Books<P> {
    waiting: FastMap<EntryId, Waiting<P>>,
    children: FastMap<EntryId, Vec<EntryId>>,
    /// `None`: it succeeded; else how it ended.
    outcomes: FastMap<(TenantId, TaskId), Option<TaskStatus>>,
    /// The callers in `outcomes`, oldest first.
    remembered: VecDeque<(TenantId, TaskId)>,
}

impl<P> Default for Books<P> {
    fn default() -> Self {
        Self {
            waiting: FastMap::default(),
            children: FastMap::default(),
            outcomes: FastMap::default(),
            remembered: VecDeque::new(),
        }
    }
}

impl<P> Books<P> {
    /// Whether `entry` is a waiting child.
    pub(super) fn holds(&self, entry: EntryId) -> bool {
        self.waiting.contains_key(&entry)
    }

    /// The waiting children's tasks.
    pub(super) fn tasks(&self) -> impl Iterator<Item = (EntryId, &ScheduledTask<P>)> {
        self.waiting
            .iter()
            .map(|(&entry, waiting)| (entry, &waiting.parked.task))
    }

    /// How many children wait.
    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Takes waiting child `entry` out, if it waits.
    pub(super) fn take(&mut self, entry: EntryId) -> Option<ScheduledTask<P>> {
        self.waiting
            .remove(&entry)
            .map(|waiting| waiting.parked.task)
    }

    fn remember(&mut self, task: &ScheduledTask<P>, outcome: Option<TaskStatus>) {
        let Some(key) = &task.meta.mailbox else {
            return;
        };
        let caller = (key.tenant.clone(), task.meta.id);
        if self.outcomes.insert(caller.clone(), outcome).is_none() {
            self.remembered.push_back(caller);
        }
        while self.remembered.len() > REMEMBERED_OUTCOMES {
            if let Some(oldest) = self.remembered.pop_front() {
                self.outcomes.remove(&oldest);
            }
        }
    }
}

impl<P> Lot<P> {
    /// Task `task`, stored as `entry`, ended: `None` when it succeeded, else how it ended.
    /// Remembers how, and releases or cancels the children waiting on it, and theirs in turn
    /// (see the module docs).
    pub(super) fn ended(
        &mut self,
        entry: EntryId,
        task: &ScheduledTask<P>,
        outcome: Option<TaskStatus>,
    ) {
        self.books.remember(task, outcome.clone());
        let mut ending = vec![(entry, task.meta.id)];
        let mut how = outcome.map(|status| (parent_ended_words(&status), status));
        while !ending.is_empty() {
            let mut doomed = Vec::new();
            for (parent, parent_task) in ending {
                for child in self.books.children.remove(&parent).unwrap_or_default() {
                    let Some(waiting) = self.books.waiting.get_mut(&child) else {
                        continue; // cancelled, or ended by another parent already
                    };
                    match &how {
                        Some((words, status)) if !waiting.runs_anyway => {
                            let Some(waiting) = self.books.waiting.remove(&child) else {
                                continue;
                            };
                            let task = waiting.parked.task;
                            let reason = format!("task {parent_task} it depends on {words}");
                            let end = LetterEnd::Cancelled {
                                parent: Some((parent_task, status.clone())),
                            };
                            let letter = letter_of(&task, reason, end);
                            self.dead.push_back(letter);
                            self.books.remember(&task, Some(TaskStatus::Cancelled));
                            doomed.push((child, task.meta.id));
                        }
                        _ => {
                            waiting.pending = waiting.pending.saturating_sub(1);
                            if waiting.pending == 0 {
                                if let Some(waiting) = self.books.waiting.remove(&child) {
                                    self.release(child, waiting);
                                }
                            }
                        }
                    }
                }
            }
            ending = doomed;
            let cancelled = TaskStatus::Cancelled;
            how = Some((parent_ended_words(&cancelled), cancelled));
        }
    }

    /// Ends each child whose deadline passed while it waited for its parents `Expired` (a
    /// dead letter that tells its submitter so), and the children waiting on it in turn
    /// (see [`ended`](Self::ended)). A scan of the waiting children, at each rescue.
    pub(super) fn expire_held(&mut self, now_ms: u64) {
        let mut due: Vec<EntryId> = self
            .books
            .waiting
            .iter()
            .filter(|(_, waiting)| {
                let deadline = waiting.parked.task.meta.deadline_ms;
                deadline.is_some_and(|deadline| deadline <= u128::from(now_ms))
            })
            .map(|(&entry, _)| entry)
            .collect();
        due.sort_unstable();
        for entry in due {
            let Some(task) = self.books.take(entry) else {
                continue;
            };
            let letter = letter_of(&task, HELD_PAST_DEADLINE.into(), LetterEnd::Expired);
            self.dead.push_back(letter);
            self.ended(entry, &task, Some(TaskStatus::Expired));
        }
    }

    /// Parks a child whose parents have all ended, or rests it until its own start.
    fn release(&mut self, entry: EntryId, waiting: Waiting<P>) {
        match waiting.not_before_ms {
            Some(at) => {
                self.resting.insert(entry, (at, waiting.parked));
            }
            None => self.park(entry, waiting.parked),
        }
    }

    /// The live entry (parked, claimed, resting or waiting) of caller (`tenant`, `id`), the
    /// latest if several: a scan, as [`Lot::live_caller`] is.
    fn live_entry(&self, tenant: &TenantId, id: TaskId) -> Option<EntryId> {
        let parked = self
            .parked
            .iter()
            .map(|(&entry, parked)| (entry, &parked.task));
        let claimed = self
            .claimed
            .iter()
            .map(|(&entry, held)| (entry, &held.parked.task));
        let resting = self
            .resting
            .iter()
            .map(|(&entry, (_, parked))| (entry, &parked.task));
        parked
            .chain(claimed)
            .chain(resting)
            .chain(self.books.tasks())
            .filter(|(_, task)| task.meta.id == id && tenant_of(task) == Some(tenant))
            .map(|(entry, _)| entry)
            .max()
    }

    /// Whether any task of another tenant than `tenant`, live or remembered, has id `id`.
    fn other_tenant_has(&self, tenant: &TenantId, id: TaskId) -> bool {
        let live = self
            .parked
            .values()
            .map(|parked| &parked.task)
            .chain(self.claimed.values().map(|held| &held.parked.task))
            .chain(self.resting.values().map(|(_, parked)| &parked.task))
            .chain(self.books.tasks().map(|(_, task)| task))
            .any(|task| task.meta.id == id && tenant_of(task).is_some_and(|of| of != tenant));
        live || self
            .books
            .outcomes
            .keys()
            .any(|(of, task)| *task == id && of != tenant)
    }

    /// The live parents among `depends_on`'s, or the refusal of the first that cannot be
    /// waited for (in the order named).
    fn live_parents(
        &self,
        tenant: &TenantId,
        depends_on: &DependsOn,
    ) -> Result<Vec<EntryId>, DependencyError> {
        let mut live = Vec::new();
        for &parent in &depends_on.parents {
            if let Some(entry) = self.live_entry(tenant, parent) {
                live.push(entry);
                continue;
            }
            match self.books.outcomes.get(&(tenant.clone(), parent)) {
                Some(None) => {}
                Some(Some(_)) if depends_on.run_anyway => {}
                Some(Some(status)) => {
                    return Err(DependencyError::ParentEnded {
                        parent,
                        status: status.clone(),
                    })
                }
                None if self.other_tenant_has(tenant, parent) => {
                    return Err(DependencyError::OtherTenant { parent })
                }
                None => return Err(DependencyError::UnknownParent { parent }),
            }
        }
        live.sort_unstable();
        live.dedup();
        Ok(live)
    }
}

/// The dead letter that tells `task`'s submitter it ended `end`, for `reason`.
pub(super) fn letter_of<P>(task: &ScheduledTask<P>, reason: String, end: LetterEnd) -> DeadLetter {
    DeadLetter {
        key: task
            .meta
            .mailbox
            .clone()
            .unwrap_or_else(|| MailboxKey::new("")),
        task_id: task.meta.id,
        cost: task.meta.cost,
        reason,
        end,
    }
}

fn tenant_of<P>(task: &ScheduledTask<P>) -> Option<&TenantId> {
    task.meta.mailbox.as_ref().map(|key| &key.tenant)
}

#[async_trait]
impl<P> SharedDependencies<P> for InMemorySharedQueue<P>
where
    P: Clone + Send + 'static,
{
    /// The parents are resolved and the child parked under the queue's one lock, so a
    /// parent cannot end between the two.
    async fn enqueue_waiting(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        carried: Carried,
        depends_on: &DependsOn,
    ) -> Result<u32, QueueError> {
        let mut lot = self.lock();
        if lot.refuses(entry, &task) {
            return Err(QueueError::Duplicate(entry));
        }
        let tenant = tenant_of(&task)
            .cloned()
            .unwrap_or_else(|| TenantId::from(""));
        let live = lot
            .live_parents(&tenant, depends_on)
            .map_err(|refusal| QueueError::Dependency(Box::new(refusal)))?;
        let waiting = Waiting {
            parked: Parked {
                task,
                rank_time_ms,
                claims: 0,
                claimable_from_ms: 0,
                trace: carried.trace,
            },
            pending: u32::try_from(live.len()).unwrap_or(u32::MAX),
            runs_anyway: depends_on.run_anyway,
            not_before_ms: carried.not_before_ms,
        };
        if live.is_empty() {
            lot.release(entry, waiting);
            return Ok(0);
        }
        for parent in live {
            lot.books.children.entry(parent).or_default().push(entry);
        }
        let pending = waiting.pending;
        lot.books.waiting.insert(entry, waiting);
        Ok(pending)
    }

    async fn waiting_parents(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<u32>, QueueError> {
        let lot = self.lock();
        Ok(lot
            .books
            .waiting
            .values()
            .find(|waiting| {
                let meta = &waiting.parked.task.meta;
                meta.id == id && meta.mailbox.as_ref() == Some(key)
            })
            .map(|waiting| waiting.pending))
    }
}
