//! The configuration's `fleet` section: how the nodes of a shared Postgres queue report to
//! their fleet (see [`infra::postgres::fleet`](crate::infra::postgres)).

use std::time::Duration;

use serde::Deserialize;

use crate::settings::error::ConfigError;

/// The least heartbeat interval allowed, ms: a row written more often only loads the database.
const MIN_HEARTBEAT_MS: u64 = 50;
/// The greatest, ms: a node that dies must show as stale within minutes.
const MAX_HEARTBEAT_MS: u64 = 600_000;

/// The configuration's `fleet` section: `{"heartbeat_ms": 5000}`. Every node of a shared
/// Postgres queue (`postgres`, `postgres_pgmq`) registers itself in the fleet's node table
/// and writes a heartbeat every `heartbeat_ms`; a node that misses three is shown as stale.
/// Without the section, the heartbeat is 5 s.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSection {
    /// How often each node writes its heartbeat and takes the operator's requests, ms.
    /// Default 5,000; from 50 to 600,000.
    #[serde(default)]
    pub heartbeat_ms: Option<u64>,
}

impl FleetSection {
    /// The heartbeat interval these settings ask for.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat_ms
            .map_or(Duration::from_secs(5), Duration::from_millis)
    }

    /// Refuses a heartbeat outside the allowed range, naming the field.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        match self.heartbeat_ms {
            Some(ms) if !(MIN_HEARTBEAT_MS..=MAX_HEARTBEAT_MS).contains(&ms) => {
                Err(ConfigError::invalid(
                    "fleet.heartbeat_ms",
                    format!(
                        "{ms} is out of range; use a whole number of milliseconds from \
                         {MIN_HEARTBEAT_MS} to {MAX_HEARTBEAT_MS} (a node is stale after three \
                         missed heartbeats)"
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}
