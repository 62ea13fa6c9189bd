//! `parking-lot`: the command line over a running admin server (cargo feature `admin`).
//!
//! ```text
//! parking-lot status                       every pool: state, tasks, capacity in use
//! parking-lot parked --pool llm            parked tasks in rank order, why each waits, its place
//!                                          in line and when it is expected to start
//! parking-lot running --pool llm           running tasks
//! parking-lot tenants --pool llm           tenants and their work (tasks without a mailbox
//!                                          as one row), 50 a page
//! parking-lot pause --pool llm             (resume, drain, undrain)
//! parking-lot cancel --pool llm --tenant acme 42
//! parking-lot dead-letters --pool llm      a shared queue's dead letters, and why
//! parking-lot retry --pool llm ENTRY       (purge --pool llm ENTRY, purge --pool llm --all)
//! parking-lot schedules --pool llm         periodic tasks: expression, zone, next tick, paused
//! parking-lot schedule pause --pool llm reindex   (schedule resume --pool llm reindex)
//! parking-lot fleet nodes --pool llm       the fleet of a shared queue (see `parking_lot/fleet.rs`)
//! ```
//!
//! It talks to `http://127.0.0.1:7480` unless `--url` (or `PARKING_LOT_URL`) says otherwise
//! (`127.0.0.1:7480`, without a scheme, is taken as `http://127.0.0.1:7480`);
//! commands that change a pool send the token of `--token` or `PARKING_LOT_TOKEN` (and so do
//! reads, when one is given: a server off loopback, or with `read_token`, wants it). `--json`
//! prints the server's answer as it came, for scripts.
//!
//! What callers wrote (tenants, keys, reasons, error texts) reaches the operator's terminal
//! only escaped: a tenant named `a\x1b[2Jb` is shown as `a\u{1b}[2Jb`, not as an escape
//! sequence that clears the screen (see [`escape_controls`]). `--json` output escapes them as
//! JSON does.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod fleet;

use clap::{Parser, Subcommand};
use prometheus_parking_lot::config::escape_controls;
use prometheus_parking_lot::core::scheduling::StartEstimate;
use serde_json::Value;

/// The command line over a parking lot's admin server.
#[derive(Parser)]
#[command(name = "parking-lot", version, about)]
struct Cli {
    /// The admin server, `http://` assumed [env: PARKING_LOT_URL; default: http://127.0.0.1:7480]
    #[arg(long, global = true)]
    url: Option<String>,
    /// The bearer token for commands that change a pool [env: PARKING_LOT_TOKEN]
    #[arg(long, global = true)]
    token: Option<String>,
    /// Print the server's JSON answer instead of a table
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every pool: its state, its tasks and the capacity in use
    Status,
    /// Parked tasks of a pool in rank order, why each waits, and when each should start
    Parked {
        /// The pool
        #[arg(long)]
        pool: String,
        #[command(flatten)]
        page: Page,
    },
    /// Running tasks of a pool
    Running {
        /// The pool
        #[arg(long)]
        pool: String,
    },
    /// Tenants of a pool and their work (tasks without a mailbox as one row, "anonymous")
    Tenants {
        /// The pool
        #[arg(long)]
        pool: String,
        #[command(flatten)]
        page: Page,
    },
    /// Stop starting tasks (admitted work parks; running work runs on)
    Pause {
        /// The pool
        #[arg(long)]
        pool: String,
    },
    /// End a pause
    Resume {
        /// The pool
        #[arg(long)]
        pool: String,
    },
    /// Refuse new work and finish what the pool has
    Drain {
        /// The pool
        #[arg(long)]
        pool: String,
    },
    /// End a drain: take new work again
    Undrain {
        /// The pool
        #[arg(long)]
        pool: String,
    },
    /// Dead letters of a pool's shared queue, oldest first, with why each was given up
    DeadLetters {
        /// The pool
        #[arg(long)]
        pool: String,
        #[command(flatten)]
        page: Page,
    },
    /// Park a dead letter again for any node, its attempts afresh
    Retry {
        /// The pool
        #[arg(long)]
        pool: String,
        /// The dead letter's entry, as `dead-letters` lists it
        entry: String,
    },
    /// Delete a dead letter, or with --all every one of the pool's queue
    Purge {
        /// The pool
        #[arg(long)]
        pool: String,
        /// The dead letter's entry, as `dead-letters` lists it
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        entry: Option<String>,
        /// Every dead letter of the queue
        #[arg(long)]
        all: bool,
    },
    /// Periodic tasks of a pool: expression, zone, next tick, and whether each is paused
    Schedules {
        /// The pool
        #[arg(long)]
        pool: String,
    },
    /// Pause or resume one periodic task on this node
    Schedule {
        #[command(subcommand)]
        action: ScheduleAction,
    },
    /// Cancel a task: parked, it ends at once; running, it is asked to stop
    Cancel(TaskAddress),
    /// The fleet of a pool's shared Postgres queue: its nodes, parked tasks, budgets, and
    /// control of any node
    Fleet {
        #[command(subcommand)]
        command: fleet::FleetCommand,
    },
}

