//! How the Postgres queues retry a run whose lease ran out: [`RetryPolicy`], and the SQL a
//! rescue statement computes it with, the same for both layouts.

use std::time::Duration;

use sea_orm::Value;

use super::codec::{duration_ms, millis_u64};
use super::named::Params;

/// How lost runs are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Claims a task may have; a lease that runs out on the last one dead-letters the task.
    pub max_attempts: u32,
    /// The backoff before the first retry; it doubles with every further attempt.
    pub base: Duration,
    /// The longest backoff.
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// Three attempts, one second doubling up to a minute.
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

/// The parameters of a rescue statement: `$queue`, `$now_ms`, and the policy's
/// `$max_attempts`, `$retry_base_ms` and `$retry_max_ms`.
pub(crate) struct RescueParams<'a> {
    /// The queue's name.
    pub queue: &'a str,
    /// Leases that ran out at or before this time are rescued.
    pub now_ms: u64,
    /// How the rescued runs are retried.
    pub retry: &'a RetryPolicy,
}

impl Params for RescueParams<'_> {
    fn value(&self, name: &str) -> Option<Value> {
        Some(match name {
            "queue" => self.queue.to_owned().into(),
            "now_ms" => millis_u64(self.now_ms).into(),
            "max_attempts" => i32::try_from(self.retry.max_attempts)
                .unwrap_or(i32::MAX)
                .into(),
            "retry_base_ms" => duration_ms(self.retry.base).into(),
            "retry_max_ms" => duration_ms(self.retry.max).into(),
            _ => return None,
        })
    }
}

/// The time (ms) a run of `attempts` claims so far may be claimed again: `$now_ms` plus the
/// backoff, `$retry_base_ms * 2^(attempts - 1)` capped at `$retry_max_ms`.
pub(crate) fn retry_at_sql(attempts: &str) -> String {
    format!(
        "$now_ms + LEAST($retry_max_ms::bigint, $retry_base_ms::bigint * \
         (1::bigint << LEAST(GREATEST({attempts} - 1, 0), 40)))"
    )
}

/// How a task whose every attempt lost its lease ended, for the children waiting on it: in
/// words (their reason), and as a `TaskStatus` in JSON (their events), both SQL text.
pub(crate) const GIVEN_UP: (&str, &str) = (
    "'was dead-lettered (its every attempt lost its lease)'",
    "jsonb_build_object('Failed', 'the shared queue gave up on the task: ' \
         || 'its every attempt lost its lease')::text",
);

/// Why a run was rescued, as the queue records it: the node whose lease ran out and the
/// attempt.
pub(crate) fn lease_ran_out_sql(node: &str, attempts: &str) -> String {
    format!(
        "'the lease of node ' || coalesce({node}, '?') || ' ran out (attempt ' || {attempts} || ')'"
    )
}
