//! Mailbox backends implementing [`Mailbox`](crate::core::Mailbox). The Postgres mailbox
//! lives with the rest of the Postgres code, in [`infra::postgres`](crate::infra::postgres).
//!
//! [`InMemoryMailbox`] is also here, beside its module, where code written for the upstream
//! crate imports it.

pub mod memory;

pub use memory::InMemoryMailbox;

/// The mailbox in a Postgres table; its code lives in [`crate::infra::postgres::mailbox`].
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use crate::infra::postgres::mailbox::*;
}
