//! Notifiers: telling the outside world that a task ended (feature `webhook`).
//!
//! - [`http`]: [`HttpNotifier`](http::HttpNotifier) POSTs one signed JSON body per terminal
//!   event to a webhook, from a bounded outbox on a thread of its own;
//! - [`signature`]: the `X-Parking-Lot-Signature` header, and how a receiver checks it.
//!
//! A config names the http notifier under `mailbox.notifier`;
//! [`build_pools_from_scheduler_config`](crate::build_pools_from_scheduler_config) builds
//! it. The guide's `docs/guide/backends.md` ("Webhooks") describes the body a receiver gets.

mod attempt_span;
mod body;
pub mod http;
mod outbox;
pub mod signature;
