//! Jobs per second through apalis on its Postgres storage (apalis-postgres) on the local server,
//! doing per job what every path of benches/postgres_queue.rs does: enqueue it, claim it, run a
//! no-op (n -> 2n), store its result, settle the claim, and hand the result to the client that
//! submitted it.
//!
//! - *apalis, push_all*: one producer pushes all N jobs with `push_all`, 1,000 per call (one
//!   multi-row `INSERT` each); then C clients wait for their jobs' results.
//! - *apalis, push_task*: C concurrent clients push one job per call; then each waits for its
//!   jobs' results.
//!
//! W workers (W `Worker`s on the queue, each with `concurrency(1)`, so W handlers run at once)
//! fetch jobs `batch_size` at a time (apalis' default, 10) and wake on the storage's
//! LISTEN/NOTIFY (`with_pubsub`) when the queue was empty. apalis stores each handler's return
//! value as the job's result (`persist_results`, on by default) when it acknowledges the job; a
//! client reads its jobs' results with `wait_for` (apalis' `WaitForCompletion`: it polls the
//! jobs table for the ids still missing, again at once while results arrive, after 500 ms when
//! none did). Client ids are ULIDs the client chooses, as `push_task` returns none.
//!
//! Environment (as benches/postgres_queue.rs): `PG_JOBS` (10000), `PG_WORKERS` (2),
//! `PG_CLIENTS` (64), `PG_ROUNDS` (1), `PG_PATHS` (0,1: push_all, push_task); `DATABASE_URL`
//! (the local server's `bench_peers`); `APALIS_BATCH`, jobs per fetch (10); `PEER_POOL`,
//! connections (16, as our pool). Each round uses a queue of its own and deletes its jobs and
//! workers after; apalis' tables are in the schema `apalis`.

use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use futures::StreamExt;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use ulid::Ulid;

struct Scale {
    jobs: u64,
    workers: usize,
    clients: u64,
    rounds: usize,
    batch: usize,
    pool: u32,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

impl Scale {
    fn from_env() -> Self {
        Self {
            jobs: env_u64("PG_JOBS", 10_000),
            workers: env_u64("PG_WORKERS", 2) as usize,
            clients: env_u64("PG_CLIENTS", 64),
            rounds: env_u64("PG_ROUNDS", 1) as usize,
            batch: env_u64("APALIS_BATCH", 10) as usize,
            pool: env_u64("PEER_POOL", 16) as u32,
        }
    }

