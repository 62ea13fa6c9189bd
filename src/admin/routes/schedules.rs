//! A pool's periodic tasks: the list, and the pause or resume of one on this node (a
//! token).

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::{ApiError, ApiResult, Shared};

/// The pool's schedules: each with its expression, zone, next tick and whether it is paused
/// on this node.
pub(super) async fn schedules(State(state): State<Shared>, Path(name): Path<String>) -> ApiResult {
    let served = state.pool(&name)?;
    Ok(Json(json!({ "schedules": served.pool.schedules() })).into_response())
}

/// Pauses or resumes one schedule on this node.
pub(super) async fn control_schedule(
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
