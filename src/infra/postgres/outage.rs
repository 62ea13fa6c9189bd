//! A database that is away, said in words a caller can act on, and answered quickly.
//!
//! When a statement fails because the server cannot be reached, the driver often cannot say
//! why: it retries a refused connection until its pool's wait runs out ([`CONNECT_TIMEOUT`]),
//! then reports only that it waited. So a queue that meets such a failure asks the server
//! itself, with one connection of its own ([`probe`], at most [`PROBE_TIMEOUT`]), and names
//! the [`Cause`]: refused, timed out, authentication, no slot, starting or stopping, disk
//! full, busy, or a connection lost. Each cause says what the caller can do.
//!
//! While the server is away, the queue's [`OutageGate`] keeps statements from queueing behind
//! the pool's wait: each statement first asks the gate, which probes the server (one probe at
//! a time, at most one per [`PROBE_REUSE`], each answering for every statement that asked
//! before it ended) and fails the statement, with the cause, if the server is still away. A
//! statement is answered only by a probe made after it asked (or one that found the server
//! up), so the first statement after the server returns runs. The first statement that meets
//! the outage answers within [`CONNECT_TIMEOUT`] plus [`PROBE_TIMEOUT`]; every later one
//! within [`PROBE_REUSE`] plus [`PROBE_TIMEOUT`]. A probe that connects ends the outage, and
//! statements run again.

use crate::util::redact;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection};
use sea_orm::sqlx::Connection;
use sea_orm::{ConnAcquireErr, DbErr, RuntimeErr};

use super::{PgDatabase, CONNECT_TIMEOUT};

/// How long a probe waits for the server to answer.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a probe's finding answers for the statements that ask after it.
pub(crate) const PROBE_REUSE: Duration = Duration::from_millis(250);

/// Why the server could not do what a statement asked, in words a caller can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Nothing listens at the server's host and port.
    Refused,
    /// The server did not answer a new connection within [`PROBE_TIMEOUT`].
    TimedOut,
    /// The server refused this process's credentials (its words).
    Authentication(String),
    /// The server has no connection slot left.
    NoSlots,
    /// The server is starting up or shutting down (its words).
    Unavailable(String),
    /// The server is out of disk space (its words).
    DiskFull(String),
    /// The pool's connections all stayed busy while the server accepted new ones.
    Busy,
    /// A connection to the server broke (the driver's words).
    Lost(String),
}

impl Cause {
    /// The cause of `error`, if it is one of these; `None` for any other failure (a statement
    /// the server refused, say), and for a pool that waited in vain, whose cause only a
    /// [`probe`] can tell.
    pub(crate) fn of(error: &DbErr) -> Option<Self> {
        match error {
            DbErr::ConnectionAcquire(ConnAcquireErr::ConnectionClosed) => {
                Some(Self::Lost("the connection pool is closed".into()))
            }
            DbErr::Conn(RuntimeErr::SqlxError(error))
            | DbErr::Exec(RuntimeErr::SqlxError(error))
            | DbErr::Query(RuntimeErr::SqlxError(error)) => Self::of_driver(error),
            _ => None,
        }
    }

    /// The cause of a driver error, if it is one of these.
    fn of_driver(error: &sea_orm::sqlx::Error) -> Option<Self> {
        use sea_orm::sqlx::Error;
        match error {
            Error::Io(io) => Some(Self::of_io(io)),
            Error::Tls(tls) => Some(Self::Lost(format!("TLS failed: {tls}"))),
            Error::Protocol(text) => Some(Self::Lost(format!("protocol error: {text}"))),
            Error::PoolClosed => Some(Self::Lost("the connection pool is closed".into())),
            Error::WorkerCrashed => Some(Self::Lost("the connection's worker crashed".into())),
            Error::Database(error) => {
                Self::of_sqlstate(error.code().as_deref().unwrap_or(""), error.message())
            }
            _ => None,
        }
    }

