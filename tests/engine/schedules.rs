//! Periodic tasks in memory: a schedule's ticks become tasks with its metadata, a pause stops
//! them and a resume starts them again, and bad schedules are refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::schedule::{Schedule, Tick, Timing};
use prometheus_parking_lot::{MailboxKey, Priority, ResourceCost, WorkerPoolConfig};

use crate::support::eventually;

/// Records each task it runs: its payload and metadata.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<(String, TaskMetadata)>>>);

impl Runs {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn all(&self) -> Vec<(String, TaskMetadata)> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl WorkerExecutor<String, ()> for Runs {
    async fn execute(&self, payload: String, meta: TaskMetadata) {
        self.0.lock().unwrap().push((payload, meta));
    }
}

fn pool(runs: &Runs) -> WorkerPool<String, (), Runs> {
    WorkerPool::new(
        WorkerPoolConfig::new()
            .with_worker_count(2)
            .with_max_units(8),
        runs.clone(),
    )
    .expect("the pool starts")
}

fn every(ms: u64) -> Timing {
    Timing::every(Duration::from_millis(ms)).expect("a valid period")
}

fn enqueued(pool: &WorkerPool<String, (), Runs>, name: &str) -> u64 {
    let views = pool.schedules();
    views
        .iter()
        .find(|v| v.name == name)
        .expect("listed")
        .enqueued
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tick_becomes_a_task_with_the_schedules_metadata_and_its_payload() {
    let runs = Runs::default();
    let pool = pool(&runs);
    let schedule = Schedule::new("heartbeat", every(100))
        .unwrap()
        .with_priority(Priority::High)
        .with_cost(ResourceCost::cpu(2))
        .with_mailbox(MailboxKey::new("ops"));
    pool.add_schedule(schedule, |tick: &Tick| {
        format!("{}@{}", tick.schedule, tick.at_ms)
    })
    .unwrap();
    eventually("three ticks ran", || runs.count() >= 3).await;
    pool.shutdown();
    let all = runs.all();
    let mut ticks = Vec::new();
    for (payload, meta) in &all {
        let at_ms: u128 = payload.strip_prefix("heartbeat@").unwrap().parse().unwrap();
        assert_eq!(at_ms % 100, 0, "ticks fall on multiples of the period");
        let tick = Tick {
            schedule: "heartbeat".into(),
            at_ms,
        };
        assert_eq!(meta.id, tick.task_id());
        assert_eq!(meta.priority, Priority::High);
        assert_eq!(meta.cost, ResourceCost::cpu(2));
        assert_eq!(meta.mailbox.as_ref().unwrap().tenant, "ops");
        ticks.push(at_ms);
    }
    let mut distinct = ticks.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ticks.len(), "no tick ran twice: {ticks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_schedule_enqueues_nothing_until_resumed() {
    let runs = Runs::default();
    let pool = pool(&runs);
    pool.add_schedule(Schedule::new("tick", every(100)).unwrap(), |_| "x".into())
        .unwrap();
    eventually("a tick was enqueued", || enqueued(&pool, "tick") >= 1).await;
    pool.pause_schedule("tick").unwrap();
    let view = pool.schedules().remove(0);
    assert!(view.paused);
    assert_eq!(view.next_tick_ms, None);
    // A tick being submitted as the pause came lands within this wait.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let paused_at = enqueued(&pool, "tick");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(enqueued(&pool, "tick"), paused_at, "no tick while paused");
    pool.resume_schedule("tick").unwrap();
    assert!(!pool.schedules()[0].paused);
    eventually("ticks again after the resume", || {
        enqueued(&pool, "tick") >= paused_at + 2
    })
    .await;
    eventually("every enqueued tick ran", || {
        runs.count() as u64 >= paused_at + 2
    })
    .await;
    pool.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_expression_with_seconds_ticks_every_second() {
    let runs = Runs::default();
    let pool = pool(&runs);
    let timing = Timing::cron("* * * * * *", "Europe/Paris").unwrap();
    pool.add_schedule(Schedule::new("each-second", timing).unwrap(), |_| {
        "s".into()
    })
    .unwrap();
    let view = pool.schedules().remove(0);
    assert_eq!(view.expression, "* * * * * *");
    assert_eq!(view.zone.as_deref(), Some("Europe/Paris"));
    eventually("two per-second ticks ran", || runs.count() >= 2).await;
    pool.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_schedule_of_one_name_and_an_unknown_name_are_refused() {
    let runs = Runs::default();
    let pool = pool(&runs);
    pool.add_schedule(Schedule::new("a", every(60_000)).unwrap(), |_| "a".into())
        .unwrap();
    let again = pool.add_schedule(Schedule::new("a", every(1_000)).unwrap(), |_| "b".into());
    assert!(
        matches!(&again, Err(PoolError::InvalidConfig(text)) if text.contains("already has a schedule named \"a\"")),
        "{again:?}"
    );
    let unknown = pool.pause_schedule("b");
    assert!(
        matches!(&unknown, Err(PoolError::InvalidConfig(text)) if text.contains("no schedule named \"b\"")),
        "{unknown:?}"
    );
    assert_eq!(pool.schedules().len(), 1);
    pool.shutdown();
}

#[test]
fn bad_expressions_zones_periods_and_names_are_refused() {
    let cron = Timing::cron("61 * * * *", "UTC").unwrap_err().to_string();
    assert!(
        cron.contains("\"61 * * * *\" is not a cron expression"),
        "{cron}"
    );
    assert!(cron.contains("five fields"), "{cron}");
    let zone = Timing::cron("0 2 * * *", "Paris").unwrap_err().to_string();
    assert!(
        zone.contains("\"Paris\" is not a known time zone"),
        "{zone}"
    );
    let period = Timing::every(Duration::from_millis(10))
        .unwrap_err()
        .to_string();
    assert!(period.contains("too short"), "{period}");
    let name = Schedule::new("no spaces", every(1_000))
        .unwrap_err()
        .to_string();
    assert!(name.contains("not a schedule name"), "{name}");
}
