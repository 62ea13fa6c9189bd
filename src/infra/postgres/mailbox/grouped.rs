//! Takes and [`Mailbox::holds`](crate::core::Mailbox::holds) questions, gathered: every one
//! asked while the previous statement was in flight goes in the next, so many callers cost a
//! statement and a commit per group, not per result.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, QueryResult};
use tokio::sync::{mpsc, oneshot};

use crate::core::MailboxError;
use crate::infra::postgres::rows::JsonRows;
use crate::infra::postgres::{Identifier, PgDatabase};
use crate::util::serde::{MailboxKey, TaskId};

use super::hand_over::{hand_over, Home, Taken, WHOLE_ROW};
use super::stored::column;
use super::{failed, take_failed, RETURNED};

/// Takes one group answers at most (a statement's size stays bounded).
pub(super) const TAKES_AT_MOST: usize = 1_000;

/// A take of one task's delivery, waiting for the take loop.
pub(super) struct TakeTask {
    pub(super) key: MailboxKey,
    pub(super) task_id: TaskId,
    pub(super) answer: oneshot::Sender<Taken>,
}

/// Takes deliveries by task as callers ask for them, in groups: every take asked for while
/// the previous group was in flight goes in the next statement, which locks the oldest row
/// of each (key, task) (`SKIP LOCKED`), deletes them and returns each to its caller. Many
/// callers waiting on their results (an API server's requests) so cost a statement and a
/// commit per group, not per result. A take whose caller left before its statement is not
/// asked for; a row taken for a caller that left meanwhile is put back ([`hand_over`]).
/// Ends when the mailbox is dropped.
pub(super) async fn take_loop(
    database: PgDatabase,
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
           DELETE FROM {table} AS gone WHERE id = ANY(ARRAY(SELECT id FROM picked)) \
           RETURNING id, {RETURNED}, to_jsonb(gone.*)::text AS {WHOLE_ROW}) \
         SELECT DISTINCT ON (taken.id) picked.n, taken.* FROM taken JOIN picked USING (id)"
    );
    let mut group = Vec::new();
    while takes.recv_many(&mut group, TAKES_AT_MOST).await > 0 {
        group.retain(|take: &TakeTask| !take.answer.is_closed());
        if group.is_empty() {
            continue;
        }
        let mut rows = JsonRows::new();
        for (n, take) in group.iter().enumerate() {
            wanted_row(&mut rows, n, &take.key, take.task_id);
        }
        let statement = PgDatabase::statement(sql.clone(), [rows.finish().into()]);
        match database.connection().query_all_raw(statement).await {
            Ok(found) => {
                let mut by_take: HashMap<i64, QueryResult> = HashMap::with_capacity(found.len());
                for row in found {
                    if let Ok(n) = row.try_get::<i64>("", "n") {
                        by_take.insert(n, row);
                    }
                }
                for (n, take) in group.drain(..).enumerate() {
                    let taken = Ok(by_take.remove(&(n as i64)));
                    let home = Home {
                        database: database.clone(),
                        table: table.clone(),
                        key: take.key,
                    };
                    hand_over(&home, take.answer, taken).await;
                }
            }
            Err(error) => {
                let error = take_failed(error);
                for take in group.drain(..) {
                    let _ = take.answer.send(Err(error.clone()));
                }
            }
        }
    }
}

/// The columns of a wanted (key, task) row, numbered `n` in its statement.
pub(super) const WANTED_RECORD: &str =
    "n BIGINT, tenant TEXT, user_id TEXT, session_id TEXT, task_id BIGINT";

/// Adds wanted row `n`: the task `task_id` under exactly `key` (see [`WANTED_RECORD`]).
pub(super) fn wanted_row(rows: &mut JsonRows, n: usize, key: &MailboxKey, task_id: TaskId) {
    rows.row()
        .int("n", n as i64)
        .text("tenant", Some(&key.tenant.0))
        .text("user_id", key.user_id.as_deref())
        .text("session_id", key.session_id.as_deref())
        .int("task_id", task_id as i64);
}

/// A question from [`Mailbox::holds`], waiting for the holds loop.
pub(super) struct HoldsAsk {
    pub(super) wanted: Vec<(MailboxKey, TaskId)>,
    /// When the asker stops waiting: [`HOLDS_PATIENCE`] after it asked.
    pub(super) deadline: tokio::time::Instant,
    pub(super) answer: oneshot::Sender<Result<Vec<bool>, MailboxError>>,
}

/// Answers [`Mailbox::holds`] questions in groups, as [`take_loop`] takes: every question
/// asked while the previous statement was in flight goes in the next one, so clients that
/// submit one task at a time each (an API server's requests) cost a statement per group,
/// not per submission. Each question is answered within [`HOLDS_PATIENCE`] of being asked,
/// a statement in flight included: a statement runs until its group's earliest deadline and
/// then answers its whole group with an error (the submissions then go on). Ends when the
/// mailbox is dropped.
pub(super) async fn holds_loop(
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
