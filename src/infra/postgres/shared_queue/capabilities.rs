//! The capabilities a [`PgQueue`] has beyond the shared contract, each one statement (or
//! one function call) of the layout: dependencies (a table opened with them), a schedule's
//! ticks parked once, the fleet's budgets and tenant counters, unique callers.

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::PgQueue;
use crate::core::{
    Budgets, Carried, DependencyError, DependsOn, EntryId, FairByUse, QueueError, QueuedUnits,
    RunUse, ScheduleTicks, ScheduledTask, SharedBudgets, SharedDependencies, SharedFairShare,
    TaskStatus, TenantWeights, UniqueCallers,
};
use crate::infra::postgres::budgets::FleetBudgets;
use crate::infra::postgres::codec::{millis_u64, ParkRows};
use crate::infra::postgres::service::FleetService;
use crate::infra::postgres::Table;
use crate::util::serde::{MailboxKey, ResourceKind, TaskId, TenantId};
use prometheus_parking_lot_actors::queue::capabilities::no_dependencies;

#[async_trait]
impl<L, P> SharedDependencies<P> for PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + DeserializeOwned + Send + 'static,
{
    /// One call of the table's `_park_waiting` function, which resolves the parents, parks
    /// the row and its edges in one transaction (`queue/dependencies.rs`).
    async fn enqueue_waiting(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        carried: Carried,
        depends_on: &DependsOn,
    ) -> Result<u32, QueueError> {
        let Some(sql) = &self.statements.park_waiting else {
            return Err(no_dependencies(self));
        };
        let tenant = task
            .meta
            .mailbox
            .as_ref()
            .map_or_else(String::new, |key| key.tenant.0.clone());
        let mut rows = ParkRows::new(self.label.backend).attaching(self.attaches());
        // The instant goes to the function, which holds the row until its parents end.
        let trace_only = Carried {
            not_before_ms: None,
            ..carried
        };
        rows.push_carrying(entry, rank_time_ms, &task, trace_only)?;
        let parents: Vec<String> = depends_on
            .parents
            .iter()
            .map(|&parent| i64::try_from(parent).unwrap_or(i64::MAX).to_string())
            .collect();
        let params = [
            ("queue", self.queue()),
            ("tenant", tenant.into()),
            ("parents", format!("{{{}}}", parents.join(",")).into()),
            ("run_anyway", depends_on.run_anyway.into()),
            (
                "after_ms",
                millis_u64(carried.not_before_ms.unwrap_or(0)).into(),
            ),
            ("rows", rows.finish().into()),
        ];
        let row = self
            .row("park a task waiting for its parents", sql, &params)
            .await?;
        let outcome: String = match &row {
            Some(row) => self.column(row, "outcome")?,
            None => String::new(),
        };
        let parent = || -> Result<TaskId, QueueError> {
            let parent: Option<i64> = row
                .as_ref()
                .map_or(Ok(None), |row| self.column(row, "parent"))?;
            Ok(parent.map_or(0, |parent| parent as TaskId))
        };
        let refused = |error| Err(QueueError::Dependency(Box::new(error)));
        match outcome.as_str() {
            // Its parents waited for, in the `parent` column (NULL from a function made by a
            // node before it answered them: none known).
            "parked" => Ok(u32::try_from(parent()?).unwrap_or(u32::MAX)),
            "duplicate" => Err(QueueError::Duplicate(entry)),
            "unknown" => refused(DependencyError::UnknownParent { parent: parent()? }),
            "other_tenant" => refused(DependencyError::OtherTenant { parent: parent()? }),
            "ended" => {
                let status: Option<String> = match &row {
                    Some(row) => self.column(row, "status")?,
                    None => None,
                };
                let status = status
                    .and_then(|text| serde_json::from_str::<TaskStatus>(&text).ok())
                    .unwrap_or(TaskStatus::Cancelled);
                refused(DependencyError::ParentEnded {
                    parent: parent()?,
                    status,
                })
            }
            other => Err(QueueError::Backend(BackendFault::plain(
                FaultKind::Corrupt,
                format!(
                    "{}: parking a task waiting for its parents answered {other:?}; expected \
                     parked, duplicate, unknown, other_tenant or ended",
                    self.label
                ),
            ))),
        }
    }

    async fn waiting_parents(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<u32>, QueueError> {
        let Some(sql) = &self.statements.waiting_parents else {
            return Ok(None);
        };
        let params = [
            ("queue", self.queue()),
            ("tenant", key.tenant.0.clone().into()),
            ("user_id", key.user_id.clone().into()),
            ("session_id", key.session_id.clone().into()),
            ("task_id", i64::try_from(id).unwrap_or(i64::MAX).into()),
        ];
        let Some(row) = self.row("read why a task waits", sql, &params).await? else {
            return Ok(None);
        };
        let pending: i32 = self.column(&row, "pending_parents")?;
        Ok(Some(u32::try_from(pending).unwrap_or(0)))
    }
}

#[async_trait]
impl<L, P> ScheduleTicks<P> for PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + DeserializeOwned + Send + 'static,
{
    /// The tick's row (`pl_schedule_ticks`) and the task are written in one transaction
    /// (`shared_queue/ticks.rs`).
    async fn enqueue_tick(
        &self,
        schedule: &str,
        tick_ms: u64,
        entry: EntryId,
        task: ScheduledTask<P>,
    ) -> Result<bool, QueueError> {
        self.park_tick(schedule, tick_ms, entry, task).await
    }

