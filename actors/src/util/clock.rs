//! Wall-clock reads.
//!
//! The scheduling core never reads a clock: callers pass `now` in. This module is where the
//! runtime (and `TaskMetadata::new`) get that `now` from.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
///
/// A clock set before 1970 reads as `0` rather than panicking.
///
/// ```
/// let now = prometheus_parking_lot_actors::util::clock::now_ms();
/// assert!(now > 1_600_000_000_000);
/// ```
pub fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis())
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch as the engine counts them (`u64`, which lasts half a
/// billion years; a later reading saturates).
///
/// Two widths, one line between them: the scheduling core and the queue backends count
/// in `u64` (what a database's `BIGINT` holds); every instant a caller sets or reads (a
/// task's `deadline_ms`, an event's `at_ms`, a refusal's `estimated_start_ms`, a view's
/// `expected_start_ms`) is a `u128`, as [`now_ms`] gives it, so a caller compares them
/// without a cast.
pub fn engine_now_ms() -> u64 {
    engine_ms(now_ms())
}

/// An instant a caller gave (`u128`) as the engine counts it, saturating.
pub fn engine_ms(ms: u128) -> u64 {
    u64::try_from(ms).unwrap_or(u64::MAX)
}
