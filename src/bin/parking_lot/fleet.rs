//! `parking-lot fleet ...`: the fleet of a pool's shared Postgres queue, seen from any of its
//! nodes' admin servers, and control of any node.
//!
//! ```text
//! parking-lot fleet nodes --pool work              every node: health, state, claims (at risk when stale)
//! parking-lot fleet parked --pool work             the queue's parked tasks in rank order, why each waits
//! parking-lot fleet why --pool work --tenant acme 42   why one parked task waits, and its place
//! parking-lot fleet budgets --pool work            the fleet's budgets as they stand
//! parking-lot fleet pause --pool work --node NAME  (or --all; resume, drain, undrain alike)
//! parking-lot fleet cancel --pool work --tenant acme 42
//! ```

use clap::Subcommand;
use serde_json::Value;

use super::output::{columns, json_text, text};
use super::server::{path, Server};
use super::{Failure, Page, TaskAddress};
use prometheus_parking_lot::config::escape_controls;

/// What to do with a fleet.
#[derive(Subcommand)]
pub(crate) enum FleetCommand {
    /// Every node of the pool's queue: its health, state, claims and heartbeat
    Nodes {
        /// The pool
        #[arg(long)]
        pool: String,
    },
    /// The queue's parked tasks in rank order, whichever node parked them, and why each waits
    Parked {
        /// The pool
        #[arg(long)]
        pool: String,
        #[command(flatten)]
        page: Page,
    },
    /// Why one parked task of the queue waits, and its place, whichever node parked it
    Why(TaskAddress),
    /// The fleet's budgets as they stand
    Budgets {
        /// The pool
        #[arg(long)]
        pool: String,
    },
    /// Stop a node claiming (or every node), at its next heartbeat
    Pause(Target),
    /// End a node's pause (or every node's)
    Resume(Target),
    /// Drain a node (or every node): it takes no new work and finishes what it has
    Drain(Target),
    /// End a node's drain (or every node's)
    Undrain(Target),
    /// Cancel a parked task of the queue, whichever node submitted it
    Cancel(TaskAddress),
}

/// Which node a request is for.
#[derive(clap::Args)]
pub(crate) struct Target {
    /// The pool
    #[arg(long)]
    pool: String,
    /// The node, as `fleet nodes` names it
    #[arg(long, required_unless_present = "all", conflicts_with = "all")]
    node: Option<String>,
    /// Every node of the queue
    #[arg(long)]
    all: bool,
}

/// Runs `command` against `server`: the text to print.
pub(crate) async fn run(
    server: &Server,
    json: bool,
    command: &FleetCommand,
) -> Result<String, Failure> {
    let (answer, table): (Value, fn(&Value) -> String) = match command {
        FleetCommand::Nodes { pool } => (
            server.get(&format!("/api/fleet/{}", path(pool))).await?,
            nodes_table,
        ),
        FleetCommand::Parked { pool, page } => (
            server
                .get(&format!(
                    "/api/fleet/{}/parked?{}",
                    path(pool),
                    page.query()
                ))
                .await?,
            parked_table,
        ),
        FleetCommand::Why(task) => (
            server
                .get(&format!(
                    "/api/fleet/{}/why?{}",
                    path(&task.pool),
                    task.query()?
                ))
                .await
                .map_err(|failure| task.not_found(failure))?,
            why_line,
        ),
        FleetCommand::Budgets { pool } => (
            server.get(&format!("/api/fleet/{}", path(pool))).await?,
            budgets_table,
        ),
        FleetCommand::Pause(target) => (request(server, "pause", target).await?, asked_line),
        FleetCommand::Resume(target) => (request(server, "resume", target).await?, asked_line),
        FleetCommand::Drain(target) => (request(server, "drain", target).await?, asked_line),
        FleetCommand::Undrain(target) => (request(server, "undrain", target).await?, asked_line),
        FleetCommand::Cancel(task) => {
            let answer = post(server, &task.pool, "cancel", task.body()?)
                .await
                .map_err(|failure| task.not_found(failure))?;
            return Ok(if json {
                format!("{}\n", json_text(&answer, false))
            } else {
                task.cancelled()?
            });
        }
    };
    Ok(if json {
        format!("{}\n", json_text(&answer, true))
    } else {
        table(&answer)
    })
}

