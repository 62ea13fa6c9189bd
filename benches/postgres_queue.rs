//! Jobs per second through the Postgres backends on the local server, beside a plain SQL
//! `SKIP LOCKED` job loop in the same run; with the `pgmq` feature, the pgmq queue too, beside
//! a plain PGMQ send/read/archive loop.
//!
//! Every path does the same work per job: enqueue it, claim it, run a no-op, store its result,
//! settle the claim, and hand the result to the client that submitted it.
//!
//! - *pool, batched*: a producer-only pool (`worker_threads: 0`) submits all N jobs with
//!   `submit_batch` (1,000 per call); a worker pool (W workers) on the same queue claims and
//!   runs them; the producer then retrieves every result from the Postgres mailbox. Both pools
//!   are built from one config, as users build them.
//! - *pool, single*: the same, with one `submit` per job (C concurrent submitters).
//! - *plain SQL loop*: the job loop people write by hand: multi-row `INSERT`s of 1,000 jobs;
//!   W loops that each `DELETE .. WHERE id = (SELECT .. ORDER BY priority DESC, id LIMIT 1
//!   FOR UPDATE SKIP LOCKED) RETURNING` a job and `INSERT` its result; the client `DELETE ..
//!   RETURNING`s each result by task id.
//! - *pgmq pool, batched / single* (feature `pgmq`): the two pool paths on a
//!   `"type": "postgres_pgmq"` queue.
//! - *plain pgmq loop* (feature `pgmq`): the PGMQ loop people write by hand: `pgmq.send_batch`
//!   of 1,000 jobs; W loops that each `pgmq.read` one message (visibility timeout 30 s), then
//!   store its result and `pgmq.archive` it in one statement; the client takes each result as
//!   in the plain SQL loop.
//!
//! Each client submits and retrieves under a mailbox key of its own (a session). The worker
//! pool claims ahead (`"claim_ahead": A`): it holds up to A claimed tasks waiting for its W
//! workers, as a node running many short jobs is set up.
//!
//! `cargo bench -p prometheus_parking_lot_benches --bench postgres_queue --features postgres` runs
//! N = 20,000, W = 2, C = 64, A = 256, R = 3 rounds (env `PG_JOBS`, `PG_WORKERS`, `PG_CLIENTS`,
//! `PG_CLAIM_AHEAD`, `PG_ROUNDS`; `PG_PATHS=1,2` runs only those paths, numbered from 0 as listed,
//! and `PG_PHASES=1` prints when each pool round had submitted everything). The last paths
//! are the table pool's batch path again: with a fleet budget too large to hold anything back
//! (what the budget's bookkeeping in each claim costs), and with a `max_queued_units` too high
//! to refuse or shed anything (what the bounded park, which sums the queue's parked units of
//! the kind under a lock, costs each group of parks); with the `pgmq` feature, then the pgmq
//! pool's batch path with that bound. It reports each path's median and best
//! jobs/s and the ratio of medians to the plain loop. Under `cargo test` it runs a few hundred
//! jobs once, checking every result, as a smoke test.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::core::{ScheduledTask, SubmitOptions, TaskMetadata};
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{
    build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TaskExecutor,
    TokioSpawner,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};

struct Scale {
    jobs: u64,
    workers: usize,
    clients: usize,
    claim_ahead: u64,
    rounds: usize,
}

impl Scale {
    fn from_args() -> Self {
        let bench = support::measured();
        let var = support::env_u64;
        if bench {
            Self {
                jobs: var("PG_JOBS", 20_000),
                workers: var("PG_WORKERS", 2) as usize,
                clients: var("PG_CLIENTS", 64) as usize,
                claim_ahead: var("PG_CLAIM_AHEAD", 256),
                rounds: var("PG_ROUNDS", 3) as usize,
            }
        } else {
            Self {
                jobs: 300,
                workers: 2,
                clients: 8,
                claim_ahead: 16,
                rounds: 1,
            }
        }
    }
}

#[derive(Clone)]
struct Double;

/// Runs of the pools' executors, over the whole process: with `PG_PHASES=1`, each round says
/// how many runs its jobs took (a task run twice, a lease lost and the task rescued, shows).
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[async_trait::async_trait]
impl TaskExecutor<u64, u64> for Double {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        payload * 2
    }
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// The pools of one round, on a fresh queue and mailbox table: a producer-only node and a
/// worker node, each from a config of its own, as two processes would build them.
struct Round {
    producer: prometheus_parking_lot::BuiltPools<u64, u64, Double>,
    worker: prometheus_parking_lot::BuiltPools<u64, u64, Double>,
    mailbox: String,
    /// The pgmq queue's name, to drop its PGMQ queues after the round.
    queue: Option<String>,
}

