//! Everything on PostgreSQL, in one folder: the [`PgDatabase`] handle, the two shared queues
//! (a table: [`queue`]; PGMQ: [`pgmq`], cargo feature `pgmq`), the durable mailbox
//! ([`mailbox`]), and what they share: the schema, NOTIFY and LISTEN, and [`PgQueue`], the
//! shared queue both queue layouts are (cargo feature `postgres`).
//!
//! The backends speak plain SQL through SeaORM's raw statements; the tables are small and
//! their hot queries are tuned by hand (`FOR UPDATE SKIP LOCKED`, partial indexes), which an
//! entity layer would only hide. Table names come from configuration and are checked as SQL
//! identifiers (see [`Identifier`]) before they are spliced into any statement.
//!
//! The queues' drivers (their settings' rules) are in every build, so a configuration that
//! names a Postgres queue in a build without the feature is told which feature it needs.
//!
//! | file | what it holds |
//! |---|---|
//! | `database.rs` | the [`PgDatabase`] handle: connecting, running work on its runtime |
//! | `session.rs` | settings of each new connection (`TCP_NODELAY`) |
//! | `schema.rs` | the tables, created idempotently; [`Identifier`] |
//! | `announce.rs`, `listen.rs` | NOTIFY and LISTEN |
//! | `queue/` | the queue in one table, and its driver |
//! | `pgmq/` | the queue on PGMQ, its driver, and PGMQ as plain SQL where the server lacks it |
//! | `mailbox/` | results in a table, and waiting for them without polling |
//! | `shared_queue/` | [`PgQueue`]: one shared queue, whatever its layout |
//! | `claim.rs` | a claim's parameters, by name, and its answer |
//! | `fence.rs` | [`ClaimFence`]: a queue's claims ended in a mailbox's transaction |
//! | `fleet/` | the fleet of a shared queue: its nodes' registry and heartbeats, the view any node reads, the operator's requests |
//! | `named.rs` | statements with named parameters |
//! | `statements.rs` | running a statement, and a claim under its planner settings |
//! | `codec.rs` | the engine's values as SQL values and JSON rows, and back |
//! | `groups.rs` | one answer per task of a group statement |
//! | `budgets.rs` | budgets a queue's nodes share, refilled and spent in each claim |
//! | `service.rs` | tenant counters a queue's nodes share (a fair share by use), read and charged in each claim |
//! | `retry.rs` | [`RetryPolicy`] and the rescue's backoff |
//! | `outage.rs` | a server that is away: its cause, and quick answers meanwhile |
//! | `rows.rs` | rows written as one JSON array |

#[cfg(feature = "postgres")]
mod announce;
#[cfg(feature = "postgres")]
mod budgets;
#[cfg(feature = "postgres")]
pub(crate) mod claim;
#[cfg(feature = "postgres")]
pub(crate) mod codec;
#[cfg(feature = "postgres")]
mod database;
#[cfg(feature = "postgres")]
mod fence;
#[cfg(feature = "postgres")]
pub mod fleet;
#[cfg(feature = "postgres")]
mod groups;
#[cfg(feature = "postgres")]
mod listen;
#[cfg(feature = "postgres")]
pub mod mailbox;
#[cfg(feature = "postgres")]
pub(crate) mod named;
#[cfg(feature = "postgres")]
mod outage;
pub mod pgmq;
#[cfg(all(test, feature = "postgres"))]
pub(crate) mod probe;
pub mod queue;
#[cfg(feature = "postgres")]
mod retry;
#[cfg(feature = "postgres")]
pub(crate) mod rows;
#[cfg(feature = "postgres")]
mod schema;
#[cfg(feature = "postgres")]
pub(crate) mod service;
#[cfg(feature = "postgres")]
mod session;
#[cfg(feature = "postgres")]
pub(crate) mod shared_queue;
#[cfg(feature = "postgres")]
mod statements;

#[cfg(feature = "postgres")]
pub use database::PgDatabase;
#[cfg(feature = "postgres")]
pub(crate) use database::{
    db_fault, describe, driver_words, fault_of, open_failed, DatabaseError, CONNECT_TIMEOUT,
};
#[cfg(feature = "postgres")]
pub use fence::ClaimFence;
#[cfg(feature = "pgmq")]
pub use pgmq::PgmqSource;
#[cfg(feature = "postgres")]
pub use retry::RetryPolicy;
#[cfg(feature = "postgres")]
pub(crate) use retry::{lease_ran_out_sql, retry_at_sql, GIVEN_UP};
#[cfg(feature = "postgres")]
pub use schema::Identifier;
#[cfg(feature = "postgres")]
pub(crate) use schema::Table;
#[cfg(feature = "postgres")]
pub use session::{prepare_connections, set_tcp_nodelay};
#[cfg(feature = "postgres")]
pub use shared_queue::PgQueue;
