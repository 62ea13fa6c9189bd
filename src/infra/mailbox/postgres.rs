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

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sea_orm::{ConnectionTrait, DbErr, QueryResult, Value};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;

use crate::core::{Delivery, Mailbox, MailboxError, PoolError, TaskStatus};
use crate::infra::postgres::{backend_error, Identifier, PgDatabase, Table};
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
    waiters: Arc<Waiters>,
    _result: PhantomData<fn() -> R>,
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
            PoolError::Internal(backend_error("creating the mailbox table", &error))
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
        Ok(Self {
            database: database.clone(),
            table,
            waiters,
            _result: PhantomData,
        })
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

    async fn query_all(&self, sql: String, values: Vec<Value>) -> Result<Vec<QueryResult>, DbErr> {
        self.database
            .run(
                move |db| async move { db.query_all_raw(PgDatabase::statement(sql, values)).await },
            )
            .await
    }
}

fn failed(what: &'static str) -> impl Fn(DbErr) -> MailboxError {
    move |error| MailboxError::Backend(backend_error(what, &error))
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
        MailboxError::Backend(format!("postgres mailbox row, column {name}: {error}"))
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
        (_, Some(error)) => Err(
            serde_json::from_str::<PoolError>(&error).unwrap_or_else(|e| {
                PoolError::Failed(format!("the stored error does not deserialise: {e}"))
            }),
        ),
        (Some(payload), None) => serde_json::from_str::<R>(&payload)
            .map_err(|e| PoolError::Failed(format!("the stored result does not deserialise: {e}"))),
        (None, None) => Err(PoolError::Failed(
            "the stored row holds neither a result nor an error".into(),
        )),
    };
    Ok(Delivery {
        task_id: task_id as u64,
        outcome,
        stored_at_ms: u64::try_from(stored_at_ms).unwrap_or(0),
    })
}

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
        let status = status_word(&delivery.status());
        let (payload, error) = match &delivery.outcome {
            Ok(result) => (
                Some(serde_json::to_string(result).map_err(|e| {
                    MailboxError::Backend(format!("the result does not serialise: {e}"))
                })?),
                None,
            ),
            Err(error) => (
                None,
                Some(serde_json::to_string(error).map_err(|e| {
                    MailboxError::Backend(format!("the error does not serialise: {e}"))
                })?),
            ),
        };
        let hash = key_hash(key);
        let sql = format!(
            "WITH stored AS ( \
               INSERT INTO {t} (tenant, user_id, session_id, task_id, created_at_ms, status, \
                                payload, error) \
               VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb) RETURNING 1) \
             SELECT count(*) AS stored FROM stored",
            t = self.table
        );
        let values: Vec<Value> = vec![
            key.tenant.0.clone().into(),
            key.user_id.clone().into(),
            key.session_id.clone().into(),
            (delivery.task_id as i64).into(),
            i64::try_from(delivery.stored_at_ms)
                .unwrap_or(i64::MAX)
                .into(),
            status.to_owned().into(),
            payload.into(),
            error.into(),
        ];
        // A result is stored once or not at all (one statement), so a failed attempt can be
        // repeated: while the database is away the result waits here (and the mailbox
        // actor's queue behind it) instead of being dropped.
        let mut pause = Duration::from_millis(50);
        let give_up = Instant::now() + STORE_PATIENCE;
        loop {
            match self.query_all(sql.clone(), values.clone()).await {
                Ok(_) => break,
                Err(error) if Instant::now() + pause < give_up => {
                    tracing::warn!(table = %self.table, task_id = delivery.task_id, error = %backend_error("store", &error), "retrying a result store");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(error) => return Err(failed("store")(error)),
            }
        }
        self.waiters.wake_hash(hash);
        self.database
            .announce(self.table.as_str(), format!("{hash:x}"));
        Ok(())
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
        let (filter, mut values) = Self::key_filter(key, 2);
        values.insert(0, (task_id as i64).into());
        let sql = format!(
            "DELETE FROM {t} WHERE id = ( \
                SELECT id FROM {t} WHERE {filter} AND task_id = $1 \
                 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING {RETURNED}",
            t = self.table
        );
        let rows = self.query_all(sql, values).await.map_err(failed("take"))?;
        rows.first().map(delivery_of).transpose()
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