/// Which shared queue a pool round uses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    /// The Postgres table queue.
    Table,
    /// The table queue with a fleet budget on the tasks' kind, too large to hold anything
    /// back: what the budget's bookkeeping costs each claim.
    BudgetedTable,
    /// The table queue bounding the units parked for the fleet (`max_queued_units`), too
    /// high to refuse or shed anything: what the bounded park costs each group of parks.
    BoundedTable,
    /// The pgmq queue.
    Pgmq,
    /// The pgmq queue bounding the units parked for the fleet, as `BoundedTable`.
    BoundedPgmq,
}

fn pools(database: &PgDatabase, workers: usize, ahead: u64, kind: Queue) -> Round {
    let queue = unique("bench");
    let mailbox = format!("{queue}_results");
    let settings = match kind {
        Queue::Table | Queue::BudgetedTable | Queue::BoundedTable => {
            serde_json::json!({ "type": "postgres", "queue_name": queue, "claim_ahead": ahead })
        }
        Queue::Pgmq | Queue::BoundedPgmq => {
            serde_json::json!({ "type": "postgres_pgmq", "queue_name": queue, "claim_ahead": ahead })
        }
    };
    let node = |threads: usize| {
        let mut config = serde_json::json!({ "pools": { "node": {
            "worker_threads": threads,
            "max_units": 1_000_000,
            "max_queue_depth": 10_000_000,
            "queue": settings,
            "mailbox": { "storage": { "type": "postgres", "table": mailbox } }
        } } });
        if kind == Queue::BudgetedTable {
            config["pools"]["node"]["budgets"] =
                serde_json::json!({ "cpu": { "units": 1_000_000_000u32, "per_secs": 1 } });
        }
        if matches!(kind, Queue::BoundedTable | Queue::BoundedPgmq) {
            config["pools"]["node"]["max_queued_units"] = serde_json::json!(1_000_000_000u64);
        }
        let config = SchedulerConfig::from_json_str(&config.to_string()).expect("bench config");
        build_pools_from_scheduler_config::<u64, u64, Double, TokioSpawner>(
            &config,
            &QueueBuilderContext::Postgres(database.clone()),
            None,
            |_| Double,
            TokioSpawner,
        )
        .expect("bench pools")
    };
    Round {
        producer: node(0),
        worker: node(workers),
        mailbox,
        queue: matches!(kind, Queue::Pgmq | Queue::BoundedPgmq).then_some(queue),
    }
}

async fn drop_table(connection: &DatabaseConnection, table: &str) {
    let _ = connection
        .execute_unprepared(&format!("DROP TABLE IF EXISTS {table}"))
        .await;
}

/// Drops the PGMQ queues `names`.
async fn drop_pgmq_queues(connection: &DatabaseConnection, names: &[String]) {
    for name in names {
        let _ = connection
            .execute_unprepared(&format!("SELECT pgmq.drop_queue('{name}')"))
            .await;
    }
}

