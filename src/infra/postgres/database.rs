//! The [`PgDatabase`] handle: one PostgreSQL database, a SeaORM connection pool and the
//! runtime its I/O runs on, and how its errors read.

use super::{announce, listen, outage, prepare_connections};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sea_orm::sqlx::postgres::PgConnectOptions;
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
    /// A URL that cannot be read is [`PoolError::InvalidConfig`]. A server that cannot be
    /// reached or refuses the connection is [`PoolError::Backend`], as the same failure is
    /// once pools run: its [`FaultKind`] says whether to retry (`Unreachable`: a server that
    /// is down or does not answer) or not (`Refused`: wrong credentials, no such database),
    /// and its source chain keeps what the server said. The error names the cause but never
    /// the URL, which may hold a password.
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
        // A URL the driver cannot read is refused here, in the driver's own words: the
        // connection pool would only say that it cannot be parsed.
        if let Err(error) = url.parse::<PgConnectOptions>() {
            return Err(PoolError::InvalidConfig(format!(
                "database_url: {}",
                redact::text(&driver_words(&error))
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
        let address = url.to_owned();
        let connection = thread
            .block_on(async move {
                match Database::connect(options).await {
                    Ok(connection) => Ok(connection),
                    Err(error) => {
                        let cause = outage::cause_of_first_connection(&error, &address).await;
                        Err((error, cause))
                    }
                }
            })?
            .map_err(|(error, cause)| connect_failed(&error, cause))?;
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

/// The error of a first connection that failed with `error`, whose outage `cause` (if any)
/// a probe found: the database's failure, a [`BackendError`] like those of the same failure
/// later.
fn connect_failed(error: &DbErr, cause: Option<outage::Cause>) -> PoolError {
    let fault = fault_of("", cause, error);
    PoolError::from(BackendError::new(
        "",
        "PostgreSQL server of database_url",
        "accept a connection",
        fault,
    ))
}

/// Whether `error` is the server's answer to a deadlock (SQLSTATE 40P01): the transaction was
/// rolled back, and running it again may succeed.
pub(crate) fn is_deadlock(error: &DbErr) -> bool {
    use sea_orm::sqlx::Error as Driver;
    matches!(driver_error(error), Some(Driver::Database(server)) if server.code().as_deref() == Some("40P01"))
}

/// The driver's error inside `error`, if it came from the driver.
fn driver_error(error: &DbErr) -> Option<&sea_orm::sqlx::Error> {
    use sea_orm::RuntimeErr;
    match error {
        DbErr::Conn(RuntimeErr::SqlxError(driver))
        | DbErr::Exec(RuntimeErr::SqlxError(driver))
        | DbErr::Query(RuntimeErr::SqlxError(driver)) => Some(driver),
        _ => None,
    }
}

/// What the driver's `error` says, in a user's words: a server's error as its message and
/// SQLSTATE, with its detail and hint, but not the server's source location (the file, line
/// and routine of PostgreSQL's C code the driver appends as `at line 334`); a setting the
/// driver cannot read as the reason itself, not once per layer that wrapped it (`error with
/// configuration: error with configuration: ...`). Not redacted: callers redact.
pub(crate) fn driver_words(error: &sea_orm::sqlx::Error) -> String {
    use sea_orm::sqlx::postgres::PgDatabaseError;
    use sea_orm::sqlx::Error as Driver;
    match error {
        Driver::Database(server) => {
            let mut words = server.message().to_owned();
            if let Some(server) = server.try_downcast_ref::<PgDatabaseError>() {
                if let Some(detail) = server.detail() {
                    words = format!("{words} ({detail})");
                }
                if let Some(hint) = server.hint() {
                    words = format!("{words}; hint: {hint}");
                }
            }
            match server.code() {
                Some(code) => format!("the server said: {words} (SQLSTATE {code})"),
                None => format!("the server said: {words}"),
            }
        }
        Driver::Configuration(_) => {
            let mut reason: &(dyn std::error::Error + 'static) = error;
            while let Some(inner) = reason.source() {
                reason = inner;
            }
            format!("the connection settings cannot be read: {reason}")
        }
        other => other.to_string(),
    }
}

/// Says what went wrong with a database call in words a user can act on (see
/// [`driver_words`]), without the URL or any other credential (the driver quotes a
/// connection string it cannot parse).
pub(crate) fn describe(error: &DbErr) -> String {
    let words = driver_error(error).map_or_else(|| error.to_string(), driver_words);
    let text = redact::text(&words);
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
    fault_advising(what, cause, error, outage::Again::Submit)
}

/// [`fault_of`], advising a caller who would then do `again` (a retrieve retrieves again).
pub(crate) fn fault_advising(
    what: &str,
    cause: Option<outage::Cause>,
    error: &DbErr,
    again: outage::Again,
) -> BackendFault {
    let (kind, words) = match cause {
        Some(cause) => (cause.fault_kind(), cause.advising(again)),
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

/// The kind of a database error that is not an outage: what the driver met, where it says
/// (a server's refusal on connecting is its SQLSTATE's kind, not the connection's).
fn fault_kind(error: &DbErr) -> FaultKind {
    if let Some(kind) = driver_error(error).and_then(driver_fault_kind) {
        return kind;
    }
    match error {
        DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => FaultKind::Unreachable,
        DbErr::Type(_) | DbErr::Json(_) | DbErr::TryIntoErr { .. } => FaultKind::Corrupt,
        _ => FaultKind::Other,
    }
}

/// The kind of a driver's error, where the error itself tells.
fn driver_fault_kind(driver: &sea_orm::sqlx::Error) -> Option<FaultKind> {
    use sea_orm::sqlx::Error as Driver;
    match driver {
        Driver::Database(error) => Some(match error.code().as_deref().map(|code| &code[..2]) {
            // connection_exception, operator_intervention
            Some("08") | Some("57") => FaultKind::Unreachable,
            // data_exception
            Some("22") => FaultKind::Corrupt,
            Some(_) => FaultKind::Refused,
            None => FaultKind::Other,
        }),
        Driver::PoolTimedOut | Driver::PoolClosed | Driver::Io(_) => Some(FaultKind::Unreachable),
        Driver::ColumnDecode { .. } | Driver::Decode(_) => Some(FaultKind::Corrupt),
        _ => None,
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
