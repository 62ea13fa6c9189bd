//! A node of a Postgres table queue while its server really restarts (`pg_ctlcluster ...
//! restart`, the server on this machine): tasks submitted before the restart all end with
//! their results, the node claims again once the server is back, and submissions made the
//! moment it accepts connections again are accepted at their first try.
//!
//! A binary of its own, since it stops the server every other test uses: cargo runs test
//! binaries one after another, and this one waits for the server before it ends. It restarts
//! only a server on this machine (`DATABASE_URL` at 127.0.0.1 or localhost) that
//! `pg_ctlcluster` manages; elsewhere it says why it did nothing, and fails instead when
//! `PL_REQUIRE_RESTART` is set (as `scripts/test.sh` sets it where it can restart one).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_parking_lot::util::serde::MailboxKey;
use prometheus_parking_lot::SchedulerConfig;

#[path = "support/postgres_pools.rs"]
mod postgres_pools;

use postgres_pools::{build_embedded, fresh_name, server_url, submit_at_once, work};

fn main() {
    let restart = match restart_command() {
        Ok(restart) => restart,
        Err(why) if std::env::var_os("PL_REQUIRE_RESTART").is_some() => {
            panic!("PL_REQUIRE_RESTART is set, but the server cannot be restarted here: {why}")
        }
        Err(why) => {
            eprintln!("postgres_restart: nothing done: {why}");
            return;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(a_node_rides_over_a_real_restart(restart));
    println!("postgres_restart: ok");
}

/// The command that restarts the local server, or why there is none.
fn restart_command() -> Result<Command, String> {
    let url = server_url();
    let host = url
        .rsplit('@')
        .next()
        .and_then(|rest| rest.split([':', '/']).next())
        .unwrap_or_default();
    if host != "127.0.0.1" && host != "localhost" {
        return Err(format!(
            "DATABASE_URL names host {host:?}, not this machine"
        ));
    }
    let versions = std::fs::read_dir("/etc/postgresql")
        .map_err(|error| format!("no /etc/postgresql ({error}): no pg_ctlcluster cluster"))?;
    let version = versions
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or("/etc/postgresql holds no cluster")?;
    let mut command = Command::new("pg_ctlcluster");
    command.args(["--skip-systemctl-redirect", &version, "main", "restart"]);
    Ok(command)
}

async fn a_node_rides_over_a_real_restart(mut restart: Command) {
    let (queue, table) = (fresh_name("restart"), fresh_name("pl_restart_jobs"));
    let config = serde_json::json!({
        "database_url": server_url(),
        "pools": { "gpu": {
            "worker_threads": 2,
            "max_units": 2,
            "queue": { "type": "postgres", "table": table, "queue_name": queue,
                       "lease_ms": 6_000 },
            "mailbox": { "storage": { "type": "in_memory" } }
        } }
    });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
    let built = Arc::new(build_embedded(config).await);
    let key = MailboxKey::new("acme").with_session(fresh_name("restart"));
    // Two run at once (100 ms each); the rest park in the table, across the restart.
    for id in 1..=20 {
        built.pools["gpu"]
            .submit(work(id, id, 100, &key))
            .await
            .expect("accepted before the restart");
    }

    let started_before = server_start().await;
    let restarted = tokio::task::spawn_blocking(move || restart.output())
        .await
        .expect("the restart does not panic")
        .expect("pg_ctlcluster runs");
    assert!(
        restarted.status.success(),
        "pg_ctlcluster restart failed: {}",
        String::from_utf8_lossy(&restarted.stderr)
    );
    // The server accepts connections again: submit six at once, each at its first try.
    let back = Instant::now();
    let submits = submit_at_once(&built, 21..=26, &key);
    assert_ne!(
        server_start().await,
        started_before,
        "the server was restarted"
    );
    for submit in submits {
        let (id, accepted) = submit.await.expect("the submit does not panic");
        assert!(
            accepted.is_ok(),
            "task {id}, submitted {:?} after the server was back: {accepted:?}",
            back.elapsed()
        );
    }
    for id in 1..=26 {
        let result = built.pools["gpu"]
            .retrieve_task(&key, id, Duration::from_secs(60))
            .await;
        assert_eq!(result, Ok(id * 2), "task {id}");
    }
    let built = Arc::into_inner(built).expect("the submits are done");
    built
        .shutdown(Duration::from_secs(10))
        .await
        .expect("the node stops");
    let admin = sea_orm::Database::connect(server_url())
        .await
        .expect("connect as admin");
    sea_orm::ConnectionTrait::execute_unprepared(&admin, &format!("DROP TABLE IF EXISTS {table}"))
        .await
        .expect("drop the table");
}

/// When the server last started, as it says (`pg_postmaster_start_time()`).
async fn server_start() -> String {
    let admin = sea_orm::Database::connect(server_url())
        .await
        .expect("connect as admin");
    let row = sea_orm::ConnectionTrait::query_one_raw(
        &admin,
        sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT pg_postmaster_start_time()::text AS started",
        ),
    )
    .await
    .expect("read the start time")
    .expect("a row");
    let started: String = row.try_get("", "started").expect("started");
    let _ = admin.close().await;
    started
}
