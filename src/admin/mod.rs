//! The operator's surface (cargo feature `admin`): an HTTP API over running pools, the live
//! dashboard it serves, and what the `parking-lot` command line talks to.
//!
//! [`Admin`] gathers pools by name and [`serve`](Admin::serve)s them on a thread of its own
//! (its own current-thread tokio runtime, like the pools' workers), so an application needs
//! no runtime for it and a busy pool never holds it up.
//!
//! | endpoint | answers |
//! |---|---|
//! | `GET /[?pool=P]` | the dashboard page, carrying the first snapshot and history of pool P (the first by default) unless reads need the token |
//! | `GET /fleet`, `GET /api/fleet/...`, `POST /api/fleet/{pool}/...` | the fleet of a shared Postgres queue: its nodes, parked tasks, budgets, and control of any node (see `fleet.rs`) |
//! | `GET /api/pools` | every pool: its counters, capacity and use per kind (the kinds configured; under one number for all, `max_units`, the kinds tasks used, and `units_per_kind`), budgets, state |
//! | `GET /api/pools/{pool}` | one pool, with its running tasks and tenants |
//! | `GET /api/pools/{pool}/parked?offset=0&limit=50` | parked tasks in rank order, each with why it waits |
//! | `GET /api/pools/{pool}/running` | running tasks and held permits |
//! | `GET /api/pools/{pool}/tenants?offset=0&limit=50` | each tenant's running and parked tasks and the units it holds, by name, `tenants_total` in all; tasks without a mailbox (a tenant each) are one row, `anonymous`, with `anonymous_tenants` |
//! | `GET /api/pools/{pool}/snapshot?offset=0&limit=50` | what the dashboard shows, read at one instant: the pool's summary, a page of parked tasks, the running tasks, the first tenants, the latest refusals |
//! | `GET /api/pools/{pool}/refusals` | the latest refusals (at most 100) |
//! | `GET /api/pools/{pool}/history` | tasks started and ended, and the mean wait, per second over the last 10 minutes |
//! | `GET /api/events[?pool=P]` | server-sent events: every task step (`task`), and each pool's counters every second (`stats`) |
//! | `GET /api/pools/{pool}/dead-letters?offset=0&limit=50` | a shared queue's dead letters, oldest first, with their reasons (entries as strings); for a pool whose queue is its own, none, `"kept": false` and a `note` saying why |
//! | `GET /api/pools/{pool}/schedules` | the pool's periodic tasks: expression, zone, missed-tick policy, next tick, paused, how many this node enqueued |
//! | `POST /api/pools/{pool}/pause`, `/resume`, `/drain`, `/undrain` | control (a token) |
//! | `POST /api/pools/{pool}/schedules/{name}/pause`, `/resume` | pause or resume one schedule on this node (a token) |
//! | `POST /api/pools/{pool}/dead-letters/{entry}/retry` | park a dead letter again (a token) |
//! | `POST /api/pools/{pool}/dead-letters/purge` `{"entry": "..."}` or `{}` (all) | delete dead letters (a token) |
//! | `POST /api/pools/{pool}/cancel` `{"tenant", "user_id", "session_id", "id"}` | cancel a task (a token) |
//!
//! **Safe by default.** It binds to `127.0.0.1` unless told otherwise. It answers only
//! requests whose `Host` is one of its names: its bound address (`127.0.0.1:7480`),
//! `localhost` and those of [`AdminSettings::allowed_hosts`]; any other is a 421 naming the
//! host and how to allow it, so a page whose name is rebound to 127.0.0.1 reads nothing. A
//! request (a change above all) sent with an `Origin` that is not `http://` or `https://`
//! and one of those names is a 403. Every endpoint that changes something needs
//! `Authorization: Bearer <token>`, compared in constant time; an admin started without a
//! token refuses them all (403, saying how to set one). Reads of pool data (every
//! `GET /api/...`) need the token too when the server binds to anything but loopback, or
//! when [`AdminSettings::read_token`] asks for it; the dashboard page itself does not, and
//! the event stream, which a browser opens without headers, then also takes it as
//! `?token=`. No endpoint shows a task's payload or result (they carry users' prompts): the
//! API shows ids, keys, costs, states and reasons. Bad input is a 400 that says what is
//! wrong and what is allowed; a pool or task that does not exist is a 404.
//!
//! ```no_run
//! use prometheus_parking_lot::admin::{Admin, AdminSettings};
//! use prometheus_parking_lot::config::Secret;
//! # fn pools() -> prometheus_parking_lot::core::PoolClient<String, String> { unimplemented!() }
//!
//! let admin = Admin::new(
//!     AdminSettings {
//!         bind: "127.0.0.1:7480".parse().unwrap(),
//!         token: Some(Secret::new("change me")),
//!         ..AdminSettings::default()
//!     }
//!     .with_allowed_hosts(["dash.example.com"])
//!     .with_read_token(true),
//! )
//! .with_pool("llm", pools());
//! let server = admin.serve()?;
//! println!("dashboard: {}", server.url());
//! # Ok::<(), prometheus_parking_lot::PoolError>(())
//! ```