/// What `schedule` does to one periodic task.
#[derive(Subcommand)]
enum ScheduleAction {
    /// Enqueue nothing more until resumed
    Pause {
        /// The pool
        #[arg(long)]
        pool: String,
        /// The schedule's name
        name: String,
    },
    /// Enqueue again from the next tick
    Resume {
        /// The pool
        #[arg(long)]
        pool: String,
        /// The schedule's name
        name: String,
    },
}

/// Which part of a long list to show.
#[derive(clap::Args)]
struct Page {
    /// The first to show (0: the first of all)
    #[arg(long, default_value_t = 0)]
    offset: usize,
    /// How many to show (1 to 1000)
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

impl Page {
    /// The page as a query string.
    fn query(&self) -> String {
        format!("offset={}&limit={}", self.offset, self.limit)
    }
}

/// One task of a pool, as a command names it: the pool, the task's key and its id.
#[derive(clap::Args)]
struct TaskAddress {
    /// The pool
    #[arg(long)]
    pool: String,
    /// The tenant it was submitted under
    #[arg(long)]
    tenant: String,
    /// The user part of its key, if it has one
    #[arg(long)]
    user: Option<String>,
    /// The session part of its key, if it has one
    #[arg(long)]
    session: Option<String>,
    /// The task's id
    id: u64,
}

impl TaskAddress {
    /// The task as a request's body names it.
    fn body(&self) -> Value {
        serde_json::json!({
            "tenant": self.tenant, "user_id": self.user, "session_id": self.session, "id": self.id,
        })
    }

    /// The task as a query string names it.
    fn query(&self) -> String {
        let mut query = format!("tenant={}&id={}", path(&self.tenant), self.id);
        if let Some(user) = &self.user {
            query.push_str(&format!("&user_id={}", path(user)));
        }
        if let Some(session) = &self.session {
            query.push_str(&format!("&session_id={}", path(session)));
        }
        query
    }

