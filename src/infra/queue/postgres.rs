//! A queue in a PostgreSQL table that many nodes share: [`PostgresQueue`], a
//! [`SharedQueue`] through SeaORM.
//!
//! # How nodes share it
//!
//! Every node (a process running pools, on any host) parks the tasks it cannot start to one
//! table, and claims from it whenever it has room: one statement picks the best-ranked parked
//! row whose cost fits the node's free units, locks it with `FOR UPDATE SKIP LOCKED` (so
//! concurrent claims never wait for or take the same row) and marks it claimed under the
//! node's lease:
//!
//! ```sql
//! WITH pick AS (
//!     SELECT id FROM pl_queue_jobs
//!      WHERE queue_name = $1 AND state = 'parked' AND not_before_ms <= $now
//!        AND units <= CASE kind WHEN 0 THEN $free_cpu WHEN 1 THEN $free_vram ... END
//!        AND <ranked at or ahead of the starvation bound, if any>
//!      ORDER BY priority DESC, rank_time_ms, entry
//!      LIMIT 1 FOR UPDATE SKIP LOCKED)
//! UPDATE pl_queue_jobs SET state = 'claimed', locked_by = $node, lease_expires_ms = ..,
//!        attempts = attempts + 1
//!   FROM pick WHERE pl_queue_jobs.id = pick.id RETURNING ..
//! ```
//!
//! A partial index on `(queue_name, priority DESC, rank_time_ms, entry) WHERE state =
//! 'parked'` serves it in rank order; rows that do not fit are skipped by the filter.
//!
//! # Leases, retries, dead letters
//!
//! The claiming node renews its lease while the task runs and deletes the row when the task
//! ends ([`Settlement::Done`]). A node that dies stops renewing; any node's
//! [`rescue_expired`](SharedQueue::rescue_expired) then parks the row again, not before an
//! exponential backoff (`retry_base * 2^(attempts - 1)`, capped), with the reason in
//! `last_error`. A row claimed `max_attempts` times whose lease runs out once more goes to the
//! `dead` state instead, and so does a row settled as failed and a row whose payload no longer
//! deserialises: dead rows stay in the table, with their last error, for an operator.
//!
//! # Wake-ups
//!
//! Each park (and each rescue) sends `NOTIFY` on the queue's channel; a listener connection
//! wakes the pools of this process ([`SharedQueue::watch`]), so an idle node claims new work
//! at once and otherwise polls only slowly, as a safety net.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sea_orm::{QueryResult, Value};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;

use crate::core::{
    DeadLetter, EntryId, FitQuery, Lease, QueueCounts, QueueError, ScheduledTask, Settlement,
    SharedQueue,
};
use crate::infra::postgres::rows::{
    self, duration_ms, entry_from_sql, entry_to_sql, millis, millis_u64, priority_to_sql, task_of,
    Claimed, Encoded, JsonRows,
};
use crate::infra::postgres::{backend_error, Identifier, PgDatabase, Table};
use crate::util::serde::{MailboxKey, Priority, ResourceCost, ResourceKind, TaskId};

/// How lost runs are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Claims a task may have; a lease that runs out on the last one dead-letters the task.
    pub max_attempts: u32,
    /// The backoff before the first retry; it doubles with every further attempt.
    pub base: Duration,
    /// The longest backoff.
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// Three attempts, one second doubling up to a minute.
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

/// A [`SharedQueue`] in a PostgreSQL table. See the module docs.
///
/// ```no_run
/// use std::sync::Arc;
/// use prometheus_parking_lot::infra::postgres::PgDatabase;
/// use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
///
/// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
/// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
/// let queue: Arc<PostgresQueue<String>> =
///     Arc::new(PostgresQueue::open(&database, "pl_queue_jobs", "llm")?);
/// # Ok(()) }
/// ```
pub struct PostgresQueue<P> {
    database: PgDatabase,
    table: Identifier,
    queue: String,
    retry: RetryPolicy,
    /// Bumped when a task is parked or rescued anywhere (NOTIFY on the queue's channel).
    wake: Arc<watch::Sender<u64>>,
    _payload: PhantomData<fn() -> P>,
}

