//! A queue many nodes share, on [PGMQ](https://github.com/pgmq/pgmq): [`PgmqQueue`], a
//! [`SharedQueue`] through SeaORM (cargo feature `pgmq`).
//!
//! # Layout
//!
//! A configured `queue_name` `jobs` becomes five PGMQ queues: one per priority level,
//! `jobs_crit`, `jobs_high`, `jobs_norm` and `jobs_low`, and the dead-letter queue
//! `jobs_dlq`. Each task is one PGMQ message (a row of `pgmq.q_jobs_<level>`) whose JSON body
//! holds its rank (`rank`, `entry`), cost (`kind`, `units`), mailbox key (`tenant`, `user`,
//! `session`, `task`), metadata (`meta`) and payload (`payload`), and, while a node holds it,
//! the node's name (`node`). A small table `pl_pgmq_entries` keeps entry ids unique across
//! the levels. PGMQ comes from the server's extension, or is installed as plain SQL when the
//! server lacks it (see [`PgDatabase::install_pgmq`]).
//!
//! # Leases are visibility timeouts
//!
//! A claim sets the message's `vt` (PGMQ's visibility timeout) to the lease's expiry, adds 1
//! to `read_ct` (so `read_ct` is the attempt) and writes the node's name into the body;
//! renewing moves `vt`; completing the task archives the message (`pgmq.a_jobs_<level>`).
//! Times are the nodes' clocks, as in the Postgres table queue: `vt` is the expiry the node
//! computed, and a claim takes only messages whose `vt` is at or before its own now. A parked
//! message is visible from the Unix epoch on.
//!
//! A node that dies stops renewing; once `vt` has passed, any node's
//! [`rescue_expired`](SharedQueue::rescue_expired) takes the node's name off the message, so
//! it is visible again, after an exponential backoff (`vt` moved to now + backoff). A message
//! whose `read_ct` has reached `max_attempts` when its lease runs out goes instead to the
//! dead-letter queue, with the reason in its body (`reason`); so does a message whose task
//! cannot be read back, and a task that failed ([`Settlement::Failed`]) is archived in the
//! dead-letter queue's archive with its reason. [`take_dead_letters`](SharedQueue::take_dead_letters)
//! archives the dead-letter queue's messages as it reports them, so each is reported once.
//!
//! # Skip-ahead
//!
//! PGMQ's own `read` takes the oldest visible messages, optionally those whose body contains
//! a JSON value; it cannot ask for `units <= free`. So a claim is one statement on the queue
//! tables instead of `pgmq.read`, that does what `read` does (lock with `SKIP LOCKED`, set
//! `vt`, add to `read_ct`) to the messages it picks: from each level, the best-ranked visible
//! messages that fit the free units (an expression index on `(rank, entry)` of the parked
//! messages serves it in rank order), then across the levels the best-ranked of those whose
//! running cost fits. The answer is the same as the Postgres table queue's: the best-ranked
//! parked task that fits, over all levels, with the same rank bound and starvation rule.
//!
//! # Wake-ups
//!
//! Each park (one for a group of parks, [`SharedQueue::enqueue_many`]) and each rescue sends
//! `NOTIFY` on the channel `pgmq.<queue_name>`; a listener connection wakes the pools of this
//! process ([`SharedQueue::watch`]).
//!
//! # Groups
//!
//! A group of parks is one statement: the entries are registered in `pl_pgmq_entries`, and
//! each entry not registered before has its message sent to its level's queue. A group of
//! settlements that ended well is one statement too, archiving every message the node holds
//! among them (failures, rare, go one by one to the dead-letter archive).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sea_orm::{QueryResult, Value};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;

use crate::core::{
    DeadLetter, EntryId, FitQuery, Lease, PoolError, QueueCounts, QueueError, ScheduledTask,
    Settlement, SharedQueue,
};
use crate::infra::postgres::rows::{
    self, duration_ms, entry_from_sql, entry_to_sql, millis_u64, priority_to_sql, task_of, Claimed,
    Encoded,
};
use crate::infra::postgres::{backend_error, Identifier, PgDatabase, PgmqSource};
use crate::infra::queue::postgres::RetryPolicy;
use crate::util::serde::{MailboxKey, Priority, ResourceCost, ResourceKind, TaskId};

/// The longest `queue_name`: PGMQ allows 47 characters, and the levels add up to 5.
pub const MAX_QUEUE_NAME: usize = 42;

/// The priority levels, best first: their rank number and the suffix of their PGMQ queue.
const LEVELS: [(i16, &str); 4] = [(3, "crit"), (2, "high"), (1, "norm"), (0, "low")];

/// The table that keeps entry ids unique across a queue's levels.
const ENTRIES: &str = "pl_pgmq_entries";

