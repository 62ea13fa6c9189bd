//! How answers are printed: as JSON text (`--json`), or as aligned tables and lines for a
//! person, every text a caller wrote escaped.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_parking_lot::config::escape_controls;
use prometheus_parking_lot::core::scheduling::StartEstimate;
use serde_json::Value;

/// `value` as JSON text, pretty or not. serde_json escapes the control characters below
/// U+0020 in strings (a raw line break is the layout's); DEL and U+0080 to U+009F, which
/// some terminals obey, can only stand in strings, so they are written as `\u` escapes too
/// and the text stays the same JSON.
pub(crate) fn json_text(value: &Value, pretty: bool) -> String {
    let text = if pretty {
        format!("{value:#}")
    } else {
        value.to_string()
    };
    text.chars()
        .map(|c| {
            if matches!(c, '\u{7f}'..='\u{9f}') {
                format!("\\u{:04x}", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Rows as aligned columns under a header, every cell escaped (cells hold what callers
/// wrote: tenants, keys, reasons).
pub(crate) fn columns(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| row.iter().map(|cell| escape_controls(cell)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|title| title.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut text = line(header.iter().map(|title| (*title).to_owned()).collect());
    for row in rows {
        text.push_str(&line(row));
    }
    text
}

fn state_of(pool: &Value) -> &'static str {
    if pool["draining"].as_bool() == Some(true) {
        "draining"
    } else if pool["paused"].as_bool() == Some(true) {
        "paused"
    } else {
        "running"
    }
}

pub(crate) fn status_table(answer: &Value) -> String {
    let pools = answer["pools"].as_array().cloned().unwrap_or_default();
    if pools.is_empty() {
        return "no pools\n".into();
    }
    let rows = pools
        .iter()
        .map(|pool| {
            let stats = &pool["stats"];
            let kinds: Vec<String> = pool["kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|kind| kind["used"].as_u64() > Some(0) || pools.len() == 1)
                .map(|kind| format!("{} {}/{}", text(&kind["kind"]), kind["used"], kind["total"]))
                .collect();
            vec![
                text(&pool["name"]),
                state_of(pool).into(),
                stats["active_tasks"].to_string(),
                stats["queued_tasks"].to_string(),
                stats["completed_tasks"].to_string(),
                stats["failed_tasks"].to_string(),
                format!("{}/{}", stats["live_worker_threads"], stats["worker_count"]),
                kinds.join(", "),
            ]
        })
        .collect();
    columns(
        &[
            "POOL", "STATE", "RUNNING", "PARKED", "DONE", "FAILED", "WORKERS", "IN USE",
        ],
        rows,
    )
}

/// A JSON string's text (other values as JSON).
pub(crate) fn text(value: &Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

/// A task's key as `tenant/user/session`, as `--key` takes it: the parts it has, an empty
/// user where it has a session only (`globex//s9`).
fn key_of(task: &Value) -> String {
    let key = &task["key"];
    let tenant = text(&key["tenant"]);
    match (key["user_id"].as_str(), key["session_id"].as_str()) {
        (None, None) => tenant,
        (Some(user), None) => format!("{tenant}/{user}"),
        (user, Some(session)) => format!("{tenant}/{}/{session}", user.unwrap_or("")),
    }
}

/// A task's cost, with each cost of another kind it holds beside it: `300 gpu_vram + 1 cpu`.
fn cost_of(task: &Value) -> String {
    let first = format!(
        "{} {}",
        task["cost"]["units"],
        kind_name(&task["cost"]["kind"])
    );
    let also = task["also"].as_array().into_iter().flatten();
    also.fold(first, |cost, other| {
        format!("{cost} + {} {}", other["units"], kind_name(&other["kind"]))
    })
}

/// A kind as the config names it (`GpuVram` → `gpu_vram`).
fn kind_name(kind: &Value) -> String {
    let name = text(kind);
    let mut snake = String::new();
    for (index, c) in name.chars().enumerate() {
        if c.is_uppercase() && index > 0 {
            snake.push('_');
        }
        snake.extend(c.to_lowercase());
    }
    snake
}

/// How long ago (or from now) `at_ms` is, in words.
fn ago(at_ms: &Value) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |now| now.as_millis() as i128);
    let Some(at) = at_ms.as_u64() else {
        return "-".into();
    };
    let seconds = (now - i128::from(at)) / 1_000;
    if seconds >= 0 {
        format!("{seconds}s ago")
    } else {
        format!("in {}s", -seconds)
    }
}

/// Why a task waits, in words.
fn reason_of(reason: &Value) -> String {
    let kind = kind_name(&reason["kind"]);
    match reason["reason"].as_str() {
        None => "-".into(),
        Some("units") => format!("needs {} {kind}, {} free", reason["needed"], reason["free"]),
        Some("budget") => format!(
            "{kind} budget: needs {}, holds {}, enough {}",
            reason["needed"],
            reason["level"],
            ago(&reason["ready_at_ms"])
        ),
        Some("tenant_share") => format!(
            "tenant at its share of {kind}: needs {}, room for {}",
            reason["needed"], reason["room"]
        ),
        Some("worker") => format!("no idle worker ({} busy)", reason["busy"]),
        Some("reserved") => format!("task {} is reserved and goes first", reason["reserved"]),
        Some("behind") => format!("{} tasks rank ahead", reason["ahead"]),
        Some("sleeping") => format!("retry backoff, parks again {}", ago(&reason["until_ms"])),
        Some("paused") => "the pool is paused".into(),
        Some("dependencies") => format!("waits for {} tasks it depends on", reason["pending"]),
        Some(other) => other.into(),
    }
}

/// A parked task's place in line and expected start, as of the server's `at_ms`: "3rd in
/// line, expected in ~4.2 s".
fn in_line(task: &Value, at_ms: u64) -> String {
    let Some(position) = task["position"].as_u64() else {
        return "-".into();
    };
    let estimate = StartEstimate {
        position: position as usize,
        start_ms: task["expected_start_ms"].as_u64(),
        from_timeouts: task["from_timeouts"].as_bool().unwrap_or(false),
    };
    estimate.in_words(at_ms)
}

pub(crate) fn parked_table(answer: &Value) -> String {
    let tasks = answer["parked"].as_array().cloned().unwrap_or_default();
    let offset = answer["offset"].as_u64().unwrap_or(0);
    let total = answer["parked_total"].as_u64().unwrap_or(0);
    if total == 0 {
        return "no parked tasks\n".into();
    }
    if tasks.is_empty() {
        return format!("no parked tasks from --offset {offset}; {total} parked in all\n");
    }
    // The server's clock, so that a reader's clock that is off does not move the estimate.
    let at_ms = answer["at_ms"].as_u64().unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |now| now.as_millis() as u64)
    });
    let rows = tasks
        .iter()
        .enumerate()
        .map(|(index, task)| {
            vec![
                (offset + index as u64 + 1).to_string(),
                task["id"].to_string(),
                key_of(task),
                text(&task["priority"]),
                cost_of(task),
                ago(&task["since_ms"]),
                reason_of(&task["reason"]),
                in_line(task, at_ms),
            ]
        })
        .collect();
    let mut table = columns(
        &[
            "#",
            "ID",
            "KEY",
            "PRIORITY",
            "COST",
            "PARKED",
            "WAITS FOR",
            "STARTS",
        ],
        rows,
    );
    table.push_str(&format!("{} of {total} parked\n", tasks.len()));
    table
}

pub(crate) fn running_table(answer: &Value) -> String {
    let tasks = answer["running"].as_array().cloned().unwrap_or_default();
    if tasks.is_empty() {
        return "no running tasks\n".into();
    }
    let rows = tasks
        .iter()
        .map(|task| {
            vec![
                task["id"].to_string(),
                key_of(task),
                text(&task["priority"]),
                cost_of(task),
                ago(&task["since_ms"]),
                task["attempt"].to_string(),
                if task["permit"].as_bool() == Some(true) {
                    "permit"
                } else {
                    "task"
                }
                .into(),
            ]
        })
        .collect();
    columns(
        &["ID", "KEY", "PRIORITY", "COST", "STARTED", "RUN", "WHAT"],
        rows,
    )
}

/// The tenants, with their weight and weighted service under a fair share by use (the
/// order serves the lowest service first), when the pool has one; the tasks without a
/// mailbox (a tenant each) as one row, `anonymous (N tasks)`.
pub(crate) fn tenants_table(answer: &Value) -> String {
    let tenants = answer["tenants"].as_array().cloned().unwrap_or_default();
    let offset = answer["offset"].as_u64().unwrap_or(0);
    let total = answer["tenants_total"]
        .as_u64()
        .unwrap_or(tenants.len() as u64);
    if total == 0 {
        return "no tenants with live tasks\n".into();
    }
    if tenants.is_empty() {
        return format!("no tenants from --offset {offset}; {total} in all\n");
    }
    let by_use = tenants.iter().any(|tenant| tenant["weight"].is_number());
    let rows = tenants
        .iter()
        .map(|tenant| {
            let holds: Vec<String> = tenant["holds"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(kind, units)| format!("{units} {kind}"))
                .collect();
            let tasks =
                tenant["running"].as_u64().unwrap_or(0) + tenant["parked"].as_u64().unwrap_or(0);
            let name = match (tenant["anonymous_tenants"].is_u64(), tasks) {
                (true, 1) => "anonymous (1 task)".to_owned(),
                (true, tasks) => format!("anonymous ({tasks} tasks)"),
                (false, _) => text(&tenant["tenant"]),
            };
            let mut row = vec![
                name,
                tenant["running"].to_string(),
                tenant["parked"].to_string(),
                holds.join(", "),
            ];
            if by_use {
                row.push(tenant["weight"].to_string());
                row.push(
                    tenant["service"]
                        .as_f64()
                        .map_or_else(|| "-".to_owned(), |service| format!("{service:.0}")),
                );
            }
            row
        })
        .collect();
    let shown = tenants.len() as u64;
    let mut table = if by_use {
        columns(
            &["TENANT", "RUNNING", "PARKED", "HOLDS", "WEIGHT", "SERVICE"],
            rows,
        )
    } else {
        columns(&["TENANT", "RUNNING", "PARKED", "HOLDS"], rows)
    };
    if offset > 0 || shown < total {
        table.push_str(&format!(
            "{}–{} of {total} tenants\n",
            offset + 1,
            offset + shown
        ));
    }
    table
}

pub(crate) fn dead_letters_table(answer: &Value) -> String {
    if let Some(note) = answer["note"].as_str() {
        return format!("{}\n", escape_controls(note));
    }
    let letters = answer["dead_letters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if letters.is_empty() {
        return "no dead letters\n".into();
    }
    let rows = letters
        .iter()
        .map(|letter| {
            vec![
                text(&letter["entry"]),
                letter["task_id"].to_string(),
                key_of(letter),
                cost_of(letter),
                letter["attempts"].to_string(),
                text(&letter["reason"]),
            ]
        })
        .collect();
    columns(&["ENTRY", "ID", "KEY", "COST", "RUNS", "WHY"], rows)
}

pub(crate) fn schedules_table(answer: &Value) -> String {
    let schedules = answer["schedules"].as_array().cloned().unwrap_or_default();
    if schedules.is_empty() {
        return "no schedules\n".into();
    }
    let rows = schedules
        .iter()
        .map(|schedule| {
            let zone = schedule["zone"]
                .as_str()
                .map_or("-".into(), escape_controls);
            let paused = schedule["paused"].as_bool().unwrap_or(false);
            vec![
                text(&schedule["name"]),
                text(&schedule["expression"]),
                zone,
                if paused {
                    "paused".into()
                } else {
                    ago(&schedule["next_tick_ms"])
                },
                ago(&schedule["last_enqueued_ms"]),
                schedule["enqueued"].to_string(),
                text(&schedule["missed"]),
            ]
        })
        .collect();
    columns(
        &["NAME", "WHEN", "ZONE", "NEXT", "LAST", "ENQUEUED", "MISSED"],
        rows,
    )
}

pub(crate) fn state_line(answer: &Value) -> String {
    let pool = &answer["pool"];
    format!(
        "pool {} is {}\n",
        escape_controls(&text(&pool["name"])),
        state_of(pool)
    )
}
