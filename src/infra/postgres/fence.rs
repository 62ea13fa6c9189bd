//! Fencing: a result is stored only by the run that still holds its task's claim.
//!
//! A node whose lease ran out (a long pause, a partition) may still finish the run another
//! node took over meanwhile. Its result must not be published. A [`ClaimFence`] carries a
//! shared queue's settle statements to the [`PostgresMailbox`] of the same database, which
//! then ends each claim and stores its result in one transaction: the settle names the claim
//! (its entry *and* its claim count, the fencing token), so a claim that was rescued and
//! claimed again settles nothing, and its result is not stored. Both happen, or neither.
//!
//! [`PostgresMailbox`]: crate::infra::postgres::mailbox::PostgresMailbox

use std::collections::HashSet;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, Value};

use super::codec::entries_to_sql;
use super::groups::returned_entries;
use super::named::NamedSql;
use super::PgDatabase;
use crate::core::TaskStatus;
use crate::core::{Claim, EntryId, Settlement};

/// A shared queue's way of ending claims inside another statement's transaction: see the
/// module docs. Made by [`PgQueue::fence`](super::PgQueue::fence); given to
/// [`PostgresMailbox::settling_claims_of`](crate::infra::postgres::mailbox::PostgresMailbox::settling_claims_of).
#[derive(Clone)]
pub struct ClaimFence {
    pub(crate) database: PgDatabase,
    queue: String,
    settle_done: NamedSql,
    settle_failed: NamedSql,
    settle_ended: NamedSql,
}

impl std::fmt::Debug for ClaimFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimFence")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

/// The values that name `node`'s `claims` of queue `queue` in a settle or a release:
/// `$queue`, `$entries`, `$attempts`, `$node`.
pub(crate) fn claim_values(
    queue: &str,
    node: &str,
    claims: &[Claim],
) -> Vec<(&'static str, Value)> {
    let (entries, attempts): (Vec<EntryId>, Vec<String>) = claims
        .iter()
        .map(|claim| (claim.entry, claim.attempt.to_string()))
        .unzip();
    vec![
        ("queue", queue.to_owned().into()),
        ("entries", entries_to_sql(&entries).into()),
        ("attempts", format!("{{{}}}", attempts.join(",")).into()),
        ("node", node.to_owned().into()),
    ]
}

/// The values of a settle of runs that ended `status` without succeeding: `$status` (the
/// status in JSON, what a child named later is refused with) and `$why` (the reason the
/// children waiting on them are cancelled with).
pub(crate) fn ended_values(status: &TaskStatus) -> [(&'static str, Value); 2] {
    let why = crate::core::parent_ended_words(status);
    let json = serde_json::to_string(status).unwrap_or_else(|_| "\"Cancelled\"".into());
    [("status", json.into()), ("why", why.into())]
}

impl ClaimFence {
    /// A fence of `queue`'s claims with its settle statements: done, failed, ended.
    pub(crate) fn new(
        database: PgDatabase,
        queue: String,
        [settle_done, settle_failed, settle_ended]: [NamedSql; 3],
    ) -> Self {
        Self {
            database,
            queue,
            settle_done,
            settle_failed,
            settle_ended,
        }
    }

    /// Ends `node`'s `claims` inside `transaction`, each with its settlement; returns the
    /// entries (as stored) whose claims `node` still held and that are now ended.
    pub(crate) async fn settle_in(
        &self,
        transaction: &DatabaseTransaction,
        node: &str,
        claims: &[(Claim, Settlement)],
    ) -> Result<HashSet<i64>, DbErr> {
        let done: Vec<Claim> = claims
            .iter()
            .filter(|(_, settlement)| *settlement == Settlement::Done)
            .map(|(claim, _)| *claim)
            .collect();
        let mut settled = HashSet::with_capacity(claims.len());
        if !done.is_empty() {
            let params = claim_values(&self.queue, node, &done);
            settled.extend(self.run(transaction, &self.settle_done, &params).await?);
        }
        for (claim, settlement) in claims {
            let mut params = claim_values(&self.queue, node, &[*claim]);
            let sql = match settlement {
                Settlement::Done => continue,
                Settlement::Failed(reason) => {
                    params.push(("reason", reason.clone().into()));
                    &self.settle_failed
                }
                Settlement::Ended(status) => {
                    params.extend(ended_values(status));
                    &self.settle_ended
                }
            };
            settled.extend(self.run(transaction, sql, &params).await?);
        }
        Ok(settled)
    }

    async fn run(
        &self,
        transaction: &DatabaseTransaction,
        sql: &NamedSql,
        params: &[(&'static str, Value)],
    ) -> Result<HashSet<i64>, DbErr> {
        let values = sql.bind(params).map_err(DbErr::Custom)?;
        let rows = transaction
            .query_all_raw(PgDatabase::statement(sql.text().to_owned(), values))
            .await?;
        Ok(returned_entries(&rows))
    }
}