/// A [`SharedQueue`] on PGMQ queues, one per priority level. See the module docs.
///
/// ```no_run
/// use std::sync::Arc;
/// use prometheus_parking_lot::infra::postgres::PgDatabase;
/// use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
///
/// # fn main() -> Result<(), prometheus_parking_lot::PoolError> {
/// let database = PgDatabase::connect("postgres://postgres@127.0.0.1:5432/test")?;
/// let queue: Arc<PgmqQueue<String>> = Arc::new(PgmqQueue::open(&database, "llm")?);
/// # Ok(()) }
/// ```
pub struct PgmqQueue<P> {
    database: PgDatabase,
    /// The configured name, lower-cased (PGMQ folds queue names to lower case).
    name: String,
    source: PgmqSource,
    retry: RetryPolicy,
    /// Bumped when a task is parked or rescued anywhere (NOTIFY on the queue's channel).
    wake: Arc<watch::Sender<u64>>,
    _payload: PhantomData<fn() -> P>,
}

impl<P> std::fmt::Debug for PgmqQueue<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgmqQueue")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// Checks a configured queue name: an identifier of at most [`MAX_QUEUE_NAME`] characters.
pub fn check_queue_name(name: &str) -> Result<String, PoolError> {
    let name = Identifier::new(name)?;
    if name.as_str().len() > MAX_QUEUE_NAME {
        return Err(PoolError::InvalidConfig(format!(
            "{:?} is too long for a pgmq queue name: at most {MAX_QUEUE_NAME} characters (PGMQ \
             allows 47, and the priority levels add a suffix of up to 5)",
            name.as_str()
        )));
    }
    Ok(name.as_str().to_ascii_lowercase())
}

impl<P> PgmqQueue<P> {
    /// Opens the PGMQ queues of `name` (installing PGMQ as plain SQL when the server lacks
    /// the extension, and creating the queues if needed; safe when many processes start at
    /// once) and starts listening for its wake-ups. Blocks until done: call it at start, not
    /// on a pool's runtime.
    pub fn open(database: &PgDatabase, name: &str) -> Result<Self, PoolError> {
        let name = check_queue_name(name)?;
        let database = database.clone();
        let setup = {
            let database = database.clone();
            let name = name.clone();
            move |_| async move {
                let source = database.install_pgmq().await?;
                let mut queues: Vec<String> = LEVELS
                    .iter()
                    .map(|(_, suffix)| format!("{name}_{suffix}"))
                    .collect();
                queues.push(format!("{name}_dlq"));
                database
                    .create_pgmq_queues(queues, own_objects(&name))
                    .await?;
                Ok(source)
            }
        };
        let source = database.block_on(setup).map_err(|error| {
            PoolError::Internal(backend_error("creating the pgmq queues", &error))
        })?;
        let wake = Arc::new(watch::Sender::new(0));
        database.listen(
            channel(&name),
            Arc::downgrade(&wake),
            |wake: &watch::Sender<u64>, _| {
                wake.send_modify(|count: &mut u64| *count = count.wrapping_add(1));
            },
        );
        Ok(Self {
            database,
            name,
            source,
            retry: RetryPolicy::default(),
            wake,
            _payload: PhantomData,
        })
    }

    /// Sets how lost runs are retried (`max_attempts`: the `read_ct` at which a lost lease
    /// dead-letters the message).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Whether PGMQ is the server's extension or the plain SQL objects.
    pub fn source(&self) -> PgmqSource {
        self.source
    }

    /// The PGMQ queue names this queue uses: the levels, best first, then the dead-letter
    /// queue.
    pub fn pgmq_queues(&self) -> Vec<String> {
        let mut names: Vec<String> = LEVELS
            .iter()
            .map(|(_, suffix)| format!("{}_{suffix}", self.name))
            .collect();
        names.push(format!("{}_dlq", self.name));
        names
    }

    /// The table of level `suffix`.
    fn table(&self, suffix: &str) -> String {
        format!("pgmq.q_{}_{suffix}", self.name)
    }

    /// One statement part per level (`{t}` the level's table, `{p}` its rank number), joined
    /// by `separator`.
    fn per_level(&self, separator: &str, part: impl Fn(&str, i16) -> String) -> String {
        LEVELS
            .iter()
            .map(|(p, suffix)| part(&self.table(suffix), *p))
            .collect::<Vec<_>>()
            .join(separator)
    }

