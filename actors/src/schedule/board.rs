//! The schedules of one pool and where each stands: what the periodic enqueuer reads to know
//! what is due, and what [`PoolControl`](crate::engine::PoolControl) lists, pauses and
//! resumes. Nothing here is generic, so the admin server reaches it through any pool.
//!
//! Each schedule keeps a *cursor*: every tick at or before it is handled (enqueued, folded
//! into a later one, skipped). A schedule not yet *started* has no cursor: the enqueuer
//! starts it first (asking a shared queue for the latest tick the fleet stored, rule 4).

use std::sync::Mutex;

use tokio::sync::Notify;

use super::{Schedule, ScheduleError, ScheduleView};

/// The schedules of one pool. Shared by the pool's control and its enqueuer.
#[derive(Debug, Default)]
pub(crate) struct ScheduleBoard {
    state: Mutex<BoardState>,
    /// Wakes the enqueuer when a schedule is added, paused or resumed, or the pool stops.
    changed: Notify,
    /// Wakes a stop that waits for the tick in flight.
    idle: Notify,
}

#[derive(Debug, Default)]
struct BoardState {
    entries: Vec<Entry>,
    /// The pool stopped: the enqueuer ends.
    closed: bool,
    /// The enqueuer is enqueuing a tick (between [`ScheduleBoard::begin_tick`] and
    /// [`ScheduleBoard::end_tick`]).
    busy: bool,
}

#[derive(Debug)]
struct Entry {
    schedule: Schedule,
    paused: bool,
    /// Every tick at or before it is handled; `None` until the enqueuer starts the schedule.
    cursor_ms: Option<u64>,
    /// When the enqueuer started it.
    started_ms: Option<u64>,
    last_enqueued_ms: Option<u64>,
    enqueued: u64,
}

impl Entry {
    fn next_tick_ms(&self) -> Option<u64> {
        if self.paused {
            return None;
        }
        self.schedule.timing.next_after(self.cursor_ms?)
    }
}

impl ScheduleBoard {
    /// Adds `schedule`, not yet started; `Duplicate` if its name is taken.
    pub(crate) fn add(&self, schedule: Schedule) -> Result<(), ScheduleError> {
        let mut state = self.lock();
        if state
            .entries
            .iter()
            .any(|e| e.schedule.name == schedule.name)
        {
            return Err(ScheduleError::Duplicate {
                name: schedule.name,
            });
        }
        state.entries.push(Entry {
            schedule,
            paused: false,
            cursor_ms: None,
            started_ms: None,
            last_enqueued_ms: None,
            enqueued: 0,
        });
        drop(state);
        self.changed.notify_one();
        Ok(())
    }

    /// Pauses or resumes schedule `name` (rule 5); `Unknown` if there is none. A resumed
    /// schedule's cursor moves to `now_ms`, so what passed during the pause is skipped.
    pub(crate) fn set_paused(
        &self,
        name: &str,
        paused: bool,
        now_ms: u64,
    ) -> Result<(), ScheduleError> {
        let mut state = self.lock();
        let entry = state
            .entries
            .iter_mut()
            .find(|e| e.schedule.name == name)
            .ok_or_else(|| ScheduleError::Unknown {
                name: name.to_owned(),
            })?;
        if entry.paused && !paused && entry.cursor_ms.is_some() {
            entry.cursor_ms = Some(now_ms);
        }
        entry.paused = paused;
        drop(state);
        self.changed.notify_one();
        Ok(())
    }

    /// The schedules as the admin API shows them, in the order they were added.
    pub(crate) fn views(&self) -> Vec<ScheduleView> {
        self.lock()
            .entries
            .iter()
            .map(|entry| ScheduleView {
                name: entry.schedule.name.clone(),
                expression: entry.schedule.timing.expression(),
                zone: entry.schedule.timing.zone().map(str::to_owned),
                missed: entry.schedule.missed,
                paused: entry.paused,
                next_tick_ms: entry.next_tick_ms().map(u128::from),
                started_ms: entry.started_ms.map(u128::from),
                last_enqueued_ms: entry.last_enqueued_ms.map(u128::from),
                enqueued: entry.enqueued,
            })
            .collect()
    }

    /// The schedules the enqueuer has not started yet.
    pub(crate) fn unstarted(&self) -> Vec<Schedule> {
        let state = self.lock();
        let unstarted = state.entries.iter().filter(|e| e.cursor_ms.is_none());
        unstarted.map(|e| e.schedule.clone()).collect()
    }

    /// Starts schedule `name` at `now_ms` with its cursor at `cursor_ms`.
    pub(crate) fn start(&self, name: &str, cursor_ms: u64, now_ms: u64) {
        let mut state = self.lock();
        let Some(entry) = state.entries.iter_mut().find(|e| e.schedule.name == name) else {
            return;
        };
        if entry.cursor_ms.is_none() {
            entry.cursor_ms = Some(cursor_ms);
            entry.started_ms = Some(now_ms);
        }
    }

