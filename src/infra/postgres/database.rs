//! The [`PgDatabase`] handle: one PostgreSQL database, a SeaORM connection pool and the
//! runtime its I/O runs on, and how its errors read.

use super::{announce, listen, outage, prepare_connections};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr, Statement};
use tokio::runtime::Handle;

use crate::core::PoolError;
use crate::util::redact;
use prometheus_parking_lot_actors::domain::{BackendError, BackendFault, FaultKind};

/// How long connecting, or waiting for a free connection, may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A handle on one PostgreSQL database, cheap to clone.
///
/// Every statement runs on the runtime the handle was made on: its own runtime thread when
/// it connected itself ([`PgDatabase::connect`]), or the application's runtime when it wraps
/// the application's connection ([`PgDatabase::from_connection`]). Pools call it from their
/// own threads, so a connection's I/O never depends on which pool asks.
#[derive(Clone)]
pub struct PgDatabase {
    inner: Arc<Inner>,
}

struct Inner {
    connection: DatabaseConnection,
    /// Sends NOTIFYs, coalesced, outside the backends' own transactions.
    announcer: Arc<announce::Announcer>,
    /// Registers LISTEN callbacks with the listening task, once one is started.
    listener: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<listen::Listener>>>,
    runtime: Handle,
    /// Where a connection this handle made lives; stops with the last handle.
    _own_runtime: Option<RuntimeThread>,
}

impl std::fmt::Debug for PgDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password: never shown.
        f.debug_struct("PgDatabase").finish_non_exhaustive()
    }
}

impl PartialEq for PgDatabase {
    /// Two handles are equal when they share one connection pool.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for PgDatabase {}

impl PgDatabase {
    /// Connects to `url` (`postgres://user:password@host:port/database`) on a runtime thread
    /// of its own. Works from synchronous code and from inside an async runtime.
    ///
    /// The error names the cause (refused, unknown database, authentication) but never the
    /// URL, which may hold a password.
    pub fn connect(url: &str) -> Result<Self, PoolError> {
        if !["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            // Refused before the driver sees it: a URL it reads some other way (a path, no
            // password) reaches its logs whole.
            return Err(PoolError::InvalidConfig(format!(
                "database_url: `{}` is not a PostgreSQL URL; write \
                 postgres://user:password@host:port/database (or postgresql://...)",
                crate::util::redact::text(url)
            )));
        }
        let thread = RuntimeThread::start()?;
        let mut options = ConnectOptions::new(url.to_owned());
        options
            .max_connections(16)
            .min_connections(1)
            .connect_timeout(CONNECT_TIMEOUT)
            .acquire_timeout(CONNECT_TIMEOUT)
            .sqlx_logging(false);
        prepare_connections(&mut options, url);
        let connection = thread
            .block_on(Database::connect(options))?
            .map_err(|error| {
                PoolError::InvalidConfig(format!(
                    "database_url: cannot connect to PostgreSQL: {}",
                    describe(&error)
                ))
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                connection,
                announcer: Arc::default(),
                listener: std::sync::Mutex::new(None),
                runtime: thread.handle.clone(),
                _own_runtime: Some(thread),
            }),
        })
    }

    /// Wraps a connection the application made. Its statements run on the current tokio
    /// runtime, which must outlive the pools (call this from inside it).
    pub fn from_connection(connection: DatabaseConnection) -> Result<Self, PoolError> {
        let runtime = Handle::try_current().map_err(|_| {
            PoolError::InvalidConfig(
                "a Postgres connection given to the pool builder needs a tokio runtime: build \
                 the pools from inside the runtime the connection was made on"
                    .into(),
            )
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                connection,
                announcer: Arc::default(),
                listener: std::sync::Mutex::new(None),
                runtime,
                _own_runtime: None,
            }),
        })
    }

    /// The SeaORM connection. Its pool opens connections on the runtime that asks for them:
    /// use it from a runtime that lives as long as the handle (the backends themselves run
    /// every statement on the handle's own runtime).
    pub fn connection(&self) -> &DatabaseConnection {
        &self.inner.connection
    }

    /// Runs `work` on the handle's runtime and waits for it.
    pub(crate) async fn run<T, F, Fut>(&self, work: F) -> Result<T, DbErr>
    where
        T: Send + 'static,
        F: FnOnce(DatabaseConnection) -> Fut,
        Fut: Future<Output = Result<T, DbErr>> + Send + 'static,
    {
        let work = work(self.inner.connection.clone());
        self.inner
            .runtime
            .spawn(work)
            .await
            .map_err(|error| DbErr::Custom(format!("database task ended early: {error}")))?
    }

    /// Starts `work` on the handle's runtime and lets it run.
    pub(crate) fn spawn<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.inner.runtime.spawn(work));
    }

    /// Sends `payload` on `channel` (NOTIFY) soon, outside the caller's transaction, coalesced
    /// with other announcements (see [`announce`]).
    pub(crate) fn announce(&self, channel: &str, payload: String) {
        self.inner.announcer.announce(self, channel, payload);
    }

    /// Runs `work` on the handle's runtime and blocks the calling thread until it is done.
    /// For start-up only (connecting, creating tables): never from a pool's runtime.
    pub(crate) fn block_on<T, F, Fut>(&self, work: F) -> Result<T, DbErr>
    where
        T: Send + 'static,
        F: FnOnce(DatabaseConnection) -> Fut,
        Fut: Future<Output = Result<T, DbErr>> + Send + 'static,
    {
        let (done, outcome) = std::sync::mpsc::channel();
        let work = work(self.inner.connection.clone());
        self.inner.runtime.spawn(async move {
            let _ = done.send(work.await);
        });
        outcome
            .recv()
            .map_err(|_| DbErr::Custom("database runtime stopped".into()))?
    }

    /// Calls `heard(target, payload)` for every notification on `channel` (LISTEN/NOTIFY)
    /// for as long as `target` lives. All channels of a handle share one listening
    /// connection. When that connection is lost it is opened again (with a growing pause, so
    /// a database that is down is not hammered) and every listener hears an empty payload
    /// once, since notifications may have been missed meanwhile.
    pub(crate) fn listen<T>(&self, channel: String, target: Weak<T>, heard: fn(&T, &str))
    where
        T: Send + Sync + 'static,
    {
        let alive = {
            let target = target.clone();
            Box::new(move || target.strong_count() > 0) as Box<dyn Fn() -> bool + Send>
        };
        let call = Box::new(move |payload: &str| {
            if let Some(target) = target.upgrade() {
                heard(&target, payload);
            }
        }) as Box<dyn Fn(&str) + Send>;
        let mut sender = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sender = sender.get_or_insert_with(|| {
            let (sender, commands) = tokio::sync::mpsc::unbounded_channel();
            let pool = self.inner.connection.get_postgres_connection_pool().clone();
            self.inner.runtime.spawn(listen::run(pool, commands));
            sender
        });
        let _ = sender.send(listen::Listener {
            channel,
            alive,
            call,
        });
    }

    /// A statement with `$n` parameters.
    pub(crate) fn statement(
        sql: impl Into<String>,
        values: impl IntoIterator<Item = sea_orm::Value>,
    ) -> Statement {
        Statement::from_sql_and_values(sea_orm::DbBackend::Postgres, sql, values)
    }
}