    /// The cause of an I/O error on a connection.
    fn of_io(error: &std::io::Error) -> Self {
        match error.kind() {
            std::io::ErrorKind::ConnectionRefused => Self::Refused,
            std::io::ErrorKind::TimedOut => Self::TimedOut,
            _ => Self::Lost(redact::text(&error.to_string())),
        }
    }

    /// The cause a server's error of SQLSTATE `code` stands for, if it is one of these.
    pub(crate) fn of_sqlstate(code: &str, message: &str) -> Option<Self> {
        match code {
            // invalid_authorization_specification, invalid_password
            "28000" | "28P01" => Some(Self::Authentication(message.to_owned())),
            // too_many_connections
            "53300" => Some(Self::NoSlots),
            // admin_shutdown, crash_shutdown, cannot_connect_now
            "57P01" | "57P02" | "57P03" => Some(Self::Unavailable(message.to_owned())),
            // disk_full
            "53100" => Some(Self::DiskFull(message.to_owned())),
            _ => None,
        }
    }

    /// The fault of a call that could not run for this cause.
    pub(crate) fn fault(&self, what: &str) -> prometheus_parking_lot_actors::domain::BackendFault {
        prometheus_parking_lot_actors::domain::BackendFault::new(
            self.fault_kind(),
            format!("{what} failed: {self}"),
            super::DatabaseError(self.to_string()),
        )
    }

    /// The kind of backend fault this cause is: the server is out of reach (or has no room
    /// for another connection) until it comes back, or it refuses what was asked.
    pub(crate) fn fault_kind(&self) -> prometheus_parking_lot_actors::domain::FaultKind {
        use prometheus_parking_lot_actors::domain::FaultKind;
        match self {
            Self::Authentication(_) | Self::DiskFull(_) => FaultKind::Refused,
            Self::Refused
            | Self::TimedOut
            | Self::NoSlots
            | Self::Unavailable(_)
            | Self::Busy
            | Self::Lost(_) => FaultKind::Unreachable,
        }
    }

    /// Whether the server is away, so that no statement can run until it is back: later
    /// statements then wait for a probe that reaches it instead of for the pool. Refused
    /// credentials, a server without a free slot, a full disk or a busy pool are not: the
    /// pool's open connections may still run statements, and a new one fails at once.
    fn is_outage(&self) -> bool {
        matches!(
            self,
            Self::Refused | Self::TimedOut | Self::Unavailable(_) | Self::Lost(_)
        )
    }
}

/// What the caller of a failed operation does again once the cause is gone: a submitter
/// submits again, a retrieve (whose result stays stored) retrieves again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Again {
    /// Submit the task again.
    Submit,
    /// Retrieve the result again: it is still stored.
    Retrieve,
}

impl Again {
    fn verb(self) -> &'static str {
        match self {
            Self::Submit => "submit again",
            Self::Retrieve => "retrieve again",
        }
    }

    fn gerund(self) -> &'static str {
        match self {
            Self::Submit => "submitting again",
            Self::Retrieve => "retrieving again",
        }
    }
}

impl Cause {
    /// The cause in words, with what to do about it, for a caller who would then do `again`.
    pub(crate) fn advising(&self, again: Again) -> String {
        let (verb, gerund) = (again.verb(), again.gerund());
        let probe = PROBE_TIMEOUT.as_secs();
        let wait = CONNECT_TIMEOUT.as_secs();
        match self {
            Self::Refused => format!(
                "the server refused the connection: nothing listens at the host and port of \
                 database_url (PostgreSQL is stopped, or the URL names the wrong place); start \
                 it or correct database_url, then {verb}"
            ),
            Self::TimedOut => format!(
                "the server did not answer a new connection within {probe}s (a network fault, \
                 a firewall dropping packets, or a server too loaded to accept); check the way \
                 to it, then {verb}"
            ),
            Self::Authentication(said) => format!(
                "the server refused this process's credentials ({said}); correct the user or \
                 password in database_url, or the server's access rules: {gerund} \
                 will not help"
            ),
            Self::NoSlots => format!(
                "the server has no connection slot left (max_connections is reached); raise \
                 it or run fewer processes, then {verb}"
            ),
            Self::Unavailable(said) => format!(
                "the server is starting up or shutting down ({said}); {verb} once it \
                 is up"
            ),
            Self::DiskFull(said) => format!(
                "the database server's disk is full ({said}); free space on it, then {verb}"
            ),
            Self::Busy => format!(
                "no connection of this process came free within {wait}s although the server \
                 accepts new ones: the database is overloaded; {verb} later, or give it \
                 more capacity"
            ),
            Self::Lost(said) => format!(
                "the connection to the server broke ({said}); {verb} once the database \
                 is reachable"
            ),
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.advising(Again::Submit))
    }
}

