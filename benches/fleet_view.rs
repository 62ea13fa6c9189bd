//! What an open fleet view and tracing cost the claims: jobs per second through a shared
//! Postgres queue, with nobody reading the fleet, with a fleet view polled all along, and
//! (with the `otel` feature) with every task traced, in one run.
//!
//! Each round builds a producer-only node and a worker node (W workers, claiming ahead A) on a
//! fresh queue, as two processes would, submits N jobs with `submit_batch` (1,000 per call),
//! and times until the worker node has completed all N: each job is one claim, one run of a
//! no-op, one result stored and one settle. In the rounds *with the view*, a reader polls the
//! fleet as the fleet page and `parking-lot fleet` do (the nodes with their claims, the first
//! page of parked tasks with their reasons, the budgets) every P ms, far more often than the
//! page's 2 s. In the rounds *traced*, an SDK tracer provider records every span (batch
//! processor, in-memory exporter): each submission's span, and on the worker node each
//! task's claim, run and delivery, in the trace its row carries (`traceparent`); the other
//! rounds run under a no-op provider. Rounds alternate, plain, with the view, traced, so a
//! drift of the server weighs on each.
//!
//! `cargo bench -p prometheus_parking_lot_benches --features postgres,otel --bench fleet_view`
//! runs N = 10,000, W = 2, A = 256, P = 50 ms, R = 3 rounds each (env `FLEET_JOBS`,
//! `FLEET_WORKERS`, `FLEET_CLAIM_AHEAD`, `FLEET_POLL_MS`, `FLEET_ROUNDS`) and prints each
//! side's median jobs/s and their ratios to the plain rounds (without `otel`, no traced
//! rounds). Under `cargo test` it runs 300 jobs once each way, as a smoke test.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::infra::postgres::fleet::{FleetQueue, FleetView};
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, BuiltPools, QueueBuilderContext, SchedulerConfig,
    TaskExecutor, TokioSpawner,
};
use sea_orm::ConnectionTrait;

struct Scale {
    jobs: u64,
    workers: usize,
    claim_ahead: u64,
    poll: Duration,
    rounds: usize,
}

impl Scale {
    fn from_args() -> Self {
        let var = support::env_u64;
        if support::measured() {
            Self {
                jobs: var("FLEET_JOBS", 10_000),
                workers: var("FLEET_WORKERS", 2) as usize,
                claim_ahead: var("FLEET_CLAIM_AHEAD", 256),
                poll: Duration::from_millis(var("FLEET_POLL_MS", 50)),
                rounds: var("FLEET_ROUNDS", 3) as usize,
            }
        } else {
            Self {
                jobs: 300,
                workers: 2,
                claim_ahead: 16,
                poll: Duration::from_millis(20),
                rounds: 1,
            }
        }
    }
}

#[derive(Clone)]
struct Noop;

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Noop {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        payload
    }
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// A node of `queue` with `workers` workers, from a config of its own.
fn node(
    database: &PgDatabase,
    queue: &str,
    workers: usize,
    ahead: u64,
) -> BuiltPools<u64, u64, Noop> {
    let config = serde_json::json!({ "pools": { "node": {
        "worker_threads": workers,
        "max_units": 1_000_000,
        "max_queue_depth": 10_000_000,
        "queue": { "type": "postgres", "queue_name": queue, "claim_ahead": ahead },
        "mailbox": { "storage": { "type": "postgres", "table": format!("{queue}_results") } }
    } } });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("bench config");
    build_pools_from_scheduler_config::<u64, u64, Noop, TokioSpawner>(
        &config,
        &QueueBuilderContext::Postgres(database.clone()),
        None,
        |_| Noop,
        TokioSpawner,
    )
    .expect("bench pools")
}

/// What a round runs beside the claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Nothing: no fleet view, no tracer provider.
    Plain,
    /// A fleet view polled every P ms.
    View,
    /// Every task traced, every span recorded.
    #[cfg(feature = "otel")]
    Traced,
}

/// The tracer provider of the traced rounds, and the spans it recorded.
#[cfg(feature = "otel")]
struct Tracing {
    exporter: opentelemetry_sdk::trace::InMemorySpanExporter,
}

#[cfg(feature = "otel")]
impl Tracing {
    /// Installs a provider that records every span, for `side`'s round, or a no-op one.
    fn install(&self, side: Side) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
        use opentelemetry::global;
        if side != Side::Traced {
            global::set_tracer_provider(opentelemetry::trace::noop::NoopTracerProvider::new());
            return None;
        }
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(self.exporter.clone())
            .build();
        global::set_tracer_provider(provider.clone());
        Some(provider)
    }

    /// The spans a round recorded, forgotten after.
    fn recorded(&self, provider: opentelemetry_sdk::trace::SdkTracerProvider) -> usize {
        provider.force_flush().expect("spans flushed");
        let spans = self.exporter.get_finished_spans().expect("spans").len();
        self.exporter.reset();
        spans
    }
}

