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
pub fn engine_now_ms() -> u64 {
    u64::try_from(now_ms()).unwrap_or(u64::MAX)
}
