//! The fleet's routes (see the module docs of [`admin`](super)): the fleet page, the nodes
//! and their health, the queue's parked tasks with their reasons, the budgets, and control
//! of any node of the fleet. A pool's fleet is there when the pool's queue is a shared
//! Postgres queue (cargo feature `postgres`): [`Admin::with_fleet`](super::Admin::with_fleet).
//!
//! | endpoint | answers |
//! |---|---|
//! | `GET /fleet` | the fleet page |
//! | `GET /api/fleet` | the pools whose fleet is shown, with their queues |
//! | `GET /api/fleet/{pool}` | the nodes (live, stale or gone, with their claims at risk) and the budgets |
//! | `GET /api/fleet/{pool}/parked?offset=0&limit=50` | the queue's parked tasks in rank order, each with why it waits |
//! | `GET /api/fleet/{pool}/why?tenant=..&id=..` (`user_id`, `session_id`) | one parked task of the queue, its place and why it waits, whichever node parked it |
//! | `POST /api/fleet/{pool}/pause`, `/resume`, `/drain`, `/undrain` `{"node": ".."}` or `{"all": true}` | a request to a node, or every node, carried out at its next heartbeat (a token) |
//! | `POST /api/fleet/{pool}/cancel` `{"tenant", "user_id", "session_id", "id"}` | cancel a parked task of the queue, whichever node submitted it (a token) |

use axum::response::Html;
use axum::routing::get;
use axum::Router;

pub(crate) use super::routes::Fleets;
use super::routes::Shared;

/// The fleet page.
const FLEET_PAGE: &str = include_str!("fleet.html");

/// The fleet's routes, to be merged into the server's (behind its guard).
pub(crate) fn routes() -> Router<Shared> {
    api::routes(Router::new().route("/fleet", get(page)))
}

async fn page() -> Html<&'static str> {
    Html(FLEET_PAGE)
}

/// Without Postgres there is no fleet to read: the page only, which says so.
#[cfg(not(feature = "postgres"))]
mod api {
    use axum::extract::State;
    use axum::routing::get;
    use axum::{Json, Router};

    use super::Shared;

    pub(super) fn routes(router: Router<Shared>) -> Router<Shared> {
        router.route("/api/fleet", get(fleets))
    }

    /// The pools with a fleet: none.
    async fn fleets(State(state): State<Shared>) -> Json<serde_json::Value> {
        let pools: Vec<&String> = state.fleets.keys().collect();
        Json(serde_json::json!({ "fleets": pools }))
    }
}

#[cfg(feature = "postgres")]
mod api {
    use std::collections::HashMap;

    use axum::extract::{Path, Query, State};
    use axum::http::HeaderMap;
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    use axum::{Json, Router};
    use serde_json::json;

    use super::super::routes::{object_body, page, ApiError, ApiResult, CancelBody, Shared};
    use crate::core::PoolError;
    use crate::infra::postgres::fleet::{FleetView, NodeAction, STALE_AFTER_BEATS};
    use crate::util::serde::{MailboxKey, TaskId};

    pub(super) fn routes(router: Router<Shared>) -> Router<Shared> {
        router
            .route("/api/fleet", get(fleets))
            .route("/api/fleet/{pool}", get(overview))
            .route("/api/fleet/{pool}/parked", get(parked))
            .route("/api/fleet/{pool}/why", get(why))
            .route("/api/fleet/{pool}/{action}", post(control))
    }

