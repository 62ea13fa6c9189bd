//! A thousand-way fan-in (`SubmitOptions::depends_on`, core rule 24): what a parent's end
//! costs when one child waits on all of the parents, beside the same work with no child
//! waiting, in the same run.
//!
//! - **Pool**: an in-memory `WorkerPool` of 8 workers. P parents (no-op tasks of one unit)
//!   and a child that depends on all of them are submitted while a gate holds the parents
//!   back; the gate opens and the clock runs until every parent's result and the child's are
//!   retrieved. The baseline submits the same P tasks and the same last task without
//!   dependencies. Per-parent completion time is the time over P; the ratio compares the
//!   two.
//! - **Core**: the pure core alone, P parents started then ended one by one (`complete`,
//!   then `parent_ended` for the fan-in), per parent end, beside the same ends with no
//!   child held.
//!
//! - **Postgres queues** (with `--features postgres`; pgmq too with `--features pgmq`): each
//!   queue alone, through its `SharedQueue` face. P parents are parked and claimed by one node, and, for the fan-in, a
//!   child waiting on all of them is parked with `enqueue_waiting`; the clock runs while the
//!   node settles the parents one by one (`Settlement::Done`, one statement each, which
//!   releases the child in the same statement), then the child is claimed. Per parent
//!   settle, beside the same settles with no child waiting. The server is the one at
//!   `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//!
//! - **yaque** (with `--features yaque`): the pool round above on a yaque queue of its own
//!   (`"durability": "accepted"`, so every parent is parked, claimed and settled in the
//!   file), in a fresh directory each round: the child's park names every parent, and each
//!   parent's settle writes how it ended for the child (`ENDED` instead of `GONE`).
//!
//! Medians of R rounds, the two runs alternating (on Postgres, each round's rows are deleted
//! and the tables vacuumed before the next). `cargo bench -p
//! prometheus_parking_lot_benches --bench dependencies` runs P = 1,000 parents, R = 7
//! (override with `FAN_IN_PARENTS`, `FAN_IN_ROUNDS`; the Postgres case takes R = 3 unless
//! `FAN_IN_PG_ROUNDS` says otherwise); under `cargo test` it runs P = 100 once as a smoke
//! test.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::scheduling::{Admit, ParkingLot, Ticket};
use prometheus_parking_lot::core::{
    PoolLimits, StarvationGuard, SubmitOptions, TaskMetadata, WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::{MailboxKey, Priority, ResourceCost};
use tokio::runtime::Runtime;
use tokio::sync::watch;

const WORKERS: usize = 8;

struct Scale {
    parents: u64,
    rounds: usize,
}

impl Scale {
    fn from_args() -> Self {
        if support::measured() {
            Self {
                parents: support::env_u64("FAN_IN_PARENTS", 1_000),
                rounds: support::env_u64("FAN_IN_ROUNDS", 7) as usize,
            }
        } else {
            Self {
                parents: 100,
                rounds: 1,
            }
        }
    }
}

/// Waits for the gate, then returns at once.
#[derive(Clone)]
struct Gated {
    open: watch::Receiver<bool>,
}

#[async_trait::async_trait]
impl WorkerExecutor<u64, u64> for Gated {
    async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
        let mut open = self.open.clone();
        let _ = open.wait_for(|open| *open).await;
        payload
    }
}

/// One round through a fresh pool: seconds from the gate's opening to the last result.
fn pool_round(runtime: &Runtime, scale: &Scale, fan_in: bool) -> f64 {
    let (gate, open) = watch::channel(false);
    let config = WorkerPoolConfig::new()
        .with_name("fan-in")
        .with_worker_count(WORKERS)
        .with_max_units(WORKERS as u32)
        .with_max_queue_depth(scale.parents as usize + 10)
        .with_starvation(StarvationGuard::disabled());
    let pool = Arc::new(WorkerPool::new(config, Gated { open }).expect("pool starts"));
    let parents = scale.parents;
    runtime.block_on(async move {
        let key = |id: u64| MailboxKey::new("plan").with_session(format!("step-{id}"));
        let meta = |id: u64| TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key(id));
        let mut keys = Vec::with_capacity(parents as usize + 1);
        for id in 1..=parents {
            keys.push(
                pool.submit_async(id, meta(id))
                    .await
                    .expect("parent admitted"),
            );
        }
        let options = if fan_in {
            SubmitOptions::default().with_depends_on(1..=parents)
        } else {
            SubmitOptions::default()
        };
        let last = parents + 1;
        keys.push(
            pool.submit_with(last, meta(last), options)
                .await
                .expect("child admitted"),
        );
        let started = Instant::now();
        let _ = gate.send(true);
        for key in &keys {
            pool.retrieve_async(key, Duration::from_secs(60))
                .await
                .expect("a result");
        }
        let elapsed = started.elapsed().as_secs_f64();
        pool.shutdown_with_drain(Duration::from_secs(5))
            .await
            .expect("drained");
        elapsed
    })
}

