//! The actor that owns one worker thread.
//!
//! Invariants: one thread per actor; the actor fails exactly when its thread died of a
//! panic, which is what lets the supervisor restart it on a fresh thread. The restarted actor
//! gets the same [`WorkerThreadSpec`], so its fresh thread keeps the worker's index and
//! consumes the same job channel.

use std::marker::PhantomData;
use std::thread::JoinHandle;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use super::thread::{self, WorkerThreadSpec};
use super::WorkerMsg;
use crate::worker::executor::TaskExecutor;

/// Marks the payload, result and executor types without owning any.
type Types<P, R, E> = PhantomData<fn() -> (P, R, E)>;

/// Owns one worker thread. See the module docs.
pub(crate) struct WorkerActor<P, R, E>(Types<P, R, E>);

impl<P, R, E> Default for WorkerActor<P, R, E> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// The thread the actor owns.
pub(crate) struct WorkerState {
    _thread: JoinHandle<()>,
}

impl<P, R, E> Actor for WorkerActor<P, R, E>
where
    P: Send + 'static,
    R: Send + 'static,
    E: TaskExecutor<P, R> + 'static,
{
    type Msg = WorkerMsg;
    type State = WorkerState;
    type Arguments = WorkerThreadSpec<P, R, E>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        spec: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let name = thread::thread_name(&spec.pool, spec.index);
        let thread = thread::spawn(spec, myself)
            .map_err(|error| format!("could not start worker thread {name}: {error}"))?;
        Ok(WorkerState { _thread: thread })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = crate::observe::spans::actor("worker", myself.get_id(), "");
        async move {
            match message {
                WorkerMsg::ThreadDied { reason } => {
                    Err(format!("worker thread died after a panic: {reason}").into())
                }
            }
        }
        .instrument(span)
        .await
    }
}