mod fleet;
mod history;
mod hosts;
mod routes;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::config::{escape_controls, host_problem, Secret};
use crate::core::{PoolControl, PoolError};
use history::History;
use hosts::ServedHosts;

/// Where the admin server listens, the names it answers under, and who may read and change
/// things.
///
/// Fields are added to it as the server learns new rules (`allowed_hosts` and `read_token`
/// came after the first two). Build it from `AdminSettings::default()`, with the `with_*`
/// methods or a struct literal that ends in `..AdminSettings::default()`, so that a new field
/// takes its default instead of breaking the build:
///
/// ```
/// use prometheus_parking_lot::admin::AdminSettings;
/// use prometheus_parking_lot::config::Secret;
///
/// let settings = AdminSettings {
///     token: Some(Secret::new("change me")),
///     ..AdminSettings::default()
/// }
/// .with_allowed_hosts(["dash.example.com"]);
/// assert_eq!(settings.bind.port(), AdminSettings::DEFAULT_PORT);
/// assert!(!settings.read_token);
/// ```
#[derive(Debug, Clone)]
pub struct AdminSettings {
    /// The address to bind: `127.0.0.1:7480` by default (port 0 picks a free one).
    pub bind: SocketAddr,
    /// The bearer token mutating endpoints need; `None` refuses them all.
    pub token: Option<Secret>,
    /// Names answered besides the bound address and `localhost`, as a `Host` header holds
    /// them: `name` (bare or with the bound port) or `name:port`. Empty by default.
    pub allowed_hosts: Vec<String>,
    /// Whether reads of pool data need the token on loopback too; off loopback they always
    /// do. `false` by default.
    pub read_token: bool,
}

impl AdminSettings {
    /// The default port.
    pub const DEFAULT_PORT: u16 = 7480;

    /// These settings, also answering requests addressed to `hosts` (a reverse proxy's name,
    /// a machine's name on the network).
    pub fn with_allowed_hosts<I, S>(mut self, hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allowed_hosts.extend(hosts.into_iter().map(Into::into));
        self
    }

    /// These settings, with reads of pool data needing the token on loopback too (`true`).
    pub fn with_read_token(mut self, read_token: bool) -> Self {
        self.read_token = read_token;
        self
    }
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], Self::DEFAULT_PORT)),
            token: None,
            allowed_hosts: Vec::new(),
            read_token: false,
        }
    }
}

/// A pool as the server holds it: the pool and what its listener gathered.
pub(crate) struct Served {
    pub pool: PoolControl,
    pub history: Arc<Mutex<History>>,
}

/// The admin server's pools and settings, before it serves. See the module docs.
pub struct Admin {
    settings: AdminSettings,
    pools: BTreeMap<String, PoolControl>,
    fleets: fleet::Fleets,
}

impl Admin {
    /// An admin server with these settings and no pools yet.
    pub fn new(settings: AdminSettings) -> Self {
        Self {
            settings,
            pools: BTreeMap::new(),
            fleets: fleet::Fleets::default(),
        }
    }