/// Submits and retrieves `jobs` through the pools; `batched` picks `submit_batch`. Client
/// `c` of C submits and retrieves the jobs with `id % C == c`, under a key of its own (a
/// session, as an API server's callers have).
async fn pool_round(database: &PgDatabase, scale: &Scale, kind: Queue, batched: bool) -> Duration {
    let round = {
        let database = database.clone();
        let (workers, ahead) = (scale.workers, scale.claim_ahead);
        tokio::task::spawn_blocking(move || pools(&database, workers, ahead, kind))
            .await
            .expect("the pools start")
    };
    if !matches!(kind, Queue::Pgmq | Queue::BoundedPgmq) {
        // Every round leaves 20,000 dead rows in the table the pools share. A server's
        // autovacuum clears them at most once a minute (and the test server here runs with
        // it off), so each round starts on a vacuumed table, as the plain loop's rounds
        // start on fresh ones.
        let _ = database
            .connection()
            .execute_unprepared("VACUUM pl_queue_jobs")
            .await;
    }
    let producer = Arc::new(round.producer.pools["node"].client().clone());
    let clients = scale.clients as u64;
    let session = unique("s");
    let key_of =
        move |client: u64| MailboxKey::new("bench").with_session(format!("{session}-{client}"));
    let task = {
        let key_of = key_of.clone();
        move |id: u64| {
            ScheduledTask::new(
                TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key_of(id % clients)),
                id,
            )
        }
    };
    let runs_before = RUNS.load(std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    if batched {
        let ids: Vec<u64> = (1..=scale.jobs).collect();
        for chunk in ids.chunks(1_000) {
            let answers = producer
                .submit_batch(
                    chunk.iter().map(|&id| task(id)).collect(),
                    SubmitOptions::default(),
                )
                .await;
            assert!(
                answers.iter().all(Result::is_ok),
                "every batch submit is accepted"
            );
        }
    } else {
        let mut submitters = tokio::task::JoinSet::new();
        for client in 0..clients {
            let producer = Arc::clone(&producer);
            let tasks: Vec<_> = (1..=scale.jobs)
                .filter(|id| id % clients == client)
                .map(&task)
                .collect();
            submitters.spawn(async move {
                for task in tasks {
                    producer
                        .submit(task, SubmitOptions::default())
                        .await
                        .expect("submit is accepted");
                }
            });
        }
        while let Some(done) = submitters.join_next().await {
            done.expect("a submitter");
        }
    }
    let submitted = started.elapsed();
    let mut takers = tokio::task::JoinSet::new();
    for client in 0..clients {
        let producer = Arc::clone(&producer);
        let key = key_of(client);
        let jobs = scale.jobs;
        takers.spawn(async move {
            for id in (1..=jobs).filter(|id| id % clients == client) {
                let result = producer
                    .retrieve_task(&key, id, Duration::from_secs(60))
                    .await
                    .expect("every result is retrieved");
                assert_eq!(result, id * 2);
            }
        });
    }
    while let Some(done) = takers.join_next().await {
        done.expect("a taker");
    }
    let elapsed = started.elapsed();
    if std::env::var_os("PG_PHASES").is_some() {
        let runs = RUNS.load(std::sync::atomic::Ordering::Relaxed) - runs_before;
        println!(
            "    submitted after {submitted:.2?}, all retrieved after {elapsed:.2?}; {runs} runs of {} jobs",
            scale.jobs
        );
    }
    let Round {
        producer: producer_pools,
        worker,
        mailbox,
        queue,
    } = round;
    drop(producer);
    // Both nodes stop before the next round starts on the same table.
    for pools in [worker, producer_pools] {
        pools
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the nodes stop");
    }
    drop_table(database.connection(), &mailbox).await;
    if let Some(queue) = queue {
        let levels = ["crit", "high", "norm", "low", "dlq"].map(|level| format!("{queue}_{level}"));
        drop_pgmq_queues(database.connection(), &levels).await;
    }
    elapsed
}

