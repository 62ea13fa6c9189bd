//! The admin server's routes (see the module docs of [`admin`](super)): reads, control
//! behind the bearer token, the event stream and the dashboard, every one behind the
//! `guard` (the served names, the origins of requests, the token of reads).
//!
//! Here: the router, the state its handlers share, their errors and the paging of long
//! lists. The handlers live one concern a file: `access` (the guard and the token),
//! `dashboard` (the page and its assets), `pools` (reads of pools), `control` (pause,
//! resume, drain, undrain, cancel), `events` (the event stream), `dead_letters` and
//! `schedules`.

mod access;
mod control;
mod dashboard;
mod dead_letters;
mod events;
mod pools;
mod schedules;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::watch;

use super::hosts::ServedHosts;
use super::Served;
use crate::config::Secret;
use crate::core::PoolError;
use prometheus_parking_lot_actors::scheduler::inspect::MAX_PAGE;

use access::guard;
use control::control;
use dashboard::{charts_css, charts_js, dashboard};
use dead_letters::{dead_letters, purge_dead_letters, retry_dead_letter};
use events::events;
use pools::{history, list_pools, one_pool, parked, refusals, running, snapshot, tenants};
use schedules::{control_schedule, schedules};

/// The default page of parked tasks.
const DEFAULT_PAGE: usize = 50;

/// Who the server answers, and what it asks of them.
pub(crate) struct Access {
    /// The `Host` names answered, and so the origins changes are taken from.
    pub hosts: ServedHosts,
    /// The bearer token changes need (and reads, when `reads_need_token`).
    pub token: Option<Secret>,
    /// Whether reads of pool data need the token: off loopback, or asked for.
    pub reads_need_token: bool,
}

/// What every handler shares.
pub(crate) struct AdminState {
    pools: BTreeMap<String, Served>,
    /// The fleets of the pools on a shared Postgres queue (`fleet.rs`).
    pub(super) fleets: Fleets,
    access: Access,
    /// Becomes `true` as the server stops: open event streams end.
    closing: watch::Receiver<bool>,
}

pub(super) type Shared = Arc<AdminState>;

/// The fleets the server shows, by pool (see `fleet.rs`).
#[cfg(feature = "postgres")]
pub(crate) type Fleets = BTreeMap<String, crate::infra::postgres::fleet::FleetView>;

/// The fleets the server shows: none in a build without Postgres (no value of the map's
/// type can exist).
#[cfg(not(feature = "postgres"))]
pub(crate) type Fleets = BTreeMap<String, std::convert::Infallible>;

/// The router over `pools` and `more` routes (the fleet's), every request behind the
/// `guard` of `access`.
pub(crate) fn router(
    pools: BTreeMap<String, Served>,
    (fleets, more): (Fleets, Router<Shared>),
    access: Access,
    closing: watch::Receiver<bool>,
) -> Router {
    let state = Arc::new(AdminState {
        pools,
        fleets,
        access,
        closing,
    });
    Router::new()
        .route("/", get(dashboard))
        .route("/assets/charts.js", get(charts_js))
        .route("/assets/charts.css", get(charts_css))
        .route("/api/pools", get(list_pools))
        .route("/api/pools/{pool}", get(one_pool))
        .route("/api/pools/{pool}/parked", get(parked))
        .route("/api/pools/{pool}/running", get(running))
        .route("/api/pools/{pool}/snapshot", get(snapshot))
        .route("/api/pools/{pool}/tenants", get(tenants))
        .route("/api/pools/{pool}/refusals", get(refusals))
        .route("/api/pools/{pool}/history", get(history))
        .route("/api/pools/{pool}/dead-letters", get(dead_letters))
        .route(
            "/api/pools/{pool}/dead-letters/purge",
            post(purge_dead_letters),
        )
        .route(
            "/api/pools/{pool}/dead-letters/{entry}/retry",
            post(retry_dead_letter),
        )
        .route("/api/pools/{pool}/schedules", get(schedules))
        .route(
            "/api/pools/{pool}/schedules/{schedule}/{action}",
            post(control_schedule),
        )
        .route("/api/pools/{pool}/{action}", post(control))
        .route("/api/events", get(events))
        .merge(more)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            guard,
        ))
        .with_state(state)
}

