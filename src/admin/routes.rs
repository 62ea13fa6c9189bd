//! The admin server's routes (see the module docs of [`admin`](super)): reads, control
//! behind the bearer token, the event stream and the dashboard, every one behind the
//! `guard` (the served names, the origins of requests, the token of reads).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

use super::hosts::ServedHosts;
use super::Served;
use crate::config::{escape_controls, Secret};
use crate::core::{EntryId, KeptLetter, PoolError, PoolStats, TenantView};
use crate::util::serde::{MailboxKey, ResourceKind, TaskId};
use prometheus_parking_lot_actors::scheduler::inspect::MAX_PAGE;

/// The dashboard page.
const DASHBOARD: &str = include_str!("dashboard.html");
/// The charting library the page draws with (uPlot, MIT; see `src/admin/assets/`).
const CHARTS_JS: &str = include_str!("assets/uPlot.iife.min.js");
const CHARTS_CSS: &str = include_str!("assets/uPlot.min.css");

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

/// Answers a request only if its `Host` is served (else 421) and its `Origin`, when sent, is
/// served (else 403), and a read of pool data only with the token when reads need one (else
/// 401, or 403 when the server has none).
async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let access = &state.access;
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .or_else(|| {
            request
                .uri()
                .authority()
                .map(|authority| authority.as_str())
        });
    if !host.is_some_and(|host| access.hosts.serves(host)) {
        return refuse_host(host, &access.hosts);
    }
    // Browsers send an Origin with every change, and with reads made from another page
    // (their own pages' reads need none): a foreign one is refused whatever the method.
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let served = origin
            .to_str()
            .is_ok_and(|origin| access.hosts.serves_origin(origin));
        if !served {
            return refuse_origin(origin.to_str().unwrap_or("(not text)"), &access.hosts);
        }
    }
    let reads = [Method::GET, Method::HEAD].contains(request.method());
    if reads && access.reads_need_token && request.uri().path().starts_with("/api/") {
        if let Err(error) = state.authorise_read(&request) {
            return error.into_response();
        }
    }
    next.run(request).await
}

/// The 421 of a request addressed to a name the server does not answer.
fn refuse_host(host: Option<&str>, hosts: &ServedHosts) -> Response {
    let asked = host.map_or_else(
        || "a request without a Host header".to_owned(),
        |host| format!("host {}", escape_controls(host)),
    );
    let text = format!(
        "this admin server does not answer {asked}; it answers {}. To serve it under another \
         name, list that name in allowed_hosts of the configuration's admin section \
         (AdminSettings::with_allowed_hosts in code)\n",
        hosts.listed()
    );
    (StatusCode::MISDIRECTED_REQUEST, text).into_response()
}

/// The 403 of a change sent from a page the server did not serve.
fn refuse_origin(origin: &str, hosts: &ServedHosts) -> Response {
    let text = format!(
        "this admin server takes requests only from its own pages, not from origin {}; it \
         serves http:// and https:// under {}. To serve it under another name, list that \
         name in allowed_hosts of the configuration's admin section\n",
        escape_controls(origin),
        hosts.listed()
    );
    (StatusCode::FORBIDDEN, text).into_response()
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

impl AdminState {
    /// The pool named `name`, or a 404 naming the pools there are.
    pub(super) fn pool(&self, name: &str) -> Result<&Served, ApiError> {
        self.pools.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.pools.keys().map(String::as_str).collect();
            ApiError::not_found(format!("no pool named {name:?}; the pools are {names:?}"))
        })
    }

    /// Refuses a mutation without the right bearer token.
    pub(super) fn authorise(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(token) = &self.access.token else {
            return Err(ApiError(
                StatusCode::FORBIDDEN,
                "this admin server was started without a token, so it changes nothing; \
                 start it with one (AdminSettings::token) and send it as \
                 `Authorization: Bearer <token>`"
                    .into(),
            ));
        };
        match bearer(headers) {
            Some(given) if constant_time_eq(given.as_bytes(), token.expose().as_bytes()) => Ok(()),
            Some(_) => Err(not_the_token()),
            None => Err(ApiError(
                StatusCode::UNAUTHORIZED,
                "this endpoint changes a pool: send `Authorization: Bearer <token>`".into(),
            )),
        }
    }

    /// Refuses a read of pool data without the right token: the bearer, or on the event
    /// stream (which a browser opens without headers) a `token` query parameter.
    fn authorise_read(&self, request: &Request) -> Result<(), ApiError> {
        let Some(token) = &self.access.token else {
            return Err(ApiError(
                StatusCode::FORBIDDEN,
                "this admin server listens off loopback without a token, so it shows no pool \
                 data; start it with one (AdminSettings::token, or token in the \
                 configuration's admin section) and send it as `Authorization: Bearer <token>`"
                    .into(),
            ));
        };
        let in_query = (request.uri().path() == "/api/events")
            .then(|| Query::<HashMap<String, String>>::try_from_uri(request.uri()).ok())
            .flatten()
            .and_then(|Query(mut query)| query.remove("token"));
        let given = bearer(request.headers()).map(str::to_owned).or(in_query);
        match given {
            Some(given) if constant_time_eq(given.as_bytes(), token.expose().as_bytes()) => Ok(()),
            Some(_) => Err(not_the_token()),
            None => Err(ApiError(
                StatusCode::UNAUTHORIZED,
                "this admin server's reads need its token: send `Authorization: Bearer \
                 <token>` (on the event stream, `?token=<token>` also does)"
                    .into(),
            )),
        }
    }
}

