//! A picture of some tasks' lives through a pool, as an SVG: one row per task, a bar while it
//! was parked (coloured by why it waited), a bar while it ran (coloured by how it ended).
//!
//! It listens to the pool's event feed (`PoolControl::events`), keeps the steps of the tasks
//! whose ids it was given, and asks the pool why each of them waits (`why_waiting`) the moment
//! it parks: the reason the dashboard would show at that instant. `examples/quickstart.rs`
//! draws one with `--timeline FILE`; `docs/guide/tasks.md` shows it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use prometheus_parking_lot::core::{FeedEvent, PoolControl, TaskStatus, TaskStep};

/// The widest span drawn, ms: a runaway task's run is cut there, with an arrow.
const MAX_SPAN_MS: u64 = 1_500;
const WIDTH: u64 = 960;
const LABEL_WIDTH: u64 = 150;
const ROW_HEIGHT: u64 = 14;
const TOP: u64 = 58;

/// Where one task was, and when.
#[derive(Default)]
struct Life {
    priority: String,
    units: u32,
    admitted_ms: Option<u128>,
    /// Each time it parked: from when, and why (`None` until the pool answered, or if it
    /// started before it could).
    parked: Vec<(u128, Option<String>)>,
    started_ms: Option<u128>,
    ended: Option<(u128, TaskStatus)>,
}

/// The steps of the tasks it watches, gathered while the pool runs.
pub struct Timeline {
    lives: Arc<Mutex<BTreeMap<u64, Life>>>,
    listener: tokio::task::JoinHandle<()>,
}

impl Timeline {
    /// Starts listening to `pool` for the tasks whose ids are in `ids`.
    pub fn listen(pool: PoolControl, ids: Range<u64>) -> Self {
        let lives = Arc::new(Mutex::new(BTreeMap::new()));
        let mut events = pool.events();
        let gathered = lives.clone();
        let listener = tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(event) if ids.contains(&event.task_id) => note(&pool, &gathered, event),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Self { lives, listener }
    }

    /// Stops listening and writes the picture to `path`.
    pub fn write_svg(self, path: &str) -> std::io::Result<()> {
        self.listener.abort();
        let lives = self.lives.lock().expect("the timeline's lock");
        std::fs::write(path, svg(&lives))
    }
}

/// Records one event of a watched task; a park also asks the pool why.
fn note(pool: &PoolControl, lives: &Arc<Mutex<BTreeMap<u64, Life>>>, event: FeedEvent) {
    let mut all = lives.lock().expect("the timeline's lock");
    let life = all.entry(event.task_id).or_default();
    life.units = event.cost.units;
    if let Some(priority) = event.priority {
        life.priority = format!("{priority:?}");
    }
    match event.step {
        TaskStep::Admitted => life.admitted_ms = Some(event.at_ms),
        TaskStep::Parked => {
            life.parked.push((event.at_ms, None));
            let (pool, lives, parked_at) = (pool.clone(), lives.clone(), event.at_ms);
            tokio::spawn(async move {
                let Ok(Some(reason)) = pool.why_waiting(&event.key, event.task_id).await else {
                    return;
                };
                let reason = serde_json::to_value(&reason).ok().and_then(|value| {
                    value
                        .get("reason")
                        .and_then(|name| name.as_str().map(str::to_owned))
                });
                let mut all = lives.lock().expect("the timeline's lock");
                let Some(life) = all.get_mut(&event.task_id) else {
                    return;
                };
                if let Some(park) = life.parked.iter_mut().find(|(at, _)| *at == parked_at) {
                    park.1 = reason;
                }
            });
        }
        TaskStep::Started => life.started_ms = Some(event.at_ms),
        TaskStep::Ended(status) => life.ended = Some((event.at_ms, status)),
        _ => {}
    }
}

/// The colour of a parked bar, by why the task waited.
fn wait_colour(reason: Option<&str>) -> &'static str {
    match reason {
        Some("units") => "#f0b429",
        Some("worker") => "#8da2c0",
        Some("reserved" | "behind") => "#b794f4",
        Some("budget" | "tenant_share") => "#4fd1c5",
        _ => "#cbd2d9",
    }
}

/// The colour of a run, by how it ended.
fn end_colour(status: Option<&TaskStatus>) -> &'static str {
    match status {
        Some(TaskStatus::Completed) => "#2f9e44",
        Some(TaskStatus::Failed(_)) => "#e03131",
        Some(TaskStatus::TimedOut) => "#f76707",
        _ => "#495057",
    }
}

