//! A shared queue's dead letters: the list, and a retry or a purge (a token). A pool whose
//! queue is its own keeps none, and says why.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use super::{object_body, page, ApiError, ApiResult, Shared};
use crate::admin::Served;
use crate::core::{EntryId, KeptLetter};

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

pub(super) async fn dead_letters(
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

pub(super) async fn retry_dead_letter(
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

pub(super) async fn purge_dead_letters(
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
        let takes = "a purge takes {\"entry\": \"..\"} for one dead letter, or {} for all";
        object_body(&body, takes)?
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
