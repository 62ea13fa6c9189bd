//! [`PoolClient::add_schedule`]: periodic tasks on a pool, and how one tick becomes a task
//! (see [`crate::schedule`]).

use std::sync::Arc;

use super::PoolClient;
use crate::domain::{BackendError, PoolError, ScheduledTask, TaskMetadata};
use crate::queue::capabilities::lacking;
use crate::queue::QueueError;
use crate::schedule::{Schedule, Tick};
use crate::scheduler::shell::storage::shared::SharedRoom;
use crate::util::contain::drop_contained;

/// Makes the payload of a schedule's tick, or says why it cannot.
pub(crate) type PayloadFn<P> = Arc<dyn Fn(&Tick) -> Result<P, String> + Send + Sync>;

impl<P, R> PoolClient<P, R>
where
    P: Send + 'static,
    R: Send + 'static,
{
    /// Adds a periodic task: at each tick of `schedule` the pool enqueues a task with the
    /// schedule's metadata and the payload `payload` makes for that tick. On a queue several
    /// nodes share, each tick is enqueued once in the fleet, however many nodes carry the
    /// schedule (give it to every node, under the same name). `InvalidConfig` when the pool
    /// has a schedule of that name already.
    ///
    /// ```
    /// # use prometheus_parking_lot_actors::engine::PoolClient;
    /// use prometheus_parking_lot_actors::schedule::{Schedule, Timing};
    /// # fn add(pool: &PoolClient<String, String>) -> Result<(), Box<dyn std::error::Error>> {
    /// let nightly = Schedule::new("reindex", Timing::cron("0 2 * * *", "Europe/Paris")?)?;
    /// pool.add_schedule(nightly, |tick| format!("reindex as of {}", tick.at_ms))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn add_schedule(
        &self,
        schedule: Schedule,
        payload: impl Fn(&Tick) -> P + Send + Sync + 'static,
    ) -> Result<(), PoolError> {
        self.add_payload_maker(schedule, Arc::new(move |tick| Ok(payload(tick))))
    }

    /// [`add_schedule`](Self::add_schedule) with every tick's payload read from `payload`
    /// (what a configuration file gives). `InvalidConfig` when it does not read as `P`.
    ///
    /// ```
    /// # use prometheus_parking_lot_actors::engine::PoolClient;
    /// use std::time::Duration;
    /// use prometheus_parking_lot_actors::schedule::{Schedule, Timing};
    /// # fn add(pool: &PoolClient<String, String>) -> Result<(), Box<dyn std::error::Error>> {
    /// let heartbeat = Schedule::new("heartbeat", Timing::every(Duration::from_secs(30))?)?;
    /// pool.add_schedule_json(heartbeat, serde_json::json!("ping"))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn add_schedule_json(
        &self,
        schedule: Schedule,
        payload: serde_json::Value,
    ) -> Result<(), PoolError>
    where
        P: serde::de::DeserializeOwned,
    {
        let read = |value: serde_json::Value| {
            serde_json::from_value::<P>(value).map_err(|error| {
                format!("its payload does not read as the pool's payload type: {error}")
            })
        };
        if let Err(problem) = read(payload.clone()) {
            return Err(PoolError::InvalidConfig(format!(
                "pool {:?}, schedule {:?}: {problem}",
                self.name(),
                schedule.name
            )));
        }
        self.add_payload_maker(schedule, Arc::new(move |_| read(payload.clone())))
    }

    fn add_payload_maker(&self, schedule: Schedule, make: PayloadFn<P>) -> Result<(), PoolError> {
        let name = schedule.name.clone();
        let mut makers = self.payload_makers();
        if makers.contains_key(&name) {
            return Err(self
                .control()
                .schedule_error(crate::schedule::ScheduleError::Duplicate { name }));
        }
        self.control()
            .schedule_board()
            .add(schedule)
            .map_err(|error| self.control().schedule_error(error))?;
        makers.insert(name, make);
        Ok(())
    }

    /// Enqueues tick `tick_ms` of `schedule`: submitted on a queue of the pool's own, parked
    /// under the tick's key on a shared one. Whether this node enqueued it (`false`: another
    /// node did, or the schedule is gone).
    pub(crate) async fn enqueue_tick(
        &self,
        schedule: &Schedule,
        tick_ms: u64,
    ) -> Result<bool, PoolError> {
        let tick = Tick {
            schedule: schedule.name.clone(),
            at_ms: u128::from(tick_ms),
        };
        let Some(make) = self.payload_makers().get(&schedule.name).cloned() else {
            return Ok(false);
        };
        let meta = TaskMetadata {
            id: tick.task_id(),
            mailbox: Some(schedule.mailbox.clone()),
            priority: schedule.priority,
            cost: schedule.cost,
            deadline_ms: None,
            created_at_ms: crate::util::clock::now_ms(),
        };
        let payload = make(&tick).map_err(|problem| {
            PoolError::InvalidConfig(format!(
                "pool {:?}, schedule {:?}: {problem}",
                self.name(),
                tick.schedule
            ))
        })?;
        let task = ScheduledTask::new(meta, payload);
        let Some(queue) = &self.inner.shared_queue else {
            return self.submit_tick(task).await.map(|_| true);
        };
        let entry = SharedRoom::entry_for(0);
        let parked = match queue.schedule_ticks() {
            Some(ticks) => {
                ticks
                    .enqueue_tick(&tick.schedule, tick_ms, entry, task)
                    .await
            }
            None => {
                drop_contained(task);
                Err(lacking(
                    &**queue,
                    "enqueue a schedule's tick once for the nodes that share it",
                ))
            }
        };
        parked.map_err(|error| self.tick_error(queue.backend(), "enqueue a tick", error))
    }

    /// The latest tick of schedule `name` the pool's shared queue holds; `None` on a queue
    /// of the pool's own (which remembers no tick across starts).
    pub(crate) async fn latest_tick(&self, name: &str) -> Result<Option<u64>, PoolError> {
        let Some(queue) = &self.inner.shared_queue else {
            return Ok(None);
        };
        let Some(ticks) = queue.schedule_ticks() else {
            return Ok(None);
        };
        let latest = ticks.latest_tick(name).await;
        latest.map_err(|error| {
            self.tick_error(queue.backend(), "read a schedule's latest tick", error)
        })
    }

    fn payload_makers(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, PayloadFn<P>>> {
        // A map updated in one step: a poisoned lock's data is still whole.
        self.inner
            .payload_makers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tick_error(&self, backend: &str, operation: &str, error: QueueError) -> PoolError {
        let fault = crate::queue::actor::fault_of(error);
        PoolError::from(BackendError::new(
            self.name(),
            format!("{backend} queue"),
            operation,
            fault,
        ))
    }
}
