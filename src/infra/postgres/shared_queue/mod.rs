//! A [`SharedQueue`] on PostgreSQL, whatever its layout: [`PgQueue`].
//!
//! The two Postgres queues differ only in where a task lives: a row of one table
//! ([`PostgresQueue`](crate::infra::postgres::queue::PostgresQueue)), or a PGMQ message in a
//! queue per priority level (`PgmqQueue`, cargo feature `pgmq`). Each layout writes its
//! [`Statements`] once, when the queue is opened; everything else is here, once for both:
//! the values each statement is given (by name, see [`named`](super::named)), the answers of
//! group statements, the claim and its loop past unreadable tasks, the rescue and its
//! wake-up, the dead letters, and errors that name the pool, the queue and the cause (see
//! [`outage`](super::outage)). The [`SharedQueue`] operations are in `operations.rs`, the
//! [`QueueMaintenance`] ones (rescue, dead letters, counts) in `maintenance.rs`.
//!
//! | statement | parameters | answers (columns) |
//! |---|---|---|
//! | `park` | `$queue`, `$rows` ([`ParkRows`]) | `entry` of each task stored |
//! | `park_claimed` | `$queue`, `$rows`, `$node`, `$expires_ms` | `entry` of each task stored |
//! | `claim` | [`ClaimParams`] | see [`claim`](super::claim) |
//! | `renew` | `$queue`, `$entries`, `$node`, `$expires_ms` | `entry` of each lease the node holds (renewed, or skipped while another transaction holds its row) |
//! | `settle_done` | `$queue`, `$entries`, `$attempts`, `$node` | `entry` of each claim ended |
//! | `settle_failed` | `$queue`, `$entries`, `$attempts`, `$node`, `$reason` | `entry` of each claim ended |
//! | `settle_ended` | `$queue`, `$entries`, `$attempts`, `$node`, `$status`, `$why` | `entry` of each claim ended |
//! | `park_waiting` | `$queue`, `$tenant`, `$parents`, `$run_anyway`, `$after_ms`, `$rows` | `outcome`, `parent`, `status` |
//! | `waiting_parents` | `$queue`, `$tenant`, `$user_id`, `$session_id`, `$task_id` | `pending_parents` |
//! | `expire_held` | `$queue`, `$now_ms` | `n`, the children expired while they waited for their parents |
//! | `release` | `$queue`, `$entries`, `$attempts`, `$node`, `$now_ms` | `entry` of each claim handed back |
//! | `remove` | `$queue`, `$entry` | `metadata`, `payload` |
//! | `remove_task` | `$queue`, `$tenant`, `$user_id`, `$session_id`, `$task_id` | `metadata`, `payload` |
//! | `sleeping` | `$queue`, `$tenant`, `$user_id`, `$session_id`, `$task_id`, `$now_ms` | `until_ms` (none when it does not sleep) |
//! | `live_task` | `$queue`, `$tenant`, `$task_id` | `tenant`, `user_id`, `session_id` |
//! | `rescue` | [`RescueParams`] | `parked`, `dead` |
//! | `counts` | `$queue` | `parked`, `claimed` |
//! | `dead_letters` | `$queue`, `$max` | `tenant`, `user_id`, `session_id`, `task_id`, `kind`, `units`, `reason` |
//! | `bury` | `$queue`, `$row_id`, `$level`, `$reason` | none |
//! | `list_dead` | `$queue`, `$offset`, `$limit` | `entry`, `attempts`, `metadata`, `reason` |
//! | `retry_dead` | `$queue`, `$entry` | `entry` (none when no such dead letter) |
//! | `purge_dead` | `$queue`, `$entry` (`NULL`: all) | `n` |
//! | `forget_done` | `$queue`, `$now_ms` | none |
//!
//! [`SharedQueue`]: crate::core::SharedQueue
//! [`QueueMaintenance`]: crate::core::QueueMaintenance

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{QueryResult, Value};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::budgets::FleetBudgets;
use super::claim::{claimed_rows, ClaimParams, Claimed, Unreadable};
use super::codec::{column, task_of};
use super::fence::{claim_values, ended_values, ClaimFence};
use super::groups::returned_entries;
use super::named::{NamedSql, Params};
use super::outage::OutageGate;
use super::retry::RetryPolicy;
use super::service::{FleetService, OwnedClaim};
use super::statements::ClaimRun;
use super::{fault_of, PgDatabase};
use crate::core::{Claim, FitQuery, Lease, QueueError, ScheduledTask, Settlement};

mod capabilities;
mod maintenance;
mod operations;
mod ticks;

pub(crate) use ticks::{ticks_table, TICKS_TABLE};

/// The statements of a queue layout (see the module docs for what each is given and answers).
pub(crate) struct Statements {
    /// The order the claim statements take a priority's tasks in.
    pub order: crate::core::QueueOrder,
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
    /// Ends a node's claims whose runs ended neither well nor failed (`$status`, `$why`).
    pub settle_ended: NamedSql,
    /// Parks a group of tasks within a bound on the units parked, where the layout can
    /// keep one.
    pub park_within: Option<ParkWithin>,
    /// Parks one task waiting for its parents, where the layout keeps dependencies.
    pub park_waiting: Option<NamedSql>,
    /// How many parents a parked task still waits for, where the layout keeps them.
    pub waiting_parents: Option<NamedSql>,
    /// Ends the children whose deadline passed while they waited for their parents, where
    /// the layout keeps dependencies.
    pub expire_held: Option<NamedSql>,
    /// Hands a node's claims back, claimable at once by any node.
    pub release: NamedSql,
    /// Parks a node's claim again after a failed run, claimable from `$at_ms`, the claim
    /// counted as an attempt and `$reason` kept.
    pub retry: NamedSql,
    /// Removes a parked task by its entry.
    pub remove: NamedSql,
    /// Removes a parked task by its key and id (a cancel).
    pub remove_task: NamedSql,
    /// When a parked task, by its key and id, wakes, if it sleeps at `$now_ms`.
    pub sleeping: NamedSql,
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
    /// [`UniqueCallers::keep_callers_unique`](crate::core::UniqueCallers::keep_callers_unique)).
    pub forget_done: NamedSql,
    /// Dead-letters a claimed task that cannot be read.
    pub bury: NamedSql,
    /// The claim under a fair share by use across the fleet, where the layout has one.
    pub fair: Option<FairClaim>,
}

