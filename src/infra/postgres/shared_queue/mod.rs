//! A [`SharedQueue`] on PostgreSQL, whatever its layout: [`PgQueue`].
//!
//! The two Postgres queues differ only in where a task lives: a row of one table
//! ([`PostgresQueue`](crate::infra::postgres::queue::PostgresQueue)), or a PGMQ message in a
//! queue per priority level (`PgmqQueue`, cargo feature `pgmq`). Each layout writes its
//! [`Statements`] once, when the queue is opened; everything else is here, once for both:
//! the values each statement is given (by name, see [`named`](super::named)), the answers of
//! group statements, the claim and its loop past unreadable tasks, the rescue and its
//! wake-up, the dead letters, and errors that name the pool, the queue and the cause (see
//! [`outage`](super::outage)).
//!
//! | statement | parameters | answers (columns) |
//! |---|---|---|
//! | `park` | `$queue`, `$rows` ([`ParkRows`]) | `entry` of each task stored |
//! | `park_claimed` | `$queue`, `$rows`, `$node`, `$expires_ms` | `entry` of each task stored |
//! | `claim` | [`ClaimParams`] | see [`claim`](super::claim) |
//! | `renew` | `$queue`, `$entry`, `$node`, `$expires_ms` | `changed` |
//! | `settle_done` | `$queue`, `$entries`, `$attempts`, `$node` | `entry` of each claim ended |
//! | `settle_failed` | `$queue`, `$entries`, `$attempts`, `$node`, `$reason` | `entry` of each claim ended |
//! | `release` | `$queue`, `$entries`, `$attempts`, `$node`, `$now_ms` | `entry` of each claim handed back |
//! | `remove` | `$queue`, `$entry` | `metadata`, `payload` |
//! | `remove_task` | `$queue`, `$tenant`, `$user_id`, `$session_id`, `$task_id` | `metadata`, `payload` |
//! | `live_task` | `$queue`, `$tenant`, `$task_id` | `tenant`, `user_id`, `session_id` |
//! | `rescue` | [`RescueParams`] | `parked`, `dead` |
//! | `counts` | `$queue` | `parked`, `claimed` |
//! | `dead_letters` | `$queue`, `$max` | `tenant`, `user_id`, `session_id`, `task_id`, `kind`, `units`, `reason` |
//! | `bury` | `$queue`, `$row_id`, `$level`, `$reason` | none |
//! | `list_dead` | `$queue`, `$offset`, `$limit` | `entry`, `attempts`, `metadata`, `reason` |
//! | `retry_dead` | `$queue`, `$entry` | `entry` (none when no such dead letter) |
//! | `purge_dead` | `$queue`, `$entry` (`NULL`: all) | `n` |
//! | `forget_done` | `$queue`, `$now_ms` | none |

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sea_orm::{QueryResult, Value};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;

use super::budgets::FleetBudgets;
use super::claim::{claimed_rows, ClaimParams, Claimed, Unreadable};
use super::codec::{
    column, count_to_sql, entry_from_sql, entry_to_sql, millis_u64, task_of, ParkRows,
};
use super::fence::{claim_values, ClaimFence};
use super::groups::{answer_group, returned_entries, settle_in_groups};
use super::named::{NamedSql, Params};
use super::outage::OutageGate;
use super::retry::{RescueParams, RetryPolicy};
use super::{fault_of, PgDatabase, Table};
use crate::core::{
    Budgets, Claim, DeadLetter, EntryId, FitQuery, KeptLetter, Lease, QueueCounts, QueueError,
    QueueMaintenance, ScheduledTask, Settlement, SharedQueue, TaskMetadata,
};
use crate::util::serde::{MailboxKey, ResourceCost, ResourceKind, TaskId, TenantId};

/// How many claims in a row [`SharedQueue::claim_best_fit`] makes when each takes only tasks
/// that cannot be read, so that a queue full of bad tasks cannot hold a node there.
const UNREADABLE_ROUNDS: usize = 16;

/// How a statement runs: on its own, or as a claim (see [`PgDatabase::claim_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runner {
    Plain,
    Claim,
}

