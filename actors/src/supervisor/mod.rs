//! The root of the actor tree.
//!
//! The supervisor spawns every child of every pool (scheduler, queue, mailbox, workers) linked
//! to itself, so it hears when one fails. A failed worker is restarted on a fresh thread,
//! within a bounded restart intensity per pool (at most `max_restarts` within `within`);
//! past it, or when a child that cannot be restarted fails, the supervisor *escalates*: it
//! logs the reason and hands it to the pool, which stops accepting work and says why.
//!
//! Invariants: every live child is in `children`; a child stopped on purpose (pool shutdown)
//! is never restarted; an escalated pool is never restarted again.
//!
//! The tree runs on futures the pool's [`Spawn`](spawn::Spawn) hosts ([`spawn`]).

pub mod spawn;

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr,
    SupervisionEvent,
};
use tracing::Instrument;

/// Starts (or restarts) one child, linked to the given supervisor.
#[doc(hidden)]
pub type StartChild = Arc<
    dyn Fn(ActorCell) -> Pin<Box<dyn Future<Output = Result<ActorCell, SpawnErr>> + Send>>
        + Send
        + Sync,
>;

/// Called with the reason when a pool escalates.
#[doc(hidden)]
pub type Escalate = Arc<dyn Fn(String) + Send + Sync>;

/// How often a pool's workers may be restarted before the supervisor gives up on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed within the window.
    pub max_restarts: u32,
    /// The sliding window.
    pub within: Duration,
}

impl Default for RestartPolicy {
    /// 1,000 restarts within 10 seconds: a pool whose executor panics on some inputs keeps
    /// serving; a crash loop on every task stops.
    fn default() -> Self {
        Self {
            max_restarts: 1_000,
            within: Duration::from_secs(10),
        }
    }
}

/// One child to supervise.
#[derive(Clone)]
#[doc(hidden)]
pub struct ChildSpec {
    /// The pool it belongs to.
    pub pool: Arc<str>,
    /// Its role, for logs (`scheduler`, `worker-3`).
    pub role: String,
    /// How to start it.
    pub start: StartChild,
    /// Whether a failure is answered with a restart (workers) or an escalation.
    pub restartable: bool,
    /// The pool's restart policy.
    pub policy: RestartPolicy,
    /// Counts restarts (the pool's stats).
    pub restarts: Arc<AtomicU64>,
    /// Tells the pool it escalated.
    pub escalate: Escalate,
    /// For a restartable child: tells the pool this child failed and will not come back
    /// (the pool escalated, or its restart failed), so work sent its way must be failed.
    pub lost: Option<Escalate>,
}

impl ChildSpec {
    fn report_lost(&self, reason: &str) {
        if let Some(lost) = &self.lost {
            lost(reason.to_owned());
        }
    }
}

/// Messages the supervisor handles.
pub enum SupervisorMsg {
    /// Start a child and supervise it; replies with its cell.
    Spawn {
        /// What to start.
        spec: ChildSpec,
        /// The started child, or why it could not start.
        reply: RpcReplyPort<Result<ActorCell, String>>,
    },
    /// Stop supervising a pool's children (it is shutting down): their exits are expected.
    ReleasePool {
        /// The pool.
        pool: Arc<str>,
        /// The children that were supervised.
        reply: RpcReplyPort<Vec<ActorCell>>,
    },
}

/// The root actor. See the module docs.
#[derive(Default)]
pub struct SupervisorActor;

/// What the supervisor tracks.
#[derive(Default)]
#[doc(hidden)]
pub struct SupervisorState {
    children: HashMap<ActorId, (ActorCell, ChildSpec)>,
    restarts: HashMap<Arc<str>, VecDeque<Instant>>,
    escalated: HashSet<Arc<str>>,
}

impl Actor for SupervisorActor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(SupervisorState::default())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = crate::observe::spans::actor("supervisor", myself.get_id(), "");
        async move {
            match message {
                SupervisorMsg::Spawn { spec, reply } => {
                    let started = (spec.start)(myself.get_cell()).await;
                    let answer = match started {
                        Ok(cell) => {
                            state.children.insert(cell.get_id(), (cell.clone(), spec));
                            Ok(cell)
                        }
                        Err(error) => Err(format!(
                            "{}: could not start {}: {error}",
                            spec.pool, spec.role
                        )),
                    };
                    let _ = reply.send(answer);
                }
                SupervisorMsg::ReleasePool { pool, reply } => {
                    let released: Vec<ActorId> = state
                        .children
                        .iter()
                        .filter(|(_, (_, spec))| spec.pool == pool)
                        .map(|(id, _)| *id)
                        .collect();
                    let cells = released
                        .into_iter()
                        .filter_map(|id| state.children.remove(&id).map(|(cell, _)| cell))
                        .collect();
                    state.restarts.remove(&pool);
                    let _ = reply.send(cells);
                }
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = crate::observe::spans::actor("supervisor", myself.get_id(), "");
        async move {
            match event {
                SupervisionEvent::ActorFailed(cell, error) => {
                    if let Some((_, spec)) = state.children.remove(&cell.get_id()) {
                        state.child_failed(&myself, spec, error.to_string()).await;
                    }
                }
                SupervisionEvent::ActorTerminated(cell, _, reason) => {
                    if let Some((_, spec)) = state.children.remove(&cell.get_id()) {
                        let reason = reason.unwrap_or_else(|| "stopped".into());
                        let message = format!(
                            "{}: {} stopped unexpectedly ({reason})",
                            spec.pool, spec.role
                        );
                        state.escalate(&spec, message);
                    }
                }
                _ => {}
            }
            Ok(())
        }
        .instrument(span)
        .await
    }
}

impl SupervisorState {
    async fn child_failed(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        spec: ChildSpec,
        error: String,
    ) {
        if self.escalated.contains(&spec.pool) {
            spec.report_lost(&error);
            return;
        }
        if !spec.restartable {
            let message = format!(
                "{}: {} failed and cannot be restarted: {error}",
                spec.pool, spec.role
            );
            self.escalate(&spec, message);
            return;
        }
        if let Some(message) = self.note_restart(&spec) {
            self.escalate(&spec, message.clone());
            spec.report_lost(&message);
            return;
        }
        tracing::debug!(pool = %spec.pool, role = %spec.role, %error, "restarting child");
        match (spec.start)(myself.get_cell()).await {
            Ok(cell) => {
                spec.restarts.fetch_add(1, Ordering::Relaxed);
                self.children.insert(cell.get_id(), (cell, spec));
            }
            Err(start_error) => {
                let message = format!(
                    "{}: could not restart {}: {start_error}",
                    spec.pool, spec.role
                );
                self.escalate(&spec, message.clone());
                spec.report_lost(&message);
            }
        }
    }

    /// Records a restart; returns the escalation message when the policy is exceeded.
    fn note_restart(&mut self, spec: &ChildSpec) -> Option<String> {
        let now = Instant::now();
        let window = self.restarts.entry(spec.pool.clone()).or_default();
        while window
            .front()
            .is_some_and(|&at| now.duration_since(at) > spec.policy.within)
        {
            window.pop_front();
        }
        window.push_back(now);
        (window.len() > spec.policy.max_restarts as usize).then(|| {
            format!(
                "{}: worker restart intensity exceeded ({} restarts within {:?}); the pool stopped accepting tasks",
                spec.pool,
                window.len(),
                spec.policy.within
            )
        })
    }

    fn escalate(&mut self, spec: &ChildSpec, message: String) {
        if self.escalated.insert(spec.pool.clone()) {
            tracing::error!(pool = %spec.pool, "{message}");
            (spec.escalate)(message);
        }
    }
}
