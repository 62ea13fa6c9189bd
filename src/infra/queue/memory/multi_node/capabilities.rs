//! The capabilities the in-memory shared queue has beyond the contract: a schedule's ticks
//! parked once, budgets and unique callers kept for every pool that shares it. It keeps no
//! dependencies and no fleet fair-share counters: each node's core orders its own tasks.

use async_trait::async_trait;

use super::{FleetBucket, InMemorySharedQueue, Parked};
use crate::core::{
    Budgets, EntryId, QueueError, ScheduleTicks, ScheduledTask, SharedBudgets, UniqueCallers,
};
use crate::util::serde::{MailboxKey, ResourceKind, TaskId, TenantId};

#[async_trait]
impl<P> ScheduleTicks<P> for InMemorySharedQueue<P>
where
    P: Clone + Send + 'static,
{
    /// The tick's key and the task are kept under one lock: a tick at or before the
    /// schedule's latest is parked already.
    async fn enqueue_tick(
        &self,
        schedule: &str,
        tick_ms: u64,
        entry: EntryId,
        task: ScheduledTask<P>,
    ) -> Result<bool, QueueError> {
        let mut lot = self.lock();
        if lot
            .latest_ticks
            .get(schedule)
            .is_some_and(|latest| *latest >= tick_ms)
        {
            return Ok(false);
        }
        if lot.refuses(entry, &task) {
            return Err(QueueError::Duplicate(entry));
        }
        lot.latest_ticks.insert(schedule.to_owned(), tick_ms);
        let parked = Parked {
            task,
            rank_time_ms: tick_ms,
            claims: 0,
            claimable_from_ms: 0,
            trace: None,
        };
        lot.park(entry, parked);
        Ok(true)
    }

    async fn latest_tick(&self, schedule: &str) -> Result<Option<u64>, QueueError> {
        Ok(self.lock().latest_ticks.get(schedule).copied())
    }
}

#[async_trait]
impl<P: Send + 'static> SharedBudgets for InMemorySharedQueue<P> {
    /// A budget that replaces another keeps the old one's level, at most its new burst.
    async fn share_budgets(&self, budgets: &Budgets) -> Result<(), QueueError> {
        let mut lot = self.lock();
        for (kind, budget) in budgets.iter() {
            let slot = &mut lot.budgets[kind.index()];
            match slot {
                Some(bucket) if bucket.budget == *budget => {}
                _ => {
                    let level = slot.as_ref().map(|bucket| bucket.units.whole());
                    *slot = Some(FleetBucket::new(*budget, level));
                }
            }
        }
        Ok(())
    }

    async fn give_back_budget(&self, kind: ResourceKind, units: u32) -> Result<(), QueueError> {
        if let Some(bucket) = &mut self.lock().budgets[kind.index()] {
            bucket.units.give_back(units);
        }
        Ok(())
    }
}

#[async_trait]
impl<P: Send + 'static> UniqueCallers for InMemorySharedQueue<P> {
    async fn keep_callers_unique(&self) -> Result<(), QueueError> {
        self.lock().unique_callers = true;
        Ok(())
    }

    async fn live_task_key(
        &self,
        tenant: &TenantId,
        id: TaskId,
    ) -> Result<Option<MailboxKey>, QueueError> {
        let lot = self.lock();
        if !lot.unique_callers {
            return Ok(None);
        }
        let ended = || {
            lot.ended
                .get(&(tenant.clone(), id))
                .map(|(_, key)| key.clone())
        };
        Ok(lot
            .live_caller(tenant, id)
            .and_then(|task| task.meta.mailbox.clone())
            .or_else(ended))
    }
}
