//! Mailbox backends implementing [`Mailbox`](crate::core::Mailbox).

pub mod memory;
