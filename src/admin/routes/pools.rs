//! Reads of pools: the list with each pool's summary, one pool, its parked and running
//! tasks, its tenants, the snapshot the dashboard shows, its refusals and its history.

use std::collections::HashMap;
use std::sync::PoisonError;

use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};

use super::{page, ApiError, ApiResult, Shared, DEFAULT_PAGE};
use crate::admin::Served;
use crate::core::{PoolStats, TenantView};
use crate::util::serde::ResourceKind;

/// One pool's summary: its state, counters, and capacity and use per kind.
#[derive(Serialize)]
pub(super) struct PoolSummary<'a> {
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
pub(super) fn summary<'a>(name: &'a str, served: &Served, stats: PoolStats) -> PoolSummary<'a> {
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

pub(super) async fn list_pools(State(state): State<Shared>) -> Json<Value> {
    let pools: Vec<PoolSummary<'_>> = state
        .pools
        .iter()
        .map(|(name, served)| summary(name, served, served.pool.stats()))
        .collect();
    Json(json!({ "pools": pools }))
}

pub(super) async fn one_pool(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
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

pub(super) async fn parked(
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

pub(super) async fn running(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
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

pub(super) async fn tenants(
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
pub(super) async fn snapshot_json(
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

pub(super) async fn snapshot(
    State(state): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult {
    let served = state.pool(&name)?;
    let (offset, limit) = page(&query)?;
    Ok(Json(snapshot_json(served, &name, offset, limit).await?).into_response())
}

pub(super) async fn refusals(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
    let history = state
        .pool(&name)?
        .history
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let latest: Vec<_> = history.refusals.iter().rev().cloned().collect();
    Ok(Json(json!({ "refusals": latest })).into_response())
}

pub(super) async fn history(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
    Ok(Json(history_json(state.pool(&name)?)).into_response())
}

/// A pool's seconds of history, and how many events the listener missed.
pub(super) fn history_json(served: &Served) -> Value {
    let history = served
        .history
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    json!({ "seconds": history.seconds, "missed_events": history.missed })
}
