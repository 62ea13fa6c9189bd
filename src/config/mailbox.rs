//! A pool's `"mailbox"` section: where its results wait ([`StorageSettings`]) and who hears
//! about them ([`NotifierSettings`]).
//!
//! Its own file because the pool's settings (`file.rs`) and the upstream string forms
//! (`upstream_forms.rs`, which reads `"mailbox": "postgres"` as this section) both build it.

use std::fmt;

use serde::Deserialize;

use crate::settings::secret::Secret;
use crate::util::redact;

/// Where a pool's results wait, and who hears about them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailboxSettings {
    /// The storage. Default: in memory.
    #[serde(default)]
    pub storage: StorageSettings,
    /// A webhook called on every terminal state.
    #[serde(default)]
    pub notifier: Option<NotifierSettings>,
    /// How long uncollected results are kept, seconds. Default 3,600.
    #[serde(default)]
    pub retention_secs: Option<u64>,
}

/// Result storage.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum StorageSettings {
    /// In memory (the default).
    InMemory {
        /// Results kept at most; the oldest uncollected one goes first. Default 100,000.
        #[serde(default)]
        max_messages: Option<usize>,
    },
    /// A Postgres table through SeaORM.
    Postgres {
        /// The table. Default `pl_mailbox_messages`.
        #[serde(default = "default_mailbox_table")]
        table: String,
    },
}

impl Default for StorageSettings {
    fn default() -> Self {
        StorageSettings::InMemory { max_messages: None }
    }
}

fn default_mailbox_table() -> String {
    "pl_mailbox_messages".into()
}

/// A webhook for terminal events.
///
/// `Debug` shows `base_url` as its origin only (a webhook's path or query is often its
/// token) and the secrets as `Secret(***)`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum NotifierSettings {
    /// POST JSON to a URL.
    Http {
        /// The endpoint (`http://` or `https://`).
        base_url: String,
        /// An `Authorization` header value; never logged.
        #[serde(default)]
        auth_header: Option<Secret>,
        /// A key to sign bodies with (HMAC-SHA256); never logged.
        #[serde(default)]
        hmac_secret: Option<Secret>,
        /// Per-request timeout, ms. Default 5,000.
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Retries after the first attempt. Default 5.
        #[serde(default)]
        max_retries: Option<u32>,
    },
}

impl fmt::Debug for NotifierSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let NotifierSettings::Http {
            base_url,
            auth_header,
            hmac_secret,
            timeout_ms,
            max_retries,
        } = self;
        f.debug_struct("Http")
            .field("base_url", &redact::url(base_url))
            .field("auth_header", auth_header)
            .field("hmac_secret", hmac_secret)
            .field("timeout_ms", timeout_ms)
            .field("max_retries", max_retries)
            .finish()
    }
}
