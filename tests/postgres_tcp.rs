//! Every TCP connection the crate opens to PostgreSQL has `TCP_NODELAY` set, with the driver
//! as crates.io ships it (no patch of the workspace), so a dependent crate gets the latency
//! our benchmarks measure: without it, a message the driver writes in two parts waits about
//! 40 ms for the server's delayed ACK.
//!
//! The test connects over TCP (`DATABASE_URL`, default `127.0.0.1:5432`), opens several
//! connections at once, then looks at every socket of this process connected to the server.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{BorrowedFd, RawFd};

use prometheus_parking_lot::infra::postgres::PgDatabase;
use sea_orm::ConnectionTrait;

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The server's addresses, from a `postgres://user@host:port/db` URL.
fn server(url: &str) -> Vec<SocketAddr> {
    let authority = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .expect("a URL");
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    host_port.to_socket_addrs().expect("resolves").collect()
}

/// (peer, nodelay) of every TCP socket of this process connected to one of `peers`.
fn sockets_to(peers: &[SocketAddr]) -> Vec<(SocketAddr, bool)> {
    let mut found = Vec::new();
    for item in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let Some(fd) = item
            .expect("entry")
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<RawFd>().ok())
        else {
            continue;
        };
        // SAFETY: the descriptor was just listed; the test's threads close none meanwhile.
        let Ok(copy) = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() else {
            continue;
        };
        let socket = std::net::TcpStream::from(copy);
        if let Ok(peer) = socket.peer_addr() {
            if peers.contains(&peer) {
                found.push((peer, socket.nodelay().expect("TCP_NODELAY readable")));
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_to_postgres_sets_tcp_nodelay() {
    let url = database_url();
    let peers = server(&url);
    let database = tokio::task::spawn_blocking({
        let url = url.clone();
        move || PgDatabase::connect(&url)
    })
    .await
    .unwrap()
    .expect("connects");
    // Four statements at once make the pool open more connections than its first one.
    let sleep = || {
        database
            .connection()
            .execute_unprepared("SELECT pg_sleep(0.2)")
    };
    let (a, b, c, d) = tokio::join!(sleep(), sleep(), sleep(), sleep());
    for outcome in [a, b, c, d] {
        outcome.expect("the statement runs");
    }

    let sockets = sockets_to(&peers);
    assert!(
        sockets.len() >= 4,
        "the pool holds several connections over TCP: {sockets:?}"
    );
    assert!(
        sockets.iter().all(|&(_, nodelay)| nodelay),
        "a connection to PostgreSQL without TCP_NODELAY: {sockets:?}"
    );
}
