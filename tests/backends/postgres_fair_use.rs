//! The fleet's fair share by use on the Postgres table queue, charged and settled: a claim
//! charges its tenant ahead (its units, or its units times the node's timeout), and the
//! node that ran the task settles the charge to what the run used
//! (`SharedFairShare::settle_use`), as a node's core settles its own counters: what was not
//! used is given back, down to the floor; a `held` task charged nothing ahead (no timeout)
//! is charged its unit-milliseconds at its end.

use std::time::Duration;

use prometheus_parking_lot::core::{
    Capacity, FairByUse, FitQuery, RunUse, SharedFairShare, SharedQueue, TenantWeights, UsageCharge,
};
use prometheus_parking_lot::infra::queue::postgres::PostgresQueue;
use prometheus_parking_lot::util::serde::TenantId;
use sea_orm::{ConnectionTrait, Statement};

use crate::conformance::queue::{at, task};
use crate::conformance::Job;
use crate::postgres_backends::database;
use crate::postgres_pools::fresh_name;

use prometheus_parking_lot::util::serde::{Priority, ResourceKind};

/// A fresh table queue whose claims share counters charging `charge`, tenant `acme` of
/// weight 2, with the node's timeout `timeout_ms`.
async fn queue(charge: UsageCharge, timeout_ms: Option<u64>) -> Fleet {
    let name = fresh_name("fair_use");
    let queue = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            PostgresQueue::<Job>::open(&database(), "pl_queue_jobs", &name).expect("open")
        })
        .await
        .expect("opening does not panic")
    };
    let weights = TenantWeights::default().with("acme", 2);
    let fair_share =
        SharedQueue::<Job>::fair_share(&queue).expect("the table queue shares its counters");
    fair_share
        .share_fair_by_use(FairByUse::new(charge), &weights, timeout_ms)
        .await
        .expect("share the counters");
    Fleet { queue, name }
}

/// A queue and its name.
struct Fleet {
    queue: PostgresQueue<Job>,
    name: String,
}

/// Parks task `id` of `units` CPU units for tenant acme (the suite's tasks are acme's),
/// admitted `at_offset` ms after the suite's epoch, and claims it.
async fn park_and_claim(fleet: &Fleet, id: u64, units: u32, at_offset: u64) {
    let job = task(
        id,
        Priority::Normal,
        at_offset,
        ResourceKind::Cpu,
        units,
        None,
    );
    let queue = &fleet.queue;
    queue
        .enqueue(id, at(at_offset), job)
        .await
        .expect("enqueue");
    let claimed = queue
        .claim_batch(
            "node",
            &FitQuery::within(Capacity::uniform(8)),
            1,
            Duration::from_secs(30),
            at(at_offset),
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "the task is claimed");
}

/// Tenant acme's counter in the fleet's table.
async fn counter(fleet: &Fleet) -> f64 {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let connection = sea_orm::Database::connect(url).await.expect("connect");
    let row = connection
        .query_one_raw(Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "SELECT service FROM pl_fleet_service WHERE queue_key LIKE $1 AND tenant = 'acme'",
            [format!("% {}", fleet.name).into()],
        ))
        .await
        .expect("read the counter")
        .expect("acme has a counter");
    let service = row.try_get("", "service").expect("a number");
    let _ = connection.close().await;
    service
}

fn used(units: u32, held_unit_ms: f64, reported: Option<u64>) -> RunUse {
    RunUse {
        units,
        held_unit_ms,
        reported,
        started_ms: u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis(),
        )
        .expect("fits"),
    }
}

