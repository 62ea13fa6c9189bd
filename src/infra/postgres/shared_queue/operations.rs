//! What a node asks of a [`PgQueue`]: the [`SharedQueue`] operations (park, claim, renew,
//! settle, release, retry, remove), each one statement of the layout run with its values.

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};
use std::time::Duration;

use async_trait::async_trait;
use sea_orm::Value;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;

use super::PgQueue;
use crate::core::{
    Budgets, Carried, Claim, DependencyError, DependsOn, EntryId, FairByUse, FitQuery, Lease,
    QueueError, QueueMaintenance, RunUse, ScheduledTask, Settlement, SharedQueue, TaskStatus,
    TenantWeights, TraceParent, DEPENDENCIES_SUPPORTED,
};
use crate::infra::postgres::budgets::FleetBudgets;
use crate::infra::postgres::codec::{entries_to_sql, entry_to_sql, millis_u64, ParkRows};
use crate::infra::postgres::groups::{answer_group, returned_entries, settle_in_groups};
use crate::infra::postgres::service::FleetService;
use crate::infra::postgres::Table;
use crate::util::serde::{MailboxKey, ResourceKind, TaskId, TenantId};

/// How many claims in a row [`SharedQueue::claim_best_fit`] makes when each takes only tasks
/// that cannot be read, so that a queue full of bad tasks cannot hold a node there.
const UNREADABLE_ROUNDS: usize = 16;

