//! Results in a PostgreSQL table: [`PostgresMailbox`], a [`Mailbox`] through SeaORM that every
//! node of a deployment shares, so a result stored on one node is taken on any other.
//!
//! One row per delivery: the full key (tenant, user, session), the task id, when it was
//! stored, its terminal status, and either the result (`payload`, JSON) or the error it ended
//! with (`error`, JSON). Every statement filters by the full key, tenant first, with `IS NULL`
//! for a missing user or session, so one tenant's key never reads another's rows and the
//! lookup index serves every query.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | [`PostgresMailbox`]: opening it, and the [`Mailbox`] operations |
//! | `grouped.rs` | takes and `holds` questions gathered into one statement per group |
//! | `hand_over.rs` | a taken result handed to its caller, or put back when the caller left |
//! | `waiters.rs` | who waits on which key, woken by NOTIFY instead of polling |
//! | `stored.rs` | a delivery as a row, and back |

mod grouped;
mod hand_over;
mod stored;
mod waiters;

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult, TransactionTrait, Value};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::core::{Claim, Delivery, FencedDelivery, Mailbox, MailboxError, PoolError, Settlement};
use crate::infra::postgres::codec::entry_to_sql;
use crate::infra::postgres::database::fault_advising;
use crate::infra::postgres::{db_fault, open_failed, ClaimFence, Identifier, PgDatabase, Table};
use crate::util::serde::{MailboxKey, TaskId};
use grouped::{holds_loop, take_loop, HoldsAsk, TakeTask};
use hand_over::{hand_over, handed_over, Home, WHOLE_ROW};
use stored::{column, delivery_of, Rows, STORED_COLUMNS, STORED_RECORD};
use waiters::{key_hash, Waiters};

/// A [`Mailbox`] in a PostgreSQL table. See the module docs.
///
/// ```no_run
/// use prometheus_parking_lot::infra::mailbox::postgres::PostgresMailbox;
/// use prometheus_parking_lot::infra::postgres::PgDatabase;
///
/// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
/// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
/// let results = PostgresMailbox::<String>::open(&database, "pl_mailbox_messages")?;
/// # Ok(()) }
/// ```
pub struct PostgresMailbox<R> {
    database: PgDatabase,
    table: Identifier,
    /// The shared queue whose claims a result store ends in its own transaction, if linked.
    fence: Option<ClaimFence>,
    waiters: Arc<Waiters>,
    /// The take loop's inbox (see [`take_loop`](grouped::take_loop)).
    takes: mpsc::UnboundedSender<TakeTask>,
    /// The holds loop's inbox (see [`holds_loop`](grouped::holds_loop)).
    asks: mpsc::UnboundedSender<HoldsAsk>,
    _result: PhantomData<fn() -> R>,
}

