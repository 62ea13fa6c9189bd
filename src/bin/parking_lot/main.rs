//! `parking-lot`: the command line over a running admin server (cargo feature `admin`).
//!
//! ```text
//! parking-lot status                       every pool: state, tasks, capacity in use (--pool: one)
//! parking-lot parked --pool llm            parked tasks in rank order, why each waits, its place
//!                                          in line and when it is expected to start
//! parking-lot running --pool llm           running tasks
//! parking-lot tenants --pool llm           tenants and their work (tasks without a mailbox
//!                                          as one row), 50 a page
//! parking-lot pause --pool llm             (resume, drain, undrain)
//! parking-lot cancel --pool llm --key acme//s9 42   (the key as `parked` prints it)
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

mod fleet;
mod output;
mod server;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use prometheus_parking_lot::config::escape_controls;
use serde_json::Value;

use output::{
    dead_letters_table, json_text, parked_table, running_table, schedules_table, state_line,
    status_table, tenants_table,
};
use server::{path, server_url, Server};

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
    /// Every pool (or the one of --pool): its state, its tasks and the capacity in use
    Status {
        /// Only this pool
        #[arg(long)]
        pool: Option<String>,
    },
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

/// One task of a pool, as a command names it: the pool, the task's key and its id. The key
/// is `--key` as the listings print it (`tenant`, `tenant/user`, `tenant//session` or
/// `tenant/user/session`), or its parts one by one (for a part that holds a `/`).
#[derive(clap::Args)]
struct TaskAddress {
    /// The pool
    #[arg(long)]
    pool: String,
    /// The task's key as `parked` and `running` print it: tenant/user/session, an empty
    /// part for one it lacks (globex//s9: tenant globex, session s9)
    #[arg(long, conflicts_with_all = ["tenant", "user", "session"], required_unless_present = "tenant")]
    key: Option<String>,
    /// The tenant it was submitted under
    #[arg(long)]
    tenant: Option<String>,
    /// The user part of its key, if it has one
    #[arg(long)]
    user: Option<String>,
    /// The session part of its key, if it has one
    #[arg(long)]
    session: Option<String>,
    /// The task's id
    id: u64,
}

/// A task's key in parts: tenant, user, session.
struct KeyParts {
    tenant: String,
    user: Option<String>,
    session: Option<String>,
}

impl TaskAddress {
    /// The key's parts, from `--key` or from the parts given one by one.
    fn key(&self) -> Result<KeyParts, Failure> {
        let Some(key) = &self.key else {
            return Ok(KeyParts {
                tenant: self.tenant.clone().unwrap_or_default(),
                user: self.user.clone(),
                session: self.session.clone(),
            });
        };
        let part = |text: &str| Some(text.to_owned()).filter(|text| !text.is_empty());
        let parts: Vec<&str> = key.split('/').collect();
        match parts[..] {
            [tenant] | [tenant, ""] | [tenant, "", ""] if !tenant.is_empty() => Ok(KeyParts {
                tenant: tenant.to_owned(),
                user: None,
                session: None,
            }),
            [tenant, user] if !tenant.is_empty() => Ok(KeyParts {
                tenant: tenant.to_owned(),
                user: part(user),
                session: None,
            }),
            [tenant, user, session] if !tenant.is_empty() => Ok(KeyParts {
                tenant: tenant.to_owned(),
                user: part(user),
                session: part(session),
            }),
            _ => Err(Failure(format!(
                "--key {key:?} is not a key; write tenant, tenant/user, tenant//session or \
                 tenant/user/session, as `parked` prints it (--tenant, --user and --session \
                 name parts that hold a '/')"
            ))),
        }
    }

    /// The task as a request's body names it.
    fn body(&self) -> Result<Value, Failure> {
        let key = self.key()?;
        Ok(serde_json::json!({
            "tenant": key.tenant, "user_id": key.user, "session_id": key.session, "id": self.id,
        }))
    }

    /// The task as a query string names it.
    fn query(&self) -> Result<String, Failure> {
        let key = self.key()?;
        let mut query = format!("tenant={}&id={}", path(&key.tenant), self.id);
        if let Some(user) = &key.user {
            query.push_str(&format!("&user_id={}", path(user)));
        }
        if let Some(session) = &key.session {
            query.push_str(&format!("&session_id={}", path(session)));
        }
        Ok(query)
    }

    /// The line that says the task was cancelled.
    fn cancelled(&self) -> Result<String, Failure> {
        Ok(format!(
            "cancelled task {} of {}\n",
            self.id,
            escape_controls(&self.key()?.tenant)
        ))
    }

    /// A 404 for this task, with what names a task: its whole key.
    fn not_found(&self, failure: Failure) -> Failure {
        if !failure.0.contains("(404") {
            return failure;
        }
        Failure(format!(
            "{}; a task is named by its whole key (tenant, user and session), as `parked` \
             and `running` print it: --key tenant/user/session",
            failure.0
        ))
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
        Command::Status { pool: None } => (server.get("/api/pools").await?, status_table),
        Command::Status { pool: Some(pool) } => {
            let one = server.get(&format!("/api/pools/{}", path(pool))).await?;
            (serde_json::json!({ "pools": [one["pool"]] }), status_table)
        }
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
            server
                .act(&task.pool, "cancel", Some(task.body()?))
                .await
                .map_err(|failure| task.not_found(failure))?;
            return Ok(if cli.json {
                format!("{}\n", serde_json::json!({ "cancelled": task.id }))
            } else {
                task.cancelled()?
            });
        }
    };
    Ok(if cli.json {
        format!("{}\n", json_text(&answer, true))
    } else {
        table(&answer)
    })
}