/// One round of the core alone: nanoseconds per parent end.
fn core_round(scale: &Scale, fan_in: bool) -> f64 {
    let parents = scale.parents;
    let limits = PoolLimits::new(parents as u32 + 1, parents as usize + 1)
        .with_max_queue_depth(10)
        .with_starvation(StarvationGuard::disabled());
    let mut lot = ParkingLot::new(limits).expect("valid limits");
    let ticket = |id: u64| Ticket {
        id,
        priority: Priority::Normal,
        cost: ResourceCost::cpu(1),
        created_at_ms: id,
        deadline_ms: None,
        tenant: 0,
        timeout_ms: None,
        also: Default::default(),
    };
    for id in 1..=parents {
        assert_eq!(lot.admit(ticket(id), 0), Admit::Start);
    }
    let ids: Vec<u64> = (1..=parents).collect();
    let child = parents + 1;
    if fan_in {
        assert_eq!(lot.admit_after(ticket(child), &ids, false, 0), Admit::Park);
    }
    let started = Instant::now();
    for &id in &ids {
        lot.complete(id, 1).expect("running");
        if fan_in && lot.has_children(id) {
            std::hint::black_box(lot.parent_ended(id, true, 1));
        }
    }
    let elapsed = started.elapsed().as_nanos() as f64;
    if fan_in {
        assert_eq!(
            lot.state(child),
            Some(prometheus_parking_lot::core::WakeState::Running)
        );
    }
    elapsed / parents as f64
}

fn main() {
    let scale = Scale::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (mut pool_with, mut pool_without) = (Vec::new(), Vec::new());
    let (mut core_with, mut core_without) = (Vec::new(), Vec::new());
    for round in 0..scale.rounds {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for fan_in in order {
            let seconds = pool_round(&runtime, &scale, fan_in);
            let ns = core_round(&scale, fan_in);
            if fan_in {
                pool_with.push(seconds);
                core_with.push(ns);
            } else {
                pool_without.push(seconds);
                core_without.push(ns);
            }
        }
    }
    let per_parent_us = |seconds: f64| seconds * 1e6 / scale.parents as f64;
    let (with, without) = (
        per_parent_us(support::median(&pool_with)),
        per_parent_us(support::median(&pool_without)),
    );
    println!(
        "fan-in of {} parents into one child, {WORKERS} workers, {} rounds (median)",
        scale.parents, scale.rounds
    );
    println!("| measure | with the fan-in | without dependencies | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| pool: per-parent completion | {with:.2} µs | {without:.2} µs | {:.2}x |",
        with / without
    );
    let (with, without) = (support::median(&core_with), support::median(&core_without));
    println!(
        "| core: per parent end | {with:.0} ns | {without:.0} ns | {:.2}x |",
        with / without
    );
    #[cfg(feature = "yaque")]
    on_yaque::compare(&runtime, &scale);
    #[cfg(feature = "postgres")]
    on_postgres::compare(&runtime, &scale);
}

/// The fan-in through a pool on a yaque queue (see the module docs).
#[cfg(feature = "yaque")]
mod on_yaque {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use prometheus_parking_lot::config::WorkerPoolConfig;
    use prometheus_parking_lot::core::{
        Durability, ScheduledTask, StarvationGuard, SubmitOptions, TaskMetadata,
    };
    use prometheus_parking_lot::infra::mailbox::memory::InMemoryMailbox;
    use prometheus_parking_lot::infra::queue::yaque::YaqueQueue;
    use prometheus_parking_lot::{
        MailboxKey, ResourceCost, ResourcePool, TaskExecutor, TokioSpawner,
    };
    use tokio::runtime::Runtime;
    use tokio::sync::watch;

    use super::{support, Scale, WORKERS};

    /// Waits for the gate, then returns at once.
    struct Gated(watch::Receiver<bool>);

    #[async_trait::async_trait]
    impl TaskExecutor<u64, u64> for Gated {
        async fn execute(&self, payload: u64, _meta: TaskMetadata) -> u64 {
            let mut open = self.0.clone();
            let _ = open.wait_for(|open| *open).await;
            payload
        }
    }