/// The statements of a queue layout (see the module docs for what each is given and answers).
pub(crate) struct Statements {
    /// Parks a group of tasks.
    pub park: NamedSql,
    /// Stores one task as a node's claim (it started at once there).
    pub park_claimed: NamedSql,
    /// Claims the best-ranked tasks that fit.
    pub claim: NamedSql,
    /// Extends a node's lease.
    pub renew: NamedSql,
    /// Ends a node's claims whose runs ended well.
    pub settle_done: NamedSql,
    /// Ends a node's claim on a run that failed, keeping the reason.
    pub settle_failed: NamedSql,
    /// Hands a node's claims back, claimable at once by any node.
    pub release: NamedSql,
    /// Parks a node's claim again after a failed run, claimable from `$at_ms`, the claim
    /// counted as an attempt and `$reason` kept.
    pub retry: NamedSql,
    /// Removes a parked task by its entry.
    pub remove: NamedSql,
    /// Removes a parked task by its key and id (a cancel).
    pub remove_task: NamedSql,
    /// The key of the live (or lately completed) task of a caller (`$tenant`, `$task_id`)
    /// whose row keeps callers unique, if any.
    pub live_task: NamedSql,
    /// Parks expired claims again, or dead-letters them on their last attempt.
    pub rescue: NamedSql,
    /// Counts parked and claimed tasks.
    pub counts: NamedSql,
    /// Takes dead letters not reported yet.
    pub dead_letters: NamedSql,
    /// Lists the dead letters kept, oldest first.
    pub list_dead: NamedSql,
    /// Parks a dead letter again, its attempts afresh.
    pub retry_dead: NamedSql,
    /// Deletes one dead letter, or all of the queue's.
    pub purge_dead: NamedSql,
    /// Forgets the callers of completed tasks once their time is up (see
    /// [`SharedQueue::keep_callers_unique`]).
    pub forget_done: NamedSql,
    /// Dead-letters a claimed task that cannot be read.
    pub bury: NamedSql,
}

/// Which queue this is, for logs and errors: `pool "gpu", postgres queue "llm" (table
/// pl_queue_jobs)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueLabel {
    /// The backend's name ([`SharedQueue::backend`]).
    pub backend: &'static str,
    /// The queue's name, as statements bind it (`$queue`).
    pub queue: String,
    /// Where it lives (`table pl_queue_jobs`).
    pub place: String,
    /// The pool it serves, once told ([`PgQueue::with_pool`]).
    pub pool: Option<String>,
}

impl std::fmt::Display for QueueLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Debug quotes the names and escapes what they hold, so a message stays one line.
        if let Some(pool) = &self.pool {
            write!(f, "pool {pool:?}, ")?;
        }
        write!(
            f,
            "{} queue {:?} ({})",
            self.backend, self.queue, self.place
        )
    }
}

/// A [`SharedQueue`] on PostgreSQL in layout `L`. See the module docs; users name it by its
/// layout's name,
/// [`PostgresQueue`](crate::infra::postgres::queue::PostgresQueue) or `PgmqQueue`.
pub struct PgQueue<L, P> {
    database: PgDatabase,
    layout: L,
    statements: Statements,
    label: QueueLabel,
    /// The NOTIFY channel parks and rescues are announced on.
    channel: String,
    retry: RetryPolicy,
    /// Bumped when a task is parked or rescued anywhere (NOTIFY on the queue's channel).
    wake: Arc<watch::Sender<u64>>,
    gate: OutageGate,
    /// The budgets every node of the queue spends from in its claims, once shared.
    budgets: std::sync::Mutex<Option<Arc<FleetBudgets>>>,
    /// Whether the rows this handle parks keep their callers unique
    /// ([`SharedQueue::keep_callers_unique`]).
    attach: std::sync::atomic::AtomicBool,
    _payload: PhantomData<fn() -> P>,
}

