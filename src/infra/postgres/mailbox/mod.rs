//! Results in a PostgreSQL table: [`PostgresMailbox`], a [`Mailbox`] through SeaORM that every
//! node of a deployment shares, so a result stored on one node is taken on any other.
//!
//! One row per delivery: the full key (tenant, user, session), the task id, when it was
//! stored, its terminal status, and either the result (`payload`, JSON) or the error it ended
//! with (`error`, JSON). Every statement filters by the full key, tenant first, with `IS NULL`
//! for a missing user or session, so one tenant's key never reads another's rows and the
//! lookup index serves every query.
//!
//! # Waiting without polling
//!
//! A store announces on the table's channel (`NOTIFY`, after its commit, gathered with other
//! stores: see the database handle's announcer) a hash of the key; each process listens
//! on one connection and wakes exactly the waiters of that key (a hash collision only costs a
//! spurious wake-up: the waiter takes, finds nothing, waits again). A store on this node also
//! wakes its waiters directly, without the round trip. When the listening connection is lost
//! every waiter is woken once, since notifications may have been missed meanwhile.

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult, TransactionTrait, Value};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::core::{
    Claim, Delivery, FencedDelivery, Mailbox, MailboxError, PoolError, Settlement, TaskFailure,
    TaskStatus,
};
use crate::infra::postgres::codec::entry_to_sql;
use crate::infra::postgres::rows::JsonRows;
use crate::infra::postgres::{db_fault, open_failed, ClaimFence, Identifier, PgDatabase, Table};
use crate::util::serde::{MailboxKey, TaskId};

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
    /// The take loop's inbox (see [`take_loop`]).
    takes: mpsc::UnboundedSender<TakeTask>,
    /// The holds loop's inbox (see [`holds_loop`]).
    asks: mpsc::UnboundedSender<HoldsAsk>,
    _result: PhantomData<fn() -> R>,
}

/// Takes one group answers at most (a statement's size stays bounded).
const TAKES_AT_MOST: usize = 1_000;

/// A take of one task's delivery, waiting for the take loop.
struct TakeTask {
    key: MailboxKey,
    task_id: TaskId,
    answer: oneshot::Sender<Result<Option<QueryResult>, MailboxError>>,
}

/// Takes deliveries by task as callers ask for them, in groups: every take asked for while
/// the previous group was in flight goes in the next statement, which locks the oldest row
/// of each (key, task) (`SKIP LOCKED`), deletes them and returns each to its caller. Many
/// callers waiting on their results (an API server's requests) so cost a statement and a
/// commit per group, not per result. Ends when the mailbox is dropped.
async fn take_loop(
    connection: DatabaseConnection,
    table: Identifier,
    mut takes: mpsc::UnboundedReceiver<TakeTask>,
) {
    let sql = format!(
        "WITH wanted AS ( \
           SELECT * FROM jsonb_to_recordset($1::jsonb) \
             AS w({WANTED_RECORD})), \
         picked AS ( \
           SELECT w.n, p.id FROM wanted w CROSS JOIN LATERAL ( \
             SELECT m.id FROM {table} m \
              WHERE m.tenant = w.tenant AND m.task_id = w.task_id \
                AND m.user_id IS NOT DISTINCT FROM w.user_id \
                AND m.session_id IS NOT DISTINCT FROM w.session_id \
              ORDER BY m.id LIMIT 1 FOR UPDATE SKIP LOCKED) p), \
         taken AS ( \
           DELETE FROM {table} WHERE id = ANY(ARRAY(SELECT id FROM picked)) \
           RETURNING id, {RETURNED}) \
         SELECT DISTINCT ON (taken.id) picked.n, taken.* FROM taken JOIN picked USING (id)"
    );
    let mut group = Vec::new();
    while takes.recv_many(&mut group, TAKES_AT_MOST).await > 0 {
        let mut rows = JsonRows::new();
        for (n, take) in group.iter().enumerate() {
            wanted_row(&mut rows, n, &take.key, take.task_id);
        }
        let statement = PgDatabase::statement(sql.clone(), [rows.finish().into()]);
        match connection.query_all_raw(statement).await {
            Ok(found) => {
                let mut by_take: HashMap<i64, QueryResult> = HashMap::with_capacity(found.len());
                for row in found {
                    if let Ok(n) = row.try_get::<i64>("", "n") {
                        by_take.insert(n, row);
                    }
                }
                for (n, take) in group.drain(..).enumerate() {
                    let _ = take.answer.send(Ok(by_take.remove(&(n as i64))));
                }
            }
            Err(error) => {
                let error = failed("take")(error);
                for take in group.drain(..) {
                    let _ = take.answer.send(Err(error.clone()));
                }
            }
        }
    }
}

