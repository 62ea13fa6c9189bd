//! The event stream (server-sent events): every task step of the chosen pools, and their
//! summaries every second, until the stream closes or the server stops.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use serde_json::json;
use tokio::sync::{broadcast, mpsc, watch};

use super::pools::{summary, PoolSummary};
use super::{ApiError, Shared};

pub(super) async fn events(
    State(state): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let chosen: Vec<String> = match query.get("pool") {
        Some(name) => {
            state.pool(name)?;
            vec![name.clone()]
        }
        None => state.pools.keys().cloned().collect(),
    };
    let (sender, receiver) = mpsc::channel::<Event>(256);
    for name in &chosen {
        let feed = state.pool(name)?.pool.events();
        tokio::spawn(forward_tasks(
            name.clone(),
            feed,
            sender.clone(),
            state.closing.clone(),
        ));
    }
    tokio::spawn(forward_stats(Arc::clone(&state), chosen, sender));
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        let event = receiver.recv().await?;
        Some((Ok(event), receiver))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Hands a pool's task events to an event stream until it closes or the server stops.
async fn forward_tasks(
    pool: String,
    mut feed: broadcast::Receiver<prometheus_parking_lot_actors::observe::events::FeedEvent>,
    sender: mpsc::Sender<Event>,
    mut closing: watch::Receiver<bool>,
) {
    loop {
        let event = tokio::select! {
            event = feed.recv() => event,
            _ = closing.changed() => return,
        };
        let data = match event {
            Ok(event) => json!({ "pool": pool, "event": event }),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                json!({ "pool": pool, "missed": missed })
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let event = Event::default().event("task").data(data.to_string());
        if sender.send(event).await.is_err() {
            return;
        }
    }
}

/// Hands the chosen pools' summaries to an event stream every second, until it closes or
/// the server stops.
async fn forward_stats(state: Shared, chosen: Vec<String>, sender: mpsc::Sender<Event>) {
    let mut closing = state.closing.clone();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = closing.changed() => return,
        }
        let pools: Vec<PoolSummary<'_>> = chosen
            .iter()
            .filter_map(|name| {
                let served = state.pools.get(name)?;
                Some(summary(name, served, served.pool.stats()))
            })
            .collect();
        let data = json!({ "pools": pools }).to_string();
        if sender
            .send(Event::default().event("stats").data(data))
            .await
            .is_err()
        {
            return;
        }
    }
}
