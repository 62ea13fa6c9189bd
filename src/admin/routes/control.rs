//! Control of a pool (a token): pause, resume, drain, undrain, and the cancel of a task.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::pools::summary;
use super::{object_body, ApiError, ApiResult, CancelBody, Shared};

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
            let cancel: CancelBody = object_body(&body, CancelBody::TAKES)?;
            let (key, id) = cancel.task();
            pool.cancel(&key, id).await
        }
    };
    done.map_err(ApiError::of_pool)?;
    tracing::info!(pool = %name, %action, "admin action");
    Ok(Json(json!({ "pool": summary(&name, served, pool.stats()) })).into_response())
}