    /// One round through a fresh pool on a fresh queue: seconds from the gate's opening to
    /// the last result.
    fn round(runtime: &Runtime, scale: &Scale, fan_in: bool, round: usize) -> f64 {
        let dir = std::env::temp_dir().join(format!(
            "pl-bench-fan-in-{}-{round}-{fan_in}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let (gate, open) = watch::channel(false);
        let parents = scale.parents;
        let elapsed = runtime.block_on(async {
            let queue = YaqueQueue::<u64>::open(&dir, "fan-in").expect("the queue opens");
            let settings = WorkerPoolConfig::new()
                .with_name("fan-in-yaque")
                .with_worker_count(WORKERS)
                .with_max_units(WORKERS as u32)
                .with_max_queue_depth(parents as usize + 10)
                .with_starvation(StarvationGuard::disabled())
                .with_durability(Durability::Accepted);
            let pool = ResourcePool::with_settings(
                settings,
                Gated(open),
                Box::new(queue),
                Arc::new(InMemoryMailbox::new()),
                &TokioSpawner,
            )
            .expect("the pool starts");
            let key = |id: u64| MailboxKey::new("plan").with_session(format!("step-{id}"));
            let task = |id: u64| {
                let meta = TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key(id));
                ScheduledTask::new(meta, id)
            };
            let mut keys = Vec::with_capacity(parents as usize + 1);
            for id in 1..=parents {
                keys.push(pool.submit(task(id)).await.expect("parent admitted"));
            }
            let options = if fan_in {
                SubmitOptions::default().with_depends_on(1..=parents)
            } else {
                SubmitOptions::default()
            };
            let last = parents + 1;
            keys.push(
                pool.submit_with(task(last), options)
                    .await
                    .expect("child admitted"),
            );
            let started = Instant::now();
            let _ = gate.send(true);
            for key in &keys {
                pool.retrieve(key, Duration::from_secs(60))
                    .await
                    .expect("a result");
            }
            let elapsed = started.elapsed().as_secs_f64();
            pool.shutdown_with_drain(Duration::from_secs(5))
                .await
                .expect("drained");
            elapsed
        });
        let _ = std::fs::remove_dir_all(&dir);
        elapsed
    }

    /// Both runs, alternating, and the table row.
    pub fn compare(runtime: &Runtime, scale: &Scale) {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for n in 0..scale.rounds {
            let order = if n % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for fan_in in order {
                let seconds = round(runtime, scale, fan_in, n);
                if fan_in {
                    with.push(seconds);
                } else {
                    without.push(seconds);
                }
            }
        }
        let per_parent_us = |seconds: f64| seconds * 1e6 / scale.parents as f64;
        let (with, without) = (
            per_parent_us(support::median(&with)),
            per_parent_us(support::median(&without)),
        );
        println!(
            "| yaque pool (accepted): per-parent completion | {with:.2} µs | {without:.2} µs | {:.2}x |",
            with / without
        );
    }
}

/// The fan-in on the Postgres queues: the table, and pgmq with its feature (see the module
/// docs).
#[cfg(feature = "postgres")]
mod on_postgres {
    use std::time::{Duration, Instant};

    use prometheus_parking_lot::core::{
        Capacity, Carried, DependsOn, FitQuery, ScheduledTask, Settlement, SharedDependencies,
        SharedQueue, TaskMetadata,
    };
    use prometheus_parking_lot::infra::postgres::PgDatabase;
    use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
    use prometheus_parking_lot::{MailboxKey, ResourceCost};
    use tokio::runtime::Runtime;

    use super::{support, Scale};

    const NODE: &str = "bench-node";
    const LEASE: Duration = Duration::from_secs(300);

    fn now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64
    }

    fn task(id: u64) -> ScheduledTask<u64> {
        let key = MailboxKey::new("plan").with_session(format!("step-{id}"));
        ScheduledTask::new(
            TaskMetadata::new(id, ResourceCost::cpu(1)).with_mailbox(key),
            id,
        )
    }

    /// One round on `queue`, a queue of its own that keeps dependencies: microseconds per
    /// parent settle.
    async fn round<Q>(queue: &Q, parents: u64, fan_in: bool) -> f64
    where
        Q: SharedQueue<u64> + SharedDependencies<u64>,
    {
        let now = now_ms();
        let parked = queue
            .enqueue_many(
                (1..=parents)
                    .map(|id| (id, now, task(id), Carried::default()))
                    .collect(),
            )
            .await;
        assert!(parked.iter().all(Result::is_ok), "the parents are parked");
        let everything = FitQuery::within(Capacity::uniform(u32::MAX));
        let leases = queue
            .claim_batch(NODE, &everything, parents as usize, LEASE, now_ms())
            .await
            .expect("claim the parents");
        assert_eq!(leases.len() as u64, parents, "every parent is claimed");
        let child = parents + 1;
        let depends_on = DependsOn {
            parents: (1..=parents).collect(),
            run_anyway: false,
        };
        if fan_in {
            queue
                .enqueue_waiting(child, now, task(child), Carried::default(), &depends_on)
                .await
                .expect("the child waits");
        }
        let started = Instant::now();
        for lease in &leases {
            queue
                .settle(NODE, lease.claim(), Settlement::Done)
                .await
                .expect("settled");
        }
        let elapsed = started.elapsed();
        if fan_in {
            let claimed = queue
                .claim_best_fit(NODE, &everything, LEASE, now_ms())
                .await
                .expect("claim the child");
            assert_eq!(
                claimed.map(|lease| lease.entry),
                Some(child),
                "the child is released by its last parent's settle"
            );
        }
        elapsed.as_secs_f64() * 1e6 / parents as f64
    }

