//! What a pool does about tasks nobody waits for any more: a retrieve that gave up
//! ([`OnGiveUp`]), and a result stream nobody reads ([`DEFAULT_STREAM_IDLE_MS`]).

use serde::{Deserialize, Serialize};

/// What a retrieve that gives up (its wait ran out: `PoolError::Timeout`) does to the task
/// it waited for.
///
/// Two kinds of users want opposite things. A server that hands each request's result to
/// one live caller (an LLM server whose result is a channel of tokens) has nobody left once
/// that caller's wait times out: running the task then only burns capacity, and a stream in
/// its result would be generated for nobody. A service whose clients come back later for
/// their results (by a key they named, from a durable mailbox) wants the task to run and its
/// result to wait. The pool tells them apart by the key and the mailbox:
///
/// - Only a task whose key **the pool made** (it was submitted without a mailbox key, so the
///   key `submit` returned is the only way to its result) can be abandoned. A key the caller
///   named says the caller can come back by that name: such tasks are always kept.
/// - A pool that does not say (`None` in [`PoolLimits::on_give_up`](super::PoolLimits))
///   abandons where its mailbox keeps results in this process's memory, which nobody else
///   reads ([`Abandon`](Self::Abandon)), and keeps them where the mailbox is durable
///   ([`Keep`](Self::Keep)).
///
/// ```
/// use prometheus_parking_lot_actors::domain::{OnGiveUp, PoolLimits};
///
/// let limits = PoolLimits::new(8, 2).with_on_give_up(Some(OnGiveUp::Keep));
/// assert_eq!(limits.on_give_up, Some(OnGiveUp::Keep));
/// assert_eq!(OnGiveUp::for_mailbox(None, true), OnGiveUp::Abandon);
/// assert_eq!(OnGiveUp::for_mailbox(None, false), OnGiveUp::Keep);
/// assert_eq!(OnGiveUp::for_mailbox(Some(OnGiveUp::Keep), true), OnGiveUp::Keep);
/// ```
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnGiveUp {
    /// The task carries on: it runs when it fits, and its result waits for a later retrieve
    /// (until the mailbox's retention drops it).
    Keep,
    /// A task under a key the pool made is abandoned: parked, it ends at once (`Cancelled`,
    /// never started, its units never taken); running, its cancellation flag is raised and
    /// whatever it returns is dropped instead of stored, so a channel inside its result
    /// closes and the code feeding it sees its next send fail. Nothing is stored for it: a
    /// later retrieve of its key is told there is nothing to retrieve.
    Abandon,
}

impl OnGiveUp {
    /// The rule a pool follows: `chosen` if set, else what fits its mailbox (`Abandon` for
    /// one in this process's memory, `Keep` for a durable one).
    pub fn for_mailbox(chosen: Option<OnGiveUp>, in_memory: bool) -> OnGiveUp {
        chosen.unwrap_or(if in_memory {
            OnGiveUp::Abandon
        } else {
            OnGiveUp::Keep
        })
    }
}

/// How long a streamed task's full buffer may go unread, ms, unless the pool says otherwise
/// ([`PoolLimits::stream_idle_ms`](super::PoolLimits)): five minutes, far longer than a
/// reader that is still there pauses between tokens.
pub const DEFAULT_STREAM_IDLE_MS: u64 = 300_000;

/// The longest a pool may let a full stream go unread, ms: a day.
pub const MAX_STREAM_IDLE_MS: u64 = 86_400_000;