    /// `UNION ALL` of `SELECT {columns} FROM {cte}_<p>` over the levels.
    fn union_of(cte: &str, columns: &str) -> String {
        LEVELS
            .iter()
            .map(|(p, _)| format!("SELECT {columns} FROM {cte}_{p}"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    }
}

/// The indexes and table this crate adds to a queue's PGMQ tables: the rank order of parked
/// messages, lookups by entry and by task, held messages by `vt` (rescues), and the entry
/// registry.
fn own_objects(name: &str) -> String {
    let mut sql = format!(
        "CREATE TABLE IF NOT EXISTS {ENTRIES} (queue_name TEXT NOT NULL, entry BIGINT NOT NULL, \
         PRIMARY KEY (queue_name, entry));"
    );
    for (_, suffix) in LEVELS {
        let q = format!("{name}_{suffix}");
        sql.push_str(&format!(
            "CREATE INDEX IF NOT EXISTS q_{q}_pl_rank ON pgmq.q_{q} \
                 ({RANK}, {ENTRY}) WHERE {PARKED}; \
             CREATE INDEX IF NOT EXISTS q_{q}_pl_entry ON pgmq.q_{q} ({ENTRY}); \
             CREATE INDEX IF NOT EXISTS q_{q}_pl_task ON pgmq.q_{q} ({TASK}) WHERE {PARKED}; \
             CREATE INDEX IF NOT EXISTS q_{q}_pl_held ON pgmq.q_{q} (vt) WHERE NOT {PARKED};"
        ));
    }
    sql
}

/// A message's rank time, entry and task id, as the indexes have them.
const RANK: &str = "((message->>'rank')::bigint)";
const ENTRY: &str = "((message->>'entry')::bigint)";
const TASK: &str = "((message->>'task')::bigint)";
/// No node holds the message.
const PARKED: &str = "(message->>'node' IS NULL)";
/// The units free for the message's kind, from parameters `$a..$a+3`.
fn free_for(kind: &str, first: usize) -> String {
    format!(
        "CASE {kind} WHEN 0 THEN ${first} WHEN 1 THEN ${} WHEN 2 THEN ${} ELSE ${} END",
        first + 1,
        first + 2,
        first + 3
    )
}
/// A time in milliseconds (a `BIGINT` expression) as a `timestamptz`.
fn at_ms(ms: &str) -> String {
    format!("to_timestamp(({ms})::bigint / 1000.0)")
}

/// The NOTIFY channel of queue `name`.
fn channel(name: &str) -> String {
    format!("pgmq.{name}")
}

fn column<T: sea_orm::TryGetable>(row: &QueryResult, name: &str) -> Result<T, QueueError> {
    rows::column("pgmq", row, name)
}

/// The body of a task's message.
fn message(
    entry: EntryId,
    rank_time_ms: u64,
    row: &Encoded,
    node: Option<&str>,
) -> Result<String, QueueError> {
    let key = row
        .meta
        .mailbox
        .clone()
        .unwrap_or_else(|| MailboxKey::new(""));
    let raw = |text: &str| {
        serde_json::from_str::<serde_json::Value>(text).map_err(|error| {
            QueueError::Backend(format!("pgmq queue: the task does not encode: {error}"))
        })
    };
    let mut body = serde_json::json!({
        "entry": entry_to_sql(entry),
        "rank": millis_u64(rank_time_ms),
        "kind": row.meta.cost.kind.index(),
        "units": row.meta.cost.units,
        "tenant": key.tenant.0,
        "user": key.user_id,
        "session": key.session_id,
        "task": row.meta.id as i64,
        "meta": raw(&row.metadata)?,
        "payload": raw(&row.payload)?,
    });
    if let Some(node) = node {
        body["node"] = node.into();
    }
    Ok(body.to_string())
}

#[async_trait]
impl<P> SharedQueue<P> for PgmqQueue<P>
where
    P: Serialize + DeserializeOwned + Send + 'static,
{
    fn backend(&self) -> &'static str {
        "postgres_pgmq"
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
        let mut messages = Vec::with_capacity(tasks.len());
        let mut written = Vec::with_capacity(tasks.len());
        for (entry, rank_time_ms, task) in tasks {
            let body = Encoded::new("pgmq", &task).and_then(|row| {
                let body = message(entry, rank_time_ms, &row, None)?;
                Ok((priority_to_sql(row.meta.priority), body))
            });
            match body {
                Ok((p, body)) => {
                    messages.push(format!("{{\"p\":{p},\"message\":{body}}}"));
                    written.push((parked.len(), entry));
                    parked.push(Ok(()));
                }
                Err(error) => parked.push(Err(error)),
            }
        }
        if written.is_empty() {
            return parked;
        }
        // The entries are registered first; a message is sent only for an entry that was not
        // registered yet, and for an entry named twice in the batch only for its first copy.
        let sent = self.per_level(", ", |table, p| {
            format!(
                "s_{p} AS (INSERT INTO {table} (vt, read_ct, message) \
                   SELECT to_timestamp(0), 0, message FROM chosen WHERE p = {p} \
                   RETURNING {ENTRY} AS entry)"
            )
        });
        let sql = format!(
            "WITH input AS (SELECT (item->>'p')::smallint AS p, item->'message' AS message, \
                                   (item->'message'->>'entry')::bigint AS entry, ord \
                              FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS i(item, ord)), \
             fresh AS (INSERT INTO {ENTRIES} (queue_name, entry) SELECT $1, entry FROM input \
                       ON CONFLICT DO NOTHING RETURNING entry), \
             chosen AS (SELECT DISTINCT ON (entry) p, message FROM input \
                         WHERE entry IN (SELECT entry FROM fresh) ORDER BY entry, ord), \
             {sent} {}",
            Self::union_of("s", "entry")
        );
        let values: Vec<Value> = vec![
            self.name.clone().into(),
            format!("[{}]", messages.join(",")).into(),
        ];
        let stored = self.database.query_all_as("park", sql, values).await;
        // An entry stored already (or twice in this batch) is refused, once per copy.
        let stored = stored.map(|rows| rows::returned_entries(&rows));
        let any = rows::answer_group(&mut parked, written, stored, QueueError::Duplicate);
        if any {
            self.database.announce(&channel(&self.name), String::new());
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
        let row = Encoded::new("pgmq", &task)?;
        self.send_claimed(entry, rank_time_ms, row, (node, expires_at_ms))
            .await?;
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
        rows::first_readable(|| self.claim_messages(node, query, 1, lease, now_ms)).await
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
        Ok(self
            .claim_messages(node, query, max, lease, now_ms)
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
        let expires = millis_u64(now_ms).saturating_add(duration_ms(lease));
        let updates = self.per_level(", ", |table, p| {
            format!(
                "u_{p} AS (UPDATE {table} SET vt = {vt} \
                  WHERE {ENTRY} = $1 AND message->>'node' = $2 RETURNING 1)",
                vt = at_ms("$3")
            )
        });
        let sql = format!(
            "WITH {updates} SELECT count(*) AS changed FROM ({}) AS renewed",
            Self::union_of("u", "1")
        );
        let values: Vec<Value> = vec![
            entry_to_sql(entry).into(),
            node.to_owned().into(),
            expires.into(),
        ];
        let row = self.database.query_one_as("renew", sql, values).await?;
        let changed: i64 = row.map_or(Ok(0), |row| column(&row, "changed"))?;
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
        let settled = self.settle_entries(node, &[entry], settlement).await?;
        if settled.is_empty() {
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
        let done = |entries: Vec<EntryId>| async move {
            self.settle_entries(node, &entries, Settlement::Done).await
        };
        rows::settle_in_groups(settlements, failed, done).await
    }

    async fn remove(&self, entry: EntryId) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let picked = self.per_level(", ", |table, p| {
            format!(
                "c_{p} AS (SELECT {p} AS p, msg_id FROM {table} WHERE {ENTRY} = $1 AND {PARKED} \
                   FOR UPDATE SKIP LOCKED)"
            )
        });
        self.delete_parked(picked, vec![entry_to_sql(entry).into()], "remove")
            .await
    }

    async fn remove_task(
        &self,
        key: &MailboxKey,
        id: TaskId,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let picked = self.per_level(", ", |table, p| {
            format!(
                "c_{p} AS (SELECT {p} AS p, msg_id FROM {table} \
                   WHERE {TASK} = $1 AND {PARKED} AND message->>'tenant' = $2 \
                     AND message->>'user' IS NOT DISTINCT FROM $3 \
                     AND message->>'session' IS NOT DISTINCT FROM $4 \
                   ORDER BY msg_id LIMIT 1 FOR UPDATE SKIP LOCKED)"
            )
        });
        let values: Vec<Value> = vec![
            (id as i64).into(),
            key.tenant.0.clone().into(),
            key.user_id.clone().into(),
            key.session_id.clone().into(),
        ];
        self.delete_parked(picked, values, "cancel").await
    }

    async fn rescue_expired(&self, now_ms: u64) -> Result<usize, QueueError> {
        let expired = self.per_level(", ", |table, p| {
            format!(
                "e_{p} AS (SELECT msg_id, read_ct FROM {table} \
                   WHERE NOT {PARKED} AND vt <= {now} FOR UPDATE SKIP LOCKED), \
                 b_{p} AS (UPDATE {table} AS q SET message = q.message - 'node', \
                      vt = {backoff} \
                    FROM e_{p} WHERE q.msg_id = e_{p}.msg_id AND e_{p}.read_ct < $3 RETURNING 1), \
                 d_{p} AS (DELETE FROM {table} AS q USING e_{p} \
                    WHERE q.msg_id = e_{p}.msg_id AND e_{p}.read_ct >= $3 \
                    RETURNING q.read_ct, q.enqueued_at, q.message)",
                now = at_ms("$2"),
                backoff = at_ms(&format!(
                    "$2 + LEAST($5::bigint, $4::bigint * \
                     (1::bigint << LEAST(GREATEST(e_{p}.read_ct - 1, 0), 40)))"
                )),
            )
        });
        let sql = format!(
            "WITH {expired}, dead AS ({dead}), \
             letters AS (INSERT INTO pgmq.q_{name}_dlq (vt, read_ct, enqueued_at, message) \
                SELECT to_timestamp(0), read_ct, enqueued_at, (message - 'node') || \
                       jsonb_build_object('reason', 'the lease of node ' || \
                           coalesce(message->>'node', '?') || ' ran out (attempt ' || read_ct || ')') \
                  FROM dead RETURNING 1), \
             forgotten AS (DELETE FROM {ENTRIES} WHERE queue_name = $1 \
                AND entry IN (SELECT {ENTRY} FROM dead)) \
             SELECT (SELECT count(*) FROM ({back}) AS back) AS parked, \
                    (SELECT count(*) FROM letters) AS dead",
            dead = Self::union_of("d", "read_ct, enqueued_at, message"),
            back = Self::union_of("b", "1"),
            name = self.name,
        );
        let values: Vec<Value> = vec![
            self.name.clone().into(),
            millis_u64(now_ms).into(),
            i32::try_from(self.retry.max_attempts)
                .unwrap_or(i32::MAX)
                .into(),
            duration_ms(self.retry.base).into(),
            duration_ms(self.retry.max).into(),
        ];
        let Some(row) = self.database.query_one_as("rescue", sql, values).await? else {
            return Ok(0);
        };
        let parked: i64 = column(&row, "parked")?;
        let dead: i64 = column(&row, "dead")?;
        if parked > 0 {
            self.database.announce(&channel(&self.name), String::new());
        }
        if dead > 0 {
            tracing::warn!(queue = %self.name, dead, "dead-lettered tasks whose every attempt lost its lease");
        }
        Ok(usize::try_from(parked + dead).unwrap_or(usize::MAX))
    }

    async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let per_level = self.per_level(" UNION ALL ", |table, _| {
            format!(
                "SELECT count(*) FILTER (WHERE {PARKED}) AS parked, \
                        count(*) FILTER (WHERE NOT {PARKED}) AS claimed FROM {table}"
            )
        });
        let sql = format!(
            "SELECT sum(parked)::bigint AS parked, sum(claimed)::bigint AS claimed \
               FROM ({per_level}) AS levels"
        );
        let Some(row) = self.database.query_one_as("count", sql, Vec::new()).await? else {
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
        // Reported letters are archived, as a consumer of a PGMQ queue archives what it read.
        let sql = format!(
            "WITH picked AS (SELECT msg_id FROM pgmq.q_{name}_dlq ORDER BY msg_id LIMIT $1 \
                              FOR UPDATE SKIP LOCKED), \
             gone AS (DELETE FROM pgmq.q_{name}_dlq AS q USING picked \
                       WHERE q.msg_id = picked.msg_id \
                      RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.vt, q.message), \
             kept AS (INSERT INTO pgmq.a_{name}_dlq (msg_id, read_ct, enqueued_at, vt, message) \
                      SELECT msg_id, read_ct, enqueued_at, vt, message FROM gone) \
             SELECT msg_id, coalesce(message->>'tenant', '') AS tenant, \
                    message->>'user' AS user_id, message->>'session' AS session_id, \
                    coalesce(message->>'task', '0') AS task_id, \
                    coalesce(message->>'kind', '0') AS kind, \
                    coalesce(message->>'units', '0') AS units, \
                    message->>'reason' AS reason \
               FROM gone ORDER BY msg_id",
            name = self.name
        );
        let values: Vec<Value> = vec![i64::try_from(max).unwrap_or(i64::MAX).into()];
        let rows = self
            .database
            .query_all_as("dead letters", sql, values)
            .await?;
        rows.iter()
            .map(|row| {
                let number = |name: &str| -> Result<i64, QueueError> {
                    Ok(column::<String>(row, name)?.parse().unwrap_or(0))
                };
                let kind = number("kind")?;
                let kind = ResourceKind::ALL
                    .into_iter()
                    .find(|known| known.index() as i64 == kind)
                    .unwrap_or(ResourceKind::Cpu);
                let mut key = MailboxKey::new(column::<String>(row, "tenant")?);
                key.user_id = column(row, "user_id")?;
                key.session_id = column(row, "session_id")?;
                let reason: Option<String> = column(row, "reason")?;
                Ok(DeadLetter {
                    key,
                    task_id: number("task_id")? as u64,
                    cost: ResourceCost::new(kind, u32::try_from(number("units")?).unwrap_or(0)),
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

impl<P> PgmqQueue<P> {
    /// Stores a task's message in its level's queue, already held by `node` until
    /// `expires_at_ms`, with `read_ct` 1 (parked tasks go through
    /// [`enqueue_many`](SharedQueue::enqueue_many)). `Duplicate` if the entry is in the queue
    /// already, at any level.
    async fn send_claimed(
        &self,
        entry: EntryId,
        rank_time_ms: u64,
        row: Encoded,
        (node, expires_at_ms): (&str, u64),
    ) -> Result<(), QueueError> {
        let body = message(entry, rank_time_ms, &row, Some(node))?;
        let sql = format!(
            "WITH fresh AS (INSERT INTO {ENTRIES} (queue_name, entry) VALUES ($1, $2) \
                            ON CONFLICT DO NOTHING RETURNING entry), \
             sent AS (INSERT INTO {table} (vt, read_ct, message) \
                      SELECT {vt}, 1, $4::jsonb FROM fresh RETURNING msg_id) \
             SELECT count(*) AS stored FROM sent",
            table = self.table(level_of(row.meta.priority)),
            vt = at_ms("$3"),
        );
        let values: Vec<Value> = vec![
            self.name.clone().into(),
            entry_to_sql(entry).into(),
            millis_u64(expires_at_ms).into(),
            body.into(),
        ];
        let row = self.database.query_one_as("send", sql, values).await?;
        let stored: i64 = row.map_or(Ok(0), |row| column(&row, "stored"))?;
        if stored == 0 {
            return Err(QueueError::Duplicate(entry));
        }
        Ok(())
    }

    /// Ends `node`'s claims on `entries` with `settlement`, in one statement; returns the
    /// entries (as stored) that `node` held and that are now settled.
    async fn settle_entries(
        &self,
        node: &str,
        entries: &[EntryId],
        settlement: Settlement,
    ) -> Result<std::collections::HashSet<i64>, QueueError> {
        let taken = self.per_level(", ", |table, p| {
            format!(
                "g_{p} AS (DELETE FROM {table} WHERE {ENTRY} = ANY($1::bigint[]) \
                   AND message->>'node' = $2 \
                   RETURNING {p} AS p, msg_id, read_ct, enqueued_at, vt, message)"
            )
        });
        let gone = Self::union_of("g", "p, msg_id, read_ct, enqueued_at, vt, message");
        // Done: archived in the level's archive, as `pgmq.archive` does. Failed: kept, with
        // the reason, in the dead-letter queue's archive (its submitter hears of it from the
        // node, so it is not a dead letter to report).
        let keep = match &settlement {
            Settlement::Done => self.per_level(", ", |_, p| {
                let suffix = suffix_of(p);
                format!(
                    "k_{p} AS (INSERT INTO pgmq.a_{name}_{suffix} \
                         (msg_id, read_ct, enqueued_at, vt, message) \
                     SELECT msg_id, read_ct, enqueued_at, vt, message FROM g_{p} RETURNING 1)",
                    name = self.name
                )
            }),
            Settlement::Failed(_) => format!(
                "k AS (INSERT INTO pgmq.a_{name}_dlq (msg_id, read_ct, enqueued_at, vt, message) \
                 SELECT nextval(pg_get_serial_sequence('pgmq.q_{name}_dlq', 'msg_id')), read_ct, \
                        enqueued_at, vt, (message - 'node') || jsonb_build_object('reason', $4::text) \
                   FROM gone RETURNING 1)",
                name = self.name
            ),
        };
        let sql = format!(
            "WITH {taken}, gone AS ({gone}), {keep}, \
             forgotten AS (DELETE FROM {ENTRIES} WHERE queue_name = $3 \
                            AND entry IN (SELECT {ENTRY} FROM gone)) \
             SELECT {ENTRY} AS entry FROM gone"
        );
        let list = entries
            .iter()
            .map(|&entry| entry_to_sql(entry).to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut values: Vec<Value> = vec![
            format!("{{{list}}}").into(),
            node.to_owned().into(),
            self.name.clone().into(),
        ];
        if let Settlement::Failed(reason) = settlement {
            values.push(reason.into());
        }
        let rows = self.database.query_all_as("settle", sql, values).await?;
        Ok(rows::returned_entries(&rows))
    }

    /// The claim statement of [`claim_messages`](Self::claim_messages), whose parameters are
    /// those of [`rows::fit_parameters`].
    fn claim_sql(&self) -> String {
        let kind = "((c.message->>'kind')::int)";
        let units = "((c.message->>'units')::bigint)";
        let (rank, entry_of) = (
            "((c.message->>'rank')::bigint)",
            "((c.message->>'entry')::bigint)",
        );
        let reserved = self.per_level(" UNION ALL ", |table, p| {
            format!(
                "(SELECT {p} AS p, {rank} AS rank, {entry_of} AS entry, {kind} AS kind, \
                         {units} AS units FROM {table} AS c \
                   WHERE {parked} AND {rank} <= $13 AND {units} <= {whole} \
                   ORDER BY {rank}, {entry_of} LIMIT 1)",
                parked = PARKED.replace("message", "c.message"),
                whole = free_for(kind, 14),
            )
        });
        let candidates = self.per_level(", ", |table, p| {
            format!(
                "c_{p} AS (SELECT c.msg_id, {p} AS p, {rank} AS rank, {entry_of} AS entry, \
                                  {kind} AS kind, {units} AS units FROM {table} AS c \
                   WHERE {parked} AND c.vt <= {now} AND {units} <= {fits} \
                     AND ($6 OR {p} > $7 OR ({p} = $7 AND ({rank}, {entry_of}) <= ($8, $9))) \
                     AND NOT EXISTS (SELECT 1 FROM reserved AS r \
                         WHERE r.units > {r_fits} \
                           AND ({p} < r.p OR ({p} = r.p AND ({rank}, {entry_of}) > (r.rank, r.entry)))) \
                   ORDER BY {rank}, {entry_of} LIMIT $12 FOR UPDATE SKIP LOCKED)",
                parked = PARKED.replace("message", "c.message"),
                now = at_ms("$1"),
                fits = free_for(kind, 2),
                r_fits = free_for("r.kind", 2),
            )
        });
        let claims = self.per_level(", ", |table, p| {
            format!(
                "u_{p} AS (UPDATE {table} AS q SET vt = {expiry}, read_ct = q.read_ct + 1, \
                          message = q.message || jsonb_build_object('node', $10::text) \
                     FROM pick WHERE pick.p = {p} AND q.msg_id = pick.msg_id \
                   RETURNING {p} AS p, q.msg_id, q.read_ct, q.message)",
                expiry = at_ms("$11"),
            )
        });
        format!(
            "WITH reserved AS MATERIALIZED ( \
               SELECT * FROM ({reserved}) AS levels ORDER BY p DESC, rank, entry LIMIT 1), \
             {candidates}, \
             candidates AS ({all}), \
             running AS (SELECT msg_id, p, rank, entry, kind, sum(units) OVER ( \
                 PARTITION BY kind ORDER BY p DESC, rank, entry) AS held FROM candidates), \
             pick AS (SELECT msg_id, p FROM running WHERE held <= {held_fits} \
                       ORDER BY p DESC, rank, entry LIMIT $12), \
             {claims} \
             SELECT p, msg_id, read_ct, (message->>'rank')::bigint AS rank, \
                    (message->>'entry')::bigint AS entry, \
                    (message->'meta')::text AS metadata, (message->'payload')::text AS payload \
               FROM ({claimed}) AS claimed ORDER BY p DESC, rank, entry",
            all = Self::union_of("c", "msg_id, p, rank, entry, kind, units"),
            held_fits = free_for("kind", 2),
            claimed = Self::union_of("u", "p, msg_id, read_ct, message"),
        )
    }

    /// Moves the message `msg_id` of level `p` that cannot be used to the dead-letter queue,
    /// with the reason.
    async fn bury(&self, p: i16, msg_id: i64, reason: String) -> Result<(), QueueError> {
        let suffix = suffix_of(p);
        let sql = format!(
            "WITH gone AS (DELETE FROM {table} WHERE msg_id = $1 \
                           RETURNING read_ct, enqueued_at, message), \
             letter AS (INSERT INTO pgmq.q_{name}_dlq (vt, read_ct, enqueued_at, message) \
                SELECT to_timestamp(0), read_ct, enqueued_at, \
                       (message - 'node') || jsonb_build_object('reason', $2::text) FROM gone) \
             DELETE FROM {ENTRIES} WHERE queue_name = $3 \
                AND entry IN (SELECT {ENTRY} FROM gone)",
            table = self.table(suffix),
            name = self.name
        );
        let values: Vec<Value> = vec![msg_id.into(), reason.into(), self.name.clone().into()];
        self.database
            .execute_as("dead-letter", sql, values)
            .await
            .map(drop)
    }
}

impl<P> PgmqQueue<P>
where
    P: DeserializeOwned + Send + 'static,
{
    /// Claims up to `max` parked messages that fit `query` together, in one statement: from
    /// each level the best `max` visible messages that fit one by one are locked (`SKIP
    /// LOCKED`), and of those, in rank order across levels, the first `max` whose running cost
    /// per kind stays within the free units are claimed.
    async fn claim_messages(
        &self,
        node: &str,
        query: &FitQuery,
        max: usize,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Claimed<P>, QueueError> {
        let expires_at_ms = Lease::<P>::expiry(now_ms, lease);
        let sql = self.claim_sql();
        let values = rows::fit_parameters(query, node, now_ms, expires_at_ms, max);
        let rows = self.database.claim_as("claim", sql, values).await?;
        let mut leases = Vec::with_capacity(rows.len());
        for row in &rows {
            let msg_id: i64 = column(row, "msg_id")?;
            let p: i16 = column::<i32>(row, "p")? as i16;
            match task_of::<P>(row) {
                Ok(task) => {
                    let read_ct: i32 = column(row, "read_ct")?;
                    let entry: i64 = column(row, "entry")?;
                    leases.push(Lease {
                        entry: entry_from_sql(entry),
                        task,
                        attempt: u32::try_from(read_ct).unwrap_or(0),
                        expires_at_ms,
                    });
                }
                Err(reason) => {
                    tracing::error!(queue = %self.name, msg_id, %reason, "dead-lettering a queued task that cannot be read");
                    self.bury(p, msg_id, reason).await?;
                }
            }
        }
        if leases.is_empty() && !rows.is_empty() {
            return Ok(Claimed::OnlyBuried);
        }
        Ok(Claimed::Leases(leases))
    }

    /// Deletes the parked message the `c_<p>` parts of `picked` lock (at most one over all
    /// levels, the best level's), forgets its entry, and reads its task back; a task that
    /// cannot be read is gone all the same: `None` and a log line.
    async fn delete_parked(
        &self,
        picked: String,
        values: Vec<Value>,
        what: &'static str,
    ) -> Result<Option<ScheduledTask<P>>, QueueError> {
        let deletes = self.per_level(", ", |table, p| {
            format!(
                "g_{p} AS (DELETE FROM {table} AS q USING pick \
                   WHERE pick.p = {p} AND q.msg_id = pick.msg_id RETURNING q.message)"
            )
        });
        let sql = format!(
            "WITH {picked}, \
             pick AS (SELECT p, msg_id FROM ({all}) AS found ORDER BY p DESC LIMIT 1), \
             {deletes}, gone AS ({gone}), \
             forgotten AS (DELETE FROM {ENTRIES} WHERE queue_name = '{name}' \
                AND entry IN (SELECT {ENTRY} FROM gone)) \
             SELECT (message->'meta')::text AS metadata, (message->'payload')::text AS payload \
               FROM gone",
            all = Self::union_of("c", "p, msg_id"),
            gone = Self::union_of("g", "message"),
            name = self.name,
        );
        let Some(row) = self.database.query_one_as(what, sql, values).await? else {
            return Ok(None);
        };
        match task_of::<P>(&row) {
            Ok(task) => Ok(Some(task)),
            Err(reason) => {
                tracing::error!(queue = %self.name, %reason, "removed a queued task that cannot be read");
                Ok(None)
            }
        }
    }
}

/// The suffix of the level a priority parks in.
fn level_of(priority: Priority) -> &'static str {
    suffix_of(priority_to_sql(priority))
}

/// The suffix of level `p` (a rank number of [`LEVELS`]).
fn suffix_of(p: i16) -> &'static str {
    LEVELS
        .iter()
        .find(|(level, _)| *level == p)
        .map_or("low", |(_, suffix)| suffix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Capacity;
    use crate::infra::postgres::rows::probe::{self, run_sql};

    /// The pgmq claim under statistics of nearly empty level tables, as the table queue's
    /// test (`infra::queue::postgres`) has it: every level's rank index walked, no level
    /// table read whole, where the server's own plan reads them.
    #[test]
    fn a_claim_walks_each_levels_rank_index_under_statistics_of_nearly_empty_tables() {
        let database = probe::database();
        let name = format!("plan_probe_{}", std::process::id());
        let queue = PgmqQueue::<u64>::open(&database, &name).expect("open");
        let (plan, server_plan) = probe::runtime().block_on(async {
            let tables: Vec<String> = LEVELS.iter().map(|(_, level)| queue.table(level)).collect();
            for table in &tables {
                let no_autovacuum = format!("ALTER TABLE {table} SET (autovacuum_enabled = false)");
                run_sql(&database, no_autovacuum).await;
            }
            assert!(queue
                .enqueue_many(probe::tasks(0))
                .await
                .iter()
                .all(Result::is_ok));
            for table in &tables {
                run_sql(
                    &database,
                    format!("DELETE FROM {table} WHERE {TASK} % 50 <> 0"),
                )
                .await;
                run_sql(&database, format!("VACUUM ANALYZE {table}")).await;
            }
            assert!(queue
                .enqueue_many(probe::tasks(10_000))
                .await
                .iter()
                .all(Result::is_ok));
            let values = || {
                let free = FitQuery::within(Capacity::uniform(256));
                rows::fit_parameters(&free, "node", 1_000_000, 2_000_000, 256)
            };
            let explain =
                |as_claimed| database.explain_claim(queue.claim_sql(), values(), as_claimed);
            let plan = explain(true).await.expect("explain");
            let server_plan = explain(false).await.expect("explain");
            for queue_name in queue.pgmq_queues() {
                run_sql(&database, format!("SELECT pgmq.drop_queue('{queue_name}')")).await;
            }
            let forget = format!("DELETE FROM {ENTRIES} WHERE queue_name = '{name}'");
            run_sql(&database, forget).await;
            (plan, server_plan)
        });
        for (_, level) in LEVELS {
            let index = format!("Index Scan using q_{name}_{level}_pl_rank");
            assert!(
                plan.contains(&index),
                "level {level} walks its rank index:\n{plan}"
            );
            for whole_table in ["Seq Scan on", "Bitmap Heap Scan on"] {
                let read = format!("{whole_table} q_{name}_{level}");
                assert!(
                    !plan.contains(&read),
                    "level {level} is read whole:\n{plan}"
                );
            }
        }
        assert_ne!(
            plan, server_plan,
            "the server's own plan is the same:\n{server_plan}"
        );
    }

    #[test]
    fn queue_names_are_identifiers_of_at_most_42_characters_folded_to_lower_case() {
        assert_eq!(check_queue_name("LLM_jobs").unwrap(), "llm_jobs");
        assert_eq!(check_queue_name(&"q".repeat(42)).unwrap(), "q".repeat(42));
        let long = check_queue_name(&"q".repeat(43)).unwrap_err().to_string();
        assert!(
            long.contains("too long for a pgmq queue name: at most 42 characters"),
            "{long}"
        );
        let unsafe_name = check_queue_name("jobs; DROP TABLE x")
            .unwrap_err()
            .to_string();
        assert!(
            unsafe_name.contains("is not a safe SQL identifier"),
            "{unsafe_name}"
        );
    }

    #[test]
    fn every_priority_has_its_own_level() {
        let levels: Vec<&str> = [
            Priority::Critical,
            Priority::High,
            Priority::Normal,
            Priority::Low,
        ]
        .into_iter()
        .map(level_of)
        .collect();
        assert_eq!(levels, ["crit", "high", "norm", "low"]);
    }
}
