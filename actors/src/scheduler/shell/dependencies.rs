//! Dependencies between tasks, the shell's part: a submission's `depends_on` names callers
//! (tenant, task id); the shell resolves each to a live entry, or to how it ended a moment
//! ago, or refuses the submission; the core holds the ticket (core rule 24) and the shell
//! tells it how each parent ended, then starts or ends the children that end releases.
//!
//! # Who may be a parent
//!
//! A parent is a task of the child's tenant (its mailbox key's tenant) that is live in the
//! pool, or ended within [`REMEMBERED_MS`] among the last [`REMEMBERED_MAX`] ends of tasks
//! with a named tenant (a task submitted without a mailbox key has a tenant of its own, so
//! it can be nobody's parent). A parent that succeeded counts as done; one that ended
//! otherwise refuses the child (`ParentEnded`) unless it runs anyway. A parent unknown, of
//! another tenant, or the child itself is refused. No cycle can form: a task can only name
//! tasks that exist when it is submitted.
//!
//! # On a shared queue
//!
//! A shared queue that keeps dependencies
//! ([`SharedQueue::dependencies`](crate::queue::SharedQueue::dependencies),
//! the Postgres table queue) holds the child itself: the node checks only the bound and the
//! cycle, and parks the child there with the ids named
//! ([`SharedDependencies::enqueue_waiting`](crate::queue::SharedDependencies::enqueue_waiting)); the
//! queue resolves them against every node's tasks, refuses what memory refuses, and releases
//! or cancels the child as its parents end wherever they run. `why_waiting` for a child the
//! node does not hold asks the queue (`SharedDependencies::waiting_parents`, from the pool's
//! control side, before it asks whether the task sleeps there). Other shared queues refuse
//! dependencies (`Unsupported`), and so does a durable local queue that keeps none.
//!
//! # On a durable local queue
//!
//! The core holds the child as in memory; a queue that keeps dependencies
//! ([`TaskQueue::keeps_dependencies`](crate::queue::TaskQueue::keeps_dependencies), the yaque
//! queue) stores it with its parents (the storage mode's `park`, never left to spin) and
//! hears how each parent ended ([`settle_dependencies`](Shell::settle_dependencies) tells the
//! storage mode, before the children hear it). At start, `Tasks::restore` holds each stored
//! child again for its parents restored with it, and hands back those a parent that did
//! not succeed ends, which the shell cancels before it does anything else.
//!
//! # When a parent ends
//!
//! Every end of a ledger task (delivered, timed out, cancelled, expired, shed, abandoned)
//! goes through [`Tasks::note_end`](super::tasks::Tasks::note_end), which remembers it and,
//! when held children wait on it (one map lookup), queues it here. The shell settles the
//! queue before it hands its effects over ([`Shell::take_effects`]), so every event that
//! ends a parent releases its children in the same turn, and a child that ends cancelled
//! releases its own children in turn (a loop, not a recursion).

use std::collections::VecDeque;

use crate::domain::{DependencyError, MailboxKey, PoolError, TaskId, TaskStatus, MAX_PARENTS};
use crate::observe::events::TaskStep;
use crate::queue::{DependsOn, EntryId, DEPENDENCIES_SUPPORTED};
use crate::scheduler::core::{FastMap, TenantKey};
use crate::scheduler::protocol::SubmitOptions;

use super::Shell;

/// How long an ended task's outcome is remembered for its children, ms.
pub(crate) const REMEMBERED_MS: u64 = 10 * 60 * 1_000;

/// At most this many ended tasks' outcomes are remembered (the oldest go first).
pub(crate) const REMEMBERED_MAX: usize = 65_536;

/// The parents a submission waits for: live entries, and whether it runs anyway; on a
/// shared queue that keeps dependencies, the parents named, for the queue to resolve.
#[derive(Debug, Default)]
pub(super) struct Parents {
    pub entries: Vec<EntryId>,
    /// The caller's id of each of `entries`, in the same order.
    pub ids: Vec<TaskId>,
    pub run_anyway: bool,
    /// On a shared queue: the parents the queue holds the task for (`None` elsewhere, and
    /// without dependencies).
    pub in_queue: Option<DependsOn>,
}

/// A parent that ended while held children wait on it.
#[derive(Debug)]
struct ParentEnd {
    entry: EntryId,
    task_id: TaskId,
    status: TaskStatus,
    at: u64,
}

/// The outcomes remembered and the parents' ends not yet settled. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct DependencyBook {
    /// When each remembered task ended, oldest first.
    order: VecDeque<(u64, TenantKey, TaskId)>,
    /// How each remembered task ended, and when.
    ended: FastMap<(TenantKey, TaskId), (u64, TaskStatus)>,
    /// Ends of parents whose children have not heard yet.
    unsettled: Vec<ParentEnd>,
}

impl DependencyBook {
    /// Task `id` of tenant `tenant` ended `status` at `now`.
    pub fn remember(&mut self, tenant: TenantKey, id: TaskId, status: &TaskStatus, now: u64) {
        self.forget_before(now);
        while self.order.len() >= REMEMBERED_MAX {
            self.forget_oldest();
        }
        self.order.push_back((now, tenant, id));
        self.ended.insert((tenant, id), (now, status.clone()));
    }

    /// How task `id` of `tenant` ended, if it is remembered.
    fn outcome(&self, tenant: TenantKey, id: TaskId) -> Option<&TaskStatus> {
        self.ended.get(&(tenant, id)).map(|(_, status)| status)
    }

    /// Whether a task `id` of a tenant other than `tenant` is remembered (O(n), for an
    /// error's wording only).
    fn ended_elsewhere(&self, tenant: TenantKey, id: TaskId) -> bool {
        self.order
            .iter()
            .any(|&(_, other, ended)| ended == id && other != tenant)
    }