/// A layout's park within a bound on the units parked (`infra/postgres/queue/bounded.rs`).
pub(crate) struct ParkWithin {
    /// The table whose function it calls, made when the first bounded queue of it opens
    /// (`None`: the function comes with the queue, as pgmq's does).
    pub table: Option<super::Identifier>,
    /// The park (`$queue`, `$rows`, `$max_units`, `$now_ms`, `$by_deadline`, `$status`,
    /// `$why`): one `outcome` per task, in order.
    pub park: NamedSql,
}

/// A layout's statements for a claim that follows the fleet's tenant counters
/// (`infra/postgres/service.rs`).
#[derive(Debug, Clone)]
pub(crate) struct FairClaim {
    /// The tenant to claim for, and the floor (see [`pick_sql`](crate::infra::postgres::service::pick_sql)).
    pub pick: NamedSql,
    /// The claim statement, restricted to tenant `$tenant`.
    pub claim: NamedSql,
}

/// Which queue this is, for logs and errors: `pool "gpu", postgres queue "llm" (table
/// pl_queue_jobs)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueLabel {
    /// The backend's name ([`SharedQueue::backend`](crate::core::SharedQueue::backend)).
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

/// A [`SharedQueue`](crate::core::SharedQueue) on PostgreSQL in layout `L`. See the module docs; users name it by its
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
    /// The tenant counters every node of the queue claims by, once shared.
    service: std::sync::Mutex<Option<Arc<FleetService>>>,
    /// Whether the rows this handle parks keep their callers unique
    /// ([`UniqueCallers::keep_callers_unique`](crate::core::UniqueCallers::keep_callers_unique)).
    attach: std::sync::atomic::AtomicBool,
    /// The bound on the units parked of each kind this handle's parks keep
    /// ([`QueuedUnits::bound_queued_units`](crate::core::QueuedUnits::bound_queued_units));
    /// 0: none.
    max_queued_units: std::sync::atomic::AtomicU64,
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
            service: std::sync::Mutex::new(None),
            attach: std::sync::atomic::AtomicBool::new(false),
            max_queued_units: std::sync::atomic::AtomicU64::new(0),
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

    /// The database the queue lives in.
    pub(crate) fn database(&self) -> &PgDatabase {
        &self.database
    }

    /// The order its claims take each priority's tasks in.
    pub(crate) fn claim_order(&self) -> crate::core::QueueOrder {
        self.statements.order
    }

    /// Answers with `statements` from now on (a layout's option chosen after opening).
    pub(crate) fn set_statements(&mut self, statements: Statements) {
        self.statements = statements;
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
        self.run(what, sql, params).await
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

    /// Runs the claim (see [`PgDatabase::claim`]): within the fleet's budgets where the
    /// queue keeps them, by the fleet's tenant counters where its nodes share fairly by use.
    async fn claim_rows(&self, params: &ClaimParams<'_>) -> Result<Vec<QueryResult>, QueueError> {
        self.gate
            .pass(&self.database)
            .await
            .map_err(|cause| QueueError::Backend(cause.fault(&format!("{}: claim", self.label))))?;
        let (sql, fair) = match (self.fleet_service(), &self.statements.fair) {
            (Some(service), Some(fair)) => (fair.claim.clone(), Some((service, fair.pick.clone()))),
            _ => (self.statements.claim.clone(), None),
        };
        let run = ClaimRun {
            sql,
            claim: OwnedClaim {
                queue: params.queue.to_owned(),
                node: params.node.to_owned(),
                now_ms: params.now_ms,
                expires_at_ms: params.expires_at_ms,
            },
            query: *params.query,
            max: params.max,
            budgets: self.fleet_budgets(),
            fair,
        };
        match self.database.claim(run).await {
            Ok(rows) => Ok(rows),
            Err(error) => Err(self.failed("claim", &error).await),
        }
    }

    /// Whether the rows this handle parks keep their callers unique.
    fn attaches(&self) -> bool {
        self.attach.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The tenant counters the queue's nodes share, if they were given an order by use.
    fn fleet_service(&self) -> Option<Arc<FleetService>> {
        self.service
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Keeps the fleet's tenant counters for this queue's claims.
    pub(crate) fn set_fleet_service(&self, service: Arc<FleetService>) {
        *self
            .service
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(service);
    }

    /// Whether the layout can claim by the fleet's tenant counters.
    pub(crate) fn claims_by_use(&self) -> bool {
        self.statements.fair.is_some()
    }

    /// The budgets the queue's nodes share, if they were given any.
    fn fleet_budgets(&self) -> Option<Arc<FleetBudgets>> {
        self.budgets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Binds `params`, passes the [`OutageGate`], and runs `sql`.
    async fn run<T: Params + ?Sized>(
        &self,
        what: &str,
        sql: &NamedSql,
        params: &T,
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
        match self.database.rows(text, values).await {
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
            [
                self.statements.settle_done.clone(),
                self.statements.settle_failed.clone(),
                self.statements.settle_ended.clone(),
            ],
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
            Settlement::Ended(status) => {
                params.extend(ended_values(&status));
                &self.statements.settle_ended
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