/// The bearer token of `Authorization: Bearer <token>`, if sent.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
}

/// The 401 of a token that is not the server's.
fn not_the_token() -> ApiError {
    ApiError(
        StatusCode::UNAUTHORIZED,
        "the bearer token is not this server's".into(),
    )
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only, not on where
/// they differ (a token guessed byte by byte learns nothing from the answer's timing).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut differ = u8::from(a.len() != b.len());
    for (index, byte) in a.iter().enumerate() {
        differ |= byte ^ b.get(index).copied().unwrap_or(!byte);
    }
    differ == 0
}

/// One pool's summary: its state, counters, and capacity and use per kind.
#[derive(Serialize)]
struct PoolSummary<'a> {
    name: &'a str,
    paused: bool,
    draining: bool,
    /// The kinds worth a bar (see [`kinds_shown`]).
    kinds: Vec<KindUse>,
    /// The units every kind has, when the capacity is one number for all (`max_units`)
    /// and the kinds no task has used are left out of `kinds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    units_per_kind: Option<u64>,
    stats: PoolStats,
}

/// A kind's capacity and use.
#[derive(Serialize)]
struct KindUse {
    kind: &'static str,
    total: u64,
    used: u64,
}

/// The summary of pool `name` from its counters `stats`.
fn summary<'a>(name: &'a str, served: &Served, stats: PoolStats) -> PoolSummary<'a> {
    let kinds_used = served
        .history
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .kinds_used;
    let (shown, units_per_kind) = kinds_shown(&stats, kinds_used);
    let kinds = shown
        .into_iter()
        .map(|kind| KindUse {
            kind: kind.name(),
            total: stats.total_by_kind[kind.index()],
            used: stats.used_by_kind[kind.index()],
        })
        .collect();
    PoolSummary {
        name,
        paused: stats.paused,
        draining: stats.draining,
        kinds,
        units_per_kind,
        stats,
    }
}

/// The kinds a pool's capacity is shown for: those with units configured and, where one
/// number gives every kind the same units (`max_units`, which sets no kind apart), only
/// those in use now or used since the server started; then also that number.
fn kinds_shown(
    stats: &PoolStats,
    used_before: [bool; ResourceKind::COUNT],
) -> (Vec<ResourceKind>, Option<u64>) {
    let configured: Vec<ResourceKind> = ResourceKind::ALL
        .into_iter()
        .filter(|kind| stats.total_by_kind[kind.index()] > 0)
        .collect();
    // A budget's capacity is its burst: set apart, whatever the others have.
    let budgeted = |kind: &ResourceKind| stats.budgets.iter().any(|b| b.kind == *kind);
    let mut plain = configured.iter().filter(|kind| !budgeted(kind));
    let first = plain
        .clone()
        .next()
        .map(|kind| stats.total_by_kind[kind.index()]);
    let uniform = configured.len() == ResourceKind::COUNT
        && plain.all(|kind| Some(stats.total_by_kind[kind.index()]) == first);
    if !uniform {
        return (configured, None);
    }
    let shown = configured
        .into_iter()
        .filter(|kind| {
            budgeted(kind) || used_before[kind.index()] || stats.used_by_kind[kind.index()] > 0
        })
        .collect();
    (shown, first)
}

/// Where the page holds the first snapshot it shows (`null`: none, it fetches one).
const FIRST_SNAPSHOT: &str = r#"<script id="first-snapshot" type="application/json">null</script>"#;