/// One round: jobs per second, and how many times the view was read meanwhile.
async fn round(database: &PgDatabase, scale: &Scale, side: Side) -> (f64, u64) {
    let with_view = side == Side::View;
    let queue = unique("fleetbench");
    let (producer, worker) = {
        let (database, queue) = (database.clone(), queue.clone());
        let (workers, ahead) = (scale.workers, scale.claim_ahead);
        tokio::task::spawn_blocking(move || {
            (
                node(&database, &queue, 0, ahead),
                node(&database, &queue, workers, ahead),
            )
        })
        .await
        .expect("the nodes start")
    };
    let _ = database
        .connection()
        .execute_unprepared("VACUUM pl_queue_jobs")
        .await;
    let reading = Arc::new(AtomicBool::new(with_view));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = with_view.then(|| {
        let view = FleetView::new(
            database.clone(),
            FleetQueue::table("pl_queue_jobs", &queue).expect("a queue table"),
        );
        let (reading, reads, poll) = (reading.clone(), reads.clone(), scale.poll);
        tokio::spawn(async move {
            while reading.load(Ordering::Relaxed) {
                view.nodes().await.expect("the nodes");
                view.parked(0, 50).await.expect("the parked tasks");
                view.budgets().await.expect("the budgets");
                reads.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(poll).await;
            }
        })
    });
    let key = MailboxKey::new("bench").with_session(queue.clone());
    let producer_pool = producer.pools["node"].client().clone();
    let worker_pool = &worker.pools["node"];
    let started = Instant::now();
    let ids: Vec<u64> = (1..=scale.jobs).collect();
    for chunk in ids.chunks(1_000) {
        let tasks = chunk
            .iter()
            .map(|&id| {
                ScheduledTask::new(
                    TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key.clone()),
                    id,
                )
            })
            .collect();
        let answers = producer_pool
            .submit_batch(tasks, SubmitOptions::default())
            .await;
        assert!(
            answers.iter().all(Result::is_ok),
            "every submit is accepted"
        );
    }
    let deadline = started + Duration::from_secs(600);
    while worker_pool.stats().completed_tasks < scale.jobs {
        assert!(Instant::now() < deadline, "the jobs did not complete");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    reading.store(false, Ordering::Relaxed);
    if let Some(reader) = reader {
        reader.await.expect("the reader ends");
    }
    let reads = reads.load(Ordering::Relaxed);
    assert!(
        !with_view || reads > 0,
        "the view was read during the round"
    );
    drop(producer);
    drop(worker);
    for sql in [
        format!("DROP TABLE IF EXISTS {queue}_results"),
        format!("DELETE FROM pl_queue_jobs WHERE queue_name = '{queue}'"),
        format!(
            "DELETE FROM pl_fleet_nodes WHERE queue_key = 'postgres table pl_queue_jobs {queue}'"
        ),
    ] {
        let _ = database.connection().execute_unprepared(&sql).await;
    }
    (scale.jobs as f64 / elapsed.as_secs_f64(), reads)
}

fn main() {
    let scale = Scale::from_args();
    let database = PgDatabase::connect(&support::database_url()).expect("the bench database");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut total_reads = 0;
    #[cfg(feature = "otel")]
    let (tracing, mut traced, mut spans) = (
        Tracing {
            exporter: Default::default(),
        },
        Vec::new(),
        0,
    );
    for index in 0..scale.rounds {
        #[cfg(feature = "otel")]
        tracing.install(Side::Plain);
        let (rate, _) = runtime.block_on(round(&database, &scale, Side::Plain));
        println!("round {index}: no view       {rate:>9.0} jobs/s");
        without.push(rate);
        let (rate, reads) = runtime.block_on(round(&database, &scale, Side::View));
        println!("round {index}: view polled   {rate:>9.0} jobs/s ({reads} reads of the fleet)");
        with.push(rate);
        total_reads += reads;
        #[cfg(feature = "otel")]
        {
            let provider = tracing.install(Side::Traced);
            let (rate, _) = runtime.block_on(round(&database, &scale, Side::Traced));
            spans = provider.map_or(0, |provider| tracing.recorded(provider));
            println!("round {index}: traced        {rate:>9.0} jobs/s ({spans} spans recorded)");
            traced.push(rate);
        }
    }
    let (without, with) = (support::median(&without), support::median(&with));
    println!(
        "claims through a shared Postgres queue, N = {}, W = {}, claim_ahead = {}, view polled every {} ms",
        scale.jobs,
        scale.workers,
        scale.claim_ahead,
        scale.poll.as_millis()
    );
    println!("  median without a fleet view: {without:>9.0} jobs/s");
    println!("  median with a fleet view:    {with:>9.0} jobs/s ({total_reads} reads in all)");
    println!("  ratio with / without:        {:>9.3}", with / without);
    #[cfg(feature = "otel")]
    {
        let traced = support::median(&traced);
        println!(
            "  median traced (no view):     {traced:>9.0} jobs/s ({spans} spans in the last round)"
        );
        println!("  ratio traced / untraced:     {:>9.3}", traced / without);
        assert!(
            spans as u64 >= scale.jobs * 3,
            "a claim, a run and a delivery recorded for every job: {spans}"
        );
    }
}
