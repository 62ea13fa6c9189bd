//! The answers of group statements: one statement parks (or settles) many tasks, and each
//! task still gets an answer of its own, in order.

use std::collections::HashSet;

use sea_orm::QueryResult;

use super::codec::entry_to_sql;
use crate::core::{Claim, EntryId, QueueError, Settlement};

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
    settlements: Vec<(Claim, Settlement)>,
    failed: F,
    done: D,
) -> Vec<Result<(), QueueError>>
where
    F: Fn(Claim, Settlement) -> FailedFut,
    FailedFut: std::future::Future<Output = Result<(), QueueError>>,
    D: FnOnce(Vec<Claim>) -> DoneFut,
    DoneFut: std::future::Future<Output = Result<HashSet<i64>, QueueError>>,
{
    let mut settled = Vec::with_capacity(settlements.len());
    let mut ended_well = Vec::new();
    for (index, (claim, settlement)) in settlements.into_iter().enumerate() {
        match settlement {
            Settlement::Done => {
                ended_well.push((index, claim));
                settled.push(Ok(()));
            }
            settlement => settled.push(failed(claim, settlement).await),
        }
    }
    if !ended_well.is_empty() {
        let claims = ended_well.iter().map(|&(_, claim)| claim).collect();
        let ended = done(claims).await;
        let indexed = ended_well
            .into_iter()
            .map(|(index, claim)| (index, claim.entry))
            .collect();
        answer_group(&mut settled, indexed, ended, QueueError::NotClaimed);
    }
    settled
}
