//! One trace across two node processes of one Postgres queue: a task submitted in a trace on
//! one node (this process, a producer that runs nothing) is claimed and run by another node
//! (a child process), and the spans both processes export are one tree: the same trace id,
//! and the claimer's claim, run and delivery spans children of the submitter's span.
//!
//! Each process exports its finished spans to an in-process exporter; the child writes the
//! spans of the trace to its stdout, one line each, for this process to read. The binary is
//! its own child (`support/processes.rs`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use opentelemetry::global;
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use prometheus_parking_lot::core::{SubmitOptions, TraceParent};
use prometheus_parking_lot::util::serde::MailboxKey;
use prometheus_parking_lot::SchedulerConfig;

#[path = "support/postgres_pools.rs"]
mod postgres_pools;
#[path = "support/processes.rs"]
mod processes;

use postgres_pools::{build_embedded, fresh_name, server_url, work};

/// The child's settings: queue, mailbox table and the trace id to report, as one line.
const SPEC_ENV: &str = "PL_OTEL_CLUSTER_SPEC";
/// The child's role.
const CLAIMER: &str = "claimer";
/// How long the child waits for the task's spans before it gives up.
const CHILD_PATIENCE: Duration = Duration::from_secs(60);

fn main() {
    processes::main(
        &[(
            "a_task_claimed_by_another_node_process_continues_its_trace",
            a_task_claimed_by_another_node_process_continues_its_trace,
        )],
        &[(CLAIMER, claimer)],
    );
}

/// This process's exporter, installed once as the global tracer provider.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        global::set_tracer_provider(provider);
        exporter
    })
}

/// The finished spans of `trace` in this process.
fn spans_of(trace: TraceId) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .expect("the exporter's spans")
        .into_iter()
        .filter(|span| span.span_context.trace_id() == trace)
        .collect()
}

/// One pool, `work`, on Postgres queue `queue` with results in table `mailbox`.
fn config(queue: &str, mailbox: &str, workers: usize) -> SchedulerConfig {
    let text = serde_json::json!({
        "database_url": server_url(),
        "pools": {
            "work": {
                "worker_threads": workers,
                "max_units": 4,
                "queue": { "type": "postgres", "queue_name": queue, "lease_ms": 5_000 },
                "mailbox": { "storage": { "type": "postgres", "table": mailbox } }
            }
        }
    });
    SchedulerConfig::from_json_str(&text.to_string()).expect("the node's config is valid")
}

/// A span as the child reports it: name, trace id, span id, parent span id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reported {
    name: String,
    trace: String,
    span: String,
    parent: String,
}

impl Reported {
    fn line(span: &SpanData) -> String {
        format!(
            "span {} {} {} {}",
            span.name,
            span.span_context.trace_id(),
            span.span_context.span_id(),
            span.parent_span_id
        )
    }

    fn parse(line: &str) -> Option<Self> {
        let mut words = line.strip_prefix("span ")?.split(' ');
        Some(Self {
            name: words.next()?.to_owned(),
            trace: words.next()?.to_owned(),
            span: words.next()?.to_owned(),
            parent: words.next()?.to_owned(),
        })
    }
}

