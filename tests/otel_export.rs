//! The OTLP/HTTP export `examples/otel.rs` runs (its `examples/support/otlp_http.rs`), into a
//! receiver on 127.0.0.1 standing in for a collector: a traced task's spans arrive as a POST
//! to `/v1/traces` with an OTLP protobuf body that decodes to the task's trace, under the
//! service's name. A binary of its own: it installs the process's global tracer provider.
#![cfg(feature = "otel")]

#[path = "../examples/support/otlp_http.rs"]
mod otlp_http;
#[path = "support/webhook_receiver.rs"]
mod webhook_receiver;

use std::time::Duration;

use opentelemetry::context::FutureExt;
use opentelemetry::trace::{Span as _, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{global, Context};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prometheus_parking_lot::core::WorkerExecutor;
use prometheus_parking_lot::{
    MailboxKey, ResourceCost, TaskMetadata, WorkerPool, WorkerPoolConfig,
};
use prost::Message;
use webhook_receiver::{Receiver, Request};

const SERVICE: &str = "otel-export-test";

/// Answers its task's id.
#[derive(Clone)]
struct Echo;

#[async_trait::async_trait]
impl WorkerExecutor<(), u64> for Echo {
    async fn execute(&self, _: (), meta: TaskMetadata) -> u64 {
        meta.id
    }
}

/// The spans of an export's body, with the resource's `service.name` of each.
fn decode(request: &Request) -> Vec<(String, Span)> {
    let export = ExportTraceServiceRequest::decode(request.body.as_slice())
        .expect("the body is an OTLP ExportTraceServiceRequest in protobuf");
    let mut spans = Vec::new();
    for resource_spans in export.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|resource| &resource.attributes)
            .find(|attribute| attribute.key == "service.name")
            .and_then(|attribute| attribute.value.as_ref()?.value.clone())
            .map(|value| match value {
                any_value::Value::StringValue(name) => name,
                other => panic!("service.name is not a string: {other:?}"),
            })
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            spans.extend(
                scope_spans
                    .spans
                    .into_iter()
                    .map(|span| (service.clone(), span)),
            );
        }
    }
    spans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_task_is_posted_to_v1_traces_as_otlp_protobuf() {
    let receiver = Receiver::ok().await;
    let provider = otlp_http::tracer_provider(
        &format!("{}/", receiver.base_url()),
        SERVICE,
        tokio::runtime::Handle::current(),
    )
    .expect("the exporter builds");
    global::set_tracer_provider(provider.clone());

    let pool = WorkerPool::new(
        WorkerPoolConfig::new()
            .with_name("exported")
            .with_worker_count(1)
            .with_max_units(4),
        Echo,
    )
    .expect("the pool starts");
    let tracer = global::tracer_provider().tracer(SERVICE);
    let request = tracer.start("handle request");
    let trace = request.span_context().trace_id();
    let context = Context::current_with_span(request);
    let answer = async {
        let meta = TaskMetadata::new(5, ResourceCost::gpu_vram(1))
            .with_mailbox(MailboxKey::new("acme").with_session("export"));
        let key = pool.submit_async((), meta).await.expect("admitted");
        pool.retrieve_async(&key, Duration::from_secs(10)).await
    }
    .with_context(context.clone())
    .await;
    context.span().end();
    assert_eq!(answer, Ok(5));
    pool.shutdown_with_drain(Duration::from_secs(5))
        .await
        .unwrap();

    // The last batch goes out at shutdown, from a thread that is not one of the runtime's
    // (its requests run on the runtime).
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .expect("the provider flushes and shuts down");

    let requests = receiver
        .wait_until(
            Duration::from_secs(10),
            "a POST to /v1/traces",
            |requests| requests.iter().any(|request| request.path == "/v1/traces"),
        )
        .await;
    let exports: Vec<&Request> = requests
        .iter()
        .filter(|request| request.path == "/v1/traces")
        .collect();
    assert_eq!(
        requests.len(),
        exports.len(),
        "every request went to /v1/traces"
    );
    for export in &exports {
        assert_eq!(export.method, "POST");
        assert_eq!(
            export.header("content-type"),
            Some("application/x-protobuf")
        );
        assert!(!export.body.is_empty(), "an export carries spans");
    }
    let spans: Vec<(String, Span)> = exports.iter().flat_map(|export| decode(export)).collect();
    let of_trace: Vec<&(String, Span)> = spans
        .iter()
        .filter(|(_, span)| span.trace_id == trace.to_bytes())
        .collect();
    let mut names: Vec<&str> = of_trace
        .iter()
        .map(|(_, span)| span.name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["deliver", "handle request", "run", "submit"],
        "the request's span and the task's, one trace"
    );
    assert!(
        of_trace.iter().all(|(service, _)| service == SERVICE),
        "filed under the service's name: {of_trace:#?}"
    );
}
