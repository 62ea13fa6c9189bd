//! Handing a taken result to the caller that asked for it, or putting it back.
//!
//! A take deletes its row and returns it in one statement, so the row is gone from the table
//! before the caller sees it. A caller that stops waiting meanwhile (its retrieve timed out
//! and was dropped, a `select!` took another branch) would lose that result for good. So no
//! take runs in its caller's future: it runs on the database's runtime and hands each row
//! over through a channel ([`handed_over`]). A row that never reaches its caller is inserted
//! again as it was (same id, so it keeps its place among its key's results), and its key's
//! waiters are woken, whichever side finds the caller gone:
//!
//! - the taker, when the caller left before the row was sent ([`hand_over`]);
//! - the caller's end of the channel, when it is dropped with the row sent but unread
//!   ([`Handed`]'s `Drop`).

use sea_orm::{ConnectionTrait, QueryResult};
use tokio::sync::oneshot;

use crate::core::MailboxError;
use crate::infra::postgres::{Identifier, PgDatabase};
use crate::util::serde::MailboxKey;

use super::failed;
use super::stored::column;
use super::waiters::key_hash;

/// The column a take returns beside the delivery's: the whole row as JSON, to put it back.
pub(super) const WHOLE_ROW: &str = "whole_row";

/// What a take answers its caller: the row it took, if any.
pub(super) type Taken = Result<Option<QueryResult>, MailboxError>;

/// Where a taken row goes back to: its table, and the key whose waiters are woken.
#[derive(Clone)]
pub(super) struct Home {
    pub(super) database: PgDatabase,
    pub(super) table: Identifier,
    pub(super) key: MailboxKey,
}

/// The caller's end of a take: the row, once taken. Dropped with a row sent but unread, it
/// puts the row back.
pub(super) struct Handed {
    answered: oneshot::Receiver<Taken>,
    home: Home,
}

/// The taker's end of a take, and the caller's.
pub(super) fn handed_over(home: Home) -> (oneshot::Sender<Taken>, Handed) {
    let (answer, answered) = oneshot::channel();
    (answer, Handed { answered, home })
}

impl Handed {
    /// The row the take answered; `None` when the taker stopped without answering.
    pub(super) async fn received(&mut self) -> Option<Taken> {
        (&mut self.answered).await.ok()
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Ok(Ok(Some(row))) = self.answered.try_recv() {
            let home = self.home.clone();
            self.home
                .database
                .spawn(async move { put_back(&home, &row).await });
        }
    }
}

/// Sends `taken` to its caller; when the caller has left, puts its row back.
pub(super) async fn hand_over(home: &Home, answer: oneshot::Sender<Taken>, taken: Taken) {
    if let Err(Ok(Some(row))) = answer.send(taken) {
        put_back(home, &row).await;
    }
}

/// Inserts `row`'s [`WHOLE_ROW`] again (unless a row with its id exists) and wakes its key's
/// waiters; says so in the log if it cannot.
async fn put_back(home: &Home, row: &QueryResult) {
    let Home {
        database,
        table,
        key,
    } = home;
    let inserted = async {
        let whole: String = column(row, WHOLE_ROW)?;
        let sql = format!(
            "INSERT INTO {table} SELECT * FROM jsonb_populate_record(NULL::{table}, $1::jsonb) \
             ON CONFLICT (id) DO NOTHING"
        );
        database
            .connection()
            .execute_raw(PgDatabase::statement(sql, [whole.into()]))
            .await
            .map_err(failed("put back"))
    };
    match inserted.await {
        Ok(_) => database.announce(table.as_str(), format!("{:x}", key_hash(key))),
        Err(error) => tracing::error!(
            table = %table,
            tenant = %key.tenant.0,
            %error,
            "a taken result whose caller left could not be put back"
        ),
    }
}
