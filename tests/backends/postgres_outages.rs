//! A shared Postgres queue while its database is away, as an operator's bad day goes: the
//! server's port refuses connections (what a stopped server does), the network drops them
//! without an answer, the server refuses the node's credentials, its disk is full. Each
//! submit that would park answers with an error that names the pool, the queue and the
//! cause and says what to do, and answers within the stated bound even when many submit at
//! once; the pool works again when the database is back.
//!
//! The real server is never stopped (other tests share it): a TCP proxy in front of it is cut
//! the way each fault cuts, the credentials are a role of the test's own that loses its
//! login, and the full disk is the server's own `disk_full` error, raised by a trigger on the
//! test's own table.
#![cfg(feature = "postgres")]

use crate::postgres_pools;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres_pools::{build_embedded, fresh_name, server_url, submit_at_once, work, Doubler, Work};
use prometheus_parking_lot::core::{FaultKind, PoolError};
use prometheus_parking_lot::util::serde::{MailboxKey, TaskId};
use prometheus_parking_lot::{BuiltPools, SchedulerConfig};
use sea_orm::ConnectionTrait;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the pools' errors promise: the first statement that meets an outage answers within
/// 5 s (the pool's wait for a connection) plus 1 s (a probe of the server); later ones sooner.
const BOUND: Duration = Duration::from_secs(6);

/// Slack for a loaded test machine.
const SLACK: Duration = Duration::from_millis(1_500);

/// The server's `host:port`.
fn server_address() -> String {
    let url = server_url();
    let after_at = url.rsplit('@').next().unwrap_or("127.0.0.1:5432/test");
    after_at
        .split('/')
        .next()
        .unwrap_or("127.0.0.1:5432")
        .to_owned()
}

/// Runs `sql` on a connection of the test's own, as the server's superuser.
async fn admin(sql: &str) {
    let connection = sea_orm::Database::connect(server_url())
        .await
        .expect("connect as admin");
    connection
        .execute_unprepared(sql)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
    let _ = connection.close().await;
}

// ---------------------------------------------------------------------------------------------
// The proxy
// ---------------------------------------------------------------------------------------------

/// How the proxy treats connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// None: connections reach the server.
    None,
    /// Nothing listens on the port: connections are refused, as by a stopped server.
    Refused,
    /// Connections are accepted and never answered, as behind a firewall that drops packets.
    Silent,
}

/// A TCP proxy in front of the server that can be cut the way a [`Fault`] cuts.
struct Proxy {
    port: u16,
    /// How new connections are treated now; the accept loop reads it for each one, so a
    /// change between faults that keep the port open never leaves it closed for a moment.
    fault: Arc<Mutex<Fault>>,
    /// The accept loop, while the port listens.
    accepting: Mutex<Option<JoinHandle<()>>>,
    /// Connections under way (forwarded, or held without an answer).
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("its address").port();
        let proxy = Self {
            port,
            fault: Arc::new(Mutex::new(Fault::None)),
            accepting: Mutex::new(None),
            connections: Arc::default(),
        };
        proxy.listen(listener);
        proxy
    }

    fn url(&self) -> String {
        server_url().replace(&server_address(), &format!("127.0.0.1:{}", self.port))
    }

    fn listen(&self, listener: TcpListener) {
        let connections = Arc::clone(&self.connections);
        let fault = Arc::clone(&self.fault);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                // Read under the connections' lock, which `cut` holds while it changes the
                // fault and drops what is under way: no connection escapes a cut.
                let mut under_way = connections.lock().unwrap();
                let now = *fault.lock().unwrap();
                under_way.push(tokio::spawn(serve(client, now)).abort_handle());
            }
        });
        *self.accepting.lock().unwrap() = Some(accepting);
    }

    /// Treats new connections as `fault` does and drops every connection under way (so a
    /// client that reconnects at once meets the new fault, never a gap between two).
    async fn cut(&self, fault: Fault) {
        if fault == Fault::Refused {
            let accepting = self.accepting.lock().unwrap().take();
            if let Some(accepting) = accepting {
                accepting.abort();
                let _ = accepting.await;
            }
        }
        {
            let mut under_way = self.connections.lock().unwrap();
            *self.fault.lock().unwrap() = fault;
            for connection in under_way.drain(..) {
                connection.abort();
            }
        }
        let listening = self.accepting.lock().unwrap().is_some();
        if fault != Fault::Refused && !listening {
            let address = format!("127.0.0.1:{}", self.port);
            let listener = TcpListener::bind(&address).await.expect("the port again");
            self.listen(listener);
        }
    }
}