/// Says what went wrong with a database call in words a user can act on, without the URL
/// or any other credential (the driver quotes a connection string it cannot parse).
pub(crate) fn describe(error: &DbErr) -> String {
    let text = redact::text(&error.to_string());
    if text.contains("Connection refused") || text.contains("connection refused") {
        return "the server refused the connection (is PostgreSQL running, and on that host and \
                port?)"
            .into();
    }
    if text.contains("PoolTimedOut") || text.contains("pool timed out") {
        return format!(
            "no connection within {}s (the server is unreachable or overloaded)",
            CONNECT_TIMEOUT.as_secs()
        );
    }
    text
}

/// The fault of a database call that failed with `error`: its kind from what the error
/// says, its words redacted, and the redacted words kept as its cause too.
pub(crate) fn db_fault(what: &str, error: &DbErr) -> BackendFault {
    fault_of(what, outage::Cause::of(error), error)
}

/// The fault of a database call that failed with `error`, whose outage `cause` (if any) a
/// probe may have found.
pub(crate) fn fault_of(what: &str, cause: Option<outage::Cause>, error: &DbErr) -> BackendFault {
    let (kind, words) = match cause {
        Some(cause) => (cause.fault_kind(), cause.to_string()),
        None => (fault_kind(error), describe(error)),
    };
    let detail = match what {
        "" => words.clone(),
        what => format!("{what} failed: {words}"),
    };
    BackendFault::new(kind, detail, DatabaseError(words))
}

/// The error of a backend that could not be opened: the database call `operation` of
/// `backend` failed with `error` (no pool uses the backend yet).
pub(crate) fn open_failed(backend: &str, operation: &str, error: &DbErr) -> PoolError {
    let fault = fault_of("", outage::Cause::of(error), error);
    PoolError::from(BackendError::new("", backend, operation, fault))
}

/// The kind of a database error that is not an outage.
fn fault_kind(error: &DbErr) -> FaultKind {
    use sea_orm::sqlx::Error as Driver;
    use sea_orm::RuntimeErr;
    match error {
        DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => FaultKind::Unreachable,
        DbErr::Type(_) | DbErr::Json(_) | DbErr::TryIntoErr { .. } => FaultKind::Corrupt,
        DbErr::Exec(RuntimeErr::SqlxError(driver))
        | DbErr::Query(RuntimeErr::SqlxError(driver)) => {
            match driver.as_ref() {
                Driver::Database(error) => match error.code().as_deref().map(|code| &code[..2]) {
                    // connection_exception, operator_intervention
                    Some("08") | Some("57") => FaultKind::Unreachable,
                    // data_exception
                    Some("22") => FaultKind::Corrupt,
                    Some(_) => FaultKind::Refused,
                    None => FaultKind::Other,
                },
                Driver::PoolTimedOut | Driver::PoolClosed | Driver::Io(_) => FaultKind::Unreachable,
                Driver::ColumnDecode { .. } | Driver::Decode(_) => FaultKind::Corrupt,
                _ => FaultKind::Other,
            }
        }
        _ => FaultKind::Other,
    }
}

/// What the database (or its driver) said, redacted: the cause a [`BackendFault`] keeps.
/// The driver's own error is not kept, since it may quote a connection string.
#[derive(Debug, Clone)]
pub(crate) struct DatabaseError(pub(crate) String);

impl std::fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DatabaseError {}

/// A current-thread tokio runtime on a thread of its own, for the connections a
/// [`PgDatabase`] makes itself. It stops when dropped.
struct RuntimeThread {
    handle: Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl RuntimeThread {
    fn start() -> Result<Self, PoolError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| {
                PoolError::Internal(format!("could not build the database runtime: {error}"))
            })?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("parking-lot-postgres".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(|error| {
                PoolError::Internal(format!("could not start the database thread: {error}"))
            })?;
        Ok(Self {
            handle,
            stop: Some(stop),
        })
    }

    fn block_on<F>(&self, work: F) -> Result<F::Output, PoolError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (done, outcome) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            let _ = done.send(work.await);
        });
        outcome.recv().map_err(|_| {
            PoolError::Internal("the database runtime stopped while connecting".into())
        })
    }
}

impl Drop for RuntimeThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