    async fn latest_tick(&self, schedule: &str) -> Result<Option<u64>, QueueError> {
        self.read_latest_tick(schedule).await
    }
}

#[async_trait]
impl<L, P> SharedBudgets for PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + DeserializeOwned + Send + 'static,
{
    /// The buckets live in `pl_fleet_budgets`, one row per queue and kind, refilled by the
    /// database's clock and spent in each claim's transaction (`infra/postgres/budgets.rs`).
    async fn share_budgets(&self, budgets: &Budgets) -> Result<(), QueueError> {
        if budgets.is_empty() {
            return Ok(());
        }
        budgets.validate().map_err(|error| {
            QueueError::Backend(BackendFault::plain(
                FaultKind::Other,
                format!("{}: {error}", self.label),
            ))
        })?;
        let key = format!(
            "{} {} {}",
            self.label.backend, self.label.place, self.label.queue
        );
        let shared = async {
            self.database.ensure(Table::Budgets).await?;
            FleetBudgets::share(&self.database, key, budgets).await
        };
        match shared.await {
            Ok(fleet) => {
                *self
                    .budgets
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(fleet);
                Ok(())
            }
            Err(error) => Err(self.failed("share budgets", &error).await),
        }
    }

    async fn give_back_budget(&self, kind: ResourceKind, units: u32) -> Result<(), QueueError> {
        let Some(fleet) = self.fleet_budgets() else {
            return Ok(());
        };
        match fleet.give_back(&self.database, kind, units).await {
            Ok(()) => Ok(()),
            Err(error) => Err(self.failed("give back budget", &error).await),
        }
    }
}

#[async_trait]
impl<L, P> SharedFairShare for PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + DeserializeOwned + Send + 'static,
{
    /// The counters live in `pl_fleet_service`, one row per queue and tenant, read and
    /// charged in each claim's transaction (`infra/postgres/service.rs`).
    async fn share_fair_by_use(
        &self,
        order: FairByUse,
        weights: &TenantWeights,
        timeout_ms: Option<u64>,
    ) -> Result<(), QueueError> {
        let key = format!(
            "{} {} {}",
            self.label.backend, self.label.place, self.label.queue
        );
        if let Err(error) = self.database.ensure(Table::Service).await {
            return Err(self.failed("share the tenant counters", &error).await);
        }
        self.set_fleet_service(FleetService::new(key, order, weights.clone(), timeout_ms));
        Ok(())
    }

    /// One update of the tenant's row in `pl_fleet_service` (`FleetService::settle`).
    async fn settle_use(&self, tenant: &TenantId, used: RunUse) -> Result<(), QueueError> {
        let Some(service) = self.fleet_service() else {
            return Ok(());
        };
        match service.settle(&self.database, &tenant.0, &used).await {
            Ok(()) => Ok(()),
            Err(error) => Err(self
                .failed("settle a run's fair-share charge", &error)
                .await),
        }
    }
}

#[async_trait]
impl<L, P> UniqueCallers for PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + DeserializeOwned + Send + 'static,
{
    /// A unique index on the live rows' callers, checked by the statement that parks.
    async fn keep_callers_unique(&self) -> Result<(), QueueError> {
        self.attach
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn live_task_key(
        &self,
        tenant: &TenantId,
        id: TaskId,
    ) -> Result<Option<MailboxKey>, QueueError> {
        let params = [
            ("queue", self.queue()),
            ("tenant", tenant.0.clone().into()),
            ("task_id", i64::try_from(id).unwrap_or(i64::MAX).into()),
        ];
        let Some(row) = self
            .row(
                "look up a caller's task",
                &self.statements.live_task,
                &params,
            )
            .await?
        else {
            return Ok(None);
        };
        let mut key = MailboxKey::new(self.column::<String>(&row, "tenant")?);
        key.user_id = self.column(&row, "user_id")?;
        key.session_id = self.column(&row, "session_id")?;
        Ok(Some(key))
    }
}

#[async_trait]
impl<L, P> QueuedUnits for PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + DeserializeOwned + Send + 'static,
{
    /// Makes the table's bounded park (`queue/bounded.rs`) the first time a bounded queue
    /// of it opens (pgmq's comes with the queue, `pgmq/bounded.rs`); this handle's parks go
    /// through it from then on.
    async fn bound_queued_units(&self, max_queued_units: u64) -> Result<(), QueueError> {
        let Some(within) = &self.statements.park_within else {
            return Err(QueueError::Backend(BackendFault::plain(
                FaultKind::Other,
                format!(
                    "{}: the queue keeps no bound on its parked units",
                    self.label
                ),
            )));
        };
        if let Some(table) = &within.table {
            if let Err(error) = self.database.ensure(Table::QueuedUnits(table)).await {
                return Err(self.failed("make its bounded park", &error).await);
            }
        }
        self.max_queued_units
            .store(max_queued_units, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
