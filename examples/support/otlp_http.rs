//! An OTLP/HTTP trace exporter that sends through the reqwest 0.12 client (rustls) this crate
//! already builds for its webhooks and admin CLI.
//!
//! `opentelemetry-otlp` is built without HTTP clients of its own (its defaults would add a
//! second reqwest, a blocking one); it takes any `opentelemetry_http::HttpClient`, and
//! [`ReqwestOnRuntime`] is one. The SDK's batch processor exports from a thread of its own,
//! outside any tokio runtime, where reqwest's async client cannot run: each request is
//! therefore spawned on the application's runtime and its answer awaited from there.
//!
//! Shared by `examples/otel.rs` and `tests/otel_export.rs`, so the test checks the code the
//! example runs.

use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

/// How long one export may take, connection and answer together.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// An `HttpClient` for the OTLP exporter: a reqwest client whose requests run as tasks of
/// `runtime`, awaited from whichever thread exports.
#[derive(Debug, Clone)]
pub struct ReqwestOnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl ReqwestOnRuntime {
    /// A client that runs its requests on `runtime`.
    pub fn new(runtime: tokio::runtime::Handle) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build()?;
        Ok(Self { client, runtime })
    }
}

#[async_trait::async_trait]
impl HttpClient for ReqwestOnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let exchange = self.runtime.spawn(async move {
            let response = client.execute(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.bytes().await?;
            let mut answer = Response::new(body);
            *answer.status_mut() = status;
            *answer.headers_mut() = headers;
            Ok::<_, reqwest::Error>(answer)
        });
        Ok(exchange.await??)
    }
}

/// The URL spans are posted to for an OTLP endpoint's base URL (what
/// `OTEL_EXPORTER_OTLP_ENDPOINT` holds): the base with `/v1/traces` appended.
pub fn traces_url(endpoint: &str) -> String {
    format!("{}/v1/traces", endpoint.trim_end_matches('/'))
}

/// A tracer provider that batches finished spans of service `service` and posts them as OTLP
/// protobuf to `endpoint`'s `/v1/traces`, through requests run on `runtime`. Shut it down
/// (from a thread that is not one of `runtime`'s own) to send what is left.
pub fn tracer_provider(
    endpoint: &str,
    service: &'static str,
    runtime: tokio::runtime::Handle,
) -> Result<SdkTracerProvider, HttpError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(traces_url(endpoint))
        .with_http_client(ReqwestOnRuntime::new(runtime)?)
        .build()?;
    let resource = Resource::builder().with_service_name(service).build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}