impl<L: std::fmt::Debug, P> std::fmt::Debug for PgQueue<L, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgQueue")
            .field("layout", &self.layout)
            .field("queue", &self.label.queue)
            .field("pool", &self.label.pool)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl<L, P> PgQueue<L, P> {
    /// A queue in `layout`, whose tables exist, answering with `statements`; it starts
    /// listening on `channel` for the parks and rescues of every node.
    pub(crate) fn new(
        database: &PgDatabase,
        layout: L,
        statements: Statements,
        label: QueueLabel,
        channel: String,
    ) -> Self {
        let wake = Arc::new(watch::Sender::new(0));
        database.listen(
            channel.clone(),
            Arc::downgrade(&wake),
            |wake: &watch::Sender<u64>, _| {
                wake.send_modify(|count: &mut u64| *count = count.wrapping_add(1));
            },
        );
        Self {
            database: database.clone(),
            layout,
            statements,
            label,
            channel,
            retry: RetryPolicy::default(),
            wake,
            gate: OutageGate::default(),
            budgets: std::sync::Mutex::new(None),
            attach: std::sync::atomic::AtomicBool::new(false),
            _payload: PhantomData,
        }
    }

    /// Sets how lost runs are retried.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Names the pool this queue serves in its errors, beside the queue's own name.
    pub fn with_pool(mut self, pool: &str) -> Self {
        self.label.pool = Some(pool.to_owned());
        self
    }

    /// The layout's own state.
    pub(crate) fn layout(&self) -> &L {
        &self.layout
    }

    /// The statements of this queue's layout.
    #[cfg(test)]
    pub(crate) fn statements(&self) -> &Statements {
        &self.statements
    }

    /// The queue's name, as statements bind it.
    #[cfg(test)]
    pub(crate) fn name(&self) -> &str {
        &self.label.queue
    }

    /// The queue's name, as statements bind it.
    fn queue(&self) -> Value {
        self.label.queue.clone().into()
    }

    /// Runs `sql` (operation `what`) with `params`; an error names the queue, the operation
    /// and its cause.
    async fn rows<T: Params + ?Sized>(
        &self,
        what: &str,
        sql: &NamedSql,
        params: &T,
    ) -> Result<Vec<QueryResult>, QueueError> {
        self.run(what, sql, params, Runner::Plain).await
    }

    /// The first row of [`rows`](Self::rows), if any.
    async fn row<T: Params + ?Sized>(
        &self,
        what: &str,
        sql: &NamedSql,
        params: &T,
    ) -> Result<Option<QueryResult>, QueueError> {
        Ok(self.rows(what, sql, params).await?.into_iter().next())
    }

    /// Runs the claim statement (see [`PgDatabase::claim_rows`]), within the fleet's budgets
    /// where the queue has them ([`PgDatabase::claim_rows_within`]).
    async fn claim_rows(&self, params: &ClaimParams<'_>) -> Result<Vec<QueryResult>, QueueError> {
        let Some(fleet) = self.fleet_budgets() else {
            return self
                .run("claim", &self.statements.claim, params, Runner::Claim)
                .await;
        };
        self.gate
            .pass(&self.database)
            .await
            .map_err(|cause| QueueError::Backend(cause.fault(&format!("{}: claim", self.label))))?;
        let sql = self.statements.claim.clone();
        let (queue, node) = (params.queue.to_owned(), params.node.to_owned());
        let (now_ms, expires_at_ms) = (params.now_ms, params.expires_at_ms);
        let bind = move |query: &FitQuery, max: usize| {
            sql.bind(&ClaimParams {
                queue: &queue,
                node: &node,
                query,
                now_ms,
                expires_at_ms,
                max,
            })
        };
        let text = self.statements.claim.text().to_owned();
        let claimed = self
            .database
            .claim_rows_within(fleet, text, *params.query, params.max, bind)
            .await;
        match claimed {
            Ok(rows) => Ok(rows),
            Err(error) => Err(self.failed("claim", &error).await),
        }
    }

    /// Whether the rows this handle parks keep their callers unique.
    fn attaches(&self) -> bool {
        self.attach.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The budgets the queue's nodes share, if they were given any.
    fn fleet_budgets(&self) -> Option<Arc<FleetBudgets>> {
        self.budgets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Binds `params`, passes the [`OutageGate`], and runs `sql` with `runner`.
    async fn run<T: Params + ?Sized>(
        &self,
        what: &str,
        sql: &NamedSql,
        params: &T,
        runner: Runner,
    ) -> Result<Vec<QueryResult>, QueueError> {
        let values = sql.bind(params).map_err(|missing| {
            QueueError::Backend(BackendFault::plain(
                FaultKind::Other,
                format!("{}: {what}: {missing}", self.label),
            ))
        })?;
        self.gate.pass(&self.database).await.map_err(|cause| {
            QueueError::Backend(cause.fault(&format!("{}: {what}", self.label)))
        })?;
        let text = sql.text().to_owned();
        let rows = match runner {
            Runner::Plain => self.database.rows(text, values).await,
            Runner::Claim => self.database.claim_rows(text, values).await,
        };
        match rows {
            Ok(rows) => Ok(rows),
            Err(error) => Err(self.failed(what, &error).await),
        }
    }

    /// The error of a statement that failed with `error`.
    async fn failed(&self, what: &str, error: &sea_orm::DbErr) -> QueueError {
        let cause = self.gate.cause_of(&self.database, error).await;
        QueueError::Backend(fault_of(&format!("{}: {what}", self.label), cause, error))
    }

    /// Reads column `name` of a row of this queue.
    fn column<T: sea_orm::TryGetable>(
        &self,
        row: &QueryResult,
        name: &str,
    ) -> Result<T, QueueError> {
        column(self.label.backend, row, name)
    }

    /// Wakes the nodes: a task was parked or rescued.
    fn announce(&self) {
        self.database.announce(&self.channel, String::new());
    }

    /// Moves a claimed row whose task cannot be read to the dead letters, with the reason.
    async fn bury(&self, unreadable: Unreadable) -> Result<(), QueueError> {
        tracing::error!(queue = %self.label, row = unreadable.row_id, reason = %unreadable.reason, "dead-lettering a queued task that cannot be read");
        let params = [
            ("queue", self.queue()),
            ("row_id", unreadable.row_id.into()),
            ("level", unreadable.level.into()),
            ("reason", unreadable.reason.into()),
        ];
        self.rows("dead-letter", &self.statements.bury, &params)
            .await
            .map(drop)
    }

    /// The values naming `node`'s `claims` in a settle or a release.
    fn claim_params(&self, node: &str, claims: &[Claim]) -> Vec<(&'static str, Value)> {
        claim_values(&self.label.queue, node, claims)
    }

    /// The queue's way of ending claims in a result store's transaction, for a
    /// [`PostgresMailbox`](crate::infra::postgres::mailbox::PostgresMailbox) of the same
    /// database (see [`ClaimFence`]).
    pub fn fence(&self) -> ClaimFence {
        ClaimFence::new(
            self.database.clone(),
            self.label.queue.clone(),
            self.statements.settle_done.clone(),
            self.statements.settle_failed.clone(),
        )
    }

    /// Ends `node`'s `claims` with `settlement`, in one statement; returns the entries (as
    /// stored) that `node` held under those claims and that are now settled.
    async fn settle_claims(
        &self,
        node: &str,
        claims: &[Claim],
        settlement: Settlement,
    ) -> Result<std::collections::HashSet<i64>, QueueError> {
        let mut params = self.claim_params(node, claims);
        let sql = match settlement {
            Settlement::Done => &self.statements.settle_done,
            Settlement::Failed(reason) => {
                params.push(("reason", reason.into()));
                &self.statements.settle_failed
            }
        };
        let rows = self.rows("settle", sql, params.as_slice()).await?;
        Ok(returned_entries(&rows))
    }
}

impl<L, P> PgQueue<L, P>
where
    P: DeserializeOwned,
{
    /// Claims up to `max` tasks that fit `query` together, in one statement, and
    /// dead-letters the claimed ones that cannot be read.
    async fn claim(
        &self,
        node: &str,
        query: &FitQuery,
        max: usize,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Claimed<P>, QueueError> {
        let expires_at_ms = Lease::<P>::expiry(now_ms, lease);
        let params = ClaimParams {
            queue: &self.label.queue,
            node,
            query,
            now_ms,
            expires_at_ms,
            max,
        };
        let rows = self.claim_rows(&params).await?;
        let claimed = claimed_rows::<P>(self.label.backend, &rows, expires_at_ms)?;
        for unreadable in &claimed.unreadable {
            self.bury(unreadable.clone()).await?;
        }
        Ok(claimed)
    }

    /// Runs a statement that removes at most one parked task and returns it; a task that
    /// cannot be read is gone all the same (it was parked and is now removed): `None` and a
    /// log line.
    async fn take_parked<T: Params + ?Sized>(
        &self,
        what: &str,
        sql: &NamedSql,
        params: &T,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let Some(row) = self.row(what, sql, params).await? else {
            return Ok(None);
        };
        match task_of::<P>(&row) {
            Ok(task) => Ok(Some(task)),
            Err(reason) => {
                tracing::error!(queue = %self.label, %reason, "removed a queued task that cannot be read");
                Ok(None)
            }
        }
    }
}

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

    async fn enqueue(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
    ) -> Result<(), QueueError> {
        let mut parked = self.enqueue_many(vec![(entry, rank_time_ms, task)]).await;
        parked.pop().unwrap_or(Err(QueueError::Duplicate(entry)))
    }

    async fn enqueue_many(
        &self,
        tasks: Vec<(EntryId, u64, ScheduledTask<P>)>,
    ) -> Vec<Result<(), QueueError>> {
        let mut parked: Vec<Result<(), QueueError>> = Vec::with_capacity(tasks.len());
        let mut rows = ParkRows::new(self.label.backend).attaching(self.attaches());
        let mut written = Vec::with_capacity(tasks.len());
        for (entry, rank_time_ms, task) in tasks {
            match rows.push(entry, rank_time_ms, &task) {
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

    async fn enqueue_claimed(
        &self,
        node: &str,
        entry: EntryId,
        rank_time_ms: u64,
        task: ScheduledTask<P>,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Lease<P>, QueueError> {
        let expires_at_ms = Lease::<P>::expiry(now_ms, lease);
        let mut rows = ParkRows::new(self.label.backend).attaching(self.attaches());
        rows.push(entry, rank_time_ms, &task)?;
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
        })
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
        let params = [
            ("queue", self.queue()),
            ("entry", entry_to_sql(entry).into()),
            ("node", node.to_owned().into()),
            (
                "expires_ms",
                millis_u64(Lease::<P>::expiry(now_ms, lease)).into(),
            ),
        ];
        let row = self.row("renew", &self.statements.renew, &params).await?;
        let changed: i64 = row.map_or(Ok(0), |row| self.column(&row, "changed"))?;
        if changed == 0 {
            return Err(QueueError::NotClaimed(entry));
        }
        Ok(())
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
                tracing::warn!(queue = %self.label, error = %super::describe(&error), "could not announce the handed-back tasks; other nodes find them at their next poll");
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

    fn watch(&self) -> Option<watch::Receiver<u64>> {
        Some(self.wake.subscribe())
    }
}

#[async_trait]
impl<L, P> QueueMaintenance for PgQueue<L, P>
where
    L: Send + Sync,
{
    /// Parks each expired claim again after its backoff, or dead-letters it on its last
    /// attempt, in one statement; announces the parked ones.
    async fn rescue_expired(&self, now_ms: u64) -> Result<usize, QueueError> {
        let params = RescueParams {
            queue: &self.label.queue,
            now_ms,
            retry: &self.retry,
        };
        let forget = [
            ("queue", self.queue()),
            ("now_ms", millis_u64(now_ms).into()),
        ];
        self.rows(
            "forget ended callers",
            &self.statements.forget_done,
            &forget,
        )
        .await?;
        let Some(row) = self.row("rescue", &self.statements.rescue, &params).await? else {
            return Ok(0);
        };
        let parked: i64 = self.column(&row, "parked")?;
        let dead: i64 = self.column(&row, "dead")?;
        if parked > 0 {
            self.announce();
        }
        if dead > 0 {
            tracing::warn!(queue = %self.label, dead, "dead-lettered tasks whose every attempt lost its lease");
        }
        Ok(usize::try_from(parked + dead).unwrap_or(usize::MAX))
    }

    async fn take_dead_letters(&self, max: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let params = [("queue", self.queue()), ("max", count_to_sql(max).into())];
        let rows = self
            .rows("dead letters", &self.statements.dead_letters, &params)
            .await?;
        rows.iter().map(|row| self.dead_letter(row)).collect()
    }

    async fn list_dead_letters(
        &self,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<KeptLetter>, QueueError> {
        let params = [
            ("queue", self.queue()),
            ("offset", count_to_sql(offset).into()),
            ("limit", count_to_sql(limit).into()),
        ];
        let rows = self
            .rows("list dead letters", &self.statements.list_dead, &params)
            .await?;
        rows.iter().map(|row| self.kept_letter(row)).collect()
    }

    async fn retry_dead_letter(&self, entry: EntryId) -> Result<bool, QueueError> {
        let params = [
            ("queue", self.queue()),
            ("entry", entry_to_sql(entry).into()),
        ];
        let retried = self
            .row("retry a dead letter", &self.statements.retry_dead, &params)
            .await?
            .is_some();
        if retried {
            self.announce();
        }
        Ok(retried)
    }

    async fn purge_dead_letters(&self, entry: Option<EntryId>) -> Result<usize, QueueError> {
        let params = [
            ("queue", self.queue()),
            ("entry", entry.map(entry_to_sql).into()),
        ];
        let Some(row) = self
            .row("purge dead letters", &self.statements.purge_dead, &params)
            .await?
        else {
            return Ok(0);
        };
        let purged: i64 = self.column(&row, "n")?;
        Ok(usize::try_from(purged).unwrap_or(0))
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let params = [("queue", self.queue())];
        let Some(row) = self.row("count", &self.statements.counts, &params).await? else {
            return Ok(QueueCounts::default());
        };
        let count = |name: &str| -> Result<usize, QueueError> {
            let counted: i64 = self.column(&row, name)?;
            Ok(usize::try_from(counted).unwrap_or(0))
        };
        Ok(QueueCounts {
            parked: count("parked")?,
            claimed: count("claimed")?,
        })
    }
}

impl<L, P> PgQueue<L, P> {
    /// Reads a row of the `list_dead` statement.
    fn kept_letter(&self, row: &QueryResult) -> Result<KeptLetter, QueueError> {
        let entry: i64 = self.column(row, "entry")?;
        let attempts: i32 = self.column(row, "attempts")?;
        let metadata: String = self.column(row, "metadata")?;
        let meta: TaskMetadata = serde_json::from_str(&metadata).map_err(|error| {
            QueueError::Backend(BackendFault::plain(
                FaultKind::Corrupt,
                format!("{}: a dead letter's metadata: {error}", self.label),
            ))
        })?;
        Ok(KeptLetter {
            entry: entry_from_sql(entry),
            task_id: meta.id,
            key: meta.mailbox.unwrap_or_else(|| MailboxKey::new("")),
            cost: meta.cost,
            priority: meta.priority,
            attempts: u32::try_from(attempts).unwrap_or(0),
            reason: self.column(row, "reason")?,
        })
    }

    /// Reads a row of the `dead_letters` statement.
    fn dead_letter(&self, row: &QueryResult) -> Result<DeadLetter, QueueError> {
        let kind: i16 = self.column(row, "kind")?;
        let kind = ResourceKind::ALL
            .into_iter()
            .find(|known| known.index() as i16 == kind)
            .unwrap_or(ResourceKind::Cpu);
        let units: i64 = self.column(row, "units")?;
        let mut key = MailboxKey::new(self.column::<String>(row, "tenant")?);
        key.user_id = self.column(row, "user_id")?;
        key.session_id = self.column(row, "session_id")?;
        let task_id: i64 = self.column(row, "task_id")?;
        let reason: Option<String> = self.column(row, "reason")?;
        Ok(DeadLetter {
            key,
            task_id: task_id as u64,
            cost: ResourceCost::new(kind, u32::try_from(units).unwrap_or(u32::MAX)),
            reason: format!(
                "the shared queue gave up on the task: {}",
                reason.unwrap_or_else(|| "no reason recorded".into())
            ),
        })
    }
}