fn acme() -> TenantId {
    TenantId("acme".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_charge_is_units_times_the_timeout_ahead_then_the_time_held() {
    let fleet = queue(UsageCharge::Held, Some(1_000)).await;
    park_and_claim(&fleet, 1, 2, 0).await;
    assert!(
        (counter(&fleet).await - 1_000.0).abs() < 1e-6,
        "2 x 1000 ms / 2"
    );
    fleet
        .queue
        .settle_use(&acme(), used(2, 500.0, None))
        .await
        .expect("settle");
    let settled = counter(&fleet).await;
    assert!(
        (settled - 250.0).abs() < 1e-6,
        "500 unit-ms / 2, not {settled}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_charge_is_the_declared_units_ahead_then_what_was_reported() {
    let fleet = queue(UsageCharge::Reported, None).await;
    park_and_claim(&fleet, 1, 4, 0).await;
    assert!((counter(&fleet).await - 2.0).abs() < 1e-9, "4 units / 2");
    fleet
        .queue
        .settle_use(&acme(), used(4, 0.0, Some(1)))
        .await
        .expect("settle");
    let settled = counter(&fleet).await;
    assert!((settled - 0.5).abs() < 1e-9, "1 unit / 2, not {settled}");
    // A report above the declared cost is charged the declared cost: nothing changes.
    park_and_claim(&fleet, 2, 4, 1).await;
    assert!((counter(&fleet).await - 2.5).abs() < 1e-9, "0.5 + 4 / 2");
    fleet
        .queue
        .settle_use(&acme(), used(4, 0.0, Some(9)))
        .await
        .expect("settle");
    assert!((counter(&fleet).await - 2.5).abs() < 1e-9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_task_without_a_timeout_is_charged_at_its_end() {
    let fleet = queue(UsageCharge::Held, None).await;
    park_and_claim(&fleet, 1, 2, 0).await;
    assert!(
        counter(&fleet).await.abs() < 1e-9,
        "nothing bounds it ahead"
    );
    fleet
        .queue
        .settle_use(&acme(), used(2, 300.0, None))
        .await
        .expect("settle");
    assert!(
        (counter(&fleet).await - 150.0).abs() < 1e-6,
        "300 unit-ms / 2"
    );
}

/// Reports `payload` units used, once the gate lets it through.
#[derive(Clone)]
struct Reporter {
    gate: std::sync::Arc<tokio::sync::Semaphore>,
}

#[async_trait::async_trait]
impl prometheus_parking_lot::TaskExecutor<u64, u64> for Reporter {
    async fn execute(&self, used: u64, _meta: prometheus_parking_lot::core::TaskMetadata) -> u64 {
        self.gate.acquire().await.expect("gate open").forget();
        assert!(
            prometheus_parking_lot::running::report_used(used),
            "inside a run"
        );
        used
    }
}

/// Through a pool built from a configuration file: a task that waited in the table queue
/// is charged its declared units by the claim that takes it, and settled to the units its
/// executor reported when it ends; a task that started at once was never charged, and its
/// end changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_settles_what_its_claimed_runs_reported() {
    use prometheus_parking_lot::core::{ScheduledTask, TaskMetadata};
    use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
    use prometheus_parking_lot::{
        build_pools_from_scheduler_config, QueueBuilderContext, SchedulerConfig, TokioSpawner,
    };
    let name = fresh_name("fair_pool");
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let text = serde_json::json!({
        "database_url": url,
        "pools": { "work": {
            "worker_threads": 1, "max_units": 8,
            "queue": { "type": "postgres", "queue_name": name },
            "fair_share": { "by_use": { "charge": "reported", "weights": { "acme": 2 } } }
        } }
    })
    .to_string();
    let config = SchedulerConfig::from_json_str(&text).expect("valid");
    let reporter = Reporter {
        gate: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let built = tokio::task::block_in_place(|| {
        build_pools_from_scheduler_config::<u64, u64, Reporter, TokioSpawner>(
            &config,
            &QueueBuilderContext::Embedded,
            None,
            |_| reporter.clone(),
            TokioSpawner,
        )
    })
    .expect("the pool starts");
    let pool = &built.pools["work"];
    // Acme was served before: its counter is at 10 (and the floor at 0).
    let key = format!("postgres table pl_queue_jobs {name}");
    let url_for_sql = url.clone();
    let connection = sea_orm::Database::connect(url_for_sql)
        .await
        .expect("connect");
    connection
        .execute_raw(Statement::from_sql_and_values(
            sea_orm::DbBackend::Postgres,
            "INSERT INTO pl_fleet_service (queue_key, tenant, service, at_ms) \
             VALUES ($1, 'acme', 10, (extract(epoch from clock_timestamp()) * 1000)::bigint)",
            [key.into()],
        ))
        .await
        .expect("set acme's counter");
    let _ = connection.close().await;
    // Each task declares 4 units and reports using `used` of them.
    let submit = |id: u64, used: u64| {
        let meta =
            TaskMetadata::new(id, ResourceCost::cpu(4)).with_mailbox(MailboxKey::new("acme"));
        pool.submit(ScheduledTask::new(meta, used))
    };
    // Task 1 starts at once on this node, stored as its claim (the default durability):
    // the fleet charged nothing for it, so its end settles nothing there (were it settled,
    // acme would fall to 8.5 first). Task 2 waits in the table until the node claims it:
    // charged 4 / 2 from acme's 10, to 12, it settles to 10 + 3 / 2 = 11.5 (a refund of 0.5,
    // above the floor of 10 the claim's pick set).
    let first = submit(1, 1).await.expect("submit");
    let second = submit(2, 3).await.expect("submit");
    reporter.gate.add_permits(2);
    for (key, used) in [(&first, 1), (&second, 3)] {
        assert_eq!(pool.retrieve(key, Duration::from_secs(10)).await, Ok(used));
    }
    let fleet = Fleet {
        queue: tokio::task::spawn_blocking({
            let name = name.clone();
            move || PostgresQueue::<Job>::open(&database(), "pl_queue_jobs", &name).expect("open")
        })
        .await
        .expect("opening does not panic"),
        name,
    };
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let service = counter(&fleet).await;
        if (service - 12.0).abs() > 1e-3 {
            assert!(
                (service - 11.5).abs() < 1e-3,
                "acme's counter is {service}: 10, charged 4 / 2 by task 2's claim, settles \
                 to 10 + 3 / 2 (task 1, charged nothing, gives nothing back)"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "acme's counter is {service}: task 2's settlement never came"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Weights hold across claims in flight under `held` with a timeout: tenants acme (weight 3)
/// and globex (weight 1) always waiting, two claims at a time (two workers), each run using
/// 26 ms of its 100 ms timeout. acme gets about three claims for each of globex's. (A floor
/// that followed the lowest *charged* counter lifted each refund onto the other tenant's
/// counter, and the two alternated: 20 and 20.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_hold_with_claims_in_flight_under_held() {
    use prometheus_parking_lot::core::{ScheduledTask, TaskMetadata};
    use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};

    let name = fresh_name("fair_weights");
    let queue = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            PostgresQueue::<Job>::open(&database(), "pl_queue_jobs", &name).expect("open")
        })
        .await
        .expect("opening does not panic")
    };
    let weights = TenantWeights::default().with("acme", 3);
    SharedQueue::<Job>::fair_share(&queue)
        .expect("the table queue shares its counters")
        .share_fair_by_use(FairByUse::new(UsageCharge::Held), &weights, Some(100))
        .await
        .expect("share the counters");
    for id in 1..=60u64 {
        for (tenant, offset) in [("acme", 0), ("globex", 1_000)] {
            let meta = TaskMetadata::new(id + offset, ResourceCost::cpu(1))
                .with_mailbox(MailboxKey::new(tenant));
            let task = ScheduledTask::new(meta, Job::for_task(id + offset));
            queue
                .enqueue(id + offset, at(id), task)
                .await
                .expect("enqueue");
        }
    }
    let mut claims = [0u32; 2];
    for round in 0..20u64 {
        let leases = queue
            .claim_batch(
                "node",
                &FitQuery::within(Capacity::uniform(2)),
                2,
                Duration::from_secs(30),
                at(1_000 + round),
            )
            .await
            .expect("claim");
        assert_eq!(leases.len(), 2, "two claims a round");
        for lease in leases {
            let tenant = lease
                .task
                .meta
                .mailbox
                .as_ref()
                .map(|key| key.tenant.clone())
                .expect("a key");
            claims[usize::from(tenant.0 != "acme")] += 1;
            queue
                .settle_use(&tenant, used(1, 26.0, None))
                .await
                .expect("settle");
        }
    }
    assert!(
        (28..=32).contains(&claims[0]) && (8..=12).contains(&claims[1]),
        "acme {} and globex {} claims of 40 (weights 3 and 1)",
        claims[0],
        claims[1]
    );
}
