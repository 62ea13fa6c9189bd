//! `TCP_NODELAY` on every connection to PostgreSQL, set from outside the driver.
//!
//! sqlx-core 0.9.0, the driver sea-orm 2 uses, opens its TCP sockets without `TCP_NODELAY`
//! (transact-rs/sqlx#4335; fixed upstream in #4336, not released as of sqlx-core 0.9.0). With
//! Nagle's algorithm on, a message the driver sends in two writes waits for the server's
//! delayed ACK, about 40 ms on Linux: a park of a few dozen tasks that takes 1–2 ms took up to
//! 42 ms. A `[patch.crates-io]` of the driver would fix our own builds only, since a crate
//! that depends on this one does not inherit its patches; so the fix travels with the crate
//! instead, in the connection pool's `after_connect` hook.
//!
//! The driver gives the hook its connection but not the socket, so the hook finds the socket
//! among the process's descriptors (`/proc/self/fd`, or `/dev/fd`): every TCP socket whose
//! peer is the database's address and port gets `TCP_NODELAY`. Other connections of the
//! process to the same server (an application's own pool) get it too, which is what libpq
//! and the fixed sqlx do for all their connections. Over a Unix socket there is nothing to
//! do; on platforms without a descriptor directory the hook does nothing.
//!
//! Remove this module once a sqlx-core release with the fix is out.

use std::net::SocketAddr;
use std::str::FromStr;

use sea_orm::sqlx::postgres::PgConnectOptions;
use sea_orm::ConnectOptions;

/// Makes every connection the pool of `options` opens set `TCP_NODELAY` (see the module docs).
/// A URL the driver cannot parse is left alone: connecting reports it.
///
/// For an application that builds its own connection and hands it to the pools with
/// [`QueueBuilderContext`](crate::QueueBuilderContext): call this on its options before
/// connecting, or its statements may wait for delayed ACKs. It sets the pool's
/// `after_connect` hook (`map_sqlx_postgres_pool_opts`), replacing one set the same way.
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
    let Ok(server) = PgConnectOptions::from_str(url) else {
        return;
    };
    if server.get_socket().is_some() {
        return;
    }
    let (host, port) = (server.get_host().to_owned(), server.get_port());
    options.map_sqlx_postgres_pool_opts(move |pool| {
        let host = host.clone();
        pool.after_connect(move |_connection, _meta| {
            let host = host.clone();
            Box::pin(async move {
                if let Ok(addresses) = tokio::net::lookup_host((host.as_str(), port)).await {
                    set_on_sockets_to(&addresses.collect::<Vec<_>>());
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
