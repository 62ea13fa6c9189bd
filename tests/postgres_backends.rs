//! The Postgres backends against the conformance suites, on the real server
//! (`DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`), plus what only they
//! do: tables created by many processes at once, rows that cannot be read, dead letters.
#![cfg(feature = "postgres")]

#[allow(dead_code)]
mod conformance;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use conformance::{mailbox, shared_queue, Job};
use prometheus_parking_lot::core::{Mailbox, SharedQueue};
use prometheus_parking_lot::infra::mailbox::postgres::PostgresMailbox;
use prometheus_parking_lot::infra::postgres::PgDatabase;
use prometheus_parking_lot::infra::queue::postgres::{PostgresQueue, RetryPolicy};

/// The database every test uses; the tests fail (never skip) when it cannot be reached.
fn database() -> PgDatabase {
    static DATABASE: OnceLock<PgDatabase> = OnceLock::new();
    DATABASE
        .get_or_init(|| {
            let url = std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            PgDatabase::connect(&url).unwrap_or_else(|error| {
                panic!(
                    "the Postgres tests need a server at DATABASE_URL (or 127.0.0.1:5432, \
                     database test); run scripts/test.sh, which starts a local one: {error}"
                )
            })
        })
        .clone()
}

/// A queue name no other test (or earlier run) uses.
fn fresh_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Retries off, as the shared-queue suite expects: a rescued task is claimable at once and
/// never dead-lettered.
const NO_RETRY_DELAY: RetryPolicy = RetryPolicy {
    max_attempts: u32::MAX,
    base: Duration::ZERO,
    max: Duration::ZERO,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_conforms() {
    let database = database();
    shared_queue::run_all(|| {
        let database = database.clone();
        async move {
            let queue = tokio::task::spawn_blocking(move || {
                PostgresQueue::<Job>::open(&database, "pl_queue_jobs", &fresh_name("conformance"))
                    .expect("open the queue")
                    .with_retry(NO_RETRY_DELAY)
            })
            .await
            .expect("opening does not panic");
            Box::new(queue) as Box<dyn SharedQueue<Job>>
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_mailbox_conforms() {
    let database = database();
    mailbox::run_all(|| {
        let database = database.clone();
        async move {
            let table = fresh_name("conformance_mailbox");
            let mailbox = tokio::task::spawn_blocking(move || {
                PostgresMailbox::<String>::open(&database, &table).expect("open the mailbox")
            })
            .await
            .expect("opening does not panic");
            Arc::new(mailbox) as Arc<dyn Mailbox<String>>
        }
    })
    .await;
}