    /// Takes the ticks due at `now_ms`: for each started, unpaused schedule with a tick in
    /// `(cursor, now]`, the latest such tick (rule 3); the cursors move to them.
    pub(crate) fn take_due(&self, now_ms: u64) -> Vec<(Schedule, u64)> {
        let mut state = self.lock();
        let mut due = Vec::new();
        for entry in state.entries.iter_mut().filter(|e| !e.paused) {
            let Some(cursor_ms) = entry.cursor_ms else {
                continue;
            };
            let Some(latest) = entry.schedule.timing.latest_at_or_before(now_ms) else {
                continue;
            };
            if latest > cursor_ms {
                entry.cursor_ms = Some(latest);
                due.push((entry.schedule.clone(), latest));
            }
        }
        due
    }

    /// Notes that this node enqueued tick `tick_ms` of schedule `name`.
    pub(crate) fn enqueued(&self, name: &str, tick_ms: u64) {
        let mut state = self.lock();
        if let Some(entry) = state.entries.iter_mut().find(|e| e.schedule.name == name) {
            entry.last_enqueued_ms = Some(tick_ms);
            entry.enqueued += 1;
        }
    }

    /// The earliest next tick of any started, unpaused schedule.
    pub(crate) fn next_wake_ms(&self) -> Option<u64> {
        self.lock()
            .entries
            .iter()
            .filter_map(Entry::next_tick_ms)
            .min()
    }

    /// Ends the enqueuer: the pool stopped. A tick in flight still finishes, and is
    /// counted ([`idle`](Self::idle) waits for it).
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_one();
    }

    /// The enqueuer is about to enqueue a tick: `false` once the pool stopped (it enqueues
    /// nothing more).
    pub(crate) fn begin_tick(&self) -> bool {
        let mut state = self.lock();
        state.busy = !state.closed;
        state.busy
    }

    /// The tick begun last is enqueued (and counted), or failed.
    pub(crate) fn end_tick(&self) {
        self.lock().busy = false;
        self.idle.notify_waiters();
    }

    /// Resolves once no tick is in flight: after [`close`](Self::close), when every tick
    /// this pool parked is counted in its views.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.lock().busy {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Resolves when the board changed since the enqueuer last waited (a change made while
    /// it was busy is kept for its next wait).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BoardState> {
        // The state is plain data updated in one step; a panic elsewhere cannot leave it half
        // written, so a poisoned lock's data is still good.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::schedule::Timing;

    fn every_second(name: &str) -> Schedule {
        Schedule::new(name, Timing::every(Duration::from_secs(1)).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_stop_waits_for_the_tick_in_flight_and_no_tick_begins_after_it() {
        let board = std::sync::Arc::new(ScheduleBoard::default());
        assert!(board.begin_tick());
        board.close();
        let waiting = tokio::spawn({
            let board = board.clone();
            async move { board.idle().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the tick in flight holds the stop");
        board.end_tick();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the stop goes on once the tick is counted")
            .unwrap();
        assert!(!board.begin_tick(), "a stopped board begins no tick");
        tokio::time::timeout(Duration::from_secs(5), board.idle())
            .await
            .expect("nothing in flight");
    }

    #[test]
    fn only_the_latest_due_tick_is_taken_and_the_cursor_moves_to_it() {
        let board = ScheduleBoard::default();
        board.add(every_second("a")).unwrap();
        assert!(board.take_due(10_500).is_empty(), "not started yet");
        board.start("a", 10_500, 10_500);
        assert_eq!(board.next_wake_ms(), Some(11_000));
        assert!(board.take_due(10_900).is_empty());
        let due = board.take_due(13_200);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].1, 13_000);
        assert!(board.take_due(13_900).is_empty());
    }

    #[test]
    fn a_paused_schedule_takes_nothing_and_skips_what_passed_when_resumed() {
        let board = ScheduleBoard::default();
        board.add(every_second("a")).unwrap();
        board.start("a", 10_000, 10_000);
        board.set_paused("a", true, 10_000).unwrap();
        assert!(board.take_due(15_000).is_empty());
        assert_eq!(board.next_wake_ms(), None);
        board.set_paused("a", false, 15_000).unwrap();
        assert!(
            board.take_due(15_500).is_empty(),
            "the pause's ticks are skipped"
        );
        assert_eq!(board.take_due(16_000)[0].1, 16_000);
        assert!(matches!(
            board.set_paused("b", true, 0),
            Err(ScheduleError::Unknown { .. })
        ));
    }

    #[test]
    fn a_name_is_taken_once() {
        let board = ScheduleBoard::default();
        board.add(every_second("a")).unwrap();
        assert!(matches!(
            board.add(every_second("a")),
            Err(ScheduleError::Duplicate { .. })
        ));
    }
}