    /// Runs `statements` on `cleaner`.
    fn clean(runtime: &Runtime, cleaner: &sea_orm::DatabaseConnection, statements: &str) {
        use sea_orm::ConnectionTrait;
        runtime
            .block_on(cleaner.execute_unprepared(statements))
            .expect("clean up after a round");
    }

    /// A round on the table queue.
    fn table_round(
        runtime: &Runtime,
        database: &PgDatabase,
        cleaner: &sea_orm::DatabaseConnection,
        parents: u64,
        fan_in: bool,
    ) -> f64 {
        let name = format!("fan_in_{}_{}_{fan_in}", std::process::id(), now_ms());
        // Both rounds on a queue that keeps dependencies, so that the ratio is the fan-in's.
        let queue = PostgresQueue::<u64>::open(database, "pl_queue_jobs", &name)
            .expect("open")
            .with_dependencies()
            .expect("keep dependencies");
        let micros = runtime.block_on(round(&queue, parents, fan_in));
        // The next round starts on a table without this one's dead rows and edges, whether
        // or not the server's autovacuum would have come by (with it off, each round left a
        // thousand dead edges and child versions behind, and later rounds were slower for
        // it). `VACUUM` runs outside a transaction: a statement of its own.
        clean(
            runtime,
            cleaner,
            &format!("DELETE FROM pl_queue_jobs WHERE queue_name = '{name}'"),
        );
        clean(
            runtime,
            cleaner,
            "VACUUM pl_queue_jobs, pl_queue_jobs_parents",
        );
        micros
    }

    /// A round on a pgmq queue of its own that keeps dependencies.
    #[cfg(feature = "pgmq")]
    fn pgmq_round(
        runtime: &Runtime,
        database: &PgDatabase,
        cleaner: &sea_orm::DatabaseConnection,
        parents: u64,
        fan_in: bool,
    ) -> f64 {
        use prometheus_parking_lot::infra::queue::pgmq::PgmqQueue;
        let name = format!("fan_in_{}_{}_{fan_in}", std::process::id(), now_ms());
        let queue = PgmqQueue::<u64>::open(database, &name)
            .expect("open")
            .with_dependencies();
        let micros = runtime.block_on(round(&queue, parents, fan_in));
        let drops: Vec<String> = queue
            .pgmq_queues()
            .iter()
            .map(|level| format!("SELECT pgmq.drop_queue('{level}');"))
            .collect();
        clean(
            runtime,
            cleaner,
            &format!(
                "{} DELETE FROM pl_pgmq_entries WHERE queue_name = '{name}'; \
                 DELETE FROM pl_pgmq_edges WHERE queue_name = '{name}';",
                drops.concat()
            ),
        );
        clean(runtime, cleaner, "VACUUM pl_pgmq_entries, pl_pgmq_edges");
        micros
    }

    /// Prints the Postgres row of the table: per parent settle, with and without the child.
    pub fn compare(runtime: &Runtime, scale: &Scale) {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let database = PgDatabase::connect(&url).unwrap_or_else(|error| {
            panic!("the Postgres fan-in needs a server at DATABASE_URL or 127.0.0.1:5432: {error}")
        });
        let cleaner = runtime
            .block_on(sea_orm::Database::connect(&url))
            .expect("a connection to purge with");
        let rounds = if support::measured() {
            support::env_u64("FAN_IN_PG_ROUNDS", 3) as usize
        } else {
            1
        };
        type Round = fn(&Runtime, &PgDatabase, &sea_orm::DatabaseConnection, u64, bool) -> f64;
        let queues: &[(&str, Round)] = &[
            ("postgres table queue", table_round),
            #[cfg(feature = "pgmq")]
            ("pgmq queue", pgmq_round),
        ];
        for (label, run) in queues {
            let (mut with, mut without) = (Vec::new(), Vec::new());
            for index in 0..rounds {
                let order = if index % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                };
                for fan_in in order {
                    let micros = run(runtime, &database, &cleaner, scale.parents, fan_in);
                    if fan_in {
                        with.push(micros);
                    } else {
                        without.push(micros);
                    }
                }
            }
            let (with, without) = (support::median(&with), support::median(&without));
            println!(
                "| {label}: per parent settle ({rounds} rounds) | {with:.0} µs | \
                 {without:.0} µs | {:.2}x |",
                with / without
            );
        }
    }
}