/// The child: a node with a worker on the queue. It says `ready`, claims and runs what it
/// finds, and once the trace it was told of has its claim, run and deliver spans here, writes
/// them to stdout and stops.
fn claimer() {
    let spec = std::env::var(SPEC_ENV).expect("started by the test");
    let [queue, mailbox, trace] = spec.split(' ').collect::<Vec<_>>()[..] else {
        panic!("a spec of three words expected, got {spec:?}");
    };
    let trace = TraceId::from_hex(trace).expect("a trace id");
    exporter();
    processes::on_runtime(async {
        let built = build_embedded(config(queue, mailbox, 1)).await;
        println!("ready");
        std::io::stdout().flush().expect("stdout");
        let started = Instant::now();
        let wanted = ["claim", "run", "deliver"];
        loop {
            let spans = spans_of(trace);
            let done = wanted
                .iter()
                .all(|name| spans.iter().any(|span| span.name == *name));
            if done {
                for span in &spans {
                    println!("{}", Reported::line(span));
                }
                break;
            }
            assert!(
                started.elapsed() < CHILD_PATIENCE,
                "the claimer saw no claim, run and deliver of the trace: {:?}",
                spans.iter().map(|span| &span.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::task::spawn_blocking(move || drop(built))
            .await
            .expect("the node stops");
    });
}

/// The child's stdout lines up to `ready`.
fn wait_ready(lines: &mut impl Iterator<Item = std::io::Result<String>>) {
    for line in lines.by_ref() {
        if line.expect("the child's stdout") == "ready" {
            return;
        }
    }
    panic!("the claimer stopped before it was ready");
}

/// Kills the child if the test ends early, so no node outlives it.
struct Claimer {
    child: Child,
}

impl Claimer {
    fn start(spec: String) -> (Self, ChildStdout) {
        let mut child = processes::child(CLAIMER)
            .env(SPEC_ENV, spec)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the claimer starts");
        let stdout = child.stdout.take().expect("its stdout");
        (Self { child }, stdout)
    }
}

impl Drop for Claimer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A task submitted in a trace on a node that runs nothing is claimed and run by the child
/// node; the spans of both processes form one tree under the submitter's span.
fn a_task_claimed_by_another_node_process_continues_its_trace() {
    exporter();
    let (queue, mailbox) = (fresh_name("otel_q"), fresh_name("otel_mb"));
    let given: TraceParent = "00-5a1c0ffee0ddf00d5a1c0ffee0ddf00d-00f067aa0ba902b7-01"
        .parse()
        .expect("a traceparent");
    let trace = TraceId::from_bytes(given.trace_id());

    let (mut claimer, stdout) = Claimer::start(format!("{queue} {mailbox} {trace}"));
    let mut lines = BufReader::new(stdout).lines();
    wait_ready(&mut lines);

    processes::on_runtime(async {
        let built = build_embedded(config(&queue, &mailbox, 0)).await;
        let pool = &built.pools["work"];
        let key = MailboxKey::new("otel").with_session(queue.clone());
        let options = SubmitOptions::default().with_traceparent(given);
        pool.submit_with(work(1, 21, 10, &key), options)
            .await
            .expect("the producer parks it");
        let result = pool.retrieve_task(&key, 1, Duration::from_secs(60)).await;
        assert_eq!(result, Ok(42), "the claimer ran it");
        tokio::task::spawn_blocking(move || drop(built))
            .await
            .expect("the producer stops");
    });

    let reported: Vec<Reported> = lines
        .map_while(Result::ok)
        .filter_map(|line| Reported::parse(&line))
        .collect();
    let status = claimer.child.wait().expect("the claimer ends");
    assert!(status.success(), "the claimer failed: {status}");

    let here = spans_of(trace);
    let submits: Vec<&SpanData> = here.iter().filter(|span| span.name == "submit").collect();
    assert_eq!(submits.len(), 1, "one submit span here: {here:#?}");
    let submit = submits[0];
    assert_eq!(
        submit.parent_span_id,
        SpanId::from_bytes(given.span_id()),
        "the submit span is the given context's child"
    );
    assert!(
        here.iter()
            .all(|span| span.name != "run" && span.name != "claim"),
        "the producer ran nothing: {here:#?}"
    );

    let names: Vec<&str> = reported.iter().map(|span| span.name.as_str()).collect();
    for wanted in ["claim", "run", "deliver"] {
        assert!(names.contains(&wanted), "{wanted} missing: {names:?}");
    }
    let submit_id = submit.span_context.span_id().to_string();
    for span in &reported {
        assert_eq!(span.trace, trace.to_string(), "one trace: {span:?}");
        assert_eq!(
            span.parent, submit_id,
            "the claimer's span is a child of the submitter's: {span:?}"
        );
    }
}
