//! Backend failures that keep their cause: what kind of failure it was (so a caller can
//! decide to retry), what the backend said, and the error underneath.
//!
//! A backend (a queue, a mailbox, the database under both) reports a [`BackendFault`]; the
//! pool that was using it wraps it in a [`BackendError`] naming the pool, the backend and the
//! operation, and returns it as [`PoolError::Backend`](super::PoolError::Backend).
//!
//! ```
//! use std::error::Error;
//! use prometheus_parking_lot_actors::domain::{BackendError, BackendFault, FaultKind, PoolError};
//!
//! let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
//! let fault = BackendFault::new(FaultKind::Unreachable, "the database did not answer", refused);
//! let error = PoolError::from(BackendError::new("chat", "postgres queue", "park a task", fault));
//!
//! // A caller matches on the kind, and retries what is worth retrying.
//! assert!(error.is_retryable());
//! assert!(matches!(&error, PoolError::Backend(e) if e.fault.kind == FaultKind::Unreachable));
//! assert_eq!(
//!     error.to_string(),
//!     "pool chat: the postgres queue could not park a task: unreachable: the database did not answer"
//! );
//! // The chain goes down to the error the backend met.
//! let cause = error.source().and_then(|fault| fault.source()).unwrap();
//! assert_eq!(cause.to_string(), "connection refused");
//! ```

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What kind of failure a backend met: what a caller can do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FaultKind {
    /// The backend could not be reached, or stopped answering (a refused or lost
    /// connection, a timeout, a pool of connections with none free). Retrying later may
    /// succeed.
    Unreachable,
    /// The backend answered, but what it holds cannot be read back (a row or a file that
    /// does not decode). Retrying will not help; the entry needs an operator.
    Corrupt,
    /// The backend refused the request for a reason of its own (a constraint, a permission,
    /// a full disk, a missing table). Retrying will not help until that is changed.
    Refused,
    /// Anything else the backend reported.
    Other,
}

impl FaultKind {
    /// Whether trying again later may succeed: only for [`Unreachable`](Self::Unreachable).
    pub fn is_retryable(self) -> bool {
        self == Self::Unreachable
    }

    fn word(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::Corrupt => "corrupt data",
            Self::Refused => "refused",
            Self::Other => "failed",
        }
    }
}

/// A backend's own failure: its kind, what happened in words, and the error underneath.
///
/// The words never hold a secret: backends redact what they quote (a connection string's
/// password) before building a fault, and an underlying error that could echo one is kept
/// as its redacted text only.
#[derive(Clone, Serialize, Deserialize)]
pub struct BackendFault {
    /// What kind of failure it was.
    pub kind: FaultKind,
    /// What happened, in words.
    pub detail: String,
    /// The error underneath, where there is one (not kept when the fault is stored).
    #[serde(skip)]
    cause: Option<Arc<dyn Error + Send + Sync>>,
}

impl BackendFault {
    /// A fault with the error that caused it.
    pub fn new(
        kind: FaultKind,
        detail: impl Into<String>,
        cause: impl Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            detail: detail.into(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// A fault the backend found itself, with no error underneath.
    pub fn plain(kind: FaultKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            cause: None,
        }
    }
}

impl fmt::Display for BackendFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.word(), self.detail)
    }
}

impl fmt::Debug for BackendFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendFault")
            .field("kind", &self.kind)
            .field("detail", &self.detail)
            .field("cause", &self.cause.as_ref().map(|cause| cause.to_string()))
            .finish()
    }
}

impl Error for BackendFault {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.cause
            .as_deref()
            .map(|cause| cause as &(dyn Error + 'static))
    }
}

/// Two faults are equal when their kind and words are: the error underneath is not compared
/// (errors rarely are comparable), nor stored.
impl PartialEq for BackendFault {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.detail == other.detail
    }
}

impl Eq for BackendFault {}

/// A backend failed while a pool used it: which pool, which backend, doing what, and the
/// backend's [`BackendFault`] (its [`source`](Error::source)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendError {
    /// The pool that used the backend (empty while a backend is opened before any pool).
    pub pool: String,
    /// The backend, in words: `postgres queue`, `yaque queue`, `postgres mailbox`.
    pub backend: String,
    /// What the pool asked of it, in words: `park a task`, `take a result`.
    pub operation: String,
    /// What the backend met.
    pub fault: BackendFault,
}

impl BackendError {
    /// The failure of `operation` on `backend` while `pool` used it.
    pub fn new(
        pool: impl Into<String>,
        backend: impl Into<String>,
        operation: impl Into<String>,
        fault: BackendFault,
    ) -> Self {
        Self {
            pool: pool.into(),
            backend: backend.into(),
            operation: operation.into(),
            fault,
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.pool.is_empty() {
            write!(f, "pool {}: ", self.pool)?;
        }
        write!(
            f,
            "the {} could not {}: {}",
            self.backend, self.operation, self.fault
        )
    }
}

impl Error for BackendError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.fault)
    }
}
