//! What an operator reads of the pool at one instant, built from the ledger, the core and
//! the permits: the view of [`crate::scheduler::inspect`], and why one task waits, with its
//! place in line and expected start (core rule 23).

use super::ledger::admitted_ms;
use super::Shell;
use crate::domain::{MailboxKey, PoolError, ResourceKind, TaskId, TenantId};
use crate::queue::EntryId;
use crate::scheduler::core::{StartEstimate, WaitReason};
use crate::scheduler::inspect::{PoolView, TaskView, TenantView, WaitView, MAX_PAGE};

impl<P, R> Shell<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// The pool's work at `now` (see [`crate::scheduler::inspect`]): O(n) in the live
    /// tasks, plus the estimates of the page's parked ones (core rule 23), a simulation
    /// that stops once they have all started: at most O(n log n).
    pub fn inspect(&self, offset: usize, limit: usize, now: u64) -> PoolView {
        let core = &self.tasks.core;
        let ledger = &self.tasks.ledger;
        let (page, parked_total) = core.parked_page(offset, limit.min(MAX_PAGE));
        let estimates: std::collections::HashMap<EntryId, StartEstimate> =
            core.estimate_many(&page, now).into_iter().collect();
        let view = |entry: EntryId, reason: Option<WaitReason>| -> Option<TaskView> {
            let estimate = reason.as_ref().and_then(|_| estimates.get(&entry));
            let position = estimate.map(|estimate| estimate.position);
            let expected_start_ms = estimate.and_then(|estimate| estimate.start_ms);
            let from_timeouts = estimate.is_some_and(|estimate| estimate.from_timeouts);
            if let Some(record) = ledger.get(entry) {
                let since_ms = record.started_ms().unwrap_or_else(|| record.admitted_ms());
                return Some(TaskView {
                    id: record.task_id,
                    key: record.key.key().into_owned(),
                    cost: record.cost(),
                    also: core.extra_costs(entry).costs().collect(),
                    priority: record.priority,
                    permit: false,
                    since_ms: u128::from(since_ms),
                    attempt: record.attempt(),
                    reason,
                    position,
                    expected_start_ms: expected_start_ms.map(u128::from),
                    from_timeouts,
                });
            }
            let id = self
                .permits
                .waiter_id(entry)
                .or_else(|| self.permits.held_id(entry))?;
            let (cost, priority) = core.ticket_of(entry)?;
            Some(TaskView {
                id,
                key: self.permits.key().clone(),
                cost,
                also: core.extra_costs(entry).costs().collect(),
                priority,
                permit: true,
                since_ms: u128::from(admitted_ms(entry)),
                attempt: 1,
                reason,
                position,
                expected_start_ms: expected_start_ms.map(u128::from),
                from_timeouts,
            })
        };
        let mut running: Vec<TaskView> = ledger
            .iter()
            .filter(|record| record.run().is_some())
            .map(|record| record.entry)
            .chain(self.permits.held().map(|(entry, _)| entry))
            .filter_map(|entry| view(entry, None))
            .collect();
        running.sort_by_key(|task| (task.since_ms, task.id));
        let parked = page
            .into_iter()
            .filter_map(|entry| view(entry, core.why_waiting(entry)))
            .collect();
        PoolView {
            paused: core.is_paused(),
            draining: self.lifecycle.is_closed(),
            running,
            parked,
            parked_total,
            offset,
            tenants: self.tenant_views(),
        }
    }

    /// Each named tenant with live tasks, by name, then one row for all the anonymous
    /// tenants (each task submitted without a mailbox has a tenant of its own, so a row
    /// each would list the tasks, not the tenants).
    fn tenant_views(&self) -> Vec<TenantView> {
        let core = &self.tasks.core;
        let mut named: std::collections::BTreeMap<TenantId, TenantView> = Default::default();
        let mut anonymous = TenantView::anonymous();
        let mut anonymous_tenants = std::collections::HashSet::new();
        for record in self.tasks.ledger.iter() {
            let tenant = if let Some(bits) = record.key.anonymous_tenant() {
                anonymous_tenants.insert(bits);
                &mut anonymous
            } else {
                let key = record.key.key();
                named.entry(key.tenant.clone()).or_insert_with(|| {
                    let core_key = self.tasks.tenant_key_of(&key);
                    TenantView {
                        tenant: key.tenant.clone(),
                        running: 0,
                        parked: 0,
                        holds: [0; ResourceKind::COUNT],
                        service: core.tenant_service(core_key),
                        weight: core.tenant_weight(core_key),
                        anonymous_tenants: 0,
                    }
                })
            };
            if record.run().is_some() {
                tenant.running += 1;
                let cost = record.cost();
                tenant.holds[cost.kind.index()] += cost.units;
            } else if record.is_parked() {
                tenant.parked += 1;
            }
        }
        anonymous.anonymous_tenants = anonymous_tenants.len();
        let mut tenants: Vec<TenantView> = named.into_values().collect();
        if anonymous.anonymous_tenants > 0 {
            tenants.push(anonymous);
        }
        tenants
    }

    /// Why the live task `id` under exactly `key` has not started (core rule 17); `None`
    /// once it runs.
    pub fn why_waiting(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<WaitReason>, PoolError> {
        let entry = self
            .tasks
            .entry_of(key, id)
            .ok_or(PoolError::TaskNotFound(id))?;
        Ok(self.tasks.core.why_waiting(entry))
    }

    /// [`why_waiting`](Self::why_waiting) with the task's place in line and expected start
    /// at `now` (core rule 23).
    pub fn waiting(
        &self,
        key: &MailboxKey,
        id: TaskId,
        now: u64,
    ) -> Result<Option<WaitView>, PoolError> {
        let entry = self
            .tasks
            .entry_of(key, id)
            .ok_or(PoolError::TaskNotFound(id))?;
        let core = &self.tasks.core;
        let Some(reason) = core.why_waiting(entry) else {
            return Ok(None);
        };
        // A task held for its parents is in no line yet: the reason alone.
        let estimate = core.estimate_start(entry, now).unwrap_or(StartEstimate {
            position: 0,
            start_ms: None,
            from_timeouts: false,
        });
        Ok(Some(WaitView {
            reason,
            position: estimate.position,
            expected_start_ms: estimate.start_ms.map(u128::from),
            from_timeouts: estimate.from_timeouts,
            at_ms: u128::from(now),
        }))
    }
}