/// Connects to the server once, on its own, to learn whether it can be reached and, if not,
/// why. At most [`PROBE_TIMEOUT`].
pub(crate) async fn probe(database: &PgDatabase) -> Result<(), Cause> {
    let outcome = database
        .run(|db| async move {
            let options = db.get_postgres_connection_pool().connect_options();
            Ok(reach(&options).await)
        })
        .await;
    outcome.unwrap_or_else(|error| Err(Cause::Lost(redact::text(&error.to_string()))))
}

/// Why the first connection to `url` failed with `error`, where the error or a probe can
/// tell: a pool that connects retries a refused connection until its wait runs out, then
/// says only that it waited, so the server is asked once more, by a [`probe`] of its own.
pub(crate) async fn cause_of_first_connection(error: &DbErr, url: &str) -> Option<Cause> {
    use sea_orm::sqlx::Error as Driver;
    if let Some(cause) = Cause::of(error) {
        return Some(cause);
    }
    if !matches!(error, DbErr::Conn(RuntimeErr::SqlxError(driver)) if matches!(driver.as_ref(), Driver::PoolTimedOut))
    {
        return None;
    }
    let options = url.parse::<PgConnectOptions>().ok()?;
    reach(&options).await.err()
}

/// Connects once to the server `options` name, at most [`PROBE_TIMEOUT`], and closes the
/// connection: `Ok` when it could, else why not.
async fn reach(options: &PgConnectOptions) -> Result<(), Cause> {
    let connected = tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(options)).await;
    match connected {
        Err(_) => Err(Cause::TimedOut),
        Ok(Err(error)) => Err(Cause::of_driver(&error).unwrap_or_else(|| {
            let words = super::driver_words(&error);
            Cause::Lost(redact::text(&format!("connecting failed: {words}")))
        })),
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
    }
}

/// What a queue knows of its server's outage. See the module docs.
#[derive(Default)]
pub(crate) struct OutageGate {
    /// Whether an outage was found and not yet seen to end (read without a lock on every
    /// statement).
    away: AtomicBool,
    /// The last probe's finding, and when it was made.
    found: Mutex<Option<(Instant, Result<(), Cause>)>>,
    /// Held by the statement that probes for the others.
    probing: tokio::sync::Mutex<()>,
}

impl OutageGate {
    /// Lets a statement run unless the server is known to be away and a probe finds it still
    /// away: then the cause, at once.
    pub(crate) async fn pass(&self, database: &PgDatabase) -> Result<(), Cause> {
        if !self.away.load(Ordering::Acquire) {
            return Ok(());
        }
        self.diagnose(database).await
    }

    /// The cause of a statement's failure `error`, if the server was away, full or busy
    /// (probing it when the error does not say); `None` for any other failure. A connection
    /// that broke is a symptom, not a cause: the probe tells whether the server went away
    /// (and how) or the connection alone was lost.
    pub(crate) async fn cause_of(&self, database: &PgDatabase, error: &DbErr) -> Option<Cause> {
        let cause = match Cause::of(error) {
            Some(Cause::Lost(lost)) => match self.diagnose(database).await {
                Err(cause) => cause,
                Ok(()) => Cause::Lost(lost),
            },
            Some(cause) => cause,
            None if matches!(error, DbErr::ConnectionAcquire(ConnAcquireErr::Timeout)) => {
                match self.diagnose(database).await {
                    Err(cause) => cause,
                    Ok(()) => Cause::Busy,
                }
            }
            None => return None,
        };
        if cause.is_outage() {
            self.record(Err(cause.clone()));
        }
        Some(cause)
    }

