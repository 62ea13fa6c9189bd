//! A [`PgQueue`]'s upkeep: the [`QueueMaintenance`] operations (rescuing expired claims,
//! dead letters, counts), and reading a dead letter's row.

use prometheus_parking_lot_actors::domain::{BackendFault, FaultKind, TaskId, TaskStatus};

use async_trait::async_trait;
use sea_orm::QueryResult;

use super::PgQueue;
use crate::core::{
    DeadLetter, EntryId, KeptLetter, LetterEnd, QueueCounts, QueueError, QueueMaintenance,
    TaskMetadata,
};
use crate::infra::postgres::codec::{count_to_sql, entry_from_sql, entry_to_sql, millis_u64};
use crate::infra::postgres::retry::RescueParams;
use crate::util::serde::{MailboxKey, ResourceCost, ResourceKind};

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
        if let Some(expire) = &self.statements.expire_held {
            self.rows(
                "expire children waiting past their deadline",
                expire,
                &forget,
            )
            .await?;
        }
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
        let reason = reason.unwrap_or_else(|| "no reason recorded".into());
        // Only the table layout cancels tasks whose parents did not succeed, that expired
        // while they waited for them, or that a bounded park shed (`queue/bounded.rs`).
        let cancelled = row.try_get::<bool>("", "cancelled").unwrap_or(false);
        let ended = row.try_get::<Option<String>>("", "ended").ok().flatten();
        let ended = ended.and_then(|status| serde_json::from_str::<TaskStatus>(&status).ok());
        let end = match (cancelled, ended) {
            (false, _) => LetterEnd::GivenUp,
            (true, Some(TaskStatus::Expired)) => LetterEnd::Expired,
            (true, Some(TaskStatus::Rejected(_))) => LetterEnd::Shed,
            (true, _) => LetterEnd::Cancelled {
                parent: parent_of(row),
            },
        };
        Ok(DeadLetter {
            key,
            task_id: task_id as u64,
            cost: ResourceCost::new(kind, u32::try_from(units).unwrap_or(u32::MAX)),
            reason: if cancelled {
                reason
            } else {
                format!("the shared queue gave up on the task: {reason}")
            },
            end,
        })
    }
}

/// The parent a cancelled child's row names (`parent_task`, and `parent_status`, a
/// `TaskStatus` in JSON): `None` for a row without them (a node of an earlier version
/// cancelled it) or with a status this version cannot read.
fn parent_of(row: &QueryResult) -> Option<(TaskId, TaskStatus)> {
    let task: i64 = row.try_get("", "parent_task").ok()?;
    let status: String = row.try_get("", "parent_status").ok()?;
    let status = serde_json::from_str(&status).ok()?;
    Some((u64::try_from(task).ok()?, status))
}
