//! The metrics a pool records, scraped over HTTP from `metrics-exporter-prometheus` as
//! Prometheus would: names, labels, and values that move with the pool's work.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{PoolError, TaskMetadata, WorkerExecutor, WorkerPool};
use prometheus_parking_lot::util::clock::now_ms;
use prometheus_parking_lot::util::serde::{Priority, ResourceCost};

/// The exporter's address: one recorder per process, installed by the first test to ask.
fn exporter() -> SocketAddr {
    static ADDRESS: OnceLock<SocketAddr> = OnceLock::new();
    *ADDRESS.get_or_init(|| {
        let free = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
        let address = free.local_addr().expect("its address");
        drop(free);
        PrometheusBuilder::new()
            .with_http_listener(address)
            .install()
            .expect("the exporter starts");
        address
    })
}

/// GETs /metrics over plain HTTP/1.0 (no chunked body) and returns the body.
fn scrape() -> String {
    let address = exporter();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match try_scrape(address) {
            Ok(body) => return body,
            Err(error) if Instant::now() < deadline => {
                let _ = error;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("could not scrape {address}: {error}"),
        }
    }
}

fn try_scrape(address: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("answered {head}")));
    }
    Ok(body.to_owned())
}

/// The value of the sample `name` whose labels include every one of `labels`.
fn sample(body: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, series_labels) = match series.split_once('{') {
                Some((series_name, rest)) => (series_name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let matches = series_name == name
                && labels.iter().all(|(key, wanted)| {
                    series_labels
                        .split(',')
                        .any(|pair| pair == format!("{key}=\"{wanted}\""))
                });
            matches.then(|| value.parse().ok()).flatten()
        })
}

