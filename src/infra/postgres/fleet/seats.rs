//! The fleet places of pools built from a configuration: each pool on a shared Postgres queue
//! joins its fleet as it starts ([`FleetMember`]) and its admin server reads the fleet
//! ([`FleetView`]).

use std::collections::BTreeMap;

use super::{FleetMember, FleetQueue, FleetSettings, FleetView, NodeHeartbeat};
use crate::config::QueueSettings;
use crate::core::{PoolControl, PoolError, QueueOrder};
use crate::infra::postgres::PgDatabase;

/// The fleet places of built pools: their heartbeats, stopped (each node marking itself gone)
/// when this is dropped, and their views by pool.
#[derive(Debug)]
pub(crate) struct Seats {
    settings: FleetSettings,
    members: Vec<FleetMember>,
    views: BTreeMap<String, FleetView>,
}

/// The fleet's queue of pool `pool`, whose queue is `queue` and claims in `order`, if that
/// is a shared Postgres queue.
pub(crate) fn fleet_queue(
    pool: &str,
    queue: &QueueSettings,
    order: QueueOrder,
) -> Result<Option<FleetQueue>, PoolError> {
    Ok(match queue {
        QueueSettings::Postgres {
            table, queue_name, ..
        } => Some(FleetQueue::table(table, queue_name.as_deref().unwrap_or(pool))?.in_order(order)),
        QueueSettings::PostgresPgmq { queue_name, .. } => {
            Some(FleetQueue::pgmq(queue_name).in_order(order))
        }
        _ => None,
    })
}

impl Seats {
    /// No pool yet; each that joins heartbeats as `settings` say.
    pub(crate) fn new(settings: FleetSettings) -> Self {
        Self {
            settings,
            members: Vec::new(),
            views: BTreeMap::new(),
        }
    }

    /// Joins a pool (built as `instance`, its node named `node` in the queue's leases) to
    /// the fleet of its shared queue `fleet_queue` ([`fleet_queue`]).
    pub(crate) fn join(
        &mut self,
        instance: &str,
        fleet_queue: FleetQueue,
        node: &str,
        database: PgDatabase,
        control: PoolControl,
    ) -> Result<(), PoolError> {
        let heartbeat = NodeHeartbeat::new(
            database.clone(),
            fleet_queue.clone(),
            node,
            control,
            self.settings,
        );
        self.members.push(FleetMember::join(heartbeat)?);
        self.views
            .insert(instance.to_owned(), FleetView::new(database, fleet_queue));
        Ok(())
    }

    /// Each pool's view of its fleet.
    #[cfg(feature = "admin")]
    pub(crate) fn views(&self) -> impl Iterator<Item = (&String, &FleetView)> {
        self.views.iter()
    }
}
