//! What a node asks of a [`PgQueue`]: the [`SharedQueue`] operations (park, claim, renew,
//! settle, release, retry, remove), each one statement of the layout run with its values.

use std::time::Duration;

use async_trait::async_trait;
use sea_orm::Value;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;

use super::PgQueue;
use crate::core::{
    Carried, Claim, EntryId, FitQuery, Lease, QueueError, QueueMaintenance, ScheduleTicks,
    ScheduledTask, Settlement, SharedBudgets, SharedDependencies, SharedFairShare, SharedQueue,
    TraceParent, UniqueCallers,
};
use crate::core::{QueueOrder, QueuedUnits, TaskStatus, SHED_FOR_HIGHER_PRIORITY};
use crate::infra::postgres::codec::{entries_to_sql, entry_to_sql, millis_u64, ParkRows};
use crate::infra::postgres::groups::{answer_group, returned_entries, settle_in_groups};
use crate::infra::postgres::named::NamedSql;
use crate::util::serde::{MailboxKey, ResourceCost, TaskId};
use prometheus_parking_lot_actors::util::clock::engine_now_ms;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

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

    /// Only a table opened with dependencies ([`PgQueue::with_dependencies`]) keeps them.
    fn dependencies(&self) -> Option<&dyn SharedDependencies<P>> {
        self.statements.park_waiting.is_some().then_some(self)
    }

    fn schedule_ticks(&self) -> Option<&dyn ScheduleTicks<P>> {
        Some(self)
    }

    fn budgets(&self) -> Option<&dyn SharedBudgets> {
        Some(self)
    }

    /// The table layout claims by the fleet's tenant counters; the pgmq layout does not.
    fn fair_share(&self) -> Option<&dyn SharedFairShare> {
        self.claims_by_use().then_some(self)
    }

    fn unique_callers(&self) -> Option<&dyn UniqueCallers> {
        Some(self)
    }

    /// The table layout keeps a bound on its parked units; the pgmq layout does not.
    fn queued_units(&self) -> Option<&dyn QueuedUnits> {
        self.statements.park_within.is_some().then_some(self)
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
        let mut costs = Vec::with_capacity(tasks.len());
        for (entry, rank_time_ms, task, carried) in tasks {
            match rows.push_carrying(entry, rank_time_ms, &task, carried) {
                Ok(()) => {
                    written.push((parked.len(), entry));
                    costs.push(task.meta.cost);
                    parked.push(Ok(()));
                }
                Err(error) => parked.push(Err(error)),
            }
        }
        if written.is_empty() {
            return parked;
        }
        let bound = self.max_queued_units.load(Ordering::Relaxed);
        if let Some(within) = self.statements.park_within.as_ref().filter(|_| bound > 0) {
            self.park_within(&within.park, rows, bound, &mut parked, written, costs)
                .await;
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
            also: Default::default(),
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

impl<L, P> PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + DeserializeOwned + Send + 'static,
{
    /// Parks `rows` through the table's bounded park (`queue/bounded.rs`), keeping `bound`
    /// units parked of each kind: fills in the answer of each task `written` lists (with its
    /// cost, in `costs`), `UnitsFull` for one the bound refused.
    async fn park_within(
        &self,
        park: &NamedSql,
        rows: ParkRows,
        bound: u64,
        parked: &mut [Result<(), QueueError>],
        written: Vec<(usize, EntryId)>,
        costs: Vec<ResourceCost>,
    ) {
        let shed = TaskStatus::Rejected(SHED_FOR_HIGHER_PRIORITY.into());
        let params = [
            ("queue", self.queue()),
            ("rows", rows.finish().into()),
            ("max_units", i64::try_from(bound).unwrap_or(i64::MAX).into()),
            ("now_ms", millis_u64(engine_now_ms()).into()),
            (
                "by_deadline",
                (self.statements.order == QueueOrder::Deadline).into(),
            ),
            (
                "status",
                serde_json::to_string(&shed).unwrap_or_default().into(),
            ),
            ("why", SHED_FOR_HIGHER_PRIORITY.into()),
        ];
        let outcomes = match self.rows("park within its bound", park, &params).await {
            Ok(outcomes) => outcomes,
            Err(error) => {
                for (index, _) in written {
                    parked[index] = Err(error.clone());
                }
                return;
            }
        };
        // Each entry answered `parked` once is parked (a second copy in the group is a
        // duplicate), one answered `full` is refused, any other is a duplicate.
        let (mut stored, mut full) = (HashMap::new(), HashSet::new());
        for row in &outcomes {
            let (Ok(entry), Ok(outcome)) = (
                row.try_get::<i64>("", "entry"),
                row.try_get::<String>("", "outcome"),
            ) else {
                continue;
            };
            match outcome.as_str() {
                "parked" => *stored.entry(entry).or_insert(0) += 1,
                "full" => {
                    full.insert(entry);
                }
                _ => {}
            }
        }
        let any = !stored.is_empty();
        for ((index, entry), cost) in written.into_iter().zip(costs) {
            let key = entry_to_sql(entry);
            parked[index] = match stored.get_mut(&key) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    Ok(())
                }
                _ if full.contains(&key) => Err(QueueError::UnitsFull {
                    kind: cost.kind,
                    needed: cost.units,
                    max_queued_units: bound,
                }),
                _ => Err(QueueError::Duplicate(entry)),
            };
        }
        // Only a parked task is news for other nodes: one announcement for the group.
        if any {
            self.announce();
        }
    }
}
