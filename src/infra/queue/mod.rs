//! Queue backends implementing [`TaskQueue`](crate::core::TaskQueue), one folder each with
//! its driver (`driver`: how a configuration's `"queue"` reaches it). The Postgres queues
//! live with the rest of the Postgres code, in [`infra::postgres`](crate::infra::postgres).
//!
//! [`InMemoryQueue`] is also here, beside its module, where code written for the upstream
//! crate imports it.

pub(crate) mod driver;
pub mod memory;
pub mod yaque;

pub use memory::InMemoryQueue;

/// The queue in a Postgres table; its code lives in [`crate::infra::postgres::queue`].
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use crate::infra::postgres::queue::*;
}

/// The queue on PGMQ; its code lives in [`crate::infra::postgres::pgmq`].
#[cfg(feature = "pgmq")]
pub mod pgmq {
    pub use crate::infra::postgres::pgmq::*;
}

/// The in-memory queue many pools share; its code lives in
/// [`crate::infra::queue::memory::multi_node`].
pub mod shared_memory {
    pub use crate::infra::queue::memory::multi_node::*;
}
