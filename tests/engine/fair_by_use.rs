//! The fair share by use through a running pool: tenant weights from a configuration file
//! reach the core under the tenants' names, and what an executor reports with
//! `running::report_used` reaches its tenant's counter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_parking_lot::config::WorkerPoolConfig;
use prometheus_parking_lot::core::{
    FairByUse, StarvationGuard, SubmitOptions, TaskMetadata, TenantWeights, UsageCharge,
    WorkerExecutor, WorkerPool,
};
use prometheus_parking_lot::running;
use prometheus_parking_lot::util::serde::{MailboxKey, ResourceCost};
use prometheus_parking_lot::{ScheduledTask, SchedulerConfig};
use tokio::sync::Semaphore;

/// What a test task does: report `used` units, then wait for the gate.
struct Work {
    tenant: &'static str,
    used: Option<u64>,
}

/// Records the tenant of every task it starts, in order, each run waiting for a permit.
#[derive(Clone)]
struct Serve {
    order: Arc<Mutex<Vec<&'static str>>>,
    gate: Arc<Semaphore>,
}

#[async_trait::async_trait]
impl WorkerExecutor<Work, ()> for Serve {
    async fn execute(&self, work: Work, _meta: TaskMetadata) {
        self.order.lock().unwrap().push(work.tenant);
        if let Some(used) = work.used {
            assert!(running::report_used(used), "inside a run");
        }
        self.gate.acquire().await.expect("gate open").forget();
    }
}

fn serve() -> Serve {
    Serve {
        order: Arc::default(),
        gate: Arc::new(Semaphore::new(0)),
    }
}

fn task(id: u64, tenant: &'static str, units: u32, used: Option<u64>) -> ScheduledTask<Work> {
    ScheduledTask {
        meta: TaskMetadata::new(id, ResourceCost::gpu_vram(units))
            .with_mailbox(MailboxKey::new(tenant)),
        payload: Work { tenant, used },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_from_a_configuration_file_serve_three_to_one() {
    let text = r#"{ "pools": { "p": {
        "worker_threads": 1, "max_units": 10, "starvation": {},
        "fair_share": { "by_use": { "charge": "reported", "weights": { "acme": 3, "*": 1 } } }
    } } }"#;
    let config = SchedulerConfig::from_json_str(text).unwrap();
    let settings = config.worker_pool_config("p", 10).unwrap();
    assert_eq!(settings.tenant_weights.get("acme"), Some(3));
    let serve = serve();
    let pool = WorkerPool::new(settings, serve.clone()).unwrap();
    let client = pool.client();
    // The first task holds the only worker while both tenants' backlogs park behind it.
    // (Costs of 3 keep the weighted charges whole: 1 for acme, 3 for globex.)
    let mut keys = vec![client
        .submit(task(0, "acme", 3, None), SubmitOptions::default())
        .await
        .unwrap()];
    for n in 1..=12 {
        keys.push(
            client
                .submit(task(n, "acme", 3, None), SubmitOptions::default())
                .await
                .unwrap(),
        );
        keys.push(
            client
                .submit(task(100 + n, "globex", 3, None), SubmitOptions::default())
                .await
                .unwrap(),
        );
    }
    serve.gate.add_permits(keys.len());
    for key in &keys {
        client.retrieve(key, Duration::from_secs(10)).await.unwrap();
    }
    let order = serve.order.lock().unwrap().clone();
    // While both wait (the 16 starts after the first), acme is served three to one.
    let acme = order[1..17].iter().filter(|&&t| t == "acme").count();
    assert_eq!(acme, 12, "{order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_use_reaches_the_tenants_counter() {
    let order = FairByUse::new(UsageCharge::Reported);
    let settings = WorkerPoolConfig::new()
        .with_worker_count(1)
        .with_max_units(10)
        .with_starvation(StarvationGuard::disabled())
        .with_fair_share_by_use(order, TenantWeights::default().with("acme", 2));
    let serve = serve();
    let pool = WorkerPool::new(settings, serve.clone()).unwrap();
    let client = pool.client();
    // A task declaring 8 whose reply used 2 (at weight 2: charged 1, not 4).
    serve.gate.add_permits(1);
    let first = client
        .submit(task(1, "acme", 8, Some(2)), SubmitOptions::default())
        .await
        .unwrap();
    client
        .retrieve(&first, Duration::from_secs(10))
        .await
        .unwrap();
    // The next one runs, charged its 8 ahead (4 at weight 2) until it ends.
    let second = client
        .submit(task(2, "acme", 8, None), SubmitOptions::default())
        .await
        .unwrap();
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    let view = loop {
        let view = client.inspect(0, 10).await.unwrap();
        if view.running.len() == 1 {
            break view;
        }
        assert!(std::time::Instant::now() < give_up, "task 2 never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let acme = &view.tenants[0];
    assert_eq!((acme.service, acme.weight), (Some(5.0), Some(2)));
    serve.gate.add_permits(1);
    client
        .retrieve(&second, Duration::from_secs(10))
        .await
        .unwrap();
}

#[test]
fn weights_without_an_order_by_use_are_refused_naming_the_field() {
    let settings = WorkerPoolConfig::new()
        .with_worker_count(1)
        .with_fair_share_by_use(
            FairByUse::new(UsageCharge::Held),
            TenantWeights::default().with("acme", 0),
        );
    let error = WorkerPool::new(settings, serve()).err().expect("refused");
    assert!(
        error.to_string().contains(
            "fair_share.by_use.weights.acme: 0 is not allowed; use a whole number from 1 to \
             1000000 (a tenant of weight 3 is served three times what one of weight 1 is)"
        ),
        "{error}"
    );
}
