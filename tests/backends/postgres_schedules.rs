//! Periodic tasks on the shared Postgres queues, in one process: two pools on one queue park
//! each tick once between them, and ticks missed while no pool ran follow the schedule's
//! policy. (Three node processes: `tests/postgres_schedules.rs`.)

use std::time::Duration;

use prometheus_parking_lot::SchedulerConfig;

use crate::postgres_pools::{build_embedded, fresh_name, server_url};

/// The backends a schedule runs on here.
fn backends() -> Vec<&'static str> {
    let mut backends = vec!["postgres"];
    if cfg!(feature = "pgmq") {
        backends.push("postgres_pgmq");
    }
    backends
}

/// One pool, `p`, on queue `queue` of `backend`, with schedule `beat` every 200 ms.
fn config(backend: &str, queue: &str, missed: &str) -> SchedulerConfig {
    let config = serde_json::json!({
        "database_url": server_url(),
        "pools": { "p": {
            "worker_threads": 1,
            "max_units": 4,
            "queue": { "type": backend, "queue_name": queue },
            "mailbox": { "storage": { "type": "in_memory" }, "retention_secs": 5 },
            "schedules": [{ "name": "beat", "every_ms": 200, "missed": missed,
                            "payload": { "n": 1, "ms": 0 } }]
        } }
    });
    SchedulerConfig::from_json_str(&config.to_string()).expect("a valid config")
}

/// The ticks of `beat` the database holds for `queue`, in order.
async fn ticks(queue: &str) -> Vec<i64> {
    use sea_orm::ConnectionTrait;
    let connection = sea_orm::Database::connect(server_url())
        .await
        .expect("connect");
    let rows = connection
        .query_all_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!(
                "SELECT tick_ms FROM pl_schedule_ticks \
                  WHERE place LIKE '% {queue}' AND schedule = 'beat' ORDER BY tick_ms"
            ),
        ))
        .await
        .unwrap_or_default();
    let _ = connection.close().await;
    rows.iter()
        .map(|row| row.try_get::<i64>("", "tick_ms").expect("a tick"))
        .collect()
}

/// Polls the ticks of `queue` until `enough` holds (fails after 20 s).
async fn ticks_until(queue: &str, what: &str, enough: impl Fn(&[i64]) -> bool) -> Vec<i64> {
    for _ in 0..200 {
        let held = ticks(queue).await;
        if enough(&held) {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within 20 s: {what}; ticks {:?}", ticks(queue).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_on_one_queue_park_each_tick_once_between_them() {
    for backend in backends() {
        let queue = fresh_name("sched_two");
        let first = build_embedded(config(backend, &queue, "skip")).await;
        let second = build_embedded(config(backend, &queue, "skip")).await;
        ticks_until(&queue, "five ticks", |ticks| ticks.len() >= 5).await;
        let (a, b) = (&first.pools["p"], &second.pools["p"]);
        a.shutdown_with_drain(Duration::from_secs(5)).await.unwrap();
        b.shutdown_with_drain(Duration::from_secs(5)).await.unwrap();
        let held = ticks(&queue).await;
        let enqueued = a.schedules()[0].enqueued + b.schedules()[0].enqueued;
        assert_eq!(
            enqueued,
            held.len() as u64,
            "{backend}: each tick the database holds was parked by exactly one pool"
        );
        // Both pools tried every tick: more ticks passed than either pool parked alone.
        let most = a.schedules()[0].enqueued.max(b.schedules()[0].enqueued);
        assert!(most <= enqueued, "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_missed_while_no_pool_ran_are_run_once_or_skipped() {
    for backend in backends() {
        for (missed, expected) in [("run_once", 1), ("skip", 0)] {
            let queue = fresh_name("sched_missed");
            let before = build_embedded(config(backend, &queue, missed)).await;
            ticks_until(&queue, "a first tick", |ticks| !ticks.is_empty()).await;
            before.pools["p"]
                .shutdown_with_drain(Duration::from_secs(5))
                .await
                .unwrap();
            drop(before);
            // About five ticks pass with no pool running.
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            let last = *ticks(&queue).await.last().expect("a tick");
            let after = build_embedded(config(backend, &queue, missed)).await;
            let pool = &after.pools["p"];
            let started = loop {
                if let Some(started) = pool.schedules()[0].started_ms {
                    break started as i64;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            let held = ticks_until(&queue, "a tick after the restart", |ticks| {
                ticks.last().is_some_and(|tick| *tick > started)
            })
            .await;
            // The ticks of the downtime: after the last one stored, at or before the start.
            let caught_up: Vec<i64> = held
                .iter()
                .copied()
                .filter(|tick| *tick > last && *tick <= started)
                .collect();
            assert!(started - last >= 800, "{backend}: ticks were missed");
            assert_eq!(
                caught_up.len(),
                expected,
                "{backend}, missed {missed}: ticks of the downtime enqueued: {caught_up:?} \
                 (last before {last}, started {started})"
            );
            pool.shutdown_with_drain(Duration::from_secs(5))
                .await
                .unwrap();
        }
    }
}

/// A scheduled start on a shared queue runs at its instant, not at the node's next poll: a
/// pool built from a file (whose node polls every 200 ms) claims at each instant it
/// scheduled. Four tasks due 100 ms apart, each within 150 ms of its instant (a poll of a
/// second, as before, made some of them up to a second late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_start_runs_at_its_instant_not_at_the_next_poll() {
    use prometheus_parking_lot::core::SubmitOptions;
    use prometheus_parking_lot::util::clock::now_ms;
    use prometheus_parking_lot::util::serde::MailboxKey;
    use std::time::UNIX_EPOCH;

    for backend in backends() {
        let queue = fresh_name("due");
        let config = serde_json::json!({
            "database_url": server_url(),
            "pools": { "gpu": {
                "worker_threads": 2,
                "max_units": 4,
                "queue": { "type": backend, "queue_name": queue },
                "mailbox": { "storage": { "type": "in_memory" } }
            } }
        });
        let config = SchedulerConfig::from_json_str(&config.to_string()).expect("a valid config");
        let built = build_embedded(config).await;
        let pool = &built.pools["gpu"];
        let key = MailboxKey::new("acme").with_session(queue.clone());
        let first = now_ms() as u64 + 400;
        let mut due = Vec::new();
        for (index, id) in (1..=4u64).enumerate() {
            let at_ms = first + 100 * index as u64;
            let options =
                SubmitOptions::default().with_not_before(UNIX_EPOCH + Duration::from_millis(at_ms));
            let task = crate::postgres_pools::work(id, id, 0, &key);
            pool.submit_with(task, options).await.expect("admitted");
            due.push((id, at_ms));
        }
        let mut lateness = Vec::new();
        for (id, at_ms) in due {
            let result = pool.retrieve_task(&key, id, Duration::from_secs(10)).await;
            let done_ms = now_ms() as u64;
            assert_eq!(result, Ok(id * 2), "{backend}");
            lateness.push(done_ms.saturating_sub(at_ms));
        }
        // Each retrieve waited from before its task's instant: it ended this late.
        assert!(
            lateness.iter().all(|&late| late < 150),
            "{backend}: the tasks ended {lateness:?} ms after their instants"
        );
    }
}