/// The columns of a wanted (key, task) row, numbered `n` in its statement.
const WANTED_RECORD: &str = "n BIGINT, tenant TEXT, user_id TEXT, session_id TEXT, task_id BIGINT";

/// Adds wanted row `n`: the task `task_id` under exactly `key` (see [`WANTED_RECORD`]).
fn wanted_row(rows: &mut JsonRows, n: usize, key: &MailboxKey, task_id: TaskId) {
    rows.row()
        .int("n", n as i64)
        .text("tenant", Some(&key.tenant.0))
        .text("user_id", key.user_id.as_deref())
        .text("session_id", key.session_id.as_deref())
        .int("task_id", task_id as i64);
}

/// A question from [`Mailbox::holds`], waiting for the holds loop.
struct HoldsAsk {
    wanted: Vec<(MailboxKey, TaskId)>,
    /// When the asker stops waiting: [`HOLDS_PATIENCE`] after it asked.
    deadline: tokio::time::Instant,
    answer: oneshot::Sender<Result<Vec<bool>, MailboxError>>,
}

/// Answers [`Mailbox::holds`] questions in groups, as [`take_loop`] takes: every question
/// asked while the previous statement was in flight goes in the next one, so clients that
/// submit one task at a time each (an API server's requests) cost a statement per group,
/// not per submission. Each question is answered within [`HOLDS_PATIENCE`] of being asked,
/// a statement in flight included: a statement runs until its group's earliest deadline and
/// then answers its whole group with an error (the submissions then go on). Ends when the
/// mailbox is dropped.
async fn holds_loop(
    connection: DatabaseConnection,
    table: Identifier,
    mut asks: mpsc::UnboundedReceiver<HoldsAsk>,
) {
    let sql = format!(
        "SELECT w.n FROM jsonb_to_recordset($1::jsonb) \
           AS w({WANTED_RECORD}) \
          WHERE EXISTS (SELECT 1 FROM {table} m \
            WHERE m.tenant = w.tenant AND m.task_id = w.task_id \
              AND m.user_id IS NOT DISTINCT FROM w.user_id \
              AND m.session_id IS NOT DISTINCT FROM w.session_id)"
    );
    let mut group = Vec::new();
    while asks.recv_many(&mut group, TAKES_AT_MOST).await > 0 {
        let mut rows = JsonRows::new();
        let mut n = 0;
        for ask in &group {
            for (key, task_id) in &ask.wanted {
                wanted_row(&mut rows, n, key, *task_id);
                n += 1;
            }
        }
        let statement = PgDatabase::statement(sql.clone(), [rows.finish().into()]);
        let deadline = group.iter().map(|ask| ask.deadline).min();
        let deadline = deadline.unwrap_or_else(tokio::time::Instant::now);
        let found = tokio::time::timeout_at(deadline, connection.query_all_raw(statement))
            .await
            .map_err(|_| DbErr::Custom("no answer within 1s".into()))
            .and_then(|found| found)
            .map_err(failed("holds"))
            .and_then(|found| {
                found
                    .iter()
                    .map(|row| column::<i64>(row, "n"))
                    .collect::<Result<Vec<i64>, _>>()
            });
        let mut held = match found {
            Ok(found) => {
                let mut held = vec![false; n];
                for n in found {
                    if let Some(slot) = usize::try_from(n).ok().and_then(|n| held.get_mut(n)) {
                        *slot = true;
                    }
                }
                Ok(held.into_iter())
            }
            Err(error) => Err(error),
        };
        for ask in group.drain(..) {
            let answer = match &mut held {
                Ok(held) => Ok(held.by_ref().take(ask.wanted.len()).collect()),
                Err(error) => Err(error.clone()),
            };
            let _ = ask.answer.send(answer);
        }
    }
}

impl<R> std::fmt::Debug for PostgresMailbox<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresMailbox")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// The waiters' handles of the keys with one hash.
type SameHash = Vec<(MailboxKey, Weak<Notify>)>;

