//! A schedule's ticks on a shared queue (`ScheduleTicks::enqueue_tick`): each tick is parked
//! once in the fleet.
//!
//! `pl_schedule_ticks` keeps one row per (queue, schedule, tick). A node parks a tick in one
//! transaction: it writes the tick's row, unless the row, or a later tick of the same
//! schedule, is there already, and only if it wrote it, parks the task with the layout's own
//! park statement. Two nodes writing the same tick meet on the primary key: the second waits
//! for the first's transaction and then writes nothing. A crash between the two statements
//! rolls both back. A row is kept a day past its tick, which bounds the table by the ticks
//! of a day per schedule; the latest row of a schedule is what a starting node reads to see
//! which ticks were missed while no node ran it.

use sea_orm::{ConnectionTrait, DbErr, TransactionTrait, Value};
use serde::Serialize;

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind};

use super::PgQueue;
use crate::core::{EntryId, QueueError, ScheduledTask};
use crate::infra::postgres::codec::{column, millis_u64, ParkRows};
use crate::infra::postgres::named::NamedSql;
use crate::infra::postgres::{PgDatabase, Table};

/// The table of ticks every queue of a database shares.
pub(crate) const TICKS_TABLE: &str = "pl_schedule_ticks";

/// How long a tick's row is kept past its tick, in milliseconds.
const KEEP_TICKS_MS: u64 = 24 * 60 * 60 * 1_000;

/// The ticks table (see the module docs). `place` names the queue as the fleet's budgets do:
/// backend, place and queue name.
pub(crate) fn ticks_table() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {TICKS_TABLE} (
            place       TEXT        NOT NULL,
            schedule    TEXT        NOT NULL,
            tick_ms     BIGINT      NOT NULL,
            enqueued_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
            PRIMARY KEY (place, schedule, tick_ms)
        );"
    )
}

/// Writes tick `$tick_ms` of `$schedule` unless it or a later tick is written, and drops the
/// schedule's rows older than `$keep_after_ms`. Returns the tick when it wrote it.
fn write_tick_sql() -> NamedSql {
    NamedSql::new(&format!(
        "WITH tick AS (
            INSERT INTO {TICKS_TABLE} (place, schedule, tick_ms)
            SELECT $place, $schedule, $tick_ms
             WHERE NOT EXISTS (SELECT 1 FROM {TICKS_TABLE}
                                WHERE place = $place AND schedule = $schedule
                                  AND tick_ms >= $tick_ms)
            ON CONFLICT DO NOTHING RETURNING tick_ms),
         old AS (DELETE FROM {TICKS_TABLE}
                  WHERE place = $place AND schedule = $schedule AND tick_ms < $keep_after_ms
                    AND EXISTS (SELECT 1 FROM tick))
         SELECT tick_ms FROM tick"
    ))
}

/// The latest tick of `$schedule` written.
fn latest_tick_sql() -> NamedSql {
    NamedSql::new(&format!(
        "SELECT max(tick_ms) AS tick_ms FROM {TICKS_TABLE} \
          WHERE place = $place AND schedule = $schedule"
    ))
}

impl<L, P> PgQueue<L, P>
where
    L: Send + Sync + 'static,
    P: Serialize + Send + 'static,
{
    /// The queue as the ticks table names it.
    fn tick_place(&self) -> Value {
        format!(
            "{} {} {}",
            self.label.backend, self.label.place, self.label.queue
        )
        .into()
    }

    /// See `ScheduleTicks::enqueue_tick`: the tick's row and the task, in one transaction.
    pub(super) async fn park_tick(
        &self,
        schedule: &str,
        tick_ms: u64,
        entry: EntryId,
        task: ScheduledTask<P>,
    ) -> Result<bool, QueueError> {
        let what = "enqueue a tick";
        let mut rows = ParkRows::new(self.label.backend).attaching(self.attaches());
        rows.push(entry, tick_ms, &task)?;
        let tick = [
            ("place", self.tick_place()),
            ("schedule", schedule.to_owned().into()),
            ("tick_ms", millis_u64(tick_ms).into()),
            (
                "keep_after_ms",
                millis_u64(tick_ms.saturating_sub(KEEP_TICKS_MS)).into(),
            ),
        ];
        let park = [("queue", self.queue()), ("rows", rows.finish().into())];
        let tick = self.bound(what, &write_tick_sql(), &tick)?;
        let park = self.bound(what, &self.statements.park, &park)?;
        self.ready_for_ticks(what).await?;
        let parked = park_if_written(&self.database, tick, park).await;
        match parked {
            Ok(parked) => {
                if parked {
                    self.announce();
                }
                Ok(parked)
            }
            Err(error) => Err(self.failed(what, &error).await),
        }
    }

    /// See `ScheduleTicks::latest_tick`.
    pub(super) async fn read_latest_tick(&self, schedule: &str) -> Result<Option<u64>, QueueError> {
        let what = "read a schedule's latest tick";
        self.ready_for_ticks(what).await?;
        let params = [
            ("place", self.tick_place()),
            ("schedule", schedule.to_owned().into()),
        ];
        let row = self.row(what, &latest_tick_sql(), &params).await?;
        let latest = match row {
            Some(row) => column::<Option<i64>>(self.label.backend, &row, "tick_ms")?,
            None => None,
        };
        Ok(latest.and_then(|tick| u64::try_from(tick).ok()))
    }

    /// `sql` with its values taken from `params`.
    fn bound(
        &self,
        what: &str,
        sql: &NamedSql,
        params: &[(&str, Value)],
    ) -> Result<(String, Vec<Value>), QueueError> {
        let values = sql.bind(params).map_err(|missing| {
            QueueError::Backend(BackendFault::plain(
                FaultKind::Other,
                format!("{}: {what}: {missing}", self.label),
            ))
        })?;
        Ok((sql.text().to_owned(), values))
    }

    /// Creates the ticks table unless it exists.
    async fn ready_for_ticks(&self, what: &str) -> Result<(), QueueError> {
        match self.database.ensure(Table::Ticks).await {
            Ok(()) => Ok(()),
            Err(error) => Err(self.failed(what, &error).await),
        }
    }
}

/// Runs `tick` and, only if it wrote the tick, `park`, in one transaction. A park that
/// stored nothing (its entry was taken) rolls the tick back, so the tick is never kept
/// without its task.
async fn park_if_written(
    database: &PgDatabase,
    tick: (String, Vec<Value>),
    park: (String, Vec<Value>),
) -> Result<bool, DbErr> {
    database
        .run(move |db| async move {
            let transaction = db.begin().await?;
            let written = transaction
                .query_all_raw(PgDatabase::statement(tick.0, tick.1))
                .await?;
            if written.is_empty() {
                transaction.commit().await?;
                return Ok(false);
            }
            let parked = transaction
                .query_all_raw(PgDatabase::statement(park.0, park.1))
                .await?;
            if parked.is_empty() {
                transaction.rollback().await?;
                return Err(DbErr::Custom(
                    "the tick's task was not parked: its entry is taken".into(),
                ));
            }
            transaction.commit().await?;
            Ok(true)
        })
        .await
}
