//! The short forms of upstream 0.1.0's configuration files, read into this format's own.
//!
//! Upstream names a pool's backends with a bare string and adds a `runtime`:
//! `{"max_units": 20, "queue": "postgres", "mailbox": "postgres", "runtime": "native"}`.
//! Here a pool's `queue` is a mapping with a `type` and its `mailbox` a mapping of settings,
//! so a name alone stands for that mapping only when the backend needs no settings:
//!
//! | written | read as |
//! |---|---|
//! | `"queue": "in_memory"` | `{"type": "in_memory"}` |
//! | `"queue": "postgres"` | `{"type": "postgres"}` (the default table, the pool's name as queue) |
//! | `"mailbox": "in_memory"` | `{"storage": {"type": "in_memory"}}` |
//! | `"mailbox": "postgres"` | `{"storage": {"type": "postgres"}}` (the default table) |
//! | `"runtime": "native"` or `"tokio"` | nothing: there is one runtime, worker threads on tokio |
//!
//! The `runtime` is checked and taken out of the document before it is deserialized
//! ([`set_runtimes_aside`]), so a pool's fields, and the list an unknown one is answered
//! with, stay those of this format.
//!
//! A backend that needs settings (`"yaque"`, upstream's `"file"`, `"postgres_pgmq"`) is
//! refused with the mapping to write instead, and a name that is no backend gets the same
//! answer as an unknown `type`. A mapping or a list goes to the derived `Deserialize` as it
//! would without this module, so its errors read exactly as they did.

use std::fmt;

use serde::de::value::{MapAccessDeserializer, MapDeserializer, SeqAccessDeserializer};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::mailbox::{MailboxSettings, StorageSettings};
use super::wording;
use crate::infra::queue::QueueSettings;
use crate::settings::error::ConfigError;
use crate::settings::quote;

/// The queue backends a `type` may name, as serde lists them for an unknown one.
const QUEUE_TYPES: &[&str] = &["in_memory", "yaque", "postgres", "postgres_pgmq"];

/// The names a string-form `mailbox` may be.
const MAILBOX_NAMES: &[&str] = &["in_memory", "postgres"];

/// The answer to upstream's `"mailbox": "file"`: results here wait in memory or in Postgres.
const NO_FILE_MAILBOX: &str = "there is no file mailbox; write \"in_memory\", or \
    {\"storage\": {\"type\": \"postgres\"}} to keep results across restarts";

/// The names upstream's `"runtime"` may take here: both mean ours, worker threads on tokio.
const RUNTIME_NAMES: &[&str] = &["native", "tokio"];

/// Reads a pool's `runtime`: one of [`RUNTIME_NAMES`].
struct RuntimeName;

impl Visitor<'_> for RuntimeName {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`native` or `tokio`")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<(), E> {
        match name {
            "native" | "tokio" => Ok(()),
            other => Err(E::unknown_variant(other, RUNTIME_NAMES)),
        }
    }
}

/// Takes the `runtime` out of every pool of `document`, refusing one that is not ours with
/// the allowed names (`pools.chat.runtime: unknown value `web_worker`; use `native` or
/// `tokio``). A document of another shape is left for the deserializer to answer.
pub(super) fn set_runtimes_aside(document: &mut Value) -> Result<(), ConfigError> {
    let Some(Value::Object(pools)) = document.get_mut("pools") else {
        return Ok(());
    };
    for (name, pool) in pools {
        let Some(runtime) = pool
            .as_object_mut()
            .and_then(|fields| fields.remove("runtime"))
        else {
            continue;
        };
        if let Err(error) = runtime.deserialize_str(RuntimeName) {
            return Err(ConfigError::invalid(
                format!("pools.{}.runtime", quote::name(name)),
                quote::problem(&wording::problem(&error.to_string())),
            ));
        }
    }
    Ok(())
}

/// A pool's `queue`: a mapping with a `type`, or the name of a backend without settings.
pub(super) fn queue<'de, D: Deserializer<'de>>(deserializer: D) -> Result<QueueSettings, D::Error> {
    deserializer.deserialize_any(QueueForm)
}

/// A pool's `mailbox`: a mapping of settings, or the name of a storage without settings.
pub(super) fn mailbox<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<MailboxSettings, D::Error> {
    deserializer.deserialize_any(MailboxForm)
}

/// Reads a pool's `queue` in either form.
struct QueueForm;

impl<'de> Visitor<'de> for QueueForm {
    type Value = QueueSettings;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // serde's own words for the derived form, which `wording` turns into the
        // configuration's, so that a wrong type reads exactly as it did without this module.
        f.write_str("internally tagged enum QueueSettings")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<QueueSettings, E> {
        let needs = |type_name: &str, settings: &str| {
            Err(E::custom(format_args!(
                "{} needs settings; write {{\"type\": \"{type_name}\", {settings}}}",
                quote::value(name)
            )))
        };
        match name {
            "in_memory" => Ok(QueueSettings::InMemory),
            "postgres" => QueueSettings::deserialize(type_only("postgres")),
            "yaque" | "file" => needs("yaque", r#""path": "...", "stream": "...""#),
            "postgres_pgmq" => needs("postgres_pgmq", r#""queue_name": "...""#),
            other => Err(E::unknown_variant(other, QUEUE_TYPES)),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<QueueSettings, A::Error> {
        QueueSettings::deserialize(MapAccessDeserializer::new(map))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<QueueSettings, A::Error> {
        QueueSettings::deserialize(SeqAccessDeserializer::new(seq))
    }
}

/// Reads a pool's `mailbox` in either form.
struct MailboxForm;

impl<'de> Visitor<'de> for MailboxForm {
    type Value = MailboxSettings;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As for the queue: serde's words for the derived form, worded by `wording`.
        f.write_str("struct MailboxSettings")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<MailboxSettings, E> {
        let storage = match name {
            "in_memory" => StorageSettings::default(),
            "postgres" => StorageSettings::deserialize(type_only("postgres"))?,
            "file" => return Err(E::custom(NO_FILE_MAILBOX)),
            other => return Err(E::unknown_variant(other, MAILBOX_NAMES)),
        };
        Ok(MailboxSettings {
            storage,
            ..MailboxSettings::default()
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MailboxSettings, A::Error> {
        MailboxSettings::deserialize(MapAccessDeserializer::new(map))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<MailboxSettings, A::Error> {
        MailboxSettings::deserialize(SeqAccessDeserializer::new(seq))
    }
}

/// The mapping `{"type": NAME}`, so that a string form gets exactly the defaults the tagged
/// form gets.
fn type_only<'de, E: de::Error>(
    name: &'static str,
) -> MapDeserializer<'de, std::iter::Once<(&'static str, &'static str)>, E> {
    MapDeserializer::new(std::iter::once(("type", name)))
}
