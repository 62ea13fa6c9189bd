//! The one LISTEN connection of a [`PgDatabase`](super::PgDatabase): every channel its
//! backends listen on, multiplexed, with reconnection.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::sqlx::postgres::{PgListener, PgPool};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::util::redact;

/// One registration: a channel, whether its owner still lives, and what to call.
pub(crate) struct Listener {
    pub channel: String,
    pub alive: Box<dyn Fn() -> bool + Send>,
    pub call: Box<dyn Fn(&str) + Send>,
}

/// How often listeners whose owners are gone are dropped (and their channels unlistened).
const PRUNE_EVERY: Duration = Duration::from_secs(5);

/// Runs until every handle is gone (the command channel closes) or the pool closes.
pub(crate) async fn run(pool: PgPool, mut commands: UnboundedReceiver<Listener>) {
    let mut by_channel: HashMap<String, Vec<Listener>> = HashMap::new();
    let mut pause = Duration::from_millis(100);
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                if pool.is_closed() {
                    return;
                }
                tracing::warn!(error = %redact::text(&error.to_string()), "cannot open the postgres LISTEN connection; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let channels: Vec<&str> = by_channel.keys().map(String::as_str).collect();
        if let Err(error) = listener.listen_all(channels).await {
            tracing::warn!(error = %redact::text(&error.to_string()), "cannot LISTEN on postgres; retrying");
            tokio::time::sleep(pause).await;
            continue;
        }
        pause = Duration::from_millis(100);
        // Anything sent while no connection listened is lost: every listener looks again.
        for listeners in by_channel.values() {
            for listener in listeners {
                (listener.call)("");
            }
        }
        let mut prune = tokio::time::interval(PRUNE_EVERY);
        loop {
            tokio::select! {
                command = commands.recv() => {
                    let Some(new) = command else { return };
                    if !by_channel.contains_key(&new.channel) {
                        if let Err(error) = listener.listen(&new.channel).await {
                            tracing::warn!(error = %redact::text(&error.to_string()), "LISTEN failed; reconnecting");
                            by_channel.entry(new.channel.clone()).or_default().push(new);
                            break;
                        }
                    }
                    by_channel.entry(new.channel.clone()).or_default().push(new);
                }
                received = listener.try_recv() => match received {
                    Ok(Some(notification)) => {
                        for listener in by_channel.get(notification.channel()).into_iter().flatten() {
                            (listener.call)(notification.payload());
                        }
                    }
                    // The connection was lost; the next call re-opens it, but notifications
                    // sent meanwhile are gone.
                    Ok(None) => {
                        for listener in by_channel.values().flatten() {
                            (listener.call)("");
                        }
                    }
                    Err(error) => {
                        tracing::warn!(error = %redact::text(&error.to_string()), "the postgres LISTEN connection failed; reconnecting");
                        break;
                    }
                },
                _ = prune.tick() => {
                    let mut gone = Vec::new();
                    by_channel.retain(|channel, listeners| {
                        listeners.retain(|listener| (listener.alive)());
                        let keep = !listeners.is_empty();
                        if !keep {
                            gone.push(channel.clone());
                        }
                        keep
                    });
                    for channel in gone {
                        if let Err(error) = listener.unlisten(&channel).await {
                            tracing::warn!(error = %redact::text(&error.to_string()), "UNLISTEN failed; reconnecting");
                            break;
                        }
                    }
                }
            }
        }
        if pool.is_closed() {
            return;
        }
    }
}