/// The dashboard page, with the first snapshot of the pool `?pool=` names (the first by
/// default) and its history in it, so that it shows the pool as it loads, before any
/// request of its own. Where reads need the token the page carries no data (it is served
/// without the token) and fetches the snapshot with the token typed into it.
async fn dashboard(
    State(state): State<Shared>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Html<String> {
    if state.access.reads_need_token {
        return Html(DASHBOARD.to_owned());
    }
    let wanted = query.ok().and_then(|Query(mut query)| query.remove("pool"));
    let first = first_snapshot(&state, wanted.as_deref()).await;
    let embedded = FIRST_SNAPSHOT.replace("null", &script_safe(&first));
    Html(DASHBOARD.replacen(FIRST_SNAPSHOT, &embedded, 1))
}

/// The pools, and the snapshot and history of the one `wanted` names (else the first);
/// `null` without pools or when the pool does not answer.
async fn first_snapshot(state: &AdminState, wanted: Option<&str>) -> Value {
    let chosen = wanted
        .filter(|name| state.pools.contains_key(*name))
        .or_else(|| state.pools.keys().next().map(String::as_str));
    let Some((name, served)) = chosen.and_then(|name| state.pools.get_key_value(name)) else {
        return Value::Null;
    };
    let Ok(snapshot) = snapshot_json(served, name, 0, DEFAULT_PAGE).await else {
        return Value::Null;
    };
    let pools: Vec<PoolSummary<'_>> = state
        .pools
        .iter()
        .map(|(name, served)| summary(name, served, served.pool.stats()))
        .collect();
    let history = history_json(served);
    json!({ "pools": pools, "pool": name, "snapshot": snapshot, "history": history })
}

/// `value` as JSON text that may stand inside a `<script>` element: `<`, `>` and `&` (only
/// ever inside strings) as `\u` escapes, so no text of a caller's (a tenant named
/// `</script>`) ends the element.
fn script_safe(value: &Value) -> String {
    value
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

async fn charts_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        CHARTS_JS,
    )
}

async fn charts_css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        CHARTS_CSS,
    )
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint; see GET /api/pools, or the dashboard at /")
}

async fn list_pools(State(state): State<Shared>) -> Json<Value> {
    let pools: Vec<PoolSummary<'_>> = state
        .pools
        .iter()
        .map(|(name, served)| summary(name, served, served.pool.stats()))
        .collect();
    Json(json!({ "pools": pools }))
}