    /// Parent `entry` (caller id `task_id`) ended `status` at `now`, and children wait.
    pub fn parent_ended(&mut self, entry: EntryId, task_id: TaskId, status: TaskStatus, now: u64) {
        self.unsettled.push(ParentEnd {
            entry,
            task_id,
            status,
            at: now,
        });
    }

    /// Whether parents ended whose children have not heard yet.
    pub fn is_unsettled(&self) -> bool {
        !self.unsettled.is_empty()
    }

    fn forget_before(&mut self, now: u64) {
        while let Some(&(ended, ..)) = self.order.front() {
            if now.saturating_sub(ended) < REMEMBERED_MS {
                return;
            }
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        let Some((ended, tenant, id)) = self.order.pop_front() else {
            return;
        };
        if self
            .ended
            .get(&(tenant, id))
            .is_some_and(|(at, _)| *at == ended)
        {
            self.ended.remove(&(tenant, id));
        }
    }
}

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// The live parents task `id` of `key` waits for, or why its dependencies are refused.
    /// Parents that succeeded already are done; with no dependency the answer is empty.
    pub(super) fn resolve_parents(
        &self,
        id: TaskId,
        key: &MailboxKey,
        options: &SubmitOptions,
    ) -> Result<Parents, PoolError> {
        let refuse = |error| Err(PoolError::Dependency(Box::new(error)));
        let mut parents = Parents {
            entries: Vec::new(),
            ids: Vec::new(),
            run_anyway: options.run_if_parents_fail,
            in_queue: None,
        };
        if options.depends_on.is_empty() {
            return Ok(parents);
        }
        if let Some(queue) = self.storage.refuses_dependencies() {
            return refuse(DependencyError::Unsupported {
                queue,
                supported: DEPENDENCIES_SUPPORTED.into(),
            });
        }
        if options.depends_on.len() > MAX_PARENTS {
            return refuse(DependencyError::TooManyParents {
                count: options.depends_on.len(),
                max: MAX_PARENTS,
            });
        }
        if self.storage.waits_in_fleet() {
            // The queue resolves them, in the statement that parks the task (it alone
            // sees every node's tasks).
            if options.depends_on.contains(&id) {
                return refuse(DependencyError::Cycle { task: id });
            }
            let mut named = options.depends_on.clone();
            named.sort_unstable();
            named.dedup();
            parents.in_queue = Some(DependsOn {
                parents: named,
                run_anyway: parents.run_anyway,
            });
            return Ok(parents);
        }
        // A task without a named tenant has a tenant of its own: nothing is its parent.
        let named = Some(key).filter(|key| !key.is_anonymous());
        let tenant = named.map_or(0, |key| self.tasks.tenant_key_of(key));
        for &parent in &options.depends_on {
            if parent == id {
                return refuse(DependencyError::Cycle { task: id });
            }
            if let Some(entry) = named.and_then(|key| self.live_parent(key, parent)) {
                if !parents.entries.contains(&entry) {
                    parents.entries.push(entry);
                    parents.ids.push(parent);
                }
                continue;
            }
            let remembered = named.and_then(|_| self.tasks.dependencies.outcome(tenant, parent));
            match remembered {
                Some(TaskStatus::Completed) => {}
                Some(_) if parents.run_anyway => {}
                Some(status) => {
                    return refuse(DependencyError::ParentEnded {
                        parent,
                        status: status.clone(),
                    })
                }
                None if self.elsewhere(tenant, parent) => {
                    return refuse(DependencyError::OtherTenant { parent })
                }
                None => return refuse(DependencyError::UnknownParent { parent }),
            }
        }
        Ok(parents)
    }

    /// The entry of `key`'s task `parent` while it is live and has not ended (a run the
    /// watchdog ended waits for its thread, but its outcome is known and remembered).
    fn live_parent(&self, key: &MailboxKey, parent: TaskId) -> Option<EntryId> {
        let entry = self.tasks.ledger.entry_of_caller(&key.tenant, parent)?;
        let record = self.tasks.ledger.get(entry)?;
        let ended = record.run().is_some_and(|run| run.ended);
        (!ended).then_some(entry)
    }

    /// Whether a task `id` of a tenant other than `tenant` is live or remembered: read on
    /// the refusal's path only (O(n)).
    fn elsewhere(&self, tenant: TenantKey, id: TaskId) -> bool {
        self.tasks.ledger.iter().any(|record| record.task_id == id)
            || self.tasks.dependencies.ended_elsewhere(tenant, id)
    }

    /// Tells the core how each parent that ended since the last call ended, then starts the
    /// children released and ends `Cancelled` those a failed parent ends (whose own ends
    /// are settled in the same loop).
    pub(super) fn settle_dependencies(&mut self) {
        while self.tasks.dependencies.is_unsettled() {
            let ends = std::mem::take(&mut self.tasks.dependencies.unsettled);
            for end in ends {
                let fx = &mut self.tasks.fx;
                self.storage.parent_ended(end.entry, &end.status, fx);
                let succeeded = end.status == TaskStatus::Completed;
                let released = self.tasks.core.parent_ended(end.entry, succeeded, end.at);
                for child in released.cancelled {
                    let step = TaskStep::ParentFailed {
                        parent: end.task_id,
                        status: end.status.clone(),
                    };
                    self.tasks.step(child, step, end.at);
                    tracing::debug!(pool = %self.tasks.pool, parent = end.task_id, status = ?end.status, "a task it depends on did not succeed: cancelled");
                    self.end_parked(child, PoolError::Cancelled, end.at);
                }
                self.start_parked(released.started, end.at);
            }
        }
    }
}