/// Serves one client connection as `fault` says.
async fn serve(mut client: TcpStream, fault: Fault) {
    match fault {
        Fault::None => {
            if let Ok(mut server) = TcpStream::connect(server_address()).await {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            }
        }
        // Held open, never answered, until the proxy drops it.
        Fault::Silent | Fault::Refused => std::future::pending::<()>().await,
    }
}

// ---------------------------------------------------------------------------------------------
// The pool
// ---------------------------------------------------------------------------------------------

/// Pool `gpu` (one worker, one unit) on queue `queue`, of `kind` (`postgres` in `table`, or
/// `postgres_pgmq`), at `url`, built off the test's runtime as users build it.
async fn pool(url: String, kind: &str, queue: &str, table: &str) -> BuiltPools<Work, u64, Doubler> {
    let mut settings = serde_json::json!({ "type": kind, "queue_name": queue, "lease_ms": 3_000 });
    if kind == "postgres" {
        settings["table"] = table.into();
    }
    let config = serde_json::json!({
        "database_url": url,
        "pools": { "gpu": {
            "worker_threads": 1,
            "max_units": 1,
            "queue": settings,
            "mailbox": { "storage": { "type": "in_memory" } }
        } }
    });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
    build_embedded(config).await
}

/// Submits tasks `ids` to `built`'s pool at once, while its only unit is taken; returns each
/// one's error and how long it took to answer.
async fn submit_parking(
    built: &Arc<BuiltPools<Work, u64, Doubler>>,
    ids: std::ops::RangeInclusive<TaskId>,
    key: &MailboxKey,
    kind: FaultKind,
) -> Vec<JoinHandle<(TaskId, Duration, String)>> {
    ids.map(|id| {
        let (built, key) = (Arc::clone(built), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let refused = built.pools["gpu"].submit(work(id, id, 0, &key)).await;
            // A database that fails is a variant a caller can match on: the backend error
            // names the pool and the operation, and its fault's kind says whether to retry.
            let text = match refused {
                Err(PoolError::Backend(error))
                    if error.fault.kind == kind
                        && error.pool == "gpu"
                        && error.operation == "park a task" =>
                {
                    assert!(std::error::Error::source(&error).is_some());
                    error.to_string()
                }
                other => {
                    panic!("task {id}: a submit while the database is away must fail: {other:?}")
                }
            };
            (id, started.elapsed(), text)
        })
    })
    .collect()
}

/// Submits one task that parks during the outage, then, while its park is in flight, six more
/// at once; checks that each answers within the bound with an error naming the pool,
/// `queue` and `cause`, and saying `advice`.
async fn every_submit_answers_in_time(
    built: &Arc<BuiltPools<Work, u64, Doubler>>,
    key: &MailboxKey,
    (queue, cause, advice): (&str, &str, &str),
) {
    let mut answers = submit_parking(built, 2..=2, key, FaultKind::Unreachable).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    answers.extend(submit_parking(built, 3..=8, key, FaultKind::Unreachable).await);
    for answer in answers {
        let (id, took, text) = answer.await.expect("the submit does not panic");
        eprintln!("task {id} answered after {took:?}: {text}");
        assert!(
            took <= BOUND + SLACK,
            "task {id} answered after {took:?}, beyond the bound of {BOUND:?}: {text}"
        );
        for part in [
            "could not park a task",
            "pool \"gpu\"",
            &format!("queue {queue:?}"),
            cause,
            advice,
        ] {
            assert!(
                text.contains(part),
                "task {id}: {part:?} is missing from: {text}"
            );
        }
    }
}