async fn one_pool(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
    let served = state.pool(&name)?;
    let snapshot = served
        .pool
        .snapshot(0, 0)
        .await
        .map_err(ApiError::of_pool)?;
    let view = snapshot.view;
    let body = json!({
        "pool": summary(&name, served, snapshot.stats),
        "running": view.running,
        "tenants": view.tenants.iter().map(tenant_json).collect::<Vec<_>>(),
        "parked_total": view.parked_total,
    });
    Ok(Json(body).into_response())
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

async fn parked(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let served = state.pool(&name)?;
    let (offset, limit) = page(&query)?;
    let view = served
        .pool
        .inspect(offset, limit)
        .await
        .map_err(ApiError::of_pool)?;
    // `at_ms`: the server's clock when the view was taken, against which each task's
    // `expected_start_ms` reads as "expected in ~4.2 s" whatever the reader's clock says.
    let body = json!({
        "parked": view.parked,
        "parked_total": view.parked_total,
        "offset": view.offset,
        "limit": limit,
        "paused": view.paused,
        "at_ms": crate::util::clock::now_ms() as u64,
    });
    Ok(Json(body).into_response())
}

async fn running(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
    let view = state
        .pool(&name)?
        .pool
        .inspect(0, 0)
        .await
        .map_err(ApiError::of_pool)?;
    Ok(Json(json!({ "running": view.running })).into_response())
}

/// A tenant's row: its work, the units it holds per kind, its place under a fair share by
/// use, and for the row of the anonymous tenants how many it gathers.
fn tenant_json(tenant: &TenantView) -> Value {
    let holds: serde_json::Map<String, Value> = ResourceKind::ALL
        .into_iter()
        .filter(|kind| tenant.holds[kind.index()] > 0)
        .map(|kind| (kind.name().to_owned(), tenant.holds[kind.index()].into()))
        .collect();
    let mut row = json!({
        "tenant": tenant.tenant,
        "running": tenant.running,
        "parked": tenant.parked,
        "holds": holds,
    });
    // Under a fair share by use: where the tenant stands in the order.
    if let (Some(service), Some(weight)) = (tenant.service, tenant.weight) {
        row["service"] = service.into();
        row["weight"] = weight.into();
    }
    if tenant.anonymous_tenants > 0 {
        row["anonymous_tenants"] = tenant.anonymous_tenants.into();
    }
    row
}

/// Tenants `offset..offset + limit` of `tenants` as rows, with how many there are.
fn tenants_page(tenants: &[TenantView], offset: usize, limit: usize) -> Value {
    let rows: Vec<Value> = tenants
        .iter()
        .skip(offset)
        .take(limit)
        .map(tenant_json)
        .collect();
    json!({
        "tenants": rows,
        "tenants_total": tenants.len(),
        "offset": offset,
        "limit": limit,
    })
}

async fn tenants(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let served = state.pool(&name)?;
    let (offset, limit) = page(&query)?;
    let view = served.pool.inspect(0, 0).await.map_err(ApiError::of_pool)?;
    Ok(Json(tenants_page(&view.tenants, offset, limit)).into_response())
}

/// Everything the dashboard shows of pool `name` but its history, read at one instant:
/// the summary, a page of parked tasks (`offset`, `limit`), the running tasks, the first
/// tenants and the latest refusals.
async fn snapshot_json(
    served: &Served,
    name: &str,
    offset: usize,
    limit: usize,
) -> Result<Value, ApiError> {
    let snapshot = served
        .pool
        .snapshot(offset, limit)
        .await
        .map_err(ApiError::of_pool)?;
    let view = snapshot.view;
    let refusals: Vec<_> = served
        .history
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .refusals
        .iter()
        .rev()
        .cloned()
        .collect();
    Ok(json!({
        "pool": summary(name, served, snapshot.stats),
        "parked": {
            "parked": view.parked,
            "parked_total": view.parked_total,
            "offset": view.offset,
            "limit": limit,
            "paused": view.paused,
        },
        "running": view.running,
        "tenants": tenants_page(&view.tenants, 0, DEFAULT_PAGE),
        "refusals": refusals,
        "at_ms": crate::util::clock::now_ms() as u64,
    }))
}

async fn snapshot(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let served = state.pool(&name)?;
    let (offset, limit) = page(&query)?;
    Ok(Json(snapshot_json(served, &name, offset, limit).await?).into_response())
}

async fn refusals(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
    let history = state
        .pool(&name)?
        .history
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let latest: Vec<_> = history.refusals.iter().rev().cloned().collect();
    Ok(Json(json!({ "refusals": latest })).into_response())
}

async fn history(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
    Ok(Json(history_json(state.pool(&name)?)).into_response())
}

/// A pool's seconds of history, and how many events the listener missed.
fn history_json(served: &Served) -> Value {
    let history = served
        .history
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    json!({ "seconds": history.seconds, "missed_events": history.missed })
}

/// A task to cancel: its key's parts and its id.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    tenant: String,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    id: TaskId,
}

async fn control(
    State(state): State<Shared>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult {
    let served = state.pool(&name)?;
    const ACTIONS: &str = "pause, resume, drain, undrain or cancel";
    if !["pause", "resume", "drain", "undrain", "cancel"].contains(&action.as_str()) {
        return Err(ApiError::not_found(format!(
            "no action {action:?}; use {ACTIONS}"
        )));
    }
    state.authorise(&headers)?;
    let pool = &served.pool;
    let done = match action.as_str() {
        "pause" => pool.pause().await,
        "resume" => pool.resume().await,
        "drain" => pool.drain().await,
        "undrain" => pool.undrain().await,
        _ => {
            let cancel: CancelBody = serde_json::from_slice(&body).map_err(|error| {
                ApiError::bad_request(format!(
                    "a cancel takes {{\"tenant\": .., \"user_id\": .., \"session_id\": .., \"id\": ..}} (user_id and session_id optional): {error}"
                ))
            })?;
            let mut key = MailboxKey::new(cancel.tenant);
            key.user_id = cancel.user_id;
            key.session_id = cancel.session_id;
            pool.cancel(&key, cancel.id).await
        }
    };
    done.map_err(ApiError::of_pool)?;
    tracing::info!(pool = %name, %action, "admin action");
    Ok(Json(json!({ "pool": summary(&name, served, pool.stats()) })).into_response())
}

async fn events(
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

/// A dead letter as the API shows it: its entry as a string (entries use all 64 bits, past
/// what a JSON number keeps exact in a browser).
fn letter_json(letter: &KeptLetter) -> Value {
    json!({
        "entry": letter.entry.to_string(),
        "task_id": letter.task_id,
        "key": letter.key,
        "cost": letter.cost,
        "priority": letter.priority,
        "attempts": letter.attempts,
        "reason": letter.reason,
    })
}

/// An entry named in a path or a body: a whole number, or a 400 that says so.
fn entry_of(text: &str) -> Result<EntryId, ApiError> {
    text.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "entry is {text:?}; use the entry of a dead letter as listed (a whole number)"
        ))
    })
}