/// Who waits on which key, by the key's hash.
#[derive(Default)]
struct Waiters {
    by_hash: Mutex<HashMap<u64, SameHash>>,
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, SameHash>> {
        self.by_hash.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the waiters of keys with this hash.
    fn wake_hash(&self, hash: u64) {
        let waiters = self.lock();
        for (_, notify) in waiters.get(&hash).into_iter().flatten() {
            if let Some(notify) = notify.upgrade() {
                notify.notify_waiters();
            }
        }
    }

    /// Wakes every waiter (notifications may have been lost).
    fn wake_all(&self) {
        let waiters = self.lock();
        for (_, notify) in waiters.values().flatten() {
            if let Some(notify) = notify.upgrade() {
                notify.notify_waiters();
            }
        }
    }
}

/// A hash of a full key that every process computes alike (FNV-1a over its parts).
fn key_hash(key: &MailboxKey) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(key.tenant.0.as_bytes());
    for part in [&key.user_id, &key.session_id] {
        match part {
            Some(text) => {
                eat(&[1]);
                eat(text.as_bytes());
            }
            None => eat(&[0]),
        }
    }
    hash
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
        database.spawn(take_loop(
            database.connection().clone(),
            table.clone(),
            taken,
        ));
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

fn failed(what: &'static str) -> impl Fn(DbErr) -> MailboxError {
    move |error| MailboxError::Backend(db_fault(&format!("postgres {what}"), &error))
}

/// The word stored in `status`.
fn status_word(status: &TaskStatus) -> &'static str {
    match status {
        TaskStatus::Completed => "completed",
        TaskStatus::Failed(_) => "failed",
        TaskStatus::Expired => "expired",
        TaskStatus::TimedOut => "timed_out",
        TaskStatus::Cancelled => "cancelled",
        _ => "other",
    }
}

fn column<T: sea_orm::TryGetable>(row: &QueryResult, name: &str) -> Result<T, MailboxError> {
    row.try_get::<T>("", name).map_err(|error| {
        MailboxError::Backend(BackendFault::plain(
            FaultKind::Corrupt,
            format!("postgres mailbox row, column {name}: {error}"),
        ))
    })
}

/// Reads a delivery back. A row whose result no longer deserialises (the result type changed
/// between versions, say) becomes a failure that says so, rather than an error that would
/// leave the row stuck: the caller learns what happened, and the row is gone.
fn delivery_of<R: DeserializeOwned>(row: &QueryResult) -> Result<Delivery<R>, MailboxError> {
    let task_id: i64 = column(row, "task_id")?;
    let stored_at_ms: i64 = column(row, "created_at_ms")?;
    let payload: Option<String> = column(row, "payload")?;
    let error: Option<String> = column(row, "error")?;
    let outcome = match (payload, error) {
        (_, Some(error)) => Err(stored_failure(&error)),
        (Some(payload), None) => serde_json::from_str::<R>(&payload).map_err(|e| {
            TaskFailure::Failed(format!("the stored result does not deserialise: {e}"))
        }),
        (None, None) => Err(TaskFailure::Failed(
            "the stored row holds neither a result nor an error".into(),
        )),
    };
    Ok(Delivery {
        task_id: task_id as u64,
        outcome,
        stored_at_ms: u64::try_from(stored_at_ms).unwrap_or(0),
    })
}

/// How a task ended, read back from its row's `error` column. Rows stored before outcomes
/// had a type of their own hold a [`PoolError`]; those read as the outcome they stand for.
fn stored_failure(error: &str) -> TaskFailure {
    serde_json::from_str::<TaskFailure>(error)
        .or_else(|_| serde_json::from_str::<PoolError>(error).map(TaskFailure::from))
        .unwrap_or_else(|e| {
            TaskFailure::Failed(format!("the stored error does not deserialise: {e}"))
        })
}

/// A delivery's result or error as JSON text, for the `payload` and `error` columns.
type EncodedOutcome = (Option<String>, Option<String>);

/// Encodes a delivery's outcome.
fn encoded<R: Serialize>(delivery: &Delivery<R>) -> Result<EncodedOutcome, MailboxError> {
    match &delivery.outcome {
        Ok(result) => Ok((
            Some(serde_json::to_string(result).map_err(|e| {
                MailboxError::Backend(BackendFault::plain(
                    FaultKind::Refused,
                    format!("the result does not serialise: {e}"),
                ))
            })?),
            None,
        )),
        Err(error) => Ok((
            None,
            Some(serde_json::to_string(error).map_err(|e| {
                MailboxError::Backend(BackendFault::plain(
                    FaultKind::Refused,
                    format!("the error does not serialise: {e}"),
                ))
            })?),
        )),
    }
}