/// Sends `action` to the node `target` names, or every node.
async fn request(server: &Server, action: &str, target: &Target) -> Result<Value, Failure> {
    let body = match &target.node {
        Some(node) => serde_json::json!({ "node": node }),
        None => serde_json::json!({ "all": true }),
    };
    post(server, &target.pool, action, body).await
}

/// POSTs `body` to the fleet's `action` of pool `pool`, with the token.
async fn post(server: &Server, pool: &str, action: &str, body: Value) -> Result<Value, Failure> {
    let Some(token) = &server.token else {
        return Err(Failure(format!(
            "fleet {action} changes the fleet: give the admin server's token with --token or \
             PARKING_LOT_TOKEN"
        )));
    };
    let request = server
        .client
        .post(format!("{}/api/fleet/{}/{action}", server.url, path(pool)))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string());
    server.answer(request).await
}

fn nodes_table(answer: &Value) -> String {
    let nodes = answer["nodes"].as_array().cloned().unwrap_or_default();
    if nodes.is_empty() {
        return "no node has registered\n".into();
    }
    let rows = nodes
        .iter()
        .map(|node| {
            let state = match (node["paused"].as_bool(), node["draining"].as_bool()) {
                (_, Some(true)) => "draining",
                (Some(true), _) => "paused",
                _ => "claiming",
            };
            let claims = if node["claims_at_risk"].as_u64().unwrap_or(0) > 0 {
                format!("{} at risk", text(&node["claims"]))
            } else {
                text(&node["claims"])
            };
            vec![
                text(&node["node"]),
                text(&node["host"]),
                text(&node["pid"]),
                text(&node["health"]),
                state.to_owned(),
                text(&node["workers"]),
                text(&node["running"]),
                claims,
                format!("{} ms ago", text(&node["heartbeat_age_ms"])),
            ]
        })
        .collect();
    columns(
        &[
            "NODE",
            "HOST",
            "PID",
            "HEALTH",
            "STATE",
            "WORKERS",
            "RUNNING",
            "CLAIMS",
            "HEARTBEAT",
        ],
        rows,
    )
}

fn parked_table(answer: &Value) -> String {
    let parked = answer["parked"].as_array().cloned().unwrap_or_default();
    let total = answer["parked_total"].as_u64().unwrap_or(0);
    let first = answer["offset"].as_u64().unwrap_or(0);
    let rows = parked
        .iter()
        .map(|task| {
            vec![
                (task["position"].as_u64().unwrap_or(0) + 1).to_string(),
                text(&task["task_id"]),
                text(&task["key"]["tenant"]),
                format!("{} {}", text(&task["units"]), text(&task["kind"])),
                format!("{} ms", text(&task["waited_ms"])),
                text(&task["reason_text"]),
            ]
        })
        .collect();
    let mut table = columns(&["#", "TASK", "TENANT", "COST", "WAITING", "WHY"], rows);
    let shown = parked.len() as u64;
    table.push_str(&if shown == 0 {
        format!("{total} parked\n")
    } else {
        format!("{}-{} of {total} parked\n", first + 1, first + shown)
    });
    table
}

fn why_line(answer: &Value) -> String {
    let task = &answer["task"];
    format!(
        "task {} of {}: #{} in the queue; {}\n",
        text(&task["task_id"]),
        escape_controls(&text(&task["key"]["tenant"])),
        task["position"].as_u64().unwrap_or(0) + 1,
        escape_controls(&text(&task["reason_text"]))
    )
}

fn budgets_table(answer: &Value) -> String {
    let budgets = answer["budgets"].as_array().cloned().unwrap_or_default();
    if budgets.is_empty() {
        return "the queue has no budget\n".into();
    }
    let rows = budgets
        .iter()
        .map(|budget| {
            vec![
                text(&budget["kind"]),
                format!("{} of {}", text(&budget["level"]), text(&budget["burst"])),
                format!(
                    "{} every {} ms",
                    text(&budget["units"]),
                    text(&budget["per_ms"])
                ),
                format!("{} ms", text(&budget["full_in_ms"])),
            ]
        })
        .collect();
    columns(&["KIND", "LEVEL", "REFILL", "FULL IN"], rows)
}

fn asked_line(answer: &Value) -> String {
    let asked: Vec<String> = answer["asked"]
        .as_array()
        .map(|nodes| nodes.iter().map(text).collect())
        .unwrap_or_default();
    format!(
        "{} asked of {}; carried out at each node's next heartbeat\n",
        text(&answer["action"]),
        escape_controls(&asked.join(", "))
    )
}