async fn dead_letters(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let served = state.pool(&name)?;
    let (offset, limit) = page(&query)?;
    if !served.pool.keeps_dead_letters() {
        // Not an error: there is nothing to list, and the note says why.
        let body = json!({
            "dead_letters": [],
            "offset": offset,
            "limit": limit,
            "kept": false,
            "note": keeps_none(&name),
        });
        return Ok(Json(body).into_response());
    }
    let letters = served
        .pool
        .dead_letters(offset, limit)
        .await
        .map_err(ApiError::of_pool)?;
    let listed: Vec<Value> = letters.iter().map(letter_json).collect();
    let body = json!({ "dead_letters": listed, "offset": offset, "limit": limit, "kept": true });
    Ok(Json(body).into_response())
}

/// Why pool `name` has no dead letters: its queue is its own.
fn keeps_none(name: &str) -> String {
    format!(
        "pool {name:?} keeps no dead letters: its queue is its own, and a task that fails \
         ends with its error in its mailbox; only a shared queue (postgres, postgres_pgmq) \
         keeps dead letters"
    )
}

/// The 409 of a change to the dead letters of a pool that keeps none.
fn keeps_none_error(served: &Served, name: &str) -> Result<(), ApiError> {
    if served.pool.keeps_dead_letters() {
        return Ok(());
    }
    Err(ApiError(StatusCode::CONFLICT, keeps_none(name)))
}

async fn retry_dead_letter(
    State(state): State<Shared>,
    Path((name, entry)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult {
    let served = state.pool(&name)?;
    let entry = entry_of(&entry)?;
    state.authorise(&headers)?;
    keeps_none_error(served, &name)?;
    let retried = served
        .pool
        .retry_dead_letter(entry)
        .await
        .map_err(ApiError::of_pool)?;
    if !retried {
        return Err(ApiError::not_found(format!(
            "no dead letter {entry} in pool {name:?}"
        )));
    }
    tracing::info!(pool = %name, entry, "admin: dead letter retried");
    Ok(Json(json!({ "retried": entry.to_string() })).into_response())
}

/// What a purge names: one entry, or none for all.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    #[serde(default)]
    entry: Option<String>,
}

async fn purge_dead_letters(
    State(state): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult {
    let served = state.pool(&name)?;
    state.authorise(&headers)?;
    keeps_none_error(served, &name)?;
    let purge: PurgeBody = if body.is_empty() {
        PurgeBody { entry: None }
    } else {
        serde_json::from_slice(&body).map_err(|error| {
            ApiError::bad_request(format!(
                "a purge takes {{\"entry\": \"..\"}} for one dead letter, or {{}} for all: {error}"
            ))
        })?
    };
    let entry = purge.entry.as_deref().map(entry_of).transpose()?;
    let purged = served
        .pool
        .purge_dead_letters(entry)
        .await
        .map_err(ApiError::of_pool)?;
    tracing::info!(pool = %name, purged, "admin: dead letters purged");
    Ok(Json(json!({ "purged": purged })).into_response())
}

/// The pool's schedules: each with its expression, zone, next tick and whether it is paused
/// on this node.
async fn schedules(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
    let served = state.pool(&name)?;
    Ok(Json(json!({ "schedules": served.pool.schedules() })).into_response())
}

/// Pauses or resumes one schedule on this node.
async fn control_schedule(
    State(state): State<Shared>,
    Path((name, schedule, action)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult {
    let served = state.pool(&name)?;
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        _ => {
            return Err(ApiError::not_found(format!(
                "no schedule action {action:?}; use pause or resume"
            )))
        }
    };
    if !served.pool.schedules().iter().any(|s| s.name == schedule) {
        return Err(ApiError::not_found(format!(
            "no schedule named {schedule:?} in pool {name:?}"
        )));
    }
    state.authorise(&headers)?;
    let done = if paused {
        served.pool.pause_schedule(&schedule)
    } else {
        served.pool.resume_schedule(&schedule)
    };
    done.map_err(ApiError::of_pool)?;
    tracing::info!(pool = %name, schedule = %schedule, paused, "admin: schedule {action}d");
    Ok(Json(json!({ "schedule": schedule, "paused": paused })).into_response())
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_compare_by_every_byte_and_the_length() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3creT"));
        assert!(!constant_time_eq(b"s3cret", b"s3cre"));
        assert!(!constant_time_eq(b"s3cre", b"s3cret"));
        assert!(constant_time_eq(b"", b""));
    }
}