/// The columns a store writes, and their types in the JSON records it is given.
const STORED_COLUMNS: &str =
    "tenant, user_id, session_id, task_id, created_at_ms, status, payload, error";
const STORED_RECORD: &str = "tenant TEXT, user_id TEXT, session_id TEXT, task_id BIGINT, \
     created_at_ms BIGINT, status TEXT, payload JSONB, error JSONB";

/// The JSON records of a store, one per delivery that could be encoded, in order (so the
/// rows' ids, the order `take` follows, are the deliveries' order), with an answer per
/// delivery so far and the key hashes to wake.
struct Rows {
    json: JsonRows,
    answers: Vec<Result<(), MailboxError>>,
    /// The hash of each encoded delivery's key, in order.
    hashes: Vec<u64>,
    /// The hash of each delivery's key, `None` where it could not be encoded.
    hash_of: Vec<Option<u64>>,
}

impl Rows {
    fn new(capacity: usize) -> Self {
        Self {
            json: JsonRows::new(),
            answers: Vec::with_capacity(capacity),
            hashes: Vec::with_capacity(capacity),
            hash_of: Vec::with_capacity(capacity),
        }
    }

    /// Adds the record of one delivery, with the entry of its `claim`, if any; `false` when
    /// it cannot be encoded (its answer says why).
    fn add<R: Serialize>(
        &mut self,
        key: &MailboxKey,
        delivery: &Delivery<R>,
        claim: Option<Claim>,
    ) -> bool {
        let (payload, error) = match encoded(delivery) {
            Ok(encoded) => encoded,
            Err(error) => {
                self.answers.push(Err(error));
                self.hash_of.push(None);
                return false;
            }
        };
        let row = self.json.row();
        row.text("tenant", Some(&key.tenant.0))
            .text("user_id", key.user_id.as_deref())
            .text("session_id", key.session_id.as_deref())
            .int("task_id", delivery.task_id as i64)
            .int(
                "created_at_ms",
                i64::try_from(delivery.stored_at_ms).unwrap_or(i64::MAX),
            )
            .text("status", Some(status_word(&delivery.status())))
            .json("payload", payload.as_deref())
            .json("error", error.as_deref());
        if let Some(claim) = claim {
            row.int("entry", entry_to_sql(claim.entry));
        }
        let hash = key_hash(key);
        self.hashes.push(hash);
        self.hash_of.push(Some(hash));
        self.answers.push(Ok(()));
        true
    }
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
            "DELETE FROM {t} WHERE id = ( \
                SELECT id FROM {t} WHERE {filter} ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING {RETURNED}",
            t = self.table
        );
        let rows = self.query_all(sql, values).await.map_err(failed("take"))?;
        rows.first().map(delivery_of).transpose()
    }

    async fn take_task(
        &self,
        key: &MailboxKey,
        task_id: TaskId,
    ) -> Result<Option<Delivery<R>>, MailboxError> {
        let (answer, answered) = oneshot::channel();
        let take = TakeTask {
            key: key.clone(),
            task_id,
            answer,
        };
        let stopped = || {
            MailboxError::Backend(BackendFault::plain(
                FaultKind::Other,
                "the mailbox's database runtime stopped",
            ))
        };
        self.takes.send(take).map_err(|_| stopped())?;
        let row = answered.await.map_err(|_| stopped())??;
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
        let stopped = || {
            MailboxError::Backend(BackendFault::plain(
                FaultKind::Other,
                "the mailbox's database runtime stopped",
            ))
        };
        self.asks.send(ask).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_outcome_reads_back_in_the_current_form_and_the_earlier_one() {
        let stored = |failure: &TaskFailure| serde_json::to_string(failure).unwrap();
        for failure in [
            TaskFailure::TimedOut,
            TaskFailure::Failed("boom".into()),
            TaskFailure::Lost(Box::new(PoolError::Shutdown)),
        ] {
            assert_eq!(stored_failure(&stored(&failure)), failure);
        }
        // Rows written before outcomes had a type of their own hold a `PoolError`.
        assert_eq!(stored_failure(r#""Expired""#), TaskFailure::Expired);
        assert_eq!(
            stored_failure(r#""QueueFull""#),
            TaskFailure::Lost(Box::new(PoolError::QueueFull))
        );
        let TaskFailure::Failed(text) = stored_failure("not json") else {
            panic!("an unreadable row is a failure that says so");
        };
        assert!(text.contains("does not deserialise"), "{text}");
    }
}