/// The hand-written PGMQ loop: see the module docs.
#[cfg(feature = "pgmq")]
async fn plain_pgmq_round(database: &PgDatabase, scale: &Scale) -> Duration {
    database.install_pgmq().await.expect("pgmq is available");
    let connection = database.connection().clone();
    let queue = unique("plain_pgmq");
    let results_table = format!("{queue}_results");
    connection
        .execute_unprepared(&format!(
            "SELECT pgmq.create('{queue}'); \
             CREATE TABLE {results_table} (id BIGSERIAL PRIMARY KEY, task_id BIGINT NOT NULL, \
             payload JSONB NOT NULL); CREATE INDEX ON {results_table} (task_id);"
        ))
        .await
        .expect("plain pgmq queue");
    let started = Instant::now();
    let ids: Vec<u64> = (1..=scale.jobs).collect();
    for chunk in ids.chunks(1_000) {
        let bodies: Vec<String> = chunk
            .iter()
            .map(|id| format!("'{{\"task\": {id}, \"n\": {id}}}'"))
            .collect();
        connection
            .execute_unprepared(&format!(
                "SELECT pgmq.send_batch('{queue}', ARRAY[{}]::jsonb[])",
                bodies.join(",")
            ))
            .await
            .expect("send jobs");
    }
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..scale.workers {
        let connection = connection.clone();
        let (queue, results_table) = (queue.clone(), results_table.clone());
        workers.spawn(async move {
            let read = format!(
                "SELECT msg_id, (message->>'task')::bigint AS task_id, \
                        (message->>'n')::bigint AS n FROM pgmq.read('{queue}', 30, 1)"
            );
            let done = format!(
                "WITH stored AS (INSERT INTO {results_table} (task_id, payload) \
                                 VALUES ($1, $2::jsonb)) \
                 SELECT pgmq.archive('{queue}', $3::bigint)"
            );
            loop {
                let row = connection
                    .query_one_raw(Statement::from_string(DbBackend::Postgres, read.clone()))
                    .await
                    .expect("read");
                let Some(row) = row else { break };
                let msg_id: i64 = row.try_get("", "msg_id").expect("msg_id");
                let task_id: i64 = row.try_get("", "task_id").expect("task_id");
                let n: i64 = row.try_get("", "n").expect("n");
                connection
                    .execute_raw(Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        done.clone(),
                        [task_id.into(), (n * 2).to_string().into(), msg_id.into()],
                    ))
                    .await
                    .expect("store the result and archive");
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("a plain pgmq worker");
    }
    take_results(&connection, &results_table, scale).await;
    let elapsed = started.elapsed();
    drop_table(&connection, &results_table).await;
    drop_pgmq_queues(&connection, &[queue]).await;
    elapsed
}

/// The hand-written loop: see the module docs.
async fn plain_round(database: &PgDatabase, scale: &Scale) -> Duration {
    let connection = database.connection().clone();
    let jobs_table = unique("plain_jobs");
    let results_table = format!("{jobs_table}_results");
    connection
        .execute_unprepared(&format!(
            "CREATE TABLE {jobs_table} (id BIGSERIAL PRIMARY KEY, priority SMALLINT NOT NULL, \
             task_id BIGINT NOT NULL, payload JSONB NOT NULL); \
             CREATE INDEX ON {jobs_table} (priority DESC, id); \
             CREATE TABLE {results_table} (id BIGSERIAL PRIMARY KEY, task_id BIGINT NOT NULL, \
             payload JSONB NOT NULL); CREATE INDEX ON {results_table} (task_id);"
        ))
        .await
        .expect("plain tables");
    let started = Instant::now();
    let ids: Vec<u64> = (1..=scale.jobs).collect();
    for chunk in ids.chunks(1_000) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|id| format!("(1, {id}, '{id}'::jsonb)"))
            .collect();
        connection
            .execute_unprepared(&format!(
                "INSERT INTO {jobs_table} (priority, task_id, payload) VALUES {}",
                rows.join(",")
            ))
            .await
            .expect("insert jobs");
    }
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..scale.workers {
        let connection = connection.clone();
        let (jobs_table, results_table) = (jobs_table.clone(), results_table.clone());
        workers.spawn(async move {
            let claim = format!(
                "DELETE FROM {jobs_table} WHERE id = (SELECT id FROM {jobs_table} \
                 ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
                 RETURNING task_id, payload::text AS payload"
            );
            loop {
                let row = connection
                    .query_one_raw(Statement::from_string(DbBackend::Postgres, claim.clone()))
                    .await
                    .expect("claim");
                let Some(row) = row else { break };
                let task_id: i64 = row.try_get("", "task_id").expect("task_id");
                let payload: String = row.try_get("", "payload").expect("payload");
                let doubled = payload.parse::<u64>().expect("payload") * 2;
                connection
                    .execute_raw(Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        format!(
                            "INSERT INTO {results_table} (task_id, payload) VALUES ($1, $2::jsonb)"
                        ),
                        [task_id.into(), doubled.to_string().into()],
                    ))
                    .await
                    .expect("store the result");
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("a plain worker");
    }
    take_results(&connection, &results_table, scale).await;
    let elapsed = started.elapsed();
    drop_table(&connection, &jobs_table).await;
    drop_table(&connection, &results_table).await;
    elapsed
}

/// The plain loops' client: takes every job's result from `results_table` by task id.
async fn take_results(connection: &DatabaseConnection, results_table: &str, scale: &Scale) {
    let mut takers = tokio::task::JoinSet::new();
    for client in 0..scale.clients.min(16) as u64 {
        let connection = connection.clone();
        let results_table = results_table.to_owned();
        let (jobs, clients) = (scale.jobs, scale.clients.min(16) as u64);
        takers.spawn(async move {
            for id in (1..=jobs).filter(|id| id % clients == client) {
                let row = connection
                    .query_one_raw(Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        format!("DELETE FROM {results_table} WHERE task_id = $1 RETURNING payload::text AS payload"),
                        [(id as i64).into()],
                    ))
                    .await
                    .expect("take")
                    .expect("the result is there");
                let payload: String = row.try_get("", "payload").expect("payload");
                assert_eq!(payload.parse::<u64>().expect("payload"), id * 2);
            }
        });
    }
    while let Some(done) = takers.join_next().await {
        done.expect("a plain taker");
    }
}

fn rate(jobs: u64, elapsed: Duration) -> f64 {
    jobs as f64 / elapsed.as_secs_f64()
}

fn main() {
    let scale = Scale::from_args();
    let database = PgDatabase::connect(&support::database_url()).unwrap_or_else(|error| {
        panic!("the Postgres benchmark needs a server at DATABASE_URL or 127.0.0.1:5432: {error}")
    });
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    let mut names = vec![
        "plain SQL SKIP LOCKED loop",
        "pool, submit_batch",
        "pool, submit",
    ];
    if cfg!(feature = "pgmq") {
        names.extend([
            "plain pgmq read/archive loop",
            "pgmq pool, submit_batch",
            "pgmq pool, submit",
        ]);
    }
    // Last, so that the paths above keep their numbers in either build.
    names.push("pool with a fleet budget, submit_batch");
    let budgeted = names.len() - 1;
    names.push("pool with max_queued_units, submit_batch");
    let bounded = names.len() - 1;
    let bounded_pgmq = cfg!(feature = "pgmq").then(|| {
        names.push("pgmq pool, max_queued_units, batch");
        names.len() - 1
    });
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    // `PG_PATHS=1,2` runs only those paths (numbered as listed, from 0), for a quick look.
    let chosen: Option<Vec<usize>> = std::env::var("PG_PATHS").ok().map(|list| {
        list.split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect()
    });
    for round in 0..scale.rounds {
        for path in 0..names.len() {
            let path = (path + round) % names.len();
            if chosen
                .as_ref()
                .is_some_and(|chosen| !chosen.contains(&path))
            {
                continue;
            }
            let elapsed = client.block_on(async {
                match path {
                    _ if path == budgeted => {
                        pool_round(&database, &scale, Queue::BudgetedTable, true).await
                    }
                    _ if path == bounded => {
                        pool_round(&database, &scale, Queue::BoundedTable, true).await
                    }
                    _ if Some(path) == bounded_pgmq => {
                        pool_round(&database, &scale, Queue::BoundedPgmq, true).await
                    }
                    0 => plain_round(&database, &scale).await,
                    1 => pool_round(&database, &scale, Queue::Table, true).await,
                    2 => pool_round(&database, &scale, Queue::Table, false).await,
                    #[cfg(feature = "pgmq")]
                    3 => plain_pgmq_round(&database, &scale).await,
                    #[cfg(feature = "pgmq")]
                    4 => pool_round(&database, &scale, Queue::Pgmq, true).await,
                    _ => pool_round(&database, &scale, Queue::Pgmq, false).await,
                }
            });
            rates[path].push(rate(scale.jobs, elapsed));
        }
    }
    println!(
        "postgres_queue: {} jobs per run, {} workers, {} clients, claim-ahead {}, {} rounds",
        scale.jobs, scale.workers, scale.clients, scale.claim_ahead, scale.rounds
    );
    // The plain SQL loop, when it ran (`PG_PATHS` may leave it out).
    let baseline = (!rates[0].is_empty()).then(|| support::median(&rates[0]));
    let against_plain = |middle: f64| {
        baseline.map_or_else(|| "–".to_owned(), |plain| format!("{:.2}x", middle / plain))
    };
    let pgmq_baseline = rates
        .get(3)
        .filter(|rates| !rates.is_empty())
        .map(|rates| support::median(rates));
    let ran = |(_, (_, rates)): &(usize, (&&str, &Vec<f64>))| !rates.is_empty();
    for (path, (name, rates)) in names.iter().zip(&rates).enumerate().filter(ran) {
        let best = rates.iter().copied().fold(0.0, f64::max);
        let middle = support::median(rates);
        let against_pgmq = match pgmq_baseline {
            Some(plain) if (3..budgeted).contains(&path) || Some(path) == bounded_pgmq => {
                format!("  {:.2}x the plain pgmq loop", middle / plain)
            }
            _ => String::new(),
        };
        println!(
            "  {name:<29} median {middle:>9.0} jobs/s  best {best:>9.0} jobs/s  {} the plain loop{against_pgmq}",
            against_plain(middle)
        );
    }
    println!();
    println!("markdown for BENCHMARKS.md:");
    println!();
    println!(
        "{} jobs per run, {} workers, {} clients, claim-ahead {} on the worker pool, {} rounds \
         (ratios are of medians):",
        scale.jobs, scale.workers, scale.clients, scale.claim_ahead, scale.rounds
    );
    println!();
    println!("| path | median jobs/s | best jobs/s | vs plain SQL loop | vs plain pgmq loop |");
    println!("|---|---:|---:|---:|---:|");
    for (path, (name, rates)) in names.iter().zip(&rates).enumerate().filter(ran) {
        let best = rates.iter().copied().fold(0.0, f64::max);
        let middle = support::median(rates);
        let against_pgmq = match pgmq_baseline {
            Some(plain) if (3..budgeted).contains(&path) || Some(path) == bounded_pgmq => {
                format!("{:.2}x", middle / plain)
            }
            _ => "–".to_owned(),
        };
        println!(
            "| {name} | {middle:.0} | {best:.0} | {} | {against_pgmq} |",
            against_plain(middle)
        );
    }
}