    /// The line that says the task was cancelled.
    fn cancelled(&self) -> String {
        format!(
            "cancelled task {} of {}\n",
            self.id,
            escape_controls(&self.tenant)
        )
    }
}

/// What went wrong, for the user: the line printed before the exit.
struct Failure(String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("parking-lot: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(Failure(text)) => {
            eprintln!("parking-lot: {}", escape_controls(&text));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<String, Failure> {
    let url = match (&cli.url, std::env::var("PARKING_LOT_URL")) {
        (Some(url), _) => server_url(url, "--url")?,
        (None, Ok(url)) => server_url(&url, "PARKING_LOT_URL")?,
        (None, Err(_)) => "http://127.0.0.1:7480".to_owned(),
    };
    let server = Server {
        url,
        token: cli
            .token
            .clone()
            .or_else(|| std::env::var("PARKING_LOT_TOKEN").ok()),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|error| Failure(format!("cannot make an HTTP client: {error}")))?,
    };
    let (answer, table): (Value, fn(&Value) -> String) = match &cli.command {
        Command::Status => (server.get("/api/pools").await?, status_table),
        Command::Parked { pool, page } => (
            server
                .get(&format!(
                    "/api/pools/{}/parked?{}",
                    path(pool),
                    page.query()
                ))
                .await?,
            parked_table,
        ),
        Command::Running { pool } => (
            server
                .get(&format!("/api/pools/{}/running", path(pool)))
                .await?,
            running_table,
        ),
        Command::Tenants { pool, page } => (
            server
                .get(&format!(
                    "/api/pools/{}/tenants?{}",
                    path(pool),
                    page.query()
                ))
                .await?,
            tenants_table,
        ),
        Command::Pause { pool } => (server.act(pool, "pause", None).await?, state_line),
        Command::Resume { pool } => (server.act(pool, "resume", None).await?, state_line),
        Command::Drain { pool } => (server.act(pool, "drain", None).await?, state_line),
        Command::Undrain { pool } => (server.act(pool, "undrain", None).await?, state_line),
        Command::DeadLetters { pool, page } => (
            server
                .get(&format!(
                    "/api/pools/{}/dead-letters?{}",
                    path(pool),
                    page.query()
                ))
                .await?,
            dead_letters_table,
        ),
        Command::Schedules { pool } => (
            server
                .get(&format!("/api/pools/{}/schedules", path(pool)))
                .await?,
            schedules_table,
        ),
        Command::Schedule { action } => {
            let (pool, name, verb) = match action {
                ScheduleAction::Pause { pool, name } => (pool, name, "pause"),
                ScheduleAction::Resume { pool, name } => (pool, name, "resume"),
            };
            let answer = server
                .act(pool, &format!("schedules/{}/{verb}", path(name)), None)
                .await?;
            return Ok(if cli.json {
                format!("{}\n", json_text(&answer, false))
            } else {
                format!("schedule {} {verb}d\n", escape_controls(name))
            });
        }
        Command::Retry { pool, entry } => {
            let answer = server
                .act(pool, &format!("dead-letters/{}/retry", path(entry)), None)
                .await?;
            return Ok(if cli.json {
                format!("{}\n", json_text(&answer, false))
            } else {
                format!("dead letter {} parked again\n", escape_controls(entry))
            });
        }
        Command::Purge { pool, entry, .. } => {
            let body = serde_json::json!({ "entry": entry });
            let answer = server.act(pool, "dead-letters/purge", Some(body)).await?;
            return Ok(if cli.json {
                format!("{}\n", json_text(&answer, false))
            } else {
                format!(
                    "{} dead letters deleted\n",
                    json_text(&answer["purged"], false)
                )
            });
        }
        Command::Fleet { command } => return fleet::run(&server, cli.json, command).await,
        Command::Cancel(task) => {
            server.act(&task.pool, "cancel", Some(task.body())).await?;
            return Ok(if cli.json {
                format!("{}\n", serde_json::json!({ "cancelled": task.id }))
            } else {
                task.cancelled()
            });
        }
    };
    Ok(if cli.json {
        format!("{}\n", json_text(&answer, true))
    } else {
        table(&answer)
    })
}

/// The admin server's address as `given` (by `source`, `--url` or `PARKING_LOT_URL`) names
/// it, without a trailing `/`: `http://` is assumed where no scheme is written
/// (`127.0.0.1:7480`); any scheme but `http` and `https`, and what is no address, are
/// refused saying so.
fn server_url(given: &str, source: &str) -> Result<String, Failure> {
    let trimmed = given.trim().trim_end_matches('/');
    let url = if trimmed.contains("://") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let parsed = reqwest::Url::parse(&url).map_err(|error| {
        Failure(format!(
            "{source} {given:?} is not an address ({error}); write it as \
             http://127.0.0.1:7480 or 127.0.0.1:7480"
        ))
    })?;
    if !["http", "https"].contains(&parsed.scheme()) {
        return Err(Failure(format!(
            "{source} {given:?} has the scheme {}; the admin server speaks http:// or https://",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(Failure(format!(
            "{source} {given:?} names no host; write it as http://127.0.0.1:7480"
        )));
    }
    Ok(url)
}

/// `value` as JSON text, pretty or not. serde_json escapes the control characters below
/// U+0020 in strings (a raw line break is the layout's); DEL and U+0080 to U+009F, which
/// some terminals obey, can only stand in strings, so they are written as `\u` escapes too
/// and the text stays the same JSON.
fn json_text(value: &Value, pretty: bool) -> String {
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

/// A pool name as a path segment: the characters a name may hold pass, others are escaped.
fn path(name: &str) -> String {
    name.bytes()
        .map(|byte| match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The admin server, and how to reach it.
struct Server {
    url: String,
    token: Option<String>,
    client: reqwest::Client,
}

impl Server {
    /// Reads `path`, with the token when one is given (reads need it off loopback).
    async fn get(&self, path: &str) -> Result<Value, Failure> {
        let mut request = self.client.get(format!("{}{path}", self.url));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        self.answer(request).await
    }

    /// Asks pool `pool` to do `action`, with the token.
    async fn act(&self, pool: &str, action: &str, body: Option<Value>) -> Result<Value, Failure> {
        let Some(token) = &self.token else {
            return Err(Failure(format!(
                "{action} changes the pool: give the admin server's token with --token or \
                 PARKING_LOT_TOKEN"
            )));
        };
        let mut request = self
            .client
            .post(format!("{}/api/pools/{}/{action}", self.url, path(pool)))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        self.answer(request).await
    }

    /// The JSON of a successful answer, or the server's error text.
    async fn answer(&self, request: reqwest::RequestBuilder) -> Result<Value, Failure> {
        let response = request.send().await.map_err(|error| {
            Failure(format!(
                "no admin server answers at {} ({}); start one (see \
                 docs/guide/operating.md, \"The dashboard\") or give its address with --url",
                self.url,
                error.without_url()
            ))
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|error| {
            Failure(format!(
                "the answer could not be read: {}",
                error.without_url()
            ))
        })?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(value);
        }
        let reason = value["error"]
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
        // Printed escaped, like everything a server sends (see `main`).
        Err(Failure(format!("{} ({status})", reason)))
    }
}

/// Rows as aligned columns under a header, every cell escaped (cells hold what callers
/// wrote: tenants, keys, reasons).
fn columns(header: &[&str], rows: Vec<Vec<String>>) -> String {
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

fn status_table(answer: &Value) -> String {
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
fn text(value: &Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

/// A task's key as `tenant/user/session`.
fn key_of(task: &Value) -> String {
    let key = &task["key"];
    let mut parts = vec![text(&key["tenant"])];
    for part in ["user_id", "session_id"] {
        if let Some(value) = key[part].as_str() {
            parts.push(value.to_owned());
        }
    }
    parts.join("/")
}

fn cost_of(task: &Value) -> String {
    format!(
        "{} {}",
        task["cost"]["units"],
        kind_name(&task["cost"]["kind"])
    )
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
    };
    estimate.in_words(at_ms)
}

fn parked_table(answer: &Value) -> String {
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

fn running_table(answer: &Value) -> String {
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
fn tenants_table(answer: &Value) -> String {
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

fn dead_letters_table(answer: &Value) -> String {
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

fn schedules_table(answer: &Value) -> String {
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

fn state_line(answer: &Value) -> String {
    let pool = &answer["pool"];
    format!(
        "pool {} is {}\n",
        escape_controls(&text(&pool["name"])),
        state_of(pool)
    )
}