impl<P> std::fmt::Debug for PostgresQueue<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresQueue")
            .field("table", &self.table)
            .field("queue", &self.queue)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl<P> PostgresQueue<P> {
    /// Opens queue `queue` in `table` (creating the table if needed; safe when many
    /// processes start at once) and starts listening for its wake-ups. Blocks until done:
    /// call it at start, not on a pool's runtime.
    pub fn open(
        database: &PgDatabase,
        table: &str,
        queue: &str,
    ) -> Result<Self, crate::core::PoolError> {
        let table = Identifier::new(table)?;
        let database = database.clone();
        let ensure = {
            let database = database.clone();
            let table = table.clone();
            move |_| async move { database.ensure(Table::Queue(&table)).await }
        };
        database.block_on(ensure).map_err(|error| {
            crate::core::PoolError::Internal(backend_error("creating the queue table", &error))
        })?;
        let wake = Arc::new(watch::Sender::new(0));
        database.listen(
            channel(&table, queue),
            Arc::downgrade(&wake),
            |wake: &watch::Sender<u64>, _| {
                wake.send_modify(|count: &mut u64| *count = count.wrapping_add(1));
            },
        );
        Ok(Self {
            database,
            table,
            queue: queue.to_owned(),
            retry: RetryPolicy::default(),
            wake,
            _payload: PhantomData,
        })
    }

    /// Sets how lost runs are retried.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The NOTIFY channel of this queue.
    fn channel(&self) -> String {
        channel(&self.table, &self.queue)
    }

    /// Moves a row that cannot be used to the dead state, with the reason.
    async fn bury(&self, id: i64, reason: String) -> Result<(), QueueError> {
        let sql = format!(
            "UPDATE {t} SET state = 'dead', locked_by = NULL, lease_expires_ms = NULL, \
             last_error = $2 WHERE id = $1",
            t = self.table
        );
        self.execute("dead-letter", sql, vec![id.into(), reason.into()])
            .await
            .map(drop)
    }

    /// Runs a statement that changes rows; returns how many it changed.
    async fn execute(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<u64, QueueError> {
        self.database.execute_as(what, sql, values).await
    }

    /// Runs a statement that returns at most one row.
    async fn query_one(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Option<QueryResult>, QueueError> {
        self.database.query_one_as(what, sql, values).await
    }

    /// Runs a statement that returns rows.
    async fn query_all(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Vec<QueryResult>, QueueError> {
        self.database.query_all_as(what, sql, values).await
    }

    /// The first parameters of a statement on `node`'s claim of `entry`: `$1` the queue, `$2`
    /// the entry, `$3` the node.
    fn claim_of(&self, entry: EntryId, node: &str) -> Vec<Value> {
        vec![
            self.queue.clone().into(),
            entry_to_sql(entry).into(),
            node.to_owned().into(),
        ]
    }
}

/// The NOTIFY channel of `queue` in `table` (an identifier, quoted by `pg_notify`).
fn channel(table: &Identifier, queue: &str) -> String {
    format!("{table}.{queue}")
}

/// Reads column `name` of a queue row.
fn column<T: sea_orm::TryGetable>(row: &QueryResult, name: &str) -> Result<T, QueueError> {
    rows::column("postgres", row, name)
}

#[async_trait]
impl<P> SharedQueue<P> for PostgresQueue<P>
where
    P: Serialize + DeserializeOwned + Send + 'static,
{
    fn backend(&self) -> &'static str {
        "postgres"
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
        let mut rows = JsonRows::new();
        let mut written = Vec::with_capacity(tasks.len());
        for (entry, rank_time_ms, task) in tasks {
            match Encoded::new("postgres", &task) {
                Ok(encoded) => {
                    encoded_row(&mut rows, entry, rank_time_ms, &encoded);
                    written.push((parked.len(), entry));
                    parked.push(Ok(()));
                }
                Err(error) => parked.push(Err(error)),
            }
        }
        if written.is_empty() {
            return parked;
        }
        let sql = format!(
            "INSERT INTO {t} (queue_name, entry, task_id, tenant, user_id, session_id, \
                 priority, kind, units, created_at_ms, rank_time_ms, deadline_ms, metadata, payload) \
             SELECT $1, entry, task_id, tenant, user_id, session_id, priority, kind, units, \
                    created_at_ms, rank_time_ms, deadline_ms, metadata, payload \
               FROM jsonb_to_recordset($2::jsonb) AS r(entry BIGINT, task_id BIGINT, \
                    tenant TEXT, user_id TEXT, session_id TEXT, priority SMALLINT, \
                    kind SMALLINT, units BIGINT, created_at_ms BIGINT, rank_time_ms BIGINT, \
                    deadline_ms BIGINT, metadata JSONB, payload JSONB) \
             ON CONFLICT (queue_name, entry) DO NOTHING RETURNING entry",
            t = self.table
        );
        let values: Vec<Value> = vec![self.queue.clone().into(), rows.finish().into()];
        let stored = self.query_all("park", sql, values).await;
        // An entry stored already (or twice in this batch) is refused, once per copy.
        let stored = stored.map(|rows| rows::returned_entries(&rows));
        // Only a parked task is news for other nodes: one announcement for the batch.
        if rows::answer_group(&mut parked, written, stored, QueueError::Duplicate) {
            self.database.announce(&self.channel(), String::new());
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
        let row = Encoded::new("postgres", &task)?;
        let claim = (node, millis_u64(expires_at_ms));
        self.insert_claimed(entry, rank_time_ms, row, claim).await?;
        Ok(Lease {
            entry,
            task,
            attempt: 1,
            expires_at_ms,
        })
    }

    async fn claim_best_fit(
        &self,
        node: &str,
        query: &FitQuery,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Option<Lease<P>>, QueueError> {
        rows::first_readable(|| self.claim_rows(node, query, 1, lease, now_ms)).await
    }

    async fn claim_batch(
        &self,
        node: &str,
        query: &FitQuery,
        max: usize,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Vec<Lease<P>>, QueueError> {
        Ok(self
            .claim_rows(node, query, max, lease, now_ms)
            .await?
            .into_leases())
    }

    async fn renew(
        &self,
        node: &str,
        entry: EntryId,
        lease: Duration,
        now_ms: u64,
    ) -> Result<(), QueueError> {
        let sql = format!(
            "UPDATE {t} SET lease_expires_ms = $4 \
              WHERE queue_name = $1 AND entry = $2 AND state = 'claimed' AND locked_by = $3",
            t = self.table
        );
        let expires = millis_u64(now_ms).saturating_add(duration_ms(lease));
        let mut values = self.claim_of(entry, node);
        values.push(expires.into());
        let changed = self.execute("renew", sql, values).await?;
        if changed == 0 {
            return Err(QueueError::NotClaimed(entry));
        }
        Ok(())
    }

    async fn settle(
        &self,
        node: &str,
        entry: EntryId,
        settlement: Settlement,
    ) -> Result<(), QueueError> {
        let (sql, values): (String, Vec<Value>) = match settlement {
            Settlement::Done => (
                format!(
                    "DELETE FROM {t} WHERE queue_name = $1 AND entry = $2 AND state = 'claimed' \
                     AND locked_by = $3",
                    t = self.table
                ),
                self.claim_of(entry, node),
            ),
            Settlement::Failed(reason) => (
                format!(
                    "UPDATE {t} SET state = 'dead', locked_by = NULL, lease_expires_ms = NULL, \
                     last_error = $4, reported = true \
                     WHERE queue_name = $1 AND entry = $2 AND state = 'claimed' AND locked_by = $3",
                    t = self.table
                ),
                {
                    let mut values = self.claim_of(entry, node);
                    values.push(reason.into());
                    values
                },
            ),
        };
        let changed = self.execute("settle", sql, values).await?;
        if changed == 0 {
            return Err(QueueError::NotClaimed(entry));
        }
        Ok(())
    }

    async fn settle_many(
        &self,
        node: &str,
        settlements: Vec<(EntryId, Settlement)>,
    ) -> Vec<Result<(), QueueError>> {
        let failed = |entry, settlement| self.settle(node, entry, settlement);
        rows::settle_in_groups(settlements, failed, |entries| {
            self.delete_done(node, entries)
        })
        .await
    }

    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let sql = format!(
            "DELETE FROM {t} WHERE queue_name = $1 AND entry = $2 AND state = 'parked' \
             RETURNING id, metadata::text AS metadata, payload::text AS payload",
            t = self.table
        );
        let values: Vec<Value> = vec![self.queue.clone().into(), entry_to_sql(entry).into()];
        self.take_one(sql, values, "remove").await
    }

    async fn remove_task(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let sql = format!(
            "DELETE FROM {t} WHERE id = ( \
                SELECT id FROM {t} \
                 WHERE queue_name = $1 AND tenant = $2 AND task_id = $3 AND state = 'parked' \
                   AND user_id IS NOT DISTINCT FROM $4 AND session_id IS NOT DISTINCT FROM $5 \
                 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING id, metadata::text AS metadata, payload::text AS payload",
            t = self.table
        );
        let values: Vec<Value> = vec![
            self.queue.clone().into(),
            key.tenant.0.clone().into(),
            (id as i64).into(),
            key.user_id.clone().into(),
            key.session_id.clone().into(),
        ];
        self.take_one(sql, values, "cancel").await
    }

    async fn rescue_expired(&self, now_ms: u64) -> Result<usize, QueueError> {
        let sql = format!(
            "WITH rescued AS ( \
               UPDATE {t} SET \
                   state = CASE WHEN attempts >= $3 THEN 'dead' ELSE 'parked' END, \
                   last_error = 'the lease of node ' || coalesce(locked_by, '?') || \
                                ' ran out (attempt ' || attempts || ')', \
                   not_before_ms = $2 + LEAST($5::bigint, $4::bigint * (1::bigint << LEAST(attempts - 1, 40))), \
                   locked_by = NULL, lease_expires_ms = NULL \
                WHERE queue_name = $1 AND state = 'claimed' AND lease_expires_ms <= $2 \
                RETURNING state) \
             SELECT count(*) FILTER (WHERE state = 'parked') AS parked, \
                    count(*) FILTER (WHERE state = 'dead') AS dead FROM rescued \
             HAVING count(*) > 0",
            t = self.table
        );
        let values: Vec<Value> = vec![
            self.queue.clone().into(),
            millis_u64(now_ms).into(),
            i32::try_from(self.retry.max_attempts)
                .unwrap_or(i32::MAX)
                .into(),
            duration_ms(self.retry.base).into(),
            duration_ms(self.retry.max).into(),
        ];
        let row = self.query_one("rescue", sql, values).await?;
        let Some(row) = row else {
            return Ok(0);
        };
        let parked: i64 = column(&row, "parked")?;
        let dead: i64 = column(&row, "dead")?;
        if parked > 0 {
            self.database.announce(&self.channel(), String::new());
        }
        if dead > 0 {
            tracing::warn!(queue = %self.queue, dead, "dead-lettered tasks whose every attempt lost its lease");
        }
        Ok(usize::try_from(parked + dead).unwrap_or(usize::MAX))
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let sql = format!(
            "SELECT count(*) FILTER (WHERE state = 'parked') AS parked, \
                    count(*) FILTER (WHERE state = 'claimed') AS claimed \
               FROM {t} WHERE queue_name = $1",
            t = self.table
        );
        let values: Vec<Value> = vec![self.queue.clone().into()];
        let row = self.query_one("count", sql, values).await?;
        let Some(row) = row else {
            return Ok(QueueCounts::default());
        };
        let parked: i64 = column(&row, "parked")?;
        let claimed: i64 = column(&row, "claimed")?;
        Ok(QueueCounts {
            parked: usize::try_from(parked).unwrap_or(0),
            claimed: usize::try_from(claimed).unwrap_or(0),
        })
    }

    async fn take_dead_letters(&self, max: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let sql = format!(
            "UPDATE {t} SET reported = true WHERE id IN ( \
                SELECT id FROM {t} WHERE queue_name = $1 AND state = 'dead' AND NOT reported \
                 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING tenant, user_id, session_id, task_id, kind, units, last_error",
            t = self.table
        );
        let values: Vec<Value> = vec![
            self.queue.clone().into(),
            i64::try_from(max).unwrap_or(i64::MAX).into(),
        ];
        let rows = self.query_all("dead letters", sql, values).await?;
        rows.iter()
            .map(|row| {
                let kind: i16 = column(row, "kind")?;
                let units: i64 = column(row, "units")?;
                let kind = ResourceKind::ALL
                    .into_iter()
                    .find(|known| known.index() as i16 == kind)
                    .unwrap_or(ResourceKind::Cpu);
                let mut key = MailboxKey::new(column::<String>(row, "tenant")?);
                key.user_id = column(row, "user_id")?;
                key.session_id = column(row, "session_id")?;
                let task_id: i64 = column(row, "task_id")?;
                let reason: Option<String> = column(row, "last_error")?;
                Ok(DeadLetter {
                    key,
                    task_id: task_id as u64,
                    cost: ResourceCost::new(kind, u32::try_from(units).unwrap_or(u32::MAX)),
                    reason: format!(
                        "the shared queue gave up on the task: {}",
                        reason.unwrap_or_else(|| "no reason recorded".into())
                    ),
                })
            })
            .collect()
    }

    fn watch(&self) -> Option<watch::Receiver<u64>> {
        Some(self.wake.subscribe())
    }
}

impl<P> PostgresQueue<P> {
    /// Deletes `node`'s claims on `entries`, whose runs ended well, in one statement; returns
    /// the entries (as stored) it deleted.
    async fn delete_done(
        &self,
        node: &str,
        entries: Vec<EntryId>,
    ) -> Result<std::collections::HashSet<i64>, QueueError> {
        let entries = entries
            .iter()
            .map(|&entry| entry_to_sql(entry).to_string())
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!(
            "DELETE FROM {t} WHERE queue_name = $1 AND state = 'claimed' AND locked_by = $2 \
                AND entry IN (SELECT value::bigint FROM jsonb_array_elements_text($3::jsonb)) \
             RETURNING entry",
            t = self.table
        );
        let values: Vec<Value> = vec![
            self.queue.clone().into(),
            node.to_owned().into(),
            format!("[{entries}]").into(),
        ];
        let rows = self.query_all("settle", sql, values).await?;
        Ok(rows::returned_entries(&rows))
    }

    /// Inserts a task already claimed by `node` under a lease that runs out at `expires`.
    async fn insert_claimed(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        row: Encoded,
        (node, expires): (&str, i64),
    ) -> Result<(), QueueError> {
        let Encoded {
            meta,
            metadata,
            payload,
        } = row;
        let key = meta.mailbox.clone().unwrap_or_else(|| MailboxKey::new(""));
        let sql = format!(
            "WITH stored AS ( \
               INSERT INTO {t} (queue_name, entry, task_id, tenant, user_id, session_id, \
                   priority, kind, units, created_at_ms, rank_time_ms, deadline_ms, \
                   metadata, payload, state, locked_by, locked_at, lease_expires_ms, attempts) \
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, \
                       $14::jsonb, 'claimed', $15, NOW(), $16, 1) \
               ON CONFLICT (queue_name, entry) DO NOTHING RETURNING 1) \
             SELECT count(*) AS stored FROM stored",
            t = self.table
        );
        let values: Vec<Value> = vec![
            self.queue.clone().into(),
            entry_to_sql(entry).into(),
            (meta.id as i64).into(),
            key.tenant.0.into(),
            key.user_id.into(),
            key.session_id.into(),
            priority_to_sql(meta.priority).into(),
            (meta.cost.kind.index() as i16).into(),
            i64::from(meta.cost.units).into(),
            millis(meta.created_at_ms).into(),
            millis_u64(rank_time_ms).into(),
            meta.deadline_ms.map(millis).into(),
            metadata.into(),
            payload.into(),
            node.to_owned().into(),
            expires.into(),
        ];
        let row = self.query_one("park", sql, values).await?;
        let stored: i64 = match row {
            Some(row) => column(&row, "stored")?,
            None => 0,
        };
        if stored == 0 {
            return Err(QueueError::Duplicate(entry));
        }
        Ok(())
    }

    /// The claim statement of [`claim_rows`](Self::claim_rows): `$1` the queue, then the
    /// parameters of [`rows::fit_parameters`].
    fn claim_sql(&self) -> String {
        let fits = "CASE kind WHEN 0 THEN $3 WHEN 1 THEN $4 WHEN 2 THEN $5 ELSE $6 END";
        // `reserved` probes each priority level's oldest aged task on its own: one index
        // descent per level. Asked in one scan ordered by priority, the time bound is no index
        // condition, and a queue with nothing aged would be read to its end on every claim.
        let levels = Priority::ALL
            .map(|priority| format!("({}::smallint)", priority_to_sql(priority)))
            .join(", ");
        format!(
            "WITH reserved AS MATERIALIZED ( \
               SELECT r.* FROM (VALUES {levels}) AS level(priority) \
               CROSS JOIN LATERAL ( \
                 SELECT priority, rank_time_ms, entry, kind, units FROM {t} \
                  WHERE queue_name = $1 AND state = 'parked' AND priority = level.priority \
                    AND rank_time_ms <= $14 \
                    AND units <= CASE kind WHEN 0 THEN $15 WHEN 1 THEN $16 WHEN 2 THEN $17 ELSE $18 END \
                  ORDER BY rank_time_ms, entry LIMIT 1) AS r \
               ORDER BY r.priority DESC LIMIT 1), \
             candidates AS ( \
               SELECT id, kind, units, priority, rank_time_ms, entry FROM {t} AS c \
                WHERE queue_name = $1 AND state = 'parked' AND not_before_ms <= $2 \
                  AND units <= {fits} \
                  AND ($7 OR priority > $8 OR (priority = $8 AND (rank_time_ms, entry) <= ($9, $10))) \
                  AND NOT EXISTS (SELECT 1 FROM reserved r \
                      WHERE r.units > CASE r.kind WHEN 0 THEN $3 WHEN 1 THEN $4 WHEN 2 THEN $5 ELSE $6 END \
                        AND (c.priority < r.priority OR (c.priority = r.priority \
                             AND (c.rank_time_ms, c.entry) > (r.rank_time_ms, r.entry)))) \
                ORDER BY priority DESC, rank_time_ms, entry \
                LIMIT $13 FOR UPDATE SKIP LOCKED), \
             running AS ( \
               SELECT id, kind, sum(units) OVER (PARTITION BY kind \
                   ORDER BY priority DESC, rank_time_ms, entry) AS held \
               FROM candidates), \
             pick AS (SELECT id FROM running WHERE held <= {fits}) \
             UPDATE {t} AS job SET state = 'claimed', locked_by = $11, locked_at = NOW(), \
                    lease_expires_ms = $12, attempts = job.attempts + 1 \
               FROM pick WHERE job.id = pick.id \
             RETURNING job.id, job.entry, job.attempts, job.priority, job.rank_time_ms, \
                       job.metadata::text AS metadata, job.payload::text AS payload",
            t = self.table
        )
    }
}

/// Writes a task to park as the next row of an [`enqueue_many`](SharedQueue::enqueue_many)
/// statement.
fn encoded_row(rows: &mut JsonRows, entry: EntryId, rank_time_ms: u64, encoded: &Encoded) {
    let meta = &encoded.meta;
    let key = meta.mailbox.clone().unwrap_or_else(|| MailboxKey::new(""));
    rows.row()
        .int("entry", entry_to_sql(entry))
        .int("task_id", meta.id as i64)
        .text("tenant", Some(&key.tenant.0))
        .text("user_id", key.user_id.as_deref())
        .text("session_id", key.session_id.as_deref())
        .int("priority", i64::from(priority_to_sql(meta.priority)))
        .int("kind", meta.cost.kind.index() as i64)
        .int("units", i64::from(meta.cost.units))
        .int("created_at_ms", millis(meta.created_at_ms))
        .int("rank_time_ms", millis_u64(rank_time_ms))
        .int_or_null("deadline_ms", meta.deadline_ms.map(millis))
        .json("metadata", Some(&encoded.metadata))
        .json("payload", Some(&encoded.payload));
}

impl<P> PostgresQueue<P>
where
    P: DeserializeOwned + Send + 'static,
{
    /// Claims up to `max` parked rows that fit `query` together, in one statement: the best
    /// `max` rows that fit one by one are locked (`SKIP LOCKED`), and of those the rank-order
    /// prefix whose running cost per kind stays within the free units is claimed.
    async fn claim_rows(
        &self,
        node: &str,
        query: &FitQuery,
        max: usize,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Claimed<P>, QueueError> {
        let expires_at_ms = Lease::<P>::expiry(now_ms, lease);
        let sql = self.claim_sql();
        // `$1` the queue, then the claim's parameters from `$2` on.
        let mut values: Vec<Value> = vec![self.queue.clone().into()];
        values.extend(rows::fit_parameters(
            query,
            node,
            now_ms,
            expires_at_ms,
            max,
        ));
        let rows = self.database.claim_as("claim", sql, values).await?;
        let mut ranked = Vec::with_capacity(rows.len());
        for row in &rows {
            let priority: i16 = column(row, "priority")?;
            let rank_time: i64 = column(row, "rank_time_ms")?;
            let entry: i64 = column(row, "entry")?;
            ranked.push((std::cmp::Reverse(priority), rank_time, entry, row));
        }
        ranked.sort_by_key(|(priority, time, entry, _)| (*priority, *time, *entry));
        let mut leases = Vec::with_capacity(ranked.len());
        for (_, _, entry, row) in ranked {
            let id: i64 = column(row, "id")?;
            match task_of::<P>(row) {
                Ok(task) => {
                    let attempts: i32 = column(row, "attempts")?;
                    leases.push(Lease {
                        entry: entry_from_sql(entry),
                        task,
                        attempt: u32::try_from(attempts).unwrap_or(0),
                        expires_at_ms,
                    });
                }
                Err(reason) => {
                    tracing::error!(queue = %self.queue, row = id, %reason, "dead-lettering a queued task that cannot be read");
                    self.bury(id, reason).await?;
                }
            }
        }
        if leases.is_empty() && !rows.is_empty() {
            return Ok(Claimed::OnlyBuried);
        }
        Ok(Claimed::Leases(leases))
    }

    /// Runs a `DELETE .. RETURNING` of at most one row and reads its task; a row whose task
    /// cannot be read is gone all the same (it was parked and is now removed): `None` and a
    /// log line.
    async fn take_one(
        &self,
        sql: String,
        values: Vec<Value>,
        what: &'static str,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let row = self.query_one(what, sql, values).await?;
        let Some(row) = row else {
            return Ok(None);
        };
        match task_of::<P>(&row) {
            Ok(task) => Ok(Some(task)),
            Err(reason) => {
                tracing::error!(queue = %self.queue, %reason, "removed a queued task that cannot be read");
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Capacity;
    use crate::infra::postgres::rows::probe::{self, run_sql};

    /// A queue table's statistics usually describe a table nearly empty (taken between two
    /// bursts, in pages dead rows left behind), while it holds thousands of parked rows.
    /// Under such statistics the server's own choice for the claim is to read the whole table
    /// and sort it (on PostgreSQL 15: a sequential scan under a sort, 28 ms instead of 1 ms
    /// per claim at 20,000 rows). The claim's planner settings must leave only the walk of
    /// the rank index.
    #[test]
    fn a_claim_walks_the_rank_index_under_statistics_of_a_nearly_empty_table() {
        let database = probe::database();
        let table = format!("pl_plan_probe_{}", std::process::id());
        let queue = PostgresQueue::<u64>::open(&database, &table, "plan").expect("open");
        let (plan, server_plan) = probe::runtime().block_on(async {
            // No autovacuum on this table: the statistics are the ones the test takes.
            let no_autovacuum = format!("ALTER TABLE {table} SET (autovacuum_enabled = false)");
            run_sql(&database, no_autovacuum).await;
            // 3,000 rows, all but 60 deleted, statistics taken: 60 rows in the table's pages.
            assert!(queue
                .enqueue_many(probe::tasks(0))
                .await
                .iter()
                .all(Result::is_ok));
            run_sql(
                &database,
                format!("DELETE FROM {table} WHERE task_id % 50 <> 0"),
            )
            .await;
            run_sql(&database, format!("VACUUM ANALYZE {table}")).await;
            // Then 3,000 more parked rows that the statistics know nothing of.
            assert!(queue
                .enqueue_many(probe::tasks(10_000))
                .await
                .iter()
                .all(Result::is_ok));
            let values = || {
                let mut values: Vec<Value> = vec![queue.queue.clone().into()];
                let free = FitQuery::within(Capacity::uniform(256));
                values.extend(rows::fit_parameters(
                    &free, "node", 1_000_000, 2_000_000, 256,
                ));
                values
            };
            let explain =
                |as_claimed| database.explain_claim(queue.claim_sql(), values(), as_claimed);
            let plan = explain(true).await.expect("explain");
            let server_plan = explain(false).await.expect("explain");
            run_sql(&database, format!("DROP TABLE {table}")).await;
            (plan, server_plan)
        });
        assert!(
            plan.contains(&format!("Index Scan using {table}_claim")),
            "the claim walks the rank index:\n{plan}"
        );
        for whole_table in [
            format!("Seq Scan on {table}"),
            format!("Bitmap Heap Scan on {table}"),
        ] {
            assert!(
                !plan.contains(&whole_table),
                "the claim reads the whole table:\n{plan}"
            );
        }
        // What the settings are for: left to itself, the server plans otherwise here.
        assert_ne!(
            plan, server_plan,
            "the server's own plan is the same:\n{server_plan}"
        );
    }
}
