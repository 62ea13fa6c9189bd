//! How every connection the crate opens to PostgreSQL is set up: `TCP_NODELAY` on its socket
//! and just-in-time compilation off for its session.
//!
//! **`TCP_NODELAY`.** sqlx-core 0.9.0, the driver sea-orm 2 uses, opens its TCP sockets
//! without `TCP_NODELAY` (transact-rs/sqlx#4335; fixed upstream in #4336, not released as of
//! sqlx-core 0.9.0). With Nagle's algorithm on, a message the driver sends in two writes waits
//! for the server's delayed ACK, about 40 ms on Linux: a park of a few dozen tasks that takes
//! 1–2 ms took up to 42 ms. A `[patch.crates-io]` of the driver would fix our own builds only,
//! since a crate that depends on this one does not inherit its patches; so the fix travels
//! with the crate instead, in the connection pool's `after_connect` hook. The driver gives
//! the hook its connection but not the socket, so the hook finds the socket among the
//! process's descriptors (`/proc/self/fd`, or `/dev/fd`): every TCP socket whose peer is the
//! database's address and port gets `TCP_NODELAY`. Other connections of the process to the
//! same server (an application's own pool) get it too, which is what libpq and the fixed
//! sqlx do for all their connections. Over a Unix socket there is nothing to do; on
//! platforms without a descriptor directory the hook does nothing. Remove that part once a
//! sqlx-core release with the fix is out.
//!
//! **`jit = off`.** The queues' statements touch a few rows each through indexes, but a
//! settle of a thousand claims is planned for a thousand index lookups per priority level,
//! and with stale statistics (a busy queue between two analyses) its estimated cost passes
//! `jit_above_cost`: the server then compiles the statement to machine code before running
//! it, which took 0.5–1 s for a statement that runs in milliseconds, on every execution.
//! That cut the pgmq queue's throughput from about 6,300 to 1,300 jobs a second in
//! `benches/postgres_queue.rs`. Just-in-time compilation pays off for analytic queries over
//! millions of rows, which the crate never runs, so its sessions turn it off (`SET jit =
//! off`; a server without the setting, before PostgreSQL 11, ignores the request).

use std::net::SocketAddr;
use std::str::FromStr;

use sea_orm::sqlx::postgres::PgConnectOptions;
use sea_orm::sqlx::Executor;
use sea_orm::ConnectOptions;

/// Sets up every connection the pool of `options` opens as the crate's own connections are
/// (see the module docs): `TCP_NODELAY` on its socket and `jit = off` for its session.
///
/// For an application that builds its own connection and hands it to the pools with
/// [`QueueBuilderContext`](crate::QueueBuilderContext): call this on its options before
/// connecting, or its statements may wait for delayed ACKs and for compilations. It sets the
/// pool's `after_connect` hook (`map_sqlx_postgres_pool_opts`), replacing one set the same
/// way.
///
/// ```no_run
/// use sea_orm::{ConnectOptions, Database};
/// # async fn connect() -> Result<(), sea_orm::DbErr> {
/// let url = "postgres://postgres@127.0.0.1:5432/test";
/// let mut options = ConnectOptions::new(url);
/// prometheus_parking_lot::infra::postgres::prepare_connections(&mut options, url);
/// let connection = Database::connect(options).await?;
/// # Ok(()) }
/// ```
pub fn prepare_connections(options: &mut ConnectOptions, url: &str) {
    on_connect(options, url, true);
}

/// Makes every connection the pool of `options` opens set `TCP_NODELAY`, and nothing else
/// ([`prepare_connections`] also turns just-in-time compilation off). A URL the driver
/// cannot parse is left alone: connecting reports it. It sets the pool's `after_connect`
/// hook, replacing one set the same way.
///
/// ```no_run
/// use sea_orm::{ConnectOptions, Database};
/// # async fn connect() -> Result<(), sea_orm::DbErr> {
/// let url = "postgres://postgres@127.0.0.1:5432/test";
/// let mut options = ConnectOptions::new(url);
/// prometheus_parking_lot::infra::postgres::set_tcp_nodelay(&mut options, url);
/// let connection = Database::connect(options).await?;
/// # Ok(()) }
/// ```
pub fn set_tcp_nodelay(options: &mut ConnectOptions, url: &str) {
    on_connect(options, url, false);
}

/// Sets the pool's `after_connect` hook: `TCP_NODELAY` on a TCP connection to the server of
/// `url`, then `jit = off` if `no_jit`.
fn on_connect(options: &mut ConnectOptions, url: &str, no_jit: bool) {
    let peer = PgConnectOptions::from_str(url)
        .ok()
        .filter(|server| server.get_socket().is_none())
        .map(|server| (server.get_host().to_owned(), server.get_port()));
    if peer.is_none() && !no_jit {
        return;
    }
    options.map_sqlx_postgres_pool_opts(move |pool| {
        let peer = peer.clone();
        pool.after_connect(move |connection, _meta| {
            let peer = peer.clone();
            Box::pin(async move {
                if let Some((host, port)) = peer {
                    if let Ok(addresses) = tokio::net::lookup_host((host.as_str(), port)).await {
                        set_on_sockets_to(&addresses.collect::<Vec<_>>());
                    }
                }
                if no_jit {
                    // A server that lacks the setting (before PostgreSQL 11) has no JIT.
                    let _ = connection.execute("SET jit = off").await;
                }
                Ok(())
            })
        })
    });
}

/// Sets `TCP_NODELAY` on every TCP socket of this process connected to one of `peers`.
#[cfg(unix)]
fn set_on_sockets_to(peers: &[SocketAddr]) {
    use std::os::fd::{BorrowedFd, RawFd};
    let Ok(descriptors) =
        std::fs::read_dir("/proc/self/fd").or_else(|_| std::fs::read_dir("/dev/fd"))
    else {
        return;
    };
    for item in descriptors.flatten() {
        let Some(fd) = item
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<RawFd>().ok())
        else {
            continue;
        };
        // SAFETY: the descriptor was open when listed. Should another thread close it (or
        // reuse its number) meanwhile, the copy fails or is of some other file, which is
        // then checked like any other: nothing is done to a socket not connected to `peers`.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(copy) = borrowed.try_clone_to_owned() else {
            continue;
        };
        // Only the socket options are touched; dropping the copy closes the copy alone.
        let socket = std::net::TcpStream::from(copy);
        if socket.peer_addr().is_ok_and(|peer| peers.contains(&peer)) {
            let _ = socket.set_nodelay(true);
        }
    }
}

#[cfg(not(unix))]
fn set_on_sockets_to(_peers: &[SocketAddr]) {}