impl<R> std::fmt::Debug for PostgresMailbox<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresMailbox")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<R> PostgresMailbox<R> {
    /// Opens the mailbox in `table` (creating it if needed; safe when many processes start at
    /// once) and starts listening for stores. Blocks until done: call it at start, not on a
    /// pool's runtime.
    pub fn open(database: &PgDatabase, table: &str) -> Result<Self, PoolError> {
        let table = Identifier::new(table)?;
        let ensure = {
            let database = database.clone();
            let table = table.clone();
            move |_| async move { database.ensure(Table::Mailbox(&table)).await }
        };
        database.block_on(ensure).map_err(|error| {
            open_failed(
                "postgres mailbox",
                &format!("create its table {table}"),
                &error,
            )
        })?;
        let waiters = Arc::new(Waiters::default());
        database.listen(
            table.to_string(),
            Arc::downgrade(&waiters),
            |waiters, payload| {
                // Stores are announced together: a payload holds their key hashes, `,` apart.
                for hash in payload.split(',') {
                    match u64::from_str_radix(hash, 16) {
                        Ok(hash) => waiters.wake_hash(hash),
                        Err(_) => {
                            waiters.wake_all();
                            return;
                        }
                    }
                }
            },
        );
        let (takes, taken) = mpsc::unbounded_channel();
        database.spawn(take_loop(database.clone(), table.clone(), taken));
        let (asks, asked) = mpsc::unbounded_channel();
        database.spawn(holds_loop(
            database.connection().clone(),
            table.clone(),
            asked,
        ));
        Ok(Self {
            database: database.clone(),
            table,
            fence: None,
            waiters,
            takes,
            asks,
            _result: PhantomData,
        })
    }

    /// Links the mailbox to the shared queue `fence` comes from ([`PgQueue::fence`]), which
    /// must live in the mailbox's database: the result of a run that held one of its claims
    /// is then stored in the transaction that ends the claim, and only while the run's node
    /// still holds it, so a node that stalled past its lease never publishes a result (see
    /// [`ClaimFence`]). Pools built from a configuration file are linked this way.
    ///
    /// ```no_run
    /// use prometheus_parking_lot::infra::mailbox::postgres::PostgresMailbox;
    /// use prometheus_parking_lot::infra::postgres::PgDatabase;
    /// use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
    ///
    /// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
    /// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
    /// let queue = PostgresQueue::<String>::open(&database, "pl_queue_jobs", "llm")?;
    /// let results = PostgresMailbox::<String>::open(&database, "pl_mailbox_messages")?
    ///     .settling_claims_of(queue.fence())?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`PgQueue::fence`]: crate::infra::postgres::PgQueue::fence
    pub fn settling_claims_of(mut self, fence: ClaimFence) -> Result<Self, PoolError> {
        if fence.database != self.database {
            return Err(PoolError::InvalidConfig(
                "the mailbox can settle only the claims of a queue reached through the same \
                 PgDatabase handle (one transaction covers both); open both on one handle"
                    .into(),
            ));
        }
        self.fence = Some(fence);
        Ok(self)
    }

    /// `WHERE` conditions on the full key, from parameter `$first` on, and their values.
    fn key_filter(key: &MailboxKey, first: usize) -> (String, Vec<Value>) {
        let mut sql = format!("tenant = ${first}");
        let mut values: Vec<Value> = vec![key.tenant.0.clone().into()];
        for (column, part) in [("user_id", &key.user_id), ("session_id", &key.session_id)] {
            match part {
                Some(text) => {
                    values.push(text.clone().into());
                    sql.push_str(&format!(" AND {column} = ${}", first + values.len() - 1));
                }
                None => sql.push_str(&format!(" AND {column} IS NULL")),
            }
        }
        (sql, values)
    }

    /// Runs `write` (a store of `results` results, at once or not at all, so it can be
    /// repeated) until it succeeds, for up to [`STORE_PATIENCE`]: while the database is away
    /// the results wait here (and the mailbox actor's buffer behind them) instead of being
    /// dropped.
    async fn with_patience<T, W, Fut>(&self, results: usize, write: W) -> Result<T, MailboxError>
    where
        T: Send + 'static,
        W: Fn(DatabaseConnection) -> Fut + Send + Clone + 'static,
        Fut: std::future::Future<Output = Result<T, DbErr>> + Send + 'static,
    {
        let mut pause = Duration::from_millis(50);
        let give_up = Instant::now() + STORE_PATIENCE;
        loop {
            match self.database.run(write.clone()).await {
                Ok(written) => return Ok(written),
                Err(error) if Instant::now() + pause < give_up => {
                    tracing::warn!(table = %self.table, results, error = %db_fault("postgres mailbox store", &error), "retrying a result store");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(error) => return Err(failed("store")(error)),
            }
        }
    }

    /// Wakes the waiters of the keys of `hashes` here, and announces the stores to the other
    /// processes.
    fn wake(&self, mut hashes: Vec<u64>) {
        hashes.sort_unstable();
        hashes.dedup();
        for hash in &hashes {
            self.waiters.wake_hash(*hash);
        }
        for hash in &hashes {
            // The announcer joins these into as few notifications as their size allows.
            self.database
                .announce(self.table.as_str(), format!("{hash:x}"));
        }
    }

    async fn query_all(&self, sql: String, values: Vec<Value>) -> Result<Vec<QueryResult>, DbErr> {
        self.database
            .run(
                move |db| async move { db.query_all_raw(PgDatabase::statement(sql, values)).await },
            )
            .await
    }
}

/// The error of a question asked after the mailbox's database runtime stopped.
fn runtime_stopped() -> MailboxError {
    MailboxError::Backend(BackendFault::plain(
        FaultKind::Other,
        "the mailbox's database runtime stopped",
    ))
}

fn failed(what: &'static str) -> impl Fn(DbErr) -> MailboxError {
    move |error| MailboxError::Backend(db_fault(&format!("postgres {what}"), &error))
}

/// The error of a take that failed: its result, if any, is still stored, so the advice is
/// to retrieve again, not to submit again.
fn take_failed(error: DbErr) -> MailboxError {
    let cause = crate::infra::postgres::outage::Cause::of(&error);
    let known = cause.is_some();
    let again = crate::infra::postgres::outage::Again::Retrieve;
    let mut fault = fault_advising("postgres take", cause, &error, again);
    if !known && fault.kind.is_retryable() {
        fault
            .detail
            .push_str("; retrieve again once the database answers");
    }
    MailboxError::Backend(fault)
}

/// How long [`Mailbox::holds`] waits for the database: a submission does not wait longer
/// for the check (the queue answers for an outage).
const HOLDS_PATIENCE: Duration = Duration::from_secs(1);

