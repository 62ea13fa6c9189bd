//! The dashboard page, served with the first snapshot in it, and the charting library it
//! draws with.

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{Html, IntoResponse};
use serde_json::{json, Value};

use super::pools::{history_json, snapshot_json, summary, PoolSummary};
use super::{AdminState, Shared, DEFAULT_PAGE};

/// The dashboard page.
const DASHBOARD: &str = include_str!("../dashboard.html");
/// The charting library the page draws with (uPlot, MIT; see `src/admin/assets/`).
const CHARTS_JS: &str = include_str!("../assets/uPlot.iife.min.js");
const CHARTS_CSS: &str = include_str!("../assets/uPlot.min.css");

/// Where the page holds the first snapshot it shows (`null`: none, it fetches one).
const FIRST_SNAPSHOT: &str = r#"<script id="first-snapshot" type="application/json">null</script>"#;

/// The dashboard page, with the first snapshot of the pool `?pool=` names (the first by
/// default) and its history in it, so that it shows the pool as it loads, before any
/// request of its own. Where reads need the token the page carries no data (it is served
/// without the token) and fetches the snapshot with the token typed into it.
pub(super) async fn dashboard(
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

pub(super) async fn charts_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        CHARTS_JS,
    )
}

pub(super) async fn charts_css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        CHARTS_CSS,
    )
}