    /// Probes the server, one statement at a time, or takes the finding of a probe that
    /// answers for this statement: one made since it asked, or one less than
    /// [`PROBE_REUSE`] old that found the server up. An older finding of an outage does not
    /// answer for it (the server may have come back since: a submission right after it
    /// returns must not be refused for what an earlier probe saw); the statement waits for
    /// the next probe instead, made once that finding is [`PROBE_REUSE`] old, so probes stay
    /// one per [`PROBE_REUSE`] however many statements ask.
    async fn diagnose(&self, database: &PgDatabase) -> Result<(), Cause> {
        let asked = Instant::now();
        let _turn = self.probing.lock().await;
        if let Some((at, finding)) = self.last() {
            if at >= asked || (finding.is_ok() && at.elapsed() < PROBE_REUSE) {
                return finding;
            }
            if let Some(wait) = PROBE_REUSE.checked_sub(at.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        let finding = probe(database).await;
        self.record(finding.clone());
        finding
    }

    fn last(&self) -> Option<(Instant, Result<(), Cause>)> {
        self.found
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, finding: Result<(), Cause>) {
        let away = finding.as_ref().is_err_and(Cause::is_outage);
        *self.found.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), finding));
        self.away.store(away, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_s_error_codes_name_their_cause() {
        let said = "role \"x\" is not permitted to log in";
        assert_eq!(
            Cause::of_sqlstate("28000", said),
            Some(Cause::Authentication(said.into()))
        );
        assert_eq!(
            Cause::of_sqlstate("28P01", "password authentication failed"),
            Some(Cause::Authentication(
                "password authentication failed".into()
            ))
        );
        assert_eq!(
            Cause::of_sqlstate("53300", "too many"),
            Some(Cause::NoSlots)
        );
        assert_eq!(
            Cause::of_sqlstate("57P03", "the database system is starting up"),
            Some(Cause::Unavailable(
                "the database system is starting up".into()
            ))
        );
        assert_eq!(
            Cause::of_sqlstate("53100", "could not extend file"),
            Some(Cause::DiskFull("could not extend file".into()))
        );
        assert_eq!(Cause::of_sqlstate("23505", "duplicate key"), None);
    }

    #[test]
    fn io_errors_tell_refused_from_timed_out_from_lost() {
        use std::io::{Error, ErrorKind};
        let driver = |kind| sea_orm::sqlx::Error::Io(Error::from(kind));
        let of = |kind| Cause::of(&DbErr::Conn(RuntimeErr::SqlxError(driver(kind).into())));
        assert_eq!(of(ErrorKind::ConnectionRefused), Some(Cause::Refused));
        assert_eq!(of(ErrorKind::TimedOut), Some(Cause::TimedOut));
        assert!(matches!(
            of(ErrorKind::ConnectionReset),
            Some(Cause::Lost(_))
        ));
        let waited = DbErr::ConnectionAcquire(ConnAcquireErr::Timeout);
        assert_eq!(Cause::of(&waited), None, "only a probe can tell");
    }

    #[test]
    fn every_cause_says_what_to_do() {
        let causes = [
            Cause::Refused,
            Cause::TimedOut,
            Cause::Authentication("denied".into()),
            Cause::NoSlots,
            Cause::Unavailable("starting".into()),
            Cause::DiskFull("no space".into()),
            Cause::Busy,
            Cause::Lost("reset".into()),
        ];
        for cause in causes {
            let text = cause.to_string();
            assert!(
                ["submit again", "submitting again will not help"]
                    .iter()
                    .any(|advice| text.contains(advice)),
                "{text}"
            );
            let text = cause.advising(Again::Retrieve);
            assert!(
                ["retrieve again", "retrieving again will not help"]
                    .iter()
                    .any(|advice| text.contains(advice))
                    && !text.contains("submit"),
                "{text}"
            );
        }
    }
}