/// How long a store keeps retrying while the database cannot be reached.
const STORE_PATIENCE: Duration = Duration::from_secs(60);

const RETURNED: &str = "task_id, created_at_ms, payload::text AS payload, error::text AS error";

#[async_trait]
impl<R> Mailbox<R> for PostgresMailbox<R>
where
    R: Serialize + DeserializeOwned + Send + 'static,
{
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn store(&self, key: &MailboxKey, delivery: Delivery<R>) -> Result<(), MailboxError> {
        let mut stored = self.store_many(vec![(key.clone(), delivery)]).await;
        stored.pop().unwrap_or(Ok(()))
    }

    async fn store_many(
        &self,
        deliveries: Vec<(MailboxKey, Delivery<R>)>,
    ) -> Vec<Result<(), MailboxError>> {
        let mut rows = Rows::new(deliveries.len());
        for (key, delivery) in &deliveries {
            rows.add(key, delivery, None);
        }
        if rows.hashes.is_empty() {
            return rows.answers;
        }
        let sql = format!(
            "INSERT INTO {t} ({STORED_COLUMNS}) SELECT {STORED_COLUMNS} \
               FROM jsonb_to_recordset($1::jsonb) AS r({STORED_RECORD})",
            t = self.table
        );
        let values: Vec<Value> = vec![rows.json.finish().into()];
        let written = self
            .with_patience(rows.hashes.len(), move |db| {
                let (sql, values) = (sql.clone(), values.clone());
                async move { db.query_all_raw(PgDatabase::statement(sql, values)).await }
            })
            .await;
        let mut answers = rows.answers;
        match written {
            Ok(_) => self.wake(rows.hashes),
            Err(error) => {
                for answer in answers.iter_mut().filter(|answer| answer.is_ok()) {
                    *answer = Err(error.clone());
                }
            }
        }
        answers
    }

    fn fences_claims(&self) -> bool {
        self.fence.is_some()
    }

    /// One transaction: the queue's settles of the claims (which return the entries still
    /// held), then the results of those entries only.
    async fn store_fenced(
        &self,
        node: &str,
        deliveries: Vec<FencedDelivery<R>>,
    ) -> Vec<Result<bool, MailboxError>> {
        let Some(fence) = self.fence.clone() else {
            let refused = MailboxError::Backend(BackendFault::plain(
                FaultKind::Other,
                "the postgres mailbox is linked to no shared queue (settling_claims_of)",
            ));
            return deliveries.iter().map(|_| Err(refused.clone())).collect();
        };
        let mut rows = Rows::new(deliveries.len());
        let mut claims: Vec<(Claim, Settlement)> = Vec::with_capacity(deliveries.len());
        for fenced in &deliveries {
            if rows.add(&fenced.key, &fenced.delivery, Some(fenced.claim)) {
                claims.push((fenced.claim, fenced.settlement.clone()));
            }
        }
        let mut answers: Vec<Result<bool, MailboxError>> = rows
            .answers
            .iter()
            .map(|answer| answer.clone().map(|()| false))
            .collect();
        if claims.is_empty() {
            return answers;
        }
        let insert = format!(
            "INSERT INTO {t} ({STORED_COLUMNS}) SELECT {STORED_COLUMNS} \
               FROM jsonb_to_recordset($1::jsonb) AS r({STORED_RECORD}, entry BIGINT) \
              WHERE r.entry = ANY($2::bigint[])",
            t = self.table
        );
        let json = rows.json.finish();
        let node: Arc<str> = Arc::from(node);
        let settled = self
            .with_patience(claims.len(), move |db| {
                let (fence, node, claims) = (fence.clone(), node.clone(), claims.clone());
                let (insert, json) = (insert.clone(), json.clone());
                async move {
                    let transaction = db.begin().await?;
                    let settled = fence.settle_in(&transaction, &node, &claims).await?;
                    if !settled.is_empty() {
                        let held: Vec<String> = settled.iter().map(i64::to_string).collect();
                        let held = format!("{{{}}}", held.join(","));
                        let values: Vec<Value> = vec![json.into(), held.into()];
                        transaction
                            .execute_raw(PgDatabase::statement(insert, values))
                            .await?;
                    }
                    transaction.commit().await?;
                    Ok(settled)
                }
            })
            .await;
        let settled = match settled {
            Ok(settled) => settled,
            Err(error) => {
                for answer in answers.iter_mut().filter(|answer| answer.is_ok()) {
                    *answer = Err(error.clone());
                }
                return answers;
            }
        };
        let mut woken = Vec::with_capacity(settled.len());
        for ((answer, fenced), hash) in answers.iter_mut().zip(&deliveries).zip(&rows.hash_of) {
            if answer.is_ok() && settled.contains(&entry_to_sql(fenced.claim.entry)) {
                *answer = Ok(true);
                woken.extend(*hash);
            }
        }
        self.wake(woken);
        answers
    }

    async fn take(&self, key: &MailboxKey) -> Result<Option<Delivery<R>>, MailboxError> {
        let (filter, values) = Self::key_filter(key, 1);
        let sql = format!(
            "DELETE FROM {t} AS gone WHERE id = ( \
                SELECT id FROM {t} WHERE {filter} ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING {RETURNED}, to_jsonb(gone.*)::text AS {WHOLE_ROW}",
            t = self.table
        );
        // Run on the database's runtime, not in this future: a caller that leaves while the
        // statement runs gets its row put back (see `hand_over`).
        let home = Home {
            database: self.database.clone(),
            table: self.table.clone(),
            key: key.clone(),
        };
        let (answer, mut handed) = handed_over(home.clone());
        self.database.spawn(async move {
            if answer.is_closed() {
                return;
            }
            let statement = PgDatabase::statement(sql, values);
            let taken = home.database.connection().query_all_raw(statement).await;
            let taken = taken
                .map(|rows| rows.into_iter().next())
                .map_err(take_failed);
            hand_over(&home, answer, taken).await;
        });
        let row = handed.received().await.ok_or_else(runtime_stopped)??;
        row.as_ref().map(delivery_of).transpose()
    }

    async fn take_task(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<Option<Delivery<R>>, MailboxError> {
        let (answer, mut handed) = handed_over(Home {
            database: self.database.clone(),
            table: self.table.clone(),
            key: key.clone(),
        });
        let take = TakeTask {
            key: key.clone(),
            task_id,
            answer,
        };
        self.takes.send(take).map_err(|_| runtime_stopped())?;
        let row = handed.received().await.ok_or_else(runtime_stopped)??;
        row.as_ref().map(delivery_of).transpose()
    }

    /// One statement for them and for every other question asked meanwhile (the mailbox's
    /// holds loop groups them), on the lookup index.
    async fn holds(&self, wanted: &[(MailboxKey, TaskId)]) -> Result<Vec<bool>, MailboxError> {
        let (answer, answered) = oneshot::channel();
        let ask = HoldsAsk {
            wanted: wanted.to_vec(),
            deadline: tokio::time::Instant::now() + HOLDS_PATIENCE,
            answer,
        };
        self.asks.send(ask).map_err(|_| runtime_stopped())?;
        answered.await.map_err(|_| runtime_stopped())?
    }

    async fn list(&self, key: &MailboxKey) -> Result<Vec<TaskId>, MailboxError> {
        let (filter, values) = Self::key_filter(key, 1);
        let sql = format!(
            "SELECT task_id FROM {t} WHERE {filter} ORDER BY id",
            t = self.table
        );
        let rows = self.query_all(sql, values).await.map_err(failed("list"))?;
        rows.iter()
            .map(|row| column::<i64>(row, "task_id").map(|id| id as u64))
            .collect()
    }

    async fn purge_stored_before(&self, cutoff_ms: u64) -> Result<usize, MailboxError> {
        let sql = format!("DELETE FROM {t} WHERE created_at_ms < $1", t = self.table);
        let cutoff = i64::try_from(cutoff_ms).unwrap_or(i64::MAX);
        let done = self
            .database
            .run(move |db| async move {
                db.execute_raw(PgDatabase::statement(sql, [cutoff.into()]))
                    .await
            })
            .await
            .map_err(failed("purge"))?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn stored_count(&self) -> Result<usize, MailboxError> {
        let sql = format!("SELECT count(*) AS stored FROM {t}", t = self.table);
        let rows = self
            .query_all(sql, Vec::new())
            .await
            .map_err(failed("count"))?;
        let stored = match rows.first() {
            Some(row) => column::<i64>(row, "stored")?,
            None => 0,
        };
        Ok(usize::try_from(stored).unwrap_or(0))
    }

    fn subscribe(&self, key: &MailboxKey) -> Arc<Notify> {
        let mut waiters = self.waiters.lock();
        let entries = waiters.entry(key_hash(key)).or_default();
        if let Some(notify) = entries
            .iter()
            .find(|(known, _)| known == key)
            .and_then(|(_, notify)| notify.upgrade())
        {
            return notify;
        }
        entries.retain(|(known, notify)| known != key && notify.strong_count() > 0);
        let notify = Arc::new(Notify::new());
        entries.push((key.clone(), Arc::downgrade(&notify)));
        notify
    }

    fn unsubscribe(&self, key: &MailboxKey) {
        let mut waiters = self.waiters.lock();
        let hash = key_hash(key);
        if let Some(entries) = waiters.get_mut(&hash) {
            entries.retain(|(_, notify)| notify.strong_count() > 0);
            if entries.is_empty() {
                waiters.remove(&hash);
            }
        }
    }
}
