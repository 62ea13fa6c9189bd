//! The periodic enqueuer: one task per pool, on the pool's runtime, that sleeps until the
//! next tick of any of its schedules and enqueues it (the rules are in [`super`]'s docs).
//!
//! It holds the pool's client weakly, so it never keeps a pool alive: it ends when the
//! client is gone, when the pool shuts down (the board is closed), or when a submission
//! answers that the pool stopped.

use std::sync::Arc;
use std::time::Duration;

use super::{Missed, Schedule, ScheduleBoard};
use crate::domain::PoolError;
use crate::engine::client::WeakPoolClient;
use crate::util::clock::now_ms;

/// Runs the enqueuer of the pool `client` until the pool is gone.
pub(crate) async fn run<P, R>(client: WeakPoolClient<P, R>, board: Arc<ScheduleBoard>)
where
    P: Send + 'static,
    R: Send + 'static,
{
    loop {
        if board.is_closed() {
            return;
        }
        let Some(pool) = client.upgrade() else {
            return;
        };
        for schedule in board.unstarted() {
            let (cursor_ms, now) = start_cursor(&pool, &schedule).await;
            board.start(&schedule.name, cursor_ms, now);
        }
        for (schedule, tick_ms) in board.take_due(millis_now()) {
            if !board.begin_tick() {
                return;
            }
            let enqueued = pool.enqueue_tick(&schedule, tick_ms).await;
            match &enqueued {
                Ok(true) => board.enqueued(&schedule.name, tick_ms),
                Ok(false) | Err(PoolError::Shutdown) => {}
                Err(error) => tracing::warn!(
                    pool = pool.name(),
                    schedule = %schedule.name,
                    tick_ms,
                    %error,
                    "a schedule's tick was not enqueued"
                ),
            }
            board.end_tick();
            if matches!(enqueued, Err(PoolError::Shutdown)) {
                return;
            }
        }
        let wake_ms = board.next_wake_ms();
        drop(pool);
        match wake_ms {
            Some(at_ms) => {
                let wait = Duration::from_millis(at_ms.saturating_sub(millis_now()));
                tokio::select! {
                    () = board.changed() => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
            None => board.changed().await,
        }
    }
}

/// Where a schedule starts (rule 4): on a queue of the pool's own, now; on a shared queue,
/// after the latest tick the fleet stored, less what the missed-tick policy skips. With the
/// time it was started at.
async fn start_cursor<P, R>(
    pool: &crate::engine::PoolClient<P, R>,
    schedule: &Schedule,
) -> (u64, u64)
where
    P: Send + 'static,
    R: Send + 'static,
{
    let stored = match pool.latest_tick(&schedule.name).await {
        Ok(stored) => stored,
        Err(error) => {
            tracing::warn!(
                pool = pool.name(),
                schedule = %schedule.name,
                %error,
                "could not read the schedule's latest tick; starting it from now"
            );
            None
        }
    };
    let now = millis_now();
    (cursor_after(schedule, stored, now), now)
}

/// The cursor of a schedule whose latest stored tick is `stored`, started at `now`.
fn cursor_after(schedule: &Schedule, stored: Option<u64>, now: u64) -> u64 {
    let Some(stored) = stored else {
        return now;
    };
    let missed = schedule
        .timing
        .latest_at_or_before(now)
        .is_some_and(|latest| latest > stored);
    match (missed, schedule.missed) {
        (true, Missed::Skip) => now,
        // The latest missed tick is then due at once, enqueued once for all of them.
        (true, Missed::RunOnce) | (false, _) => stored.min(now),
    }
}

fn millis_now() -> u64 {
    u64::try_from(now_ms()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Timing;

    fn every_second(missed: Missed) -> Schedule {
        Schedule::new("s", Timing::every(Duration::from_secs(1)).unwrap())
            .unwrap()
            .with_missed(missed)
    }

    #[test]
    fn a_schedule_no_node_ran_starts_now() {
        assert_eq!(
            cursor_after(&every_second(Missed::RunOnce), None, 10_500),
            10_500
        );
    }

    #[test]
    fn missed_ticks_are_skipped_or_run_once() {
        // Ticks 11_000 ..= 15_000 passed after the stored 10_000.
        let skip = every_second(Missed::Skip);
        assert_eq!(cursor_after(&skip, Some(10_000), 15_500), 15_500);
        let run_once = every_second(Missed::RunOnce);
        assert_eq!(cursor_after(&run_once, Some(10_000), 15_500), 10_000);
    }

    #[test]
    fn nothing_missed_continues_after_the_stored_tick() {
        let skip = every_second(Missed::Skip);
        assert_eq!(cursor_after(&skip, Some(15_000), 15_500), 15_000);
    }
}