fn svg(lives: &BTreeMap<u64, Life>) -> String {
    let origin = lives
        .values()
        .filter_map(|life| life.admitted_ms)
        .min()
        .unwrap_or(0);
    let last_end = lives
        .values()
        .filter_map(|life| life.ended.as_ref().map(|end| end.0));
    let since_origin =
        |at_ms: u128| u64::try_from(at_ms.saturating_sub(origin)).unwrap_or(u64::MAX);
    let span_ms = since_origin(last_end.max().unwrap_or(origin + 1)).clamp(1, MAX_SPAN_MS);
    let plot = WIDTH - LABEL_WIDTH - 20;
    let x = |at_ms: u128| LABEL_WIDTH + plot * since_origin(at_ms).min(span_ms) / span_ms;
    let height = TOP + ROW_HEIGHT * lives.len() as u64 + 40;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="10">"#
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>"##
    );
    legend(&mut out);
    for (row, (id, life)) in lives.iter().enumerate() {
        let y = TOP + ROW_HEIGHT * row as u64;
        let label = format!("#{id} {} {} VRAM", life.priority, life.units);
        let _ = writeln!(out, r#"<text x="4" y="{}">{label}</text>"#, y + 10);
        let run_start = life.started_ms;
        let end = life.ended.as_ref().map(|(at, _)| *at);
        for (index, (parked_at, reason)) in life.parked.iter().enumerate() {
            let until = life
                .parked
                .get(index + 1)
                .map(|next| next.0)
                .or(run_start)
                .or(end);
            let until = until.unwrap_or(origin + u128::from(span_ms));
            bar(
                &mut out,
                x(*parked_at),
                x(until),
                y,
                wait_colour(reason.as_deref()),
            );
        }
        if let Some(started) = run_start {
            let status = life.ended.as_ref().map(|(_, status)| status);
            let until = end.unwrap_or(origin + u128::from(span_ms));
            bar(&mut out, x(started), x(until), y, end_colour(status));
            if since_origin(until) > span_ms {
                let _ = writeln!(out, r#"<text x="{}" y="{}">→</text>"#, x(until) + 2, y + 10);
            }
        }
        if let Some((at, TaskStatus::Expired)) = &life.ended {
            let (at_x, text_y) = (x(*at) + 2, y + 10);
            let _ = writeln!(
                out,
                r##"<text x="{at_x}" y="{text_y}" fill="#495057">✕ expired</text>"##
            );
        }
    }
    axis(
        &mut out,
        TOP + ROW_HEIGHT * lives.len() as u64 + 14,
        span_ms,
        plot,
    );
    out.push_str("</svg>\n");
    out
}

fn bar(out: &mut String, from: u64, to: u64, y: u64, colour: &str) {
    let width = to.saturating_sub(from).max(1);
    let _ = writeln!(
        out,
        r#"<rect x="{from}" y="{}" width="{width}" height="{}" fill="{colour}"/>"#,
        y + 2,
        ROW_HEIGHT - 4
    );
}

fn legend(out: &mut String) {
    let entries = [
        ("parked: too few free units", wait_colour(Some("units"))),
        ("parked: no idle worker", wait_colour(Some("worker"))),
        (
            "parked: behind a reserved task",
            wait_colour(Some("reserved")),
        ),
        ("parked: other", wait_colour(None)),
        ("ran, completed", end_colour(Some(&TaskStatus::Completed))),
        (
            "ran, failed (panic)",
            end_colour(Some(&TaskStatus::Failed(String::new()))),
        ),
        ("ran, timed out", end_colour(Some(&TaskStatus::TimedOut))),
    ];
    let _ = writeln!(
        out,
        r#"<text x="4" y="14" font-size="12" font-weight="bold">Tasks through the pool: each row a task, time from the first one's admission</text>"#
    );
    for (index, (what, colour)) in entries.iter().enumerate() {
        let (column, line) = (index as u64 % 4, index as u64 / 4);
        let (x, y) = (4 + column * 235, 26 + line * 14);
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{y}" width="10" height="10" fill="{colour}"/>"#
        );
        let _ = writeln!(out, r#"<text x="{}" y="{}">{what}</text>"#, x + 14, y + 9);
    }
}

fn axis(out: &mut String, y: u64, span_ms: u64, plot: u64) {
    let step = [10, 20, 50, 100, 200, 250, 500]
        .into_iter()
        .find(|step| span_ms / step <= 8)
        .unwrap_or(1_000);
    let _ = writeln!(
        out,
        r##"<line x1="{LABEL_WIDTH}" y1="{y}" x2="{}" y2="{y}" stroke="#868e96"/>"##,
        LABEL_WIDTH + plot
    );
    for tick in (0..=span_ms).step_by(step as usize) {
        let x = LABEL_WIDTH + plot * tick / span_ms;
        let _ = writeln!(
            out,
            r#"<text x="{x}" y="{}" text-anchor="middle">{tick} ms</text>"#,
            y + 14
        );
    }
}