    /// Adds `pool` under `name`: a pool's client (`pool.client().clone()`) or its
    /// [`PoolControl`], whatever the pool runs.
    pub fn with_pool(mut self, name: impl Into<String>, pool: impl Into<PoolControl>) -> Self {
        self.pools.insert(name.into(), pool.into());
        self
    }

    /// Shows the fleet of pool `name`'s shared Postgres queue, read through `view`, on the
    /// fleet page and under `/api/fleet/{name}`: its nodes, parked tasks, budgets, and
    /// control of every node. Pools built from a configuration have theirs already
    /// ([`BuiltPools::serve_admin`](crate::BuiltPools::serve_admin)).
    #[cfg(feature = "postgres")]
    pub fn with_fleet(
        mut self,
        name: impl Into<String>,
        view: crate::infra::postgres::fleet::FleetView,
    ) -> Self {
        self.fleets.insert(name.into(), view);
        self
    }

    /// Binds the address and serves on a thread of its own until the returned server is
    /// dropped or [`stop`](AdminServer::stop)ped. An address that cannot be bound is an
    /// error naming it, and so is a malformed name of `allowed_hosts` or a `read_token`
    /// without a token.
    pub fn serve(self) -> Result<AdminServer, PoolError> {
        self.check_settings()?;
        let listener = std::net::TcpListener::bind(self.settings.bind).map_err(|error| {
            PoolError::InvalidConfig(format!(
                "admin: cannot listen on {}: {error}; choose another address (port 0 picks a free one)",
                self.settings.bind
            ))
        })?;
        let addr = listener.local_addr().map_err(|error| {
            PoolError::Internal(format!("admin: the bound address cannot be read: {error}"))
        })?;
        listener.set_nonblocking(true).map_err(|error| {
            PoolError::Internal(format!(
                "admin: the listener cannot be made non-blocking: {error}"
            ))
        })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let Admin {
            settings,
            pools,
            fleets,
        } = self;
        let thread = std::thread::Builder::new()
            .name("parking-lot-admin".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::error!(%error, "the admin server's runtime could not start");
                        return;
                    }
                };
                runtime.block_on(async move {
                    let (closing, closed) = tokio::sync::watch::channel(false);
                    let served = pools
                        .into_iter()
                        .map(|(name, pool)| {
                            let history = History::listen(&pool);
                            (name, Served { pool, history })
                        })
                        .collect();
                    let access = routes::Access {
                        hosts: ServedHosts::new(addr, &settings.allowed_hosts),
                        reads_need_token: settings.read_token || !addr.ip().is_loopback(),
                        token: settings.token,
                    };
                    let app = routes::router(served, (fleets, fleet::routes()), access, closed);
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            tracing::error!(%error, "the admin server cannot listen");
                            return;
                        }
                    };
                    let serving = axum::serve(listener, app).with_graceful_shutdown(async move {
                        let _ = stopped.await;
                        // Open event streams end, so the shutdown need not wait for them.
                        let _ = closing.send(true);
                    });
                    if let Err(error) = serving.await {
                        tracing::error!(%error, "the admin server stopped");
                    }
                });
            })
            .map_err(|error| {
                PoolError::Internal(format!("admin: its thread could not start: {error}"))
            })?;
        tracing::info!(%addr, "admin server listening");
        Ok(AdminServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Admin {
    /// Refuses settings the server could not honour, naming the setting.
    fn check_settings(&self) -> Result<(), PoolError> {
        if self.settings.read_token && self.settings.token.is_none() {
            return Err(PoolError::InvalidConfig(
                "admin: read_token asks reads for a token the server does not have; give it \
                 a token too"
                    .into(),
            ));
        }
        for host in &self.settings.allowed_hosts {
            if let Some(problem) = host_problem(host) {
                return Err(PoolError::InvalidConfig(format!(
                    "admin: the allowed host {} {problem}; write it as a Host header holds \
                     it: dash.example.com or dash.example.com:7480",
                    escape_controls(host)
                )));
            }
        }
        Ok(())
    }
}

/// A serving admin server; dropping it stops it.
pub struct AdminServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AdminServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its dashboard's address: `http://127.0.0.1:7480/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Stops serving and waits for the thread (open event streams end).
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("addr", &self.addr)
            .finish()
    }
}