/// Scrapes until `check` passes on the body, or fails with the last body.
fn eventually(what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let body = scrape();
        if check(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never showed; the last scrape:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sleeps `millis` once the gate opens; panics on 0.
#[derive(Clone)]
struct Gated(Arc<AtomicBool>);

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for Gated {
    async fn execute(&self, millis: u64, _meta: TaskMetadata) -> u64 {
        assert!(millis > 0, "a deliberate panic");
        while !self.0.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(millis)).await;
        millis
    }
}

fn vram(id: u64, units: u32) -> TaskMetadata {
    TaskMetadata::new(id, ResourceCost::gpu_vram(units)).with_priority(Priority::High)
}

#[test]
fn a_scrape_shows_a_pools_tasks_counted_timed_and_refused_by_reason() {
    exporter();
    let gate = Arc::new(AtomicBool::new(false));
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_name("scraped")
            .with_worker_count(2)
            .with_max_units(4)
            .with_max_queue_depth(18),
        Gated(gate.clone()),
    )
    .expect("the pool starts");
    let pool_label = [("pool", "scraped")];

    // 2 tasks of 2 units start (4 units, 2 workers) and wait at the gate; 18 park.
    let keys: Vec<_> = (1..=20)
        .map(|id| pool.submit(5, vram(id, 2)).expect("admitted"))
        .collect();
    let busy = eventually("the parked and running tasks", |body| {
        sample(body, "parking_lot_queue_depth", &pool_label) == Some(18.0)
    });
    assert_eq!(
        sample(&busy, "parking_lot_tasks_running", &pool_label),
        Some(2.0)
    );
    let vram_label = [("pool", "scraped"), ("kind", "gpu_vram")];
    assert_eq!(
        sample(&busy, "parking_lot_units_used", &vram_label),
        Some(4.0)
    );
    assert_eq!(
        sample(&busy, "parking_lot_units_total", &vram_label),
        Some(4.0)
    );
    assert_eq!(
        sample(&busy, "parking_lot_tasks_submitted_total", &pool_label),
        Some(20.0)
    );

    // Refusals, each under its reason: the lot is full, and a task larger than the pool.
    assert_eq!(pool.submit(5, vram(21, 1)), Err(PoolError::QueueFull));
    assert!(matches!(
        pool.submit(5, vram(22, 5)),
        Err(PoolError::InsufficientResources { .. })
    ));
    let refused = eventually("the refusals", |body| {
        sample(
            body,
            "parking_lot_tasks_rejected_total",
            &[("pool", "scraped"), ("reason", "queue_full")],
        ) == Some(1.0)
    });
    assert_eq!(
        sample(
            &refused,
            "parking_lot_tasks_rejected_total",
            &[("pool", "scraped"), ("reason", "too_large")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &refused,
            "parking_lot_tasks_rejected_total",
            &[("pool", "scraped"), ("reason", "duplicate")]
        ),
        Some(0.0)
    );

    gate.store(true, Ordering::Release);
    for key in &keys {
        assert_eq!(pool.retrieve(key, Duration::from_secs(10)), Ok(5));
    }
    // One more of each ending: a deadline already passed, and a panic.
    let late = vram(23, 1).with_deadline_ms(now_ms().saturating_sub(1_000));
    assert_eq!(pool.submit(5, late), Err(PoolError::Expired));
    let crashed = pool.submit(0, vram(24, 1)).expect("admitted");
    assert!(matches!(
        pool.retrieve(&crashed, Duration::from_secs(10)),
        Err(PoolError::Failed(_))
    ));
    // The restart is counted once the pool publishes again: one more task.
    let after = pool.submit(5, vram(25, 1)).expect("admitted");
    assert_eq!(pool.retrieve(&after, Duration::from_secs(10)), Ok(5));

    let done = eventually("the pool at rest with the restart counted", |body| {
        sample(body, "parking_lot_tasks_completed_total", &pool_label) == Some(21.0)
            && sample(body, "parking_lot_worker_restarts_total", &pool_label) == Some(1.0)
    });
    let value = |name: &str| sample(&done, name, &pool_label);
    // The expired task ended at admission: counted as expired, never as admitted.
    assert_eq!(value("parking_lot_tasks_submitted_total"), Some(22.0));
    assert_eq!(value("parking_lot_tasks_failed_total"), Some(1.0));
    assert_eq!(value("parking_lot_tasks_expired_total"), Some(1.0));
    assert_eq!(value("parking_lot_tasks_timed_out_total"), Some(0.0));
    assert_eq!(value("parking_lot_queue_depth"), Some(0.0));
    assert_eq!(value("parking_lot_tasks_running"), Some(0.0));
    assert_eq!(value("parking_lot_queue_errors_total"), Some(0.0));
    assert_eq!(
        sample(&done, "parking_lot_units_used", &vram_label),
        Some(0.0)
    );
    // Every started task's wait, under its priority; every run, ended or failed.
    let high = [("pool", "scraped"), ("priority", "high")];
    assert_eq!(
        sample(&done, "parking_lot_task_wait_seconds_count", &high),
        Some(22.0)
    );
    assert_eq!(value("parking_lot_task_run_seconds_count"), Some(22.0));
    // The parked tasks waited at least for the 5 ms runs ahead of them.
    let waited = sample(&done, "parking_lot_task_wait_seconds_sum", &high).expect("a sum");
    assert!(waited >= 0.045, "parked tasks waited {waited} s in all");
    assert!(done.contains("# TYPE parking_lot_tasks_completed_total counter"));
    assert!(done.contains("# TYPE parking_lot_queue_depth gauge"));
}

/// Fails each task's first run (asking for a retry), then returns its id.
#[derive(Clone, Default)]
struct FirstRunFails(Arc<std::sync::Mutex<std::collections::HashSet<u64>>>);

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for FirstRunFails {
    async fn execute(&self, _payload: u64, meta: TaskMetadata) -> u64 {
        if self.0.lock().unwrap().insert(meta.id) {
            prometheus_parking_lot::running::retry_later("503 Service Unavailable");
        }
        meta.id
    }
}

#[test]
fn a_scrape_shows_a_budgets_level_and_waits_and_the_retries() {
    exporter();
    // 10 I/O units a minute: the second task waits for the bucket long after the test.
    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_name("quota")
            .with_worker_count(2)
            .with_budget(
                prometheus_parking_lot::ResourceKind::Io,
                prometheus_parking_lot::core::Budget::per_minute(10),
            )
            .with_retry(prometheus_parking_lot::core::Retries::new(
                3,
                Duration::from_millis(20),
            )),
        FirstRunFails::default(),
    )
    .expect("the pool starts");
    pool.retry_tasks();
    let io = |id, units| TaskMetadata::new(id, ResourceCost::io(units));
    // Task 1 spends 4 on each of its two runs (the first asks for a retry); task 2 needs 6
    // of the 2 left, 24 s of refill away.
    let first = pool.submit(0, io(1, 4)).expect("admitted");
    assert_eq!(pool.retrieve(&first, Duration::from_secs(10)), Ok(1));
    pool.submit(0, io(2, 6))
        .expect("admitted: it waits for the bucket");
    let label = [("pool", "quota"), ("kind", "io")];
    let body = eventually("the budget's wait", |body| {
        sample(body, "parking_lot_budget_waits_total", &label) == Some(1.0)
    });
    let level = sample(&body, "parking_lot_budget_level", &label).expect("a level");
    assert!(level < 6.0, "too few for task 2: {level}");
    let ready_in = sample(&body, "parking_lot_budget_ready_in_seconds", &label).expect("a wait");
    assert!(ready_in > 1.0 && ready_in <= 36.0, "{ready_in} s");
    assert_eq!(
        sample(
            &body,
            "parking_lot_task_retries_total",
            &[("pool", "quota")]
        ),
        Some(1.0)
    );
}
