//! The actor that runs a pool's retention cleaner (a periodic purge of results older than
//! the retention period) and, for a mailbox backend that awaits (a database), stores results
//! and hands terminal events to notifiers, so the scheduler never awaits mailbox I/O. An
//! inline mailbox is stored into by the scheduler directly.
//!
//! Invariants: a delivery is stored before any notifier hears of it; deliveries are stored
//! in the order the scheduler sent them.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use super::notify::Notifiers;
use super::{Delivery, Mailbox};
use crate::clock::now_ms;
use crate::domain::MailboxKey;
use crate::scheduler::core::clamp_ms;

/// What runs after a store, told whether the result is stored.
pub(crate) type AfterStore = Box<dyn FnOnce(bool) + Send>;

/// Messages the mailbox actor handles.
pub(crate) enum MailboxMsg<R> {
    /// Store a task's outcome and notify.
    Deliver {
        /// Where it goes.
        key: MailboxKey,
        /// The outcome.
        delivery: Delivery<R>,
        /// Which run of the task it was (see [`TerminalEvent::attempt`](super::TerminalEvent::attempt)).
        attempt: u32,
        /// Runs once the store is done, told whether it succeeded (a shared queue's claim is
        /// settled only after its task's result is stored).
        then: Option<AfterStore>,
    },
    /// Drop results older than the retention period (sent by the actor's own timer).
    PurgeExpired,
}

/// The mailbox actor. See the module docs.
pub(crate) struct MailboxActor<R>(PhantomData<fn() -> R>);

impl<R> Default for MailboxActor<R> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// What the mailbox actor starts with and holds.
pub(crate) struct MailboxState<R> {
    /// The pool's name, for events.
    pub pool: Arc<str>,
    /// The storage backend.
    pub mailbox: Arc<dyn Mailbox<R>>,
    /// Who hears of terminal events, and how results become JSON for them.
    pub notifiers: Notifiers<R>,
    /// How long results are kept; `None` keeps them until taken.
    pub retention: Option<Duration>,
    /// The pool's counters (`expired_results`).
    pub counters: Arc<crate::stats::PoolCounters>,
}

impl<R> Actor for MailboxActor<R>
where
    R: Send + 'static,
{
    type Msg = MailboxMsg<R>;
    type State = MailboxState<R>;
    type Arguments = MailboxState<R>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if let Some(retention) = state.retention {
            let sweep = (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
            myself.send_interval(sweep, || MailboxMsg::PurgeExpired);
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let span = crate::spans::actor("mailbox", myself.get_id(), &state.pool);
        async move {
            match message {
                MailboxMsg::Deliver {
                    key,
                    delivery,
                    attempt,
                    then,
                } => {
                    let stored = state.deliver(key, delivery, attempt).await;
                    if let Some(then) = then {
                        then(stored);
                    }
                }
                MailboxMsg::PurgeExpired => state.purge_expired().await,
            }
            Ok(())
        }
        .instrument(span)
        .await
    }
}

impl<R> MailboxState<R>
where
    R: Send + 'static,
{
    /// Stores a delivery and notifies; whether it was stored.
    async fn deliver(&mut self, key: MailboxKey, delivery: Delivery<R>, attempt: u32) -> bool {
        let event = self
            .notifiers
            .event_for(&self.pool, &key, &delivery, attempt);
        let task_id = delivery.task_id;
        if let Err(error) = self.mailbox.store(&key, delivery).await {
            tracing::error!(pool = %self.pool, task_id, %error, "could not store a result");
            return false;
        }
        if let Some(event) = event {
            self.notifiers.notify(&event);
        }
        true
    }

    async fn purge_expired(&mut self) {
        let Some(retention) = self.retention else {
            return;
        };
        let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
        let cutoff = clamp_ms(now_ms()).saturating_sub(retention_ms);
        match self.mailbox.purge_stored_before(cutoff).await {
            Ok(0) => {}
            Ok(purged) => {
                self.counters.expired_results.fetch_add(
                    u64::try_from(purged).unwrap_or(u64::MAX),
                    std::sync::atomic::Ordering::Relaxed,
                );
                tracing::debug!(pool = %self.pool, purged, "retention purge");
            }
            Err(error) => tracing::warn!(pool = %self.pool, %error, "retention purge failed"),
        }
    }
}