/// Submits task `id` until the pool accepts it again (the database is back), within 10 s.
async fn submit_once_back(built: &BuiltPools<Work, u64, Doubler>, id: TaskId, key: &MailboxKey) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match built.pools["gpu"].submit(work(id, id, 0, key)).await {
            Ok(_) => return,
            Err(error) if Instant::now() < deadline => {
                eprintln!("not yet back: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("the pool does not recover: {error}"),
        }
    }
}

/// Submits tasks 9 to 14 at once, the moment the database is back: each is accepted at its
/// first try (the pool's own check of the server, made during the outage, does not refuse
/// what comes after the server returned).
async fn submit_right_after_the_return(
    built: &Arc<BuiltPools<Work, u64, Doubler>>,
    key: &MailboxKey,
) {
    let submits = submit_at_once(built, 9..=14, key);
    for submit in submits {
        let (id, accepted) = submit.await.expect("the submit does not panic");
        assert!(
            accepted.is_ok(),
            "task {id}, submitted right after the database returned: {accepted:?}"
        );
    }
}

/// A refused port, on queue layout `kind`: every submit answers in time and says so, and the
/// pool runs again once the port listens.
async fn refused_then_back(kind: &str) {
    let proxy = Proxy::start().await;
    let (queue, table) = (fresh_name("outage"), fresh_name("pl_outage_jobs"));
    let built = Arc::new(pool(proxy.url(), kind, &queue, &table).await);
    let key = MailboxKey::new("acme").with_session(fresh_name("refused"));
    // Task 1 holds the only unit through the outage: the others park.
    built.pools["gpu"]
        .submit(work(1, 1, 4_000, &key))
        .await
        .expect("accepted");

    proxy.cut(Fault::Refused).await;
    let cause = "the server refused the connection";
    let advice = "start it or correct database_url, then submit again";
    every_submit_answers_in_time(&built, &key, (&queue, cause, advice)).await;

    proxy.cut(Fault::None).await;
    submit_right_after_the_return(&built, &key).await;
    for (id, doubled) in [(1, 2)].into_iter().chain((9..=14).map(|id| (id, id * 2))) {
        let result = built.pools["gpu"]
            .retrieve_task(&key, id, Duration::from_secs(20))
            .await;
        assert_eq!(result, Ok(doubled), "task {id}");
    }
    drop(built);
    if kind == "postgres" {
        admin(&format!("DROP TABLE IF EXISTS {table}")).await;
    } else {
        drop_pgmq(&queue).await;
    }
}