    /// The fleet of pool `name`, or a 404 naming the pools that have one.
    fn fleet_of<'a>(state: &'a Shared, name: &str) -> Result<&'a FleetView, ApiError> {
        state.fleets.get(name).ok_or_else(|| {
            let names: Vec<&str> = state.fleets.keys().map(String::as_str).collect();
            ApiError::not_found(format!(
                "pool {name:?} shows no fleet (its queue is not a shared Postgres queue, or \
                 there is no such pool); the pools with a fleet are {names:?}"
            ))
        })
    }

    async fn fleets(State(state): State<Shared>) -> Json<serde_json::Value> {
        let fleets: Vec<serde_json::Value> = state
            .fleets
            .iter()
            .map(|(pool, view)| {
                json!({
                    "pool": pool,
                    "queue": view.queue().key(),
                    "backend": view.queue().backend(),
                })
            })
            .collect();
        Json(json!({ "fleets": fleets }))
    }

    async fn overview(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
        let fleet = fleet_of(&state, &name)?;
        let nodes = fleet.nodes().await.map_err(ApiError::of_pool)?;
        let budgets = fleet.budgets().await.map_err(ApiError::of_pool)?;
        let body = json!({
            "pool": name,
            "queue": fleet.queue().key(),
            "backend": fleet.queue().backend(),
            "stale_after_beats": STALE_AFTER_BEATS,
            "nodes": nodes,
            "budgets": budgets,
        });
        Ok(Json(body).into_response())
    }

    async fn parked(
        State(state): State<Shared>,
        Path(name): Path<String>,
        Query(query): Query<HashMap<String, String>>,
    ) -> ApiResult {
        let fleet = fleet_of(&state, &name)?;
        let (offset, limit) = page(&query)?;
        let parked = fleet
            .parked(offset, limit)
            .await
            .map_err(ApiError::of_pool)?;
        let mut body = serde_json::to_value(parked).map_err(|error| {
            ApiError::of_pool(PoolError::Internal(format!(
                "fleet: a page of parked tasks: {error}"
            )))
        })?;
        body["limit"] = limit.into();
        Ok(Json(body).into_response())
    }

    /// Why a parked task of the queue waits: `?tenant=..&id=..` (and `user_id`, `session_id`
    /// when its key has them).
    async fn why(
        State(state): State<Shared>,
        Path(name): Path<String>,
        Query(query): Query<HashMap<String, String>>,
    ) -> ApiResult {
        let fleet = fleet_of(&state, &name)?;
        if let Some(unknown) = query
            .keys()
            .find(|key| !["tenant", "user_id", "session_id", "id"].contains(&key.as_str()))
        {
            return Err(ApiError::bad_request(format!(
                "unknown parameter {unknown:?}; use tenant, user_id, session_id and id"
            )));
        }
        let Some(tenant) = query.get("tenant") else {
            return Err(ApiError::bad_request(
                "why takes the task's tenant (?tenant=..&id=..)",
            ));
        };
        let id: TaskId = query
            .get("id")
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| {
                ApiError::bad_request("why takes the task's id, a whole number (?tenant=..&id=..)")
            })?;
        let mut key = MailboxKey::new(tenant.clone());
        key.user_id = query.get("user_id").cloned();
        key.session_id = query.get("session_id").cloned();
        let task = fleet
            .why_waiting(&key, id)
            .await
            .map_err(ApiError::of_pool)?
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "task {id} of tenant {tenant:?} is not parked in the queue of pool {name:?} \
                     (it runs, it ended, or no node took it)"
                ))
            })?;
        Ok(Json(json!({ "task": task })).into_response())
    }

    /// Which nodes a request is for: one by name, or every node.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Target {
        #[serde(default)]
        node: Option<String>,
        #[serde(default)]
        all: bool,
    }

    const ACTIONS: &str = "pause, resume, drain, undrain or cancel";

    async fn control(
        State(state): State<Shared>,
        Path((name, action)): Path<(String, String)>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> ApiResult {
        let fleet = fleet_of(&state, &name)?;
        if action != "cancel" && NodeAction::from_name(&action).is_none() {
            return Err(ApiError::not_found(format!(
                "no fleet action {action:?}; use {ACTIONS}"
            )));
        }
        state.authorise(&headers)?;
        if action == "cancel" {
            return cancel(&state, &name, &body).await;
        }
        let action = NodeAction::from_name(&action).unwrap_or(NodeAction::Pause);
        let takes = format!(
            "a fleet {} takes {{\"node\": \"..\"}} for one node or {{\"all\": true}} for every node",
            action.name()
        );
        let target: Target = object_body(&body, &takes)?;
        let node = match (&target.node, target.all) {
            (Some(node), false) => Some(node.as_str()),
            (None, true) => None,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "a fleet {} names one node ({{\"node\": \"..\"}}) or asks for every node \
                     ({{\"all\": true}}), not both nor neither",
                    action.name()
                )))
            }
        };
        let asked = fleet
            .request(node, action)
            .await
            .map_err(ApiError::of_pool)?;
        if asked.is_empty() {
            let nodes = fleet.nodes().await.map_err(ApiError::of_pool)?;
            let serving: Vec<&str> = nodes
                .iter()
                .filter(|node| node.health != crate::infra::postgres::fleet::NodeHealth::Gone)
                .map(|node| node.node.as_str())
                .collect();
            return Err(ApiError::not_found(format!(
                "no node {} serves the queue of pool {name:?}; its nodes are {serving:?}",
                node.map_or_else(|| "at all".to_owned(), |node| format!("{node:?}"))
            )));
        }
        tracing::info!(pool = %name, action = action.name(), nodes = ?asked, "admin: fleet request");
        Ok(Json(json!({ "action": action.name(), "asked": asked })).into_response())
    }

    /// Cancels a task of the queue: this node's pool finds it here or parked in the shared
    /// queue, whichever node submitted it, and its submitter hears `Cancelled`.
    async fn cancel(state: &Shared, name: &str, body: &[u8]) -> ApiResult {
        let served = state.pool(name)?;
        let cancel: CancelBody = object_body(body, CancelBody::TAKES)?;
        let (key, id) = cancel.task();
        served
            .pool
            .cancel(&key, id)
            .await
            .map_err(ApiError::of_pool)?;
        tracing::info!(pool = %name, id, "admin: fleet cancel");
        Ok(Json(json!({ "cancelled": id })).into_response())
    }
}