#[async_trait]
impl<L, P> SharedQueue<P> for PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + DeserializeOwned + Send + 'static,
{
    fn backend(&self) -> &'static str {
        self.label.backend
    }

    fn maintenance(&self) -> &dyn QueueMaintenance {
        self
    }

    fn order(&self) -> crate::core::QueueOrder {
        self.statements.order
    }

    async fn enqueue(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
    ) -> Result<(), QueueError> {
        self.enqueue_carrying(entry, rank_time_ms, task, Carried::default())
            .await
    }

    /// One row whose `not_before_ms` (the table's column, pgmq's visibility time) keeps every
    /// node's claim off it until then, and whose `traceparent` (the table's column, a field
    /// of pgmq's message) every claim of it returns.
    async fn enqueue_carrying(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        carried: Carried,
    ) -> Result<(), QueueError> {
        let mut parked = self
            .enqueue_many(vec![(entry, rank_time_ms, task, carried)])
            .await;
        parked.pop().unwrap_or(Err(QueueError::Duplicate(entry)))
    }

    async fn enqueue_many(
        &self,
        tasks: Vec<(EntryId, u64, ScheduledTask<P>, Carried)>,
    ) -> Vec<Result<(), QueueError>> {
        let mut parked: Vec<Result<(), QueueError>> = Vec::with_capacity(tasks.len());
        let mut rows = ParkRows::new(self.label.backend).attaching(self.attaches());
        let mut written = Vec::with_capacity(tasks.len());
        for (entry, rank_time_ms, task, carried) in tasks {
            match rows.push_carrying(entry, rank_time_ms, &task, carried) {
                Ok(()) => {
                    written.push((parked.len(), entry));
                    parked.push(Ok(()));
                }
                Err(error) => parked.push(Err(error)),
            }
        }
        if written.is_empty() {
            return parked;
        }
        let params = [("queue", self.queue()), ("rows", rows.finish().into())];
        let stored = self.rows("park", &self.statements.park, &params).await;
        // An entry stored already (or twice in this group) is refused, once per copy.
        let stored = stored.map(|rows| returned_entries(&rows));
        // Only a parked task is news for other nodes: one announcement for the group.
        if answer_group(&mut parked, written, stored, QueueError::Duplicate) {
            self.announce();
        }
        parked
    }

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

    async fn enqueue_claimed(
        &self,
        node: &str,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        trace: Option<TraceParent>,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Lease<P>, QueueError> {
        let expires_at_ms = Lease::<P>::expiry(now_ms, lease);
        let mut rows = ParkRows::new(self.label.backend).attaching(self.attaches());
        let carried = Carried {
            not_before_ms: None,
            trace,
        };
        rows.push_carrying(entry, rank_time_ms, &task, carried)?;
        let params = [
            ("queue", self.queue()),
            ("rows", rows.finish().into()),
            ("node", node.to_owned().into()),
            ("expires_ms", millis_u64(expires_at_ms).into()),
        ];
        let stored = self
            .rows("park", &self.statements.park_claimed, &params)
            .await?;
        if stored.is_empty() {
            return Err(QueueError::Duplicate(entry));
        }
        Ok(Lease {
            entry,
            task,
            attempt: 1,
            expires_at_ms,
            trace,
        })
    }

    fn supports_dependencies(&self) -> bool {
        self.statements.park_waiting.is_some()
    }

    /// One call of the table's `_park_waiting` function, which resolves the parents, parks
    /// the row and its edges in one transaction (`queue/dependencies.rs`).
    async fn enqueue_waiting(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        carried: Carried,
        depends_on: &DependsOn,
    ) -> Result<(), QueueError> {
        let Some(sql) = &self.statements.park_waiting else {
            return Err(QueueError::Dependency(Box::new(
                DependencyError::Unsupported {
                    queue: format!("the shared queue {}", self.label.backend),
                    supported: DEPENDENCIES_SUPPORTED.into(),
                },
            )));
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
            "parked" => Ok(()),
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

    /// The counters live in `pl_fleet_service`, one row per queue and tenant, read and
    /// charged in each claim's transaction (`infra/postgres/service.rs`); the table layout
    /// claims by them, the pgmq layout does not.
    async fn share_fair_by_use(
        &self,
        order: FairByUse,
        weights: &TenantWeights,
        timeout_ms: Option<u64>,
    ) -> Result<bool, QueueError> {
        if !self.claims_by_use() {
            return Ok(false);
        }
        let key = format!(
            "{} {} {}",
            self.label.backend, self.label.place, self.label.queue
        );
        if let Err(error) = self.database.ensure(Table::Service).await {
            return Err(self.failed("share the tenant counters", &error).await);
        }
        self.set_fleet_service(FleetService::new(key, order, weights.clone(), timeout_ms));
        Ok(true)
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

    async fn give_back_budget(&self, kind: ResourceKind, units: u32) -> Result<(), QueueError> {
        let Some(fleet) = self.fleet_budgets() else {
            return Ok(());
        };
        match fleet.give_back(&self.database, kind, units).await {
            Ok(()) => Ok(()),
            Err(error) => Err(self.failed("give back budget", &error).await),
        }
    }

    /// Claims one task at a time until it takes one that can be read or finds none: a task
    /// that cannot be read is dead-lettered and the next is tried, `UNREADABLE_ROUNDS` times
    /// at most.
    async fn claim_best_fit(
        &self,
        node: &str,
        query: &FitQuery,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Option<Lease<P>>, QueueError> {
        for _ in 0..UNREADABLE_ROUNDS {
            let mut claimed = self.claim(node, query, 1, lease, now_ms).await?;
            if !claimed.leases.is_empty() || claimed.unreadable.is_empty() {
                return Ok(claimed.leases.pop());
            }
        }
        Ok(None)
    }

    async fn claim_batch(
        &self,
        node: &str,
        query: &FitQuery,
        max: usize,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Vec<Lease<P>>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        Ok(self.claim(node, query, max, lease, now_ms).await?.leases)
    }

    async fn renew(
        &self,
        node: &str,
        entry: EntryId,
        lease: Duration,
        now_ms: u64,
    ) -> Result<(), QueueError> {
        match self.renew_many(node, &[entry], lease, now_ms).await?[..] {
            [] => Ok(()),
            _ => Err(QueueError::NotClaimed(entry)),
        }
    }

    /// One statement for every entry, each looked up by its key.
    async fn renew_many(
        &self,
        node: &str,
        entries: &[EntryId],
        lease: Duration,
        now_ms: u64,
    ) -> Result<Vec<EntryId>, QueueError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let params = [
            ("queue", self.queue()),
            ("entries", entries_to_sql(entries).into()),
            ("node", node.to_owned().into()),
            (
                "expires_ms",
                millis_u64(Lease::<P>::expiry(now_ms, lease)).into(),
            ),
        ];
        let rows = self.rows("renew", &self.statements.renew, &params).await?;
        let renewed = returned_entries(&rows);
        Ok(entries
            .iter()
            .copied()
            .filter(|&entry| !renewed.contains(&entry_to_sql(entry)))
            .collect())
    }

    async fn settle(
        &self,
        node: &str,
        claim: Claim,
        settlement: Settlement,
    ) -> Result<(), QueueError> {
        let settled = self.settle_claims(node, &[claim], settlement).await?;
        if settled.is_empty() {
            return Err(QueueError::NotClaimed(claim.entry));
        }
        Ok(())
    }

    async fn settle_many(
        &self,
        node: &str,
        settlements: Vec<(Claim, Settlement)>,
    ) -> Vec<Result<(), QueueError>> {
        let failed = |claim, settlement| self.settle(node, claim, settlement);
        let done = |claims: Vec<Claim>| async move {
            self.settle_claims(node, &claims, Settlement::Done).await
        };
        settle_in_groups(settlements, failed, done).await
    }

    async fn release_many(
        &self,
        node: &str,
        claims: Vec<Claim>,
        now_ms: u64,
    ) -> Vec<Result<(), QueueError>> {
        let mut params = self.claim_params(node, &claims);
        params.push(("now_ms", millis_u64(now_ms).into()));
        let released = self
            .rows("release", &self.statements.release, params.as_slice())
            .await
            .map(|rows| returned_entries(&rows));
        if matches!(&released, Ok(entries) if !entries.is_empty()) {
            // At once, not coalesced: a node hands work back as it stops, and its process
            // may end before a coalesced announcement would go out.
            let notify = "SELECT pg_notify($1, '')".to_owned();
            let channel = vec![Value::from(self.channel.clone())];
            if let Err(error) = self.database.rows(notify, channel).await {
                tracing::warn!(queue = %self.label, error = %crate::infra::postgres::describe(&error), "could not announce the handed-back tasks; other nodes find them at their next poll");
            }
        }
        let mut answers: Vec<Result<(), QueueError>> = claims.iter().map(|_| Ok(())).collect();
        let indexed = claims.iter().map(|claim| claim.entry).enumerate().collect();
        answer_group(&mut answers, indexed, released, QueueError::NotClaimed);
        answers
    }

    async fn retry(
        &self,
        node: &str,
        claim: Claim,
        at_ms: u64,
        reason: String,
    ) -> Result<(), QueueError> {
        let mut params = self.claim_params(node, &[claim]);
        params.push(("at_ms", millis_u64(at_ms).into()));
        params.push(("reason", reason.into()));
        let rows = self
            .rows("retry", &self.statements.retry, params.as_slice())
            .await?;
        if returned_entries(&rows).is_empty() {
            return Err(QueueError::NotClaimed(claim.entry));
        }
        Ok(())
    }

    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let params = [
            ("queue", self.queue()),
            ("entry", entry_to_sql(entry).into()),
        ];
        self.take_parked("remove", &self.statements.remove, &params)
            .await
    }

    async fn remove_task(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let params = [
            ("queue", self.queue()),
            ("tenant", key.tenant.0.clone().into()),
            ("user_id", key.user_id.clone().into()),
            ("session_id", key.session_id.clone().into()),
            ("task_id", (id as i64).into()),
        ];
        self.take_parked("cancel", &self.statements.remove_task, &params)
            .await
    }

    async fn sleeping_until(
        &self,
        key: &MailboxKey,
        id: TaskId,
        now_ms: u64,
    ) -> Result<Option<u64>, QueueError> {
        let params = [
            ("queue", self.queue()),
            ("tenant", key.tenant.0.clone().into()),
            ("user_id", key.user_id.clone().into()),
            ("session_id", key.session_id.clone().into()),
            ("task_id", i64::try_from(id).unwrap_or(i64::MAX).into()),
            ("now_ms", millis_u64(now_ms).into()),
        ];
        let Some(row) = self
            .row("read a sleeping task", &self.statements.sleeping, &params)
            .await?
        else {
            return Ok(None);
        };
        let until: i64 = self.column(&row, "until_ms")?;
        Ok(u64::try_from(until).ok())
    }

    fn watch(&self) -> Option<watch::Receiver<u64>> {
        Some(self.wake.subscribe())
    }
}