/// An error answer: `{"error": "..."}` with its status.
#[derive(Debug)]
pub(crate) struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl ApiError {
    pub(super) fn bad_request(text: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, text.into())
    }

    pub(super) fn not_found(text: impl Into<String>) -> Self {
        Self(StatusCode::NOT_FOUND, text.into())
    }

    /// A pool's error, with the status it deserves.
    pub(super) fn of_pool(error: PoolError) -> Self {
        let status = match error {
            PoolError::TaskNotFound(_) => StatusCode::NOT_FOUND,
            PoolError::InvalidConfig(_) => StatusCode::CONFLICT,
            PoolError::Shutdown => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self(status, error.to_string())
    }
}

pub(super) type ApiResult = Result<Response, ApiError>;

/// A request body read as `T`, which must be a JSON object: serde's derived `Deserialize`
/// would also take an array of the fields in order (`["tenant", null, null, 9]` for a
/// cancel), which no caller means. Anything else is a 400 that says what the body takes
/// (`takes`, the request's name and shape) and what was wrong.
pub(super) fn object_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    takes: &str,
) -> Result<T, ApiError> {
    let refuse = |why: String| ApiError::bad_request(format!("{takes}: {why}"));
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|error| refuse(error.to_string()))?;
    let shape = match &value {
        serde_json::Value::Object(_) => None,
        serde_json::Value::Array(_) => Some("an array"),
        serde_json::Value::String(_) => Some("a string"),
        serde_json::Value::Number(_) => Some("a number"),
        serde_json::Value::Bool(_) => Some("a boolean"),
        serde_json::Value::Null => Some("null"),
    };
    if let Some(shape) = shape {
        return Err(refuse(format!("the body is {shape}, not a JSON object")));
    }
    serde_json::from_value(value).map_err(|error| refuse(error.to_string()))
}

/// A task to cancel, as a pool's and a fleet's cancel take it: its key's parts and its id.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelBody {
    tenant: String,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    id: crate::util::serde::TaskId,
}

impl CancelBody {
    /// What a cancel's body takes, for its errors.
    pub(super) const TAKES: &'static str = "a cancel takes {\"tenant\": .., \"user_id\": .., \
        \"session_id\": .., \"id\": ..} (user_id and session_id optional)";

    /// The task's key and id.
    pub(super) fn task(self) -> (crate::util::serde::MailboxKey, crate::util::serde::TaskId) {
        let mut key = crate::util::serde::MailboxKey::new(self.tenant);
        key.user_id = self.user_id;
        key.session_id = self.session_id;
        (key, self.id)
    }
}

impl AdminState {
    /// The pool named `name`, or a 404 naming the pools there are.
    pub(super) fn pool(&self, name: &str) -> Result<&Served, ApiError> {
        self.pools.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.pools.keys().map(String::as_str).collect();
            ApiError::not_found(format!("no pool named {name:?}; the pools are {names:?}"))
        })
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint; see GET /api/pools, or the dashboard at /")
}

/// A whole number from a query string, within `min..=max`, or a 400 that says so.
fn number(
    query: &HashMap<String, String>,
    name: &str,
    default: usize,
    min: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let Some(text) = query.get(name) else {
        return Ok(default);
    };
    match text.parse::<usize>() {
        Ok(value) if (min..=max).contains(&value) => Ok(value),
        _ => Err(ApiError::bad_request(format!(
            "{name} is {text:?}; use a whole number from {min} to {max}"
        ))),
    }
}

/// A page's `offset` and `limit` from a query string that holds nothing else.
pub(super) fn page(query: &HashMap<String, String>) -> Result<(usize, usize), ApiError> {
    if let Some(unknown) = query
        .keys()
        .find(|key| !["offset", "limit"].contains(&key.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown parameter {unknown:?}; use offset and limit"
        )));
    }
    let offset = number(query, "offset", 0, 0, usize::MAX / 2)?;
    let limit = number(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE)?;
    Ok((offset, limit))
}