/// Drops the PGMQ queues of pgmq queue `name`.
async fn drop_pgmq(name: &str) {
    for suffix in ["crit", "high", "norm", "low", "dlq"] {
        admin(&format!("SELECT pgmq.drop_queue('{name}_{suffix}')")).await;
    }
    admin(&format!(
        "DELETE FROM pl_pgmq_entries WHERE queue_name = '{name}'"
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_port_fails_every_submit_in_time_naming_pool_queue_and_cause() {
    refused_then_back("postgres").await;
}

#[cfg(feature = "pgmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_port_fails_every_pgmq_submit_in_time_naming_pool_queue_and_cause() {
    refused_then_back("postgres_pgmq").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_fails_every_submit_in_time_as_timed_out() {
    let proxy = Proxy::start().await;
    let (queue, table) = (fresh_name("silent"), fresh_name("pl_outage_jobs"));
    let built = Arc::new(pool(proxy.url(), "postgres", &queue, &table).await);
    let key = MailboxKey::new("acme").with_session(fresh_name("silent"));
    built.pools["gpu"]
        .submit(work(1, 1, 4_000, &key))
        .await
        .expect("accepted");

    proxy.cut(Fault::Silent).await;
    let cause = "the server did not answer a new connection within 1s";
    let advice = "check the way to it, then submit again";
    every_submit_answers_in_time(&built, &key, (&queue, cause, advice)).await;

    proxy.cut(Fault::None).await;
    submit_once_back(&built, 9, &key).await;
    let result = built.pools["gpu"]
        .retrieve_task(&key, 9, Duration::from_secs(20))
        .await;
    assert_eq!(result, Ok(18));
    drop(built);
    admin(&format!("DROP TABLE IF EXISTS {table}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_fail_a_submit_at_once_saying_to_fix_them() {
    let role = fresh_name("pl_outage_role");
    admin(&format!("CREATE ROLE {role} LOGIN")).await;
    admin(&format!("GRANT CREATE, USAGE ON SCHEMA public TO {role}")).await;
    let url = server_url().replace("postgres@", &format!("{role}@"));
    assert!(url.contains(&role), "DATABASE_URL names its user: {url}");
    let (queue, table) = (fresh_name("auth"), fresh_name("pl_outage_jobs"));
    let built = Arc::new(pool(url, "postgres", &queue, &table).await);
    let key = MailboxKey::new("acme").with_session(fresh_name("auth"));
    built.pools["gpu"]
        .submit(work(1, 1, 3_000, &key))
        .await
        .expect("accepted");

    // The role loses its login, and its connections are closed: new ones are refused.
    admin(&format!("ALTER ROLE {role} NOLOGIN")).await;
    admin(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
    ))
    .await;
    let answers = submit_parking(&built, 2..=4, &key, FaultKind::Refused).await;
    for answer in answers {
        let (id, took, text) = answer.await.expect("the submit does not panic");
        eprintln!("task {id} answered after {took:?}: {text}");
        assert!(
            took <= BOUND + SLACK,
            "task {id} answered after {took:?}: {text}"
        );
        for part in [
            "pool \"gpu\"",
            &format!("queue {queue:?}"),
            "refused this process's credentials",
            &format!("role \"{role}\" is not permitted to log in"),
            "submitting again will not help",
        ] {
            assert!(
                text.contains(part),
                "task {id}: {part:?} is missing from: {text}"
            );
        }
    }
    drop(built);
    admin(&format!("DROP OWNED BY {role}")).await;
    admin(&format!("DROP ROLE {role}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_a_park_saying_to_free_space_and_the_pool_parks_again_after() {
    let (queue, table) = (fresh_name("disk"), fresh_name("pl_outage_jobs"));
    let built = Arc::new(pool(server_url(), "postgres", &queue, &table).await);
    let key = MailboxKey::new("acme").with_session(fresh_name("disk"));
    built.pools["gpu"]
        .submit(work(1, 1, 2_000, &key))
        .await
        .expect("accepted");

    // The server's own error for a full disk, on every new row of this test's table.
    let full = format!("{table}_full");
    admin(&format!(
        "CREATE FUNCTION {full}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           RAISE EXCEPTION 'could not extend file \"base/5/16384\": No space left on device' \
           USING ERRCODE = 'disk_full'; END $$; \
         CREATE TRIGGER {full} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {full}()"
    ))
    .await;
    let answers = submit_parking(&built, 2..=2, &key, FaultKind::Refused).await;
    for answer in answers {
        let (id, took, text) = answer.await.expect("the submit does not panic");
        eprintln!("task {id} answered after {took:?}: {text}");
        for part in [
            "pool \"gpu\"",
            &format!("queue {queue:?}"),
            "the database server's disk is full",
            "No space left on device",
            "free space on it, then submit again",
        ] {
            assert!(
                text.contains(part),
                "task {id}: {part:?} is missing from: {text}"
            );
        }
    }

    admin(&format!(
        "DROP TRIGGER {full} ON {table}; DROP FUNCTION {full}()"
    ))
    .await;
    built.pools["gpu"]
        .submit(work(3, 3, 0, &key))
        .await
        .expect("parks again at once");
    for (id, doubled) in [(1, 2), (3, 6)] {
        let result = built.pools["gpu"]
            .retrieve_task(&key, id, Duration::from_secs(20))
            .await;
        assert_eq!(result, Ok(doubled), "task {id}");
    }
    drop(built);
    admin(&format!("DROP TABLE IF EXISTS {table}")).await;
}

// ---------------------------------------------------------------------------------------------
// Retrieves from a Postgres mailbox while its database is away
// ---------------------------------------------------------------------------------------------

/// Pool `gpu` (one worker) on an in-memory queue, its results in Postgres mailbox table
/// `table`, at `url`.
async fn mailbox_pool(url: String, table: &str) -> BuiltPools<Work, u64, Doubler> {
    let config = serde_json::json!({
        "database_url": url,
        "pools": { "gpu": {
            "worker_threads": 1,
            "max_units": 4,
            "queue": { "type": "in_memory" },
            "mailbox": { "storage": { "type": "postgres", "table": table } }
        } }
    });
    let config = SchedulerConfig::from_json_str(&config.to_string()).expect("valid config");
    build_embedded(config).await
}

/// A retrieve that meets the database away asks again until it is back and returns the
/// result, within its timeout; one whose timeout passes first says the result is still
/// there (retrieve again, not submit again), and it is: the next retrieve takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrieve_rides_over_an_outage_and_one_that_runs_out_says_to_retrieve_again() {
    let proxy = Proxy::start().await;
    let table = fresh_name("pl_outage_results");
    let built = Arc::new(mailbox_pool(proxy.url(), &table).await);
    let pool = &built.pools["gpu"];
    let key = MailboxKey::new("acme").with_session(fresh_name("retrieve"));

    // Task 1's result is stored before the outage; task 2 ends while the database is away
    // (its store waits for it).
    pool.submit(work(1, 1, 0, &key)).await.expect("accepted");
    pool.submit(work(2, 2, 1_000, &key))
        .await
        .expect("accepted");
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.cut(Fault::Refused).await;

    let waiting = {
        let (built, key) = (Arc::clone(&built), key.clone());
        tokio::spawn(async move {
            let pool = &built.pools["gpu"];
            let first = pool.retrieve_task(&key, 1, Duration::from_secs(30)).await;
            let second = pool.retrieve_task(&key, 2, Duration::from_secs(30)).await;
            (first, second)
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !waiting.is_finished(),
        "the retrieves wait for the database"
    );
    proxy.cut(Fault::None).await;
    let (first, second) = waiting.await.expect("the retrieves do not panic");
    assert_eq!(first, Ok(2), "task 1's result, stored before the outage");
    assert_eq!(
        second,
        Ok(4),
        "task 2's result, stored once the database was back"
    );

    pool.submit(work(3, 3, 0, &key)).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.cut(Fault::Refused).await;
    let started = Instant::now();
    let gave_up = pool.retrieve_task(&key, 3, Duration::from_secs(2)).await;
    let took = started.elapsed();
    match &gave_up {
        Err(PoolError::Backend(error)) => {
            assert_eq!(error.fault.kind, FaultKind::Unreachable, "{error}");
            let text = error.to_string();
            assert!(text.contains("retrieve again"), "{text}");
            assert!(!text.contains("submit"), "{text}");
        }
        other => panic!("a retrieve that ran out during the outage: {other:?}"),
    }
    assert!(
        took < Duration::from_secs(2) + BOUND + SLACK,
        "it answered after {took:?}"
    );
    proxy.cut(Fault::None).await;
    let again = pool.retrieve_task(&key, 3, Duration::from_secs(20)).await;
    assert_eq!(again, Ok(6), "the result stayed stored");
    drop(built);
    admin(&format!("DROP TABLE IF EXISTS {table}")).await;
}
