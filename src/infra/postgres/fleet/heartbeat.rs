//! The heartbeat duty of a node of a shared queue ([`NodeHeartbeat`]), and the thread that
//! runs it beside the pool ([`FleetMember`]).
//!
//! Each round the duty takes what an operator asked of the node (a pause, a drain, ...),
//! carries it out with the pool's own control, then writes the node's state: so the row
//! shows the request done at the same heartbeat that took it. A round that fails (the
//! database is away) is logged and tried again at the next; the node runs on meanwhile, and
//! the fleet shows it stale until the database is back.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::DbErr;

use super::registry::{
    ensure_nodes_table, forget_old_nodes, leave, take_wanted, write_beat, NodeAction, NodeBeat,
};
use super::{millis, FleetQueue, FleetSettings};
use crate::core::{PoolControl, PoolError};
use crate::infra::postgres::PgDatabase;
use crate::util::serde::ResourceKind;

/// Keeps one node's row of the fleet: its heartbeat, its state, and the requests it was sent.
#[derive(Clone)]
pub struct NodeHeartbeat {
    database: PgDatabase,
    queue: FleetQueue,
    node: Arc<str>,
    pool: PoolControl,
    settings: FleetSettings,
}

impl NodeHeartbeat {
    /// The heartbeat of node `node` (its name in the queue's leases), serving `queue` with
    /// `pool`.
    pub fn new(
        database: PgDatabase,
        queue: FleetQueue,
        node: impl Into<Arc<str>>,
        pool: PoolControl,
        settings: FleetSettings,
    ) -> Self {
        Self {
            database,
            queue,
            node: node.into(),
            pool,
            settings,
        }
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// One round: carries out the request waiting for this node, if any, and writes its
    /// state. Answers the request carried out.
    pub async fn run_once(&self) -> Result<Option<NodeAction>, PoolError> {
        let key = self.queue.key();
        let wanted = take_wanted(&self.database, key, &self.node)
            .await
            .map_err(|error| self.failed("take the operator's request", &error))?;
        if let Some(action) = wanted {
            let done = match action {
                NodeAction::Pause => self.pool.pause().await,
                NodeAction::Resume => self.pool.resume().await,
                NodeAction::Drain => self.pool.drain().await,
                NodeAction::Undrain => self.pool.undrain().await,
            };
            match done {
                Ok(()) => {
                    tracing::info!(node = %self.node, action = action.name(), "fleet: carried out an operator's request")
                }
                Err(error) => {
                    tracing::warn!(node = %self.node, action = action.name(), %error, "fleet: an operator's request failed")
                }
            }
        }
        write_beat(&self.database, key, &self.node, &self.beat())
            .await
            .map_err(|error| self.failed("write its heartbeat", &error))?;
        forget_old_nodes(&self.database)
            .await
            .map_err(|error| self.failed("forget the nodes long gone", &error))?;
        Ok(wanted)
    }

    /// Marks the node gone: it stopped cleanly.
    pub async fn leave(&self) -> Result<(), PoolError> {
        leave(&self.database, self.queue.key(), &self.node)
            .await
            .map_err(|error| self.failed("mark itself gone", &error))
    }

    /// The node's state now.
    fn beat(&self) -> NodeBeat {
        let stats = self.pool.stats();
        let capacity: serde_json::Map<String, serde_json::Value> = ResourceKind::ALL
            .into_iter()
            .filter(|kind| stats.total_by_kind[kind.index()] > 0)
            .map(|kind| {
                (
                    kind.name().to_owned(),
                    stats.total_by_kind[kind.index()].into(),
                )
            })
            .collect();
        NodeBeat {
            pool: self.pool.name().to_owned(),
            host: host_name(),
            pid: std::process::id(),
            heartbeat_every_ms: millis(self.settings.heartbeat),
            workers: i64::try_from(stats.worker_count).unwrap_or(i64::MAX),
            capacity: serde_json::Value::Object(capacity).to_string(),
            running: i64::try_from(stats.active_tasks).unwrap_or(i64::MAX),
            paused: stats.paused,
            draining: stats.draining,
        }
    }

    fn failed(&self, what: &str, error: &DbErr) -> PoolError {
        PoolError::Internal(format!(
            "fleet: node {} of {} could not {what}: {}",
            self.node,
            self.queue.key(),
            crate::infra::postgres::describe(error)
        ))
    }
}

/// This machine's name, as the node table shows it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// How long a stopping node waits to mark itself gone: its row then says stale instead.
const LEAVE_WITHIN: Duration = Duration::from_secs(2);

/// A node's part in its fleet: its [`NodeHeartbeat`] run every heartbeat on a thread of its
/// own, until dropped, when the node marks itself gone.
pub struct FleetMember {
    node: Arc<str>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FleetMember {
    /// Registers the node of `heartbeat` (creating the node table if needed, and trying its
    /// first heartbeat before it answers) and keeps its row from then on.
    ///
    /// The fleet is the operator's view, not the node's work: a node whose row cannot be
    /// written (a role without the right to create or write `pl_fleet_nodes`, a database that
    /// is away) runs all the same. It logs why, once, tries again every heartbeat, and the
    /// fleet shows it stale meanwhile. Only a heartbeat thread that cannot start is an error.
    pub fn join(heartbeat: NodeHeartbeat) -> Result<Self, PoolError> {
        let node = heartbeat.node.clone();
        let database = heartbeat.database.clone();
        if let Err(error) = heartbeat
            .database
            .block_on(|_| async move { ensure_nodes_table(&database).await })
        {
            let error = heartbeat.failed("create the node table", &error);
            tracing::warn!(%error, "fleet: the node runs, but the fleet will not show it until the node table exists");
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (first, tried) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("parking-lot-fleet".into())
            .spawn(move || beat_until_stopped(heartbeat, first, stopped))
            .map_err(|error| {
                PoolError::Internal(format!(
                    "fleet: the heartbeat thread could not start: {error}"
                ))
            })?;
        // The first round is tried before the pool is handed out, so a node that starts is
        // in the fleet at once (when its row can be written).
        let _ = tried.recv();
        Ok(Self {
            node,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FleetMember {
    fn drop(&mut self) {
        self.stop_now();
    }
}

impl std::fmt::Debug for FleetMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetMember")
            .field("node", &self.node)
            .finish()
    }
}

/// The heartbeat thread: a round at once (then a word to `first`), a round every heartbeat
/// until `stopped`, and a last write that marks the node gone.
fn beat_until_stopped(
    heartbeat: NodeHeartbeat,
    first: std::sync::mpsc::Sender<()>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::warn!(%error, "fleet: the heartbeat's runtime could not start; the fleet will not show this node");
            return;
        }
    };
    runtime.block_on(async move {
        let mut failing = false;
        note(heartbeat.run_once().await, &mut failing);
        let _ = first.send(());
        let mut tick = tokio::time::interval(heartbeat.settings.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // A round still waiting for a database that is away does not hold the stop up.
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = &mut stopped => break,
            }
            tokio::select! {
                round = heartbeat.run_once() => note(round, &mut failing),
                _ = &mut stopped => break,
            }
        }
        match tokio::time::timeout(LEAVE_WITHIN, heartbeat.leave()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "fleet: the node could not mark itself gone; it will show as stale")
            }
            Err(_) => tracing::warn!(
                "fleet: the node could not mark itself gone in time; it will show as stale"
            ),
        }
    });
}

/// Logs a round that failed after one that did not (and the first), and the round that
/// works again: a database away for an hour is one warning, not one per heartbeat.
fn note(round: Result<Option<NodeAction>, PoolError>, failing: &mut bool) {
    match round {
        Err(error) if !*failing => {
            *failing = true;
            tracing::warn!(%error, "fleet: a heartbeat failed; the node runs on, the fleet shows it stale, and each heartbeat tries again");
        }
        Ok(_) if *failing => {
            *failing = false;
            tracing::info!("fleet: the node heartbeats again");
        }
        _ => {}
    }
}
