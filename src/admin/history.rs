//! What the admin server remembers of a pool's recent past, gathered from its event feed by
//! a listener of its own: the latest refusals, per second the tasks started and ended and
//! their mean wait, for the dashboard's charts, and the kinds its tasks have used.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;

use crate::core::PoolControl;
use crate::util::serde::{ResourceKind, TaskId};
use prometheus_parking_lot_actors::domain::TaskStatus;
use prometheus_parking_lot_actors::observe::events::{FeedEvent, TaskStep};
use prometheus_parking_lot_actors::util::clock::engine_ms;

/// Refusals kept, the latest.
pub(crate) const REFUSALS_KEPT: usize = 100;
/// Seconds of history kept: 10 minutes.
pub(crate) const SECONDS_KEPT: usize = 600;

/// A refusal as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RefusalRecord {
    pub task_id: TaskId,
    pub tenant: String,
    pub reason: &'static str,
    pub at_ms: u64,
}

/// One second of a pool's life.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Second {
    /// The second, ms since the Unix epoch (a multiple of 1,000).
    pub at_ms: u64,
    /// Tasks that started in it.
    pub started: u64,
    /// Tasks that ended in it, and of those the ones that did not complete.
    pub ended: u64,
    pub failed: u64,
    /// The mean wait (admission to start) of the tasks that started in it, ms.
    pub mean_wait_ms: f64,
    #[serde(skip)]
    wait_sum_ms: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub refusals: VecDeque<RefusalRecord>,
    pub seconds: VecDeque<Second>,
    /// Events the listener missed because it fell behind the feed.
    pub missed: u64,
    /// Whether a task of each kind (by [`ResourceKind::index`]) has started since the
    /// listener began.
    pub kinds_used: [bool; ResourceKind::COUNT],
}

impl History {
    /// Starts a listener on `pool`'s events (on the current runtime) and returns what it
    /// gathers.
    pub fn listen(pool: &PoolControl) -> Arc<Mutex<Self>> {
        let history = Arc::new(Mutex::new(Self::default()));
        let mut events = pool.events();
        let gathered = Arc::downgrade(&history);
        tokio::spawn(async move {
            loop {
                let event = events.recv().await;
                let Some(history) = gathered.upgrade() else {
                    return;
                };
                let mut history = history.lock().unwrap_or_else(PoisonError::into_inner);
                match event {
                    Ok(event) => history.note(&event),
                    Err(RecvError::Lagged(missed)) => history.missed += missed,
                    Err(RecvError::Closed) => return,
                }
            }
        });
        history
    }

    /// Takes note of one event.
    pub fn note(&mut self, event: &FeedEvent) {
        let at_ms = engine_ms(event.at_ms);
        match &event.step {
            TaskStep::Refused(refusal) => {
                if self.refusals.len() == REFUSALS_KEPT {
                    self.refusals.pop_front();
                }
                self.refusals.push_back(RefusalRecord {
                    task_id: event.task_id,
                    tenant: event.key.tenant.0.clone(),
                    reason: refusal.label(),
                    at_ms,
                });
            }
            TaskStep::Started => {
                self.kinds_used[event.cost.kind.index()] = true;
                let wait = event
                    .since_ms
                    .map_or(0, |since| at_ms.saturating_sub(engine_ms(since)));
                let second = self.second(at_ms);
                second.started += 1;
                second.wait_sum_ms += wait;
                second.mean_wait_ms = second.wait_sum_ms as f64 / second.started as f64;
            }
            TaskStep::Ended(status) => {
                let second = self.second(at_ms);
                second.ended += 1;
                if *status != TaskStatus::Completed {
                    second.failed += 1;
                }
            }
            _ => {}
        }
    }

    /// The record of the second `at_ms` falls in, made if new (an event of a second long
    /// gone, out of order, goes to the oldest kept).
    fn second(&mut self, at_ms: u64) -> &mut Second {
        let at_ms = at_ms - at_ms % 1_000;
        let newest = self.seconds.back().map(|second| second.at_ms);
        if newest.is_none_or(|newest| at_ms > newest) {
            if self.seconds.len() == SECONDS_KEPT {
                self.seconds.pop_front();
            }
            self.seconds.push_back(Second {
                at_ms,
                ..Second::default()
            });
        }
        let index = self
            .seconds
            .iter()
            .rposition(|second| second.at_ms <= at_ms)
            .unwrap_or(0);
        &mut self.seconds[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::serde::{MailboxKey, ResourceCost};
    use prometheus_parking_lot_actors::observe::events::Refusal;

    fn event(step: TaskStep, at_ms: u64, since_ms: Option<u64>) -> FeedEvent {
        FeedEvent {
            task_id: 1,
            key: MailboxKey::new("acme"),
            cost: ResourceCost::cpu(1),
            step,
            at_ms: u128::from(at_ms),
            since_ms: since_ms.map(u128::from),
            priority: None,
        }
    }

    #[test]
    fn seconds_count_starts_ends_and_the_mean_wait() {
        let mut history = History::default();
        history.note(&event(TaskStep::Started, 10_100, Some(10_000)));
        history.note(&event(TaskStep::Started, 10_900, Some(10_600)));
        history.note(&event(TaskStep::Ended(TaskStatus::Completed), 11_000, None));
        history.note(&event(TaskStep::Ended(TaskStatus::TimedOut), 11_500, None));
        history.note(&event(TaskStep::Refused(Refusal::QueueFull), 11_600, None));
        let seconds: Vec<_> = history
            .seconds
            .iter()
            .map(|s| (s.at_ms, s.started, s.ended, s.failed, s.mean_wait_ms))
            .collect();
        assert_eq!(seconds, [(10_000, 2, 0, 0, 200.0), (11_000, 0, 2, 1, 0.0)]);
        assert_eq!(history.refusals[0].reason, "queue_full");
        assert_eq!(history.kinds_used, [true, false, false, false], "cpu only");
    }

    #[test]
    fn only_the_latest_refusals_and_seconds_are_kept() {
        let mut history = History::default();
        for at in 0..(SECONDS_KEPT as u64 + 5) {
            history.note(&event(TaskStep::Started, at * 1_000, None));
            history.note(&event(
                TaskStep::Refused(Refusal::Shutdown),
                at * 1_000,
                None,
            ));
        }
        assert_eq!(history.seconds.len(), SECONDS_KEPT);
        assert_eq!(history.seconds[0].at_ms, 5_000);
        assert_eq!(history.refusals.len(), REFUSALS_KEPT);
    }
}
