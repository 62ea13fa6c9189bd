//! Control of a pool (a token): pause, resume, drain, undrain, and the cancel of a task.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::pools::summary;
use super::{ApiError, ApiResult, Shared};
use crate::util::serde::{MailboxKey, TaskId};

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

pub(super) async fn control(
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
