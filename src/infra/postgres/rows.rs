//! What the queue backends on PostgreSQL share: statements run with a named error, the
//! conversions between the engine's numbers and SQL columns, and a task encoded for storage.

use std::collections::HashSet;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr, QueryResult, TransactionTrait, Value};
use serde::Serialize;

use super::{backend_error, PgDatabase};
use crate::core::{
    Capacity, EntryId, FitQuery, Lease, QueueError, ScheduledTask, Settlement, TaskMetadata,
};
use crate::util::serde::{Priority, ResourceKind};

impl PgDatabase {
    /// Runs a statement that changes rows; returns how many it changed. `what` names the
    /// operation in the error.
    pub(crate) async fn execute_as(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<u64, QueueError> {
        self.run(move |db| async move { db.execute_raw(PgDatabase::statement(sql, values)).await })
            .await
            .map(|done| done.rows_affected())
            .map_err(db_error(what))
    }

    /// Runs a statement that returns at most one row.
    pub(crate) async fn query_one_as(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Option<QueryResult>, QueueError> {
        self.run(
            move |db| async move { db.query_one_raw(PgDatabase::statement(sql, values)).await },
        )
        .await
        .map_err(db_error(what))
    }

    /// Runs a statement that returns rows.
    pub(crate) async fn query_all_as(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Vec<QueryResult>, QueueError> {
        self.run(
            move |db| async move { db.query_all_raw(PgDatabase::statement(sql, values)).await },
        )
        .await
        .map_err(db_error(what))
    }
}

/// The planner settings a claim runs under (see [`PgDatabase::claim_as`]).
const CLAIM_PLANNER: &str = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; \
                             SET LOCAL enable_sort = off; SET LOCAL jit = off";

impl PgDatabase {
    /// Runs a claim: a statement that walks a queue's rank index and returns the rows it took.
    ///
    /// It runs in a transaction of its own under [`CLAIM_PLANNER`], because a queue table's
    /// statistics are wrong most of the time: it swings from empty to many thousand rows
    /// between two `ANALYZE` runs, and one taken while it was nearly empty (with the pages
    /// its dead rows left behind) makes the planner expect a few dozen parked rows. It then
    /// reads them all and sorts them, on every claim: 28 ms instead of 1 ms for 256 of
    /// 20,000 rows. With the full read, the bitmap read and the sort ruled out, the only plan
    /// left is the walk of the rank index in order, which stops at the rows it takes; JIT
    /// compilation is turned off because the cost those rules add to the other plans would
    /// otherwise set it off (about 300 ms). The settings end with the transaction. Costs
    /// three round trips more per claim, each claim taking up to hundreds of tasks.
    pub(crate) async fn claim_as(
        &self,
        what: &str,
        sql: String,
        values: Vec<Value>,
    ) -> Result<Vec<QueryResult>, QueueError> {
        self.run(move |db| async move {
            let transaction = db.begin().await?;
            transaction.execute_unprepared(CLAIM_PLANNER).await?;
            let rows = transaction
                .query_all_raw(PgDatabase::statement(sql, values))
                .await?;
            transaction.commit().await?;
            Ok(rows)
        })
        .await
        .map_err(db_error(what))
    }
}

/// The entries (as stored) in the `entry` column of a group statement's rows.
pub(crate) fn returned_entries(rows: &[QueryResult]) -> HashSet<i64> {
    rows.iter()
        .filter_map(|row| row.try_get::<i64>("", "entry").ok())
        .collect()
}

/// Fills in the answers of a group statement (parks, settlements). `written` lists the
/// (answer index, entry) of the tasks the statement covered, whose answers are `Ok` so far;
/// `returned` is the entries it returned, or its error, which every one of them gets. An
/// entry it did not return gets `missing(entry)`, and so does each extra copy of an entry
/// named twice (the statement acts on it once). Returns whether any entry was returned.
pub(crate) fn answer_group(
    answers: &mut [Result<(), QueueError>],
    written: Vec<(usize, EntryId)>,
    returned: Result<HashSet<i64>, QueueError>,
    missing: fn(EntryId) -> QueueError,
) -> bool {
    let mut returned = match returned {
        Ok(returned) => returned,
        Err(error) => {
            for (index, _) in written {
                answers[index] = Err(error.clone());
            }
            return false;
        }
    };
    let any = !returned.is_empty();
    for (index, entry) in written {
        if !returned.remove(&entry_to_sql(entry)) {
            answers[index] = Err(missing(entry));
        }
    }
    any
}

/// Ends a group of claims as [`SharedQueue::settle_many`](crate::core::SharedQueue::settle_many)
/// asks: the runs that ended well in one statement, `done` (which returns the entries it
/// ended), and failures, which are rare, one by one through `failed`. One answer per claim, in
/// order; a claim `done` did not end is `NotClaimed`.
pub(crate) async fn settle_in_groups<F, FailedFut, D, DoneFut>(
    settlements: Vec<(EntryId, Settlement)>,
    failed: F,
    done: D,
) -> Vec<Result<(), QueueError>>
where
    F: Fn(EntryId, Settlement) -> FailedFut,
    FailedFut: std::future::Future<Output = Result<(), QueueError>>,
    D: FnOnce(Vec<EntryId>) -> DoneFut,
    DoneFut: std::future::Future<Output = Result<HashSet<i64>, QueueError>>,
{
    let mut settled = Vec::with_capacity(settlements.len());
    let mut ended_well = Vec::new();
    for (index, (entry, settlement)) in settlements.into_iter().enumerate() {
        match settlement {
            Settlement::Done => {
                ended_well.push((index, entry));
                settled.push(Ok(()));
            }
            settlement => settled.push(failed(entry, settlement).await),
        }
    }
    if !ended_well.is_empty() {
        let entries = ended_well.iter().map(|&(_, entry)| entry).collect();
        let ended = done(entries).await;
        answer_group(&mut settled, ended_well, ended, QueueError::NotClaimed);
    }
    settled
}

/// Entry ids are unsigned; the columns are signed. Flipping the top bit keeps their order.
pub(crate) fn entry_to_sql(entry: EntryId) -> i64 {
    (entry ^ (1 << 63)) as i64
}

/// The entry id an [`entry_to_sql`] value stands for.
pub(crate) fn entry_from_sql(entry: i64) -> EntryId {
    (entry as u64) ^ (1 << 63)
}

/// A priority as a small number, higher first.
pub(crate) fn priority_to_sql(priority: Priority) -> i16 {
    match priority {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
        Priority::Critical => 3,
    }
}

/// Milliseconds as a `BIGINT`, saturating.
pub(crate) fn millis(value: u128) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Milliseconds as a `BIGINT`, saturating.
pub(crate) fn millis_u64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A duration in milliseconds as a `BIGINT`, saturating.
pub(crate) fn duration_ms(value: Duration) -> i64 {
    i64::try_from(value.as_millis()).unwrap_or(i64::MAX)
}

/// Turns a database error into a queue error naming the operation.
pub(crate) fn db_error(what: &str) -> impl Fn(DbErr) -> QueueError + '_ {
    move |error| QueueError::Backend(backend_error(what, &error))
}

/// Reads column `name` of a row of `backend`'s queue.
pub(crate) fn column<T: sea_orm::TryGetable>(
    backend: &str,
    row: &QueryResult,
    name: &str,
) -> Result<T, QueueError> {
    row.try_get::<T>("", name).map_err(|error| {
        QueueError::Backend(format!("{backend} queue row, column {name}: {error}"))
    })
}

/// A task as a queue stores it, encoded before any await (payloads need not be `Sync`).
pub(crate) struct Encoded {
    /// The task's metadata.
    pub meta: TaskMetadata,
    /// The metadata as JSON text.
    pub metadata: String,
    /// The payload as JSON text.
    pub payload: String,
}

impl Encoded {
    /// Encodes `task` for `backend`'s queue.
    pub(crate) fn new<P: Serialize>(
        backend: &str,
        task: &ScheduledTask<P>,
    ) -> Result<Self, QueueError> {
        let encode = |what: &str, error: serde_json::Error| {
            QueueError::Backend(format!(
                "{backend} queue: the task's {what} does not serialise: {error}"
            ))
        };
        Ok(Self {
            meta: task.meta.clone(),
            metadata: serde_json::to_string(&task.meta).map_err(|e| encode("metadata", e))?,
            payload: serde_json::to_string(&task.payload).map_err(|e| encode("payload", e))?,
        })
    }
}

/// Rows written as one JSON array, so that one statement with one `jsonb` parameter
/// (`jsonb_to_recordset`) writes them all: the statement's text is the same for any number
/// of rows, and the server prepares it once.
pub(crate) struct JsonRows {
    text: String,
    fields_in_row: usize,
}

impl JsonRows {
    pub(crate) fn new() -> Self {
        Self {
            text: String::from("["),
            fields_in_row: 0,
        }
    }

    /// Starts the next row; its fields follow.
    pub(crate) fn row(&mut self) -> &mut Self {
        if self.text.len() > 1 {
            self.text.push_str("},");
        }
        self.text.push('{');
        self.fields_in_row = 0;
        self
    }

    fn name(&mut self, name: &str) {
        if self.fields_in_row > 0 {
            self.text.push(',');
        }
        self.fields_in_row += 1;
        self.text.push('"');
        self.text.push_str(name);
        self.text.push_str("\":");
    }

    /// A number field.
    pub(crate) fn int(&mut self, name: &str, value: i64) -> &mut Self {
        self.name(name);
        self.text.push_str(&value.to_string());
        self
    }

    /// A number field, or `null`.
    pub(crate) fn int_or_null(&mut self, name: &str, value: Option<i64>) -> &mut Self {
        match value {
            Some(value) => self.int(name, value),
            None => self.json(name, None),
        }
    }

    /// A text field, or `null`.
    pub(crate) fn text(&mut self, name: &str, value: Option<&str>) -> &mut Self {
        self.name(name);
        match value {
            Some(text) => self
                .text
                .push_str(&serde_json::Value::from(text).to_string()),
            None => self.text.push_str("null"),
        }
        self
    }

    /// A field holding `value`, JSON text already, or `null`.
    pub(crate) fn json(&mut self, name: &str, value: Option<&str>) -> &mut Self {
        self.name(name);
        self.text.push_str(value.unwrap_or("null"));
        self
    }

    /// The array.
    pub(crate) fn finish(mut self) -> String {
        if self.text.len() > 1 {
            self.text.push('}');
        }
        self.text.push(']');
        self.text
    }
}

/// Reads a task back from its metadata and payload, both JSON text in the row's columns
/// `metadata` and `payload`.
pub(crate) fn task_of<P: serde::de::DeserializeOwned>(
    row: &QueryResult,
) -> Result<ScheduledTask<P>, String> {
    let text = |column: &str| {
        row.try_get::<String>("", column)
            .map_err(|error| format!("column {column}: {error}"))
    };
    let meta: TaskMetadata = serde_json::from_str(&text("metadata")?)
        .map_err(|error| format!("metadata does not deserialise: {error}"))?;
    let payload: P = serde_json::from_str(&text("payload")?)
        .map_err(|error| format!("payload does not deserialise: {error}"))?;
    Ok(ScheduledTask { meta, payload })
}

/// The parameters of a claim statement, in this order (`$n` counted from the first):
///
/// | n | value |
/// |---|---|
/// | 1 | now, ms |
/// | 2-5 | free units of cpu, gpu_vram, io, mixed |
/// | 6 | no rank bound (bool) |
/// | 7-9 | the bound's priority, rank time and entry (0 without a bound) |
/// | 10 | the node |
/// | 11 | the lease's expiry, ms |
/// | 12 | at most this many tasks |
/// | 13 | tasks ranked at or before this time have aged (-1: no starvation rule) |
/// | 14-17 | the node's whole units per kind (for its reserved task) |
pub(crate) fn fit_parameters(
    query: &FitQuery,
    node: &str,
    now_ms: u64,
    expires_at_ms: u64,
    max: usize,
) -> Vec<Value> {
    let (unbounded, priority, time, entry) = match query.bound {
        Some(bound) => (
            false,
            priority_to_sql(bound.priority),
            millis_u64(bound.rank_time_ms),
            entry_to_sql(bound.entry),
        ),
        None => (true, 0, 0, 0),
    };
    // The node's reserved task (see `StarvationRule`): the best-ranked aged task its whole
    // capacity could run. When it does not fit now, only tasks ranked at or ahead of it may
    // be claimed.
    let (aged_before, whole) = match query.starvation {
        Some(rule) => (millis_u64(rule.parked_before_ms), rule.capacity),
        None => (-1, Capacity::uniform(0)),
    };
    let mut values: Vec<Value> = vec![millis_u64(now_ms).into()];
    values.extend(per_kind(query.free));
    values.extend([
        unbounded.into(),
        priority.into(),
        time.into(),
        entry.into(),
        node.to_owned().into(),
        millis_u64(expires_at_ms).into(),
        i64::try_from(max).unwrap_or(i64::MAX).into(),
        aged_before.into(),
    ]);
    values.extend(per_kind(whole));
    values
}

/// Units per kind, in the kinds' column order.
fn per_kind(units: Capacity) -> [Value; 4] {
    [
        ResourceKind::Cpu,
        ResourceKind::GpuVram,
        ResourceKind::Io,
        ResourceKind::Mixed,
    ]
    .map(|kind| Value::from(i64::from(units.get(kind))))
}

/// What one claim statement took.
pub(crate) enum Claimed<P> {
    /// These leases, best-ranked first (none: nothing fits).
    Leases(Vec<Lease<P>>),
    /// Tasks were claimed, but none could be read: each was dead-lettered.
    OnlyBuried,
}

impl<P> Claimed<P> {
    /// The leases taken (none when every claimed task was dead-lettered).
    pub(crate) fn into_leases(self) -> Vec<Lease<P>> {
        match self {
            Claimed::Leases(leases) => leases,
            Claimed::OnlyBuried => Vec::new(),
        }
    }
}

/// Claims one task with `claim_one` until it takes one that can be read or finds none. A
/// task that cannot be read is dead-lettered by the claim and the next is tried; a bounded
/// number of times, so a queue full of bad tasks cannot hold a node here.
pub(crate) async fn first_readable<P, F, Fut>(
    mut claim_one: F,
) -> Result<Option<Lease<P>>, QueueError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Claimed<P>, QueueError>>,
{
    for _ in 0..16 {
        match claim_one().await? {
            Claimed::Leases(mut leases) => return Ok(leases.pop()),
            Claimed::OnlyBuried => continue,
        }
    }
    Ok(None)
}

#[cfg(test)]
impl PgDatabase {
    /// The plan the server would run a claim with (`EXPLAIN (COSTS OFF)`, one line a row),
    /// under the claim's planner settings when `as_claimed`, else under the server's. Runs
    /// nothing: the transaction is rolled back.
    pub(crate) async fn explain_claim(
        &self,
        sql: String,
        values: Vec<Value>,
        as_claimed: bool,
    ) -> Result<String, QueueError> {
        self.run(move |db| async move {
            let transaction = db.begin().await?;
            if as_claimed {
                transaction.execute_unprepared(CLAIM_PLANNER).await?;
            }
            let rows = transaction
                .query_all_raw(PgDatabase::statement(
                    format!("EXPLAIN (COSTS OFF) {sql}"),
                    values,
                ))
                .await?;
            transaction.rollback().await?;
            let lines: Result<Vec<String>, _> = rows
                .iter()
                .map(|row| row.try_get::<String>("", "QUERY PLAN"))
                .collect();
            Ok(lines?.join("\n"))
        })
        .await
        .map_err(db_error("explain"))
    }
}

/// What the queues' plan tests share: the server, raw statements, and tasks to park.
#[cfg(test)]
pub(crate) mod probe {
    use sea_orm::ConnectionTrait;

    use super::PgDatabase;
    use crate::core::{EntryId, ScheduledTask, TaskMetadata};
    use crate::util::serde::{Priority, ResourceCost, ResourceKind};

    /// The server the tests use (`DATABASE_URL`, or the local one).
    pub(crate) fn database() -> PgDatabase {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        PgDatabase::connect(&url).expect("the Postgres server the tests use")
    }

    /// A runtime for a test's async steps (the database runs on its own).
    pub(crate) fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }

    /// Runs `sql` outside any transaction (`VACUUM` refuses one).
    pub(crate) async fn run_sql(database: &PgDatabase, sql: String) {
        database
            .run(move |db| async move { db.execute_unprepared(&sql).await.map(drop) })
            .await
            .unwrap_or_else(|error| panic!("{error}"));
    }

    /// 3,000 one-unit CPU tasks of every priority, ids and entries from `first`.
    pub(crate) fn tasks(first: u64) -> Vec<(EntryId, u64, ScheduledTask<u64>)> {
        (first..first + 3_000)
            .map(|id| {
                let meta = TaskMetadata::new(id, ResourceCost::new(ResourceKind::Cpu, 1))
                    .with_priority(Priority::ALL[(id % 4) as usize]);
                (id, 1_000 + id, ScheduledTask::new(meta, id))
            })
            .collect()
    }
}