    /// Client `c` of C owns the jobs with `n % C == c`, as in our bench.
    fn jobs_of(&self, client: u64) -> Vec<u64> {
        (1..=self.jobs)
            .filter(|n| n % self.clients == client)
            .collect()
    }
}

/// The job: the no-op every path runs.
async fn double(n: u64) -> Result<u64, BoxDynError> {
    Ok(n * 2)
}

/// The W workers of one round on `queue`, each a task of its own; stopped through their contexts.
struct Workers {
    contexts: Vec<WorkerContext>,
    running: Vec<tokio::task::JoinHandle<()>>,
}

fn start_workers(pool: &PgPool, queue: &str, scale: &Scale) -> Workers {
    let mut workers = Workers {
        contexts: Vec::new(),
        running: Vec::new(),
    };
    for w in 0..scale.workers {
        let context = WorkerContext::new(&format!("{queue}-w{w}"));
        let config = Config::default().queue(queue).batch_size(scale.batch);
        let backend = PostgresStorage::<u64>::new(pool)
            .with_config(config)
            .with_pubsub();
        let worker = WorkerBuilder::new(&context)
            .backend(backend)
            .concurrency(1)
            .build(double);
        workers.contexts.push(context);
        workers.running.push(tokio::spawn(async move {
            worker.run().await.expect("an apalis worker");
        }));
    }
    workers
}

impl Workers {
    async fn stop(self) {
        for context in &self.contexts {
            context.stop().expect("a worker stops");
        }
        for running in self.running {
            running.await.expect("a worker task");
        }
    }
}

fn task(n: u64) -> (Ulid, Task<u64>) {
    let id = Ulid::generate();
    let task = TaskBuilder::new(n).task_id(TaskId::from_ulid(id)).build();
    (id, task)
}

/// Each client waits for its own jobs' results (`ids[i]` is job `jobs[i]`) and checks them.
async fn take_results(storage: &PostgresStorage<u64>, ids: Vec<Vec<(u64, Ulid)>>) {
    let mut takers = tokio::task::JoinSet::new();
    for mine in ids {
        let mut storage = storage.clone();
        takers.spawn(async move {
            let expected: std::collections::HashMap<Ulid, u64> =
                mine.iter().map(|&(n, id)| (id, n * 2)).collect();
            let results: Vec<TaskResult<u64>> = storage
                .wait_for(mine.iter().map(|&(_, id)| TaskId::from_ulid(id)))
                .map(|result| result.expect("a result"))
                .collect()
                .await;
            assert_eq!(results.len(), expected.len(), "every result comes back");
            for result in results {
                let id = result.task_id.as_ulid().expect("a ULID task id");
                let value = result.result.expect("the job succeeded");
                assert_eq!(value, expected[&id], "job {id}");
            }
        });
    }
    while let Some(done) = takers.join_next().await {
        done.expect("a taker");
    }
}

async fn push_all_round(storage: &PostgresStorage<u64>, scale: &Scale) {
    let mut ids: Vec<Vec<(u64, Ulid)>> = vec![Vec::new(); scale.clients as usize];
    let mut producer = storage.clone();
    let all: Vec<u64> = (1..=scale.jobs).collect();
    for chunk in all.chunks(1_000) {
        let mut tasks = Vec::with_capacity(chunk.len());
        for &n in chunk {
            let (id, task) = task(n);
            ids[(n % scale.clients) as usize].push((n, id));
            tasks.push(task);
        }
        producer
            .push_all(&mut futures::stream::iter(tasks))
            .await
            .expect("push_all");
    }
    take_results(storage, ids).await;
}

async fn push_task_round(storage: &PostgresStorage<u64>, scale: &Scale) {
    let mut submitters = tokio::task::JoinSet::new();
    for client in 0..scale.clients {
        let mut producer = storage.clone();
        let jobs = scale.jobs_of(client);
        submitters.spawn(async move {
            let mut ids = Vec::with_capacity(jobs.len());
            for n in jobs {
                let (id, task) = task(n);
                producer.push_task(task).await.expect("push_task");
                ids.push((n, id));
            }
            ids
        });
    }
    let ids = submitters.join_all().await;
    take_results(storage, ids).await;
}

/// One timed round of `path` on a queue of its own, whose jobs and workers are deleted after.
async fn round(pool: &PgPool, scale: &Scale, path: usize, number: usize) -> f64 {
    let queue = format!("bench_{path}_{number}_{}", std::process::id());
    let storage = PostgresStorage::<u64>::new(pool).with_config(Config::default().queue(&queue));
    let workers = start_workers(pool, &queue, scale);
    let started = Instant::now();
    match path {
        0 => push_all_round(&storage, scale).await,
        _ => push_task_round(&storage, scale).await,
    }
    let elapsed = started.elapsed();
    workers.stop().await;
    for clear in [
        "DELETE FROM apalis.jobs WHERE job_type = $1",
        "DELETE FROM apalis.workers WHERE worker_type = $1",
    ] {
        sqlx::query(clear)
            .bind(&queue)
            .execute(pool)
            .await
            .expect("clear the round's rows");
    }
    scale.jobs as f64 / elapsed.as_secs_f64()
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

fn main() {
    let scale = Scale::from_env();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/bench_peers".to_owned());
    let names = ["apalis, push_all", "apalis, push_task"];
    let chosen: Vec<usize> = std::env::var("PG_PATHS")
        .unwrap_or_else(|_| "0,1".to_owned())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let rates = runtime.block_on(async {
        let pool = PgPoolOptions::new()
            .max_connections(scale.pool)
            .acquire_timeout(Duration::from_secs(60))
            .connect(&url)
            .await
            .expect("the Postgres server at DATABASE_URL");
        PostgresStorage::setup(&pool).await.expect("apalis' tables");
        let mut rates = vec![Vec::new(); names.len()];
        for number in 0..scale.rounds {
            for path in (0..names.len()).filter(|path| chosen.contains(path)) {
                rates[path].push(round(&pool, &scale, path, number).await);
            }
        }
        rates
    });
    println!(
        "apalis: {} jobs per run, {} workers, {} clients, batch {}, {} rounds",
        scale.jobs, scale.workers, scale.clients, scale.batch, scale.rounds
    );
    for (name, rates) in names.iter().zip(&rates).filter(|(_, r)| !r.is_empty()) {
        let best = rates.iter().copied().fold(0.0, f64::max);
        println!(
            "  {name:<29} median {:>9.0} jobs/s  best {best:>9.0} jobs/s",
            median(rates)
        );
    }
}
